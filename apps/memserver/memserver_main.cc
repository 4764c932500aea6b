// `tessera memserver`: a memory server daemon that lends its memory in slabs, and hosts the
// Kayak service (KV tables and offload functions, apps/kayak/server) on the CPU it lends.
#include <gflags/gflags.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <ctime>
#include <memory>
#include <string>

#include "apps/cli/cli.h"
#include "apps/cli/version.h"
#include "apps/kayak/server/kv_service.h"
#include "common/logging.h"
#include "common/units.h"
#include "membership/etcd_client.h"
#include "membership/etcd_view.h"
#include "fabric/auth.h"
#include "fabric/transport.h"
#include "memserver/daemon.h"

DEFINE_string(listen, "127.0.0.1", "Address to listen on (0.0.0.0 or :: for every interface)");
DEFINE_int32(port, 7700, "TCP port; 0 picks an ephemeral port (printed on stdout)");
DEFINE_string(capacity, "1G", "Memory to lend, e.g. 512M, 4G (a multiple of --slab_size)");
DEFINE_string(slab_size, "16M",
              "Slab size, e.g. 2M, 16M (a multiple of 4K; of 2M with --huge_pages)");
DEFINE_string(headroom, "1G",
              "Host memory to keep free: below it slabs are evicted (owners get a notice first)");
DEFINE_string(transport, "auto", "auto (RDMA when a device exists, else TCP), tcp or rdma");
DEFINE_string(auth_token_file, "",
              "File holding the cluster secret (16..4096 bytes; `tessera token secret`); empty: "
              "the development default, served on loopback only");
DEFINE_int32(metrics_port, -1, "Prometheus endpoint port (GET /metrics); 0 = ephemeral; -1 = off");
DEFINE_bool(huge_pages, false, "Back the slabs with 2 MiB huge pages when available");
DEFINE_int32(io_threads, 1, "Network I/O threads (1..64)");
DEFINE_bool(reuse_port, false,
            "Listen with SO_REUSEPORT, so that a replacement memserver (same user) can bind the "
            "port before this one exits; off: a second memserver on the port fails to start");
DEFINE_bool(fault_injection, false,
            "Accept `tessera fault` requests (for resilience experiments; off by default)");
DEFINE_string(eviction_grace, "2s", "Time an owner gets to move an evicted slab's data");
DEFINE_string(orphan_grace, "30s",
              "Slabs of a client that has had no open connection for this long are freed (its "
              "process died or exited without releasing them); a reconnect within it keeps them. "
              "0 = never free them. Checked every --monitor_interval");
DEFINE_string(monitor_interval, "200ms", "How often free host memory is sampled");
DEFINE_int32(max_slabs_per_client, 0,
             "Most slabs one client (one credential, all its processes) may hold on this "
             "server; an ALLOC beyond it fails with ResourceExhausted naming this flag. "
             "0 = no quota");
DEFINE_int32(max_connections, 4096,
             "Connections open at once, authenticated or not; further ones are closed at once");
DEFINE_int32(max_connections_per_client, 256,
             "Authenticated connections one client (one credential) may hold; AUTH beyond it is "
             "refused with ResourceExhausted. 0 = no limit");
DEFINE_string(handshake_timeout, "10s",
              "A connection that has not authenticated this long after connecting is closed");
DEFINE_string(max_queued_replies, "16M",
              "Per connection: once this many reply bytes wait for the client to read them, "
              "the server stops reading that connection's requests until they drain "
              "(64K..1G)");
DEFINE_string(offload_lib, "",
              "Comma-separated shared libraries of operators' offload functions, loaded at "
              "start-up (C ABI: apps/kayak/server/tessera_offload.h)");
DEFINE_int32(offload_workers, 2, "Worker threads that run offload functions (1..64)");
DEFINE_int32(offload_queue, 32,
             "Offload invocations that may wait for a worker; beyond it the server answers "
             "'pushed back' at once and the client runs the request the KV way");
DEFINE_string(offload_budget, "50ms",
              "CPU time one run of an offload function may take on its worker thread");
DEFINE_string(offload_inline, "10us",
              "Built-in functions estimated to take at most this run inline on the network I/O "
              "thread instead of the worker pool (0: never)");
DEFINE_string(meminfo_path, "/proc/meminfo",
              "Where MemAvailable is read (tests point it at a file they write)");
