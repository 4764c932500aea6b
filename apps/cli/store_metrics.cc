#include "apps/cli/store_metrics.h"

#include <cstdio>
#include <sstream>

#include "apps/cli/version.h"

namespace tessera::cli {
namespace {

// Label values escape backslash, quote and newline.
std::string Label(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

// Upper bounds of the latency histograms, in seconds: 10 us .. 10 s.
constexpr double kBucketsS[] = {10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3,
                                5e-3,  10e-3, 25e-3, 50e-3,  100e-3, 250e-3, 1.0,  10.0};

void Header(std::ostringstream& o, const char* name, const char* type, const char* help) {
  o << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n";
}

// Recorded values at most value_ns, found from the histogram's percentiles (to the
// resolution of its buckets): the largest n with Percentile(n / count) <= value_ns.
uint64_t CountAtOrBelow(const LatencyHistogram& h, uint64_t value_ns) {
  const uint64_t count = h.count();
  if (count == 0 || h.min() > value_ns) return 0;
  if (h.max() <= value_ns) return count;
  uint64_t lo = 0, hi = count;  // Percentile(lo / count) <= value_ns < Percentile(hi / count).
  while (hi - lo > 1) {
    const uint64_t mid = lo + (hi - lo) / 2;
    if (h.Percentile(static_cast<double>(mid) / static_cast<double>(count)) <= value_ns) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

std::string Num(double v) {
  char b[64];
  std::snprintf(b, sizeof(b), "%.9g", v);
  return b;
}

}  // namespace

std::string BuildInfoMetrics(const std::string& component) {
  std::ostringstream o;
  Header(o, "tessera_build_info", "gauge", "Always 1: the version and commit of this build.");
  o << "tessera_build_info{component=\"" << Label(component) << "\",version=\""
    << Label(version::Version()) << "\",commit=\"" << Label(version::Commit()) << "\"} 1\n";
  return o.str();
}

std::string StoreMetrics(const std::string& store_name, const client::PageStoreStats& s) {
  std::ostringstream o;
  const std::string l = "{store=\"" + Label(store_name) + "\"}";
  auto counter = [&](const char* name, const char* help, uint64_t v) {
    Header(o, name, "counter", help);
    o << name << l << " " << v << "\n";
  };
  auto gauge = [&](const char* name, const char* help, double v) {
    Header(o, name, "gauge", help);
    o << name << l << " " << Num(v) << "\n";
  };
  auto histogram = [&](const char* name, const char* help, const LatencyHistogram& h) {
    Header(o, name, "histogram", help);
    const std::string base = std::string(name);
    const std::string store = "store=\"" + Label(store_name) + "\"";
    for (double le : kBucketsS) {
      o << base << "_bucket{" << store << ",le=\"" << Num(le) << "\"} "
        << CountAtOrBelow(h, static_cast<uint64_t>(le * 1e9)) << "\n";
    }
    o << base << "_bucket{" << store << ",le=\"+Inf\"} " << h.count() << "\n";
    o << base << "_sum" << l << " " << Num(h.mean() * static_cast<double>(h.count()) / 1e9)
      << "\n";
    o << base << "_count" << l << " " << h.count() << "\n";
  };
  counter("tessera_client_reads_total", "Page reads completed.", s.reads);
  counter("tessera_client_writes_total", "Page writes completed.", s.writes);
  counter("tessera_client_read_errors_total", "Page reads that failed.", s.read_errors);
  counter("tessera_client_write_errors_total", "Page writes that failed.", s.write_errors);
  counter("tessera_client_degraded_reads_total",
          "Reads that needed parity (a piece missing, late or corrupt).", s.degraded_reads);
  counter("tessera_client_hedged_reads_total",
          "Reads that also asked the rest of the stripe after the hedge time (group layout).",
          s.hedged_reads);
  counter("tessera_client_decodes_total", "Reads that ran an erasure decode.", s.decodes);
  counter("tessera_client_corruptions_detected_total",
          "Pieces whose CRC did not match.", s.corruptions_detected);
  counter("tessera_client_corruptions_repaired_total",
          "Corrupt pieces rewritten correctly.", s.corruptions_repaired);
  counter("tessera_client_data_loss_total",
          "Reads that failed with DataLoss (more than r pieces lost).", s.data_loss);
  counter("tessera_client_server_failures_total", "Memory servers declared failed.",
          s.server_failures);
  counter("tessera_client_regenerations_total",
          "Lost pieces rebuilt onto replacement servers.", s.regenerations_done);
  gauge("tessera_client_regenerations_pending", "Lost pieces not rebuilt yet.",
        static_cast<double>(s.regenerations_pending));
  counter("tessera_client_bytes_sent_total", "Payload bytes written to memory servers.",
          s.bytes_sent);
  counter("tessera_client_bytes_received_total", "Payload bytes read from memory servers.",
          s.bytes_received);
  counter("tessera_client_direct_reads_total",
          "Pages read on the caller's own thread (run to completion).", s.direct_reads);
  counter("tessera_client_direct_fallbacks_total",
          "Direct reads handed to the store's I/O thread after all.", s.direct_fallbacks);
  gauge("tessera_client_remote_bytes", "Remote memory held now.",
        static_cast<double>(s.remote_bytes));
  const uint64_t direct = s.direct_reads + s.direct_fallbacks;
  gauge("tessera_client_direct_read_ratio",
        "Share (0..1) of direct reads served without a fallback.",
        direct ? static_cast<double>(s.direct_reads) / static_cast<double>(direct) : 0.0);
  gauge("tessera_client_degraded_read_ratio", "Share (0..1) of reads that were degraded.",
        s.reads ? static_cast<double>(s.degraded_reads) / static_cast<double>(s.reads) : 0.0);
  histogram("tessera_client_read_latency_seconds", "Page read latency, submit to completion.",
            s.read_latency);
  histogram("tessera_client_write_latency_seconds", "Page write latency, submit to completion.",
            s.write_latency);
  return o.str();
}

}  // namespace tessera::cli
