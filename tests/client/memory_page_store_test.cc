// The in-memory PageStore double's own injections (the PageStore contract itself is checked by
// the conformance suite, pagestore_conformance_test.cc, which runs against the double too).
#include "client/testing/memory_page_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "tests/support/status_matchers.h"

namespace tessera::client::testing {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::StatusIs;
using ::testing::HasSubstr;

// Records the order in which ops complete and the thread that completed them.
struct Recorder {
  std::mutex mu;
  std::vector<PageId> order;
  std::vector<std::thread::id> threads;
  std::atomic<size_t> done{0};
  static void Done(PageOp* op) {
    auto* r = static_cast<Recorder*>(op->user);
    {
      std::lock_guard<std::mutex> lock(r->mu);
      r->order.push_back(op->page);
      r->threads.push_back(std::this_thread::get_id());
    }
    r->done.fetch_add(1);
    r->done.notify_all();
  }
  void WaitFor(size_t n) {
    for (size_t d = done.load(); d < n; d = done.load()) done.wait(d);
  }
};

std::vector<PageOp> Reads(Recorder* rec, std::vector<uint8_t>* buf, size_t n) {
  buf->assign(n * kPageSize, 0);
  std::vector<PageOp> ops(n);
  for (size_t i = 0; i < n; ++i) {
    ops[i].kind = PageOp::Kind::kRead;
    ops[i].page = i;
    ops[i].buf = buf->data() + i * kPageSize;
    ops[i].done = Recorder::Done;
    ops[i].user = rec;
  }
  return ops;
}

std::vector<PageOp*> Ptrs(std::vector<PageOp>& ops) {
  std::vector<PageOp*> p;
  for (auto& op : ops) p.push_back(&op);
  return p;
}

TEST(MemoryPageStoreTest, HeldOpsCompleteInTheChosenOrderOnTheStoreThread) {
  MemoryPageStore store(16);
  Recorder rec;
  std::vector<uint8_t> buf;
  auto ops = Reads(&rec, &buf, 4);
  store.Hold();
  for (auto* op : Ptrs(ops)) ASSERT_THAT(store.Submit(std::span<PageOp* const>(&op, 1)), IsOk());
  ASSERT_TRUE(store.WaitHeld(4));
  EXPECT_EQ(rec.done.load(), 0u) << "a held op completed";
  store.Release(MemoryPageStore::ReleaseOrder::kReverse);
  rec.WaitFor(4);
  EXPECT_EQ(rec.order, (std::vector<PageId>{3, 2, 1, 0}));
  for (auto id : rec.threads) EXPECT_NE(id, std::this_thread::get_id());
}

TEST(MemoryPageStoreTest, ShuffledCompletionsAreAPermutation) {
  MemoryPageStore store(MemoryPageStoreOptions{.capacity_pages = 64, .shuffle_seed = 7});
  Recorder rec;
  std::vector<uint8_t> buf;
  auto ops = Reads(&rec, &buf, 64);
  store.Hold();  // One batch of 64, so the shuffle has something to reorder.
  ASSERT_THAT(store.Submit(Ptrs(ops)), IsOk());
  ASSERT_TRUE(store.WaitHeld(64));
  store.Release();
  rec.WaitFor(64);
  // Released ops keep their order; the next batch is shuffled.
  std::vector<PageId> in_order(64);
  for (size_t i = 0; i < 64; ++i) in_order[i] = i;
  EXPECT_EQ(rec.order, in_order);
  Recorder rec2;
  auto ops2 = Reads(&rec2, &buf, 64);
  // Completions may start before the whole batch is queued only if Submit were split: it is
  // one call, so the store thread sees all 64 at once.
  ASSERT_THAT(store.Submit(Ptrs(ops2)), IsOk());
  rec2.WaitFor(64);
  std::vector<PageId> sorted = rec2.order;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, in_order);
  EXPECT_NE(rec2.order, in_order) << "64 ops completed in submission order despite the shuffle";
}

