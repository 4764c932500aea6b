// MemServerDaemon: one memory server process, wired together — slab pool, request handler,
// resource monitor, the fabric engine, the hosted services (memserver/service.h) and
// (optionally) the Prometheus endpoint.
//
// Start() builds everything and starts accepting; after it returns, port() is the bound port
// and the caller prints `listening on HOST:PORT`. RunUntilSignal() then drives the resource
// monitor every `monitor_interval` on the calling thread and returns when one of the given
// signals arrives (they must be blocked in every thread, i.e. before Start()). Shutdown() is
// graceful: clients get a shutting-down NOTICE, then connections close.
//
// Ownership: owns every part; destruction stops the network first, then frees the memory.
// Threads: Start/RunUntilSignal/Shutdown from one thread (the main thread).
#pragma once

#include <signal.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "fabric/server.h"
#include "fabric/transport.h"
#include "memserver/handler.h"
#include "memserver/http_metrics.h"
#include "memserver/resource_monitor.h"
#include "memserver/service.h"
#include "memserver/slab_pool.h"

namespace tessera::memserver {

struct DaemonOptions {
  std::string listen_host = "127.0.0.1";
  uint16_t port = 0;
  uint64_t capacity_bytes = 1ull << 30;
  uint64_t slab_bytes = 16ull << 20;
  uint64_t headroom_bytes = 1ull << 30;
  bool huge_pages = false;
  fabric::TransportKind transport = fabric::TransportKind::kAuto;
  std::string secret;
  int io_threads = 1;
  bool reuse_port = false;  // fabric::ServerOptions::reuse_port.
  int metrics_port = -1;  // -1: no metrics endpoint; 0: ephemeral.
  std::string build_info_metrics;  // Served first on the metrics endpoint (tessera_build_info).
  bool fault_injection = false;  // Off unless asked for (--fault_injection).
  std::string meminfo_path = "/proc/meminfo";
  uint64_t monitor_interval_ns = 200ull * 1000000;
  uint64_t eviction_grace_ns = 2000ull * 1000000;
  // Slabs of a client with no open connection for this long are freed (0: never).
  uint64_t orphan_grace_ns = 30000ull * 1000000;
  double smoothing = 0.5;
  // Limits (docs/operators/limits.md): slabs per client id (0: none), connections in total and
  // per client id (0: none), the handshake deadline, and the per-connection reply bound.
  uint64_t max_slabs_per_client = 0;
  uint32_t max_connections = 4096;
  uint32_t max_connections_per_client = 256;
  uint32_t handshake_timeout_ms = 10000;
  uint64_t max_queued_reply_bytes = 16ull << 20;
  // The services hosted in this process, made in order at start-up (at most kMaxServices), and
  // the CPU lent to each beside the I/O threads.
  std::vector<ServicePlugin> services;
  CpuLoan service_cpu;
};

class MemServerDaemon {
 public:
  static Result<std::unique_ptr<MemServerDaemon>> Start(const DaemonOptions& options);
  ~MemServerDaemon();
  MemServerDaemon(const MemServerDaemon&) = delete;
  MemServerDaemon& operator=(const MemServerDaemon&) = delete;

  uint16_t port() const { return server_->port(); }
  const std::string& host() const { return options_.listen_host; }
  // -1 when disabled.
  int metrics_port() const { return metrics_ ? metrics_->port() : -1; }
  bool rdma_enabled() const { return server_->rdma_enabled(); }
  MemServerHandler& handler() { return *handler_; }

  // Ticks the monitor until a signal of `signals` arrives; returns its number.
  int RunUntilSignal(const sigset_t& signals);
  void Shutdown();

 private:
  explicit MemServerDaemon(const DaemonOptions& options) : options_(options) {}
  void TickOnce();
  Status StartServices();  // After the server is created, before it starts.

  DaemonOptions options_;
  // Destroyed bottom-up: endpoint, network, monitor, handler, memory.
  std::unique_ptr<SlabPool> pool_;
  // After the network has stopped and before the pool: their slabs go back to the pool.
  std::vector<std::unique_ptr<Service>> services_;
  std::unique_ptr<MemServerHandler> handler_;
  std::unique_ptr<MeminfoSource> source_;
  MonotonicClock clock_;
  std::unique_ptr<ResourceMonitor> monitor_;
  std::unique_ptr<fabric::Server> server_;
  std::unique_ptr<MetricsHttpServer> metrics_;
};

}  // namespace tessera::memserver
