#include "kernel_shim/nbd/nbd_server.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <set>
#include <unordered_map>

#include "common/logging.h"
#include "kernel_shim/nbd/protocol.h"

namespace tessera::nbd {

using client::kPageSize;
using client::PageId;
using client::PageOp;

namespace {

// NBD error value for a store failure.
uint32_t ErrnoOf(const Status& st) {
  switch (st.code()) {
    case StatusCode::kOk: return 0;
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange: return kEInval;
    case StatusCode::kResourceExhausted: return kENoSpc;
    case StatusCode::kUnsupported: return kENotSup;
    default: return kEIo;
  }
}

// Reads exactly n bytes; false on EOF, error or timeout (SO_RCVTIMEO).
bool ReadFull(int fd, void* buf, size_t n) {
  auto* p = static_cast<uint8_t*>(buf);
  while (n > 0) {
    ssize_t got = ::recv(fd, p, n, 0);
    if (got > 0) {
      p += got;
      n -= static_cast<size_t>(got);
      continue;
    }
    if (got < 0 && errno == EINTR) continue;
    return false;
  }
  return true;
}

// Writes every iovec; false once the peer is gone.
bool WriteIov(int fd, struct iovec* iov, size_t count) {
  while (count > 0) {
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = std::min<size_t>(count, IOV_MAX);
    ssize_t sent = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (sent < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    size_t left = static_cast<size_t>(sent);
    while (count > 0 && left >= iov->iov_len) {
      left -= iov->iov_len;
      ++iov;
      --count;
    }
    if (count > 0 && left > 0) {
      iov->iov_base = static_cast<uint8_t*>(iov->iov_base) + left;
      iov->iov_len -= left;
    }
  }
  return true;
}

bool WriteString(int fd, const std::string& s) {
  struct iovec iov = {const_cast<char*>(s.data()), s.size()};
  return WriteIov(fd, &iov, 1);
}


}  // namespace

struct Request;

// Asynchronous per-page locks shared by every connection: a request that changes data holds
// the lock of each page it touches from before its first store op until after its last.
class PageLockTable {
 public:
  // True: granted now. False: queued; the grant arrives later as an event on r's connection.
  bool Acquire(PageId page, Request* r) {
    std::lock_guard<std::mutex> lk(mu_);
    auto [it, inserted] = held_.try_emplace(page);
    if (inserted) return true;
    it->second.push_back(r);
    return false;
  }
  // Releases `page`; returns the waiter that now holds it (nullptr: none).
  Request* Release(PageId page) {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = held_.find(page);
    TCHECK(it != held_.end());
    if (it->second.empty()) {
      held_.erase(it);
      return nullptr;
    }
    Request* next = it->second.front();
    it->second.pop_front();
    return next;
  }

 private:
  std::mutex mu_;
  std::unordered_map<PageId, std::deque<Request*>> held_;
};

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

  // Sending. Replies are written by whichever thread finishes a request: a store thread for a
  // READ or a plain WRITE that completed without error (no thread hop on the fast path), else
  // the completion thread. A sender tries a non-blocking sendmsg of its whole reply; what does
  // not fit goes to `outbox`, which only the completion thread drains, with blocking sends and
  // without holding send_mu, while `flushing` keeps every other sender appending to the outbox.
  // So replies never interleave and a slow client never blocks a store thread.
  std::mutex send_mu;
  std::deque<std::string> outbox;  // Guarded by send_mu; non-empty implies flushing.
  bool flushing = false;           // Guarded by send_mu.
  bool send_failed = false;        // Guarded by send_mu.
  // Bytes in the outbox: the reader also waits while this exceeds max_inflight_bytes, so a
  // client that sends requests but never reads replies cannot grow the outbox without bound.
  std::atomic<uint64_t> outbox_bytes{0};
  std::thread completer;

  Connection(Shared* s, UniqueFd f) : shared(s), fd(std::move(f)) {}

  void Post(EventKind kind, Request* r) {
    std::lock_guard<std::mutex> lk(mu);
    events.push_back({kind, r});
    cv.notify_one();
  }

