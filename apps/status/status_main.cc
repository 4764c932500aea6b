// `tessera status CLUSTER_FILE|HOST:PORT...`: lists memory servers with their slabs, memory,
// load and health.
#include <gflags/gflags.h>
#include <sys/stat.h>

#include <cstdio>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "apps/cli/cli.h"
#include "common/clock.h"
#include "common/report.h"
#include "common/units.h"
#include "fabric/auth.h"
#include "fabric/credential.h"
#include "fabric/cluster_file.h"
#include "fabric/control_client.h"
#include "membership/etcd_client.h"
#include "membership/etcd_view.h"

DEFINE_string(auth_token_file, "",
              "Credential file (`tessera token issue`) or the cluster secret; empty: the "
              "development default (logged)");
DEFINE_string(timeout, "2s", "Per-server deadline for connecting and answering");
DEFINE_bool(json, false, "One JSON object per server instead of a table");
DEFINE_string(etcd, "",
              "etcd endpoints (HOST:PORT,...): list the servers registered in --cluster_name "
              "instead of a cluster file");
DEFINE_string(cluster_name, "", "Cluster registered in etcd (with --etcd)");

namespace {

using tessera::cli::UsageError;
namespace fabric = tessera::fabric;

const tessera::cli::CliSpec kSpec = {
    "tessera status",
    "CLUSTER_FILE|HOST:PORT... | --etcd ENDPOINTS --cluster_name NAME  [--json] [--timeout D] "
    "[--auth_token_file F]",
    "Asks every memory server (listed in a cluster file, or given as HOST:PORT) for a\n"
    "heartbeat and its stats, and prints one row per server: health (reachable, or\n"
    "unreachable with the reason), slabs used/free, memory lent/capacity, load, connections\n"
    "and round-trip time. Servers are queried in parallel. With --etcd the list is every\n"
    "server registered in etcd (plus its server_id, host and registered capacity). Exit\n"
    "status 0 when every server is reachable, 1 otherwise.",
    __FILE__, 0, -1};

struct Row {
  fabric::ClusterMember member;
  std::optional<tessera::membership::ServerRecord> record;  // --etcd: its registration.
  bool reachable = false;
  std::string reason;
  fabric::HeartbeatResponse hb;
  uint64_t rtt_ns = 0;
  std::string ops_per_sec = "-";
  std::string evictions = "-";
  std::string rdma = "-";
  uint64_t slab_size = 0;
};

bool IsFile(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string StatValue(const std::string& stats, const std::string& key) {
  std::istringstream in(stats);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key + " ", 0) == 0) return line.substr(key.size() + 1);
  }
  return "-";
}

void Query(const fabric::Credential& cred, uint64_t timeout_ms, Row* row) {
  fabric::ConnectOptions co;
  co.secret = cred.key;
  co.client_id = cred.client_id != 0
                     ? cred.client_id
                     : std::random_device{}() | (uint64_t{std::random_device{}()} << 32) | 1;
  co.deadline = tessera::Deadline::AfterMs(timeout_ms);
  auto conn = fabric::ControlClient::Connect(row->member.endpoint, co);
  if (!conn.ok()) {
    row->reason = conn.status().ToString();
    return;
  }
  fabric::ControlClient& control = **conn;
  row->rdma = control.rdma_offered() ? "yes" : "no";  // The server offers RDMA data transfers.
  row->slab_size = control.info().slab_size;
  uint64_t t0 = tessera::MonotonicNs();
  auto hb = control.Heartbeat(tessera::Deadline::AfterMs(timeout_ms));
  row->rtt_ns = tessera::MonotonicNs() - t0;
  if (!hb.ok()) {
    row->reason = "heartbeat: " + hb.status().ToString();
    return;
  }
  row->hb = *hb;
  row->reachable = true;
  auto stats = control.Stats(tessera::Deadline::AfterMs(timeout_ms));
  if (stats.ok()) {
    row->ops_per_sec = StatValue(*stats, "ops_per_sec");
    row->evictions = StatValue(*stats, "evictions");
  }
  control.Close(tessera::Deadline::AfterMs(timeout_ms)).IgnoreError();
}

}  // namespace

