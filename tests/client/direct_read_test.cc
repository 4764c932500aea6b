// Run-to-completion reads of the group layout (RemoteStoreOptions::direct_reads): a blocking
// ReadPage/ReadPages reads a stored page on the caller's thread. Real memservers on loopback.
// Covered: the fast path is taken (PageStoreStats::direct_reads) and can be turned off;
// readers on several threads racing rewrites, compaction moves and trims of the same pages
// always get the latest acknowledged data (or newer); a server SIGKILLed or SIGSTOPped while
// readers read; corrupted replies (FaultInjectingTransport) fall back and are repaired; a
// ThreadReader (both layouts) reads directly again after every server was late at once.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "client/local_cluster.h"
#include "client/remote/engine.h"
#include "client/remote_store.h"
#include "client/testing/fault_injecting_transport.h"
#include "common/clock.h"
#include "tests/support/status_matchers.h"
#include "tests/support/test_util.h"

namespace tessera::client {
namespace {

using ::tessera::testing::IsOk;

std::unique_ptr<LocalCluster> StartCluster(size_t n) {
  LocalClusterOptions o;
  o.bin_dir = ::tessera::testing::BinDir();
  o.servers = n;
  o.capacity = "8M";
  o.slab_size = "64K";  // 16 rows per slab: compaction and slab frees happen early.
  auto c = LocalCluster::Start(o);
  EXPECT_THAT(c, IsOk());
  return c.ok() ? std::move(*c) : nullptr;
}

ErasureCodedStoreOptions GroupOptions(const LocalCluster& c, uint64_t pages) {
  ErasureCodedStoreOptions o;
  for (const auto& e : c.endpoints()) o.remote.servers.push_back(RemoteServer{e, ""});
  o.remote.secret = c.secret();
  o.remote.transport = fabric::TransportKind::kTcp;
  o.remote.capacity_pages = pages;
  o.k = 4;
  o.r = 2;
  o.layout = EcLayout::kGroup;
  return o;
}

// The erasure-coded split layout with the same servers: RS(4,2), 1 KB splits, delta 1.
ErasureCodedStoreOptions SplitOptions(const LocalCluster& c, uint64_t pages) {
  ErasureCodedStoreOptions o = GroupOptions(c, pages);
  o.layout = EcLayout::kSplit;
  return o;
}

// Version v of page p: a header (p, v) and a body derived from both. Version 0 = zeros.
void Fill(PageId p, uint32_t v, uint8_t* out) {
  std::memset(out, 0, 16);
  std::memcpy(out, &p, 8);
  std::memcpy(out + 8, &v, 4);
  uint64_t x = p * 0x9E3779B97F4A7C15ull + v * 0xC2B2AE3D27D4EB4Full + 1;
  for (size_t i = 16; i < kPageSize; i += 8) {
    x ^= x >> 29;
    x *= 0xBF58476D1CE4E5B9ull;
    std::memcpy(out + i, &x, 8);
  }
}

bool IsZero(const uint8_t* b) {
  for (size_t i = 0; i < kPageSize; ++i) {
    if (b[i] != 0) return false;
  }
  return true;
}

// The version a page's content is (0: zeros), or -1 when it is no version of page p at all.
int64_t VersionOf(PageId p, const uint8_t* b) {
  if (IsZero(b)) return 0;
  PageId hp;
  uint32_t v;
  std::memcpy(&hp, b, 8);
  std::memcpy(&v, b + 8, 4);
  if (hp != p || v == 0) return -1;
  uint8_t want[kPageSize];
  Fill(p, v, want);
  return std::memcmp(want, b, kPageSize) == 0 ? v : -1;
}

void WriteRange(PageStore* s, PageId first, uint64_t n, uint32_t v) {
  std::vector<uint8_t> bufs(n * kPageSize);
  std::vector<PageId> ids(n);
  for (uint64_t i = 0; i < n; ++i) {
    ids[i] = first + i;
    Fill(first + i, v, bufs.data() + i * kPageSize);
  }
  ASSERT_THAT(s->WritePages(ids.data(), n, bufs.data()), IsOk());
}

TEST(DirectReadTest, StoredPagesAreReadOnTheCallersThreadAndTheOptionTurnsItOff) {
  auto cluster = StartCluster(6);
  ASSERT_NE(cluster, nullptr);
  constexpr uint64_t kPages = 128;
  for (bool direct : {true, false}) {
    SCOPED_TRACE(direct ? "direct_reads" : "no direct_reads");
    ErasureCodedStoreOptions o = GroupOptions(*cluster, 2 * kPages);
    o.remote.direct_reads = direct;
    o.group.hedge_us = 1000000;  // A loaded machine's hiccup is not a straggler here.
    auto s = CreateErasureCodedStore(o);
    ASSERT_THAT(s, IsOk());
    PageStore* store = s->get();
    WriteRange(store, 0, kPages, 1);
    ASSERT_THAT(store->Flush(), IsOk());  // Every page is in a sealed, stored stripe now.
    uint8_t buf[kPageSize];
    for (PageId p = 0; p < 2 * kPages; ++p) {  // The upper half was never written: zeros.
      ASSERT_THAT(store->ReadPage(p, buf), IsOk());
      ASSERT_EQ(VersionOf(p, buf), p < kPages ? 1 : 0) << "page " << p;
    }
    // A batch, in several rounds of the reader.
    std::vector<PageId> ids(kPages);
    for (PageId p = 0; p < kPages; ++p) ids[p] = kPages - 1 - p;
    std::vector<uint8_t> got(kPages * kPageSize);
    ASSERT_THAT(store->ReadPages(ids.data(), kPages, got.data()), IsOk());
    for (size_t i = 0; i < kPages; ++i) {
      ASSERT_EQ(VersionOf(ids[i], got.data() + i * kPageSize), 1) << "page " << ids[i];
    }
    // Out of range still says so.
    EXPECT_FALSE(store->ReadPage(1u << 30, buf).ok());
    const PageStoreStats st = store->Stats();
    if (direct) {
      // Stored and zero pages, then the batch; the out-of-range page falls back. (A connection
      // that cannot be made within 200 ms on a very loaded machine falls back too.)
      EXPECT_EQ(st.direct_reads + st.direct_fallbacks, 3 * kPages + 1);
      EXPECT_GE(st.direct_reads, 3 * kPages - 8);
      // One count per round that posted reads: the stored pages one by one, then 4 batches.
      EXPECT_LE(st.direct_spin_hits + st.direct_sleeps, kPages + kPages / 32);
      EXPECT_GE(st.direct_spin_hits + st.direct_sleeps, kPages + kPages / 32 - 8);
    } else {
      EXPECT_EQ(st.direct_reads, 0u);
      EXPECT_EQ(st.direct_fallbacks, 0u);
    }
    EXPECT_GE(st.reads, 3 * kPages);
    EXPECT_EQ(st.data_loss, 0u);
  }
}

// Readers on 3 threads read pages while one writer rewrites (versions 1, 2, ...), trims (every
// 5th version of a page is a trim: zeros) and compaction moves the survivors. Every read must
// return a version between the last one acknowledged before the read started and the last one
// started before it ended.
// Both ack policies: with first-k a write is acknowledged before its stripe settles, so a
// page must stop being read from its old slot as soon as it is rewritten, not when the new
// stripe settles.
// The race described above, on any direct-reading store; returns the store's stats after it.
PageStoreStats RaceReadersWithWritesAndTrims(PageStore* store, uint64_t kPages) {
  std::vector<std::atomic<uint32_t>> acked(kPages), started(kPages);
  WriteRange(store, 0, kPages, 1);
  for (PageId p = 0; p < kPages; ++p) {
    acked[p].store(1);
    started[p].store(1);
  }
  EXPECT_THAT(store->Flush(), IsOk());
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> reads{0}, bad{0};
  auto reader = [&](int id) {
    std::mt19937_64 rng(id);
    uint8_t buf[kPageSize];
    while (!stop.load(std::memory_order_relaxed)) {
      const PageId p = rng() % kPages;
      const uint32_t lo = acked[p].load();
      Status st = store->ReadPage(p, buf);
      const uint32_t hi = started[p].load();
      const int64_t v = VersionOf(p, buf);
      bool ok = st.ok() && v >= 0;
      if (ok && v == 0) {
        // Zeros: some trim version in [lo, hi].
        ok = false;
        for (uint32_t x = lo; x <= hi && !ok; ++x) ok = x % 5 == 0;
      } else if (ok) {
        ok = v >= lo && v <= hi && v % 5 != 0;
      }
      if (!ok) {
        if (bad.fetch_add(1) < 5) {
          ADD_FAILURE() << "page " << p << ": read " << st << " version " << v << ", expected "
                        << lo << ".." << hi;
        }
      }
      reads.fetch_add(1);
    }
  };
  std::vector<std::thread> readers;
  for (int i = 0; i < 3; ++i) readers.emplace_back(reader, i + 1);
  std::mt19937_64 rng(42);
  uint8_t buf[kPageSize];
  const Deadline end = Deadline::AfterMs(2000);
  uint64_t ops = 0;
  while (!end.Expired() || ops < 600) {
    const PageId p = rng() % kPages;
    const uint32_t v = started[p].load() + 1;
    started[p].store(v);
    if (v % 5 == 0) {
      EXPECT_THAT(store->Trim(p, 1), IsOk());
    } else {
      Fill(p, v, buf);
      EXPECT_THAT(store->WritePage(p, buf), IsOk());
    }
    acked[p].store(v);
    if (++ops % 64 == 0) {
      EXPECT_THAT(store->Flush(), IsOk());  // Stored: readable directly.
    }
    if (ops > 20000) break;
  }
  stop.store(true);
  for (auto& t : readers) t.join();
  const PageStoreStats st = store->Stats();
  EXPECT_EQ(bad.load(), 0u) << "of " << reads.load() << " reads";
  EXPECT_GT(reads.load(), 100u);
  EXPECT_GT(st.direct_reads, 0u);
  EXPECT_GT(st.direct_fallbacks, 0u);  // Pages buffered or being written meanwhile.
  EXPECT_EQ(st.data_loss, 0u);
  // And at rest every page is its last version.
  EXPECT_THAT(store->Flush(), IsOk());
  for (PageId p = 0; p < kPages; ++p) {
    EXPECT_THAT(store->ReadPage(p, buf), IsOk());
    const uint32_t v = acked[p].load();
    EXPECT_EQ(VersionOf(p, buf), v % 5 == 0 ? 0 : v) << "page " << p;
  }
  return st;
}

class DirectReadRaceTest : public ::testing::TestWithParam<AckPolicy> {};

TEST_P(DirectReadRaceTest, ConcurrentReadersSeeTheLatestAcknowledgedDataWhileWritesCompactAndTrim) {
  auto cluster = StartCluster(6);
  ASSERT_NE(cluster, nullptr);
  constexpr uint64_t kPages = 96;
  ErasureCodedStoreOptions o = GroupOptions(*cluster, kPages);
  o.group.fill_us = 200;
  // Compaction that moves pages (in-place parity updates reuse garbage slots and move no live
  // page): reads must race the moves.
  o.group.compaction = GroupCompaction::kRestripe;
  o.ack = GetParam();
  auto s = CreateErasureCodedStore(o);
  ASSERT_THAT(s, IsOk());
  const PageStoreStats st = RaceReadersWithWritesAndTrims(s->get(), kPages);
  EXPECT_GT(st.compaction_moves, 0u) << "the test should make compaction move pages";
}

// The same race on the split layout: a page is directly readable only while no write of it is
// in flight (k + delta splits on the caller's thread, decoded there when a data split is
// missing), so every rewrite and trim must be published before its splits are posted.
TEST_P(DirectReadRaceTest, SplitLayoutReadersSeeTheLatestAcknowledgedDataWhileWritesAndTrims) {
  auto cluster = StartCluster(6);
  ASSERT_NE(cluster, nullptr);
  constexpr uint64_t kPages = 96;
  ErasureCodedStoreOptions o = SplitOptions(*cluster, kPages);
  o.ack = GetParam();
  auto s = CreateErasureCodedStore(o);
  ASSERT_THAT(s, IsOk());
  (void)RaceReadersWithWritesAndTrims(s->get(), kPages);
}

INSTANTIATE_TEST_SUITE_P(Ack, DirectReadRaceTest,
                         ::testing::Values(AckPolicy::kAll, AckPolicy::kFirstK),
                         [](const ::testing::TestParamInfo<AckPolicy>& i) {
                           return i.param == AckPolicy::kAll ? std::string("all")
                                                             : std::string("first_k");
                         });

// Readers keep reading while a server holding pages is SIGKILLed: every read returns the right
// page (direct reads that lose their server fall back to a degraded read).
void KillWhileReadersRead(EcLayout layout) {
  auto cluster = StartCluster(6);
  ASSERT_NE(cluster, nullptr);
  constexpr uint64_t kPages = 128;
  ErasureCodedStoreOptions o = GroupOptions(*cluster, kPages);
  o.layout = layout;
  auto s = CreateErasureCodedStore(o);
  ASSERT_THAT(s, IsOk());
  PageStore* store = s->get();
  WriteRange(store, 0, kPages, 3);
  ASSERT_THAT(store->Flush(), IsOk());
  auto servers = store->ServersOfPage(0);
  ASSERT_THAT(servers, IsOk());
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> reads{0}, bad{0};
  auto reader = [&](int id) {
    std::mt19937_64 rng(id);
    uint8_t buf[kPageSize];
    while (!stop.load(std::memory_order_relaxed)) {
      const PageId p = rng() % kPages;
      Status st = store->ReadPage(p, buf);
      if (!st.ok() || VersionOf(p, buf) != 3) {
        if (bad.fetch_add(1) < 5) ADD_FAILURE() << "page " << p << ": " << st;
      }
      reads.fetch_add(1);
    }
  };
  std::vector<std::thread> readers;
  for (int i = 0; i < 2; ++i) readers.emplace_back(reader, i + 1);
  const Deadline warm = Deadline::AfterMs(20000);
  while (reads.load() < 200 && !warm.Expired()) std::this_thread::yield();
  const uint64_t direct_before = store->Stats().direct_reads;
  ASSERT_THAT(cluster->Kill((*servers)[0]), IsOk());
  const uint64_t at_kill = reads.load();
  // Until the store declared the server failed (its I/O thread or heartbeat notices the reset)
  // and the readers did 400 more reads.
  const Deadline after = Deadline::AfterMs(20000);
  while ((reads.load() < at_kill + 400 || store->Stats().server_failures == 0) &&
         !after.Expired()) {
    std::this_thread::yield();
  }
  stop.store(true);
  for (auto& t : readers) t.join();
  const PageStoreStats st = store->Stats();
  EXPECT_EQ(bad.load(), 0u);
  EXPECT_GE(reads.load(), at_kill + 400) << "reads stalled after the kill";
  EXPECT_GT(direct_before, 0u);
  EXPECT_GT(st.direct_reads, direct_before) << "pages on live servers are still read directly";
  EXPECT_GE(st.server_failures, 1u);
  EXPECT_GE(st.degraded_reads + st.decodes, 1u);  // Split: decoded on the reader's thread.
  EXPECT_EQ(st.data_loss, 0u);
}

TEST(DirectReadTest, ServerKilledWhileReadersReadLosesNothing) {
  KillWhileReadersRead(EcLayout::kGroup);
}

TEST(DirectReadTest, SplitLayoutServerKilledWhileReadersReadLosesNothing) {
  KillWhileReadersRead(EcLayout::kSplit);
}

// Split layout, after the verdict: the killed server's member is re-placed and waits for its
// regeneration (held back here by a long grace). The replacement holds none of the splits yet,
// so direct readers must not ask it: every page is still read on the caller's thread, decoded
// from the other members, with no false corruption report and no fallback.
TEST(DirectReadTest, SplitLayoutReadsStayDirectWhileAReplacementIsNotRebuiltYet) {
  auto cluster = StartCluster(7);  // RS(4,2) over 6, plus one for the replacement.
  ASSERT_NE(cluster, nullptr);
  constexpr uint64_t kPages = 128;
  ErasureCodedStoreOptions o = SplitOptions(*cluster, kPages);
  o.remote.regeneration_grace_ms = 600000;  // No rebuild during the test.
  auto s = CreateErasureCodedStore(o);
  ASSERT_THAT(s, IsOk());
  PageStore* store = s->get();
  WriteRange(store, 0, kPages, 5);
  ASSERT_THAT(store->Flush(), IsOk());
  auto servers = store->ServersOfPage(0);
  ASSERT_THAT(servers, IsOk());
  const uint32_t killed = (*servers)[0];  // Split 0: a data split of page 0.
  // One split to rebuild per written page whose slab has a member on the killed server.
  uint64_t to_rebuild = 0;
  for (PageId p = 0; p < kPages; ++p) {
    auto on = store->ServersOfPage(p);
    ASSERT_THAT(on, IsOk());
    to_rebuild += std::count(on->begin(), on->end(), killed) > 0 ? 1 : 0;
  }
  ASSERT_THAT(cluster->Kill(killed), IsOk());
  // The verdict, then the I/O thread re-places the members and publishes them (pages to
  // rebuild are counted after that), while reads of page 0 go on.
  uint8_t buf[kPageSize];
  const Deadline verdict = Deadline::AfterMs(30000);
  while (store->Stats().regenerations_pending < to_rebuild && !verdict.Expired()) {
    ASSERT_THAT(store->ReadPage(0, buf), IsOk());
    ASSERT_EQ(VersionOf(0, buf), 5);
  }
  ASSERT_EQ(store->Stats().regenerations_pending, to_rebuild)
      << "the killed server's members were not declared failed and re-placed in 30 s";
  const PageStoreStats before = store->Stats();
  for (PageId p = 0; p < kPages; ++p) {
    ASSERT_THAT(store->ReadPage(p, buf), IsOk());
    ASSERT_EQ(VersionOf(p, buf), 5) << "page " << p;
  }
  const PageStoreStats after = store->Stats();
  // A read whose servers did not answer within the hedge time (memservers descheduled on a
  // loaded machine) is hedged on the I/O thread, as promised; any other fallback (a CRC
  // mismatch from asking the replacement) is what this test rules out.
  const uint64_t hedged = after.direct_hedged - before.direct_hedged;
  EXPECT_EQ(after.direct_reads - before.direct_reads + hedged, kPages);
  EXPECT_GE(after.direct_reads - before.direct_reads, kPages / 2);
  EXPECT_EQ(after.direct_fallbacks - before.direct_fallbacks, hedged);
  EXPECT_EQ(after.corruptions_detected, before.corruptions_detected);
  EXPECT_EQ(after.regenerations_pending, to_rebuild) << "the rebuild started: it shows nothing";
  EXPECT_EQ(after.data_loss, 0u);
}

// A SIGSTOPped server: a direct read of its page gives up after hedge_us and the page is read
// degraded by the I/O thread at once; reads stay bounded while the server stays stopped.
TEST(DirectReadTest, StoppedServerReadsGoDegradedAfterTheHedgeDelay) {
  auto cluster = StartCluster(6);
  ASSERT_NE(cluster, nullptr);
  constexpr uint64_t kPages = 128;
  ErasureCodedStoreOptions o = GroupOptions(*cluster, kPages);
  o.group.hedge_us = 5000;
  o.remote.op_timeout_ms = 60000;  // Only hedging can finish the reads.
  o.remote.heartbeat_timeout_ms = 60000;
  auto s = CreateErasureCodedStore(o);
  ASSERT_THAT(s, IsOk());
  PageStore* store = s->get();
  WriteRange(store, 0, kPages, 2);
  ASSERT_THAT(store->Flush(), IsOk());
  auto servers = store->ServersOfPage(0);
  ASSERT_THAT(servers, IsOk());
  const size_t stopped = (*servers)[0];
  ASSERT_THAT(cluster->Stop(stopped), IsOk());
  uint8_t buf[kPageSize];
  const uint64_t t0 = MonotonicNs();
  for (PageId p = 0; p < kPages; ++p) {
    ASSERT_THAT(store->ReadPage(p, buf), IsOk());
    ASSERT_EQ(VersionOf(p, buf), 2) << "page " << p;
  }
  const double secs = static_cast<double>(MonotonicNs() - t0) / 1e9;
  ASSERT_THAT(cluster->Cont(stopped), IsOk());
  const PageStoreStats st = store->Stats();
  EXPECT_LT(secs, 20.0);
  EXPECT_GE(st.direct_fallbacks, 1u);
  EXPECT_GE(st.degraded_reads, 1u);
  EXPECT_GT(st.direct_reads, 0u);
  EXPECT_EQ(st.server_failures, 0u);
  EXPECT_EQ(st.data_loss, 0u);
}

// Replies of one server are corrupted in the client's transport (the direct readers' too): the
// CRC mismatch sends the read to the I/O thread, which decodes and repairs.
TEST(DirectReadTest, CrcMismatchFallsBackAndIsRepaired) {
  auto cluster = StartCluster(6);
  ASSERT_NE(cluster, nullptr);
  constexpr uint64_t kPages = 64;
  auto faults = std::make_shared<testing::TransportFaults>();
  ErasureCodedStoreOptions o = GroupOptions(*cluster, kPages);
  o.remote.transport_factory = testing::FaultInjectingFactory(faults);
  o.delta = 0;
  // A direct read slower than the hedge time on a loaded machine would go to a degraded read,
  // which does not ask the corrupting server (failed once in ctest -j2 at load 8).
  o.group.hedge_us = 1000000;
  auto s = CreateErasureCodedStore(o);
  ASSERT_THAT(s, IsOk());
  PageStore* store = s->get();
  WriteRange(store, 0, kPages, 4);
  ASSERT_THAT(store->Flush(), IsOk());
  auto servers = store->ServersOfPage(0);
  ASSERT_THAT(servers, IsOk());
  const std::string bad = cluster->endpoints()[(*servers)[0]].ToString();
  faults->CorruptReadsFrom(bad, true);
  uint8_t buf[kPageSize];
  ASSERT_THAT(store->ReadPage(0, buf), IsOk());
  EXPECT_EQ(VersionOf(0, buf), 4);
  faults->CorruptReadsFrom(bad, false);
  PageStoreStats st = store->Stats();
  EXPECT_GE(faults->reads_corrupted.load(), 2u);  // The direct read and the I/O thread's.
  EXPECT_EQ(st.direct_reads, 0u);
  EXPECT_EQ(st.direct_fallbacks, 1u);
  EXPECT_GE(st.corruptions_detected, 1u);
  EXPECT_EQ(st.data_loss, 0u);
  // Clean again: read directly.
  ASSERT_THAT(store->ReadPage(0, buf), IsOk());
  EXPECT_EQ(VersionOf(0, buf), 4);
  EXPECT_EQ(store->Stats().direct_reads, 1u);
}

// Split layout: stored pages are read on the caller's thread from their k data splits (with
// delta > 0, the first k of k + delta: decoded there when a parity split beats a data split),
// zeros for pages never written; with one server's replies corrupted, a page whose split fails
// its CRC goes to the I/O thread, which decodes it from the others and rewrites the corrupt
// split.
TEST(DirectReadTest, SplitLayoutReadsDirectlyAndCorruptSplitsFallBackAndAreRepaired) {
  auto cluster = StartCluster(6);
  ASSERT_NE(cluster, nullptr);
  constexpr uint64_t kPages = 128;
  auto faults = std::make_shared<testing::TransportFaults>();
  ErasureCodedStoreOptions o = SplitOptions(*cluster, 2 * kPages);
  o.remote.transport_factory = testing::FaultInjectingFactory(faults);
  o.group.hedge_us = 1000000;  // A loaded machine's hiccup is not a straggler here.
  // Exactly the k data splits are asked, so a corrupt one is always seen (with delta 1 it may
  // come after k good ones and never be looked at).
  o.delta = 0;
  auto s = CreateErasureCodedStore(o);
  ASSERT_THAT(s, IsOk());
  PageStore* store = s->get();
  WriteRange(store, 0, kPages, 6);
  ASSERT_THAT(store->Flush(), IsOk());
  uint8_t buf[kPageSize];
  for (PageId p = 0; p < 2 * kPages; ++p) {
    ASSERT_THAT(store->ReadPage(p, buf), IsOk());
    ASSERT_EQ(VersionOf(p, buf), p < kPages ? 6 : 0) << "page " << p;
  }
  const PageStoreStats before = store->Stats();
  // (A connection that cannot be made within 200 ms on a very loaded machine falls back.)
  EXPECT_GE(before.direct_reads, 2 * kPages - 8);
  auto servers = store->ServersOfPage(0);
  ASSERT_THAT(servers, IsOk());
  faults->CorruptReadsFrom(cluster->endpoints()[(*servers)[0]].ToString(), true);
  std::vector<PageId> ids(kPages);
  for (PageId p = 0; p < kPages; ++p) ids[p] = p;
  std::vector<uint8_t> got(kPages * kPageSize);
  ASSERT_THAT(store->ReadPages(ids.data(), kPages, got.data()), IsOk());
  faults->CorruptReadsFrom(cluster->endpoints()[(*servers)[0]].ToString(), false);
  for (PageId p = 0; p < kPages; ++p) {
    ASSERT_EQ(VersionOf(p, got.data() + p * kPageSize), 6) << "page " << p;
  }
  const PageStoreStats st = store->Stats();
  EXPECT_GE(faults->reads_corrupted.load(), 1u);
  EXPECT_GE(st.direct_fallbacks - before.direct_fallbacks, 1u);
  EXPECT_GE(st.corruptions_detected, 1u);
  EXPECT_GE(st.decodes, 1u);
  EXPECT_EQ(st.data_loss, 0u);
  // Repaired (or never asked again): clean reads are direct again and right.
  const uint64_t direct = st.direct_reads;
  ASSERT_THAT(store->ReadPages(ids.data(), kPages, got.data()), IsOk());
  for (PageId p = 0; p < kPages; ++p) {
    ASSERT_EQ(VersionOf(p, got.data() + p * kPageSize), 6) << "page " << p;
  }
  EXPECT_GE(store->Stats().direct_reads - direct, kPages - 8);
}

// Reads pages [0, pages) of `store` through a ThreadReader, as an event loop does. Completions
// come from this thread (read here) or an I/O thread (handed over).
class ReaderLoop {
 public:
  ReaderLoop(PageStore* store, uint64_t pages) : ops_(pages), bufs_(pages * kPageSize) {
    auto r = store->NewThreadReader({});
    EXPECT_THAT(r, IsOk());
    if (r.ok()) reader_ = std::move(*r);
    for (PageId p = 0; p < pages; ++p) {
      ops_[p].kind = PageOp::Kind::kRead;
      ops_[p].page = p;
      ops_[p].buf = bufs_.data() + p * kPageSize;
      ops_[p].user = this;
      ops_[p].done = [](PageOp* op) {
        auto* self = static_cast<ReaderLoop*>(op->user);
        std::lock_guard<std::mutex> lock(self->mu_);
        ++self->done_;
        self->cv_.notify_all();
      };
    }
  }
  ThreadReader* reader() { return reader_.get(); }
  const PageOp& op(PageId p) const { return ops_[p]; }

