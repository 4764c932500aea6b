#include "kernel_shim/pager/policy_sim.h"

#include <algorithm>
#include <atomic>
#include <limits>
#include <set>
#include <unordered_map>

#include "kernel_shim/pager/page_state.h"
#include "kernel_shim/pager/victim_policy.h"

namespace tessera::kernel_shim::internal {

using client::PageId;

PolicySimResult SimulatePolicy(const std::vector<TraceAccess>& trace, const PolicySimOptions& o) {
  PolicySimResult r;
  if (o.cap_pages == 0 || trace.empty()) return r;
  PageId n = 0;
  for (const TraceAccess& a : trace) n = std::max(n, a.page + 1);
  std::vector<std::atomic<uint64_t>> w(n);
  for (auto& x : w) x.store(kNever);
  std::vector<uint8_t> trapped(n, 0);  // Dirty pages write-protected by a write trap.
  VictimChooser chooser(o.policy, o.write_traps, w.data(), [&](PageId p) { trapped[p] = 1; });
  InactiveRing ring(2 * o.cap_pages + 64);
  InactiveSizer sizer(o.sizer);
  const uint64_t cap = o.cap_pages;
  uint64_t local = 0, staged = 0;

  auto drop = [&](PageId p, bool dirty) {
    if (dirty) ++r.writebacks;
    w[p].store(kRemote | kInStore);
    trapped[p] = 0;
    --local;
  };
  // Drops the oldest staged page; false if the list is empty.
  auto drop_oldest = [&]() {
    PageId q;
    size_t slot;
    while (ring.PopTail(&q, &slot)) {
      if (q == InactiveRing::kHole) continue;
      uint64_t s = w[q].load();
      if (St(s) != kStaged || CtxOf(s) != slot) continue;  // Moved back since: a hole.
      --staged;
      drop(q, (s & kStagedDirty) != 0);
      sizer.Dropped(q, cap);
      return true;
    }
    return false;
  };
  std::vector<Victim> victims;
  auto evict_one = [&]() {
    victims.clear();
    if (!o.inactive_list) {
      if (chooser.Pick(1, cap, &victims) == 0) return false;
      drop(victims[0].page, victims[0].dirty);
      return true;
    }
    const size_t target = sizer.Target(cap);
    if (staged < target + 1) {
      size_t want = target + 1 - staged;
      while (ring.room() < want && drop_oldest()) {
      }
      want = std::min(want, ring.room());
      chooser.Pick(want, cap, &victims);
      for (const Victim& v : victims) {
        const size_t slot = ring.Push(v.page);
        w[v.page].store(WithCtx(kStaged | kInStore | (v.dirty ? kStagedDirty : 0),
                                static_cast<uint32_t>(slot)));
        trapped[v.page] = 0;
        ++staged;
      }
    }
    return drop_oldest();
  };

  for (const TraceAccess& a : trace) {
    ++r.accesses;
    const PageId p = a.page;
    uint64_t s = w[p].load();
    switch (St(s)) {
      case kClean:
        if (a.write) {
          w[p].store((With(s, kDirty) | kRef) & ~kArmed);
          ++r.wp_faults;
        }
        continue;
      case kDirty:
        if (a.write && trapped[p]) {
          trapped[p] = 0;
          w[p].store((s | kRef) & ~kArmed);
          ++r.wp_faults;
        }
        continue;
      case kStaged: {
        ++r.minor_refaults;
        const bool dirty = (s & kStagedDirty) != 0 || a.write;
        w[p].store(kInStore | kRef | (dirty ? kDirty : kClean));
        --staged;
        chooser.Activate(p);
        continue;
      }
      default:
        break;
    }
    // Not local: a major fault. A page never written maps writable zeros (kDirty), as the
    // pager's zero fill does; a stored page maps clean unless the access writes.
    ++r.major_faults;
    if (o.inactive_list && St(s) == kRemote) sizer.Refaulted(p, local - staged);
    w[p].store(St(s) == kNever ? kDirty : ((s & kInStore) | (a.write ? kDirty : kClean)));
    chooser.Admit(p);
    ++local;
    while (local > cap && evict_one()) {
    }
  }
  r.final_inactive_fraction = o.inactive_list ? sizer.fraction() : 0;
  return r;
}

uint64_t BeladyMinFaults(const std::vector<TraceAccess>& trace, size_t cap_pages) {
  if (cap_pages == 0) return trace.size();
  const size_t n = trace.size();
  constexpr size_t kNeverAgain = std::numeric_limits<size_t>::max();
  std::vector<size_t> next(n, kNeverAgain);
  std::unordered_map<PageId, size_t> last;
  for (size_t i = n; i-- > 0;) {
    auto it = last.find(trace[i].page);
    if (it != last.end()) next[i] = it->second;
    last[trace[i].page] = i;
  }
  // Resident pages ordered by next use (farthest last); ties broken by page id.
  std::set<std::pair<size_t, PageId>> by_next;
  std::unordered_map<PageId, size_t> resident;  // page -> its key in by_next
  uint64_t faults = 0;
  for (size_t i = 0; i < n; ++i) {
    const PageId p = trace[i].page;
    auto it = resident.find(p);
    if (it != resident.end()) {
      by_next.erase({it->second, p});
    } else {
      ++faults;
      if (resident.size() >= cap_pages) {
        auto far = std::prev(by_next.end());
        resident.erase(far->second);
        by_next.erase(far);
      }
    }
    // Distinct keys for pages never used again: their index keeps them apart.
    size_t key = next[i] == kNeverAgain ? kNeverAgain - i : next[i];
    resident[p] = key;
    by_next.insert({key, p});
  }
  return faults;
}

}  // namespace tessera::kernel_shim::internal
