// SpanMap: tagged, non-overlapping address spans, for the LD_PRELOAD shim's bookkeeping of what
// it does not page: parts of the paged region taken out of paging (and why), and mappings left
// out altogether (shared, file, mlocked, ...), with the bytes of each tag now and at their peak.
//
// Bookkeeping only: it never touches the memory it describes. Its containers use the process's
// malloc, so the shim calls it with its "bypass" flag set. Thread-safe (one internal mutex).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

namespace tessera::kernel_shim {

class SpanMap {
 public:
  static constexpr int kMaxTags = 8;
  static constexpr int kNone = -1;

  struct Part {
    uintptr_t start, end;
    int tag;  // kNone where no span covers it.
  };

  // [start, end) gets `tag` (0..kMaxTags-1), replacing whatever covered it.
  void Set(uintptr_t start, uintptr_t end, int tag);
  // Nothing covers [start, end) afterwards.
  void Erase(uintptr_t start, uintptr_t end);
  // [start, end) cut at span boundaries, in address order, gaps as kNone parts.
  std::vector<Part> Parts(uintptr_t start, uintptr_t end) const;
  bool Intersects(uintptr_t start, uintptr_t end) const;
  uint64_t Bytes(int tag) const;
  uint64_t PeakBytes(int tag) const;

 private:
  void EraseLocked(uintptr_t start, uintptr_t end);

  mutable std::mutex mu_;
  struct Span {
    uintptr_t end;
    int tag;
  };
  std::map<uintptr_t, Span> spans_;  // start -> span
  uint64_t bytes_[kMaxTags] = {};
  uint64_t peak_[kMaxTags] = {};
};

}  // namespace tessera::kernel_shim
