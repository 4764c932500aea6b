// MemoryCgroup: one cgroup-v1 memory cgroup, owned by this object (RAII): created by Create(),
// its processes killed and the cgroup removed by Remove() or the destructor. The kernel-swap
// paths confine a program with it (`tessera run --pager swap`, the kernel-swap peers of the
// benches): memory.limit_in_bytes caps its resident memory, the rest is reclaimed to swap.
//
// Swap devices are global in Linux: cgroup v1 can cap how much swap a cgroup uses
// (memory.memsw.limit_in_bytes) but not which device it uses. While a swap device is on, any
// process on the machine under memory pressure may swap to it, in priority order.
//
// Threads: one owner thread. EnterFromChild() is async-signal-safe (for
// use between fork and exec).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace tessera::kernel_shim {

struct MemoryCgroupStats {
  uint64_t usage = 0;            // memory.usage_in_bytes
  uint64_t max_usage = 0;        // memory.max_usage_in_bytes (peak resident, page cache included)
  uint64_t memsw_max_usage = 0;  // memory.memsw.max_usage_in_bytes (peak resident + swap), 0 if
                                 // swap accounting is off
  uint64_t swap = 0;             // total_swap of memory.stat (bytes in swap now)
  uint64_t pgmajfault = 0;       // total_pgmajfault (swap-ins and file reads)
  uint64_t oom_kills = 0;        // oom_kill of memory.oom_control
  bool under_oom = false;        // under_oom of memory.oom_control
};

class MemoryCgroup {
 public:
  // Creates /sys/fs/cgroup/memory/NAME (NAME must not exist). Unsupported without root or a
  // cgroup-v1 memory controller; AlreadyExists if the cgroup exists.
  static Result<std::unique_ptr<MemoryCgroup>> Create(const std::string& name);
  ~MemoryCgroup();
  MemoryCgroup(const MemoryCgroup&) = delete;
  MemoryCgroup& operator=(const MemoryCgroup&) = delete;

  const std::string& path() const { return path_; }
  // memory.limit_in_bytes (EBUSY from the kernel, when it cannot reclaim down to it, is
  // returned as Unavailable).
  Status SetLimit(uint64_t bytes);
  // memory.oom_control: true stops the OOM killer for this cgroup (its tasks wait instead).
  Status SetOomKillDisable(bool disable);
  // memory.max_usage_in_bytes (and memsw) back to the current usage.
  Status ResetPeak();
  Status Add(pid_t pid);
  MemoryCgroupStats Stats() const;
  // SIGKILLs every process in the cgroup until it is empty (bounded: Timeout after 10 s).
  Status KillAll();
  // KillAll, then rmdir. Idempotent.
  Status Remove();
  // For a forked child before exec: writes its own pid to `procs_path` (path() +
  // "/cgroup.procs"); returns false on failure. Async-signal-safe.
  static bool EnterFromChild(const char* procs_path);

  // Whether this machine can run the kernel-swap paths: root, a cgroup-v1 memory controller
  // with swap accounting. Unsupported naming what is missing.
  static Status CheckSupported();

 private:
  MemoryCgroup() = default;
  std::string path_;
};

}  // namespace tessera::kernel_shim
