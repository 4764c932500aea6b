// StreamDetector: the prefetcher's trend detector (Leap's majority trend). One per fault thread:
// it keeps the deltas of the thread's last faults on remote pages; when a majority of them agree
// (a sequential or strided stream) it asks for a read-ahead window along the stream, doubling
// the window while the stream keeps hitting prefetched pages and halving it on misses. The
// pager (prefetcher.cc) reads the window into pager-owned buffers that wait unmapped for their
// first fault, so a hit is exact. Not thread-safe: one owner thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>

#include "client/page_store.h"

namespace tessera::kernel_shim::internal {

class StreamDetector {
 public:
  explicit StreamDetector(size_t max_window) : max_window_(max_window) {}

  struct Plan {
    int64_t delta;  // Stride of the stream (pages; negative for a descending stream).
    size_t window;  // Pages to read ahead along it (at most max_window).
  };
  // Records a fault on page p. `hits`: the pager's prefetch hits so far (a rise since the last
  // plan grows the window). Returns a read-ahead plan when the recent faults form a stream.
  std::optional<Plan> OnFault(client::PageId p, uint64_t hits);

 private:
  const size_t max_window_;
  uint64_t last_ = UINT64_MAX;
  std::deque<int64_t> deltas_;
  size_t window_ = 4;
  uint64_t issued_at_hits_ = 0;
};

}  // namespace tessera::kernel_shim::internal
