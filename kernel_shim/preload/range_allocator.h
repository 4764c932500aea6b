// RangeAllocator: hands out page-aligned ranges of one fixed address range (the paged region of
// the LD_PRELOAD shim) and takes them back, in any pieces. It backs both the heap allocator's
// extents (jemalloc extent hooks) and the program's private anonymous mmap()s, so it supports
// what those need: aligned allocation, allocation at a given address (in-place growth of an
// extent or an mremap), and release of any part of an earlier allocation (munmap of the middle
// of a mapping). Free ranges are coalesced with their neighbours; allocation is best fit (the
// smallest free range that holds the request, lowest address among equals), which keeps large
// free ranges intact for large requests.
//
// The allocator only does bookkeeping: it never touches the memory it manages. Its own
// containers are allocated with the process's malloc, so the shim calls it with its "bypass"
// flag set (the bookkeeping must never live in paged memory).
//
// Threads: all methods are thread-safe (one internal mutex; nothing here is on a page-fault
// path).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <utility>

namespace tessera::kernel_shim {

class RangeAllocator {
 public:
  static constexpr size_t kPage = 4096;

  // Manages [base, base + size); both page-aligned. All of it starts free.
  RangeAllocator(uintptr_t base, size_t size);

  // A free range of `size` bytes (rounded up to pages) aligned to `alignment` (a power of two,
  // at least a page; smaller values mean a page). 0 when nothing fits.
  uintptr_t Allocate(size_t size, size_t alignment = kPage);
  // Exactly [addr, addr + size) if all of it is free (and inside the range); false otherwise.
  bool AllocateAt(uintptr_t addr, size_t size);
  // Marks [addr, addr + size) (rounded out to pages) allocated, whatever parts of it were free
  // (a MAP_FIXED mapping over the range). False if it is not inside the managed range.
  bool Claim(uintptr_t addr, size_t size);
  // Returns [addr, addr + size) (rounded out to pages) to the free set. Parts already free are
  // ignored, so releasing a range twice or releasing a superset is harmless. Returns false if
  // the range is not inside the managed range (nothing changes then).
  bool Release(uintptr_t addr, size_t size);

  uintptr_t base() const { return base_; }
  size_t size() const { return size_; }
  size_t free_bytes() const;
  size_t free_ranges() const;
  bool IsFree(uintptr_t addr, size_t size) const;  // Every byte of the range is free.

 private:
  void InsertFreeLocked(uintptr_t addr, size_t size);  // Coalesces with neighbours.
  void EraseFreeLocked(std::map<uintptr_t, size_t>::iterator it);

  const uintptr_t base_;
  const size_t size_;
  mutable std::mutex mu_;
  std::map<uintptr_t, size_t> by_addr_;             // start -> length
  std::set<std::pair<size_t, uintptr_t>> by_size_;  // (length, start)
  size_t free_bytes_ = 0;
};

}  // namespace tessera::kernel_shim
