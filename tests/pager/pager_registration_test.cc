// Pager::Unregister / Pager::Register over MemoryPageStore: pages taken out of paging keep their
// content (remote ones are read back first), leave the resident set and the footprint, may be
// made inaccessible while the pager evicts around them, and come back as resident pages.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstring>
#include <functional>
#include <thread>

#include "client/testing/memory_page_store.h"
#include "common/clock.h"
#include "kernel_shim/pager/pager.h"
#include "tests/pager/page_patterns.h"

namespace tessera::kernel_shim {
namespace {

using client::testing::MemoryPageStore;
constexpr size_t kPage = 4096;

bool WaitFor(const std::function<bool()>& cond, int ms = 10000) {
  Deadline d = Deadline::AfterMs(ms);
  while (!cond()) {
    if (d.Expired()) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

std::unique_ptr<Pager> MakePager(MemoryPageStore* store, size_t pages, uint64_t limit_pages) {
  PagerOptions o;
  o.store = store;
  o.region_bytes = pages * kPage;
  o.local_limit_bytes = limit_pages * kPage;
  o.evict_batch = 16;
  // No never-written neighbours mapped around a fault: the evictor drops those on its own time,
  // and the footprint the tests compare would move under them.
  o.zero_fault_around_pages = 0;
  auto r = Pager::Create(o);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? std::move(r).value() : nullptr;
}

void FillPage(uint8_t* p, uint64_t seed) {
  for (size_t i = 0; i < kPage; i += 8) {
    const uint64_t v = seed * 1000003 + i;
    std::memcpy(p + i, &v, 8);
  }
}
bool PageIs(const uint8_t* p, uint64_t seed) {
  for (size_t i = 0; i < kPage; i += 8) {
    uint64_t v;
    std::memcpy(&v, p + i, 8);
    if (v != seed * 1000003 + i) return false;
  }
  return true;
}

TEST(PagerRegistration, UnregisteredPagesKeepTheirContentAndLeaveTheCounts) {
  MemoryPageStore store(512);
  auto pager = MakePager(&store, 512, 32);
  ASSERT_NE(pager, nullptr);
  uint8_t* b = pager->base();
  for (size_t p = 0; p < 256; ++p) FillPage(b + p * kPage, p);
  // Over the cap of 32: most of the first pages went remote.
  ASSERT_TRUE(WaitFor([&] { return pager->Stats().resident_pages <= 40; }));
  const uint64_t footprint = pager->Stats().footprint_pages;
  ASSERT_TRUE(pager->Unregister(b, 64 * kPage, /*keep_content=*/true).ok());
  EXPECT_EQ(pager->Stats().footprint_pages, footprint - 64);
  // Inaccessible while the pager evicts the rest (it must never read these pages).
  ASSERT_EQ(mprotect(b, 64 * kPage, PROT_NONE), 0);
  for (size_t p = 64; p < 512; ++p) FillPage(b + p * kPage, p + 7);
  for (size_t p = 64; p < 512; ++p) ASSERT_TRUE(PageIs(b + p * kPage, p + 7)) << p;
  ASSERT_EQ(mprotect(b, 64 * kPage, PROT_READ | PROT_WRITE), 0);
  for (size_t p = 0; p < 64; ++p) ASSERT_TRUE(PageIs(b + p * kPage, p)) << p;
  // Paged again: resident now, and evicted and read back like any page.
  ASSERT_TRUE(pager->Register(b, 64 * kPage).ok());
  EXPECT_GE(pager->Stats().footprint_pages, 448u + 64);
  for (size_t p = 64; p < 512; ++p) ASSERT_TRUE(PageIs(b + p * kPage, p + 7)) << p;
  for (size_t p = 0; p < 64; ++p) ASSERT_TRUE(PageIs(b + p * kPage, p)) << p;
  EXPECT_GT(pager->Stats().remote_reads, 0u);
  EXPECT_EQ(pager->Stats().fill_errors, 0u);
}

TEST(PagerRegistration, UnregisterWithoutContentDropsAndDiscardLeavesThemUnpaged) {
  MemoryPageStore store(128);
  auto pager = MakePager(&store, 128, 0);
  ASSERT_NE(pager, nullptr);
  uint8_t* b = pager->base();
  for (size_t p = 0; p < 16; ++p) FillPage(b + p * kPage, p);
  ASSERT_TRUE(pager->Unregister(b + 4 * kPage, 8 * kPage, /*keep_content=*/false).ok());
  for (size_t i = 4 * kPage; i < 12 * kPage; ++i) ASSERT_EQ(b[i], 0) << i;
  EXPECT_TRUE(PageIs(b + 12 * kPage, 12));
  // Plain memory now: written without the pager seeing it, and Discard() only drops it.
  FillPage(b + 5 * kPage, 99);
  const uint64_t resident = pager->Stats().resident_pages;
  ASSERT_TRUE(pager->Discard(b, 16 * kPage).ok());
  EXPECT_LT(pager->Stats().resident_pages, resident);
  for (size_t i = 0; i < 4 * kPage; ++i) ASSERT_EQ(b[i], 0) << i;
  for (size_t i = 12 * kPage; i < 16 * kPage; ++i) ASSERT_EQ(b[i], 0) << i;
  // Registered again: the dropped pages fault in as zeros through the pager.
  ASSERT_TRUE(pager->Register(b + 4 * kPage, 8 * kPage).ok());
  const uint64_t faults = pager->Stats().faults;
  for (size_t i = 4 * kPage; i < 12 * kPage; ++i) ASSERT_EQ(b[i], 0) << i;
  EXPECT_GT(pager->Stats().faults, faults);
  FillPage(b + 6 * kPage, 6);
  EXPECT_TRUE(PageIs(b + 6 * kPage, 6));
  EXPECT_FALSE(pager->Unregister(b + 1, kPage, true).ok());
  EXPECT_FALSE(pager->Register(b, 129 * kPage).ok());
}

// Pages on the inactive list in a range taken out of paging are moved back first, kept or
// dropped like resident pages: Unregister does not wait for the evictor to drop them (it did,
// and a runtime's mprotect of such a range hung while the list held a page of it). In a child
// process, so that a hang fails the test after a bounded wait.
TEST(PagerRegistration, StagedPagesInTheRangeAreTakenAtOnce) {
  const int result = testing::RunInChild([] {
    constexpr size_t kPages = 256, kCap = 32;
    MemoryPageStore store(kPages);
    PagerOptions o;
    o.store = &store;
    o.region_bytes = kPages * kPage;
    o.local_limit_bytes = kCap * kPage;
    o.evict_batch = 4;
    o.zero_fault_around_pages = 0;
    o.prefetch = false;
    o.victim = VictimPolicy::kFifo;  // The list holds the oldest of the last pages written.
    o.inactive_list = true;
    auto r = Pager::Create(o);
    if (!r.ok()) return 2;
    auto pager = std::move(r).value();
    uint8_t* b = pager->base();
    for (uint32_t round = 1; round <= 2; ++round) {
      for (size_t p = 0; p < kPages; ++p) FillPage(b + p * kPage, p + round * 1000);
      // Every local page is among the last 64 written (FIFO), so the range holds them all.
      if (!WaitFor([&] { return pager->Stats().resident_pages <= kCap; })) return 3;
      if (pager->Stats().staged_pages == 0) return 4;
      uint8_t* range = b + (kPages - 64) * kPage;
      const bool keep = round == 1;
      if (!pager->Unregister(range, 64 * kPage, keep).ok()) return 5;
      if (pager->Stats().staged_pages != 0 || pager->Stats().resident_pages != 0) return 6;
      for (size_t p = kPages - 64; p < kPages; ++p) {
        const uint8_t* page = b + p * kPage;
        if (keep ? !PageIs(page, p + round * 1000) : page[0] != 0 || page[kPage - 1] != 0) {
          return 7;
        }
      }
      if (!pager->Register(range, 64 * kPage).ok()) return 8;
    }
    return 0;
  }, 30000);
  ASSERT_NE(result, -1) << "Unregister waited on staged pages (no end in 30 s)";
  EXPECT_EQ(result, 0) << "exit code: 2 create, 3 cap, 4 nothing staged, 5 unregister, "
                          "6 pages left counted, 7 wrong bytes, 8 register";
}

}  // namespace
}  // namespace tessera::kernel_shim
