// The channel between the LD_PRELOAD shim (libtessera_preload.so, inside the paged program)
// and the launcher (`tessera run`): the environment variables that configure the shim, and the
// stats file the shim writes (a live snapshot rewritten about twice a second, and a final one
// at exit). The file is plain text, one `key value` per line, written to a temporary name and
// renamed, so a reader never sees half a file.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "client/page_store.h"
#include "common/status.h"
#include "kernel_shim/pager/compressed_tier.h"
#include "kernel_shim/pager/pager.h"

namespace tessera::kernel_shim {

// Environment variables read by the shim. They stay in the environment it passes on, with
// LD_PRELOAD, so the programs the paged program execs are paged too (kEnvDescendant).
inline constexpr const char* kEnvCluster = "TESSERA_RUN_CLUSTER";  // cluster file (required)
inline constexpr const char* kEnvToken = "TESSERA_RUN_TOKEN";      // auth token file
inline constexpr const char* kEnvK = "TESSERA_RUN_K";
inline constexpr const char* kEnvR = "TESSERA_RUN_R";
inline constexpr const char* kEnvLocal = "TESSERA_RUN_LOCAL";      // "50%", bytes, or "" (none)
inline constexpr const char* kEnvRegion = "TESSERA_RUN_REGION";    // paged region, bytes
inline constexpr const char* kEnvStats = "TESSERA_RUN_STATS";      // final stats file
inline constexpr const char* kEnvLive = "TESSERA_RUN_LIVE";        // live stats file
inline constexpr const char* kEnvLogLevel = "TESSERA_RUN_LOG_LEVEL";
// "off", "auto" or a size: the compressed local tier (kernel_shim/pager/compressed_tier.h).
inline constexpr const char* kEnvCompressedTier = "TESSERA_RUN_COMPRESSED_TIER";
inline constexpr const char* kEnvLayout = "TESSERA_RUN_LAYOUT";  // "split" or "group"
inline constexpr const char* kEnvWriteTraps = "TESSERA_RUN_WRITE_TRAPS";  // "0", "1", "auto"
// "0": no inactive list, victims are written back at once (PagerOptions::inactive_list).
inline constexpr const char* kEnvInactiveList = "TESSERA_RUN_INACTIVE_LIST";
// "0": a fault thread serves the faults of one wake-up one by one (PagerOptions::batch_faults).
inline constexpr const char* kEnvBatchFaults = "TESSERA_RUN_BATCH_FAULTS";
// "0": fault threads read through the store's I/O thread (RemoteStoreOptions::direct_reads).
inline constexpr const char* kEnvDirectReads = "TESSERA_RUN_DIRECT_READS";
// Microseconds (0..1000) a fault thread polls the userfaultfd after serving a fault before it
// sleeps in poll() (PagerOptions::fault_spin_us); "0" or unset: it sleeps at once.
inline constexpr const char* kEnvFaultSpin = "TESSERA_RUN_FAULT_SPIN_US";
// Microseconds (0..1000) a direct (run-to-completion) read polls for its reply before it sleeps
// (RemoteStoreOptions::direct_spin_us); unset: the store's default.
inline constexpr const char* kEnvDirectSpin = "TESSERA_RUN_DIRECT_SPIN_US";
// "1": the cluster file is rewritten while the program runs (`tessera run --etcd` mirrors etcd's
// membership into it, atomically by rename); the shim re-reads it when it changes and adds the
// new servers to its store / treats the vanished ones as failed. libcurl (etcd) is never loaded
// into the paged program: the launcher watches etcd.
inline constexpr const char* kEnvFollow = "TESSERA_RUN_FOLLOW";
// Set by the shim of the program `tessera run` started (to its pid), for the programs it and
// its descendants exec: they are paged too, each by its own pager and store (one local-memory
// budget per process), and write their final stats to `<kEnvStats>.<pid>` (no live stats). A
// program exec'd in place of the first one (same pid) counts as the first.
inline constexpr const char* kEnvDescendant = "TESSERA_RUN_DESCENDANT";
inline constexpr const char* kPreloadName = "libtessera_preload.so";

// The local-memory setting: a fixed byte cap, or a fraction of the peak footprint.
struct LocalMemory {
  uint64_t bytes = 0;    // Fixed cap (0: none).
  double fraction = 0;   // In (0, 1]; 0: none.
};
// "50%" (1..100%), "512M", "2G", "1048576" (K/M/G suffixes, powers of 1024), or "100%"/"" for
// no limit. InvalidArgument otherwise.
Result<LocalMemory> ParseLocalMemory(std::string_view text);

// The compressed tier setting (CompressedTier), `tessera run --compressed-tier off|auto|SIZE`.
struct CompressedTierSetting {
  bool enabled = false;
  uint64_t capacity_bytes = 0;  // SIZE; 0 with enabled: auto (a share of the local budget).
};
// "off", "auto", or a size ("64M", "1G", bytes; at least 1M). InvalidArgument otherwise.
Result<CompressedTierSetting> ParseCompressedTier(std::string_view text);

using RunStats = std::map<std::string, uint64_t>;
// Keys "fault_latency_b<i>": the count of LatencyHistogram bucket i of the fault latency (only
// non-empty buckets are written); "fault_latency_sum_ns" is the histogram's sum.
inline constexpr const char* kFaultBucketPrefix = "fault_latency_b";

// The figures the shim publishes. `final` is 1 in the last snapshot written at exit.
RunStats CollectRunStats(const PagerStats& pager, const client::PageStoreStats& store,
                         uint64_t elapsed_ns, bool final);
// Adds the compressed tier's figures (keys tier_*) to `stats`.
void AddTierStats(const CompressedTierStats& tier, RunStats* stats);
std::string FormatRunStats(const RunStats& stats, const std::string& error = "");
// Parses FormatRunStats' output; `error` receives the shim's error line, if any.
RunStats ParseRunStats(std::string_view text, std::string* error = nullptr);
// The stats of a process tree: per-process stats summed, except latency percentiles and
// elapsed time (the largest) and `final` (1 only if every process wrote its final stats).
// "processes" counts the processes merged (an input that is a merge itself counts as its
// "processes").
RunStats MergeRunStats(const std::vector<RunStats>& each);

}  // namespace tessera::kernel_shim
