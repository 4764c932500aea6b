// kayak::Connection: one authenticated TCP connection from a Kayak client to a memserver,
// carrying the KV frames (fabric/wire.h ops 16..31) with many requests in flight.
//
// Open() connects and runs the fabric handshake (fabric/handshake.h). Send() writes one request
// frame (a blocking send under a mutex; frames are small) and registers its callback; a reader
// thread receives the replies, validates every frame (fabric::ParseFrame) and calls the
// callback of its request id. When the connection fails (the server died, closed, sent a
// malformed frame or a shutting-down notice) every pending callback gets Unavailable naming
// the server, and later Send()s fail the same way at once.
//
// Ownership: owns the socket and the reader thread; the destructor shuts the socket down,
// fails what is pending and joins the reader (so no callback runs after it returns).
// Threads: Send() from any thread; callbacks run on the reader thread (or on the caller's
// thread for a Send() on a dead connection) and must not block on this connection's replies.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
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
      tessera::Deadline deadline);
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

 private:
  Connection(tessera::fabric::Endpoint endpoint, tessera::UniqueFd fd);
  void ReaderMain();
  void Fail(const tessera::Status& why);

  const tessera::fabric::Endpoint endpoint_;
  tessera::UniqueFd fd_;
  std::atomic<bool> up_{true};
  std::mutex send_mu_;
  std::mutex mu_;
  uint64_t next_id_ = 1;                                   // Under mu_.
  std::unordered_map<uint64_t, ReplyCallback> pending_;    // Under mu_.
  tessera::Status down_reason_;                            // Under mu_.
  std::thread reader_;
};

}  // namespace kayak
