// One I/O thread of the server engine (see fabric/server_io_thread.h).
#include "fabric/server_io_thread.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <array>
#include <cstring>
#include <vector>

#include "fabric/frame_builder.h"
#include "fabric/server_impl.h"
#include "fabric/socket.h"

namespace tessera::fabric {
namespace {

enum Tag : uint64_t {
  kTagAccept = 1,
  kTagRecv = 2,
  kTagSend = 3,
  kTagDelay = 4,
  kTagHandshakeTimer = 5,
  kTagEvent = 6,
  kTagIgnore = 7,
  kTagStopTick = 8,
};
constexpr int kTagBits = 4;
inline uint64_t MakeData(uint64_t id, Tag tag) { return (id << kTagBits) | tag; }

__kernel_timespec TimespecNs(uint64_t ns) {
  return __kernel_timespec{static_cast<int64_t>(ns / 1000000000ull),
                           static_cast<int64_t>(ns % 1000000000ull)};
}

}  // namespace

ServerIoThread::ServerIoThread(Server::Impl* server, int index, UniqueFd listen_fd)
    : server_(server), index_(index), listen_fd_(std::move(listen_fd)),
      reply_channel_(std::make_shared<AsyncReplyChannel>()) {
  reply_channel_->thread = this;
}

// Every connection is gone by the time Run() returns; the ring's only remaining ops are
// timeouts, which reference no user memory, so the IoRing may exit now.
ServerIoThread::~ServerIoThread() {
  std::lock_guard<std::mutex> lock(reply_channel_->mu);
  reply_channel_->thread = nullptr;
}

void AsyncReply::Send(Result<std::vector<uint8_t>> payload) const {
  if (!channel_) return;
  std::lock_guard<std::mutex> lock(channel_->mu);
  if (channel_->thread == nullptr) return;
  ServerIoThread::Command c;
  c.kind = ServerIoThread::Command::Kind::kReply;
  c.connection_id = connection_id_;
  c.op = op_;
  c.request_id = request_id_;
  c.reply = std::move(payload);
  channel_->thread->Enqueue(std::move(c));
}

Status ServerIoThread::Init(uint32_t ring_entries) {
  event_fd_.Reset(::eventfd(0, EFD_CLOEXEC));
  if (!event_fd_) return ErrnoError("eventfd");
  // Created here; enabled by the I/O thread itself, which thereby becomes the single issuer.
  return ring_.Init(ring_entries);
}

void ServerIoThread::Start() {
  thread_ = std::thread([this] { Run(); });
}

void ServerIoThread::Join() {
  if (thread_.joinable()) thread_.join();
}

void ServerIoThread::Enqueue(Command c) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    commands_.push_back(std::move(c));
  }
  uint64_t one = 1;
  ssize_t n = ::write(event_fd_.get(), &one, sizeof(one));
  (void)n;  // An eventfd write only fails when the counter would overflow: still woken.
}

void ServerIoThread::ArmAccept() {
  io_uring_sqe* sqe = ring_.Sqe();
  io_uring_prep_multishot_accept(sqe, listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC);
  io_uring_sqe_set_data64(sqe, MakeData(0, kTagAccept));
  accept_armed_ = true;
}

void ServerIoThread::ArmEvent() {
  io_uring_sqe* sqe = ring_.Sqe();
  io_uring_prep_read(sqe, event_fd_.get(), &event_buf_, sizeof(event_buf_), 0);
  io_uring_sqe_set_data64(sqe, MakeData(0, kTagEvent));
  event_armed_ = true;
}

void ServerIoThread::Run() {
  Status enabled = ring_.EnableOnThisThread();
  TCHECK(enabled.ok()) << enabled;
  ArmAccept();
  ArmEvent();
  while (true) {
    int rc = io_uring_submit_and_wait(ring_.get(), 1);
    if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
      TLOG(ERROR) << "io_uring_submit_and_wait: " << strerror(-rc);
    }
    io_uring_cqe* cqes[256];
    unsigned n;
    while ((n = io_uring_peek_batch_cqe(ring_.get(), cqes, 256)) > 0) {
      for (unsigned i = 0; i < n; ++i) {
        uint64_t data = io_uring_cqe_get_data64(cqes[i]);
        int res = cqes[i]->res;
        uint32_t flags = cqes[i]->flags;
        io_uring_cqe_seen(ring_.get(), cqes[i]);
        HandleCqe(data, res, flags);
      }
    }
    if (stopping_ && conns_.empty() && !accept_armed_ && !event_armed_) break;
    if (stopping_) StopStep();
  }
}

