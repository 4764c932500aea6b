// Workload: the seam between the experiment runner and what it runs under faults.
//
// The runner (runner.cc, scenario_run.cc) owns the orchestration: the cluster of memservers,
// the faults, the 100 ms sampling clock and the verdict. A workload owns the load: it writes
// its data, drives its clients or its program, counts what it saw and checks every value it
// reads. One run calls, in order:
//
//   Start    before t = 0, the cluster up: start services, write the data. Events may fire.
//   Run      from t = 0, faults firing: the load, until it is done, duration_s has passed or
//            the run is cancelled. Sets RunResult::completion_s.
//   Sample   on the sampler thread, every 100 ms from t = 0 to the end, concurrently with Run
//            and Verify (and once more after Verify).
//   Verify   after every timed fault is undone: read everything back and check it. Skipped
//            when Start or Run failed or the run was cancelled.
//   Finish   after the last sample: stop what Start started, move the counters into the
//            RunResult. Called whenever Start was called.
//   Report   once the run's figures are summarised: the kind's JSON keys, summary lines and
//            plot words.
//
// Each kind is one file under apps/experiment/workloads/ that defines a WorkloadType, listed
// once in workloads/registry.cc.
//
// Threads: Start, Run, Verify, Finish and Report on the run's thread; Sample on the sampler
// thread (it must be safe against Run and Verify); the runner calls store(),
// BeforeFirstFailure() and companion_pid() from its fault scheduler thread while Run runs.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "apps/experiment/results.h"
#include "apps/experiment/runner.h"
#include "apps/experiment/scenario.h"
#include "client/local_cluster.h"
#include "client/page_store.h"
#include "client/remote_store.h"
#include "common/histogram.h"
#include "common/status.h"

namespace tessera::experiment {

// What the sampler takes from a workload every 100 ms.
struct WorkloadSample {
  uint64_t ops = 0;  // Completed since the start (cumulative).
  double rate = -1;  // ops/s when the workload knows it better than ops deltas (run), else -1.
  double p50_us = 0, p99_us = 0;  // Of this interval, or as published (run).
  uint64_t degraded_reads = 0;
  uint64_t regenerations_pending = 0;
  uint64_t data_loss = 0;
  uint64_t server_failures = 0;
  uint64_t regenerations_done = 0;
};

// What a run offers its workload: the scenario, the cluster, the fault phase, and a place to
// publish events (lines the at_event faults match).
//
// Threads: the accessors are read-only after the cluster started; Event(), HasEvent(),
// phase() and the failure set are thread-safe.
class RunContext {
 public:
  RunContext(const Scenario& s, const ClusterSpec& c, const ExpectSpec& e, const RunOptions& o,
             std::string dir, bool healthy)
      : scenario_(s),
        cluster_spec_(c),
        expect_(e),
        options_(o),
        dir_(std::move(dir)),
        healthy_(healthy) {}

  const Scenario& scenario() const { return scenario_; }
  const WorkloadSpec& workload() const { return scenario_.workload; }
  const ClusterSpec& cluster_spec() const { return cluster_spec_; }
  const ExpectSpec& expect() const { return expect_; }
  const RunOptions& options() const { return options_; }
  const std::string& dir() const { return dir_; }  // This run's output directory.
  bool healthy() const { return healthy_; }        // The no-fault baseline.
  bool cancelled() const { return options_.cancel->load(); }

  // The memservers (set by the runner before Start).
  client::LocalCluster& cluster() const { return *cluster_; }
  const std::vector<client::RemoteServer>& servers() const { return servers_; }
  const std::string& cluster_file() const { return cluster_file_; }  // With rack labels.
  void SetCluster(client::LocalCluster* c, std::vector<client::RemoteServer> servers,
                  std::string file) {
    cluster_ = c;
    servers_ = std::move(servers);
    cluster_file_ = std::move(file);
  }

  // The runner's etcd ([cluster] membership = "etcd"; "" otherwise): the memservers register
  // under kEtcdClusterName there. Set by the runner before Start.
  const std::string& etcd_endpoint() const { return etcd_endpoint_; }
  void SetEtcd(std::string endpoint) { etcd_endpoint_ = std::move(endpoint); }
  static constexpr const char* kEtcdClusterName = "experiment";

