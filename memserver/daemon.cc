#include "memserver/daemon.h"

#include <cerrno>
#include <ctime>

#include "common/clock.h"
#include "common/logging.h"
#include "common/units.h"

namespace tessera::memserver {

Result<std::unique_ptr<MemServerDaemon>> MemServerDaemon::Start(const DaemonOptions& options) {
  if (options.secret.empty()) return InvalidArgument("the daemon needs an auth secret");
  if (options.monitor_interval_ns == 0) return InvalidArgument("monitor interval must be > 0");
  bool enable_rdma = false;
  switch (options.transport) {
    case fabric::TransportKind::kTcp:
      break;
    case fabric::TransportKind::kAuto:
      enable_rdma = true;  // The engine logs why and stays on TCP when no device exists.
      break;
    case fabric::TransportKind::kRdma: {
      Status probe = fabric::ProbeRdma();
      if (!probe.ok()) {
        return Unsupported("--transport=rdma requested but RDMA is not usable here: ",
                           probe.message());
      }
      enable_rdma = true;
      break;
    }
  }

  auto d = std::unique_ptr<MemServerDaemon>(new MemServerDaemon(options));
  SlabPool::Options po;
  po.capacity_bytes = options.capacity_bytes;
  po.slab_bytes = options.slab_bytes;
  po.huge_pages = options.huge_pages;
  TESSERA_ASSIGN_OR_RETURN(d->pool_, SlabPool::Create(po));

  MemServerHandler::Options ho;
  ho.fault_injection = options.fault_injection;
  ho.headroom_bytes = options.headroom_bytes;
  ho.orphan_grace_ns = options.orphan_grace_ns;
  ho.max_slabs_per_client = options.max_slabs_per_client;
  ho.build_info_metrics = options.build_info_metrics;
  d->handler_ = std::make_unique<MemServerHandler>(d->pool_.get(), ho);

  d->source_ = std::make_unique<MeminfoSource>(options.meminfo_path);
  ResourceMonitor::Options mo;
  mo.headroom_bytes = options.headroom_bytes;
  mo.eviction_grace_ns = options.eviction_grace_ns;
  mo.smoothing = options.smoothing;
  TESSERA_ASSIGN_OR_RETURN(d->monitor_, ResourceMonitor::Create(mo, d->pool_.get(),
                                                                d->source_.get(), &d->clock_,
                                                                d->handler_.get()));
  d->handler_->AttachMonitor(d->monitor_.get());
  // First sample before accepting: the allocation limit is right from the first request.
  d->TickOnce();

  fabric::ServerOptions so;
  so.host = options.listen_host;
  so.port = options.port;
  so.io_threads = options.io_threads;
  so.reuse_port = options.reuse_port;
  so.secret = options.secret;
  so.slab_size = d->pool_->slab_bytes();
  so.capacity_bytes = d->pool_->capacity_bytes();
  so.enable_rdma = enable_rdma;
  so.max_connections = options.max_connections;
  so.max_connections_per_client = options.max_connections_per_client;
  so.handshake_timeout_ms = options.handshake_timeout_ms;
  so.max_queued_reply_bytes = options.max_queued_reply_bytes;
  TESSERA_ASSIGN_OR_RETURN(d->server_, fabric::Server::Create(so, d->handler_.get()));
  TESSERA_ASSIGN_OR_RETURN(fabric::MemoryRegistration reg,
                           d->server_->RegisterMemory(d->pool_->base(), d->pool_->region_bytes()));
  d->handler_->AttachServer(d->server_.get(), reg);
  TESSERA_RETURN_IF_ERROR(d->StartServices());
  TESSERA_RETURN_IF_ERROR(d->server_->Start());
  if (options.transport == fabric::TransportKind::kRdma && !d->server_->rdma_enabled()) {
    return Unsupported("--transport=rdma requested but the verbs listener did not start");
  }

  if (options.metrics_port >= 0) {
    MemServerHandler* h = d->handler_.get();
    TESSERA_ASSIGN_OR_RETURN(
        d->metrics_,
        MetricsHttpServer::Start(options.listen_host, static_cast<uint16_t>(options.metrics_port),
                                 [h] { return h->PrometheusText(); }));
  }
  TLOG(INFO) << "memserver: " << FormatSize(d->pool_->capacity_bytes()) << " in "
             << d->pool_->counts().max_slabs << " slabs of " << FormatSize(d->pool_->slab_bytes())
             << (d->pool_->huge_pages() ? " (huge pages)" : "") << ", headroom "
             << FormatSize(options.headroom_bytes) << ", transport "
             << (d->server_->rdma_enabled() ? "tcp+rdma" : "tcp")
             << (options.fault_injection ? ", fault injection allowed" : "")
             << ", orphan grace "
             << (options.orphan_grace_ns == 0
                     ? std::string("off")
                     : std::to_string(options.orphan_grace_ns / 1000000) + " ms");
  return d;
}

namespace {

// What one service sees of the daemon (memserver/service.h).
class DaemonServiceHost final : public ServiceHost {
 public:
  DaemonServiceHost(std::string name, fabric::Server* server, SlabPool* pool, OwnerId owner,
                    const CpuLoan* cpu)
      : name_(std::move(name)), server_(server), pool_(pool), owner_(owner), cpu_(cpu) {}
  Status RegisterRequestTypes(uint16_t first_op, uint16_t last_op,
                              fabric::ServiceHandler* handler) override {
    return server_->RegisterService(name_, first_op, last_op, handler);
  }
  SlabPool& slabs() override { return *pool_; }
  OwnerId slab_owner() const override { return owner_; }
  const CpuLoan& cpu() const override { return *cpu_; }

