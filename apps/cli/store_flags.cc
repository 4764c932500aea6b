#include "apps/cli/store_flags.h"

#include <gflags/gflags.h>

DEFINE_int32(k, 4,
             "Data pieces of the erasure code, RS(k,r): 1, 2, 4, 8 or 16 (4096 must divide by "
             "k); a page's splits (split layout) or the pages of a stripe (group layout)");
DEFINE_int32(r, 2, "Parity pieces of the erasure code (1..4): memservers that may fail");
DEFINE_string(layout, "",
              "Erasure-coded layout: split (a page cut into k splits on k+r servers) or group "
              "(whole pages on one server each, k of them plus r parity pages per stripe); "
              "default: group");
DEFINE_int32(spares, -1,
             "Embedded cluster: memservers beyond k+r, replacements for regeneration (0..16; "
             "-1: r, so that writes still find k+r live servers after r failures)");
DEFINE_int32(io_threads, 1, "I/O threads of the page store (1..16)");
DEFINE_int32(metrics_port, -1,
             "Prometheus endpoint (GET /metrics) of the page store's client metrics; 0 = "
             "ephemeral (printed as `metrics on HOST:PORT`); -1 = off");

namespace tessera::cli {

std::vector<std::string> StoreFlagNames(unsigned groups) {
  std::vector<std::string> out;
  if (groups & kCodeFlags) out.insert(out.end(), {"k", "r", "layout"});
  if (groups & kEmbeddedFlags) out.push_back("spares");
  if (groups & kIoFlags) out.push_back("io_threads");
  if (groups & kMetricsFlags) out.push_back("metrics_port");
  if (groups & kClusterFlags) {
    out.insert(out.end(), {"cluster", "etcd", "cluster_name", "auth_token_file"});
  }
  return out;
}

void StoreFlags::ApplyTo(client::ErasureCodedStoreOptions* options) const {
  options->k = k;
  options->r = r;
  if (layout) options->layout = *layout;
  options->remote.io_threads = io_threads;
}

StoreFlags ReadStoreFlags(const CliSpec& spec) {
  StoreFlags f;
  if (FLAGS_k < 1 || FLAGS_k > 16 || 4096 % FLAGS_k != 0) {
    UsageError(spec, "--k must be 1, 2, 4, 8 or 16 (4096 must divide by k)");
  }
  if (FLAGS_r < 1 || FLAGS_r > 4) UsageError(spec, "--r must be in 1..4");
  if (!FLAGS_layout.empty()) {
    auto l = client::ParseEcLayout(FLAGS_layout);
    if (!l.ok()) UsageError(spec, "--layout must be split or group, not '" + FLAGS_layout + "'");
    f.layout = *l;
  }
  if (FLAGS_spares < -1 || FLAGS_spares > 16) {
    UsageError(spec, "--spares must be in 0..16 (or -1: r)");
  }
  if (FLAGS_io_threads < 1 || FLAGS_io_threads > 16) {
    UsageError(spec, "--io-threads must be in 1..16");
  }
  if (FLAGS_metrics_port < -1 || FLAGS_metrics_port > 65535) {
    UsageError(spec, "--metrics-port must be -1 (off) or in 0..65535");
  }
  f.k = FLAGS_k;
  f.r = FLAGS_r;
  f.spares = FLAGS_spares < 0 ? FLAGS_r : FLAGS_spares;
  f.io_threads = FLAGS_io_threads;
  f.metrics_port = FLAGS_metrics_port;
  return f;
}

}  // namespace tessera::cli