  // Submits the reads of pages [first, first + n) and Wait()s (at least once: it posts what
  // Submit() queued) until none is left here (read, or handed over).
  void Start(PageId first, uint64_t n) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      target_ = done_ + n;
    }
    std::vector<PageOp*> batch;
    for (PageId p = first; p < first + n; ++p) batch.push_back(&ops_[p]);
    ASSERT_THAT(reader_->Submit(batch), IsOk());
    const Deadline deadline = Deadline::AfterMs(20000);
    do {
      (void)reader_->Wait(deadline);
    } while (reader_->inflight() > 0 && !deadline.Expired());
    ASSERT_EQ(reader_->inflight(), 0u) << "reads neither read nor handed over in 20 s";
  }
  // True once every read Start() began has completed (the handed-over ones too), within `ms`.
  bool Finished(int ms) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::milliseconds(ms), [&] { return done_ >= target_; });
  }
  // Start() and Finished(); then each page holds version v.
  void Read(PageId first, uint64_t n, uint32_t v) {
    ASSERT_NO_FATAL_FAILURE(Start(first, n));
    ASSERT_TRUE(Finished(20000)) << "handed-over reads did not complete in 20 s";
    for (PageId p = first; p < first + n; ++p) {
      ASSERT_THAT(ops_[p].status, IsOk());
      ASSERT_EQ(VersionOf(p, ops_[p].buf), v) << "page " << p;
    }
  }

 private:
  std::unique_ptr<ThreadReader> reader_;
  std::vector<PageOp> ops_;
  std::vector<uint8_t> bufs_;
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t done_ = 0;    // Guarded by mu_.
  uint64_t target_ = 0;  // Guarded by mu_.
};

