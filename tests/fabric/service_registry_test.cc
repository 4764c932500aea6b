// The server engine's registry of service ops (Server::RegisterService): a registered service
// gets the requests of its ops with their payload whole and answers them now or later; a
// service op no service registered gets a clear error reply and the connection goes on; a
// range outside the service ops, or one that overlaps another service's, is refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "fabric/server.h"
#include "fabric/wire.h"
#include "tests/fabric/server_fixture.h"

namespace tessera::fabric {
namespace {

using testing::kClientA;
using testing::kSecret;
using testing::RawPeer;
using testing::ServerFixture;

constexpr uint16_t kEcho = 40;     // Answers at once with the payload reversed.
constexpr uint16_t kLater = 41;    // Answers from another thread through the AsyncReply.
constexpr uint16_t kRefuse = 42;   // Answers with an error.

class WidgetService : public ServiceHandler {
 public:
  ~WidgetService() override {
    for (auto& t : threads_) t.join();
  }
  std::optional<Result<std::vector<uint8_t>>> HandleRequest(const PeerInfo& peer, Op op,
                                                            std::span<const uint8_t> payload,
                                                            AsyncReply reply) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      seen_.push_back({static_cast<uint16_t>(op), peer.client_id,
                       std::vector<uint8_t>(payload.begin(), payload.end())});
    }
    std::vector<uint8_t> out(payload.rbegin(), payload.rend());
    switch (static_cast<uint16_t>(op)) {
      case kEcho: return Result<std::vector<uint8_t>>(std::move(out));
      case kLater:
        threads_.emplace_back([reply, out] { reply.Send(out); });
        return std::nullopt;
      default: return Result<std::vector<uint8_t>>(InvalidArgument("bad widget"));
    }
  }
  struct Seen {
    uint16_t op;
    uint64_t client_id;
    std::vector<uint8_t> payload;
  };
  std::vector<Seen> seen() {
    std::lock_guard<std::mutex> lock(mu_);
    return seen_;
  }

 private:
  std::mutex mu_;
  std::vector<Seen> seen_;
  std::vector<std::thread> threads_;  // Only the one I/O thread adds to it.
};

// One request on `p`: its reply, parsed (the test fails when none comes within 5 s).
ParsedFrame Call(RawPeer& p, uint16_t op, uint64_t id, const std::vector<uint8_t>& payload,
                 std::vector<uint8_t>& storage) {
  p.Send(BuildRawFrame(FrameHeader{Op{op}, false, id}, payload));
  auto got = p.Recv();
  if (!got) {
    ADD_FAILURE() << "no reply to op " << op << " within 5 s";
    return ParsedFrame{};
  }
  storage = std::move(*got);
  auto f = ParseFrame(storage, Direction::kResponse);
  EXPECT_TRUE(f.ok()) << f.status();
  return f.ok() ? *f : ParsedFrame{};
}

std::string Text(std::span<const uint8_t> b) { return std::string(b.begin(), b.end()); }

