#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <gtest/gtest.h>

#include <string>

#include "common/clock.h"
#include "common/fd.h"
#include "memserver/http_metrics.h"
#include "memserver/metrics.h"

namespace tessera::memserver {
namespace {

TEST(AtomicHistogramTest, PercentilesMatchTheSample) {
  AtomicLatencyHistogram h;
  EXPECT_EQ(h.Percentile(0.5), 0u);
  for (uint64_t v = 1; v <= 1000; ++v) h.Record(v * 1000);  // 1us .. 1ms
  EXPECT_EQ(h.count(), 1000u);
  EXPECT_NEAR(static_cast<double>(h.Percentile(0.5)), 500000.0, 500000.0 * 0.01);
  EXPECT_NEAR(static_cast<double>(h.Percentile(0.99)), 990000.0, 990000.0 * 0.01);
}

TEST(ServerMetricsTest, CountsOpsErrorsAndBytes) {
  ServerMetrics m;
  m.CountOp(OpSlot::kRead, true);
  m.CountOp(OpSlot::kRead, false);
  m.CountOp(OpSlot::kWrite, true);
  m.AddBytesRead(10);
  m.AddBytesWritten(20);
  EXPECT_EQ(m.ops(OpSlot::kRead), 2u);
  EXPECT_EQ(m.errors(OpSlot::kRead), 1u);
  EXPECT_EQ(m.total_ops(), 3u);
  EXPECT_EQ(m.total_errors(), 1u);
  EXPECT_EQ(m.bytes_read(), 10u);
  EXPECT_EQ(m.bytes_written(), 20u);
  m.UpdateRates(1000000000);
  for (int i = 0; i < 7; ++i) m.CountOp(OpSlot::kAlloc, true);
  m.UpdateRates(2000000000);  // 7 ops in one second.
  EXPECT_DOUBLE_EQ(m.ops_per_sec(), 7.0);
  EXPECT_LE(m.load_permille(), 1000u);
}

// Sends `request` to 127.0.0.1:port and returns everything the server answers.
std::string Exchange(uint16_t port, const std::string& request) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) return "connect failed";
  if (::send(fd.get(), request.data(), request.size(), MSG_NOSIGNAL) < 0) return "send failed";
  ::shutdown(fd.get(), SHUT_WR);  // EOF: the server never waits out its request deadline.
  std::string out;
  Deadline deadline = Deadline::AfterMs(10000);
  char buf[4096];
  for (;;) {
    pollfd p{fd.get(), POLLIN, 0};
    if (::poll(&p, 1, deadline.RemainingMs()) <= 0) return out + "<timeout>";
    ssize_t n = ::recv(fd.get(), buf, sizeof(buf), 0);
    if (n <= 0) return out;
    out.append(buf, static_cast<size_t>(n));
  }
}

TEST(MetricsHttpServerTest, ServesMetricsAndRejectsEverythingElse) {
  auto s = MetricsHttpServer::Start("127.0.0.1", 0, [] { return std::string("up 1\n"); });
  ASSERT_TRUE(s.ok()) << s.status();
  uint16_t port = (*s)->port();
  ASSERT_NE(port, 0);
  std::string ok = Exchange(port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(ok.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << ok;
  EXPECT_NE(ok.find("Content-Length: 5\r\n"), std::string::npos) << ok;
  EXPECT_EQ(ok.substr(ok.size() - 5), "up 1\n");
  EXPECT_EQ(Exchange(port, "GET /other HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 404", 0), 0u);
  EXPECT_EQ(Exchange(port, "POST /metrics HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 405", 0), 0u);
  EXPECT_EQ(Exchange(port, "garbage\r\n\r\n").rfind("HTTP/1.1 400", 0), 0u);
  // A client that sends nothing and closes does not stop the server.
  EXPECT_EQ(Exchange(port, ""), "");
  EXPECT_EQ(Exchange(port, "GET /metrics?x=1 HTTP/1.0\r\n\r\n").rfind("HTTP/1.1 200", 0), 0u);
  (*s)->Stop();
}

}  // namespace
}  // namespace tessera::memserver
