// IoThread: start, connection setup, the loop (poll, drain the queue, housekeeping, flush posts,
// sleep), posting requests and dispatching their completions. Layout-independent.
#include "client/remote/engine.h"
#include "client/remote/layout.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "common/logging.h"

namespace tessera::client::remote {

IoThread::IoThread(RemoteStore* store, int index)
    : store_(store), index_(index), lay_(store->lay_), layout_(NewLayout(*this, lay_)) {}

IoThread::~IoThread() {
  RequestStop();
}

void IoThread::RequestStop() {
  if (sim_prepared_) {
    sim_prepared_ = false;
    Teardown();
    return;
  }
  if (!thread_.joinable()) return;
  stop_.store(true);
  Wake();
  thread_.join();
}

void IoThread::Wake() {
  if (!event_fd_.valid()) return;
  uint64_t one = 1;
  ssize_t n = write(event_fd_.get(), &one, sizeof(one));
  (void)n;
}

void IoThread::Enqueue(QueueItem item) {
  while (!queue_.push(item)) {
  }  // push() allocates a node beyond the reserve; it fails only when memory is exhausted.
  if (sleeping_.load(std::memory_order_seq_cst)) Wake();
}

Status IoThread::Start() {
  int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (fd < 0) return ErrnoError("eventfd");
  event_fd_ = UniqueFd(fd);
  if (store_->opt_.sim) {
    // Simulation (sim_control.h): no thread; the simulation runs Turn() on its own thread.
    Status st = Prepare();
    if (st.ok()) {
      sim_prepared_ = true;
      last_tick_ns_ = MonotonicNs();
    }
    return st;
  }
  std::promise<Status> started;
  auto fut = started.get_future();
  thread_ = std::thread([this, &started] { Run(&started); });
  Status st = fut.get();
  if (!st.ok()) {
    stop_.store(true);
    thread_.join();
  }
  return st;
}

Status IoThread::Connect() {
  const RemoteStoreOptions& o = store_->opt_;
  fabric::TransportOptions to;
  to.kind = o.transport;
  // One transport slot per request slot (see Run()), so a flushed batch always fits.
  const uint32_t reqs = (o.max_inflight_pages + 16) * static_cast<uint32_t>(lay_.width()) * 2;
  to.max_inflight = std::min<uint32_t>(65536, reqs);
  to.ring_entries = 1024;
  TESSERA_ASSIGN_OR_RETURN(t_, store_->NewTransport(to));
  const uint32_t n = store_->num_servers();
  for (uint32_t i = 0; i < n; ++i) TESSERA_RETURN_IF_ERROR(ConnectServer(i));
  synced_servers_.store(n, std::memory_order_release);
  return Status::Ok();
}

Status IoThread::ConnectServer(uint32_t i) {
  const RemoteStoreOptions& o = store_->opt_;
  const fabric::Endpoint& ep = store_->server(i).endpoint;
  // The slot exists (as failed) even when the connection does not, so indices stay aligned.
  conn_.resize(i + 1, kNoConn);
  local_failed_.resize(i + 1, 1);
  conn_down_.resize(i + 1, 0);
  reconnect_at_.resize(i + 1, 0);
  reconnect_fails_.resize(i + 1, 0);
  probes_.resize(i + 1);
  errors_in_a_row_.resize(i + 1, 0);
  outstanding_.resize(i + 1, 0);
  latency_ewma_ns_.resize(i + 1, 0);
  slow_.resize(i + 1, 0);
  late_strikes_.resize(i + 1, 0);
  last_reply_ns_.resize(i + 1, 0);
  fabric::ConnectOptions co;
  co.secret = o.secret;
  co.client_id = store_->client_id_;
  co.deadline = Deadline::AfterMs(o.connect_timeout_ms);
  auto c = t_->Connect(ep, co);
  if (!c.ok()) {
    return Unavailable("cannot connect to " + ep.ToString() + ": " + c.status().ToString());
  }
  conn_[i] = *c;
  TESSERA_ASSIGN_OR_RETURN(auto info, t_->Info(*c));
  (void)store_->SameInstance(i, info.server_id);
  if (info.slab_size != store_->slab_size_) {
    return InvalidArgument("servers disagree on the slab size: " +
                           std::to_string(info.slab_size) + " at " + ep.ToString() + " vs " +
                           std::to_string(store_->slab_size_));
  }
  local_failed_[i] = 0;
  return Status::Ok();
}

void IoThread::SyncServers() {
  const uint32_t n = store_->num_servers();
  for (uint32_t i = static_cast<uint32_t>(conn_.size()); i < n; ++i) {
    Status st = ConnectServer(i);
    if (!st.ok()) store_->MarkFailed(i, "joining: " + st.ToString());
  }
  now_ns_ = MonotonicNs();
  {
    std::lock_guard<std::mutex> lock(store_->sync_mu_);
    synced_servers_.store(n, std::memory_order_release);
  }
  store_->sync_cv_.notify_all();
}

void IoThread::ReleaseRemote(uint32_t server, uint64_t slab_id) {
  t_->RemoveSlab(conn_[server], slab_id);
  freer_->Free(server, slab_id);
}

void IoThread::Run(std::promise<Status>* started) {
  Status st = Prepare();
  started->set_value(st);
  if (!st.ok()) return;
  Loop();
  Teardown();
}

Status IoThread::Prepare() {
  freer_ = std::make_unique<SlabFreer>(store_);
  allocator_ = std::make_unique<SlabAllocator>(store_, [this] { Wake(); });
  TESSERA_RETURN_IF_ERROR(Connect());
  // The slab size is known once thread 0 connected; Init() starts the others after it.
  slabs_ = std::vector<Slab>(layout_->SlabCount());
  const uint32_t nctx = store_->opt_.max_inflight_pages + 16;
  const size_t per = static_cast<size_t>(lay_.width()) * lay_.split;
  ctxs_ = std::vector<Ctx>(nctx);
  constexpr uint32_t kSpareBufs = 64;
  bufs_.assign(per * (nctx + kSpareBufs), 0);
  buf_bytes_ = per;
  buf_orphans_.assign(nctx + kSpareBufs, 0);
  for (uint32_t i = 0; i < nctx; ++i) {
    ctxs_[i].buf = bufs_.data() + per * i;
    ctxs_[i].next_free = free_ctx_;
    free_ctx_ = &ctxs_[i];
  }
  for (uint32_t i = nctx; i < nctx + kSpareBufs; ++i) spare_bufs_.push_back(bufs_.data() + per * i);
  free_ctx_count_ = static_cast<int>(nctx);
  const uint32_t nreq =
      std::min<uint32_t>(65536, nctx * static_cast<uint32_t>(lay_.width()) * 2);
  // The cap per server (RemoteStoreOptions::max_outstanding_per_server): by default the op
  // contexts. An op has at most one request at a server, so live ops never take a server past
  // it; requests left at a server that does not answer (late reads let go by their ops) do.
  cap_ =
      store_->opt_.max_outstanding_per_server != 0 ? store_->opt_.max_outstanding_per_server : nctx;
  // No reply for a quarter of the op timeout (at most 1 s) while at the cap: not answering. A
  // busy server answers within milliseconds; the stuck-request abort waits 2 x the op timeout.
  silent_abort_ns_ = std::min<uint64_t>(uint64_t{store_->opt_.op_timeout_ms} * 250000, 1000000000);
  reqs_ = std::vector<Request>(nreq);
  pending_wrs_.reserve(nreq);
  flushing_.reserve(nreq);
  TESSERA_RETURN_IF_ERROR(t_->SetWakeFd(event_fd_.get()));
  for (uint32_t i = 0; i < nreq; ++i) reqs_[i].next_free = i + 1;
  free_req_ = 0;
  comps_.resize(256);
  layout_->Setup(nctx);
  return Status::Ok();
}

void IoThread::Teardown() {
  // Shutdown: end the slab allocations still out and what waits for them, fail queued ops, then
  // give in-flight ones a bounded time to finish.
  StopAllocations();
  layout_->Stop();
  QueueItem item;
  while (queue_.pop(item)) FailAtShutdown(item);
  layout_->StoreBuffered();
  Deadline d = Deadline::AfterMs(2000);
  FlushPosts();
  // inflight() counts requests without a reply yet; replies already received wait in the
  // transport until Poll hands them out (a batch at a time), so poll until it has none left.
  while (!d.Expired()) {
    size_t n = t_->Poll(comps_);
    if (n == 0) {
      if (t_->inflight() == 0) break;
      n = t_->Wait(comps_, Deadline(MonotonicNs() + 10000000));
    }
    for (size_t i = 0; i < n; ++i) OnCompletion(comps_[i]);
    FlushPosts();
  }
  bool all_settled = true;
  for (size_t i = 0; i < ctxs_.size(); ++i) {
    Ctx& c = ctxs_[i];
    if (c.op != nullptr && !c.finished) {
      c.finished = true;
      Complete(c.op, Unavailable("page store is shutting down"), c.start_ns);
      c.op = nullptr;
    }
    layout_->AbandonCtx(i, c);
    if (!c.released && c.outstanding > 0) all_settled = false;
  }
  // A clean shutdown gives the remote memory back at once (the memservers would otherwise keep
  // it until the owner's lease runs out, see --orphan_grace). Bounded: a server that does not
  // answer keeps its slabs until its lease reclaims them.
  if (all_settled) FreeAllSlabs();
  freer_->Finish(Deadline::AfterMs(2000));
  t_.reset();
}

Ctx* IoThread::NewCtx() {
  Ctx* c = free_ctx_;
  if (c == nullptr) return nullptr;
  free_ctx_ = c->next_free;
  --free_ctx_count_;
  uint8_t* buf = c->buf;
  *c = Ctx{};
  c->buf = buf;
  return c;
}

uint8_t* IoThread::SplitBuf(Ctx* c, int j) {
  return c->buf + static_cast<size_t>(j) * lay_.split;
}

void IoThread::Loop() {
  last_tick_ns_ = MonotonicNs();
  poll_ns_ = uint64_t{store_->opt_.poll_us} * 1000;
  while (!stop_.load(std::memory_order_acquire)) {
    const uint64_t timeout = Turn();
    if (timeout == 0) {
      last_progress_ns_ = 0;
      continue;
    }
    if (poll_ns_ > 0) {
      const uint64_t now = MonotonicNs();
      if (last_progress_ns_ == 0) last_progress_ns_ = now;
      if (now - last_progress_ns_ < poll_ns_) continue;  // Keep polling a little longer.
      last_progress_ns_ = 0;
    }
    loop_allowance_ns_ = timeout;
    Sleep(timeout);
  }
}

uint64_t IoThread::Turn() {
  // A server joined (RemoteStore::AddServer): connect before placement may name it.
  if (store_->num_servers() != synced_servers_.load(std::memory_order_relaxed)) SyncServers();
  now_ns_ = MonotonicNs();
  // This thread's own stall (descheduled, or a blocking control call in the last iteration)
  // is excused from the op timeouts of the requests it left out meanwhile.
  if (last_loop_ns_ != 0 && now_ns_ - last_loop_ns_ > loop_allowance_ns_ + 5000000) {
    ExcuseStall(now_ns_ - last_loop_ns_ - loop_allowance_ns_);
  }
  last_loop_ns_ = now_ns_;
  loop_allowance_ns_ = 0;
  bool progress = false;
  size_t n = t_->Poll(comps_);
  for (size_t i = 0; i < n; ++i) OnCompletion(comps_[i]);
  progress |= n > 0;
  const int before = free_ctx_count_;
  progress |= TakeAllocAnswers();
  progress |= layout_->Poll();
  progress |= Drain();
  progress |= free_ctx_count_ != before;
  Housekeeping();
  progress |= !pending_wrs_.empty();
  FlushPosts();
  if (progress) return 0;
  // Nothing to do until a reply, a Submit() or a housekeeping tick: the transport's Wait()
  // also watches the eventfd, so a new op is started at once even while replies are still
  // out (e.g. a late-binding read's straggler split).
  const uint64_t timeout = t_->inflight() > 0 || regen_active_ > 0 ? 1000000 : 20000000;
  return layout_->SleepBound(timeout);
}

uint64_t IoThread::SimTurn() {
  freer_->SimPump();
  const uint64_t timeout = Turn();
  const uint64_t now = MonotonicNs();
  if (timeout == 0) return now;
  loop_allowance_ns_ = timeout;
  uint64_t next = now + timeout;
  // What the allocator and the freer would wake this thread for. (A reconnect probe does not
  // wake it: the next housekeeping tick takes its answer.)
  next = std::min(next, allocator_->SimNextNs());
  next = std::min(next, freer_->SimNextNs());
  return std::max(next, now);
}

void IoThread::Sleep(uint64_t timeout_ns) {
  sleeping_.store(true, std::memory_order_seq_cst);
  if (queue_.empty() && !stop_.load()) {
    if (t_->inflight() > 0) {
      const size_t n = t_->Wait(comps_, Deadline(MonotonicNs() + timeout_ns));
      sleeping_.store(false, std::memory_order_relaxed);
      for (size_t i = 0; i < n; ++i) OnCompletion(comps_[i]);
    } else {
      pollfd p{event_fd_.get(), POLLIN, 0};
      (void)poll(&p, 1, static_cast<int>(timeout_ns / 1000000));
    }
  }
  sleeping_.store(false, std::memory_order_relaxed);
  uint64_t v;
  ssize_t r = read(event_fd_.get(), &v, sizeof(v));
  (void)r;
}

void IoThread::FlushPosts() {
  if (pending_wrs_.empty()) return;
  flushing_.clear();
  std::swap(flushing_, pending_wrs_);  // Completions handled below may Post() again.
  // A connection that went down since its requests were collected fails just those requests.
  size_t live = 0;
  for (size_t i = 0; i < flushing_.size(); ++i) {
    if (t_->Connected(flushing_[i].connection)) {
      flushing_[live++] = flushing_[i];
    } else {
      pending_wrs_.push_back(flushing_[i]);  // Parked: failed below.
    }
  }
  std::vector<fabric::WorkRequest> dead;
  if (!pending_wrs_.empty()) {
    dead.swap(pending_wrs_);
    pending_wrs_.reserve(reqs_.size());
  }
  flushing_.resize(live);
  Status st = t_->Post(flushing_);
  auto fail = [this](const fabric::WorkRequest& wr, const Status& why) {
    fabric::Completion comp;
    comp.kind = fabric::CompletionKind::kData;
    comp.cookie = wr.cookie;
    comp.connection = wr.connection;
    comp.status = why;
    OnCompletion(comp);
  };
  if (!st.ok()) {
    TLOG(WARNING) << store_->name_ << ": posting " << flushing_.size()
                  << " requests failed: " << st;
    std::vector<fabric::WorkRequest> failed(flushing_.begin(), flushing_.end());
    for (const auto& wr : failed) fail(wr, st);
  }
  for (const auto& wr : dead) fail(wr, Unavailable("connection to the server is down"));
}

bool IoThread::Drain() {
  QueueItem item;
  bool any = false;
  while (free_ctx_ != nullptr && queue_.pop(item)) {
    any = true;
    // While a new slab is being allocated, what must follow its write waits (slab_alloc.cc).
    if (!layout_->Hold(item)) Dispatch(item);
  }
  return any;
}

void IoThread::Dispatch(const QueueItem& item) {
  if (item.kind == QueueItem::Kind::kLocate) {
    item.locate->Done(layout_->Locate(item.locate->page));
  } else if (item.kind == QueueItem::Kind::kFlush) {
    // What the layout buffers (the group layout's stripe buffer) is stored now.
    if (!layout_->Flush()) seal_wanted_.store(true, std::memory_order_relaxed);
    freer_->After(item.trim);  // After the frees of the trims before it, too.
  } else if (item.kind == QueueItem::Kind::kTrim) {
    layout_->Trim(item.trim->first, item.trim->count);
    // Done once the slabs it released are freed remotely, and the slabs being allocated now
    // are there (or given back, when the trim left them unwanted).
    if (AllocationsPending()) {
      trims_after_allocs_.push_back(item.trim);
    } else {
      freer_->After(item.trim);
    }
  } else {
    StartOp(item.op, item.degraded, item.verify);
  }
}

void IoThread::Complete(PageOp* op, Status st, uint64_t start_ns) {
  const bool read = op->kind == PageOp::Kind::kRead;
  if (start_ns != 0) {
    const uint64_t lat = MonotonicNs() - start_ns;
    std::lock_guard<std::mutex> lock(hist_mu_);
    (read ? read_hist_ : write_hist_).Record(lat);
  }
  SharedStats& s = store_->stats_;
  (read ? s.reads : s.writes).fetch_add(1, std::memory_order_relaxed);
  if (!st.ok()) (read ? s.read_errors : s.write_errors).fetch_add(1, std::memory_order_relaxed);
  op->status = std::move(st);
  op->done(op);
}

void IoThread::StartOp(PageOp* op, bool degraded, bool verify) {
  const uint64_t now = MonotonicNs();
  now_ns_ = now;
  if (op->page >= store_->opt_.capacity_pages) {
    Complete(op,
             OutOfRange("page " + std::to_string(op->page) + " is beyond the store's " +
                        std::to_string(store_->opt_.capacity_pages) + " pages"),
             now);
    return;
  }
  layout_->StartOp(op, now, degraded, verify);
}

bool IoThread::Post(Ctx* c, int split, fabric::OpKind kind, uint8_t* local) {
  Slab& s = slabs_[c->slab];
  const uint32_t server = s.server[split].load(std::memory_order_relaxed);
  // remote 0: a group member whose allocation failed (left missing, see BeginAllocate).
  if (server == kNoServer || !Usable(server) || s.remote[split] == 0) return false;
  if (free_req_ >= reqs_.size()) return false;
  const uint32_t ri = free_req_;
  Request& rq = reqs_[ri];
  free_req_ = rq.next_free;
  rq.ctx = c;
  rq.split = split;
  rq.server = server;
  rq.post_ns = now_ns_;
  rq.live = true;
  rq.write = kind == fabric::OpKind::kWrite;
  if (!t_->Connected(conn_[server])) {
    rq.live = false;
    rq.next_free = free_req_;
    free_req_ = ri;
    ConnLost(server, "connection lost");
    return false;
  }
  fabric::WorkRequest wr;
  wr.connection = conn_[server];
  wr.op = kind;
  wr.slab_id = s.remote[split];
  wr.remote_offset = static_cast<uint64_t>(c->pidx) * lay_.split;
  wr.length = static_cast<uint32_t>(lay_.split);
  wr.local = local;
  wr.cookie = ri;
  pending_wrs_.push_back(wr);  // Sent by FlushPosts() at the end of this loop iteration.
  ++c->outstanding;
  ++outstanding_[server];
  (kind == fabric::OpKind::kWrite ? store_->stats_.bytes_sent : store_->stats_.bytes_received)
      .fetch_add(lay_.split, std::memory_order_relaxed);
  return true;
}

void IoThread::MaybeRelease(Ctx* c) {
  if (!c->finished || c->outstanding > 0 || c->released) return;
  c->released = true;
  c->next_free = free_ctx_;
  free_ctx_ = c;
  ++free_ctx_count_;
  layout_->ReleaseCtx(c);
  if (c->slab_ref) {
    c->slab_ref = false;
    Slab& s = slabs_[c->slab];
    if (--s.refs == 0 && s.free_wanted) MaybeFreeSlab(s);
  }
}


// ---- completions, failures ----

void IoThread::OnCompletion(const fabric::Completion& comp) {
  if (comp.kind == fabric::CompletionKind::kNotice) {
    OnNotice(comp);
    return;
  }
  if (comp.cookie >= reqs_.size() || !reqs_[comp.cookie].live) return;
  Request& rq = reqs_[comp.cookie];
  Ctx* c = rq.ctx;
  const int split = rq.split;
  const bool was_write = rq.write;
  const uint32_t server = rq.server;
  uint8_t* const orphan_buf = rq.orphan_buf;
  rq.live = false;
  rq.ctx = nullptr;
  rq.orphan_buf = nullptr;
  rq.next_free = free_req_;
  free_req_ = static_cast<uint32_t>(comp.cookie);
  if (server < outstanding_.size()) --outstanding_[server];
  if (c == nullptr) {
    // A detached late read: its op is long finished. Only what it says about the server counts.
    const size_t bi = static_cast<size_t>(orphan_buf - bufs_.data()) / buf_bytes_;
    if (--buf_orphans_[bi] == 0) spare_bufs_.push_back(orphan_buf);
    const bool answered = comp.status.ok() || !IsConnectionError(comp.status);
    if (answered && server < late_strikes_.size()) {
      late_strikes_[server] = 0;
      last_reply_ns_[server] = now_ns_;
      store_->NoteAlive(server, now_ns_);
    }
    if (comp.status.ok() && server < latency_ewma_ns_.size()) {
      const uint64_t sample = now_ns_ > rq.post_ns ? now_ns_ - rq.post_ns : 0;
      uint64_t& e = latency_ewma_ns_[server];
      e = e == 0 ? sample : e - e / 8 + sample / 8;
    }
    if (!answered) ServerError(server, comp.status);
    return;
  }
  --c->outstanding;
  const bool answered = comp.status.ok() || !IsConnectionError(comp.status);
  if (answered && server < late_strikes_.size()) {
    late_strikes_[server] = 0;
    last_reply_ns_[server] = now_ns_;
    if (comp.status.ok()) errors_in_a_row_[server] = 0;
    store_->NoteAlive(server, now_ns_);
  }
  if (comp.status.ok() && server < latency_ewma_ns_.size()) {
    const uint64_t sample = now_ns_ > rq.post_ns ? now_ns_ - rq.post_ns : 0;
    uint64_t& e = latency_ewma_ns_[server];
    e = e == 0 ? sample : e - e / 8 + sample / 8;
    if (++since_classify_ >= 64) ClassifySlow();
  }
  if (!answered) ServerError(server, comp.status);
  layout_->OnReply(c, split, server, was_write, comp.status);
}

// A server is slow when its reply latency is more than twice the (lower) median of the live
// servers' and more than 100 us above it (a loaded box's jitter is not a straggler). Runs every

void IoThread::CopyHistograms(LatencyHistogram* read, LatencyHistogram* write) {
  std::lock_guard<std::mutex> lock(hist_mu_);
  read->Merge(read_hist_);
  write->Merge(write_hist_);
}

Result<std::vector<size_t>> IoThread::ServersOf(PageId page) const {
  const uint64_t ls = page / store_->pages_per_slab_;
  const uint64_t i = ls / store_->opt_.io_threads;
  std::vector<size_t> out;
  for (int j = 0; j < lay_.width(); ++j) {
    const uint32_t s =
        i < slabs_.size() ? slabs_[i].server[j].load(std::memory_order_relaxed) : kNoServer;
    if (s == kNoServer) return NotFound("page " + std::to_string(page) + " has no slab yet");
    out.push_back(s);
  }
  return out;
}

void IoThread::FailAtShutdown(const QueueItem& item) {
  const Status st = Unavailable("page store is shutting down");
  if (item.kind == QueueItem::Kind::kTrim || item.kind == QueueItem::Kind::kFlush) {
    item.trim->Done(st);
  } else if (item.kind == QueueItem::Kind::kLocate) {
    item.locate->Done(st);
  } else {
    Complete(item.op, st, 0);
  }
}

}  // namespace tessera::client::remote
