// Internal to the NBD export: one client connection in the transmission phase (nbdkit's
// server/connections.c + protocol.c), the request state it carries, and the state every
// connection of one NbdServer shares (store, options, page locks, counters).
//
// A connection has a reader thread (Run: the handshake, then request headers and write
// payloads; it starts READs itself, reading them directly with its ThreadReader when the store
// offers one) and a completion thread (read-modify-write
// steps, TRIM/FLUSH, errors and retries, see kernel_shim/nbd/nbd_server.h); replies go out
// through its ReplySender. Requests that change data hold page locks (PageLockTable).
//
// Ownership: NbdServer::ServeConnection creates a Connection and deletes it when Run returns;
// a Request is owned by its connection from ReadRequests until Retire. Threads: as above;
// Post() from any thread.
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "client/page_store.h"
#include "common/fd.h"
#include "kernel_shim/nbd/nbd_server.h"
#include "kernel_shim/nbd/page_lock_table.h"
#include "kernel_shim/nbd/protocol.h"
#include "kernel_shim/nbd/reply_sender.h"
#include "kernel_shim/nbd/socket_io.h"

namespace tessera::nbd {

using client::kPageSize;
using client::PageId;
using client::PageOp;

struct NbdServer::Shared {
  client::PageStore* store = nullptr;
  const NbdServerOptions* options = nullptr;
  PageLockTable locks;

  std::mutex conns_mu;
  std::condition_variable conns_cv;
  std::set<Connection*> conns;
  size_t live = 0;  // Connections whose threads have not finished.
  bool closing = false;

  std::atomic<uint64_t> connections{0}, requests{0}, errors_replied{0}, bytes_read{0},
      bytes_written{0}, rmw_pages{0}, trimmed_pages{0}, retried_ops{0};
};

struct Request {
  NbdServer::Connection* conn = nullptr;
  RequestHeader h;
  const ExportSpec* exp = nullptr;
  uint32_t error = 0;
  std::string error_message;

  // READ: the pages read; WRITE: the payload.
  std::unique_ptr<uint8_t[]> data;
  size_t data_bytes = 0;  // Accounted against max_inflight_bytes.

  // Store pages [first, last] touched (valid when length > 0).
  PageId first = 0, last = 0;
  std::vector<PageOp> ops;
  std::atomic<uint32_t> pending{0};
  enum class Phase : uint8_t { kLocking, kEdgeRead, kWrite, kDone } phase = Phase::kLocking;
  PageId next_lock = 0;
  bool locking = false;  // Holds locks [first, next_lock).
  // Read-modify-write buffers for the partial first / last page.
  std::unique_ptr<uint8_t[]> edge[2];
  PageId edge_page[2] = {0, 0};
  int edges = 0;
  int retries = 0;  // Rounds of resubmitting ops that failed with Unavailable.

  bool partial(PageId p) const {
    const uint64_t base = (p - exp->first_page) * kPageSize;
    return h.offset > base || h.offset + h.length < base + kPageSize;
  }
};

struct NbdServer::Connection {
  enum class EventKind : uint8_t { kStart, kOpsDone, kGrant, kReply, kFlush };
  struct Event {
    EventKind kind;
    Request* req;
  };

  Shared* shared;
  UniqueFd fd;
  BufferedReader in;  // The reader thread's requests (after the handshake).
  bool structured = false;
  uint16_t trans_flags = 0;
  const ExportSpec* exp = nullptr;
  std::string peer;

  std::mutex mu;
  std::condition_variable cv;        // Events for the completion thread.
  std::condition_variable space_cv;  // Room for the reader.
  std::vector<Event> events;
  uint32_t inflight = 0;
  uint64_t inflight_bytes = 0;
  bool reader_done = false;

  // Replies (kernel_shim/nbd/reply_sender.h). The reader also waits while its outbox holds more
  // than max_inflight_bytes, so a client that sends requests but never reads replies cannot
  // grow the outbox without bound.
  ReplySender sender;
  std::thread completer;

  Connection(Shared* s, UniqueFd f)
      : shared(s), fd(std::move(f)), in(fd.get()), sender(fd.get(), [this] {
          std::lock_guard<std::mutex> lk(mu);  // So the reader cannot miss the wake-up.
          space_cv.notify_one();
        }) {}

  void Post(EventKind kind, Request* r) {
    std::lock_guard<std::mutex> lk(mu);
    events.push_back({kind, r});
    cv.notify_one();
  }

  // --- reader thread ---
  // Reads READs' pages on this thread (NbdServerOptions::direct_reads); null: Submit() them.
  // Created, used and destroyed by the reader thread only.
  std::unique_ptr<client::ThreadReader> direct;
  uint64_t reply_avg_ns = 0;  // Recent direct replies' wait (AwaitRequest's polling window).
  void Run();  // Handshake (kernel_shim/nbd/handshake.h), then requests until the end.
  void ReadRequests();
  void StartRead(Request* r);
  // Direct reads in flight: posts the queued ones and completes them (answering their READs)
  // until the next request is waiting (buffered or on the socket) or none is left in flight.
  void AwaitRequest();
  // Waits for room for a request of `bytes` payload bytes (back-pressure), completing direct
  // reads meanwhile. Returns with `lk` held.
  void WaitForRoom(std::unique_lock<std::mutex>& lk, size_t bytes);

  // --- completion thread ---
  void Complete();
  void Handle(const Event& e, std::vector<Request*>* finished);
  void ContinueLocking(Request* r, std::vector<Request*>* finished);
  void Execute(Request* r, std::vector<Request*>* finished);
  void WritePhase(Request* r, std::vector<Request*>* finished);
  void ReleaseLocks(Request* r);
  void FinishChange(Request* r, std::vector<Request*>* finished);
  void SendReplies(std::vector<Request*>& finished);
  // Appends r's reply (header kept alive in *headers, which must not reallocate) to *iov.
  void AppendReply(Request* r, std::vector<std::string>* headers, std::vector<struct iovec>* iov);
  // Sends or queues the bytes (see ReplySender); on_completer: drain the outbox here if this
  // call started a drain, else hand the drain to the completion thread.
  void SendOrQueue(struct iovec* iov, size_t count, bool on_completer);
  // Deletes finished requests and returns their room to the reader.
  void Retire(Request* const* rs, size_t count);
  // Store-thread fast path: answers r if it is a READ or plain WRITE whose ops all succeeded.
  bool TryFinishFast(Request* r);
};

}  // namespace tessera::nbd
