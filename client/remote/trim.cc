// Trims and slab release: pages become never-written in the client's tables, and logical
// slabs left with no written page give their remote slabs back (FREE); a clean shutdown frees
// everything.
#include "client/remote/engine.h"
#include "client/remote/layout.h"

#include <algorithm>

#include "common/logging.h"

namespace tessera::client::remote {

void IoThread::MaybeFreeSlab(Slab& s) {
  if (!s.allocated || !s.free_wanted || layout_->InUse(s) > 0 || s.refs > 0) return;
  layout_->SlabFreed(s);
  const uint32_t pps = static_cast<uint32_t>(store_->pages_per_slab_);
  std::array<std::pair<uint32_t, uint64_t>, kMaxWidth> remotes{};
  // Unpublish first: from here on a write to this logical slab allocates a fresh set, and a
  // server failure noticed during the frees below does not try to re-place these splits.
  s.allocated = false;
  s.free_wanted = false;
  // A replacement still being allocated for one of its members is given back when it comes.
  const uint32_t slab = static_cast<uint32_t>(&s - slabs_.data());
  for (PendingReplace& r : replacing_) {
    if (r.slab == slab) r.cancelled = true;
  }
  for (int j = 0; j < lay_.width(); ++j) {
    if (s.regen_cursor[j] < pps) --regen_active_;  // No written page is left to rebuild.
    s.regen_cursor[j] = pps;
    remotes[j] = {s.server[j].load(std::memory_order_relaxed), s.remote[j]};
    s.server[j].store(kNoServer, std::memory_order_relaxed);
    s.remote_info[j] = fabric::AllocSlabResponse{};
  }
  PublishSlab(slab);
  {
    std::lock_guard<std::mutex> lock(store_->mu_);
    for (int j = 0; j < lay_.width(); ++j) {
      const uint32_t server = remotes[j].first;
      if (server != kNoServer && store_->load_[server] > 0) store_->load_[server]--;
    }
  }
  for (int j = 0; j < lay_.width(); ++j) {
    const uint32_t server = remotes[j].first;
    if (server == kNoServer || local_failed_[server] || store_->failed_[server].load()) continue;
    if (remotes[j].second != 0) ReleaseRemote(server, remotes[j].second);  // 0: left missing.
  }
  store_->stats_.slabs_freed.fetch_add(1, std::memory_order_relaxed);
}

void IoThread::FreeAllSlabs() {
  for (Slab& s : UsedSlabs()) {
    if (!s.allocated) continue;
    for (int j = 0; j < lay_.width(); ++j) {
      const uint32_t server = s.server[j].load(std::memory_order_relaxed);
      if (server == kNoServer || local_failed_[server] || store_->failed_[server].load()) continue;
      if (s.remote[j] != 0) ReleaseRemote(server, s.remote[j]);
    }
    s.allocated = false;
    PublishSlab(static_cast<uint32_t>(&s - slabs_.data()));
  }
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
  QueueJob job;
  job.first = first;
  job.count = count;
  const size_t T = threads_.size();
  job.left = static_cast<int>(T);
  for (size_t t = 0; t < T; ++t) {
    QueueItem item;
    item.kind = QueueItem::Kind::kTrim;
    item.trim = &job;
    threads_[t]->Enqueue(item);
  }
  {
    std::unique_lock<std::mutex> lock(job.mu);
    job.cv.wait(lock, [&] { return job.left == 0; });
  }
  TESSERA_RETURN_IF_ERROR(job.status);
  stats_.trims.fetch_add(count);
  return Status::Ok();
}


}  // namespace tessera::client::remote
