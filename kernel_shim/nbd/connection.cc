// One NBD connection: request reading and validation, the completion thread's state machine
// (locks, read-modify-write, trims, flushes, retries) and the replies (see
// kernel_shim/nbd/connection.h).
#include "kernel_shim/nbd/connection.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>
#include <optional>

#include "common/clock.h"
#include "common/coding.h"
#include "common/logging.h"
#include "kernel_shim/nbd/handshake.h"
#include "kernel_shim/nbd/socket_io.h"

namespace tessera::nbd {

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

// Submits r->ops (all of them, already filled), to `direct` when given (a READ on the reader
// thread) else to the store. False if the batch was refused (then r->error is set and no
// callback will come).
bool SubmitOps(client::PageStore* store, Request* r, client::ThreadReader* direct = nullptr) {
  std::vector<PageOp*> ptrs(r->ops.size());
  for (size_t i = 0; i < r->ops.size(); ++i) {
    r->ops[i].done = &OnOpDone;
    r->ops[i].user = r;
    ptrs[i] = &r->ops[i];
  }
  r->pending.store(static_cast<uint32_t>(r->ops.size()), std::memory_order_release);
  r->retries = 0;
  Status st = direct != nullptr ? direct->Submit(ptrs) : store->Submit(ptrs);
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

void NbdServer::Connection::Run() {
  std::optional<Negotiated> n = NegotiateHandshake(fd.get(), *shared->options, peer);
  if (!n) return;
  exp = n->exp;
  structured = n->structured;
  trans_flags = n->trans_flags;
  // A client that stops reading replies for this long is dropped (a blocked send fails), so
  // Shutdown() and the connection's threads never wait on it forever.
  SetSendTimeoutMs(fd.get(), shared->options->send_timeout_ms);
  if (shared->options->direct_reads) {
    reply_avg_ns = uint64_t{shared->options->direct_spin_us} * 1000 / 2;  // Measured from here.
    client::ThreadReaderOptions to;
    to.wake_fd = fd.get();  // A request arriving wakes the reader from waiting for replies.
    auto reader = shared->store->NewThreadReader(to);
    if (reader.ok()) {
      direct = std::move(*reader);
    } else if (reader.status().code() != StatusCode::kUnsupported) {
      TLOG(WARNING) << "nbd " << peer << ": no direct reads on this connection: "
                    << reader.status();
    }
  }
  completer = std::thread([this] { Complete(); });
  ReadRequests();
  if (direct) {
    // Finish the READs still being read here (bounded by the store's hedge time, after which
    // the reader hands them to the store), then let the reader go on this thread.
    while (direct->inflight() > 0) (void)direct->Wait(Deadline::AfterMs(100));
    direct.reset();
  }
  {
    std::lock_guard<std::mutex> lk(mu);
    reader_done = true;
    cv.notify_one();
  }
  completer.join();
}

void NbdServer::Connection::ReadRequests() {
  const NbdServerOptions& opt = *shared->options;
  uint8_t hb[kRequestHeaderSize];
  uint32_t since_poll = 0;
  for (;;) {
    // With direct reads: requests already buffered are parsed first, so the reads of a burst are
    // posted together (by AwaitRequest's Poll); replies are still reaped every 32 requests.
    if (direct && (in.buffered() < kRequestHeaderSize || ++since_poll >= 32)) {
      since_poll = 0;
      AwaitRequest();
    }
    if (!in.ReadFull(hb, sizeof hb)) return;  // EOF or the client vanished.
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
      WaitForRoom(lk, r->data_bytes);
      inflight++;
      inflight_bytes += r->data_bytes;
    }
    if (h.type == kCmdWrite) {
      r->data.reset(new uint8_t[std::max<size_t>(h.length, 1)]);
      // Queued direct reads go out before this thread may block for the rest of a payload.
      if (direct && in.buffered() < h.length) (void)direct->Poll();
      if (!in.ReadFull(r->data.get(), h.length)) {
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
  if (!SubmitOps(shared->store, r, direct.get())) Post(EventKind::kReply, r);
}


void NbdServer::Connection::AwaitRequest() {
  // Polls (replies and the socket) for twice the time replies recently took to come, at most
  // direct_spin_us, and not at all when they took longer (polling could not catch them): a
  // reply caught while polling saves a wake-up (tens of microseconds on a VM whose idle CPUs
  // halt). Then sleeps until a reply arrives, the socket becomes readable (the reader's wake
  // fd), or the store's hedge time of the oldest read (it is handed over then).
  // Only with a single request in flight (the client waits for its reply): with more, the
  // client is busy sending and the memservers answering, and on a small machine polling would
  // take the CPU they need (bench nbd at QD32: 0.84-0.87x the ops/s when every wait polled).
  uint32_t requests = 0;
  {
    std::lock_guard<std::mutex> lk(mu);
    requests = inflight;
  }
  const uint64_t bound = requests <= 1 ? uint64_t{shared->options->direct_spin_us} * 1000 : 0;
  const uint64_t window = reply_avg_ns > bound ? 0 : std::min(bound, 2 * reply_avg_ns);
  const uint64_t start = MonotonicNs();
  bool waited = false;
  bool sampled = bound == 0;  // The average is of single-request waits only.
  for (;;) {
    const size_t done = direct->Poll();  // Answers the READs whose pages all arrived.
    if (done == 0) {
      waited = true;
    } else if (waited && !sampled) {
      // A moving average (1/8 new) of how long the first reply took (a wake-up included if it
      // slept); not sampled when replies were waiting already.
      reply_avg_ns = reply_avg_ns - reply_avg_ns / 8 + (MonotonicNs() - start) / 8;
      sampled = true;
    }
    if (direct->inflight() == 0 || in.Readable()) return;
    if (MonotonicNs() - start < window) continue;
    (void)direct->Wait(Deadline::AfterMs(100));
  }
}

void NbdServer::Connection::WaitForRoom(std::unique_lock<std::mutex>& lk, size_t bytes) {
  const NbdServerOptions& opt = *shared->options;
  auto room = [&] {
    if (sender.queued_bytes() > opt.max_inflight_bytes) return false;
    return inflight == 0 || (inflight < opt.max_inflight_requests &&
                             inflight_bytes + bytes <= opt.max_inflight_bytes);
  };
  while (!room()) {
    if (direct && direct->inflight() > 0) {
      // Our own direct reads hold the room: complete them (they retire their requests). Other
      // threads free room too, so the wait is short and re-checks.
      lk.unlock();
      if (direct->Poll() == 0) (void)direct->Wait(Deadline::AfterMs(1));
      lk.lock();
      continue;
    }
    space_cv.wait(lk);
  }
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
      sender.Drain();
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
  if (shared->options->before_change) {
    Status st = shared->options->before_change();
    if (!st.ok()) {
      LogStoreError(r, st);
      r->error = kEIo;
      r->error_message = st.ToString();
      ReleaseLocks(r);
      finished->push_back(r);
      return;
    }
  }
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
    uint8_t offset[8];
    EncodeBigEndian64(offset, h.offset);
    s.append(reinterpret_cast<const char*>(offset), 8);
    headers->push_back(std::move(s));
  } else {
    headers->push_back(EncodeStructuredHeader(kReplyFlagDone, kReplyTypeNone, h.cookie, 0));
  }
  iov->push_back({headers->back().data(), headers->back().size()});
  if (read_data) iov->push_back({r->data.get() + h.offset % kPageSize, h.length});
}

void NbdServer::Connection::SendOrQueue(struct iovec* iov, size_t count, bool on_completer) {
  if (sender.SendOrQueue(iov, count) != ReplySender::Outcome::kDrainNeeded) return;
  if (on_completer) {
    sender.Drain();
  } else {
    Post(EventKind::kFlush, nullptr);
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
  // One call for the whole batch: it holds the sender's lock across its sendmsg calls, so no
  // store thread can slip a reply between a header and its data.
  SendOrQueue(iov.data(), iov.size(), /*on_completer=*/true);
  Retire(finished.data(), finished.size());
  finished.clear();
}

}  // namespace tessera::nbd
