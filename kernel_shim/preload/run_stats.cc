#include "kernel_shim/preload/run_stats.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "common/units.h"

namespace tessera::kernel_shim {

Result<LocalMemory> ParseLocalMemory(std::string_view text) {
  LocalMemory lm;
  if (text.empty()) return lm;
  if (text.back() == '%') {
    std::string_view num = text.substr(0, text.size() - 1);
    if (num.empty() || num.size() > 3) return InvalidArgument("bad percentage '" + std::string(text) + "'");
    int p = 0;
    for (char c : num) {
      if (c < '0' || c > '9') return InvalidArgument("bad percentage '" + std::string(text) + "'");
      p = p * 10 + (c - '0');
    }
    if (p < 1 || p > 100) return InvalidArgument("local memory percentage must be in 1..100%");
    if (p < 100) lm.fraction = p / 100.0;
    return lm;
  }
  TESSERA_ASSIGN_OR_RETURN(uint64_t bytes, ParseSize(text));
  if (bytes < (1ull << 20)) return InvalidArgument("local memory below 1M: " + std::string(text));
  lm.bytes = bytes;
  return lm;
}

Result<CompressedTierSetting> ParseCompressedTier(std::string_view text) {
  CompressedTierSetting s;
  if (text == "off") return s;
  s.enabled = true;
  if (text == "auto") return s;
  auto bytes = ParseSize(text);
  if (!bytes.ok()) {
    return InvalidArgument("compressed tier '" + std::string(text) +
                           "': expected off, auto or a size such as 64M (" +
                           bytes.status().message() + ")");
  }
  if (*bytes < (1ull << 20)) {
    return InvalidArgument("compressed tier '" + std::string(text) + "': at least 1M");
  }
  s.capacity_bytes = *bytes;
  return s;
}

RunStats CollectRunStats(const PagerStats& p, const client::PageStoreStats& s, uint64_t elapsed_ns,
                         bool final) {
  RunStats r;
  r["faults"] = p.faults;
  r["wp_faults"] = p.wp_faults;
  r["zero_fills"] = p.zero_fills;
  r["zero_fill_around"] = p.zero_fill_around;
  r["zero_drops"] = p.zero_drops;
  r["trap_faults"] = p.trap_faults;
  r["traps_armed"] = p.traps_armed;
  r["trap_ioctls"] = p.trap_ioctls;
  r["fills_writable"] = p.fills_writable;
  r["remote_reads"] = p.remote_reads;
  r["remote_writes"] = p.remote_writes;
  r["clean_drops"] = p.clean_drops;
  r["evictions"] = p.evictions;
  r["throttle_giveups"] = p.throttle_giveups;
  r["prefetch_issued"] = p.prefetch_issued;
  r["prefetch_hits"] = p.prefetch_hits;
  r["discarded"] = p.discarded;
  r["deactivated"] = p.deactivated;
  r["minor_refaults"] = p.minor_refaults;
  r["inactive_drops"] = p.inactive_drops;
  r["staged_pages"] = p.staged_pages;
  r["inactive_target_pages"] = p.inactive_target_pages;
  r["spin_hits"] = p.spin_hits;
  r["fault_batches"] = p.fault_batches;
  r["fault_batch_pages"] = p.fault_batch_pages;
  r["fill_errors"] = p.fill_errors;
  r["fill_retries"] = p.fill_retries;
  r["writeback_errors"] = p.writeback_errors;
  r["resident_pages"] = p.resident_pages;
  r["peak_resident_pages"] = p.peak_resident_pages;
  r["footprint_pages"] = p.footprint_pages;
  r["peak_footprint_pages"] = p.peak_footprint_pages;
  r["limit_pages"] = p.limit_pages;
  r["fork_snapshots"] = p.fork_snapshots;
  r["fork_fallbacks"] = p.fork_fallbacks;
  r["fork_window_faults"] = p.fork_window_faults;
  r["fork_preserved"] = p.fork_preserved;
  r["fork_pinned"] = p.fork_pinned;
  r["fork_child_faults"] = p.fork_child_faults;
  r["fork_child_dropped"] = p.fork_child_dropped;
  r["fork_child_limit_pages"] = p.fork_child_limit_pages;
  r["fork_child_peak_resident_pages"] = p.fork_child_peak_resident_pages;
  r["fork_child_peak_dirty_pages"] = p.fork_child_peak_dirty_pages;
  r["fault_latency_count"] = p.fault_latency.count();
  r["fault_p50_ns"] = p.fault_latency.p50();
  r["fault_p99_ns"] = p.fault_latency.p99();
  // The histogram itself (its non-empty buckets), for `tessera run --metrics-port`.
  r["fault_latency_sum_ns"] = p.fault_latency.sum();
  for (int b = 0; b < LatencyHistogram::kBuckets; ++b) {
    if (p.fault_latency.bucket_count(b) != 0) {
      r[std::string(kFaultBucketPrefix) + std::to_string(b)] = p.fault_latency.bucket_count(b);
    }
  }
  r["store_reads"] = s.reads;
  r["store_writes"] = s.writes;
  r["store_read_errors"] = s.read_errors;
  r["store_write_errors"] = s.write_errors;
  r["store_degraded_reads"] = s.degraded_reads;
  r["store_decodes"] = s.decodes;
  r["store_data_loss"] = s.data_loss;
  r["store_server_failures"] = s.server_failures;
  r["store_server_suspicions"] = s.server_suspicions;
  r["store_server_recoveries"] = s.server_recoveries;
  r["store_bytes_sent"] = s.bytes_sent;
  r["store_bytes_received"] = s.bytes_received;
  r["store_regenerations_done"] = s.regenerations_done;
  r["store_direct_reads"] = s.direct_reads;
  r["store_direct_fallbacks"] = s.direct_fallbacks;
  r["store_direct_hedged"] = s.direct_hedged;
  r["store_direct_spin_hits"] = s.direct_spin_hits;
  r["store_direct_sleeps"] = s.direct_sleeps;
  r["store_read_p50_ns"] = s.read_latency.p50();
  r["store_read_p99_ns"] = s.read_latency.p99();
  r["elapsed_ns"] = elapsed_ns;
  r["final"] = final ? 1 : 0;
  return r;
}

void AddTierStats(const CompressedTierStats& t, RunStats* stats) {
  RunStats& r = *stats;
  r["tier_stored"] = t.stored;
  r["tier_admitted_clean"] = t.admitted_clean;
  r["tier_incompressible"] = t.incompressible;
  r["tier_kept_raw"] = t.kept_raw;
  r["tier_bypassed_full"] = t.bypassed_full;
  r["tier_hits"] = t.hits;
  r["tier_hits_near"] = t.hits_near;
  r["tier_shrinks"] = t.shrinks;
  r["tier_grows"] = t.grows;
  r["tier_misses"] = t.misses;
  r["tier_writebacks"] = t.writebacks;
  r["tier_writeback_errors"] = t.writeback_errors;
  r["tier_dropped"] = t.dropped;
  r["tier_entries"] = t.entries;
  r["tier_dirty_entries"] = t.dirty_entries;
  r["tier_compressed_bytes"] = t.compressed_bytes;
  r["tier_charged_bytes"] = t.charged_bytes;
  r["tier_capacity_bytes"] = t.capacity_bytes;
}

std::string FormatRunStats(const RunStats& stats, const std::string& error) {
  std::string out;
  for (const auto& [k, v] : stats) out += k + " " + std::to_string(v) + "\n";
  if (!error.empty()) {
    std::string e = error;
    for (char& c : e) if (c == '\n') c = ' ';
    out += "error " + e + "\n";
  }
  return out;
}

RunStats ParseRunStats(std::string_view text, std::string* error) {
  RunStats r;
  while (!text.empty()) {
    size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    size_t sp = line.find(' ');
    if (sp == std::string_view::npos) continue;
    std::string key(line.substr(0, sp));
    std::string_view val = line.substr(sp + 1);
    if (key == "error") {
      if (error) *error = std::string(val);
      continue;
    }
    uint64_t v = 0;
    bool ok = !val.empty();
    for (char c : val) {
      if (c < '0' || c > '9') { ok = false; break; }
      v = v * 10 + static_cast<uint64_t>(c - '0');
    }
    if (ok) r[key] = v;
  }
  return r;
}

RunStats MergeRunStats(const std::vector<RunStats>& each) {
  RunStats out;
  uint64_t processes = 0;
  for (const RunStats& s : each) {
    auto n = s.find("processes");
    processes += n == s.end() ? 1 : n->second;
    for (const auto& [key, v] : s) {
      if (key == "processes") continue;
      const bool largest = key.find("_p50_") != std::string::npos ||
                           key.find("_p99_") != std::string::npos || key == "elapsed_ns";
      auto it = out.find(key);
      if (key == "final") {
        out[key] = it == out.end() ? v : std::min(it->second, v);
      } else if (largest) {
        out[key] = it == out.end() ? v : std::max(it->second, v);
      } else {
        out[key] += v;
      }
    }
  }
  out["processes"] = processes;
  return out;
}

}  // namespace tessera::kernel_shim
