// The PageStore conformance suite: one set of tests of the contract in client/page_store.h, run
// against every store through a factory (value-parameterised, the way the transport conformance
// suite runs against every transport):
//   memory       the in-memory double (client/testing/memory_page_store.h), completions shuffled
//   local_ssd    LocalSsdStore on a file in a temporary directory
//   disk_backed  DiskBackedStore: single copy on memservers + a LocalSsdStore backup
//   single       one remote copy          rep2      two remote copies
//   ec_split     RS(4,2), split layout    ec_group  RS(4,2), group layout
//   ec_group_inplace  the group layout with in-place parity-update compaction
// The remote stores run on 6 real `tessera memserver` processes on loopback (LocalCluster),
// started once per test process, only for a remote store.
//
// What every store must do: read back the last acknowledged write (single ops, batches, any
// buffer alignment); read never-written and trimmed pages as zeros; fail a bad page id with
// OutOfRange for that op alone, touching no other page; reject a malformed batch whole (no op
// run, no callback); complete each accepted op exactly once, never inside Submit(); keep a
// read from ever returning torn or stale bytes while the page is rewritten; let Flush() cover
// every acknowledged write; move its stats counters; refuse impossible sizes with a clear error;
// and complete every accepted op when destroyed with ops in flight, after which a new store on
// the same backing works.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "client/disk_backed_store.h"
#include "client/local_cluster.h"
#include "client/local_ssd_store.h"
#include "client/page_store.h"
#include "client/remote_store.h"
#include "client/testing/memory_page_store.h"
#include "common/clock.h"
#include "tests/support/status_matchers.h"
#include "tests/support/test_util.h"

