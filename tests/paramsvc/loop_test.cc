// The Parameter Service server's event loops (apps/paramsvc/server_loop.cc), in-process with
// real clients: connections cost no thread of their own, a reader that stops reading holds no
// core and no other connection, bad frames close only their own connection, and the service
// listens on IPv6 as well as IPv4.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "apps/paramsvc/client/client.h"
#include "apps/paramsvc/io.h"
#include "apps/paramsvc/server/server.h"
#include "common/clock.h"
#include "fabric/auth.h"

namespace tessera::paramsvc {
namespace {

constexpr char kSecret[] = "paramsvc-loop-test-secret-0123456789";

std::unique_ptr<Server> StartServer(const std::string& host, int loops) {
  auto fd = Server::Listen(host, 0);
  if (!fd.ok()) return nullptr;
  ServerOptions o;
  o.secret = kSecret;
  o.max_cores = 1;
  o.event_loops = loops;
  auto s = Server::Start(o, std::move(*fd));
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? std::move(*s) : nullptr;
}

Result<std::unique_ptr<Client>> Connect(const std::string& host, uint16_t port) {
  ClientOptions o;
  o.host = host;
  o.port = port;
  o.secret = kSecret;
  o.op_timeout_ms = 20000;
  return Client::Connect(o);
}

JobSpec Spec(const std::string& name, uint64_t floats) {
  JobSpec s;
  s.name = name;
  s.workers = 1;
  s.optimizer.lr = 1.0f;  // p -= gradient, exactly
  s.partition_bytes = 1u << 20;
  s.tensors = {{"w", DType::kF32, {floats}}};
  return s;
}

// Trains a one-worker job for `iters` rounds of gradient 1 from 0: every element ends at -iters.
void Train(Client* c, uint64_t floats, int iters) {
  std::vector<float> p(floats, 0.0f), g(floats, 1.0f);
  void* params[1] = {p.data()};
  const void* grads[1] = {g.data()};
  ASSERT_TRUE(c->SetParams({params, 1}).ok());
  for (int i = 0; i < iters; ++i) ASSERT_TRUE(c->PushPull({grads, 1}, {params, 1}).ok());
  for (uint64_t i = 0; i < floats; ++i) ASSERT_EQ(p[i], -static_cast<float>(iters)) << i;
}

int ThreadsOfThisProcess() {
  int n = 0;
  for (auto& e : std::filesystem::directory_iterator("/proc/self/task")) {
    (void)e;
    ++n;
  }
  return n;
}

uint64_t Connections(const Server& s) {
  return nlohmann::json::parse(s.StatusJson()).at("connections").get<uint64_t>();
}

int RawConnect(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

TEST(ParamsvcLoop, ThreeHundredConnectionsAddNoThreadAndTrainingGoesOn) {
  auto srv = StartServer("127.0.0.1", 2);
  ASSERT_NE(srv, nullptr);
  const int threads_before = ThreadsOfThisProcess();
  std::vector<int> idle;
  for (int i = 0; i < 300; ++i) {
    const int fd = RawConnect(srv->port());
    ASSERT_GE(fd, 0) << "connection " << i << ": " << std::strerror(errno);
    idle.push_back(fd);
  }
  auto c = Connect("127.0.0.1", srv->port());
  ASSERT_TRUE(c.ok()) << c.status();
  const Deadline d = Deadline::AfterMs(20000);
  while (Connections(*srv) < 301 && !d.Expired()) std::this_thread::yield();
  ASSERT_EQ(Connections(*srv), 301u) << "the loops did not accept every connection in 20 s";
  // The client has a thread or two of its own; the server added none for 301 connections.
  EXPECT_LE(ThreadsOfThisProcess(), threads_before + 3)
      << "threads before: " << threads_before << ", now: " << ThreadsOfThisProcess();
  ASSERT_TRUE((*c)->Join(Spec("many", 4096), 0).ok());
  Train(c->get(), 4096, 20);
  for (int fd : idle) ::close(fd);
  const Deadline gone = Deadline::AfterMs(20000);
  while (Connections(*srv) > 1 && !gone.Expired()) std::this_thread::yield();
  EXPECT_EQ(Connections(*srv), 1u) << "closed connections were not dropped";
}

// A worker that stops reading its replies fills its socket; the replies that do not fit wait
// in its queue. The core that makes them never blocks, so another job on the same (only) core,
// served by the same loop, trains on.
TEST(ParamsvcLoop, AReaderThatStopsReadingHoldsUpNoOtherJob) {
  auto srv = StartServer("127.0.0.1", 1);
  ASSERT_NE(srv, nullptr);
  constexpr uint64_t kBig = 1u << 20;  // 4 MiB of parameters in partitions of 1 MiB.
  auto stuck = Connect("127.0.0.1", srv->port());
  ASSERT_TRUE(stuck.ok()) << stuck.status();
  ASSERT_TRUE((*stuck)->Join(Spec("stuck", kBig), 0).ok());
  {
    std::vector<float> p(kBig, 0.0f);
    void* params[1] = {p.data()};
    ASSERT_TRUE((*stuck)->SetParams({params, 1}).ok());
  }
  // Raw pulls on a second connection of the same job that never reads: 32 replies of 1 MiB
  // are far more than its socket holds.
  const int fd = RawConnect(srv->port());
  ASSERT_GE(fd, 0);
  auto handshake = [&]() -> Status {
    uint8_t hello[40] = {};
    EncodeFixed64(hello + 32, 7);
    TESSERA_RETURN_IF_ERROR(
        WriteFrame(fd, Header{static_cast<uint8_t>(Op::kHello), 0, 0, 0, 1}, hello));
    Header h;
    std::vector<uint8_t> payload;
    TESSERA_RETURN_IF_ERROR(ReadFrame(fd, &h, &payload));
    if (h.status != 0 || payload.size() != 40) return Internal("bad HELLO reply");
    fabric::HandshakeTranscript tr;
    std::memcpy(tr.client_nonce.data(), hello, 32);
    tr.client_id = 7;
    std::memcpy(tr.server_nonce.data(), payload.data(), 32);
    tr.server_id = DecodeFixed64(payload.data() + 32);
    const fabric::Mac mac = fabric::ClientMac(kSecret, tr);
    TESSERA_RETURN_IF_ERROR(
        WriteFrame(fd, Header{static_cast<uint8_t>(Op::kAuth), 0, 0, 0, 2}, mac));
    TESSERA_RETURN_IF_ERROR(ReadFrame(fd, &h, &payload));
    return h.status == 0 ? Status::Ok() : Internal("AUTH refused");
  };
  ASSERT_TRUE(handshake().ok());
  int rcv = 4096;
  ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcv, sizeof(rcv));
  PullRequest pr;
  pr.partition = 0;
  pr.min_version = 0;
  pr.dtype = DType::kF32;
  uint8_t body[PullRequest::kWireSize];
  pr.EncodeTo(body);
  for (int i = 0; i < 32; ++i) {
    ASSERT_TRUE(WriteFrame(fd,
                           Header{static_cast<uint8_t>(Op::kPull), 0, 0, (*stuck)->job(), 100u + i},
                           body)
                    .ok());
  }
  // Another job trains to completion meanwhile, on the same core and the same loop.
  auto other = Connect("127.0.0.1", srv->port());
  ASSERT_TRUE(other.ok()) << other.status();
  ASSERT_TRUE((*other)->Join(Spec("other", 4096), 0).ok());
  Train(other->get(), 4096, 50);
  ::close(fd);
}

TEST(ParamsvcLoop, AMalformedFrameClosesOnlyItsConnection) {
  auto srv = StartServer("127.0.0.1", 1);
  ASSERT_NE(srv, nullptr);
  auto c = Connect("127.0.0.1", srv->port());
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE((*c)->Join(Spec("good", 4096), 0).ok());
  const int fd = RawConnect(srv->port());
  ASSERT_GE(fd, 0);
  const char junk[64] = "this is not a parameter service frame at all, not even close";
  ASSERT_EQ(::send(fd, junk, sizeof(junk), MSG_NOSIGNAL), static_cast<ssize_t>(sizeof(junk)));
  // The server says why, then closes that connection.
  Header h;
  std::vector<uint8_t> payload;
  SetSocketTimeouts(fd, 20000, 20000);
  ASSERT_TRUE(ReadFrame(fd, &h, &payload).ok());
  EXPECT_EQ(h.status, static_cast<uint16_t>(StatusCode::kProtocolError));
  EXPECT_FALSE(ReadFrame(fd, &h, &payload).ok()) << "the connection stayed open";
  ::close(fd);
  Train(c->get(), 4096, 10);
}

TEST(ParamsvcLoop, ServesOverIpv6) {
  auto srv = StartServer("::1", 2);
  if (srv == nullptr) GTEST_SKIP() << "no IPv6 loopback address (::1) on this machine";
  const auto status = nlohmann::json::parse(srv->StatusJson());
  EXPECT_EQ(status.at("advertise"), "[::1]:" + std::to_string(srv->port()));
  auto c = Connect("::1", srv->port());
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE((*c)->Join(Spec("v6", 4096), 0).ok());
  Train(c->get(), 4096, 10);
  // An IPv4 client does not reach a server bound to ::1 only.
  EXPECT_LT(RawConnect(srv->port()), 0);
}

TEST(ParamsvcLoop, BadListenAddressesAreRefused) {
  EXPECT_EQ(Server::Listen("not-an-address", 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Server::Listen("::zz", 0).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tessera::paramsvc
