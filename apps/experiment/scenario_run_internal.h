// Internal to apps/experiment/: ScenarioRun, the run of one scenario behind RunScenarioOnce
// (scenario_run.h). Its members are defined in two files by concern: scenario_run.cc (the
// cluster, the client process, the schedule, sampling and the run itself) and
// scenario_faults.cc (resolving, firing and undoing faults).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "apps/experiment/child_processes.h"
#include "apps/experiment/partition.h"
#include "apps/experiment/scenario_run.h"
#include "apps/experiment/workload.h"
#include "client/local_cluster.h"
#include "client/remote_store.h"

namespace tessera::experiment {

class ScenarioRun {
 public:
  ScenarioRun(const Scenario& s, const ClusterSpec& c, const ExpectSpec& e, const RunOptions& o,
              const std::string& name, const std::string& dir, bool healthy)
      : s_(s), c_(c), o_(o), dir_(dir), partition_(o.system_lock), ctx_(s, c_, e, o, dir, healthy) {
    const WorkloadType& type = TypeOf(s.workload.kind);
    if (c_.layout.empty()) c_.layout = type.default_layout;
    res_.name = name;
    res_.healthy = healthy;
    res_.cluster = c_;
    workload_ = type.make(ctx_);
  }

  RunResult Run();

 private:
  static constexpr double kInf = std::numeric_limits<double>::infinity();
  static constexpr int kSampleMs = 100;

  int RackOf(size_t i) const;

  Status StartCluster();

  // ---- faults ----

  std::vector<size_t> Resolve(const FaultSpec& f, size_t index);

  Status Apply(FaultAction a, size_t i, const FaultSpec& f, std::string* note);

  // Undo of a timed fault (duration_s).
  Status Undo(FaultAction a, size_t i);

  struct Active {
    FaultAction action;
    std::vector<size_t> servers;
    double until;       // Seconds since t0; inf = to the end.
    bool undo;          // Undo at `until`.
    bool etcd = false;  // On the runner's etcd, not on servers.
  };

  // The client process (a pagestore workload with client_pages): started once the workload
  // has written its pages and taken its slab census, so the census counts none of its slabs.
  Status StartClient();

  void ReportClient();

  // A fault on the runner's etcd or on the client process.
  void FireProcessFault(const FaultSpec& f, double t, FaultRecord* rec);

  // Undo of a timed fault on etcd: a killed etcd is started again on its data, a stopped one
  // resumed.
  Status UndoEtcd(FaultAction a);

  bool IsPermanentFailure(FaultAction a, const FaultSpec& f) const;

  void FireFault(size_t index, double t);

  void UpdatePhase(double t);

  // after_recovery: every permanent failure fired so far is declared failed by the store, and
  // nothing is left to regenerate.
  bool Recovered();

  // The fault scheduler: at_s faults by time, at_event faults on the workload's events.
  void Scheduler();

  // ---- sampling ----

  void TakeSample();

  void Sampler();

  Status RunInner();

  std::string PartitionMode() const;

 private:
  const Scenario& s_;
  ClusterSpec c_;
  const RunOptions& o_;
  std::string dir_;
  Partition partition_;
  Status partition_ready_ = Unsupported("partition not prepared");
  std::unique_ptr<EtcdServer> etcd_;  // Outlives the memservers registered in it.
  std::unique_ptr<client::LocalCluster> cluster_;
  std::unique_ptr<ClientProcess> client_;  // Killed before the memservers go.
  std::optional<ClientOutcome> client_outcome_;
  double last_client_kill_at_ = -1;  // NowS() of the last SIGKILL of the client process.
  std::vector<client::RemoteServer> servers_;
  RunContext ctx_;
  // Destroyed before the context and the cluster: it frees its slabs, stops its service.
  std::unique_ptr<Workload> workload_;
  RunResult res_;
  std::mutex mu_;  // res_.samples, res_.faults, last_fault_text_
  std::string last_fault_text_;
  std::vector<Active> active_;
  std::set<size_t> partitioned_real_, partitioned_fallback_, partitioned_hosts_;
  static constexpr const char* kHostLinkDown =
      "network namespaces: the partitioned host's veth is down";
  bool failed_before_ = false;       // A server failed for good already.
  uint64_t permanent_failures_ = 0;  // Servers failed for good by the faults fired so far.
  // When the workload's Run() returned (seconds since t0_); samples after it are not the load's.
  double load_end_t_ = kInf;
  std::atomic<bool> sched_stop_{false}, sampler_stop_{false};
  pid_t aggregator_stopped_ = 0;
  double t0_ = 0;
  double last_sample_t_ = 0;
  uint64_t last_ops_ = 0, last_ticks_ = 0;
  int last_phase_ = 0;
  std::atomic<double> last_failure_t_{-1};
  std::atomic<uint64_t> failures_before_{0}, regens_before_{0};
  std::atomic<double> regen_after_{-1};
};

}  // namespace tessera::experiment
