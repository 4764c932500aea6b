// CPU load for tests and benches that check behaviour under contention: CpuLoad keeps N
// busy-loop child processes running for the life of a scope, and CpuQuota throttles a set of
// processes with a cgroup-v1 CPU quota (cpu.cfs_quota_us) where the `cpu` controller is mounted.
//
//   auto load = CpuLoad::Start(4);          // 4 busy loops beside the test
//   ... run the test's workload ...
//                                            // ~CpuLoad SIGKILLs and reaps them
//
// The children are forked and do nothing but spin (no allocation, no locks: safe to fork from
// a multi-threaded process); each gets PR_SET_PDEATHSIG = SIGKILL, so none outlives the thread
// that started it, even when the test crashes. CpuQuota moves the processes it was given back
// to the root cgroup and removes its cgroup on destruction.
//
// Threads: each object is owned and used by one thread. Start the CpuLoad from a thread that
// outlives it (PR_SET_PDEATHSIG fires when the forking thread exits).
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace tessera::testing {

class CpuLoad {
 public:
  // Forks `processes` (1..256) busy-loop children. Errors (fork failed) kill the ones started.
  static Result<std::unique_ptr<CpuLoad>> Start(int processes);
  ~CpuLoad();  // Stop().
  CpuLoad(const CpuLoad&) = delete;
  CpuLoad& operator=(const CpuLoad&) = delete;

  const std::vector<pid_t>& pids() const { return pids_; }
  // How many children are still running (a child that died unexpectedly is a broken load).
  int Running() const;
  // SIGKILLs and reaps every child. Idempotent.
  void Stop();

 private:
  CpuLoad() = default;
  std::vector<pid_t> pids_;
};

class CpuQuota {
 public:
  // "" when a cgroup-v1 `cpu` hierarchy is mounted at /sys/fs/cgroup/cpu and writable; else
  // the reason a caller should skip the throttled variant.
  static std::string Unavailable();
  // A fresh cgroup under /sys/fs/cgroup/cpu limited to `cpus` CPUs (0.01..64) over a 100 ms
  // period.
  static Result<std::unique_ptr<CpuQuota>> Create(double cpus);
  ~CpuQuota();
  CpuQuota(const CpuQuota&) = delete;
  CpuQuota& operator=(const CpuQuota&) = delete;

  // Moves process `pid` (all its threads) into the cgroup.
  Status Add(pid_t pid);
  // Changes the limit.
  Status SetCpus(double cpus);
  const std::string& path() const { return path_; }

 private:
  CpuQuota() = default;
  std::string path_;
  std::vector<pid_t> added_;
};

}  // namespace tessera::testing
