// The transport conformance suite: every Transport kind against an in-process fabric::Server
// with an in-memory handler, slabs allocated through a ControlClient. The rdma instance skips
// with the reason when no device exists. Also the ControlClient on its own.
// Also the engine's robustness against raw, misbehaving peers (plain sockets). Slab owners and
// the server's limits are in server_limits_test.cc.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <thread>

#include "common/fd.h"
#include "fabric/auth.h"
#include "fabric/control_client.h"
#include "fabric/server.h"
#include "fabric/transport.h"
#include "tests/fabric/server_fixture.h"
#include "tests/fabric/test_handler.h"

namespace tessera::fabric {
namespace {

using testing::RawPeer;
using testing::ServerFixture;
using testing::TestHandler;
using testing::WaitData;
using testing::WaitNotice;
using testing::kClientA;
using testing::kClientB;
using testing::kSecret;


class ConformanceTest : public ::testing::TestWithParam<TransportKind> {
 protected:
  void SetUp() override {
    if (GetParam() == TransportKind::kRdma) {
      Status probe = ProbeRdma();
      if (!probe.ok()) GTEST_SKIP() << probe.message();
    }
    fx_ = std::make_unique<ServerFixture>(GetParam() == TransportKind::kRdma);
    a_ = MakeTransport();
    conn_a_ = ConnectOrDie(*a_, kClientA);
    ctl_a_ = ControlOrDie(kClientA);
    buf_.resize(1 << 20);
    ASSERT_TRUE(a_->RegisterMemory(buf_.data(), buf_.size()).ok());
  }

  std::unique_ptr<Transport> MakeTransport(uint32_t max_inflight = 1024) {
    TransportOptions o;
    o.kind = GetParam();
    o.max_inflight = max_inflight;
    auto t = Transport::Create(o);
    TCHECK(t.ok()) << t.status();
    TCHECK((*t)->kind() == GetParam());
    return std::move(*t);
  }

  ConnectionId ConnectOrDie(Transport& t, uint64_t client, const std::string& secret = kSecret) {
    ConnectOptions co;
    co.secret = secret;
    co.client_id = client;
    auto c = t.Connect(fx_->endpoint(), co);
    TCHECK(c.ok()) << c.status();
    return *c;
  }

  std::unique_ptr<ControlClient> ControlOrDie(uint64_t client) {
    ConnectOptions co;
    co.secret = kSecret;
    co.client_id = client;
    auto c = ControlClient::Connect(fx_->endpoint(), co);
    TCHECK(c.ok()) << c.status();
    return std::move(*c);
  }

  // A slab of client A (through ctl_a_), made known to `t` on connection `c`.
  uint64_t Alloc(Transport& t, ConnectionId c) {
    auto r = ctl_a_->AllocSlab(AllocSlabRequest{}, Deadline::AfterMs(5000));
    TCHECK(r.ok()) << r.status();
    slabs_[r->slab_id] = *r;
    TCHECK_OK(t.AddSlab(c, *r));
    return r->slab_id;
  }
  // Makes a slab Alloc() returned known to another connection of client A.
  void Share(Transport& t, ConnectionId c, uint64_t slab) { TCHECK_OK(t.AddSlab(c, slabs_[slab])); }

