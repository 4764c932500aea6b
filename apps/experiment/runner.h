// Runner: executes a Scenario end to end and judges it.
//
// For each variant (or once) it runs the scenario on a fresh cluster of real memserver
// processes (scenario_run.h: the cluster, the faults, the 100 ms samples), with the scenario's
// workload behind the Workload seam (workload.h; one file per kind under workloads/): an
// unmodified program under `tessera run`, the in-process pagestore load generator that checks
// every byte it reads, the Parameter Service, or a Kayak KV table driven by kayak::Client with
// every value read checked against the last acknowledged PUT. Before the runs it times the
// program locally when identical_output is judged, and runs a healthy baseline when a slowdown
// is; after them it predicts the pages lost (`tessera sim placement`) when that is judged,
// judges every expectation, and writes the results (results.h): OUT/timeline.csv,
// OUT/timeline.png, OUT/summary.json and OUT/summary.md (per variant in OUT/VARIANT/ when the
// scenario has variants, with the verdict over all of them at the top level).
//
// Threads: RunExperiment blocks the calling thread and starts its own helper threads (sampler,
// fault scheduler, workload); it is not reentrant per output directory.
#pragma once

#include <atomic>
#include <string>

#include "apps/experiment/scenario.h"
#include "common/status.h"

namespace tessera::experiment {

struct RunOptions {
  std::string out_dir;        // Created if missing.
  std::string bin_dir;        // Holds tessera-memserver, tessera-run, tessera-fault, tessera-sim-*.
  std::string data_dir;       // Replaces ${data_dir} in commands: share/tessera (workloads/).
  std::string system_lock;    // flock'ed while firewall rules exist; empty: no lock.
  int lock_wait_ms = 120000;  // Bound on waiting for it; then the drop-all fallback.
  bool quick = false;         // Apply the scenario's [quick] table.
  bool progress = false;      // A live status line on stderr.
  const std::atomic<bool>* cancel = nullptr;  // Set by a signal handler: stop, clean up.
};

struct Outcome {
  bool passed = false;
  int expectations = 0;
  int failed = 0;
  std::string summary_md;  // What summary.md holds.
};

// Unsupported (with the reason) when this build cannot run the scenario at all: a workload
// kind or layout that does not exist yet. Checked before anything starts.
Status CheckRunnable(const Scenario& s);

// Runs the scenario (after CheckRunnable). An error means the experiment could not be carried
// out (a cluster that does not start, a cancel); failed expectations are in the Outcome.
Result<Outcome> RunExperiment(const Scenario& s, const RunOptions& options);

}  // namespace tessera::experiment