namespace tessera::client {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::StatusIs;
using ::testing::HasSubstr;

constexpr uint64_t kPages = 512;
constexpr int kWaitMs = 30000;

// ------------------------------------------------------------------ page contents
// A page holds (page, version) in its first 16 bytes and a hash-derived body, so a read can be
// decoded: which page and version it holds, and whether it is whole (not torn).
void Fill(PageId page, uint64_t version, uint8_t* out) {
  std::memcpy(out, &page, 8);
  std::memcpy(out + 8, &version, 8);
  uint64_t x = page * 0x9E3779B97F4A7C15ull + version * 0xC2B2AE3D27D4EB4Full + 7;
  for (size_t i = 16; i < kPageSize; i += 8) {
    x ^= x >> 29;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 32;
    std::memcpy(out + i, &x, 8);
  }
}

std::vector<uint8_t> Page(PageId page, uint64_t version) {
  std::vector<uint8_t> v(kPageSize);
  Fill(page, version, v.data());
  return v;
}

bool IsZero(const uint8_t* p) {
  return std::all_of(p, p + kPageSize, [](uint8_t b) { return b == 0; });
}

// The version a page holds: 0 for zeros, -1 when it is neither zeros nor a whole page `page`.
int64_t VersionOf(PageId page, const uint8_t* got) {
  if (IsZero(got)) return 0;
  uint64_t p, v;
  std::memcpy(&p, got, 8);
  std::memcpy(&v, got + 8, 8);
  if (p != page) return -1;
  uint8_t want[kPageSize];
  Fill(page, v, want);
  return std::memcmp(want, got, kPageSize) == 0 ? static_cast<int64_t>(v) : -1;
}

// ------------------------------------------------------------------ stores
// Lives as long as one test: what the stores of that test share (the SSD file's directory), so
// a store can be closed and a new one opened on the same backing.
struct Backing {
  ::tessera::testing::TempDir dir;
};

LocalCluster* SharedCluster() {
  static std::unique_ptr<LocalCluster> cluster = [] {
    LocalClusterOptions o;
    o.bin_dir = ::tessera::testing::BinDir();
    o.servers = 6;
    o.capacity = "16M";
    o.slab_size = "64K";  // 16 pages per slab: the test's pages span many slabs and servers.
    auto c = LocalCluster::Start(o);
    EXPECT_THAT(c, IsOk());
    return c.ok() ? std::move(c).value() : nullptr;
  }();
  return cluster.get();
}

RemoteStoreOptions Remote(uint64_t pages) {
  RemoteStoreOptions o;
  LocalCluster* c = SharedCluster();
  if (c == nullptr) return o;  // No servers: Create fails with a clear error.
  for (const auto& e : c->endpoints()) o.servers.push_back(RemoteServer{e, ""});
  o.secret = c->secret();
  o.transport = fabric::TransportKind::kTcp;
  o.capacity_pages = pages;
  return o;
}

Result<std::unique_ptr<PageStore>> MakeSsd(Backing& b, uint64_t pages) {
  LocalSsdOptions o;
  o.path = b.dir.path() + "/pages.bin";
  o.capacity_pages = pages;
  TESSERA_ASSIGN_OR_RETURN(auto s, LocalSsdStore::Create(o));
  return std::unique_ptr<PageStore>(std::move(s));
}

Result<std::unique_ptr<PageStore>> MakeCopies(uint64_t pages, int copies) {
  ReplicatedStoreOptions o;
  o.remote = Remote(pages);
  o.copies = copies;
  TESSERA_ASSIGN_OR_RETURN(auto s, CreateReplicatedStore(o));
  return std::unique_ptr<PageStore>(std::move(s));
}

Result<std::unique_ptr<PageStore>> MakeEc(uint64_t pages, EcLayout layout,
                                          GroupCompaction compaction = GroupOptions{}.compaction) {
  ErasureCodedStoreOptions o;
  o.remote = Remote(pages);
  o.k = 4;
  o.r = 2;
  o.layout = layout;
  o.group.compaction = compaction;
  TESSERA_ASSIGN_OR_RETURN(auto s, CreateErasureCodedStore(o));
  return std::unique_ptr<PageStore>(std::move(s));
}

struct StoreKind {
  std::string name;
  // Makes a store of `pages` pages on `backing` (a second call: a store on the same backing).
  std::function<Result<std::unique_ptr<PageStore>>(Backing&, uint64_t pages)> make;
  // After Flush(): checks what "every acknowledged write has its full resilience" means for
  // this store, given the number of distinct pages written since it was made.
  std::function<void(PageStore&, uint64_t live_pages)> check_flushed;
};

const std::vector<StoreKind>& Kinds() {
  static const std::vector<StoreKind> kinds = {
      {"memory",
       [](Backing&, uint64_t pages) -> Result<std::unique_ptr<PageStore>> {
         TESSERA_ASSIGN_OR_RETURN(auto s, testing::MemoryPageStore::Create(
                                              {.capacity_pages = pages, .shuffle_seed = 3}));
         return std::unique_ptr<PageStore>(std::move(s));
       },
       nullptr},
      {"local_ssd", MakeSsd, nullptr},
      {"disk_backed",
       [](Backing& b, uint64_t pages) -> Result<std::unique_ptr<PageStore>> {
         TESSERA_ASSIGN_OR_RETURN(auto primary, MakeCopies(pages, 1));
         TESSERA_ASSIGN_OR_RETURN(auto backup, MakeSsd(b, pages));
         TESSERA_ASSIGN_OR_RETURN(auto s,
                                  DiskBackedStore::Create(std::move(primary), std::move(backup)));
         return std::unique_ptr<PageStore>(std::move(s));
       },
       [](PageStore& s, uint64_t) {
         // Every acknowledged write is on disk as well as in remote memory.
         EXPECT_EQ(static_cast<DiskBackedStore&>(s).backup_pending(), 0u);
       }},
      {"single", [](Backing&, uint64_t pages) { return MakeCopies(pages, 1); }, nullptr},
      {"rep2", [](Backing&, uint64_t pages) { return MakeCopies(pages, 2); }, nullptr},
      {"ec_split", [](Backing&, uint64_t pages) { return MakeEc(pages, EcLayout::kSplit); },
       nullptr},
      {"ec_group", [](Backing&, uint64_t pages) { return MakeEc(pages, EcLayout::kGroup); },
       [](PageStore& s, uint64_t live_pages) {
         // No write is left in a stripe buffer: every live page is in a sealed stripe, whose
         // k+r members were all written.
         EXPECT_EQ(s.Stats().stored_pages, live_pages);
       }},
      {"ec_group_inplace",  // The other compaction: garbage reused by in-place parity updates.
       [](Backing&, uint64_t pages) {
         return MakeEc(pages, EcLayout::kGroup, GroupCompaction::kInPlace);
       },
       [](PageStore& s, uint64_t live_pages) { EXPECT_EQ(s.Stats().stored_pages, live_pages); }},
  };
  return kinds;
}

// ------------------------------------------------------------------ async helpers
thread_local bool t_inside_submit = false;

// A batch of ops submitted together; counts completions and catches any completed twice or
// from inside Submit().
struct Batch {
  std::vector<PageOp> ops;
  std::vector<std::atomic<int>> calls;
  std::atomic<size_t> done{0};
  std::atomic<int> inside_submit{0};

