#include "apps/kayak/connection.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/logging.h"
#include "fabric/frame_reader.h"
#include "fabric/handshake.h"
#include "fabric/socket.h"

namespace kayak {

namespace fab = tessera::fabric;
using tessera::Result;
using tessera::Status;

Result<std::unique_ptr<Connection>> Connection::Open(const fab::Endpoint& endpoint,
                                                     const std::string& secret,
                                                     uint64_t client_id,
                                                     tessera::Deadline deadline) {
  fab::ConnectOptions co;
  co.secret = secret;
  co.client_id = client_id;
  co.deadline = deadline;
  TESSERA_ASSIGN_OR_RETURN(fab::ClientSocket sock, fab::ConnectAndAuthenticate(endpoint, co));
  TESSERA_RETURN_IF_ERROR(fab::SetBlocking(sock.fd.get(), true));
  fab::SetNoDelay(sock.fd.get());
  std::unique_ptr<Connection> c(new Connection(endpoint, std::move(sock.fd)));
  c->reader_ = std::thread([p = c.get()] { p->ReaderMain(); });
  return c;
}

std::unique_ptr<Connection> Connection::Dead(const fab::Endpoint& endpoint, Status why) {
  std::unique_ptr<Connection> c(new Connection(endpoint, tessera::UniqueFd()));
  c->up_.store(false);
  c->down_reason_ = tessera::Unavailable("memserver ", endpoint.ToString(), ": ", why.ToString());
  return c;
}

Connection::Connection(fab::Endpoint endpoint, tessera::UniqueFd fd)
    : endpoint_(std::move(endpoint)), fd_(std::move(fd)) {}

Connection::~Connection() {
  Close();
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
      pending_.emplace(id, std::move(cb));
    }
  }
  if (!down.ok()) return cb(down);
  std::vector<uint8_t> frame(fab::kHeaderSize + payload.size());
  fab::EncodeHeader(fab::FrameHeader{op, false, id, tessera::StatusCode::kOk,
                                     static_cast<uint32_t>(payload.size())},
                    frame.data());
  if (!payload.empty()) std::memcpy(frame.data() + fab::kHeaderSize, payload.data(), payload.size());
  std::lock_guard<std::mutex> lock(send_mu_);
  size_t off = 0;
  while (off < frame.size()) {
    ssize_t n = ::send(fd_.get(), frame.data() + off, frame.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      // The reader notices the broken socket too and fails this request with the others.
      ::shutdown(fd_.get(), SHUT_RDWR);
      return;
    }
    off += static_cast<size_t>(n);
  }
}

void Connection::Fail(const Status& why) {
  std::unordered_map<uint64_t, ReplyCallback> pending;
  {
    std::lock_guard<std::mutex> lock(mu_);
    up_.store(false, std::memory_order_release);
    if (down_reason_.ok()) down_reason_ = why;
    pending.swap(pending_);
  }
  for (auto& [id, cb] : pending) cb(why);
}

void Connection::ReaderMain() {
  fab::FrameReader in(256 * 1024);
  const std::string who = "memserver " + endpoint_.ToString();
  while (true) {
    std::span<uint8_t> space = in.RecvSpace();
    ssize_t n = ::recv(fd_.get(), space.data(), space.size(), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      Fail(tessera::Unavailable(who, ": connection lost (",
                                n == 0 ? "closed by the server" : strerror(errno), ")"));
      return;
    }
    in.Commit(static_cast<size_t>(n));
    while (true) {
      auto next = in.Next(fab::Direction::kResponse);
      if (!next.ok()) {
        Fail(tessera::Unavailable(who, ": malformed reply: ", next.status().message()));
        ::shutdown(fd_.get(), SHUT_RDWR);
        return;
      }
      if (!next->has_value()) break;
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
          cb = std::move(it->second);
          pending_.erase(it);
        }
      }
      if (cb) {
        if (f->header.status != tessera::StatusCode::kOk) {
          std::string msg(f->data.begin(), f->data.end());
          cb(Status(f->header.status, who + ": " + msg));
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