  // --- reader thread ---
  void Run();
  bool Handshake();
  bool SendOptionReply(uint32_t option, uint32_t type, std::string_view data) {
    return WriteString(fd.get(), EncodeOptionReply(option, type, data));
  }
  const ExportSpec* FindExport(const std::string& name) const;
  void ReadRequests();
  void StartRead(Request* r);

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
  // Sends or queues the bytes (see send_mu); on_completer: drain the outbox here if needed.
  void SendOrQueue(struct iovec* iov, size_t count, bool on_completer);
  void DrainOutbox();
  // Deletes finished requests and returns their room to the reader.
  void Retire(Request* const* rs, size_t count);
  // Store-thread fast path: answers r if it is a READ or plain WRITE whose ops all succeeded.
  bool TryFinishFast(Request* r);
};

namespace {

// Store failures are logged (the client only sees an errno): the first 10, then every 1000th.
void LogStoreError(const Request* r, const Status& st) {
  static std::atomic<uint64_t> count{0};
  const uint64_t n = count.fetch_add(1, std::memory_order_relaxed);
  if (n < 10 || n % 1000 == 0) {
    TLOG(WARNING) << "nbd: " << CommandName(r->h.type) << " at " << r->h.offset << " length "
                  << r->h.length << " failed in the page store (" << n + 1
                  << " failures so far): " << st;
  }
}

void OnOpDone(PageOp* op) {
  auto* r = static_cast<Request*>(op->user);
  if (r->pending.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    if (r->conn->TryFinishFast(r)) return;
    r->conn->Post(NbdServer::Connection::EventKind::kOpsDone, r);
  }
}

// Submits r->ops (all of them, already filled). False if the store refused the batch (then
// r->error is set and no callback will come).
bool SubmitOps(client::PageStore* store, Request* r) {
  std::vector<PageOp*> ptrs(r->ops.size());
  for (size_t i = 0; i < r->ops.size(); ++i) {
    r->ops[i].done = &OnOpDone;
    r->ops[i].user = r;
    ptrs[i] = &r->ops[i];
  }
  r->pending.store(static_cast<uint32_t>(r->ops.size()), std::memory_order_release);
  r->retries = 0;
  Status st = store->Submit(ptrs);
  if (!st.ok()) {
    LogStoreError(r, st);
    r->error = ErrnoOf(st) == kEInval ? kEIo : ErrnoOf(st);
    r->error_message = st.ToString();
    return false;
  }
  return true;
}

// Unavailable means a server went away under the op (e.g. a slab allocated on a server that
// died before the store declared it failed); the store places the next attempt elsewhere.
// Resubmits just the ops that failed that way, at most kMaxRetries rounds per request phase.
// True if a resubmission is under way.
constexpr int kMaxRetries = 4;
bool RetryUnavailable(client::PageStore* store, Request* r) {
  if (r->retries >= kMaxRetries) return false;
  std::vector<PageOp*> again;
  for (PageOp& op : r->ops) {
    if (op.status.ok()) continue;
    if (op.status.code() != StatusCode::kUnavailable && op.status.code() != StatusCode::kTimeout) {
      return false;  // A real failure (DataLoss, OutOfRange): report it.
    }
    again.push_back(&op);
  }
  r->retries++;
  r->conn->shared->retried_ops.fetch_add(again.size(), std::memory_order_relaxed);
  for (PageOp* op : again) op->status = Status::Ok();
  r->pending.store(static_cast<uint32_t>(again.size()), std::memory_order_release);
  if (!store->Submit(again).ok()) {
    for (PageOp* op : again) op->status = Unavailable("page store refused the retry");
    return false;
  }
  return true;
}

// The first failed op's status, or OK.
Status FirstError(const Request* r) {
  for (const PageOp& op : r->ops) {
    if (!op.status.ok()) return op.status;
  }
  return Status::Ok();
}

}  // namespace

const ExportSpec* NbdServer::Connection::FindExport(const std::string& name) const {
  const auto& exports = shared->options->exports;
  for (const ExportSpec& e : exports) {
    if (e.name == name) return &e;
  }
  if (name.empty()) return &exports.front();  // The default export.
  return nullptr;
}

void NbdServer::Connection::Run() {
  if (Handshake()) {
    completer = std::thread([this] { Complete(); });
    ReadRequests();
    {
      std::lock_guard<std::mutex> lk(mu);
      reader_done = true;
      cv.notify_one();
    }
    completer.join();
  }
}

bool NbdServer::Connection::Handshake() {
  const int f = fd.get();
  const uint32_t timeout_ms = shared->options->handshake_timeout_ms;
  struct timeval tv = {static_cast<time_t>(timeout_ms / 1000),
                       static_cast<suseconds_t>((timeout_ms % 1000) * 1000)};
  ::setsockopt(f, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);

  if (!WriteString(f, EncodeGreeting(kFlagFixedNewstyle | kFlagNoZeroes))) return false;
  uint8_t b[16];
  if (!ReadFull(f, b, 4)) return false;
  const uint32_t client_flags = GetU32(b);
  if ((client_flags & ~(kClientFlagFixedNewstyle | kClientFlagNoZeroes)) != 0) {
    TLOG(WARNING) << "nbd " << peer << ": unknown client flags " << client_flags << "; closing";
    return false;
  }
  const bool no_zeroes = (client_flags & kClientFlagNoZeroes) != 0;

  for (;;) {
    if (!ReadFull(f, b, 16)) return false;
    if (GetU64(b) != kIHaveOpt) {
      TLOG(WARNING) << "nbd " << peer << ": bad option magic; closing";
      return false;
    }
    const uint32_t option = GetU32(b + 8);
    const uint32_t len = GetU32(b + 12);
    if (len > 65536) {
      TLOG(WARNING) << "nbd " << peer << ": " << OptionName(option) << " with " << len
                    << " bytes of data is too long; closing";
      return false;
    }
    std::string data(len, '\0');
    if (len > 0 && !ReadFull(f, data.data(), len)) return false;

    trans_flags = kTransHasFlags | kTransSendFlush | kTransSendFua | kTransSendTrim |
                  kTransSendWriteZeroes | kTransCanMultiConn | (structured ? kTransSendDf : 0);
    switch (option) {
      case kOptExportName: {
        exp = FindExport(data);
        if (exp == nullptr) {
          TLOG(WARNING) << "nbd " << peer << ": NBD_OPT_EXPORT_NAME of unknown export \""
                        << data << "\"; closing";
          return false;
        }
        std::string reply;
        PutU64(&reply, exp->size_bytes);
        PutU16(&reply, trans_flags);
        if (!no_zeroes) reply.append(124, '\0');
        if (!WriteString(f, reply)) return false;
        break;
      }
      case kOptAbort:
        SendOptionReply(option, kRepAck, "");
        return false;
      case kOptList: {
        if (len != 0) {
          if (!SendOptionReply(option, kRepErrInvalid, "NBD_OPT_LIST takes no data")) return false;
          continue;
        }
        for (const ExportSpec& e : shared->options->exports) {
          if (!SendOptionReply(option, kRepServer, EncodeServerReplyData(e.name, e.description))) {
            return false;
          }
        }
        if (!SendOptionReply(option, kRepAck, "")) return false;
        continue;
      }
      case kOptStructuredReply:
        if (len != 0) {
          if (!SendOptionReply(option, kRepErrInvalid, "NBD_OPT_STRUCTURED_REPLY takes no data")) {
            return false;
          }
          continue;
        }
        structured = true;
        if (!SendOptionReply(option, kRepAck, "")) return false;
        continue;
      case kOptInfo:
      case kOptGo: {
        auto req = DecodeInfoRequest(data);
        if (!req.ok()) {
          if (!SendOptionReply(option, kRepErrInvalid, req.status().message())) return false;
          continue;
        }
        const ExportSpec* e = FindExport(req->name);
        if (e == nullptr) {
          if (!SendOptionReply(option, kRepErrUnknown, "no export named \"" + req->name + "\"")) {
            return false;
          }
          continue;
        }
        bool ok = SendOptionReply(option, kRepInfo, EncodeInfoExport(e->size_bytes, trans_flags)) &&
                  SendOptionReply(option, kRepInfo, EncodeInfoName(e->name)) &&
                  (e->description.empty() ||
                   SendOptionReply(option, kRepInfo, EncodeInfoDescription(e->description))) &&
                  SendOptionReply(option, kRepInfo,
                                  EncodeInfoBlockSize(1, kPageSize, shared->options->max_payload)) &&
                  SendOptionReply(option, kRepAck, "");
        if (!ok) return false;
        if (option == kOptInfo) continue;
        exp = e;
        break;
      }
      default:
        if (!SendOptionReply(option, kRepErrUnsup, OptionName(option) + " is not supported")) {
          return false;
        }
        continue;
    }
    break;  // Transmission phase.
  }
  struct timeval none = {0, 0};
  ::setsockopt(f, SOL_SOCKET, SO_RCVTIMEO, &none, sizeof none);
  // A client that stops reading replies for this long is dropped (a blocked send fails), so
  // Shutdown() and the connection's threads never wait on it forever.
  struct timeval send_bound = {static_cast<time_t>(shared->options->send_timeout_ms / 1000),
                               static_cast<suseconds_t>((shared->options->send_timeout_ms % 1000) * 1000)};
  ::setsockopt(f, SOL_SOCKET, SO_SNDTIMEO, &send_bound, sizeof send_bound);
  return true;
}

void NbdServer::Connection::ReadRequests() {
  const int f = fd.get();
  const NbdServerOptions& opt = *shared->options;
  uint8_t hb[kRequestHeaderSize];
  for (;;) {
    if (!ReadFull(f, hb, sizeof hb)) return;  // EOF or the client vanished.
    auto hdr = DecodeRequestHeader(hb);
    if (!hdr.ok()) {
      TLOG(WARNING) << "nbd " << peer << ": " << hdr.status().message() << "; closing";
      return;
    }
    const RequestHeader& h = *hdr;
    if (h.type == kCmdDisc) return;
    if (h.type == kCmdWrite && h.length > opt.max_payload) {
      TLOG(WARNING) << "nbd " << peer << ": WRITE of " << h.length << " bytes exceeds the "
                    << opt.max_payload << "-byte maximum; closing (the payload cannot be skipped "
                    << "safely)";
      return;
    }

    auto* r = new Request;
    r->conn = this;
    r->h = h;
    r->exp = exp;
    shared->requests.fetch_add(1, std::memory_order_relaxed);
    const bool sized = h.type == kCmdRead || h.type == kCmdWrite;
    if (sized && h.length <= opt.max_payload) {
      r->data_bytes = h.type == kCmdRead ? (static_cast<size_t>(h.length) / kPageSize + 2) * kPageSize
                                         : h.length;
    }
    // Back-pressure: wait for room before buffering this request's bytes.
    {
      std::unique_lock<std::mutex> lk(mu);
      space_cv.wait(lk, [&] {
        if (outbox_bytes.load(std::memory_order_relaxed) > opt.max_inflight_bytes) return false;
        return inflight == 0 || (inflight < opt.max_inflight_requests &&
                                 inflight_bytes + r->data_bytes <= opt.max_inflight_bytes);
      });
      inflight++;
      inflight_bytes += r->data_bytes;
    }
    if (h.type == kCmdWrite) {
      r->data.reset(new uint8_t[std::max<size_t>(h.length, 1)]);
      if (!ReadFull(f, r->data.get(), h.length)) {
        // The client vanished mid-payload: nothing of this request reaches the store.
        r->error = kEIo;
        r->error_message = "connection closed mid-payload";
        Post(EventKind::kReply, r);
        return;
      }
    }

    // Validation.
    uint16_t allowed = 0;
    bool known = true;
    switch (h.type) {
      case kCmdRead: allowed = structured ? kCmdFlagDf : 0; break;
      case kCmdWrite: allowed = kCmdFlagFua; break;
      case kCmdFlush: allowed = 0; break;
      case kCmdTrim: allowed = kCmdFlagFua; break;
      case kCmdWriteZeroes: allowed = kCmdFlagFua | kCmdFlagNoHole; break;
      default: known = false;
    }
    const uint64_t size = exp->size_bytes;
    const bool in_range = h.offset <= size && h.length <= size - h.offset;
    if (!known) {
      r->error = kEInval;
      r->error_message = CommandName(h.type) + " is not supported";
    } else if ((h.flags & ~allowed) != 0) {
      r->error = kEInval;
      r->error_message = "flags " + std::to_string(h.flags) + " not valid for " + CommandName(h.type);
    } else if (h.type == kCmdRead && h.length > opt.max_payload) {
      r->error = kEInval;
      r->error_message = "READ of " + std::to_string(h.length) + " bytes exceeds the maximum " +
                         std::to_string(opt.max_payload);
    } else if (h.type != kCmdFlush && !in_range) {
      r->error = (h.type == kCmdWrite || h.type == kCmdWriteZeroes) ? kENoSpc : kEInval;
      r->error_message = CommandName(h.type) + " at offset " + std::to_string(h.offset) + " length " +
                         std::to_string(h.length) + " is beyond the export's " +
                         std::to_string(size) + " bytes";
    }
    if (r->error != 0 || (h.type != kCmdFlush && h.length == 0)) {
      Post(EventKind::kReply, r);
      continue;
    }
    if (h.type != kCmdFlush) {
      r->first = exp->first_page + h.offset / kPageSize;
      r->last = exp->first_page + (h.offset + h.length - 1) / kPageSize;
    }
    if (h.type == kCmdRead) {
      StartRead(r);
    } else {
      Post(EventKind::kStart, r);
    }
  }
}

void NbdServer::Connection::StartRead(Request* r) {
  const size_t n = static_cast<size_t>(r->last - r->first + 1);
  r->data.reset(new uint8_t[n * kPageSize]);
  r->ops.resize(n);
  for (size_t i = 0; i < n; ++i) {
    r->ops[i].kind = PageOp::Kind::kRead;
    r->ops[i].page = r->first + i;
    r->ops[i].buf = r->data.get() + i * kPageSize;
  }
  r->phase = Request::Phase::kDone;
  if (!SubmitOps(shared->store, r)) Post(EventKind::kReply, r);
}

// --- completion thread ---

void NbdServer::Connection::Complete() {
  std::vector<Event> batch;
  std::vector<Request*> finished;
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(mu);
      cv.wait(lk, [&] { return !events.empty() || (reader_done && inflight == 0); });
      if (events.empty()) return;
      batch.swap(events);
    }
    for (const Event& e : batch) Handle(e, &finished);
    batch.clear();
    if (!finished.empty()) SendReplies(finished);
  }
}

