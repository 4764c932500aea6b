// Runner: executes a Scenario end to end and judges it.
//
// For each variant (or once) it starts a fresh LocalCluster of real memserver processes with
// fault injection on, runs the workload (an unmodified program under `tessera run` with the
// scenario's layout, the in-process pagestore load generator that checks every byte it reads,
// the Parameter Service, or a Kayak KV table driven by kayak::Client with every value read
// checked against the last acknowledged PUT), fires the scenario's
// faults on schedule or on a workload event, samples metrics every 100 ms (workload throughput
// and latency, degraded reads, regenerations pending, data loss, memserver CPU and RSS from
// /proc), and at the end writes OUT/timeline.csv, OUT/timeline.png (gnuplot), OUT/summary.json
// and OUT/summary.md (per variant in OUT/VARIANT/ when the scenario has variants, with the
// verdict over all of them at the top level).
//
// partition/heal: real nftables rules on the server's port when `nft` works here (the runner
// holds an flock on options.system_lock, if set, while rules exist and removes them on every exit path,
// including a cancel through options.cancel), else the memserver's drop-all fault; the results
// say which.
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
