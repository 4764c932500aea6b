// LatencyHistogram: a log-linear histogram of nanosecond values with bounded relative error.
//
// Values below 128 are counted exactly; above that each power of two is split into 128
// buckets, so any reported percentile is within 0.8% of the true value. Record() is O(1),
// allocation-free and branch-light, for the fast path. The counters live inline (about 58 KB),
// so keep one per thread (or per benchmark) and Merge() them; a single object is not
// thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <string>

namespace tessera {

class LatencyHistogram {
 public:
  static constexpr int kSubBits = 7;
  static constexpr uint64_t kSub = 1ull << kSubBits;
  static constexpr int kBuckets = static_cast<int>(kSub + (64 - kSubBits) * kSub);

  LatencyHistogram() { Clear(); }

  void Record(uint64_t value_ns) {
    counts_[BucketOf(value_ns)]++;
    count_++;
    sum_ += value_ns;
    if (value_ns < min_) min_ = value_ns;
    if (value_ns > max_) max_ = value_ns;
  }
  void Merge(const LatencyHistogram& other);
  void Clear();

  uint64_t count() const { return count_; }
  uint64_t min() const { return count_ ? min_ : 0; }
  uint64_t max() const { return max_; }
  double mean() const { return count_ ? static_cast<double>(sum_) / count_ : 0.0; }
  uint64_t sum() const { return sum_; }
  // Values recorded in bucket b (0 <= b < kBuckets; see BucketOf).
  uint64_t bucket_count(int b) const { return counts_[b]; }
  // The value at quantile q in [0, 1] (0.5 = median, 0.99 = p99); 0 when empty.
  uint64_t Percentile(double q) const;
  uint64_t p50() const { return Percentile(0.50); }
  uint64_t p99() const { return Percentile(0.99); }
  uint64_t p999() const { return Percentile(0.999); }

  // "n=.. mean=.. p50=.. p99=.. p999=.. max=.." with values in microseconds.
  std::string Summary() const;

  static int BucketOf(uint64_t v) {
    if (v < kSub) return static_cast<int>(v);
    int e = 63 - __builtin_clzll(v);  // e >= kSubBits
    uint64_t sub = (v >> (e - kSubBits)) - kSub;
    return static_cast<int>(kSub + static_cast<uint64_t>(e - kSubBits) * kSub + sub);
  }
  // Lowest value that lands in bucket b, and the width of b.
  static uint64_t BucketLow(int b);
  static uint64_t BucketWidth(int b);

 private:
  std::array<uint64_t, kBuckets> counts_;
  uint64_t count_ = 0;
  uint64_t sum_ = 0;
  uint64_t min_ = UINT64_MAX;
  uint64_t max_ = 0;
};

}  // namespace tessera
