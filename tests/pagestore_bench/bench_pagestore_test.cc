// Smoke test of `tessera bench pagestore --quick`: 10 real memservers, every store, every
// scenario (normal, straggler, one server SIGKILLed); every row present, no store ever returns
// wrong bytes, the resilient stores lose nothing when one server dies, and the measured memory
// overheads are the layouts' (1.25 for RS(8,2), 2 and 3 for replication). No timing assertions:
// the speed targets are the bench's job.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>

#include "tests/support/test_util.h"

namespace tessera {
namespace {

TEST(BenchPagestoreTest, QuickRunMeasuresEveryStoreInEveryScenario) {
  auto r = testing::RunTessera({"bench", "pagestore", "--quick", "--json"}, 240000);
  ASSERT_EQ(r.exit_code, 0) << r.stdout_text;
  std::map<std::string, int> rows_per_scenario;
  std::map<std::string, double> overhead;
  std::map<std::string, std::string> layout;
  int targets = 0;
  for (const auto& row : testing::JsonRows(r.stdout_text, "suite", "pagestore")) {
    const std::string table = row.value("table", "");
    const std::string store = row.value("store", "");
    if (table == "overhead") {
      overhead[store] = row.value("measured", -1.0);
      layout[store] = row.value("layout", "");
    } else if (table == "targets") {
      const std::string result = row.value("result", "");
      EXPECT_TRUE(result == "PASS" || result == "MISS") << row;
      targets++;
    } else if (table.empty()) {
      const std::string scenario = row.value("scenario", "");
      rows_per_scenario[scenario]++;
      EXPECT_EQ(row.value("wrong_bytes", -1.0), 0) << row;
      bool lossy = store == "single" || store == "single+disk";
      if (scenario != "failed" || !lossy) {
        EXPECT_EQ(row.value("errors", -1.0), 0) << row;
        EXPECT_GT(row.value("ops_per_s", -1.0), 0) << row;
        EXPECT_GT(row.value("p50_us", -1.0), 0) << row;
        EXPECT_GE(row.value("p99_us", -1.0), row.value("p50_us", -1.0)) << row;
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
  auto rows = testing::JsonRows(r.stdout_text, "store", "ssd");
  EXPECT_FALSE(rows.empty()) << r.stdout_text;
  // The bench's scratch directory is gone.
  EXPECT_TRUE(std::filesystem::is_empty(dir.path())) << dir.path();
}

// The write-heavy scenario with the group layout's two compactions: what each costs, every
// page read back right afterwards.
TEST(BenchPagestoreTest, OverwriteScenarioComparesTheGroupCompactions) {
  auto r = testing::RunTessera({"bench", "pagestore", "--quick", "--json", "--stores",
                                "ec-group-restripe,ec-group-inplace,rep2", "--scenarios",
                                "overwrite"},
                               120000);
  ASSERT_EQ(r.exit_code, 0) << r.stdout_text;
  std::map<std::string, nlohmann::json> rows;
  for (const auto& row : testing::JsonRows(r.stdout_text, "table", "overwrite")) {
    rows[row.value("store", "")] = row;
  }
  ASSERT_EQ(rows.size(), 3u) << r.stdout_text;
  for (const auto& [store, row] : rows) {
    EXPECT_EQ(row.value("wrong_bytes", -1), 0) << row;
    EXPECT_EQ(row.value("errors", -1), 0) << row;
    EXPECT_GT(row.value("ops_per_s_qd32", -1.0), 0) << row;
    EXPECT_GE(row.value("writes", 0), 4 * 512) << row;
    EXPECT_GE(row.value("bytes_per_byte_written", 0.0), row.value("bound", 9.0) / 1.2 - 0.01)
        << "a store cannot send less than its redundancy: " << row;
  }
  const auto& restripe = rows["ec-group-restripe"];
  const auto& inplace = rows["ec-group-inplace"];
  EXPECT_GT(restripe.value("compaction_moves", 0), 0) << restripe;
  EXPECT_EQ(restripe.value("slots_reclaimed", -1), 0) << restripe;
  EXPECT_GT(inplace.value("slots_reclaimed", 0), 0) << inplace;
  EXPECT_EQ(rows["rep2"].value("layout", ""), "copies");
  EXPECT_NEAR(rows["rep2"].value("bytes_per_byte_written", 0.0), 2.0, 0.01);
}

TEST(BenchPagestoreTest, BadFlagsAreUsageErrors) {
  EXPECT_EQ(testing::RunTessera({"bench", "pagestore", "--qds", "0"}).exit_code, 2);
  EXPECT_EQ(testing::RunTessera({"bench", "pagestore", "--stores", "raid5"}).exit_code, 2);
  EXPECT_EQ(testing::RunTessera({"bench", "pagestore", "--stores", "ssd,ssd"}).exit_code, 2);
  EXPECT_EQ(testing::RunTessera({"bench", "pagestore", "--scenarios", "flood"}).exit_code, 2);
  EXPECT_EQ(testing::RunTessera({"bench", "pagestore", "--no_such_flag"}).exit_code, 2);
  EXPECT_EQ(testing::RunTessera({"bench", "pagestore", "--poll_us", "5000"}).exit_code, 2);
  EXPECT_EQ(testing::RunTessera({"bench", "pagestore", "--overwrite_passes", "0"}).exit_code, 2);
}

}  // namespace
}  // namespace tessera