// A store whose stopped servers are neither timed out nor suspected (only the direct reader's
// own handling is at work), with a hedge time that a loaded machine's hiccup does not reach.
ErasureCodedStoreOptions ReaderOptions(const LocalCluster& c, EcLayout layout, uint64_t pages) {
  ErasureCodedStoreOptions o =
      layout == EcLayout::kSplit ? SplitOptions(c, pages) : GroupOptions(c, pages);
  o.group.hedge_us = 1000000;
  o.remote.op_timeout_ms = 60000;
  o.remote.heartbeat_timeout_ms = 60000;
  return o;
}

// A ThreadReader whose direct reads were all given up at once (every server slower than the
// hedge time: a loaded machine's stall, here SIGSTOPped servers) reads directly again once the
// servers answer. The given-up requests keep their servers out of new reads until their late
// replies are reaped; with every server out, no page can be started directly (split: fewer than
// k servers left; group: its one server is out), so the reader must reap them although none of
// its reads is in flight, or every later read is handed to the I/O thread for good.
void ThreadReaderReadsDirectlyAgainAfterEveryServerWasLate(EcLayout layout) {
  auto cluster = StartCluster(6);
  ASSERT_NE(cluster, nullptr);
  constexpr uint64_t kPages = 64;
  auto s = CreateErasureCodedStore(ReaderOptions(*cluster, layout, kPages));
  ASSERT_THAT(s, IsOk());
  PageStore* store = s->get();
  WriteRange(store, 0, kPages, 3);
  ASSERT_THAT(store->Flush(), IsOk());
  ReaderLoop loop(store, kPages);
  ASSERT_NE(loop.reader(), nullptr);
  // Every server running: the reader connects to them (and reads directly).
  ASSERT_NO_FATAL_FAILURE(loop.Read(0, kPages, 3));
  const PageStoreStats before = store->Stats();
  ASSERT_GT(before.direct_reads, 0u);

  // Every server stopped: each direct read is given up after the hedge time and handed over;
  // the I/O thread reads the pages once the servers run again.
  for (size_t i = 0; i < cluster->size(); ++i) ASSERT_THAT(cluster->Stop(i), IsOk());
  ASSERT_NO_FATAL_FAILURE(loop.Start(0, kPages));
  EXPECT_EQ(store->Stats().direct_reads, before.direct_reads);
  for (size_t i = 0; i < cluster->size(); ++i) ASSERT_THAT(cluster->Cont(i), IsOk());
  ASSERT_TRUE(loop.Finished(30000))
      << "the handed-over reads did not complete in 30 s after the servers ran again";
  for (PageId p = 0; p < kPages; ++p) {
    ASSERT_THAT(loop.op(p).status, IsOk());
    ASSERT_EQ(VersionOf(p, loop.op(p).buf), 3) << "page " << p;
  }

  // The servers answer again (the late replies arrive as they run): reads of the same pages
  // are read on this thread again.
  const Deadline again = Deadline::AfterMs(10000);
  uint64_t direct = 0;
  for (PageId p = 0; direct == 0 && !again.Expired(); p = (p + 1) % kPages) {
    ASSERT_NO_FATAL_FAILURE(loop.Read(p, 1, 3));
    direct = store->Stats().direct_reads - before.direct_reads;
  }
  EXPECT_GT(direct, 0u) << "no page read directly in the 10 s after the servers ran again: "
                           "the reader still keeps every server out";
  EXPECT_EQ(store->Stats().data_loss, 0u);
}