int main(int argc, char** argv) {
  // A one-shot tool: per-connection INFO lines from the transport would only be noise.
  gflags::SetCommandLineOptionWithMode("log_level", "warning", gflags::SET_FLAGS_DEFAULT);
  tessera::cli::InitCli(kSpec, &argc, &argv);
  auto timeout = tessera::ParseDurationNs(FLAGS_timeout);
  if (!timeout.ok() || *timeout == 0) UsageError(kSpec, "bad --timeout '" + FLAGS_timeout + "'");
  const uint64_t timeout_ms = (*timeout + 999999) / 1000000;

  std::vector<Row> rows;
  const bool use_etcd = !FLAGS_etcd.empty();
  if (use_etcd && argc > 1) UsageError(kSpec, "give a cluster file / servers or --etcd, not both");
  if (!use_etcd && argc <= 1) UsageError(kSpec, "give a cluster file, HOST:PORT... or --etcd");
  if (!use_etcd && !FLAGS_cluster_name.empty()) UsageError(kSpec, "--cluster_name needs --etcd");
  if (use_etcd) {
    auto eps = tessera::membership::ParseEtcdEndpoints(FLAGS_etcd);
    if (!eps.ok()) UsageError(kSpec, "--etcd: " + eps.status().message());
    if (auto st = tessera::membership::ValidateClusterName(FLAGS_cluster_name); !st.ok()) {
      UsageError(kSpec, "--etcd needs --cluster_name: " + st.message());
    }
    tessera::membership::EtcdOptions eo;
    eo.endpoints = *eps;
    eo.request_timeout_ms = static_cast<uint32_t>(timeout_ms);
    auto records = tessera::membership::ReadServers(eo, FLAGS_cluster_name);
    if (!records.ok()) {
      std::fprintf(stderr, "tessera status: %s\n", records.status().ToString().c_str());
      return 1;
    }
    for (const auto& rec : *records) {
      auto ep = fabric::ParseEndpoint(rec.endpoint);
      if (!ep.ok()) continue;  // ReadServers checked it already.
      Row row;
      row.member.endpoint = *ep;
      row.member.rack = rec.rack;
      row.record = rec;
      rows.push_back(std::move(row));
    }
    if (rows.empty()) {
      std::fprintf(stderr, "tessera status: no server is registered in cluster '%s' at %s\n",
                   FLAGS_cluster_name.c_str(), FLAGS_etcd.c_str());
    }
  }
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (IsFile(arg)) {
      auto members = fabric::LoadClusterFile(arg);
      if (!members.ok()) {
        std::fprintf(stderr, "tessera status: %s\n", members.status().ToString().c_str());
        return 2;
      }
      for (auto& m : *members) rows.push_back(Row{m});
      continue;
    }
    auto ep = fabric::ParseEndpoint(arg);
    if (!ep.ok()) {
      UsageError(kSpec, "'" + arg + "' is neither a cluster file nor HOST:PORT (" +
                            ep.status().message() + ")");
    }
    fabric::ClusterMember m;
    m.endpoint = *ep;
    rows.push_back(Row{m});
  }
  auto secret = fabric::LoadCredential(FLAGS_auth_token_file, "tessera status");
  if (!secret.ok()) {
    std::fprintf(stderr, "tessera status: %s\n", secret.status().ToString().c_str());
    return 1;
  }

  // One thread (and one Transport) per server, at most 32 at a time.
  constexpr size_t kParallel = 32;
  for (size_t base = 0; base < rows.size(); base += kParallel) {
    std::vector<std::thread> threads;
    for (size_t i = base; i < rows.size() && i < base + kParallel; ++i) {
      threads.emplace_back(Query, std::cref(*secret), timeout_ms, &rows[i]);
    }
    for (auto& t : threads) t.join();
  }

  tessera::Report report(FLAGS_json);
  bool all_ok = true;
  for (const Row& r : rows) {
    tessera::Report::Row out;
    out.Set("server", r.member.endpoint.ToString());
    out.Set("rack", r.member.rack.empty() ? "-" : r.member.rack);
    if (r.record) {
      out.Set("server_id", r.record->server_id);
      out.Set("host", r.record->host.empty() ? "-" : r.record->host);
      out.Set("registered_capacity", tessera::FormatSize(r.record->capacity));
    }
    out.Set("health", r.reachable ? "reachable" : "unreachable");
    if (r.reachable) {
      out.Set("slabs_used", uint64_t{r.hb.slabs_used});
      out.Set("slabs_free", uint64_t{r.hb.slabs_free});
      out.Set("used", tessera::FormatSize(static_cast<uint64_t>(r.hb.slabs_used) * r.slab_size));
      out.Set("lendable", tessera::FormatSize(r.hb.free_bytes));
      out.Set("capacity", tessera::FormatSize(r.hb.total_bytes));
      char load[16];
      std::snprintf(load, sizeof(load), "%.1f%%", r.hb.load_permille / 10.0);
      out.Set("load", load);
      out.Set("ops_per_sec", r.ops_per_sec);
      out.Set("evictions", r.evictions);
      out.Set("conns", uint64_t{r.hb.connections});
      out.Set("rdma", r.rdma);
      char rtt[24];
      std::snprintf(rtt, sizeof(rtt), "%.0f", r.rtt_ns / 1e3);
      out.Set("rtt_us", rtt);
      out.Set("reason", "-");
    } else {
      all_ok = false;
      for (const char* k : {"slabs_used", "slabs_free", "used", "lendable", "capacity", "load",
                            "ops_per_sec", "evictions", "conns", "rdma", "rtt_us"}) {
        out.Set(k, "-");
      }
      out.Set("reason", r.reason);
    }
    report.Add(std::move(out));
  }
  report.Flush();
  return all_ok && !rows.empty() ? 0 : 1;
}
