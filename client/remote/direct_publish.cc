// Publishing and locating for direct reads (see direct_read.cc for the protocol and why it is
// enough): the I/O thread publishes each page's location and each slab's members under
// seqlocks; any thread locates a page from them and checks, after its reply arrived, that
// neither seqlock moved.
#include <algorithm>
#include <cstring>

#include "client/remote/engine.h"

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
    d.settled[j].store(s.regen_cursor[j], std::memory_order_relaxed);
  }
  d.ver.store(v + 2, std::memory_order_release);
}

void IoThread::PublishSettled(const Slab& s, int j) {
  if (!dslab_) return;
  dslab_[static_cast<size_t>(&s - slabs_.data())].settled[j].store(s.regen_cursor[j],
                                                                   std::memory_order_release);
}

void IoThread::EnsureSplitTable(const Slab& s) {
  if (!dsplit_ptr_) return;
  const size_t si = static_cast<size_t>(&s - slabs_.data());
  if (dsplit_[si]) return;
  const size_t n = store_->pages_per_slab_ * static_cast<size_t>(2 + lay_.width());
  dsplit_[si] = std::make_unique<std::atomic<uint32_t>[]>(n);  // All kSplitZero, version 0.
  dsplit_ptr_[si].store(dsplit_[si].get(), std::memory_order_release);
}

void IoThread::PublishSplitPage(const Slab& s, uint32_t pidx) {
  if (!dsplit_ptr_) return;
  const size_t si = static_cast<size_t>(&s - slabs_.data());
  std::atomic<uint32_t>* tbl = dsplit_[si].get();
  if (tbl == nullptr) return;
  const int W = lay_.width();
  std::atomic<uint32_t>* e = tbl + static_cast<size_t>(pidx) * static_cast<size_t>(2 + W);
  const uint32_t state = s.busy[pidx] != nullptr ? kSplitNo
                         : s.written[pidx]        ? kSplitStored
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

// ---- any thread: locating ----

namespace {
// Reads member j of a published slab (under its seqlock, checked by the caller).
void LoadMember(const DirectSlab& ds, int j, DirectPart* p) {
  p->server = ds.server[j].load(std::memory_order_relaxed);
  p->remote.slab_id = ds.id[j].load(std::memory_order_relaxed);
  p->remote.remote_addr = ds.addr[j].load(std::memory_order_relaxed);
  p->remote.size = ds.size[j].load(std::memory_order_relaxed);
  p->remote.rkey = ds.rkey[j].load(std::memory_order_relaxed);
}
}  // namespace

bool IoThread::DirectLocate(PageId page, DirectTarget* out) const {
  if (!lay_.group) return DirectLocateSplit(page, out);
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
    DirectPart part;
    LoadMember(ds, col, &part);
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

bool IoThread::DirectLocateSplit(PageId page, DirectTarget* out) const {
  if (!dsplit_ptr_) return false;
  const uint64_t pps = store_->pages_per_slab_;
  const uint64_t T = static_cast<uint64_t>(store_->opt_.io_threads);
  const uint32_t si = static_cast<uint32_t>(page / pps / T);
  const uint32_t pidx = static_cast<uint32_t>(page % pps);
  const int W = lay_.width();
  const DirectSlab& ds = dslab_[si];
  for (int attempt = 0; attempt < 4; ++attempt) {
    const uint32_t sv = ds.ver.load(std::memory_order_acquire);
    if (sv & 1) continue;
    for (int j = 0; j < W; ++j) {
      LoadMember(ds, j, &out->part[j]);
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

bool IoThread::DirectValid(PageId page, const DirectTarget& t) const {
  std::atomic_thread_fence(std::memory_order_acquire);
  if (lay_.group) {
    if (dloc_[LocalIndex(page)].ver.load(std::memory_order_relaxed) != t.page_ver) return false;
  } else if (!t.zero) {
    const std::atomic<uint32_t>* tbl = dsplit_ptr_[t.slab].load(std::memory_order_acquire);
    const size_t pidx = page % store_->pages_per_slab_;
    if (tbl[pidx * static_cast<size_t>(2 + lay_.width())].load(std::memory_order_relaxed) !=
        t.page_ver) {
      return false;
    }
  }
  return t.zero || dslab_[t.slab].ver.load(std::memory_order_relaxed) == t.slab_ver;
}

void IoThread::RecordDirectRead(uint64_t latency_ns) {
  std::lock_guard<std::mutex> lock(hist_mu_);
  read_hist_.Record(latency_ns);
}

}  // namespace tessera::client::remote
