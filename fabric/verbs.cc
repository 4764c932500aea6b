// RDMA verbs: ProbeRdma, the server-side VerbsListener and the client-side verbs Transport.
//
// Data path: one RC QP per server, RDMA READ/WRITE posted as one chained ibv_post_send per
// connection per batch, selectively signalled (every Nth WR and the last of a batch); an RC QP
// completes in order, so a signalled completion also completes every unsignalled WR before it.
// Authentication and notices travel over a ControlClient connection (the login) to the same
// server; the QP is bound to that login by the rdma_token from AUTH_OK. Control calls are the
// caller's own ControlClient's (fabric/control_client.h), not this transport's. Handles are RAII
// (fabric/verbs_handles.h); VerbsResources fixes the teardown order: QP, CQ, MR, PD (then the
// listening id, the event channel and the device list).
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <netdb.h>
#include <poll.h>
#include <rdma/rdma_cma.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <mutex>
#include <set>
#include <thread>
#include <unordered_map>

#include "common/coding.h"
#include "common/logging.h"
#include "fabric/auth.h"
#include "fabric/control_client.h"
#include "fabric/verbs.h"
#include "fabric/verbs_handles.h"

namespace tessera::fabric {
namespace {

// rdma_cm private data of a connect request: the login token and the client id.
constexpr size_t kPrivateDataSize = 16;

Status CmError(const char* what) { return ErrnoError(what); }

// Waits for the next rdma_cm event on `ch` of type `want` with a deadline.
Status WaitCmEvent(rdma_event_channel* ch, rdma_cm_event_type want, Deadline deadline,
                   const char* what) {
  while (true) {
    pollfd p{ch->fd, POLLIN, 0};
    int ms = deadline.RemainingMs();
    if (ms == 0) return Timeout(what, ": no rdma_cm event before the deadline");
    int rc = ::poll(&p, 1, ms);
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0) return ErrnoError("poll(rdma_cm channel)");
    if (rc == 0) return Timeout(what, ": no rdma_cm event before the deadline");
    rdma_cm_event* ev = nullptr;
    if (rdma_get_cm_event(ch, &ev) != 0) return CmError("rdma_get_cm_event");
    rdma_cm_event_type got = ev->event;
    int status = ev->status;
    rdma_ack_cm_event(ev);
    if (got == want) return Status::Ok();
    return Unavailable(what, ": rdma_cm reported ", rdma_event_str(got), " (status ", status,
                       ") instead of ", rdma_event_str(want));
  }
}

// Also returns when `wake_fd` (>= 0) is readable; true then.
bool WaitCompletionChannel(ibv_comp_channel* ch, int timeout_ms, int wake_fd) {
  pollfd p[2] = {{ch->fd, POLLIN, 0}, {wake_fd, POLLIN, 0}};
  int rc = ::poll(p, wake_fd >= 0 ? 2 : 1, timeout_ms);
  if (rc > 0 && (p[0].revents & POLLIN)) {
    ibv_cq* cq = nullptr;
    void* ctx = nullptr;
    if (ibv_get_cq_event(ch, &cq, &ctx) == 0) ibv_ack_cq_events(cq, 1);
  }
  return rc > 0 && wake_fd >= 0 && (p[1].revents & POLLIN) != 0;
}

Result<addrinfo*> Resolve(const std::string& host, uint16_t port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  addrinfo* res = nullptr;
  std::string p = std::to_string(port);
  int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), p.c_str(), &hints, &res);
  if (rc != 0) return InvalidArgument("cannot resolve '", host, "': ", gai_strerror(rc));
  return res;
}

}  // namespace

Status ProbeRdma() {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (list == nullptr) {
    return Unsupported("no RDMA device: ibv_get_device_list failed: ", strerror(errno));
  }
  if (n == 0) {
    ibv_free_device_list(list);
    return Unsupported("no RDMA device: ibv_get_device_list returned 0 devices");
  }
  std::string name = ibv_get_device_name(list[0]);
  ibv_context* ctx = ibv_open_device(list[0]);
  ibv_free_device_list(list);
  if (ctx == nullptr) return Unsupported("RDMA device ", name, " does not open: ", strerror(errno));
  ibv_port_attr port{};
  int rc = ibv_query_port(ctx, 1, &port);
  ibv_close_device(ctx);
  if (rc != 0) return Unsupported("RDMA device ", name, ": ibv_query_port failed");
  if (port.state != IBV_PORT_ACTIVE) {
    return Unsupported("RDMA device ", name, ": port 1 is not active (state ", port.state, ")");
  }
  return Status::Ok();
}

