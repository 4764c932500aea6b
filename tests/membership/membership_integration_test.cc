// Membership through a real etcd with real memserver processes: registration under a lease,
// clients following joins, leaves and failures (a lease that expires regenerates the splits),
// and etcd itself restarting mid-run.
#include <signal.h>

#include <cstring>
#include <functional>
#include <memory>

#include <gtest/gtest.h>

#include "client/local_cluster.h"
#include "client/remote_store.h"
#include "common/clock.h"
#include "membership/etcd_view.h"
#include "tests/support/etcd_process.h"
#include "tests/support/test_util.h"

namespace tessera::membership {
namespace {

using client::LocalCluster;
using client::LocalClusterOptions;
using client::PageStore;
using client::PageId;
using client::kPageSize;
using testing::EtcdProcess;

constexpr int kWaitMs = 20000;
constexpr const char* kCluster = "itest";

void WaitFor(const std::function<bool()>& pred, const std::string& what, int ms = kWaitMs) {
  const Deadline d = Deadline::AfterMs(ms);
  while (!pred()) {
    ASSERT_FALSE(d.Expired()) << "timed out waiting for " << what;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // Poll interval, bounded.
  }
}

void Fill(PageId page, uint32_t version, uint8_t* out) {
  uint64_t x = page * 0x9E3779B97F4A7C15ull + version * 0xC2B2AE3D27D4EB4Full + 1;
  for (size_t i = 0; i < kPageSize; i += 8) {
    x ^= x >> 29;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 32;
    std::memcpy(out + i, &x, 8);
  }
}

void WriteRange(PageStore* s, PageId first, uint64_t n, uint32_t version) {
  std::vector<uint8_t> buf(kPageSize);
  for (PageId p = first; p < first + n; ++p) {
    Fill(p, version, buf.data());
    Status st = s->WritePage(p, buf.data());
    ASSERT_TRUE(st.ok()) << "write page " << p << ": " << st;
  }
}

void VerifyRange(PageStore* s, PageId first, uint64_t n, uint32_t version) {
  std::vector<uint8_t> buf(kPageSize), want(kPageSize);
  for (PageId p = first; p < first + n; ++p) {
    Status st = s->ReadPage(p, buf.data());
    ASSERT_TRUE(st.ok()) << "read page " << p << ": " << st;
    Fill(p, version, want.data());
    ASSERT_EQ(std::memcmp(buf.data(), want.data(), kPageSize), 0) << "page " << p << " differs";
  }
}

class EtcdMembershipTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string why = EtcdProcess::SkipReason(); !why.empty()) GTEST_SKIP() << why;
    auto e = EtcdProcess::Start();
    ASSERT_TRUE(e.ok()) << e.status();
    etcd_ = std::move(*e);
    eo_.endpoints = {etcd_->endpoint()};
  }

  // n memservers registered in etcd (lease ttl 2 s). `token`: share another cluster's secret.
  std::unique_ptr<LocalCluster> StartServers(size_t n, const std::string& token = "") {
    LocalClusterOptions o;
    o.bin_dir = testing::BinDir();
    o.servers = n;
    o.capacity = "8M";
    o.slab_size = "64K";
    o.extra_flags = {"--etcd=" + etcd_->endpoint(), std::string("--cluster_name=") + kCluster,
                     "--etcd_ttl=2s"};
    if (!token.empty()) o.extra_flags.push_back("--auth_token_file=" + token);
    auto c = LocalCluster::Start(o);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  }

  std::unique_ptr<MembershipView> View() {
    auto v = MembershipView::Start(eo_, kCluster);
    EXPECT_TRUE(v.ok()) << v.status();
    return v.ok() ? std::move(*v) : nullptr;
  }

  static bool HasEndpoint(const std::vector<ServerRecord>& m, const fabric::Endpoint& e) {
    for (const auto& r : m) {
      if (r.endpoint == e.ToString()) return true;
    }
    return false;
  }

  // n registered servers, a view that has seen them all, and an RS(2,1) store of 256 pages over
  // them (TCP) that follows the view; `tweak` adjusts the store's options. Members are declared
  // in the order they must be torn down last to first.
  struct Rig {
    std::unique_ptr<LocalCluster> cluster;
    std::unique_ptr<MembershipView> view;
    std::unique_ptr<client::RemotePageStore> store;
    std::unique_ptr<StoreFollower> follower;
  };
  void StartRig(size_t n, Rig* rig,
                const std::function<void(client::ErasureCodedStoreOptions*)>& tweak = {}) {
    rig->cluster = StartServers(n);
    ASSERT_NE(rig->cluster, nullptr);
    rig->view = View();
    ASSERT_NE(rig->view, nullptr);
    ASSERT_TRUE(rig->view->WaitFor([n](const auto& m) { return m.size() == n; }, kWaitMs));
    auto servers = ToRemoteServers(rig->view->Members());
    ASSERT_TRUE(servers.ok()) << servers.status();
    client::ErasureCodedStoreOptions o;
    o.remote.servers = *servers;
    o.remote.secret = rig->cluster->secret();
    o.remote.transport = fabric::TransportKind::kTcp;
    o.remote.capacity_pages = 256;
    o.k = 2;
    o.r = 1;
    if (tweak) tweak(&o);
    auto s = client::CreateErasureCodedStore(o);
    ASSERT_TRUE(s.ok()) << s.status();
    rig->store = std::move(*s);
    auto f = StoreFollower::Start(rig->view.get(), rig->store.get());
    ASSERT_TRUE(f.ok()) << f.status();
    rig->follower = std::move(*f);
  }

  std::unique_ptr<EtcdProcess> etcd_;
  EtcdOptions eo_;
};

