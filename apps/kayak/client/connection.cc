#include "apps/kayak/client/connection.h"

#include <sys/socket.h>
#include <unistd.h>

#include <sys/time.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "apps/kayak/wire/wire.h"
#include "common/logging.h"
#include "fabric/connect.h"
#include "fabric/frame_reader.h"

namespace kayak {

namespace fab = tessera::fabric;
namespace kw = tessera::kayak::wire;
using tessera::Result;
using tessera::Status;

Result<std::unique_ptr<Connection>> Connection::Open(const fab::Endpoint& endpoint,
                                                     const std::string& secret,
                                                     uint64_t client_id,
                                                     tessera::Deadline deadline,
                                                     int request_timeout_ms) {
  if (request_timeout_ms <= 0) {
    return tessera::InvalidArgument("request timeout must be positive, got ", request_timeout_ms, " ms");
  }
  fab::ConnectOptions co;
  co.secret = secret;
  co.client_id = client_id;
  co.deadline = deadline;
  TESSERA_ASSIGN_OR_RETURN(fab::ClientSocket sock, fab::ConnectAndAuthenticate(endpoint, co));
  TESSERA_RETURN_IF_ERROR(fab::SetBlocking(sock.fd.get(), true));
  fab::SetNoDelay(sock.fd.get());
  // The reader wakes at least this often to expire overdue requests on an idle socket, and a
  // send blocked this long (the server stopped reading) gives up.
  const int tick_ms = std::clamp(request_timeout_ms / 4, 1, 250);
  timeval rcv{tick_ms / 1000, (tick_ms % 1000) * 1000};
  timeval snd{request_timeout_ms / 1000, (request_timeout_ms % 1000) * 1000};
  if (::setsockopt(sock.fd.get(), SOL_SOCKET, SO_RCVTIMEO, &rcv, sizeof(rcv)) != 0 ||
      ::setsockopt(sock.fd.get(), SOL_SOCKET, SO_SNDTIMEO, &snd, sizeof(snd)) != 0) {
    return tessera::ErrnoError("setsockopt SO_RCVTIMEO/SO_SNDTIMEO");
  }
  std::unique_ptr<Connection> c(new Connection(endpoint, std::move(sock.fd), request_timeout_ms));
  c->reader_ = std::thread([p = c.get()] { p->ReaderMain(); });
  return c;
}

std::unique_ptr<Connection> Connection::Dead(const fab::Endpoint& endpoint, Status why) {
  std::unique_ptr<Connection> c(new Connection(endpoint, tessera::UniqueFd(), 1));
  c->up_.store(false);
  c->down_reason_ = tessera::Unavailable("memserver ", endpoint.ToString(), ": ", why.ToString());
  return c;
}

Connection::Connection(fab::Endpoint endpoint, tessera::UniqueFd fd, int request_timeout_ms)
    : endpoint_(std::move(endpoint)), fd_(std::move(fd)),
      request_timeout_ns_(static_cast<uint64_t>(request_timeout_ms) * 1'000'000) {}

namespace {
thread_local SendBatch* tls_batch = nullptr;
}  // namespace

SendBatch::SendBatch() : outer_(tls_batch == nullptr) {
  if (outer_) tls_batch = this;
}
SendBatch::~SendBatch() {
  if (!outer_) return;
  tls_batch = nullptr;
  for (Connection* c : dirty_) {
    std::lock_guard<std::mutex> lock(c->send_mu_);
    c->FlushOut();
  }
}
SendBatch* SendBatch::Current() { return tls_batch; }
void SendBatch::Touch(Connection* c) {
  if (std::find(dirty_.begin(), dirty_.end(), c) == dirty_.end()) dirty_.push_back(c);
}

Connection::~Connection() {
  Close();
  JoinReader();
}

void Connection::JoinReader() {
  if (reader_.joinable()) reader_.join();
}

void Connection::Close() {
  if (fd_) ::shutdown(fd_.get(), SHUT_RDWR);  // The reader sees EOF and fails what is pending.
  up_.store(false, std::memory_order_release);
}

void Connection::Send(fab::Op op, std::span<const uint8_t> payload, ReplyCallback cb) {
  uint64_t id = 0;
  Status down;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!up_.load(std::memory_order_acquire)) {
      down = down_reason_.ok() ? tessera::Unavailable("memserver ", endpoint_.ToString(),
                                                      ": connection closed")
                               : down_reason_;
    } else {
      id = next_id_++;
      pending_.emplace(id, Pending{std::move(cb), tessera::MonotonicNs() + request_timeout_ns_, op});
    }
  }
  if (!down.ok()) return cb(down);
  SendBatch* batch = SendBatch::Current();
  std::lock_guard<std::mutex> lock(send_mu_);
  const size_t at = out_.size();
  out_.resize(at + fab::kHeaderSize + payload.size());
  fab::EncodeHeader(fab::FrameHeader{op, false, id, tessera::StatusCode::kOk,
                                     static_cast<uint32_t>(payload.size())},
                    out_.data() + at);
  if (!payload.empty()) std::memcpy(out_.data() + at + fab::kHeaderSize, payload.data(), payload.size());
  frames_sent_.fetch_add(1, std::memory_order_relaxed);
  if (batch != nullptr) {
    batch->Touch(this);  // Written when the batch closes.
  } else {
    FlushOut();
  }
}

