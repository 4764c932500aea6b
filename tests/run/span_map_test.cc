// SpanMap (the shim's bookkeeping of what it does not page) and RangeAllocator::Claim (a
// MAP_FIXED mapping over parts of the region, free or not).
#include "kernel_shim/preload/span_map.h"

#include <gtest/gtest.h>

#include "kernel_shim/preload/range_allocator.h"

namespace tessera::kernel_shim {
namespace {

TEST(SpanMap, SetSplitsAndReplacesOverlaps) {
  SpanMap m;
  m.Set(0x1000, 0x5000, 0);
  m.Set(0x2000, 0x3000, 1);
  EXPECT_EQ(m.Bytes(0), 0x3000u);
  EXPECT_EQ(m.Bytes(1), 0x1000u);
  auto parts = m.Parts(0x0, 0x6000);
  ASSERT_EQ(parts.size(), 5u);
  EXPECT_EQ(parts[0].tag, SpanMap::kNone);
  EXPECT_EQ(parts[0].end, 0x1000u);
  EXPECT_EQ(parts[1].tag, 0);
  EXPECT_EQ(parts[2].tag, 1);
  EXPECT_EQ(parts[2].start, 0x2000u);
  EXPECT_EQ(parts[2].end, 0x3000u);
  EXPECT_EQ(parts[3].tag, 0);
  EXPECT_EQ(parts[3].end, 0x5000u);
  EXPECT_EQ(parts[4].tag, SpanMap::kNone);
  EXPECT_EQ(parts[4].start, 0x5000u);
}

TEST(SpanMap, EraseKeepsTheOutsideAndPeaksStay) {
  SpanMap m;
  m.Set(0x1000, 0x9000, 2);
  m.Erase(0x3000, 0x4000);
  EXPECT_EQ(m.Bytes(2), 0x7000u);
  EXPECT_EQ(m.PeakBytes(2), 0x8000u);
  EXPECT_TRUE(m.Intersects(0x2000, 0x3001));
  EXPECT_FALSE(m.Intersects(0x3000, 0x4000));
  EXPECT_TRUE(m.Intersects(0x3fff, 0x4001));
  m.Erase(0, 0x10000);
  EXPECT_EQ(m.Bytes(2), 0u);
  EXPECT_FALSE(m.Intersects(0, 0x10000));
  EXPECT_EQ(m.PeakBytes(2), 0x8000u);
  auto parts = m.Parts(0x1000, 0x2000);
  ASSERT_EQ(parts.size(), 1u);
  EXPECT_EQ(parts[0].tag, SpanMap::kNone);
}

TEST(RangeAllocator, ClaimTakesFreeAndUsedPartsAlike) {
  constexpr uintptr_t kBase = 1ull << 30;
  RangeAllocator r(kBase, 64 * 4096);
  ASSERT_TRUE(r.AllocateAt(kBase + 8 * 4096, 4 * 4096));
  ASSERT_TRUE(r.Claim(kBase + 6 * 4096, 10 * 4096));  // Over free, used and free pages.
  EXPECT_FALSE(r.IsFree(kBase + 6 * 4096, 4096));
  EXPECT_FALSE(r.IsFree(kBase + 15 * 4096, 4096));
  EXPECT_TRUE(r.IsFree(kBase + 5 * 4096, 4096));
  EXPECT_TRUE(r.IsFree(kBase + 16 * 4096, 4096));
  EXPECT_EQ(r.free_bytes(), (64 - 10) * 4096u);
  EXPECT_FALSE(r.Claim(kBase + 63 * 4096, 2 * 4096));  // Past the end.
  ASSERT_TRUE(r.Release(kBase + 6 * 4096, 10 * 4096));
  EXPECT_EQ(r.free_bytes(), 64 * 4096u);
}

}  // namespace
}  // namespace tessera::kernel_shim
