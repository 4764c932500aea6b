// Unit tests of the compressed local tier (kernel_shim/pager/compressed_tier.h) over the
// in-memory PageStore double, and of the pager paging through it: accounting, incompressible
// pages, eviction from the tier to the store, write-back failures and races, concurrency.
#include "kernel_shim/pager/compressed_tier.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#include "client/testing/memory_page_store.h"
#include "common/clock.h"
#include "kernel_shim/pager/pager.h"
#include "kernel_shim/preload/run_stats.h"

namespace tessera::kernel_shim {
namespace {

using client::PageId;
using client::PageOp;
using client::testing::MemoryPageStore;
constexpr size_t kPage = 4096;

bool WaitFor(const std::function<bool()>& cond, int ms = 20000) {
  Deadline d = Deadline::AfterMs(ms);
  while (!cond()) {
    if (d.Expired()) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

// A page that LZ4 compresses about 4:1 (text-like: a few distinct 64-byte runs), distinct per
// (page, version).
std::vector<uint8_t> Compressible(PageId page, uint32_t version) {
  std::vector<uint8_t> b(kPage);
  for (size_t off = 0; off < kPage; ++off) {
    const size_t run = off / 64;
    b[off] = static_cast<uint8_t>((run % 5 == 0 ? page * 31 + version * 7 + off : run % 3) & 0xff);
  }
  std::memcpy(b.data(), &page, sizeof page);
  std::memcpy(b.data() + 8, &version, sizeof version);
  return b;
}

std::vector<uint8_t> Random(uint64_t seed) {
  std::vector<uint8_t> b(kPage);
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i < kPage; i += 8) {
    uint64_t x = rng();
    std::memcpy(b.data() + i, &x, 8);
  }
  return b;
}

// Write-backs start at once unless a delay is given (the tests of the delay give one).
std::unique_ptr<CompressedTier> MakeTier(client::PageStore* store, uint64_t capacity,
                                         uint32_t writeback_delay_ms = 0) {
  CompressedTierOptions o;
  o.store = store;
  o.capacity_bytes = capacity;
  o.writeback_delay_ms = writeback_delay_ms;
  auto t = CompressedTier::Create(o);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? std::move(*t) : nullptr;
}

TEST(CompressedTierTest, CreateAndSettingRejectBadInput) {
  MemoryPageStore store(64);
  CompressedTierOptions o;
  EXPECT_EQ(CompressedTier::Create(o).status().code(), StatusCode::kInvalidArgument);
  o.store = &store;
  o.budget_share = 0;  // Auto capacity without a share.
  EXPECT_EQ(CompressedTier::Create(o).status().code(), StatusCode::kInvalidArgument);
  o.budget_share = 0.9;
  EXPECT_EQ(CompressedTier::Create(o).status().code(), StatusCode::kInvalidArgument);
  o.budget_share = 0.25;
  o.max_compressed_bytes = 5000;
  EXPECT_EQ(CompressedTier::Create(o).status().code(), StatusCode::kInvalidArgument);
  o.max_compressed_bytes = 3072;
  o.writeback_inflight = 0;
  EXPECT_EQ(CompressedTier::Create(o).status().code(), StatusCode::kInvalidArgument);
  o.writeback_inflight = 32;
  o.writeback_delay_ms = 60001;
  EXPECT_EQ(CompressedTier::Create(o).status().code(), StatusCode::kInvalidArgument);
  o.writeback_delay_ms = 1000;
  o.adapt_window_hits = 65537;
  EXPECT_EQ(CompressedTier::Create(o).status().code(), StatusCode::kInvalidArgument);

  auto off = ParseCompressedTier("off");
  ASSERT_TRUE(off.ok());
  EXPECT_FALSE(off->enabled);
  auto au = ParseCompressedTier("auto");
  ASSERT_TRUE(au.ok());
  EXPECT_TRUE(au->enabled);
  EXPECT_EQ(au->capacity_bytes, 0u);
  auto sz = ParseCompressedTier("64M");
  ASSERT_TRUE(sz.ok());
  EXPECT_EQ(sz->capacity_bytes, 64u << 20);
  for (const char* bad : {"", "on", "fast", "-1", "512K", "64Q"}) {
    auto r = ParseCompressedTier(bad);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
  }
}

TEST(CompressedTierTest, CapacityFollowsTheBudget) {
  MemoryPageStore store(64);
  CompressedTierOptions o;
  o.store = &store;  // Auto: a quarter of the budget.
  auto au = CompressedTier::Create(o);
  ASSERT_TRUE(au.ok());
  EXPECT_EQ((*au)->TierStats().capacity_bytes, 0u) << "no budget yet";
  (*au)->SetBudgetBytes(64 << 20);
  EXPECT_EQ((*au)->TierStats().capacity_bytes, 16u << 20);
  // A fixed size, bounded by three quarters of the budget.
  auto fixed = MakeTier(&store, 32 << 20);
  ASSERT_NE(fixed, nullptr);
  EXPECT_EQ(fixed->TierStats().capacity_bytes, 32u << 20);
  fixed->SetBudgetBytes(16 << 20);
  EXPECT_EQ(fixed->TierStats().capacity_bytes, 12u << 20);
  fixed->SetBudgetBytes(1 << 30);
  EXPECT_EQ(fixed->TierStats().capacity_bytes, 32u << 20);
}

TEST(CompressedTierTest, PagesAreChargedAtTheirCompressedSizeAndReadLocally) {
  MemoryPageStore store(1024);
  auto tier = MakeTier(&store, 8 << 20);
  ASSERT_NE(tier, nullptr);
  constexpr PageId kN = 200;
  for (PageId p = 0; p < kN; ++p) ASSERT_TRUE(tier->WritePage(p, Compressible(p, 1).data()).ok());
  CompressedTierStats s = tier->TierStats();
  EXPECT_EQ(s.stored, kN);
  EXPECT_EQ(s.entries, kN);
  EXPECT_EQ(s.incompressible, 0u);
  EXPECT_EQ(s.charged_bytes, s.compressed_bytes + kN * CompressedTier::kEntryOverheadBytes);
  EXPECT_EQ(tier->charged_bytes(), s.charged_bytes);
  EXPECT_LT(s.charged_bytes, kN * kPage / 2) << "pages were not compressed";
  const uint64_t store_reads = store.reads_completed();
  std::vector<uint8_t> got(kPage);
  for (PageId p = 0; p < kN; ++p) {
    ASSERT_TRUE(tier->ReadPage(p, got.data()).ok());
    ASSERT_EQ(got, Compressible(p, 1)) << "page " << p;
  }
  EXPECT_EQ(tier->TierStats().hits, kN);
  EXPECT_EQ(store.reads_completed(), store_reads) << "tier hits went to the store";
  // Written back in the background; Flush waits for all of it.
  ASSERT_TRUE(tier->Flush().ok());
  s = tier->TierStats();
  EXPECT_EQ(s.writebacks, kN);
  EXPECT_EQ(s.dirty_entries, 0u);
  for (PageId p = 0; p < kN; ++p) ASSERT_EQ(store.Page(p), Compressible(p, 1)) << "page " << p;
}

TEST(CompressedTierTest, AReadHandsThePageOverAndCleanPagesComeBackThroughAdmit) {
  MemoryPageStore store(64);
  auto tier = MakeTier(&store, 1 << 20);
  ASSERT_NE(tier, nullptr);
  ASSERT_TRUE(tier->WritePage(9, Compressible(9, 1).data()).ok());
  ASSERT_TRUE(tier->Flush().ok());
  std::vector<uint8_t> got(kPage);
  ASSERT_TRUE(tier->ReadPage(9, got.data()).ok());
  EXPECT_EQ(got, Compressible(9, 1));
  // Written back and now held by the reader: no longer charged here.
  EXPECT_EQ(tier->TierStats().entries, 0u);
  EXPECT_EQ(tier->charged_bytes(), 0u);
  // Evicted again unchanged: admitted clean (nothing to write back), read locally again.
  tier->AdmitClean(9, got.data());
  CompressedTierStats s = tier->TierStats();
  EXPECT_EQ(s.admitted_clean, 1u);
  EXPECT_EQ(s.dirty_entries, 0u);
  EXPECT_GT(tier->charged_bytes(), 0u);
  const uint64_t reads = store.reads_completed(), writes = store.writes_stored();
  ASSERT_TRUE(tier->ReadPage(9, got.data()).ok());
  EXPECT_EQ(got, Compressible(9, 1));
  EXPECT_EQ(store.reads_completed(), reads);
  ASSERT_TRUE(tier->Flush().ok());
  EXPECT_EQ(store.writes_stored(), writes) << "a clean page was written back";
  // Incompressible clean pages are not admitted.
  tier->AdmitClean(10, Random(3).data());
  EXPECT_EQ(tier->TierStats().entries, 0u);
}

TEST(CompressedTierTest, BatchReadsServeHitsLocallyAndMissesWithOneStoreBatch) {
  MemoryPageStore store(64);
  auto tier = MakeTier(&store, 1 << 20);
  ASSERT_NE(tier, nullptr);
  for (PageId p : {1, 3}) ASSERT_TRUE(tier->WritePage(p, Compressible(p, 1).data()).ok());
  for (PageId p : {2, 4}) store.Put(p, Compressible(p, 7));
  const PageId pages[] = {1, 2, 3, 4};
  std::vector<uint8_t> out(4 * kPage);
  ASSERT_TRUE(tier->ReadPages(pages, 4, out.data()).ok());
  for (size_t i = 0; i < 4; ++i) {
    const auto want = pages[i] % 2 ? Compressible(pages[i], 1) : Compressible(pages[i], 7);
    EXPECT_EQ(std::vector<uint8_t>(out.begin() + i * kPage, out.begin() + (i + 1) * kPage), want)
        << "page " << pages[i];
  }
  CompressedTierStats s = tier->TierStats();
  EXPECT_EQ(s.hits, 2u);
  EXPECT_EQ(s.misses, 2u);
  EXPECT_EQ(store.reads_completed(), 2u);
  // A store error reaches the caller.
  store.FailReads(4);
  EXPECT_EQ(tier->ReadPages(pages, 4, out.data()).code(), StatusCode::kDataLoss);
}

TEST(CompressedTierTest, IncompressiblePagesGoStraightToTheStore) {
  MemoryPageStore store(64);
  auto tier = MakeTier(&store, 8 << 20);
  ASSERT_NE(tier, nullptr);
  ASSERT_TRUE(tier->WritePage(3, Compressible(3, 1).data()).ok());
  ASSERT_TRUE(tier->Flush().ok());
  // Random bytes replace the tier's entry and go to the store (acknowledged by it).
  const auto rnd = Random(7);
  ASSERT_TRUE(tier->WritePage(3, rnd.data()).ok());
  EXPECT_EQ(store.Page(3), rnd);
  CompressedTierStats s = tier->TierStats();
  EXPECT_EQ(s.incompressible, 1u);
  EXPECT_EQ(s.entries, 0u);
  EXPECT_EQ(s.charged_bytes, 0u);
  std::vector<uint8_t> got(kPage);
  ASSERT_TRUE(tier->ReadPage(3, got.data()).ok());
  EXPECT_EQ(got, rnd);
  EXPECT_EQ(tier->TierStats().misses, 1u);
}

TEST(CompressedTierTest, FullTierDropsWrittenBackPagesOldestFirstAndNeverDirtyOnes) {
  MemoryPageStore store(4096);
  const uint64_t cap = 1 << 20;
  auto tier = MakeTier(&store, cap);
  ASSERT_NE(tier, nullptr);
  // About 1.2 KB charged per page: ~850 fit. Write 2000, flushing as we go so that older
  // entries are written back and may be dropped.
  constexpr PageId kN = 2000;
  for (PageId p = 0; p < kN; ++p) {
    ASSERT_TRUE(tier->WritePage(p, Compressible(p, 1).data()).ok());
    if (p % 100 == 99) {
      ASSERT_TRUE(tier->Flush().ok());
    }
    ASSERT_LE(tier->charged_bytes(), cap);
  }
  CompressedTierStats s = tier->TierStats();
  EXPECT_GT(s.dropped, 0u);
  EXPECT_LT(s.entries, kN);
  EXPECT_EQ(s.bypassed_full, 0u);
  std::vector<uint8_t> got(kPage);
  // The newest page is in the tier, the oldest was dropped: both read correctly.
  const uint64_t reads = store.reads_completed();
  ASSERT_TRUE(tier->ReadPage(kN - 1, got.data()).ok());
  EXPECT_EQ(got, Compressible(kN - 1, 1));
  EXPECT_EQ(store.reads_completed(), reads);
  ASSERT_TRUE(tier->ReadPage(0, got.data()).ok());
  EXPECT_EQ(got, Compressible(0, 1));
  EXPECT_EQ(store.reads_completed(), reads + 1);

  // With write-backs held, the full tier keeps its dirty entries and sends new pages straight
  // to the store instead.
  MemoryPageStore held(4096);
  auto t2 = MakeTier(&held, cap);
  ASSERT_NE(t2, nullptr);
  held.Hold(MemoryPageStore::HoldKind::kWrites);
  std::vector<PageOp> ops(kN);
  std::vector<std::vector<uint8_t>> bufs(kN);
  std::atomic<size_t> acked{0};
  for (PageId p = 0; p < kN; ++p) {
    bufs[p] = Compressible(p, 2);
    ops[p].kind = PageOp::Kind::kWrite;
    ops[p].page = p;
    ops[p].buf = bufs[p].data();
    ops[p].user = &acked;
    ops[p].done = [](PageOp* op) { static_cast<std::atomic<size_t>*>(op->user)->fetch_add(1); };
    PageOp* one[1] = {&ops[p]};
    ASSERT_TRUE(t2->Submit(one).ok());
  }
  s = t2->TierStats();
  EXPECT_GT(s.bypassed_full, 0u);
  EXPECT_EQ(s.dropped, 0u) << "a page not written back was dropped";
  EXPECT_EQ(s.entries + s.bypassed_full, kN);
  ASSERT_TRUE(WaitFor([&] { return acked.load() == s.entries; }))
      << "tier writes not acknowledged while the store held its write-backs";
  held.Release();
  ASSERT_TRUE(WaitFor([&] { return acked.load() == kN; }));
  ASSERT_TRUE(t2->Flush().ok());
  for (PageId p = 0; p < kN; ++p) ASSERT_EQ(held.Page(p), bufs[p]) << "page " << p;
}

TEST(CompressedTierTest, RefusedWriteBacksAreRetriedAndThePageStaysReadable) {
  MemoryPageStore store(64);
  CompressedTierOptions o;
  o.store = &store;
  o.capacity_bytes = 1 << 20;
  o.writeback_retry_ms = 2;
  o.writeback_delay_ms = 0;
  auto t = CompressedTier::Create(o);
  ASSERT_TRUE(t.ok());
  auto& tier = *t;
  store.FailWritesWith(Unavailable("memserver down"));
  ASSERT_TRUE(tier->WritePage(5, Compressible(5, 1).data()).ok());
  ASSERT_TRUE(WaitFor([&] { return tier->TierStats().writeback_errors >= 2; }));
  std::vector<uint8_t> got(kPage);
  ASSERT_TRUE(tier->ReadPage(5, got.data()).ok());
  EXPECT_EQ(got, Compressible(5, 1));
  EXPECT_FALSE(store.Holds(5));
  store.FailWritesWith(Status::Ok());
  ASSERT_TRUE(tier->Flush().ok());
  EXPECT_EQ(store.Page(5), Compressible(5, 1));
  EXPECT_EQ(tier->TierStats().dirty_entries, 0u);
}

TEST(CompressedTierTest, RewritesAndTrimsDuringAWriteBackEndWithTheNewestBytes) {
  MemoryPageStore store(64);
  auto tier = MakeTier(&store, 1 << 20);
  ASSERT_NE(tier, nullptr);
  store.Hold(MemoryPageStore::HoldKind::kWrites);
  ASSERT_TRUE(tier->WritePage(1, Compressible(1, 1).data()).ok());
  ASSERT_TRUE(store.WaitHeld(1));
  // A newer compressible version, then an incompressible one: kept raw (one write of a page in
  // flight at a time), written after the held one.
  ASSERT_TRUE(tier->WritePage(1, Compressible(1, 2).data()).ok());
  const auto rnd = Random(11);
  ASSERT_TRUE(tier->WritePage(1, rnd.data()).ok());
  EXPECT_EQ(tier->TierStats().kept_raw, 1u);
  std::vector<uint8_t> got(kPage);
  ASSERT_TRUE(tier->ReadPage(1, got.data()).ok());
  EXPECT_EQ(got, rnd);
  // Page 2 is trimmed while its write-back is held: it must not come back in the store.
  ASSERT_TRUE(tier->WritePage(2, Compressible(2, 1).data()).ok());
  ASSERT_TRUE(store.WaitHeld(2));
  ASSERT_TRUE(tier->Trim(2, 1).ok());
  store.Release();
  ASSERT_TRUE(tier->Flush().ok());
  EXPECT_EQ(store.Page(1), rnd);
  EXPECT_EQ(store.writes_of(1), 2u);
  ASSERT_TRUE(WaitFor([&] { return !store.Holds(2); })) << "a trimmed page was written back";
  ASSERT_TRUE(tier->ReadPage(2, got.data()).ok());
  EXPECT_EQ(got, std::vector<uint8_t>(kPage, 0));
  EXPECT_EQ(tier->TierStats().entries, 0u) << "the raw page stayed after its write-back";
}

// A page read back and written again before its write-back is due replaces its entry: the
// store gets one write, of the newest bytes, when a flush makes it due.
TEST(CompressedTierTest, ADelayedWriteBackStoresARewrittenPageOnce) {
  MemoryPageStore store(64);
  auto tier = MakeTier(&store, 1 << 20, /*writeback_delay_ms=*/60000);
  ASSERT_NE(tier, nullptr);
  std::vector<uint8_t> got(kPage);
  for (uint32_t v = 1; v <= 5; ++v) {
    ASSERT_TRUE(tier->WritePage(3, Compressible(3, v).data()).ok());
    ASSERT_TRUE(tier->ReadPage(3, got.data()).ok());
    ASSERT_EQ(got, Compressible(3, v));
  }
  EXPECT_EQ(store.writes_of(3), 0u) << "written back before it was due";
  EXPECT_EQ(tier->TierStats().dirty_entries, 1u);
  ASSERT_TRUE(tier->Flush().ok());  // Due at once: a flush waits.
  EXPECT_EQ(store.writes_of(3), 1u);
  EXPECT_EQ(store.Page(3), Compressible(3, 5));
  EXPECT_EQ(tier->TierStats().dirty_entries, 0u);
}

// A tier filling up does not wait for the delay: past 3/4 of its capacity its oldest pages are
// written back at once, so that they can be dropped to make room.
TEST(CompressedTierTest, ATierFillingUpWritesBackWithoutWaitingForTheDelay) {
  MemoryPageStore store(4096);
  const uint64_t cap = 256 << 10;
  auto tier = MakeTier(&store, cap, /*writeback_delay_ms=*/60000);
  ASSERT_NE(tier, nullptr);
  PageId p = 0;
  while (tier->charged_bytes() <= cap / 4 * 3) {
    ASSERT_TRUE(tier->WritePage(p, Compressible(p, 1).data()).ok());
    ++p;
  }
  ASSERT_TRUE(WaitFor([&] { return tier->TierStats().writebacks > 0; }))
      << "no write-back within 20 s of the tier passing 3/4 of its capacity";
  EXPECT_TRUE(store.Holds(0)) << "the oldest page is written back first";
  for (PageId q = 0; q < p; ++q) {
    std::vector<uint8_t> got(kPage);
    ASSERT_TRUE(tier->ReadPage(q, got.data()).ok());
    ASSERT_EQ(got, Compressible(q, 1)) << "page " << q;
  }
}

// A page LZ4 shrinks to a few dozen bytes: zeros but for its id.
std::vector<uint8_t> Sparse(PageId page) {
  std::vector<uint8_t> b(kPage, 0);
  std::memcpy(b.data(), &page, sizeof page);
  return b;
}

// The capacity adapts to the hits' eviction distances (compressed_tier.h, "Size"): hits on pages
// evicted within the tier's charge in pages (a resident set with the tier's room would have kept
// them) shrink it to 1/16, hits on pages evicted longer ago grow it back.
TEST(CompressedTierTest, NearHitsShrinkTheCapacityAndFarHitsGrowItBack) {
  MemoryPageStore store(4096);
  const uint64_t cap = 1 << 20;
  constexpr uint32_t kWindow = 64;
  CompressedTierOptions o;
  o.store = &store;
  o.capacity_bytes = cap;
  o.writeback_delay_ms = 0;
  o.adapt_window_hits = kWindow;
  auto created = CompressedTier::Create(o);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  CompressedTier& tier = **created;
  std::vector<uint8_t> got(kPage);
  // Near: each page is read back right after it was evicted (distance 0).
  constexpr uint32_t kNearWindows = 20;
  for (uint32_t i = 0; i < kNearWindows * kWindow; ++i) {
    const PageId p = i % 8;
    ASSERT_TRUE(tier.WritePage(p, Compressible(p, i).data()).ok());
    ASSERT_TRUE(tier.ReadPage(p, got.data()).ok());
    ASSERT_EQ(got, Compressible(p, i));
  }
  CompressedTierStats s = tier.TierStats();
  EXPECT_EQ(s.hits, kNearWindows * kWindow);
  EXPECT_EQ(s.hits_near, s.hits);
  // The averaged near share passes 1/4 at the third window (1 - (7/8)^3): two windows grow (the
  // scale stays 1), the 18 after shrink it to its floor (0.8^13 < 1/16).
  EXPECT_EQ(s.grows, 2u);
  EXPECT_EQ(s.shrinks, kNearWindows - 2);
  EXPECT_DOUBLE_EQ(s.capacity_scale, 1.0 / 16);
  EXPECT_EQ(s.capacity_bytes, cap / 16);
  // Far: 400 pages evicted, then read back oldest first; each is read hundreds of evictions
  // after it left, while the tier's charge is a dozen pages or less. The average falls under
  // 1/4 within 10 windows, and 13 more grow the scale back to 1.
  constexpr PageId kFirst = 100, kFar = 400;
  constexpr int kRounds = 6;
  const uint64_t shrinks_before = s.shrinks;
  for (int round = 0; round < kRounds; ++round) {
    for (PageId p = kFirst; p < kFirst + kFar; ++p) {
      ASSERT_TRUE(tier.WritePage(p, Sparse(p).data()).ok());
    }
    ASSERT_TRUE(tier.Flush().ok());
    ASSERT_LE(tier.charged_bytes(), 12 * kPage) << "pages not as compressible as assumed";
    for (PageId p = kFirst; p < kFirst + kFar; ++p) {
      ASSERT_TRUE(tier.ReadPage(p, got.data()).ok());
      ASSERT_EQ(got, Sparse(p)) << "page " << p;
    }
  }
  s = tier.TierStats();
  EXPECT_EQ(s.hits, kNearWindows * kWindow + kRounds * kFar) << "a far page was not held";
  EXPECT_LT((s.hits_near - kNearWindows * kWindow) * 4, kRounds * kFar);
  EXPECT_LE(s.shrinks - shrinks_before, 10u);
  EXPECT_GE(s.grows, 2u + 13);  // 1.25^13 > 16.
  EXPECT_DOUBLE_EQ(s.capacity_scale, 1.0);
  EXPECT_EQ(s.capacity_bytes, cap);
}

// With adapt_window_hits 0 the capacity stays what it was set to, whatever the hits.
TEST(CompressedTierTest, AFixedCapacityDoesNotAdapt) {
  MemoryPageStore store(64);
  const uint64_t cap = 1 << 20;
  CompressedTierOptions o;
  o.store = &store;
  o.capacity_bytes = cap;
  o.writeback_delay_ms = 0;
  o.adapt_window_hits = 0;
  auto created = CompressedTier::Create(o);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  std::vector<uint8_t> got(kPage);
  for (uint32_t i = 0; i < 2048; ++i) {
    ASSERT_TRUE((*created)->WritePage(i % 8, Compressible(i % 8, i).data()).ok());
    ASSERT_TRUE((*created)->ReadPage(i % 8, got.data()).ok());
  }
  const CompressedTierStats s = (*created)->TierStats();
  EXPECT_EQ(s.hits_near, 2048u);
  EXPECT_EQ(s.shrinks + s.grows, 0u);
  EXPECT_EQ(s.capacity_bytes, cap);
}

// The tier stops while write-backs are in flight and a page waits for its delay: the
// destructor waits for the write-backs' completions and drops the waiting page. (Its thread
// once took the waiting page as due - every queued write-back is urgent while stopping - and
// spun holding the lock the completions need: the destructor never returned.)
TEST(CompressedTierTest, StoppingWithWriteBacksInFlightAndAPageWaitingReturns) {
  MemoryPageStore store(4096);
  const uint64_t cap = 256 << 10;
  CompressedTierOptions o;
  o.store = &store;
  o.capacity_bytes = cap;
  o.writeback_delay_ms = 60000;
  o.writeback_inflight = 1024;  // Every urgent write-back starts at once: slots stay free.
  auto created = CompressedTier::Create(o);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  std::unique_ptr<CompressedTier> tier = std::move(*created);
  store.Hold(MemoryPageStore::HoldKind::kWrites);
  // Past 3/4 of the capacity: the write-backs start at once, and are held by the store.
  PageId p = 0;
  while (tier->charged_bytes() <= cap / 4 * 3) {
    ASSERT_TRUE(tier->WritePage(p, Compressible(p, 1).data()).ok());
    ++p;
  }
  ASSERT_TRUE(store.WaitHeld(p)) << "the write-backs did not start";
  // Trimmed: the tier is empty again (not urgent), and one more page waits for its delay.
  ASSERT_TRUE(tier->Trim(0, p).ok());
  ASSERT_TRUE(tier->WritePage(p, Compressible(p, 1).data()).ok());
  EXPECT_EQ(tier->TierStats().dirty_entries, 1u);
  std::thread stop([&] { tier.reset(); });
  store.Release();
  stop.join();
  EXPECT_EQ(tier, nullptr);
  EXPECT_FALSE(store.Holds(p)) << "a page not written back when the tier stopped is dropped";
}

TEST(CompressedTierTest, AsyncReadsCompleteOffTheSubmittingThread) {
  MemoryPageStore store(64);
  auto tier = MakeTier(&store, 1 << 20);
  ASSERT_NE(tier, nullptr);
  ASSERT_TRUE(tier->WritePage(4, Compressible(4, 1).data()).ok());
  std::vector<uint8_t> buf(kPage);
  struct Ctx {
    std::atomic<bool> done{false};
    std::thread::id on;
  } ctx;
  PageOp op;
  op.kind = PageOp::Kind::kRead;
  op.page = 4;
  op.buf = buf.data();
  op.user = &ctx;
  op.done = [](PageOp* o) {
    auto* c = static_cast<Ctx*>(o->user);
    c->on = std::this_thread::get_id();
    c->done.store(true);
  };
  PageOp* one[1] = {&op};
  ASSERT_TRUE(tier->Submit(one).ok());
  ASSERT_TRUE(WaitFor([&] { return ctx.done.load(); }));
  EXPECT_NE(ctx.on, std::this_thread::get_id());
  EXPECT_TRUE(op.status.ok());
  EXPECT_EQ(buf, Compressible(4, 1));
}

TEST(CompressedTierTest, ConcurrentWritersAndReadersSeeTheirLatestBytes) {
  MemoryPageStore store(4096, /*latency_us=*/50);
  auto tier = MakeTier(&store, 128 << 10);  // Small: drops and misses happen too.
  ASSERT_NE(tier, nullptr);
  constexpr int kThreads = 4;
  constexpr PageId kPerThread = 300;
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<uint32_t> version(kPerThread, 0);
      std::mt19937 rng(t);
      std::vector<uint8_t> got(kPage);
      for (int i = 0; i < 3000; ++i) {
        const PageId local = rng() % kPerThread, p = local * kThreads + t;
        if (rng() % 3 == 0 || version[local] == 0) {
          ++version[local];
          const auto b = version[local] % 7 == 0 ? Random(p * 1000 + version[local])
                                                 : Compressible(p, version[local]);
          if (!tier->WritePage(p, b.data()).ok()) bad++;
        } else {
          const auto want = version[local] % 7 == 0 ? Random(p * 1000 + version[local])
                                                    : Compressible(p, version[local]);
          if (!tier->ReadPage(p, got.data()).ok() || got != want) bad++;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
  ASSERT_TRUE(tier->Flush().ok());
  CompressedTierStats s = tier->TierStats();
  EXPECT_GT(s.hits, 0u);
  EXPECT_GT(s.dropped + s.bypassed_full, 0u);
  EXPECT_EQ(s.dirty_entries, 0u);
}

// The pager paging through the tier: resident pages plus the tier's charge stay within the
// budget, and pages evicted into the tier come back without a store read.
TEST(CompressedTierTest, PagerChargesTheTierAgainstItsBudget) {
  constexpr size_t kPages = 2048, kLimit = 512;
  MemoryPageStore store(kPages);
  CompressedTierOptions to;
  to.store = &store;  // Auto: a quarter of the pager's budget.
  to.adapt_window_hits = 0;  // The full quarter, whatever the hits' distances.
  auto tier = CompressedTier::Create(to);
  ASSERT_TRUE(tier.ok());
  PagerOptions o;
  o.store = &store;
  o.tier = tier->get();
  o.region_bytes = kPages * kPage;
  o.local_limit_bytes = kLimit * kPage;
  o.evict_batch = 16;
  EXPECT_EQ(Pager::Create(o).status().code(), StatusCode::kInvalidArgument);  // store != tier.
  o.store = tier->get();
  auto pager = Pager::Create(o);
  ASSERT_TRUE(pager.ok()) << pager.status().ToString();
  uint8_t* base = (*pager)->base();
  for (size_t p = 0; p < kPages; ++p) {
    const auto b = Compressible(p, 1);
    std::memcpy(base + p * kPage, b.data(), kPage);
  }
  ASSERT_TRUE(WaitFor([&] {
    const PagerStats ps = (*pager)->Stats();
    return ps.resident_pages * kPage + (*tier)->charged_bytes() <= kLimit * kPage * 105 / 100;
  })) << "resident + tier over the budget";
  // Back to front: the pages evicted last (in the tier) are faulted first.
  const uint64_t before = store.reads_completed();
  for (size_t p = kPages; p-- > 0;) {
    ASSERT_EQ(std::memcmp(base + p * kPage, Compressible(p, 1).data(), kPage), 0) << p;
  }
  CompressedTierStats s = (*tier)->TierStats();
  EXPECT_GT(s.hits, 0u);
  EXPECT_EQ(s.capacity_bytes, kLimit * kPage / 4);
  EXPECT_LT(store.reads_completed() - before, (*pager)->Stats().remote_reads)
      << "every fill went to the store";
  pager->reset();
}

// With the inactive list on (the default), victims leave local memory from the list's end, not
// through the plain eviction path: clean ones must still be kept compressed in the tier, so that
// their next fault is local (before, only the list-off path admitted them, and a read-only page
// paged through the list went to the store every time).
TEST(CompressedTierTest, CleanPagesLeavingTheInactiveListAreKeptInTheTier) {
  constexpr size_t kPages = 1024, kLimit = 256;
  MemoryPageStore store(kPages);
  CompressedTierOptions to;
  to.store = &store;
  to.capacity_bytes = 1 << 20;  // Three quarters of the budget: 768 KiB.
  to.writeback_delay_ms = 0;
  to.adapt_window_hits = 0;  // A fixed capacity: this test is about admission only.
  auto tier = CompressedTier::Create(to);
  ASSERT_TRUE(tier.ok()) << tier.status().ToString();
  PagerOptions o;
  o.store = tier->get();
  o.tier = tier->get();
  o.region_bytes = kPages * kPage;
  o.local_limit_bytes = kLimit * kPage;
  o.evict_batch = 16;
  o.inactive_list = true;
  o.adaptive_writable_fills = false;  // Pages read back stay clean.
  o.prefetch = false;
  auto pager = Pager::Create(o);
  ASSERT_TRUE(pager.ok()) << pager.status().ToString();
  uint8_t* base = (*pager)->base();
  for (size_t p = 0; p < kPages; ++p) {
    const auto b = Compressible(p, 1);
    std::memcpy(base + p * kPage, b.data(), kPage);
  }
  ASSERT_TRUE((*tier)->Flush().ok());
  // Two read-only passes: pages come back clean and are evicted clean through the list.
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t p = 0; p < kPages; ++p) {
      ASSERT_EQ(std::memcmp(base + p * kPage, Compressible(p, 1).data(), kPage), 0) << p;
    }
  }
  const PagerStats ps = (*pager)->Stats();
  const CompressedTierStats s = (*tier)->TierStats();
  EXPECT_GT(ps.deactivated, 0u) << "the inactive list did not run";
  EXPECT_GT(ps.clean_drops, 0u);
  EXPECT_GT(s.admitted_clean, 0u) << "clean pages leaving the list were not kept in the tier";
  pager->reset();
}

}  // namespace
}  // namespace tessera::kernel_shim