DEFINE_string(etcd, "",
              "etcd endpoints (HOST:PORT,...): register this server in the cluster --cluster_name "
              "under a lease, so clients started with --etcd find it");
DEFINE_string(cluster_name, "", "Cluster to register in (with --etcd)");
DEFINE_string(rack, "", "Failure domain published in etcd (with --etcd; all servers or none)");
DEFINE_string(etcd_ttl, "5s",
              "Lease of the etcd registration: a killed server vanishes this long after (2s..1h)");
DEFINE_string(advertise, "",
              "HOST[:PORT] clients should connect to, published in etcd (default: --listen and "
              "the bound port; required when --listen is a wildcard)");

namespace {

using tessera::cli::CliSpec;
using tessera::cli::UsageError;

const CliSpec kSpec = {
    "tessera memserver",
    "[--listen ADDR] [--port N] [--capacity SIZE] [--slab_size SIZE] [--headroom SIZE] ...",
    "Runs a memory server: lends --capacity bytes of this host's memory, in slabs, to\n"
    "authenticated Tessera clients; evicts slabs (with notice) when the host runs short of\n"
    "memory. Prints `listening on HOST:PORT` once it accepts connections. SIGTERM or SIGINT\n"
    "stops it gracefully (clients are told). With --etcd it registers in etcd under a lease\n"
    "(deleted on SIGTERM/SIGINT, expiring --etcd_ttl after a crash).",
    __FILE__, 0, 0};

uint64_t SizeFlag(const char* name, const std::string& value) {
  auto r = tessera::ParseSize(value);
  if (!r.ok()) UsageError(kSpec, std::string("--") + name + ": " + r.status().message());
  return *r;
}

uint64_t DurationFlag(const char* name, const std::string& value) {
  auto r = tessera::ParseDurationNs(value);
  if (!r.ok()) UsageError(kSpec, std::string("--") + name + ": " + r.status().message());
  if (*r == 0) UsageError(kSpec, std::string("--") + name + " must be positive");
  return *r;
}

}  // namespace

