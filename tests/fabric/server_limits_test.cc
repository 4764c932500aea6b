// The server's slab owners (one per process instance of a credential) and its limits: frames
// before authentication refused by their header, the handshake timeout, connections per
// client, and replies queued for a client that does not read them.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <string>
#include <thread>

#include "common/fd.h"
#include "fabric/auth.h"
#include "fabric/control_client.h"
#include "fabric/server.h"
#include "fabric/socket.h"
#include "fabric/transport.h"
#include "tests/fabric/server_fixture.h"

namespace tessera::fabric {
namespace {

using testing::RawPeer;
using testing::ServerFixture;
using testing::WaitData;
using testing::kClientA;
using testing::kClientB;
using testing::kSecret;

// ---- slab owners: one per process instance ----

TEST(OwnerIdTest, DerivedFromClientAndInstance) {
  EXPECT_EQ(OwnerIdFor(kClientA, 0), kClientA) << "no instance: the client id owns";
  const uint64_t a1 = OwnerIdFor(kClientA, 1), a2 = OwnerIdFor(kClientA, 2);
  EXPECT_NE(a1, a2);
  EXPECT_NE(a1, kClientA);
  EXPECT_NE(a1, OwnerIdFor(kClientB, 1));
  EXPECT_EQ(a1, OwnerIdFor(kClientA, 1)) << "deterministic";
  EXPECT_EQ(a1 >> 63, 0u) << "the top bit is the memserver's";
  EXPECT_NE(ProcessInstanceId(), 0u);
  EXPECT_EQ(ProcessInstanceId(), ProcessInstanceId());
  EXPECT_EQ(ConnectOptions{}.instance_id, ProcessInstanceId());
}

TEST(OwnerIdTest, TwoInstancesOfOneClientOwnSeparateSlabs) {
  ServerFixture fx;
  ConnectOptions one, two;
  one.secret = two.secret = kSecret;
  one.client_id = two.client_id = kClientA;
  one.instance_id = 11;
  two.instance_id = 22;
  auto c1 = ControlClient::Connect(fx.endpoint(), one);
  ASSERT_TRUE(c1.ok()) << c1.status();
  auto c2 = ControlClient::Connect(fx.endpoint(), two);
  ASSERT_TRUE(c2.ok()) << c2.status();
  auto slab = (*c1)->AllocSlab({}, Deadline::AfterMs(5000));
  ASSERT_TRUE(slab.ok()) << slab.status();
  // The other process of the same credential cannot free it, or read it.
  Status st = (*c2)->FreeSlab(slab->slab_id, Deadline::AfterMs(5000));
  EXPECT_EQ(st.code(), StatusCode::kPermissionDenied) << st;
  for (uint64_t instance : {uint64_t{22}, uint64_t{11}}) {
    auto t = Transport::Create(TransportOptions{TransportKind::kTcp});
    ASSERT_TRUE(t.ok());
    ConnectOptions co = one;
    co.instance_id = instance;
    auto conn = (*t)->Connect(fx.endpoint(), co);
    ASSERT_TRUE(conn.ok()) << conn.status();
    ASSERT_TRUE((*t)->AddSlab(*conn, *slab).ok());
    uint8_t buf[512] = {};
    WorkRequest r{*conn, OpKind::kRead, slab->slab_id, 0, 512, buf, 1};
    ASSERT_TRUE((*t)->Post({&r, 1}).ok());
    auto c = WaitData(**t, 1);
    ASSERT_EQ(c.size(), 1u);
    if (instance == 22) {
      EXPECT_EQ(c[0].status.code(), StatusCode::kPermissionDenied) << c[0].status;
    } else {
      EXPECT_TRUE(c[0].status.ok()) << c[0].status;
    }
  }
  // Its own instance frees it.
  EXPECT_TRUE((*c1)->FreeSlab(slab->slab_id, Deadline::AfterMs(5000)).ok());
}

// ---- server limits ----

// Resident memory of this process, in bytes (the server runs in it).
uint64_t RssBytes() {
  std::ifstream f("/proc/self/status");
  std::string key;
  while (f >> key) {
    if (key == "VmRSS:") {
      uint64_t kb = 0;
      f >> kb;
      return kb * 1024;
    }
  }
  return 0;
}

TEST(ServerLimitsTest, FramesBeforeAuthenticationAreRefusedByTheirHeader) {
  ServerFixture fx;
  // A WRITE header claiming 4 MiB, 64 KiB of it sent, no HELLO: closed on the header.
  {
    RawPeer p(fx.server_->port());
    std::vector<uint8_t> data(kMaxDataLength, 7);
    auto w =
        BuildFrame(FrameHeader{Op::kWrite, false, 5}, WriteRequest{1, 0, kMaxDataLength}, data);
    p.Send(std::span(w).first(64 << 10));
    EXPECT_TRUE(p.ClosedByServer());
  }
  // A HELLO header whose length is not a HELLO's.
  {
    RawPeer p(fx.server_->port());
    std::vector<uint8_t> h(kHeaderSize);
    EncodeHeader(FrameHeader{Op::kHello, false, 1, StatusCode::kOk, 1u << 20}, h.data());
    p.Send(h);
    EXPECT_TRUE(p.ClosedByServer());
  }
  // HELLO with 3 trailing bytes (an instance id is 8).
  {
    RawPeer p(fx.server_->port());
    HelloRequest hello;
    hello.client_id = kClientA;
    std::vector<uint8_t> extra(3, 1);
    p.Send(BuildFrame(FrameHeader{Op::kHello, false, 1}, hello, extra));
    EXPECT_TRUE(p.ClosedByServer());
  }
  EXPECT_EQ(fx.handler_.connects.load(), 0);
}

TEST(ServerLimitsTest, AConnectionThatDoesNotAuthenticateInTimeIsClosed) {
  ServerFixture fx(false, [](ServerOptions& o) { o.handshake_timeout_ms = 200; });
  RawPeer silent(fx.server_->port());
  RawPeer half(fx.server_->port());
  HelloRequest hello;
  hello.client_id = kClientA;
  half.Send(BuildFrame(FrameHeader{Op::kHello, false, 1}, hello));
  ASSERT_TRUE(half.Recv().has_value());  // CHALLENGE; then no AUTH.
  EXPECT_TRUE(silent.ClosedByServer());
  EXPECT_TRUE(half.ClosedByServer());
}

TEST(ServerLimitsTest, ConnectionsPerClientAreBounded) {
  ServerFixture fx(false, [](ServerOptions& o) { o.max_connections_per_client = 2; });
  ConnectOptions a;
  a.secret = kSecret;
  a.client_id = kClientA;
  auto a1 = ControlClient::Connect(fx.endpoint(), a);
  ASSERT_TRUE(a1.ok()) << a1.status();
  auto a2 = ControlClient::Connect(fx.endpoint(), a);
  ASSERT_TRUE(a2.ok()) << a2.status();
  auto a3 = ControlClient::Connect(fx.endpoint(), a);
  ASSERT_FALSE(a3.ok());
  EXPECT_EQ(a3.status().code(), StatusCode::kResourceExhausted) << a3.status();
  EXPECT_NE(a3.status().message().find("max_connections_per_client"), std::string::npos)
      << a3.status();
  // Another client is not affected.
  ConnectOptions b = a;
  b.client_id = kClientB;
  auto b1 = ControlClient::Connect(fx.endpoint(), b);
  ASSERT_TRUE(b1.ok()) << b1.status();
  // A closed connection gives its slot back (the server notices the close asynchronously).
  (*a1)->Close(Deadline::AfterMs(5000)).IgnoreError();
  a1->reset();
  Deadline d = Deadline::AfterMs(10000);
  Result<std::unique_ptr<ControlClient>> again = ResourceExhausted("not tried");
  while (!d.Expired()) {
    again = ControlClient::Connect(fx.endpoint(), a);
    if (again.ok() || again.status().code() != StatusCode::kResourceExhausted) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(again.ok()) << "no slot came back within 10 s: " << again.status();
}

TEST(ServerLimitsTest, RepliesAreBoundedWhileTheClientDoesNotReadThem) {
  constexpr uint64_t kBound = 64 << 10;
  ServerFixture fx(false, [](ServerOptions& o) { o.max_queued_reply_bytes = kBound; });
  RawPeer p(fx.server_->port());
  p.Handshake(kSecret, kClientA);
  p.Send(BuildFrame(FrameHeader{Op::kAllocSlab, false, 3}, AllocSlabRequest{}));
  auto alloc = p.Recv();
  ASSERT_TRUE(alloc.has_value());
  auto af = ParseFrame(*alloc, Direction::kResponse);
  ASSERT_TRUE(af.ok()) << af.status();
  const uint64_t slab = std::get<AllocSlabResponse>(af->body).slab_id;
  const uint32_t len = static_cast<uint32_t>(fx.handler_.slab_size());
  // 2000 READs of a whole slab (125 MiB of replies) sent at once, none read yet.
  constexpr int kReads = 2000;
  const uint64_t rss0 = RssBytes();
  std::vector<uint8_t> batch;
  for (int i = 0; i < kReads; ++i) {
    auto f = BuildFrame(FrameHeader{Op::kRead, false, 100 + static_cast<uint64_t>(i)},
                        ReadRequest{slab, 0, len});
    batch.insert(batch.end(), f.begin(), f.end());
  }
  p.Send(batch);
  Deadline d = Deadline::AfterMs(10000);
  while (fx.server_->reply_backpressure_pauses() == 0 && !d.Expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_GT(fx.server_->reply_backpressure_pauses(), 0u)
      << "the server never stopped reading a client that takes no replies";
  const uint64_t rss1 = RssBytes();
  EXPECT_LT(rss1, rss0 + (32u << 20)) << "RSS grew from " << rss0 << " to " << rss1;
  // Reading the replies lets the server go on: every READ is answered, in order, with OK.
  for (int i = 0; i < kReads; ++i) {
    auto r = p.Recv();
    ASSERT_TRUE(r.has_value()) << "reply " << i << " never came";
    auto f = ParseFrame(*r, Direction::kResponse);
    ASSERT_TRUE(f.ok()) << f.status();
    ASSERT_EQ(f->header.status, StatusCode::kOk);
    ASSERT_EQ(f->header.request_id, 100 + static_cast<uint64_t>(i));
    ASSERT_EQ(f->header.payload_len, len);
  }
}

}  // namespace
}  // namespace tessera::fabric
