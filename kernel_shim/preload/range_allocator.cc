#include "kernel_shim/preload/range_allocator.h"

#include <algorithm>

namespace tessera::kernel_shim {
namespace {

uintptr_t RoundUp(uintptr_t v, uintptr_t a) { return (v + a - 1) & ~(a - 1); }

}  // namespace

RangeAllocator::RangeAllocator(uintptr_t base, size_t size) : base_(base), size_(size) {
  if (size_ > 0) InsertFreeLocked(base_, size_);
}

void RangeAllocator::EraseFreeLocked(std::map<uintptr_t, size_t>::iterator it) {
  by_size_.erase({it->second, it->first});
  free_bytes_ -= it->second;
  by_addr_.erase(it);
}

void RangeAllocator::InsertFreeLocked(uintptr_t addr, size_t size) {
  uintptr_t start = addr, end = addr + size;
  // Absorb every free range overlapping or touching [start, end).
  auto it = by_addr_.upper_bound(start);
  if (it != by_addr_.begin()) {
    auto prev = std::prev(it);
    if (prev->first + prev->second >= start) it = prev;
  }
  while (it != by_addr_.end() && it->first <= end) {
    start = std::min(start, it->first);
    end = std::max(end, it->first + it->second);
    auto next = std::next(it);
    EraseFreeLocked(it);
    it = next;
  }
  by_addr_.emplace(start, end - start);
  by_size_.emplace(end - start, start);
  free_bytes_ += end - start;
}

uintptr_t RangeAllocator::Allocate(size_t size, size_t alignment) {
  if (size == 0) return 0;
  size = RoundUp(size, kPage);
  if (alignment < kPage) alignment = kPage;
  if ((alignment & (alignment - 1)) != 0) return 0;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = by_size_.lower_bound({size, 0}); it != by_size_.end(); ++it) {
    const uintptr_t start = it->second, len = it->first;
    const uintptr_t a = RoundUp(start, alignment);
    if (a - start > len || len - (a - start) < size) continue;
    auto fit = by_addr_.find(start);
    EraseFreeLocked(fit);
    if (a > start) InsertFreeLocked(start, a - start);
    if (start + len > a + size) InsertFreeLocked(a + size, start + len - (a + size));
    return a;
  }
  return 0;
}

bool RangeAllocator::AllocateAt(uintptr_t addr, size_t size) {
  if (size == 0 || addr % kPage != 0) return false;
  size = RoundUp(size, kPage);
  if (addr < base_ || addr - base_ > size_ || size > size_ - (addr - base_)) return false;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_addr_.upper_bound(addr);
  if (it == by_addr_.begin()) return false;
  --it;
  const uintptr_t start = it->first, len = it->second;
  if (start + len < addr + size) return false;
  EraseFreeLocked(it);
  if (addr > start) InsertFreeLocked(start, addr - start);
  if (start + len > addr + size) InsertFreeLocked(addr + size, start + len - (addr + size));
  return true;
}

bool RangeAllocator::Claim(uintptr_t addr, size_t size) {
  if (size == 0) return true;
  const uintptr_t start = addr & ~(kPage - 1);
  const uintptr_t end = RoundUp(addr + size, kPage);
  if (start < base_ || end > base_ + size_ || end < start) return false;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_addr_.upper_bound(start);
  if (it != by_addr_.begin() && std::prev(it)->first + std::prev(it)->second > start) --it;
  while (it != by_addr_.end() && it->first < end) {
    const uintptr_t fs = it->first, fe = it->first + it->second;
    auto next = std::next(it);
    EraseFreeLocked(it);
    if (fs < start) InsertFreeLocked(fs, start - fs);
    if (fe > end) InsertFreeLocked(end, fe - end);
    it = next;
  }
  return true;
}

bool RangeAllocator::Release(uintptr_t addr, size_t size) {
  if (size == 0) return true;
  const uintptr_t start = addr & ~(kPage - 1);
  const uintptr_t end = RoundUp(addr + size, kPage);
  if (start < base_ || end > base_ + size_ || end < start) return false;
  std::lock_guard<std::mutex> lock(mu_);
  InsertFreeLocked(start, end - start);
  return true;
}

size_t RangeAllocator::free_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return free_bytes_;
}

size_t RangeAllocator::free_ranges() const {
  std::lock_guard<std::mutex> lock(mu_);
  return by_addr_.size();
}

bool RangeAllocator::IsFree(uintptr_t addr, size_t size) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_addr_.upper_bound(addr);
  if (it == by_addr_.begin()) return false;
  --it;
  return it->first + it->second >= addr + size;
}

}  // namespace tessera::kernel_shim