int main(int argc, char** argv) {
  tessera::cli::InitCli(kSpec, &argc, &argv);
  namespace ms = tessera::memserver;
  ms::DaemonOptions o;
  o.listen_host = FLAGS_listen;
  if (o.listen_host.empty()) UsageError(kSpec, "--listen must not be empty");
  if (FLAGS_port < 0 || FLAGS_port > 65535) UsageError(kSpec, "--port must be in [0, 65535]");
  o.port = static_cast<uint16_t>(FLAGS_port);
  o.capacity_bytes = SizeFlag("capacity", FLAGS_capacity);
  o.slab_bytes = SizeFlag("slab_size", FLAGS_slab_size);
  o.headroom_bytes = SizeFlag("headroom", FLAGS_headroom);
  if (o.slab_bytes == 0 || o.slab_bytes % 4096 != 0) {
    UsageError(kSpec, "--slab_size must be a positive multiple of 4K");
  }
  if (FLAGS_huge_pages && o.slab_bytes % (2u << 20) != 0) {
    UsageError(kSpec, "--slab_size must be a multiple of 2M with --huge_pages");
  }
  if (o.capacity_bytes < o.slab_bytes || o.capacity_bytes % o.slab_bytes != 0) {
    UsageError(kSpec, "--capacity must be a positive multiple of --slab_size");
  }
  auto kind = tessera::fabric::ParseTransportKind(FLAGS_transport);
  if (!kind.ok()) UsageError(kSpec, "--transport: " + kind.status().message());
  o.transport = *kind;
  if (FLAGS_metrics_port < -1 || FLAGS_metrics_port > 65535) {
    UsageError(kSpec, "--metrics_port must be -1 (off) or in [0, 65535]");
  }
  o.metrics_port = FLAGS_metrics_port;
  o.build_info_metrics = tessera::version::PrometheusBuildInfo("memserver");
  if (FLAGS_io_threads < 1 || FLAGS_io_threads > 64) {
    UsageError(kSpec, "--io_threads must be in [1, 64]");
  }
  o.io_threads = FLAGS_io_threads;
  o.reuse_port = FLAGS_reuse_port;
  o.huge_pages = FLAGS_huge_pages;
  o.fault_injection = FLAGS_fault_injection;
  o.eviction_grace_ns = DurationFlag("eviction_grace", FLAGS_eviction_grace);
  o.monitor_interval_ns = DurationFlag("monitor_interval", FLAGS_monitor_interval);
  if (FLAGS_orphan_grace == "0") {
    o.orphan_grace_ns = 0;
  } else {
    auto grace = tessera::ParseDurationNs(FLAGS_orphan_grace);
    if (!grace.ok()) UsageError(kSpec, "--orphan_grace: " + grace.status().message());
    o.orphan_grace_ns = *grace;
  }
  if (FLAGS_max_slabs_per_client < 0) UsageError(kSpec, "--max_slabs_per_client must be >= 0");
  o.max_slabs_per_client = static_cast<uint64_t>(FLAGS_max_slabs_per_client);
  if (FLAGS_max_connections < 1) UsageError(kSpec, "--max_connections must be >= 1");
  o.max_connections = static_cast<uint32_t>(FLAGS_max_connections);
  if (FLAGS_max_connections_per_client < 0) {
    UsageError(kSpec, "--max_connections_per_client must be >= 0");
  }
  o.max_connections_per_client = static_cast<uint32_t>(FLAGS_max_connections_per_client);
  {
    uint64_t ns = DurationFlag("handshake_timeout", FLAGS_handshake_timeout);
    if (ns < 1000000 || ns > 3600ull * 1000000000) {
      UsageError(kSpec, "--handshake_timeout must be 1ms..1h");
    }
    o.handshake_timeout_ms = static_cast<uint32_t>(ns / 1000000);
  }
  o.max_queued_reply_bytes = SizeFlag("max_queued_replies", FLAGS_max_queued_replies);
  if (o.max_queued_reply_bytes < (64u << 10) || o.max_queued_reply_bytes > (1ull << 30)) {
    UsageError(kSpec, "--max_queued_replies must be 64K..1G");
  }
  o.meminfo_path = FLAGS_meminfo_path;
  if (FLAGS_offload_workers < 1 || FLAGS_offload_workers > 64) {
    UsageError(kSpec, "--offload_workers must be in [1, 64]");
  }
  if (FLAGS_offload_queue < 1 || FLAGS_offload_queue > 4096) {
    UsageError(kSpec, "--offload_queue must be in [1, 4096]");
  }
  // The CPU lent to the hosted services, and the Kayak service's own settings.
  o.service_cpu.workers = FLAGS_offload_workers;
  o.service_cpu.budget_ns = DurationFlag("offload_budget", FLAGS_offload_budget);
  tessera::kayak::OffloadOptions offload;
  offload.max_queue = static_cast<uint32_t>(FLAGS_offload_queue);
  if (FLAGS_offload_inline == "0") {
    offload.inline_ns = 0;
  } else {
    offload.inline_ns = DurationFlag("offload_inline", FLAGS_offload_inline);
    if (offload.inline_ns > 1'000'000) UsageError(kSpec, "--offload_inline must be at most 1ms");
  }
  for (size_t start = 0; start < FLAGS_offload_lib.size();) {
    size_t comma = FLAGS_offload_lib.find(',', start);
    if (comma == std::string::npos) comma = FLAGS_offload_lib.size();
    if (comma > start) offload.libraries.push_back(FLAGS_offload_lib.substr(start, comma - start));
    start = comma + 1;
  }
  o.services.push_back(tessera::kayak::Plugin(std::move(offload)));

  // etcd registration settings, checked before anything starts.
  const bool use_etcd = !FLAGS_etcd.empty();
  tessera::membership::EtcdOptions etcd_options;
  int64_t etcd_ttl_s = 5;
  if (use_etcd) {
    auto eps = tessera::membership::ParseEtcdEndpoints(FLAGS_etcd);
    if (!eps.ok()) UsageError(kSpec, "--etcd: " + eps.status().message());
    etcd_options.endpoints = *eps;
    if (auto st = tessera::membership::ValidateClusterName(FLAGS_cluster_name); !st.ok()) {
      UsageError(kSpec, "--etcd needs --cluster_name: " + st.message());
    }
    const uint64_t ttl_ns = DurationFlag("etcd_ttl", FLAGS_etcd_ttl);
    etcd_ttl_s = static_cast<int64_t>((ttl_ns + 999999999) / 1000000000);
    if (etcd_ttl_s < 2 || etcd_ttl_s > 3600) UsageError(kSpec, "--etcd_ttl must be 2s..1h");
    if (FLAGS_advertise.empty() &&
        (FLAGS_listen == "0.0.0.0" || FLAGS_listen == "::" || FLAGS_listen == "[::]")) {
      UsageError(kSpec, "--listen " + FLAGS_listen +
                            " with --etcd needs --advertise HOST (the address clients use)");
    }
  } else if (!FLAGS_cluster_name.empty() || !FLAGS_rack.empty() || !FLAGS_advertise.empty()) {
    UsageError(kSpec, "--cluster_name, --rack and --advertise need --etcd");
  }

  auto secret = tessera::fabric::LoadAuthSecret(FLAGS_auth_token_file, "tessera memserver");
  if (!secret.ok()) {
    std::fprintf(stderr, "tessera memserver: %s\n", secret.status().ToString().c_str());
    return 1;
  }
  o.secret = *secret;

  // Block the stop signals in every thread (threads inherit the mask); the main thread waits
  // for them with sigtimedwait while it drives the resource monitor.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  signal(SIGPIPE, SIG_IGN);

  auto daemon = ms::MemServerDaemon::Start(o);
  if (!daemon.ok()) {
    std::fprintf(stderr, "tessera memserver: %s\n", daemon.status().ToString().c_str());
    return 1;
  }
  // IPv6 literals are bracketed so the line parses as an endpoint ("[::1]:7700").
  std::string host = (*daemon)->host();
  if (host.find(':') != std::string::npos) host = "[" + host + "]";
  std::printf("listening on %s:%u\n", host.c_str(), (*daemon)->port());
  if ((*daemon)->metrics_port() >= 0) {
    std::printf("metrics on %s:%d\n", host.c_str(), (*daemon)->metrics_port());
  }
  std::unique_ptr<tessera::membership::Registration> registration;
  if (use_etcd) {
    tessera::membership::ServerRecord rec;
    rec.server_id = tessera::membership::NewServerId();
    std::string adv = FLAGS_advertise.empty() ? host : FLAGS_advertise;
    if (!tessera::fabric::ParseEndpoint(adv).ok()) {
      adv = (adv.find(':') != std::string::npos && adv.front() != '[' ? "[" + adv + "]" : adv) +
            ":" + std::to_string((*daemon)->port());
    }
    if (auto ep = tessera::fabric::ParseEndpoint(adv); !ep.ok()) {
      std::fprintf(stderr, "tessera memserver: --advertise %s: %s\n", adv.c_str(),
                   ep.status().ToString().c_str());
      return 1;
    }
    rec.endpoint = adv;
    rec.rack = FLAGS_rack;
    rec.capacity = o.capacity_bytes;
    rec.slab_size = o.slab_bytes;
    char hn[256] = {0};
    ::gethostname(hn, sizeof(hn) - 1);
    rec.host = hn;
    rec.pid = ::getpid();
    rec.start_time_ms = static_cast<int64_t>(::time(nullptr)) * 1000;
    rec.version = tessera::version::Version();
    auto r = tessera::membership::Registration::Start(etcd_options, FLAGS_cluster_name, rec,
                                                      etcd_ttl_s);
    if (!r.ok()) {
      std::fprintf(stderr, "tessera memserver: cannot register in etcd (%s): %s\n",
                   FLAGS_etcd.c_str(), r.status().ToString().c_str());
      (*daemon)->Shutdown();
      return 1;
    }
    registration = std::move(*r);
    std::printf("registered in etcd as %s (endpoint %s, lease %lld, ttl %llds)\n",
                registration->key().c_str(), adv.c_str(),
                static_cast<long long>(registration->lease()),
                static_cast<long long>(etcd_ttl_s));
  }
  std::fflush(stdout);
  int sig = (*daemon)->RunUntilSignal(stop);
  TLOG(INFO) << "memserver: " << (sig == SIGINT ? "SIGINT" : "SIGTERM")
             << ", shutting down (clients notified)";
  if (registration) {
    // Leave the cluster first: watching clients stop placing new slabs here at once.
    if (auto st = registration->Stop(); !st.ok()) {
      TLOG(WARNING) << "memserver: deregistering from etcd: " << st;
    }
    registration.reset();
  }
  (*daemon)->Shutdown();
  daemon->reset();
  return 0;
}
