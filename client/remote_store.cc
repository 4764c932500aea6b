// The remote PageStore engine (see remote_store.h for the layout and the CRC design).
//
// Per I/O thread: one Transport with a connection to every server, a fixed pool of op contexts
// (Ctx) and of request slots (one per posted WorkRequest; the slot index is the cookie), and the
// metadata of the logical slabs it owns. Everything below the Submit() hand-off runs on the
// owning thread without locks; the only shared mutable state is atomics (server failure flags,
// counters) and the membership/placement view, which is only touched under a mutex on the
// control path (slab allocation, replacement).
#include "client/remote_store.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <condition_variable>
#include <optional>
#include <array>
#include <atomic>
#include <cstring>
#include <future>
#include <mutex>
#include <thread>

#include <boost/lockfree/queue.hpp>

#include "coding/codec.h"
#include "common/clock.h"
#include "common/fd.h"
#include "common/logging.h"
#include "fabric/auth.h"
#include "fabric/cluster_file.h"
#include "placement/membership.h"

namespace tessera::client {

const char* AckPolicyName(AckPolicy policy) {
  return policy == AckPolicy::kAll ? "all" : "first-k";
}

Result<AckPolicy> ParseAckPolicy(std::string_view name) {
  if (name == "all") return AckPolicy::kAll;
  if (name == "first-k" || name == "firstk") return AckPolicy::kFirstK;
  return InvalidArgument("unknown ack policy '" + std::string(name) + "' (all, first-k)");
}

Result<std::vector<RemoteServer>> ParseServerList(std::string_view list) {
  std::vector<RemoteServer> out;
  size_t pos = 0;
  while (pos <= list.size()) {
    size_t comma = list.find(',', pos);
    if (comma == std::string_view::npos) comma = list.size();
    std::string_view word = list.substr(pos, comma - pos);
    if (!word.empty()) {
      TESSERA_ASSIGN_OR_RETURN(fabric::Endpoint e, fabric::ParseEndpoint(word));
      out.push_back(RemoteServer{e, ""});
    }
    pos = comma + 1;
  }
  if (out.empty()) return InvalidArgument("empty server list");
  return out;
}

Result<std::vector<RemoteServer>> LoadServers(const std::string& cluster_file) {
  TESSERA_ASSIGN_OR_RETURN(auto members, fabric::LoadClusterFile(cluster_file));
  std::vector<RemoteServer> out;
  for (const auto& m : members) out.push_back(RemoteServer{m.endpoint, m.rack});
  return out;
}

namespace {

constexpr int kMaxWidth = coding::kMaxSplits;
constexpr uint32_t kNoServer = ~0u;
constexpr size_t kMaxServersForMedian = 4096;

bool IsConnectionError(const Status& s) {
  return s.code() == StatusCode::kUnavailable || s.code() == StatusCode::kCancelled ||
         s.code() == StatusCode::kTimeout;
}

struct Layout {
  int k = 1;
  int r = 0;
  bool copies = false;  // Replication: every split is the whole page.
  size_t split = kPageSize;
  int delta = 0;        // Extra splits asked by a read.
  AckPolicy ack = AckPolicy::kAll;
  int width() const { return k + r; }
};

class RemoteStore;

// One page op in progress (user read/write, or an internal regeneration).
struct Ctx {
  enum class Kind : uint8_t { kRead, kWrite, kRegen };
  Kind kind = Kind::kRead;
  PageOp* op = nullptr;
  PageId page = 0;
  uint32_t slab = 0;  // Index into the thread's slab table.
  uint32_t pidx = 0;  // Page index inside the slab.
  uint64_t start_ns = 0;
  uint32_t seq = 0;  // Page write sequence when the op started.
  uint8_t* buf = nullptr;  // width * split bytes (copies: one page, all splits alias it).
  std::array<uint32_t, kMaxWidth> crcs{};
  uint64_t asked = 0;    // Splits requested (read) / to store (write).
  uint64_t good = 0;     // Read: verified splits. Write: stored splits.
  uint64_t bad = 0;      // Failed or mismatching splits.
  uint64_t corrupt = 0;  // CRC mismatches on live servers.
  int outstanding = 0;   // Requests posted and not completed.
  int regen_split = -1;
  bool finished = false;  // The logical op is over (user notified).
  bool acked = false;
  bool repairing = false;
  bool released = false;
  bool slab_ref = false;  // Counted in its slab's refs (see IoThread::Attach).
  uint64_t retried = 0;  // Write splits already posted a second time.
  Ctx* next_write = nullptr;  // Writes of the same page queued behind this one.
  Ctx* next_free = nullptr;
};

struct Request {
  Ctx* ctx = nullptr;
  int split = 0;
  uint32_t server = 0;
  uint64_t post_ns = 0;
  uint32_t next_free = 0;
  bool live = false;
  bool write = false;
};

// A logical slab: width remote slabs, and the per-page metadata (owned by one I/O thread).
struct Slab {
  bool allocated = false;
  uint64_t id = 0;  // Logical slab number.
  std::array<std::atomic<uint32_t>, kMaxWidth> server;
  std::array<uint64_t, kMaxWidth> remote{};
  std::array<uint32_t, kMaxWidth> regen_cursor{};  // Pages below are rebuilt; pps = complete.
  std::vector<uint32_t> crc;  // pps * width.
  std::vector<uint32_t> seq;
  std::vector<uint8_t> written;
  std::vector<Ctx*> busy;  // The write in flight on each page (head of its queue).
  // A trim arrived while a write of the page was in flight (and no write was queued after the
  // trim): the page reads as zeros and becomes never-written when that write settles.
  std::vector<uint8_t> trim_after;
  uint32_t written_count = 0;  // Pages with written[p] set.
  uint32_t refs = 0;           // Op contexts (user ops, regeneration) using this slab.
  bool free_wanted = false;    // A trim touched it: free the remote slabs once nothing is left.
  Slab() {
    for (auto& s : server) s.store(kNoServer, std::memory_order_relaxed);
  }
};

// Trims travel through the I/O threads' op queues (so they are ordered with the writes
// submitted before them) as PageOps of this internal kind; Submit() never accepts it from a
// caller (ValidateBatch refuses unknown kinds). op->page is the first page, op->user the job.
constexpr PageOp::Kind kTrimKind = static_cast<PageOp::Kind>(0x7f);
struct TrimJob {
  uint64_t count = 0;
  std::mutex mu;
  std::condition_variable cv;
  int left = 0;
  static void Done(PageOp* op) {
    auto* job = static_cast<TrimJob*>(op->user);
    std::lock_guard<std::mutex> lock(job->mu);
    --job->left;
    job->cv.notify_all();
  }
};

struct SharedStats {
  std::atomic<uint64_t> reads{0}, writes{0}, read_errors{0}, write_errors{0}, trims{0},
      degraded_reads{0}, decodes{0}, corruptions_detected{0}, corruptions_repaired{0},
      data_loss{0}, server_failures{0}, regenerations_done{0}, regenerations_pending{0},
      bytes_sent{0}, bytes_received{0}, slabs_freed{0};
};

class IoThread {
 public:
  IoThread(RemoteStore* store, int index);
  ~IoThread();
  Status Start();  // Spawns the thread, connects, returns the connect status.
  void RequestStop();
  void Enqueue(PageOp* op);
  void Wake();
  void CopyHistograms(LatencyHistogram* read, LatencyHistogram* write);
  uint32_t ServerOf(uint64_t logical_slab, int split) const;
  // Number of acknowledged writes whose splits are not all stored yet.
  uint64_t unsettled() const { return unsettled_.load(std::memory_order_acquire); }

