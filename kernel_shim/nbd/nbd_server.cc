// The NBD server facade (see kernel_shim/nbd/nbd_server.h): export validation, listeners, the
// acceptor, connection bookkeeping, shutdown and stats. The protocol lives in handshake.cc
// (option haggling), connection.cc (transmission), reply_sender.cc (the outbox),
// page_lock_table.h and socket_io.cc.
#include "kernel_shim/nbd/nbd_server.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>

#include "common/logging.h"
#include "kernel_shim/nbd/connection.h"
#include "kernel_shim/nbd/socket_io.h"

namespace tessera::nbd {

NbdServer::NbdServer(client::PageStore* store, NbdServerOptions options)
    : store_(store), options_(std::move(options)), shared_(std::make_unique<Shared>()) {
  shared_->store = store_;
  shared_->options = &options_;
}

Result<std::unique_ptr<NbdServer>> NbdServer::Create(client::PageStore* store,
                                                     NbdServerOptions options) {
  if (store == nullptr) return InvalidArgument("NbdServer needs a page store");
  if (options.exports.empty()) return InvalidArgument("NbdServer needs at least one export");
  if (options.max_payload < kPageSize || options.max_payload > (1u << 30)) {
    return InvalidArgument("max_payload must be in [4096, 1 GiB], got ", options.max_payload);
  }
  if (options.max_inflight_requests == 0) return InvalidArgument("max_inflight_requests is 0");
  if (options.direct_spin_us > 1000) {
    return InvalidArgument("direct_spin_us must be in [0, 1000], got ", options.direct_spin_us);
  }
  const uint64_t cap = store->capacity_pages();
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  std::set<std::string> names;
  for (const ExportSpec& e : options.exports) {
    if (!names.insert(e.name).second) return InvalidArgument("export \"", e.name, "\" listed twice");
    if (e.name.size() > 4096) return InvalidArgument("export name longer than 4096 bytes");
    if (e.size_bytes == 0) return InvalidArgument("export \"", e.name, "\" has size 0");
    const uint64_t pages = (e.size_bytes + kPageSize - 1) / kPageSize;
    if (e.first_page > cap || pages > cap - e.first_page) {
      return InvalidArgument("export \"", e.name, "\" (pages ", e.first_page, "..",
                             e.first_page + pages, ") does not fit the store's ", cap, " pages");
    }
    ranges.push_back({e.first_page, e.first_page + pages});
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first < ranges[i - 1].second) return InvalidArgument("export page ranges overlap");
  }
  return std::unique_ptr<NbdServer>(new NbdServer(store, std::move(options)));
}

NbdServer::~NbdServer() { Shutdown().IgnoreError(); }

Result<uint16_t> NbdServer::ListenTcp(const std::string& host, uint16_t port) {
  uint16_t bound = 0;
  TESSERA_ASSIGN_OR_RETURN(UniqueFd fd, ListenTcpSocket(host, port, &bound));
  listeners_.push_back(std::move(fd));
  return bound;
}

Status NbdServer::ListenUnix(const std::string& path) {
  TESSERA_ASSIGN_OR_RETURN(UniqueFd fd, ListenUnixSocket(path));
  listeners_.push_back(std::move(fd));
  unix_paths_.push_back(path);
  return Status::Ok();
}

Status NbdServer::Start() {
  if (listeners_.empty()) return InvalidArgument("Start() before any Listen*()");
  int efd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (efd < 0) return ErrnoError("eventfd");
  wake_fd_ = UniqueFd(efd);
  acceptor_ = std::thread([this] { AcceptLoop(); });
  return Status::Ok();
}

void NbdServer::AcceptLoop() {
  std::vector<pollfd> pfds;
  for (const UniqueFd& l : listeners_) pfds.push_back({l.get(), POLLIN, 0});
  pfds.push_back({wake_fd_.get(), POLLIN, 0});
  for (;;) {
    int n = ::poll(pfds.data(), pfds.size(), -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      TLOG(ERROR) << "nbd: poll: " << std::strerror(errno);
      return;
    }
    if (pfds.back().revents != 0) return;
    for (size_t i = 0; i + 1 < pfds.size(); ++i) {
      if (!(pfds[i].revents & POLLIN)) continue;
      int c = ::accept4(pfds[i].fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      SetNoDelay(c);  // Fails harmlessly on unix.
      ServeConnection(UniqueFd(c));
    }
  }
}

void NbdServer::ServeConnection(UniqueFd fd) {
  Shared* s = shared_.get();
  auto* conn = new Connection(s, std::move(fd));
  conn->peer = PeerName(conn->fd.get());
  {
    std::lock_guard<std::mutex> lk(s->conns_mu);
    if (s->closing) {
      delete conn;
      return;
    }
    s->conns.insert(conn);
    s->live++;
  }
  s->connections.fetch_add(1, std::memory_order_relaxed);
  std::thread([s, conn] {
    conn->Run();
    {
      std::lock_guard<std::mutex> lk(s->conns_mu);
      s->conns.erase(conn);
    }
    delete conn;  // Closes the socket.
    std::lock_guard<std::mutex> lk(s->conns_mu);
    s->live--;
    s->conns_cv.notify_all();
  }).detach();
}

Status NbdServer::Shutdown() {
  if (shut_down_.exchange(true)) return Status::Ok();
  if (acceptor_.joinable()) {
    uint64_t one = 1;
    if (::write(wake_fd_.get(), &one, sizeof one) < 0) {
      TLOG(WARNING) << "nbd: eventfd write: " << std::strerror(errno);
    }
    acceptor_.join();
  }
  listeners_.clear();
  for (const std::string& p : unix_paths_) ::unlink(p.c_str());
  {
    std::unique_lock<std::mutex> lk(shared_->conns_mu);
    shared_->closing = true;
    // Stop every reader; requests already accepted still complete and are answered.
    for (Connection* c : shared_->conns) ::shutdown(c->fd.get(), SHUT_RD);
    shared_->conns_cv.wait(lk, [&] { return shared_->live == 0; });
  }
  return store_->Flush();
}

size_t NbdServer::active_connections() const {
  std::lock_guard<std::mutex> lk(shared_->conns_mu);
  return shared_->live;
}

NbdServerStats NbdServer::Stats() const {
  NbdServerStats s;
  s.connections = shared_->connections.load();
  s.requests = shared_->requests.load();
  s.errors_replied = shared_->errors_replied.load();
  s.bytes_read = shared_->bytes_read.load();
  s.bytes_written = shared_->bytes_written.load();
  s.rmw_pages = shared_->rmw_pages.load();
  s.trimmed_pages = shared_->trimmed_pages.load();
  s.retried_ops = shared_->retried_ops.load();
  return s;
}

std::vector<ExportSpec> LayOutExports(const std::vector<std::pair<std::string, uint64_t>>& sizes,
                                      uint64_t* total_pages) {
  std::vector<ExportSpec> out;
  uint64_t next = 0;
  for (const auto& [name, bytes] : sizes) {
    ExportSpec e;
    e.name = name;
    e.size_bytes = bytes;
    e.first_page = next;
    next += (bytes + kPageSize - 1) / kPageSize;
    out.push_back(std::move(e));
  }
  *total_pages = next;
  return out;
}

}  // namespace tessera::nbd