  Batch(PageOp::Kind kind, const std::vector<PageId>& pages, uint8_t* bufs)
      : ops(pages.size()), calls(pages.size()) {
    for (size_t i = 0; i < pages.size(); ++i) {
      ops[i].kind = kind;
      ops[i].page = pages[i];
      ops[i].buf = bufs + i * kPageSize;
      ops[i].done = &Batch::Done;
      ops[i].user = this;
      calls[i].store(0);
    }
  }
  static void Done(PageOp* op) {
    auto* b = static_cast<Batch*>(op->user);
    if (t_inside_submit) b->inside_submit.fetch_add(1);
    b->calls[op - b->ops.data()].fetch_add(1);
    if (b->done.fetch_add(1) + 1 == b->ops.size()) b->done.notify_all();
  }
  Status Submit(PageStore& s) {
    std::vector<PageOp*> ptrs;
    for (auto& op : ops) ptrs.push_back(&op);
    t_inside_submit = true;
    Status st = s.Submit(ptrs);
    t_inside_submit = false;
    return st;
  }
  // Bounded wait for every op; false on timeout.
  bool Wait() {
    const Deadline d = Deadline::AfterMs(kWaitMs);
    for (size_t n = done.load(); n < ops.size(); n = done.load()) {
      if (d.Expired()) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return true;
  }
  void ExpectEachCompletedOnce() {
    for (size_t i = 0; i < ops.size(); ++i) {
      EXPECT_EQ(calls[i].load(), 1) << "op " << i << " (page " << ops[i].page << ")";
    }
    EXPECT_EQ(inside_submit.load(), 0) << "done() ran inside Submit()";
  }
};

// Writes pages [first, first + n) at `version` through the blocking batch call, with buffers
// off by one byte from any alignment.
Status WriteRange(PageStore& s, PageId first, uint64_t n, uint64_t version) {
  std::vector<uint8_t> raw(n * kPageSize + 1);
  std::vector<PageId> ids(n);
  for (uint64_t i = 0; i < n; ++i) {
    ids[i] = first + i;
    Fill(first + i, version, raw.data() + 1 + i * kPageSize);
  }
  return s.WritePages(ids.data(), n, raw.data() + 1);
}

// Reads pages [first, first + n) and checks each holds version versions[i] (0: zeros).
void ExpectRange(PageStore& s, PageId first, const std::vector<uint64_t>& versions) {
  const uint64_t n = versions.size();
  std::vector<uint8_t> raw(n * kPageSize + 3, 0xAB);
  std::vector<PageId> ids(n);
  for (uint64_t i = 0; i < n; ++i) ids[i] = first + i;
  ASSERT_THAT(s.ReadPages(ids.data(), n, raw.data() + 3), IsOk());
  for (uint64_t i = 0; i < n; ++i) {
    ASSERT_EQ(VersionOf(first + i, raw.data() + 3 + i * kPageSize),
              static_cast<int64_t>(versions[i]))
        << "page " << first + i;
  }
}

// ------------------------------------------------------------------ the suite
class PageStoreConformance : public ::testing::TestWithParam<size_t> {
 protected:
  void SetUp() override {
    store_ = Open(kPages);
    ASSERT_NE(store_, nullptr);
  }
  void TearDown() override { store_.reset(); }

  const StoreKind& kind() const { return Kinds()[GetParam()]; }
  std::unique_ptr<PageStore> Open(uint64_t pages) {
    auto s = kind().make(backing_, pages);
    EXPECT_THAT(s, IsOk()) << kind().name;
    return s.ok() ? std::move(s).value() : nullptr;
  }

