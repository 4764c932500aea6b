#include "common/histogram.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "common/report.h"

namespace tessera {
namespace {

TEST(HistogramTest, EmptyIsZero) {
  LatencyHistogram h;
  EXPECT_EQ(h.count(), 0u);
  EXPECT_EQ(h.p50(), 0u);
  EXPECT_EQ(h.min(), 0u);
  EXPECT_EQ(h.max(), 0u);
}

TEST(HistogramTest, SmallValuesAreExact) {
  LatencyHistogram h;
  for (uint64_t v = 1; v <= 100; ++v) h.Record(v);
  EXPECT_EQ(h.p50(), 50u);
  EXPECT_EQ(h.p99(), 99u);
  EXPECT_EQ(h.Percentile(1.0), 100u);
  EXPECT_EQ(h.min(), 1u);
  EXPECT_EQ(h.max(), 100u);
  EXPECT_DOUBLE_EQ(h.mean(), 50.5);
}

TEST(HistogramTest, BucketsCoverEveryValueOnce) {
  // Bucket boundaries are contiguous: low(b+1) == low(b) + width(b).
  for (int b = 0; b + 1 < LatencyHistogram::kBuckets; ++b) {
    ASSERT_EQ(LatencyHistogram::BucketLow(b + 1),
              LatencyHistogram::BucketLow(b) + LatencyHistogram::BucketWidth(b))
        << "bucket " << b;
  }
  for (uint64_t v : {0ull, 1ull, 127ull, 128ull, 129ull, 1000ull, 123456789ull, 1ull << 40,
                     ~0ull}) {
    int b = LatencyHistogram::BucketOf(v);
    ASSERT_GE(v, LatencyHistogram::BucketLow(b));
    ASSERT_LT(v - LatencyHistogram::BucketLow(b), LatencyHistogram::BucketWidth(b));
  }
}

TEST(HistogramTest, PercentilesWithinRelativeError) {
  std::mt19937_64 rng(42);
  std::lognormal_distribution<double> dist(10.0, 1.5);
  std::vector<uint64_t> values;
  LatencyHistogram h;
  for (int i = 0; i < 200000; ++i) {
    uint64_t v = static_cast<uint64_t>(dist(rng)) + 1;
    values.push_back(v);
    h.Record(v);
  }
  std::sort(values.begin(), values.end());
  for (double q : {0.5, 0.9, 0.99, 0.999}) {
    uint64_t exact = values[static_cast<size_t>(std::ceil(q * values.size())) - 1];
    double rel = std::fabs(static_cast<double>(h.Percentile(q)) - exact) / exact;
    EXPECT_LT(rel, 0.01) << "q=" << q << " exact=" << exact << " got=" << h.Percentile(q);
  }
}

TEST(HistogramTest, MergeEqualsRecordingEverything) {
  LatencyHistogram a, b, all;
  for (uint64_t v = 0; v < 5000; ++v) {
    (v % 3 ? a : b).Record(v * 37);
    all.Record(v * 37);
  }
  a.Merge(b);
  EXPECT_EQ(a.count(), all.count());
  EXPECT_EQ(a.p50(), all.p50());
  EXPECT_EQ(a.p999(), all.p999());
  EXPECT_EQ(a.min(), all.min());
  EXPECT_EQ(a.max(), all.max());
}

TEST(MedianTest, OddEvenEmpty) {
  EXPECT_EQ(Median({}), 0);
  EXPECT_EQ(Median({3, 1, 2}), 2);
  EXPECT_EQ(Median({4, 1, 3, 2}), 2.5);
}

}  // namespace
}  // namespace tessera
