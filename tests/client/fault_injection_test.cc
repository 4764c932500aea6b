// The remote stores over FaultInjectingTransport (client/testing/): corrupted read replies,
// failed data ops and dropped data connections, injected in the client's transport seam,
// against real memservers. Both erasure-coded layouts return every page right, count and
// repair the corruption, fail the servers whose ops fail, and reconnect to a stopped server
// without the I/O thread waiting for its handshake.
#include "client/testing/fault_injecting_transport.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "client/local_cluster.h"
#include "client/remote_store.h"
#include "common/clock.h"
#include "tests/support/status_matchers.h"
#include "tests/support/test_util.h"

namespace tessera::client {
namespace {

using ::tessera::testing::IsOk;

void Fill(PageId page, uint8_t* out) {
  for (size_t i = 0; i < kPageSize; ++i) out[i] = static_cast<uint8_t>(page * 131 + i * 7 + 1);
}

class FaultInjectionTest : public ::testing::TestWithParam<EcLayout> {};

TEST_P(FaultInjectionTest, CorruptRepliesAndFailedOpsLoseNothing) {
  LocalClusterOptions co;
  co.bin_dir = ::tessera::testing::BinDir();
  co.servers = 6;
  co.capacity = "4M";
  co.slab_size = "64K";
  auto cluster = LocalCluster::Start(co);
  ASSERT_THAT(cluster, IsOk());
  auto faults = std::make_shared<testing::TransportFaults>();
  ErasureCodedStoreOptions o;
  for (const auto& e : (*cluster)->endpoints()) o.remote.servers.push_back(RemoteServer{e, ""});
  o.remote.secret = (*cluster)->secret();
  o.remote.transport = fabric::TransportKind::kTcp;
  o.remote.capacity_pages = 256;
  o.remote.transport_factory = testing::FaultInjectingFactory(faults);
  o.k = 4;
  o.r = 2;
  o.delta = 0;
  o.layout = GetParam();
  // Group: a direct read whose reply takes longer than hedge_us on a loaded machine hands its
  // server's pages to degraded reads, which never ask the corrupting server, so nothing would
  // be detected; this test is about corruption, not stragglers.
  o.group.hedge_us = 1000000;
  // Likewise a server whose replies came late while the machine was loaded would be classified
  // slow and asked last: if it were the corrupting one, no read would ask it.
  o.remote.avoid_slow_servers = false;
  auto s = CreateErasureCodedStore(o);
  ASSERT_THAT(s, IsOk());
  PageStore* store = s->get();
  constexpr PageId kPages = 256;
  std::vector<uint8_t> data(kPages * kPageSize);
  std::vector<PageId> ids(kPages);
  for (PageId p = 0; p < kPages; ++p) {
    ids[p] = p;
    Fill(p, data.data() + p * kPageSize);
  }
  ASSERT_THAT(store->WritePages(ids.data(), kPages, data.data()), IsOk());
  ASSERT_THAT(store->Flush(), IsOk());
  auto verify = [&] {
    std::vector<uint8_t> got(kPages * kPageSize);
    ASSERT_THAT(store->ReadPages(ids.data(), kPages, got.data()), IsOk());
    for (PageId p = 0; p < kPages; ++p) {
      ASSERT_EQ(std::memcmp(got.data() + p * kPageSize, data.data() + p * kPageSize, kPageSize), 0)
          << "page " << p;
    }
  };
  // 1. Every read reply of page 0's first server is corrupted on the way in.
  auto servers = ServersOfPage(*store, 0);
  ASSERT_THAT(servers, IsOk());
  const std::string bad = (*cluster)->endpoints()[(*servers)[0]].ToString();
  faults->CorruptReadsFrom(bad, true);
  verify();
  faults->CorruptReadsFrom(bad, false);
  EXPECT_GT(faults->reads_corrupted.load(), 0u);
  auto st = store->Stats();
  EXPECT_GE(st.corruptions_detected, faults->reads_corrupted.load() > 0 ? 1u : 0u);
  EXPECT_EQ(st.data_loss, 0u);
  EXPECT_GE(st.decodes, 1u);
  // 2. Data ops to two servers fail: they are declared failed, pages come back by decoding.
  // The two are servers the reads below must ask: each the first server of some page (its own
  // server in the group layout, its first data split's in split). A server holding only parity
  // would be asked only by a degraded read, and with delta 0 perhaps not at all.
  std::vector<size_t> failing;
  for (PageId p = 1; p < kPages && failing.size() < 2; ++p) {
    auto of = ServersOfPage(*store, p);
    ASSERT_THAT(of, IsOk());
    const size_t first = (*of)[0];
    if (first != (*servers)[0] &&
        std::find(failing.begin(), failing.end(), first) == failing.end()) {
      failing.push_back(first);
    }
  }
  ASSERT_EQ(failing.size(), 2u) << "no two pages with distinct first servers besides page 0's";
  faults->FailOpsTo((*cluster)->endpoints()[failing[0]].ToString(), true);
  faults->FailOpsTo((*cluster)->endpoints()[failing[1]].ToString(), true);
  verify();
  EXPECT_GT(faults->ops_failed.load(), 0u);
  // Their data path is broken while they still answer heartbeats and probes: each is suspect at
  // once and failed after fail_after_ms of that (not on the first error).
  const Deadline d = Deadline::AfterMs(30000);
  while (store->Stats().server_failures < 2 && !d.Expired()) {
    verify();  // Reads keep meeting the broken servers until they are failed.
  }
  st = store->Stats();
  EXPECT_EQ(st.server_failures, 2u) << "the two servers whose data ops fail were not failed in 30 s";
  EXPECT_GE(st.server_suspicions, 2u);
  EXPECT_EQ(st.data_loss, 0u);
}

// A data connection lost while its server is stopped (SIGSTOP; no heartbeats, so it is not
// suspected): the reconnect's connect and handshake, which a stopped server never answers,
// run off the I/O thread, and the I/O thread makes its own connection only once the server has
// answered them. Reads meanwhile complete without that server, and the I/O thread never tries
// to connect to it while it is stopped (it used to, for up to 250 ms per attempt, with every
// request of the thread waiting); once the server runs again, the connection comes back.
TEST_P(FaultInjectionTest, AReconnectToAStoppedServerDoesNotHoldTheIoThread) {
  LocalClusterOptions co;
  co.bin_dir = ::tessera::testing::BinDir();
  co.servers = 6;
  co.capacity = "4M";
  co.slab_size = "64K";
  auto cluster = LocalCluster::Start(co);
  ASSERT_THAT(cluster, IsOk());
  auto faults = std::make_shared<testing::TransportFaults>();
  ErasureCodedStoreOptions o;
  for (const auto& e : (*cluster)->endpoints()) o.remote.servers.push_back(RemoteServer{e, ""});
  o.remote.secret = (*cluster)->secret();
  o.remote.transport = fabric::TransportKind::kTcp;
  o.remote.capacity_pages = 256;
  o.remote.transport_factory = testing::FaultInjectingFactory(faults);
  o.remote.direct_reads = false;  // Every read through the I/O thread.
  o.remote.heartbeat_interval_ms = 600000;
  o.remote.heartbeat_timeout_ms = 600000;
  o.remote.op_timeout_ms = 60000;
  o.remote.connect_timeout_ms = 20000;
  o.k = 4;
  o.r = 2;
  o.layout = GetParam();
  auto s = CreateErasureCodedStore(o);
  ASSERT_THAT(s, IsOk());
  PageStore* store = s->get();
  constexpr PageId kPages = 256;
  std::vector<uint8_t> data(kPages * kPageSize);
  std::vector<PageId> ids(kPages);
  for (PageId p = 0; p < kPages; ++p) {
    ids[p] = p;
    Fill(p, data.data() + p * kPageSize);
  }
  ASSERT_THAT(store->WritePages(ids.data(), kPages, data.data()), IsOk());
  ASSERT_THAT(store->Flush(), IsOk());
  auto verify = [&] {
    std::vector<uint8_t> got(kPages * kPageSize);
    ASSERT_THAT(store->ReadPages(ids.data(), kPages, got.data()), IsOk());
    for (PageId p = 0; p < kPages; ++p) {
      ASSERT_EQ(std::memcmp(got.data() + p * kPageSize, data.data() + p * kPageSize, kPageSize), 0)
          << "page " << p;
    }
  };
  auto servers = ServersOfPage(*store, 0);
  ASSERT_THAT(servers, IsOk());
  const size_t stopped = (*servers)[0];
  const std::string ep = (*cluster)->endpoints()[stopped].ToString();
  const uint64_t connects = faults->connects_to(ep);
  ASSERT_THAT((*cluster)->Stop(stopped), IsOk());
  faults->DropConnectionTo(ep);
  uint8_t buf[kPageSize];
  ASSERT_THAT(store->ReadPage(0, buf), IsOk());  // Its request there drops the connection.
  ASSERT_EQ(std::memcmp(buf, data.data(), kPageSize), 0);
  for (int round = 0; round < 10; ++round) verify();  // Many housekeeping rounds.
  EXPECT_EQ(faults->connects_to(ep), connects)
      << "the I/O thread tried to connect to the stopped server (a handshake it never answers)";
  EXPECT_EQ(store->Stats().reconnects, 0u);

  ASSERT_THAT((*cluster)->Cont(stopped), IsOk());
  const Deadline d = Deadline::AfterMs(30000);
  while (store->Stats().reconnects == 0 && !d.Expired()) verify();
  EXPECT_EQ(store->Stats().reconnects, 1u) << "the connection did not come back in 30 s";
  EXPECT_GT(faults->connects_to(ep), connects);
  ASSERT_THAT(store->WritePages(ids.data(), kPages, data.data()), IsOk());
  ASSERT_THAT(store->Flush(), IsOk());  // Every member stored, the resumed server's too.
  verify();
  EXPECT_EQ(store->Stats().server_failures, 0u);
  EXPECT_EQ(store->Stats().data_loss, 0u);
}

INSTANTIATE_TEST_SUITE_P(Layouts, FaultInjectionTest,
                         ::testing::Values(EcLayout::kSplit, EcLayout::kGroup),
                         [](const ::testing::TestParamInfo<EcLayout>& i) {
                           return std::string(EcLayoutName(i.param));
                         });

}  // namespace
}  // namespace tessera::client