  Backing backing_;
  std::unique_ptr<PageStore> store_;
};

TEST_P(PageStoreConformance, NeverWrittenPagesReadAsZeros) {
  EXPECT_EQ(store_->capacity_pages(), kPages);
  EXPECT_FALSE(store_->name().empty());
  EXPECT_GE(store_->memory_overhead(), 1.0);
  std::vector<uint8_t> buf(kPageSize, 0xAB);
  for (PageId p : {PageId{0}, PageId{1}, kPages / 2, kPages - 1}) {
    std::fill(buf.begin(), buf.end(), 0xAB);
    ASSERT_THAT(store_->ReadPage(p, buf.data()), IsOk()) << "page " << p;
    EXPECT_TRUE(IsZero(buf.data())) << "page " << p;
  }
  ExpectRange(*store_, 100, std::vector<uint64_t>(64, 0));
}

TEST_P(PageStoreConformance, ReadsTheLastWriteSingleAndBatched) {
  // Single pages, aligned and not.
  std::vector<uint8_t> raw(kPageSize + 5), out(kPageSize + 5);
  for (PageId p : {PageId{0}, PageId{17}, kPages - 1}) {
    Fill(p, 1, raw.data() + 5);
    ASSERT_THAT(store_->WritePage(p, raw.data() + 5), IsOk()) << "page " << p;
    ASSERT_THAT(store_->ReadPage(p, out.data() + 1), IsOk()) << "page " << p;
    EXPECT_EQ(VersionOf(p, out.data() + 1), 1) << "page " << p;
  }
  // A batch over many slabs and servers, read back as one batch and page by page.
  ASSERT_THAT(WriteRange(*store_, 32, 300, 2), IsOk());
  ExpectRange(*store_, 32, std::vector<uint64_t>(300, 2));
  for (PageId p = 32; p < 332; p += 37) {
    ASSERT_THAT(store_->ReadPage(p, out.data()), IsOk());
    EXPECT_EQ(VersionOf(p, out.data()), 2) << "page " << p;
  }
  // Neighbours of what was written stay zeros.
  ExpectRange(*store_, 332, std::vector<uint64_t>(8, 0));
}

TEST_P(PageStoreConformance, OverwritesReturnTheLastAcknowledgedVersion) {
  std::vector<uint64_t> versions(kPages, 0);
  std::mt19937_64 rng(11);
  for (uint64_t round = 1; round <= 6; ++round) {
    // Whole range, then a random subset page by page (garbage for log-structured layouts).
    if (round % 3 == 1) {
      ASSERT_THAT(WriteRange(*store_, 0, kPages, round), IsOk());
      std::fill(versions.begin(), versions.end(), round);
    }
    for (int i = 0; i < 96; ++i) {
      const PageId p = rng() % kPages;
      std::vector<uint8_t> b = Page(p, round * 1000 + i);
      ASSERT_THAT(store_->WritePage(p, b.data()), IsOk()) << "page " << p;
      versions[p] = round * 1000 + i;
    }
  }
  ExpectRange(*store_, 0, versions);
}

TEST_P(PageStoreConformance, AsyncBatchesCompleteEachOpOnceAndNeverInsideSubmit) {
  constexpr size_t kN = 200;
  std::vector<PageId> pages(kN);
  for (size_t i = 0; i < kN; ++i) pages[i] = (i * 7) % kPages;  // Distinct: 7 is prime to 512.
  std::vector<uint8_t> in(kN * kPageSize), out(kN * kPageSize, 0xCD);
  for (size_t i = 0; i < kN; ++i) Fill(pages[i], 3, in.data() + i * kPageSize);
  Batch w(PageOp::Kind::kWrite, pages, in.data());
  ASSERT_THAT(w.Submit(*store_), IsOk());
  ASSERT_TRUE(w.Wait()) << "writes not all completed within " << kWaitMs << " ms";
  w.ExpectEachCompletedOnce();
  for (auto& op : w.ops) ASSERT_THAT(op.status, IsOk()) << "page " << op.page;
  Batch r(PageOp::Kind::kRead, pages, out.data());
  ASSERT_THAT(r.Submit(*store_), IsOk());
  ASSERT_TRUE(r.Wait()) << "reads not all completed within " << kWaitMs << " ms";
  r.ExpectEachCompletedOnce();
  for (size_t i = 0; i < kN; ++i) {
    ASSERT_THAT(r.ops[i].status, IsOk()) << "page " << pages[i];
    EXPECT_EQ(VersionOf(pages[i], out.data() + i * kPageSize), 3) << "page " << pages[i];
  }
  // An empty batch is accepted and completes nothing.
  EXPECT_THAT(store_->Submit(std::span<PageOp* const>()), IsOk());
}

TEST_P(PageStoreConformance, TrimReadsZerosAndSparesTheRest) {
  ASSERT_THAT(WriteRange(*store_, 0, 256, 1), IsOk());
  const uint64_t trims_before = store_->Stats().trims;
  ASSERT_THAT(store_->Trim(40, 100), IsOk());
  std::vector<uint64_t> want(256, 1);
  for (size_t p = 40; p < 140; ++p) want[p] = 0;
  ExpectRange(*store_, 0, want);
  EXPECT_GE(store_->Stats().trims, trims_before + 100);
  // A whole range trimmed (so remote slabs can be freed), then written again.
  ASSERT_THAT(store_->Trim(0, kPages), IsOk());
  ExpectRange(*store_, 0, std::vector<uint64_t>(256, 0));
  ASSERT_THAT(WriteRange(*store_, 60, 20, 2), IsOk());
  std::vector<uint64_t> again(100, 0);
  for (size_t i = 10; i < 30; ++i) again[i] = 2;
  ExpectRange(*store_, 50, again);
  // Empty and bad ranges: OutOfRange, nothing trimmed.
  EXPECT_THAT(store_->Trim(10, 0), IsOk());
  EXPECT_THAT(store_->Trim(kPages - 4, 5), StatusIs(StatusCode::kOutOfRange));
  EXPECT_THAT(store_->Trim(kPages + 1, 1), StatusIs(StatusCode::kOutOfRange));
  EXPECT_THAT(store_->Trim(70, std::numeric_limits<uint64_t>::max()),
              StatusIs(StatusCode::kOutOfRange));  // first + count wraps around.
  EXPECT_THAT(store_->Trim(std::numeric_limits<uint64_t>::max(), 2),
              StatusIs(StatusCode::kOutOfRange));
  ExpectRange(*store_, 50, again);
}

TEST_P(PageStoreConformance, FlushCoversEveryAcknowledgedWrite) {
  EXPECT_THAT(store_->Flush(), IsOk());  // Nothing written yet.
  // Writes acknowledged one by one and in a batch, then Flush().
  for (PageId p = 0; p < 10; ++p) {
    std::vector<uint8_t> b = Page(p, 1);
    ASSERT_THAT(store_->WritePage(p, b.data()), IsOk());
  }
  ASSERT_THAT(WriteRange(*store_, 10, 90, 1), IsOk());
  ASSERT_THAT(store_->Flush(), IsOk());
  if (kind().check_flushed) kind().check_flushed(*store_, 100);
  ExpectRange(*store_, 0, std::vector<uint64_t>(100, 1));
  // Flush() from two threads while a third keeps writing: each returns OK, and once the
  // writer is done a last Flush() covers everything.
  std::atomic<bool> stop{false};
  std::atomic<int> write_errors{0};
  std::thread writer([&] {
    for (uint64_t v = 2; v < 6 && !stop.load(); ++v) {
      if (!WriteRange(*store_, 100, 150, v).ok()) write_errors++;
    }
  });
  std::atomic<int> flush_errors{0};
  std::vector<std::thread> flushers;
  for (int t = 0; t < 2; ++t) {
    flushers.emplace_back([&] {
      for (int i = 0; i < 3; ++i) {
        if (!store_->Flush().ok()) flush_errors++;
      }
    });
  }
  for (auto& t : flushers) t.join();
  writer.join();
  EXPECT_EQ(flush_errors.load(), 0);
  EXPECT_EQ(write_errors.load(), 0);
  ASSERT_THAT(store_->Flush(), IsOk());
  if (kind().check_flushed) kind().check_flushed(*store_, 250);
  ExpectRange(*store_, 100, std::vector<uint64_t>(150, 5));
}

TEST_P(PageStoreConformance, ConcurrentWritersAndReadersOnDistinctPages) {
  constexpr int kThreads = 4;
  constexpr uint64_t kPer = kPages / kThreads;
  std::atomic<int> bad{0}, errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const PageId first = t * kPer;
      std::vector<PageId> ids(kPer);
      for (uint64_t i = 0; i < kPer; ++i) ids[i] = first + i;
      std::vector<uint8_t> in(kPer * kPageSize), out(kPer * kPageSize);
      for (uint64_t round = 1; round <= 4; ++round) {
        for (uint64_t i = 0; i < kPer; ++i) Fill(first + i, round, in.data() + i * kPageSize);
        if (!store_->WritePages(ids.data(), kPer, in.data()).ok()) errors++;
        if (!store_->ReadPages(ids.data(), kPer, out.data()).ok()) errors++;
        for (uint64_t i = 0; i < kPer; ++i) {
          if (VersionOf(first + i, out.data() + i * kPageSize) != static_cast<int64_t>(round)) {
            bad++;
          }
        }
        // Single-page reads of a neighbour's range: whole pages of some version, never torn.
        const PageId q = ((t + 1) % kThreads) * kPer + round * 5;
        if (!store_->ReadPage(q, out.data()).ok()) errors++;
        if (VersionOf(q, out.data()) < 0) bad++;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(bad.load(), 0);
}

// One writer bumps the versions of a few pages; readers check every read is a whole page of a
// version at least as new as the last one acknowledged before the read was submitted.
TEST_P(PageStoreConformance, ReadsRacingWritesAreNeverTornOrStale) {
  constexpr PageId kHot = 8;
  std::vector<std::atomic<uint64_t>> acked(kHot);
  for (auto& a : acked) a.store(0);
  std::atomic<bool> stop{false};
  std::atomic<int> torn{0}, stale{0}, errors{0};
  std::thread writer([&] {
    std::vector<uint8_t> b(kPageSize);
    for (uint64_t v = 1; v <= 60; ++v) {
      for (PageId p = 0; p < kHot; ++p) {
        Fill(p * 61, v, b.data());
        if (!store_->WritePage(p * 61, b.data()).ok()) errors++;
        acked[p].store(v);
      }
    }
    stop.store(true);
  });
  std::vector<std::thread> readers;
  for (int t = 0; t < 2; ++t) {
    readers.emplace_back([&, t] {
      std::vector<uint8_t> b(kPageSize);
      std::mt19937 rng(t);
      while (!stop.load()) {
        const PageId p = rng() % kHot;
        const uint64_t floor = acked[p].load();
        if (!store_->ReadPage(p * 61, b.data()).ok()) {
          errors++;
          continue;
        }
        const int64_t v = VersionOf(p * 61, b.data());
        if (v < 0)
          torn++;
        else if (static_cast<uint64_t>(v) < floor)
          stale++;
      }
    });
  }
  writer.join();
  for (auto& th : readers) th.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(torn.load(), 0) << "a read returned a page that is no whole version of it";
  EXPECT_EQ(stale.load(), 0) << "a read returned a version older than one acknowledged before";
}

TEST_P(PageStoreConformance, BadPageIdsFailAloneAndCorruptNothing) {
  ASSERT_THAT(WriteRange(*store_, 0, kPages, 1), IsOk());
  // Ids that wrap to real pages under a modulo or a truncation to 32 bits.
  const std::vector<PageId> bad = {kPages,
                                   kPages + 1,
                                   2 * kPages,
                                   uint64_t{1} << 32,
                                   (uint64_t{1} << 32) + 5,
                                   std::numeric_limits<uint64_t>::max()};
  std::vector<PageId> pages;
  for (PageId b : bad) {
    pages.push_back(b);
    pages.push_back(pages.size() % kPages);  // A good page between the bad ones.
  }
  std::vector<uint8_t> junk(pages.size() * kPageSize, 0xEE);
  for (size_t i = 0; i < pages.size(); ++i) {
    if (pages[i] < kPages) Fill(pages[i], 2, junk.data() + i * kPageSize);
  }
  Batch w(PageOp::Kind::kWrite, pages, junk.data());
  ASSERT_THAT(w.Submit(*store_), IsOk());
  ASSERT_TRUE(w.Wait());
  w.ExpectEachCompletedOnce();
  std::vector<uint64_t> want(kPages, 1);
  for (size_t i = 0; i < pages.size(); ++i) {
    if (pages[i] >= kPages) {
      EXPECT_THAT(w.ops[i].status, StatusIs(StatusCode::kOutOfRange)) << "page " << pages[i];
    } else {
      EXPECT_THAT(w.ops[i].status, IsOk()) << "page " << pages[i];
      want[pages[i]] = 2;
    }
  }
  std::vector<uint8_t> out(pages.size() * kPageSize);
  Batch r(PageOp::Kind::kRead, pages, out.data());
  ASSERT_THAT(r.Submit(*store_), IsOk());
  ASSERT_TRUE(r.Wait());
  r.ExpectEachCompletedOnce();
  for (size_t i = 0; i < pages.size(); ++i) {
    if (pages[i] >= kPages) {
      EXPECT_THAT(r.ops[i].status, StatusIs(StatusCode::kOutOfRange)) << "page " << pages[i];
    } else {
      EXPECT_THAT(r.ops[i].status, IsOk());
    }
  }
  std::vector<uint8_t> one(kPageSize);
  EXPECT_THAT(store_->ReadPage(kPages, one.data()), StatusIs(StatusCode::kOutOfRange));
  EXPECT_THAT(store_->WritePage(std::numeric_limits<uint64_t>::max(), one.data()),
              StatusIs(StatusCode::kOutOfRange));
  ExpectRange(*store_, 0, want);  // Every page holds exactly what was written to it.
}

TEST_P(PageStoreConformance, MalformedBatchesAreRejectedWhole) {
  std::vector<uint8_t> b = Page(5, 1);
  std::atomic<int> calls{0};
  auto count = [](PageOp* op) { static_cast<std::atomic<int>*>(op->user)->fetch_add(1); };
  auto good = [&] {
    PageOp op;
    op.kind = PageOp::Kind::kWrite;
    op.page = 5;
    op.buf = b.data();
    op.done = count;
    op.user = &calls;
    return op;
  };
  PageOp ok = good();
  PageOp no_buf = good();
  no_buf.buf = nullptr;
  PageOp no_done = good();
  no_done.done = nullptr;
  PageOp bad_kind = good();
  bad_kind.kind = static_cast<PageOp::Kind>(7);
  for (PageOp* second : {&no_buf, &no_done, &bad_kind, static_cast<PageOp*>(nullptr)}) {
    PageOp* batch[] = {&ok, second};
    EXPECT_THAT(store_->Submit(batch), StatusIs(StatusCode::kInvalidArgument, HasSubstr("op 1")));
  }
  // The blocking batch calls check their arguments too.
  PageId id = 5;
  EXPECT_THAT(store_->ReadPages(&id, 1, nullptr), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(store_->WritePages(nullptr, 1, b.data()), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(store_->ReadPages(&id, 0, nullptr), IsOk());  // Nothing to do.
  // Ops submitted later have completed and been flushed; none of the rejected ones ran.
  ASSERT_THAT(WriteRange(*store_, 0, 4, 1), IsOk());
  ASSERT_THAT(store_->Flush(), IsOk());
  EXPECT_EQ(calls.load(), 0) << "an op of a rejected batch was completed";
  ExpectRange(*store_, 5, {0});  // ... nor stored.
}

TEST_P(PageStoreConformance, StatsCountersMove) {
  const PageStoreStats before = store_->Stats();
  ASSERT_THAT(WriteRange(*store_, 0, 64, 1), IsOk());
  ExpectRange(*store_, 0, std::vector<uint64_t>(64, 1));
  std::vector<uint8_t> b(kPageSize);
  EXPECT_THAT(store_->ReadPage(kPages + 3, b.data()), StatusIs(StatusCode::kOutOfRange));
  ASSERT_THAT(store_->Trim(0, 8), IsOk());
  const PageStoreStats after = store_->Stats();
  EXPECT_GE(after.writes - before.writes, 64u);
  EXPECT_GE(after.reads - before.reads, 64u);
  EXPECT_GE(after.read_errors - before.read_errors, 1u);
  EXPECT_GE(after.trims - before.trims, 8u);
  EXPECT_GE(after.bytes_sent - before.bytes_sent, 64 * kPageSize);
  EXPECT_GE(after.read_latency.count() - before.read_latency.count(), 64u);
  EXPECT_GE(after.write_latency.count() - before.write_latency.count(), 64u);
  EXPECT_GT(after.read_latency.p50(), 0u);
  EXPECT_EQ(after.data_loss, 0u);
}

TEST_P(PageStoreConformance, ImpossibleSizesAreRefusedClearly) {
  auto none = kind().make(backing_, 0);
  EXPECT_THAT(none, StatusIs(StatusCode::kInvalidArgument, HasSubstr("capacity")));
  // Far more pages than any machine holds: either a clear error, or a sparse address space
  // that works at its far end; never a crash or an allocation of the whole table.
  constexpr uint64_t kHuge = uint64_t{1} << 50;
  if (auto huge = kind().make(backing_, kHuge); huge.ok()) {
    PageStore& h = **huge;
    EXPECT_EQ(h.capacity_pages(), kHuge);
    std::vector<uint8_t> b = Page(kHuge - 1, 9), out(kPageSize);
    ASSERT_THAT(h.WritePage(kHuge - 1, b.data()), IsOk());
    ASSERT_THAT(h.ReadPage(kHuge - 1, out.data()), IsOk());
    EXPECT_EQ(VersionOf(kHuge - 1, out.data()), 9);
    EXPECT_THAT(h.ReadPage(kHuge, out.data()), StatusIs(StatusCode::kOutOfRange));
  } else {
    EXPECT_THAT(huge.status().code(),
                ::testing::AnyOf(StatusCode::kInvalidArgument, StatusCode::kResourceExhausted,
                                 StatusCode::kIoError))
        << huge.status();
    EXPECT_THAT(huge.status().message(), HasSubstr("capacity")) << huge.status();
  }
  // The store made before still works.
  ASSERT_THAT(WriteRange(*store_, 3, 2, 1), IsOk());
  ExpectRange(*store_, 3, {1, 1});
}

// Closing a store with ops in flight completes every accepted op exactly once; a new store on
// the same backing (file, servers) then starts empty and works.
TEST_P(PageStoreConformance, CloseWithOpsInFlightThenReopen) {
  ASSERT_THAT(WriteRange(*store_, 0, 16, 1), IsOk());
  constexpr size_t kN = 256;
  std::vector<PageId> pages(kN);
  for (size_t i = 0; i < kN; ++i) pages[i] = i;
  std::vector<uint8_t> in(kN * kPageSize);
  for (size_t i = 0; i < kN; ++i) Fill(i, 2, in.data() + i * kPageSize);
  std::vector<uint8_t> out(kN * kPageSize);
  Batch w(PageOp::Kind::kWrite, pages, in.data());
  Batch r(PageOp::Kind::kRead, pages, out.data());
  ASSERT_THAT(w.Submit(*store_), IsOk());
  ASSERT_THAT(r.Submit(*store_), IsOk());
  store_.reset();
  EXPECT_EQ(w.done.load(), kN) << "destroying the store left accepted writes uncompleted";
  EXPECT_EQ(r.done.load(), kN) << "destroying the store left accepted reads uncompleted";
  w.ExpectEachCompletedOnce();
  r.ExpectEachCompletedOnce();
  for (size_t i = 0; i < kN; ++i) {
    // A read that succeeded returned a whole version of its page (zeros, 1 or 2).
    if (r.ops[i].status.ok()) {
      EXPECT_GE(VersionOf(i, out.data() + i * kPageSize), 0) << "page " << i;
    }
  }
  store_ = Open(kPages);
  ASSERT_NE(store_, nullptr);
  ExpectRange(*store_, 0, std::vector<uint64_t>(32, 0));
  ASSERT_THAT(WriteRange(*store_, 0, 32, 3), IsOk());
  ExpectRange(*store_, 0, std::vector<uint64_t>(32, 3));
}

INSTANTIATE_TEST_SUITE_P(Stores, PageStoreConformance, ::testing::Range<size_t>(0, Kinds().size()),
                         [](const ::testing::TestParamInfo<size_t>& info) {
                           return Kinds()[info.param].name;
                         });

}  // namespace
}  // namespace tessera::client
