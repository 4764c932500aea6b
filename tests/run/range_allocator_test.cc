// Unit tests of the shim's region range allocator and of the launcher/shim stats channel.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "common/units.h"
#include "kernel_shim/preload/range_allocator.h"
#include "kernel_shim/preload/run_stats.h"

namespace tessera::kernel_shim {
namespace {

constexpr uintptr_t kBase = 0x10000000;
constexpr size_t kPage = 4096;

TEST(RangeAllocator, AllocatesAlignedDisjointRangesAndCoalesces) {
  RangeAllocator ra(kBase, 256 * kPage);
  uintptr_t a = ra.Allocate(10 * kPage);
  uintptr_t b = ra.Allocate(1);  // rounds up to a page
  uintptr_t c = ra.Allocate(16 * kPage, 16 * kPage);
  ASSERT_NE(a, 0u);
  ASSERT_NE(b, 0u);
  ASSERT_NE(c, 0u);
  EXPECT_EQ(c % (16 * kPage), 0u);
  EXPECT_TRUE(b >= a + 10 * kPage || b + kPage <= a);
  EXPECT_TRUE(c >= b + kPage || c + 16 * kPage <= b);
  EXPECT_EQ(ra.free_bytes(), 256 * kPage - 27 * kPage);
  ra.Release(a, 10 * kPage);
  ra.Release(b, kPage);
  ra.Release(c, 16 * kPage);
  EXPECT_EQ(ra.free_bytes(), 256 * kPage);
  EXPECT_EQ(ra.free_ranges(), 1u);  // fully coalesced
}

TEST(RangeAllocator, PartialReleaseAndAllocateAt) {
  RangeAllocator ra(kBase, 64 * kPage);
  uintptr_t a = ra.Allocate(32 * kPage);
  ASSERT_EQ(a, kBase);
  ra.Release(a + 8 * kPage, 8 * kPage);  // munmap of the middle
  EXPECT_TRUE(ra.IsFree(a + 8 * kPage, 8 * kPage));
  EXPECT_FALSE(ra.IsFree(a, kPage));
  EXPECT_FALSE(ra.AllocateAt(a + 7 * kPage, 2 * kPage));  // overlaps a live page
  EXPECT_TRUE(ra.AllocateAt(a + 8 * kPage, 4 * kPage));
  EXPECT_FALSE(ra.AllocateAt(a + 8 * kPage, kPage));  // now taken
  // Releasing a superset that includes free parts is harmless.
  ra.Release(kBase, 64 * kPage);
  EXPECT_EQ(ra.free_bytes(), 64 * kPage);
  EXPECT_EQ(ra.free_ranges(), 1u);
  EXPECT_FALSE(ra.Release(kBase - kPage, kPage));  // outside: refused
  EXPECT_FALSE(ra.AllocateAt(kBase + 63 * kPage, 2 * kPage));
  EXPECT_EQ(ra.Allocate(65 * kPage), 0u);  // does not fit
  EXPECT_EQ(ra.Allocate(kPage, 3 * kPage), 0u);  // alignment not a power of two
}

TEST(RangeAllocator, RandomOperationsMatchAPageBitmap) {
  const size_t pages = 1024;
  RangeAllocator ra(kBase, pages * kPage);
  std::vector<bool> used(pages, false);
  struct Live {
    uintptr_t a;
    size_t n;
  };
  std::vector<Live> live;
  std::mt19937_64 rng(7);
  for (int i = 0; i < 20000; ++i) {
    const int op = static_cast<int>(rng() % 3);
    if (op < 2) {
      size_t n = 1 + rng() % 24;
      size_t align = size_t{1} << (rng() % 4);
      uintptr_t a = ra.Allocate(n * kPage, align * kPage);
      if (a == 0) continue;
      ASSERT_EQ((a - kBase) % (align * kPage), 0u);
      for (size_t p = (a - kBase) / kPage; p < (a - kBase) / kPage + n; ++p) {
        ASSERT_FALSE(used[p]) << "page " << p << " handed out twice";
        used[p] = true;
      }
      live.push_back({a, n});
    } else if (!live.empty()) {
      size_t idx = rng() % live.size();
      Live l = live[idx];
      // Release a random sub-range (or all) of the allocation.
      size_t off = rng() % l.n, len = 1 + rng() % (l.n - off);
      ra.Release(l.a + off * kPage, len * kPage);
      for (size_t p = (l.a - kBase) / kPage + off; p < (l.a - kBase) / kPage + off + len; ++p) {
        used[p] = false;
      }
      live.erase(live.begin() + static_cast<long>(idx));
      if (off > 0) live.push_back({l.a, off});
      if (off + len < l.n) live.push_back({l.a + (off + len) * kPage, l.n - off - len});
    }
    if (i % 1000 == 0) {
      size_t free_pages = 0;
      for (bool u : used) free_pages += u ? 0 : 1;
      ASSERT_EQ(ra.free_bytes(), free_pages * kPage);
      for (size_t p = 0; p < pages; ++p) {
        ASSERT_EQ(ra.IsFree(kBase + p * kPage, kPage), !used[p]) << "page " << p;
      }
    }
  }
}

TEST(RunStats, ParsesLocalMemoryAndSizes) {
  auto half = ParseLocalMemory("50%");
  ASSERT_TRUE(half.ok());
  EXPECT_DOUBLE_EQ(half->fraction, 0.5);
  EXPECT_EQ(half->bytes, 0u);
  auto all = ParseLocalMemory("100%");
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->fraction, 0.0);  // no limit
  auto fixed = ParseLocalMemory("256M");
  ASSERT_TRUE(fixed.ok());
  EXPECT_EQ(fixed->bytes, 256ull << 20);
  for (const char* bad : {"0%", "101%", "%", "-5%", "12X", "abc", "100", "5.5%", "1K"}) {
    EXPECT_FALSE(ParseLocalMemory(bad).ok()) << bad;
  }
  EXPECT_EQ(*ParseSize("8G"), 8ull << 30);
  EXPECT_EQ(*ParseSize("4096"), 4096u);
  EXPECT_FALSE(ParseSize("").ok());
  EXPECT_FALSE(ParseSize("99999999999999999T").ok());
}

TEST(RunStats, FormatParseRoundTrip) {
  PagerStats p;
  p.faults = 12;
  p.remote_writes = 34;
  p.fault_latency.Record(5000);
  client::PageStoreStats s;
  s.server_failures = 2;
  RunStats r = CollectRunStats(p, s, 99, true);
  std::string error;
  RunStats back = ParseRunStats(FormatRunStats(r, "boom\nline"), &error);
  EXPECT_EQ(back, r);
  EXPECT_EQ(error, "boom line");
  EXPECT_EQ(back["faults"], 12u);
  EXPECT_EQ(back["store_server_failures"], 2u);
  EXPECT_EQ(back["final"], 1u);
  EXPECT_TRUE(ParseRunStats("garbage\nx y\n").empty());
}

}  // namespace
}  // namespace tessera::kernel_shim
