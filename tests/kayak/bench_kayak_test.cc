// `tessera bench kayak --quick --json`: real memservers and redis-server; checks the JSON
// contract of every row (keys and types) and that every mode and workload produced throughput.
#include <gtest/gtest.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "client/hosts.h"
#include "tests/support/test_util.h"

namespace {

TEST(BenchKayakTest, QuickJsonRowsKeepTheContract) {
  tessera::testing::TempDir dir;
  auto out = tessera::testing::RunTessera(
      {"bench", "kayak", "--quick", "--json", "--seconds=0.4", "--phase_seconds=0.6",
       "--plot=" + dir.path() + "/bimodal.png"},
      240000);
  ASSERT_EQ(out.exit_code, 0) << out.stdout_text;
  std::istringstream lines(out.stdout_text);
  std::string line;
  std::set<std::string> modes, workloads, targets;
  int rows = 0, empty_rows = 0;
  while (std::getline(lines, line)) {
    if (line.empty()) continue;
    auto j = nlohmann::json::parse(line, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << line;
    EXPECT_EQ(j["suite"], "kayak");
    EXPECT_EQ(j["hosts"], "loopback") << line;
    EXPECT_EQ(j["pin"], "none") << line;
    if (j.contains("target")) {  // A target row: what, met or not, and the figures.
      ASSERT_TRUE(j["target"].is_string()) << line;
      ASSERT_TRUE(j["met"].is_boolean()) << line;
      ASSERT_TRUE(j["detail"].is_string()) << line;
      targets.insert(j["target"].get<std::string>());
      continue;
    }
    ++rows;
    ASSERT_TRUE(j["system"] == "tessera" || j["system"] == "redis") << line;
    for (const char* k : {"ops_per_s", "p50_us", "p99_us", "slo_us"}) {
      ASSERT_TRUE(j[k].is_number()) << k << " in " << line;
    }
    ASSERT_TRUE(j["chain"].is_number_integer()) << line;
    ASSERT_TRUE(j["compute_us"].is_number_integer()) << line;
    ASSERT_TRUE(j["slo_met"].is_boolean()) << line;
    ASSERT_TRUE(j.contains("x_final")) << line;
    ASSERT_TRUE(j["workload"].is_string()) << line;
    // A point can see no completion in its 0.3 s if the loaded machine stalls it; allow a few.
    if (j["ops_per_s"].get<double>() <= 0) ++empty_rows;
    EXPECT_GT(j["slo_us"].get<double>(), 0) << line;
    modes.insert(j["mode"]);
    workloads.insert(j["workload"]);
    if (j["system"] == "tessera") {
      const double x = j["x_final"].get<double>();
      EXPECT_GE(x, 0.0);
      EXPECT_LE(x, 1.0);
      if (j["mode"] == "kv") {
        EXPECT_EQ(x, 0.0);
      }
      if (j["mode"] == "rpc") {
        EXPECT_EQ(x, 1.0);
      }
    }
  }
  EXPECT_EQ(modes, (std::set<std::string>{"kv", "rpc", "pushback", "kayak", "redis-get", "redis-fcall"}));
  EXPECT_TRUE(workloads.count("bimodal"));
  EXPECT_TRUE(workloads.count("ycsb-t"));
  EXPECT_TRUE(workloads.count("chain4-compute20us"));
  EXPECT_GE(rows, 20);
  EXPECT_TRUE(targets.count("bimodal: kayak converges within 1 s of a phase change"));
  EXPECT_TRUE(targets.count("chain4-compute20us: kayak >= better of kv/rpc (within 3%)"));
  EXPECT_LE(empty_rows, rows / 10) << "too many points without a single completed request";
  EXPECT_FALSE(tessera::testing::ReadFile(dir.path() + "/bimodal.png").empty()) << "no plot";
}

// --hosts netns --pin auto: the memservers and Redis in namespaces of their own, on the server
// CPUs; every row says so. Bad values of either flag are usage errors naming the flag.
TEST(BenchKayakTest, NetnsHostsArePutInTheRows) {
  if (::geteuid() != 0) GTEST_SKIP() << "network namespaces need root";
  auto out = tessera::testing::RunTessera(
      {"bench", "kayak", "--quick", "--json", "--seconds=0.3", "--plot=", "--hosts=netns",
       "--pin=auto", "--workloads=chain1-compute0us", "--modes=kv,kayak,redis-get"},
      120000);
  ASSERT_EQ(out.exit_code, 0) << out.stdout_text;
  const auto rows = tessera::testing::JsonRows(out.stdout_text, "suite", "kayak");
  const std::string pin = tessera::client::FormatPin(
      tessera::client::AutoPin(tessera::client::AllowedCpus()));
  std::set<std::string> modes;
  for (const auto& j : rows) {
    EXPECT_EQ(j["hosts"], "netns") << j;
    EXPECT_EQ(j["pin"], pin) << j;
    if (!j.contains("target")) {
      modes.insert(j["mode"].get<std::string>());
      EXPECT_GT(j["ops_per_s"].get<double>(), 0) << j;
    }
  }
  EXPECT_EQ(modes, (std::set<std::string>{"kv", "kayak", "redis-get"}));
  EXPECT_EQ(tessera::testing::RunTessera({"bench", "kayak", "--hosts=veth"}).exit_code, 2);
  EXPECT_EQ(tessera::testing::RunTessera({"bench", "kayak", "--pin=client:0,client:1"}).exit_code,
            2);
}

}  // namespace

// --x_sweep: X held at each value (the R-loop only) on real memservers; its own table (stderr
// with --json), never in the JSON lines (whose contract the test above checks). A bad value is a
// usage error.
TEST(BenchKayakTest, XSweepPrintsItsOwnTableAndRejectsBadFractions) {
  // (Through sh, for stderr on the same pipe.)
  const std::string tessera = tessera::testing::BinDir() + "/tessera";
  auto out = tessera::testing::RunCommand(
      {"/bin/sh", "-c",
       "'" + tessera + "' bench kayak --quick --json --seconds=0.3 --noredis --plot= "
                       "--workloads=chain4-compute0us --modes=rpc --x_sweep=0,1 2>&1"},
      120000);
  ASSERT_EQ(out.exit_code, 0) << out.stdout_text;
  std::istringstream lines(out.stdout_text);
  std::string line;
  int json_rows = 0;
  while (std::getline(lines, line)) {
    if (line.empty() || line[0] != '{') continue;
    auto j = nlohmann::json::parse(line, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << line;
    ++json_rows;
    EXPECT_EQ(j["mode"], "rpc") << "a sweep point leaked into the JSON lines: " << line;
  }
  EXPECT_EQ(json_rows, 1);
  const size_t at = out.stdout_text.find("x sweep");
  ASSERT_NE(at, std::string::npos) << out.stdout_text;
  std::istringstream table(out.stdout_text.substr(at));
  std::string header, row;
  std::getline(table, header);  // The title.
  std::getline(table, header);  // workload x=0 x=1
  EXPECT_NE(header.find("x=0"), std::string::npos) << header;
  EXPECT_NE(header.find("x=1"), std::string::npos) << header;
  ASSERT_TRUE(std::getline(table, row));
  std::istringstream cells(row);
  std::string name, c0, c1;
  cells >> name >> c0 >> c1;
  EXPECT_EQ(name, "chain4-compute0us") << row;
  EXPECT_GT(std::stod(c0), 0) << row;  // kops/s at X = 0 (all KV) and X = 1 (all RPC).
  EXPECT_GT(std::stod(c1), 0) << row;

  auto bad = tessera::testing::RunCommand({"/bin/sh", "-c", "'" + tessera + "' bench kayak --x_sweep=0,1.5 2>&1"}, 30000);
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.stdout_text.find("--x_sweep: '1.5'"), std::string::npos) << bad.stdout_text;
}
