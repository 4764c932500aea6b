// `tessera nbd`: serves the resilient page store as Network Block Device exports.
//
// Without --cluster it starts an embedded local cluster (k+2r real memservers on loopback,
// one spare for regeneration) and tears it down on SIGINT/SIGTERM; with --cluster it uses the
// servers of a cluster file. Each export is a page-aligned range of one erasure-coded store.
// Prints `nbd export "NAME" SIZE bytes (...) on nbd://HOST:PORT/NAME` per export once ready.
#include <gflags/gflags.h>
#include <signal.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "apps/cli/cli.h"
#include "apps/cli/membership_cli.h"
#include "apps/cli/store_flags.h"
#include "apps/cli/store_metrics.h"
#include "client/local_cluster.h"
#include "client/page_store.h"
#include "client/remote_store.h"
#include "common/prometheus.h"
#include "common/subprocess.h"
#include "common/units.h"
#include "fabric/auth.h"
#include "fabric/credential.h"
#include "kernel_shim/nbd/export_state.h"
#include "kernel_shim/nbd/nbd_server.h"
#include "memserver/http_metrics.h"

DEFINE_string(size, "", "Size of the export, e.g. 1G (required unless --exports is given)");
DEFINE_string(name, "tessera", "Name of the export");
DEFINE_string(exports, "", "Several exports instead of --size/--name: NAME=SIZE,NAME=SIZE,...");
DEFINE_string(listen, "127.0.0.1:10809", "TCP address to listen on, HOST:PORT (port 0: ephemeral)");
DEFINE_string(unix, "", "Listen on this unix socket instead of TCP");
DEFINE_bool(direct_reads, true,
            "Run-to-completion READs (group layout): each connection's reader thread reads the "
            "pages of a READ itself, on its own connections to the servers holding them, with many "
            "reads in flight; --nodirect_reads hands every read to the page store's I/O thread");
DEFINE_int32(direct_spin_us, 100,
             "With direct reads in flight and no request waiting, a connection's reader polls for "
             "twice the recent reply time, at most this long (0..1000 us; 0: never), before it "
             "sleeps");
DEFINE_bool(print_cluster, true, "Print the embedded cluster's file and token paths");
DEFINE_string(state_file, "",
              "Export state file (one per export set). The export's page map lives only in this "
              "process, so a later run cannot read back what this one stored: the file records "
              "durably, before the first write reaches the store, that this run changes data, "
              "and a later run over it refuses to start (rather than serve zeros) until it is "
              "deleted. Required unless --ephemeral");
DEFINE_bool(ephemeral, false,
            "Serve a device that starts empty on every start and whose contents end with this "
            "process, without a --state_file (for scratch space, tests and benchmarks)");

