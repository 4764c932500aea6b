#include "apps/run/run_metrics.h"

#include <algorithm>

#include <cstdlib>

#include "common/histogram.h"
#include "common/prometheus.h"

namespace tessera::run {

namespace {

uint64_t Get(const kernel_shim::RunStats& s, const char* key) {
  auto it = s.find(key);
  return it == s.end() ? 0 : it->second;
}

}  // namespace

std::string RunMetrics(const kernel_shim::RunStats& s) {
  PrometheusWriter w;
  struct Count {
    const char* name;
    const char* key;
    const char* help;
  };
  static constexpr Count kCounters[] = {
      {"tessera_run_faults_total", "faults", "Page faults the pager served."},
      {"tessera_run_write_protect_faults_total", "wp_faults",
       "Write-protect faults (first writes to clean pages)."},
      {"tessera_run_remote_reads_total", "remote_reads", "Pages the pager read back."},
      {"tessera_run_remote_writes_total", "remote_writes", "Dirty pages written back."},
      {"tessera_run_evictions_total", "evictions", "Pages evicted to stay within the budget."},
      {"tessera_run_prefetch_issued_total", "prefetch_issued", "Pages read ahead."},
      {"tessera_run_prefetch_hits_total", "prefetch_hits", "Read-ahead pages used before eviction."},
      {"tessera_run_fault_batches_total", "fault_batches",
       "Wake-ups of a fault thread that served several queued faults together."},
      {"tessera_run_fill_errors_total", "fill_errors",
       "Faults the store could not serve (the page was poisoned: SIGBUS)."},
      {"tessera_run_fill_retries_total", "fill_retries",
       "Fault reads retried after a transient store error."},
      {"tessera_run_writeback_errors_total", "writeback_errors", "Write-backs that failed."},
      {"tessera_run_tier_hits_total", "tier_hits",
       "Faults served from the compressed tier (no network)."},
      {"tessera_run_tier_writebacks_total", "tier_writebacks",
       "Pages the compressed tier wrote back to the store."},
      {"tessera_run_store_degraded_reads_total", "store_degraded_reads",
       "Store reads that needed parity (a piece missing, late or corrupt)."},
      {"tessera_run_store_data_loss_total", "store_data_loss",
       "Store reads that failed with DataLoss (more than r pieces lost)."},
      {"tessera_run_store_server_suspicions_total", "store_server_suspicions",
       "Times a memory server became suspect."},
      {"tessera_run_store_server_recoveries_total", "store_server_recoveries",
       "Times a suspect memory server answered again."},
      {"tessera_run_store_server_failures_total", "store_server_failures",
       "Memory servers declared failed."},
      {"tessera_run_store_regenerations_total", "store_regenerations_done",
       "Lost pieces rebuilt onto replacement servers."},
      {"tessera_run_store_bytes_sent_total", "store_bytes_sent",
       "Payload bytes written to memory servers."},
      {"tessera_run_store_bytes_received_total", "store_bytes_received",
       "Payload bytes read from memory servers."},
      {"tessera_run_fork_snapshots_total", "fork_snapshots",
       "fork()s whose child shared the heap's pages through the store."},
      {"tessera_run_fork_fallbacks_total", "fork_fallbacks",
       "fork()s that paged the heap in first (the child got a full private copy)."},
      {"tessera_run_fork_child_faults_total", "fork_child_faults",
       "Faults of forked children served by this process's pager."},
      {"tessera_run_fork_preserved_total", "fork_preserved",
       "Store pages copied aside for a forked child before the parent overwrote them."},
      {"tessera_run_fork_pinned_total", "fork_pinned",
       "Write-backs held back for a forked child (no spare store page): pages kept local."},
  };
  for (const Count& c : kCounters) w.Counter(c.name, c.help, Get(s, c.key));
  w.Gauge("tessera_run_resident_pages", "Pages of the paged heap resident now.",
          static_cast<double>(Get(s, "resident_pages")));
  w.Gauge("tessera_run_footprint_pages", "Pages of the paged heap in use now (resident or not).",
          static_cast<double>(Get(s, "footprint_pages")));
  w.Gauge("tessera_run_limit_pages", "The local-memory budget in pages (0: none).",
          static_cast<double>(Get(s, "limit_pages")));
  w.Gauge("tessera_run_tier_charged_bytes",
          "Local memory the compressed tier holds, charged to the budget.",
          static_cast<double>(Get(s, "tier_charged_bytes")));
  // Resident pages can be over the limit for a moment (a fault maps its pages before the
  // evictor makes room): the ratio says "all of it" then, and the two gauges above show by how
  // much.
  w.Ratio("tessera_run_resident_ratio", "Share (0..1) of the budget in use.",
          std::min(Get(s, "resident_pages"), Get(s, "limit_pages")), Get(s, "limit_pages"));
  w.Ratio("tessera_run_tier_hit_ratio", "Share (0..1) of faults served by the compressed tier.",
          Get(s, "tier_hits"), Get(s, "faults"));
  w.Gauge("tessera_run_elapsed_seconds", "Time since the program started.",
          static_cast<double>(Get(s, "elapsed_ns")) / 1e9);
  const std::string prefix = kernel_shim::kFaultBucketPrefix;
  w.LatencyHistogramSeconds(
      "tessera_run_fault_latency_seconds", "Page fault latency, fault to page mapped.",
      [&](int b) { return Get(s, (prefix + std::to_string(b)).c_str()); },
      Get(s, "fault_latency_sum_ns"));
  return w.str();
}

}  // namespace tessera::run