void ServerIoThread::HandleCqe(uint64_t data, int res, uint32_t flags) {
  uint64_t id = data >> kTagBits;
  switch (static_cast<Tag>(data & ((1u << kTagBits) - 1))) {
    case kTagAccept:
      if (!(flags & IORING_CQE_F_MORE)) accept_armed_ = false;
      if (res >= 0) {
        OnAccept(UniqueFd(res));
      } else if (!stopping_ && res != -ECANCELED) {
        TLOG(WARNING) << "accept: " << strerror(-res);
      }
      if (!accept_armed_ && !stopping_) ArmAccept();
      break;
    case kTagEvent:
      event_armed_ = false;
      OnEvent();
      if (!stopping_) ArmEvent();
      break;
    case kTagRecv: {
      Conn* c = Find(id);
      if (!c) break;
      c->io.OnRecvDone();
      OnRecv(c, res);
      MaybeFree(c);
      break;
    }
    case kTagSend: {
      Conn* c = Find(id);
      if (!c) break;
      c->io.OnSendDone(res);
      OnSend(c, res);
      MaybeFree(c);
      break;
    }
    case kTagDelay: {
      auto it = delayed_.find(id);
      if (it == delayed_.end()) break;
      std::unique_ptr<Delayed> d = std::move(it->second);
      delayed_.erase(it);
      Conn* c = Find(d->conn_id);
      if (c && !c->closing) {
        std::memcpy(c->io.pending.Append(d->bytes.size()), d->bytes.data(), d->bytes.size());
        Flush(c);
      }
      break;
    }
    case kTagHandshakeTimer: {
      Conn* c = Find(id);
      if (c && !c->closing && !c->ready) {
        Close(c, "no successful AUTH within the handshake timeout", LogLevel::kWarning);
        MaybeFree(c);
      }
      break;
    }
    case kTagStopTick:
      tick_armed_ = false;
      break;
    case kTagIgnore:
      break;
  }
}

ServerIoThread::Conn* ServerIoThread::Find(uint64_t id) {
  auto it = conns_.find(id);
  return it == conns_.end() ? nullptr : it->second.get();
}

void ServerIoThread::OnAccept(UniqueFd fd) {
  if (stopping_) return;
  if (server_->open_connections_.load() >= server_->options_.max_connections) {
    TLOG(WARNING) << "refusing a connection: max_connections ("
                  << server_->options_.max_connections << ") reached";
    return;
  }
  SetNoDelay(fd.get());
  auto c = std::make_unique<Conn>();
  uint64_t id = server_->next_conn_id_.fetch_add(1);
  c->peer.connection_id = id;
  c->peer.address = PeerAddress(fd.get());
  c->peer.io_thread = index_;
  c->io = FramedConnection(std::move(fd), kPreAuthRecvBuffer);
  Conn* raw = c.get();
  conns_.emplace(id, std::move(c));
  server_->open_connections_.fetch_add(1);
  ArmRecv(raw);
  // Handshake limit.
  __kernel_timespec ts = TimespecNs(uint64_t{server_->options_.handshake_timeout_ms} * 1000000);
  io_uring_sqe* sqe = ring_.Sqe();
  io_uring_prep_timeout(sqe, &ts, 0, 0);
  io_uring_sqe_set_data64(sqe, MakeData(id, kTagHandshakeTimer));
  ring_.Submit();  // The timespec is read at submission.
}

void ServerIoThread::ArmRecv(Conn* c) {
  // A connection closing after its last reply reads nothing more: its unprocessed bytes stay
  // in the window, which may be full (a full window cannot take a recv).
  if (c->closing || c->close_after_send) return;
  c->io.ArmRecv(ring_, MakeData(c->peer.connection_id, kTagRecv));
}

void ServerIoThread::OnRecv(Conn* c, int res) {
  if (c->closing) return;
  if (res == 0) {
    if (c->io.in.buffered() > 0) {
      Close(c, "peer closed the connection in the middle of a frame", LogLevel::kWarning);
    } else {
      Close(c, "peer closed the connection", LogLevel::kDebug);
    }
    return;
  }
  if (res < 0) {
    if (res == -EINTR || res == -EAGAIN) {
      ArmRecv(c);
      return;
    }
    Close(c, std::string("recv: ") + strerror(-res), LogLevel::kInfo);
    return;
  }
  c->io.in.Commit(static_cast<size_t>(res));
  ProcessInput(c);
  if (c->closing) return;
  // Back-pressure: a peer that does not take its replies gets no more requests read.
  if (RepliesUnderBound(c)) {
    ArmRecv(c);
  } else {
    server_->reply_pauses_.fetch_add(1, std::memory_order_relaxed);
  }
  Flush(c);
}

