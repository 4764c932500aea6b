// MappedRegion: owns one mmap'ed range and unmaps it on destruction. Move-only.
//
// Anonymous, page-aligned memory for slabs, page buffers and pager regions. Optionally backed
// by huge pages (falls back to normal pages with a logged warning when none are available).
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>

#include "common/status.h"

namespace tessera {

class MappedRegion {
 public:
  struct Options {
    bool huge_pages = false;  // Try MAP_HUGETLB first.
    bool populate = false;    // MAP_POPULATE: fault everything in now.
    bool shared = false;      // MAP_SHARED instead of MAP_PRIVATE (survives fork as shared).
  };

  MappedRegion() = default;
  ~MappedRegion() { Reset(); }
  MappedRegion(const MappedRegion&) = delete;
  MappedRegion& operator=(const MappedRegion&) = delete;
  MappedRegion(MappedRegion&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)),
        huge_(std::exchange(o.huge_, false)) {}
  MappedRegion& operator=(MappedRegion&& o) noexcept {
    if (this != &o) {
      Reset();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
      huge_ = std::exchange(o.huge_, false);
    }
    return *this;
  }

  // Maps `size` bytes (rounded up to the page or huge-page size) of zeroed anonymous memory.
  static Result<MappedRegion> Anonymous(size_t size, Options options);
  static Result<MappedRegion> Anonymous(size_t size) { return Anonymous(size, Options{}); }

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  bool huge_pages() const { return huge_; }
  bool empty() const { return data_ == nullptr; }
  void Reset();

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  bool huge_ = false;
};

}  // namespace tessera