  // 0 before any fault, 1 while one is active, 2 after the faults.
  int phase() const { return phase_.load(); }
  void set_phase(int p) { phase_.store(p); }

  void Event(const std::string& line);
  // True when an event holds `substring`.
  bool HasEvent(const std::string& substring) const;

  // Servers failed for good (kill, restart, partition without end): written by the fault
  // scheduler; read by Verify, after the scheduler stopped.
  std::set<size_t>& failed_servers() { return failed_servers_; }

 private:
  const Scenario& scenario_;
  const ClusterSpec& cluster_spec_;
  const ExpectSpec& expect_;
  const RunOptions& options_;
  std::string dir_;
  bool healthy_;
  client::LocalCluster* cluster_ = nullptr;
  std::vector<client::RemoteServer> servers_;
  std::string cluster_file_;
  std::string etcd_endpoint_;
  std::atomic<int> phase_{0};
  mutable std::mutex mu_;
  std::vector<std::string> events_;
  std::set<size_t> failed_servers_;
};

class Workload {
 public:
  virtual ~Workload() = default;

  virtual Status Start(RunContext& ctx) = 0;
  virtual Status Run(RunContext& ctx, RunResult* r) = 0;
  virtual WorkloadSample Sample() = 0;
  virtual Status Verify(RunContext& ctx, RunResult* r) = 0;
  virtual Status Finish(RunContext& ctx, RunResult* r) = 0;
  virtual void Report(const RunResult& r, WorkloadReport* out) const = 0;

  // The workload's page store, when it has one: `page:P` targets, a restarted server joining
  // it, the placement snapshot before the first permanent failure. nullptr otherwise.
  virtual client::RemotePageStore* store() { return nullptr; }
  // Called by the fault scheduler just before the first server fails for good.
  virtual void BeforeFirstFailure() {}
  // The companion process the target `aggregator` names (0: none, or not started).
  virtual pid_t companion_pid() const { return 0; }
};

// A kind of workload: its factory and the checks of a scenario that only it needs.
struct WorkloadType {
  WorkloadKind kind;
  const char* default_layout;  // The layout when the scenario names none ("": the tool's).
  std::unique_ptr<Workload> (*make)(const RunContext& ctx);
  // Unsupported or InvalidArgument when this build cannot run `s` with this kind.
  Status (*check)(const Scenario& s);
};

// The factory of a WorkloadType whose workload is built from the run's context.
template <class W>
std::unique_ptr<Workload> MakeWorkload(const RunContext& ctx) {
  return std::make_unique<W>(ctx);
}

// The type of `kind` (every kind has one: workloads/registry.cc).
const WorkloadType& TypeOf(WorkloadKind kind);

// Latencies of a load's operations, per 100 ms interval (for the samples) and by fault phase
// (before, during, after). Thread-safe.
class PhaseLatency {
 public:
  // One operation that started in phase `start_phase` and ended now, in `end_phase`: it counts
  // as during the faults when either is.
  void Record(uint64_t ns, int start_phase, int end_phase);
  // An operation of the interval only (not of the load: a final verify pass).
  void RecordInterval(uint64_t ns);
  // This interval's p50 and p99 into `s`; starts the next interval.
  void TakeInterval(WorkloadSample* s);
  void SetResult(RunResult* r) const;  // p50/p99 before and during the faults.

 private:
  mutable std::mutex mu_;
  LatencyHistogram interval_;
  LatencyHistogram phase_[3];
};

// A sample of a load that counts its own operations and losses and records each operation's
// latency in `latency`.
WorkloadSample CountedSample(uint64_t ops, uint64_t data_loss, PhaseLatency& latency);

// Runs body(0) .. body(n - 1) on n threads and waits for them all.
void RunThreads(size_t n, const std::function<void(size_t)>& body);

// `cmd` with ${data_dir} replaced.
std::vector<std::string> ExpandCommand(const std::vector<std::string>& cmd,
                                       const std::string& data_dir);

// 64-bit mixing (splitmix64's finaliser): the workloads' deterministic data.
uint64_t Mix(uint64_t x);

// Seconds on the monotonic clock.
double NowS();

// Unsupported when `s` (or a variant) names a layout: the kinds whose store is not one of the
// runner's erasure-coded stores.
Status NoLayout(const Scenario& s);

}  // namespace tessera::experiment
