// The Parameter Service server's event loops: a few threads (one per core by default), each an
// epoll instance, serve every connection, instead of a reader and a writer thread per
// connection. A loop accepts (all loops watch the listening socket with EPOLLEXCLUSIVE), reads
// requests without blocking, answers the handshake and hands each whole request to Handle
// (server_conn.cc). Replies are written by whichever thread makes them (a core, a timer, the
// loop), without blocking; what the socket does not take is queued and written by the loop when
// the socket drains. Admin requests, which may wait on other servers, run on a thread of their
// own per connection.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "apps/paramsvc/server/server_impl.h"
#include "common/logging.h"
#include "fabric/credential.h"

namespace tessera::paramsvc {
namespace server_internal {
namespace {

// epoll tags of a loop's own descriptors (a connection's tag is its Conn*).
char kWakeTag, kListenTag;

constexpr uint32_t kConnEvents = EPOLLIN | EPOLLRDHUP;

bool IsAdminOp(uint8_t op) {
  switch (static_cast<Op>(op)) {
    case Op::kMoveJob:
    case Op::kImportBegin:
    case Op::kImportPart:
    case Op::kImportPrepare:
    case Op::kImportCommit:
    case Op::kImportAbort:
    case Op::kMoveStatus:
    case Op::kDrain:
      return true;
    default:
      return false;
  }
}

}  // namespace

void Conn::WatchOut(bool on) {
  if (on == out_armed || dead.load()) return;
  epoll_event e{};
  // A closing connection reads nothing more (the peer's end of file would wake the loop
  // again and again).
  e.events = (closing ? 0u : kConnEvents) | (on ? EPOLLOUT : 0u);
  e.data.ptr = this;
  if (::epoll_ctl(epfd, EPOLL_CTL_MOD, fd.get(), &e) == 0) out_armed = on;
}

bool Conn::FlushLocked() {
  while (!out.empty()) {
    Out& o = out.front();
    const size_t own = o.own.size(), shared = o.shared ? o.shared->size() : 0;
    o.h.payload_len = static_cast<uint32_t>(own + shared);
    uint8_t hb[kHeaderSize];
    EncodeHeader(o.h, hb);
    iovec iov[3];
    int n = 0;
    size_t skip = o.sent;
    auto add = [&](const uint8_t* p, size_t len) {
      if (skip >= len) {
        skip -= len;
        return;
      }
      iov[n++] = {const_cast<uint8_t*>(p) + skip, len - skip};
      skip = 0;
    };
    add(hb, kHeaderSize);
    if (own > 0) add(o.own.data(), own);
    if (shared > 0) add(o.shared->data(), shared);
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(n);
    const ssize_t w = ::sendmsg(fd.get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        WatchOut(true);
        return true;
      }
      dead = true;
      out.clear();
      ::shutdown(fd.get(), SHUT_RDWR);  // The loop sees the hang-up and drops it.
      return false;
    }
    o.sent += static_cast<size_t>(w);
    if (o.sent == kHeaderSize + own + shared) out.pop_front();
  }
  WatchOut(false);
  if (closing) {
    dead = true;
    ::shutdown(fd.get(), SHUT_RDWR);
  }
  return true;
}

void Conn::Queue(Out o) {
  std::lock_guard<std::mutex> l(qmu);
  if (dead.load() || closing) return;
  out.push_back(std::move(o));
  if (out.size() == 1) (void)FlushLocked();  // Else the loop writes it when the socket drains.
}

void Conn::CloseAfterFlush() {
  std::lock_guard<std::mutex> l(qmu);
  if (closing) return;
  closing = true;
  if (out.empty()) {
    (void)FlushLocked();  // Shuts it down now.
    return;
  }
  // Only the socket draining matters now (the peer's end of file would wake the loop again
  // and again).
  epoll_event e{};
  e.events = EPOLLOUT;
  e.data.ptr = this;
  if (!dead.load() && ::epoll_ctl(epfd, EPOLL_CTL_MOD, fd.get(), &e) == 0) out_armed = true;
}

}  // namespace server_internal

using server_internal::EventLoop;

Status Server::Impl::StartLoops(int n) {
  for (int i = 0; i < n; ++i) {
    auto loop = std::make_unique<EventLoop>();
    loop->ep.Reset(::epoll_create1(EPOLL_CLOEXEC));
    if (!loop->ep) return ErrnoError("epoll_create1");
    loop->ev.Reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (!loop->ev) return ErrnoError("eventfd");
    epoll_event e{};
    e.events = EPOLLIN;
    e.data.ptr = &server_internal::kWakeTag;
    if (::epoll_ctl(loop->ep.get(), EPOLL_CTL_ADD, loop->ev.get(), &e) != 0) {
      return ErrnoError("epoll_ctl");
    }
    loops.push_back(std::move(loop));
  }
  for (auto& loop : loops) {
    EventLoop* raw = loop.get();
    loop->th = std::thread([this, raw] { LoopRun(raw); });
  }
  return Status::Ok();
}