bool ServerIoThread::RepliesUnderBound(const Conn* c) const {
  return c->io.queued_bytes() < server_->options_.max_queued_reply_bytes;
}

void ServerIoThread::ProcessInput(Conn* c) {
  while (!c->closing && !c->close_after_send && RepliesUnderBound(c)) {
    if (!c->ready) {
      // Before AUTH, refuse a frame by its header: no window grows for an unauthenticated peer.
      auto header = c->io.in.PeekHeader(Direction::kRequest);
      if (!header.ok()) {
        Close(c, "malformed frame: " + header.status().message(), LogLevel::kWarning);
        return;
      }
      if (!header->has_value()) break;
      const FrameHeader& h = **header;
      if (h.op != Op::kHello && h.op != Op::kAuth) {
        Close(c, OpName(h.op) + " before authentication", LogLevel::kWarning);
        return;
      }
      if (kHeaderSize + h.payload_len > kPreAuthRecvBuffer) {
        Close(c,
              OpName(h.op) + " header claims " + std::to_string(h.payload_len) +
                  " payload bytes, more than a handshake frame",
              LogLevel::kWarning);
        return;
      }
    }
    auto next = c->io.in.Next(Direction::kRequest);
    if (!next.ok()) {
      Close(c, "malformed frame: " + next.status().message(), LogLevel::kWarning);
      return;
    }
    if (!next->has_value()) break;  // The rest of the frame is still on its way.
    const FrameReader::Frame& raw = **next;
    auto frame = ParseFrame(c->io.in.FrameBytes(raw), Direction::kRequest);
    if (!frame.ok()) {
      Close(c, "malformed frame: " + frame.status().message(), LogLevel::kWarning);
      return;
    }
    Dispatch(c, *frame);
    c->io.in.Consume(raw);
  }
}

void ServerIoThread::Dispatch(Conn* c, const ParsedFrame& f) {
  const FrameHeader& h = f.header;
  if (!c->ready) {
    ServerHandshake::Step step = c->handshake.OnFrame(f, server_->handshake_, c->io.pending);
    switch (step.outcome) {
      case ServerHandshake::Outcome::kContinue:
        return;
      case ServerHandshake::Outcome::kAuthenticated:
        c->ready = true;
        // Authenticated: the full receive window (frames up to kMaxDataLength grow it further).
        c->io.in.Reserve(FramedConnection::kInitialRecvBuffer);
        c->peer.client_id = c->handshake.client_id();
        c->peer.owner_id = c->handshake.owner_id();
        c->peer.admin = c->handshake.role() == Role::kAdmin;
        server_->handler_->OnConnect(c->peer);
        return;
      case ServerHandshake::Outcome::kReplyThenClose:
        if (!step.reason.empty()) {
          TLOG(WARNING) << "connection " << c->peer.connection_id << " from " << c->peer.address
                        << ": " << step.reason;
        }
        c->close_after_send = true;
        return;
      case ServerHandshake::Outcome::kClose:
        Close(c, step.reason, LogLevel::kWarning);
        return;
    }
    return;
  }
  if (h.op == Op::kHello || h.op == Op::kAuth) {
    Close(c, OpName(h.op) + " after authentication", LogLevel::kWarning);
    return;
  }
  if (h.op == Op::kGoodbye) {
    AppendOk(c->io.pending, Op::kGoodbye, h.request_id);
    c->close_after_send = true;
    return;
  }
  // A vectored op is governed like the single-range op it batches (fault injection, ...).
  const Op policy_op = h.op == Op::kReadV ? Op::kRead : (h.op == Op::kWriteV ? Op::kWrite : h.op);
  OpPolicy policy = server_->handler_->BeforeOp(c->peer, policy_op);
  switch (policy.action) {
    case OpPolicy::Action::kProceed:
      Execute(c, f, c->io.pending);
      return;
    case OpPolicy::Action::kHang:
      return;
    case OpPolicy::Action::kDrop:
      Close(c, "dropped by fault policy at " + OpName(h.op), LogLevel::kInfo);
      return;
    case OpPolicy::Action::kDelay: {
      auto d = std::make_unique<Delayed>();
      d->conn_id = c->peer.connection_id;
      Execute(c, f, d->bytes);
      uint64_t id = next_delay_id_++;
      __kernel_timespec ts = TimespecNs(policy.delay_ns);
      io_uring_sqe* sqe = ring_.Sqe();
      io_uring_prep_timeout(sqe, &ts, 0, 0);
      io_uring_sqe_set_data64(sqe, MakeData(id, kTagDelay));
      ring_.Submit();  // The timespec is read at submission.
      delayed_.emplace(id, std::move(d));
      return;
    }
  }
}

