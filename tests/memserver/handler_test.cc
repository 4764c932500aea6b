// MemServerHandler without a network: the engine's calls are made directly.
#include "memserver/handler.h"

#include <gtest/gtest.h>

#include <cstring>

#include "common/clock.h"
#include "fabric/auth.h"

namespace tessera::memserver {
namespace {

constexpr uint64_t kSlab = 64 << 10;

class HandlerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SlabPool::Options o;
    o.slab_bytes = kSlab;
    o.capacity_bytes = 4 * kSlab;
    auto p = SlabPool::Create(o);
    ASSERT_TRUE(p.ok()) << p.status();
    pool_ = std::move(p).value();
    MemServerHandler::Options ho;
    ho.fault_injection = true;  // The fault tests below need it; it is off by default.
    handler_ = std::make_unique<MemServerHandler>(pool_.get(), ho);
    fabric::MemoryRegistration reg;
    reg.base_addr = reinterpret_cast<uint64_t>(pool_->base());
    handler_->AttachServer(nullptr, reg);
    alice_.client_id = 1;
    alice_.owner_id = 1;
    bob_.client_id = 2;
    bob_.owner_id = 2;
    root_.client_id = 3;
    root_.owner_id = 3;
    root_.admin = true;  // The cluster secret or an admin token (fabric/credential.h).
  }
  uint64_t Alloc(const fabric::PeerInfo& who) {
    auto r = handler_->AllocSlab(who, {});
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->slab_id : 0;
  }
  std::unique_ptr<SlabPool> pool_;
  std::unique_ptr<MemServerHandler> handler_;
  fabric::PeerInfo alice_, bob_, root_;
};

