// Run-to-completion reads (group layout): a thread calling the blocking ReadPage/ReadPages reads
// stored pages itself, on its own Transport, with no hand-off to an I/O thread and back (see
// "Direct reads" in client/remote_store.h).
//
// Protocol, per page:
//   1. DirectLocate: read the page's published location (slab, row, member, CRC) under its
//      seqlock, then the slab's member (server, remote slab) under the slab's seqlock.
//   2. Post one READ of the member on this thread's connection to that server (connected and
//      the slab added on first use), poll for direct_spin_us, then sleep in Wait() until
//      hedge_us (op_timeout_ms when hedging is off).
//   3. Accept the page only if the read succeeded, its CRC32C matches the published one, and
//      DirectValid: neither seqlock moved since step 1.
// Why that is enough: while a page is published as stored in (slab, row, member), that slot
// holds exactly the page's data: its stripe row cannot be reused before every live page left
// it, a page leaves a slot only through the I/O thread (rewrite, trim, compaction move), which
// republishes the page (version bump) before it posts anything that could overwrite the slot,
// and a member that moves to another server (failure, eviction) or a freed slab bumps the slab's
// version first. So if both versions are unchanged after the reply arrived, the reply was read
// from the slot while it held the page (the bump, the server's later write and our reply are
// ordered through the sockets). The CRC catches corruption, a replacement member not rebuilt
// yet, and torn reads of a member being rewritten. Anything else falls back to the I/O thread
// path (degraded reads, hedging, repair): never a wrong page, at worst one wasted round trip.
#include <cstring>
#include <memory>
#include <unordered_set>
#include <vector>

#include "client/remote/engine.h"
#include "coding/codec.h"
#include "common/logging.h"