// ---- server side ----

namespace {

class VerbsListenerImpl final : public VerbsListener {
 public:
  // Stop() disconnects the queue pairs; res_ then tears down in its order.
  ~VerbsListenerImpl() override { Stop(); }

  Status Init(const std::string& host, uint16_t port) {
    TESSERA_RETURN_IF_ERROR(ProbeRdma());
    int n = 0;
    res_.devices.reset(rdma_get_devices(&n));
    if (!res_.devices || n == 0) return Unsupported("no RDMA device: rdma_get_devices found none");
    res_.context = res_.devices.get()[0];
    res_.pd.reset(ibv_alloc_pd(res_.context));
    if (!res_.pd) return CmError("ibv_alloc_pd");
    res_.event_channel.reset(rdma_create_event_channel());
    if (!res_.event_channel) return CmError("rdma_create_event_channel");
    rdma_cm_id* listen = nullptr;
    if (rdma_create_id(res_.event_channel.get(), &listen, this, RDMA_PS_TCP) != 0) {
      return CmError("rdma_create_id");
    }
    res_.listen_id.reset(listen);
    TESSERA_ASSIGN_OR_RETURN(addrinfo * ai, Resolve(host, port, true));
    int rc = rdma_bind_addr(listen, ai->ai_addr);
    freeaddrinfo(ai);
    if (rc != 0) return CmError("rdma_bind_addr");
    if (rdma_listen(listen, 64) != 0) return CmError("rdma_listen");
    port_ = ntohs(rdma_get_src_port(listen));
    // A CQ for the accepted QPs: the server posts nothing, but every QP needs one.
    res_.cq.reset(ibv_create_cq(res_.context, 16, nullptr, nullptr, 0));
    if (!res_.cq) return CmError("ibv_create_cq");
    return Status::Ok();
  }

  Result<MemoryRegistration> Register(void* addr, size_t length) override {
    MrPtr mr(ibv_reg_mr(res_.pd.get(), addr, length,
                        IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE));
    if (!mr) return CmError("ibv_reg_mr");
    const uint32_t rkey = mr->rkey;
    std::lock_guard<std::mutex> lock(mu_);
    res_.mrs.push_back(std::move(mr));
    MemoryRegistration reg;
    reg.base_addr = reinterpret_cast<uint64_t>(addr);
    reg.rkey = rkey;
    reg.rdma = true;
    return reg;
  }

  Status Start() override {
    thread_ = std::thread([this] { Run(); });
    return Status::Ok();
  }

  void Stop() override {
    if (stop_.exchange(true)) return;
    if (thread_.joinable()) thread_.join();
    // QPs first (with their ids), then the CQ.
    for (const QpIdPtr& id : res_.qps) rdma_disconnect(id.get());
    res_.qps.clear();
    res_.cq.reset();
  }

  uint16_t port() const override { return port_; }

  uint64_t IssueToken() override {
    uint64_t t = 0;
    while (t == 0) {
      if (!RandomBytes({reinterpret_cast<uint8_t*>(&t), sizeof(t)}).ok()) t = 0;
    }
    std::lock_guard<std::mutex> lock(mu_);
    tokens_.insert(t);
    return t;
  }

  void RevokeToken(uint64_t token) override {
    std::lock_guard<std::mutex> lock(mu_);
    tokens_.erase(token);
  }

 private:
  void Run() {
    while (!stop_.load()) {
      pollfd p{res_.event_channel->fd, POLLIN, 0};
      int rc = ::poll(&p, 1, 100);
      if (rc <= 0) continue;
      rdma_cm_event* ev = nullptr;
      if (rdma_get_cm_event(res_.event_channel.get(), &ev) != 0) continue;
      rdma_cm_event_type type = ev->event;
      rdma_cm_id* id = ev->id;
      uint64_t token = 0;
      bool has_token = false;
      if (type == RDMA_CM_EVENT_CONNECT_REQUEST &&
          ev->param.conn.private_data_len >= kPrivateDataSize &&
          ev->param.conn.private_data != nullptr) {
        SpanReader priv({static_cast<const uint8_t*>(ev->param.conn.private_data),
                         ev->param.conn.private_data_len});
        token = priv.GetFixed64("rdma token");
        has_token = true;
      }
      rdma_ack_cm_event(ev);
      switch (type) {
        case RDMA_CM_EVENT_CONNECT_REQUEST:
          OnConnectRequest(id, has_token, token);
          break;
        case RDMA_CM_EVENT_DISCONNECTED: {
          auto it = std::find_if(res_.qps.begin(), res_.qps.end(),
                                 [id](const QpIdPtr& q) { return q.get() == id; });
          if (it != res_.qps.end()) res_.qps.erase(it);  // Destroys the QP, then the id.
          break;
        }
        default:
          break;
      }
    }
  }