 private:
  const std::string name_;
  fabric::Server* const server_;
  SlabPool* const pool_;
  const OwnerId owner_;
  const CpuLoan* const cpu_;
};

}  // namespace

Status MemServerDaemon::StartServices() {
  if (options_.services.size() > kMaxServices) {
    return InvalidArgument(options_.services.size(), " services; a memserver hosts at most ",
                           kMaxServices);
  }
  if (options_.service_cpu.workers < 1 || options_.service_cpu.workers > 64 ||
      options_.service_cpu.budget_ns == 0) {
    return InvalidArgument("service CPU: workers must be in [1, 64] and the budget > 0");
  }
  for (size_t i = 0; i < options_.services.size(); ++i) {
    const ServicePlugin& plugin = options_.services[i];
    DaemonServiceHost host(plugin.name, server_.get(), pool_.get(),
                           ServiceOwner(static_cast<uint32_t>(i)), &options_.service_cpu);
    auto service = plugin.create(host);
    if (!service.ok()) return service.status().WithContext("service " + plugin.name);
    handler_->AttachService(service->get());
    services_.push_back(std::move(*service));
    TLOG(INFO) << "memserver: service " << plugin.name << " started";
  }
  return Status::Ok();
}

MemServerDaemon::~MemServerDaemon() { Shutdown(); }

void MemServerDaemon::TickOnce() {
  monitor_->Tick();
  handler_->ReclaimOrphans(MonotonicNs());
  handler_->metrics().UpdateRates(MonotonicNs());
}

int MemServerDaemon::RunUntilSignal(const sigset_t& signals) {
  for (;;) {
    uint64_t ns = options_.monitor_interval_ns;
    timespec ts{static_cast<time_t>(ns / 1000000000ull), static_cast<long>(ns % 1000000000ull)};
    int sig = ::sigtimedwait(&signals, nullptr, &ts);
    if (sig > 0) return sig;
    if (sig < 0 && errno != EAGAIN && errno != EINTR) {
      TLOG(ERROR) << "sigtimedwait failed: " << std::strerror(errno);
      return SIGTERM;
    }
    TickOnce();
  }
}

void MemServerDaemon::Shutdown() {
  if (server_) server_->Stop(Deadline::AfterMs(1000));
  if (metrics_) metrics_->Stop();
}

}  // namespace tessera::memserver
