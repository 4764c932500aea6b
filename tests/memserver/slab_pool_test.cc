#include "memserver/slab_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <thread>
#include <vector>

namespace tessera::memserver {
namespace {

constexpr uint64_t kSlab = 64 << 10;

std::unique_ptr<SlabPool> MakePool(uint64_t slabs) {
  SlabPool::Options o;
  o.slab_bytes = kSlab;
  o.capacity_bytes = slabs * kSlab;
  auto p = SlabPool::Create(o);
  EXPECT_TRUE(p.ok()) << p.status();
  return std::move(*p);
}

TEST(SlabPoolTest, ValidatesOptions) {
  SlabPool::Options o;
  o.slab_bytes = 1000;  // Not a page multiple.
  o.capacity_bytes = 1 << 20;
  EXPECT_EQ(SlabPool::Create(o).status().code(), StatusCode::kInvalidArgument);
  o.slab_bytes = 64 << 10;
  o.capacity_bytes = (64 << 10) * 3 + 4096;  // Not a slab multiple.
  EXPECT_EQ(SlabPool::Create(o).status().code(), StatusCode::kInvalidArgument);
  o.capacity_bytes = 4096;  // Smaller than one slab.
  EXPECT_EQ(SlabPool::Create(o).status().code(), StatusCode::kInvalidArgument);
  o.capacity_bytes = 1 << 20;
  o.huge_pages = true;  // 64K slabs cannot be huge-page aligned.
  EXPECT_EQ(SlabPool::Create(o).status().code(), StatusCode::kInvalidArgument);
  o.slab_bytes = 0;
  o.huge_pages = false;
  EXPECT_FALSE(SlabPool::Create(o).ok());
}

TEST(SlabPoolTest, AllocUntilFullThenFreeAndReuse) {
  auto pool = MakePool(4);
  std::set<uint64_t> ids;
  for (int i = 0; i < 4; ++i) {
    auto id = pool->Alloc(7);
    ASSERT_TRUE(id.ok()) << id.status();
    EXPECT_NE(*id, 0u);
    ids.insert(*id);
  }
  EXPECT_EQ(ids.size(), 4u);
  EXPECT_EQ(pool->Alloc(7).status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(pool->counts().allocated_slabs, 4u);
  uint64_t first = *ids.begin();
  ASSERT_TRUE(pool->Free(7, first).ok());
  auto again = pool->Alloc(8);
  ASSERT_TRUE(again.ok());
  // Same slot, new generation: the old id is dead.
  EXPECT_EQ(SlabPool::IndexOf(*again), SlabPool::IndexOf(first));
  EXPECT_NE(*again, first);
  EXPECT_EQ(pool->Resolve(7, first, 0, 1).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(pool->Free(7, first).code(), StatusCode::kNotFound);
  EXPECT_EQ(pool->Alloc(0).status().code(), StatusCode::kInvalidArgument);
}

TEST(SlabPoolTest, OwnershipIsChecked) {
  auto pool = MakePool(2);
  uint64_t a = *pool->Alloc(1);
  uint64_t b = *pool->Alloc(2);
  EXPECT_TRUE(pool->Resolve(1, a, 0, 8).ok());
  EXPECT_EQ(pool->Resolve(2, a, 0, 8).status().code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(pool->Resolve(1, b, 0, 8).status().code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(pool->Free(2, a).code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(pool->SlabsOwnedBy(1), 1u);
  EXPECT_TRUE(pool->Free(1, a).ok());
}

TEST(SlabPoolTest, BoundsAreChecked) {
  auto pool = MakePool(2);
  uint64_t a = *pool->Alloc(1);
  EXPECT_TRUE(pool->Resolve(1, a, 0, kSlab).ok());
  EXPECT_TRUE(pool->Resolve(1, a, kSlab - 1, 1).ok());
  EXPECT_EQ(pool->Resolve(1, a, kSlab - 1, 2).status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(pool->Resolve(1, a, kSlab, 1).status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(pool->Resolve(1, a, UINT64_MAX, 1).status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(pool->Resolve(1, a, 1, UINT64_MAX).status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(pool->Resolve(1, a, 0, 0).status().code(), StatusCode::kInvalidArgument);
  // Ids that name no slot, or a slot never allocated.
  EXPECT_EQ(pool->Resolve(1, 0, 0, 1).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(pool->Resolve(1, (1ull << 32) | 999, 0, 1).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(pool->Resolve(1, (1ull << 32) | 1, 0, 1).status().code(), StatusCode::kNotFound);
}

TEST(SlabPoolTest, DataPersistsAndFreedSlabsComeBackZeroed) {
  auto pool = MakePool(1);
  uint64_t a = *pool->Alloc(1);
  auto w = pool->Resolve(1, a, 100, 5);
  ASSERT_TRUE(w.ok());
  std::memcpy(w->data(), "hello", 5);
  auto r = pool->Resolve(1, a, 100, 5);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(std::memcmp(r->data(), "hello", 5), 0);
  ASSERT_TRUE(pool->Free(1, a).ok());
  uint64_t b = *pool->Alloc(2);  // Another client gets the same memory...
  auto z = pool->Resolve(2, b, 0, kSlab);
  ASSERT_TRUE(z.ok());
  // ...and must not see the previous owner's bytes.
  EXPECT_TRUE(std::all_of(z->begin(), z->end(), [](uint8_t c) { return c == 0; }));
}

TEST(SlabPoolTest, LimitRefusesNewAllocations) {
  auto pool = MakePool(4);
  pool->SetLimit(1);
  ASSERT_TRUE(pool->Alloc(1).ok());
  EXPECT_EQ(pool->Alloc(1).status().code(), StatusCode::kResourceExhausted);
  pool->SetLimit(100);  // Clamped to capacity.
  EXPECT_EQ(pool->counts().limit_slabs, 4u);
  EXPECT_TRUE(pool->Alloc(1).ok());
}

TEST(SlabPoolTest, EvictingSlabsStayUsableUntilForceFreed) {
  auto pool = MakePool(2);
  uint64_t a = *pool->Alloc(5);
  auto owner = pool->MarkEvicting(a);
  ASSERT_TRUE(owner.ok());
  EXPECT_EQ(*owner, 5u);
  EXPECT_EQ(pool->MarkEvicting(a).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(pool->counts().evicting_slabs, 1u);
  EXPECT_TRUE(pool->Resolve(5, a, 0, 16).ok());
  ASSERT_TRUE(pool->ForceFree(a).ok());
  EXPECT_EQ(pool->counts().evicting_slabs, 0u);
  EXPECT_EQ(pool->counts().allocated_slabs, 0u);
  EXPECT_EQ(pool->Resolve(5, a, 0, 16).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(pool->ForceFree(a).code(), StatusCode::kNotFound);
}

TEST(SlabPoolTest, ConcurrentAllocFreeResolveKeepsCountsExact) {
  auto pool = MakePool(16);
  std::vector<std::thread> threads;
  std::atomic<int> wrong_owner{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      OwnerId me = static_cast<OwnerId>(t + 1);
      for (int i = 0; i < 2000; ++i) {
        auto id = pool->Alloc(me);
        if (!id.ok()) continue;
        auto mem = pool->Resolve(me, *id, 0, 8);
        if (!mem.ok()) wrong_owner++;
        // Another thread's id would be refused; our own freed id must be dead.
        if (!pool->Free(me, *id).ok()) wrong_owner++;
        if (pool->Resolve(me, *id, 0, 8).ok()) wrong_owner++;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong_owner.load(), 0);
  EXPECT_EQ(pool->counts().allocated_slabs, 0u);
  EXPECT_EQ(pool->AllocatedSlabs().size(), 0u);
}

}  // namespace
}  // namespace tessera::memserver