TEST_F(HandlerTest, AllocResolvesToRegisteredMemory) {
  auto r = handler_->AllocSlab(alice_, {});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->size, kSlab);
  auto mem = handler_->ResolveWrite(alice_, fabric::WriteRequest{r->slab_id, 0, 16});
  ASSERT_TRUE(mem.ok());
  EXPECT_EQ(reinterpret_cast<uint64_t>(mem->data()), r->remote_addr);
  // Size hints above the slab size cannot be met; smaller ones get a whole slab.
  EXPECT_EQ(handler_->AllocSlab(alice_, {kSlab + 1}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(handler_->AllocSlab(alice_, {4096}).ok());
}

TEST_F(HandlerTest, OwnershipAndBoundsAndMetrics) {
  uint64_t slab = Alloc(alice_);
  EXPECT_TRUE(handler_->ResolveRead(alice_, {slab, kSlab - 8, 8}).ok());
  EXPECT_EQ(handler_->ResolveRead(bob_, {slab, 0, 8}).status().code(),
            StatusCode::kPermissionDenied);
  EXPECT_EQ(handler_->ResolveRead(alice_, {slab, kSlab - 8, 9}).status().code(),
            StatusCode::kOutOfRange);
  EXPECT_EQ(handler_->FreeSlab(bob_, {slab}).code(), StatusCode::kPermissionDenied);
  EXPECT_TRUE(handler_->FreeSlab(alice_, {slab}).ok());
  EXPECT_EQ(handler_->metrics().ops(OpSlot::kRead), 3u);
  EXPECT_EQ(handler_->metrics().errors(OpSlot::kRead), 2u);
  EXPECT_EQ(handler_->metrics().bytes_read(), 8u);
  EXPECT_EQ(handler_->metrics().errors(OpSlot::kFree), 1u);
}

TEST_F(HandlerTest, InvokeRegistry) {
  auto echo = [](const fabric::PeerInfo& p, std::span<const uint8_t> a)
      -> Result<std::vector<uint8_t>> {
    std::vector<uint8_t> out(a.begin(), a.end());
    out.push_back(static_cast<uint8_t>(p.client_id));
    return out;
  };
  ASSERT_TRUE(handler_->RegisterFunction(7, "echo", echo).ok());
  EXPECT_EQ(handler_->RegisterFunction(7, "again", echo).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(handler_->RegisterFunction(kReservedFunctionIdBase, "x", echo).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(handler_->RegisterFunction(8, "empty", nullptr).code(), StatusCode::kInvalidArgument);
  const uint8_t args[] = {9, 8};
  auto r = handler_->Invoke(bob_, 7, args);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, (std::vector<uint8_t>{9, 8, 2}));
  EXPECT_EQ(handler_->Invoke(bob_, 99, args).status().code(), StatusCode::kNotFound);
}

TEST_F(HandlerTest, WireFaultsBecomePolicies) {
  fabric::FaultRequest f;
  f.action = fabric::FaultAction::kDelay;
  f.delay_us = 250;
  ASSERT_TRUE(handler_->Fault(root_, f).ok());
  auto p = handler_->BeforeOp(alice_, fabric::Op::kRead);
  EXPECT_EQ(p.action, fabric::OpPolicy::Action::kDelay);
  EXPECT_EQ(p.delay_ns, 250000u);
  EXPECT_EQ(handler_->BeforeOp(alice_, fabric::Op::kFault).action,
            fabric::OpPolicy::Action::kProceed);
  f = {};
  f.action = fabric::FaultAction::kHang;
  f.op_mask = 1u << static_cast<int>(fabric::Op::kStats);
  ASSERT_TRUE(handler_->Fault(root_, f).ok());
  EXPECT_EQ(handler_->BeforeOp(alice_, fabric::Op::kStats).action,
            fabric::OpPolicy::Action::kHang);
  f = {};
  f.action = fabric::FaultAction::kDropConnection;
  ASSERT_TRUE(handler_->Fault(root_, f).ok());
  EXPECT_EQ(handler_->BeforeOp(alice_, fabric::Op::kWrite).action,
            fabric::OpPolicy::Action::kDrop);
  ASSERT_TRUE(handler_->Fault(root_, fabric::FaultRequest{}).ok());  // clear
  EXPECT_EQ(handler_->BeforeOp(alice_, fabric::Op::kWrite).action,
            fabric::OpPolicy::Action::kProceed);
  // Faulting FAULT itself is refused, and eviction needs a monitor.
  f = {};
  f.action = fabric::FaultAction::kHang;
  f.op_mask = 1u << static_cast<int>(fabric::Op::kFault);
  EXPECT_EQ(handler_->Fault(root_, f).code(), StatusCode::kInvalidArgument);
  f = {};
  f.action = fabric::FaultAction::kEvictSlabs;
  f.count = 1;
  EXPECT_EQ(handler_->Fault(root_, f).code(), StatusCode::kUnsupported);
}

TEST_F(HandlerTest, FaultInvokeFlipsBitsAndRefusesAllocation) {
  uint64_t slab = Alloc(alice_);
  FaultSpec flip{FaultKind::kBitFlip};
  flip.count = 1;
  flip.slab_id = slab;
  std::string args = EncodeFaultSpec(flip);
  auto r = handler_->Invoke(
      root_, kFaultFunctionId,
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(args.data()), args.size()));
  ASSERT_TRUE(r.ok()) << r.status();
  auto mem = handler_->ResolveRead(alice_, {slab, 0, static_cast<uint32_t>(kSlab)});
  ASSERT_TRUE(mem.ok());
  int ones = 0;
  for (uint8_t b : *mem) ones += __builtin_popcount(b);
  EXPECT_EQ(ones, 1);  // A fresh slab is all zeros; exactly one bit is now set.

  std::string refuse = EncodeFaultSpec(FaultSpec{FaultKind::kRefuseAlloc});
  ASSERT_TRUE(handler_->Invoke(root_, kFaultFunctionId,
                               std::span<const uint8_t>(
                                   reinterpret_cast<const uint8_t*>(refuse.data()), refuse.size()))
                  .ok());
  EXPECT_EQ(handler_->AllocSlab(alice_, {}).status().code(), StatusCode::kResourceExhausted);
  const uint8_t junk[] = {1, 2, 3};
  EXPECT_EQ(handler_->Invoke(root_, kFaultFunctionId, junk).status().code(),
            StatusCode::kInvalidArgument);
}

TEST_F(HandlerTest, FaultsAreOffByDefault) {
  MemServerHandler h(pool_.get(), MemServerHandler::Options{});
  EXPECT_EQ(h.Fault(root_, fabric::FaultRequest{}).code(), StatusCode::kUnsupported);
}

// Client credentials (PeerInfo::admin false) may not inject faults or evict, whether through
// FAULT or the fault INVOKE function; nothing is applied when refused.
TEST_F(HandlerTest, FaultsNeedAnAdmin) {
  fabric::FaultRequest f;
  f.action = fabric::FaultAction::kHang;
  f.op_mask = 1u << static_cast<int>(fabric::Op::kRead);
  Status st = handler_->Fault(alice_, f);
  EXPECT_EQ(st.code(), StatusCode::kPermissionDenied) << st;
  EXPECT_NE(st.message().find("admin credential"), std::string::npos) << st;
  f.action = fabric::FaultAction::kEvictSlabs;
  f.count = 1;
  EXPECT_EQ(handler_->Fault(alice_, f).code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(handler_->BeforeOp(alice_, fabric::Op::kRead).action,
            fabric::OpPolicy::Action::kProceed);
  std::string refuse = EncodeFaultSpec(FaultSpec{FaultKind::kRefuseAlloc});
  EXPECT_EQ(handler_
                ->Invoke(bob_, kFaultFunctionId,
                         std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(refuse.data()),
                                                  refuse.size()))
                .status()
                .code(),
            StatusCode::kPermissionDenied);
  EXPECT_TRUE(handler_->AllocSlab(alice_, {}).ok());  // Not refused: the fault was not applied.
}

// An admin reads, writes and frees any client's slab; clients only their own.
TEST_F(HandlerTest, AdminReachesEverySlab) {
  uint64_t slab = Alloc(alice_);
  auto w = handler_->ResolveWrite(alice_, {slab, 100, 4});
  ASSERT_TRUE(w.ok());
  std::memcpy(w->data(), "abcd", 4);
  EXPECT_EQ(handler_->ResolveWrite(bob_, {slab, 100, 4}).status().code(),
            StatusCode::kPermissionDenied);
  auto r = handler_->ResolveRead(root_, {slab, 100, 4});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(std::memcmp(r->data(), "abcd", 4), 0);
  EXPECT_EQ(handler_->ResolveRead(root_, {slab, kSlab - 2, 4}).status().code(),
            StatusCode::kOutOfRange);  // Bounds still hold for admins.
  EXPECT_TRUE(handler_->FreeSlab(root_, {slab}).ok());
  EXPECT_EQ(handler_->ResolveRead(alice_, {slab, 0, 4}).status().code(), StatusCode::kNotFound);
}

TEST_F(HandlerTest, StatsAndPrometheusText) {
  Alloc(alice_);
  std::string stats = handler_->StatsText();
  EXPECT_NE(stats.find("slabs_allocated 1\n"), std::string::npos) << stats;
  EXPECT_NE(stats.find("capacity_bytes 262144\n"), std::string::npos) << stats;
  EXPECT_NE(stats.find("faults none\n"), std::string::npos) << stats;
  std::string prom = handler_->PrometheusText();
  EXPECT_NE(prom.find("# TYPE tessera_memserver_ops_total counter\n"), std::string::npos);
  EXPECT_NE(prom.find("tessera_memserver_ops_total{op=\"alloc\"} 1\n"), std::string::npos) << prom;
  // Latency is a histogram, load a ratio in 0..1.
  EXPECT_NE(prom.find("# TYPE tessera_memserver_service_seconds histogram\n"), std::string::npos);
  EXPECT_NE(prom.find("tessera_memserver_service_seconds_bucket{le=\"+Inf\"} "),
            std::string::npos) << prom;
  EXPECT_EQ(prom.find("summary"), std::string::npos) << prom;
  EXPECT_NE(prom.find("tessera_memserver_load_ratio "), std::string::npos) << prom;
  EXPECT_NE(prom.find("tessera_memserver_slab_usage_ratio 0.25\n"), std::string::npos) << prom;
  auto hb = handler_->Heartbeat(alice_);
  ASSERT_TRUE(hb.ok());
  EXPECT_EQ(hb->slabs_used, 1u);
  EXPECT_EQ(hb->slabs_free, 3u);
  EXPECT_EQ(hb->free_bytes, 3 * kSlab);
  EXPECT_EQ(hb->total_bytes, 4 * kSlab);
}


// Leases: the handler counts connections per owner; ReclaimOrphans(now) frees the slabs of
// owners with none open for the grace. Time is passed in, so no waiting is needed.
TEST(HandlerLeaseTest, OrphansAreFreedAfterTheGraceOnly) {
  SlabPool::Options o;
  o.slab_bytes = kSlab;
  o.capacity_bytes = 8 * kSlab;
  auto pool = SlabPool::Create(o);
  ASSERT_TRUE(pool.ok());
  MemServerHandler::Options ho;
  ho.orphan_grace_ns = 1000000000;  // 1 s
  MemServerHandler h(pool->get(), ho);
  fabric::PeerInfo alice, bob, carol;
  alice.client_id = 1;
  alice.owner_id = 1;
  bob.client_id = 2;
  bob.owner_id = 2;
  carol.client_id = 3;
  carol.owner_id = 3;
  for (auto* p : {&alice, &bob, &carol}) h.OnConnect(*p);
  for (auto* p : {&alice, &alice, &bob, &carol}) ASSERT_TRUE(h.AllocSlab(*p, {}).ok());
  h.OnConnect(alice);  // A second connection of alice.
  h.OnDisconnect(alice);
  const uint64_t late = MonotonicNs() + 5000000000ull;
  EXPECT_EQ(h.ReclaimOrphans(late), 0u) << "alice still has a connection open";
  h.OnDisconnect(alice);
  h.OnDisconnect(carol);
  EXPECT_EQ(h.lease_stats().orphaned_owners, 2u);
  EXPECT_EQ(h.lease_stats().slab_owners, 3u) << "orphans and bob, who is connected";
  EXPECT_EQ(h.ReclaimOrphans(MonotonicNs()), 0u) << "within the grace";
  h.OnConnect(carol);  // Carol is back in time.
  EXPECT_EQ(h.ReclaimOrphans(late), 2u);  // Alice's two slabs.
  EXPECT_EQ((*pool)->SlabsOwnedBy(1), 0u);
  EXPECT_EQ((*pool)->SlabsOwnedBy(2), 1u);
  EXPECT_EQ((*pool)->SlabsOwnedBy(3), 1u);
  const auto ls = h.lease_stats();
  EXPECT_EQ(ls.owners_reclaimed, 1u);
  EXPECT_EQ(ls.slabs_reclaimed, 2u);
  EXPECT_EQ(ls.orphaned_owners, 0u);
  EXPECT_EQ(ls.slab_owners, 2u);
  const std::string stats = h.StatsText();
  EXPECT_NE(stats.find("orphan_grace_ms 1000\n"), std::string::npos) << stats;
  EXPECT_NE(stats.find("slab_owners 2\n"), std::string::npos) << stats;
  EXPECT_NE(stats.find("orphan_slabs_reclaimed 2\n"), std::string::npos) << stats;
  const std::string prom = h.PrometheusText();
  EXPECT_NE(prom.find("tessera_memserver_orphan_slabs_reclaimed_total 2\n"), std::string::npos);
  EXPECT_NE(prom.find("tessera_memserver_orphaned_owners 0\n"), std::string::npos);
  // Alice comes back after the reclaim: she starts from nothing, and can allocate again.
  h.OnConnect(alice);
  EXPECT_TRUE(h.AllocSlab(alice, {}).ok());
}

TEST(HandlerLeaseTest, GraceZeroNeverFrees) {
  SlabPool::Options o;
  o.slab_bytes = kSlab;
  o.capacity_bytes = 2 * kSlab;
  auto pool = SlabPool::Create(o);
  ASSERT_TRUE(pool.ok());
  MemServerHandler h(pool->get(), MemServerHandler::Options{});
  fabric::PeerInfo alice;
  alice.client_id = 1;
  alice.owner_id = 1;
  h.OnConnect(alice);
  ASSERT_TRUE(h.AllocSlab(alice, {}).ok());
  h.OnDisconnect(alice);
  EXPECT_EQ(h.ReclaimOrphans(MonotonicNs() + 3600000000000ull), 0u);
  EXPECT_EQ((*pool)->SlabsOwnedBy(1), 1u);
}

// Two processes of one credential are two owners: the one that died loses its slabs after the
// grace although the other stays connected.
TEST(HandlerLeaseTest, AProcessThatDiedLosesItsSlabsWhileAnotherOfItsClientStaysConnected) {
  SlabPool::Options o;
  o.slab_bytes = kSlab;
  o.capacity_bytes = 8 * kSlab;
  auto pool = SlabPool::Create(o);
  ASSERT_TRUE(pool.ok());
  MemServerHandler::Options ho;
  ho.orphan_grace_ns = 1000000000;
  MemServerHandler h(pool->get(), ho);
  fabric::PeerInfo crashed, alive;
  crashed.client_id = alive.client_id = 7;
  crashed.owner_id = fabric::OwnerIdFor(7, 1);
  alive.owner_id = fabric::OwnerIdFor(7, 2);
  h.OnConnect(crashed);
  h.OnConnect(alive);
  auto s1 = h.AllocSlab(crashed, {});
  auto s2 = h.AllocSlab(alive, {});
  ASSERT_TRUE(s1.ok() && s2.ok());
  EXPECT_EQ(h.ResolveRead(alive, {s1->slab_id, 0, 8}).status().code(),
            StatusCode::kPermissionDenied)
      << "another process of the same client reached the slab";
  h.OnDisconnect(crashed);  // SIGKILL: its connections close.
  EXPECT_EQ(h.ReclaimOrphans(MonotonicNs() + 5000000000ull), 1u);
  EXPECT_EQ((*pool)->SlabsOwnedBy(crashed.owner_id), 0u);
  EXPECT_EQ((*pool)->SlabsOwnedBy(alive.owner_id), 1u);
}

TEST(HandlerQuotaTest, AClientOverItsSlabQuotaGetsAClearErrorAndOthersAreUnaffected) {
  SlabPool::Options o;
  o.slab_bytes = kSlab;
  o.capacity_bytes = 8 * kSlab;
  auto pool = SlabPool::Create(o);
  ASSERT_TRUE(pool.ok());
  MemServerHandler::Options ho;
  ho.max_slabs_per_client = 2;
  MemServerHandler h(pool->get(), ho);
  fabric::PeerInfo a1, a2, b;
  a1.client_id = a2.client_id = 7;
  a1.owner_id = fabric::OwnerIdFor(7, 1);
  a2.owner_id = fabric::OwnerIdFor(7, 2);
  b.client_id = b.owner_id = 8;
  for (auto* p : {&a1, &a2, &b}) h.OnConnect(*p);
  ASSERT_TRUE(h.AllocSlab(a1, {}).ok());
  auto second = h.AllocSlab(a2, {});
  ASSERT_TRUE(second.ok());
  // The quota is per client: its second process counts against the same two slabs.
  for (auto* p : {&a1, &a2}) {
    auto r = h.AllocSlab(*p, {});
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted) << r.status();
    EXPECT_NE(r.status().message().find("--max_slabs_per_client 2"), std::string::npos)
        << r.status();
  }
  for (int i = 0; i < 2; ++i) EXPECT_TRUE(h.AllocSlab(b, {}).ok()) << "another client refused";
  // Freeing one makes room again.
  ASSERT_TRUE(h.FreeSlab(a2, {second->slab_id}).ok());
  EXPECT_TRUE(h.AllocSlab(a1, {}).ok());
  const std::string stats = h.StatsText();
  EXPECT_NE(stats.find("quota_refusals 2\n"), std::string::npos) << stats;
}

}  // namespace
}  // namespace tessera::memserver
