#include "kernel_shim/pager/victim_policy.h"

#include <algorithm>

#include "kernel_shim/pager/page_state.h"

namespace tessera::kernel_shim::internal {

using client::PageId;

namespace {
// Probation holds 1/8 of the cap (new pages prove themselves there; measured on zipf(0.99):
// 1/10 faults 0.86x FIFO, 1/4 0.89x).
constexpr size_t kProbationDivisor = 8;
}  // namespace

VictimChooser::VictimChooser(VictimPolicy policy, bool write_traps, std::atomic<uint64_t>* states,
                             std::function<void(PageId)> arm_trap)
    : policy_(policy), write_traps_(write_traps), states_(states), arm_trap_(std::move(arm_trap)) {}

void VictimChooser::Admit(PageId p) {
  if (policy_ == VictimPolicy::kSmart && ghost_set_.erase(p)) {
    protected_.push_back(p);
    segment_[p] = 2;
  } else {
    probation_.push_back(p);
    segment_[p] = 1;
  }
}

void VictimChooser::Activate(PageId p) {
  if (policy_ != VictimPolicy::kSmart) {
    Admit(p);
    return;
  }
  ghost_set_.erase(p);  // Its stale ghost entry leaves the FIFO when it comes round.
  protected_.push_back(p);
  segment_[p] = 2;
}

size_t VictimChooser::Pick(size_t n, uint64_t cap, std::vector<Victim>* out) {
  size_t probation_target = std::max<size_t>(1, cap / kProbationDivisor);
  size_t guard = (probation_.size() + protected_.size()) * 2 + 16;
  while (out->size() < n && guard-- > 0 && (!probation_.empty() || !protected_.empty())) {
    bool from_probation = policy_ == VictimPolicy::kFifo || protected_.empty() ||
                          (probation_.size() > probation_target && !probation_.empty());
    std::deque<PageId>& q = from_probation ? probation_ : protected_;
    PageId p = q.front();
    q.pop_front();
    auto it = segment_.find(p);
    if (it == segment_.end() || it->second != (from_probation ? 1 : 2)) continue;  // Stale.
    auto& w = states_[p];
    uint64_t s = w.load();
    if ((St(s) != kClean && St(s) != kDirty) || (s & kBusy)) {
      if (St(s) == kClean || St(s) == kDirty || St(s) == kFilling) q.push_back(p);  // Later.
      else segment_.erase(it);
      continue;
    }
    if (policy_ == VictimPolicy::kSmart) {
      if (s & kRef) {
        // Written since it was last looked at: a second chance (protected) or a promotion
        // (probation), with the write trap set again.
        uint64_t credits = std::min<uint64_t>(3, Credits(s) + 1);
        if (!w.compare_exchange_strong(s, WithCredits((s & ~kRef) | kArmed, credits))) {
          q.push_back(p);
          continue;
        }
        if (St(s) == kDirty && write_traps_) arm_trap_(p);
        if (from_probation) {
          protected_.push_back(p);
          it->second = 2;
        } else {
          q.push_back(p);
        }
        continue;
      }
      if (!(s & kArmed)) {
        // Never observed: set the write trap (dirty pages are mapped writable; clean ones are
        // write-protected already) and look again when it comes round.
        if (w.compare_exchange_strong(s, s | kArmed) && St(s) == kDirty && write_traps_) {
          arm_trap_(p);
        }
        q.push_back(p);
        continue;
      }
      if (!from_probation && Credits(s) > 0) {
        // Written in earlier rounds: spend one credit (an LFU-like memory beyond one round).
        (void)w.compare_exchange_strong(s, WithCredits(s, Credits(s) - 1));  // Lost race: retry later.
        q.push_back(p);
        continue;
      }
    }
    if (!w.compare_exchange_strong(s, With(s, kEvicting) & ~(kRedirty | kRef))) {
      q.push_back(p);
      continue;
    }
    segment_.erase(it);
    out->push_back(Victim{p, St(s) == kDirty});
    if (policy_ == VictimPolicy::kSmart) {
      ghost_set_.insert(p);
      ghost_fifo_.push_back(p);
      size_t ghost_cap = std::max<size_t>(cap, 64);
      while (ghost_fifo_.size() > ghost_cap) {
        ghost_set_.erase(ghost_fifo_.front());
        ghost_fifo_.pop_front();
      }
    }
  }
  return out->size();
}

}  // namespace tessera::kernel_shim::internal
