#include "common/histogram.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace tessera {

void LatencyHistogram::Clear() {
  counts_.fill(0);
  count_ = 0;
  sum_ = 0;
  min_ = UINT64_MAX;
  max_ = 0;
}

void LatencyHistogram::Merge(const LatencyHistogram& o) {
  for (int i = 0; i < kBuckets; ++i) counts_[i] += o.counts_[i];
  count_ += o.count_;
  sum_ += o.sum_;
  min_ = std::min(min_, o.min_);
  max_ = std::max(max_, o.max_);
}

uint64_t LatencyHistogram::BucketLow(int b) {
  if (b < static_cast<int>(kSub)) return static_cast<uint64_t>(b);
  int group = (b - static_cast<int>(kSub)) / static_cast<int>(kSub);  // e - kSubBits
  uint64_t sub = static_cast<uint64_t>(b - static_cast<int>(kSub)) % kSub;
  return (kSub + sub) << group;
}

uint64_t LatencyHistogram::BucketWidth(int b) {
  if (b < static_cast<int>(kSub)) return 1;
  int group = (b - static_cast<int>(kSub)) / static_cast<int>(kSub);
  return 1ull << group;
}

uint64_t LatencyHistogram::Percentile(double q) const {
  if (count_ == 0) return 0;
  q = std::clamp(q, 0.0, 1.0);
  uint64_t rank = static_cast<uint64_t>(std::ceil(q * static_cast<double>(count_)));
  if (rank == 0) rank = 1;
  uint64_t seen = 0;
  for (int b = 0; b < kBuckets; ++b) {
    seen += counts_[b];
    if (seen >= rank) {
      uint64_t mid = BucketLow(b) + BucketWidth(b) / 2;
      return std::clamp(mid, min_, max_);
    }
  }
  return max_;
}

std::string LatencyHistogram::Summary() const {
  char buf[192];
  std::snprintf(buf, sizeof(buf), "n=%llu mean=%.1fus p50=%.1fus p99=%.1fus p999=%.1fus max=%.1fus",
                static_cast<unsigned long long>(count_), mean() / 1e3, p50() / 1e3, p99() / 1e3,
                p999() / 1e3, max() / 1e3);
  return buf;
}

}  // namespace tessera
