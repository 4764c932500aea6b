// Publishing and locating for direct reads (see direct_read.cc for the protocol and why it is
// enough): the I/O thread publishes each page's location and each slab's members under
// seqlocks; any thread locates a page from them and checks, after its reply arrived, that
// neither seqlock moved.
#include <algorithm>
#include <cstring>

#include "client/remote/engine.h"
#include "client/remote/layout.h"

namespace tessera::client::remote {
// ---- I/O thread: publishing ----

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
    for (int j = 0; j < W; ++j) LoadDirectMember(ds, j, &out->part[j]);
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

bool IoThread::DirectLocate(PageId page, DirectTarget* out) const {
  return layout_->DirectLocate(page, out);
}

bool IoThread::DirectValid(PageId page, const DirectTarget& t) const {
  std::atomic_thread_fence(std::memory_order_acquire);
  if (!layout_->DirectPageValid(page, t)) return false;
  return t.zero || dslab_[t.slab].ver.load(std::memory_order_relaxed) == t.slab_ver;
}

void IoThread::RecordDirectRead(uint64_t latency_ns) {
  std::lock_guard<std::mutex> lock(hist_mu_);
  read_hist_.Record(latency_ns);
}

}  // namespace tessera::client::remote
