#include "apps/cli/store_metrics.h"

#include <cstdio>

#include "apps/cli/version.h"
#include "common/prometheus.h"

namespace tessera::cli {

std::string StoreMetrics(const std::string& store_name, const client::PageStoreStats& s) {
  PrometheusWriter w("store=\"" + PrometheusLabel(store_name) + "\"");
  w.Counter("tessera_client_reads_total", "Page reads completed.", s.reads);
  w.Counter("tessera_client_writes_total", "Page writes completed.", s.writes);
  w.Counter("tessera_client_trims_total", "Pages trimmed (their remote copies freed).", s.trims);
  w.Counter("tessera_client_read_errors_total", "Page reads that failed.", s.read_errors);
  w.Counter("tessera_client_write_errors_total", "Page writes that failed.", s.write_errors);
  w.Counter("tessera_client_degraded_reads_total",
            "Reads that needed parity (a piece missing, late or corrupt).", s.degraded_reads);
  w.Counter("tessera_client_hedged_reads_total",
            "Reads that also asked the rest of the stripe after the hedge time (group layout).",
            s.hedged_reads);
  w.Counter("tessera_client_decodes_total", "Reads that ran an erasure decode.", s.decodes);
  w.Counter("tessera_client_corruptions_detected_total", "Pieces whose CRC did not match.",
            s.corruptions_detected);
  w.Counter("tessera_client_corruptions_repaired_total", "Corrupt pieces rewritten correctly.",
            s.corruptions_repaired);
  w.Counter("tessera_client_data_loss_total",
            "Reads that failed with DataLoss (more than r pieces lost).", s.data_loss);
  w.Counter("tessera_client_server_suspicions_total",
            "Times a memory server became suspect (asked last, never waited on).",
            s.server_suspicions);
  w.Counter("tessera_client_server_recoveries_total",
            "Times a suspect memory server answered again and was healthy.", s.server_recoveries);
  w.Counter("tessera_client_server_failures_total", "Memory servers declared failed.",
            s.server_failures);
  w.Counter("tessera_client_verdicts_held_total",
            "Failure verdicts on silence held back: failing the server would have lost data.",
            s.verdicts_held);
  w.Counter("tessera_client_reconnects_total", "Data connections re-established.", s.reconnects);
  w.Counter("tessera_client_stale_repairs_total",
            "Pieces a write could not store at once, rewritten once their server was back.",
            s.stale_repairs);
  w.Counter("tessera_client_allocs_abandoned_total",
            "Slab allocations given up on a server that turned suspect, and asked elsewhere.",
            s.allocs_abandoned);
  w.Counter("tessera_client_regenerations_total", "Lost pieces rebuilt onto replacement servers.",
            s.regenerations_done);
  w.Gauge("tessera_client_regenerations_pending", "Lost pieces not rebuilt yet.",
          static_cast<double>(s.regenerations_pending));
  w.Counter("tessera_client_bytes_sent_total", "Payload bytes written to memory servers.",
            s.bytes_sent);
  w.Counter("tessera_client_bytes_received_total", "Payload bytes read from memory servers.",
            s.bytes_received);
  w.Counter("tessera_client_compaction_moves_total",
            "Live pages re-striped by compaction (group layout).", s.compaction_moves);
  w.Counter("tessera_client_direct_reads_total",
            "Pages read on the caller's own thread (run to completion).", s.direct_reads);
  w.Counter("tessera_client_direct_fallbacks_total",
            "Direct reads handed to the store's I/O thread after all.", s.direct_fallbacks);
  w.Counter("tessera_client_direct_hedged_total",
            "Direct reads handed over because a server had not answered within the hedge time.",
            s.direct_hedged);
  w.Gauge("tessera_client_remote_bytes", "Remote memory held now.",
          static_cast<double>(s.remote_bytes));
  w.Gauge("tessera_client_stored_pages", "Pages stored in sealed stripes now (group layout).",
          static_cast<double>(s.stored_pages));
  w.Ratio("tessera_client_direct_read_ratio",
          "Share (0..1) of direct reads served without a fallback.", s.direct_reads,
          s.direct_reads + s.direct_fallbacks);
  w.Ratio("tessera_client_degraded_read_ratio", "Share (0..1) of reads that were degraded.",
          s.degraded_reads, s.reads);
  w.LatencyHistogramSeconds("tessera_client_read_latency_seconds",
                            "Page read latency, submit to completion.", s.read_latency);
  w.LatencyHistogramSeconds("tessera_client_write_latency_seconds",
                            "Page write latency, submit to completion.", s.write_latency);
  return w.str();
}

Result<std::unique_ptr<memserver::MetricsHttpServer>> ServeClientMetrics(
    const std::string& host, int port, const std::string& component, client::PageStore* store,
    std::function<std::string()> extra, FILE* announce) {
  std::string build_info = version::PrometheusBuildInfo(component);
  TESSERA_ASSIGN_OR_RETURN(
      auto server,
      memserver::MetricsHttpServer::Start(
          host, static_cast<uint16_t>(port),
          [build_info = std::move(build_info), store, extra = std::move(extra)] {
            return build_info + (store ? StoreMetrics(store->name(), store->Stats()) : "") +
                   (extra ? extra() : "");
          }));
  std::fprintf(announce, "metrics on %s:%u\n", host.c_str(), static_cast<unsigned>(server->port()));
  std::fflush(announce);
  return server;
}

}  // namespace tessera::cli