  void OnConnectRequest(rdma_cm_id* raw_id, bool has_token, uint64_t token) {
    QpIdPtr id(raw_id);  // Destroyed (with its QP, if any) on every refusal below.
    bool valid = false;
    if (has_token) {
      std::lock_guard<std::mutex> lock(mu_);
      valid = tokens_.count(token) > 0;
    }
    if (!valid) {
      TLOG(WARNING) << "verbs listener: rejecting a QP without a valid login token";
      rdma_reject(id.get(), nullptr, 0);
      return;
    }
    if (id->verbs != res_.context) {
      TLOG(WARNING) << "verbs listener: connect request on another RDMA device; rejected";
      rdma_reject(id.get(), nullptr, 0);
      return;
    }
    ibv_qp_init_attr attr{};
    attr.send_cq = res_.cq.get();
    attr.recv_cq = res_.cq.get();
    attr.qp_type = IBV_QPT_RC;
    attr.cap.max_send_wr = 1;
    attr.cap.max_recv_wr = 1;
    attr.cap.max_send_sge = 1;
    attr.cap.max_recv_sge = 1;
    if (rdma_create_qp(id.get(), res_.pd.get(), &attr) != 0) {
      TLOG(WARNING) << "verbs listener: rdma_create_qp: " << strerror(errno);
      rdma_reject(id.get(), nullptr, 0);
      return;
    }
    rdma_conn_param param{};
    param.responder_resources = 16;
    param.initiator_depth = 16;
    param.rnr_retry_count = 7;
    if (rdma_accept(id.get(), &param) != 0) {
      TLOG(WARNING) << "verbs listener: rdma_accept: " << strerror(errno);
      return;
    }
    res_.qps.push_back(std::move(id));
  }

  // res_.qps: only touched by the listener thread, then Stop(); res_.mrs: under mu_.
  VerbsResources res_;
  uint16_t port_ = 0;
  std::mutex mu_;
  std::set<uint64_t> tokens_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace

Result<std::unique_ptr<VerbsListener>> VerbsListener::Create(const std::string& host,
                                                             uint16_t port) {
  auto l = std::make_unique<VerbsListenerImpl>();
  TESSERA_RETURN_IF_ERROR(l->Init(host, port));
  return std::unique_ptr<VerbsListener>(std::move(l));
}

// ---- client side ----

namespace {

class VerbsTransport final : public Transport {
 public:
  explicit VerbsTransport(const TransportOptions& options) : options_(options) {}

  ~VerbsTransport() override {
    // The QPs (in conns_) first; then res_ tears down the CQ, MRs, PD, ... in its order.
    for (auto& c : conns_) {
      if (c.id) rdma_disconnect(c.id.get());
    }
    conns_.clear();
    res_.Reset();
  }

  Status Init() {
    if (options_.max_inflight < 1 || options_.max_inflight > 65536) {
      return InvalidArgument("max_inflight must be in 1..65536, got ", options_.max_inflight);
    }
    if (options_.signal_interval < 1 || options_.signal_interval > 64) {
      return InvalidArgument("signal_interval must be in 1..64, got ", options_.signal_interval);
    }
    TESSERA_RETURN_IF_ERROR(ProbeRdma());
    int n = 0;
    res_.devices.reset(rdma_get_devices(&n));
    if (!res_.devices || n == 0) return Unsupported("no RDMA device: rdma_get_devices found none");
    res_.context = res_.devices.get()[0];
    res_.pd.reset(ibv_alloc_pd(res_.context));
    if (!res_.pd) return CmError("ibv_alloc_pd");
    res_.comp_channel.reset(ibv_create_comp_channel(res_.context));
    if (!res_.comp_channel) return CmError("ibv_create_comp_channel");
    ibv_device_attr dev{};
    if (ibv_query_device(res_.context, &dev) != 0) return CmError("ibv_query_device");
    int cqe = static_cast<int>(std::min<uint32_t>(options_.max_inflight, dev.max_cqe));
    res_.cq.reset(ibv_create_cq(res_.context, cqe, nullptr, res_.comp_channel.get(), 0));
    if (!res_.cq) return CmError("ibv_create_cq");
    max_qp_wr_ = std::min<uint32_t>(options_.max_inflight, static_cast<uint32_t>(dev.max_qp_wr));
    res_.event_channel.reset(rdma_create_event_channel());
    if (!res_.event_channel) return CmError("rdma_create_event_channel");
    slots_.resize(options_.max_inflight);
    for (uint32_t i = options_.max_inflight; i > 0; --i) free_slots_.push_back(i - 1);
    return Status::Ok();
  }

