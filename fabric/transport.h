// fabric::Transport: the data path of the client side of the memory fabric. One-sided READ and
// WRITE of remote slabs, posted in batches and completed by polling; nothing in it blocks except
// Connect/Disconnect and Wait. The control calls (allocate and free slabs, stats, heartbeats,
// offload invocations, fault injection) are not here: they are fabric::ControlClient's
// (fabric/control_client.h), a concrete blocking client with its own connection.
//
// Two implementations share this interface and one conformance test suite
// (tests/fabric/conformance_test.cc):
//   - TCP on io_uring: frames (fabric/wire.h) over one TCP connection per server, many requests
//     in flight per connection, one io_uring_submit per Post() batch, completions reaped by
//     Poll() of the owning thread.
//   - RDMA verbs (libibverbs + librdmacm): one RC QP per server, connected with rdma_cm to the
//     server's verbs listener, RDMA READ/WRITE straight into registered slabs (the server CPU
//     is not involved). Each connection also keeps an authenticated TCP login (a ControlClient)
//     to the server: it binds the QP to the login and carries the server's notices.
// Create({kind = kAuto}) picks verbs when a usable RDMA device exists and TCP otherwise.
//
// Fault injection: the server's fault hooks (RequestHandler::BeforeOp, fabric/server.h: delay,
// hang, drop) see every request that reaches the server's CPU: all TCP data ops and every
// control call. RDMA one-sided READ/WRITE never reach it, so they BYPASS those hooks: injected
// delays, hangs and drops do not affect the verbs transport's data path (only its control calls
// and the loss of its login connection). Test data-path fault handling over TCP; `tessera fault`
// says so when its target offers RDMA. Faults that act on the memory itself (bit flips,
// evictions) and crashes affect both.
//
// Slabs: ops name a remote slab by id. Tell the transport about every slab before naming it
// (AddSlab with the ControlClient's AllocSlab reply for the same server and client_id); the
// verbs transport needs its address and key, and refuses ops on other slabs.
//
// Threads: a Transport belongs to ONE thread; none of its methods may be called concurrently.
// Create one Transport per thread. It may be created on another thread, but the thread that
// first calls Connect() must be the one that uses it from then on, destructor included (the TCP
// transport's io_uring accepts submissions from that thread only). Post() and Poll() never
// block.
//
// Ownership: local buffers named in WorkRequests belong to the caller and must stay valid (and
// unmodified for a WRITE) until the op's completion is returned by Poll(). For the verbs
// transport they must lie inside memory passed to RegisterMemory(); the TCP transport accepts
// any buffer. Destroying a Transport closes its connections; ops still in flight are abandoned
// (their buffers are no longer touched once the destructor returns).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "fabric/wire.h"

namespace tessera::fabric {

enum class TransportKind : uint8_t { kAuto, kTcp, kRdma };
std::string_view TransportKindName(TransportKind kind);  // "auto", "tcp", "rdma"
Result<TransportKind> ParseTransportKind(std::string_view name);

// Why RDMA is or is not usable on this machine, e.g. "no RDMA device: ibv_get_device_list
// returned 0 devices". OK when a device is present and opens.
Status ProbeRdma();

struct TransportOptions {
  TransportKind kind = TransportKind::kAuto;
  // Most data ops in flight at once over all connections of this Transport; Post() returns
  // ResourceExhausted beyond it. 1..65536.
  uint32_t max_inflight = 1024;
  uint32_t ring_entries = 256;  // io_uring SQ entries (TCP).
  // Verbs: signal every Nth send WR (selective signalling); 1..64.
  uint32_t signal_interval = 16;
  // TCP: ops of one Post() batch bound for the same connection and of the same kind travel as
  // one vectored request (READV/WRITEV, up to kMaxVectorRanges ranges), completed together;
  // each op still gets its own completion. A batch op that is alone for its connection is a
  // plain READ/WRITE. (Verbs posts the whole batch as one WR chain either way.)
  bool coalesce = true;
};

struct Endpoint {
  std::string host;
  uint16_t port = 0;
  std::string ToString() const;  // "host:port" ("[v6]:port")
};
// Parses "host:port" or "[v6addr]:port"; port 1..65535.
Result<Endpoint> ParseEndpoint(std::string_view text);

// This process's instance id (fabric/auth.h, "Slab ownership"): drawn from getrandom on the
// first call, non-zero, then the same for the life of the process (every connection, every
// thread). Thread-safe.
uint64_t ProcessInstanceId();

struct ConnectOptions {
  std::string secret;      // Shared secret; must match the server's.
  uint64_t client_id = 0;  // Non-zero; the credential's id (fabric/credential.h).
  // Sent in HELLO; with client_id it makes the owner id of the slabs this connection allocates
  // (fabric/auth.h OwnerIdFor): by default one per process, so the connections of one process
  // share their slabs and another process with the same credential does not. 0: none (the
  // owner id is client_id).
  uint64_t instance_id = ProcessInstanceId();
  Deadline deadline = Deadline::AfterMs(5000);  // Bounds TCP connect + handshake (+ QP setup).
};

// Handle of one connection inside one Transport (index; not meaningful across Transports).
using ConnectionId = uint32_t;

// What the server told us at AUTH_OK.
struct ServerInfo {
  uint64_t server_id = 0;
  uint64_t slab_size = 0;
  uint64_t capacity_bytes = 0;
  bool rdma = false;  // This connection moves data with RDMA.
  Endpoint endpoint;
};

enum class OpKind : uint8_t { kRead, kWrite };

// One one-sided op. READ copies `length` bytes at slab `slab_id` + `remote_offset` into
// `local`; WRITE copies `local` there.
struct WorkRequest {
  ConnectionId connection = 0;
  OpKind op = OpKind::kRead;
  uint64_t slab_id = 0;
  uint64_t remote_offset = 0;
  uint32_t length = 0;  // 1 .. kMaxDataLength.
  void* local = nullptr;
  uint64_t cookie = 0;  // Returned in the completion.
};

enum class CompletionKind : uint8_t {
  kData,    // A WorkRequest finished: cookie and status are set.
  kNotice,  // A server NOTICE: connection and notice are set.
};

struct Completion {
  CompletionKind kind = CompletionKind::kData;
  uint64_t cookie = 0;
  Status status;  // Of the op: OK, the server's error, Unavailable (connection lost), ...
  ConnectionId connection = 0;
  Notice notice;
};

class Transport {
 public:
  // kAuto: verbs when ProbeRdma() is OK, else TCP. kRdma without a device: Unsupported with the
  // probe's reason.
  static Result<std::unique_ptr<Transport>> Create(const TransportOptions& options);
  virtual ~Transport() = default;

