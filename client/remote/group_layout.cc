// The group layout's hooks into the I/O thread (see group_layout.h): setup and shutdown, page
// ops and replies, slabs, stale members, hedging, regeneration, and direct reads. Its read path
// is group_read.cc; its write path, compaction and trims group_write.cc.
#include "client/remote/group_layout.h"

#include <algorithm>
#include <cstring>

#include "common/logging.h"

namespace tessera::client::remote {

// ---- the store's ----

Status GroupStoreLayout::MakeCodecs(RemoteStore& store) const {
  TESSERA_ASSIGN_OR_RETURN(auto codec, StripeCodec::Create(lay_.k, lay_.r));
  store.stripe_codec_.emplace(std::move(codec));
  return Status::Ok();
}

uint64_t GroupStoreLayout::NumSlabs(const RemoteStoreOptions& o, uint64_t pages_per_slab) const {
  // Per I/O thread: room for twice its pages in stripes (compaction keeps the used slots
  // within max_garbage_factor x the live pages), plus two slabs.
  const uint64_t T = static_cast<uint64_t>(o.io_threads);
  const uint64_t runs = (o.capacity_pages + kGroupRun - 1) / kGroupRun;
  const uint64_t pages = ((runs + T - 1) / T) * kGroupRun;
  const uint64_t slots = pages_per_slab * static_cast<uint64_t>(lay_.k);
  return (2 * pages + slots - 1) / slots + 2;
}

long double GroupStoreLayout::TableBytes(const RemoteStoreOptions& o, uint64_t num_slabs) const {
  // A slab table per I/O thread, and a page location per page.
  return static_cast<long double>(num_slabs) * sizeof(Slab) * o.io_threads +
         static_cast<long double>(o.capacity_pages) * 40.0L;
}

void GroupStoreLayout::Placement(placement::PolicySpec* spec) const {
  spec->k = lay_.k;
  spec->r = lay_.r;
  spec->replicas = lay_.width();
}

// ---- the I/O thread's ----

GroupLayout::GroupLayout(IoThread& io, const LayoutParams& lay)
    : io_(io), store_(io.store_), lay_(lay) {}

uint64_t GroupLayout::SlabCount() const { return store_->num_slabs_; }

void GroupLayout::Setup(uint32_t nctx) {
  const int T = store_->opt_.io_threads;
  const uint64_t runs = (store_->opt_.capacity_pages + kGroupRun - 1) / kGroupRun;
  // The tables cover every page the store can hold (the whole paged region), most of which a
  // program never touches: lazily zeroed memory, where all zero bytes is a never-written page,
  // costs only the pages used (an 8G region's tables filled eagerly were 113 MB resident and
  // about 0.4 s of every run's start and exit).
  gloc_size_ = ((runs + T - 1) / T) * kGroupRun;
  gloc_mem_ = std::move(MappedRegion::Anonymous(gloc_size_ * sizeof(PageLoc)).value());
  gloc_ = reinterpret_cast<PageLoc*>(gloc_mem_.data());
  dloc_mem_ = std::move(MappedRegion::Anonymous(gloc_size_ * sizeof(DirectLoc)).value());
  dloc_ = reinterpret_cast<DirectLoc*>(dloc_mem_.data());
  gbuf_.reserve(lay_.k);
  gbuf_data_.assign(static_cast<size_t>(lay_.k) * kPageSize, 0);
  zero_page_.assign(kPageSize, 0);
  open_parity_.assign(static_cast<size_t>(lay_.r) * kPageSize, 0);
  gslab_rows_ = static_cast<uint32_t>(store_->pages_per_slab_);
  io_.dslab_.reset(new DirectSlab[io_.slabs_.size()]);
  stripe_ops_.resize(nctx);
  for (auto& v : stripe_ops_) v.reserve(2 * static_cast<size_t>(lay_.k));
  gbuf_ops_.reserve(2 * static_cast<size_t>(lay_.k));
  stripe_seq_.resize(nctx);
  stripe_moves_.assign(nctx, 0);
}

void GroupLayout::StoreBuffered() {
  // Store what the stripe buffer holds; if no op context is free for it, fail its writes.
  if (Seal()) return;
  for (auto& [op, start] : gbuf_ops_) {
    io_.Complete(op, Unavailable("page store is shutting down"), start);
  }
  gbuf_ops_.clear();
}

void GroupLayout::AbandonCtx(size_t i, Ctx& c) {
  if (c.kind != Ctx::Kind::kStripe || c.finished || c.acked) return;
  // A stripe that did not settle in time: its writes complete, as failed.
  c.acked = true;
  for (auto& [op, start] : stripe_ops_[i]) {
    io_.Complete(op, Unavailable("page store is shutting down"), start);
  }
  stripe_ops_[i].clear();
}

void GroupLayout::StartOp(PageOp* op, uint64_t now, bool degraded, bool verify) {
  if (op->kind == PageOp::Kind::kWrite) {
    StartWrite(op, now);  // Buffered (no op context until its stripe is sealed).
    return;
  }
  Ctx* c = io_.NewCtx();
  c->op = op;
  c->page = op->page;
  c->start_ns = now;
  c->kind = Ctx::Kind::kRead;
  StartRead(c, degraded, verify);
}

void GroupLayout::OnReply(Ctx* c, int member, uint32_t server, bool write, const Status& st) {
  if (c->kind == Ctx::Kind::kReclaim) {
    OnReclaimRead(c, member, st);
    io_.MaybeRelease(c);
  } else if (!write) {
    OnRead(c, member, st);
    io_.MaybeRelease(c);
  } else if (c->kind == Ctx::Kind::kStripe) {
    OnStripeWrite(c, member, server, st);
  } else {
    // A rebuilt member (kRegen) is stored (or its new server failed too: it is re-placed and
    // rebuilt again): readable from it either way once no rebuild is in flight. Other writes
    // here rewrite a corrupt member a read decoded.
    if (c->kind == Ctx::Kind::kRegen) {
      io_.slabs_[c->slab].stripes[c->pidx].rebuilding &= ~(1ull << member);
    }
    io_.RepairWritten(c, st);
  }
}

void GroupLayout::WriteGivenUp(Ctx* c) {
  StripeProgress(c);  // Only stripe writes are parked (a rebuilt member is posted once).
}

void GroupLayout::ReleaseCtx(Ctx* c) {
  if (!c->stripe_ref) return;
  c->stripe_ref = false;
  --io_.slabs_[c->slab].stripes[c->pidx].refs;
  MaybeReleaseStripe(c->slab, c->pidx);
}

bool GroupLayout::Flush() { return Seal(); }

void GroupLayout::Stop() {
  // Shutdown (the engine ended the allocations): what waited behind the stripe buffer fails like
  // the rest of the queue.
  for (const QueueItem& item : held_) io_.FailAtShutdown(item);
  held_.clear();
  held_writes_.clear();
  held_barriers_ = 0;
}

bool GroupLayout::Hold(const QueueItem& item) {
  if ((held_.empty() && !BufferFull()) || !MustHold(item)) return false;
  HoldItem(item);
  return true;
}

bool GroupLayout::MustHold(const QueueItem& item) const {
  if (held_barriers_ > 0) return true;
  if (item.kind != QueueItem::Kind::kPage) return !held_.empty();
  if (item.op->page >= store_->opt_.capacity_pages) return false;  // Fails at once.
  if (item.op->kind == PageOp::Kind::kWrite) return BufferFull() || !held_.empty();
  return held_writes_.count(item.op->page) > 0;  // Must see the write waiting before it.
}

void GroupLayout::HoldItem(const QueueItem& item) {
  if (item.kind != QueueItem::Kind::kPage) {
    ++held_barriers_;
  } else if (item.op->kind == PageOp::Kind::kWrite) {
    ++held_writes_[item.op->page];
  }
  held_.push_back(item);
}

void GroupLayout::ReleaseHeld() {
  // Take everything out and put back what must still wait, in order (the counts rebuilt as it
  // goes, so an item waits exactly when one before it that it must follow still waits).
  std::deque<QueueItem> items;
  items.swap(held_);
  held_writes_.clear();
  held_barriers_ = 0;
  for (const QueueItem& item : items) {
    if (io_.free_ctx_ == nullptr || MustHold(item)) {
      HoldItem(item);
    } else {
      io_.Dispatch(item);
    }
  }
}

bool GroupLayout::Poll() {
  if (held_.empty() || BufferFull()) return false;
  const size_t held = held_.size();
  ReleaseHeld();
  return held_.size() != held;
}

uint64_t GroupLayout::SleepBound(uint64_t timeout) const {
  // (A buffer waiting for a slab is woken by the allocator's answer, not by its fill time.)
  // (Nor, with no op context free, can it seal: a completion frees one, and wakes it.)
  if (gbuf_.empty() || waiting_alloc_ || io_.free_ctx_ == nullptr) return timeout;
  // Wake when the oldest buffered page's fill delay is up.
  const uint64_t due = gbuf_since_ns_ + uint64_t{lay_.g.fill_us} * 1000;
  const uint64_t now = MonotonicNs();
  return std::min(timeout, due > now ? due - now : 0);
}

void GroupLayout::SlabAllocated(Slab& s) {
  s.stripes.assign(store_->pages_per_slab_, Stripe{});
  s.stripes_used = 0;
  s.row_cursor = 0;
  s.draining = false;
  store_->stats_.remote_slabs.fetch_add(static_cast<uint64_t>(lay_.width()),
                                        std::memory_order_relaxed);
}

void GroupLayout::SlabFreed(Slab&) {
  store_->stats_.remote_slabs.fetch_sub(static_cast<uint64_t>(lay_.width()),
                                        std::memory_order_relaxed);
}

bool GroupLayout::StaleObsolete(const Slab& s, const StaleSplit& e) const {
  const Stripe& st = s.stripes[e.pidx];
  return st.state != Stripe::State::kSealed || st.gen != e.seq || ((st.zero >> e.j) & 1);
}

bool GroupLayout::StaleBusy(const Slab& s, const StaleSplit& e) const {
  return s.stripes[e.pidx].state == Stripe::State::kWriting ||
         ((s.stripes[e.pidx].rebuilding >> e.j) & 1);
}

void GroupLayout::RepairStale(const StaleSplit& e) {
  // Counted pending by NoteStale; GroupRebuildMember counts only scrubs itself.
  RebuildMember(e.slab, e.pidx, e.j, /*scrub=*/false);
}

void GroupLayout::Rehedge(Ctx* c, uint64_t bit) {
  if (c->kind == Ctx::Kind::kRead && !c->degraded) return;  // GroupHedge's.
  c->late |= bit;
  if (c->kind == Ctx::Kind::kReclaim) return;  // Needs exactly the members it asked.
  store_->stats_.hedged_reads.fetch_add(1, std::memory_order_relaxed);
  AskMore(c);
}

bool GroupLayout::NeedsRebuild(const Slab& s, uint32_t p, int j) const {
  // Rows in use whose member j is not padding.
  const Stripe& st = s.stripes[p];
  return st.state != Stripe::State::kFree && ((st.zero >> j) & 1) == 0;
}

void GroupLayout::PublishPage(PageId page) {
  if (!dloc_) return;
  const uint64_t li = LocalIndex(page);
  const PageLoc& L = gloc_[li];
  uint32_t slab = kDirectNo, row_col = 0, crc = 0;
  if (L.where == PageLoc::Where::kNone) {
    slab = kDirectZero;
  } else if (L.where == PageLoc::Where::kStored && L.row < (1u << 24)) {
    slab = L.slab;
    row_col = L.row << 8 | L.col;
    crc = io_.slabs_[L.slab].stripes[L.row].crc[L.col];
  }
  DirectLoc& d = dloc_[li];
  const uint32_t v = d.ver.load(std::memory_order_relaxed);
  d.ver.store(v + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  d.slab_inv.store(~slab, std::memory_order_relaxed);
  d.row_col.store(row_col, std::memory_order_relaxed);
  d.crc.store(crc, std::memory_order_relaxed);
  d.ver.store(v + 2, std::memory_order_release);
}

bool GroupLayout::Regenerate(Slab& s, int j) {
  const uint32_t rows = static_cast<uint32_t>(store_->pages_per_slab_);
  while (s.regen_cursor[j] < rows) {
    if (io_.regen_tokens_ < 1 || io_.regen_inflight_ >= 16 || io_.free_ctx_count_ < 4) return false;
    const uint32_t row = s.regen_cursor[j];
    Stripe& st = s.stripes[row];
    if (st.state == Stripe::State::kWriting) {
      // The stripe write in flight stores (or re-places) the member itself; wait for it.
      return true;
    }
    ++s.regen_cursor[j];
    if (s.regen_cursor[j] == rows) --io_.regen_active_;
    if (st.state == Stripe::State::kFree || ((st.zero >> j) & 1)) continue;
    io_.regen_tokens_ -= 1;
    RebuildMember(static_cast<uint32_t>(&s - io_.slabs_.data()), row, j, /*scrub=*/false);
  }
  return true;
}

void GroupLayout::RebuildMember(uint32_t slab, uint32_t row, int j, bool scrub) {
  Slab& s = io_.slabs_[slab];
  Stripe& st = s.stripes[row];
  Ctx* c = io_.NewCtx();
  c->kind = Ctx::Kind::kRegen;
  c->scrub = scrub;
  c->page = kNoPage;
  io_.Attach(c, slab);
  c->pidx = row;
  c->col = j;
  c->regen_split = j;
  c->crcs = st.crc;
  c->zero = st.zero;
  c->stripe_ref = true;
  ++st.refs;
  st.rebuilding |= 1ull << j;  // Cleared when the rebuilt member is stored (or given up).
  c->asked = 1ull << j;        // Never read the member being rebuilt.
  c->degraded = true;
  ++io_.regen_inflight_;
  if (scrub) store_->stats_.regenerations_pending.fetch_add(1, std::memory_order_relaxed);
  AskMore(c);
}

bool GroupLayout::DirectLocate(PageId page, DirectTarget* out) const {
  if (!dloc_) return false;
  const DirectLoc& d = dloc_[LocalIndex(page)];
  for (int attempt = 0; attempt < 4; ++attempt) {
    const uint32_t v1 = d.ver.load(std::memory_order_acquire);
    if (v1 & 1) continue;  // The I/O thread is changing it (a few instructions): look again.
    const uint32_t slab = ~d.slab_inv.load(std::memory_order_relaxed);
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
    const DirectSlab& ds = io_.dslab_[slab];
    const int col = static_cast<int>(row_col & 0xff);
    if (col >= lay_.width()) return false;
    const uint32_t sv = ds.ver.load(std::memory_order_acquire);
    if (sv & 1) continue;
    DirectPart part;
    LoadDirectMember(ds, col, &part);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (ds.ver.load(std::memory_order_relaxed) != sv) continue;
    if (part.server == kNoServer || part.remote.slab_id == 0) return false;
    part.crc = crc;
    out->zero = false;
    out->slab_ver = sv;
    out->slab = slab;
    out->offset = static_cast<uint64_t>(row_col >> 8) * kPageSize;
    out->length = kPageSize;
    out->parts = 1;
    out->part[0] = part;
    return true;
  }
  return false;
}

bool GroupLayout::DirectPageValid(PageId page, const DirectTarget& t) const {
  return dloc_[LocalIndex(page)].ver.load(std::memory_order_relaxed) == t.page_ver;
}

}  // namespace tessera::client::remote