Status Server::Impl::StartAcceptingLoops() {
  if (accepting.exchange(true)) return Status::Ok();
  for (auto& loop : loops) {
    epoll_event e{};
    e.events = EPOLLIN | EPOLLEXCLUSIVE;
    e.data.ptr = &server_internal::kListenTag;
    if (::epoll_ctl(loop->ep.get(), EPOLL_CTL_ADD, listen_fd.get(), &e) != 0) {
      return ErrnoError("epoll_ctl (listening socket)");
    }
  }
  return Status::Ok();
}

void Server::Impl::StopLoops() {
  const uint64_t one = 1;
  for (auto& loop : loops) (void)!::write(loop->ev.get(), &one, sizeof(one));
  for (auto& loop : loops) {
    if (loop->th.joinable()) loop->th.join();
  }
  // No loop runs now: shut every connection, so admin requests waiting on a peer end.
  for (auto& loop : loops) {
    for (auto& [raw, conn] : loop->conns) {
      conn->dead = true;
      ::shutdown(conn->fd.get(), SHUT_RDWR);
    }
  }
  std::vector<std::pair<std::shared_ptr<std::atomic<bool>>, std::thread>> admin;
  {
    std::lock_guard<std::mutex> l(admin_mu);
    admin.swap(admin_threads);
  }
  for (auto& [done, th] : admin) {
    if (th.joinable()) th.join();
  }
  for (auto& loop : loops) loop->conns.clear();
}

void Server::Impl::LoopRun(EventLoop* loop) {
  epoll_event events[64];
  std::vector<std::shared_ptr<Conn>> gone;
  while (!stop.load()) {
    const int n = ::epoll_wait(loop->ep.get(), events, 64, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      TLOG(ERROR) << "paramsvc: epoll_wait: " << std::strerror(errno);
      return;
    }
    for (int i = 0; i < n && !stop.load(); ++i) {
      void* tag = events[i].data.ptr;
      if (tag == &server_internal::kWakeTag) {
        uint64_t v;
        (void)!::read(loop->ev.get(), &v, sizeof(v));
        continue;
      }
      if (tag == &server_internal::kListenTag) {
        AcceptSome(loop);
        continue;
      }
      auto it = loop->conns.find(static_cast<Conn*>(tag));
      if (it == loop->conns.end()) continue;
      std::shared_ptr<Conn> conn = it->second;
      const uint32_t ev = events[i].events;
      if ((ev & EPOLLOUT) != 0) {
        std::lock_guard<std::mutex> l(conn->qmu);
        (void)conn->FlushLocked();
      }
      if ((ev & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) != 0 && !conn->dead.load() &&
          !ReadSome(conn)) {
        // The peer closed, or the connection must end: what is queued is still written.
        conn->CloseAfterFlush();
      }
      if (conn->dead.load() || (ev & (EPOLLHUP | EPOLLERR)) != 0) gone.push_back(conn);
    }
    // Dropped after the batch, so no event of this batch can name a freed connection.
    for (auto& conn : gone) {
      if (loop->conns.erase(conn.get()) == 0) continue;
      (void)::epoll_ctl(loop->ep.get(), EPOLL_CTL_DEL, conn->fd.get(), nullptr);
      {
        std::lock_guard<std::mutex> l(conn->qmu);
        conn->dead = true;
        conn->closing = true;
        conn->out.clear();
      }
      ::shutdown(conn->fd.get(), SHUT_RDWR);
      nconns.fetch_sub(1);
    }
    gone.clear();
  }
}

void Server::Impl::AcceptSome(EventLoop* loop) {
  for (int i = 0; i < 64; ++i) {
    const int fd = ::accept4(listen_fd.get(), nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) return;  // EAGAIN (another loop took it), or an aborted connection.
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (nconns.load() >= opt.max_connections) {
      // Told why, then closed (the reply fits the socket's buffer).
      SetSocketTimeouts(fd, 0, 1000);
      const std::string m =
          ResourceExhausted("too many connections (", opt.max_connections, ")").message();
      (void)WriteFrame(fd,
                       Header{0, static_cast<uint16_t>(StatusCode::kResourceExhausted), 0, 0, 0},
                       {reinterpret_cast<const uint8_t*>(m.data()), m.size()});
      ::close(fd);
      continue;
    }
    auto conn = std::make_shared<Conn>();
    conn->fd.Reset(fd);
    conn->epfd = loop->ep.get();
    epoll_event e{};
    e.events = server_internal::kConnEvents;
    e.data.ptr = conn.get();
    if (::epoll_ctl(loop->ep.get(), EPOLL_CTL_ADD, fd, &e) != 0) continue;  // fd closed.
    nconns.fetch_add(1);
    loop->conns.emplace(conn.get(), std::move(conn));
  }
}

