// common/net.h: one way to listen, for every server.
#include "common/net.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace tessera {
namespace {

TEST(Net, ListensOnAnEphemeralPortAndSaysWhichIpv4AndIpv6) {
  auto fd = ListenTcp("127.0.0.1", 0);
  ASSERT_TRUE(fd.ok()) << fd.status();
  const uint16_t port = BoundPort(fd->get());
  ASSERT_NE(port, 0);
  int c = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(c, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0) << "nothing listens";
  ::close(c);

  auto v6 = ListenTcp("[::1]", 0);
  if (!v6.ok()) GTEST_SKIP() << "no IPv6 loopback here: " << v6.status();
  EXPECT_NE(BoundPort(v6->get()), 0);
}

TEST(Net, APortInUseAndABadHostAreClearErrors) {
  auto fd = ListenTcp("127.0.0.1", 0);
  ASSERT_TRUE(fd.ok()) << fd.status();
  const uint16_t port = BoundPort(fd->get());
  ListenOptions o;
  o.what = "metrics endpoint";
  auto again = ListenTcp("127.0.0.1", port, o);
  ASSERT_FALSE(again.ok());
  EXPECT_NE(
      again.status().message().find("bind metrics endpoint 127.0.0.1:" + std::to_string(port)),
      std::string::npos)
      << again.status();
  EXPECT_NE(again.status().message().find("in use"), std::string::npos) << again.status();
  auto bad = ListenTcp("no such host.invalid", 0, o);
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument) << bad.status();
  EXPECT_NE(bad.status().message().find("metrics endpoint"), std::string::npos) << bad.status();
}

}  // namespace
}  // namespace tessera