void ServerIoThread::Execute(Conn* c, const ParsedFrame& f, ByteBuffer& out) {
  RequestHandler* handler = server_->handler_;
  const FrameHeader& h = f.header;
  if (IsServiceOp(h.op)) return ExecuteService(c, f, out);
  switch (h.op) {
    case Op::kRead: {
      const auto& req = std::get<ReadRequest>(f.body);
      auto mem = handler->ResolveRead(c->peer, req);
      if (!mem.ok()) return AppendError(out, h.op, h.request_id, mem.status());
      if (mem->size() != req.length) {
        return AppendError(out, h.op, h.request_id,
                           Internal("handler resolved ", mem->size(), " bytes for a READ of ",
                                    req.length));
      }
      return AppendBytes(out, h.op, h.request_id, *mem);
    }
    case Op::kWrite: {
      const auto& req = std::get<WriteRequest>(f.body);
      auto mem = handler->ResolveWrite(c->peer, req);
      if (!mem.ok()) return AppendError(out, h.op, h.request_id, mem.status());
      if (mem->size() != req.length) {
        return AppendError(out, h.op, h.request_id,
                           Internal("handler resolved ", mem->size(), " bytes for a WRITE of ",
                                    req.length));
      }
      std::memcpy(mem->data(), f.data.data(), req.length);
      return AppendOk(out, h.op, h.request_id);
    }
    case Op::kReadV:
    case Op::kWriteV:
      return ExecuteVector(c, f, out);
    case Op::kAllocSlab: {
      auto r = handler->AllocSlab(c->peer, std::get<AllocSlabRequest>(f.body));
      if (!r.ok()) return AppendError(out, h.op, h.request_id, r.status());
      return AppendBody(out, h.op, h.request_id, *r);
    }
    case Op::kFreeSlab: {
      Status st = handler->FreeSlab(c->peer, std::get<FreeSlabRequest>(f.body));
      if (!st.ok()) return AppendError(out, h.op, h.request_id, st);
      return AppendOk(out, h.op, h.request_id);
    }
    case Op::kStats: {
      auto r = handler->Stats(c->peer);
      if (!r.ok()) return AppendError(out, h.op, h.request_id, r.status());
      std::string_view text = *r;
      if (text.size() > kMaxDataLength) text = text.substr(0, kMaxDataLength);
      return AppendBytes(out, h.op, h.request_id,
                         {reinterpret_cast<const uint8_t*>(text.data()), text.size()});
    }
    case Op::kHeartbeat: {
      auto r = handler->Heartbeat(c->peer);
      if (!r.ok()) return AppendError(out, h.op, h.request_id, r.status());
      return AppendBody(out, h.op, h.request_id, *r);
    }
    case Op::kInvoke: {
      const auto& req = std::get<InvokeRequest>(f.body);
      auto r = handler->Invoke(c->peer, req.function_id, f.data);
      if (!r.ok()) return AppendError(out, h.op, h.request_id, r.status());
      if (r->size() > kMaxDataLength) {
        return AppendError(out, h.op, h.request_id,
                           Internal("INVOKE result of ", r->size(), " bytes exceeds ",
                                    kMaxDataLength));
      }
      return AppendBytes(out, h.op, h.request_id, *r);
    }
    case Op::kFault: {
      Status st = handler->Fault(c->peer, std::get<FaultRequest>(f.body));
      if (!st.ok()) return AppendError(out, h.op, h.request_id, st);
      return AppendOk(out, h.op, h.request_id);
    }
    case Op::kHello:
    case Op::kAuth:
    case Op::kNotice:
    case Op::kGoodbye:
      break;
  }
  AppendError(out, h.op, h.request_id, Internal("op ", OpName(h.op), " reached Execute"));
}

