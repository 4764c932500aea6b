// fabric::Server: the memory server's network engine (TCP on io_uring, optional verbs listener).
//
// The Server accepts TCP connections, runs the HELLO/CHALLENGE/AUTH handshake itself, parses and
// validates every frame, and dispatches authenticated requests to a RequestHandler (implemented
// by the memserver), or, for service ops (fabric/wire.h), to the ServiceHandler registered for
// the op (RegisterService). For READ and WRITE the handler only validates and names the slab memory;
// the engine copies the bytes between that memory and the socket buffers. Many requests may be
// in flight per connection and replies may leave out of order (a delayed reply does not hold up
// the others). A malformed frame, or anything other than HELLO/AUTH before a successful AUTH,
// closes that one connection with a logged reason; the server and the other clients go on.
//
// Memory bounds. Before AUTH a connection has a receive window of kPreAuthRecvBuffer bytes and
// a frame header claiming more than a handshake frame needs (or any op but HELLO/AUTH) closes
// it at once, before its payload is read; a connection not authenticated within
// handshake_timeout_ms is closed. So an unauthenticated connection costs about 1 KiB of server
// memory whatever it sends. After AUTH the window grows to the largest frame received (at most
// kMaxDataLength plus header) and replies are bounded by max_queued_reply_bytes (reading
// stops while they are not drained). Connections are bounded in total (max_connections) and
// per client id (max_connections_per_client).
//
// Threads: Start() spawns `io_threads` I/O threads, each with its own io_uring and its own
// SO_REUSEPORT listening socket on the same port (the kernel spreads connections over them).
// Each connection lives on one I/O thread for its whole life. RequestHandler methods are called
// from the I/O threads, concurrently when io_threads > 1, and must not block for long (a slow
// handler stalls every connection of that thread). Notify(), Stop(), port() and
// RegisterMemory() may be called from any thread.
//
// Ownership: the Server does not own the handler; the handler must outlive the Server (or at
// least its Stop()). The Server owns its sockets, rings and threads; ~Server() calls Stop().
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "fabric/wire.h"

namespace tessera::fabric {

// Who sent a request. Stable for the life of a connection; passed by reference to every
// handler call of that connection (valid only during the call).
struct PeerInfo {
  uint64_t connection_id = 0;  // Unique within this Server, never reused.
  uint64_t client_id = 0;      // From HELLO, authenticated by AUTH (0 before AUTH).
  // Who owns the slabs this connection allocates: OwnerIdFor(client_id, HELLO's instance id)
  // (fabric/auth.h, "Slab ownership"); client_id when the client sent no instance.
  uint64_t owner_id = 0;
  // AUTH proved an admin credential (the cluster secret or an admin token, fabric/credential.h):
  // the handler lets it act on every client's slabs and inject faults. False for a client
  // token, which may act only on client_id's own slabs.
  bool admin = false;
  std::string address;         // "127.0.0.1:54321" / "[::1]:54321".
  int io_thread = 0;           // Index of the I/O thread serving the connection.
};

// What the engine does with one request, asked before it runs (fault injection wraps the seam
// here; production code paths stay the same).
struct OpPolicy {
  enum class Action : uint8_t {
    kProceed,  // Run the op and reply now.
    kDelay,    // Run the op now, send the reply after delay_ns (an io_uring timeout; the loop
               // keeps serving other requests meanwhile).
    kHang,     // Never run or answer this op (the client sees its own timeout).
    kDrop,     // Close the connection (as if the network failed); the op is not run.
  };
  Action action = Action::kProceed;
  uint64_t delay_ns = 0;

  static OpPolicy Proceed() { return {}; }
  static OpPolicy Delay(uint64_t ns) { return {Action::kDelay, ns}; }
  static OpPolicy Hang() { return {Action::kHang, 0}; }
  static OpPolicy Drop() { return {Action::kDrop, 0}; }
};

// The receive window of a connection before AUTH: HELLO (with its instance id) and AUTH fit.
inline constexpr size_t kPreAuthRecvBuffer = 256;

class ServerIoThread;
struct AsyncReplyChannel;  // Internal: how a reply finds its I/O thread.

// The reply to one asynchronous request (a service op, see ServiceHandler): the service keeps it and calls Send() exactly once, later, from any thread (e.g. an offload worker). The
// reply is queued to the connection's I/O thread (woken by an eventfd) and leaves in order with
// that connection's other replies; the caller never blocks on the network. Send() is a no-op
// when the connection has closed or the server stopped meanwhile. Copyable value; thread-safe.
class AsyncReply {
 public:
  AsyncReply() = default;
  AsyncReply(std::shared_ptr<AsyncReplyChannel> channel, uint64_t connection_id, Op op,
             uint64_t request_id)
      : channel_(std::move(channel)), connection_id_(connection_id), op_(op),
        request_id_(request_id) {}
  // An OK response whose payload is `payload`, or an error response with its code and message.
  // The payload must be valid for the op (fabric/wire.h), or the client drops the connection.
  void Send(Result<std::vector<uint8_t>> payload) const;

