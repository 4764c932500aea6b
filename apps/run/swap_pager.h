// `tessera run --pager swap`: runs PROGRAM, and every process it starts, in a cgroup-v1 memory
// cgroup whose limit follows P% of its peak footprint (resident + swapped, like the uffd pager's
// --local-memory P%) or a fixed size, with a private `tessera swap` device (started for the run
// at the highest swap priority, stopped after it) taking what the limit pushes out.
//
// The swap device is global while it is on (Linux cannot bind a swap device to a cgroup): other
// processes of the machine that come under memory pressure during the run may swap to it too,
// first of all devices (priority 32767). The run's summary counts the whole device.
#pragma once

#include <string>
#include <vector>

namespace tessera::run {

struct SwapPagerOptions {
  std::string bin_dir;                  // Holds tessera-swap.
  std::vector<std::string> argv;        // PROGRAM (resolved path) and its arguments.
  double fraction = 0;                  // Limit: this share of the peak footprint, or
  uint64_t fixed_bytes = 0;             // ... this many bytes (one of the two).
  uint64_t swap_bytes = 8ull << 30;     // Size of the private swap device.
  std::vector<std::string> swap_flags;  // Passed to `tessera swap on` (--cluster, --k, ...).
  std::string local_memory_text;        // As given, for the summary.
  std::string stats_json;               // "" or where to write the summary as JSON.
  // "" or a file rewritten twice a second with `key value` lines, under the uffd pager's names
  // where the meaning is the same: elapsed_ns, faults (the cgroup's major faults: swap-ins),
  // remote_reads and remote_writes (device pages), store_read_p50_ns and store_read_p99_ns,
  // store_degraded_reads, store_data_loss (lost pages), store_server_failures,
  // store_regenerations_done, limit_bytes, final (1 in the last rewrite, after the program).
  std::string live_stats_file;
  bool summary = true;
  double term_grace_s = 10;
};

// Returns the exit code `tessera run` exits with (the program's; 128+N for signal N; 1 when the
// swap path cannot be set up, with the reason on stderr).
int RunWithSwapPager(const SwapPagerOptions& options);

}  // namespace tessera::run
