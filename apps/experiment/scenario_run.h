// One run of a scenario (a variant, or the healthy baseline): a fresh LocalCluster of real
// memserver processes with fault injection on (registered in an etcd of the run's own with
// [cluster] membership = "etcd"), the scenario's workload (workload.h) on it, with a client
// process beside it for a pagestore workload with client_pages (child_processes.h),
// the faults fired on schedule or on the workload's events (and undone after their
// duration), and a sample of the metrics every 100 ms (the workload's throughput and latency,
// degraded reads, regenerations pending, data loss, memserver CPU and RSS from /proc).
//
// partition/heal: real nftables rules on the server's port when `nft` works here (the run
// holds an flock on options.system_lock, if set, while rules exist and removes them on every
// exit path, including a cancel through options.cancel), else the memserver's drop-all fault;
// the result says which.
//
// Threads: RunScenarioOnce blocks the calling thread and starts its own helper threads
// (sampler, fault scheduler, and the workload's).
#pragma once

#include <string>

#include "apps/experiment/results.h"
#include "apps/experiment/runner.h"
#include "apps/experiment/scenario.h"

namespace tessera::experiment {

// A run that could not be carried out has RunResult::error set.
RunResult RunScenarioOnce(const Scenario& s, const ClusterSpec& cluster, const ExpectSpec& expect,
                          const RunOptions& options, const std::string& name,
                          const std::string& dir, bool healthy);

}  // namespace tessera::experiment
