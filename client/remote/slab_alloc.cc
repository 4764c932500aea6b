// Split layout (and copies): a new logical slab is allocated off the I/O thread. Its ALLOC
// control calls go to the SlabAllocator's workers (IoThread::BeginAllocate, slabs.cc); the
// write that needs the slab waits for them in waiting_, and the queue items that must come
// after that write (its slab's other pages, and any trim, flush or locate with everything
// behind it) wait in held_. Every other op goes on meanwhile: an allocation from a server that
// has stopped answering holds up the writes of one new slab until the server is suspect and the
// member is asked elsewhere (IoThread::AbandonStuckAllocs), not this thread.
#include "client/remote/split_layout.h"

#include <algorithm>
#include <bit>

#include "common/logging.h"

namespace tessera::client::remote {

void SplitLayout::AllocateThenWrite(Slab& s, Ctx* c) {
  const uint32_t slab = static_cast<uint32_t>(&s - io_.slabs_.data());
  for (auto& [w, ctxs] : waiting_) {
    if (w == slab) {
      ctxs.push_back(c);
      return;
    }
  }
  waiting_.emplace_back(slab, std::vector<Ctx*>{c});
  io_.BeginAllocate(s);  // SlabReady() starts (or fails) the writes, now or later.
}

void SplitLayout::SlabReady(uint32_t slab, const Status& st) {
  std::vector<Ctx*> waiting;
  for (size_t i = 0; i < waiting_.size(); ++i) {
    if (waiting_[i].first == slab) {
      waiting = std::move(waiting_[i].second);
      waiting_.erase(waiting_.begin() + static_cast<std::ptrdiff_t>(i));
      break;
    }
  }
  for (Ctx* c : waiting) {
    if (st.ok()) {
      StartWrite(c);
    } else {
      c->finished = true;
      io_.Complete(c->op, st, c->start_ns);
      c->op = nullptr;
      io_.MaybeRelease(c);
    }
  }
}

bool SplitLayout::MustHold(const QueueItem& item) const {
  if (held_barriers_ > 0) return true;
  if (item.kind != QueueItem::Kind::kPage) return !waiting_.empty() || !held_.empty();
  if (item.op->page >= store_->opt_.capacity_pages) return false;  // Fails at once.
  const uint32_t slab = SlabIndexOf(item.op->page);
  if (slab < held_per_slab_.size() && held_per_slab_[slab] > 0) return true;
  return io_.Allocating(slab);
}

void SplitLayout::HoldItem(const QueueItem& item) {
  if (item.kind != QueueItem::Kind::kPage) {
    ++held_barriers_;
  } else if (item.op->page < store_->opt_.capacity_pages) {
    const uint32_t slab = SlabIndexOf(item.op->page);
    if (held_per_slab_.size() <= slab) held_per_slab_.resize(slab + 1, 0);
    ++held_per_slab_[slab];
  }
  held_.push_back(item);
}

void SplitLayout::ReleaseHeld() {
  if (held_.empty()) return;
  // Take everything out and put back what must still wait, in order (the counts rebuilt as it
  // goes, so an item waits exactly when one before it that it must follow still waits).
  std::deque<QueueItem> items;
  items.swap(held_);
  std::fill(held_per_slab_.begin(), held_per_slab_.end(), 0);
  held_barriers_ = 0;
  for (const QueueItem& item : items) {
    if (io_.free_ctx_ == nullptr || MustHold(item)) {
      HoldItem(item);
    } else {
      io_.Dispatch(item);
    }
  }
}

void SplitLayout::Stop() {
  // The engine ended the allocations (StopAllocations) and the writes waiting for them.
  // Whatever waited for them fails like the rest of the queue at shutdown.
  for (const QueueItem& item : held_) io_.FailAtShutdown(item);
  held_.clear();
}

}  // namespace tessera::client::remote
