// Internal to fabric/: a growable byte buffer whose growth does not zero-fill (std::vector
// would memset every reply/request it appends, a measurable cost on the data path). Owns its
// memory; move-only; not thread-safe.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <utility>

namespace tessera::fabric {

class ByteBuffer {
 public:
  ByteBuffer() = default;
  ByteBuffer(ByteBuffer&&) noexcept = default;
  ByteBuffer& operator=(ByteBuffer&&) noexcept = default;

  uint8_t* data() { return data_.get(); }
  const uint8_t* data() const { return data_.get(); }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  void clear() { size_ = 0; }
  void reserve(size_t n) {
    if (n <= capacity_) return;
    std::unique_ptr<uint8_t[]> bigger(new uint8_t[n]);
    if (size_ > 0) std::memcpy(bigger.get(), data_.get(), size_);
    data_ = std::move(bigger);
    capacity_ = n;
  }
  // Appends n uninitialised bytes; returns where they start.
  uint8_t* Append(size_t n) {
    if (size_ + n > capacity_) reserve(std::max(size_ + n, capacity_ * 2));
    uint8_t* p = data_.get() + size_;
    size_ += n;
    return p;
  }
  void Release() {
    data_.reset();
    size_ = capacity_ = 0;
  }
  friend void swap(ByteBuffer& a, ByteBuffer& b) noexcept {
    std::swap(a.data_, b.data_);
    std::swap(a.size_, b.size_);
    std::swap(a.capacity_, b.capacity_);
  }

 private:
  std::unique_ptr<uint8_t[]> data_;
  size_t size_ = 0;
  size_t capacity_ = 0;
};

}  // namespace tessera::fabric
