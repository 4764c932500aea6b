#include "kernel_shim/pager/pager_impl.h"

#include <linux/userfaultfd.h>
#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>

#include "common/clock.h"
#include "common/logging.h"

namespace tessera::kernel_shim::internal {

uint64_t PagerImpl::LimitPages() const {
  if (o_.local_limit_bytes > 0) return std::max<uint64_t>(1, o_.local_limit_bytes / kPageSize);
  if (o_.local_fraction > 0) {
    uint64_t floor_pages = o_.min_local_bytes / kPageSize;
    uint64_t f = static_cast<uint64_t>(o_.local_fraction *
                                       static_cast<double>(peak_footprint_.load()));
    return std::max<uint64_t>(std::max<uint64_t>(floor_pages, f), 1);
  }
  return 0;
}

uint64_t PagerImpl::ResidentCap() const {
  const uint64_t cap = LimitPages();
  if (cap == 0 || o_.tier == nullptr) return cap;
  // The tier's compressed pages count against the same budget. While its write-back catches
  // up it may hold more than its capacity; the resident set keeps a quarter of the budget.
  const uint64_t tier_pages = (o_.tier->charged_bytes() + kPageSize - 1) / kPageSize;
  return std::max<uint64_t>({cap > tier_pages ? cap - tier_pages : 0, cap / 4, 1});
}

void PagerImpl::MaybeKickEviction() {
  uint64_t cap = ResidentCap();
  if (cap == 0) return;
  if (static_cast<double>(resident_.load()) <= o_.high_watermark * static_cast<double>(cap)) return;
  {
    std::lock_guard<std::mutex> l(evict_mu_);
    if (evict_kick_) return;
    evict_kick_ = true;
  }
  evict_cv_.notify_one();
}

uint64_t PagerImpl::HardCap() const {
  const uint64_t cap = ResidentCap();
  if (cap == 0) return 0;
  return cap + std::max<uint64_t>(2 * o_.evict_batch, cap / 8);
}

void PagerImpl::Throttle() {
  if (HardCap() == 0) return;
  // Write-backs failing (the store refuses writes): the cap cannot be kept; waiting would only
  // slow the program down to no purpose.
  if (evict_failing_.load(std::memory_order_relaxed)) return;
  std::unique_lock<std::mutex> l(evict_mu_);
  // How long a fault waits on an evictor that runs but frees nothing (every victim re-written
  // as it leaves): past it the fault goes on, and the cap is exceeded by its page.
  constexpr uint64_t kNoProgressMs = 500;
  uint64_t seen = evictions_.load();
  Deadline progress = Deadline::AfterMs(kNoProgressMs);
  while (static_cast<uint64_t>(resident_.load()) > HardCap()) {
    if (evict_paused_ > 0 || stopping_.load() || evict_failing_.load()) return;
    // The evictor's last pass found nothing to evict, and no pass is running or asked for.
    if (evict_stuck_ && !evict_running_ && !evict_kick_) return;
    if (const uint64_t now = evictions_.load(); now != seen) {
      seen = now;
      progress = Deadline::AfterMs(kNoProgressMs);
    } else if (progress.Expired()) {
      throttle_giveups_.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    evict_kick_ = true;
    evict_cv_.notify_one();
    evict_idle_cv_.wait_for(l, std::chrono::milliseconds(1));
  }
}

void PagerImpl::DrainPolicyEvents() {
  std::vector<PageId> ev;
  {
    std::lock_guard<std::mutex> l(events_mu_);
    ev.swap(resident_events_);
  }
  for (PageId p : ev) chooser_->Admit(p);
  if (!staging_on()) return;
  std::vector<PageId> act, ref;
  {
    std::lock_guard<std::mutex> l(events_mu_);
    act.swap(activated_events_);
    ref.swap(refault_events_);
  }
  for (PageId p : act) chooser_->Activate(p);
  const int64_t active = resident_.load() - staged_.load();
  for (PageId p : ref) {
    if (sizer_.Refaulted(p, static_cast<uint64_t>(std::max<int64_t>(0, active)))) {
      near_refaults_.fetch_add(1, std::memory_order_relaxed);
    }
  }
}

void PagerImpl::Deactivate(std::vector<Victim>* victims, std::vector<Victim>* fallback) {
  // Runs of consecutive pages move into consecutive slots with one UFFDIO_MOVE.
  std::sort(victims->begin(), victims->end(),
            [](const Victim& a, const Victim& b) { return a.page < b.page; });
  const size_t n = victims->size();
  for (size_t k = 0; k < n;) {
    size_t j = k + 1;
    const size_t contiguous = ring_->contiguous_room();
    while (j < n && j - k < contiguous && (*victims)[j].page == (*victims)[j - 1].page + 1) ++j;
    if (contiguous == 0) {  // The ring is full (the caller keeps room; never expected).
      for (; k < n; ++k) fallback->push_back((*victims)[k]);
      break;
    }
    const size_t run = j - k;
    const size_t first_slot = ring_->Push((*victims)[k].page);
    for (size_t i = k + 1; i < j; ++i) ring_->Push((*victims)[i].page);
    Status st;
    const size_t moved = MoveStaging(Slot(static_cast<uint32_t>(first_slot)),
                                     Addr((*victims)[k].page), run, /*to_staging=*/true, &st);
    if (!st.ok()) {
      uint64_t n_err = move_errors_.fetch_add(1) + 1;
      if ((n_err & (n_err - 1)) == 0) {
        TLOG(WARNING) << "pager: moving page " << (*victims)[k + moved].page
                      << " to the inactive list: " << st.ToString() << " (written back instead; "
                      << n_err << " such moves so far)";
      }
    }
    for (size_t i = k; i < j; ++i) {
      const Victim& v = (*victims)[i];
      if (i - k >= moved) {  // Not moved: still mapped and kEvicting; its slot is a hole.
        fallback->push_back(v);
        continue;
      }
      const uint32_t slot = static_cast<uint32_t>(first_slot + (i - k));
      auto& w = W(v.page);
      uint64_t s = w.load();
      uint64_t staged;
      do {
        // A write that raced with the move (a write-protect fault while kEvicting) made it dirty.
        const bool dirty = v.dirty || (s & kRedirty);
        staged = WithCtx(kStaged | (s & kInStore) | (dirty ? kStagedDirty : 0), slot);
      } while (!w.compare_exchange_weak(s, staged));
      staged_.fetch_add(1);
      deactivated_.fetch_add(1, std::memory_order_relaxed);
      // A fault that arrived while it moved: serve it now (it moves straight back).
      if (s & kWaitMissing) {
        HandleMissing(v.page, (s & kWaitWrite) != 0, MonotonicNs(), nullptr);
      } else if (s & kWaitWp) {
        Wake(v.page);
      }
    }
    k = j;
  }
}

void PagerImpl::TakeOldestStaged(size_t n, std::vector<Victim>* out) {
  PageId p;
  size_t slot;
  while (out->size() < n && ring_->PopTail(&p, &slot)) {
    if (p == InactiveRing::kHole) continue;
    auto& w = W(p);
    uint64_t s = w.load();
    for (;;) {
      if (St(s) != kStaged || CtxOf(s) != slot) break;  // Moved back (or discarded): a hole.
      if (w.compare_exchange_weak(s, With(s, kStagedBusy))) {
        out->push_back(
            Victim{p, (s & kStagedDirty) != 0, /*staged=*/true, static_cast<uint32_t>(slot)});
        staged_inflight_.fetch_add(1);
        break;
      }
    }
  }
}

void PagerImpl::DropRuns(uint8_t* base, std::vector<uint64_t>* ids) {
  ForEachRun(ids, [base](uint64_t first, size_t n) {
    if (::madvise(base + first * kPageSize, n * kPageSize, MADV_DONTNEED) != 0) {
      TLOG(ERROR) << "pager: madvise(DONTNEED): " << strerror(errno);
    }
  });
}

void PagerImpl::ArmWriteTrap(PageId p) {
  traps_armed_.fetch_add(1, std::memory_order_relaxed);
  traps_pending_.push_back(p);  // Set by FlushWriteTraps() once the chooser's round is over.
}

void PagerImpl::FlushWriteTraps() {
  if (traps_pending_.empty()) return;
  ForEachRun(&traps_pending_, [this](PageId first, size_t n) {
    // Best effort: a trap is a hint to the policy (a write it misses only costs accuracy).
    (void)uffd_.WriteProtect(Addr(first), n * kPageSize, true, 1000);
    trap_ioctls_.fetch_add(1, std::memory_order_relaxed);
  });
  traps_pending_.clear();
}

void PagerImpl::WriteDone(PageOp* op) {
  auto* batch = static_cast<WbBatch*>(op->user);
  {
    std::lock_guard<std::mutex> l(batch->mu);
    batch->done[static_cast<size_t>(op - batch->ops.data())] = 1;
    if (--batch->pending == 0) batch->cv.notify_all();
  }
  batch->Unref();
}

void PagerImpl::WriteProtectRuns(const std::vector<PageId>& sorted, const char* what) {
  for (size_t k = 0; k < sorted.size();) {
    size_t j = k;
    while (j + 1 < sorted.size() && sorted[j + 1] == sorted[j] + 1) ++j;
    Status st = uffd_.WriteProtect(Addr(sorted[k]), (j - k + 1) * kPageSize, true);
    if (!st.ok()) TLOG(ERROR) << "pager: " << what << ": " << st.ToString();
    k = j + 1;
  }
}

std::unique_ptr<PagerImpl::EvictJob> PagerImpl::StartEvict(std::vector<Victim> victims_in) {
  auto job = std::make_unique<EvictJob>();
  job->victims = std::move(victims_in);
  const std::vector<Victim>& victims = job->victims;
  size_t n = victims.size();
  // 1. Write-protect the dirty victims, runs of consecutive pages in one ioctl (clean pages are
  //    mapped write-protected already).
  std::vector<PageId> dirty_pages;
  for (const Victim& v : victims) {
    if (v.dirty && !v.staged) dirty_pages.push_back(v.page);
  }
  std::sort(dirty_pages.begin(), dirty_pages.end());
  WriteProtectRuns(dirty_pages, "write-protecting victims");
  // 2. Copy the dirty pages out (a write after the protection faults and sets kRedirty) and
  //    write them back in one batch.
  auto* batch = new WbBatch();
  batch->bufs.resize(n * kPageSize);
  batch->ops.resize(n);
  batch->done.assign(n, 1);
  std::vector<PageOp*> submit;
  // Victims never stored whose bytes are still all zeros (zero-filled, never written): dropped
  // without a write-back, back to never-written.
  job->zero.assign(n, 0);
  std::vector<uint8_t>& zero = job->zero;
  for (size_t i = 0; i < n; ++i) {
    if (!victims[i].dirty) continue;
    uint8_t* b = batch->bufs.data() + i * kPageSize;
    // A staged page's bytes are in its slot, which the evictor owns (kStagedBusy).
    std::memcpy(b, victims[i].staged ? Slot(victims[i].slot) : Addr(victims[i].page), kPageSize);
    if (!(W(victims[i].page).load() & kInStore) && IsAllZero(b)) {
      zero[i] = 1;
      continue;
    }
    PageOp& op = batch->ops[i];
    op.kind = PageOp::Kind::kWrite;
    op.page = victims[i].page;
    op.buf = b;
    op.done = &PagerImpl::WriteDone;
    op.user = batch;
    batch->done[i] = 0;
    submit.push_back(&op);
  }
  job->batch = batch;
  job->pinned.assign(n, 0);
  if (!submit.empty() && snap_live_.load()) PreserveForChild(&submit, &job->pinned, batch->ops);
  if (!submit.empty()) {
    batch->pending = submit.size();
    batch->refs.fetch_add(static_cast<int>(submit.size()));
    job->submit_status = o_.store->Submit(submit);
    if (!job->submit_status.ok()) {
      batch->refs.fetch_sub(static_cast<int>(submit.size()));  // No callback will come.
    } else {
      job->submitted = true;
    }
  }
  return job;
}

size_t PagerImpl::FinishEvict(EvictJob* job) {
  size_t failures = 0;
  const std::vector<Victim>& victims = job->victims;
  const std::vector<uint8_t>& zero = job->zero;
  const size_t n = victims.size();
  WbBatch* batch = job->batch;
  // Per victim: the write-back's outcome (OK for clean and all-zero victims).
  std::vector<Status> wb_status(n);
  if (!job->submit_status.ok()) {
    for (size_t i = 0; i < n; ++i) {
      if (victims[i].dirty && !zero[i]) wb_status[i] = job->submit_status;
    }
  } else if (job->submitted) {
    {
      std::unique_lock<std::mutex> l(batch->mu);
      if (!batch->cv.wait_for(l, std::chrono::milliseconds(kWritebackTimeoutMs),
                              [&] { return batch->pending == 0; })) {
        TLOG(ERROR) << "pager: " << batch->pending << " write-backs got no completion from the "
                    << "store in " << kWritebackTimeoutMs / 1000 << " s (a store bug); their "
                    << "pages stay resident";
      }
      for (size_t i = 0; i < n; ++i) {
        if (!victims[i].dirty || zero[i] || job->pinned[i]) continue;
        wb_status[i] = batch->done[i] ? batch->ops[i].status
                                      : Timeout("no completion from the store");
      }
    }
  }
  for (size_t i = 0; i < n; ++i) {
    if (job->pinned[i]) wb_status[i] = ResourceExhausted("kept for a forked child");
  }
  batch->Unref();
  job->batch = nullptr;
  // 3. Commit: drop each victim unless it was written meanwhile or its write-back failed.
  std::vector<size_t> drop;  // Indices into victims.
  std::vector<PageId> kept;
  std::vector<uint64_t> freed_slots;  // Staging slots of dropped pages, emptied together below.
  for (size_t i = 0; i < n; ++i) {
    PageId p = victims[i].page;
    auto& w = W(p);
    bool wb_ok = wb_status[i].ok();
    if (victims[i].staged) {
      FinishStaged(victims[i], zero[i] != 0, wb_status[i], &freed_slots);
      if (!wb_ok) failures++;
      continue;
    }
    if (job->pinned[i]) {
      failures++;  // The cap cannot be kept: eviction backs off (as for failed write-backs).
    } else if (victims[i].dirty && !zero[i]) {
      if (wb_ok) remote_writes_.fetch_add(1);
      else {
        failures++;
        uint64_t n_err = writeback_errors_.fetch_add(1) + 1;
        if ((n_err & (n_err - 1)) == 0) {  // Logged at 1, 2, 4, 8, ... failures.
          TLOG(WARNING) << "pager: write-back of page " << p << " failed ("
                        << wb_status[i].ToString() << "); the page stays resident ("
                        << n_err << " failed write-backs so far)";
        }
      }
    }
    for (;;) {
      uint64_t s = w.load();
      uint64_t in_store = (victims[i].dirty && !zero[i] && wb_ok) ? kInStore : 0;
      if (!wb_ok || (s & kRedirty)) {
        // Keep it: dirty (the write-back is stale or missing). It is mapped, so a missing
        // fault recorded meanwhile was a stale message: wake it.
        const uint64_t keep =
            (With(s, kDirty) & ~(kRedirty | kWaitMissing | kWaitWrite)) | in_store;
        if (!w.compare_exchange_weak(s, keep)) continue;
        if (s & kWaitMissing) Wake(p);
        kept.push_back(p);
        break;
      }
      if (!w.compare_exchange_weak(s, With(s, kDropping) | in_store)) continue;
      // A clean victim leaves for good: keep it compressed in the tier, so that its next fault
      // is local (kDropping: a write now waits, so the bytes are stable until the madvise).
      if (o_.tier != nullptr && !victims[i].dirty && (s & kInStore)) {
        o_.tier->AdmitClean(p, Addr(p));
      }
      drop.push_back(i);
      break;
    }
  }
  // 4. MADV_DONTNEED the dropped pages and the freed slots, runs in one call: each call flushes
  //    the TLB of every CPU running a thread of this process (an IPI on each, a VM exit on a
  //    VM), so one call per page cost the evictor most of its time.
  std::vector<PageId> sorted;
  for (size_t i : drop) sorted.push_back(victims[i].page);
  DropRuns(base(), &sorted);
  DropRuns(staging_, &freed_slots);
  // 5. End the transitions; resolve faults that arrived meanwhile.
  for (size_t i : drop) {
    const PageId p = victims[i].page;
    auto& w = W(p);
    uint64_t s = w.load();
    uint64_t fin;
    do {
      fin = (s & kInStore) ? (kRemote | kInStore) : kNever;
    } while (!w.compare_exchange_weak(s, fin));
    resident_.fetch_sub(1);
    evictions_.fetch_add(1);
    if (!(s & kInStore)) AddFootprint(footprint_, peak_footprint_, -1);
    if (zero[i]) zero_drops_.fetch_add(1);
    else if (!victims[i].dirty) clean_drops_.fetch_add(1);
    ResolveWaiters(p, s);
  }
  if (!kept.empty()) {
    std::lock_guard<std::mutex> l(events_mu_);
    for (PageId p : kept) resident_events_.push_back(p);
  }
  return failures;
}

void PagerImpl::FinishStaged(const Victim& v, bool zero, const Status& wb,
                             std::vector<uint64_t>* freed_slots) {
  const PageId p = v.page;
  auto& w = W(p);
  staged_inflight_.fetch_sub(1);
  const bool wrote = v.dirty && !zero;
  if (wrote) {
    if (wb.ok()) {
      remote_writes_.fetch_add(1);
    } else {
      uint64_t n_err = writeback_errors_.fetch_add(1) + 1;
      if ((n_err & (n_err - 1)) == 0) {
        TLOG(WARNING) << "pager: write-back of page " << p << " failed (" << wb.ToString()
                      << "); the page stays local (" << n_err << " failed write-backs so far)";
      }
    }
  }
  uint64_t s = w.load();
  uint64_t fin = kNever;
  bool admitted = false;
  for (;;) {
    if (!wb.ok() || (s & kWaitMissing)) {
      // Keep it: the write-back failed, or the program wants the page (a fault waits): move it
      // back into the region now, as a minor refault would.
      const uint64_t in_store = (s & kInStore) | (wrote && wb.ok() ? kInStore : 0);
      const bool dirty = !wb.ok() ? v.dirty : false;
      if (!w.compare_exchange_weak(s, With(s, kUnstaging))) continue;
      if (s & kWaitMissing) minor_refaults_.fetch_add(1, std::memory_order_relaxed);
      // On failure it stays staged (logged, off the list's order): its next fault retries.
      (void)Unstage(p, v.slot, dirty || (s & kWaitWrite), in_store, 0);
      return;
    }
    const uint64_t in_store = (s & kInStore) | (wrote ? kInStore : 0);
    fin = in_store ? (kRemote | kInStore) : kNever;
    // A clean page leaves for good: keep it compressed in the tier, as FinishEvict does, so
    // that its next fault is local. Its bytes are in the slot, stable while kStagedBusy (a
    // fault now waits); if one comes before the CAS, the page moves back and the tier's copy
    // holds the same bytes as the store's.
    if (o_.tier != nullptr && !v.dirty && !zero && (s & kInStore) && !admitted) {
      o_.tier->AdmitClean(p, Slot(v.slot));
      admitted = true;
    }
    if (!w.compare_exchange_weak(s, fin)) continue;
    break;
  }
  // Emptied by the caller with the batch's other slots: only this thread (the evictor) fills
  // slots, and it does so after the batch is finished.
  freed_slots->push_back(v.slot);
  staged_.fetch_sub(1);
  resident_.fetch_sub(1);
  evictions_.fetch_add(1);
  inactive_drops_.fetch_add(1, std::memory_order_relaxed);
  if (fin == kNever) AddFootprint(footprint_, peak_footprint_, -1);
  if (zero) {
    zero_drops_.fetch_add(1);
  } else if (!v.dirty) {
    clean_drops_.fetch_add(1);
  }
  sizer_.Dropped(p, ResidentCap());
  if (s & kWaitWp) Wake(p);
}

void PagerImpl::EvictLoop() {
  // Up to kEvictPipeline batches are in flight at once: the next batch is picked, protected and
  // submitted while earlier write-backs are on the wire, so eviction keeps up with a fault
  // stream and faults wait (Throttle) only when the cap truly cannot be kept.
  constexpr size_t kEvictPipeline = 4;
  std::deque<std::unique_ptr<EvictJob>> inflight;
  int64_t inflight_pages = 0;
  auto finish_oldest = [&]() -> size_t {
    std::unique_ptr<EvictJob> job = std::move(inflight.front());
    inflight.pop_front();
    inflight_pages -= static_cast<int64_t>(job->victims.size());
    size_t failed = FinishEvict(job.get());
    evict_failing_.store(failed > 0);
    evict_idle_cv_.notify_all();
    return failed;
  };
  while (true) {
    {
      std::unique_lock<std::mutex> l(evict_mu_);
      evict_cv_.wait(l, [&] { return evict_kick_ || stopping_.load(); });
      evict_kick_ = false;
      if (stopping_.load()) return;
      if (evict_paused_ > 0) continue;
      evict_running_ = true;
    }
    bool stuck = false;
    for (;;) {
      DrainPolicyEvents();
      if (o_.tier != nullptr) o_.tier->SetBudgetBytes(LimitPages() * kPageSize);
      uint64_t cap = ResidentCap();
      if (cap == 0 || stopping_.load()) break;
      {
        std::lock_guard<std::mutex> l(evict_mu_);
        if (evict_paused_ > 0) break;
      }
      double low = o_.low_watermark * static_cast<double>(cap);
      int64_t r = resident_.load() - inflight_pages;  // What stays once the jobs commit.
      if (static_cast<double>(r) <= low) break;
      size_t want = std::min<size_t>(o_.evict_batch,
                                     static_cast<size_t>(static_cast<double>(r) - low) + 1);
      std::vector<Victim> victims;
      size_t picked = 0;
      if (staging_on()) {
        // Keep the inactive list at its target: deactivate the policy's victims into it (those
        // that cannot move are written back at once), then drop `want` pages from its old end.
        const size_t target = sizer_.Target(cap);
        inactive_target_.store(target, std::memory_order_relaxed);
        const int64_t listed = staged_.load() - staged_inflight_.load();
        const int64_t deficit = static_cast<int64_t>(target + want) - listed;
        // Slots of staged pages being written back are the last free ones the ring reuses:
        // never push that far.
        const int64_t room = static_cast<int64_t>(ring_->room()) - staged_inflight_.load();
        // At most twice what this round drops: the list fills over rounds, and the policy's
        // CLOCK does not turn faster than pages can show a write (4 batches a round cost GNU
        // sort 66k store reads instead of 50k).
        const int64_t n = std::min<int64_t>({deficit, room, 2 * static_cast<int64_t>(want)});
        if (n > 0) {
          std::vector<Victim> candidates;
          picked += chooser_->Pick(static_cast<size_t>(n), cap, &candidates);
          FlushWriteTraps();
          Deactivate(&candidates, &victims);
        }
        if (victims.size() < want) TakeOldestStaged(want - victims.size(), &victims);
        picked = victims.size();
      } else {
        picked = chooser_->Pick(want, cap, &victims);
        FlushWriteTraps();
      }
      if (picked == 0) {
        if (inflight.empty()) {
          stuck = true;
          break;
        }
        finish_oldest();  // Its kept pages may become victims again.
        continue;
      }
      inflight_pages += static_cast<int64_t>(victims.size());
      inflight.push_back(StartEvict(std::move(victims)));
      if (inflight.size() >= kEvictPipeline && finish_oldest() > 0) {
        // The store rejects writes: back off instead of spinning on the same pages.
        while (!inflight.empty()) finish_oldest();
        std::unique_lock<std::mutex> l(evict_mu_);
        evict_cv_.wait_for(l, std::chrono::milliseconds(20), [&] { return stopping_.load(); });
      }
    }
    while (!inflight.empty()) finish_oldest();
    {
      std::lock_guard<std::mutex> l(evict_mu_);
      evict_running_ = false;
      evict_stuck_ = stuck;
    }
    evict_idle_cv_.notify_all();
  }
}

}  // namespace tessera::kernel_shim::internal
