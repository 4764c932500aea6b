// The server engine's facade and shared state (see fabric/server.h); the I/O threads are in
// fabric/server_io_thread.cc, the handshake in fabric/handshake.cc.
#include "fabric/server.h"

#include "common/logging.h"
#include "fabric/auth.h"
#include "fabric/server_impl.h"
#include "fabric/socket.h"

namespace tessera::fabric {

Server::Impl::Impl(ServerOptions options, RequestHandler* handler)
    : options_(std::move(options)), handler_(handler) {
  service_of_op_.fill(-1);
}

Server::Impl::~Impl() { Stop(Deadline::AfterMs(1000)); }

Status Server::Impl::Init() {
  if (handler_ == nullptr) return InvalidArgument("Server needs a RequestHandler");
  if (options_.secret.empty()) return InvalidArgument("Server needs a non-empty secret");
  TESSERA_RETURN_IF_ERROR(CheckSecretForListen(options_.secret, options_.host));
  if (options_.io_threads < 1 || options_.io_threads > 64) {
    return InvalidArgument("io_threads must be in 1..64, got ", options_.io_threads);
  }
  if (options_.ring_entries < 8 || options_.ring_entries > 32768) {
    return InvalidArgument("ring_entries must be in 8..32768, got ", options_.ring_entries);
  }
  if (options_.max_connections == 0) return InvalidArgument("max_connections must be > 0");
  if (options_.max_queued_reply_bytes < (64u << 10) ||
      options_.max_queued_reply_bytes > (1ull << 30)) {
    return InvalidArgument("max_queued_reply_bytes must be 64 KiB..1 GiB, got ",
                           options_.max_queued_reply_bytes);
  }
  if (options_.handshake_timeout_ms == 0) {
    return InvalidArgument("handshake_timeout_ms must be > 0");
  }
  server_id_ = options_.server_id;
  while (server_id_ == 0) {
    TESSERA_RETURN_IF_ERROR(
        RandomBytes({reinterpret_cast<uint8_t*>(&server_id_), sizeof(server_id_)}));
  }
  const bool reuse = options_.io_threads > 1 || options_.reuse_port;
  uint16_t port = options_.port;
  for (int i = 0; i < options_.io_threads; ++i) {
    TESSERA_ASSIGN_OR_RETURN(UniqueFd fd, BindListener(options_.host, port, reuse));
    if (i == 0) port = BoundPort(fd.get());
    auto t = std::make_unique<ServerIoThread>(this, i, std::move(fd));
    TESSERA_RETURN_IF_ERROR(t->Init(options_.ring_entries));
    threads_.push_back(std::move(t));
  }
  port_ = port;
  if (options_.enable_rdma) {
    auto listener = VerbsListener::Create(options_.host, options_.rdma_port);
    if (listener.ok()) {
      verbs_ = std::move(*listener);
    } else {
      TLOG(WARNING) << "RDMA requested but not available, serving TCP only: "
                    << listener.status().message();
    }
  }
  return Status::Ok();
}

Status Server::Impl::Start() {
  if (started_.exchange(true)) return InvalidArgument("Server::Start called twice");
  if (verbs_) {
    Status st = verbs_->Start();
    if (st.ok()) {
      verbs_started_ = true;
    } else {
      TLOG(WARNING) << "verbs listener failed to start, serving TCP only: " << st.message();
    }
  }
  handshake_.secret = options_.secret;
  handshake_.server_id = server_id_;
  handshake_.slab_size = options_.slab_size;
  handshake_.capacity_bytes = options_.capacity_bytes;
  handshake_.admit = [this](uint64_t client_id) { return TakeClientSlot(client_id); };
  if (verbs_started_) {
    VerbsListener* verbs = verbs_.get();
    handshake_.issue_rdma_token = [verbs] { return verbs->IssueToken(); };
    handshake_.rdma_host = options_.host;
    handshake_.rdma_port = verbs_->port();
  }
  for (auto& t : threads_) t->Start();
  return Status::Ok();
}

void Server::Impl::Stop(Deadline grace) {
  std::lock_guard<std::mutex> lock(stop_mu_);
  if (stopped_) return;
  stopped_ = true;
  if (started_) {
    for (auto& t : threads_) {
      t->Enqueue(ServerIoThread::Command{ServerIoThread::Command::Kind::kStop, std::nullopt,
                                         Notice{}, grace.at_ns()});
    }
    for (auto& t : threads_) t->Join();
  }
  if (verbs_) verbs_->Stop();
  threads_.clear();
}

Status Server::Impl::TakeClientSlot(uint64_t client_id) {
  const uint32_t limit = options_.max_connections_per_client;
  std::lock_guard<std::mutex> lock(clients_mu_);
  uint32_t& n = client_connections_[client_id];
  if (limit != 0 && n >= limit) {
    return ResourceExhausted("client ", client_id, " already has ", n,
                             " connections open to this server, its limit "
                             "(--max_connections_per_client)");
  }
  ++n;
  return Status::Ok();
}

void Server::Impl::ReleaseClientSlot(uint64_t client_id) {
  std::lock_guard<std::mutex> lock(clients_mu_);
  auto it = client_connections_.find(client_id);
  if (it == client_connections_.end()) return;
  if (--it->second == 0) client_connections_.erase(it);
}

Status Server::Impl::Notify(std::optional<uint64_t> client_id, const Notice& notice) {
  std::lock_guard<std::mutex> lock(stop_mu_);
  if (stopped_ || !started_) return Unavailable("server is not running");
  uint8_t check[Notice::kWireSize];
  notice.EncodeTo(check);
  TESSERA_RETURN_IF_ERROR(Notice::Decode(check).status());
  for (auto& t : threads_) {
    t->Enqueue(ServerIoThread::Command{ServerIoThread::Command::Kind::kNotice, client_id, notice,
                                       0});
  }
  return Status::Ok();
}

Status Server::Impl::Disconnect(uint64_t client_id) {
  std::lock_guard<std::mutex> lock(stop_mu_);
  if (stopped_ || !started_) return Unavailable("server is not running");
  for (auto& t : threads_) {
    t->Enqueue(ServerIoThread::Command{ServerIoThread::Command::Kind::kDisconnect, client_id,
                                       Notice{}, 0});
  }
  return Status::Ok();
}

Status Server::Impl::RegisterService(std::string name, uint16_t first_op, uint16_t last_op,
                                     ServiceHandler* handler) {
  if (name.empty() || handler == nullptr) {
    return InvalidArgument("RegisterService needs a name and a handler");
  }
  if (started_) return InvalidArgument("RegisterService(", name, ") after Start()");
  if (first_op < kFirstServiceOp || last_op > kLastServiceOp || first_op > last_op) {
    return InvalidArgument("service ", name, ": ops ", first_op, "..", last_op, " outside the ",
                           "service ops ", kFirstServiceOp, "..", kLastServiceOp);
  }
  for (uint32_t op = first_op; op <= last_op; ++op) {
    int16_t taken = service_of_op_[op - kFirstServiceOp];
    if (taken >= 0) {
      return AlreadyExists("service ", name, ": op ", op, " belongs to service ",
                           services_[taken].name);
    }
  }
  const auto index = static_cast<int16_t>(services_.size());
  services_.push_back(Service{std::move(name), first_op, last_op, handler});
  for (uint32_t op = first_op; op <= last_op; ++op) service_of_op_[op - kFirstServiceOp] = index;
  return Status::Ok();
}

ServiceHandler* Server::Impl::ServiceFor(Op op) const {
  if (!IsServiceOp(op)) return nullptr;
  int16_t index = service_of_op_[static_cast<uint16_t>(op) - kFirstServiceOp];
  return index < 0 ? nullptr : services_[index].handler;
}

std::string Server::Impl::ServiceNames() const {
  if (services_.empty()) return "no services registered";
  std::string out = "services:";
  for (const Service& s : services_) {
    out += " " + s.name + " " + std::to_string(s.first_op) + ".." + std::to_string(s.last_op);
  }
  return out;
}

Result<MemoryRegistration> Server::Impl::RegisterMemory(void* addr, size_t length) {
  if (addr == nullptr || length == 0) return InvalidArgument("RegisterMemory: empty region");
  if (started_) return InvalidArgument("RegisterMemory must be called before Start()");
  if (verbs_) return verbs_->Register(addr, length);
  MemoryRegistration reg;
  reg.base_addr = reinterpret_cast<uint64_t>(addr);
  return reg;
}

Result<std::unique_ptr<Server>> Server::Create(ServerOptions options, RequestHandler* handler) {
  auto impl = std::make_unique<Impl>(std::move(options), handler);
  TESSERA_RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Server::~Server() { impl_->Stop(Deadline::AfterMs(1000)); }
Status Server::Start() { return impl_->Start(); }
void Server::Stop(Deadline grace) { impl_->Stop(grace); }
Status Server::Notify(std::optional<uint64_t> client_id, const Notice& notice) {
  return impl_->Notify(client_id, notice);
}
Status Server::Disconnect(uint64_t client_id) { return impl_->Disconnect(client_id); }
Result<MemoryRegistration> Server::RegisterMemory(void* addr, size_t length) {
  return impl_->RegisterMemory(addr, length);
}
Status Server::RegisterService(std::string name, uint16_t first_op, uint16_t last_op,
                               ServiceHandler* handler) {
  return impl_->RegisterService(std::move(name), first_op, last_op, handler);
}
const std::string& Server::host() const { return impl_->options_.host; }
uint16_t Server::port() const { return impl_->port_; }
bool Server::rdma_enabled() const { return impl_->verbs_started_; }
uint16_t Server::rdma_port() const { return impl_->verbs_ ? impl_->verbs_->port() : 0; }
uint64_t Server::server_id() const { return impl_->server_id_; }
uint32_t Server::connection_count() const { return impl_->open_connections_.load(); }
uint64_t Server::reply_backpressure_pauses() const {
  return impl_->reply_pauses_.load(std::memory_order_relaxed);
}

}  // namespace tessera::fabric
