// `tessera paramsvc serve` as a real process for the Parameter Service's integration tests:
// started on an ephemeral port, checkpointing into real memservers when given them.
#pragma once

#include <string>
#include <vector>

#include "client/local_cluster.h"
#include "common/clock.h"
#include "common/subprocess.h"
#include "tests/support/test_util.h"

namespace tessera::paramsvc {

struct Service {
  Subprocess proc;
  uint16_t port = 0;
  pid_t aggregator = 0;  // The aggregation server (the supervisor restarts it)
  std::string endpoint() const { return "127.0.0.1:" + std::to_string(port); }
};

// The pid of the next aggregation server the supervisor starts (its "aggregator pid" line).
inline Result<pid_t> NextAggregator(Subprocess* p) {
  auto line = p->WaitForLine("aggregator pid ", Deadline::AfterMs(30000));
  if (!line.ok()) return line.status();
  return static_cast<pid_t>(std::stol(line->substr(15)));
}

// Three memservers of 64 MiB in 1 MiB slabs: the aggregation server's checkpoint store.
inline client::LocalClusterOptions ThreeServers() {
  client::LocalClusterOptions co;
  co.bin_dir = tessera::testing::BinDir();
  co.servers = 3;
  co.capacity = "64M";
  co.slab_size = "1M";
  return co;
}

// `serve` with 2 cores and `token`; with `store`, checkpointing into it (RS(2,1), 64 MiB).
inline Result<Service> StartService(const client::LocalCluster* store, const std::string& token,
                                    const std::vector<std::string>& extra = {}) {
  std::vector<std::string> argv = {tessera::testing::BinDir() + "/tessera-paramsvc-serve",
                                   "--port=0", "--cores=2", "--log_level=warning",
                                   "--auth_token_file=" + token};
  if (store) {
    argv.push_back("--store=" + store->cluster_file_path());
    argv.push_back("--ec_k=2");
    argv.push_back("--ec_r=1");
    argv.push_back("--store_mb=64");
  }
  argv.insert(argv.end(), extra.begin(), extra.end());
  Subprocess::Options o;
  o.capture_stdout = true;
  auto p = Subprocess::Start(argv, o);
  if (!p.ok()) return p.status();
  Service s;
  s.proc = std::move(*p);
  auto line = s.proc.WaitForLine("listening on ", Deadline::AfterMs(30000));
  if (!line.ok()) return line.status();
  s.port = static_cast<uint16_t>(std::stoi(line->substr(line->rfind(':') + 1)));
  auto agg = NextAggregator(&s.proc);
  if (!agg.ok()) return agg.status();
  s.aggregator = *agg;
  return s;
}

}  // namespace tessera::paramsvc
