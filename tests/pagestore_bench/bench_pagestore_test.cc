// Smoke test of `tessera bench pagestore --quick`: 10 real memservers, every store, every
// scenario (normal, straggler, one server SIGKILLed); every row present, no store ever returns
// wrong bytes, the resilient stores lose nothing when one server dies, and the measured memory
// overheads are the layouts' (1.25 for RS(8,2), 2 and 3 for replication). No timing assertions:
// the speed targets are the bench's job.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/test_util.h"

namespace tessera {
namespace {

double Field(const std::string& line, const std::string& name) {
  std::string key = "\"" + name + "\":";
  size_t at = line.find(key);
  if (at == std::string::npos) return -1;
  return std::stod(line.substr(at + key.size()));
}

std::string StrField(const std::string& line, const std::string& name) {
  std::string key = "\"" + name + "\":\"";
  size_t at = line.find(key);
  if (at == std::string::npos) return "";
  size_t end = line.find('"', at + key.size());
  return line.substr(at + key.size(), end - at - key.size());
}

TEST(BenchPagestoreTest, QuickRunMeasuresEveryStoreInEveryScenario) {
  auto r = testing::RunTessera({"bench", "pagestore", "--quick", "--json"}, 240000);
  ASSERT_EQ(r.exit_code, 0) << r.stdout_text;
  std::istringstream in(r.stdout_text);
  std::string line;
  std::map<std::string, int> rows_per_scenario;
  std::map<std::string, double> overhead;
  std::map<std::string, std::string> layout;
  int targets = 0;
  while (std::getline(in, line)) {
    line.erase(std::remove(line.begin(), line.end(), ' '), line.end());
    if (line.find("\"suite\":\"pagestore\"") == std::string::npos) continue;
    std::string table = StrField(line, "table");
    std::string store = StrField(line, "store");
    if (table == "overhead") {
      overhead[store] = Field(line, "measured");
      layout[store] = StrField(line, "layout");
    } else if (table == "targets") {
      std::string result = StrField(line, "result");
      EXPECT_TRUE(result == "PASS" || result == "MISS") << line;
      targets++;
    } else if (table.empty()) {
      std::string scenario = StrField(line, "scenario");
      rows_per_scenario[scenario]++;
      EXPECT_EQ(Field(line, "wrong_bytes"), 0) << line;
      bool lossy = store == "single" || store == "single+disk";
      if (scenario != "failed" || !lossy) {
        EXPECT_EQ(Field(line, "errors"), 0) << line;
        EXPECT_GT(Field(line, "ops_per_s"), 0) << line;
        EXPECT_GT(Field(line, "p50_us"), 0) << line;
        EXPECT_GE(Field(line, "p99_us"), Field(line, "p50_us")) << line;
      }
    }
  }
  // --quick: {read, write} x QD {1, 32}; 9 stores normally, the 8 remote ones when disturbed.
  EXPECT_EQ(rows_per_scenario["normal"], 36) << r.stdout_text;
  EXPECT_EQ(rows_per_scenario["straggler"], 32) << r.stdout_text;
  EXPECT_EQ(rows_per_scenario["failed"], 32) << r.stdout_text;
  EXPECT_EQ(targets, 10) << r.stdout_text;
  EXPECT_NEAR(overhead["ec"], 1.25, 0.01);
  EXPECT_NEAR(overhead["ec-d0"], 1.25, 0.01);
  // Group layout: at least (k+r)/k is sent; partly filled stripes and compaction moves add.
  EXPECT_GE(overhead["ec-group"], 1.25 - 0.01);
  EXPECT_EQ(layout["ec-group"], "group");
  EXPECT_EQ(layout["ec"], "split");
  EXPECT_EQ(layout["rep2"], "copies");
  EXPECT_NEAR(overhead["rep2"], 2.0, 0.01);
  EXPECT_NEAR(overhead["rep3"], 3.0, 0.01);
  EXPECT_NEAR(overhead["single"], 1.0, 0.01);
  EXPECT_NEAR(overhead["single+disk"], 2.0, 0.01);
  EXPECT_NEAR(overhead["ssd"], 1.0, 0.01);
}

TEST(BenchPagestoreTest, LocalSsdAloneNeedsNoServers) {
  testing::TempDir dir;
  auto r = testing::RunTessera({"bench", "pagestore", "--quick", "--json", "--stores", "ssd",
                                "--ssd_dir", dir.path()},
                               60000);
  ASSERT_EQ(r.exit_code, 0) << r.stdout_text;
  EXPECT_NE(r.stdout_text.find("\"store\": \"ssd\""), std::string::npos) << r.stdout_text;
  // The bench's scratch directory is gone.
  EXPECT_TRUE(std::filesystem::is_empty(dir.path())) << dir.path();
}

TEST(BenchPagestoreTest, BadFlagsAreUsageErrors) {
  EXPECT_EQ(testing::RunTessera({"bench", "pagestore", "--qds", "0"}).exit_code, 2);
  EXPECT_EQ(testing::RunTessera({"bench", "pagestore", "--stores", "raid5"}).exit_code, 2);
  EXPECT_EQ(testing::RunTessera({"bench", "pagestore", "--stores", "ssd,ssd"}).exit_code, 2);
  EXPECT_EQ(testing::RunTessera({"bench", "pagestore", "--scenarios", "flood"}).exit_code, 2);
  EXPECT_EQ(testing::RunTessera({"bench", "pagestore", "--no_such_flag"}).exit_code, 2);
  EXPECT_EQ(testing::RunTessera({"bench", "pagestore", "--poll_us", "5000"}).exit_code, 2);
}

}  // namespace
}  // namespace tessera