namespace tessera {
namespace {

const cli::CliSpec kSpec = {
    "tessera nbd",
    "--size SIZE [--name EXPORT] | --exports NAME=SIZE,... [--cluster FILE | --etcd ENDPOINTS "
    "--cluster_name NAME] "
    "[--auth_token_file F] "
    "(--state_file PATH | --ephemeral) [--k 4 --r 2] [--layout split|group] [--nodirect_reads] "
    "[--listen HOST:PORT | --unix PATH]",
    "Serves the erasure-coded page store as Network Block Device exports (fixed newstyle,\n"
    "structured replies, READ/WRITE/FUA/FLUSH/TRIM/WRITE_ZEROES, multi-connection). Without\n"
    "--cluster or --etcd it starts k+2r memservers on loopback and stops them on SIGINT/SIGTERM;\n"
    "with --etcd it follows the servers registered in etcd (joins used, leaves regenerated).\n"
    "Any NBD client works: nbdinfo/nbdsh/nbdcopy nbd://127.0.0.1:10809/tessera, qemu-img,\n"
    "qemu-io; as swap on a machine with the nbd kernel module:\n"
    "  modprobe nbd; nbd-client 127.0.0.1 10809 /dev/nbd0 -N tessera; mkswap /dev/nbd0;\n"
    "  swapon /dev/nbd0\n"
    "(a machine without /sys/module/nbd and no loadable nbd module cannot do the last step).\n"
    "The device's contents live as long as this process: with --state_file a restart after\n"
    "writes refuses to serve (the blocks cannot be found again) instead of reading zeros;\n"
    "--ephemeral serves a fresh empty device on every start (docs/guides/data-safety.md).",
    __FILE__,
    0,
    0,
    cli::StoreFlagNames(cli::kCodeFlags | cli::kEmbeddedFlags | cli::kIoFlags |
                        cli::kMetricsFlags | cli::kClusterFlags)};

int g_signal_pipe = -1;
void OnSignal(int sig) {
  const unsigned char b = static_cast<unsigned char>(sig);
  [[maybe_unused]] ssize_t n = ::write(g_signal_pipe, &b, 1);
}

std::string Human(uint64_t bytes) { return tessera::FormatSize(bytes); }

// The NBD front end's own metrics, beside the page store's (apps/cli/store_metrics.h).
std::string NbdMetrics(const nbd::NbdServerStats& n, size_t active) {
  PrometheusWriter w;
  w.Counter("tessera_nbd_connections_total", "NBD connections accepted.", n.connections);
  w.Gauge("tessera_nbd_connections", "NBD connections open now.", static_cast<double>(active));
  w.Counter("tessera_nbd_requests_total", "NBD requests served.", n.requests);
  w.Counter("tessera_nbd_request_errors_total", "NBD requests answered with an error.",
            n.errors_replied);
  w.Counter("tessera_nbd_bytes_read_total", "Bytes NBD clients read.", n.bytes_read);
  w.Counter("tessera_nbd_bytes_written_total", "Bytes NBD clients wrote.", n.bytes_written);
  w.Counter("tessera_nbd_trimmed_pages_total", "Pages trimmed by TRIM and WRITE_ZEROES.",
            n.trimmed_pages);
  w.Counter("tessera_nbd_rmw_pages_total",
            "Edge pages of unaligned requests served by read-modify-write.", n.rmw_pages);
  w.Counter("tessera_nbd_retried_ops_total",
            "Page operations resubmitted after failing with Unavailable.", n.retried_ops);
  return w.str();
}

int Main(int argc, char** argv) {
  cli::InitCli(kSpec, &argc, &argv);
  const cli::StoreFlags sf = cli::ReadStoreFlags(kSpec);
  const cli::ClusterFlags cf = cli::ReadClusterFlags(kSpec);
  if (FLAGS_direct_spin_us < 0 || FLAGS_direct_spin_us > 1000) {
    cli::UsageError(kSpec, "--direct_spin_us must be in 0..1000");
  }

  if (FLAGS_state_file.empty() == !FLAGS_ephemeral) {
    cli::UsageError(kSpec, FLAGS_ephemeral
                               ? "give --state_file or --ephemeral, not both"
                               : "--state_file PATH is required (or --ephemeral for a device "
                                 "that starts empty on every start): without it a restarted "
                                 "export could not tell that its blocks were lost");
  }
  // The state file first: a restart after writes refuses before touching the memservers.
  std::unique_ptr<nbd::ExportStateFile> state;
  if (!FLAGS_state_file.empty()) {
    auto s = nbd::ExportStateFile::Open(FLAGS_state_file);
    if (!s.ok()) {
      std::fprintf(stderr, "tessera nbd: refusing to serve: %s\n", s.status().ToString().c_str());
      return 1;
    }
    state = std::move(*s);
  }

  // Exports.
  std::vector<std::pair<std::string, uint64_t>> sizes;
  if (!FLAGS_exports.empty()) {
    if (!FLAGS_size.empty()) cli::UsageError(kSpec, "give either --size or --exports, not both");
    std::string_view rest = FLAGS_exports;
    while (!rest.empty()) {
      const size_t comma = rest.find(',');
      std::string_view item = rest.substr(0, comma);
      rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
      const size_t eq = item.find('=');
      if (eq == std::string_view::npos || eq == 0) {
        cli::UsageError(kSpec, "--exports wants NAME=SIZE items, got '" + std::string(item) + "'");
      }
      auto bytes = tessera::ParseSize(item.substr(eq + 1));
      if (!bytes.ok() || *bytes == 0) {
        cli::UsageError(kSpec, "bad size in --exports item '" + std::string(item) + "'");
      }
      sizes.emplace_back(std::string(item.substr(0, eq)), *bytes);
    }
  } else {
    if (FLAGS_size.empty()) cli::UsageError(kSpec, "--size is required");
    auto bytes = tessera::ParseSize(FLAGS_size);
    if (!bytes.ok() || *bytes == 0) cli::UsageError(kSpec, "bad --size '" + FLAGS_size + "'");
    sizes.emplace_back(FLAGS_name, *bytes);
  }
  uint64_t total_pages = 0;
  nbd::NbdServerOptions so;
  so.exports = nbd::LayOutExports(sizes, &total_pages);
  so.direct_reads = FLAGS_direct_reads;
  so.direct_spin_us = static_cast<uint32_t>(FLAGS_direct_spin_us);
  if (state) {
    nbd::ExportStateFile* sf = state.get();
    so.before_change = [sf] { return sf->RecordWritten(); };
  }
  if (total_pages > (1ull << 30)) cli::UsageError(kSpec, "exports larger than 4 TiB in total");
  for (auto& e : so.exports) {
    e.description = "Tessera page store, RS(" + std::to_string(sf.k) + "," +
                    std::to_string(sf.r) + ")";
  }

  // SIGINT/SIGTERM, on whichever thread they land, write their number to a pipe the main
  // thread waits on (handlers, unlike a blocked mask, are not inherited by the memservers).
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) {
    std::perror("tessera nbd: pipe2");
    return 1;
  }
  g_signal_pipe = pipe_fds[1];
  struct sigaction sa{};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  std::unique_ptr<client::LocalCluster> cluster;
  client::ErasureCodedStoreOptions eo;
  auto source = cli::ResolveCluster(cf.cluster, cf.etcd, cf.cluster_name);
  if (!source.ok() && source.status().code() == StatusCode::kInvalidArgument) {
    cli::UsageError(kSpec, source.status().message());
  }
  if (!source.ok() && source.status().code() != StatusCode::kNotFound) {
    std::fprintf(stderr, "tessera nbd: %s\n", source.status().ToString().c_str());
    return 1;
  }
  if (!source.ok()) {
    client::LocalClusterOptions lo;
    lo.bin_dir = SelfExeDir();
    lo.servers = sf.EmbeddedServers();
    // Each server holds 1/k of the pages it is given splits of; every server may get splits
    // of any page, so give each room for total/k plus slab rounding and the spare's share.
    const uint64_t per_server_mb =
        total_pages * client::kPageSize / static_cast<uint64_t>(sf.k) / (1 << 20);
    lo.capacity = std::to_string(per_server_mb * 2 + 16) + "M";
    lo.slab_size = "1M";
    std::fprintf(stderr, "tessera nbd: starting %zu memservers on loopback...\n", lo.servers);
    auto c = client::LocalCluster::Start(lo);
    if (!c.ok()) {
      std::fprintf(stderr, "tessera nbd: %s\n", c.status().ToString().c_str());
      return 1;
    }
    cluster = std::move(*c);
    for (const auto& ep : cluster->endpoints()) eo.remote.servers.push_back({ep, ""});
    eo.remote.secret = cluster->secret();
  } else {
    auto cred = fabric::LoadCredential(cf.auth_token_file, "tessera nbd");
    if (!cred.ok()) {
      std::fprintf(stderr, "tessera nbd: %s\n", cred.status().ToString().c_str());
      return 1;
    }
    eo.remote.servers = source->servers;
    eo.remote.secret = cred->key;
    eo.remote.client_id = cred->client_id;  // 0 (the cluster secret): a random id.
  }
  eo.remote.capacity_pages = total_pages;
  eo.remote.direct_reads = FLAGS_direct_reads;
  sf.ApplyTo(&eo);
  auto store_or = client::CreateErasureCodedStore(eo);
  if (!store_or.ok()) {
    std::fprintf(stderr, "tessera nbd: %s\n", store_or.status().ToString().c_str());
    return 1;
  }
  std::unique_ptr<client::RemotePageStore> store = std::move(*store_or);
  // --etcd: new servers are used for new slabs, a vanished registration is a failure signal.
  std::unique_ptr<membership::StoreFollower> follower;
  if (source.ok() && source->from_etcd()) {
    auto f = membership::StoreFollower::Start(source->view.get(), store.get());
    if (!f.ok()) {
      std::fprintf(stderr, "tessera nbd: %s\n", f.status().ToString().c_str());
      return 1;
    }
    follower = std::move(*f);
    std::fprintf(stderr, "tessera nbd: %zu memservers from etcd cluster '%s', following changes\n",
                 source->servers.size(), cf.cluster_name.c_str());
  }

