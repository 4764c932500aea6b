// fabric::ControlClient: the blocking control calls to ONE memory server (AllocSlab, FreeSlab,
// Stats, Heartbeat, Invoke, Fault) over its own authenticated TCP connection. It is the control
// half of the client side of the fabric; fabric::Transport (fabric/transport.h) is the data half
// (one-sided READ/WRITE, posted and polled). They are separate so that a tool or a monitor that
// only asks for stats or heartbeats never builds a data path, and so that a transport whose data
// path is not TCP (verbs) does not have to forward control calls.
//
// A slab allocated here is named in a Transport's WorkRequests after Transport::AddSlab() with
// this call's reply, on a Transport connection to the same server with the same client_id (the
// server checks ownership by client_id, not by connection).
//
// Each call sends one request and waits for its reply until the deadline (Timeout; the
// connection stays usable, a late reply is skipped). A lost connection fails the call and
// every later one with Unavailable (connected() turns false; connect a new client to retry).
// NOTICEs the server sends on this connection are kept (the newest 1024) for PollNotices().
//
// Threads: one thread at a time (no internal locking); the client may move between threads
// between calls. Ownership: owns its socket; destroying it closes the connection (without the
// GOODBYE exchange; call Close() for that).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/fd.h"
#include "common/status.h"
#include "fabric/transport.h"
#include "fabric/wire.h"

namespace tessera::fabric {

class FrameReader;

class ControlClient {
 public:
  // Connects and authenticates (both ways) within options.deadline. PermissionDenied when the
  // secrets differ; Timeout / Unavailable for network failures.
  static Result<std::unique_ptr<ControlClient>> Connect(const Endpoint& endpoint,
                                                        const ConnectOptions& options);
  ~ControlClient();
  ControlClient(const ControlClient&) = delete;
  ControlClient& operator=(const ControlClient&) = delete;

  // What the server said at AUTH_OK (rdma is false: this connection carries no RDMA).
  const ServerInfo& info() const { return info_; }
  // The server runs a verbs listener and offered RDMA to this login. One-sided RDMA READ/WRITE
  // from a verbs client then bypass the server's fault hooks (see RequestHandler::BeforeOp).
  bool rdma_offered() const { return (auth_ok_.flags & AuthOkResponse::kRdmaOffered) != 0; }
  // The whole AUTH_OK (the verbs transport binds its queue pair with its rdma_token).
  const AuthOkResponse& auth_ok() const { return auth_ok_; }
  bool connected() const { return down_.ok(); }
  // Why the connection is down (OK while it is up).
  const Status& down_reason() const { return down_; }

  Result<AllocSlabResponse> AllocSlab(const AllocSlabRequest& req, Deadline deadline);
  Status FreeSlab(uint64_t slab_id, Deadline deadline);
  // "key value" lines.
  Result<std::string> Stats(Deadline deadline);
  Result<HeartbeatResponse> Heartbeat(Deadline deadline);
  // The same heartbeat in two halves, so that one thread can keep heartbeats to many servers
  // in flight at once (the store's monitor): SendHeartbeat() sends the request (a small frame;
  // bounded by `deadline`) and returns its id; PollHeartbeat() reads what has arrived without
  // blocking and returns true once the reply to `id` is there (an error reply is an error).
  // Use fd() with poll() to wait. A lost connection is Unavailable.
  Result<uint64_t> SendHeartbeat(Deadline deadline);
  Result<bool> PollHeartbeat(uint64_t id);
  Result<std::vector<uint8_t>> Invoke(uint32_t function_id, std::span<const uint8_t> args,
                                      Deadline deadline);
  Status Fault(const FaultRequest& req, Deadline deadline);
  // GOODBYE exchange, then the connection is closed (connected() turns false).
  Status Close(Deadline deadline);

  // Moves the notices received so far (reading what has arrived, without blocking) into `out`;
  // returns how many. A connection closed by the server turns connected() false here too.
  size_t PollNotices(std::span<Notice> out);
  // The socket, readable when a notice (or the close) arrives; for poll() only (-1 once down).
  int fd() const { return fd_.get(); }

 private:
  ControlClient(UniqueFd fd, Endpoint endpoint, uint64_t server_id, AuthOkResponse auth_ok);
  // Sends one request frame; returns its id.
  Result<uint64_t> Send(Op op, std::span<const uint8_t> payload, Deadline deadline);
  // Sends one request; returns its whole response frame (status checked by the caller).
  Result<std::vector<uint8_t>> Call(Op op, std::span<const uint8_t> payload, Deadline deadline);
  // One non-blocking recv into the window (down_ set when the connection is gone).
  enum class ReadResult : uint8_t { kData, kNothing, kDown };
  ReadResult ReadOnce();
  // Takes whole frames from the window: notices are queued, stale replies skipped; returns
  // true and the bytes once the reply to `want_id` is there.
  Result<bool> TakeFrames(uint64_t want_id, Op want_op, std::vector<uint8_t>* reply);
  void MarkDown(Status reason);

  UniqueFd fd_;
  Endpoint endpoint_;
  ServerInfo info_;
  AuthOkResponse auth_ok_;
  Status down_;
  std::unique_ptr<FrameReader> in_;
  std::deque<Notice> notices_;
  uint64_t next_id_ = 3;  // 1 and 2 were the handshake's.
};

}  // namespace tessera::fabric