// A service op goes to the service registered for it (Server::RegisterService); an op no
// service took is refused with a reply, and the connection goes on.
void ServerIoThread::ExecuteService(Conn* c, const ParsedFrame& f, ByteBuffer& out) {
  const FrameHeader& h = f.header;
  ServiceHandler* service = server_->ServiceFor(h.op);
  if (service == nullptr) {
    return AppendError(out, h.op, h.request_id,
                       Unsupported(OpName(h.op), ": no service on this server handles op ",
                                   static_cast<unsigned>(h.op), " (",
                                   server_->ServiceNames(), ")"));
  }
  auto r = service->HandleRequest(
      c->peer, h.op, f.data,
      AsyncReply(reply_channel_, c->peer.connection_id, h.op, h.request_id));
  if (!r) return;  // Answered later through the AsyncReply.
  if (!r->ok()) return AppendError(out, h.op, h.request_id, r->status());
  AppendBytes(out, h.op, h.request_id, **r);
}

// READV / WRITEV: every range is resolved (ownership and bounds checked by the handler) before
// any byte moves, so a bad range fails the whole request and writes nothing.
void ServerIoThread::ExecuteVector(Conn* c, const ParsedFrame& f, ByteBuffer& out) {
  RequestHandler* handler = server_->handler_;
  const FrameHeader& h = f.header;
  const auto& v = std::get<VectorRequest>(f.body);
  const bool write = h.op == Op::kWriteV;
  std::array<std::span<uint8_t>, kMaxVectorRanges> mem;
  for (uint32_t i = 0; i < v.count; ++i) {
    const VectorRange r = VectorRangeAt(f.data, i);
    auto m = write ? handler->ResolveWrite(c->peer, WriteRequest{r.slab_id, r.offset, r.length})
                   : handler->ResolveRead(c->peer, ReadRequest{r.slab_id, r.offset, r.length});
    if (!m.ok()) {
      return AppendError(out, h.op, h.request_id,
                         m.status().WithContext(OpName(h.op) + " range " + std::to_string(i)));
    }
    if (m->size() != r.length) {
      return AppendError(out, h.op, h.request_id,
                         Internal("handler resolved ", m->size(), " bytes for a range of ",
                                  r.length));
    }
    mem[i] = *m;
  }
  if (write) {
    const uint8_t* src = f.data.data() + size_t{v.count} * VectorRange::kWireSize;
    for (uint32_t i = 0; i < v.count; ++i) {
      std::memcpy(mem[i].data(), src, mem[i].size());
      src += mem[i].size();
    }
    return AppendOk(out, h.op, h.request_id);
  }
  uint8_t* p = AppendFrameHeader(out, h.op, true, h.request_id, StatusCode::kOk, v.total_length);
  for (uint32_t i = 0; i < v.count; ++i) {
    std::memcpy(p, mem[i].data(), mem[i].size());
    p += mem[i].size();
  }
}

void ServerIoThread::Flush(Conn* c) {
  if (c->closing) return;
  if (c->io.Flush(ring_, MakeData(c->peer.connection_id, kTagSend)) ==
          FramedConnection::FlushResult::kIdle &&
      c->close_after_send) {
    Close(c, "closed after the last reply", LogLevel::kDebug);
  }
}

void ServerIoThread::OnSend(Conn* c, int res) {
  if (c->closing) return;
  if (res < 0 && res != -EINTR && res != -EAGAIN) {
    Close(c, std::string("send: ") + strerror(-res), LogLevel::kInfo);
    return;
  }
  Flush(c);
  // Reading stopped at the reply bound: resume once the replies drained below it (requests
  // already buffered run first).
  if (!c->closing && !c->io.recv_armed() && RepliesUnderBound(c)) {
    ProcessInput(c);
    if (c->closing) return;
    if (RepliesUnderBound(c)) ArmRecv(c);
    Flush(c);
  }
}

void ServerIoThread::Close(Conn* c, const std::string& reason, LogLevel level) {
  if (c->closing) return;
  c->closing = true;
  if (level == LogLevel::kWarning) {
    TLOG(WARNING) << "closing connection " << c->peer.connection_id << " from "
                  << c->peer.address << ": " << reason;
  } else if (level == LogLevel::kInfo) {
    TLOG(INFO) << "closing connection " << c->peer.connection_id << " from " << c->peer.address
               << ": " << reason;
  } else {
    TLOG(DEBUG) << "closing connection " << c->peer.connection_id << ": " << reason;
  }
  c->io.Shutdown();
  if (c->ready) {
    server_->ReleaseClientSlot(c->peer.client_id);
    server_->handler_->OnDisconnect(c->peer);
  }
  if (c->handshake.rdma_token() != 0 && server_->verbs_) {
    server_->verbs_->RevokeToken(c->handshake.rdma_token());
  }
}

