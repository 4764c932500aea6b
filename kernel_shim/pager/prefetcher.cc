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

std::optional<StreamDetector::Plan> StreamDetector::OnFault(PageId p, uint64_t hits) {
  constexpr size_t kHistory = 8;
  if (last_ != UINT64_MAX) {
    deltas_.push_back(static_cast<int64_t>(p) - static_cast<int64_t>(last_));
    if (deltas_.size() > kHistory) deltas_.pop_front();
  }
  last_ = p;
  if (deltas_.size() < 3) return std::nullopt;
  // Boyer-Moore majority vote over the recent deltas.
  int64_t cand = 0;
  int votes = 0;
  for (int64_t d : deltas_) {
    if (votes == 0) {
      cand = d;
      votes = 1;
    } else if (d == cand) {
      ++votes;
    } else {
      --votes;
    }
  }
  size_t agree = std::count(deltas_.begin(), deltas_.end(), cand);
  if (cand == 0 || agree * 2 <= deltas_.size()) {
    window_ = std::max<size_t>(2, window_ / 2);
    return std::nullopt;
  }
  // Adapt the window: grow while the stream keeps hitting prefetched pages.
  if (hits > issued_at_hits_) window_ = std::min(max_window_, window_ * 2);
  issued_at_hits_ = hits;
  return Plan{cand, std::min(window_, max_window_)};
}

void PagerImpl::MaybePrefetch(PageId p, StreamDetector* s) {
  std::optional<StreamDetector::Plan> plan;
  {
    std::lock_guard<std::mutex> l(stream_mu_);
    plan = s->OnFault(p, prefetch_hits_.load(std::memory_order_relaxed));
  }
  if (!plan) return;
  const int64_t cand = plan->delta;
  std::vector<PageOp*> ops;
  ops.reserve(plan->window);
  for (size_t i = 1; i <= plan->window; ++i) {
    int64_t q = static_cast<int64_t>(p) + cand * static_cast<int64_t>(i);
    if (q < 0 || static_cast<uint64_t>(q) >= pages_) break;
    auto& w = W(q);
    uint64_t st = w.load();
    if (St(st) != kRemote) continue;
    FillCtx* c = GetCtx(true);
    if (!c) break;
    if (!w.compare_exchange_strong(st, WithCtx(With(st, kPrefetching), c->index))) {
      PutCtx(c);
      continue;
    }
    c->op = PageOp{};
    c->op.kind = PageOp::Kind::kRead;
    c->op.page = static_cast<PageId>(q);
    c->op.buf = c->buf;
    c->op.done = &PagerImpl::FillDone;
    c->op.user = c;
    c->prefetch = true;
    c->start_ns = MonotonicNs();
    ops.push_back(&c->op);
  }
  if (ops.empty()) return;
  prefetch_issued_.fetch_add(ops.size());
  remote_reads_.fetch_add(ops.size());
  fills_in_flight_.fetch_add(static_cast<int64_t>(ops.size()));
  Status st = o_.store->Submit(ops);
  if (!st.ok()) {
    fills_in_flight_.fetch_sub(static_cast<int64_t>(ops.size()));
    for (PageOp* op : ops) {
      op->status = st;
      CompletePrefetch(static_cast<FillCtx*>(op->user));
    }
  }
}

void PagerImpl::CompletePrefetch(FillCtx* c) {
  PageId p = c->op.page;
  auto& w = W(p);
  for (;;) {
    uint64_t s = w.load();
    if (!c->op.status.ok()) {
      // A failed read ahead is forgotten; a fault waiting on it is re-served by a demand fill
      // (which poisons the page if the store still cannot return it).
      if (!w.compare_exchange_weak(s, (s & kInStore) | kRemote)) continue;
      PutCtx(c);
      if (s & kWaitMissing) Handoff(p, (s & kWaitWrite) != 0);
      return;
    }
    if (s & kWaitMissing) {
      bool writable = (s & kWaitWrite) != 0;
      if (!w.compare_exchange_weak(s, (s & kInStore) | kFilling)) continue;
      prefetch_hits_.fetch_add(1);
      MapPage(p, c->buf, writable, kInStore, 0);
      PutCtx(c);
      return;
    }
    if (!w.compare_exchange_weak(s, With(s, kPrefetched))) continue;
    std::lock_guard<std::mutex> l(ctx_mu_);
    prefetched_fifo_.push_back(c->index);
    return;
  }
}

}  // namespace tessera::kernel_shim::internal