TEST(DirectReadTest, ThreadReaderReadsDirectlyAgainAfterEveryServerWasLate) {
  ThreadReaderReadsDirectlyAgainAfterEveryServerWasLate(EcLayout::kGroup);
}

TEST(DirectReadTest, SplitLayoutThreadReaderReadsDirectlyAgainAfterEveryServerWasLate) {
  ThreadReaderReadsDirectlyAgainAfterEveryServerWasLate(EcLayout::kSplit);
}

// Split layout, one server stopped (as a descheduled memserver on a loaded machine answers
// nothing for a while): every page is still read on the reader's thread, from the others (k +
// delta = 5 of the 6 splits are asked). A request left at the stopped server holds a reply
// buffer until it answers; after a few such reads the server is asked only when k cannot be
// had without it, so its requests never take the reader's 512 buffers (asked for every page,
// it would hold one for each of the 1024 reads here).
TEST(DirectReadTest, SplitLayoutThreadReaderReadsDirectlyWhileAServerAnswersNothing) {
  auto cluster = StartCluster(6);
  ASSERT_NE(cluster, nullptr);
  constexpr uint64_t kPages = 64;
  auto s = CreateErasureCodedStore(ReaderOptions(*cluster, EcLayout::kSplit, kPages));
  ASSERT_THAT(s, IsOk());
  PageStore* store = s->get();
  WriteRange(store, 0, kPages, 7);
  ASSERT_THAT(store->Flush(), IsOk());
  ReaderLoop loop(store, kPages);
  ASSERT_NE(loop.reader(), nullptr);
  ASSERT_NO_FATAL_FAILURE(loop.Read(0, kPages, 7));  // Connected to every server.
  auto servers = store->ServersOfPage(0);
  ASSERT_THAT(servers, IsOk());
  const size_t stopped = (*servers)[0];  // Split 0 of page 0: a data split, asked first.
  const PageStoreStats before = store->Stats();
  ASSERT_THAT(cluster->Stop(stopped), IsOk());
  for (int round = 0; round < 16; ++round) {
    ASSERT_NO_FATAL_FAILURE(loop.Read(0, kPages, 7)) << "round " << round;
  }
  ASSERT_THAT(cluster->Cont(stopped), IsOk());
  const PageStoreStats st = store->Stats();
  EXPECT_EQ(st.direct_reads - before.direct_reads, 16 * kPages);
  EXPECT_EQ(st.direct_fallbacks, before.direct_fallbacks);
  EXPECT_EQ(st.data_loss, 0u);
}