void Connection::FlushOut() {
  size_t off = 0;
  while (off < out_.size()) {
    send_calls_.fetch_add(1, std::memory_order_relaxed);
    ssize_t n = ::send(fd_.get(), out_.data() + off, out_.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      // Broken, or no progress for the request timeout (SO_SNDTIMEO): the reader notices the
      // shut-down socket and fails these requests with the others.
      ::shutdown(fd_.get(), SHUT_RDWR);
      break;
    }
    off += static_cast<size_t>(n);
  }
  out_.clear();
}

void Connection::ExpireOverdue(uint64_t now_ns) {
  std::vector<Pending> overdue;
  {
    std::lock_guard<std::mutex> lock(mu_);
    while (!pending_.empty() && pending_.begin()->second.deadline_ns <= now_ns) {
      overdue.push_back(std::move(pending_.begin()->second));
      pending_.erase(pending_.begin());
    }
  }
  for (Pending& p : overdue) {
    p.cb(tessera::Timeout("memserver ", endpoint_.ToString(), ": no reply to ", kw::KvOpName(p.op),
                          " within ", request_timeout_ns_ / 1'000'000,
                          " ms (the server may be stopped or overloaded)"));
  }
}

void Connection::Fail(const Status& why) {
  std::map<uint64_t, Pending> pending;
  {
    std::lock_guard<std::mutex> lock(mu_);
    up_.store(false, std::memory_order_release);
    if (down_reason_.ok()) down_reason_ = why;
    pending.swap(pending_);
  }
  for (auto& [id, p] : pending) p.cb(why);
}

void Connection::ReaderMain() {
  fab::FrameReader in(256 * 1024);
  const std::string who = "memserver " + endpoint_.ToString();
  while (true) {
    std::span<uint8_t> space = in.RecvSpace();
    ssize_t n = ::recv(fd_.get(), space.data(), space.size(), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {  // Idle for SO_RCVTIMEO.
      ExpireOverdue(tessera::MonotonicNs());
      continue;
    }
    if (n <= 0) {
      Fail(tessera::Unavailable(who, ": connection lost (",
                                n == 0 ? "closed by the server" : strerror(errno), ")"));
      return;
    }
    in.Commit(static_cast<size_t>(n));
    // Requests the callbacks below send are written together when this batch closes.
    SendBatch batch;
    while (true) {
      auto next = in.Next(fab::Direction::kResponse);
      if (!next.ok()) {
        Fail(tessera::Unavailable(who, ": malformed reply: ", next.status().message()));
        ::shutdown(fd_.get(), SHUT_RDWR);
        return;
      }
      if (!next->has_value()) {
        // Replies keep coming while one request got none: it expires all the same.
        ExpireOverdue(tessera::MonotonicNs());
        break;
      }
      const auto& raw = **next;
      auto f = fab::ParseFrame(in.FrameBytes(raw), fab::Direction::kResponse);
      if (!f.ok()) {
        Fail(tessera::Unavailable(who, ": malformed reply: ", f.status().message()));
        ::shutdown(fd_.get(), SHUT_RDWR);
        return;
      }
      if (f->header.op == fab::Op::kNotice) {
        const auto& notice = std::get<fab::Notice>(f->body);
        if (notice.kind == fab::NoticeKind::kShuttingDown) {
          Fail(tessera::Unavailable(who, ": the server is shutting down"));
        }
        in.Consume(raw);
        continue;
      }
      ReplyCallback cb;
      {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = pending_.find(f->header.request_id);
        if (it != pending_.end()) {
          cb = std::move(it->second.cb);
          pending_.erase(it);
        }
      }
      if (cb) {
        if (f->header.status != tessera::StatusCode::kOk) {
          std::string msg(f->data.begin(), f->data.end());
          cb(Status(f->header.status, who + ": " + msg));
        } else if (auto kv = kw::ParseResponse(f->header.op, f->data); !kv.ok()) {
          Fail(tessera::Unavailable(who, ": malformed reply: ", kv.status().message()));
          ::shutdown(fd_.get(), SHUT_RDWR);
          cb(Status(kv.status().code(), who + ": " + kv.status().message()));
          return;
        } else {
          Reply r;
          r.header = f->header;
          r.payload.assign(raw.payload.begin(), raw.payload.end());
          cb(std::move(r));
        }
      }
      in.Consume(raw);
    }
  }
}

}  // namespace kayak