 private:
  void Run(std::promise<Status>* started);
  Status Connect();
  void Loop();
  void Drain();
  void StartOp(PageOp* op);
  void StartRead(Ctx* c);
  void StartWrite(Ctx* c);
  void PostWriteSplits(Ctx* c, uint64_t mask);
  void AskMore(Ctx* c);
  bool Post(Ctx* c, int split, fabric::OpKind kind, uint8_t* local);
  // Hands the requests Post() collected to the transport in one batch (one submit for all of
  // them; frames bound for one server leave in one send).
  void FlushPosts();
  // Sleeps until a completion, a Submit() (eventfd) or `timeout_ns`.
  void Sleep(uint64_t timeout_ns);
  void OnCompletion(const fabric::Completion& comp);
  void OnReadSplit(Ctx* c, int split, const Status& st);
  void OnWriteSplit(Ctx* c, int split, uint32_t server, const Status& st);
  void FinishRead(Ctx* c, Status st);
  void WriteSettled(Ctx* c);
  void AckWrite(Ctx* c, Status st);
  void MaybeRelease(Ctx* c);
  void Complete(PageOp* op, Status st, uint64_t start_ns);
  void FailServer(uint32_t server, const std::string& why);
  void HandleLocalFailures();
  void ReplaceSplit(Slab& s, int j);
  void ReplaceSplitOnce(Slab& s, int j);
  Status AllocateSlab(Slab& s);
  // Trim: pages of this thread's slabs in [first, first+count) become never-written; slabs left
  // with no written page give their remote slabs back.
  void DoTrim(PageId first, uint64_t count);
  void Unwrite(Slab& s, uint32_t p);
  void MaybeFreeSlab(Slab& s);
  // Frees every allocated slab's remote slabs (clean shutdown), bounded by `d`.
  void FreeAllSlabs(const Deadline& d);
  void Attach(Ctx* c, uint32_t slab) {
    c->slab = slab;
    c->slab_ref = true;
    ++slabs_[slab].refs;
  }
  void Housekeeping();
  void Regenerate(uint64_t now);
  void OnNotice(const fabric::Completion& comp);
  Ctx* NewCtx();
  uint8_t* SplitBuf(Ctx* c, int j);
  // Source of write split j: copies all come from the one page at the start of the buffer.
  uint8_t* WriteBuf(Ctx* c, int j) { return lay_.copies ? c->buf : SplitBuf(c, j); }
  int regen_active_ = 0;  // (slab, split) pairs whose regeneration cursor is not at the end.
  uint64_t regen_failures_ = 0;
  uint64_t alloc_replacements_ = 0;  // New-slab splits placed on a replacement server.  // Pages this thread could not regenerate (logged at 1, 2, 4, ...).

  RemoteStore* store_;
  const int index_;
  Layout lay_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> sleeping_{false};
  UniqueFd event_fd_;
  boost::lockfree::queue<PageOp*> queue_{4096};

  std::unique_ptr<fabric::Transport> t_;
  std::vector<fabric::ConnectionId> conn_;
  std::vector<uint8_t> local_failed_;
  // Reply latency per server (EWMA, 1/8 weight, from this thread's data ops) and which servers
  // are much slower than the rest (ClassifySlow(), every kClassifyEvery completions): reads ask
  // their splits last.
  std::vector<uint64_t> latency_ewma_ns_;
  std::vector<uint8_t> slow_;
  uint32_t since_classify_ = 0;
  void ClassifySlow();
  uint64_t seen_failure_epoch_ = 0;
  std::vector<Slab> slabs_;
  std::vector<Ctx> ctxs_;
  std::vector<uint8_t> bufs_;
  Ctx* free_ctx_ = nullptr;
  int free_ctx_count_ = 0;
  std::vector<Request> reqs_;
  uint32_t free_req_ = 0;
  std::vector<fabric::Completion> comps_;
  std::vector<fabric::WorkRequest> pending_wrs_;  // Posted by Post(), not yet by FlushPosts().
  std::vector<fabric::WorkRequest> flushing_;

  // Regeneration.
  double regen_tokens_ = 0;
  uint64_t last_tick_ns_ = 0;
  int regen_inflight_ = 0;
  uint64_t last_timeout_scan_ns_ = 0;
  std::atomic<uint64_t> unsettled_{0};
  uint64_t poll_ns_ = 0;           // RemoteStoreOptions::poll_us.
  // A recent MonotonicNs() for request timestamps (refreshed every loop iteration, every op
  // start and after blocking control calls): one clock read per op instead of one per split.
  uint64_t now_ns_ = 0;
  uint64_t last_progress_ns_ = 0;  // When polling without progress began (0: not polling).

  std::mutex hist_mu_;  // Guards the histograms against Stats() readers (uncontended).
  LatencyHistogram read_hist_, write_hist_;
};

class RemoteStore final : public PageStore {
 public:
  RemoteStore(const RemoteStoreOptions& o, Layout lay, std::string name)
      : opt_(o), lay_(lay), name_(std::move(name)) {}
  ~RemoteStore() override { Shutdown(); }

  Status Init();
  void Shutdown() {
    {
      std::lock_guard<std::mutex> lock(monitor_mu_);
      monitor_stop_.store(true);
    }
    monitor_cv_.notify_all();
    if (monitor_.joinable()) monitor_.join();
    for (auto& t : threads_) t->RequestStop();
    threads_.clear();
  }

  std::string name() const override { return name_; }
  uint64_t capacity_pages() const override { return opt_.capacity_pages; }
  double memory_overhead() const override {
    return static_cast<double>(lay_.width()) / static_cast<double>(lay_.k) *
           (lay_.copies ? 1.0 : 1.0);
  }
  Status Submit(std::span<PageOp* const> ops) override;
  Status Trim(PageId first, uint64_t count) override;
  Status Flush() override;
  PageStoreStats Stats() const override;

  // Shared with the I/O threads.
  const RemoteStoreOptions opt_;
  const Layout lay_;
  const std::string name_;
  std::optional<coding::Codec> codec_;
  uint64_t slab_size_ = 0;
  uint64_t pages_per_slab_ = 0;
  uint64_t num_slabs_ = 0;
  uint64_t client_id_ = 0;
  std::unique_ptr<std::atomic<bool>[]> failed_;
  std::atomic<uint64_t> failure_epoch_{0};
  mutable SharedStats stats_;

  // Membership, placement and slab counts per server: control path, under mu_.
  std::mutex mu_;
  placement::SnapshotPtr snap_;
  placement::PlacementPtr policy_;
  std::vector<uint64_t> load_;

  std::vector<std::unique_ptr<IoThread>> threads_;
  // Heartbeats.
  std::thread monitor_;
  std::atomic<bool> monitor_stop_{false};
  std::mutex monitor_mu_;
  std::condition_variable monitor_cv_;

  void MarkFailed(uint32_t server, const std::string& why) {
    if (failed_[server].exchange(true)) return;
    stats_.server_failures.fetch_add(1);
    TLOG(WARNING) << name_ << ": server " << opt_.servers[server].endpoint.ToString()
                  << " failed: " << why;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto next = snap_->WithState(server, placement::ServerState::kFailed);
      if (next.ok()) {
        auto pol = policy_->Reconfigure(*next);
        snap_ = *next;
        if (pol.ok()) policy_ = *pol;
      }
    }
    failure_epoch_.fetch_add(1, std::memory_order_release);
    for (auto& t : threads_) t->Wake();
  }