void NbdServer::Connection::Handle(const Event& e, std::vector<Request*>* finished) {
  Request* r = e.req;
  switch (e.kind) {
    case EventKind::kReply:
      finished->push_back(r);
      return;
    case EventKind::kFlush:
      DrainOutbox();
      return;
    case EventKind::kStart:
      if (r->h.type == kCmdFlush) {
        Status st = shared->store->Flush();
        if (!st.ok()) {
          LogStoreError(r, st);
          r->error = kEIo;
          r->error_message = st.ToString();
        }
        finished->push_back(r);
        return;
      }
      r->phase = Request::Phase::kLocking;
      r->next_lock = r->first;
      r->locking = true;
      ContinueLocking(r, finished);
      return;
    case EventKind::kGrant:
      r->next_lock++;  // The page we waited for is ours now.
      ContinueLocking(r, finished);
      return;
    case EventKind::kOpsDone: {
      Status st = FirstError(r);
      if (!st.ok() && RetryUnavailable(shared->store, r)) return;  // Another kOpsDone follows.
      if (!st.ok()) LogStoreError(r, st);
      if (r->phase == Request::Phase::kDone) {  // A READ.
        if (!st.ok()) {
          r->error = ErrnoOf(st);
          r->error_message = st.ToString();
        }
        finished->push_back(r);
        return;
      }
      if (!st.ok()) {
        r->error = ErrnoOf(st);
        r->error_message = st.ToString();
        ReleaseLocks(r);
        finished->push_back(r);
        return;
      }
      if (r->phase == Request::Phase::kEdgeRead) {
        WritePhase(r, finished);
        return;
      }
      FinishChange(r, finished);  // Write phase done.
      return;
    }
  }
}

