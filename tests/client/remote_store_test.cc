// The remote stores against real memservers on loopback (LocalCluster): round trips of every
// layout, and the failure tests of the issue: SIGKILL r servers under mixed load, r+1 servers of
// one coding group (exactly the affected pages report DataLoss), a SIGSTOPped straggler (late
// binding keeps reads completing), bit flips (detected and repaired), eviction (nothing lost),
// and several threads with many ops in flight.
#include "client/remote_store.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "client/local_cluster.h"
#include "common/clock.h"
#include "common/logging.h"
#include "fabric/control_client.h"
#include "tests/client/remote_store_testing.h"
#include "tests/support/status_matchers.h"
#include "tests/support/test_util.h"

namespace tessera::client {
namespace {

using namespace remote_testing;  // NOLINT(build/namespaces): the shared helpers.
using ::tessera::testing::IsOk;
using ::tessera::testing::StatusIs;
using ::testing::HasSubstr;

// The failure tests run against both erasure-coded layouts.
class EcLayoutTest : public ::testing::TestWithParam<EcLayout> {
 protected:
  bool group() const { return GetParam() == EcLayout::kGroup; }
};

std::string LayoutParamName(const ::testing::TestParamInfo<EcLayout>& info) {
  return std::string(EcLayoutName(info.param));
}

// A store made with `o`, every page (of `pages`) written and flushed. nullptr (with a test
// failure) if it cannot be made.
std::unique_ptr<PageStore> WrittenStore(const ErasureCodedStoreOptions& o, uint64_t pages) {
  auto s = CreateErasureCodedStore(o);
  if (!s.ok()) {
    ADD_FAILURE() << s.status();
    return nullptr;
  }
  WriteAll(s->get(), pages);
  Status st = (*s)->Flush();
  if (!st.ok()) {
    ADD_FAILURE() << st;
    return nullptr;
  }
  return std::move(*s);
}

// The stopped-server tests' store over `c`: RS(4,2), delta 1, 24 op contexts
// (max_inflight_pages 8), op and heartbeat timeouts of 20 s (longer than such a test may take),
// every page written and flushed. nullptr (with a test failure) if it cannot be made.
std::unique_ptr<PageStore> StoppedServerStore(const LocalCluster& c, uint64_t pages, EcLayout layout) {
  ErasureCodedStoreOptions o = EcOptions(c, pages, 4, 2, layout);
  o.delta = 1;
  o.remote.max_inflight_pages = 8;
  o.remote.op_timeout_ms = 20000;
  o.remote.heartbeat_timeout_ms = 20000;
  return WrittenStore(o, pages);
}


TEST(RemoteStoreTest, RoundTripEveryLayout) {
  auto cluster = StartCluster(6);
  ASSERT_NE(cluster, nullptr);
  constexpr uint64_t kPages = 200;
  std::vector<std::unique_ptr<PageStore>> stores;
  {
    ErasureCodedStoreOptions o = EcOptions(*cluster, kPages, 4, 2);
    auto s = CreateErasureCodedStore(o);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_DOUBLE_EQ((*s)->memory_overhead(), 1.5);
    stores.push_back(std::move(*s));
    o.ack = AckPolicy::kFirstK;
    o.delta = 2;
    auto f = CreateErasureCodedStore(o);
    ASSERT_TRUE(f.ok()) << f.status();
    EXPECT_EQ((*f)->name(), "ec(4,2) delta=2 ack=first-k");
    stores.push_back(std::move(*f));
    // The group layout, both ack policies; k need not divide 4096 there.
    o = EcOptions(*cluster, kPages, 3, 2, EcLayout::kGroup);
    auto g = CreateErasureCodedStore(o);
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_EQ((*g)->name(), "ec-group(3,2) delta=1 ack=all");
    EXPECT_NEAR((*g)->memory_overhead(), 5.0 / 3.0, 1e-9);
    stores.push_back(std::move(*g));
    o.ack = AckPolicy::kFirstK;
    auto gf = CreateErasureCodedStore(o);
    ASSERT_TRUE(gf.ok()) << gf.status();
    stores.push_back(std::move(*gf));
  }
  for (int copies : {1, 2, 3}) {
    ReplicatedStoreOptions o;
    o.remote = RemoteOptions(*cluster, kPages);
    o.copies = copies;
    o.read_fanout = copies > 1 ? 2 : 1;
    auto s = CreateReplicatedStore(o);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_DOUBLE_EQ((*s)->memory_overhead(), copies);
    stores.push_back(std::move(*s));
  }
  for (auto& s : stores) {
    SCOPED_TRACE(s->name());
    WriteAll(s.get(), kPages - 1);
    std::vector<uint32_t> v(kPages - 1, 1);
    VerifyAll(s.get(), v);
    // Overwrite some pages; the newest acknowledged version is read back.
    for (PageId p = 0; p < 20; ++p) ASSERT_TRUE(WriteVersion(s.get(), p, 2).ok());
    for (PageId p = 0; p < 20; ++p) v[p] = 2;
    VerifyAll(s.get(), v);
    uint8_t buf[kPageSize];
    std::memset(buf, 0xAB, kPageSize);
    ASSERT_TRUE(s->ReadPage(kPages - 1, buf).ok());  // Never written: zeros.
    EXPECT_TRUE(std::all_of(buf, buf + kPageSize, [](uint8_t b) { return b == 0; }));
    Status oor = s->ReadPage(kPages, buf);
    EXPECT_EQ(oor.code(), StatusCode::kOutOfRange) << oor;
    ASSERT_TRUE(s->Flush().ok());
    auto st = s->Stats();
    EXPECT_GE(st.writes, kPages - 1 + 20);
    EXPECT_EQ(st.read_errors, 1u);  // The out-of-range read.
    EXPECT_EQ(st.data_loss, 0u);
    EXPECT_GT(st.read_latency.count(), 0u);
  }
  // Settings are validated.
  ErasureCodedStoreOptions bad;
  bad.layout = EcLayout::kSplit;
  bad.remote = RemoteOptions(*cluster, kPages);
  bad.k = 3;
  EXPECT_FALSE(CreateErasureCodedStore(bad).ok());
  bad.k = 8;  // 10 splits, 6 servers.
  EXPECT_FALSE(CreateErasureCodedStore(bad).ok());
  bad.k = 4;
  bad.delta = 3;
  EXPECT_FALSE(CreateErasureCodedStore(bad).ok());
}

// Mixed load from two threads, each on its own pages (so each knows its pages' contents).
struct Load {
  PageStore* store;
  std::vector<uint32_t>* versions;
  PageId first, count;
  std::atomic<uint64_t>* ops;
  std::atomic<bool>* stop;
  std::atomic<uint64_t>* errors;
  void operator()() {
    std::mt19937_64 rng(first + 7);
    uint8_t buf[kPageSize];
    while (!stop->load()) {
      PageId p = first + rng() % count;
      if (rng() % 3 == 0) {
        uint32_t v = (*versions)[p] + 1;
        Fill(p, v, buf);
        if (store->WritePage(p, buf).ok()) {
          (*versions)[p] = v;
        } else {
          errors->fetch_add(1);
        }
      } else {
        Status st = store->ReadPage(p, buf);
        if (!st.ok() || !Matches(p, (*versions)[p], buf)) {
          errors->fetch_add(1);
          ADD_FAILURE() << "page " << p << ": " << st;
        }
      }
      ops->fetch_add(1);
    }
  }
};


TEST_P(EcLayoutTest, SigkillRServersUnderMixedLoadLosesNothing) {
  auto cluster = StartCluster(8);
  ASSERT_NE(cluster, nullptr);
  constexpr uint64_t kPages = 512;
  ErasureCodedStoreOptions o = EcOptions(*cluster, kPages, 4, 2, GetParam());
  auto s = CreateErasureCodedStore(o);
  ASSERT_TRUE(s.ok()) << s.status();
  PageStore* store = s->get();
  WriteAll(store, kPages);
  std::vector<uint32_t> versions(kPages, 1);

  std::atomic<uint64_t> ops{0}, errors{0};
  std::atomic<bool> stop{false};
  std::thread a(Load{store, &versions, 0, kPages / 2, &ops, &stop, &errors});
  std::thread b(Load{store, &versions, kPages / 2, kPages / 2, &ops, &stop, &errors});
  std::mt19937 rng(42);
  std::vector<size_t> idx(cluster->size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  std::shuffle(idx.begin(), idx.end(), rng);
  WaitFor([&] { return ops.load() >= 200; }, "load to start");
  ASSERT_TRUE(cluster->Kill(idx[0]).ok());
  const uint64_t at = ops.load();
  WaitFor([&] { return ops.load() >= at + 200; }, "load after the first kill");
  ASSERT_TRUE(cluster->Kill(idx[1]).ok());
  const uint64_t at2 = ops.load();
  WaitFor([&] { return ops.load() >= at2 + 300; }, "load after the second kill");
  stop.store(true);
  a.join();
  b.join();
  EXPECT_EQ(errors.load(), 0u);
  VerifyAll(store, versions);
  // Killed servers are suspect at once (lost connections, refused reconnects) and failed after
  // fail_after_ms plus a refused confirming probe: not necessarily before the load ended.
  WaitFor([&] { return store->Stats().server_failures == 2; }, "the two kills to be declared");
  auto st = store->Stats();
  EXPECT_EQ(st.server_failures, 2u);
  EXPECT_EQ(st.data_loss, 0u);
  EXPECT_GT(st.degraded_reads + st.regenerations_done, 0u);
  // Regeneration finishes; afterwards all pages are still right.
  WaitFor([&] { return store->Stats().regenerations_pending == 0; }, "regeneration");
  VerifyAll(store, versions);
}


// Many pages in flight: splits for one server travel coalesced (READV/WRITEV, far fewer requests
// than splits). A server SIGKILLed while a big write batch is in flight, another while a big
// read batch is: every write is acknowledged, every page reads back right.
TEST_P(EcLayoutTest, CoalescedBatchesSurviveKillsMidBatch) {
  auto cluster = StartCluster(6);
  ASSERT_NE(cluster, nullptr);
  constexpr uint64_t kPages = 1536;
  ErasureCodedStoreOptions o = EcOptions(*cluster, kPages, 4, 2, GetParam());
  auto s = CreateErasureCodedStore(o);
  ASSERT_TRUE(s.ok()) << s.status();
  PageStore* store = s->get();
  std::vector<uint8_t> bufs(kPages * kPageSize);
  std::vector<PageId> ids(kPages);
  for (PageId p = 0; p < kPages; ++p) {
    ids[p] = p;
    Fill(p, 1, bufs.data() + p * kPageSize);
  }
  // 1. One batch of every page, no failure: count requests against splits.
  const uint64_t requests_before = SumServerStat(*cluster, "data_requests");
  ASSERT_TRUE(store->WritePages(ids.data(), kPages, bufs.data()).ok());
  const uint64_t requests = SumServerStat(*cluster, "data_requests") - requests_before;
  // Split layout: 6 splits per page; group: 6 members per stripe of 4 pages.
  const uint64_t splits = group() ? kPages / 4 * 6 : kPages * 6;
  EXPECT_LT(requests * 4, splits) << requests << " requests for " << splits
                                  << " split writes: splits were not coalesced";

  // 2. Version 2 of every page in one batch; a server dies while it is in flight.
  for (PageId p = 0; p < kPages; ++p) Fill(p, 2, bufs.data() + p * kPageSize);
  std::mt19937 rng(7);
  std::vector<size_t> victims = {rng() % 6};
  victims.push_back((victims[0] + 1 + rng() % 5) % 6);
  std::thread killer([&] { EXPECT_TRUE(cluster->Kill(victims[0]).ok()); });
  Status w = store->WritePages(ids.data(), kPages, bufs.data());
  killer.join();
  ASSERT_TRUE(w.ok()) << w;

  // 3. Read every page back in one batch while a second server dies.
  std::vector<uint8_t> got(kPages * kPageSize);
  std::thread killer2([&] { EXPECT_TRUE(cluster->Kill(victims[1]).ok()); });
  Status r = store->ReadPages(ids.data(), kPages, got.data());
  killer2.join();
  ASSERT_TRUE(r.ok()) << r;
  for (PageId p = 0; p < kPages; ++p) {
    ASSERT_TRUE(Matches(p, 2, got.data() + p * kPageSize)) << "page " << p;
  }
  std::vector<uint32_t> versions(kPages, 2);
  VerifyAll(store, versions);
  auto st = store->Stats();
  EXPECT_EQ(st.data_loss, 0u);
  EXPECT_EQ(st.read_errors + st.write_errors, 0u);
}

// Late binding steers around a straggler: with 2 copies and read_fanout 1, a read asks one
// copy; once a server answers far slower than the others, reads ask the other copy first
// (without this, every read whose primary copy is on the slow server waits out its delay).
TEST(RemoteStoreTest, ReadsAvoidAServerThatIsMuchSlowerThanTheOthers) {
  auto cluster = StartCluster(2);
  ASSERT_NE(cluster, nullptr);
  ReplicatedStoreOptions o;
  o.remote = RemoteOptions(*cluster, 512);
  o.copies = 2;
  auto s = CreateReplicatedStore(o);
  ASSERT_TRUE(s.ok()) << s.status();
  PageStore* store = s->get();
  WriteAll(store, 512);  // Both servers hold a copy of every page.
  ASSERT_TRUE(cluster->Fault(1, {"delay", "100ms"}).ok());
  // Writes (ack=all) wait for both copies: they teach the store that server 1 is slow.
  for (PageId p = 0; p < 8; ++p) ASSERT_TRUE(WriteVersion(store, p, 1).ok());
  const uint64_t start = MonotonicNs();
  uint8_t buf[kPageSize];
  for (PageId p = 0; p < 512; p += 8) {  // 64 reads over every slab.
    ASSERT_TRUE(store->ReadPage(p, buf).ok());
    ASSERT_TRUE(Matches(p, 1, buf)) << p;
  }
  const uint64_t ms = (MonotonicNs() - start) / 1000000;
  // Half of the slabs have their primary copy on server 1: 32 reads x 100 ms = 3.2 s if the
  // delay were paid; avoided, 64 reads take milliseconds (a few re-probes of the slow server
  // may still pay it).
  EXPECT_LT(ms, 1600u) << "reads kept waiting for the slow server";
  ASSERT_TRUE(cluster->Fault(1, {"clear"}).ok());
}

// poll_us: the I/O thread polls before sleeping; same results, and out-of-range values refused.
TEST_P(EcLayoutTest, PollingIoThreadRoundTripsAndBadPollIsRefused) {
  auto cluster = StartCluster(6);
  ASSERT_NE(cluster, nullptr);
  ErasureCodedStoreOptions o = EcOptions(*cluster, 256, 4, 2, GetParam());
  o.remote.poll_us = 1001;
  auto bad = CreateErasureCodedStore(o);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument) << bad.status();
  o.remote.poll_us = 200;
  auto s = CreateErasureCodedStore(o);
  ASSERT_TRUE(s.ok()) << s.status();
  WriteAll(s->get(), 256);
  for (PageId p = 0; p < 256; p += 3) ASSERT_TRUE(WriteVersion(s->get(), p, 2).ok());
  std::vector<uint32_t> versions(256, 1);
  for (PageId p = 0; p < 256; p += 3) versions[p] = 2;
  VerifyAll(s->get(), versions);
}

TEST_P(EcLayoutTest, KillRPlusOneOfOneGroupExactlyAffectedPagesReportDataLoss) {
  auto cluster = StartCluster(8);
  ASSERT_NE(cluster, nullptr);
  constexpr uint64_t kPages = 1024;  // 16 logical slabs of 64 pages.
  ErasureCodedStoreOptions o = EcOptions(*cluster, kPages, 4, 2, GetParam());
  auto s = CreateErasureCodedStore(o);
  ASSERT_TRUE(s.ok()) << s.status();
  PageStore* store = s->get();
  WriteAll(store, kPages);
  auto victims = ServersOfPage(*store, 0);
  ASSERT_TRUE(victims.ok()) << victims.status();
  std::set<size_t> killed(victims->begin(), victims->begin() + 3);  // r + 1 of page 0's group.
  std::vector<bool> affected(kPages);
  size_t n_affected = 0;
  for (PageId p = 0; p < kPages; ++p) {
    auto servers = ServersOfPage(*store, p);
    ASSERT_TRUE(servers.ok());
    int lost = 0;
    for (size_t sv : *servers) lost += killed.count(sv);
    // Split layout: a page needs 4 of its 6 servers. Group: its own server (first), or 4 of
    // the 6 members of its stripe.
    affected[p] = lost > 2 && (!group() || killed.count((*servers)[0]) > 0);
    n_affected += affected[p];
  }
  // All r + 1 at once: every one is signalled before any is reaped. Killed one by one, the
  // store may notice the first death (a reset connection) before the next kill and rebuild
  // that server's splits of page 0's slab on a spare, and page 0 is then not lost.
  for (size_t k : killed) ASSERT_EQ(::kill(cluster->pid(k), SIGKILL), 0) << "server " << k;
  for (size_t k : killed) ASSERT_TRUE(cluster->Kill(k).ok());
  uint8_t buf[kPageSize];
  for (PageId p = 0; p < kPages; ++p) {
    Status st = store->ReadPage(p, buf);
    if (affected[p]) {
      ASSERT_THAT(st, StatusIs(StatusCode::kDataLoss, HasSubstr("page " + std::to_string(p) + ":")))
          << "page " << p;
    } else {
      ASSERT_THAT(st, IsOk()) << "page " << p;
      ASSERT_TRUE(Matches(p, 1, buf)) << "page " << p;
    }
  }
  EXPECT_GT(n_affected, 0u);
  EXPECT_LT(n_affected, kPages);
  EXPECT_EQ(store->Stats().data_loss, n_affected);
  // An affected page written again is whole again.
  Status rewrite = WriteVersion(store, 0, 5);
  ASSERT_TRUE(rewrite.ok()) << rewrite;
  ASSERT_TRUE(store->ReadPage(0, buf).ok());
  EXPECT_TRUE(Matches(0, 5, buf));
}

TEST_P(EcLayoutTest, SigstopStragglerReadsCompleteByLateBinding) {
  auto cluster = StartCluster(6);
  ASSERT_NE(cluster, nullptr);
  constexpr uint64_t kPages = 256;
  ErasureCodedStoreOptions o = EcOptions(*cluster, kPages, 4, 2, GetParam());
  o.delta = 1;
  // Long timeouts: only late binding can make reads complete while the server is stopped.
  o.remote.op_timeout_ms = 60000;
  o.remote.heartbeat_timeout_ms = 60000;
  auto s = CreateErasureCodedStore(o);
  ASSERT_TRUE(s.ok()) << s.status();
  PageStore* store = s->get();
  WriteAll(store, kPages);
  auto servers = ServersOfPage(*store, 0);
  ASSERT_TRUE(servers.ok());
  const size_t straggler = (*servers)[0];  // Holds data split 0 of page 0.
  ASSERT_TRUE(cluster->Stop(straggler).ok());
  const uint64_t t0 = MonotonicNs();
  uint8_t buf[kPageSize];
  for (PageId p = 0; p < kPages; ++p) {
    Status st = store->ReadPage(p, buf);
    ASSERT_TRUE(st.ok()) << "page " << p << ": " << st;
    ASSERT_TRUE(Matches(p, 1, buf)) << "page " << p;
  }
  const double secs = static_cast<double>(MonotonicNs() - t0) / 1e9;
  ASSERT_TRUE(cluster->Cont(straggler).ok());
  EXPECT_LT(secs, 30.0);
  auto st = store->Stats();
  EXPECT_EQ(st.server_failures, 0u);
  EXPECT_GE(st.decodes, 1u);
  EXPECT_GE(st.degraded_reads, 1u);
  if (group()) {
    EXPECT_GE(st.hedged_reads + st.degraded_reads, 1u);
  }
}

// A stopped server used to keep every read that asked it (a late split, or the group layout's
// own member of a degraded read) holding its op context until the op timeout: with few contexts
// the store stalled after max_inflight_pages reads. Late requests of finished reads are now let
// go, and an overdue server counts as slow (asked last), so reads keep flowing.
TEST_P(EcLayoutTest, StoppedStragglerDoesNotHoldOpContexts) {
  auto cluster = StartCluster(6);
  ASSERT_NE(cluster, nullptr);
  constexpr uint64_t kPages = 256;
  auto owned = StoppedServerStore(*cluster, kPages, GetParam());
  ASSERT_NE(owned, nullptr);
  PageStore* store = owned.get();
  auto servers = ServersOfPage(*store, 0);
  ASSERT_TRUE(servers.ok());
  const size_t straggler = (*servers)[0];
  ASSERT_TRUE(cluster->Stop(straggler).ok());
  const uint64_t t0 = MonotonicNs();
  uint8_t buf[kPageSize];
  for (int pass = 0; pass < 2; ++pass) {
    for (PageId p = 0; p < kPages; ++p) {
      Status st = store->ReadPage(p, buf);
      ASSERT_TRUE(st.ok()) << "page " << p << ": " << st;
      ASSERT_TRUE(Matches(p, 1, buf)) << "page " << p;
    }
  }
  const double secs = static_cast<double>(MonotonicNs() - t0) / 1e9;
  ASSERT_TRUE(cluster->Cont(straggler).ok());
  EXPECT_LT(secs, 10.0) << "512 reads with a stopped server; the op timeout is 20 s";
  EXPECT_EQ(store->Stats().server_failures, 0u);
  EXPECT_EQ(store->Stats().data_loss, 0u);
}

// The state StoppedStragglerDoesNotHoldOpContexts stalled in now and then on a loaded machine,
// made every read's: a stopped server, and servers that answer but are classified slow. A read
// wants k + delta splits (stripe members), finds only k on servers answering normally, and its
// slow pass took the extra one from the first slow server in split order: the stopped one.
// Every such request kept a spare reply buffer (64 per I/O thread) until the server failed;
// with those gone finished reads kept their op contexts, and with those gone (24 here) the
// store stalled until the op timeout. A silent server is asked only when k cannot be had
// without it.
TEST_P(EcLayoutTest, StoppedServerIsNotAskedForTheExtraSplitWhenOthersAreSlow) {
  auto cluster = StartCluster(6);
  ASSERT_NE(cluster, nullptr);
  constexpr uint64_t kPages = 256;
  auto owned = StoppedServerStore(*cluster, kPages, GetParam());
  ASSERT_NE(owned, nullptr);
  PageStore* store = owned.get();
  // Page 0's servers: split layout, in split order; group, the page's own server first, then the
  // other members of its stripe in member order. The pages with this very list (page 0's
  // logical slab, and any other placed alike) have the stopped server ahead of the two slow
  // ones in split (member) order: group, its member holds a data page (index < k) and the last
  // two others are members k and k + 1.
  auto servers = ServersOfPage(*store, 0);
  ASSERT_TRUE(servers.ok()) << servers.status();
  ASSERT_EQ(servers->size(), 6u);
  std::vector<PageId> pages;
  for (PageId p = 0; p < kPages; ++p) {
    auto sp = ServersOfPage(*store, p);
    ASSERT_TRUE(sp.ok()) << sp.status();
    if (*sp == *servers) pages.push_back(p);
  }
  ASSERT_GE(pages.size(), 8u);
  const size_t straggler = (*servers)[0];
  // Slow, not silent: 3 ms is far above the others' reply time (and above hedge_us, so direct
  // reads hand those pages to the I/O thread too).
  ASSERT_TRUE(cluster->Fault((*servers)[4], {"delay", "3ms"}).ok());
  ASSERT_TRUE(cluster->Fault((*servers)[5], {"delay", "3ms"}).ok());
  ASSERT_TRUE(cluster->Stop(straggler).ok());
  // More reads than the spare buffers and op contexts together (64 + 24).
  constexpr int kReads = 160;
  const uint64_t t0 = MonotonicNs();
  uint8_t buf[kPageSize];
  for (int i = 0; i < kReads; ++i) {
    const PageId p = pages[static_cast<size_t>(i) % pages.size()];
    Status st = store->ReadPage(p, buf);
    ASSERT_TRUE(st.ok()) << "read " << i << ", page " << p << ": " << st;
    ASSERT_TRUE(Matches(p, 1, buf)) << "page " << p;
  }
  const double secs = static_cast<double>(MonotonicNs() - t0) / 1e9;
  ASSERT_TRUE(cluster->Cont(straggler).ok());
  ASSERT_TRUE(cluster->Fault((*servers)[4], {"clear"}).ok());
  ASSERT_TRUE(cluster->Fault((*servers)[5], {"clear"}).ok());
  EXPECT_LT(secs, 10.0) << kReads << " reads with a stopped server; the op timeout is 20 s";
  EXPECT_EQ(store->Stats().server_failures, 0u);
  EXPECT_EQ(store->Stats().data_loss, 0u);
}

// A store over `c` whose reads through the I/O thread never hedge (split: delta 0; group:
// hedge_us 0), so that a request to a stopped server waits half the op timeout (10 s) before
// its read asks elsewhere; RS(4,2), 24 op contexts, at most 8 requests outstanding at one
// server, op and heartbeat timeouts of 20 s; every page written and flushed.
std::unique_ptr<PageStore> CappedStore(const LocalCluster& c, uint64_t pages, EcLayout layout) {
  ErasureCodedStoreOptions o = EcOptions(c, pages, 4, 2, layout);
  o.delta = 0;
  o.group.hedge_us = 0;
  o.remote.direct_reads = false;
  o.remote.max_inflight_pages = 8;
  o.remote.max_outstanding_per_server = 8;
  o.remote.op_timeout_ms = 20000;
  o.remote.heartbeat_timeout_ms = 20000;
  return WrittenStore(o, pages);
}

// The requests outstanding at one server are capped. A stopped server takes requests until it
// holds its cap (8); reads then leave it out and ask the other members (unless k cannot be had
// without it: the split layout's first burst of reads finds every server at the cap), and once
// it has been silent at its cap for a quarter of the op timeout (at most 1 s) its connection is
// aborted, which gives the op contexts its requests held back (their reads ask elsewhere).
// Without the cap every op context ended up waiting on the stopped server, and the reads took
// half the op timeout or more. Only the stopped server is suspected, nothing is failed, and its
// connection comes back once it answers.
TEST_P(EcLayoutTest, ReadsGoOnWhileAStoppedServerHoldsItsCapOfRequests) {
  auto cluster = StartCluster(6);
  ASSERT_NE(cluster, nullptr);
  constexpr uint64_t kPages = 256;
  auto owned = CappedStore(*cluster, kPages, GetParam());
  ASSERT_NE(owned, nullptr);
  PageStore* store = owned.get();
  auto servers = ServersOfPage(*store, 0);
  ASSERT_TRUE(servers.ok()) << servers.status();
  const size_t stopped = (*servers)[0];
  ASSERT_TRUE(cluster->Stop(stopped).ok());
  std::vector<PageId> ids(kPages);
  for (PageId p = 0; p < kPages; ++p) ids[p] = p;
  std::vector<uint8_t> out(kPages * kPageSize);
  const uint64_t t0 = MonotonicNs();
  ASSERT_THAT(store->ReadPages(ids.data(), kPages, out.data()), IsOk());
  const double secs = static_cast<double>(MonotonicNs() - t0) / 1e9;
  for (PageId p = 0; p < kPages; ++p) {
    ASSERT_TRUE(Matches(p, 1, out.data() + p * kPageSize)) << "page " << p;
  }
  EXPECT_LT(secs, 5.0) << kPages << " reads with a stopped server; a request there waits 10 s "
                       << "for its read to ask elsewhere";
  EXPECT_LE(store->Stats().server_suspicions, 1u) << "a server that answers was suspected";
  EXPECT_EQ(store->Stats().server_failures, 0u);
  ASSERT_TRUE(cluster->Cont(stopped).ok());
  WaitFor([&] { return store->Stats().reconnects >= 1; }, "the aborted connection to come back");
  VerifyAll(store, std::vector<uint32_t>(kPages, 1));
  ASSERT_THAT(WriteVersion(store, 0, 2), IsOk());  // Stored on every member, the stopped one too.
  ASSERT_THAT(store->Flush(), IsOk());
  ExpectVersion(store, 0, 1, 2);
  EXPECT_EQ(store->Stats().server_failures, 0u);
  EXPECT_EQ(store->Stats().data_loss, 0u);
}

// A server that is merely slow (every reply 200 ms late) holds its cap of requests while
// writes wait for it, but it keeps answering: it is never aborted nor suspected, and every
// write is stored.
TEST_P(EcLayoutTest, ABusyServerAtItsCapIsNotAborted) {
  auto cluster = StartCluster(6);
  ASSERT_NE(cluster, nullptr);
  constexpr uint64_t kPages = 64;
  auto owned = CappedStore(*cluster, kPages, GetParam());
  ASSERT_NE(owned, nullptr);
  PageStore* store = owned.get();
  auto servers = ServersOfPage(*store, 0);
  ASSERT_TRUE(servers.ok()) << servers.status();
  const size_t busy = (*servers)[0];
  ASSERT_TRUE(cluster->Fault(busy, {"delay", "200ms"}).ok());
  // Every page rewritten at once: with the store's 24 op contexts, far more writes want the
  // busy server than its cap lets through.
  std::vector<uint32_t> versions(kPages, 2);
  std::vector<PageId> ids(kPages);
  std::vector<uint8_t> data(kPages * kPageSize);
  for (PageId p = 0; p < kPages; ++p) {
    ids[p] = p;
    Fill(p, 2, data.data() + p * kPageSize);
  }
  ASSERT_THAT(store->WritePages(ids.data(), kPages, data.data()), IsOk());
  ASSERT_THAT(store->Flush(), IsOk());
  VerifyAll(store, versions);
  ASSERT_TRUE(cluster->Fault(busy, {"clear"}).ok());
  const PageStoreStats st = store->Stats();
  EXPECT_EQ(st.reconnects, 0u) << "the busy server's connection was aborted";
  EXPECT_EQ(st.server_suspicions, 0u);
  EXPECT_EQ(st.server_failures, 0u);
  EXPECT_EQ(st.write_errors, 0u);
  EXPECT_EQ(st.data_loss, 0u);
}

// RS(4,2) over `c` with heartbeats every 20 ms and suspicion after 200 ms of silence, and an
// op timeout (60 s) no such test reaches: only the failure detector's verdicts count. Every
// page written and flushed (WrittenStore).
std::unique_ptr<PageStore> HeartbeatVerdictStore(const LocalCluster& c, uint64_t pages,
                                                 EcLayout layout) {
  ErasureCodedStoreOptions o = EcOptions(c, pages, 4, 2, layout);
  o.remote.heartbeat_interval_ms = 20;
  o.remote.heartbeat_timeout_ms = 200;
  o.remote.op_timeout_ms = 60000;
  return WrittenStore(o, pages);
}

TEST_P(EcLayoutTest, HeartbeatTimeoutFailsAStoppedServerAndItsSplitsAreRegenerated) {
  auto cluster = StartCluster(8);
  ASSERT_NE(cluster, nullptr);
  constexpr uint64_t kPages = 64 * 4;
  auto owned = HeartbeatVerdictStore(*cluster, kPages, GetParam());
  ASSERT_NE(owned, nullptr);
  PageStore* store = owned.get();
  auto servers = ServersOfPage(*store, 0);
  ASSERT_TRUE(servers.ok());
  const size_t victim = (*servers)[1];
  ASSERT_TRUE(cluster->Stop(victim).ok());
  WaitFor([&] { return store->Stats().server_failures == 1; }, "the heartbeat to fail the server");
  WaitFor([&] {
    auto x = store->Stats();
    return x.regenerations_done > 0 && x.regenerations_pending == 0;
  }, "regeneration onto replacements");
  std::vector<uint32_t> versions(kPages, 1);
  VerifyAll(store, versions);
  ASSERT_TRUE(cluster->Cont(victim).ok());
  EXPECT_EQ(store->Stats().data_loss, 0u);
}

// r + 1 of the k + r servers stop at once (a machine that gives its memservers no CPU for a
// while): every page has a split on each of them, so failing all of them would lose every
// page. The verdicts on silence stop at r: the last stopped server's verdict is held (it stays
// suspect), and once the servers resume it answers, is healthy again, and every page reads
// back. Without the cap all r + 1 were failed and every read failed with DataLoss.
TEST_P(EcLayoutTest, StoppingMoreThanRServersFailsAtMostRAndLosesNothing) {
  auto cluster = StartCluster(6);
  ASSERT_NE(cluster, nullptr);
  constexpr uint64_t kPages = 64 * 4;
  auto owned = HeartbeatVerdictStore(*cluster, kPages, GetParam());
  ASSERT_NE(owned, nullptr);
  PageStore* store = owned.get();
  for (size_t i = 0; i < 3; ++i) ASSERT_TRUE(cluster->Stop(i).ok());
  WaitFor([&] { return store->Stats().verdicts_held >= 1; },
          "the verdict on the third stopped server to be held");
  EXPECT_EQ(store->Stats().server_failures, 2u);
  const uint64_t recovered = store->Stats().server_recoveries;
  for (size_t i = 0; i < 3; ++i) ASSERT_TRUE(cluster->Cont(i).ok());
  WaitFor([&] { return store->Stats().server_recoveries > recovered; },
          "the held server to answer again");
  VerifyAll(store, std::vector<uint32_t>(kPages, 1));
  const PageStoreStats st = store->Stats();
  EXPECT_EQ(st.server_failures, 2u);
  EXPECT_EQ(st.data_loss, 0u);
  EXPECT_EQ(st.read_errors, 0u);
}

TEST_P(EcLayoutTest, BitFlipsAreDetectedAndRepaired) {
  auto cluster = StartCluster(6);
  ASSERT_NE(cluster, nullptr);
  constexpr uint64_t kPages = 64 * 4;  // Every split slot of 4 logical slabs is written.
  ErasureCodedStoreOptions o = EcOptions(*cluster, kPages, 4, 2, GetParam());
  // delta 0: every read asks exactly the data splits, so a second pass reads the same splits
  // and must find them repaired (with delta 1 a late extra split may be checked in one pass
  // and not the other).
  o.delta = 0;
  // A direct read slower than the hedge time on a loaded machine hands that server's pages to
  // degraded reads (group), which do not ask it, so its flipped bits would go unseen.
  o.group.hedge_us = 1000000;
  auto s = CreateErasureCodedStore(o);
  ASSERT_TRUE(s.ok()) << s.status();
  PageStore* store = s->get();
  WriteAll(store, kPages);
  ASSERT_TRUE(cluster->Fault(1, {"bitflip", "40"}).ok());
  std::vector<uint32_t> versions(kPages, 1);
  VerifyAll(store, versions);
  auto st = store->Stats();
  EXPECT_GT(st.corruptions_detected, 0u);
  EXPECT_EQ(st.data_loss, 0u);
  WaitFor([&] {
    auto x = store->Stats();
    return x.corruptions_repaired >= x.corruptions_detected;
  }, "repairs");
  // A later pass finds nothing new: the bad splits were rewritten. Reads ask splits on a
  // server that answers much slower than the others last, so under load a pass may read a
  // split the previous one skipped (and find it bad, and repair it): allow a few passes.
  uint64_t detected = store->Stats().corruptions_detected;
  bool clean = false;
  for (int pass = 0; pass < 5 && !clean; ++pass) {
    VerifyAll(store, versions);
    WaitFor([&] {
      auto x = store->Stats();
      return x.corruptions_repaired >= x.corruptions_detected;
    }, "repairs");
    const uint64_t now = store->Stats().corruptions_detected;
    clean = now == detected;
    detected = now;
  }
  EXPECT_TRUE(clean) << "every pass found new bad splits: repairs are not being stored";
  EXPECT_EQ(store->Stats().data_loss, 0u);
}

TEST_P(EcLayoutTest, EvictionNoticeMovesSplitsAndLosesNothing) {
  auto cluster = StartCluster(8);  // Spare servers to move the evicted splits to.
  ASSERT_NE(cluster, nullptr);
  constexpr uint64_t kPages = 64 * 6;
  ErasureCodedStoreOptions o = EcOptions(*cluster, kPages, 4, 2, GetParam());
  auto s = CreateErasureCodedStore(o);
  ASSERT_TRUE(s.ok()) << s.status();
  PageStore* store = s->get();
  WriteAll(store, kPages);
  ASSERT_TRUE(cluster->Fault(2, {"evict", "3"}).ok());
  ASSERT_TRUE(cluster->Fault(3, {"evict", "3"}).ok());
  WaitFor([&] {
    auto x = store->Stats();
    return x.regenerations_done > 0 && x.regenerations_pending == 0;
  }, "regeneration of the evicted splits");
  std::vector<uint32_t> versions(kPages, 1);
  VerifyAll(store, versions);
  auto st = store->Stats();
  EXPECT_EQ(st.data_loss, 0u);
  EXPECT_EQ(st.server_failures, 0u);
  EXPECT_EQ(st.corruptions_detected, 0u);
}

struct AsyncCounter {
  std::atomic<uint64_t> done{0};
  std::atomic<uint64_t> failed{0};
};

void OnDone(PageOp* op) {
  auto* c = static_cast<AsyncCounter*>(op->user);
  if (!op->status.ok()) c->failed.fetch_add(1);
  c->done.fetch_add(1, std::memory_order_release);
  c->done.notify_all();
}

TEST_P(EcLayoutTest, ManyThreadsManyOpsInFlight) {
  auto cluster = StartCluster(6);
  ASSERT_NE(cluster, nullptr);
  constexpr int kThreads = 4;
  constexpr uint64_t kPerThread = 128;
  constexpr int kDepth = 32;
  ErasureCodedStoreOptions o;
  o.remote = RemoteOptions(*cluster, kThreads * kPerThread);
  o.remote.io_threads = 2;
  o.k = 4;
  o.r = 2;
  o.layout = GetParam();
  auto s = CreateErasureCodedStore(o);
  ASSERT_TRUE(s.ok()) << s.status();
  PageStore* store = s->get();
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const PageId first = t * kPerThread;
      std::vector<uint8_t> bufs(kDepth * kPageSize);
      std::vector<PageOp> ops(kDepth);
      std::vector<PageOp*> ptrs(kDepth);
      for (int round = 0; round < 2; ++round) {
        for (uint64_t base = 0; base < kPerThread; base += kDepth) {
          for (int kind = 0; kind < 2; ++kind) {
            AsyncCounter counter;
            for (int i = 0; i < kDepth; ++i) {
              ops[i] = PageOp{};
              ops[i].kind = kind == 0 ? PageOp::Kind::kWrite : PageOp::Kind::kRead;
              ops[i].page = first + base + i;
              ops[i].buf = bufs.data() + i * kPageSize;
              if (kind == 0) Fill(ops[i].page, round + 1, ops[i].buf);
              ops[i].done = OnDone;
              ops[i].user = &counter;
              ptrs[i] = &ops[i];
            }
            if (!store->Submit(ptrs).ok()) {
              bad.fetch_add(1);
              return;
            }
            Deadline d = Deadline::AfterMs(kWaitMs);
            for (uint64_t v = counter.done.load(); v < kDepth; v = counter.done.load()) {
              if (d.Expired()) {
                bad.fetch_add(1);
                return;
              }
              std::this_thread::yield();
            }
            if (counter.failed.load() != 0) bad.fetch_add(1);
            if (kind == 1) {
              for (int i = 0; i < kDepth; ++i) {
                if (!Matches(ops[i].page, round + 1, ops[i].buf)) bad.fetch_add(1);
              }
            }
          }
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
  auto st = store->Stats();
  EXPECT_EQ(st.reads, kThreads * kPerThread * 2);
  EXPECT_EQ(st.writes, kThreads * kPerThread * 2);
}


INSTANTIATE_TEST_SUITE_P(Layouts, EcLayoutTest,
                         ::testing::Values(EcLayout::kSplit, EcLayout::kGroup), LayoutParamName);

TEST(EcLayoutNamesTest, ParseAndName) {
  EXPECT_EQ(*ParseEcLayout("split"), EcLayout::kSplit);
  EXPECT_EQ(*ParseEcLayout("group"), EcLayout::kGroup);
  EXPECT_EQ(EcLayoutName(EcLayout::kGroup), "group");
  EXPECT_EQ(EcLayoutName(EcLayout::kSplit), "split");
  EXPECT_THAT(ParseEcLayout("batch"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("(split, group)")));
  EXPECT_THAT(ParseEcLayout("group"), IsOk());
}

// Group layout: rewriting pages again and again leaves garbage in old stripes; compaction
// re-stripes the survivors so the used stripe space stays within max_garbage_factor x the live
// pages, and every page still reads back right (also after r servers die).
// Both ways of reclaiming garbage: re-striping live pages, and in-place parity updates of the
// garbage slots.
class GroupCompactionTest : public ::testing::TestWithParam<GroupCompaction> {};

TEST_P(GroupCompactionTest, CompactionBoundsGarbageAndLosesNothing) {
  auto cluster = StartCluster(6);
  ASSERT_NE(cluster, nullptr);
  constexpr uint64_t kPages = 512;
  ErasureCodedStoreOptions o = EcOptions(*cluster, kPages, 4, 2, EcLayout::kGroup);
  o.group.compaction = GetParam();
  auto s = CreateErasureCodedStore(o);
  ASSERT_TRUE(s.ok()) << s.status();
  PageStore* store = s->get();
  WriteAll(store, kPages);
  std::vector<uint32_t> versions(kPages, 1);
  // Rewrite a shifting eighth of the pages, one at a time, many rounds: each rewrite turns a
  // slot of an old stripe into garbage.
  std::mt19937 rng(5);
  for (int round = 0; round < 6; ++round) {
    for (PageId p = 0; p < kPages; ++p) {
      if (rng() % 8 != 0) continue;
      ASSERT_TRUE(WriteVersion(store, p, ++versions[p]).ok());
    }
  }
  ASSERT_TRUE(store->Flush().ok());
  // Remote memory: at most (k+r)/k x 1.2 x the pages, plus three slabs per server of the group
  // of slack (slab granularity: a partly used slab, the spare allocated ahead of need, and one
  // being drained) -- 512 pages of 4K.
  const double data = kPages * kPageSize;
  const double bound = data * 1.5 * 1.2 + 3 * 6 * 65536.0;
  WaitFor([&] { return static_cast<double>(store->Stats().remote_bytes) <= bound; },
          "compaction to bring the remote memory within (k+r)/k x 1.2");
  {
    auto x = store->Stats();
    EXPECT_LE(static_cast<double>(x.remote_bytes), bound)
        << "remote " << x.remote_bytes << " stored " << x.stored_pages << " moves "
        << x.compaction_moves << " stripes " << x.stripes_written << " padding "
        << x.padding_slots;
  }
  auto st = store->Stats();
  if (GetParam() == GroupCompaction::kRestripe) {
    EXPECT_GT(st.compaction_moves, 0u);
    EXPECT_EQ(st.slots_reclaimed, 0u);
  } else {
    EXPECT_GT(st.slots_reclaimed, 0u);  // Garbage slots refilled in place ...
    EXPECT_GT(st.parity_updates, 0u);
  }
  EXPECT_EQ(st.stored_pages, kPages);
  VerifyAll(store, versions);
  // Nothing is lost, after compaction, when r servers die (in-place: the updated parity is
  // right, or decodes would return wrong bytes and fail the CRC).
  ASSERT_TRUE(cluster->Kill(0).ok());
  ASSERT_TRUE(cluster->Kill(3).ok());
  VerifyAll(store, versions);
  EXPECT_EQ(store->Stats().data_loss, 0u);
}

INSTANTIATE_TEST_SUITE_P(Compactions, GroupCompactionTest,
                         ::testing::Values(GroupCompaction::kRestripe, GroupCompaction::kInPlace),
                         [](const ::testing::TestParamInfo<GroupCompaction>& info) {
                           return info.param == GroupCompaction::kRestripe ? "restripe"
                                                                           : "in_place";
                         });

TEST(GroupCompactionTest, NamesParseBothWays) {
  for (GroupCompaction c : {GroupCompaction::kRestripe, GroupCompaction::kInPlace}) {
    auto parsed = ParseGroupCompaction(GroupCompactionName(c));
    ASSERT_THAT(parsed, IsOk());
    EXPECT_EQ(*parsed, c);
  }
  EXPECT_THAT(ParseGroupCompaction("defrag"), StatusIs(StatusCode::kInvalidArgument));
}

// Group layout: single-page writes wait in the stripe buffer for at most fill_us, and Flush()
// seals it at once: when Flush returns, every acknowledged write is stored with all k+r
// members, so r servers can die at once without losing any of them.
TEST(GroupLayoutTest, FlushSealsTheStripeBufferAndGivesFullResilience) {
  auto cluster = StartCluster(6);
  ASSERT_NE(cluster, nullptr);
  constexpr uint64_t kPages = 64;
  ErasureCodedStoreOptions o = EcOptions(*cluster, kPages, 4, 2, EcLayout::kGroup);
  o.group.fill_us = 10000;  // Long: only Flush() (or a full stripe) seals early.
  o.ack = AckPolicy::kFirstK;
  auto s = CreateErasureCodedStore(o);
  ASSERT_TRUE(s.ok()) << s.status();
  PageStore* store = s->get();
  // 3 pages (fewer than k): they wait in the buffer until Flush().
  std::vector<uint8_t> bufs(3 * kPageSize);
  std::vector<PageOp> ops(3);
  AsyncCounter counter;
  for (int i = 0; i < 3; ++i) {
    Fill(i, 1, bufs.data() + i * kPageSize);
    ops[i].kind = PageOp::Kind::kWrite;
    ops[i].page = i;
    ops[i].buf = bufs.data() + i * kPageSize;
    ops[i].done = OnDone;
    ops[i].user = &counter;
    PageOp* one = &ops[i];
    ASSERT_TRUE(store->Submit(std::span<PageOp* const>(&one, 1)).ok());
  }
  ASSERT_THAT(store->Flush(), IsOk());
  EXPECT_EQ(counter.done.load(), 3u);
  EXPECT_EQ(counter.failed.load(), 0u);
  auto st = store->Stats();
  EXPECT_EQ(st.stored_pages, 3u);
  EXPECT_EQ(st.padding_slots, 1u);  // One stripe of 3 pages and 1 padding slot.
  // Kill r members of the stripe other than page 0's own server, and page 0's own server.
  auto servers = ServersOfPage(*store, 0);
  ASSERT_TRUE(servers.ok()) << servers.status();
  ASSERT_EQ(servers->size(), 5u);  // Its own, 2 other pages', 2 parity (padding: nowhere).
  ASSERT_TRUE(cluster->Kill((*servers)[0]).ok());
  ASSERT_TRUE(cluster->Kill((*servers)[4]).ok());
  std::vector<uint32_t> versions(3, 1);
  VerifyAll(store, versions);
  EXPECT_GE(store->Stats().decodes, 1u);
  EXPECT_EQ(store->Stats().data_loss, 0u);
}


}  // namespace
}  // namespace tessera::client
