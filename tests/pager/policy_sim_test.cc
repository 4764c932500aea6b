// The victim policies on recorded and synthetic page-access traces, through the pager's own
// chooser and inactive list (policy_sim.h: no userfaultfd), against Belady's MIN on the same
// trace: scan resistance, a read-hot set that survives a write stream, a phase change, and the
// zipf kernel of `tessera bench pager`.
#include "kernel_shim/pager/policy_sim.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "bench/pager/workload.h"
#include "kernel_shim/pager/inactive_list.h"

namespace tessera::kernel_shim::internal {
namespace {

using Trace = std::vector<TraceAccess>;

uint64_t Rng(uint64_t& s) { return bench_pager::SplitMix(s); }

// A hot set of `hot` pages read at random, with a one-pass read of `stream` other pages through
// it (one stream page per `per` hot reads), after a warm-up of the hot set.
Trace ScanTrace(size_t hot, size_t stream, size_t per) {
  Trace t;
  uint64_t s = 1;
  for (size_t i = 0; i < hot * 8; ++i) t.push_back({Rng(s) % hot, false});
  for (size_t i = 0; i < stream; ++i) {
    t.push_back({hot + i, false});
    for (size_t j = 0; j < per; ++j) t.push_back({Rng(s) % hot, false});
  }
  return t;
}

// A read-hot set (Zipf over `hot` pages, never written), while the program writes a stream of
// new pages once each (GNU sort reading its input at random and writing its runs).
Trace ReadHotWriteStreamTrace(size_t hot, size_t stream, size_t per) {
  Trace t;
  uint64_t s = 2;
  bench_pager::Zipf z(hot, 0.9);
  for (size_t i = 0; i < hot; ++i) t.push_back({i, true});  // The input is loaded first.
  for (size_t i = 0; i < stream; ++i) {
    for (size_t j = 0; j < per; ++j) t.push_back({z.Next(s), false});
    t.push_back({hot + i, true});
  }
  return t;
}

// Two disjoint working sets of `set` pages, each drawn from Zipf(0.9) (a quarter of the accesses
// write), one after the other.
Trace PhaseTrace(size_t set, size_t accesses) {
  Trace t;
  uint64_t s = 3;
  bench_pager::Zipf z(set, 0.9);
  for (size_t phase = 0; phase < 2; ++phase) {
    for (size_t i = 0; i < accesses; ++i) {
      uint64_t x = Rng(s);
      t.push_back({phase * set + z.Next(s), (x >> 40) % 4 == 0});
    }
  }
  return t;
}

// Pages read (never written) at random from Zipf(0.9) over `pages`, after they are loaded once.
Trace ReadZipfTrace(size_t pages, size_t accesses) {
  Trace t;
  uint64_t s = 4;
  bench_pager::Zipf z(pages, 0.9);
  for (size_t p = 0; p < pages; ++p) t.push_back({p, true});
  for (size_t i = 0; i < accesses; ++i) t.push_back({z.Next(s), false});
  return t;
}

// The page sequence of bench pager's zipf workload (bench/pager/workload.h): the buffer is
// written once, then each pass does pages x 4 read-modify-writes of a Zipf(0.99) page.
Trace BenchZipfTrace(size_t pages, int passes) {
  Trace t;
  for (size_t p = 0; p < pages; ++p) t.push_back({p, true});
  bench_pager::Zipf z(pages, 0.99);
  uint64_t s = 42;
  for (int pass = 0; pass < passes; ++pass) {
    for (size_t i = 0; i < pages * 4; ++i) t.push_back({z.Next(s), true});
  }
  return t;
}

struct Row {
  uint64_t min, fifo, smart, inactive, minor;
  uint64_t inactive_no_traps;  // The inactive list without write traps (their default with it).
};

Row Compare(const std::string& name, const Trace& t, size_t cap) {
  Row row{};
  row.min = BeladyMinFaults(t, cap);
  PolicySimOptions o;
  o.cap_pages = cap;
  o.policy = VictimPolicy::kFifo;
  o.inactive_list = false;
  row.fifo = SimulatePolicy(t, o).major_faults;
  o.policy = VictimPolicy::kSmart;
  row.smart = SimulatePolicy(t, o).major_faults;
  o.inactive_list = true;
  PolicySimResult with = SimulatePolicy(t, o);
  row.inactive = with.major_faults;
  row.minor = with.minor_refaults;
  o.write_traps = false;
  row.inactive_no_traps = SimulatePolicy(t, o).major_faults;
  std::printf(
      "%-22s cap %5zu  MIN %7lu  fifo %7lu (%.2fx)  smart %7lu (%.2fx)  "
      "smart+inactive %7lu (%.2fx, %lu minor refaults, inactive %.2f of the cap)  "
      "without traps %7lu (%.2fx)\n",
      name.c_str(), cap, row.min, row.fifo, double(row.fifo) / row.min, row.smart,
      double(row.smart) / row.min, row.inactive, double(row.inactive) / row.min,
      with.minor_refaults, with.final_inactive_fraction, row.inactive_no_traps,
      double(row.inactive_no_traps) / row.min);
  return row;
}

TEST(BeladyMinTest, CountsTheOptimumOnAKnownTrace) {
  // Cap 2, accesses 1 2 3 1 2 3: MIN misses 1, 2, 3 (evicts 2, used after 1), hits 1, misses 2
  // (evicts 1 or 3: 3 is next), hits 3 -> 4 faults. LRU would miss all 6.
  Trace t;
  for (client::PageId p : {1, 2, 3, 1, 2, 3}) t.push_back({p, false});
  EXPECT_EQ(BeladyMinFaults(t, 2), 4u);
  EXPECT_EQ(BeladyMinFaults(t, 3), 3u);
}

TEST(PolicySimTest, InactiveListResistsAScanOfReadOnlyPages) {
  const size_t cap = 512;
  Row r = Compare("scan over read-hot set", ScanTrace(cap / 2, cap * 16, 2), cap);
  // The stream's pages leave through the inactive list untouched: the list shrinks to its floor
  // and the read-hot set stays (1.02x MIN; FIFO 1.53x).
  EXPECT_LE(r.inactive, r.smart);
  EXPECT_LT(r.inactive, r.fifo);
  EXPECT_LE(double(r.inactive), 1.3 * double(r.min));
  EXPECT_GT(r.minor, 0u);
}

TEST(PolicySimTest, ReadHotSetSurvivesAWriteStream) {
  const size_t cap = 512;
  Row r =
      Compare("read-hot + write stream", ReadHotWriteStreamTrace(cap * 3 / 4, cap * 16, 4), cap);
  EXPECT_LT(r.inactive, r.smart);
  EXPECT_LE(double(r.inactive), 1.3 * double(r.min));
}

// Zipf over twice the cap: no online policy comes near MIN (it knows the future); the
// inactive list sees the reads and beats the write-only view.
TEST(PolicySimTest, AdaptsToAPhaseChange) {
  const size_t cap = 512;
  Row r = Compare("phase change", PhaseTrace(cap * 2, cap * 40), cap);
  EXPECT_LT(r.inactive, r.smart);
  EXPECT_LT(r.inactive, r.fifo);
}

TEST(PolicySimTest, ReadOnlyZipfSetTwiceTheCap) {
  const size_t cap = 512;
  Row r = Compare("read-only zipf", ReadZipfTrace(cap * 2, cap * 64), cap);
  EXPECT_LT(r.inactive, r.smart);
}

TEST(PolicySimTest, BenchZipfWorkload) {
  const size_t cap = 1024;
  Row r = Compare("bench pager zipf", BenchZipfTrace(cap * 2, 3), cap);
  EXPECT_LE(r.inactive, r.fifo);
}

TEST(InactiveRingTest, PushPopInOrderWithHolesAndWrap) {
  InactiveRing ring(4);
  EXPECT_EQ(ring.Push(10), 0u);
  EXPECT_EQ(ring.Push(11), 1u);
  EXPECT_EQ(ring.Push(12), 2u);
  EXPECT_EQ(ring.room(), 1u);
  client::PageId p;
  size_t slot;
  ASSERT_TRUE(ring.PopTail(&p, &slot));
  EXPECT_EQ(p, 10u);
  EXPECT_EQ(slot, 0u);
  EXPECT_EQ(ring.contiguous_room(), 1u);  // Slot 3, then it wraps to slot 0.
  EXPECT_EQ(ring.Push(13), 3u);
  EXPECT_EQ(ring.Push(14), 0u);
  EXPECT_EQ(ring.room(), 0u);
  for (client::PageId want : {11, 12, 13, 14}) {
    ASSERT_TRUE(ring.PopTail(&p, &slot));
    EXPECT_EQ(p, want);
  }
  EXPECT_FALSE(ring.PopTail(&p, &slot));
}

TEST(InactiveSizerTest, NearRefaultsGrowTheListAndColdDropsShrinkIt) {
  InactiveSizerOptions so;
  InactiveSizer s(so);
  const size_t cap = 1000;
  EXPECT_EQ(s.Target(cap), 125u);
  for (client::PageId p = 0; p < 100; ++p) s.Dropped(p, cap);
  const size_t after_drops = s.Target(cap);
  EXPECT_LT(after_drops, 125u);
  // Dropped 100 pages ago at most: within an active set of 700 pages.
  for (client::PageId p = 0; p < 10; ++p) EXPECT_TRUE(s.Refaulted(p, 700));
  EXPECT_GT(s.Target(cap), after_drops);
  EXPECT_FALSE(s.Refaulted(5, 700)) << "a shadow entry serves one refault";
  for (client::PageId p = 100; p < 200; ++p) s.Dropped(p, cap);
  EXPECT_FALSE(s.Refaulted(50, 10)) << "dropped 149 pages ago: beyond an active set of 10";
}

}  // namespace
}  // namespace tessera::kernel_shim::internal
