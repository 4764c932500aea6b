// Internal to kernel_shim/preload/: the shim's configuration, from the TESSERA_RUN_* variables
// `tessera run` sets (kernel_shim/preload/run_stats.h).
#pragma once

#include <cstdint>
#include <string>

#include "kernel_shim/pager/pager.h"
#include "kernel_shim/preload/run_stats.h"

#pragma GCC visibility push(hidden)
namespace tessera::kernel_shim::shim {

struct Config {
  std::string cluster, token, stats, live, log_level;
  int k = 4, r = 2;
  WriteTraps write_traps = WriteTraps::kAuto;  // kEnvWriteTraps: "0", "1" or "auto" (unset)
  bool inactive_list = true;   // kEnvInactiveList
  bool direct_reads = true;
  bool batch_faults = true;    // kEnvBatchFaults
  uint32_t fault_spin_us = 0;  // kEnvFaultSpin
  int direct_spin_us = -1;     // kEnvDirectSpin; -1: the store's default
  std::string layout;  // "" = the store's default
  bool follow = false;  // kEnvFollow: re-read the cluster file when it changes.
  LocalMemory local;
  CompressedTierSetting tier;  // kEnvCompressedTier
  uint64_t region = 8ull << 30;
  bool descendant = false;  // Exec'd by the program `tessera run` started, or its descendants.
};

// Copies the shim's variables into `c`. They (and LD_PRELOAD) stay in the environment, so the
// programs this one execs are paged too; kEnvDescendant tells them they are descendants.
// Without kEnvCluster (the library preloaded by hand) this library is removed from LD_PRELOAD
// and the result is false. True when configured; `error` is then set if a variable is bad.
bool TakeConfig(Config* c, std::string* error);

}  // namespace tessera::kernel_shim::shim
#pragma GCC visibility pop