void NbdServer::Connection::ContinueLocking(Request* r, std::vector<Request*>* finished) {
  while (r->next_lock <= r->last) {
    if (!shared->locks.Acquire(r->next_lock, r)) return;  // A kGrant event continues.
    r->next_lock++;
  }
  Execute(r, finished);
}

void NbdServer::Connection::Execute(Request* r, std::vector<Request*>* finished) {
  const uint16_t type = r->h.type;
  // Whole pages of a TRIM, or of a WRITE_ZEROES that may leave holes, are trimmed: they then
  // read as zeros and their remote splits can be released.
  if (type == kCmdTrim || (type == kCmdWriteZeroes && !(r->h.flags & kCmdFlagNoHole))) {
    PageId a = r->first, b = r->last + 1;
    if (r->partial(a)) ++a;
    if (b > a && r->partial(b - 1)) --b;
    if (b > a) {
      Status st = shared->store->Trim(a, b - a);
      for (int i = 0; i < kMaxRetries && st.code() == StatusCode::kUnavailable; ++i) {
        st = shared->store->Trim(a, b - a);  // See RetryUnavailable().
      }
      if (!st.ok()) {
        LogStoreError(r, st);
        r->error = ErrnoOf(st) == kEInval ? kEIo : ErrnoOf(st);
        r->error_message = st.ToString();
        ReleaseLocks(r);
        finished->push_back(r);
        return;
      }
      shared->trimmed_pages.fetch_add(b - a, std::memory_order_relaxed);
    }
    if (type == kCmdTrim) {  // Partial pages of a TRIM are left as they are (it is advisory).
      FinishChange(r, finished);
      return;
    }
  }
  // Edge pages that the request covers only in part: read them first.
  r->edges = 0;
  if (r->partial(r->first)) r->edge_page[r->edges++] = r->first;
  if (r->last != r->first && r->partial(r->last)) r->edge_page[r->edges++] = r->last;
  if (r->edges == 0) {
    WritePhase(r, finished);
    return;
  }
  r->phase = Request::Phase::kEdgeRead;
  r->ops.assign(static_cast<size_t>(r->edges), PageOp{});
  for (int i = 0; i < r->edges; ++i) {
    r->edge[i].reset(new uint8_t[kPageSize]);
    r->ops[i].kind = PageOp::Kind::kRead;
    r->ops[i].page = r->edge_page[i];
    r->ops[i].buf = r->edge[i].get();
  }
  shared->rmw_pages.fetch_add(static_cast<uint64_t>(r->edges), std::memory_order_relaxed);
  if (!SubmitOps(shared->store, r)) {
    ReleaseLocks(r);
    finished->push_back(r);
  }
}

