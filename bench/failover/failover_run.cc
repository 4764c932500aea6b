#include "bench/failover/failover_run.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include <signal.h>

#include "tests/support/etcd_process.h"
#include "client/local_cluster.h"
#include "client/page_store.h"
#include "common/clock.h"
#include "membership/etcd_view.h"
#include "tests/support/cpu_load.h"

namespace tessera::bench {
namespace {

using client::kPageSize;
using client::PageId;
using client::PageStore;

constexpr int kHealthy = 0, kFault = 1, kAfter = 2;
constexpr const char* kClusterName = "failover";

// The bytes of page p: a splitmix64 stream seeded by the page id and the run's seed.
void FillPage(PageId page, uint32_t seed, uint8_t* buf) {
  uint64_t x = page * 0x9E3779B97F4A7C15ull ^ (uint64_t{seed} << 32);
  for (size_t i = 0; i < kPageSize; i += 8) {
    x += 0x9E3779B97F4A7C15ull;
    uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    std::memcpy(buf + i, &z, 8);
  }
}

// Holds a fault for a stated duration (not a synchronisation: nothing is waited for).
void Hold(double seconds) { std::this_thread::sleep_for(std::chrono::duration<double>(seconds)); }

double Percentile(std::vector<uint64_t>& ns, double q) {
  if (ns.empty()) return 0;
  std::sort(ns.begin(), ns.end());
  size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(ns.size())));
  rank = std::clamp<size_t>(rank, 1, ns.size());
  return static_cast<double>(ns[rank - 1]) / 1000.0;
}

// Blocking ReadPage of uniformly random written pages, every byte checked; each read's latency
// is filed under the phase it started in.
class Reader {
 public:
  Reader(PageStore* store, uint64_t pages, uint32_t seed, std::atomic<int>* phase)
      : store_(store), pages_(pages), seed_(seed), phase_(phase) {
    thread_ = std::thread([this] { Loop(); });
  }
  ~Reader() { Stop(); }
  void Stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }
  // After Stop().
  std::vector<uint64_t>& latencies(int phase) { return lat_[phase]; }
  uint64_t data_loss() const { return data_loss_; }
  uint64_t errors() const { return errors_; }

 private:
  void Loop() {
    std::mt19937_64 rng(seed_);
    std::vector<uint8_t> got(kPageSize), want(kPageSize);
    while (!stop_.load(std::memory_order_relaxed)) {
      const PageId page = rng() % pages_;
      const int phase = phase_->load(std::memory_order_relaxed);
      const uint64_t t0 = MonotonicNs();
      Status st = store_->ReadPage(page, got.data());
      const uint64_t t1 = MonotonicNs();
      if (phase != kAfter) lat_[phase].push_back(t1 - t0);
      if (!st.ok()) {
        (st.code() == StatusCode::kDataLoss ? data_loss_ : errors_)++;
        continue;
      }
      FillPage(page, seed_, want.data());
      if (std::memcmp(got.data(), want.data(), kPageSize) != 0) data_loss_++;
    }
  }

  PageStore* store_;
  uint64_t pages_;
  uint32_t seed_;
  std::atomic<int>* phase_;
  std::atomic<bool> stop_{false};
  std::vector<uint64_t> lat_[2];
  uint64_t data_loss_ = 0, errors_ = 0;
  std::thread thread_;
};

// Polls RemoteServersFailed every 2 ms and remembers when each server was first seen failed.
class FailureWatcher {
 public:
  explicit FailureWatcher(client::RemotePageStore* store) : store_(store) {
    thread_ = std::thread([this] { Loop(); });
  }
  ~FailureWatcher() { Stop(); }
  void Stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }
  std::optional<uint64_t> FailedAt(size_t server) {
    std::lock_guard<std::mutex> l(mu_);
    auto it = failed_at_.find(server);
    if (it == failed_at_.end()) return std::nullopt;
    return it->second;
  }
  std::map<size_t, uint64_t> failed() {
    std::lock_guard<std::mutex> l(mu_);
    return failed_at_;
  }

 private:
  void Loop() {
    while (!stop_.load()) {
      auto f = client::RemoteServersFailed(*store_);
      const uint64_t now = MonotonicNs();
      if (f.ok()) {
        std::lock_guard<std::mutex> l(mu_);
        for (size_t i = 0; i < f->size(); ++i) {
          if ((*f)[i] && !failed_at_.count(i)) failed_at_[i] = now;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));  // Poll interval.
    }
  }

  client::RemotePageStore* store_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::map<size_t, uint64_t> failed_at_;  // Under mu_.
  std::thread thread_;
};

Status WriteAll(PageStore& store, uint64_t pages, uint32_t seed) {
  constexpr size_t kBatch = 64;
  std::vector<uint8_t> bufs(kBatch * kPageSize);
  std::vector<PageId> ids(kBatch);
  for (PageId first = 0; first < pages; first += kBatch) {
    const size_t n = std::min<uint64_t>(kBatch, pages - first);
    for (size_t i = 0; i < n; ++i) {
      ids[i] = first + i;
      FillPage(first + i, seed, bufs.data() + i * kPageSize);
    }
    TESSERA_RETURN_IF_ERROR(store.WritePages(ids.data(), n, bufs.data()));
  }
  return store.Flush();
}