  void MonitorLoop();
};

// ------------------------------------------------------------------------------------------

IoThread::IoThread(RemoteStore* store, int index)
    : store_(store), index_(index), lay_(store->lay_) {}

IoThread::~IoThread() {
  RequestStop();
}

void IoThread::RequestStop() {
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

void IoThread::Enqueue(PageOp* op) {
  while (!queue_.push(op)) {
  }  // push() allocates a node beyond the reserve; it fails only when memory is exhausted.
  if (sleeping_.load(std::memory_order_seq_cst)) Wake();
}

Status IoThread::Start() {
  int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (fd < 0) return ErrnoError("eventfd");
  event_fd_ = UniqueFd(fd);
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
  TESSERA_ASSIGN_OR_RETURN(t_, fabric::Transport::Create(to));
  fabric::ConnectOptions co;
  co.secret = o.secret;
  co.client_id = store_->client_id_;
  for (size_t i = 0; i < o.servers.size(); ++i) {
    co.deadline = Deadline::AfterMs(o.connect_timeout_ms);
    auto c = t_->Connect(o.servers[i].endpoint, co);
    if (!c.ok()) {
      return Unavailable("cannot connect to " + o.servers[i].endpoint.ToString() + ": " +
                         c.status().ToString());
    }
    conn_.push_back(*c);
    TESSERA_ASSIGN_OR_RETURN(auto info, t_->Info(*c));
    if (info.slab_size != store_->slab_size_) {
      return InvalidArgument("servers disagree on the slab size: " +
                             std::to_string(info.slab_size) + " at " +
                             o.servers[i].endpoint.ToString() + " vs " +
                             std::to_string(store_->slab_size_));
    }
  }
  local_failed_.assign(o.servers.size(), 0);
  latency_ewma_ns_.assign(o.servers.size(), 0);
  slow_.assign(o.servers.size(), 0);
  return Status::Ok();
}

void IoThread::Run(std::promise<Status>* started) {
  Status st = Connect();
  if (!st.ok()) {
    started->set_value(st);
    return;
  }
  // The slab size is known once thread 0 connected; Init() starts the others after it.
  const uint64_t pps = store_->pages_per_slab_;
  const int T = store_->opt_.io_threads;
  const uint64_t mine = (store_->num_slabs_ + T - 1 - index_) / T;
  slabs_ = std::vector<Slab>(mine);
  const uint32_t nctx = store_->opt_.max_inflight_pages + 16;
  const size_t per = static_cast<size_t>(lay_.width()) * lay_.split;
  ctxs_ = std::vector<Ctx>(nctx);
  bufs_.assign(per * nctx, 0);
  for (uint32_t i = 0; i < nctx; ++i) {
    ctxs_[i].buf = bufs_.data() + per * i;
    ctxs_[i].next_free = free_ctx_;
    free_ctx_ = &ctxs_[i];
  }
  free_ctx_count_ = static_cast<int>(nctx);
  const uint32_t nreq =
      std::min<uint32_t>(65536, nctx * static_cast<uint32_t>(lay_.width()) * 2);
  reqs_ = std::vector<Request>(nreq);
  pending_wrs_.reserve(nreq);
  flushing_.reserve(nreq);
  if (Status w = t_->SetWakeFd(event_fd_.get()); !w.ok()) {
    started->set_value(w);
    return;
  }
  for (uint32_t i = 0; i < nreq; ++i) reqs_[i].next_free = i + 1;
  free_req_ = 0;
  comps_.resize(256);
  (void)pps;
  started->set_value(Status::Ok());
  Loop();
  // Shutdown: fail queued ops, then give in-flight ones a bounded time to finish.
  PageOp* op;
  while (queue_.pop(op)) {
    if (op->kind == kTrimKind) {
      op->status = Unavailable("page store is shutting down");
      op->done(op);
      continue;
    }
    Complete(op, Unavailable("page store is shutting down"), 0);
  }
  Deadline d = Deadline::AfterMs(2000);
  FlushPosts();
  while (t_->inflight() > 0 && !d.Expired()) {
    size_t n = t_->Wait(comps_, Deadline(MonotonicNs() + 10000000));
    for (size_t i = 0; i < n; ++i) OnCompletion(comps_[i]);
    FlushPosts();
  }
  bool all_settled = true;
  for (auto& c : ctxs_) {
    if (c.op != nullptr && !c.finished) {
      c.finished = true;
      Complete(c.op, Unavailable("page store is shutting down"), c.start_ns);
      c.op = nullptr;
    }
    if (!c.released && c.outstanding > 0) all_settled = false;
  }
  // A clean shutdown gives the remote memory back at once (the memservers would otherwise keep
  // it until the owner's lease runs out, see --orphan_grace). Bounded: a server that does not
  // answer keeps its slabs until its lease reclaims them.
  if (all_settled) FreeAllSlabs(Deadline::AfterMs(2000));
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
    now_ns_ = MonotonicNs();
    bool progress = false;
    size_t n = t_->Poll(comps_);
    for (size_t i = 0; i < n; ++i) OnCompletion(comps_[i]);
    progress |= n > 0;
    const int before = free_ctx_count_;
    Drain();
    progress |= free_ctx_count_ != before;
    Housekeeping();
    progress |= !pending_wrs_.empty();
    FlushPosts();
    if (progress) {
      last_progress_ns_ = 0;
      continue;
    }
    if (poll_ns_ > 0) {
      const uint64_t now = MonotonicNs();
      if (last_progress_ns_ == 0) last_progress_ns_ = now;
      if (now - last_progress_ns_ < poll_ns_) continue;  // Keep polling a little longer.
      last_progress_ns_ = 0;
    }
    // Nothing to do until a reply, a Submit() or a housekeeping tick: the transport's Wait()
    // also watches the eventfd, so a new op is started at once even while replies are still
    // out (e.g. a late-binding read's straggler split).
    Sleep(t_->inflight() > 0 || regen_active_ > 0 ? 1000000 : 20000000);
  }
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

void IoThread::Drain() {
  PageOp* op;
  while (free_ctx_ != nullptr && queue_.pop(op)) StartOp(op);
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

void IoThread::StartOp(PageOp* op) {
  const uint64_t now = MonotonicNs();
  now_ns_ = now;
  if (op->page >= store_->opt_.capacity_pages) {
    Complete(op,
             OutOfRange("page " + std::to_string(op->page) + " is beyond the store's " +
                        std::to_string(store_->opt_.capacity_pages) + " pages"),
             now);
    return;
  }
  if (op->kind == kTrimKind) {
    DoTrim(op->page, static_cast<TrimJob*>(op->user)->count);
    op->status = Status::Ok();
    op->done(op);
    return;
  }
  Ctx* c = NewCtx();
  c->op = op;
  c->page = op->page;
  c->start_ns = now;
  const uint64_t ls = op->page / store_->pages_per_slab_;
  Attach(c, static_cast<uint32_t>(ls / store_->opt_.io_threads));
  c->pidx = static_cast<uint32_t>(op->page % store_->pages_per_slab_);
  if (op->kind == PageOp::Kind::kRead) {
    c->kind = Ctx::Kind::kRead;
    StartRead(c);
  } else {
    c->kind = Ctx::Kind::kWrite;
    std::memcpy(c->buf, op->buf, kPageSize);  // The caller's buffer is free once acked.
    StartWrite(c);
  }
}

bool IoThread::Post(Ctx* c, int split, fabric::OpKind kind, uint8_t* local) {
  Slab& s = slabs_[c->slab];
  const uint32_t server = s.server[split].load(std::memory_order_relaxed);
  if (server == kNoServer || local_failed_[server] ||
      store_->failed_[server].load(std::memory_order_relaxed)) {
    return false;
  }
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
    FailServer(server, "connection lost");
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
  (kind == fabric::OpKind::kWrite ? store_->stats_.bytes_sent : store_->stats_.bytes_received)
      .fetch_add(lay_.split, std::memory_order_relaxed);
  return true;
}

// ---- reads ----

void IoThread::StartRead(Ctx* c) {
  Slab& s = slabs_[c->slab];
  if (!s.allocated || !s.written[c->pidx]) {
    std::memset(c->op->buf, 0, kPageSize);
    c->finished = true;
    Complete(c->op, Status::Ok(), c->start_ns);
    c->op = nullptr;
    MaybeRelease(c);
    return;
  }
  if (Ctx* w = s.busy[c->pidx]) {
    while (w->next_write != nullptr) w = w->next_write;
    if (s.trim_after[c->pidx]) {
      std::memset(c->op->buf, 0, kPageSize);  // Trimmed after the write in flight.
    } else {
      std::memcpy(c->op->buf, w->buf, kPageSize);  // Newest data, possibly not yet acked.
    }
    c->finished = true;
    Complete(c->op, Status::Ok(), c->start_ns);
    c->op = nullptr;
    MaybeRelease(c);
    return;
  }
  c->seq = s.seq[c->pidx];
  std::memcpy(c->crcs.data(), &s.crc[static_cast<size_t>(c->pidx) * lay_.width()],
              sizeof(uint32_t) * lay_.width());
  c->asked = c->good = c->bad = c->corrupt = 0;
  AskMore(c);
}

// Asks splits until good + outstanding reaches k + delta (or nothing is left to ask), preferring
// data splits, then splits whose regeneration has passed this page. Finishes with DataLoss when
// fewer than k can still arrive.
void IoThread::AskMore(Ctx* c) {
  Slab& s = slabs_[c->slab];
  const int want = (c->finished ? 0 : lay_.k + (c->bad == 0 ? lay_.delta : 0));
  int have = std::popcount(c->good) + c->outstanding;
  // Pass 0: settled splits on servers that answer normally (data splits first, so an
  // undisturbed read needs no decode); pass 1: settled splits on servers currently much slower
  // than the others (a straggler is asked only when the others do not suffice); pass 2: splits
  // whose regeneration has not reached this page yet.
  for (int pass = 0; pass < 3 && have < want; ++pass) {
    for (int j = 0; j < lay_.width() && have < want; ++j) {
      const uint64_t bit = 1ull << j;
      if ((c->asked & bit) != 0) continue;
      if (c->regen_split == j) continue;
      const bool settled = s.regen_cursor[j] > c->pidx;
      if (!settled) {
        if (pass != 2) continue;
      } else {
        const uint32_t server = s.server[j].load(std::memory_order_relaxed);
        const bool slow = server < slow_.size() && slow_[server];
        if (pass != (slow ? 1 : 0)) continue;
      }
      c->asked |= bit;
      if (Post(c, j, fabric::OpKind::kRead, SplitBuf(c, j))) {
        ++have;
      } else {
        c->bad |= bit;
      }
    }
  }
  if (have >= lay_.k || c->finished) return;
  if (c->outstanding > 0) return;  // Wait: more may arrive (they count toward k).
  if (s.seq[c->pidx] != c->seq || s.busy[c->pidx] != nullptr) {
    if (c->kind == Ctx::Kind::kRead) {  // A write raced with us: start over.
      StartRead(c);
      return;
    }
  }
  FinishRead(c, DataLoss("page " + std::to_string(c->page) + ": only " +
                         std::to_string(std::popcount(c->good)) + " of the " +
                         std::to_string(lay_.width()) + " splits are readable and intact (" +
                         std::to_string(lay_.k) + " needed); the page's data is lost"));
}

void IoThread::OnReadSplit(Ctx* c, int split, const Status& st) {
  const uint64_t bit = 1ull << split;
  if (c->finished) return;
  if (!st.ok()) {
    c->bad |= bit;
  } else {
    uint32_t crc = coding::Crc32c(SplitBuf(c, split), lay_.split);
    if (crc == c->crcs[split]) {
      c->good |= bit;
    } else {
      c->bad |= bit;
      Slab& s = slabs_[c->slab];
      if (s.regen_cursor[split] > c->pidx && s.seq[c->pidx] == c->seq) {
        c->corrupt |= bit;
        store_->stats_.corruptions_detected.fetch_add(1, std::memory_order_relaxed);
      }
    }
  }
  if (std::popcount(c->good) >= lay_.k) {
    FinishRead(c, Status::Ok());
    return;
  }
  AskMore(c);
}

void IoThread::FinishRead(Ctx* c, Status st) {
  c->finished = true;
  Slab& s = slabs_[c->slab];
  uint8_t page[kPageSize];
  uint8_t* out = c->kind == Ctx::Kind::kRead ? c->op->buf : page;
  if (st.ok()) {
    if (lay_.copies) {
      std::memcpy(out, SplitBuf(c, std::countr_zero(c->good)), kPageSize);
    } else {
      const uint64_t data_mask = (1ull << lay_.k) - 1;
      if ((c->good & data_mask) == data_mask) {
        std::memcpy(out, c->buf, kPageSize);
      } else {
        const uint8_t* splits[kMaxWidth];
        for (int j = 0; j < lay_.width(); ++j) splits[j] = SplitBuf(c, j);
        auto info = store_->codec_->ReconstructTrusted(splits, c->good, out);
        if (!info.ok()) {
          st = info.status();
        } else {
          store_->stats_.decodes.fetch_add(1, std::memory_order_relaxed);
        }
      }
    }
    const uint64_t preferred = lay_.copies ? 1 : (1ull << lay_.k) - 1;
    if (c->kind == Ctx::Kind::kRead && (c->good & preferred) != preferred) {
      store_->stats_.degraded_reads.fetch_add(1, std::memory_order_relaxed);
    }
  } else if (st.code() == StatusCode::kDataLoss) {
    store_->stats_.data_loss.fetch_add(c->kind == Ctx::Kind::kRead ? 1 : 0);
  }
  // Splits to rewrite: corrupt ones (read) or the regenerated one; only if no write raced.
  uint64_t rewrite = c->kind == Ctx::Kind::kRegen ? (1ull << c->regen_split) : c->corrupt;
  if (!st.ok() || s.seq[c->pidx] != c->seq || s.busy[c->pidx] != nullptr) rewrite = 0;
  if (c->kind == Ctx::Kind::kRead) {
    Complete(c->op, st, c->start_ns);
    c->op = nullptr;
  } else {
    --regen_inflight_;
    if (!st.ok()) {
      const uint64_t failures = ++regen_failures_;
      if ((failures & (failures - 1)) == 0) {  // Log at 1, 2, 4, ... failures.
        TLOG(WARNING) << store_->name_ << ": cannot regenerate page " << c->page << ": " << st
                      << " (" << failures << " pages so far on this thread)";
      }
    }
    store_->stats_.regenerations_pending.fetch_sub(1, std::memory_order_relaxed);
  }
  if (rewrite != 0) {
    // Rebuild the full split set from the page into the ctx buffer, then write the chosen ones.
    // Requests still in flight target the ctx buffer, so wait for them: only the splits being
    // rewritten are touched and they are not in flight (they completed, wrongly).
    if (lay_.copies) {
      for (int j = 0; j < lay_.width(); ++j) {
        if (rewrite & (1ull << j)) std::memcpy(SplitBuf(c, j), out, kPageSize);
      }
    } else {
      for (int j = 0; j < lay_.k; ++j) {
        if (rewrite & (1ull << j)) std::memcpy(SplitBuf(c, j), out + j * lay_.split, lay_.split);
      }
      if (rewrite >> lay_.k) {
        uint8_t parity_buf[coding::kMaxParitySplits][kPageSize];
        uint8_t* parity[coding::kMaxParitySplits];
        for (int j = 0; j < lay_.r; ++j) parity[j] = parity_buf[j];
        store_->codec_->Encode(out, parity);
        for (int j = 0; j < lay_.r; ++j) {
          if (rewrite & (1ull << (lay_.k + j))) {
            std::memcpy(SplitBuf(c, lay_.k + j), parity[j], lay_.split);
          }
        }
      }
    }
    c->repairing = true;
    c->asked = rewrite;
    c->good = 0;
    for (int j = 0; j < lay_.width(); ++j) {
      if ((rewrite & (1ull << j)) && !Post(c, j, fabric::OpKind::kWrite, SplitBuf(c, j))) {
        c->asked &= ~(1ull << j);
      }
    }
  }
  MaybeRelease(c);
}

// ---- writes ----

Status IoThread::AllocateSlab(Slab& s) {
  const uint64_t ls = static_cast<uint64_t>(&s - slabs_.data()) * store_->opt_.io_threads +
                      index_;
  std::vector<placement::ServerId> servers;
  {
    std::lock_guard<std::mutex> lock(store_->mu_);
    auto p = store_->policy_->Place(*store_->snap_, ls, store_->load_);
    if (!p.ok()) return Unavailable("no placement for slab " + std::to_string(ls) + ": " +
                                    p.status().ToString());
    servers = *p;
    for (auto id : servers) store_->load_[id]++;
  }
  s.id = ls;
  const size_t pps = store_->pages_per_slab_;
  // A server that does not answer an allocation within the op timeout is declared failed, as
  // for data ops; a split whose server failed or refused (full) is placed on the replacement
  // placement chooses, a few times at most, instead of failing the write.
  constexpr int kMaxReplacements = 3;
  const uint32_t attempt_ms =
      std::min(store_->opt_.control_timeout_ms, store_->opt_.op_timeout_ms);
  for (int j = 0; j < lay_.width(); ++j) {
    Status last;
    bool done = false;
    for (int attempt = 0; attempt <= kMaxReplacements && !done; ++attempt) {
      const uint32_t server = servers[j];
      if (!local_failed_[server] && !store_->failed_[server].load()) {
        auto r = t_->AllocSlab(conn_[server], {}, Deadline::AfterMs(attempt_ms));
        if (r.ok()) {
          s.server[j].store(server, std::memory_order_relaxed);
          s.remote[j] = r->slab_id;
          s.regen_cursor[j] = static_cast<uint32_t>(pps);
          done = true;
          break;
        }
        last = r.status();
        if (IsConnectionError(r.status())) FailServer(server, r.status().ToString());
      } else {
        last = Unavailable("server is failed");
      }
      if (attempt == kMaxReplacements) break;
      // Re-place split j (servers[j] stays in `servers` until replaced: never chosen again).
      std::lock_guard<std::mutex> lock(store_->mu_);
      auto rep = store_->policy_->ChooseReplacement(*store_->snap_, ls, servers, j,
                                                    store_->load_);
      if (!rep.ok()) {
        auto fresh = store_->policy_->Place(*store_->snap_, ls + attempt + 1, store_->load_);
        if (fresh.ok()) {
          for (placement::ServerId id : *fresh) {
            if (std::find(servers.begin(), servers.end(), id) == servers.end()) {
              rep = id;
              break;
            }
          }
        }
      }
      if (!rep.ok()) break;
      const uint64_t n = ++alloc_replacements_;
      if ((n & (n - 1)) == 0) {  // Log at 1, 2, 4, ... (a full server would flood the log).
        TLOG(INFO) << store_->name_ << ": slab " << ls << " split " << j << ": "
                   << store_->opt_.servers[server].endpoint.ToString() << " could not allocate ("
                   << last << "); placing it on "
                   << store_->opt_.servers[*rep].endpoint.ToString() << " (" << n
                   << " splits re-placed so far on this thread)";
      }
      if (store_->load_[server] > 0) store_->load_[server]--;
      store_->load_[*rep]++;
      servers[j] = *rep;
    }
    if (!done) {
      // Roll back what we took.
      for (int i = 0; i < j; ++i) {
        const uint32_t srv = s.server[i].load();
        if (!local_failed_[srv] && !store_->failed_[srv].load()) {
          (void)t_->FreeSlab(conn_[srv], s.remote[i], Deadline::AfterMs(attempt_ms));
        }
        s.server[i].store(kNoServer);
      }
      {
        std::lock_guard<std::mutex> lock(store_->mu_);
        for (auto id : servers) {
          if (store_->load_[id] > 0) store_->load_[id]--;
        }
      }
      return Unavailable("cannot allocate a slab on " +
                         store_->opt_.servers[servers[j]].endpoint.ToString() + ": " +
                         last.ToString());
    }
  }
  s.crc.assign(pps * lay_.width(), 0);
  // Sequences only ever grow (also across a free and a reallocation), so an op context that
  // saw an older incarnation of a page never mistakes it for the current one.
  if (s.seq.size() != pps) s.seq.assign(pps, 0);
  s.written.assign(pps, 0);
  s.busy.assign(pps, nullptr);
  s.trim_after.assign(pps, 0);
  s.written_count = 0;
  s.free_wanted = false;
  s.allocated = true;
  return Status::Ok();
}

void IoThread::StartWrite(Ctx* c) {
  Slab& s = slabs_[c->slab];
  if (!s.allocated) {
    Status st = AllocateSlab(s);
    now_ns_ = MonotonicNs();  // The control calls may have blocked.
    if (!st.ok()) {
      c->finished = true;
      Complete(c->op, st, c->start_ns);
      c->op = nullptr;
      MaybeRelease(c);
      return;
    }
  }
  if (Ctx* w = s.busy[c->pidx]; w != nullptr && w != c) {
    while (w->next_write != nullptr) w = w->next_write;
    w->next_write = c;  // Started when the writes before it are settled.
    s.trim_after[c->pidx] = 0;  // This write comes after any trim of the page.
    return;
  }
  s.busy[c->pidx] = c;
  const int W = lay_.width();
  if (lay_.copies) {
    const uint32_t crc = coding::Crc32c(WriteBuf(c, 0), kPageSize);
    for (int j = 0; j < W; ++j) c->crcs[j] = crc;
  } else {
    uint8_t* parity[coding::kMaxParitySplits];
    for (int j = 0; j < lay_.r; ++j) parity[j] = SplitBuf(c, lay_.k + j);
    store_->codec_->EncodeWithCrcs(c->buf, parity, c->crcs.data());
  }
  // Publish: reads from now on are served from this ctx until it settles, then verify against
  // these CRCs.
  s.seq[c->pidx]++;
  c->seq = s.seq[c->pidx];
  std::memcpy(&s.crc[static_cast<size_t>(c->pidx) * W], c->crcs.data(), sizeof(uint32_t) * W);
  if (!s.written[c->pidx]) {
    for (int j = 0; j < W; ++j) {
      if (s.regen_cursor[j] <= c->pidx) {
        store_->stats_.regenerations_pending.fetch_add(1, std::memory_order_relaxed);
      }
    }
  }
  if (!s.written[c->pidx]) ++s.written_count;
  s.written[c->pidx] = 1;
  c->asked = (W == 64 ? ~0ull : (1ull << W) - 1);
  c->good = c->bad = 0;
  unsettled_.fetch_add(1, std::memory_order_relaxed);
  PostWriteSplits(c, c->asked);
}

void IoThread::PostWriteSplits(Ctx* c, uint64_t mask) {
  Slab& s = slabs_[c->slab];
  for (int j = 0; j < lay_.width(); ++j) {
    const uint64_t bit = 1ull << j;
    if ((mask & bit) == 0) continue;
    if (Post(c, j, fabric::OpKind::kWrite, WriteBuf(c, j))) continue;
    // Its server is failed: re-place the split and post it there.
    const uint32_t server = s.server[j].load(std::memory_order_relaxed);
    if (server != kNoServer && store_->failed_[server].load()) {
      HandleLocalFailures();
    }
    if (!Post(c, j, fabric::OpKind::kWrite, WriteBuf(c, j))) c->bad |= bit;
  }
  if (c->outstanding == 0) WriteSettled(c);
  else if (!c->acked && lay_.ack == AckPolicy::kFirstK && std::popcount(c->good) >= lay_.k) {
    AckWrite(c, Status::Ok());
  }
}

void IoThread::OnWriteSplit(Ctx* c, int split, uint32_t server, const Status& st) {
  const uint64_t bit = 1ull << split;
  if (c->kind != Ctx::Kind::kWrite) {  // A repair or regeneration write.
    if (st.ok()) {
      if (c->kind == Ctx::Kind::kRegen) {
        store_->stats_.regenerations_done.fetch_add(1, std::memory_order_relaxed);
      } else {
        store_->stats_.corruptions_repaired.fetch_add(1, std::memory_order_relaxed);
      }
    } else if (IsConnectionError(st)) {
      // The replacement's server failed too; the split will be re-placed and rebuilt.
    }
    MaybeRelease(c);
    return;
  }
  if (st.ok()) {
    c->good |= bit;
  } else {
    // Re-place: the server is failed (connection loss / timeout) or dropped the slab.
    Slab& s = slabs_[c->slab];
    if (IsConnectionError(st)) FailServer(server, st.ToString());  // Idempotent.
    if ((c->retried & bit) == 0 &&
        (s.server[split].load(std::memory_order_relaxed) != server ||
         (server != kNoServer && !store_->failed_[server].load()))) {
      // Moved to a replacement (or the server is fine and refused once): retry once there.
      c->retried |= bit;
      if (!Post(c, split, fabric::OpKind::kWrite, WriteBuf(c, split))) c->bad |= bit;
    } else {
      c->bad |= bit;
    }
  }
  if (!c->acked) {
    const int stored = std::popcount(c->good);
    const bool all_done = c->outstanding == 0;
    if ((lay_.ack == AckPolicy::kFirstK && stored >= lay_.k) ||
        (all_done && stored >= lay_.k)) {
      AckWrite(c, Status::Ok());
    } else if (all_done) {
      AckWrite(c, Unavailable("page " + std::to_string(c->page) + ": only " +
                              std::to_string(stored) + " of " + std::to_string(lay_.width()) +
                              " splits could be stored"));
    }
  }
  if (c->outstanding == 0) WriteSettled(c);
}

void IoThread::AckWrite(Ctx* c, Status st) {
  c->acked = true;
  if (!st.ok()) {
    // The page is not readable as written: forget it rather than return wrong bytes.
    Slab& s = slabs_[c->slab];
    if (s.written[c->pidx]) Unwrite(s, c->pidx);
  }
  Complete(c->op, st, c->start_ns);
  c->op = nullptr;
}

void IoThread::WriteSettled(Ctx* c) {
  if (!c->acked) {
    const int stored = std::popcount(c->good);
    AckWrite(c, stored >= lay_.k ? Status::Ok()
                                 : Unavailable("page " + std::to_string(c->page) + ": only " +
                                               std::to_string(stored) +
                                               " splits could be stored"));
  }
  c->finished = true;
  unsettled_.fetch_sub(1, std::memory_order_release);
  Slab& s = slabs_[c->slab];
  Ctx* next = c->next_write;
  s.busy[c->pidx] = next;
  if (next == nullptr && s.trim_after[c->pidx]) {
    s.trim_after[c->pidx] = 0;
    if (s.written[c->pidx]) Unwrite(s, c->pidx);
  }
  MaybeRelease(c);
  if (next != nullptr) StartWrite(next);
}

void IoThread::MaybeRelease(Ctx* c) {
  if (!c->finished || c->outstanding > 0 || c->released) return;
  c->released = true;
  c->next_free = free_ctx_;
  free_ctx_ = c;
  ++free_ctx_count_;
  if (c->slab_ref) {
    c->slab_ref = false;
    Slab& s = slabs_[c->slab];
    if (--s.refs == 0 && s.free_wanted) MaybeFreeSlab(s);
  }
}

// ---- trims and slab release ----

void IoThread::Unwrite(Slab& s, uint32_t p) {
  s.written[p] = 0;
  --s.written_count;
  ++s.seq[p];  // Reads and regenerations in flight on the old contents see the change.
  // The page no longer needs rebuilding on splits whose regeneration has not reached it.
  for (int j = 0; j < lay_.width(); ++j) {
    if (s.regen_cursor[j] <= p) {
      store_->stats_.regenerations_pending.fetch_sub(1, std::memory_order_relaxed);
    }
  }
}

void IoThread::DoTrim(PageId first, uint64_t count) {
  if (count == 0 || first >= store_->opt_.capacity_pages) return;
  const uint64_t last = std::min<uint64_t>(first + count, store_->opt_.capacity_pages);  // excl.
  const uint64_t pps = store_->pages_per_slab_;
  const uint64_t T = static_cast<uint64_t>(store_->opt_.io_threads);
  for (uint64_t ls = first / pps; ls * pps < last; ++ls) {
    if (ls % T != static_cast<uint64_t>(index_)) continue;
    Slab& s = slabs_[ls / T];
    if (!s.allocated) continue;
    const uint64_t base = ls * pps;
    const uint32_t p0 = static_cast<uint32_t>(std::max(first, base) - base);
    const uint32_t p1 = static_cast<uint32_t>(std::min(last, base + pps) - base);
    for (uint32_t p = p0; p < p1; ++p) {
      if (s.busy[p] != nullptr) {
        s.trim_after[p] = 1;  // Applied when the write(s) before the trim settle.
      } else if (s.written[p]) {
        Unwrite(s, p);
      }
    }
    s.free_wanted = true;
    MaybeFreeSlab(s);
  }
}

void IoThread::MaybeFreeSlab(Slab& s) {
  if (!s.allocated || !s.free_wanted || s.written_count > 0 || s.refs > 0) return;
  const uint32_t pps = static_cast<uint32_t>(store_->pages_per_slab_);
  std::array<std::pair<uint32_t, uint64_t>, kMaxWidth> remotes{};
  // Unpublish first: from here on a write to this logical slab allocates a fresh set, and a
  // server failure noticed during the frees below does not try to re-place these splits.
  s.allocated = false;
  s.free_wanted = false;
  for (int j = 0; j < lay_.width(); ++j) {
    if (s.regen_cursor[j] < pps) --regen_active_;  // No written page is left to rebuild.
    s.regen_cursor[j] = pps;
    remotes[j] = {s.server[j].load(std::memory_order_relaxed), s.remote[j]};
    s.server[j].store(kNoServer, std::memory_order_relaxed);
  }
  {
    std::lock_guard<std::mutex> lock(store_->mu_);
    for (int j = 0; j < lay_.width(); ++j) {
      const uint32_t server = remotes[j].first;
      if (server != kNoServer && store_->load_[server] > 0) store_->load_[server]--;
    }
  }
  const uint32_t ms = std::min<uint32_t>(store_->opt_.control_timeout_ms, 1000);
  for (int j = 0; j < lay_.width(); ++j) {
    const uint32_t server = remotes[j].first;
    if (server == kNoServer || local_failed_[server] || store_->failed_[server].load()) continue;
    Status st = t_->FreeSlab(conn_[server], remotes[j].second, Deadline::AfterMs(ms));
    if (!st.ok()) {
      // Not fatal: the data is unreachable from now on; the server reclaims the slab when this
      // client's lease ends.
      TLOG(DEBUG) << store_->name_ << ": cannot free slab " << remotes[j].second << " on "
                  << store_->opt_.servers[server].endpoint.ToString() << ": " << st;
      if (IsConnectionError(st)) FailServer(server, st.ToString());
    }
  }
  store_->stats_.slabs_freed.fetch_add(1, std::memory_order_relaxed);
  now_ns_ = MonotonicNs();  // The control calls may have blocked.
}

void IoThread::FreeAllSlabs(const Deadline& d) {
  for (Slab& s : slabs_) {
    if (!s.allocated) continue;
    for (int j = 0; j < lay_.width(); ++j) {
      const uint32_t server = s.server[j].load(std::memory_order_relaxed);
      if (server == kNoServer || local_failed_[server] || store_->failed_[server].load()) continue;
      if (d.Expired() || !t_->Connected(conn_[server])) continue;
      (void)t_->FreeSlab(conn_[server], s.remote[j], d);
    }
    s.allocated = false;
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
  rq.live = false;
  rq.next_free = free_req_;
  free_req_ = static_cast<uint32_t>(comp.cookie);
  --c->outstanding;
  if (comp.status.ok() && server < latency_ewma_ns_.size()) {
    const uint64_t sample = now_ns_ > rq.post_ns ? now_ns_ - rq.post_ns : 0;
    uint64_t& e = latency_ewma_ns_[server];
    e = e == 0 ? sample : e - e / 8 + sample / 8;
    if (++since_classify_ >= 64) ClassifySlow();
  }
  if (!comp.status.ok() && IsConnectionError(comp.status)) {
    FailServer(rq.server, comp.status.ToString());
  }
  if (!was_write) {
    OnReadSplit(c, split, comp.status);
    MaybeRelease(c);
  } else {
    OnWriteSplit(c, split, server, comp.status);
  }
}

// A server is slow when its reply latency is more than twice the (lower) median of the live
// servers' and more than 100 us above it (a loaded box's jitter is not a straggler). Runs every
// 64 completions and at least every millisecond while completions arrive.
void IoThread::ClassifySlow() {
  since_classify_ = 0;
  uint64_t v[kMaxServersForMedian];
  size_t n = 0;
  for (size_t i = 0; i < latency_ewma_ns_.size() && n < kMaxServersForMedian; ++i) {
    if (!local_failed_[i] && latency_ewma_ns_[i] != 0) v[n++] = latency_ewma_ns_[i];
  }
  if (n < 2) return;
  std::nth_element(v, v + (n - 1) / 2, v + n);
  const uint64_t median = v[(n - 1) / 2];  // The lower median (of two servers: the faster).
  for (size_t i = 0; i < latency_ewma_ns_.size(); ++i) {
    uint64_t& e = latency_ewma_ns_[i];
    slow_[i] = e > 2 * median && e > median + 100000;
    // A slow server's splits are rarely read, so its estimate would go stale: let it drift
    // down so the server is tried again now and then (writes and those reads refresh it).
    if (slow_[i]) e -= e / 128;
  }
}

void IoThread::OnNotice(const fabric::Completion& comp) {
  uint32_t server = kNoServer;
  for (size_t i = 0; i < conn_.size(); ++i) {
    if (conn_[i] == comp.connection) server = static_cast<uint32_t>(i);
  }
  if (server == kNoServer) return;
  if (comp.notice.kind == fabric::NoticeKind::kShuttingDown) {
    FailServer(server, "it is shutting down");
    return;
  }
  // Eviction: move that split of the slab elsewhere now, rebuild it in the background.
  for (Slab& s : slabs_) {
    if (!s.allocated) continue;
    for (int j = 0; j < lay_.width(); ++j) {
      if (s.server[j].load(std::memory_order_relaxed) == server &&
          s.remote[j] == comp.notice.slab_id) {
        TLOG(INFO) << store_->name_ << ": slab " << comp.notice.slab_id << " on "
                   << store_->opt_.servers[server].endpoint.ToString()
                   << " is being evicted; moving split " << j << " of logical slab " << s.id;
        ReplaceSplit(s, j);
      }
    }
  }
}

void IoThread::FailServer(uint32_t server, const std::string& why) {
  store_->MarkFailed(server, why);
  HandleLocalFailures();
}

void IoThread::HandleLocalFailures() {
  const uint64_t epoch = store_->failure_epoch_.load(std::memory_order_acquire);
  if (epoch == seen_failure_epoch_) return;
  seen_failure_epoch_ = epoch;
  for (uint32_t i = 0; i < conn_.size(); ++i) {
    if (local_failed_[i] || !store_->failed_[i].load()) continue;
    local_failed_[i] = 1;
    // In-flight ops to it complete with Cancelled (reads then ask other splits, writes re-place).
    // No GOODBYE exchange: a stopped server would hold this thread for its whole timeout.
    (void)t_->Abort(conn_[i]);
    for (Slab& s : slabs_) {
      if (!s.allocated) continue;
      for (int j = 0; j < lay_.width(); ++j) {
        if (s.server[j].load(std::memory_order_relaxed) == i) ReplaceSplit(s, j);
      }
    }
  }
}

void IoThread::ReplaceSplit(Slab& s, int j) {
  ReplaceSplitOnce(s, j);
  now_ns_ = MonotonicNs();  // AllocSlab / FreeSlab may have blocked.
}

void IoThread::ReplaceSplitOnce(Slab& s, int j) {
  const uint32_t old = s.server[j].load(std::memory_order_relaxed);
  std::vector<placement::ServerId> current(lay_.width());
  for (int i = 0; i < lay_.width(); ++i) current[i] = s.server[i].load();
  for (int attempt = 0; attempt < 3; ++attempt) {
    placement::ServerId chosen;
    {
      std::lock_guard<std::mutex> lock(store_->mu_);
      auto r = store_->policy_->ChooseReplacement(*store_->snap_, s.id, current, j,
                                                  store_->load_);
      if (!r.ok()) {
        // No surviving split to anchor the choice (e.g. a single copy): take a server the
        // policy would place the slab on now, outside the current set.
        auto fresh = store_->policy_->Place(*store_->snap_, s.id + attempt, store_->load_);
        if (fresh.ok()) {
          for (placement::ServerId id : *fresh) {
            if (std::find(current.begin(), current.end(), id) == current.end()) {
              r = id;
              break;
            }
          }
        }
      }
      if (!r.ok()) {
        TLOG(WARNING) << store_->name_ << ": no replacement for split " << j
                      << " of logical slab " << s.id << ": " << r.status();
        return;
      }
      chosen = *r;
      store_->load_[chosen]++;
    }
    if (local_failed_[chosen]) continue;
    auto a = t_->AllocSlab(conn_[chosen], {}, Deadline::AfterMs(store_->opt_.control_timeout_ms));
    if (!a.ok()) {
      TLOG(WARNING) << store_->name_ << ": cannot allocate a replacement slab on "
                    << store_->opt_.servers[chosen].endpoint.ToString() << ": " << a.status();
      if (IsConnectionError(a.status())) store_->MarkFailed(chosen, a.status().ToString());
      current[j] = chosen;  // Do not pick it again.
      continue;
    }
    const uint64_t old_remote = s.remote[j];
    s.server[j].store(chosen, std::memory_order_relaxed);
    s.remote[j] = a->slab_id;
    const uint32_t pps = static_cast<uint32_t>(store_->pages_per_slab_);
    uint64_t pending = 0;
    for (uint32_t p = 0; p < pps; ++p) pending += s.written[p];
    // Pages the previous rebuild of this split had not reached yet are counted again below.
    const uint32_t was = s.regen_cursor[j];
    if (was < pps) {
      uint64_t left = 0;
      for (uint32_t p = was; p < pps; ++p) left += s.written[p];
      store_->stats_.regenerations_pending.fetch_sub(left, std::memory_order_relaxed);
    } else {
      ++regen_active_;
    }
    s.regen_cursor[j] = 0;
    store_->stats_.regenerations_pending.fetch_add(pending, std::memory_order_relaxed);
    if (old != kNoServer && !store_->failed_[old].load() && !local_failed_[old]) {
      // Eviction: give the old slab back (the server drops it anyway).
      (void)t_->FreeSlab(conn_[old], old_remote, Deadline::AfterMs(100));
    }
    return;
  }
}

void IoThread::Regenerate(uint64_t now) {
  const uint64_t rate = store_->opt_.regeneration_pages_per_sec;
  const double elapsed = static_cast<double>(now - last_tick_ns_) / 1e9;
  last_tick_ns_ = now;
  if (rate == 0) {
    regen_tokens_ = 1e9;
  } else {
    regen_tokens_ = std::min<double>(regen_tokens_ + elapsed * static_cast<double>(rate),
                                     std::max<double>(8.0, static_cast<double>(rate) / 100));
  }
  const uint32_t pps = static_cast<uint32_t>(store_->pages_per_slab_);
  for (Slab& s : slabs_) {
    if (!s.allocated) continue;
    for (int j = 0; j < lay_.width(); ++j) {
      while (s.regen_cursor[j] < pps) {
        if (regen_tokens_ < 1 || regen_inflight_ >= 16 || free_ctx_count_ < 4) return;
        const uint32_t p = s.regen_cursor[j]++;
        if (s.regen_cursor[j] == pps) --regen_active_;
        if (!s.written[p]) continue;
        if (s.busy[p] != nullptr) {  // The write in flight stores the split itself.
          store_->stats_.regenerations_pending.fetch_sub(1, std::memory_order_relaxed);
          continue;
        }
        regen_tokens_ -= 1;
        Ctx* c = NewCtx();
        c->kind = Ctx::Kind::kRegen;
        c->page = s.id * pps + p;
        Attach(c, static_cast<uint32_t>(&s - slabs_.data()));
        c->pidx = p;
        c->regen_split = j;
        c->seq = s.seq[p];
        std::memcpy(c->crcs.data(), &s.crc[static_cast<size_t>(p) * lay_.width()],
                    sizeof(uint32_t) * lay_.width());
        c->asked = 1ull << j;  // Never read the split being rebuilt.
        ++regen_inflight_;
        AskMore(c);
      }
    }
  }
}

void IoThread::Housekeeping() {
  HandleLocalFailures();
  const uint64_t now = MonotonicNs();
  // Op timeouts: scan at most every millisecond.
  if (now - last_timeout_scan_ns_ > 1000000) {
    last_timeout_scan_ns_ = now;
    if (since_classify_ > 0) ClassifySlow();
    const uint64_t limit = static_cast<uint64_t>(store_->opt_.op_timeout_ms) * 1000000;
    if (t_->inflight() > 0) {
      for (const Request& rq : reqs_) {
        if (rq.live && now - rq.post_ns > limit && !local_failed_[rq.server]) {
          FailServer(rq.server, "no reply within the op timeout (" +
                                    std::to_string(store_->opt_.op_timeout_ms) + " ms)");
        }
      }
    }
  }
  if (regen_active_ > 0 || regen_inflight_ > 0) {
    Regenerate(now);
  } else {
    last_tick_ns_ = now;
  }
}

void IoThread::CopyHistograms(LatencyHistogram* read, LatencyHistogram* write) {
  std::lock_guard<std::mutex> lock(hist_mu_);
  read->Merge(read_hist_);
  write->Merge(write_hist_);
}

uint32_t IoThread::ServerOf(uint64_t logical_slab, int split) const {
  const uint64_t i = logical_slab / store_->opt_.io_threads;
  if (i >= slabs_.size()) return kNoServer;
  return slabs_[i].server[split].load(std::memory_order_relaxed);
}

// ---- the store ----

Status RemoteStore::Init() {
  const RemoteStoreOptions& o = opt_;
  if (o.servers.size() < static_cast<size_t>(lay_.width())) {
    return InvalidArgument("need at least " + std::to_string(lay_.width()) +
                           " servers for " + name_ + ", got " +
                           std::to_string(o.servers.size()));
  }
  if (o.io_threads < 1 || o.io_threads > 16) return InvalidArgument("io_threads must be 1..16");
  if (o.max_inflight_pages < 8 || o.max_inflight_pages > 16384) {
    return InvalidArgument("max_inflight_pages must be 8..16384");
  }
  if (o.capacity_pages == 0) return InvalidArgument("capacity_pages must be > 0");
  if (o.poll_us > 1000) return InvalidArgument("poll_us must be 0..1000");
  if (o.heartbeat_interval_ms == 0 || o.heartbeat_timeout_ms == 0 || o.op_timeout_ms == 0) {
    return InvalidArgument("heartbeat and op timeouts must be > 0");
  }
  if (!lay_.copies) {
    TESSERA_ASSIGN_OR_RETURN(auto codec, coding::Codec::Create(lay_.k, lay_.r));
    codec_.emplace(std::move(codec));
  }
  client_id_ = o.client_id;
  while (client_id_ == 0) {
    uint8_t b[8];
    TESSERA_RETURN_IF_ERROR(fabric::RandomBytes(b));
    std::memcpy(&client_id_, b, 8);
  }
  failed_.reset(new std::atomic<bool>[o.servers.size()]);
  for (size_t i = 0; i < o.servers.size(); ++i) failed_[i].store(false);

  // The slab size is needed for the slab table: probe it with a short-lived transport.
  {
    fabric::TransportOptions to;
    to.kind = o.transport;
    TESSERA_ASSIGN_OR_RETURN(auto t, fabric::Transport::Create(to));
    fabric::ConnectOptions co;
    co.secret = o.secret;
    co.client_id = client_id_;
    co.deadline = Deadline::AfterMs(o.connect_timeout_ms);
    auto c = t->Connect(o.servers[0].endpoint, co);
    if (!c.ok()) {
      return Unavailable("cannot connect to " + o.servers[0].endpoint.ToString() + ": " +
                         c.status().ToString());
    }
    TESSERA_ASSIGN_OR_RETURN(auto info, t->Info(*c));
    slab_size_ = info.slab_size;
  }
  if (slab_size_ < lay_.split) return InvalidArgument("server slab size is below one split");
  pages_per_slab_ = slab_size_ / lay_.split;
  num_slabs_ = (o.capacity_pages + pages_per_slab_ - 1) / pages_per_slab_;

  std::vector<placement::ServerInfo> infos;
  for (size_t i = 0; i < o.servers.size(); ++i) {
    placement::ServerInfo si;
    si.id = static_cast<placement::ServerId>(i);
    si.address = o.servers[i].endpoint.ToString();
    si.capacity_slabs = 1 << 20;
    si.free_slabs = si.capacity_slabs;
    si.rack = o.servers[i].rack;
    infos.push_back(si);
  }
  TESSERA_ASSIGN_OR_RETURN(snap_, placement::MembershipSnapshot::Create(1, std::move(infos)));
  placement::PolicySpec spec = o.placement;
  spec.k = lay_.copies ? 1 : lay_.k;
  spec.r = lay_.copies ? 0 : lay_.r;
  spec.replicas = lay_.width();
  if (lay_.copies) {
    if (spec.kind == placement::PolicyKind::kCodingSets) {
      // CodingSets groups k+r servers; for copies use groups of `copies` servers.
      spec.k = 1;
      spec.r = lay_.width() - 1;
    }
  }
  auto pol = placement::CreatePolicy(spec, snap_);
  if (!pol.ok() && lay_.copies) {
    // CodingSets needs parity; a single copy falls back to random replication of 1.
    spec.kind = placement::PolicyKind::kRandomReplication;
    pol = placement::CreatePolicy(spec, snap_);
  }
  if (!pol.ok()) return pol.status();
  policy_ = *pol;
  if (policy_->width() != lay_.width()) {
    return InvalidArgument("placement " + policy_->name() + " places " +
                           std::to_string(policy_->width()) + " servers per slab, layout needs " +
                           std::to_string(lay_.width()));
  }
  load_.assign(o.servers.size(), 0);

  for (int i = 0; i < o.io_threads; ++i) threads_.push_back(std::make_unique<IoThread>(this, i));
  for (auto& t : threads_) TESSERA_RETURN_IF_ERROR(t->Start());
  monitor_ = std::thread([this] { MonitorLoop(); });
  return Status::Ok();
}

void RemoteStore::MonitorLoop() {
  fabric::TransportOptions to;
  to.kind = fabric::TransportKind::kTcp;
  auto t = fabric::Transport::Create(to);
  if (!t.ok()) {
    TLOG(ERROR) << name_ << ": heartbeats disabled: " << t.status();
    return;
  }
  std::vector<std::optional<fabric::ConnectionId>> conns(opt_.servers.size());
  fabric::ConnectOptions co;
  co.secret = opt_.secret;
  co.client_id = client_id_;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(monitor_mu_);
      monitor_cv_.wait_for(lock, std::chrono::milliseconds(opt_.heartbeat_interval_ms),
                           [this] { return monitor_stop_.load(); });
      if (monitor_stop_.load()) return;
    }
    for (size_t i = 0; i < opt_.servers.size() && !monitor_stop_.load(); ++i) {
      if (failed_[i].load()) continue;
      if (!conns[i] || !(*t)->Connected(*conns[i])) {
        co.deadline = Deadline::AfterMs(opt_.heartbeat_timeout_ms);
        auto c = (*t)->Connect(opt_.servers[i].endpoint, co);
        if (!c.ok()) {
          MarkFailed(static_cast<uint32_t>(i), "heartbeat connection: " + c.status().ToString());
          continue;
        }
        conns[i] = *c;
      }
      auto hb = (*t)->Heartbeat(*conns[i], Deadline::AfterMs(opt_.heartbeat_timeout_ms));
      if (!hb.ok()) {
        MarkFailed(static_cast<uint32_t>(i), "heartbeat: " + hb.status().ToString());
      }
      fabric::Completion drop[16];
      while ((*t)->Poll(drop) > 0) {
      }
    }
  }
}

Status RemoteStore::Submit(std::span<PageOp* const> ops) {
  TESSERA_RETURN_IF_ERROR(ValidateBatch(ops));
  if (threads_.empty()) return Unavailable("page store is shut down");
  const uint64_t T = threads_.size();
  for (PageOp* op : ops) {
    const uint64_t ls = op->page >= opt_.capacity_pages ? 0 : op->page / pages_per_slab_;
    threads_[ls % T]->Enqueue(op);
  }
  return Status::Ok();
}

Status RemoteStore::Trim(PageId first, uint64_t count) {
  if (first > opt_.capacity_pages || count > opt_.capacity_pages - first) {
    return OutOfRange("trim range beyond the store's capacity");
  }
  if (count == 0) return Status::Ok();
  if (threads_.empty()) return Unavailable("page store is shut down");
  // Each I/O thread marks the pages of its slabs never-written (they read as zeros without a
  // round trip) and frees the remote slabs of logical slabs left with no written page. The
  // trim goes through the same queues as page ops, so it is ordered after every write
  // submitted before this call; a write submitted after it is stored normally (a freed
  // logical slab is allocated afresh).
  TrimJob job;
  job.count = count;
  const size_t T = threads_.size();
  std::vector<PageOp> ops(T);
  job.left = static_cast<int>(T);
  for (size_t i = 0; i < T; ++i) {
    ops[i].kind = kTrimKind;
    ops[i].page = first;
    ops[i].buf = nullptr;
    ops[i].done = &TrimJob::Done;
    ops[i].user = &job;
    threads_[i]->Enqueue(&ops[i]);
  }
  {
    std::unique_lock<std::mutex> lock(job.mu);
    job.cv.wait(lock, [&] { return job.left == 0; });
  }
  for (const PageOp& op : ops) TESSERA_RETURN_IF_ERROR(op.status);
  stats_.trims.fetch_add(count);
  return Status::Ok();
}

Status RemoteStore::Flush() {
  // Wait (bounded by the op timeout plus slack) until no acknowledged write has splits left.
  const Deadline d = Deadline::AfterMs(opt_.op_timeout_ms * 3 + opt_.control_timeout_ms);
  for (;;) {
    uint64_t left = 0;
    for (const auto& t : threads_) left += t->unsettled();
    if (left == 0) return Status::Ok();
    if (d.Expired()) {
      return Timeout("Flush: " + std::to_string(left) + " writes still being stored");
    }
    std::this_thread::yield();
  }
}

PageStoreStats RemoteStore::Stats() const {
  PageStoreStats s;
  s.reads = stats_.reads.load();
  s.writes = stats_.writes.load();
  s.read_errors = stats_.read_errors.load();
  s.write_errors = stats_.write_errors.load();
  s.trims = stats_.trims.load();
  s.degraded_reads = stats_.degraded_reads.load();
  s.decodes = stats_.decodes.load();
  s.corruptions_detected = stats_.corruptions_detected.load();
  s.corruptions_repaired = stats_.corruptions_repaired.load();
  s.data_loss = stats_.data_loss.load();
  s.server_failures = stats_.server_failures.load();
  s.regenerations_done = stats_.regenerations_done.load();
  const int64_t pending = static_cast<int64_t>(stats_.regenerations_pending.load());
  s.regenerations_pending = pending < 0 ? 0 : static_cast<uint64_t>(pending);
  s.bytes_sent = stats_.bytes_sent.load();
  s.bytes_received = stats_.bytes_received.load();
  for (const auto& t : threads_) t->CopyHistograms(&s.read_latency, &s.write_latency);
  return s;
}

}  // namespace

Result<std::unique_ptr<PageStore>> CreateErasureCodedStore(
    const ErasureCodedStoreOptions& options) {
  if (options.delta < 0 || options.delta > options.r) {
    return InvalidArgument("delta must be 0..r (" + std::to_string(options.r) + ")");
  }
  Layout lay;
  lay.k = options.k;
  lay.r = options.r;
  lay.copies = false;
  if (options.k < 1 || options.k > coding::kMaxDataSplits || kPageSize % options.k != 0) {
    return InvalidArgument("k must divide 4096 and be at most 32");
  }
  if (options.r < 1 || options.r > coding::kMaxParitySplits) {
    return InvalidArgument("r must be 1..4");
  }
  lay.split = kPageSize / static_cast<size_t>(options.k);
  lay.delta = options.delta;
  lay.ack = options.ack;
  std::string name = "ec(" + std::to_string(options.k) + "," + std::to_string(options.r) +
                     ") delta=" + std::to_string(options.delta) +
                     " ack=" + AckPolicyName(options.ack);
  auto store = std::make_unique<RemoteStore>(options.remote, lay, name);
  TESSERA_RETURN_IF_ERROR(store->Init());
  return std::unique_ptr<PageStore>(std::move(store));
}

Result<std::unique_ptr<PageStore>> CreateReplicatedStore(const ReplicatedStoreOptions& options) {
  if (options.copies < 1 || options.copies > 5) return InvalidArgument("copies must be 1..5");
  if (options.read_fanout < 1 || options.read_fanout > options.copies) {
    return InvalidArgument("read_fanout must be 1..copies");
  }
  Layout lay;
  lay.k = 1;
  lay.r = options.copies - 1;
  lay.copies = true;
  lay.split = kPageSize;
  lay.delta = options.read_fanout - 1;
  lay.ack = options.ack;
  std::string name = options.copies == 1
                         ? std::string("single-copy")
                         : "replication(" + std::to_string(options.copies) + ") ack=" +
                               AckPolicyName(options.ack);
  auto store = std::make_unique<RemoteStore>(options.remote, lay, name);
  TESSERA_RETURN_IF_ERROR(store->Init());
  return std::unique_ptr<PageStore>(std::move(store));
}

Result<std::vector<size_t>> ServersOfPage(const PageStore& store, PageId page) {
  const auto* rs = dynamic_cast<const RemoteStore*>(&store);
  if (rs == nullptr) return InvalidArgument("not a remote store");
  if (page >= rs->opt_.capacity_pages) return OutOfRange("page beyond capacity");
  const uint64_t ls = page / rs->pages_per_slab_;
  std::vector<size_t> out;
  for (int j = 0; j < rs->lay_.width(); ++j) {
    const uint32_t s = rs->threads_[ls % rs->threads_.size()]->ServerOf(ls, j);
    if (s == kNoServer) return NotFound("page " + std::to_string(page) + " has no slab yet");
    out.push_back(s);
  }
  return out;
}

}  // namespace tessera::client