void NbdServer::Connection::WritePhase(Request* r, std::vector<Request*>* finished) {
  static const uint8_t kZeros[kPageSize] = {};
  const bool zeroes = r->h.type == kCmdWriteZeroes;
  const bool holes = zeroes && !(r->h.flags & kCmdFlagNoHole);
  const uint64_t off = r->h.offset, end = r->h.offset + r->h.length;
  r->phase = Request::Phase::kWrite;
  r->ops.clear();
  for (PageId p = r->first; p <= r->last; ++p) {
    const uint64_t base = (p - r->exp->first_page) * kPageSize;
    const uint64_t lo = std::max(off, base), hi = std::min(end, base + kPageSize);
    PageOp op;
    op.kind = PageOp::Kind::kWrite;
    op.page = p;
    int ei = -1;
    for (int i = 0; i < r->edges; ++i) {
      if (r->edge_page[i] == p) ei = i;
    }
    if (ei >= 0) {
      uint8_t* page = r->edge[ei].get();
      if (zeroes) {
        std::memset(page + (lo - base), 0, hi - lo);
      } else {
        std::memcpy(page + (lo - base), r->data.get() + (lo - off), hi - lo);
      }
      op.buf = page;
    } else if (holes) {
      continue;  // Trimmed already.
    } else if (zeroes) {
      op.buf = const_cast<uint8_t*>(kZeros);  // The store only reads a write's buffer.
    } else {
      op.buf = r->data.get() + (base - off);
    }
    r->ops.push_back(op);
  }
  if (r->ops.empty()) {
    FinishChange(r, finished);
    return;
  }
  if (!SubmitOps(shared->store, r)) {
    ReleaseLocks(r);
    finished->push_back(r);
  }
}