TEST(ServiceRegistryTest, ARegisteredServiceGetsItsOpsAndOthersGetAClearError) {
  WidgetService widgets;
  ServerFixture fx(false, {}, [&](Server& s) {
    ASSERT_TRUE(s.RegisterService("widgets", kEcho, kRefuse, &widgets).ok());
  });
  RawPeer p(fx.server_->port());
  p.Handshake(kSecret, kClientA);
  std::vector<uint8_t> buf;

  const std::vector<uint8_t> payload = {1, 2, 3, 4, 5};
  ParsedFrame echo = Call(p, kEcho, 7, payload, buf);
  EXPECT_EQ(echo.header.op, Op{kEcho});
  EXPECT_EQ(echo.header.request_id, 7u);
  ASSERT_EQ(echo.header.status, StatusCode::kOk);
  EXPECT_EQ(std::vector<uint8_t>(echo.data.begin(), echo.data.end()),
            (std::vector<uint8_t>{5, 4, 3, 2, 1}));

  ParsedFrame later = Call(p, kLater, 8, {9, 8}, buf);
  ASSERT_EQ(later.header.status, StatusCode::kOk);
  EXPECT_EQ(later.header.request_id, 8u);
  EXPECT_EQ(std::vector<uint8_t>(later.data.begin(), later.data.end()),
            (std::vector<uint8_t>{8, 9}));

  ParsedFrame refused = Call(p, kRefuse, 9, {}, buf);
  EXPECT_EQ(refused.header.status, StatusCode::kInvalidArgument);
  EXPECT_EQ(Text(refused.data), "bad widget");

  // A service op nobody registered: an error reply naming the op and the services there are.
  ParsedFrame unknown = Call(p, 43, 10, payload, buf);
  EXPECT_EQ(unknown.header.op, Op{43});
  EXPECT_EQ(unknown.header.request_id, 10u);
  EXPECT_EQ(unknown.header.status, StatusCode::kUnsupported);
  EXPECT_NE(Text(unknown.data).find("no service on this server handles op 43"),
            std::string::npos)
      << Text(unknown.data);
  EXPECT_NE(Text(unknown.data).find("widgets 40..42"), std::string::npos) << Text(unknown.data);

  // The connection goes on.
  ParsedFrame again = Call(p, kEcho, 11, {6}, buf);
  EXPECT_EQ(again.header.status, StatusCode::kOk);

  auto seen = widgets.seen();
  ASSERT_EQ(seen.size(), 4u) << "op 43 must not reach the service";
  EXPECT_EQ(seen[0].op, kEcho);
  EXPECT_EQ(seen[0].client_id, kClientA);
  EXPECT_EQ(seen[0].payload, payload);
  EXPECT_EQ(seen[1].op, kLater);
  EXPECT_EQ(seen[2].op, kRefuse);
  EXPECT_EQ(seen[3].op, kEcho);
}

TEST(ServiceRegistryTest, WithoutServicesEveryServiceOpIsRefusedByReply) {
  ServerFixture fx;
  RawPeer p(fx.server_->port());
  p.Handshake(kSecret, kClientA);
  std::vector<uint8_t> buf;
  for (uint16_t op : {kFirstServiceOp, kLastServiceOp}) {
    ParsedFrame f = Call(p, op, op, {1}, buf);
    EXPECT_EQ(f.header.status, StatusCode::kUnsupported);
    EXPECT_NE(Text(f.data).find("no services registered"), std::string::npos) << Text(f.data);
  }
  // An op outside the service range is a protocol error: the connection closes.
  p.Send(BuildRawFrame(FrameHeader{Op{kLastServiceOp + 1}, false, 1}, std::vector<uint8_t>{1}));
  EXPECT_TRUE(p.ClosedByServer());
}

TEST(ServiceRegistryTest, RangesAreCheckedWhenRegistered) {
  WidgetService a, b;
  std::optional<ServerFixture> fx;
  fx.emplace(false, std::function<void(ServerOptions&)>{}, [&](Server& s) {
    EXPECT_EQ(s.RegisterService("a", kFirstServiceOp - 1, 20, &a).code(),
              StatusCode::kInvalidArgument);
    EXPECT_EQ(s.RegisterService("a", 20, kLastServiceOp + 1, &a).code(),
              StatusCode::kInvalidArgument);
    EXPECT_EQ(s.RegisterService("a", 30, 20, &a).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(s.RegisterService("", 20, 30, &a).code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(s.RegisterService("a", 20, 30, &a).ok());
    Status overlap = s.RegisterService("b", 30, 35, &b);
    EXPECT_EQ(overlap.code(), StatusCode::kAlreadyExists);
    EXPECT_NE(overlap.message().find("belongs to service a"), std::string::npos) << overlap;
    EXPECT_TRUE(s.RegisterService("b", 31, 35, &b).ok());
  });
  Status late = fx->server_->RegisterService("c", 40, 41, &b);
  EXPECT_EQ(late.code(), StatusCode::kInvalidArgument) << late;
}

}  // namespace
}  // namespace tessera::fabric