  std::unique_ptr<ServerFixture> fx_;
  std::unique_ptr<Transport> a_;
  ConnectionId conn_a_ = 0;
  std::unique_ptr<ControlClient> ctl_a_;
  std::map<uint64_t, AllocSlabResponse> slabs_;
  std::vector<uint8_t> buf_;
};

TEST_P(ConformanceTest, WriteThenRead512And4096) {
  uint64_t slab = Alloc(*a_, conn_a_);
  auto info = a_->Info(conn_a_);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->slab_size, fx_->handler_.slab_size());
  for (uint32_t size : {512u, 4096u}) {
    uint8_t* src = buf_.data();
    uint8_t* dst = buf_.data() + 65536;
    for (uint32_t i = 0; i < size; ++i) src[i] = static_cast<uint8_t>(i * 7 + size);
    std::memset(dst, 0, size);
    WorkRequest w{conn_a_, OpKind::kWrite, slab, 1024, size, src, 1};
    ASSERT_TRUE(a_->Post({&w, 1}).ok());
    auto c = WaitData(*a_, 1);
    ASSERT_EQ(c.size(), 1u);
    EXPECT_EQ(c[0].cookie, 1u);
    EXPECT_TRUE(c[0].status.ok()) << c[0].status;
    WorkRequest r{conn_a_, OpKind::kRead, slab, 1024, size, dst, 2};
    ASSERT_TRUE(a_->Post({&r, 1}).ok());
    c = WaitData(*a_, 1);
    ASSERT_EQ(c.size(), 1u);
    EXPECT_TRUE(c[0].status.ok()) << c[0].status;
    EXPECT_EQ(std::memcmp(src, dst, size), 0) << "size " << size;
  }
  EXPECT_EQ(a_->inflight(), 0u);
}

TEST_P(ConformanceTest, ManyInFlightInBatches) {
  uint64_t slab = Alloc(*a_, conn_a_);
  // 128 writes of 512 B, each to its own block with its own pattern, posted in batches of 32.
  constexpr int kOps = 128;
  constexpr uint32_t kSize = 512;
  std::vector<WorkRequest> batch;
  for (int i = 0; i < kOps; ++i) {
    uint8_t* src = buf_.data() + i * kSize;
    std::memset(src, i & 0xff, kSize);
    batch.push_back({conn_a_, OpKind::kWrite, slab, uint64_t(i) * kSize, kSize, src, uint64_t(i)});
  }
  for (size_t off = 0; off < batch.size(); off += 32) {
    ASSERT_TRUE(a_->Post({batch.data() + off, 32}).ok());
  }
  EXPECT_EQ(a_->inflight(), 128u);
  auto done = WaitData(*a_, 128);
  ASSERT_EQ(done.size(), 128u);
  std::vector<bool> seen(128, false);
  for (auto& c : done) {
    ASSERT_TRUE(c.status.ok()) << c.status;
    ASSERT_LT(c.cookie, 128u);
    EXPECT_FALSE(seen[c.cookie]);
    seen[c.cookie] = true;
  }
  // Read everything back in one batch of 128.
  std::vector<WorkRequest> reads;
  uint8_t* dst = buf_.data() + 512 * 1024;
  for (int i = 0; i < 128; ++i) {
    reads.push_back({conn_a_, OpKind::kRead, slab, uint64_t(i) * kSize, kSize, dst + i * kSize,
                     uint64_t(1000 + i)});
  }
  ASSERT_TRUE(a_->Post(reads).ok());
  done = WaitData(*a_, 128);
  ASSERT_EQ(done.size(), 128u);
  for (int i = 0; i < 128; ++i) {
    EXPECT_EQ(dst[i * kSize], i & 0xff) << i;
    EXPECT_EQ(dst[i * kSize + kSize - 1], i & 0xff) << i;
  }
}

// Coalescing (TCP): the ops of one Post() for one connection travel as one READV/WRITEV per
// kind, yet each completes on its own with its own bytes; with coalescing off, one frame each.
TEST_P(ConformanceTest, CoalescedBatchCompletesEveryOpWithItsOwnBytes) {
  if (GetParam() == TransportKind::kRdma) GTEST_SKIP() << "coalescing is a TCP framing choice";
  for (bool coalesce : {true, false}) {
    SCOPED_TRACE(coalesce ? "coalesce" : "no coalescing");
    TransportOptions o;
    o.kind = GetParam();
    o.coalesce = coalesce;
    auto t = Transport::Create(o);
    ASSERT_TRUE(t.ok()) << t.status();
    ConnectionId conn = ConnectOrDie(**t, kClientA);
    uint64_t slab = Alloc(**t, conn);
    constexpr int kOps = kMaxVectorRanges + 3;  // Two frames per kind when coalescing.
    std::vector<WorkRequest> batch;
    for (int i = 0; i < kOps; ++i) {
      // Ranges of varying size, out of address order, so a mix-up shows.
      const uint32_t len = 64 + (i % 5) * 32;
      uint8_t* src = buf_.data() + i * 512;
      std::memset(src, (i * 7 + 1) & 0xff, len);
      batch.push_back({conn, OpKind::kWrite, slab, uint64_t(kOps - 1 - i) * 256, len, src,
                       uint64_t(i)});
    }
    const int before = fx_->handler_.before_ops.load();
    ASSERT_TRUE((*t)->Post(batch).ok());
    auto done = WaitData(**t, kOps);
    ASSERT_EQ(done.size(), size_t(kOps));
    for (auto& c : done) ASSERT_TRUE(c.status.ok()) << c.status;
    std::vector<WorkRequest> reads;
    uint8_t* dst = buf_.data() + 512 * 1024;
    std::memset(dst, 0, kOps * 512);
    for (int i = 0; i < kOps; ++i) {
      reads.push_back({conn, OpKind::kRead, slab, uint64_t(kOps - 1 - i) * 256, batch[i].length,
                       dst + i * 512, uint64_t(1000 + i)});
    }
    ASSERT_TRUE((*t)->Post(reads).ok());
    done = WaitData(**t, kOps);
    ASSERT_EQ(done.size(), size_t(kOps));
    for (auto& c : done) ASSERT_TRUE(c.status.ok()) << c.status;
    for (int i = 0; i < kOps; ++i) {
      ASSERT_EQ(std::memcmp(dst + i * 512, buf_.data() + i * 512, batch[i].length), 0) << i;
      EXPECT_EQ(dst[i * 512 + batch[i].length], 0) << "op " << i << " got bytes past its range";
    }
    EXPECT_EQ(fx_->handler_.before_ops.load() - before, coalesce ? 4 : 2 * kOps);
  }
}

// A vectored request is all or nothing: one bad range fails every op of that frame with the
// server's error, and none of its writes lands; other connections' and later batches are fine.
TEST_P(ConformanceTest, CoalescedBatchWithABadRangeFailsWholeAndWritesNothing) {
  if (GetParam() == TransportKind::kRdma) GTEST_SKIP() << "coalescing is a TCP framing choice";
  uint64_t slab = Alloc(*a_, conn_a_);
  const uint64_t slab_size = fx_->handler_.slab_size();
  std::memset(buf_.data(), 0x5a, 4096);
  std::vector<WorkRequest> batch = {
      {conn_a_, OpKind::kWrite, slab, 0, 512, buf_.data(), 1},
      {conn_a_, OpKind::kWrite, slab, slab_size - 256, 512, buf_.data() + 512, 2},  // Past the end.
      {conn_a_, OpKind::kWrite, slab, 1024, 512, buf_.data() + 1024, 3},
      {conn_a_, OpKind::kRead, slab, 8192, 512, buf_.data() + 8192, 4},
      {conn_a_, OpKind::kRead, slab + 1000, 0, 512, buf_.data() + 16384, 5},  // No such slab.
  };
  ASSERT_TRUE(a_->Post(batch).ok());
  auto done = WaitData(*a_, 5);
  ASSERT_EQ(done.size(), 5u);
  for (auto& c : done) {
    if (c.cookie <= 3) {
      EXPECT_EQ(c.status.code(), StatusCode::kOutOfRange) << c.cookie << ": " << c.status;
    } else {
      EXPECT_EQ(c.status.code(), StatusCode::kNotFound) << c.cookie << ": " << c.status;
    }
  }
  EXPECT_TRUE(a_->Connected(conn_a_)) << "a refused request is not a broken connection";
  // Nothing of the failed WRITEV landed.
  std::vector<WorkRequest> check = {{conn_a_, OpKind::kRead, slab, 0, 2048, buf_.data() + 32768, 9}};
  ASSERT_TRUE(a_->Post(check).ok());
  done = WaitData(*a_, 1);
  ASSERT_EQ(done.size(), 1u);
  ASSERT_TRUE(done[0].status.ok()) << done[0].status;
  for (int i = 0; i < 2048; ++i) ASSERT_EQ(buf_[32768 + i], 0) << "byte " << i << " was written";
}

// A delayed or hung READV delays or hangs all of its ops, like the single-range op it batches.
TEST_P(ConformanceTest, FaultPoliciesApplyToVectoredOps) {
  if (GetParam() == TransportKind::kRdma) GTEST_SKIP() << "one-sided RDMA bypasses BeforeOp";
  uint64_t slab = Alloc(*a_, conn_a_);
  fx_->handler_.SetPolicy(Op::kRead, OpPolicy::Hang());
  std::vector<WorkRequest> reads = {{conn_a_, OpKind::kRead, slab, 0, 512, buf_.data(), 1},
                                    {conn_a_, OpKind::kRead, slab, 512, 512, buf_.data() + 512, 2}};
  ASSERT_TRUE(a_->Post(reads).ok());
  Completion out[4];
  EXPECT_EQ(a_->Wait(out, Deadline::AfterMs(100)), 0u) << "a hung READV must not complete";
  EXPECT_TRUE(a_->Disconnect(conn_a_).ok());
  auto c = WaitData(*a_, 2);
  ASSERT_EQ(c.size(), 2u);
  for (auto& x : c) EXPECT_EQ(x.status.code(), StatusCode::kCancelled) << x.status;
}

TEST_P(ConformanceTest, FullQueueIsResourceExhaustedAndNothingIsPosted) {
  auto t = MakeTransport(8);
  ConnectionId c = ConnectOrDie(*t, kClientA);
  ASSERT_TRUE(t->RegisterMemory(buf_.data(), buf_.size()).ok());
  uint64_t slab = Alloc(*t, c);
  std::vector<WorkRequest> batch(9, WorkRequest{c, OpKind::kRead, slab, 0, 512, buf_.data(), 0});
  Status st = t->Post(batch);
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted) << st;
  EXPECT_EQ(t->inflight(), 0u);
  ASSERT_TRUE(t->Post({batch.data(), 8}).ok());
  EXPECT_EQ(t->Post({batch.data(), 1}).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(WaitData(*t, 8).size(), 8u);
  EXPECT_TRUE(t->Post({batch.data(), 1}).ok());
  EXPECT_EQ(WaitData(*t, 1).size(), 1u);
}

TEST_P(ConformanceTest, MalformedWorkRequestsAreRefusedUpFront) {
  uint64_t slab = Alloc(*a_, conn_a_);
  WorkRequest ok{conn_a_, OpKind::kRead, slab, 0, 512, buf_.data(), 0};
  WorkRequest bad = ok;
  bad.length = 0;
  WorkRequest batch[2] = {ok, bad};
  EXPECT_EQ(a_->Post(batch).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(a_->inflight(), 0u);
  bad = ok;
  bad.local = nullptr;
  EXPECT_EQ(a_->Post({&bad, 1}).code(), StatusCode::kInvalidArgument);
  bad = ok;
  bad.connection = 77;
  EXPECT_EQ(a_->Post({&bad, 1}).code(), StatusCode::kInvalidArgument);
}

TEST_P(ConformanceTest, OutOfRangeIsRefused) {
  uint64_t slab = Alloc(*a_, conn_a_);
  uint64_t size = fx_->handler_.slab_size();
  WorkRequest r{conn_a_, OpKind::kRead, slab, size - 100, 512, buf_.data(), 5};
  Status st = a_->Post({&r, 1});
  if (GetParam() == TransportKind::kRdma) {
    EXPECT_EQ(st.code(), StatusCode::kOutOfRange) << st;  // Checked locally against the slab size.
    return;
  }
  ASSERT_TRUE(st.ok()) << st;
  auto c = WaitData(*a_, 1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status.code(), StatusCode::kOutOfRange) << c[0].status;
  // The connection stays usable.
  r.remote_offset = 0;
  ASSERT_TRUE(a_->Post({&r, 1}).ok());
  c = WaitData(*a_, 1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_TRUE(c[0].status.ok()) << c[0].status;
}

TEST_P(ConformanceTest, OtherClientsSlabIsRefused) {
  if (GetParam() == TransportKind::kRdma) {
    GTEST_SKIP() << "RDMA access control is the rkey; ownership is enforced at ALLOC_SLAB";
  }
  uint64_t slab = Alloc(*a_, conn_a_);
  auto b = MakeTransport();
  ConnectionId cb = ConnectOrDie(*b, kClientB);
  WorkRequest w{cb, OpKind::kWrite, slab, 0, 512, buf_.data(), 9};
  ASSERT_TRUE(b->Post({&w, 1}).ok());
  auto c = WaitData(*b, 1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status.code(), StatusCode::kPermissionDenied) << c[0].status;
  auto ctl_b = ControlOrDie(kClientB);
  EXPECT_EQ(ctl_b->FreeSlab(slab, Deadline::AfterMs(5000)).code(), StatusCode::kPermissionDenied);
  EXPECT_TRUE(ctl_a_->FreeSlab(slab, Deadline::AfterMs(5000)).ok());
}

TEST_P(ConformanceTest, WrongSecretIsRefused) {
  auto b = MakeTransport();
  ConnectOptions co;
  co.secret = "not-the-right-secret-at-all";
  co.client_id = kClientB;
  auto c = b->Connect(fx_->endpoint(), co);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kPermissionDenied) << c.status();
  auto ctl = ControlClient::Connect(fx_->endpoint(), co);
  EXPECT_EQ(ctl.status().code(), StatusCode::kPermissionDenied) << ctl.status();
  // The server goes on serving the good client.
  EXPECT_TRUE(ctl_a_->Heartbeat(Deadline::AfterMs(5000)).ok());
}

TEST_P(ConformanceTest, ControlCalls) {
  uint64_t slab = Alloc(*a_, conn_a_);
  auto stats = ctl_a_->Stats(Deadline::AfterMs(5000));
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_NE(stats->find("slabs_used 1"), std::string::npos) << *stats;
  auto hb = ctl_a_->Heartbeat(Deadline::AfterMs(5000));
  ASSERT_TRUE(hb.ok()) << hb.status();
  EXPECT_EQ(hb->slabs_used, 1u);
  EXPECT_EQ(hb->server_time_ns, 42u);
  std::vector<uint8_t> args = {1, 2, 3, 4};
  auto inv = ctl_a_->Invoke(7, args, Deadline::AfterMs(5000));
  ASSERT_TRUE(inv.ok()) << inv.status();
  EXPECT_EQ(*inv, (std::vector<uint8_t>{4, 3, 2, 1}));
  EXPECT_EQ(ctl_a_->Invoke(8, args, Deadline::AfterMs(5000)).status().code(),
            StatusCode::kNotFound);
  FaultRequest fr;
  fr.action = FaultAction::kClear;
  EXPECT_TRUE(ctl_a_->Fault(fr, Deadline::AfterMs(5000)).ok());
  EXPECT_EQ(fx_->handler_.faults.load(), 1);
  EXPECT_TRUE(ctl_a_->FreeSlab(slab, Deadline::AfterMs(5000)).ok());
  EXPECT_EQ(ctl_a_->FreeSlab(slab, Deadline::AfterMs(5000)).code(), StatusCode::kNotFound);
  EXPECT_EQ(ctl_a_->FreeSlab(0, Deadline::AfterMs(5000)).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(ctl_a_->connected());
}

TEST_P(ConformanceTest, DelayedReplyDoesNotHoldUpOthers) {
  if (GetParam() == TransportKind::kRdma) GTEST_SKIP() << "one-sided RDMA bypasses BeforeOp";
  uint64_t slab = Alloc(*a_, conn_a_);
  constexpr uint64_t kDelayMs = 300;
  fx_->handler_.SetPolicy(Op::kRead, OpPolicy::Delay(kDelayMs * 1000000));
  uint64_t start = MonotonicNs();
  WorkRequest ops[2] = {{conn_a_, OpKind::kRead, slab, 0, 4096, buf_.data(), 1},
                        {conn_a_, OpKind::kWrite, slab, 8192, 4096, buf_.data() + 8192, 2}};
  ASSERT_TRUE(a_->Post(ops).ok());
  // A control call is answered while the READ waits.
  ASSERT_TRUE(ctl_a_->Heartbeat(Deadline::AfterMs(5000)).ok());
  auto c = WaitData(*a_, 2);
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].cookie, 2u) << "the undelayed WRITE must complete first";
  EXPECT_EQ(c[1].cookie, 1u);
  EXPECT_TRUE(c[1].status.ok());
  EXPECT_GE(MonotonicNs() - start, kDelayMs * 1000000);
}

TEST_P(ConformanceTest, HangThenDisconnectCancels) {
  if (GetParam() == TransportKind::kRdma) GTEST_SKIP() << "one-sided RDMA bypasses BeforeOp";
  uint64_t slab = Alloc(*a_, conn_a_);
  fx_->handler_.SetPolicy(Op::kRead, OpPolicy::Hang());
  WorkRequest r{conn_a_, OpKind::kRead, slab, 0, 512, buf_.data(), 3};
  ASSERT_TRUE(a_->Post({&r, 1}).ok());
  Completion buf[4];
  EXPECT_EQ(a_->Wait(buf, Deadline::AfterMs(100)), 0u);
  EXPECT_TRUE(ctl_a_->Heartbeat(Deadline::AfterMs(5000)).ok());
  EXPECT_TRUE(a_->Disconnect(conn_a_).ok());
  auto c = WaitData(*a_, 1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status.code(), StatusCode::kCancelled) << c[0].status;
  EXPECT_FALSE(a_->Connected(conn_a_));
}

// SetWakeFd(): another thread ends a Wait() that has replies outstanding (a hung READ here)
// by making the fd readable; without the fd write the same Wait() runs to its deadline.
TEST_P(ConformanceTest, WakeFdEndsWaitEarly) {
  if (GetParam() == TransportKind::kRdma) GTEST_SKIP() << "one-sided RDMA bypasses BeforeOp";
  uint64_t slab = Alloc(*a_, conn_a_);
  fx_->handler_.SetPolicy(Op::kRead, OpPolicy::Hang());
  WorkRequest r{conn_a_, OpKind::kRead, slab, 0, 512, buf_.data(), 5};
  ASSERT_TRUE(a_->Post({&r, 1}).ok());
  UniqueFd efd(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  ASSERT_TRUE(efd.valid());
  EXPECT_EQ(a_->SetWakeFd(-2).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(a_->SetWakeFd(efd.get()).ok());
  Completion buf[4];
  uint64_t start = MonotonicNs();
  EXPECT_EQ(a_->Wait(buf, Deadline::AfterMs(100)), 0u);
  EXPECT_GE(MonotonicNs() - start, 100'000'000u) << "nothing woke it: it must wait out the deadline";
  for (int round = 0; round < 3; ++round) {  // The watch survives being triggered.
    std::thread waker([&] {
      uint64_t one = 1;
      ASSERT_EQ(write(efd.get(), &one, sizeof(one)), 8);
    });
    start = MonotonicNs();
    EXPECT_EQ(a_->Wait(buf, Deadline::AfterMs(20000)), 0u);
    EXPECT_LT(MonotonicNs() - start, 10'000'000'000u) << "the fd write must end the Wait";
    waker.join();
    uint64_t v;
    ASSERT_EQ(read(efd.get(), &v, sizeof(v)), 8);
  }
  ASSERT_TRUE(a_->SetWakeFd(-1).ok());
  start = MonotonicNs();
  EXPECT_EQ(a_->Wait(buf, Deadline::AfterMs(50)), 0u);
  EXPECT_GE(MonotonicNs() - start, 50'000'000u);
  EXPECT_TRUE(a_->Disconnect(conn_a_).ok());
  auto c = WaitData(*a_, 1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status.code(), StatusCode::kCancelled) << c[0].status;
}

TEST_P(ConformanceTest, AbortCancelsInFlightOpsAtOnce) {
  if (GetParam() == TransportKind::kRdma) GTEST_SKIP() << "one-sided RDMA bypasses BeforeOp";
  uint64_t slab = Alloc(*a_, conn_a_);
  fx_->handler_.SetPolicy(Op::kRead, OpPolicy::Hang());
  WorkRequest r{conn_a_, OpKind::kRead, slab, 0, 512, buf_.data(), 6};
  ASSERT_TRUE(a_->Post({&r, 1}).ok());
  EXPECT_TRUE(a_->Abort(conn_a_).ok());
  EXPECT_FALSE(a_->Connected(conn_a_));
  auto c = WaitData(*a_, 1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status.code(), StatusCode::kCancelled) << c[0].status;
  EXPECT_EQ(a_->Post({&r, 1}).code(), StatusCode::kUnavailable);
  EXPECT_EQ(a_->Abort(conn_a_).code(), StatusCode::kUnavailable) << "already closed";
  EXPECT_EQ(a_->Abort(12345).code(), StatusCode::kInvalidArgument);
}

TEST_P(ConformanceTest, DropClosesTheConnection) {
  if (GetParam() == TransportKind::kRdma) GTEST_SKIP() << "one-sided RDMA bypasses BeforeOp";
  uint64_t slab = Alloc(*a_, conn_a_);
  fx_->handler_.SetPolicy(Op::kWrite, OpPolicy::Drop());
  WorkRequest w{conn_a_, OpKind::kWrite, slab, 0, 512, buf_.data(), 4};
  ASSERT_TRUE(a_->Post({&w, 1}).ok());
  auto c = WaitData(*a_, 1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status.code(), StatusCode::kUnavailable) << c[0].status;
  EXPECT_FALSE(a_->Connected(conn_a_));
  EXPECT_EQ(a_->Post({&w, 1}).code(), StatusCode::kUnavailable);
  fx_->handler_.ClearPolicies();
  ConnectionId again = ConnectOrDie(*a_, kClientA);
  Share(*a_, again, slab);
  WorkRequest w2{again, OpKind::kWrite, slab, 0, 512, buf_.data(), 5};
  ASSERT_TRUE(a_->Post({&w2, 1}).ok());
  c = WaitData(*a_, 1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_TRUE(c[0].status.ok()) << c[0].status;
}

TEST_P(ConformanceTest, NoticesAreDelivered) {
  ASSERT_TRUE(fx_->server_->Notify(kClientA, Notice{NoticeKind::kSlabEvicting, 17, 500}).ok());
  Completion n = WaitNotice(*a_);
  EXPECT_EQ(n.kind, CompletionKind::kNotice);
  EXPECT_EQ(n.connection, conn_a_);
  EXPECT_EQ(n.notice.kind, NoticeKind::kSlabEvicting);
  EXPECT_EQ(n.notice.slab_id, 17u);
  EXPECT_EQ(n.notice.deadline_ms, 500u);
  // A notice for another client does not reach A; one for everybody does.
  ASSERT_TRUE(fx_->server_->Notify(kClientB, Notice{NoticeKind::kSlabEvicting, 18, 1}).ok());
  ASSERT_TRUE(fx_->server_->Notify(std::nullopt, Notice{NoticeKind::kSlabEvicting, 19, 1}).ok());
  n = WaitNotice(*a_);
  EXPECT_EQ(n.notice.slab_id, 19u);
  // An invalid notice is refused at the API.
  EXPECT_FALSE(fx_->server_->Notify(kClientA, Notice{NoticeKind::kSlabEvicting, 0, 1}).ok());
}

TEST_P(ConformanceTest, StopSendsShutdownNoticeAndClosesConnections) {
  if (GetParam() == TransportKind::kRdma) GTEST_SKIP() << "covered by the TCP control connection";
  uint64_t slab = Alloc(*a_, conn_a_);
  fx_->handler_.SetPolicy(Op::kRead, OpPolicy::Hang());
  WorkRequest r{conn_a_, OpKind::kRead, slab, 0, 512, buf_.data(), 6};
  ASSERT_TRUE(a_->Post({&r, 1}).ok());
  std::thread stopper([&] { fx_->server_->Stop(Deadline::AfterMs(1000)); });
  std::vector<Completion> c;
  Completion n = WaitNotice(*a_, &c);
  if (c.empty()) c = WaitData(*a_, 1);
  stopper.join();
  EXPECT_EQ(n.notice.kind, NoticeKind::kShuttingDown);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status.code(), StatusCode::kUnavailable) << c[0].status;
  EXPECT_EQ(fx_->server_->connection_count(), 0u);
  EXPECT_EQ(fx_->handler_.connects.load(), fx_->handler_.disconnects.load());
  EXPECT_FALSE(fx_->server_->Notify(std::nullopt, Notice{}).ok());
}

TEST_P(ConformanceTest, AddSlabValidatesItsArguments) {
  auto r = ctl_a_->AllocSlab(AllocSlabRequest{}, Deadline::AfterMs(5000));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(a_->AddSlab(conn_a_ + 100, *r).code(), StatusCode::kInvalidArgument);
  AllocSlabResponse zero = *r;
  zero.slab_id = 0;
  EXPECT_EQ(a_->AddSlab(conn_a_, zero).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(a_->AddSlab(conn_a_, *r).ok());
  a_->RemoveSlab(conn_a_, r->slab_id);
  a_->RemoveSlab(conn_a_, 999999);  // Unknown: ignored.
}

INSTANTIATE_TEST_SUITE_P(Transports, ConformanceTest,
                         ::testing::Values(TransportKind::kTcp, TransportKind::kRdma),
                         [](const auto& info) { return std::string(TransportKindName(info.param)); });

TEST(TransportCreateTest, AutoPicksWhatTheMachineHas) {
  auto t = Transport::Create(TransportOptions{});
  ASSERT_TRUE(t.ok()) << t.status();
  if (ProbeRdma().ok()) {
    EXPECT_EQ((*t)->kind(), TransportKind::kRdma);
  } else {
    EXPECT_EQ((*t)->kind(), TransportKind::kTcp);
    auto r = Transport::Create(TransportOptions{TransportKind::kRdma});
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kUnsupported);
    EXPECT_NE(r.status().message().find("no RDMA device"), std::string::npos) << r.status();
  }
}

// ---- the control client on its own ----

class ControlClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fx_ = std::make_unique<ServerFixture>();
    co_.secret = kSecret;
    co_.client_id = kClientA;
    auto c = ControlClient::Connect(fx_->endpoint(), co_);
    ASSERT_TRUE(c.ok()) << c.status();
    ctl_ = std::move(*c);
  }
  std::unique_ptr<ServerFixture> fx_;
  ConnectOptions co_;
  std::unique_ptr<ControlClient> ctl_;
};

TEST_F(ControlClientTest, InfoComesFromAuthOk) {
  EXPECT_EQ(ctl_->info().slab_size, fx_->handler_.slab_size());
  EXPECT_EQ(ctl_->info().server_id, fx_->server_->server_id());
  EXPECT_FALSE(ctl_->info().rdma);
  EXPECT_FALSE(ctl_->rdma_offered()) << "this server runs no verbs listener";
  EXPECT_TRUE(ctl_->connected());
}

TEST_F(ControlClientTest, ACallPastItsDeadlineLeavesTheConnectionUsable) {
  fx_->handler_.SetPolicy(Op::kStats, OpPolicy::Delay(300ull * 1000000));
  auto st = ctl_->Stats(Deadline::AfterMs(30));
  EXPECT_EQ(st.status().code(), StatusCode::kTimeout) << st.status();
  fx_->handler_.ClearPolicies();
  // The late STATS reply arrives first and is skipped; the heartbeat gets its own reply.
  auto hb = ctl_->Heartbeat(Deadline::AfterMs(5000));
  ASSERT_TRUE(hb.ok()) << hb.status();
  EXPECT_EQ(hb->server_time_ns, 42u);
  EXPECT_TRUE(ctl_->connected());
}

TEST_F(ControlClientTest, NoticesAreKeptForPollNotices) {
  ASSERT_TRUE(fx_->server_->Notify(kClientA, Notice{NoticeKind::kSlabEvicting, 21, 500}).ok());
  Notice got[4];
  size_t n = 0;
  Deadline d = Deadline::AfterMs(5000);
  while (n == 0 && !d.Expired()) {
    pollfd p{ctl_->fd(), POLLIN, 0};
    ::poll(&p, 1, 50);
    n = ctl_->PollNotices(got);
  }
  ASSERT_EQ(n, 1u) << "no notice within 5 s";
  EXPECT_EQ(got[0].slab_id, 21u);
  // A notice that arrives while a call waits for its reply is kept too.
  ASSERT_TRUE(fx_->server_->Notify(kClientA, Notice{NoticeKind::kSlabEvicting, 22, 1}).ok());
  fx_->handler_.SetPolicy(Op::kHeartbeat, OpPolicy::Delay(100ull * 1000000));
  ASSERT_TRUE(ctl_->Heartbeat(Deadline::AfterMs(5000)).ok());
  EXPECT_EQ(ctl_->PollNotices(got), 1u);
  EXPECT_EQ(got[0].slab_id, 22u);
}

TEST_F(ControlClientTest, ALostConnectionFailsEveryLaterCall) {
  ASSERT_TRUE(fx_->server_->Disconnect(kClientA).ok());
  auto hb = ctl_->Heartbeat(Deadline::AfterMs(5000));
  EXPECT_EQ(hb.status().code(), StatusCode::kUnavailable) << hb.status();
  EXPECT_FALSE(ctl_->connected());
  EXPECT_EQ(ctl_->Stats(Deadline::AfterMs(5000)).status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(ctl_->fd(), -1);
}

TEST_F(ControlClientTest, CloseSaysGoodbye) {
  ASSERT_EQ(fx_->server_->connection_count(), 1u);
  EXPECT_TRUE(ctl_->Close(Deadline::AfterMs(5000)).ok());
  EXPECT_FALSE(ctl_->connected());
  Deadline d = Deadline::AfterMs(5000);
  while (fx_->server_->connection_count() > 0 && !d.Expired()) {
    pollfd none{-1, 0, 0};
    ::poll(&none, 0, 10);
  }
  EXPECT_EQ(fx_->server_->connection_count(), 0u);
  EXPECT_TRUE(ctl_->Close(Deadline::AfterMs(5000)).ok()) << "idempotent";
}

TEST_F(ControlClientTest, UnreachableServerIsUnavailable) {
  fx_.reset();  // Nothing listens on the port any more.
  ConnectOptions co = co_;
  co.deadline = Deadline::AfterMs(2000);
  auto c = ControlClient::Connect(Endpoint{"127.0.0.1", 1}, co);
  EXPECT_FALSE(c.ok());
  EXPECT_TRUE(c.status().code() == StatusCode::kUnavailable ||
              c.status().code() == StatusCode::kTimeout)
      << c.status();
}

// ---- raw peers ----


class RawPeerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fx_ = std::make_unique<ServerFixture>();
    auto t = Transport::Create(TransportOptions{TransportKind::kTcp});
    ASSERT_TRUE(t.ok());
    good_ = std::move(*t);
    ConnectOptions co;
    co.secret = kSecret;
    co.client_id = kClientA;
    auto c = good_->Connect(fx_->endpoint(), co);
    ASSERT_TRUE(c.ok()) << c.status();
    conn_ = *c;
    auto ctl = ControlClient::Connect(fx_->endpoint(), co);
    ASSERT_TRUE(ctl.ok()) << ctl.status();
    ctl_ = std::move(*ctl);
    auto slab = ctl_->AllocSlab({}, Deadline::AfterMs(5000));
    ASSERT_TRUE(slab.ok());
    ASSERT_TRUE(good_->AddSlab(conn_, *slab).ok());
    slab_ = slab->slab_id;
  }
  // The well-behaved client still reads and writes.
  void ExpectGoodClientWorks() {
    uint8_t data[512];
    std::memset(data, 0x3c, sizeof(data));
    WorkRequest w{conn_, OpKind::kWrite, slab_, 0, 512, data, 1};
    ASSERT_TRUE(good_->Post({&w, 1}).ok());
    auto c = WaitData(*good_, 1);
    ASSERT_EQ(c.size(), 1u);
    EXPECT_TRUE(c[0].status.ok()) << c[0].status;
  }
  std::unique_ptr<ServerFixture> fx_;
  std::unique_ptr<Transport> good_;
  ConnectionId conn_ = 0;
  std::unique_ptr<ControlClient> ctl_;  // The good client's second connection.
  uint64_t slab_ = 0;
};

TEST_F(RawPeerTest, OpsBeforeAuthenticationCloseTheConnection) {
  {
    RawPeer p(fx_->server_->port());
    p.Send(BuildFrame(FrameHeader{Op::kRead, false, 5}, ReadRequest{slab_, 0, 512}));
    EXPECT_TRUE(p.ClosedByServer());
  }
  {
    // HELLO, then STATS instead of AUTH.
    RawPeer p(fx_->server_->port());
    HelloRequest h;
    h.client_id = 5;
    p.Send(BuildFrame(FrameHeader{Op::kHello, false, 1}, h));
    ASSERT_TRUE(p.Recv().has_value());
    p.Send(BuildRawFrame(FrameHeader{Op::kStats, false, 2}));
    EXPECT_TRUE(p.ClosedByServer());
  }
  ExpectGoodClientWorks();
}

TEST_F(RawPeerTest, ClientRejectsAServerWithTheWrongSecret) {
  // A fake server that answers the handshake with a MAC made from another secret.
  UniqueFd lfd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(lfd.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(::listen(lfd.get(), 1), 0);
  socklen_t len = sizeof(a);
  ::getsockname(lfd.get(), reinterpret_cast<sockaddr*>(&a), &len);
  std::thread fake([&] {
    UniqueFd c(::accept(lfd.get(), nullptr, nullptr));
    uint8_t buf[256];
    ssize_t n = ::recv(c.get(), buf, kHeaderSize + HelloRequest::kWireSize, MSG_WAITALL);
    if (n != static_cast<ssize_t>(kHeaderSize + HelloRequest::kWireSize)) return;
    auto hello = HelloRequest::Decode({buf + kHeaderSize, HelloRequest::kWireSize});
    HandshakeTranscript t;
    t.client_nonce = hello->client_nonce;
    t.client_id = hello->client_id;
    t.server_id = 9;
    ChallengeResponse ch;
    ch.server_id = 9;
    auto f = BuildFrame(FrameHeader{Op::kHello, true, 1}, ch);
    ::send(c.get(), f.data(), f.size(), MSG_NOSIGNAL);
    n = ::recv(c.get(), buf, kHeaderSize + AuthRequest::kWireSize, MSG_WAITALL);
    AuthOkResponse ok;
    ok.server_mac = ServerMac("an-impostor-does-not-know-it", t);
    f = BuildFrame(FrameHeader{Op::kAuth, true, 2}, ok);
    ::send(c.get(), f.data(), f.size(), MSG_NOSIGNAL);
    ::recv(c.get(), buf, 1, 0);  // Until the client hangs up.
  });
  auto t = Transport::Create(TransportOptions{TransportKind::kTcp});
  ASSERT_TRUE(t.ok());
  ConnectOptions co;
  co.secret = kSecret;
  co.client_id = 5;
  auto c = (*t)->Connect(Endpoint{"127.0.0.1", ntohs(a.sin_port)}, co);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kPermissionDenied) << c.status();
  fake.join();
}

TEST_F(RawPeerTest, MalformedFrameClosesOnlyThatConnection) {
  RawPeer p(fx_->server_->port());
  p.Handshake(kSecret, kClientB);
  auto f = BuildFrame(FrameHeader{Op::kRead, false, 5}, ReadRequest{1, 0, 512});
  f[0] = 'X';  // Bad magic.
  p.Send(f);
  EXPECT_TRUE(p.ClosedByServer());
  ExpectGoodClientWorks();
  // A WRITE whose payload lies about its length.
  RawPeer q(fx_->server_->port());
  q.Handshake(kSecret, kClientB);
  std::vector<uint8_t> data(64, 1);
  auto w = BuildFrame(FrameHeader{Op::kWrite, false, 6}, WriteRequest{1, 0, 63}, data);
  q.Send(w);
  EXPECT_TRUE(q.ClosedByServer());
  ExpectGoodClientWorks();
}

TEST_F(RawPeerTest, PeerVanishingMidFrameLeavesTheServerServing) {
  for (int i = 0; i < 3; ++i) {
    RawPeer p(fx_->server_->port());
    p.Handshake(kSecret, kClientB);
    std::vector<uint8_t> data(4096, 2);
    auto w = BuildFrame(FrameHeader{Op::kWrite, false, 6}, WriteRequest{1, 0, 4096}, data);
    p.Send(std::span(w).first(100 + i * 1000));
  }  // Closed here, mid-frame.
  ExpectGoodClientWorks();
  // Wait (bounded) until the server noticed all three closures (the good client's data and
  // control connections stay).
  Deadline d = Deadline::AfterMs(5000);
  while (fx_->server_->connection_count() > 2 && !d.Expired()) {
    ASSERT_TRUE(ctl_->Heartbeat(Deadline::AfterMs(5000)).ok());
  }
  EXPECT_EQ(fx_->server_->connection_count(), 2u);
}

TEST_F(RawPeerTest, ServerDisconnectClosesThatClient) {
  ASSERT_TRUE(fx_->server_->Disconnect(kClientA).ok());
  Completion buf[4];
  Deadline d = Deadline::AfterMs(5000);
  while (good_->Connected(conn_) && !d.Expired()) good_->Wait(buf, Deadline::AfterMs(50));
  EXPECT_FALSE(good_->Connected(conn_));
}

}  // namespace
}  // namespace tessera::fabric
