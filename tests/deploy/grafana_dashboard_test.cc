// deploy/grafana/tessera.json queries only metrics Tessera exports: every tessera_* name in
// its queries appears in the /metrics text of a real `tessera memserver --metrics-port` or a
// real `tessera nbd --metrics-port` (an embedded cluster) after some I/O.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <string>

#include "common/clock.h"
#include "common/subprocess.h"
#include "tests/support/test_util.h"

namespace tessera {
namespace {

using testing::BinDir;

std::string HttpGet(uint16_t port, const std::string& path) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string out;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
    const std::string req = "GET " + path + " HTTP/1.1\r\nHost: localhost\r\n\r\n";
    if (::write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size())) {
      char buf[65536];
      ssize_t n;
      while ((n = ::read(fd, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
    }
  }
  ::close(fd);
  return out;
}

// The port of a "metrics on HOST:PORT" line the process prints, or 0.
uint16_t MetricsPort(Subprocess& p) {
  auto line = p.WaitForLine("metrics on ", Deadline::AfterMs(60000));
  if (!line.ok()) return 0;
  return static_cast<uint16_t>(std::stoi(line->substr(line->rfind(':') + 1)));
}

TEST(GrafanaDashboard, EveryQueriedMetricIsExported) {
  const std::string text = testing::ReadFile(std::string(TESSERA_SOURCE_DIR) +
                                             "/deploy/grafana/tessera.json");
  auto dashboard = nlohmann::json::parse(text, nullptr, false);
  ASSERT_FALSE(dashboard.is_discarded()) << "deploy/grafana/tessera.json is not JSON";
  std::set<std::string> queried;
  const std::regex name("tessera_[a-z0-9_]+");
  for (const auto& panel : dashboard["panels"]) {
    for (const auto& target : panel["targets"]) {
      const std::string expr = target["expr"].get<std::string>();
      for (std::sregex_iterator it(expr.begin(), expr.end(), name), end; it != end; ++it) {
        queried.insert(it->str());
      }
    }
  }
  ASSERT_GT(queried.size(), 10u);

  Subprocess::Options o;
  o.capture_stdout = true;
  o.quiet_stderr = true;
  auto memserver = Subprocess::Start({BinDir() + "/tessera", "memserver", "--port=0",
                                      "--capacity=64M", "--slab-size=1M", "--metrics-port=0"},
                                     o);
  ASSERT_TRUE(memserver.ok()) << memserver.status();
  const uint16_t memserver_port = MetricsPort(*memserver);
  ASSERT_NE(memserver_port, 0) << "no 'metrics on' line from tessera memserver";

  auto nbd = Subprocess::Start({BinDir() + "/tessera", "nbd", "--size=16M", "--k=2", "--r=1",
                                "--ephemeral", "--listen=127.0.0.1:0", "--metrics-port=0"},
                               o);
  ASSERT_TRUE(nbd.ok()) << nbd.status();
  const uint16_t nbd_port = MetricsPort(*nbd);
  ASSERT_NE(nbd_port, 0) << "no 'metrics on' line from tessera nbd";

  const std::string exported = HttpGet(memserver_port, "/metrics") + HttpGet(nbd_port, "/metrics");
  ASSERT_NE(exported.find("tessera_build_info{component=\"nbd\""), std::string::npos) << exported;
  ASSERT_NE(exported.find("tessera_client_read_latency_seconds_bucket{"), std::string::npos);
  for (const std::string& metric : queried) {
    EXPECT_NE(exported.find("\n" + metric), std::string::npos)
        << metric << " is queried by the dashboard but exported by nothing";
  }
  EXPECT_TRUE(nbd->Stop().ok());
  EXPECT_TRUE(memserver->Stop().ok());
}

}  // namespace
}  // namespace tessera
