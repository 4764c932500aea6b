#include "kernel_shim/pager/inactive_list.h"

#include <algorithm>

namespace tessera::kernel_shim::internal {

void InactiveSizer::Dropped(client::PageId p, uint64_t cap_pages) {
  ++drops_;
  fraction_ = std::max(o_.min_fraction, fraction_ - o_.shrink_step);
  shadow_[p] = drops_;
  shadow_fifo_.emplace_back(p, drops_);
  const size_t bound = std::max<uint64_t>(cap_pages, 64);
  while (shadow_fifo_.size() > bound) {
    auto [q, when] = shadow_fifo_.front();
    shadow_fifo_.pop_front();
    auto it = shadow_.find(q);
    if (it != shadow_.end() && it->second == when) shadow_.erase(it);
  }
}

bool InactiveSizer::Refaulted(client::PageId p, uint64_t active_pages) {
  auto it = shadow_.find(p);
  if (it == shadow_.end()) return false;
  const uint64_t distance = drops_ - it->second;
  shadow_.erase(it);
  if (distance > active_pages) return false;
  ++near_refaults_;
  fraction_ = std::min(o_.max_fraction, fraction_ + o_.grow_step);
  return true;
}

}  // namespace tessera::kernel_shim::internal
