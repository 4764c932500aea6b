// The service API of the memory server (memserver/service.h) on an in-process daemon: a service
// made at start-up gets its owner id, the CPU lent to it and its request types; its slabs come
// from the server's pool; the fabric hands it its ops; STATS carries its lines; an op no
// service registered gets a clear error reply; two services cannot share an op.
#include "memserver/service.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>

#include <atomic>
#include <cstring>
#include <string>
#include <vector>

#include "fabric/connect.h"
#include "fabric/control_client.h"
#include "fabric/wire.h"
#include "memserver/daemon.h"

namespace tessera::memserver {
namespace {

constexpr char kSecret[] = "memserver-service-test-secret-0123456789";
constexpr uint16_t kCountOp = 60;  // Answers the 8 bytes the service wrote into its slab.
constexpr uint16_t kLastOp = 61;

class CounterService : public Service, public fabric::ServiceHandler {
 public:
  std::optional<Result<std::vector<uint8_t>>> HandleRequest(const fabric::PeerInfo&,
                                                            fabric::Op op,
                                                            std::span<const uint8_t> payload,
                                                            fabric::AsyncReply) override {
    requests_.fetch_add(1);
    if (static_cast<uint16_t>(op) != kCountOp || payload.size() != 8) {
      return Result<std::vector<uint8_t>>(InvalidArgument("counter: want op 60 with 8 bytes"));
    }
    return Result<std::vector<uint8_t>>(std::vector<uint8_t>(slab_.begin(), slab_.begin() + 8));
  }
  std::string StatsText() override {
    return "counter_requests " + std::to_string(requests_.load()) + "\n";
  }
  std::span<uint8_t> slab_;
  OwnerId owner_ = 0;
  int workers_ = 0;

 private:
  std::atomic<uint64_t> requests_{0};
};

ServicePlugin Counter(CounterService** made) {
  return ServicePlugin{"counter", [made](ServiceHost& host) -> Result<std::unique_ptr<Service>> {
    auto s = std::make_unique<CounterService>();
    s->owner_ = host.slab_owner();
    s->workers_ = host.cpu().workers;
    TESSERA_ASSIGN_OR_RETURN(uint64_t slab, host.slabs().Alloc(host.slab_owner()));
    TESSERA_ASSIGN_OR_RETURN(s->slab_, host.slabs().Resolve(host.slab_owner(), slab, 0, 8));
    std::memcpy(s->slab_.data(), "countme!", 8);
    TESSERA_RETURN_IF_ERROR(host.RegisterRequestTypes(kCountOp, kLastOp, s.get()));
    *made = s.get();
    return std::unique_ptr<Service>(std::move(s));
  }};
}

DaemonOptions Options() {
  DaemonOptions o;
  o.port = 0;
  o.capacity_bytes = 4u << 20;
  o.slab_bytes = 1u << 20;
  o.headroom_bytes = 0;
  o.transport = fabric::TransportKind::kTcp;
  o.secret = kSecret;
  return o;
}

// One request over an authenticated socket; the whole reply frame, parsed into `f`.
void Call(const fabric::Endpoint& ep, uint16_t op, std::span<const uint8_t> payload,
          std::vector<uint8_t>& reply, fabric::ParsedFrame& f) {
  fabric::ConnectOptions co;
  co.secret = kSecret;
  co.client_id = 5;
  auto sock = fabric::ConnectAndAuthenticate(ep, co);
  ASSERT_TRUE(sock.ok()) << sock.status();
  ASSERT_TRUE(fabric::SetBlocking(sock->fd.get(), true).ok());
  auto frame = fabric::BuildRawFrame(fabric::FrameHeader{fabric::Op{op}, false, 3}, payload);
  ASSERT_EQ(::send(sock->fd.get(), frame.data(), frame.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(frame.size()));
  reply.clear();
  Deadline d = Deadline::AfterMs(10000);
  size_t want = fabric::kHeaderSize;
  while (reply.size() < want) {
    pollfd p{sock->fd.get(), POLLIN, 0};
    ASSERT_GT(::poll(&p, 1, d.RemainingMs()), 0) << "no reply to op " << op << " within 10 s";
    uint8_t buf[4096];
    ssize_t n = ::recv(sock->fd.get(), buf, sizeof(buf), 0);
    ASSERT_GT(n, 0) << "the server closed the connection";
    reply.insert(reply.end(), buf, buf + n);
    if (reply.size() >= fabric::kHeaderSize) {
      want = fabric::kHeaderSize + fabric::GetU32(reply.data() + 20);
    }
  }
  auto parsed = fabric::ParseFrame(reply, fabric::Direction::kResponse);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  f = *parsed;
}

std::string Text(std::span<const uint8_t> b) { return std::string(b.begin(), b.end()); }

TEST(ServiceTest, AServiceGetsItsOpsSlabsAndCpu) {
  CounterService* counter = nullptr;
  DaemonOptions o = Options();
  o.service_cpu.workers = 3;
  o.services.push_back(Counter(&counter));
  auto d = MemServerDaemon::Start(o);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_NE(counter, nullptr);
  EXPECT_EQ(counter->owner_, ServiceOwner(0));
  EXPECT_TRUE(IsServiceOwner(counter->owner_));
  EXPECT_EQ(counter->workers_, 3);
  const fabric::Endpoint ep{"127.0.0.1", (*d)->port()};

  std::vector<uint8_t> reply;
  fabric::ParsedFrame f;
  const std::vector<uint8_t> eight(8, 1);
  Call(ep, kCountOp, eight, reply, f);
  ASSERT_EQ(f.header.status, StatusCode::kOk) << Text(f.data);
  EXPECT_EQ(Text(f.data), "countme!");
  Call(ep, kLastOp, eight, reply, f);
  EXPECT_EQ(f.header.status, StatusCode::kInvalidArgument);
  EXPECT_EQ(Text(f.data), "counter: want op 60 with 8 bytes");

  // An op nobody registered: answered by the engine, never seen by the service.
  Call(ep, 70, eight, reply, f);
  EXPECT_EQ(f.header.status, StatusCode::kUnsupported);
  EXPECT_NE(Text(f.data).find("no service on this server handles op 70 (services: counter "
                              "60..61)"),
            std::string::npos)
      << Text(f.data);

  EXPECT_NE((*d)->handler().StatsText().find("counter_requests 2\n"), std::string::npos)
      << (*d)->handler().StatsText();
  (*d)->Shutdown();
}

TEST(ServiceTest, TwoServicesCannotShareAnOp) {
  CounterService* a = nullptr;
  CounterService* b = nullptr;
  DaemonOptions o = Options();
  o.services.push_back(Counter(&a));
  o.services.push_back(Counter(&b));
  auto d = MemServerDaemon::Start(o);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kAlreadyExists) << d.status();
  EXPECT_NE(d.status().message().find("belongs to service counter"), std::string::npos)
      << d.status();
}

TEST(ServiceTest, TheCpuLoanIsChecked) {
  DaemonOptions o = Options();
  o.service_cpu.workers = 0;
  auto d = MemServerDaemon::Start(o);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument) << d.status();
}

}  // namespace
}  // namespace tessera::memserver
