// `tessera run --metrics-port`: while a program runs at 50% local memory on an embedded
// cluster, its pager's figures are served as Prometheus text: build info, counters that grow
// as it faults and pages out, the fault latency as a histogram (no summary), ratios in 0..1.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/subprocess.h"
#include "tests/support/test_util.h"

namespace tessera {
namespace {

using testing::BinDir;
using testing::TempDir;

// 24 MB of distinct pages, touched again and again until it is killed: faults and evictions
// go on while the test scrapes.
constexpr char kProgram[] = R"PY(
import sys
pages = [bytearray(4096) for _ in range(6144)]
print("ready", flush=True)
n = 0
while True:
    for p in pages:
        p[n % 4096] = (p[n % 4096] + 1) % 256
    n += 1
)PY";

// The value of the first sample of `name` (exact name, then a space or '{'), or -1.
double Sample(const std::string& text, const std::string& name) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(name, 0) != 0 || line.size() <= name.size()) continue;
    const char next = line[name.size()];
    if (next != ' ' && next != '{') continue;
    return std::strtod(line.c_str() + line.rfind(' ') + 1, nullptr);
  }
  return -1;
}

TEST(RunMetrics, ThePagersFiguresAreServedWhileTheProgramRuns) {
  TempDir tmp;
  const std::string script = tmp.path() + "/prog.py";
  std::ofstream(script) << kProgram;
  Subprocess::Options so;
  so.capture_stdout = true;
  so.stderr_to_stdout = true;  // `metrics on` goes to stderr: stdout is the program's.
  so.own_process_group = true;
  auto p = Subprocess::Start({BinDir() + "/tessera", "run", "--local-memory", "50%", "--region",
                              "1G", "--k", "2", "--r", "1", "--spares", "0", "--metrics-port",
                              "0", "--", "/usr/bin/python3", script},
                             so);
  ASSERT_TRUE(p.ok()) << p.status();
  auto line = p->WaitForLine("metrics on ", Deadline::AfterMs(120000));
  ASSERT_TRUE(line.ok()) << "no 'metrics on' line: " << line.status();
  const uint16_t port = testing::MetricsPortIn(*line);
  ASSERT_NE(port, 0) << *line;
  ASSERT_TRUE(p->WaitForLine("ready", Deadline::AfterMs(120000)).ok());

  // The shim rewrites its live stats about twice a second: wait (bounded) until a snapshot
  // shows the program paging.
  std::string text;
  const Deadline d = Deadline::AfterMs(60000);
  while (!(Sample(text, "tessera_run_remote_writes_total") > 0 &&
           Sample(text, "tessera_run_remote_reads_total") > 0)) {
    ASSERT_FALSE(d.Expired()) << "no paging seen in 60 s of /metrics:\n" << text;
    text = testing::HttpGet(port, "/metrics");
  }
  EXPECT_NE(text.find("tessera_build_info{component=\"run\""), std::string::npos) << text;
  EXPECT_GT(Sample(text, "tessera_run_faults_total"), 0) << text;
  EXPECT_GT(Sample(text, "tessera_run_limit_pages"), 0) << text;
  EXPECT_EQ(Sample(text, "tessera_run_store_data_loss_total"), 0) << text;
  EXPECT_NE(text.find("# TYPE tessera_run_fault_latency_seconds histogram"), std::string::npos);
  EXPECT_EQ(text.find(" summary"), std::string::npos) << "latencies are histograms:\n" << text;
  // The histogram counts every fault measured so far, in cumulative buckets.
  const double count = Sample(text, "tessera_run_fault_latency_seconds_count");
  EXPECT_GT(count, 0) << text;
  EXPECT_EQ(Sample(text, "tessera_run_fault_latency_seconds_bucket{le=\"+Inf\"}"), count)
      << text;
  for (const char* ratio : {"tessera_run_resident_ratio", "tessera_run_tier_hit_ratio"}) {
    const double v = Sample(text, ratio);
    EXPECT_GE(v, 0) << ratio;
    EXPECT_LE(v, 1) << ratio;
  }
  // Resident pages over the limit for a moment (a fault maps its pages before the evictor makes
  // room) read as the whole budget in use.
  const double resident = Sample(text, "tessera_run_resident_pages");
  const double limit = Sample(text, "tessera_run_limit_pages");
  // (The text format prints 9 significant digits.)
  EXPECT_NEAR(Sample(text, "tessera_run_resident_ratio"), std::min(resident, limit) / limit, 1e-8)
      << text;

  ASSERT_EQ(kill(-p->pid(), SIGTERM), 0);
  auto ws = p->Wait(Deadline::AfterMs(60000));
  ASSERT_TRUE(ws.ok()) << ws.status();
}

TEST(RunMetrics, MetricsPortWithTheSwapPagerIsAUsageError) {
  auto out = testing::RunCommand({BinDir() + "/tessera", "run", "--pager", "swap",
                                  "--metrics-port", "0", "--", "/bin/true"});
  EXPECT_EQ(out.exit_code, 2);
}

}  // namespace
}  // namespace tessera