// Frees a closed connection once the kernel holds none of its buffers.
void ServerIoThread::MaybeFree(Conn* c) {
  if (!c->closing || c->io.ops_in_kernel() > 0) return;
  conns_.erase(c->peer.connection_id);
  server_->open_connections_.fetch_sub(1);
}

void ServerIoThread::OnEvent() {
  std::deque<Command> cmds;
  {
    std::lock_guard<std::mutex> lock(mu_);
    cmds.swap(commands_);
  }
  for (Command& cmd : cmds) {
    switch (cmd.kind) {
      case Command::Kind::kNotice:
        for (auto& [id, c] : conns_) {
          if (c->closing || !c->ready) continue;
          if (cmd.client_id && c->peer.owner_id != *cmd.client_id &&
              c->peer.client_id != *cmd.client_id) {
            continue;
          }
          AppendBody(c->io.pending, Op::kNotice, 0, cmd.notice);
          Flush(c.get());
        }
        break;
      case Command::Kind::kDisconnect: {
        std::vector<Conn*> victims;
        for (auto& [id, c] : conns_) {
          if (c->ready &&
              (c->peer.client_id == *cmd.client_id || c->peer.owner_id == *cmd.client_id)) {
            victims.push_back(c.get());
          }
        }
        for (Conn* c : victims) {
          Close(c, "disconnected by the server", LogLevel::kInfo);
          MaybeFree(c);
        }
        break;
      }
      case Command::Kind::kStop:
        BeginStop(cmd.grace_deadline_ns);
        break;
      case Command::Kind::kReply: {
        Conn* c = Find(cmd.connection_id);
        if (c == nullptr || c->closing) break;  // The client went away meanwhile.
        if (cmd.reply.ok()) {
          AppendBytes(c->io.pending, cmd.op, cmd.request_id, *cmd.reply);
        } else {
          AppendError(c->io.pending, cmd.op, cmd.request_id, cmd.reply.status());
        }
        Flush(c);
        break;
      }
    }
  }
}

void ServerIoThread::BeginStop(uint64_t grace_deadline_ns) {
  if (stopping_) return;
  stopping_ = true;
  grace_deadline_ns_ = grace_deadline_ns;
  ::shutdown(listen_fd_.get(), SHUT_RDWR);  // Ends the multishot accept.
  if (accept_armed_) {
    io_uring_sqe* sqe = ring_.Sqe();
    io_uring_prep_cancel64(sqe, MakeData(0, kTagAccept), 0);
    io_uring_sqe_set_data64(sqe, MakeData(0, kTagIgnore));
  }
  Notice bye;
  bye.kind = NoticeKind::kShuttingDown;
  std::vector<Conn*> all;
  for (auto& [id, c] : conns_) all.push_back(c.get());
  for (Conn* c : all) {
    if (c->closing) continue;
    if (c->ready) {
      AppendBody(c->io.pending, Op::kNotice, 0, bye);
      c->close_after_send = true;
      Flush(c);
    } else {
      Close(c, "server stopping", LogLevel::kDebug);
    }
    MaybeFree(c);
  }
  // Wake up the loop periodically so the grace deadline is noticed.
  ArmStopTick();
}

void ServerIoThread::ArmStopTick() {
  if (tick_armed_) return;
  tick_armed_ = true;
  __kernel_timespec ts = TimespecNs(10 * 1000 * 1000);
  io_uring_sqe* sqe = ring_.Sqe();
  io_uring_prep_timeout(sqe, &ts, 0, 0);
  io_uring_sqe_set_data64(sqe, MakeData(0, kTagStopTick));
  ring_.Submit();
}

void ServerIoThread::StopStep() {
  if (MonotonicNs() < grace_deadline_ns_) {
    if (!conns_.empty()) ArmStopTick();
    return;
  }
  std::vector<Conn*> all;
  for (auto& [id, c] : conns_) all.push_back(c.get());
  for (Conn* c : all) {
    Close(c, "server stopping (grace period over)", LogLevel::kDebug);
    MaybeFree(c);
  }
  if (!conns_.empty() || accept_armed_) ArmStopTick();
}

}  // namespace tessera::fabric
