// The split layout's (and copies') hooks into the I/O thread (see split_layout.h). Its read
// path is read_path.cc, its write path write_path.cc and slab_alloc.cc.
#include "client/remote/split_layout.h"

#include <algorithm>
#include <cstring>

namespace tessera::client::remote {

SplitLayout::SplitLayout(IoThread& io, const LayoutParams& lay)
    : io_(io), store_(io.store_), lay_(lay) {}

uint64_t SplitLayout::SlabCount() const {
  // Logical slab ls lives at index ls / io_threads of thread ls % io_threads.
  const int T = store_->opt_.io_threads;
  return (store_->num_slabs_ + T - 1 - io_.index_) / T;
}

void SplitLayout::Setup(uint32_t) {
  io_.allocator_ = std::make_unique<SlabAllocator>(store_, [this] { io_.Wake(); });
  if (lay_.copies || !store_->opt_.direct_reads) return;
  // Direct reads: slab members now, page tables per slab when first allocated.
  io_.dslab_.reset(new DirectSlab[io_.slabs_.size()]);
  io_.dsplit_.resize(io_.slabs_.size());
  io_.dsplit_ptr_.reset(new std::atomic<std::atomic<uint32_t>*>[io_.slabs_.size()]);
  for (size_t i = 0; i < io_.slabs_.size(); ++i) io_.dsplit_ptr_[i].store(nullptr);
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
    io_.StartRead(c);
  } else {
    c->kind = Ctx::Kind::kWrite;
    std::memcpy(c->buf, op->buf, kPageSize);  // The caller's buffer is free once acked.
    io_.StartWrite(c);
  }
}

void SplitLayout::OnReply(Ctx* c, int member, uint32_t server, bool write, const Status& st) {
  if (!write) {
    io_.OnReadSplit(c, member, st);
    io_.MaybeRelease(c);
  } else {
    io_.OnWriteSplit(c, member, server, st);
  }
}

void SplitLayout::WriteGivenUp(Ctx* c) { io_.WriteProgress(c); }

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
        io_.Unwrite(s, p);
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
  io_.EnsureSplitTable(s);  // Every page of it reads as zeros (all were unwritten before a free).
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
  io_.AskMore(c);
}

void SplitLayout::RepairStale(const StaleSplit& e) {
  RebuildSplit(io_.slabs_[e.slab], e.pidx, e.j);
}

void SplitLayout::Rehedge(Ctx* c, uint64_t bit) {
  c->late |= bit;
  store_->stats_.hedged_reads.fetch_add(1, std::memory_order_relaxed);
  io_.AskMore(c);
}

bool SplitLayout::Regenerate(Slab& s, int j) {
  const uint32_t pps = static_cast<uint32_t>(store_->pages_per_slab_);
  while (s.regen_cursor[j] < pps) {
    if (io_.regen_tokens_ < 1 || io_.regen_inflight_ >= 16 || io_.free_ctx_count_ < 4) return false;
    const uint32_t p = s.regen_cursor[j]++;
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
  return io_.DirectLocateSplit(page, out);
}

bool SplitLayout::DirectPageValid(PageId page, const DirectTarget& t) const {
  if (t.zero) return true;
  const std::atomic<uint32_t>* tbl = io_.dsplit_ptr_[t.slab].load(std::memory_order_acquire);
  const size_t pidx = page % store_->pages_per_slab_;
  return tbl[pidx * static_cast<size_t>(2 + lay_.width())].load(std::memory_order_relaxed) ==
         t.page_ver;
}

}  // namespace tessera::client::remote
