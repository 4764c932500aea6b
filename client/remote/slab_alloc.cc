// Split layout (and copies): a new logical slab is allocated off the I/O thread. Its ALLOC
// control calls go to the SlabAllocator's thread; the write that needs the slab waits for them
// in the slab's PendingAlloc, and the queue items that must come after that write (its slab's
// other pages, and any trim, flush or locate with everything behind it) wait in held_. Every
// other op goes on meanwhile: an allocation from a server that has stopped answering holds up
// the writes of one new slab for its deadline, not this thread.
#include "client/remote/split_layout.h"

#include <algorithm>
#include <bit>

#include "common/logging.h"

namespace tessera::client::remote {

void SplitLayout::AllocateThenWrite(Slab& s, Ctx* c) {
  const uint32_t slab = static_cast<uint32_t>(&s - io_.slabs_.data());
  for (PendingAlloc& a : allocs_) {
    if (a.slab == slab) {
      a.waiting.push_back(c);
      return;
    }
  }
  auto servers = io_.PlaceSlab(s);
  if (!servers.ok()) {
    c->finished = true;
    io_.Complete(c->op, servers.status(), c->start_ns);
    c->op = nullptr;
    io_.MaybeRelease(c);
    return;
  }
  allocs_.emplace_back();
  PendingAlloc& a = allocs_.back();
  a.slab = slab;
  a.servers = std::move(*servers);
  a.waiting.push_back(c);
  for (int j = 0; j < lay_.width() && a.failed.ok(); ++j) AskMember(a, j);
  MaybeEndAlloc(allocs_.size() - 1);
}

void SplitLayout::AskMember(PendingAlloc& a, int j) {
  for (;;) {
    const uint32_t server = a.servers[j];
    // A suspect server is skipped while there is another choice (it may be stopped), and asked
    // as the last resort.
    if (io_.Usable(server) &&
        (!store_->Suspect(server) || a.tries[j] == io_.kMaxAllocReplacements)) {
      const uint32_t ms = std::min(store_->opt_.control_timeout_ms, store_->opt_.op_timeout_ms);
      allocator_->Alloc(uint64_t{a.slab} << 8 | static_cast<uint64_t>(j), server, ms);
      a.asked |= 1ull << j;
      return;
    }
    if (!ReplaceMember(a, j, Unavailable("server is failed, suspect or not connected"))) return;
  }
}

bool SplitLayout::ReplaceMember(PendingAlloc& a, int j, const Status& why) {
  if (a.failed.ok() && (a.tries[j] == io_.kMaxAllocReplacements ||
                        !io_.ReplaceNewMember(io_.slabs_[a.slab].id, a.servers, j, why))) {
    a.failed = Unavailable("cannot allocate a slab on " +
                           store_->server(a.servers[j]).endpoint.ToString() + ": " +
                           why.ToString());
  }
  if (!a.failed.ok()) return false;
  ++a.tries[j];
  return true;
}

bool SplitLayout::TakeAllocAnswers() {
  if (allocator_ == nullptr || !allocator_->Take(&answers_)) return false;
  for (SlabAllocator::Answer& answer : answers_) OnAllocAnswer(answer);
  answers_.clear();
  return true;
}

void SplitLayout::OnAllocAnswer(SlabAllocator::Answer& answer) {
  const uint32_t slab = static_cast<uint32_t>(answer.tag >> 8);
  const int j = static_cast<int>(answer.tag & 0xff);
  const uint32_t server = answer.server;
  size_t i = 0;
  while (i < allocs_.size() && allocs_[i].slab != slab) ++i;
  if (i == allocs_.size()) {  // Cannot happen: an answer always has its allocation.
    if (answer.slab.ok()) io_.freer_->Free(server, answer.slab->slab_id);
    return;
  }
  PendingAlloc& a = allocs_[i];
  a.asked &= ~(1ull << j);
  Slab& s = io_.slabs_[slab];
  Status why;
  if (answer.slab.ok()) {
    const fabric::AllocSlabResponse& r = *answer.slab;
    if (!a.failed.ok()) {
      io_.freer_->Free(server, r.slab_id);  // The allocation failed meanwhile: give it back.
    } else if (Status added = io_.Usable(server) ? io_.t_->AddSlab(io_.conn_[server], r)
                                                 : Unavailable("data connection down");
               added.ok()) {
      s.server[j].store(server, std::memory_order_relaxed);
      s.remote[j] = r.slab_id;
      s.remote_info[j] = r;
      s.regen_cursor[j] = static_cast<uint32_t>(store_->pages_per_slab_);
      a.got |= 1ull << j;
    } else {
      io_.freer_->Free(server, r.slab_id);
      why = added;
    }
  } else {
    why = answer.slab.status();
    if (why.code() == StatusCode::kCancelled) {
      if (a.failed.ok()) a.failed = why;  // Shutting down: no replacement.
    } else if (IsConnectionError(why)) {
      store_->ReportTrouble(server, "slab allocation: " + why.ToString());
    }
  }
  if (!why.ok() && a.failed.ok() && ReplaceMember(a, j, why)) AskMember(a, j);
  MaybeEndAlloc(i);
}

void SplitLayout::MaybeEndAlloc(size_t i) {
  PendingAlloc& a = allocs_[i];
  if (a.asked != 0) return;
  Slab& s = io_.slabs_[a.slab];
  std::vector<Ctx*> waiting = std::move(a.waiting);
  const Status failed = a.failed;
  if (!failed.ok()) {
    for (uint64_t m = a.got; m != 0; m &= m - 1) {
      const int j = std::countr_zero(m);
      const uint32_t srv = s.server[j].load(std::memory_order_relaxed);
      if (!io_.local_failed_[srv] && !store_->failed_[srv].load()) {
        io_.ReleaseRemote(srv, s.remote[j]);
      }
    }
    for (int j = 0; j < lay_.width(); ++j) s.server[j].store(kNoServer);
    std::lock_guard<std::mutex> lock(store_->mu_);
    for (auto id : a.servers) {
      if (store_->load_[id] > 0) store_->load_[id]--;
    }
  } else {
    io_.FinishSlab(s);
  }
  allocs_.erase(allocs_.begin() + static_cast<std::ptrdiff_t>(i));
  for (Ctx* c : waiting) {
    if (failed.ok()) {
      StartWrite(c);
    } else {
      c->finished = true;
      io_.Complete(c->op, failed, c->start_ns);
      c->op = nullptr;
      io_.MaybeRelease(c);
    }
  }
}

bool SplitLayout::MustHold(const QueueItem& item) const {
  if (held_barriers_ > 0) return true;
  if (item.kind != QueueItem::Kind::kPage) return !allocs_.empty() || !held_.empty();
  if (item.op->page >= store_->opt_.capacity_pages) return false;  // Fails at once.
  const uint32_t slab = SlabIndexOf(item.op->page);
  if (slab < held_per_slab_.size() && held_per_slab_[slab] > 0) return true;
  return std::any_of(allocs_.begin(), allocs_.end(),
                     [slab](const PendingAlloc& a) { return a.slab == slab; });
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
  if (allocator_ == nullptr) return;
  allocator_->Finish();  // Every call not made is answered Cancelled.
  while (!allocs_.empty() && TakeAllocAnswers()) {
  }
  // Whatever waited for them fails like the rest of the queue at shutdown.
  for (const QueueItem& item : held_) {
    if (item.kind == QueueItem::Kind::kPage) {
      io_.Complete(item.op, Unavailable("page store is shutting down"), 0);
    } else if (item.kind == QueueItem::Kind::kLocate) {
      item.locate->Done(Unavailable("page store is shutting down"));
    } else {
      item.trim->Done(Unavailable("page store is shutting down"));
    }
  }
  held_.clear();
}

}  // namespace tessera::client::remote
