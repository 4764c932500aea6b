// KvTable / KvArena: the Kayak service's KV hash table in a memserver's slabs.
#include "apps/kayak/server/kv_table.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <thread>

namespace tessera::kayak {
namespace {

// The slab owner the memserver would reserve for the service (memserver/service.h).
constexpr OwnerId kOwner = memserver::ServiceOwner(0);

std::span<const uint8_t> B(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}
// String literals: spans that stay valid (a temporary std::string would dangle).
std::span<const uint8_t> B(const char* s) {
  return {reinterpret_cast<const uint8_t*>(s), std::strlen(s)};
}
std::string S(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }

std::unique_ptr<SlabPool> Pool(uint64_t capacity, uint64_t slab) {
  auto p = SlabPool::Create({capacity, slab, false});
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return std::move(*p);
}

TEST(KvTableTest, PutGetOverwriteDeleteWithVersions) {
  auto pool = Pool(16 << 20, 1 << 20);
  KvStore store(pool.get(), kOwner);
  EXPECT_EQ(store.Table(7, false), nullptr);
  KvTable* t = store.Table(7, true);
  ASSERT_NE(t, nullptr);
  std::vector<uint8_t> v;
  EXPECT_EQ(t->Get(B("a"), &v), 0u);
  auto p1 = t->Put(B("a"), B("one"), 0);
  ASSERT_TRUE(p1.ok());
  EXPECT_FALSE(p1->conflict);
  EXPECT_GT(p1->version, 0u);
  EXPECT_EQ(t->Get(B("a"), &v), p1->version);
  EXPECT_EQ(S(v), "one");
  // Overwrite with a longer value (another size class) and an empty one.
  std::string big(5000, 'x');
  auto p2 = t->Put(B("a"), B(big), p1->version);
  ASSERT_TRUE(p2.ok());
  EXPECT_FALSE(p2->conflict);
  EXPECT_GT(p2->version, p1->version);
  EXPECT_EQ(t->Get(B("a"), &v), p2->version);
  EXPECT_EQ(S(v), big);
  // Conditional writes.
  auto stale = t->Put(B("a"), B("zzz"), p1->version);
  ASSERT_TRUE(stale.ok());
  EXPECT_TRUE(stale->conflict);
  EXPECT_EQ(stale->version, p2->version);
  auto create = t->Put(B("a"), B("zzz"), ~uint64_t{0});
  EXPECT_TRUE(create->conflict);
  EXPECT_EQ(S((t->Get(B("a"), &v), v)), big);
  auto empty = t->Put(B("e"), B(""), 0);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(t->Get(B("e"), &v), empty->version);
  EXPECT_TRUE(v.empty());
  // Delete.
  auto d = t->Delete(B("a"), 0);
  ASSERT_TRUE(d.ok());
  EXPECT_FALSE(d->conflict);
  EXPECT_EQ(t->Get(B("a"), &v), 0u);
  EXPECT_EQ(t->Delete(B("a"), 0).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(t->stats().objects, 1u);
}

TEST(KvTableTest, RejectsBadSizesWithoutChangingAnything) {
  auto pool = Pool(16 << 20, 1 << 20);
  KvStore store(pool.get(), kOwner);
  KvTable* t = store.Table(1, true);
  std::string key65(65, 'k');
  EXPECT_EQ(t->Put(B(key65), B("v"), 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(t->Put(B(""), B("v"), 0).status().code(), StatusCode::kInvalidArgument);
  std::string huge((64 << 10) + 1, 'v');
  EXPECT_EQ(t->Put(B("k"), B(huge), 0).status().code(), StatusCode::kInvalidArgument);
  std::string max(64 << 10, 'v');
  std::string key64(64, 'k');
  ASSERT_TRUE(t->Put(B(key64), B(max), 0).ok());
  std::vector<uint8_t> v;
  EXPECT_NE(t->Get(B(key64), &v), 0u);
  EXPECT_EQ(v.size(), max.size());
  EXPECT_EQ(t->stats().objects, 1u);
}

TEST(KvTableTest, GrowsAndDeletesAgainstAModel) {
  auto pool = Pool(64 << 20, 1 << 20);
  KvStore store(pool.get(), kOwner, KvTable::Options{4, 8});
  KvTable* t = store.Table(3, true);
  std::map<std::string, std::string> model;
  std::mt19937_64 rng(42);
  for (int i = 0; i < 40000; ++i) {
    std::string key = "key" + std::to_string(rng() % 5000);
    int op = static_cast<int>(rng() % 10);
    if (op < 6) {
      std::string value(rng() % 300, static_cast<char>('a' + rng() % 26));
      ASSERT_TRUE(t->Put(B(key), B(value), 0).ok());
      model[key] = value;
    } else if (op < 9) {
      auto d = t->Delete(B(key), 0);
      if (model.erase(key)) {
        ASSERT_TRUE(d.ok()) << key;
      } else {
        ASSERT_EQ(d.status().code(), StatusCode::kNotFound) << key;
      }
    } else {
      std::vector<uint8_t> v;
      auto it = model.find(key);
      if (it == model.end()) {
        ASSERT_EQ(t->Get(B(key), &v), 0u);
      } else {
        ASSERT_NE(t->Get(B(key), &v), 0u);
        ASSERT_EQ(S(v), it->second);
      }
    }
  }
  auto st = t->stats();
  EXPECT_EQ(st.objects, model.size());
  EXPECT_GT(st.buckets, 4u * 8u) << "the index never grew";
  for (auto& [k, val] : model) {
    std::vector<uint8_t> v;
    ASSERT_NE(t->Get(B(k), &v), 0u) << k;
    ASSERT_EQ(S(v), val);
  }
  // Deleting everything returns every chunk to the free lists.
  for (auto& [k, val] : model) ASSERT_TRUE(t->Delete(B(k), 0).ok());
  EXPECT_EQ(t->stats().objects, 0u);
  EXPECT_EQ(store.arena().stats().bytes_in_use, 0u);
}

TEST(KvTableTest, FullSlabsRefuseWritesAndKeepData) {
  auto pool = Pool(2 << 20, 1 << 20);  // Two slabs only.
  KvStore store(pool.get(), kOwner);
  KvTable* t = store.Table(1, true);
  std::string value(900, 'v');  // 1 KiB chunks: one slab holds 1024 of them.
  int stored = 0;
  Status last;
  for (int i = 0; i < 5000; ++i) {
    auto r = t->Put(B("k" + std::to_string(i)), B(value), 0);
    if (!r.ok()) {
      last = r.status();
      break;
    }
    ++stored;
  }
  EXPECT_EQ(last.code(), StatusCode::kResourceExhausted) << last.ToString();
  EXPECT_NE(last.message().find("KV store full"), std::string::npos) << last.ToString();
  EXPECT_EQ(stored, 2048);
  // Every stored object is intact, an overwrite in the same class still works (reuses the
  // freed chunk), and a delete makes room again.
  std::vector<uint8_t> v;
  for (int i = 0; i < stored; ++i) ASSERT_NE(t->Get(B("k" + std::to_string(i)), &v), 0u);
  std::string value2(900, 'w');
  ASSERT_TRUE(t->Delete(B("k0"), 0).ok());
  ASSERT_TRUE(t->Put(B("new"), B(value2), 0).ok());
  EXPECT_EQ(t->Get(B("new"), &v), t->Get(B("new"), nullptr));
  EXPECT_EQ(S(v), value2);
  // A commit that needs more room than there is changes nothing.
  std::string a = "k1", b = "k2", c = "fresh1", d = "fresh2";
  std::vector<KvTable::WriteItem> writes = {{B(c), B(value), false}, {B(d), B(value), false},
                                            {B(a), {}, true}};
  auto r = t->Commit({}, writes);
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(t->Get(B(a), nullptr), 0u) << "a failed commit deleted a key";
  EXPECT_EQ(t->Get(B(c), nullptr), 0u);
}

TEST(KvTableTest, CommitValidatesReadVersions) {
  auto pool = Pool(16 << 20, 1 << 20);
  KvStore store(pool.get(), kOwner);
  KvTable* t = store.Table(1, true);
  uint64_t va = t->Put(B("a"), B("1"), 0)->version;
  std::vector<KvTable::ReadItem> reads = {{B("a"), va}, {B("b"), 0}};
  std::vector<KvTable::WriteItem> writes = {{B("a"), B("2"), false}, {B("b"), B("x"), false}};
  auto ok = t->Commit(reads, writes);
  ASSERT_TRUE(ok.ok());
  EXPECT_FALSE(ok->conflict);
  std::vector<uint8_t> v;
  EXPECT_EQ(t->Get(B("a"), &v), ok->version);
  EXPECT_EQ(S(v), "2");
  EXPECT_EQ(t->Get(B("b"), &v), ok->version);
  // The same commit again: the versions it read are stale now.
  auto again = t->Commit(reads, writes);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->conflict);
}

// Concurrent read-modify-write through Commit: no increment is lost.
TEST(KvTableTest, ConcurrentOptimisticIncrementsLoseNothing) {
  auto pool = Pool(16 << 20, 1 << 20);
  KvStore store(pool.get(), kOwner);
  KvTable* t = store.Table(1, true);
  ASSERT_TRUE(t->Put(B("ctr"), B(std::string(8, '\0')), 0).ok());
  constexpr int kThreads = 4, kPerThread = 2000;
  std::atomic<uint64_t> conflicts{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&] {
      for (int n = 0; n < kPerThread;) {
        std::vector<uint8_t> v;
        uint64_t ver = t->Get(B("ctr"), &v);
        uint64_t x;
        std::memcpy(&x, v.data(), 8);
        ++x;
        std::memcpy(v.data(), &x, 8);
        std::vector<KvTable::ReadItem> reads = {{B("ctr"), ver}};
        std::vector<KvTable::WriteItem> writes = {{B("ctr"), v, false}};
        auto r = t->Commit(reads, writes);
        ASSERT_TRUE(r.ok());
        if (r->conflict) {
          conflicts.fetch_add(1);
        } else {
          ++n;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  std::vector<uint8_t> v;
  t->Get(B("ctr"), &v);
  uint64_t x;
  std::memcpy(&x, v.data(), 8);
  EXPECT_EQ(x, uint64_t{kThreads} * kPerThread);
}

}  // namespace
}  // namespace tessera::kayak