namespace tessera::client::remote {

// ---- I/O thread: publishing ----

void IoThread::PublishPage(PageId page) {
  if (!dloc_) return;
  const uint64_t li = LocalIndex(page);
  const PageLoc& L = gloc_[li];
  uint32_t slab = kDirectNo, row_col = 0, crc = 0;
  if (L.where == PageLoc::Where::kNone) {
    slab = kDirectZero;
  } else if (L.where == PageLoc::Where::kStored && L.row < (1u << 24)) {
    slab = L.slab;
    row_col = L.row << 8 | L.col;
    crc = slabs_[L.slab].stripes[L.row].crc[L.col];
  }
  DirectLoc& d = dloc_[li];
  const uint32_t v = d.ver.load(std::memory_order_relaxed);
  d.ver.store(v + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  d.slab.store(slab, std::memory_order_relaxed);
  d.row_col.store(row_col, std::memory_order_relaxed);
  d.crc.store(crc, std::memory_order_relaxed);
  d.ver.store(v + 2, std::memory_order_release);
}

void IoThread::PublishSlab(uint32_t slab) {
  if (!dslab_) return;
  const Slab& s = slabs_[slab];
  DirectSlab& d = dslab_[slab];
  const uint32_t v = d.ver.load(std::memory_order_relaxed);
  d.ver.store(v + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  for (int j = 0; j < lay_.width(); ++j) {
    const fabric::AllocSlabResponse& r = s.remote_info[j];
    d.server[j].store(s.allocated ? s.server[j].load(std::memory_order_relaxed) : kNoServer,
                      std::memory_order_relaxed);
    d.id[j].store(s.allocated ? r.slab_id : 0, std::memory_order_relaxed);
    d.addr[j].store(r.remote_addr, std::memory_order_relaxed);
    d.size[j].store(r.size, std::memory_order_relaxed);
    d.rkey[j].store(r.rkey, std::memory_order_relaxed);
  }
  d.ver.store(v + 2, std::memory_order_release);
}

// ---- any thread: locating ----

bool IoThread::DirectLocate(PageId page, DirectTarget* out) const {
  if (!dloc_) return false;
  const DirectLoc& d = dloc_[LocalIndex(page)];
  for (int attempt = 0; attempt < 4; ++attempt) {
    const uint32_t v1 = d.ver.load(std::memory_order_acquire);
    if (v1 & 1) continue;  // The I/O thread is changing it (a few instructions): look again.
    const uint32_t slab = d.slab.load(std::memory_order_relaxed);
    const uint32_t row_col = d.row_col.load(std::memory_order_relaxed);
    const uint32_t crc = d.crc.load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (d.ver.load(std::memory_order_relaxed) != v1) continue;
    out->page_ver = v1;
    if (slab == kDirectZero) {
      out->zero = true;
      return true;
    }
    if (slab == kDirectNo || slab >= store_->num_slabs_) return false;
    const DirectSlab& ds = dslab_[slab];
    const int col = static_cast<int>(row_col & 0xff);
    if (col >= lay_.width()) return false;
    const uint32_t sv = ds.ver.load(std::memory_order_acquire);
    if (sv & 1) continue;
    const uint32_t server = ds.server[col].load(std::memory_order_relaxed);
    fabric::AllocSlabResponse r;
    r.slab_id = ds.id[col].load(std::memory_order_relaxed);
    r.remote_addr = ds.addr[col].load(std::memory_order_relaxed);
    r.size = ds.size[col].load(std::memory_order_relaxed);
    r.rkey = ds.rkey[col].load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (ds.ver.load(std::memory_order_relaxed) != sv) continue;
    if (server == kNoServer || r.slab_id == 0) return false;
    out->zero = false;
    out->slab_ver = sv;
    out->slab = slab;
    out->row = row_col >> 8;
    out->col = col;
    out->crc = crc;
    out->server = server;
    out->remote = r;
    return true;
  }
  return false;
}

bool IoThread::DirectValid(PageId page, const DirectTarget& t) const {
  std::atomic_thread_fence(std::memory_order_acquire);
  if (dloc_[LocalIndex(page)].ver.load(std::memory_order_relaxed) != t.page_ver) return false;
  return t.zero || dslab_[t.slab].ver.load(std::memory_order_relaxed) == t.slab_ver;
}

void IoThread::RecordDirectRead(uint64_t latency_ns) {
  std::lock_guard<std::mutex> lock(hist_mu_);
  read_hist_.Record(latency_ns);
}

// ---- the caller's thread: reading ----

namespace {

constexpr size_t kBatch = 32;  // Pages per round of a direct ReadPages.
// Reply buffers: a round uses up to kBatch; a read that timed out keeps its buffer until its
// reply arrives (the transport may still write it), so there are more than a round's worth.
constexpr size_t kSlots = 2 * kBatch;

// One thread's direct-read state for one store: its own Transport (a Transport belongs to one
// thread), connected lazily to the servers it reads from, with the slabs it has named. Lives in
// that thread's thread_local list; destroyed by that thread (when it exits, or when it next
// reads from any store after this one shut down).
class DirectReader {
 public:
  explicit DirectReader(RemoteStore* store) : store_(store) {}

  Status Init() {
    fabric::TransportOptions to;
    to.kind = store_->opt_.transport;
    to.max_inflight = kSlots;
    to.ring_entries = 64;
    TESSERA_ASSIGN_OR_RETURN(t_, store_->NewTransport(to));
    bufs_.assign(kSlots * kPageSize, 0);
    TESSERA_RETURN_IF_ERROR(t_->RegisterMemory(bufs_.data(), bufs_.size()));
    servers_.resize(store_->num_servers());
    comps_.resize(kSlots);
    spin_ns_ = uint64_t{store_->opt_.direct_spin_us} * 1000;
    reply_avg_ns_ = spin_ns_ / 2;  // Polls the whole bound until replies are measured.
    const uint64_t hedge = uint64_t{store_->lay_.g.hedge_us} * 1000;
    wait_ns_ = hedge != 0 ? hedge : uint64_t{store_->opt_.op_timeout_ms} * 1000000;
    for (uint32_t i = 0; i < kSlots; ++i) free_.push_back(kSlots - 1 - i);
    return Status::Ok();
  }

  // Reads pages[0..n) (n <= kBatch) into out[i * kPageSize]; done[i] = 1 for each page read
  // here, degraded[i] = 1 for each whose server is not answering in time (hedge now). Pages
  // left undone go to the I/O threads.
  void Read(const PageId* pages, size_t n, uint8_t* out, uint8_t* done, uint8_t* degraded) {
    const uint64_t start = MonotonicNs();
    if (stuck_ > 0) Reap(nullptr, nullptr, nullptr);  // Late replies free their servers.
    wrs_.clear();
    size_t outstanding = 0;
    for (size_t i = 0; i < n; ++i) {
      done[i] = 0;
      degraded[i] = 0;
      const PageId p = pages[i];
      if (p >= store_->opt_.capacity_pages) continue;  // The I/O thread says OutOfRange.
      IoThread* th = store_->threads_[store_->ThreadOf(p)].get();
      DirectTarget& t = targets_[i];
      if (!th->DirectLocate(p, &t)) continue;
      if (t.zero) {
        std::memset(out + i * kPageSize, 0, kPageSize);
        done[i] = 1;
        continue;
      }
      if (t.server >= servers_.size()) {
        // A server that joined after this reader started (RemoteStore::AddServer).
        if (t.server >= store_->num_servers()) continue;
        servers_.resize(store_->num_servers());
      }
      if (servers_[t.server].stuck > 0) {
        // A read of ours there is overdue: do not queue behind it, hedge at once. Once the
        // store declares the server failed, the connection goes (and the overdue reads with it).
        if (store_->failed_[t.server].load(std::memory_order_relaxed)) Drop(t.server);
        degraded[i] = 1;
        continue;
      }
      const int64_t conn = Connection(t.server);
      if (conn < 0 || free_.empty()) continue;
      if (!AddSlab(t.server, static_cast<fabric::ConnectionId>(conn), t.remote)) continue;
      const uint32_t slot = free_.back();
      free_.pop_back();
      slots_[slot] = Slot{true, false, t.server, static_cast<uint32_t>(i)};
      fabric::WorkRequest wr;
      wr.connection = static_cast<fabric::ConnectionId>(conn);
      wr.op = fabric::OpKind::kRead;
      wr.slab_id = t.remote.slab_id;
      wr.remote_offset = static_cast<uint64_t>(t.row) * kPageSize;
      wr.length = kPageSize;
      wr.local = bufs_.data() + static_cast<size_t>(slot) * kPageSize;
      wr.cookie = slot;
      wrs_.push_back(wr);
      ++outstanding;
    }
    if (!wrs_.empty()) {
      if (Status st = t_->Post(wrs_); !st.ok()) {
        // Nothing was posted (all or nothing): the I/O threads read them.
        for (const auto& wr : wrs_) Release(static_cast<uint32_t>(wr.cookie));
        outstanding = 0;
      } else {
        store_->stats_.bytes_received.fetch_add(wrs_.size() * kPageSize,
                                                std::memory_order_relaxed);
      }
    }
    bool slept = false;
    if (outstanding > 0) {
      const uint64_t spin_until = start + DirectSpinWindowNs(reply_avg_ns_, spin_ns_);
      const Deadline deadline(MonotonicNs() + wait_ns_);
      while (outstanding > 0) {
        size_t got = 0;
        if (MonotonicNs() < spin_until) {
          got = t_->Poll(comps_);
        } else {
          slept = true;
          got = t_->Wait(comps_, deadline);
          if (got == 0 && deadline.Expired()) break;
        }
        outstanding -= Handle(got, pages, out, done);
      }
      if (outstanding == 0) {
        // A moving average (1/8 new) of the round's reply time, a wake-up included if it slept.
        const uint64_t took = MonotonicNs() - start;
        reply_avg_ns_ = reply_avg_ns_ - reply_avg_ns_ / 8 + took / 8;
      }
    }
    if (outstanding > 0) {
      // No reply within hedge_us: those pages are read degraded by the I/O thread now. The
      // reads stay posted (their buffers reserved) until their replies arrive; meanwhile this
      // thread does not read from those servers directly.
      for (uint32_t slot = 0; slot < kSlots; ++slot) {
        Slot& sl = slots_[slot];
        if (!sl.busy || sl.stuck) continue;
        sl.stuck = true;
        ++stuck_;
        ++servers_[sl.server].stuck;
        degraded[sl.index] = 1;
      }
    }
    SharedStats& s = store_->stats_;
    uint64_t served = 0;
    const uint64_t lat = MonotonicNs() - start;
    for (size_t i = 0; i < n; ++i) {
      if (!done[i]) continue;
      ++served;
      store_->threads_[store_->ThreadOf(pages[i])]->RecordDirectRead(lat);
    }
    if (served > 0) {
      s.reads.fetch_add(served, std::memory_order_relaxed);
      s.direct_reads.fetch_add(served, std::memory_order_relaxed);
    }
    if (!wrs_.empty()) (slept ? s.direct_sleeps : s.direct_spin_hits).fetch_add(1);
  }

 private:
  struct Server {
    int64_t conn = -1;         // In t_, or -1.
    uint64_t retry_ns = 0;     // No connection attempt before this (after a failure).
    uint32_t backoff_ms = 0;   // The next failure's backoff (doubles up to 1 s).
    uint32_t stuck = 0;        // Reads there that timed out and have not completed yet.
    std::unordered_set<uint64_t> slabs;  // Added to t_ on `conn`.
  };
  struct Slot {
    bool busy = false;     // A read is posted into this buffer.
    bool stuck = false;    // ... and timed out (its round is over).
    uint32_t server = 0;
    uint32_t index = 0;    // Page index in its round.
  };

  void Release(uint32_t slot) {
    Slot& sl = slots_[slot];
    if (sl.stuck) {
      --stuck_;
      --servers_[sl.server].stuck;
    }
    sl.busy = sl.stuck = false;
    free_.push_back(slot);
  }

  // Late replies of timed-out reads (nothing of the current round may be in flight).
  void Reap(const PageId* pages, uint8_t* out, uint8_t* done) {
    const size_t got = t_->Poll(comps_);
    (void)Handle(got, pages, out, done);
  }

  // Handles `got` completions; returns how many finished a read of the current round.
  size_t Handle(size_t got, const PageId* pages, uint8_t* out, uint8_t* done) {
    size_t finished = 0;
    for (size_t c = 0; c < got; ++c) {
      const fabric::Completion& comp = comps_[c];
      if (comp.kind != fabric::CompletionKind::kData) continue;  // Notices: the I/O threads act.
      const uint64_t slot = comp.cookie;
      if (slot >= kSlots || !slots_[slot].busy) continue;
      const Slot sl = slots_[slot];
      if (!comp.status.ok() && IsConnectionError(comp.status)) {
        // A lost connection is dropped (reconnected later unless the store fails the server);
        // the I/O thread reads the page and notices the failure itself.
        Drop(sl.server);
      }
      if (sl.stuck || pages == nullptr) {  // A late reply: its page went to the I/O thread.
        Release(static_cast<uint32_t>(slot));
        continue;
      }
      ++finished;
      const uint32_t i = sl.index;
      const DirectTarget& t = targets_[i];
      const uint8_t* buf = bufs_.data() + slot * kPageSize;
      // Accept only the slot's page as published when the read was posted (CRC), and only if
      // it has not moved since (versions); anything else: the I/O thread sorts it out.
      if (comp.status.ok() && coding::Crc32c(buf, kPageSize) == t.crc &&
          store_->threads_[store_->ThreadOf(pages[i])]->DirectValid(pages[i], t)) {
        std::memcpy(out + static_cast<size_t>(i) * kPageSize, buf, kPageSize);
        done[i] = 1;
      }
      Release(static_cast<uint32_t>(slot));
    }
    return finished;
  }

  int64_t Connection(uint32_t server) {
    if (server >= servers_.size()) {
      // A server that joined after this reader started (RemoteStore::AddServer).
      if (server >= store_->num_servers()) return -1;
      servers_.resize(store_->num_servers());
    }
    Server& sv = servers_[server];
    if (store_->failed_[server].load(std::memory_order_relaxed)) {
      if (sv.conn >= 0) Drop(server);
      return -1;  // A failed server is never used again by this store.
    }
    if (sv.conn >= 0 && t_->Connected(static_cast<fabric::ConnectionId>(sv.conn))) return sv.conn;
    if (sv.conn >= 0) Drop(server);
    const uint64_t now = MonotonicNs();
    if (now < sv.retry_ns) return -1;
    fabric::ConnectOptions co;
    co.secret = store_->opt_.secret;
    co.client_id = store_->client_id_;
    // Short: a stopped server would hold this (faulting) thread for the whole deadline.
    co.deadline = Deadline::AfterMs(std::min<uint32_t>(store_->opt_.connect_timeout_ms, 200));
    auto c = t_->Connect(store_->server(server).endpoint, co);
    if (!c.ok()) {
      // No attempt for a while: 10 ms, doubling up to 1 s.
      sv.backoff_ms = std::min<uint32_t>(sv.backoff_ms == 0 ? 10 : sv.backoff_ms * 2, 1000);
      sv.retry_ns = MonotonicNs() + uint64_t{sv.backoff_ms} * 1000000;
      return -1;
    }
    sv.conn = *c;
    sv.backoff_ms = 0;
    sv.slabs.clear();
    return sv.conn;
  }

  bool AddSlab(uint32_t server, fabric::ConnectionId conn, const fabric::AllocSlabResponse& r) {
    Server& sv = servers_[server];
    if (sv.slabs.count(r.slab_id) != 0) return true;
    if (sv.slabs.size() >= 4096) {  // Slabs come and go: forget the old ones now and then.
      for (uint64_t id : sv.slabs) t_->RemoveSlab(conn, id);
      sv.slabs.clear();
    }
    if (!t_->AddSlab(conn, r).ok()) return false;
    sv.slabs.insert(r.slab_id);
    return true;
  }

  // Closes this thread's connection to the server (its in-flight reads complete as Cancelled).
  void Drop(uint32_t server) {
    Server& sv = servers_[server];
    if (sv.conn >= 0) (void)t_->Abort(static_cast<fabric::ConnectionId>(sv.conn));
    sv.conn = -1;
    sv.slabs.clear();
  }

  RemoteStore* const store_;
  std::unique_ptr<fabric::Transport> t_;
  std::vector<uint8_t> bufs_;  // kSlots registered pages: replies land here, then are copied.
  std::array<Slot, kSlots> slots_{};
  std::vector<uint32_t> free_;  // Slots not busy.
  uint32_t stuck_ = 0;          // Slots stuck.
  std::vector<Server> servers_;
  std::vector<fabric::Completion> comps_;
  std::vector<fabric::WorkRequest> wrs_;
  std::array<DirectTarget, kBatch> targets_{};
  uint64_t spin_ns_ = 0;       // The polling bound (direct_spin_us).
  uint64_t reply_avg_ns_ = 0;  // Recent rounds' reply time (see DirectSpinWindowNs).
  uint64_t wait_ns_ = 0;
};

// This thread's readers, one per store it read from. A reader whose store shut down is
// destroyed here, on its own thread, the next time this thread looks a reader up (or at exit).
struct ReaderEntry {
  uint64_t uid = 0;
  std::weak_ptr<int> alive;
  std::unique_ptr<DirectReader> reader;  // Null: its Init() failed (no direct reads here).
};
thread_local std::vector<ReaderEntry> t_readers;

DirectReader* ReaderFor(RemoteStore* store, uint64_t uid, const std::shared_ptr<int>& alive) {
  for (size_t i = 0; i < t_readers.size();) {
    if (t_readers[i].alive.expired()) {
      t_readers.erase(t_readers.begin() + static_cast<std::ptrdiff_t>(i));
      continue;
    }
    if (t_readers[i].uid == uid) {
      return t_readers[i].reader.get();
    }
    ++i;
  }
  auto reader = std::make_unique<DirectReader>(store);
  if (Status st = reader->Init(); !st.ok()) {
    TLOG(WARNING) << store->name_ << ": direct reads off on this thread: " << st;
    reader.reset();
  }
  t_readers.push_back(ReaderEntry{uid, alive, std::move(reader)});
  return t_readers.back().reader.get();
}

}  // namespace

uint64_t RemoteStore::NextUid() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

void RemoteStore::DropThreadReader() {
  for (size_t i = 0; i < t_readers.size(); ++i) {
    if (t_readers[i].uid == uid_) {
      t_readers.erase(t_readers.begin() + static_cast<std::ptrdiff_t>(i));
      return;
    }
  }
}

Status RemoteStore::ReadPage(PageId page, uint8_t* out) {
  return ReadPages(&page, 1, out);
}

Status RemoteStore::ReadPages(const PageId* pages, size_t count, uint8_t* out) {
  if (count == 0) return Status::Ok();
  if (pages == nullptr || out == nullptr) return InvalidArgument("null pages or buffer");
  DirectReader* reader = nullptr;
  if (lay_.group && opt_.direct_reads && !threads_.empty()) {
    reader = ReaderFor(this, uid_, alive_);
  }
  if (reader == nullptr) return ReadThroughIoThreads(pages, count, out, nullptr);
  Status first;
  std::array<uint8_t, kBatch> done{}, degraded{};
  std::array<PageId, kBatch> left{};
  std::array<uint8_t, kBatch> left_degraded{};
  std::array<uint8_t, kBatch * kPageSize>* scratch = nullptr;
  std::unique_ptr<std::array<uint8_t, kBatch * kPageSize>> scratch_owner;
  for (size_t base = 0; base < count; base += kBatch) {
    const size_t n = std::min(kBatch, count - base);
    uint8_t* chunk = out + base * kPageSize;
    reader->Read(pages + base, n, chunk, done.data(), degraded.data());
    size_t m = 0;
    for (size_t i = 0; i < n; ++i) {
      if (done[i]) continue;
      left[m] = pages[base + i];
      left_degraded[m] = degraded[i];
      ++m;
    }
    if (m == 0) continue;
    stats_.direct_fallbacks.fetch_add(m, std::memory_order_relaxed);
    Status st;
    if (m == n) {
      st = ReadThroughIoThreads(left.data(), m, chunk, left_degraded.data());
    } else {
      // Some pages of the chunk were read here: the rest go through a scratch buffer.
      if (scratch == nullptr) {
        scratch_owner = std::make_unique<std::array<uint8_t, kBatch * kPageSize>>();
        scratch = scratch_owner.get();
      }
      st = ReadThroughIoThreads(left.data(), m, scratch->data(), left_degraded.data());
      size_t k = 0;
      for (size_t i = 0; i < n; ++i) {
        if (done[i]) continue;
        std::memcpy(chunk + i * kPageSize, scratch->data() + k * kPageSize, kPageSize);
        ++k;
      }
    }
    if (first.ok() && !st.ok()) first = st;
  }
  return first;
}

Status RemoteStore::ReadThroughIoThreads(const PageId* pages, size_t count, uint8_t* out,
                                         const uint8_t* degraded) {
  if (threads_.empty()) return Unavailable("page store is shut down");
  std::unique_ptr<PageOp[]> ops(new PageOp[count]);
  OpWaiter waiter;
  waiter.Arm(ops.get(), count);
  for (size_t i = 0; i < count; ++i) {
    PageOp& op = ops[i];
    op.kind = PageOp::Kind::kRead;
    op.page = pages[i];
    op.buf = out + i * kPageSize;
    QueueItem item;
    item.op = &op;
    item.degraded = degraded != nullptr && degraded[i] != 0;
    threads_[op.page >= opt_.capacity_pages ? 0 : ThreadOf(op.page)]->Enqueue(item);
  }
  return waiter.Wait(ops.get(), count);
}

}  // namespace tessera::client::remote
