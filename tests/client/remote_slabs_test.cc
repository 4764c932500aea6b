// Remote slabs of the stores against real memservers (LocalCluster): allocation (placed away
// from dead, hung and full servers) and release (trim, regeneration, destruction), with the
// servers' own slab counts as the measure; ALLOC calls (new slabs of either layout, the
// replacement of a failed member) and FREE calls never hold up an I/O thread's requests.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <random>
#include <thread>
#include <vector>

#include "client/local_cluster.h"
#include "client/remote/engine.h"
#include "client/remote/slab_allocator.h"
#include "client/remote_store.h"
#include "common/clock.h"
#include "common/logging.h"
#include "tests/client/remote_store_testing.h"
#include "tests/support/status_matchers.h"
#include "tests/support/test_util.h"

namespace tessera::client {
namespace {

using namespace remote_testing;  // NOLINT(build/namespaces): the shared helpers.
using ::tessera::testing::IsOk;

// 64K slabs: ec(2,1) splits are 2 KiB, so a logical slab is 32 pages on 3 remote slabs;
// replication(2) slabs hold 16 pages on 2 remote slabs.
TEST(RemoteStoreTest, TrimFreesWholeSlabsRemotelyAndZeroesPartialOnesLocally) {
  auto cluster = StartCluster(3);
  ASSERT_NE(cluster, nullptr);
  for (int layout = 0; layout < 2; ++layout) {
    std::unique_ptr<PageStore> store;
    uint64_t pps, width;
    if (layout == 0) {
      ErasureCodedStoreOptions o;
      o.layout = EcLayout::kSplit;
      o.remote = RemoteOptions(*cluster, 320);
      o.remote.io_threads = 2;  // Slabs alternate between the threads.
      o.k = 2;
      o.r = 1;
      auto s = CreateErasureCodedStore(o);
      ASSERT_TRUE(s.ok()) << s.status();
      store = std::move(*s);
      pps = 32;
      width = 3;
    } else {
      ReplicatedStoreOptions o;
      o.remote = RemoteOptions(*cluster, 160);
      o.copies = 2;
      auto s = CreateReplicatedStore(o);
      ASSERT_TRUE(s.ok()) << s.status();
      store = std::move(*s);
      pps = 16;
      width = 2;
    }
    SCOPED_TRACE(store->name());
    const uint64_t pages = store->capacity_pages();
    const uint64_t slabs = pages / pps;
    ASSERT_EQ(SumServerStat(*cluster, "slabs_allocated"), 0u);
    WriteAll(store.get(), pages);
    ASSERT_TRUE(store->Flush().ok());
    EXPECT_EQ(SumServerStat(*cluster, "slabs_allocated"), slabs * width);

    // Two whole logical slabs (1 and 2): their remote slabs are freed, the pages read zeros.
    const uint64_t bytes_before = store->Stats().bytes_sent;
    ASSERT_TRUE(store->Trim(pps, 2 * pps).ok());
    EXPECT_EQ(store->Stats().bytes_sent, bytes_before) << "a trim must not write remotely";
    EXPECT_EQ(SumServerStat(*cluster, "slabs_allocated"), (slabs - 2) * width);
    ExpectZeros(store.get(), pps, 3 * pps);
    ExpectVersion(store.get(), 0, pps, 1);
    ExpectVersion(store.get(), 3 * pps, pages, 1);

    // Part of slab 3: zeros there, the rest of the slab intact, nothing freed.
    const PageId a = 3 * pps + 4, b = 3 * pps + pps / 2;
    ASSERT_TRUE(store->Trim(a, b - a).ok());
    EXPECT_EQ(SumServerStat(*cluster, "slabs_allocated"), (slabs - 2) * width);
    ExpectZeros(store.get(), a, b);
    ExpectVersion(store.get(), 3 * pps, a, 1);
    ExpectVersion(store.get(), b, 4 * pps, 1);
    // The rest of slab 3 trimmed too: now it is empty and freed.
    ASSERT_TRUE(store->Trim(3 * pps, 4).ok());
    ASSERT_TRUE(store->Trim(b, 4 * pps - b).ok());
    EXPECT_EQ(SumServerStat(*cluster, "slabs_allocated"), (slabs - 3) * width);

    // Write after trim: a freed slab is allocated afresh and the write is stored.
    ASSERT_TRUE(WriteVersion(store.get(), pps + 5, 7).ok());
    ASSERT_TRUE(WriteVersion(store.get(), a, 7).ok());
    ExpectVersion(store.get(), pps + 5, pps + 6, 7);
    ExpectVersion(store.get(), a, a + 1, 7);
    ExpectZeros(store.get(), pps, pps + 5);
    ExpectZeros(store.get(), a + 1, b);
    EXPECT_EQ(SumServerStat(*cluster, "slabs_allocated"), (slabs - 1) * width);

    // Bad ranges are refused and change nothing.
    EXPECT_EQ(store->Trim(pages - 1, 2).code(), StatusCode::kOutOfRange);
    EXPECT_EQ(store->Trim(pages + 1, 0).code(), StatusCode::kOutOfRange);
    ExpectVersion(store.get(), pages - 1, pages, 1);

    // Everything: all remote memory back.
    ASSERT_TRUE(store->Trim(0, pages).ok());
    EXPECT_EQ(SumServerStat(*cluster, "slabs_allocated"), 0u);
    ExpectZeros(store.get(), 0, pages);
    EXPECT_EQ(store->Stats().data_loss, 0u);
  }
}

// Trims racing writes: a write is never lost (a page reads back its newest acknowledged version,
// or zeros only when a trim of it may have come after that write), pages outside the trimmed
// ranges always keep their data, and slabs freed under the writer are reallocated.
TEST(RemoteStoreTest, TrimConcurrentWithWritesLosesNoWrite) {
  auto cluster = StartCluster(3);
  ASSERT_NE(cluster, nullptr);
  ErasureCodedStoreOptions o;
  o.layout = EcLayout::kSplit;
  o.remote = RemoteOptions(*cluster, 256);  // 8 logical slabs of 32 pages.
  o.remote.io_threads = 2;
  o.k = 2;
  o.r = 1;
  auto s = CreateErasureCodedStore(o);
  ASSERT_TRUE(s.ok()) << s.status();
  PageStore* store = s->get();
  constexpr uint64_t kPps = 32, kSlabs = 8;
  std::atomic<uint64_t> trims_started{0}, trims_done{0};
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> zeros_seen{0}, exact_seen{0};
  // Phase 0 trims the lower half of every slab (upper halves must never change); phase 1
  // trims the whole range (slabs are freed and reallocated under the writer).
  for (int phase = 0; phase < 2; ++phase) {
    SCOPED_TRACE(phase == 0 ? "partial trims" : "whole-range trims");
    stop = false;
    std::thread trimmer([&] {
      for (int i = 0; i < 150 && !stop.load(); ++i) {
        trims_started.fetch_add(1);
        if (phase == 0) {
          for (uint64_t sl = 0; sl < kSlabs; ++sl) {
            EXPECT_TRUE(store->Trim(sl * kPps, kPps / 2).ok());
          }
        } else {
          EXPECT_TRUE(store->Trim(0, kSlabs * kPps).ok());
        }
        trims_done.fetch_add(1);
        std::this_thread::yield();
      }
      stop = true;
    });
    std::mt19937_64 rng(phase + 1);
    uint32_t version = 100 * (phase + 1);
    uint8_t buf[kPageSize];
    while (!stop.load()) {
      const PageId p = rng() % (kSlabs * kPps);
      const bool protected_page = phase == 0 && p % kPps >= kPps / 2;
      ++version;
      const uint64_t s0 = trims_started.load(), d0 = trims_done.load();
      ASSERT_TRUE(WriteVersion(store, p, version).ok()) << "page " << p;
      ASSERT_TRUE(store->ReadPage(p, buf).ok()) << "page " << p;
      if (Matches(p, version, buf)) {
        exact_seen.fetch_add(1);
        continue;
      }
      ASSERT_TRUE(IsZeroPage(buf)) << "page " << p << " reads neither version " << version
                                   << " nor zeros";
      ASSERT_FALSE(protected_page) << "page " << p << " outside the trimmed ranges was zeroed";
      ASSERT_TRUE(trims_started.load() > s0 || s0 > d0)
          << "page " << p << " lost its write: no trim could have come after it";
      zeros_seen.fetch_add(1);
    }
    trimmer.join();
  }
  EXPECT_GT(exact_seen.load(), 0u);
  // Quiet again: every page written once more reads back, and the cluster holds exactly the
  // slabs of the store.
  WriteAll(store, kSlabs * kPps);
  std::vector<uint32_t> v(kSlabs * kPps, 1);
  VerifyAll(store, v);
  ASSERT_TRUE(store->Flush().ok());
  EXPECT_EQ(SumServerStat(*cluster, "slabs_allocated"), kSlabs * 3);
  ASSERT_TRUE(store->Trim(0, kSlabs * kPps).ok());
  EXPECT_EQ(SumServerStat(*cluster, "slabs_allocated"), 0u);
  EXPECT_EQ(store->Stats().data_loss, 0u);
  TLOG(INFO) << "trim race: " << exact_seen.load() << " read-backs exact, " << zeros_seen.load()
             << " trimmed in between";
}

// A clean shutdown (the store's destructor) gives every remote slab back at once.
TEST(RemoteStoreTest, DestroyingTheStoreFreesItsSlabs) {
  auto cluster = StartCluster(3);
  ASSERT_NE(cluster, nullptr);
  ErasureCodedStoreOptions o = EcOptions(*cluster, 128, 2, 1);
  auto s = CreateErasureCodedStore(o);
  ASSERT_TRUE(s.ok()) << s.status();
  WriteAll(s->get(), 128);
  ASSERT_TRUE((*s)->Flush().ok());
  EXPECT_EQ(SumServerStat(*cluster, "slabs_allocated"), 4u * 3);
  s->reset();
  EXPECT_EQ(SumServerStat(*cluster, "slabs_allocated"), 0u);
}


// A write that needs a new slab while one of the servers placement picks is dead (SIGKILL) or
// hung (SIGSTOP) and heartbeats cannot notice: the allocation fails or times out, the server
// becomes suspect (later allocations skip it) and the split is placed elsewhere; the write
// succeeds. The dead one is failed (its probe is refused); the hung one, which a probe cannot
// tell from a busy one without the heartbeats' measure of its silence, is only suspect.
TEST(RemoteStoreTest, NewSlabIsPlacedElsewhereWhenAServerIsDeadButNotYetDeclared) {
  auto cluster = StartCluster(5);
  ASSERT_NE(cluster, nullptr);
  ErasureCodedStoreOptions o;
  o.layout = EcLayout::kSplit;
  o.remote = RemoteOptions(*cluster, 32 * 16);  // 16 logical slabs of 32 pages.
  o.remote.heartbeat_interval_ms = 600000;  // Heartbeats never get to notice.
  o.remote.heartbeat_timeout_ms = 600000;
  o.remote.op_timeout_ms = 1000;
  o.k = 2;
  o.r = 1;
  auto s = CreateErasureCodedStore(o);
  ASSERT_TRUE(s.ok()) << s.status();
  PageStore* store = s->get();
  ASSERT_TRUE(WriteVersion(store, 0, 1).ok());  // Connections are up and used.
  struct Phase {
    const char* what;
    size_t server;
    PageId first_slab, end_slab;
  };
  for (const Phase& ph : {Phase{"SIGKILL", 0, 1, 8}, Phase{"SIGSTOP", 1, 8, 16}}) {
    SCOPED_TRACE(ph.what);
    ASSERT_TRUE((ph.server == 0 ? cluster->Kill(ph.server) : cluster->Stop(ph.server)).ok());
    bool placed_on_it = false;
    for (PageId sl = ph.first_slab; sl < ph.end_slab; ++sl) {
      Status st = WriteVersion(store, sl * 32, 1);
      ASSERT_TRUE(st.ok()) << "first write of logical slab " << sl << ": " << st;
      auto servers = ServersOfPage(*store, sl * 32);
      ASSERT_TRUE(servers.ok()) << servers.status();
      placed_on_it |= std::find(servers->begin(), servers->end(), ph.server) != servers->end();
    }
    EXPECT_FALSE(placed_on_it) << "a new slab was placed on the dead server";
    uint8_t buf[kPageSize];
    for (PageId sl = ph.first_slab; sl < ph.end_slab; ++sl) {
      ASSERT_TRUE(store->ReadPage(sl * 32, buf).ok());
      ASSERT_TRUE(Matches(sl * 32, 1, buf)) << "logical slab " << sl;
    }
  }
  // The dead one: suspect at its first refused connection, failed fail_after_ms later.
  WaitFor([&] { return store->Stats().server_failures >= 1; }, "the SIGKILLed server's verdict");
  EXPECT_EQ(store->Stats().server_failures, 1u);
  EXPECT_GE(store->Stats().server_suspicions, 2u);
  EXPECT_EQ(store->Stats().write_errors, 0u);
  ASSERT_TRUE(cluster->Cont(1).ok());
}


// Trimming slabs whose lost splits are still being regenerated: the pending rebuilds are
// dropped with the pages, the slabs are freed on the live servers, and new writes work.
TEST(RemoteStoreTest, TrimDuringRegenerationDropsThePendingRebuilds) {
  auto cluster = StartCluster(4);
  ASSERT_NE(cluster, nullptr);
  ErasureCodedStoreOptions o;
  o.layout = EcLayout::kSplit;
  o.remote = RemoteOptions(*cluster, 128);  // 4 logical slabs of 32 pages.
  o.remote.regeneration_pages_per_sec = 1;  // Rebuilds stay pending while we trim.
  o.k = 2;
  o.r = 1;
  auto s = CreateErasureCodedStore(o);
  ASSERT_TRUE(s.ok()) << s.status();
  PageStore* store = s->get();
  WriteAll(store, 128);
  ASSERT_TRUE(cluster->Kill(0).ok());
  // Declared failed on its next heartbeat; its splits are then re-placed, pending rebuild.
  WaitFor([&] { return store->Stats().regenerations_pending > 0; }, "rebuilds pending");
  ASSERT_TRUE(store->Trim(0, 64).ok());   // Two slabs whole.
  ASSERT_TRUE(store->Trim(64, 16).ok());  // Half of the third.
  const uint64_t left = store->Stats().regenerations_pending;
  ASSERT_TRUE(store->Trim(80, 48).ok());  // The rest.
  EXPECT_EQ(store->Stats().regenerations_pending, 0u) << "before the last trim: " << left;
  ExpectZeros(store, 0, 128);
  WriteAll(store, 128);
  std::vector<uint32_t> v(128, 1);
  VerifyAll(store, v);
  EXPECT_EQ(store->Stats().data_loss, 0u);
}


// A server that refuses allocations (full: ResourceExhausted) is not declared failed; the new
// slab's split goes to a replacement and the write succeeds.
TEST(RemoteStoreTest, NewSlabAvoidsAServerThatRefusesAllocations) {
  auto cluster = StartCluster(4);
  ASSERT_NE(cluster, nullptr);
  ErasureCodedStoreOptions o = EcOptions(*cluster, 32 * 8, 2, 1);
  auto s = CreateErasureCodedStore(o);
  ASSERT_TRUE(s.ok()) << s.status();
  PageStore* store = s->get();
  ASSERT_TRUE(cluster->Fault(2, {"refuse-alloc"}).ok());
  for (PageId sl = 0; sl < 8; ++sl) {
    Status st = WriteVersion(store, sl * 32 + 3, 1);
    ASSERT_TRUE(st.ok()) << "logical slab " << sl << ": " << st;
    auto servers = ServersOfPage(*store, sl * 32);
    ASSERT_TRUE(servers.ok());
    EXPECT_EQ(std::count(servers->begin(), servers->end(), 2u), 0) << "slab " << sl;
  }
  uint8_t buf[kPageSize];
  for (PageId sl = 0; sl < 8; ++sl) {
    ASSERT_TRUE(store->ReadPage(sl * 32 + 3, buf).ok());
    ASSERT_TRUE(Matches(sl * 32 + 3, 1, buf));
  }
  EXPECT_EQ(store->Stats().server_failures, 0u);
}

// Group layout: trimming every page frees the remote memory (all stripe slabs go back to the
// servers); pages read as zeros and can be written again.
TEST(GroupLayoutTest, TrimFreesRemoteMemory) {
  auto cluster = StartCluster(6);
  ASSERT_NE(cluster, nullptr);
  constexpr uint64_t kPages = 256;
  ErasureCodedStoreOptions o = EcOptions(*cluster, kPages, 4, 2, EcLayout::kGroup);
  auto s = CreateErasureCodedStore(o);
  ASSERT_TRUE(s.ok()) << s.status();
  PageStore* store = s->get();
  WriteAll(store, kPages);
  ASSERT_TRUE(store->Flush().ok());
  EXPECT_GT(store->Stats().remote_bytes, 0u);
  EXPECT_GT(SumServerStat(*cluster, "slabs_allocated"), 0u);
  ASSERT_THAT(store->Trim(0, kPages), IsOk());
  EXPECT_EQ(store->Stats().remote_bytes, 0u);
  EXPECT_EQ(SumServerStat(*cluster, "slabs_allocated"), 0u);
  uint8_t buf[kPageSize];
  ASSERT_TRUE(store->ReadPage(7, buf).ok());
  EXPECT_TRUE(std::all_of(buf, buf + kPageSize, [](uint8_t b) { return b == 0; }));
  ASSERT_TRUE(WriteVersion(store, 7, 3).ok());
  ASSERT_TRUE(store->ReadPage(7, buf).ok());
  EXPECT_TRUE(Matches(7, 3, buf));
}

// RS(2,1) on one I/O thread that serves every read (no direct reads), with heartbeats and op
// timeouts too long to fail a server that hangs control calls for control_timeout_ms.
ErasureCodedStoreOptions OneIoThreadNoHeartbeats(const LocalCluster& cluster, uint64_t pages,
                                                 uint32_t control_timeout_ms) {
  ErasureCodedStoreOptions o = EcOptions(cluster, pages, 2, 1);
  o.remote.io_threads = 1;
  o.remote.direct_reads = false;
  o.remote.heartbeat_interval_ms = 600000;
  o.remote.heartbeat_timeout_ms = 600000;
  o.remote.op_timeout_ms = 60000;
  o.remote.control_timeout_ms = control_timeout_ms;
  return o;
}

// A FREE to a server that has stopped answering (SIGSTOP; heartbeats too rare to suspect it)
// waits out its deadline on the store's freer thread, never on the I/O thread: reads queued
// behind the trim that released the slabs complete while the trim still waits for its FREEs.
// Once the server resumes, the trim returns, and the FREEs that timed out are made again, so
// every server is back to the slabs still in use.
TEST(RemoteStoreTest, FreesToAStoppedServerDoNotHoldUpReads) {
  auto cluster = StartCluster(3);
  ASSERT_NE(cluster, nullptr);
  constexpr uint64_t kPps = 32, kSlabs = 16;
  // Each FREE to the stopped server waits control_timeout_ms (1 s).
  ErasureCodedStoreOptions o = OneIoThreadNoHeartbeats(*cluster, kPps * kSlabs, 1000);
  auto s = CreateErasureCodedStore(o);
  ASSERT_TRUE(s.ok()) << s.status();
  PageStore* store = s->get();
  WriteAll(store, kPps * kSlabs);
  ASSERT_THAT(store->Flush(), IsOk());
  ASSERT_EQ(SumServerStat(*cluster, "slabs_allocated"), kSlabs * 3);

  ASSERT_TRUE(cluster->Stop(2).ok());
  std::atomic<bool> trimmed{false};
  Status trim_status;
  std::thread trimmer([&] {
    trim_status = store->Trim(0, kPps * kSlabs / 2);
    trimmed.store(true);
  });
  // The I/O thread releases the 8 slabs at once; their 8 FREEs to the stopped server take at
  // least 8 s on the freer.
  WaitFor([&] { return store->Stats().slabs_released >= kSlabs / 2; }, "8 slabs released");
  ExpectVersion(store, kPps * kSlabs / 2, kPps * (kSlabs / 2 + 2), 1);
  EXPECT_FALSE(trimmed.load()) << "the reads waited for the FREEs to the stopped server";
  ASSERT_TRUE(cluster->Cont(2).ok());
  trimmer.join();
  EXPECT_THAT(trim_status, IsOk());
  WaitFor([&] { return SumServerStat(*cluster, "slabs_allocated") == kSlabs / 2 * 3; },
          "the slabs released while the server was stopped to be freed there");
  ExpectZeros(store, 0, kPps);
  EXPECT_EQ(store->Stats().server_failures, 0u);
  EXPECT_EQ(store->Stats().data_loss, 0u);
}

// A new slab's allocations are made off the I/O thread (split layout): while every server hangs
// its ALLOCs (each waits control_timeout_ms), the write that needs the new slab waits, and the
// reads of the slabs the store already has go on. With the ALLOCs on the I/O thread, the reads
// waited behind them.
TEST(RemoteStoreTest, AllocationsFromHungServersDoNotHoldUpReads) {
  auto cluster = StartCluster(4);
  ASSERT_NE(cluster, nullptr);
  constexpr uint64_t kPps = 32, kSlabs = 8;
  // Each hung ALLOC waits control_timeout_ms (3 s).
  ErasureCodedStoreOptions o = OneIoThreadNoHeartbeats(*cluster, kPps * kSlabs, 3000);
  auto s = CreateErasureCodedStore(o);
  ASSERT_TRUE(s.ok()) << s.status();
  PageStore* store = s->get();
  for (PageId p = 0; p < 2 * kPps; ++p) ASSERT_THAT(WriteVersion(store, p, 1), IsOk());
  ASSERT_THAT(store->Flush(), IsOk());
  ASSERT_EQ(SumServerStat(*cluster, "slabs_allocated"), 2 * 3u);

  for (size_t i = 0; i < cluster->size(); ++i) {
    ASSERT_TRUE(cluster->Fault(i, {"hang", "--ops", "alloc"}).ok());
  }
  // The first write of logical slab 5, submitted before the reads (the queue is in order).
  constexpr PageId kNewPage = 5 * kPps;
  std::vector<uint8_t> data(kPageSize);
  Fill(kNewPage, 1, data.data());
  std::atomic<bool> written{false};
  PageOp op;
  op.kind = PageOp::Kind::kWrite;
  op.page = kNewPage;
  op.buf = data.data();
  op.user = &written;
  op.done = [](PageOp* w) { static_cast<std::atomic<bool>*>(w->user)->store(true); };
  PageOp* ops[] = {&op};
  ASSERT_THAT(store->Submit(ops), IsOk());
  ExpectVersion(store, 0, 2 * kPps, 1);
  EXPECT_FALSE(written.load()) << "the reads waited for the new slab's allocations";

  for (size_t i = 0; i < cluster->size(); ++i) {
    ASSERT_TRUE(cluster->Fault(i, {"clear"}).ok());
  }
  // The hung ALLOCs time out and their members are placed again, on servers that answer now.
  WaitFor([&] { return written.load(); }, "the write of the new slab");
  EXPECT_THAT(op.status, IsOk());
  ExpectVersion(store, kNewPage, kNewPage + 1, 1);
  ASSERT_THAT(store->Flush(), IsOk());
  EXPECT_EQ(SumServerStat(*cluster, "slabs_allocated"), 3 * 3u);
  EXPECT_EQ(store->Stats().write_errors, 0u);
}

// A store shut down while a new slab's ALLOC waits for a server that stopped answering (SIGSTOP;
// no heartbeats, so it is never suspected; the call's deadline is 60 s) cuts the call short: the
// destructor returns at once, and the write that waited for the slab fails with a reason. It
// used to wait out the call's deadline.
TEST(RemoteStoreTest, ShutdownCutsShortAnAllocWaitingForAStoppedServer) {
  auto cluster = StartCluster(3);
  ASSERT_NE(cluster, nullptr);
  constexpr uint64_t kPps = 32;
  auto s = CreateErasureCodedStore(OneIoThreadNoHeartbeats(*cluster, 4 * kPps, 600000));
  ASSERT_TRUE(s.ok()) << s.status();
  std::unique_ptr<RemotePageStore> store = std::move(*s);
  ASSERT_THAT(WriteVersion(store.get(), 0, 1), IsOk());  // Slab 0: one ALLOC to each server.
  const uint64_t allocs_before = SumServerStat(*cluster, "ops_alloc", {2});

  ASSERT_TRUE(cluster->Stop(2).ok());
  std::vector<uint8_t> data(kPageSize);
  Fill(kPps, 1, data.data());
  std::atomic<bool> written{false};
  PageOp op;
  op.kind = PageOp::Kind::kWrite;
  op.page = kPps;  // Logical slab 1: a member on every server (RS(2,1) on 3 servers).
  op.buf = data.data();
  op.user = &written;
  op.done = [](PageOp* w) { static_cast<std::atomic<bool>*>(w->user)->store(true); };
  PageOp* ops[] = {&op};
  ASSERT_THAT(store->Submit(ops), IsOk());
  // The slab's ALLOCs go out together: once the two servers that answer have had theirs, the
  // stopped one's is out too.
  WaitFor([&] { return SumServerStat(*cluster, "ops_alloc", {2}) == allocs_before + 2; },
          "the new slab's ALLOCs to the servers that answer");
  EXPECT_FALSE(written.load());

  std::atomic<bool> destroyed{false};
  std::thread closer([&] {
    store.reset();
    destroyed.store(true);
  });
  WaitFor([&] { return destroyed.load(); }, "the store to shut down");
  closer.join();
  EXPECT_TRUE(written.load());
  EXPECT_FALSE(op.status.ok());
  EXPECT_FALSE(op.status.message().empty());
  ASSERT_TRUE(cluster->Cont(2).ok());
}

// Writes submitted without waiting for them (PageStore::Submit): their completions are counted.
class PendingWrites {
 public:
  explicit PendingWrites(size_t n) : bufs_(n * kPageSize), ops_(n) {}
  // Pages [first, first + n) at `version`.
  void Submit(PageStore* store, PageId first, uint32_t version) {
    std::vector<PageOp*> ptrs;
    for (size_t i = 0; i < ops_.size(); ++i) {
      PageOp& op = ops_[i];
      Fill(first + i, version, bufs_.data() + i * kPageSize);
      op.kind = PageOp::Kind::kWrite;
      op.page = first + i;
      op.buf = bufs_.data() + i * kPageSize;
      op.user = this;
      op.done = [](PageOp* w) { static_cast<PendingWrites*>(w->user)->done_.fetch_add(1); };
      ptrs.push_back(&op);
    }
    ASSERT_THAT(store->Submit(ptrs), IsOk());
  }
  size_t done() const { return done_.load(); }
  bool all_done() const { return done() == ops_.size(); }
  void ExpectAllOk() const {
    for (const PageOp& op : ops_) EXPECT_THAT(op.status, IsOk()) << "page " << op.page;
  }

