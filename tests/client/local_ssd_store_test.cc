// LocalSsdStore: the io_uring local-file PageStore. Random patterns against a shadow copy,
// unaligned buffers, trims, out-of-range ids, whole-batch rejection, concurrent submitters.
#include "client/local_ssd_store.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "tests/support/test_util.h"

namespace tessera::client {
namespace {

using tessera::testing::TempDir;

// Counts completions of a batch; Wait() is bounded and fails the test with a message.
class BatchWaiter {
 public:
  static void Done(PageOp* op) {
    auto* w = static_cast<BatchWaiter*>(op->user);
    std::lock_guard<std::mutex> lock(w->mu_);
    if (--w->left_ == 0) w->cv_.notify_all();
  }
  void Expect(size_t n) {
    std::lock_guard<std::mutex> lock(mu_);
    left_ += n;
  }
  bool Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(60), [&] { return left_ == 0; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  size_t left_ = 0;
};

void FillPage(uint8_t* p, uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i < kPageSize; i += 8) {
    uint64_t v = rng();
    std::memcpy(p + i, &v, 8);
  }
}

std::unique_ptr<LocalSsdStore> MakeStore(const TempDir& dir, uint64_t pages, uint32_t qd = 64,
                                         bool direct = true) {
  LocalSsdOptions o;
  o.path = dir.path() + "/pages.bin";
  o.capacity_pages = pages;
  o.queue_depth = qd;
  o.direct_io = direct;
  auto r = LocalSsdStore::Create(o);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? std::move(r).value() : nullptr;
}

// An aligned arena; page i at offset i * 4096 + shift (shift != 0 makes it unaligned).
struct Arena {
  Arena(size_t pages, size_t shift) : mem((pages + 1) * kPageSize + kPageSize), shift_(shift) {}
  uint8_t* page(size_t i) {
    uintptr_t base = reinterpret_cast<uintptr_t>(mem.data());
    base = (base + kPageSize - 1) / kPageSize * kPageSize;
    return reinterpret_cast<uint8_t*>(base) + i * kPageSize + shift_;
  }
  std::vector<uint8_t> mem;
  size_t shift_;
};

// Rounds of a batch of distinct random pages, each read or written, against a shadow copy.
void RandomRounds(PageStore* store, uint64_t pages, size_t shift, uint64_t seed, int rounds,
                  size_t batch) {
  std::vector<std::array<uint8_t, kPageSize>> shadow(pages);
  for (auto& p : shadow) p.fill(0);
  std::mt19937_64 rng(seed);
  Arena arena(batch, shift);
  std::vector<PageOp> ops(batch);
  std::vector<PageOp*> ptrs(batch);
  for (int round = 0; round < rounds; ++round) {
    std::vector<PageId> chosen;
    while (chosen.size() < batch) {
      PageId p = rng() % pages;
      if (std::find(chosen.begin(), chosen.end(), p) == chosen.end()) chosen.push_back(p);
    }
    BatchWaiter waiter;
    waiter.Expect(batch);
    for (size_t i = 0; i < batch; ++i) {
      ops[i] = PageOp();
      ops[i].page = chosen[i];
      ops[i].buf = arena.page(i);
      ops[i].done = BatchWaiter::Done;
      ops[i].user = &waiter;
      if (rng() % 2 == 0) {
        ops[i].kind = PageOp::Kind::kWrite;
        FillPage(ops[i].buf, rng());
        std::memcpy(shadow[chosen[i]].data(), ops[i].buf, kPageSize);
      } else {
        ops[i].kind = PageOp::Kind::kRead;
        std::memset(ops[i].buf, 0xAB, kPageSize);
      }
      ptrs[i] = &ops[i];
    }
    ASSERT_TRUE(store->Submit(ptrs).ok());
    ASSERT_TRUE(waiter.Wait()) << "round " << round << " did not complete within 60 s";
    for (size_t i = 0; i < batch; ++i) {
      ASSERT_TRUE(ops[i].status.ok()) << ops[i].status;
      if (ops[i].kind == PageOp::Kind::kRead) {
        ASSERT_EQ(0, std::memcmp(ops[i].buf, shadow[ops[i].page].data(), kPageSize))
            << "round " << round << " page " << ops[i].page;
      }
    }
  }
  // Finally every page, one blocking read each.
  std::vector<uint8_t> buf(kPageSize + 1);
  for (PageId p = 0; p < pages; ++p) {
    ASSERT_TRUE(store->ReadPage(p, buf.data() + (shift ? 1 : 0)).ok());
    ASSERT_EQ(0, std::memcmp(buf.data() + (shift ? 1 : 0), shadow[p].data(), kPageSize))
        << "page " << p;
  }
}

TEST(LocalSsdStoreTest, RandomPatternMatchesShadowAligned) {
  TempDir dir;
  auto store = MakeStore(dir, 128);
  ASSERT_NE(store, nullptr);
  RandomRounds(store.get(), 128, 0, 1, 40, 32);
  PageStoreStats s = store->Stats();
  EXPECT_EQ(s.read_errors + s.write_errors, 0u);
  EXPECT_EQ(s.reads + s.writes, 40u * 32 + 128);
  EXPECT_EQ(s.read_latency.count(), s.reads);
}

TEST(LocalSsdStoreTest, RandomPatternMatchesShadowUnalignedBuffers) {
  TempDir dir;
  auto store = MakeStore(dir, 96);
  ASSERT_NE(store, nullptr);
  RandomRounds(store.get(), 96, 1, 2, 30, 24);
  TempDir dir2;
  auto store2 = MakeStore(dir2, 96);
  ASSERT_NE(store2, nullptr);
  RandomRounds(store2.get(), 96, 17, 3, 30, 8);
}

TEST(LocalSsdStoreTest, BufferedModeWorks) {
  TempDir dir;
  auto store = MakeStore(dir, 64, 16, /*direct=*/false);
  ASSERT_NE(store, nullptr);
  EXPECT_FALSE(store->direct_io());
  EXPECT_EQ(store->name(), "local-ssd(buffered)");
  RandomRounds(store.get(), 64, 3, 4, 20, 16);
}

TEST(LocalSsdStoreTest, NameSaysWhichIoModeIsUsed) {
  TempDir dir;
  auto store = MakeStore(dir, 8);
  ASSERT_NE(store, nullptr);
  if (store->direct_io()) {
    EXPECT_EQ(store->name(), "local-ssd(direct)");
  } else {
    EXPECT_NE(store->name().find("buffered: O_DIRECT"), std::string::npos) << store->name();
  }
  EXPECT_EQ(store->capacity_pages(), 8u);
  EXPECT_EQ(store->memory_overhead(), 1.0);
}

TEST(LocalSsdStoreTest, NeverWrittenAndTrimmedPagesReadAsZeros) {
  TempDir dir;
  auto store = MakeStore(dir, 32);
  ASSERT_NE(store, nullptr);
  std::vector<uint8_t> page(kPageSize), zeros(kPageSize, 0), out(kPageSize);
  ASSERT_TRUE(store->ReadPage(5, out.data()).ok());
  EXPECT_EQ(out, zeros);
  for (PageId p = 0; p < 32; ++p) {
    FillPage(page.data(), 100 + p);
    ASSERT_TRUE(store->WritePage(p, page.data()).ok());
  }
  ASSERT_TRUE(store->Trim(4, 8).ok());
  for (PageId p = 0; p < 32; ++p) {
    ASSERT_TRUE(store->ReadPage(p, out.data()).ok());
    if (p >= 4 && p < 12) {
      EXPECT_EQ(out, zeros) << "trimmed page " << p;
    } else {
      FillPage(page.data(), 100 + p);
      EXPECT_EQ(out, page) << "page " << p;
    }
  }
  EXPECT_EQ(store->Stats().trims, 8u);
  EXPECT_EQ(store->Trim(30, 3).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(store->Trim(32, 1).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(store->Trim(1, UINT64_MAX).code(), StatusCode::kOutOfRange);
  EXPECT_TRUE(store->Flush().ok());
}

TEST(LocalSsdStoreTest, OutOfRangePageFailsOnlyThatOp) {
  TempDir dir;
  auto store = MakeStore(dir, 16);
  ASSERT_NE(store, nullptr);
  std::vector<uint8_t> a(kPageSize, 7), b(kPageSize, 9);
  PageOp ops[3];
  BatchWaiter waiter;
  waiter.Expect(3);
  ops[0].kind = PageOp::Kind::kWrite;
  ops[0].page = 15;
  ops[0].buf = a.data();
  ops[1].kind = PageOp::Kind::kWrite;
  ops[1].page = 16;
  ops[1].buf = b.data();
  ops[2].kind = PageOp::Kind::kRead;
  ops[2].page = UINT64_MAX;
  ops[2].buf = b.data();
  PageOp* ptrs[3];
  for (int i = 0; i < 3; ++i) {
    ops[i].done = BatchWaiter::Done;
    ops[i].user = &waiter;
    ptrs[i] = &ops[i];
  }
  ASSERT_TRUE(store->Submit(ptrs).ok());
  ASSERT_TRUE(waiter.Wait());
  EXPECT_TRUE(ops[0].status.ok()) << ops[0].status;
  EXPECT_EQ(ops[1].status.code(), StatusCode::kOutOfRange);
  EXPECT_NE(ops[1].status.message().find("page 16"), std::string::npos) << ops[1].status;
  EXPECT_EQ(ops[2].status.code(), StatusCode::kOutOfRange);
  std::vector<uint8_t> out(kPageSize);
  EXPECT_EQ(store->ReadPage(16, out.data()).code(), StatusCode::kOutOfRange);
  ASSERT_TRUE(store->ReadPage(15, out.data()).ok());
  EXPECT_EQ(out, a);
  PageStoreStats s = store->Stats();
  EXPECT_EQ(s.write_errors, 1u);
  EXPECT_EQ(s.read_errors, 2u);
}

TEST(LocalSsdStoreTest, InvalidBatchIsRejectedWhole) {
  TempDir dir;
  auto store = MakeStore(dir, 16);
  ASSERT_NE(store, nullptr);
  std::atomic<int> calls{0};
  std::vector<uint8_t> buf(kPageSize, 1);
  PageOp good;
  good.kind = PageOp::Kind::kWrite;
  good.page = 1;
  good.buf = buf.data();
  good.user = &calls;
  good.done = [](PageOp* op) { static_cast<std::atomic<int>*>(op->user)->fetch_add(1); };
  PageOp no_buf = good;
  no_buf.buf = nullptr;
  PageOp no_done = good;
  no_done.done = nullptr;
  PageOp bad_kind = good;
  bad_kind.kind = static_cast<PageOp::Kind>(7);
  for (PageOp* bad : {&no_buf, &no_done, &bad_kind, static_cast<PageOp*>(nullptr)}) {
    PageOp* ptrs[2] = {&good, bad};
    Status st = store->Submit(ptrs);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st;
  }
  // A valid op afterwards completes; none of the rejected batches' ops did.
  ASSERT_TRUE(store->WritePage(2, buf.data()).ok());
  EXPECT_EQ(calls.load(), 0);
  EXPECT_EQ(store->Stats().writes, 1u);
}

TEST(LocalSsdStoreTest, BadOptionsAreRejected) {
  TempDir dir;
  LocalSsdOptions o;
  o.capacity_pages = 4;
  EXPECT_EQ(LocalSsdStore::Create(o).status().code(), StatusCode::kInvalidArgument);
  o.path = dir.path() + "/x";
  o.capacity_pages = 0;
  EXPECT_EQ(LocalSsdStore::Create(o).status().code(), StatusCode::kInvalidArgument);
  o.capacity_pages = 4;
  o.queue_depth = 0;
  EXPECT_EQ(LocalSsdStore::Create(o).status().code(), StatusCode::kInvalidArgument);
  o.queue_depth = 5000;
  EXPECT_EQ(LocalSsdStore::Create(o).status().code(), StatusCode::kInvalidArgument);
  o.queue_depth = 8;
  o.path = dir.path() + "/no/such/dir/file";
  auto r = LocalSsdStore::Create(o);
  EXPECT_EQ(r.status().code(), StatusCode::kIoError);
  EXPECT_NE(r.status().message().find("no/such/dir"), std::string::npos) << r.status();
}

// More ops than the ring holds: the rest wait in the submission queue.
TEST(LocalSsdStoreTest, QueueDeeperThanRing) {
  TempDir dir;
  auto store = MakeStore(dir, 256, /*qd=*/2);
  ASSERT_NE(store, nullptr);
  RandomRounds(store.get(), 256, 0, 5, 4, 200);
}

// Several submitting threads, each on its own pages with many ops in flight.
TEST(LocalSsdStoreTest, ConcurrentSubmitters) {
  TempDir dir;
  constexpr int kThreads = 4;
  constexpr uint64_t kPagesPerThread = 64;
  auto store = MakeStore(dir, kThreads * kPagesPerThread, 32);
  ASSERT_NE(store, nullptr);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const uint64_t base = t * kPagesPerThread;
      Arena arena(kPagesPerThread, t);  // Thread 0 aligned, others unaligned.
      std::vector<PageOp> ops(kPagesPerThread);
      std::vector<PageOp*> ptrs(kPagesPerThread);
      for (int pass = 0; pass < 3; ++pass) {
        for (auto kind : {PageOp::Kind::kWrite, PageOp::Kind::kRead}) {
          BatchWaiter waiter;
          waiter.Expect(kPagesPerThread);
          for (uint64_t i = 0; i < kPagesPerThread; ++i) {
            ops[i] = PageOp();
            ops[i].kind = kind;
            ops[i].page = base + i;
            ops[i].buf = arena.page(i);
            ops[i].done = BatchWaiter::Done;
            ops[i].user = &waiter;
            if (kind == PageOp::Kind::kWrite) {
              FillPage(ops[i].buf, (base + i) * 10 + pass);
            } else {
              std::memset(ops[i].buf, 0, kPageSize);
            }
            ptrs[i] = &ops[i];
          }
          // Two halves, to mix batch sizes.
          std::span<PageOp* const> all(ptrs);
          if (!store->Submit(all.subspan(0, 10)).ok() || !store->Submit(all.subspan(10)).ok() ||
              !waiter.Wait()) {
            failures++;
            return;
          }
          std::vector<uint8_t> expect(kPageSize);
          for (uint64_t i = 0; i < kPagesPerThread; ++i) {
            if (!ops[i].status.ok()) failures++;
            if (kind == PageOp::Kind::kRead) {
              FillPage(expect.data(), (base + i) * 10 + pass);
              if (std::memcmp(expect.data(), ops[i].buf, kPageSize) != 0) failures++;
            }
          }
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  PageStoreStats s = store->Stats();
  EXPECT_EQ(s.reads, 3u * kThreads * kPagesPerThread);
  EXPECT_EQ(s.writes, 3u * kThreads * kPagesPerThread);
  EXPECT_EQ(s.bytes_sent, s.writes * kPageSize);
}

// Ops still queued when the store is destroyed are completed before the destructor returns.
TEST(LocalSsdStoreTest, DestructionCompletesAcceptedOps) {
  TempDir dir;
  auto store = MakeStore(dir, 64, 4);
  ASSERT_NE(store, nullptr);
  std::atomic<int> calls{0};
  std::vector<uint8_t> buf(64 * kPageSize, 3);
  std::vector<PageOp> ops(64);
  std::vector<PageOp*> ptrs(64);
  for (int i = 0; i < 64; ++i) {
    ops[i].kind = PageOp::Kind::kWrite;
    ops[i].page = i;
    ops[i].buf = buf.data() + i * kPageSize;
    ops[i].user = &calls;
    ops[i].done = [](PageOp* op) { static_cast<std::atomic<int>*>(op->user)->fetch_add(1); };
    ptrs[i] = &ops[i];
  }
  ASSERT_TRUE(store->Submit(ptrs).ok());
  store.reset();
  EXPECT_EQ(calls.load(), 64);
  for (auto& op : ops) EXPECT_TRUE(op.status.ok()) << op.status;
}

}  // namespace
}  // namespace tessera::client