  TransportKind kind() const override { return TransportKind::kRdma; }

  Result<ConnectionId> Connect(const Endpoint& endpoint, const ConnectOptions& options) override {
    TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<ControlClient> login,
                             ControlClient::Connect(endpoint, options));
    if (!login->rdma_offered()) {
      (void)login->Close(Deadline::AfterMs(1000));
      return Unsupported("server ", endpoint.ToString(), " does not offer RDMA");
    }
    Conn c;
    Status st = ConnectQp(&c, login->auth_ok(), options);
    if (!st.ok()) {
      c.id.reset();  // The half-made QP and its id.
      (void)login->Close(Deadline::AfterMs(1000));
      return st;
    }
    c.login = std::move(login);
    c.up = true;
    conns_.push_back(std::move(c));
    return static_cast<ConnectionId>(conns_.size() - 1);
  }

  Status Disconnect(ConnectionId id) override {
    TESSERA_RETURN_IF_ERROR(CheckConn(id));
    FailConn(id, Cancelled("connection closed by Disconnect()"));
    return conns_[id].login->Close(Deadline::AfterMs(1000));
  }

  Status Abort(ConnectionId id) override {
    TESSERA_RETURN_IF_ERROR(CheckConn(id));
    FailConn(id, Cancelled("connection aborted by Abort()"));
    conns_[id].login.reset();
    return Status::Ok();
  }

  Result<ServerInfo> Info(ConnectionId id) const override {
    if (id >= conns_.size()) return InvalidArgument("unknown connection ", id);
    if (!conns_[id].login) return Unavailable("connection ", id, " was aborted");
    ServerInfo info = conns_[id].login->info();
    info.rdma = true;
    return info;
  }

  bool Connected(ConnectionId id) const override {
    return id < conns_.size() && conns_[id].up && conns_[id].login &&
           conns_[id].login->connected();
  }

  Status RegisterMemory(void* addr, size_t length) override {
    if (addr == nullptr || length == 0) return InvalidArgument("RegisterMemory: empty region");
    MrPtr mr(ibv_reg_mr(res_.pd.get(), addr, length, IBV_ACCESS_LOCAL_WRITE));
    if (!mr) return CmError("ibv_reg_mr");
    regions_.push_back({reinterpret_cast<uintptr_t>(addr), length, mr.get()});
    res_.mrs.push_back(std::move(mr));
    std::sort(regions_.begin(), regions_.end(),
              [](const Region& a, const Region& b) { return a.base < b.base; });
    return Status::Ok();
  }