 private:
  std::vector<uint8_t> bufs_;
  std::vector<PageOp> ops_;
  std::atomic<size_t> done_{0};
};

// The allocator's calls to different servers run at once: while a server that stopped
// (SIGSTOP) holds the calls to itself, each for its deadline (60 s), the calls to the other
// servers are answered. The stopped server's calls are answered in order once it resumes. With
// one allocator thread, every call after the first to the stopped server waited for it.
TEST(SlabAllocatorTest, ACallToAStoppedServerHoldsUpOnlyTheCallsToIt) {
  auto cluster = StartCluster(3);
  ASSERT_NE(cluster, nullptr);
  auto s = CreateErasureCodedStore(OneIoThreadNoHeartbeats(*cluster, 64, 60000));
  ASSERT_TRUE(s.ok()) << s.status();
  auto* rs = dynamic_cast<remote::RemoteStore*>(s->get());
  ASSERT_NE(rs, nullptr);
  ASSERT_THAT(WriteVersion(rs, 0, 1), IsOk());  // The store knows every server's instance.

  ASSERT_TRUE(cluster->Stop(0).ok());
  remote::SlabAllocator alloc(rs, [] {});
  alloc.Alloc(1, 0, 60000);
  alloc.Alloc(2, 1, 60000);
  alloc.Alloc(3, 0, 60000);  // Behind call 1: the same server.
  alloc.Alloc(4, 2, 60000);
  std::map<uint64_t, remote::SlabAllocator::Answer> got;
  auto take = [&] {
    std::vector<remote::SlabAllocator::Answer> out;
    alloc.Take(&out);
    for (auto& a : out) got.emplace(a.tag, std::move(a));
  };
  WaitFor([&] { take(); return got.count(2) && got.count(4); },
          "the calls to the servers that answer");
  EXPECT_THAT(got.at(2).slab, IsOk());
  EXPECT_THAT(got.at(4).slab, IsOk());
  EXPECT_EQ(got.count(1) + got.count(3), 0u) << "a stopped server answered";
  EXPECT_LE(alloc.workers(), 3u);

  ASSERT_TRUE(cluster->Cont(0).ok());
  WaitFor([&] { take(); return got.size() == 4; }, "the calls to the resumed server");
  ASSERT_THAT(got.at(1).slab, IsOk());
  ASSERT_THAT(got.at(3).slab, IsOk());
  EXPECT_NE(got.at(1).slab->slab_id, got.at(3).slab->slab_id);
  alloc.Finish();
  EXPECT_EQ(SumServerStat(*cluster, "slabs_allocated", {1, 2}), 1u + 2u);  // Slab 0's, and ours.
}

// A new slab's member whose ALLOC went to a server that stopped (SIGSTOP) just before is asked
// of another server once the heartbeats make the stopped one suspect (about 2 s), not after the
// call's deadline (60 s here; control_timeout_ms, 5 s, by default): the write completes while
// the server is still stopped, and it is not failed. The late answer's slab is given back when
// the server resumes.
TEST(RemoteStoreTest, ANewSlabsAllocToAServerThatStopsIsAskedElsewhereOnceItIsSuspect) {
  auto cluster = StartCluster(4);
  ASSERT_NE(cluster, nullptr);
  constexpr uint64_t kPps = 32;
  ErasureCodedStoreOptions o = EcOptions(*cluster, 4 * kPps, 2, 1);
  o.remote.io_threads = 1;
  o.remote.direct_reads = false;
  o.remote.op_timeout_ms = 60000;        // The ALLOC's deadline: min(control, op timeout).
  o.remote.control_timeout_ms = 600000;
  o.remote.fail_after_ms = 600000;       // Suspect, never failed.
  auto s = CreateErasureCodedStore(o);
  ASSERT_TRUE(s.ok()) << s.status();
  PageStore* store = s->get();
  ASSERT_THAT(WriteVersion(store, 0, 1), IsOk());
  // Logical slab 1's placement, found by allocating it once and giving it back: placed again
  // on the same servers (the servers' loads are as they were).
  ASSERT_THAT(WriteVersion(store, kPps, 1), IsOk());
  auto first = ServersOfPage(*store, kPps);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_THAT(store->Trim(kPps, kPps), IsOk());
  WaitFor([&] { return SumServerStat(*cluster, "slabs_allocated") == 3u; }, "slab 1 given back");

  const size_t stopped = (*first)[0];
  std::vector<size_t> others;  // Every server but the stopped one.
  for (size_t i = 0; i < cluster->size(); ++i) {
    if (i != stopped) others.push_back(i);
  }
  const uint64_t frees_before = SumServerStat(*cluster, "ops_free", others);
  ASSERT_TRUE(cluster->Stop(stopped).ok());
  PendingWrites write(1);
  write.Submit(store, kPps, 2);
  WaitFor([&] { return write.all_done(); }, "the write of the new slab while a server is stopped");
  write.ExpectAllOk();
  const PageStoreStats st = store->Stats();
  EXPECT_EQ(st.allocs_abandoned, 1u) << "the member was not asked of the stopped server first "
                                        "(the placement changed), or was asked again";
  EXPECT_GE(st.server_suspicions, 1u);
  EXPECT_EQ(st.server_failures, 0u);
  auto now = ServersOfPage(*store, kPps);
  ASSERT_TRUE(now.ok());
  EXPECT_EQ(std::find(now->begin(), now->end(), stopped), now->end());
  ExpectVersion(store, kPps, kPps + 1, 2);

  ASSERT_TRUE(cluster->Cont(stopped).ok());
  auto zero = ServersOfPage(*store, 0);
  ASSERT_TRUE(zero.ok());
  const uint64_t kept =
      std::find(zero->begin(), zero->end(), stopped) != zero->end() ? 1 : 0;  // Slab 0's member.
  // The resumed server answers the ALLOC it was stopped in; the client gives that slab back.
  WaitFor([&] { return SumServerStat(*cluster, "ops_free", others) > frees_before; },
          "the abandoned ALLOC's slab to be given back");
  EXPECT_EQ(SumServerStat(*cluster, "slabs_allocated", others), kept);
  EXPECT_EQ(SumServerStat(*cluster, "slabs_allocated"), 2u * 3u);
  EXPECT_EQ(store->Stats().write_errors, 0u);
}

// The group layout allocates its slabs off the I/O thread, one slab ahead of need: while the
// ALLOC of the next slab waits for a server that has stopped (SIGSTOP; no heartbeats, so it is
// not suspected), the writes that the spare slab has rows for are stored, and the reads of the
// slabs the store has complete; only a stripe that needs the new slab waits for it. With the
// ALLOC on the I/O thread, everything waited control_timeout_ms behind it.
TEST(GroupLayoutTest, WritesAndReadsGoOnWhileANewSlabsAllocWaitsForAStoppedServer) {
  auto cluster = StartCluster(3);
  ASSERT_NE(cluster, nullptr);
  constexpr uint64_t kPerSlab = 32;  // RS(2,1), 64K slabs: 16 rows of 2 data pages.
  ErasureCodedStoreOptions o = OneIoThreadNoHeartbeats(*cluster, 8 * kPerSlab, 6000);
  o.layout = EcLayout::kGroup;
  o.ack = AckPolicy::kFirstK;  // A stripe is acknowledged without the stopped server's member.
  o.group.fill_us = 10000;     // Full stripes: a batch takes a known number of rows.
  auto s = CreateErasureCodedStore(o);
  ASSERT_TRUE(s.ok()) << s.status();
  PageStore* store = s->get();
  WriteAll(store, 2 * kPerSlab);  // Two slabs full ...
  ASSERT_THAT(store->Flush(), IsOk());
  // ... and the spare allocated ahead of need.
  WaitFor([&] { return SumServerStat(*cluster, "slabs_allocated") == 3 * 3u; }, "the spare slab");

  ASSERT_TRUE(cluster->Stop(2).ok());
  // A slab's worth of new pages fills the spare; its first stripe starts the allocation of the
  // next slab, whose ALLOC to the stopped server waits for its deadline (6 s).
  PendingWrites spare(kPerSlab);
  spare.Submit(store, 2 * kPerSlab, 1);
  // One stripe more, which needs the next slab.
  PendingWrites next(2);
  next.Submit(store, 3 * kPerSlab, 1);
  ExpectVersion(store, 0, 2 * kPerSlab, 1);
  WaitFor([&] { return spare.all_done(); }, "the writes the spare slab has rows for");
  EXPECT_EQ(next.done(), 0u) << "the stripe that needs the new slab did not wait for its ALLOC, "
                                "or the reads and the other writes waited for it";
  spare.ExpectAllOk();

  ASSERT_TRUE(cluster->Cont(2).ok());
  WaitFor([&] { return next.all_done(); }, "the stripe of the new slab");
  next.ExpectAllOk();
  ASSERT_THAT(store->Flush(), IsOk());
  VerifyAll(store, std::vector<uint32_t>(3 * kPerSlab + 2, 1));
  EXPECT_EQ(store->Stats().server_failures, 0u);
  EXPECT_EQ(store->Stats().write_errors, 0u);
  EXPECT_EQ(store->Stats().data_loss, 0u);
}

// The replacement of a failed server's member is allocated off the I/O thread too: while its
// ALLOC waits for the only server left to take it, which has stopped (6 s deadline), reads of
// the slab (degraded) complete, and a write to the slab waits for the replacement to be there
// (it is stored on all k + r members). With the ALLOC on the I/O thread, the reads waited
// behind it, and the write was stored without the member.
TEST(RemoteStoreTest, ReadsGoOnWhileAReplacementsAllocWaitsForAStoppedServer) {
  auto cluster = StartCluster(4);
  ASSERT_NE(cluster, nullptr);
  constexpr uint64_t kPps = 32;
  ErasureCodedStoreOptions o = OneIoThreadNoHeartbeats(*cluster, 4 * kPps, 6000);
  auto s = CreateErasureCodedStore(o);
  ASSERT_TRUE(s.ok()) << s.status();
  PageStore* store = s->get();
  WriteAll(store, kPps);  // Logical slab 0.
  ASSERT_THAT(store->Flush(), IsOk());
  auto servers = ServersOfPage(*store, 0);
  ASSERT_TRUE(servers.ok()) << servers.status();
  ASSERT_EQ(servers->size(), 3u);
  size_t spare = 0;
  while (std::find(servers->begin(), servers->end(), spare) != servers->end()) ++spare;
  const size_t dead = (*servers)[0];

  ASSERT_TRUE(cluster->Stop(spare).ok());
  ASSERT_TRUE(cluster->Kill(dead).ok());
  // The I/O thread finds the connection gone at its next request there, cannot reconnect, and
  // the monitor's probe is refused: a verdict. The split on it is re-placed on the stopped one.
  uint8_t buf[kPageSize];
  ASSERT_THAT(store->ReadPage(0, buf), IsOk());
  WaitFor([&] { return store->Stats().server_failures == 1; }, "the killed server's verdict");
  PendingWrites write(1);
  write.Submit(store, 5, 2);
  ExpectVersion(store, 0, 5, 1);
  ExpectVersion(store, 6, kPps, 1);
  EXPECT_EQ(write.done(), 0u) << "the write did not wait for the replacement, or the reads "
                                 "waited for its ALLOC";

  ASSERT_TRUE(cluster->Cont(spare).ok());
  WaitFor([&] { return write.all_done(); }, "the write to the replacement");
  write.ExpectAllOk();
  auto now = ServersOfPage(*store, 0);
  ASSERT_TRUE(now.ok());
  EXPECT_NE(std::find(now->begin(), now->end(), spare), now->end()) << "not re-placed";
  ExpectVersion(store, 5, 6, 2);
  ExpectVersion(store, 6, kPps, 1);
  EXPECT_EQ(store->Stats().server_failures, 1u);
  EXPECT_EQ(store->Stats().write_errors, 0u);
  EXPECT_EQ(store->Stats().data_loss, 0u);
}

}  // namespace
}  // namespace tessera::client