// A data-changing request succeeded: with FUA, the store makes it fully resilient before the
// reply; then its pages are unlocked.
void NbdServer::Connection::FinishChange(Request* r, std::vector<Request*>* finished) {
  if (r->h.flags & kCmdFlagFua) {
    Status st = shared->store->Flush();
    if (!st.ok()) {
      LogStoreError(r, st);
      r->error = kEIo;
      r->error_message = st.ToString();
    }
  }
  ReleaseLocks(r);
  finished->push_back(r);
}

void NbdServer::Connection::ReleaseLocks(Request* r) {
  if (!r->locking) return;
  for (PageId p = r->first; p < r->next_lock; ++p) {
    Request* next = shared->locks.Release(p);
    if (next != nullptr) next->conn->Post(EventKind::kGrant, next);
  }
  r->locking = false;
}

void NbdServer::Connection::AppendReply(Request* r, std::vector<std::string>* headers,
                                         std::vector<struct iovec>* iov) {
  const RequestHeader& h = r->h;
  const bool read_data = h.type == kCmdRead && r->error == 0 && h.length > 0;
  if (r->error != 0) shared->errors_replied.fetch_add(1, std::memory_order_relaxed);
  if (r->error == 0) {
    if (h.type == kCmdRead) shared->bytes_read.fetch_add(h.length, std::memory_order_relaxed);
    if (h.type == kCmdWrite) shared->bytes_written.fetch_add(h.length, std::memory_order_relaxed);
  }
  if (!structured) {
    headers->push_back(EncodeSimpleReply(r->error, h.cookie));
  } else if (r->error != 0) {
    headers->push_back(EncodeStructuredError(h.cookie, r->error, r->error_message));
  } else if (read_data) {
    std::string s = EncodeStructuredHeader(kReplyFlagDone, kReplyTypeOffsetData, h.cookie,
                                           8 + h.length);
    PutU64(&s, h.offset);
    headers->push_back(std::move(s));
  } else {
    headers->push_back(EncodeStructuredHeader(kReplyFlagDone, kReplyTypeNone, h.cookie, 0));
  }
  iov->push_back({headers->back().data(), headers->back().size()});
  if (read_data) iov->push_back({r->data.get() + h.offset % kPageSize, h.length});
}