  virtual TransportKind kind() const = 0;

  // Connects and authenticates (both ways) with a deadline. PermissionDenied when the server
  // rejects our MAC or its MAC is wrong; Timeout / Unavailable for network failures.
  virtual Result<ConnectionId> Connect(const Endpoint& endpoint, const ConnectOptions& options) = 0;
  // Sends GOODBYE and closes; in-flight ops of that connection complete with Cancelled.
  virtual Status Disconnect(ConnectionId connection) = 0;
  // Closes at once, without the GOODBYE exchange Disconnect() waits for (a peer declared dead,
  // e.g. a stopped process, may never answer); in-flight ops complete with Cancelled.
  virtual Status Abort(ConnectionId connection) = 0;
  virtual Result<ServerInfo> Info(ConnectionId connection) const = 0;
  // False once the connection failed or was closed.
  virtual bool Connected(ConnectionId connection) const = 0;

  // Registers local memory for data ops (required by verbs, recorded by TCP).
  virtual Status RegisterMemory(void* addr, size_t length) = 0;

  // Posts a batch, all or nothing: InvalidArgument for a malformed request (nothing posted),
  // ResourceExhausted when the batch does not fit in the free in-flight slots, Unavailable when
  // a named connection is down. Never blocks.
  virtual Status Post(std::span<const WorkRequest> batch) = 0;
  // Reaps finished ops and notices into `out`; returns how many. Never blocks.
  virtual size_t Poll(std::span<Completion> out) = 0;
  // Like Poll() but waits (without spinning) until at least one completion or the deadline;
  // returns 0 at the deadline.
  virtual size_t Wait(std::span<Completion> out, Deadline deadline) = 0;
  // Data ops posted and not yet returned by Poll()/Wait().
  virtual uint32_t inflight() const = 0;
  // Makes Wait() also return (possibly with 0 completions) soon after `fd` becomes readable, so
  // another thread can wake the owner sleeping in Wait() (e.g. by writing an eventfd). The
  // caller owns the fd, keeps it open while it is watched and clears its readiness itself
  // (read the eventfd); -1 stops watching. Owning thread only.
  virtual Status SetWakeFd(int fd) = 0;

  // Remote slabs (see the file comment): `slab` is AllocSlab's reply from a ControlClient to
  // this connection's server with the same client_id. InvalidArgument for an unknown connection
  // or slab id 0; the verbs transport: Unsupported when the slab has no rkey (the server's
  // memory is not registered for RDMA). RemoveSlab (after FreeSlab) forgets it; unknown ids
  // are ignored.
  virtual Status AddSlab(ConnectionId connection, const AllocSlabResponse& slab) = 0;
  virtual void RemoveSlab(ConnectionId connection, uint64_t slab_id) = 0;
};

// The TCP transport. Exposed for tests and for callers that want TCP explicitly.
Result<std::unique_ptr<Transport>> CreateTcpTransport(const TransportOptions& options);
// The verbs transport; Unsupported (with the reason) when no usable device exists.
Result<std::unique_ptr<Transport>> CreateRdmaTransport(const TransportOptions& options);

}  // namespace tessera::fabric