// Reads every written page once and checks it; returns the pages lost or wrong.
uint64_t VerifyAll(PageStore& store, uint64_t pages, uint32_t seed, uint64_t* errors) {
  std::vector<uint8_t> got(kPageSize), want(kPageSize);
  uint64_t lost = 0;
  for (PageId p = 0; p < pages; ++p) {
    Status st = store.ReadPage(p, got.data());
    if (!st.ok()) {
      (st.code() == StatusCode::kDataLoss ? lost : *errors)++;
      continue;
    }
    FillPage(p, seed, want.data());
    if (std::memcmp(got.data(), want.data(), kPageSize) != 0) lost++;
  }
  return lost;
}

bool KnownScenario(const std::string& s) {
  return s == "kill" || s == "stop" || s == "reset" || s == "oversubscribe" || s == "etcd-outage";
}

}  // namespace

Result<FailoverResult> RunFailover(const FailoverConfig& c) {
  if (!KnownScenario(c.scenario)) return InvalidArgument("unknown scenario '", c.scenario, "'");
  const bool etcd_mode = c.scenario == "etcd-outage";
  // Declared in teardown order (last destroyed first): etcd, servers, view, store, follower.
  std::unique_ptr<testing::EtcdProcess> etcd;
  if (etcd_mode) {
    TESSERA_ASSIGN_OR_RETURN(etcd, testing::EtcdProcess::Start());
  }

  client::LocalClusterOptions lo;
  lo.bin_dir = c.bin_dir;
  lo.servers = static_cast<size_t>(c.servers);
  lo.capacity = "128M";
  lo.slab_size = "1M";
  lo.fault_injection = true;
  if (etcd_mode) {
    lo.extra_flags = {"--etcd=" + etcd->endpoint(), std::string("--cluster_name=") + kClusterName,
                      "--etcd_ttl=" + std::to_string(c.etcd_ttl_s) + "s"};
  }
  TESSERA_ASSIGN_OR_RETURN(auto cluster, client::LocalCluster::Start(lo));

  std::unique_ptr<membership::MembershipView> view;
  client::ErasureCodedStoreOptions so;
  so.k = c.k;
  so.r = c.r;
  so.layout = c.layout;
  so.remote.secret = cluster->secret();
  so.remote.capacity_pages = c.pages;
  if (etcd_mode) {
    membership::EtcdOptions eo;
    eo.endpoints = {etcd->endpoint()};
    TESSERA_ASSIGN_OR_RETURN(view, membership::MembershipView::Start(eo, kClusterName));
    const size_t want = cluster->size();
    if (!view->WaitFor([&](const auto& m) { return m.size() == want; }, 15000)) {
      return Timeout("only ", view->Members().size(), " of ", want,
                     " memservers registered in etcd within 15 s");
    }
    TESSERA_ASSIGN_OR_RETURN(so.remote.servers, membership::ToRemoteServers(view->Members()));
  } else {
    for (const fabric::Endpoint& e : cluster->endpoints()) {
      so.remote.servers.push_back(client::RemoteServer{e, ""});
    }
  }
  TESSERA_ASSIGN_OR_RETURN(auto store, client::CreateErasureCodedStore(so));
  std::unique_ptr<membership::StoreFollower> follower;
  if (etcd_mode) {
    TESSERA_ASSIGN_OR_RETURN(follower, membership::StoreFollower::Start(view.get(), store.get()));
  }

  TESSERA_RETURN_IF_ERROR(WriteAll(*store, c.pages, c.seed));

  // The faulted server: the first holding page 0 (it holds data in both layouts). Store indices
  // follow the cluster's order outside the etcd scenario, which faults no server.
  std::optional<size_t> victim;
  if (c.scenario == "kill" || c.scenario == "stop" || c.scenario == "reset") {
    TESSERA_ASSIGN_OR_RETURN(auto holders, client::ServersOfPage(*store, 0));
    if (holders.empty()) return Internal("page 0 has no servers");
    victim = holders[0];
  }

  std::atomic<int> phase{kHealthy};
  FailureWatcher watcher(store.get());
  Reader reader(store.get(), c.pages, c.seed, &phase);
  Hold(c.healthy_s);

  FailoverResult res;
  const client::PageStoreStats before = store->Stats();
  const uint64_t t_fault = MonotonicNs();
  uint64_t t_end = 0;
  Status fault_status;
  if (c.scenario == "kill") {
    phase = kFault;
    fault_status = cluster->Kill(*victim);
    // Until the dead server's splits are rebuilt (or the window ends), polled every 2 ms.
    const Deadline d = Deadline::AfterMs(static_cast<uint64_t>(c.kill_window_s * 1000));
    uint64_t last_idle = 0, first_progress = 0, done_at = 0;
    while (fault_status.ok() && !d.Expired()) {
      const client::PageStoreStats s = store->Stats();
      const uint64_t now = MonotonicNs();
      const uint64_t rebuilt = s.regenerations_done - before.regenerations_done;
      if (rebuilt == 0) {
        last_idle = now;
      } else if (first_progress == 0) {
        first_progress = now;
      }
      if (done_at == 0 && rebuilt > 0 && s.regenerations_pending == 0 &&
          watcher.FailedAt(*victim)) {
        done_at = now;
        res.regenerated = rebuilt;
      }
      // The window lasts until regeneration is done, and at least kill_min_window_s, so the
      // read percentiles have reads to stand on.
      if (done_at != 0 && (now - t_fault) / 1e9 >= c.kill_min_window_s) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));  // Poll interval.
    }
    if (first_progress != 0) {
      if (auto v = watcher.FailedAt(*victim)) {
        // The verdict and the first rebuilt split are seen by two 2 ms polls: a start within
        // that resolution of the verdict reads as 0.
        res.regen_start_ms =
            std::max(0.0, (static_cast<double>(first_progress) - static_cast<double>(*v)) / 1e6);
      }
    }
    if (done_at != 0 && done_at > last_idle) {
      // From the last poll that saw nothing rebuilt to the first that saw all of it: a lower
      // bound on the rate (off by at most two poll intervals).
      res.regen_pages_per_s = res.regenerated / ((done_at - last_idle) / 1e9);
    } else if (first_progress != 0) {  // Still rebuilding when the window ended.
      res.regenerated = store->Stats().regenerations_done - before.regenerations_done;
    }
  } else if (c.scenario == "stop") {
    phase = kFault;
    fault_status = cluster->Stop(*victim);
    if (fault_status.ok()) Hold(c.stop_s);
    Status cont = cluster->Cont(*victim);
    if (fault_status.ok()) fault_status = cont;
  } else if (c.scenario == "reset") {
    phase = kFault;
    fault_status = cluster->Fault(
        *victim, {"drop", "--ops=read,write", "--duration=" + std::to_string(c.reset_ms) + "ms"});
    if (fault_status.ok()) Hold(c.reset_window_s - (MonotonicNs() - t_fault) / 1e9);
  } else if (c.scenario == "oversubscribe") {
    auto load = testing::CpuLoad::Start(c.busy_loops);
    phase = kFault;
    if (load.ok()) {
      Hold(c.oversubscribe_s);
      if ((*load)->Running() != c.busy_loops) {
        fault_status = Internal("a busy loop died during the oversubscription");
      }
    } else {
      fault_status = load.status();
    }
  } else {  // etcd-outage
    phase = kFault;
    // SIGSTOP: every connection stays open and nothing answers, the way a hung or
    // partitioned etcd looks to its clients.
    fault_status = ::kill(etcd->pid(), SIGSTOP) == 0 ? Status::Ok() : ErrnoError("SIGSTOP etcd");
    if (fault_status.ok()) Hold(3.0 * c.etcd_ttl_s);
    Status resumed = ::kill(etcd->pid(), SIGCONT) == 0 ? Status::Ok() : ErrnoError("SIGCONT etcd");
    if (fault_status.ok()) fault_status = resumed;
    // Leases that ran out while etcd was stopped expire right after it resumes.
    if (fault_status.ok()) Hold(c.etcd_ttl_s + 2.0);
  }
  t_end = MonotonicNs();
  phase = kAfter;
  reader.Stop();
  if (!fault_status.ok()) return fault_status;

  res.fault_window_s = (t_end - t_fault) / 1e9;
  res.healthy_reads = reader.latencies(kHealthy).size();
  res.fault_reads = reader.latencies(kFault).size();
  res.healthy_p99_us = Percentile(reader.latencies(kHealthy), 0.99);
  res.read_p50_us = Percentile(reader.latencies(kFault), 0.50);
  res.read_p99_us = Percentile(reader.latencies(kFault), 0.99);
  res.read_max_us = Percentile(reader.latencies(kFault), 1.0);
  res.data_loss = reader.data_loss();
  res.read_errors = reader.errors();
  res.data_loss += VerifyAll(*store, c.pages, c.seed, &res.read_errors);

  watcher.Stop();
  // Servers failed at the end (the watcher may have missed one that failed after its last poll).
  std::map<size_t, uint64_t> failed = watcher.failed();
  if (auto f = client::RemoteServersFailed(*store); f.ok()) {
    for (size_t i = 0; i < f->size(); ++i) {
      if ((*f)[i] && !failed.count(i)) failed[i] = t_end;
    }
  }
  for (const auto& [server, at] : failed) {
    if (victim && server == *victim) {
      res.faulted_declared_failed = true;
      res.detect_ms = (static_cast<double>(at) - static_cast<double>(t_fault)) / 1e6;
    } else {
      res.false_failures++;
    }
  }
  if (follower) res.membership_leaves = follower->leaves();
  return res;
}

}  // namespace tessera::bench
