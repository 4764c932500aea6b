// SwapCgroup: the Linux-swap peer of the paging benches. A swapfile (written out, mkswap'd,
// swapon'd) plus a cgroup-v1 memory cgroup whose limit plays the role of `--local-memory`.
// Both are removed on every exit path: Teardown(), the destructor, exit() (atexit) and
// SIGINT/SIGTERM/SIGHUP (the handler tears down, then re-raises with the default action).
//
// Ownership and threads: one per process (the signal and atexit handlers reach it through a
// process-wide pointer), created and used by the bench's main thread only. Teardown is
// async-signal-safe (rmdir, swapoff, unlink on fixed buffers).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace tessera::bench {

class SwapCgroup {
 public:
  SwapCgroup() = default;
  ~SwapCgroup() { Teardown(); }
  SwapCgroup(const SwapCgroup&) = delete;
  SwapCgroup& operator=(const SwapCgroup&) = delete;

  // Creates DIR/NAME-swap-PID of `swap_bytes` and /sys/fs/cgroup/memory/NAME-PID.
  // Unsupported without root or a cgroup-v1 memory controller; the caller then skips the swap
  // column and says why. Call once.
  Status Setup(const std::string& swap_dir, const std::string& name, uint64_t swap_bytes);
  // Sets memory.limit_in_bytes of the cgroup.
  Status SetLimit(uint64_t bytes);
  // argv that runs `argv` inside the cgroup (a shell moves itself in, then execs).
  std::vector<std::string> Wrap(const std::vector<std::string>& argv) const;
  // Removes the cgroup and the swapfile. Idempotent.
  void Teardown();

  bool active() const { return cgroup_[0] != 0; }

 private:
  char swapfile_[256] = {};
  char cgroup_[256] = {};
  std::atomic<bool> swap_on_{false};
};

}  // namespace tessera::bench
