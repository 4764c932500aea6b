// The split layout's (and copies') hooks into the I/O thread (see split_layout.h). Its read
// path is read_path.cc, its write path write_path.cc and slab_alloc.cc.
#include "client/remote/split_layout.h"

#include <algorithm>
#include <cstring>

namespace tessera::client::remote {

// ---- the store's ----

Status SplitStoreLayout::MakeCodecs(RemoteStore& store) const {
  if (lay_.copies) return Status::Ok();  // Every split is the page.
  TESSERA_ASSIGN_OR_RETURN(auto codec, coding::Codec::Create(lay_.k, lay_.r));
  store.codec_.emplace(std::move(codec));
  return Status::Ok();
}

uint64_t SplitStoreLayout::NumSlabs(const RemoteStoreOptions& o, uint64_t pages_per_slab) const {
  return (o.capacity_pages + pages_per_slab - 1) / pages_per_slab;
}

long double SplitStoreLayout::TableBytes(const RemoteStoreOptions& o, uint64_t num_slabs) const {
  // One slab table (shared out among the I/O threads); CRCs and per-page state per page.
  return static_cast<long double>(num_slabs) * sizeof(Slab) +
         static_cast<long double>(o.capacity_pages) * (4.0L * lay_.width() + 16.0L);
}

void SplitStoreLayout::Placement(placement::PolicySpec* spec) const {
  spec->k = lay_.copies ? 1 : lay_.k;
  spec->r = lay_.copies ? 0 : lay_.r;
  spec->replicas = lay_.width();
  if (lay_.copies && spec->kind == placement::PolicyKind::kCodingSets) {
    // CodingSets groups k+r servers; for copies use groups of `copies` servers.
    spec->k = 1;
    spec->r = lay_.width() - 1;
  }
}

bool SplitStoreLayout::PlacementFallback(placement::PolicySpec* spec) const {
  if (!lay_.copies) return false;
  // CodingSets needs parity; a single copy falls back to random replication of 1.
  spec->kind = placement::PolicyKind::kRandomReplication;
  return true;
}

// ---- the I/O thread's ----

SplitLayout::SplitLayout(IoThread& io, const LayoutParams& lay)
    : io_(io), store_(io.store_), lay_(lay) {}

uint64_t SplitLayout::SlabCount() const {
  // Logical slab ls lives at index ls / io_threads of thread ls % io_threads.
  const int T = store_->opt_.io_threads;
  return (store_->num_slabs_ + T - 1 - io_.index_) / T;
}

void SplitLayout::Setup(uint32_t) {
  if (lay_.copies || !store_->opt_.direct_reads) return;
  // Direct reads: slab members now, page tables per slab when first allocated.
  io_.dslab_.reset(new DirectSlab[io_.slabs_.size()]);
  dsplit_.resize(io_.slabs_.size());
  dsplit_ptr_.reset(new std::atomic<std::atomic<uint32_t>*>[io_.slabs_.size()]);
  for (size_t i = 0; i < io_.slabs_.size(); ++i) dsplit_ptr_[i].store(nullptr);
}

void SplitLayout::StartOp(PageOp* op, uint64_t now, bool, bool verify) {
  Ctx* c = io_.NewCtx();
  c->op = op;
  c->page = op->page;
  c->start_ns = now;
  const uint64_t ls = op->page / store_->pages_per_slab_;
  io_.Attach(c, static_cast<uint32_t>(ls / store_->opt_.io_threads));
  c->pidx = static_cast<uint32_t>(op->page % store_->pages_per_slab_);
  if (op->kind == PageOp::Kind::kRead) {
    c->kind = Ctx::Kind::kRead;
    c->verify = verify;
    StartRead(c);
  } else {
    c->kind = Ctx::Kind::kWrite;
    std::memcpy(c->buf, op->buf, kPageSize);  // The caller's buffer is free once acked.
    StartWrite(c);
  }
}

void SplitLayout::OnReply(Ctx* c, int member, uint32_t server, bool write, const Status& st) {
  if (!write) {
    OnReadSplit(c, member, st);
    io_.MaybeRelease(c);
  } else {
    OnWriteSplit(c, member, server, st);
  }
}

bool SplitLayout::Hold(const QueueItem& item) {
  if ((waiting_.empty() && held_.empty()) || !MustHold(item)) return false;
  HoldItem(item);
  return true;
}

bool SplitLayout::Poll() {
  bool any = false;
  if (!held_.empty()) {
    const size_t held = held_.size();
    ReleaseHeld();
    any |= held_.size() != held;
  }
  return any;
}

void SplitLayout::WriteGivenUp(Ctx* c) { WriteProgress(c); }

Result<std::vector<size_t>> SplitLayout::Locate(PageId page) { return io_.ServersOf(page); }

void SplitLayout::Trim(PageId first, uint64_t count) {
  if (count == 0 || first >= store_->opt_.capacity_pages) return;
  const uint64_t last = std::min<uint64_t>(first + count, store_->opt_.capacity_pages);  // excl.
  const uint64_t pps = store_->pages_per_slab_;
  const uint64_t T = static_cast<uint64_t>(store_->opt_.io_threads);
  for (uint64_t ls = first / pps; ls * pps < last; ++ls) {
    if (ls % T != static_cast<uint64_t>(io_.index_)) continue;
    Slab& s = io_.slabs_[ls / T];
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
    io_.MaybeFreeSlab(s);
  }
}

void SplitLayout::SlabAllocated(Slab& s) {
  const size_t pps = store_->pages_per_slab_;
  s.crc.assign(pps * lay_.width(), 0);
  // Sequences only ever grow (also across a free and a reallocation), so an op context that
  // saw an older incarnation of a page never mistakes it for the current one.
  if (s.seq.size() != pps) s.seq.assign(pps, 0);
  s.written.assign(pps, 0);
  s.busy.assign(pps, nullptr);
  s.trim_after.assign(pps, 0);
  s.written_count = 0;
  EnsureSplitTable(s);  // Every page of it reads as zeros (all were unwritten before a free).
}

void SplitLayout::RebuildSplit(Slab& s, uint32_t p, int j) {
  Ctx* c = io_.NewCtx();
  c->kind = Ctx::Kind::kRegen;
  c->page = s.id * store_->pages_per_slab_ + p;
  io_.Attach(c, static_cast<uint32_t>(&s - io_.slabs_.data()));
  c->pidx = p;
  c->regen_split = j;
  c->seq = s.seq[p];
  std::memcpy(c->crcs.data(), &s.crc[static_cast<size_t>(p) * lay_.width()],
              sizeof(uint32_t) * lay_.width());
  c->asked = 1ull << j;  // Never read the split being rebuilt.
  ++io_.regen_inflight_;
  AskMore(c);
}

void SplitLayout::RepairStale(const StaleSplit& e) {
  RebuildSplit(io_.slabs_[e.slab], e.pidx, e.j);
}

void SplitLayout::Rehedge(Ctx* c, uint64_t bit) {
  c->late |= bit;
  store_->stats_.hedged_reads.fetch_add(1, std::memory_order_relaxed);
  AskMore(c);
}

bool SplitLayout::Regenerate(Slab& s, int j) {
  const uint32_t pps = static_cast<uint32_t>(store_->pages_per_slab_);
  while (s.regen_cursor[j] < pps) {
    if (io_.regen_tokens_ < 1 || io_.regen_inflight_ >= 16 || io_.free_ctx_count_ < 4) return false;
    const uint32_t p = s.regen_cursor[j]++;
    io_.PublishSettled(s, j);
    if (s.regen_cursor[j] == pps) --io_.regen_active_;
    if (!s.written[p]) continue;
    if (s.busy[p] != nullptr) {  // The write in flight stores the split itself.
      store_->stats_.regenerations_pending.fetch_sub(1, std::memory_order_relaxed);
      continue;
    }
    io_.regen_tokens_ -= 1;
    RebuildSplit(s, p, j);
  }
  return true;
}

bool SplitLayout::DirectLocate(PageId page, DirectTarget* out) const {
  if (!dsplit_ptr_) return false;
  const uint64_t pps = store_->pages_per_slab_;
  const uint64_t T = static_cast<uint64_t>(store_->opt_.io_threads);
  const uint32_t si = static_cast<uint32_t>(page / pps / T);
  const uint32_t pidx = static_cast<uint32_t>(page % pps);
  const int W = lay_.width();
  const DirectSlab& ds = io_.dslab_[si];
  for (int attempt = 0; attempt < 4; ++attempt) {
    const uint32_t sv = ds.ver.load(std::memory_order_acquire);
    if (sv & 1) continue;
    for (int j = 0; j < W; ++j) {
      LoadDirectMember(ds, j, &out->part[j]);
      // A replacement member not rebuilt this far yet holds no split of the page: not asked
      // (the others decode it), as the I/O thread's own reads do.
      if (ds.settled[j].load(std::memory_order_relaxed) <= pidx) out->part[j].server = kNoServer;
    }
    std::atomic_thread_fence(std::memory_order_acquire);
    if (ds.ver.load(std::memory_order_relaxed) != sv) continue;
    // Set before the slab is first published, never changed after.
    const std::atomic<uint32_t>* tbl = dsplit_ptr_[si].load(std::memory_order_acquire);
    if (tbl == nullptr) {
      out->zero = true;  // The slab was never allocated: no page of it was ever written.
      return true;
    }
    // (A freed slab's pages were all unwritten first: they read kSplitZero below.)
    const std::atomic<uint32_t>* e = tbl + static_cast<size_t>(pidx) * static_cast<size_t>(2 + W);
    const uint32_t v1 = e[0].load(std::memory_order_acquire);
    if (v1 & 1) continue;
    const uint32_t state = e[1].load(std::memory_order_relaxed);
    for (int j = 0; j < W; ++j) out->part[j].crc = e[2 + j].load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (e[0].load(std::memory_order_relaxed) != v1) continue;
    if (state == kSplitZero) {
      out->zero = true;
      return true;
    }
    if (state != kSplitStored) return false;
    out->zero = false;
    out->page_ver = v1;
    out->slab_ver = sv;
    out->slab = si;
    out->offset = static_cast<uint64_t>(pidx) * lay_.split;
    out->length = static_cast<uint32_t>(lay_.split);
    out->parts = W;
    return true;
  }
  return false;
}

bool SplitLayout::DirectPageValid(PageId page, const DirectTarget& t) const {
  if (t.zero) return true;
  const std::atomic<uint32_t>* tbl = dsplit_ptr_[t.slab].load(std::memory_order_acquire);
  const size_t pidx = page % store_->pages_per_slab_;
  return tbl[pidx * static_cast<size_t>(2 + lay_.width())].load(std::memory_order_relaxed) ==
         t.page_ver;
}

// ---- direct reads: the I/O thread publishes ----

void SplitLayout::EnsureSplitTable(const Slab& s) {
  if (!dsplit_ptr_) return;
  const size_t si = static_cast<size_t>(&s - io_.slabs_.data());
  if (dsplit_[si]) return;
  const size_t n = store_->pages_per_slab_ * static_cast<size_t>(2 + lay_.width());
  dsplit_[si] = std::make_unique<std::atomic<uint32_t>[]>(n);  // All kSplitZero, version 0.
  dsplit_ptr_[si].store(dsplit_[si].get(), std::memory_order_release);
}

void SplitLayout::PublishSplitPage(const Slab& s, uint32_t pidx) {
  if (!dsplit_ptr_) return;
  const size_t si = static_cast<size_t>(&s - io_.slabs_.data());
  std::atomic<uint32_t>* tbl = dsplit_[si].get();
  if (tbl == nullptr) return;
  const int W = lay_.width();
  std::atomic<uint32_t>* e = tbl + static_cast<size_t>(pidx) * static_cast<size_t>(2 + W);
  const uint32_t state = s.busy[pidx] != nullptr ? kSplitNo
                         : s.written[pidx]       ? kSplitStored
                                                 : kSplitZero;
  const uint32_t v = e[0].load(std::memory_order_relaxed);
  e[0].store(v + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  e[1].store(state, std::memory_order_relaxed);
  if (state == kSplitStored) {
    const uint32_t* crc = &s.crc[static_cast<size_t>(pidx) * static_cast<size_t>(W)];
    for (int j = 0; j < W; ++j) e[2 + j].store(crc[j], std::memory_order_relaxed);
  }
  e[0].store(v + 2, std::memory_order_release);
}

}  // namespace tessera::client::remote
