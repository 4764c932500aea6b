// The io_uring TCP server engine (see fabric/server.h).
//
// Each I/O thread runs one io_uring with: a multishot accept on its own SO_REUSEPORT listening
// socket, one recv per connection into that connection's input buffer, at most one send per
// connection (replies produced while it is in flight collect in a second buffer and go out as
// one send next), timeouts for delayed replies and handshake limits, and a read on an eventfd
// through which other threads hand in notices, disconnects and the stop request. A connection
// is freed only once none of its operations is in the kernel.
#include "fabric/server.h"

#include <arpa/inet.h>
#include <liburing.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "common/fd.h"
#include "common/logging.h"
#include "fabric/auth.h"
#include "fabric/byte_buffer.h"
#include "fabric/frame_reader.h"
#include "fabric/verbs.h"

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

constexpr size_t kInitialRecvBuffer = 256 * 1024;

std::string FormatAddress(const sockaddr_storage& ss) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (ss.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &in->sin_addr, buf, sizeof(buf));
    return std::string(buf) + ":" + std::to_string(ntohs(in->sin_port));
  }
  if (ss.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &in6->sin6_addr, buf, sizeof(buf));
    return "[" + std::string(buf) + "]:" + std::to_string(ntohs(in6->sin6_port));
  }
  return "unknown";
}

Result<UniqueFd> BindListener(const std::string& host, uint16_t port, bool reuseport) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  std::string port_str = std::to_string(port);
  int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), port_str.c_str(), &hints, &res);
  if (rc != 0) return InvalidArgument("cannot resolve listen host '", host, "': ", gai_strerror(rc));
  Status last = Unavailable("no address for '", host, "'");
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    UniqueFd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
    if (!fd) {
      last = ErrnoError("socket");
      continue;
    }
    int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (reuseport && ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one)) != 0) {
      last = ErrnoError("setsockopt(SO_REUSEPORT)");
      continue;
    }
    if (::bind(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
      last = ErrnoError("bind ", host, ":", port);
      continue;
    }
    if (::listen(fd.get(), 1024) != 0) {
      last = ErrnoError("listen");
      continue;
    }
    freeaddrinfo(res);
    return fd;
  }
  freeaddrinfo(res);
  return last;
}