 private:
  std::shared_ptr<AsyncReplyChannel> channel_;
  uint64_t connection_id_ = 0;
  Op op_ = Op{kFirstServiceOp};
  uint64_t request_id_ = 0;
};

// Implemented by the memserver (and by tests). See the thread rules above. A non-OK Status or
// Result is sent back to the client as an error response carrying its code and message; the
// connection stays open.
class RequestHandler {
 public:
  virtual ~RequestHandler() = default;

  // After a successful AUTH / when an authenticated connection closes (for any reason).
  virtual void OnConnect(const PeerInfo& peer) { (void)peer; }
  virtual void OnDisconnect(const PeerInfo& peer) { (void)peer; }

  // Validate bounds and ownership and return exactly req.length bytes of slab memory. The engine
  // copies from (READ) / into (WRITE) the span before returning to its loop, so the memory must
  // stay mapped at least until then; keeping it mapped while another thread frees the slab is
  // the handler's job (e.g. a pool mapped for the life of the daemon).
  virtual Result<std::span<uint8_t>> ResolveRead(const PeerInfo& peer, const ReadRequest& req) = 0;
  virtual Result<std::span<uint8_t>> ResolveWrite(const PeerInfo& peer,
                                                  const WriteRequest& req) = 0;

  virtual Result<AllocSlabResponse> AllocSlab(const PeerInfo& peer,
                                              const AllocSlabRequest& req) = 0;
  virtual Status FreeSlab(const PeerInfo& peer, const FreeSlabRequest& req) = 0;
  // "key value" lines.
  virtual Result<std::string> Stats(const PeerInfo& peer) = 0;
  virtual Result<HeartbeatResponse> Heartbeat(const PeerInfo& peer) = 0;
  virtual Result<std::vector<uint8_t>> Invoke(const PeerInfo& peer, uint32_t function_id,
                                              std::span<const uint8_t> args) {
    (void)peer;
    (void)args;
    return Unsupported("no offload function ", function_id, " on this server");
  }
  virtual Status Fault(const PeerInfo& peer, const FaultRequest& req) {
    (void)peer;
    (void)req;
    return Unsupported("fault injection is not enabled on this server");
  }

