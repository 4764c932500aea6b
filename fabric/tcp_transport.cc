// The TCP transport on io_uring (see fabric/transport.h).
//
// Per connection: one recv always armed into an input buffer, at most one send in flight (frames
// posted meanwhile collect in a second buffer and leave together). Data ops occupy a slot in a
// fixed table; the request_id is (generation << 32 | slot), so a reply is matched in O(1) and a
// stale or forged id is detected. GOODBYE uses ids with the top bit set. The fast path
// (Post/Poll) allocates nothing once buffers have grown to the working-set size.
#include <poll.h>

#include <cstring>
#include <unordered_map>

#include "common/logging.h"
#include "fabric/frame_builder.h"
#include "fabric/socket.h"
#include "fabric/tcp_transport.h"

namespace tessera::fabric {
namespace {

constexpr uint64_t kControlBit = 1ull << 63;
constexpr uint64_t kTagRecv = 1;
constexpr uint64_t kTagSend = 2;
constexpr uint64_t kTagWake = 3;  // The SetWakeFd() poll (connection field unused).

uint64_t MakeData(uint64_t conn, uint64_t tag) { return (conn << 2) | tag; }

}  // namespace

// ---- TcpTransport ----

TcpTransport::TcpTransport(const TransportOptions& options) : options_(options) {}

TcpTransport::~TcpTransport() {
  if (!ring_.ready()) return;
  for (auto& c : conns_) c->io.Shutdown();
  // Wait until the kernel holds none of our buffers; ~IoRing then tears the ring down.
  Deadline limit = Deadline::AfterMs(5000);
  while (!limit.Expired()) {
    bool busy = false;
    for (auto& c : conns_) busy |= c->io.ops_in_kernel() > 0;
    if (!busy) break;
    ring_.SubmitAndWait(10 * 1000 * 1000);
    io_uring_cqe* cqes[64];
    unsigned n = io_uring_peek_batch_cqe(ring_.get(), cqes, 64);
    for (unsigned i = 0; i < n; ++i) {
      uint64_t data = io_uring_cqe_get_data64(cqes[i]);
      uint64_t tag = data & 3;
      uint64_t id = data >> 2;
      if (id >= conns_.size()) continue;
      if (tag == kTagRecv) conns_[id]->io.OnRecvDone();
      if (tag == kTagSend) conns_[id]->io.OnSendDone(cqes[i]->res);
    }
    io_uring_cq_advance(ring_.get(), n);
  }
}

Status TcpTransport::Init() {
  if (options_.max_inflight < 1 || options_.max_inflight > 65536) {
    return InvalidArgument("max_inflight must be in 1..65536, got ", options_.max_inflight);
  }
  if (options_.ring_entries < 8 || options_.ring_entries > 32768) {
    return InvalidArgument("ring_entries must be in 8..32768, got ", options_.ring_entries);
  }
  TESSERA_RETURN_IF_ERROR(ring_.Init(options_.ring_entries));
  slots_.resize(options_.max_inflight);
  free_slots_.reserve(options_.max_inflight);
  for (uint32_t i = options_.max_inflight; i > 0; --i) free_slots_.push_back(i - 1);
  ready_.resize(options_.max_inflight + 64);
  touched_.reserve(64);
  return Status::Ok();
}

Result<ConnectionId> TcpTransport::Connect(const Endpoint& endpoint,
                                           const ConnectOptions& options) {
  if (conns_.size() >= (1u << 30)) return ResourceExhausted("too many connections");
  TESSERA_RETURN_IF_ERROR(ring_.EnableOnThisThread());
  TESSERA_ASSIGN_OR_RETURN(ClientSocket sock, ConnectAndAuthenticate(endpoint, options));
  // The ring does the I/O from now on; io_uring polls blocking sockets itself.
  TESSERA_RETURN_IF_ERROR(SetBlocking(sock.fd.get(), true));

  auto c = std::make_unique<Conn>();
  c->io = FramedConnection(std::move(sock.fd));
  c->io.ReserveSendBuffers(64 * 1024);
  c->up = true;
  c->info.server_id = sock.login.server_id;
  c->info.slab_size = sock.login.auth_ok.slab_size;
  c->info.capacity_bytes = sock.login.auth_ok.capacity_bytes;
  c->info.endpoint = endpoint;
  ConnectionId id = static_cast<ConnectionId>(conns_.size());
  conns_.push_back(std::move(c));
  ArmRecv(id);
  ring_.Submit();
  return id;
}

Status TcpTransport::CheckConn(ConnectionId id) const {
  if (id >= conns_.size()) return InvalidArgument("unknown connection ", id);
  if (!conns_[id]->up) {
    return Unavailable("connection ", id, " to ", conns_[id]->info.endpoint.ToString(),
                       " is down: ", conns_[id]->down_reason.message());
  }
  return Status::Ok();
}

Status TcpTransport::Disconnect(ConnectionId id) {
  TESSERA_RETURN_IF_ERROR(CheckConn(id));
  conns_[id]->goodbye = true;
  auto r = Control(id, Op::kGoodbye, Deadline::AfterMs(1000));
  MarkDown(id, Cancelled("connection closed by Disconnect()"));
  if (!r.ok() && r.status().code() != StatusCode::kUnavailable) return r.status();
  return Status::Ok();
}

Status TcpTransport::Abort(ConnectionId id) {
  TESSERA_RETURN_IF_ERROR(CheckConn(id));
  conns_[id]->goodbye = true;  // Our own close: not logged as a failure.
  MarkDown(id, Cancelled("connection aborted by Abort()"));
  return Status::Ok();
}

Result<ServerInfo> TcpTransport::Info(ConnectionId id) const {
  if (id >= conns_.size()) return InvalidArgument("unknown connection ", id);
  return conns_[id]->info;
}

bool TcpTransport::Connected(ConnectionId id) const {
  return id < conns_.size() && conns_[id]->up;
}

Status TcpTransport::RegisterMemory(void* addr, size_t length) {
  if (addr == nullptr || length == 0) return InvalidArgument("RegisterMemory: empty region");
  return Status::Ok();  // TCP copies through its own buffers; nothing to pin.
}

void TcpTransport::ArmRecv(ConnectionId id) {
  Conn* c = conns_[id].get();
  if (!c->up) return;
  c->io.ArmRecv(ring_, MakeData(id, kTagRecv));
}

void TcpTransport::Flush(ConnectionId id) {
  Conn* c = conns_[id].get();
  if (!c->up) return;
  c->io.Flush(ring_, MakeData(id, kTagSend));
}

Status TcpTransport::Post(std::span<const WorkRequest> batch) {
  if (batch.empty()) return Status::Ok();
  for (const WorkRequest& wr : batch) {
    TESSERA_RETURN_IF_ERROR(CheckConn(wr.connection));
    if (wr.length == 0 || wr.length > kMaxDataLength) {
      return InvalidArgument("work request length ", wr.length, " outside 1..", kMaxDataLength);
    }
    if (wr.local == nullptr) return InvalidArgument("work request without a local buffer");
    if (wr.slab_id == 0) return InvalidArgument("work request with slab_id 0");
    if (wr.remote_offset + wr.length < wr.remote_offset) {
      return InvalidArgument("work request offset + length overflows");
    }
  }
  if (batch.size() > free_slots_.size()) {
    return ResourceExhausted("batch of ", batch.size(), " ops does not fit: ", free_slots_.size(),
                             " of ", options_.max_inflight, " in-flight slots free");
  }
  touched_.clear();
  for (size_t i = 0; i < batch.size(); ++i) {
    const WorkRequest& wr = batch[i];
    Conn* c = conns_[wr.connection].get();
    (wr.op == OpKind::kRead ? c->batch_reads : c->batch_writes).push_back(static_cast<uint32_t>(i));
    c->inflight++;
    if (!c->touched) {
      c->touched = true;
      touched_.push_back(wr.connection);
    }
  }
  inflight_ += static_cast<uint32_t>(batch.size());
  for (ConnectionId id : touched_) {
    Conn* c = conns_[id].get();
    c->touched = false;
    EncodeGroup(c, batch, c->batch_reads, OpKind::kRead);
    EncodeGroup(c, batch, c->batch_writes, OpKind::kWrite);
    c->batch_reads.clear();
    c->batch_writes.clear();
    Flush(id);
  }
  ring_.Submit();
  return Status::Ok();
}

uint32_t TcpTransport::TakeSlot(const WorkRequest& wr) {
  uint32_t slot_index = free_slots_.back();
  free_slots_.pop_back();
  Slot& s = slots_[slot_index];
  s.used = true;
  s.gen = (s.gen + 1) & 0x7fffffffu;  // Keeps kControlBit clear in the request id.
  if (s.gen == 0) s.gen = 1;
  s.cookie = wr.cookie;
  s.local = wr.local;
  s.length = wr.length;
  s.op = wr.op;
  s.conn = wr.connection;
  s.vector_head = false;
  s.member = false;
  s.next = kNoSlot;
  s.vector_total = 0;
  return slot_index;
}

// Appends the frames for `ops` (indices into `batch`, one connection, one kind) to the
// connection's pending bytes: a plain READ/WRITE for a lone op, else READV/WRITEV frames of up to
// kMaxVectorRanges ranges and kMaxDataLength bytes each.
void TcpTransport::EncodeGroup(Conn* c, std::span<const WorkRequest> batch,
                               const std::vector<uint32_t>& ops, OpKind kind) {
  const size_t max_ranges = options_.coalesce ? kMaxVectorRanges : 1;
  size_t i = 0;
  while (i < ops.size()) {
    size_t j = i;
    uint64_t total = 0;
    while (j < ops.size() && j - i < max_ranges &&
           total + batch[ops[j]].length <= kMaxDataLength) {
      total += batch[ops[j]].length;
      ++j;
    }
    if (j - i == 1) {
      const WorkRequest& wr = batch[ops[i]];
      const uint32_t slot_index = TakeSlot(wr);
      const uint64_t request_id = (uint64_t{slots_[slot_index].gen} << 32) | slot_index;
      if (kind == OpKind::kRead) {
        uint8_t* p = c->io.pending.Append(kHeaderSize + ReadRequest::kWireSize);
        EncodeHeader(FrameHeader{Op::kRead, false, request_id, StatusCode::kOk,
                                 static_cast<uint32_t>(ReadRequest::kWireSize)},
                     p);
        ReadRequest{wr.slab_id, wr.remote_offset, wr.length}.EncodeTo(p + kHeaderSize);
      } else {
        uint8_t* p = c->io.pending.Append(kHeaderSize + WriteRequest::kWireSize + wr.length);
        EncodeHeader(FrameHeader{Op::kWrite, false, request_id, StatusCode::kOk,
                                 static_cast<uint32_t>(WriteRequest::kWireSize + wr.length)},
                     p);
        WriteRequest{wr.slab_id, wr.remote_offset, wr.length}.EncodeTo(p + kHeaderSize);
        std::memcpy(p + kHeaderSize + WriteRequest::kWireSize, wr.local, wr.length);
      }
      i = j;
      continue;
    }
    const uint32_t n = static_cast<uint32_t>(j - i);
    const size_t fixed = VectorRequest::kWireSize + size_t{n} * VectorRange::kWireSize;
    const size_t payload = fixed + (kind == OpKind::kWrite ? total : 0);
    uint8_t* p = c->io.pending.Append(kHeaderSize + payload);
    uint32_t head = kNoSlot;
    uint32_t prev = kNoSlot;
    uint8_t* range = p + kHeaderSize + VectorRequest::kWireSize;
    uint8_t* data = p + kHeaderSize + fixed;
    for (size_t m = i; m < j; ++m) {
      const WorkRequest& wr = batch[ops[m]];
      const uint32_t slot_index = TakeSlot(wr);
      if (head == kNoSlot) {
        head = slot_index;
      } else {
        slots_[prev].next = slot_index;
        slots_[slot_index].member = true;
      }
      prev = slot_index;
      VectorRange{wr.slab_id, wr.remote_offset, wr.length}.EncodeTo(range);
      range += VectorRange::kWireSize;
      if (kind == OpKind::kWrite) {
        std::memcpy(data, wr.local, wr.length);
        data += wr.length;
      }
    }
    Slot& hs = slots_[head];
    hs.vector_head = true;
    hs.vector_total = static_cast<uint32_t>(total);
    const uint64_t request_id = (uint64_t{hs.gen} << 32) | head;
    EncodeHeader(FrameHeader{kind == OpKind::kRead ? Op::kReadV : Op::kWriteV, false, request_id,
                             StatusCode::kOk, static_cast<uint32_t>(payload)},
                 p);
    VectorRequest{n, static_cast<uint32_t>(total)}.EncodeTo(p + kHeaderSize);
    i = j;
  }
}

void TcpTransport::PushCompletion(Completion c) {
  if (ready_count_ == ready_.size()) {
    std::vector<Completion> bigger(ready_.size() * 2);
    for (size_t i = 0; i < ready_count_; ++i) {
      bigger[i] = std::move(ready_[(ready_head_ + i) % ready_.size()]);
    }
    ready_ = std::move(bigger);
    ready_head_ = 0;
  }
  ready_[(ready_head_ + ready_count_) % ready_.size()] = std::move(c);
  ready_count_++;
}

size_t TcpTransport::Drain(std::span<Completion> out) {
  size_t n = 0;
  while (n < out.size() && ready_count_ > 0) {
    out[n++] = std::move(ready_[ready_head_]);
    ready_head_ = (ready_head_ + 1) % ready_.size();
    ready_count_--;
  }
  return n;
}

void TcpTransport::CompleteSlot(uint32_t slot_index, Status status) {
  Slot& s = slots_[slot_index];
  Completion c;
  c.kind = CompletionKind::kData;
  c.cookie = s.cookie;
  c.status = std::move(status);
  c.connection = s.conn;
  s.used = false;
  conns_[s.conn]->inflight--;
  free_slots_.push_back(slot_index);
  inflight_--;
  PushCompletion(std::move(c));
}

bool TcpTransport::Reap() {
  if (!ring_.enabled()) return false;  // Nothing was ever connected.
  io_uring_cqe* cqes[128];
  unsigned n = io_uring_peek_batch_cqe(ring_.get(), cqes, 128);
  if (n == 0 && ring_.defer_taskrun()) {
    // Run the deferred completions (one io_uring_enter, like a non-blocking recv()).
    ring_.GetEvents();
    n = io_uring_peek_batch_cqe(ring_.get(), cqes, 128);
  }
  if (n == 0) return false;
  for (unsigned i = 0; i < n; ++i) {
    uint64_t data = io_uring_cqe_get_data64(cqes[i]);
    int res = cqes[i]->res;
    uint64_t tag = data & 3;
    ConnectionId id = static_cast<ConnectionId>(data >> 2);
    if (tag == kTagWake) {
      // Only the current watch counts (not a removed one's last CQE, not the removal's own).
      if (id == wake_gen_ && wake_fd_ >= 0) {
        woken_ = true;
        if ((cqes[i]->flags & IORING_CQE_F_MORE) == 0) wake_armed_ = false;  // Re-armed by Wait.
      }
      continue;
    }
    if (tag == kTagRecv) {
      conns_[id]->io.OnRecvDone();
      OnRecv(id, res);
    } else if (tag == kTagSend) {
      Conn* c = conns_[id].get();
      c->io.OnSendDone(res);
      if (c->up) {
        if (res < 0 && res != -EAGAIN && res != -EINTR) {
          MarkDown(id, Unavailable("send to ", c->info.endpoint.ToString(), ": ", strerror(-res)));
        } else {
          Flush(id);
        }
      }
    }
    if (conns_[id]->io.ops_in_kernel() == 0 && !conns_[id]->up) ReleaseConn(id);
  }
  io_uring_cq_advance(ring_.get(), n);
  if (io_uring_sq_ready(ring_.get()) > 0) ring_.Submit();
  return true;
}

void TcpTransport::OnRecv(ConnectionId id, int res) {
  Conn* c = conns_[id].get();
  if (!c->up) return;
  if (res <= 0 && c->goodbye && res != -EAGAIN && res != -EINTR) {
    MarkDown(id, Cancelled("connection closed by Disconnect()"));
    return;
  }
  if (res == 0) {
    MarkDown(id, Unavailable("server ", c->info.endpoint.ToString(), " closed the connection"));
    return;
  }
  if (res < 0) {
    if (res == -EAGAIN || res == -EINTR) {
      ArmRecv(id);
      return;
    }
    MarkDown(id, Unavailable("recv from ", c->info.endpoint.ToString(), ": ", strerror(-res)));
    return;
  }
  c->io.in.Commit(static_cast<size_t>(res));
  while (c->up) {
    auto next = c->io.in.Next(Direction::kResponse);
    if (!next.ok()) {
      MarkDown(id, next.status().WithContext("malformed frame from " + c->info.endpoint.ToString()));
      return;
    }
    if (!next->has_value()) break;  // The rest of the frame is still on its way.
    const FrameReader::Frame& frame = **next;
    Status st = HandleFrame(id, frame.header, frame.payload);
    if (!st.ok()) {
      MarkDown(id, st.WithContext("bad frame from " + c->info.endpoint.ToString()));
      return;
    }
    c->io.in.Consume(frame);
  }
  ArmRecv(id);
}

Status TcpTransport::HandleFrame(ConnectionId id, const FrameHeader& h,
                                 std::span<const uint8_t> payload) {
  if (h.op == Op::kNotice) {
    TESSERA_ASSIGN_OR_RETURN(Notice n, Notice::Decode(payload));
    Completion c;
    c.kind = CompletionKind::kNotice;
    c.connection = id;
    c.notice = n;
    PushCompletion(std::move(c));
    return Status::Ok();
  }
  if (h.request_id & kControlBit) {
    auto it = controls_.find(h.request_id);
    if (it == controls_.end()) return Status::Ok();  // Its caller gave up (deadline).
    if (it->second.conn != id || it->second.op != h.op) {
      return ProtocolError("control reply ", OpName(h.op), " does not match its request");
    }
    std::vector<uint8_t> frame(kHeaderSize + payload.size());
    EncodeHeader(h, frame.data());
    std::memcpy(frame.data() + kHeaderSize, payload.data(), payload.size());
    TESSERA_RETURN_IF_ERROR(ParseFrame(frame, Direction::kResponse).status());
    it->second.done = true;
    it->second.frame = std::move(frame);
    return Status::Ok();
  }
  uint32_t slot_index = static_cast<uint32_t>(h.request_id & 0xffffffffu);
  uint32_t gen = static_cast<uint32_t>(h.request_id >> 32);
  if (slot_index >= slots_.size() || !slots_[slot_index].used || slots_[slot_index].gen != gen ||
      slots_[slot_index].conn != id || slots_[slot_index].member) {
    return ProtocolError("reply to unknown request id ", h.request_id);
  }
  Slot& s = slots_[slot_index];
  Op want = s.op == OpKind::kRead ? (s.vector_head ? Op::kReadV : Op::kRead)
                                  : (s.vector_head ? Op::kWriteV : Op::kWrite);
  if (h.op != want) {
    return ProtocolError(OpName(h.op), " reply to a ", OpName(want), " request");
  }
  if (s.vector_head) {
    if (h.status == StatusCode::kOk && want == Op::kReadV && payload.size() != s.vector_total) {
      return ProtocolError("READV reply of ", payload.size(), " bytes for ", s.vector_total,
                           " requested");
    }
    const Status failure =
        h.status == StatusCode::kOk
            ? Status::Ok()
            : Status(h.status,
                     std::string(reinterpret_cast<const char*>(payload.data()), payload.size()));
    size_t off = 0;
    for (uint32_t m = slot_index; m != kNoSlot;) {
      Slot& ms = slots_[m];
      const uint32_t next = ms.next;
      if (failure.ok() && want == Op::kReadV) {
        std::memcpy(ms.local, payload.data() + off, ms.length);
        off += ms.length;
      }
      CompleteSlot(m, failure);
      m = next;
    }
    return Status::Ok();
  }
  if (h.status != StatusCode::kOk) {
    CompleteSlot(slot_index,
                 Status(h.status, std::string(reinterpret_cast<const char*>(payload.data()),
                                              payload.size())));
    return Status::Ok();
  }
  if (want == Op::kRead) {
    if (payload.size() != s.length) {
      return ProtocolError("READ reply of ", payload.size(), " bytes for ", s.length, " requested");
    }
    std::memcpy(s.local, payload.data(), s.length);
  }
  CompleteSlot(slot_index, Status::Ok());
  return Status::Ok();
}

void TcpTransport::MarkDown(ConnectionId id, Status reason) {
  Conn* c = conns_[id].get();
  if (!c->up) return;
  c->up = false;
  c->down_reason = reason;
  if (reason.code() != StatusCode::kCancelled) {
    TLOG(INFO) << "fabric: connection " << id << " down: " << reason.ToString();
  }
  c->io.Shutdown();
  if (c->inflight > 0) {
    for (uint32_t i = 0; i < slots_.size(); ++i) {
      if (slots_[i].used && slots_[i].conn == id) CompleteSlot(i, reason);
    }
  }
  for (auto& [rid, w] : controls_) {
    if (w.conn == id && !w.done) {
      w.done = true;
      w.failure = reason;
    }
  }
  if (c->io.ops_in_kernel() == 0) ReleaseConn(id);
}

void TcpTransport::ReleaseConn(ConnectionId id) { conns_[id]->io.Release(); }

size_t TcpTransport::Poll(std::span<Completion> out) {
  if (ready_count_ >= out.size()) return Drain(out);
  while (Reap()) {
    if (ready_count_ >= out.size()) break;
  }
  return Drain(out);
}

size_t TcpTransport::Wait(std::span<Completion> out, Deadline deadline) {
  if (!ring_.enabled()) return Drain(out);  // Never connected: nothing can complete.
  woken_ = false;
  ArmWake();
  while (true) {
    size_t n = Poll(out);
    if (n > 0 || out.empty()) return n;
    if (woken_ || deadline.Expired()) return 0;
    WaitKernel(deadline);
  }
}

Status TcpTransport::SetWakeFd(int fd) {
  if (fd < -1) return InvalidArgument("SetWakeFd: bad fd ", fd);
  if (wake_armed_) {
    io_uring_sqe* sqe = ring_.Sqe();
    io_uring_prep_poll_remove(sqe, MakeData(wake_gen_, kTagWake));
    io_uring_sqe_set_data64(sqe, MakeData(0, kTagWake));  // Generation 0 is never current.
    ring_.Submit();
    wake_armed_ = false;
  }
  wake_gen_ = wake_gen_ + 1 == (1u << 30) ? 1 : wake_gen_ + 1;
  wake_fd_ = fd;
  woken_ = false;
  return Status::Ok();
}

void TcpTransport::ArmWake() {
  if (wake_fd_ < 0 || wake_armed_ || !ring_.enabled()) return;
  io_uring_sqe* sqe = ring_.Sqe();
  io_uring_prep_poll_multishot(sqe, wake_fd_, POLLIN);
  io_uring_sqe_set_data64(sqe, MakeData(wake_gen_, kTagWake));
  wake_armed_ = true;
  // Submitted by the WaitKernel() that follows.
}

void TcpTransport::WaitKernel(Deadline deadline) {
  uint64_t now = MonotonicNs();
  uint64_t left = deadline.at_ns() > now ? deadline.at_ns() - now : 0;
  if (left > 100'000'000) left = 100'000'000;  // Re-check at least every 100 ms.
  ring_.SubmitAndWait(left);
}

Result<std::vector<uint8_t>> TcpTransport::Control(ConnectionId id, Op op, Deadline deadline) {
  TESSERA_RETURN_IF_ERROR(CheckConn(id));
  uint64_t rid = kControlBit | next_control_++;
  ControlWait& w = controls_[rid];
  w.conn = id;
  w.op = op;
  Conn* c = conns_[id].get();
  EncodeHeader(FrameHeader{op, false, rid, StatusCode::kOk, 0}, c->io.pending.Append(kHeaderSize));
  Flush(id);
  ring_.Submit();
  while (true) {
    while (Reap()) {
    }
    ControlWait& cw = controls_[rid];
    if (cw.done) {
      ControlWait done = std::move(cw);
      controls_.erase(rid);
      if (!done.failure.ok()) return done.failure;
      return std::move(done.frame);
    }
    if (deadline.Expired()) {
      controls_.erase(rid);
      return Timeout(OpName(op), " to ", c->info.endpoint.ToString(), ": no reply before the deadline");
    }
    WaitKernel(deadline);
  }
}

Status TcpTransport::AddSlab(ConnectionId id, const AllocSlabResponse& slab) {
  if (id >= conns_.size()) return InvalidArgument("unknown connection ", id);
  if (slab.slab_id == 0) return InvalidArgument("AddSlab: slab_id 0");
  return Status::Ok();  // Slabs travel by id; the server checks ownership.
}

void TcpTransport::RemoveSlab(ConnectionId id, uint64_t slab_id) {
  (void)id;
  (void)slab_id;
}

Result<std::unique_ptr<Transport>> CreateTcpTransport(const TransportOptions& options) {
  auto t = std::make_unique<TcpTransport>(options);
  TESSERA_RETURN_IF_ERROR(t->Init());
  return std::unique_ptr<Transport>(std::move(t));
}

}  // namespace tessera::fabric