void NbdServer::Connection::SendOrQueue(struct iovec* iov, size_t count, bool on_completer) {
  size_t total = 0;
  for (size_t i = 0; i < count; ++i) total += iov[i].iov_len;
  bool start_drain = false;
  {
    std::lock_guard<std::mutex> lk(send_mu);
    if (send_failed) return;
    size_t sent = 0;
    if (!flushing) {
      while (sent < total) {
        // Skip what was sent already.
        size_t skip = sent, i = 0;
        while (i < count && skip >= iov[i].iov_len) skip -= iov[i++].iov_len;
        std::vector<struct iovec> rest(iov + i, iov + count);
        rest[0].iov_base = static_cast<uint8_t*>(rest[0].iov_base) + skip;
        rest[0].iov_len -= skip;
        msghdr msg{};
        msg.msg_iov = rest.data();
        msg.msg_iovlen = std::min<size_t>(rest.size(), IOV_MAX);
        ssize_t n = ::sendmsg(fd.get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
          sent += static_cast<size_t>(n);
          continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        send_failed = true;  // The client is gone; later replies are dropped.
        outbox.clear();
        outbox_bytes.store(0);
        ::shutdown(fd.get(), SHUT_RDWR);  // Also stops the reader...
        std::lock_guard<std::mutex> lk2(mu);
        space_cv.notify_one();  // ... if it waits for room.
        return;
      }
      if (sent == total) return;
    }
    // Queue what is left, in order.
    std::string rest;
    rest.reserve(total - sent);
    size_t skip = sent;
    for (size_t i = 0; i < count; ++i) {
      const auto* b = static_cast<const char*>(iov[i].iov_base);
      if (skip >= iov[i].iov_len) {
        skip -= iov[i].iov_len;
        continue;
      }
      rest.append(b + skip, iov[i].iov_len - skip);
      skip = 0;
    }
    outbox_bytes.fetch_add(rest.size(), std::memory_order_relaxed);
    outbox.push_back(std::move(rest));
    if (!flushing) {
      flushing = true;
      start_drain = true;
    }
  }
  if (start_drain) {
    if (on_completer) {
      DrainOutbox();
    } else {
      Post(EventKind::kFlush, nullptr);
    }
  }
}

void NbdServer::Connection::DrainOutbox() {
  for (;;) {
    std::string chunk;
    {
      std::lock_guard<std::mutex> lk(send_mu);
      if (outbox.empty() || send_failed) {
        outbox.clear();
        outbox_bytes.store(0);
        flushing = false;
        return;
      }
      chunk = std::move(outbox.front());
      outbox.pop_front();
    }
    outbox_bytes.fetch_sub(chunk.size(), std::memory_order_relaxed);
    {
      std::lock_guard<std::mutex> lk(mu);  // So the reader cannot miss the wake-up.
      space_cv.notify_one();
    }
    if (!WriteString(fd.get(), chunk)) {  // Blocking; only this thread writes meanwhile.
      std::lock_guard<std::mutex> lk(send_mu);
      send_failed = true;
      outbox.clear();
      outbox_bytes.store(0);
      flushing = false;
      ::shutdown(fd.get(), SHUT_RDWR);
      std::lock_guard<std::mutex> lk2(mu);
      space_cv.notify_one();
      return;
    }
  }
}

void NbdServer::Connection::Retire(Request* const* rs, size_t count) {
  uint64_t freed_bytes = 0;
  for (size_t i = 0; i < count; ++i) {
    freed_bytes += rs[i]->data_bytes;
    delete rs[i];
  }
  std::lock_guard<std::mutex> lk(mu);
  inflight -= static_cast<uint32_t>(count);
  inflight_bytes -= freed_bytes;
  space_cv.notify_one();
  cv.notify_one();  // The completion thread exits once the reader is done and nothing is left.
}

bool NbdServer::Connection::TryFinishFast(Request* r) {
  const bool read = r->phase == Request::Phase::kDone && r->h.type == kCmdRead;
  const bool write = r->phase == Request::Phase::kWrite && !(r->h.flags & kCmdFlagFua);
  if (!read && !write) return false;
  for (const PageOp& op : r->ops) {
    if (!op.status.ok()) return false;  // Retries, logging and error replies: completion thread.
  }
  ReleaseLocks(r);
  std::vector<std::string> headers;
  headers.reserve(1);
  std::vector<struct iovec> iov;
  AppendReply(r, &headers, &iov);
  SendOrQueue(iov.data(), iov.size(), /*on_completer=*/false);
  Retire(&r, 1);
  return true;
}

void NbdServer::Connection::SendReplies(std::vector<Request*>& finished) {
  std::vector<std::string> headers;
  headers.reserve(finished.size());  // Never reallocates, so the iovecs stay valid.
  std::vector<struct iovec> iov;
  iov.reserve(finished.size() * 2);
  for (Request* r : finished) AppendReply(r, &headers, &iov);
  // One call for the whole batch: it holds send_mu across its sendmsg calls, so no store thread
  // can slip a reply between a header and its data.
  SendOrQueue(iov.data(), iov.size(), /*on_completer=*/true);
  Retire(finished.data(), finished.size());
  finished.clear();
}

// --- NbdServer ---

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
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string port_s = std::to_string(port);
  int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), port_s.c_str(), &hints, &res);
  if (rc != 0) return InvalidArgument("cannot resolve \"", host, "\": ", gai_strerror(rc));
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> guard(res, &freeaddrinfo);
  UniqueFd fd(::socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) return ErrnoError("socket");
  int one = 1;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd.get(), res->ai_addr, res->ai_addrlen) != 0) {
    return ErrnoError("bind ", host, ":", port);
  }
  if (::listen(fd.get(), 64) != 0) return ErrnoError("listen");
  sockaddr_storage ss{};
  socklen_t sl = sizeof ss;
  if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&ss), &sl) != 0) {
    return ErrnoError("getsockname");
  }
  const uint16_t bound = ss.ss_family == AF_INET6
                             ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                             : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  listeners_.push_back(std::move(fd));
  return bound;
}

