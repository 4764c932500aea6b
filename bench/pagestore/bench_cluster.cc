#include "bench/pagestore/bench_cluster.h"

#include "client/local_cluster.h"
#include "client/remote_store.h"

namespace tessera::bench {
namespace {

class LocalBenchCluster final : public BenchCluster {
 public:
  LocalBenchCluster(std::unique_ptr<client::LocalCluster> cluster, uint32_t poll_us)
      : cluster_(std::move(cluster)), poll_us_(poll_us) {}

  Result<std::unique_ptr<client::PageStore>> MakeStore(const std::string& kind,
                                                       uint64_t pages) override {
    client::RemoteStoreOptions remote;
    for (const fabric::Endpoint& e : cluster_->endpoints()) {
      remote.servers.push_back(client::RemoteServer{e, ""});
    }
    remote.secret = cluster_->secret();
    remote.capacity_pages = pages;
    remote.poll_us = poll_us_;
    if (kind == "ec" || kind == "ec-d0" || kind == "ec-group" || kind == "ec-group-d0" ||
        kind == "ec-group-restripe" || kind == "ec-group-inplace") {
      // "ec": the split layout (EC-Split); "ec-group": whole pages in stripes (EC-Batch), with
      // the default compaction or the one named.
      client::ErasureCodedStoreOptions o;
      o.remote = remote;
      o.k = 8;
      o.r = 2;
      o.delta = kind == "ec" || kind.rfind("ec-group", 0) == 0 ? 1 : 0;
      if (kind == "ec-group-d0") o.delta = 0;
      o.layout = kind.rfind("ec-group", 0) == 0 ? client::EcLayout::kGroup
                                                 : client::EcLayout::kSplit;
      if (kind == "ec-group-restripe") o.group.compaction = client::GroupCompaction::kRestripe;
      if (kind == "ec-group-inplace") o.group.compaction = client::GroupCompaction::kInPlace;
      TESSERA_ASSIGN_OR_RETURN(auto s, client::CreateErasureCodedStore(o));
      return std::unique_ptr<client::PageStore>(std::move(s));
    }
    client::ReplicatedStoreOptions o;
    o.remote = remote;
    if (kind == "rep2") {
      o.copies = 2;
    } else if (kind == "rep3") {
      o.copies = 3;
    } else if (kind == "single") {
      o.copies = 1;
    } else {
      return InvalidArgument("unknown remote store kind '", kind, "'");
    }
    TESSERA_ASSIGN_OR_RETURN(auto s, client::CreateReplicatedStore(o));
    return std::unique_ptr<client::PageStore>(std::move(s));
  }

  int servers() const override { return static_cast<int>(cluster_->size()); }
  std::string endpoint(int server) const override {
    return cluster_->endpoints().at(server).ToString();
  }
  Status SlowDown(int server, int delay_us) override {
    return cluster_->Fault(server, {"delay", std::to_string(delay_us) + "us"});
  }
  Status ClearFaults(int server) override { return cluster_->Fault(server, {"clear"}); }
  Status Kill(int server) override { return cluster_->Kill(server); }

 private:
  std::unique_ptr<client::LocalCluster> cluster_;
  uint32_t poll_us_;
};

}  // namespace

Result<std::unique_ptr<BenchCluster>> BenchCluster::Start(int servers, const std::string& bin_dir,
                                                          uint64_t capacity_bytes,
                                                          uint64_t slab_bytes,
                                                          uint32_t poll_us) {
  if (servers < 1) return InvalidArgument("need at least one server, got ", servers);
  client::LocalClusterOptions o;
  o.bin_dir = bin_dir;
  o.servers = static_cast<size_t>(servers);
  o.capacity = std::to_string(capacity_bytes / 1024) + "K";
  o.slab_size = std::to_string(slab_bytes / 1024) + "K";
  o.fault_injection = true;
  TESSERA_ASSIGN_OR_RETURN(auto cluster, client::LocalCluster::Start(o));
  return std::unique_ptr<BenchCluster>(new LocalBenchCluster(std::move(cluster), poll_us));
}

}  // namespace tessera::bench
