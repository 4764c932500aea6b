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
    d.settled[j].store(s.regen_cursor[j], std::memory_order_relaxed);
  }
  d.ver.store(v + 2, std::memory_order_release);
}

void IoThread::PublishSettled(const Slab& s, int j) {
  if (!dslab_) return;
  dslab_[static_cast<size_t>(&s - slabs_.data())].settled[j].store(s.regen_cursor[j],
                                                                   std::memory_order_release);
}

// ---- any thread: locating ----

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