Status NbdServer::ListenUnix(const std::string& path) {
  sockaddr_un addr{};
  if (path.empty() || path.size() >= sizeof addr.sun_path) {
    return InvalidArgument("unix socket path must be 1..", sizeof addr.sun_path - 1, " bytes");
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) return ErrnoError("socket");
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    return ErrnoError("bind ", path);
  }
  if (::listen(fd.get(), 64) != 0) return ErrnoError("listen");
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
      int one = 1;
      ::setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);  // Fails harmlessly on unix.
      ServeConnection(UniqueFd(c));
    }
  }
}

void NbdServer::ServeConnection(UniqueFd fd) {
  Shared* s = shared_.get();
  auto* conn = new Connection(s, std::move(fd));
  {
    sockaddr_storage ss{};
    socklen_t sl = sizeof ss;
    char host[NI_MAXHOST] = "", serv[NI_MAXSERV] = "";
    if (::getpeername(conn->fd.get(), reinterpret_cast<sockaddr*>(&ss), &sl) == 0 &&
        ss.ss_family != AF_UNIX &&
        ::getnameinfo(reinterpret_cast<sockaddr*>(&ss), sl, host, sizeof host, serv, sizeof serv,
                      NI_NUMERICHOST | NI_NUMERICSERV) == 0) {
      conn->peer = std::string(host) + ":" + serv;
    } else {
      conn->peer = "unix";
    }
  }
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