TEST(DirectReadTest, BadSpinIsRefused) {
  auto cluster = StartCluster(6);
  ASSERT_NE(cluster, nullptr);
  ErasureCodedStoreOptions o = GroupOptions(*cluster, 64);
  o.remote.direct_spin_us = 1001;
  EXPECT_FALSE(CreateErasureCodedStore(o).ok());
  o.remote.direct_spin_us = 0;  // Never polls: sleeps in Wait() at once.
  auto s = CreateErasureCodedStore(o);
  ASSERT_THAT(s, IsOk());
  WriteRange(s->get(), 0, 8, 1);
  ASSERT_THAT((*s)->Flush(), IsOk());
  uint8_t buf[kPageSize];
  for (PageId p = 0; p < 8; ++p) {
    ASSERT_THAT((*s)->ReadPage(p, buf), IsOk());
    ASSERT_EQ(VersionOf(p, buf), 1);
  }
  // Each read direct, but for one whose server did not answer within the hedge time.
  EXPECT_EQ((*s)->Stats().direct_reads + (*s)->Stats().direct_hedged, 8u);
  EXPECT_GE((*s)->Stats().direct_reads, 4u);
  EXPECT_EQ((*s)->Stats().direct_spin_hits, 0u);
}

}  // namespace
// The polling window follows the recent reply time, within the bound.
TEST(DirectSpinWindow, TwiceTheRecentReplyTimeWithinTheBound) {
  using remote::DirectSpinWindowNs;
  EXPECT_EQ(DirectSpinWindowNs(20'000, 100'000), 40'000u);   // Quick replies: 2x their time.
  EXPECT_EQ(DirectSpinWindowNs(70'000, 100'000), 100'000u);  // Capped at the bound.
  EXPECT_EQ(DirectSpinWindowNs(150'000, 100'000), 0u);       // Slower than the bound: no poll.
  EXPECT_EQ(DirectSpinWindowNs(20'000, 0), 0u);              // direct_spin_us 0 never polls.
}

}  // namespace tessera::client