TEST(MemoryPageStoreTest, HeldWritesAreNotStoredUntilReleased) {
  MemoryPageStore store(8);
  std::vector<uint8_t> a(kPageSize, 'a'), out(kPageSize);
  ASSERT_THAT(store.WritePage(1, a.data()), IsOk());
  store.Hold(MemoryPageStore::HoldKind::kWrites);
  std::vector<uint8_t> b(kPageSize, 'b');
  std::atomic<bool> done{false};
  PageOp w;
  w.kind = PageOp::Kind::kWrite;
  w.page = 1;
  w.buf = b.data();
  w.user = &done;
  w.done = [](PageOp* op) {
    static_cast<std::atomic<bool>*>(op->user)->store(true);
    static_cast<std::atomic<bool>*>(op->user)->notify_all();
  };
  PageOp* ptr = &w;
  ASSERT_THAT(store.Submit(std::span<PageOp* const>(&ptr, 1)), IsOk());
  ASSERT_TRUE(store.WaitHeld(1));
  // Reads still complete while a write is held, and see the old bytes.
  ASSERT_THAT(store.ReadPage(1, out.data()), IsOk());
  EXPECT_EQ(out, a);
  EXPECT_FALSE(done.load());
  store.Release();
  done.wait(false);
  EXPECT_THAT(w.status, IsOk());
  EXPECT_EQ(store.Page(1), b);
  EXPECT_EQ(store.writes_of(1), 2u);
}

TEST(MemoryPageStoreTest, InjectedFailures) {
  MemoryPageStore store(MemoryPageStoreOptions{.capacity_pages = 8, .name = "m"});
  std::vector<uint8_t> a(kPageSize, 'a'), out(kPageSize);
  ASSERT_THAT(store.WritePage(2, a.data()), IsOk());
  // A lost page reads as DataLoss naming it until it is written again.
  store.LosePage(2);
  EXPECT_THAT(store.ReadPage(2, out.data()), StatusIs(StatusCode::kDataLoss, HasSubstr("page 2")));
  ASSERT_THAT(store.WritePage(2, a.data()), IsOk());
  EXPECT_THAT(store.ReadPage(2, out.data()), IsOk());
  // FailReads sticks across writes until HealReads.
  store.FailReads(2);
  ASSERT_THAT(store.WritePage(2, a.data()), IsOk());
  EXPECT_THAT(store.ReadPage(2, out.data()), StatusIs(StatusCode::kDataLoss));
  store.HealReads(2);
  EXPECT_THAT(store.ReadPage(2, out.data()), IsOk());
  // A failed write stores nothing.
  store.FailWritesWith(IoError("disk gone"));
  std::vector<uint8_t> b(kPageSize, 'b');
  EXPECT_THAT(store.WritePage(2, b.data()), StatusIs(StatusCode::kIoError));
  EXPECT_EQ(store.Page(2), a);
  store.FailWritesWith(Status::Ok());
  // The next n ops of any kind fail, then the store works again.
  store.FailNextOps(2, Unavailable("server died"));
  EXPECT_THAT(store.ReadPage(2, out.data()),
              StatusIs(StatusCode::kUnavailable, HasSubstr("page 2")));
  EXPECT_THAT(store.WritePage(3, b.data()), StatusIs(StatusCode::kUnavailable));
  EXPECT_THAT(store.WritePage(3, b.data()), IsOk());
  // Rejected submissions run no callback.
  store.RejectSubmits(Unavailable("shut"));
  EXPECT_THAT(store.ReadPage(3, out.data()), StatusIs(StatusCode::kUnavailable, HasSubstr("shut")));
  store.RejectSubmits(Status::Ok());
  store.FailFlushWith(IoError("fsync"));
  EXPECT_THAT(store.Flush(), StatusIs(StatusCode::kIoError));
  store.FailFlushWith(Status::Ok());
  EXPECT_THAT(store.Flush(), IsOk());
  EXPECT_EQ(store.flushes(), 2u);
  PageStoreStats s = store.Stats();
  EXPECT_EQ(s.data_loss, 2u);
  EXPECT_EQ(s.read_errors, 3u);
  EXPECT_EQ(s.write_errors, 2u);
  EXPECT_EQ(store.writes_stored(), 4u);
}

TEST(MemoryPageStoreTest, LatencyDelaysCompletions) {
  MemoryPageStore store(4, /*latency_us=*/20000);
  std::vector<uint8_t> out(kPageSize);
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_THAT(store.ReadPage(0, out.data()), IsOk());
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(20));
  EXPECT_GE(store.Stats().read_latency.p50(), 20'000'000u);
}

// Destroying the store completes ops it still holds (each accepted op completes once).
TEST(MemoryPageStoreTest, DestructionCompletesHeldOps) {
  Recorder rec;
  std::vector<uint8_t> buf;
  auto ops = Reads(&rec, &buf, 3);
  {
    MemoryPageStore store(8);
    store.Hold();
    ASSERT_THAT(store.Submit(Ptrs(ops)), IsOk());
    ASSERT_TRUE(store.WaitHeld(3));
  }
  EXPECT_EQ(rec.done.load(), 3u);
}

}  // namespace
}  // namespace tessera::client::testing
