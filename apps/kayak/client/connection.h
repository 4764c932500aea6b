// kayak::Connection: one authenticated TCP connection from a Kayak client to a memserver,
// carrying the KV frames (apps/kayak/wire/wire.h, service ops 16..21) with many requests in
// flight.
//
// Open() connects and runs the fabric handshake (fabric/handshake.h). Send() appends one request
// frame to the connection's output and registers its callback; a reader thread receives the
// replies, validates every frame (fabric::ParseFrame, then the KV payload with
// wire::ParseResponse) and calls the callback of its request id.
//
// Coalescing: while a reader thread runs the callbacks of the replies one recv() brought (a
// SendBatch is open on that thread), the requests those callbacks send, to this connection or
// any other, are written with one send() per connection when the batch closes; a Send() from
// any other thread is written at once. So a closed-loop caller that issues its next request
// from the reply callback sends many frames per system call under load, and one when idle.
//
// Timeouts: a request with no reply `request_timeout_ms` after it was sent fails with Timeout
// naming the server (a stopped or hung server does not hang a caller forever); a late reply is
// dropped. A send that cannot make progress for that long (the server stopped reading) closes
// the connection. When the connection fails (the server died, closed, sent a malformed frame or
// a shutting-down notice) every pending callback gets Unavailable naming the server, and later
// Send()s fail the same way at once.
//
// Ownership: owns the socket and the reader thread; the destructor shuts the socket down,
// fails what is pending and joins the reader (so no callback runs after it returns).
// Threads: Send() from any thread; callbacks run on the reader thread (or on the caller's
// thread for a Send() on a dead connection) and must not block on this connection's replies.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/fd.h"
#include "common/status.h"
#include "fabric/transport.h"
#include "fabric/wire.h"

namespace kayak {

struct Reply {
  tessera::fabric::FrameHeader header;
  std::vector<uint8_t> payload;  // The whole payload (fixed part + data) of an OK response.
};
using ReplyCallback = std::function<void(tessera::Result<Reply>)>;

class Connection {
 public:
  static tessera::Result<std::unique_ptr<Connection>> Open(
      const tessera::fabric::Endpoint& endpoint, const std::string& secret, uint64_t client_id,
      tessera::Deadline deadline, int request_timeout_ms = 10000);
  // A connection that never came up (the server was unreachable): every Send() fails with `why`.
  static std::unique_ptr<Connection> Dead(const tessera::fabric::Endpoint& endpoint,
                                          tessera::Status why);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Sends op with `payload` (its fixed part and data); `cb` gets the reply: OK responses as a
  // Reply, error responses as their Status.
  void Send(tessera::fabric::Op op, std::span<const uint8_t> payload, ReplyCallback cb);
  bool up() const { return up_.load(std::memory_order_acquire); }
  const tessera::fabric::Endpoint& endpoint() const { return endpoint_; }
  // Closes the connection now (pending requests fail with Unavailable).
  void Close();
  // Waits for the reader thread to finish (after Close()); not from a callback.
  void JoinReader();
  // Requests sent so far and send() calls made for them (coalescing makes the second smaller).
  uint64_t frames_sent() const { return frames_sent_.load(std::memory_order_relaxed); }
  uint64_t send_calls() const { return send_calls_.load(std::memory_order_relaxed); }

 private:
  friend class SendBatch;
  struct Pending {
    ReplyCallback cb;
    uint64_t deadline_ns;
    tessera::fabric::Op op;
  };
  Connection(tessera::fabric::Endpoint endpoint, tessera::UniqueFd fd, int request_timeout_ms);
  void ReaderMain();
  void Fail(const tessera::Status& why);
  void FlushOut();  // Writes out_ (under send_mu_).
  void ExpireOverdue(uint64_t now_ns);

  const tessera::fabric::Endpoint endpoint_;
  tessera::UniqueFd fd_;
  const uint64_t request_timeout_ns_;
  std::atomic<bool> up_{true};
  std::mutex send_mu_;
  std::vector<uint8_t> out_;  // Frames not yet written; under send_mu_.
  std::mutex mu_;
  uint64_t next_id_ = 1;  // Under mu_.
  // Under mu_; ordered by id, hence by deadline (every request gets the same timeout).
  std::map<uint64_t, Pending> pending_;
  tessera::Status down_reason_;  // Under mu_.
  std::atomic<uint64_t> frames_sent_{0}, send_calls_{0};
  std::thread reader_;
};

// Open on a reader thread while it runs the callbacks of one recv()'s replies: Send()s on this
// thread are buffered and each connection they touched is flushed once when it closes. Nested
// scopes join the outermost. Internal to kayak (Connection's reader); not for callers.
class SendBatch {
 public:
  SendBatch();
  ~SendBatch();
  SendBatch(const SendBatch&) = delete;
  SendBatch& operator=(const SendBatch&) = delete;
  // The open batch of this thread, or nullptr.
  static SendBatch* Current();
  void Touch(Connection* c);

 private:
  bool outer_;
  std::vector<Connection*> dirty_;
};

}  // namespace kayak