  Status Post(std::span<const WorkRequest> batch) override {
    if (batch.empty()) return Status::Ok();
    for (const WorkRequest& wr : batch) {
      TESSERA_RETURN_IF_ERROR(CheckConn(wr.connection));
      if (wr.length == 0 || wr.length > kMaxDataLength) {
        return InvalidArgument("work request length ", wr.length, " outside 1..", kMaxDataLength);
      }
      if (wr.local == nullptr) return InvalidArgument("work request without a local buffer");
      const Conn& c = conns_[wr.connection];
      auto it = c.slabs.find(wr.slab_id);
      if (it == c.slabs.end()) {
        return InvalidArgument("slab ", wr.slab_id, " was not allocated through this transport");
      }
      if (wr.remote_offset > it->second.size || wr.length > it->second.size - wr.remote_offset) {
        return OutOfRange("offset ", wr.remote_offset, " + length ", wr.length,
                          " outside slab of ", it->second.size, " bytes");
      }
      if (FindLkey(wr.local, wr.length) == nullptr) {
        return InvalidArgument("local buffer is not inside memory passed to RegisterMemory()");
      }
    }
    if (batch.size() > free_slots_.size()) {
      return ResourceExhausted("batch of ", batch.size(), " ops does not fit: ", free_slots_.size(),
                               " in-flight slots free");
    }
    // Per-QP capacity.
    for (const WorkRequest& wr : batch) conns_[wr.connection].batch_count++;
    bool fits = true;
    for (const WorkRequest& wr : batch) {
      Conn& c = conns_[wr.connection];
      if (c.fifo.size() + c.batch_count > max_qp_wr_) fits = false;
    }
    for (const WorkRequest& wr : batch) conns_[wr.connection].batch_count = 0;
    if (!fits) return ResourceExhausted("a queue pair's send queue is full");

    wrs_.resize(batch.size());
    sges_.resize(batch.size());
    // Group by connection, preserving order: one chained post per QP.
    for (size_t start = 0; start < batch.size();) {
      ConnectionId cid = batch[start].connection;
      Conn& c = conns_[cid];
      ibv_send_wr* head = nullptr;
      ibv_send_wr* prev = nullptr;
      size_t end = start;
      for (size_t i = start; i < batch.size(); ++i) {
        if (batch[i].connection != cid) continue;
        if (i != end) break;  // Keep it simple: a maximal run of one connection.
        end = i + 1;
        const WorkRequest& wr = batch[i];
        uint32_t slot = free_slots_.back();
        free_slots_.pop_back();
        slots_[slot] = Slot{true, wr.cookie, cid};
        c.fifo.push_back(slot);
        const Region* r = FindLkey(wr.local, wr.length);
        const SlabRef& slab = c.slabs.at(wr.slab_id);
        ibv_sge& sge = sges_[i];
        sge.addr = reinterpret_cast<uintptr_t>(wr.local);
        sge.length = wr.length;
        sge.lkey = r->mr->lkey;
        ibv_send_wr& s = wrs_[i];
        s = ibv_send_wr{};
        s.wr_id = slot;
        s.sg_list = &sge;
        s.num_sge = 1;
        s.opcode = wr.op == OpKind::kRead ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE;
        c.unsignalled++;
        if (c.unsignalled >= options_.signal_interval) {
          s.send_flags = IBV_SEND_SIGNALED;
          c.unsignalled = 0;
        }
        s.wr.rdma.remote_addr = slab.remote_addr + wr.remote_offset;
        s.wr.rdma.rkey = slab.rkey;
        if (prev) prev->next = &s;
        else head = &s;
        prev = &s;
      }
      // The last WR of the run is always signalled, so every op completes promptly.
      prev->send_flags = IBV_SEND_SIGNALED;
      c.unsignalled = 0;
      ibv_send_wr* bad = nullptr;
      int rc = ibv_post_send(c.id->qp, head, &bad);
      if (rc != 0) {
        FailConn(cid, Unavailable("ibv_post_send: ", strerror(rc)));
        return Unavailable("ibv_post_send failed: ", strerror(rc));
      }
      inflight_ += static_cast<uint32_t>(end - start);
      start = end;
    }
    return Status::Ok();
  }

  size_t Poll(std::span<Completion> out) override {
    ibv_wc wc[32];
    int n = ibv_poll_cq(res_.cq.get(), 32, wc);
    for (int i = 0; i < n; ++i) OnWc(wc[i]);
    PollLogins();
    size_t m = 0;
    while (m < out.size() && !ready_.empty()) {
      out[m++] = std::move(ready_.front());
      ready_.pop_front();
    }
    return m;
  }

  size_t Wait(std::span<Completion> out, Deadline deadline) override {
    while (true) {
      size_t n = Poll(out);
      if (n > 0 || out.empty() || deadline.Expired()) return n;
      ibv_req_notify_cq(res_.cq.get(), 0);
      n = Poll(out);
      if (n > 0) return n;
      int ms = std::min(deadline.RemainingMs(), 5);
      // The logins are checked by the next Poll() at the latest 5 ms from now.
      if (WaitCompletionChannel(res_.comp_channel.get(), ms < 0 ? 5 : ms, wake_fd_)) {
        return Poll(out);
      }
    }
  }

  uint32_t inflight() const override { return inflight_; }
  Status SetWakeFd(int fd) override {
    if (fd < -1) return InvalidArgument("SetWakeFd: bad fd ", fd);
    wake_fd_ = fd;
    return Status::Ok();
  }

