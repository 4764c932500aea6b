// DiskBackedStore (single copy + asynchronous disk backup): reads fall back to the disk copy when
// the primary loses a page, never to a stale one. The primary is the in-memory store double
// (client/testing/memory_page_store.h) losing pages; the backup is either a double holding or
// failing writes, or a real LocalSsdStore.
#include "client/disk_backed_store.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "client/local_ssd_store.h"
#include "client/testing/memory_page_store.h"
#include "common/clock.h"
#include "tests/support/test_util.h"

namespace tessera::client {
namespace {

using tessera::testing::TempDir;

using testing::MemoryPageStore;
using testing::MemoryPageStoreOptions;
using HoldKind = MemoryPageStore::HoldKind;

// The in-memory asynchronous store double (client/testing), named for its role.
std::unique_ptr<MemoryPageStore> Fake(uint64_t capacity, std::string name = "fake") {
  return std::make_unique<MemoryPageStore>(
      MemoryPageStoreOptions{.capacity_pages = capacity, .name = std::move(name)});
}

std::vector<uint8_t> Pattern(uint64_t seed) {
  std::vector<uint8_t> v(kPageSize);
  std::mt19937_64 rng(seed);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

struct Fixture {
  explicit Fixture(uint64_t pages) {
    auto p = Fake(pages, "primary");
    auto b = Fake(pages, "backup");
    primary = p.get();
    backup = b.get();
    auto r = DiskBackedStore::Create(std::move(p), std::move(b));
    EXPECT_TRUE(r.ok()) << r.status();
    store = std::move(r).value();
  }
  ~Fixture() {
    EXPECT_EQ(primary->held(), 0u) << "test ends with held primary writes";
    EXPECT_EQ(backup->held(), 0u) << "test ends with held backup writes";
  }
  MemoryPageStore* primary;
  MemoryPageStore* backup;
  std::unique_ptr<DiskBackedStore> store;
};

TEST(DiskBackedStoreTest, ReadsFallBackToDiskWhenPrimaryLosesPages) {
  Fixture f(64);
  for (PageId p = 0; p < 64; ++p) ASSERT_TRUE(f.store->WritePage(p, Pattern(p).data()).ok());
  ASSERT_TRUE(f.store->Flush().ok());
  EXPECT_EQ(f.store->backup_pending(), 0u);
  for (PageId p = 0; p < 64; p += 3) f.primary->LosePage(p);
  std::vector<uint8_t> out(kPageSize);
  for (PageId p = 0; p < 64; ++p) {
    ASSERT_TRUE(f.store->ReadPage(p, out.data()).ok()) << "page " << p;
    EXPECT_EQ(out, Pattern(p)) << "page " << p;
  }
  EXPECT_EQ(f.store->fallback_reads(), 22u);
  PageStoreStats s = f.store->Stats();
  EXPECT_EQ(s.degraded_reads, 22u);
  EXPECT_EQ(s.reads, 64u);
  EXPECT_EQ(s.writes, 64u);
  EXPECT_EQ(s.read_errors, 0u);
  EXPECT_EQ(s.bytes_sent, 2u * 64 * kPageSize);  // Primary + backup.
  EXPECT_EQ(f.store->memory_overhead(), 2.0);
  EXPECT_EQ(f.store->name(), "disk-backed(primary + backup)");
}

// The backup lags: a page whose newest acknowledged write is not yet on disk is never served
// from the older disk copy.
TEST(DiskBackedStoreTest, NeverReturnsAStaleDiskCopy) {
  Fixture f(8);
  ASSERT_TRUE(f.store->WritePage(3, Pattern(1).data()).ok());
  ASSERT_TRUE(f.store->Flush().ok());  // Disk holds version 1.
  f.backup->Hold(HoldKind::kWrites);
  ASSERT_TRUE(f.store->WritePage(3, Pattern(2).data()).ok());  // Acked, backup held.
  EXPECT_EQ(f.store->backup_pending(), 1u);
  f.primary->LosePage(3);
  std::vector<uint8_t> out(kPageSize);
  Status st = f.store->ReadPage(3, out.data());
  EXPECT_EQ(st.code(), StatusCode::kDataLoss) << st;
  EXPECT_NE(st.message().find("disk backup of page 3 is behind"), std::string::npos) << st;
  EXPECT_EQ(f.store->stale_refusals(), 1u);
  EXPECT_EQ(f.store->Stats().data_loss, 1u);
  f.backup->Release();
  ASSERT_TRUE(f.store->Flush().ok());
  ASSERT_TRUE(f.store->ReadPage(3, out.data()).ok());
  EXPECT_EQ(out, Pattern(2));
  EXPECT_EQ(f.store->fallback_reads(), 1u);
}

// Rewrites while a backup write is in flight: one waits, newer ones replace it, and the disk
// ends with the last acknowledged content.
TEST(DiskBackedStoreTest, BackupWritesOfAPageAreSerialisedAndCoalesced) {
  Fixture f(4);
  f.backup->Hold(HoldKind::kWrites);
  for (uint64_t v = 1; v <= 10; ++v) ASSERT_TRUE(f.store->WritePage(2, Pattern(v).data()).ok());
  // The first backup write is posted just after its ack; wait (bounded) until it is held.
  Deadline deadline = Deadline::AfterMs(10000);
  while (f.backup->held() == 0 && !deadline.Expired()) std::this_thread::yield();
  EXPECT_EQ(f.backup->held(), 1u);       // Only the first is in flight ...
  EXPECT_EQ(f.store->backup_pending(), 2u);  // ... and the newest is queued behind it.
  f.primary->LosePage(2);
  std::vector<uint8_t> out(kPageSize);
  EXPECT_EQ(f.store->ReadPage(2, out.data()).code(), StatusCode::kDataLoss);
  f.backup->Release();
  ASSERT_TRUE(f.store->Flush().ok());
  EXPECT_EQ(f.backup->writes_of(2), 2u);
  ASSERT_TRUE(f.store->ReadPage(2, out.data()).ok());
  EXPECT_EQ(out, Pattern(10));
}

TEST(DiskBackedStoreTest, NeverWrittenAndTrimmedPagesFallBackToZeros) {
  Fixture f(16);
  std::vector<uint8_t> zeros(kPageSize, 0), out(kPageSize, 1);
  f.primary->LosePage(5);
  ASSERT_TRUE(f.store->ReadPage(5, out.data()).ok());
  EXPECT_EQ(out, zeros);
  ASSERT_TRUE(f.store->WritePage(7, Pattern(7).data()).ok());
  ASSERT_TRUE(f.store->Trim(6, 3).ok());
  f.primary->LosePage(7);
  ASSERT_TRUE(f.store->ReadPage(7, out.data()).ok());
  EXPECT_EQ(out, zeros);
  EXPECT_EQ(f.store->Trim(15, 2).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(f.store->Stats().trims, 3u);
}

TEST(DiskBackedStoreTest, FailedBackupWriteIsReportedAndNeverUsed) {
  Fixture f(4);
  ASSERT_TRUE(f.store->WritePage(1, Pattern(1).data()).ok());
  ASSERT_TRUE(f.store->Flush().ok());
  f.backup->FailWritesWith(IoError("backup: write failed (injected)"));
  ASSERT_TRUE(f.store->WritePage(1, Pattern(2).data()).ok());
  Status flush = f.store->Flush();
  EXPECT_EQ(flush.code(), StatusCode::kIoError) << flush;
  EXPECT_NE(flush.message().find("backup write of page 1"), std::string::npos) << flush;
  EXPECT_TRUE(f.store->Flush().ok());  // Reported once.
  f.primary->LosePage(1);
  std::vector<uint8_t> out(kPageSize);
  EXPECT_EQ(f.store->ReadPage(1, out.data()).code(), StatusCode::kDataLoss);
  f.backup->FailWritesWith(Status::Ok());
  ASSERT_TRUE(f.store->WritePage(1, Pattern(3).data()).ok());
  ASSERT_TRUE(f.store->Flush().ok());
  f.primary->LosePage(1);
  ASSERT_TRUE(f.store->ReadPage(1, out.data()).ok());
  EXPECT_EQ(out, Pattern(3));
}

// The primary cannot store a write (its server is gone): the write goes through to disk, is
// acknowledged from there, and reads use the disk copy, not the primary's older bytes.
TEST(DiskBackedStoreTest, WritesThePrimaryCannotStoreGoThroughToDisk) {
  Fixture f(8);
  ASSERT_TRUE(f.store->WritePage(4, Pattern(1).data()).ok());
  ASSERT_TRUE(f.store->Flush().ok());
  f.primary->FailWritesWith(Unavailable("server of page 4 failed"));
  f.backup->Hold(HoldKind::kWrites);
  std::atomic<bool> done{false};
  std::vector<uint8_t> v2 = Pattern(2);
  PageOp op;
  op.kind = PageOp::Kind::kWrite;
  op.page = 4;
  op.buf = v2.data();
  op.user = &done;
  op.done = [](PageOp* o) {
    auto* d = static_cast<std::atomic<bool>*>(o->user);
    d->store(true);
    d->notify_all();
  };
  PageOp* ptr = &op;
  ASSERT_TRUE(f.store->Submit(std::span<PageOp* const>(&ptr, 1)).ok());
  // Not acknowledged while the disk write is held: its only copy is not stored yet.
  Deadline deadline = Deadline::AfterMs(10000);
  while (f.backup->held() == 0 && !deadline.Expired()) std::this_thread::yield();
  ASSERT_EQ(f.backup->held(), 1u) << "the write never reached the disk backup within 10 s";
  EXPECT_FALSE(done.load());
  f.backup->Release();
  done.wait(false);
  ASSERT_TRUE(op.status.ok()) << op.status;
  EXPECT_EQ(f.store->written_through(), 1u);
  std::vector<uint8_t> out(kPageSize);
  ASSERT_TRUE(f.store->ReadPage(4, out.data()).ok());
  EXPECT_EQ(out, Pattern(2));  // The primary still answers with version 1: not used.
  // The primary is back: a write it stores makes it current again.
  f.primary->FailWritesWith(Status::Ok());
  ASSERT_TRUE(f.store->WritePage(4, Pattern(3).data()).ok());
  uint64_t fallbacks = f.store->fallback_reads();
  ASSERT_TRUE(f.store->ReadPage(4, out.data()).ok());
  EXPECT_EQ(out, Pattern(3));
  EXPECT_EQ(f.store->fallback_reads(), fallbacks);
  // That write's disk copy is made in the background after the primary acknowledged it: let it
  // finish before the disk is made to fail, or it fails too and the last Flush reports it.
  ASSERT_TRUE(f.store->Flush().ok());
  // Both fail: the write fails, naming both causes, and nothing older is served as newer.
  f.primary->FailWritesWith(Unavailable("server of page 4 failed"));
  f.backup->FailWritesWith(IoError("backup: write failed (injected)"));
  Status st = f.store->WritePage(4, Pattern(4).data());
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st;
  EXPECT_NE(st.message().find("disk write failed too"), std::string::npos) << st;
  ASSERT_TRUE(f.store->ReadPage(4, out.data()).ok());
  EXPECT_EQ(out, Pattern(3));
  f.backup->FailWritesWith(Status::Ok());
  ASSERT_TRUE(f.store->Flush().ok());
}

TEST(DiskBackedStoreTest, OtherPrimaryErrorsPassThrough) {
  Fixture f(4);
  ASSERT_TRUE(f.store->WritePage(0, Pattern(0).data()).ok());
  ASSERT_TRUE(f.store->Flush().ok());
  f.primary->FailReadsWith(PermissionDenied("not yours"));
  std::vector<uint8_t> out(kPageSize);
  EXPECT_EQ(f.store->ReadPage(0, out.data()).code(), StatusCode::kPermissionDenied);
  f.primary->FailReadsWith(Status::Ok());
  EXPECT_EQ(f.store->ReadPage(9, out.data()).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(f.store->WritePage(9, out.data()).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(f.store->fallback_reads(), 0u);
  // A primary that rejects a batch: the batch is rejected whole, no callback runs.
  f.primary->RejectSubmits(Unavailable("primary rejects submissions"));
  EXPECT_EQ(f.store->WritePage(0, out.data()).code(), StatusCode::kUnavailable);
  f.primary->RejectSubmits(Status::Ok());
  PageOp op;
  PageOp* ptr = &op;
  EXPECT_EQ(f.store->Submit(std::span<PageOp* const>(&ptr, 1)).code(),
            StatusCode::kInvalidArgument);
}

TEST(DiskBackedStoreTest, BackupSmallerThanPrimaryIsRejected) {
  auto r = DiskBackedStore::Create(Fake(8), Fake(4));
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(DiskBackedStore::Create(nullptr, Fake(4)).status().code(),
            StatusCode::kInvalidArgument);
}

// A real LocalSsdStore as the backup; several threads write and read with many ops in flight,
// then the primary loses every page and everything reads back from disk.
TEST(DiskBackedStoreTest, ConcurrentLoadOverRealLocalSsdBackup) {
  TempDir dir;
  constexpr int kThreads = 4;
  constexpr uint64_t kPer = 48;
  LocalSsdOptions o;
  o.path = dir.path() + "/backup.bin";
  o.capacity_pages = kThreads * kPer;
  auto ssd = LocalSsdStore::Create(o);
  ASSERT_TRUE(ssd.ok()) << ssd.status();
  auto p = Fake(kThreads * kPer, "primary");
  MemoryPageStore* primary = p.get();
  auto r = DiskBackedStore::Create(std::move(p), std::move(ssd).value());
  ASSERT_TRUE(r.ok()) << r.status();
  std::unique_ptr<DiskBackedStore> store = std::move(r).value();
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<PageId> ids(kPer);
      for (uint64_t i = 0; i < kPer; ++i) ids[i] = t * kPer + i;
      for (int round = 0; round < 4; ++round) {
        std::vector<uint8_t> in(kPer * kPageSize + 1), out(kPer * kPageSize + 1);
        for (uint64_t i = 0; i < kPer; ++i) {
          auto pat = Pattern(ids[i] * 100 + round);
          std::memcpy(in.data() + 1 + i * kPageSize, pat.data(), kPageSize);
        }
        if (!store->WritePages(ids.data(), kPer, in.data() + 1).ok()) failures++;
        if (!store->ReadPages(ids.data(), kPer, out.data() + 1).ok()) failures++;
        if (std::memcmp(in.data() + 1, out.data() + 1, kPer * kPageSize) != 0) failures++;
      }
    });
  }
  for (auto& th : threads) th.join();
  ASSERT_EQ(failures.load(), 0);
  ASSERT_TRUE(store->Flush().ok());
  for (PageId pg = 0; pg < kThreads * kPer; ++pg) primary->LosePage(pg);
  std::vector<uint8_t> out(kPageSize);
  for (PageId pg = 0; pg < kThreads * kPer; ++pg) {
    ASSERT_TRUE(store->ReadPage(pg, out.data()).ok()) << "page " << pg;
    ASSERT_EQ(out, Pattern(pg * 100 + 3)) << "page " << pg;
  }
  EXPECT_EQ(store->fallback_reads(), kThreads * kPer);
  EXPECT_NE(store->name().find("local-ssd"), std::string::npos);
}

}  // namespace
}  // namespace tessera::client
