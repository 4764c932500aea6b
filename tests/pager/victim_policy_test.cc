// Unit tests of the pager's victim policy (VictimChooser) and prefetch trend detector
// (StreamDetector) over plain page-state words: no userfaultfd, no store.
#include "kernel_shim/pager/victim_policy.h"

#include <gtest/gtest.h>

#include <atomic>
#include <vector>

#include "kernel_shim/pager/page_state.h"
#include "kernel_shim/pager/prefetcher.h"

namespace tessera::kernel_shim::internal {
namespace {

struct Region {
  explicit Region(size_t n) : words(n) {
    for (auto& w : words) w.store(kNever);
  }
  std::vector<std::atomic<uint64_t>> words;
  std::vector<client::PageId> traps;  // Pages the chooser asked to write-protect.
  std::atomic<uint64_t>* data() { return words.data(); }
  VictimChooser Chooser(VictimPolicy policy, bool traps_on = true) {
    return VictimChooser(policy, traps_on, data(), [this](client::PageId p) { traps.push_back(p); });
  }
  // Page p became resident with the given state (kClean or kDirty).
  void Resident(VictimChooser* c, client::PageId p, uint64_t state) {
    words[p].store(state);
    c->Admit(p);
  }
};

std::vector<client::PageId> Pages(const std::vector<Victim>& v) {
  std::vector<client::PageId> out;
  for (const auto& x : v) out.push_back(x.page);
  return out;
}

TEST(VictimChooserTest, FifoEvictsInResidencyOrderAndMarksEvicting) {
  Region r(16);
  auto c = r.Chooser(VictimPolicy::kFifo);
  for (client::PageId p : {5, 2, 9, 1}) r.Resident(&c, p, p % 2 ? kDirty : kClean);
  std::vector<Victim> v;
  ASSERT_EQ(c.Pick(3, 100, &v), 3u);
  EXPECT_EQ(Pages(v), (std::vector<client::PageId>{5, 2, 9}));
  EXPECT_TRUE(v[0].dirty);
  EXPECT_FALSE(v[1].dirty);
  for (client::PageId p : {5, 2, 9}) EXPECT_EQ(St(r.words[p].load()), kEvicting) << p;
  EXPECT_EQ(St(r.words[1].load()), kDirty);
  EXPECT_TRUE(r.traps.empty()) << "FIFO sets no write traps";
}

TEST(VictimChooserTest, BusyOrFillingPagesAreSkippedAndRetriedLater) {
  Region r(8);
  auto c = r.Chooser(VictimPolicy::kFifo);
  r.Resident(&c, 0, kDirty);
  r.Resident(&c, 1, kClean);
  r.words[0].store(kDirty | kBusy);  // A write-protect fault is lifting protection.
  std::vector<Victim> v;
  ASSERT_EQ(c.Pick(2, 100, &v), 1u);
  EXPECT_EQ(v[0].page, 1u);
  r.words[0].store(kDirty);  // The fault finished.
  v.clear();
  ASSERT_EQ(c.Pick(2, 100, &v), 1u);
  EXPECT_EQ(v[0].page, 0u);
}

TEST(VictimChooserTest, PagesGoneElsewhereAreForgotten) {
  Region r(8);
  auto c = r.Chooser(VictimPolicy::kFifo);
  r.Resident(&c, 3, kClean);
  r.words[3].store(kNever);  // Discarded meanwhile.
  std::vector<Victim> v;
  EXPECT_EQ(c.Pick(4, 100, &v), 0u);
  EXPECT_EQ(c.tracked(), 0u);
}

TEST(VictimChooserTest, SmartArmsTrapsOnDirtyPagesBeforeEvictingThem) {
  Region r(8);
  auto c = r.Chooser(VictimPolicy::kSmart);
  r.Resident(&c, 0, kDirty);
  r.Resident(&c, 1, kClean);
  std::vector<Victim> v;
  // First round: neither was observed yet; the dirty one gets a trap, both get kArmed.
  ASSERT_EQ(c.Pick(2, 100, &v), 2u);
  EXPECT_EQ(r.traps, (std::vector<client::PageId>{0}));
  EXPECT_EQ(Pages(v), (std::vector<client::PageId>{0, 1}));
}

TEST(VictimChooserTest, SmartWithoutTrapsMakesNoTrapCalls) {
  Region r(8);
  auto c = r.Chooser(VictimPolicy::kSmart, /*traps_on=*/false);
  for (client::PageId p = 0; p < 4; ++p) r.Resident(&c, p, kDirty);
  std::vector<Victim> v;
  ASSERT_EQ(c.Pick(4, 100, &v), 4u);
  EXPECT_TRUE(r.traps.empty());
}

TEST(VictimChooserTest, SmartGivesWrittenPagesASecondChance) {
  Region r(8);
  auto c = r.Chooser(VictimPolicy::kSmart);
  r.Resident(&c, 0, kDirty | kArmed | kRef);  // Written since last looked at.
  // Observed, not written; enough of them that probation is above its 1/8 share of the cap.
  for (client::PageId p = 1; p <= 3; ++p) r.Resident(&c, p, kClean | kArmed);
  std::vector<Victim> v;
  ASSERT_EQ(c.Pick(1, 8, &v), 1u);
  EXPECT_EQ(v[0].page, 1u) << "the written page should survive this round";
  const uint64_t w0 = r.words[0].load();
  EXPECT_EQ(St(w0), kDirty);
  EXPECT_FALSE(w0 & kRef) << "the reference was consumed";
  EXPECT_EQ(Credits(w0), 1u);
  EXPECT_EQ(r.traps, (std::vector<client::PageId>{0})) << "the trap is set again";
}

TEST(VictimChooserTest, SmartPromotesRefaultedGhostsToProtected) {
  Region r(64);
  auto c = r.Chooser(VictimPolicy::kSmart);
  r.Resident(&c, 7, kClean | kArmed);
  std::vector<Victim> v;
  ASSERT_EQ(c.Pick(1, 8, &v), 1u);
  EXPECT_TRUE(c.in_ghost(7));
  r.words[7].store(kRemote | kInStore);
  // Page 7 faults back in: it re-enters protected. New pages fill probation beyond its 1/8
  // share (cap 8: one page), so probation pages are evicted before page 7.
  r.Resident(&c, 7, kClean | kArmed);
  EXPECT_FALSE(c.in_ghost(7));
  for (client::PageId p = 10; p < 14; ++p) r.Resident(&c, p, kClean | kArmed);
  v.clear();
  ASSERT_EQ(c.Pick(3, 8, &v), 3u);
  for (const auto& x : v) EXPECT_NE(x.page, 7u) << "a re-faulted ghost was evicted first";
}

TEST(VictimChooserTest, SmartFaultsFewerThanFifoOnASkewedTrace) {
  // A trace with a hot set written often and a cold scan: simulate residency with a cap, count
  // misses (re-admissions) under each policy. Writes set kRef the way a write-protect fault does.
  auto run = [](VictimPolicy policy) {
    constexpr size_t kPages = 400, kCap = 64;
    Region r(kPages);
    auto c = r.Chooser(policy);
    size_t misses = 0, resident = 0;
    uint64_t x = 12345;
    for (int i = 0; i < 20000; ++i) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      const client::PageId p = (x >> 33) % 10 < 7 ? (x >> 40) % 16 : 16 + (x >> 40) % (kPages - 16);
      uint64_t s = r.words[p].load();
      if (St(s) == kClean || St(s) == kDirty) {
        r.words[p].store(With(s, kDirty) | kRef);  // A write seen by a trap or a clean page.
        continue;
      }
      ++misses;
      r.Resident(&c, p, kDirty | (s & kInStore));
      if (++resident > kCap) {
        std::vector<Victim> v;
        if (c.Pick(resident - kCap, kCap, &v) == 0) continue;
        for (const auto& y : v) r.words[y.page].store(kRemote | kInStore);
        resident -= v.size();
      }
    }
    return misses;
  };
  const size_t fifo = run(VictimPolicy::kFifo), smart = run(VictimPolicy::kSmart);
  EXPECT_LT(smart, fifo) << "smart " << smart << " vs FIFO " << fifo;
}

TEST(StreamDetectorTest, SequentialStreamAsksForAGrowingWindow) {
  StreamDetector d(32);
  EXPECT_FALSE(d.OnFault(100, 0));
  EXPECT_FALSE(d.OnFault(101, 0));
  EXPECT_FALSE(d.OnFault(102, 0));
  auto plan = d.OnFault(103, 0);
  ASSERT_TRUE(plan);
  EXPECT_EQ(plan->delta, 1);
  EXPECT_EQ(plan->window, 4u);
  plan = d.OnFault(104, /*hits=*/3);  // The read-ahead was used: grow.
  ASSERT_TRUE(plan);
  EXPECT_EQ(plan->window, 8u);
  for (uint64_t h = 10, p = 105; p < 120; ++p, h += 10) plan = d.OnFault(p, h);
  ASSERT_TRUE(plan);
  EXPECT_EQ(plan->window, 32u) << "capped at max_window";
}

TEST(StreamDetectorTest, StridedAndDescendingStreamsAreFollowed) {
  StreamDetector d(16);
  std::optional<StreamDetector::Plan> plan;
  for (uint64_t p = 1000; p > 900; p -= 3) plan = d.OnFault(p, 0);
  ASSERT_TRUE(plan);
  EXPECT_EQ(plan->delta, -3);
}

TEST(StreamDetectorTest, RandomFaultsAskForNothing) {
  StreamDetector d(16);
  uint64_t x = 99;
  int plans = 0;
  for (int i = 0; i < 200; ++i) {
    x = x * 6364136223846793005ull + 1;
    plans += d.OnFault((x >> 33) % 100000, 0) ? 1 : 0;
  }
  EXPECT_LE(plans, 2);
}

}  // namespace
}  // namespace tessera::kernel_shim::internal