TEST_F(EtcdMembershipTest, ServersRegisterAndLeaveGracefullyOrByLeaseExpiry) {
  auto cluster = StartServers(3);
  ASSERT_NE(cluster, nullptr);
  auto view = View();
  ASSERT_NE(view, nullptr);
  ASSERT_TRUE(view->WaitFor([](const auto& m) { return m.size() == 3; }, kWaitMs));
  for (const auto& e : cluster->endpoints()) EXPECT_TRUE(HasEndpoint(view->Members(), e));
  const auto rec = view->Members().front();
  EXPECT_EQ(rec.capacity, 8u << 20);
  EXPECT_EQ(rec.slab_size, 64u << 10);
  EXPECT_GT(rec.pid, 0);
  EXPECT_EQ(rec.server_id.size(), 16u);
  // SIGTERM: the key is deleted at once (well before the 2 s lease could expire).
  const uint64_t t0 = MonotonicNs();
  ASSERT_EQ(::kill(cluster->pid(0), SIGTERM), 0);
  ASSERT_TRUE(view->WaitFor(
      [&](const auto& m) { return m.size() == 2 && !HasEndpoint(m, cluster->endpoints()[0]); },
      kWaitMs));
  EXPECT_LT(MonotonicNs() - t0, 1'800'000'000ull) << "graceful leave waited for the lease";
  // SIGKILL: the key vanishes when the lease expires.
  ASSERT_TRUE(cluster->Kill(1).ok());
  ASSERT_TRUE(view->WaitFor(
      [&](const auto& m) { return m.size() == 1 && !HasEndpoint(m, cluster->endpoints()[1]); },
      kWaitMs))
      << "the killed server's lease did not expire";
}

TEST_F(EtcdMembershipTest, StoreUsesJoinedServersAndALeaseExpiryRegeneratesSplits) {
  Rig rig;
  StartRig(3, &rig, [](client::ErasureCodedStoreOptions* o) {
    // A lease expiry is trouble, not a verdict: it makes the server suspect, and a confirming
    // probe that times out fails it only once its silence is long enough by the detector's
    // measure too (4 s here). Op timeouts stay out of it.
    o->remote.heartbeat_timeout_ms = 4000;
    o->remote.op_timeout_ms = 15000;
    o->layout = client::EcLayout::kSplit;
  });
  if (HasFatalFailure()) return;
  LocalCluster* first = rig.cluster.get();
  client::RemotePageStore* store = rig.store.get();
  WriteRange(store, 0, 128, 1);

  // Two servers join (same secret): the store connects to them.
  auto second = StartServers(2, first->token_path());
  ASSERT_NE(second, nullptr);
  WaitFor([&] { return client::RemoteServersOf(*store)->size() == 5; }, "the store to add 2 servers");
  auto failed = client::RemoteServersFailed(*store);
  for (bool f : *failed) EXPECT_FALSE(f);

  // Stop (not kill) server 0: its TCP connections stay open and it answers nothing. Its lease
  // expires and it stays silent: the client fails it and regenerates onto the new servers (the
  // only live ones outside the old set).
  auto where = client::ServersOfPage(*store, 0);
  ASSERT_TRUE(where.ok());
  const size_t victim = (*where)[0];  // Store index (the store's order is etcd's).
  ASSERT_LT(victim, 3u);
  const fabric::Endpoint victim_ep = (*client::RemoteServersOf(*store))[victim].endpoint;
  size_t stopped = first->size();  // The same server in the LocalCluster's order.
  for (size_t i = 0; i < first->size(); ++i) {
    if (first->endpoints()[i].port == victim_ep.port) stopped = i;
  }
  ASSERT_LT(stopped, first->size());
  ASSERT_TRUE(first->Stop(stopped).ok());
  WaitFor([&] { return store->Stats().server_failures == 1; },
          "the lease expiry and its silence to fail it");
  EXPECT_GE(store->Stats().server_suspicions, 1u);
  EXPECT_TRUE((*client::RemoteServersFailed(*store))[victim]);
  WaitFor([&] {
    auto x = store->Stats();
    return x.regenerations_done > 0 && x.regenerations_pending == 0;
  }, "regeneration onto the joined servers");
  where = client::ServersOfPage(*store, 0);
  ASSERT_TRUE(where.ok());
  bool on_new = false;
  for (size_t i : *where) on_new |= i >= 3;
  EXPECT_TRUE(on_new) << "page 0's splits did not move to a joined server";
  VerifyRange(store, 0, 128, 1);
  // New writes go to the current membership; everything still reads back.
  WriteRange(store, 128, 128, 2);
  VerifyRange(store, 128, 128, 2);
  EXPECT_EQ(store->Stats().data_loss, 0u);
  EXPECT_GE(rig.follower->leaves(), 1u);
  rig.follower.reset();
  ASSERT_TRUE(first->Cont(stopped).ok());  // Else the monitor's heartbeat to it holds shutdown.
  rig.store.reset();  // Before `second` goes.
}

TEST_F(EtcdMembershipTest, SigkilledServerIsRegeneratedAndDataSurvives) {
  Rig rig;
  StartRig(4, &rig);
  if (HasFatalFailure()) return;
  LocalCluster* cluster = rig.cluster.get();
  MembershipView* view = rig.view.get();
  client::RemotePageStore* store = rig.store.get();
  WriteRange(store, 0, 256, 1);
  auto where = client::ServersOfPage(*store, 0);
  ASSERT_TRUE(where.ok());
  auto all = client::RemoteServersOf(*store);
  const fabric::Endpoint victim_ep = (*all)[(*where)[0]].endpoint;
  size_t victim = 0;
  for (size_t i = 0; i < cluster->size(); ++i) {
    if (cluster->endpoints()[i].port == victim_ep.port) victim = i;
  }
  ASSERT_TRUE(cluster->Kill(victim).ok());
  ASSERT_TRUE(view->WaitFor([&](const auto& m) { return !HasEndpoint(m, victim_ep); }, kWaitMs))
      << "the SIGKILLed server's lease did not expire";
  WaitFor([&] {
    auto x = store->Stats();
    return x.server_failures == 1 && x.regenerations_done > 0 && x.regenerations_pending == 0;
  }, "regeneration after the kill");
  VerifyRange(store, 0, 256, 1);
  EXPECT_EQ(store->Stats().data_loss, 0u);
}

TEST_F(EtcdMembershipTest, EtcdRestartMidRunLosesNothingAndTheWatchResumes) {
  Rig rig;
  StartRig(3, &rig);
  if (HasFatalFailure()) return;
  LocalCluster* first = rig.cluster.get();
  MembershipView* view = rig.view.get();
  client::RemotePageStore* store = rig.store.get();
  WriteRange(store, 0, 64, 1);
  const uint64_t snaps = view->snapshots();

  // etcd goes away: the client keeps working from its last view.
  ASSERT_TRUE(etcd_->Kill().ok());
  WriteRange(store, 64, 64, 1);
  VerifyRange(store, 0, 128, 1);
  EXPECT_EQ(view->Members().size(), 3u) << "the last view must survive etcd being away";
  // Back on the same ports and data: registrations are still there (leases are renewed when
  // etcd starts), the watch reconnects, and a server joining now is seen.
  ASSERT_TRUE(etcd_->Restart().ok());
  WaitFor([&] { return view->snapshots() > snaps; }, "the watch to reconnect");
  auto joiner = StartServers(1, first->token_path());
  ASSERT_NE(joiner, nullptr);
  WaitFor([&] { return client::RemoteServersOf(*store)->size() == 4; }, "the join after restart");
  ASSERT_TRUE(view->WaitFor([](const auto& m) { return m.size() == 4; }, kWaitMs));
  const auto now = *client::RemoteServersOf(*store);
  const auto failed_now = *client::RemoteServersFailed(*store);
  for (size_t i = 0; i < now.size(); ++i) {
    EXPECT_FALSE(failed_now[i]) << now[i].endpoint.ToString() << " marked failed";
  }
  EXPECT_EQ(store->Stats().server_failures, 0u);
  VerifyRange(store, 0, 128, 1);
  rig.follower.reset();
  rig.store.reset();  // Before `joiner` goes.
}

}  // namespace
}  // namespace tessera::membership