  auto server_or = nbd::NbdServer::Create(store.get(), so);
  if (!server_or.ok()) {
    std::fprintf(stderr, "tessera nbd: %s\n", server_or.status().ToString().c_str());
    return 1;
  }
  nbd::NbdServer& server = **server_or;
  std::string uri_base;
  if (!FLAGS_unix.empty()) {
    Status st = server.ListenUnix(FLAGS_unix);
    if (!st.ok()) {
      std::fprintf(stderr, "tessera nbd: %s\n", st.ToString().c_str());
      return 1;
    }
  } else {
    const size_t colon = FLAGS_listen.rfind(':');
    if (colon == std::string::npos) cli::UsageError(kSpec, "--listen wants HOST:PORT");
    std::string host = FLAGS_listen.substr(0, colon);
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
    char* end = nullptr;
    const unsigned long port = std::strtoul(FLAGS_listen.c_str() + colon + 1, &end, 10);
    if (end == FLAGS_listen.c_str() + colon + 1 || *end != '\0' || port > 65535) {
      cli::UsageError(kSpec, "bad port in --listen '" + FLAGS_listen + "'");
    }
    auto bound = server.ListenTcp(host, static_cast<uint16_t>(port));
    if (!bound.ok()) {
      std::fprintf(stderr, "tessera nbd: %s\n", bound.status().ToString().c_str());
      return 1;
    }
    const std::string shown = host.find(':') != std::string::npos ? "[" + host + "]" : host;
    uri_base = "nbd://" + (host.empty() ? std::string("0.0.0.0") : shown) + ":" + std::to_string(*bound) + "/";
  }
  Status st = server.Start();
  if (!st.ok()) {
    std::fprintf(stderr, "tessera nbd: %s\n", st.ToString().c_str());
    return 1;
  }
  if (cluster && FLAGS_print_cluster) {
    std::printf("embedded cluster: %zu memservers, cluster file %s, auth token %s\n",
                cluster->size(), cluster->cluster_file_path().c_str(), cluster->token_path().c_str());
  }
  std::printf("page store: %s, %llu pages\n", store->name().c_str(),
              static_cast<unsigned long long>(total_pages));
  std::unique_ptr<memserver::MetricsHttpServer> metrics;
  if (sf.metrics_port >= 0) {
    nbd::NbdServer* n = &server;
    auto m = cli::ServeClientMetrics("127.0.0.1", sf.metrics_port, "nbd", store.get(), [n] {
      return NbdMetrics(n->Stats(), n->active_connections());
    });
    if (!m.ok()) {
      std::fprintf(stderr, "tessera nbd: metrics: %s\n", m.status().ToString().c_str());
      return 1;
    }
    metrics = std::move(*m);
  }
  for (const auto& e : so.exports) {
    const std::string uri = FLAGS_unix.empty() ? uri_base + e.name
                                               : "nbd+unix:///" + e.name + "?socket=" + FLAGS_unix;
    std::printf("nbd export \"%s\" %llu bytes (%s) on %s\n", e.name.c_str(),
                static_cast<unsigned long long>(e.size_bytes), Human(e.size_bytes).c_str(), uri.c_str());
  }
  std::fflush(stdout);
  if (::access("/sys/module/nbd", F_OK) != 0) {
    std::fprintf(stderr,
                 "tessera nbd: note: this machine has no nbd kernel module loaded "
                 "(/sys/module/nbd is missing), so /dev/nbdN (and swap on it) is not available "
                 "here; user-space NBD clients (nbdinfo, nbdcopy, qemu-img, qemu-io) work. Where "
                 "the module exists: modprobe nbd; nbd-client HOST PORT /dev/nbd0 -N NAME\n");
  }