  Status AddSlab(ConnectionId c, const AllocSlabResponse& r) override {
    if (c >= conns_.size()) return InvalidArgument("unknown connection ", c);
    if (r.slab_id == 0) return InvalidArgument("AddSlab: slab_id 0");
    if (r.rkey == 0) {
      return Unsupported("server returned slab ", r.slab_id, " without an rkey: its memory is not "
                         "registered for RDMA");
    }
    conns_[c].slabs[r.slab_id] = SlabRef{r.remote_addr, r.rkey, r.size};
    return Status::Ok();
  }
  void RemoveSlab(ConnectionId c, uint64_t slab_id) override {
    if (c < conns_.size()) conns_[c].slabs.erase(slab_id);
  }

 private:
  struct SlabRef {
    uint64_t remote_addr;
    uint32_t rkey;
    uint64_t size;
  };
  struct Conn {
    std::unique_ptr<ControlClient> login;  // Authentication, the QP's token, notices.
    QpIdPtr id;                             // The RC QP and its rdma_cm id.
    bool up = false;
    Status down_reason;
    std::deque<uint32_t> fifo;  // Slots posted on this QP, in post order.
    uint32_t unsignalled = 0;
    size_t batch_count = 0;
    std::unordered_map<uint64_t, SlabRef> slabs;
  };
  struct Slot {
    bool used = false;
    uint64_t cookie = 0;
    ConnectionId conn = 0;
  };
  struct Region {
    uintptr_t base;
    size_t length;
    ibv_mr* mr;  // Owned by res_.mrs.
  };

  Status CheckConn(ConnectionId id) const {
    if (id >= conns_.size()) return InvalidArgument("unknown connection ", id);
    if (!conns_[id].up) return Unavailable("connection ", id, " is down: ", conns_[id].down_reason.message());
    if (!conns_[id].login || !conns_[id].login->connected()) {
      return Unavailable("login connection ", id, " is down");
    }
    return Status::Ok();
  }

  const Region* FindLkey(const void* p, size_t len) const {
    uintptr_t a = reinterpret_cast<uintptr_t>(p);
    for (const Region& r : regions_) {
      if (a >= r.base && a - r.base <= r.length && len <= r.length - (a - r.base)) return &r;
    }
    return nullptr;
  }

  Status ConnectQp(Conn* c, const AuthOkResponse& ok, const ConnectOptions& options) {
    rdma_cm_id* raw = nullptr;
    if (rdma_create_id(res_.event_channel.get(), &raw, nullptr, RDMA_PS_TCP) != 0) {
      return CmError("rdma_create_id");
    }
    c->id.reset(raw);
    TESSERA_ASSIGN_OR_RETURN(addrinfo * ai, Resolve(ok.rdma_host, ok.rdma_port, false));
    int ms = std::max(1, options.deadline.RemainingMs());
    int rc = rdma_resolve_addr(c->id.get(), nullptr, ai->ai_addr, ms);
    freeaddrinfo(ai);
    if (rc != 0) return CmError("rdma_resolve_addr");
    TESSERA_RETURN_IF_ERROR(
        WaitCmEvent(res_.event_channel.get(), RDMA_CM_EVENT_ADDR_RESOLVED, options.deadline,
                    "resolve address"));
    if (c->id->verbs != res_.context) {
      return Unsupported("the route to ", ok.rdma_host, " uses another RDMA device than the first; "
                         "multi-device clients are not supported");
    }
    if (rdma_resolve_route(c->id.get(), std::max(1, options.deadline.RemainingMs())) != 0) {
      return CmError("rdma_resolve_route");
    }
    TESSERA_RETURN_IF_ERROR(
        WaitCmEvent(res_.event_channel.get(), RDMA_CM_EVENT_ROUTE_RESOLVED, options.deadline,
                    "resolve route"));
    ibv_qp_init_attr attr{};
    attr.send_cq = res_.cq.get();
    attr.recv_cq = res_.cq.get();
    attr.qp_type = IBV_QPT_RC;
    attr.sq_sig_all = 0;
    attr.cap.max_send_wr = max_qp_wr_;
    attr.cap.max_recv_wr = 1;
    attr.cap.max_send_sge = 1;
    attr.cap.max_recv_sge = 1;
    if (rdma_create_qp(c->id.get(), res_.pd.get(), &attr) != 0) return CmError("rdma_create_qp");
    uint8_t priv[kPrivateDataSize];
    SpanWriter(priv, sizeof priv).PutFixed64(ok.rdma_token).PutFixed64(options.client_id);
    rdma_conn_param param{};
    param.private_data = priv;
    param.private_data_len = sizeof(priv);
    param.responder_resources = 16;
    param.initiator_depth = 16;
    param.retry_count = 7;
    param.rnr_retry_count = 7;
    if (rdma_connect(c->id.get(), &param) != 0) return CmError("rdma_connect");
    return WaitCmEvent(res_.event_channel.get(), RDMA_CM_EVENT_ESTABLISHED, options.deadline,
                       "connect QP");
  }