  // Consulted for every authenticated request before it runs (not for GOODBYE). A READV/WRITEV
  // is one request: it is consulted once, with Op::kRead / Op::kWrite. RDMA one-sided
  // READ/WRITE from verbs clients never reach the server's CPU and so are never consulted:
  // policies here do not delay, hang or drop them (fabric/transport.h, "Fault injection").
  virtual OpPolicy BeforeOp(const PeerInfo& peer, Op op) {
    (void)peer;
    (void)op;
    return OpPolicy::Proceed();
  }
};

// A service the server hosts: the handler of a range of service ops (fabric/wire.h), registered
// with Server::RegisterService before Start(), in the manner of eRPC's request-type registry.
// The engine authenticates the connection, consults RequestHandler::BeforeOp (fault injection
// applies to service ops too) and checks only that the payload fits in kMaxPayloadLength; the
// service defines and validates the payload's layout. A non-OK answer goes back as an error
// response carrying its code and message; the connection stays open.
// Threads: HandleRequest runs on the I/O threads, concurrently when io_threads > 1.
class ServiceHandler {
 public:
  virtual ~ServiceHandler() = default;
  // One request of a registered op; `payload` is valid only during the call. Either answer now,
  // on the I/O thread (return the response payload or an error), or return std::nullopt and
  // answer later with reply.Send() (exactly once, from any thread). Long work must go the
  // second way: a slow handler stalls every connection of its I/O thread.
  virtual std::optional<Result<std::vector<uint8_t>>> HandleRequest(const PeerInfo& peer, Op op,
                                                                    std::span<const uint8_t> payload,
                                                                    AsyncReply reply) = 0;
};

struct ServerOptions {
  std::string host = "127.0.0.1";  // Address to listen on ("0.0.0.0", "::", a name).
  uint16_t port = 0;               // 0: an ephemeral port (see Server::port()).
  int io_threads = 1;              // 1..64.
  // SO_REUSEPORT on the listening socket even with one I/O thread, so that a replacement
  // process of the same user can bind the port before this one has exited (a restart with no
  // window in which another socket can take the port). Off by default: a second server started
  // on a busy port by mistake should fail, not share the port's connections.
  bool reuse_port = false;
  std::string secret;              // Cluster secret (fabric/auth.h LoadAuthSecret); non-empty.
  uint64_t server_id = 0;          // 0: random.
  uint64_t slab_size = 0;          // Advertised in AUTH_OK.
  uint64_t capacity_bytes = 0;     // Advertised in AUTH_OK.
  // Connections open at once (authenticated or not), per server; further connections are
  // closed at once.
  uint32_t max_connections = 4096;
  // Authenticated connections one client id (one credential, all its processes) may hold at
  // once; AUTH beyond it is refused with ResourceExhausted naming the limit. 0: no limit.
  uint32_t max_connections_per_client = 256;
  uint32_t ring_entries = 1024;    // io_uring SQ size per I/O thread.
  // Milliseconds a client may take from connect to a successful AUTH before it is closed.
  uint32_t handshake_timeout_ms = 10000;
  // Reply back-pressure: once a connection's replies not yet taken by the peer reach this many
  // bytes, the server stops reading (and executing) that connection's requests until they
  // drain below it. A connection then holds at most its receive window (one frame, <= 4 MiB +
  // header) plus this plus one reply. 64 KiB..1 GiB.
  uint64_t max_queued_reply_bytes = 16ull << 20;
  // Verbs: when true and an RDMA device exists, an rdma_cm listener on rdma_port (0: ephemeral)
  // accepts RC QPs from authenticated clients and AUTH_OK offers RDMA. Without a device this
  // logs why and the server runs TCP only (it is not an error).
  bool enable_rdma = false;
  uint16_t rdma_port = 0;
};

// Result of Server::RegisterMemory.
struct MemoryRegistration {
  uint64_t base_addr = 0;  // Address of the region (what remote_addr values are relative to).
  uint32_t rkey = 0;       // Verbs remote key; 0 when no verbs listener runs.
  bool rdma = false;       // Registered with a verbs PD.
};

class Server {
 public:
  // Validates options, binds the listening socket(s) (so port() is known) and prepares the
  // rings. Does not start threads. `handler` must outlive the Server.
  static Result<std::unique_ptr<Server>> Create(ServerOptions options, RequestHandler* handler);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Starts the I/O threads (and the verbs listener when enabled). Once it returns OK the server
  // accepts connections. Call once.
  Status Start();

  // Graceful stop: stop accepting, send a kShuttingDown NOTICE to every authenticated client,
  // give queued replies up to `grace` to drain, close every connection (OnDisconnect for each
  // authenticated one) and join the threads. Idempotent; thread-safe.
  void Stop(Deadline grace = Deadline::AfterMs(1000));

  // Queues a NOTICE for every authenticated connection whose client id or owner id
  // (PeerInfo::owner_id: one process's slabs) is `client_id`, or for all of them when it is
  // nullopt. Thread-safe, non-blocking (an eventfd wakes the I/O threads). Returns
  // Unavailable after Stop(). Notices to clients that are not connected are dropped.
  Status Notify(std::optional<uint64_t> client_id, const Notice& notice);

  // Closes every connection whose client id or owner id is `client_id` (fault injection,
  // eviction of a misbehaving client).
  // Thread-safe, asynchronous.
  Status Disconnect(uint64_t client_id);

  // Registers memory the handler hands out (the slab pool). With a verbs listener the region is
  // registered as an MR for remote READ/WRITE and the rkey returned; otherwise it is recorded
  // and rkey is 0. Call before Start(); the memory must outlive the Server.
  Result<MemoryRegistration> RegisterMemory(void* addr, size_t length);

  // Hands every request of the ops first_op..last_op to `handler` (which must outlive the
  // Server); `name` names the service in errors and logs. Call before Start(). InvalidArgument
  // for an empty name or a range outside kFirstServiceOp..kLastServiceOp, AlreadyExists (naming
  // the service) when another service took an op of the range, InvalidArgument after Start().
  // A request of a service op that no service registered gets an Unsupported error response
  // naming the op; the connection stays open.
  Status RegisterService(std::string name, uint16_t first_op, uint16_t last_op,
                         ServiceHandler* handler);

  const std::string& host() const;
  uint16_t port() const;
  bool rdma_enabled() const;  // A verbs listener is running (after Start()).
  uint16_t rdma_port() const;
  uint64_t server_id() const;
  // Connections currently open (authenticated or not). Thread-safe.
  uint32_t connection_count() const;
  // Times a connection stopped being read because its unsent replies reached
  // max_queued_reply_bytes (since start). Thread-safe.
  uint64_t reply_backpressure_pauses() const;

  class Impl;

 private:
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera::fabric