  unsigned char sig = 0;
  while (::read(pipe_fds[0], &sig, 1) < 0 && errno == EINTR) {
  }
  std::fprintf(stderr, "tessera nbd: %s: closing connections and flushing...\n",
               sig == SIGINT ? "SIGINT" : "SIGTERM");
  st = server.Shutdown();
  nbd::NbdServerStats ns = server.Stats();
  std::fprintf(stderr,
               "tessera nbd: %llu connections, %llu requests (%llu errors), %llu bytes read, "
               "%llu written, %llu pages trimmed, %llu read-modify-write pages, %llu page ops "
               "retried\n",
               static_cast<unsigned long long>(ns.connections),
               static_cast<unsigned long long>(ns.requests),
               static_cast<unsigned long long>(ns.errors_replied),
               static_cast<unsigned long long>(ns.bytes_read),
               static_cast<unsigned long long>(ns.bytes_written),
               static_cast<unsigned long long>(ns.trimmed_pages),
               static_cast<unsigned long long>(ns.rmw_pages),
               static_cast<unsigned long long>(ns.retried_ops));
  client::PageStoreStats ps = store->Stats();
  std::fprintf(stderr,
               "tessera nbd: page store %s: %llu page reads (p50 %.1f us, p99 %.1f us), %llu page "
               "writes (p50 %.1f us, p99 %.1f us), %llu degraded reads, %llu server failures, "
               "%llu direct reads, %llu direct fallbacks\n",
               store->name().c_str(), static_cast<unsigned long long>(ps.reads),
               ps.read_latency.p50() / 1e3, ps.read_latency.p99() / 1e3,
               static_cast<unsigned long long>(ps.writes), ps.write_latency.p50() / 1e3,
               ps.write_latency.p99() / 1e3, static_cast<unsigned long long>(ps.degraded_reads),
               static_cast<unsigned long long>(ps.server_failures),
               static_cast<unsigned long long>(ps.direct_reads),
               static_cast<unsigned long long>(ps.direct_fallbacks));
  if (!st.ok()) {
    std::fprintf(stderr, "tessera nbd: flush on shutdown: %s\n", st.ToString().c_str());
    return 1;
  }
  metrics.reset();  // Before the store it reads.
  server_or->reset();
  follower.reset();
  store.reset();
  cluster.reset();
  return 0;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) { return tessera::Main(argc, argv); }
