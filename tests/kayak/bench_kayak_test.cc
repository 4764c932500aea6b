// `tessera bench kayak --quick --json`: real memservers and redis-server; checks the JSON
// contract of every row (keys and types) and that every mode and workload produced throughput.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

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
  std::set<std::string> modes, workloads;
  int rows = 0, empty_rows = 0;
  while (std::getline(lines, line)) {
    if (line.empty()) continue;
    auto j = nlohmann::json::parse(line, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << line;
    ++rows;
    EXPECT_EQ(j["suite"], "kayak");
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
  EXPECT_LE(empty_rows, rows / 10) << "too many points without a single completed request";
  EXPECT_FALSE(tessera::testing::ReadFile(dir.path() + "/bimodal.png").empty()) << "no plot";
}

}  // namespace