bool Server::Impl::ReadSome(const std::shared_ptr<Conn>& c) {
  // At most this much per wake-up, so one busy connection does not starve the others.
  size_t budget = 4u << 20;
  while (budget > 0) {
    uint8_t* dst;
    size_t want;
    if (!c->in_payload) {
      dst = c->hdr + c->hdr_have;
      want = kHeaderSize - c->hdr_have;
    } else {
      dst = c->payload.data() + c->payload_have;
      want = c->payload.size() - c->payload_have;
    }
    const ssize_t r = ::recv(c->fd.get(), dst, std::min(want, budget), MSG_DONTWAIT);
    if (r == 0) return false;  // The peer closed.
    if (r < 0) {
      if (errno == EINTR) continue;
      return errno == EAGAIN || errno == EWOULDBLOCK;
    }
    budget -= static_cast<size_t>(r);
    if (!c->in_payload) {
      c->hdr_have += static_cast<size_t>(r);
      if (c->hdr_have < kHeaderSize) continue;
      auto h = DecodeHeader({c->hdr, kHeaderSize});
      c->hdr_have = 0;
      if (!h.ok()) {
        TLOG(WARNING) << "paramsvc: closing a connection: " << h.status().message();
        c->SendError(0, 0, 0, h.status());
        return false;
      }
      c->h = *h;
      c->payload.assign(h->payload_len, 0);
      c->payload_have = 0;
      c->in_payload = h->payload_len > 0;
      if (c->in_payload) continue;
    } else {
      c->payload_have += static_cast<size_t>(r);
      if (c->payload_have < c->payload.size()) continue;
      c->in_payload = false;
    }
    if (!OnFrame(c, c->h, std::move(c->payload))) return false;
    c->payload = {};
  }
  return true;
}

bool Server::Impl::OnFrame(const std::shared_ptr<Conn>& conn, const Header& h,
                           std::vector<uint8_t> payload) {
  if (h.status != 0) {
    conn->SendError(h.op, h.job, h.request_id, ProtocolError("a request carries a status"));
    return true;
  }
  const Op op = static_cast<Op>(h.op);
  if (!conn->authed) {
    if (op == Op::kHello && payload.size() == 40) {
      std::memcpy(conn->tr.client_nonce.data(), payload.data(), 32);
      conn->tr.client_id = DecodeFixed64(payload.data() + 32);
      conn->tr.server_id = server_id;
      if (!fabric::RandomBytes(conn->tr.server_nonce).ok()) return false;
      uint8_t out[40];
      std::memcpy(out, conn->tr.server_nonce.data(), 32);
      EncodeFixed64(out + 32, server_id);
      conn->Send(h.op, 0, h.request_id, out);
      conn->hello = true;
      return true;
    }
    if (op == Op::kAuth && conn->hello && payload.size() == 32) {
      fabric::Mac mac;
      std::memcpy(mac.data(), payload.data(), 32);
      // Any credential issued from the cluster secret (fabric/credential.h): a client token, an
      // admin token or the secret itself.
      std::optional<fabric::VerifiedClient> who =
          fabric::VerifyClientMac(opt.secret, conn->tr, mac);
      if (!who) {
        conn->SendError(h.op, 0, h.request_id,
                        PermissionDenied("authentication failed: the credential for client id ",
                                         conn->tr.client_id,
                                         " was not issued from this service's cluster secret"));
        return false;
      }
      conn->authed = true;
      conn->admin = who->role == fabric::Role::kAdmin;
      const fabric::Mac sm = fabric::ServerMac(who->key, conn->tr);
      conn->Send(h.op, 0, h.request_id, sm);
      return true;
    }
    conn->SendError(h.op, h.job, h.request_id,
                    PermissionDenied(OpName(h.op), " before authentication (HELLO, AUTH first)"));
    return false;
  }
  if (server_internal::IsAdminOp(h.op)) {
    RunAdmin(conn, h, std::move(payload));
  } else {
    Handle(conn, h, std::move(payload));
  }
  return true;
}

void Server::Impl::RunAdmin(const std::shared_ptr<Conn>& conn, const Header& h,
                            std::vector<uint8_t> payload) {
  {
    std::lock_guard<std::mutex> l(conn->amu);
    conn->admin_q.emplace_back(h, std::move(payload));
    if (conn->admin_running) return;  // Its thread takes it next, in order.
    conn->admin_running = true;
  }
  auto done = std::make_shared<std::atomic<bool>>(false);
  std::thread th([this, conn, done] {
    for (;;) {
      std::pair<Header, std::vector<uint8_t>> req;
      {
        std::lock_guard<std::mutex> l(conn->amu);
        if (conn->admin_q.empty() || stop.load()) {
          conn->admin_q.clear();
          conn->admin_running = false;
          break;
        }
        req = std::move(conn->admin_q.front());
        conn->admin_q.pop_front();
      }
      Handle(conn, req.first, std::move(req.second));
    }
    done->store(true);
  });
  std::lock_guard<std::mutex> l(admin_mu);
  // Reap the threads that finished.
  for (auto it = admin_threads.begin(); it != admin_threads.end();) {
    if (it->first->load()) {
      it->second.join();
      it = admin_threads.erase(it);
    } else {
      ++it;
    }
  }
  admin_threads.emplace_back(std::move(done), std::move(th));
}

}  // namespace tessera::paramsvc
