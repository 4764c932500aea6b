// deploy/grafana/tessera.json queries only metrics Tessera exports: every tessera_* name in
// its queries appears in the /metrics text of a real `tessera memserver --metrics-port`, a
// real `tessera nbd --metrics-port` (an embedded cluster), a real `tessera paramsvc serve
// --metrics-port` checkpointing to that cluster, and a real `tessera swap on --metrics-port`.
// Every endpoint serves tessera_build_info with its features, no summary, and ratios in 0..1.
#include <gtest/gtest.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "common/clock.h"
#include "common/subprocess.h"
#include "tests/support/test_util.h"

namespace tessera {
namespace {

using testing::BinDir;
using testing::HttpGet;
using testing::MetricsPortIn;

// The port of a "metrics on HOST:PORT" line the process prints, or 0.
uint16_t MetricsPort(Subprocess& p) {
  auto line = p.WaitForLine("metrics on ", Deadline::AfterMs(60000));
  return line.ok() ? MetricsPortIn(*line) : 0;
}

std::set<std::string> QueriedMetrics() {
  const std::string text = testing::ReadFile(std::string(TESSERA_SOURCE_DIR) +
                                             "/deploy/grafana/tessera.json");
  auto dashboard = nlohmann::json::parse(text, nullptr, false);
  EXPECT_FALSE(dashboard.is_discarded()) << "deploy/grafana/tessera.json is not JSON";
  std::set<std::string> queried;
  if (dashboard.is_discarded()) return queried;
  const std::regex name("tessera_[a-z0-9_]+");
  for (const auto& panel : dashboard["panels"]) {
    for (const auto& target : panel["targets"]) {
      const std::string expr = target["expr"].get<std::string>();
      for (std::sregex_iterator it(expr.begin(), expr.end(), name), end; it != end; ++it) {
        queried.insert(it->str());
      }
    }
  }
  return queried;
}

// What every endpoint must do: build info with its component and features, histograms rather
// than summaries, ratios in 0..1.
void CheckConventions(const std::string& component, const std::string& text) {
  EXPECT_NE(text.find("HTTP/1.1 200 OK"), std::string::npos) << component << ":\n" << text;
  EXPECT_NE(text.find("tessera_build_info{component=\"" + component + "\",version=\""),
            std::string::npos)
      << component << ":\n" << text;
  EXPECT_NE(text.find("\",features=\""), std::string::npos) << component;
  EXPECT_EQ(text.find(" summary\n"), std::string::npos) << component << " exports a summary";
  EXPECT_EQ(text.find("quantile=\""), std::string::npos) << component;
  std::istringstream in(text);
  int ratios = 0;
  for (std::string line; std::getline(in, line);) {
    const size_t name_end = line.find_first_of("{ ");
    if (line.empty() || line[0] == '#' || name_end == std::string::npos) continue;
    const std::string name = line.substr(0, name_end);
    if (name.size() < 6 || name.compare(name.size() - 6, 6, "_ratio") != 0) continue;
    const double v = std::stod(line.substr(line.rfind(' ') + 1));
    EXPECT_TRUE(v >= 0 && v <= 1) << component << ": " << line;
    ++ratios;
  }
  EXPECT_GT(ratios, 0) << component << " exports no ratio";
}

// `tessera swap on` needs root, /dev/fuse and loop devices; `off` runs on every exit path.
class SwapDevice {
 public:
  static bool Possible() {
    return ::geteuid() == 0 && ::access("/dev/fuse", R_OK | W_OK) == 0 &&
           ::access("/dev/loop-control", R_OK | W_OK) == 0;
  }
  explicit SwapDevice(std::vector<std::string> flags)
      : name_("grafana-" + std::to_string(::getpid())) {
    std::vector<std::string> argv = {BinDir() + "/tessera", "swap", "on", "--name", name_,
                                     "--size", "64M"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    on_ = testing::RunCommand(argv, 180000);
  }
  ~SwapDevice() {
    testing::RunCommand({BinDir() + "/tessera", "swap", "off", "--name", name_}, 120000);
  }
  const testing::CommandOutcome& on() const { return on_; }

 private:
  std::string name_;
  testing::CommandOutcome on_;
};

TEST(GrafanaDashboard, EveryQueriedMetricIsExported) {
  const std::set<std::string> queried = QueriedMetrics();
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
  // "embedded cluster: N memservers, cluster file F, auth token T": the paramsvc checkpoints
  // go to the same servers.
  auto cluster = nbd->WaitForLine("embedded cluster: ", Deadline::AfterMs(60000));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const size_t file_at = cluster->find("cluster file ") + 13;
  const std::string cluster_file = cluster->substr(file_at, cluster->find(',', file_at) - file_at);
  const std::string token = cluster->substr(cluster->find("auth token ") + 11);
  const uint16_t nbd_port = MetricsPort(*nbd);
  ASSERT_NE(nbd_port, 0) << "no 'metrics on' line from tessera nbd";

  auto paramsvc = Subprocess::Start(
      {BinDir() + "/tessera", "paramsvc", "serve", "--port=0", "--metrics-port=0",
       "--store=" + cluster_file, "--auth-token-file=" + token, "--k=2", "--r=1",
       "--store-mb=16"},
      o);
  ASSERT_TRUE(paramsvc.ok()) << paramsvc.status();
  auto checkpoints = paramsvc->WaitForLine("checkpoints ", Deadline::AfterMs(60000));
  ASSERT_TRUE(checkpoints.ok()) << checkpoints.status();
  EXPECT_EQ(*checkpoints, "checkpoints on");
  const uint16_t paramsvc_port = MetricsPort(*paramsvc);
  ASSERT_NE(paramsvc_port, 0) << "no 'metrics on' line from tessera paramsvc serve";

  const std::string memserver_text = HttpGet(memserver_port, "/metrics");
  const std::string nbd_text = HttpGet(nbd_port, "/metrics");
  const std::string paramsvc_text = HttpGet(paramsvc_port, "/metrics");
  CheckConventions("memserver", memserver_text);
  CheckConventions("nbd", nbd_text);
  CheckConventions("paramsvc", paramsvc_text);
  EXPECT_NE(memserver_text.find("# TYPE tessera_memserver_service_seconds histogram\n"),
            std::string::npos);
  EXPECT_NE(memserver_text.find("tessera_memserver_service_seconds_bucket{le=\"+Inf\"} "),
            std::string::npos);
  EXPECT_NE(nbd_text.find("tessera_client_read_latency_seconds_bucket{"), std::string::npos);
  EXPECT_NE(paramsvc_text.find("tessera_client_writes_total{store="), std::string::npos)
      << paramsvc_text;
  std::string exported = memserver_text + nbd_text + paramsvc_text;

  if (SwapDevice::Possible()) {
    SwapDevice swap({"--k=2", "--r=1", "--metrics-port=0"});
    ASSERT_EQ(swap.on().exit_code, 0) << swap.on().stdout_text;
    const uint16_t swap_port = MetricsPortIn(swap.on().stdout_text);
    ASSERT_NE(swap_port, 0) << "no 'metrics on' line from tessera swap on:\n"
                            << swap.on().stdout_text;
    const std::string swap_text = HttpGet(swap_port, "/metrics");
    CheckConventions("swap", swap_text);
    EXPECT_NE(swap_text.find("tessera_swap_pages_total{op=\"write\"} "), std::string::npos)
        << swap_text;
    exported += swap_text;
  }
  for (const std::string& metric : queried) {
    if (metric.rfind("tessera_swap_", 0) == 0 && !SwapDevice::Possible()) continue;
    EXPECT_NE(exported.find("\n" + metric), std::string::npos)
        << metric << " is queried by the dashboard but exported by nothing";
  }
  EXPECT_TRUE(paramsvc->Stop().ok());
  EXPECT_TRUE(nbd->Stop().ok());
  EXPECT_TRUE(memserver->Stop().ok());
  if (!SwapDevice::Possible()) {
    GTEST_SKIP() << "the tessera_swap_* queries were not checked: `tessera swap on` needs root, "
                    "/dev/fuse and /dev/loop-control";
  }
}

}  // namespace
}  // namespace tessera