uint16_t BoundPort(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return 0;
  if (ss.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  if (ss.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
  return 0;
}

// A request handed to an I/O thread by another thread.
struct Command {
  enum class Kind { kNotice, kDisconnect, kStop } kind;
  std::optional<uint64_t> client_id;
  Notice notice;
  uint64_t grace_deadline_ns = 0;
};

}  // namespace

class Server::Impl {
 public:
  struct Conn {
    enum class State { kHello, kAuth, kReady };
    UniqueFd fd;
    PeerInfo peer;
    State state = State::kHello;
    bool closing = false;
    bool close_after_send = false;
    int ops_in_kernel = 0;
    bool recv_armed = false;
    bool send_armed = false;
    FrameReader in;
    ByteBuffer pending;  // Replies not yet handed to the kernel.
    ByteBuffer sending;  // The buffer of the send in flight.
    size_t send_off = 0;
    HandshakeTranscript transcript;
    uint64_t rdma_token = 0;
  };

  struct Delayed {
    uint64_t conn_id;
    ByteBuffer bytes;
  };

  class IoThread {
   public:
    IoThread(Impl* server, int index, UniqueFd listen_fd)
        : server_(server), index_(index), listen_fd_(std::move(listen_fd)) {}
    ~IoThread() {
      if (ring_ready_) io_uring_queue_exit(&ring_);
    }

    Status Init(uint32_t entries) {
      event_fd_.Reset(::eventfd(0, EFD_CLOEXEC));
      if (!event_fd_) return ErrnoError("eventfd");
      // Created disabled here and enabled by the I/O thread, which thereby becomes the ring's
      // single issuer; task work is then deferred until that thread enters the kernel to wait
      // (no interrupts, completions handled in batches). Older kernels: cooperative task run.
      io_uring_params params{};
      params.flags = IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN |
                     IORING_SETUP_R_DISABLED;
      int rc = io_uring_queue_init_params(entries, &ring_, &params);
      ring_disabled_ = rc >= 0;
      if (rc < 0) {
        params = io_uring_params{};
        params.flags = IORING_SETUP_COOP_TASKRUN;
        rc = io_uring_queue_init_params(entries, &ring_, &params);
      }
      if (rc < 0) {
        params = io_uring_params{};
        rc = io_uring_queue_init_params(entries, &ring_, &params);
      }
      if (rc < 0) {
        errno = -rc;
        return ErrnoError("io_uring_queue_init(", entries, ")");
      }
      ring_ready_ = true;
      return Status::Ok();
    }

    void Start() {
      thread_ = std::thread([this] { Run(); });
    }
    void Join() {
      if (thread_.joinable()) thread_.join();
    }

    void Enqueue(Command c) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        commands_.push_back(std::move(c));
      }
      uint64_t one = 1;
      ssize_t n = ::write(event_fd_.get(), &one, sizeof(one));
      (void)n;  // An eventfd write only fails when the counter would overflow: still woken.
    }

   private:
    io_uring_sqe* Sqe() {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      while (sqe == nullptr) {
        io_uring_submit(&ring_);
        sqe = io_uring_get_sqe(&ring_);
      }
      return sqe;
    }

    void ArmAccept() {
      io_uring_sqe* sqe = Sqe();
      io_uring_prep_multishot_accept(sqe, listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC);
      io_uring_sqe_set_data64(sqe, MakeData(0, kTagAccept));
      accept_armed_ = true;
    }

    void ArmEvent() {
      io_uring_sqe* sqe = Sqe();
      io_uring_prep_read(sqe, event_fd_.get(), &event_buf_, sizeof(event_buf_), 0);
      io_uring_sqe_set_data64(sqe, MakeData(0, kTagEvent));
      event_armed_ = true;
    }

    void Run() {
      if (ring_disabled_) {
        // io_uring_enable_rings() is declared but not exported by liburing 2.3.
        if (::syscall(__NR_io_uring_register, ring_.ring_fd, IORING_REGISTER_ENABLE_RINGS,
                      nullptr, 0) < 0) {
          TCHECK(false) << "io_uring_register(ENABLE_RINGS): " << strerror(errno);
        }
        ring_disabled_ = false;
      }
      ArmAccept();
      ArmEvent();
      while (true) {
        int rc = io_uring_submit_and_wait(&ring_, 1);
        if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
          TLOG(ERROR) << "io_uring_submit_and_wait: " << strerror(-rc);
        }
        io_uring_cqe* cqes[256];
        unsigned n;
        while ((n = io_uring_peek_batch_cqe(&ring_, cqes, 256)) > 0) {
          for (unsigned i = 0; i < n; ++i) {
            uint64_t data = io_uring_cqe_get_data64(cqes[i]);
            int res = cqes[i]->res;
            uint32_t flags = cqes[i]->flags;
            io_uring_cqe_seen(&ring_, cqes[i]);
            HandleCqe(data, res, flags);
          }
        }
        if (stopping_ && conns_.empty() && !accept_armed_ && !event_armed_) break;
        if (stopping_) StopStep();
      }
      // Every connection is gone; the ring's only remaining ops are timeouts, which reference
      // no user memory. ~IoThread exits the ring.
    }

    void HandleCqe(uint64_t data, int res, uint32_t flags) {
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
          c->ops_in_kernel--;
          c->recv_armed = false;
          OnRecv(c, res);
          MaybeFree(c);
          break;
        }
        case kTagSend: {
          Conn* c = Find(id);
          if (!c) break;
          c->ops_in_kernel--;
          c->send_armed = false;
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
            std::memcpy(c->pending.Append(d->bytes.size()), d->bytes.data(), d->bytes.size());
            Flush(c);
          }
          break;
        }
        case kTagHandshakeTimer: {
          Conn* c = Find(id);
          if (c && !c->closing && c->state != Conn::State::kReady) {
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

    Conn* Find(uint64_t id) {
      auto it = conns_.find(id);
      return it == conns_.end() ? nullptr : it->second.get();
    }

    void OnAccept(UniqueFd fd) {
      if (stopping_) return;
      if (server_->open_connections_.load() >= server_->options_.max_connections) {
        TLOG(WARNING) << "refusing a connection: max_connections ("
                      << server_->options_.max_connections << ") reached";
        return;
      }
      int one = 1;
      ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      auto c = std::make_unique<Conn>();
      uint64_t id = server_->next_conn_id_.fetch_add(1);
      sockaddr_storage ss{};
      socklen_t len = sizeof(ss);
      ::getpeername(fd.get(), reinterpret_cast<sockaddr*>(&ss), &len);
      c->peer.connection_id = id;
      c->peer.address = FormatAddress(ss);
      c->peer.io_thread = index_;
      c->fd = std::move(fd);
      c->in = FrameReader(kInitialRecvBuffer);
      Conn* raw = c.get();
      conns_.emplace(id, std::move(c));
      server_->open_connections_.fetch_add(1);
      ArmRecv(raw);
      // Handshake limit.
      __kernel_timespec ts{};
      uint64_t ms = server_->options_.handshake_timeout_ms;
      ts.tv_sec = static_cast<int64_t>(ms / 1000);
      ts.tv_nsec = static_cast<int64_t>((ms % 1000) * 1000000);
      io_uring_sqe* sqe = Sqe();
      io_uring_prep_timeout(sqe, &ts, 0, 0);
      io_uring_sqe_set_data64(sqe, MakeData(id, kTagHandshakeTimer));
      io_uring_submit(&ring_);  // The timespec is read at submission.
    }

    void ArmRecv(Conn* c) {
      if (c->closing || c->recv_armed) return;
      std::span<uint8_t> space = c->in.RecvSpace();
      io_uring_sqe* sqe = Sqe();
      io_uring_prep_recv(sqe, c->fd.get(), space.data(), space.size(), 0);
      io_uring_sqe_set_data64(sqe, MakeData(c->peer.connection_id, kTagRecv));
      c->recv_armed = true;
      c->ops_in_kernel++;
    }

    void OnRecv(Conn* c, int res) {
      if (c->closing) return;
      if (res == 0) {
        if (c->in.buffered() > 0) {
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
      c->in.Commit(static_cast<size_t>(res));
      ProcessInput(c);
      if (c->closing) return;
      ArmRecv(c);
      Flush(c);
    }

    void ProcessInput(Conn* c) {
      while (!c->closing && !c->close_after_send) {
        auto next = c->in.Next(Direction::kRequest);
        if (!next.ok()) {
          Close(c, "malformed frame: " + next.status().message(), LogLevel::kWarning);
          return;
        }
        if (!next->has_value()) break;  // The rest of the frame is still on its way.
        const FrameReader::Frame& raw = **next;
        auto frame = ParseFrame(c->in.FrameBytes(raw), Direction::kRequest);
        if (!frame.ok()) {
          Close(c, "malformed frame: " + frame.status().message(), LogLevel::kWarning);
          return;
        }
        Dispatch(c, *frame);
        c->in.Consume(raw);
      }
    }

    // ---- replies ----

    // Appends a response header and reserves its payload; returns the payload's start.
    static uint8_t* AppendHeader(ByteBuffer& out, Op op, uint64_t request_id, StatusCode status,
                                 uint32_t payload_len) {
      uint8_t* p = out.Append(kHeaderSize + payload_len);
      FrameHeader h{op, true, request_id, status, payload_len};
      EncodeHeader(h, p);
      return p + kHeaderSize;
    }
    template <typename Body>
    static void AppendBody(ByteBuffer& out, Op op, uint64_t request_id, const Body& body) {
      body.EncodeTo(AppendHeader(out, op, request_id, StatusCode::kOk, Body::kWireSize));
    }
    static void AppendBytes(ByteBuffer& out, Op op, uint64_t request_id,
                            std::span<const uint8_t> data) {
      uint8_t* p =
          AppendHeader(out, op, request_id, StatusCode::kOk, static_cast<uint32_t>(data.size()));
      if (!data.empty()) std::memcpy(p, data.data(), data.size());
    }
    static void AppendError(ByteBuffer& out, Op op, uint64_t request_id, const Status& st) {
      std::string_view msg = st.message();
      if (msg.size() > kMaxErrorMessageLength) msg = msg.substr(0, kMaxErrorMessageLength);
      StatusCode code = st.ok() ? StatusCode::kInternal : st.code();
      uint8_t* p = AppendHeader(out, op, request_id, code, static_cast<uint32_t>(msg.size()));
      if (!msg.empty()) std::memcpy(p, msg.data(), msg.size());
    }

    void Dispatch(Conn* c, const ParsedFrame& f) {
      const FrameHeader& h = f.header;
      switch (c->state) {
        case Conn::State::kHello: {
          if (h.op != Op::kHello) {
            Close(c, OpName(h.op) + " before HELLO", LogLevel::kWarning);
            return;
          }
          const auto& hello = std::get<HelloRequest>(f.body);
          if (hello.min_version > kProtocolVersion || hello.max_version < kProtocolVersion) {
            AppendError(c->pending, Op::kHello, h.request_id,
                        Unsupported("client speaks protocol versions ", hello.min_version, "..",
                                    hello.max_version, "; this server speaks ", kProtocolVersion));
            c->close_after_send = true;
            return;
          }
          c->transcript.client_nonce = hello.client_nonce;
          c->transcript.client_id = hello.client_id;
          c->transcript.server_id = server_->server_id_;
          Status st = RandomBytes(c->transcript.server_nonce);
          if (!st.ok()) {
            AppendError(c->pending, Op::kHello, h.request_id, st);
            c->close_after_send = true;
            return;
          }
          ChallengeResponse ch;
          ch.server_nonce = c->transcript.server_nonce;
          ch.server_id = server_->server_id_;
          AppendBody(c->pending, Op::kHello, h.request_id, ch);
          c->state = Conn::State::kAuth;
          return;
        }
        case Conn::State::kAuth: {
          if (h.op != Op::kAuth) {
            Close(c, OpName(h.op) + " before AUTH", LogLevel::kWarning);
            return;
          }
          const auto& auth = std::get<AuthRequest>(f.body);
          Mac want = ClientMac(server_->options_.secret, c->transcript);
          if (!MacEqual(want, auth.client_mac)) {
            TLOG(WARNING) << "connection " << c->peer.connection_id << " from "
                          << c->peer.address << " (client_id " << c->transcript.client_id
                          << "): authentication failed (wrong secret)";
            AppendError(c->pending, Op::kAuth, h.request_id,
                        PermissionDenied("authentication failed: the client's MAC does not match "
                                         "this server's secret"));
            c->close_after_send = true;
            return;
          }
          AuthOkResponse ok;
          ok.server_mac = ServerMac(server_->options_.secret, c->transcript);
          ok.slab_size = server_->options_.slab_size;
          ok.capacity_bytes = server_->options_.capacity_bytes;
          if (server_->verbs_ && server_->verbs_started_) {
            ok.flags = AuthOkResponse::kRdmaOffered;
            ok.rdma_port = server_->verbs_->port();
            ok.rdma_host = server_->options_.host;
            c->rdma_token = server_->verbs_->IssueToken();
            ok.rdma_token = c->rdma_token;
          }
          AppendBody(c->pending, Op::kAuth, h.request_id, ok);
          c->state = Conn::State::kReady;
          c->peer.client_id = c->transcript.client_id;
          server_->handler_->OnConnect(c->peer);
          return;
        }
        case Conn::State::kReady:
          break;
      }
      if (h.op == Op::kHello || h.op == Op::kAuth) {
        Close(c, OpName(h.op) + " after authentication", LogLevel::kWarning);
        return;
      }
      if (h.op == Op::kGoodbye) {
        AppendHeader(c->pending, Op::kGoodbye, h.request_id, StatusCode::kOk, 0);
        c->close_after_send = true;
        return;
      }
      // A vectored op is governed like the single-range op it batches (fault injection, ...).
      const Op policy_op =
          h.op == Op::kReadV ? Op::kRead : (h.op == Op::kWriteV ? Op::kWrite : h.op);
      OpPolicy policy = server_->handler_->BeforeOp(c->peer, policy_op);
      switch (policy.action) {
        case OpPolicy::Action::kProceed:
          Execute(c, f, c->pending);
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
          __kernel_timespec ts{};
          ts.tv_sec = static_cast<int64_t>(policy.delay_ns / 1000000000ull);
          ts.tv_nsec = static_cast<int64_t>(policy.delay_ns % 1000000000ull);
          io_uring_sqe* sqe = Sqe();
          io_uring_prep_timeout(sqe, &ts, 0, 0);
          io_uring_sqe_set_data64(sqe, MakeData(id, kTagDelay));
          io_uring_submit(&ring_);  // The timespec is read at submission.
          delayed_.emplace(id, std::move(d));
          return;
        }
      }
    }

    void Execute(Conn* c, const ParsedFrame& f, ByteBuffer& out) {
      RequestHandler* handler = server_->handler_;
      const FrameHeader& h = f.header;
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
          AppendHeader(out, h.op, h.request_id, StatusCode::kOk, 0);
          return;
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
          AppendHeader(out, h.op, h.request_id, StatusCode::kOk, 0);
          return;
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
          AppendHeader(out, h.op, h.request_id, StatusCode::kOk, 0);
          return;
        }
        case Op::kHello:
        case Op::kAuth:
        case Op::kNotice:
        case Op::kGoodbye:
          break;
      }
      AppendError(out, h.op, h.request_id, Internal("op ", OpName(h.op), " reached Execute"));
    }

    // READV / WRITEV: every range is resolved (ownership and bounds checked by the handler)
    // before any byte moves, so a bad range fails the whole request and writes nothing.
    void ExecuteVector(Conn* c, const ParsedFrame& f, ByteBuffer& out) {
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
        AppendHeader(out, h.op, h.request_id, StatusCode::kOk, 0);
        return;
      }
      uint8_t* p = AppendHeader(out, h.op, h.request_id, StatusCode::kOk, v.total_length);
      for (uint32_t i = 0; i < v.count; ++i) {
        std::memcpy(p, mem[i].data(), mem[i].size());
        p += mem[i].size();
      }
    }

    void Flush(Conn* c) {
      if (c->closing || c->send_armed) return;
      if (c->sending.size() == c->send_off) {
        c->sending.clear();
        c->send_off = 0;
        if (c->pending.empty()) {
          if (c->close_after_send) Close(c, "closed after the last reply", LogLevel::kDebug);
          return;
        }
        swap(c->sending, c->pending);
      }
      io_uring_sqe* sqe = Sqe();
      io_uring_prep_send(sqe, c->fd.get(), c->sending.data() + c->send_off,
                         c->sending.size() - c->send_off, MSG_NOSIGNAL);
      io_uring_sqe_set_data64(sqe, MakeData(c->peer.connection_id, kTagSend));
      c->send_armed = true;
      c->ops_in_kernel++;
    }

    void OnSend(Conn* c, int res) {
      if (c->closing) return;
      if (res < 0) {
        if (res == -EINTR || res == -EAGAIN) {
          Flush(c);
          return;
        }
        Close(c, std::string("send: ") + strerror(-res), LogLevel::kInfo);
        return;
      }
      c->send_off += static_cast<size_t>(res);
      Flush(c);
    }

    void Close(Conn* c, const std::string& reason, LogLevel level) {
      if (c->closing) return;
      c->closing = true;
      if (level == LogLevel::kWarning) {
        TLOG(WARNING) << "closing connection " << c->peer.connection_id << " from "
                      << c->peer.address << ": " << reason;
      } else if (level == LogLevel::kInfo) {
        TLOG(INFO) << "closing connection " << c->peer.connection_id << " from "
                   << c->peer.address << ": " << reason;
      } else {
        TLOG(DEBUG) << "closing connection " << c->peer.connection_id << ": " << reason;
      }
      ::shutdown(c->fd.get(), SHUT_RDWR);
      if (c->state == Conn::State::kReady) server_->handler_->OnDisconnect(c->peer);
      if (c->rdma_token != 0 && server_->verbs_) server_->verbs_->RevokeToken(c->rdma_token);
    }

    // Frees a closed connection once the kernel holds none of its buffers.
    void MaybeFree(Conn* c) {
      if (!c->closing || c->ops_in_kernel > 0) return;
      conns_.erase(c->peer.connection_id);
      server_->open_connections_.fetch_sub(1);
    }

    void OnEvent() {
      std::deque<Command> cmds;
      {
        std::lock_guard<std::mutex> lock(mu_);
        cmds.swap(commands_);
      }
      for (Command& cmd : cmds) {
        switch (cmd.kind) {
          case Command::Kind::kNotice:
            for (auto& [id, c] : conns_) {
              if (c->closing || c->state != Conn::State::kReady) continue;
              if (cmd.client_id && c->peer.client_id != *cmd.client_id) continue;
              AppendBody(c->pending, Op::kNotice, 0, cmd.notice);
              Flush(c.get());
            }
            break;
          case Command::Kind::kDisconnect: {
            std::vector<Conn*> victims;
            for (auto& [id, c] : conns_) {
              if (c->state == Conn::State::kReady && c->peer.client_id == *cmd.client_id) {
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
        }
      }
    }

    void BeginStop(uint64_t grace_deadline_ns) {
      if (stopping_) return;
      stopping_ = true;
      grace_deadline_ns_ = grace_deadline_ns;
      ::shutdown(listen_fd_.get(), SHUT_RDWR);  // Ends the multishot accept.
      if (accept_armed_) {
        io_uring_sqe* sqe = Sqe();
        io_uring_prep_cancel64(sqe, MakeData(0, kTagAccept), 0);
        io_uring_sqe_set_data64(sqe, MakeData(0, kTagIgnore));
      }
      Notice bye;
      bye.kind = NoticeKind::kShuttingDown;
      std::vector<Conn*> all;
      for (auto& [id, c] : conns_) all.push_back(c.get());
      for (Conn* c : all) {
        if (c->closing) continue;
        if (c->state == Conn::State::kReady) {
          AppendBody(c->pending, Op::kNotice, 0, bye);
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

    void ArmStopTick() {
      if (tick_armed_) return;
      tick_armed_ = true;
      __kernel_timespec ts{0, 10 * 1000 * 1000};
      io_uring_sqe* sqe = Sqe();
      io_uring_prep_timeout(sqe, &ts, 0, 0);
      io_uring_sqe_set_data64(sqe, MakeData(0, kTagStopTick));
      io_uring_submit(&ring_);
    }

    void StopStep() {
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

    Impl* server_;
    int index_;
    UniqueFd listen_fd_;
    UniqueFd event_fd_;
    io_uring ring_{};
    bool ring_ready_ = false;
    bool ring_disabled_ = false;
    std::thread thread_;
    std::mutex mu_;
    std::deque<Command> commands_;
    uint64_t event_buf_ = 0;
    bool accept_armed_ = false;
    bool event_armed_ = false;
    bool stopping_ = false;
    bool tick_armed_ = false;
    uint64_t grace_deadline_ns_ = 0;
    std::unordered_map<uint64_t, std::unique_ptr<Conn>> conns_;
    std::unordered_map<uint64_t, std::unique_ptr<Delayed>> delayed_;
    uint64_t next_delay_id_ = 1;
  };

  Impl(ServerOptions options, RequestHandler* handler)
      : options_(std::move(options)), handler_(handler) {}

  ~Impl() { Stop(Deadline::AfterMs(1000)); }

  Status Init() {
    if (handler_ == nullptr) return InvalidArgument("Server needs a RequestHandler");
    if (options_.secret.empty()) return InvalidArgument("Server needs a non-empty secret");
    if (options_.io_threads < 1 || options_.io_threads > 64) {
      return InvalidArgument("io_threads must be in 1..64, got ", options_.io_threads);
    }
    if (options_.ring_entries < 8 || options_.ring_entries > 32768) {
      return InvalidArgument("ring_entries must be in 8..32768, got ", options_.ring_entries);
    }
    if (options_.max_connections == 0) return InvalidArgument("max_connections must be > 0");
    if (options_.handshake_timeout_ms == 0) {
      return InvalidArgument("handshake_timeout_ms must be > 0");
    }
    server_id_ = options_.server_id;
    while (server_id_ == 0) {
      TESSERA_RETURN_IF_ERROR(
          RandomBytes({reinterpret_cast<uint8_t*>(&server_id_), sizeof(server_id_)}));
    }
    bool reuse = options_.io_threads > 1;
    uint16_t port = options_.port;
    for (int i = 0; i < options_.io_threads; ++i) {
      TESSERA_ASSIGN_OR_RETURN(UniqueFd fd, BindListener(options_.host, port, reuse));
      if (i == 0) port = BoundPort(fd.get());
      auto t = std::make_unique<IoThread>(this, i, std::move(fd));
      TESSERA_RETURN_IF_ERROR(t->Init(options_.ring_entries));
      threads_.push_back(std::move(t));
    }
    port_ = port;
    if (options_.enable_rdma) {
      auto listener = VerbsListener::Create(options_.host, options_.rdma_port);
      if (listener.ok()) {
        verbs_ = std::move(*listener);
      } else {
        TLOG(WARNING) << "RDMA requested but not available, serving TCP only: "
                      << listener.status().message();
      }
    }
    return Status::Ok();
  }

  Status Start() {
    if (started_.exchange(true)) return InvalidArgument("Server::Start called twice");
    if (verbs_) {
      Status st = verbs_->Start();
      if (st.ok()) {
        verbs_started_ = true;
      } else {
        TLOG(WARNING) << "verbs listener failed to start, serving TCP only: " << st.message();
      }
    }
    for (auto& t : threads_) t->Start();
    return Status::Ok();
  }

  void Stop(Deadline grace) {
    std::lock_guard<std::mutex> lock(stop_mu_);
    if (stopped_) return;
    stopped_ = true;
    if (started_) {
      for (auto& t : threads_) {
        Command c{Command::Kind::kStop, std::nullopt, Notice{}, grace.at_ns()};
        t->Enqueue(std::move(c));
      }
      for (auto& t : threads_) t->Join();
    }
    if (verbs_) verbs_->Stop();
    threads_.clear();
  }

  Status Notify(std::optional<uint64_t> client_id, const Notice& notice) {
    std::lock_guard<std::mutex> lock(stop_mu_);
    if (stopped_ || !started_) return Unavailable("server is not running");
    uint8_t check[Notice::kWireSize];
    notice.EncodeTo(check);
    TESSERA_RETURN_IF_ERROR(Notice::Decode(check).status());
    for (auto& t : threads_) t->Enqueue(Command{Command::Kind::kNotice, client_id, notice, 0});
    return Status::Ok();
  }

  Status Disconnect(uint64_t client_id) {
    std::lock_guard<std::mutex> lock(stop_mu_);
    if (stopped_ || !started_) return Unavailable("server is not running");
    for (auto& t : threads_) {
      t->Enqueue(Command{Command::Kind::kDisconnect, client_id, Notice{}, 0});
    }
    return Status::Ok();
  }

  Result<MemoryRegistration> RegisterMemory(void* addr, size_t length) {
    if (addr == nullptr || length == 0) return InvalidArgument("RegisterMemory: empty region");
    if (started_) return InvalidArgument("RegisterMemory must be called before Start()");
    if (verbs_) return verbs_->Register(addr, length);
    MemoryRegistration reg;
    reg.base_addr = reinterpret_cast<uint64_t>(addr);
    return reg;
  }

  ServerOptions options_;
  RequestHandler* handler_;
  uint64_t server_id_ = 0;
  uint16_t port_ = 0;
  std::vector<std::unique_ptr<IoThread>> threads_;
  std::unique_ptr<VerbsListener> verbs_;
  bool verbs_started_ = false;
  std::atomic<bool> started_{false};
  std::atomic<bool> stopped_{false};
  std::mutex stop_mu_;
  std::atomic<uint64_t> next_conn_id_{1};
  std::atomic<uint32_t> open_connections_{0};
};

Result<std::unique_ptr<Server>> Server::Create(ServerOptions options, RequestHandler* handler) {
  auto impl = std::make_unique<Impl>(std::move(options), handler);
  TESSERA_RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Server::~Server() { impl_->Stop(Deadline::AfterMs(1000)); }
Status Server::Start() { return impl_->Start(); }
void Server::Stop(Deadline grace) { impl_->Stop(grace); }
Status Server::Notify(std::optional<uint64_t> client_id, const Notice& notice) {
  return impl_->Notify(client_id, notice);
}
Status Server::Disconnect(uint64_t client_id) { return impl_->Disconnect(client_id); }
Result<MemoryRegistration> Server::RegisterMemory(void* addr, size_t length) {
  return impl_->RegisterMemory(addr, length);
}
const std::string& Server::host() const { return impl_->options_.host; }
uint16_t Server::port() const { return impl_->port_; }
bool Server::rdma_enabled() const { return impl_->verbs_started_; }
uint16_t Server::rdma_port() const { return impl_->verbs_ ? impl_->verbs_->port() : 0; }
uint64_t Server::server_id() const { return impl_->server_id_; }
uint32_t Server::connection_count() const { return impl_->open_connections_.load(); }

}  // namespace tessera::fabric