  // Notices from the logins (one poll() over all their sockets, then only the readable ones
  // are read); a login the server closed fails its connection.
  void PollLogins() {
    login_fds_.clear();
    for (const Conn& c : conns_) {
      login_fds_.push_back(pollfd{c.up && c.login ? c.login->fd() : -1, POLLIN, 0});
    }
    if (login_fds_.empty() || ::poll(login_fds_.data(), login_fds_.size(), 0) <= 0) return;
    Notice notices[16];
    for (ConnectionId id = 0; id < conns_.size(); ++id) {
      if (login_fds_[id].fd < 0 || login_fds_[id].revents == 0) continue;
      ControlClient& login = *conns_[id].login;
      size_t k;
      while ((k = login.PollNotices(notices)) > 0) {
        for (size_t i = 0; i < k; ++i) {
          Completion n;
          n.kind = CompletionKind::kNotice;
          n.connection = id;
          n.notice = notices[i];
          ready_.push_back(std::move(n));
        }
      }
      if (!login.connected()) FailConn(id, login.down_reason());
    }
  }

  void OnWc(const ibv_wc& wc) {
    uint32_t slot = static_cast<uint32_t>(wc.wr_id);
    if (slot >= slots_.size() || !slots_[slot].used) return;
    ConnectionId cid = slots_[slot].conn;
    Conn& c = conns_[cid];
    Status st = wc.status == IBV_WC_SUCCESS
                    ? Status::Ok()
                    : Unavailable("RDMA op failed: ", ibv_wc_status_str(wc.status));
    // Everything posted before `slot` on this QP is complete too (RC completes in order).
    while (!c.fifo.empty()) {
      uint32_t s = c.fifo.front();
      c.fifo.pop_front();
      Complete(s, s == slot ? st : Status::Ok());
      if (s == slot) break;
    }
    if (!st.ok()) FailConn(cid, st);
  }

  void Complete(uint32_t slot, Status st) {
    Completion c;
    c.kind = CompletionKind::kData;
    c.cookie = slots_[slot].cookie;
    c.connection = slots_[slot].conn;
    c.status = std::move(st);
    slots_[slot].used = false;
    free_slots_.push_back(slot);
    inflight_--;
    ready_.push_back(std::move(c));
  }

  void FailConn(ConnectionId id, Status reason) {
    Conn& c = conns_[id];
    if (!c.up) return;
    c.up = false;
    c.down_reason = reason;
    while (!c.fifo.empty()) {
      uint32_t s = c.fifo.front();
      c.fifo.pop_front();
      Complete(s, reason);
    }
    if (c.id) rdma_disconnect(c.id.get());
  }

  TransportOptions options_;
  std::vector<pollfd> login_fds_;
  // Declared before conns_, so the QPs in conns_ go first on every path (see the destructor).
  VerbsResources res_;
  uint32_t max_qp_wr_ = 0;
  std::vector<Conn> conns_;
  std::vector<Region> regions_;
  std::vector<Slot> slots_;
  std::vector<uint32_t> free_slots_;
  uint32_t inflight_ = 0;
  int wake_fd_ = -1;  // SetWakeFd(): Wait() also returns when it is readable.
  std::deque<Completion> ready_;
  std::vector<ibv_send_wr> wrs_;
  std::vector<ibv_sge> sges_;
};

}  // namespace

Result<std::unique_ptr<Transport>> CreateRdmaTransport(const TransportOptions& options) {
  auto t = std::make_unique<VerbsTransport>(options);
  TESSERA_RETURN_IF_ERROR(t->Init());
  return std::unique_ptr<Transport>(std::move(t));
}

}  // namespace tessera::fabric
