// Smoke test of `tessera bench failover --quick --json`: one SIGKILLed server per layout on
// 8 real memservers. Every row carries the keys other tools read, with the right types, and no
// read lost data; the targets come out judged. No timing assertions.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "tests/support/test_util.h"

namespace tessera {
namespace {

TEST(BenchFailoverTest, QuickKillRowsCarryTheContractKeysAndLoseNothing) {
  auto r = testing::RunTessera(
      {"bench", "failover", "--quick", "--json", "--scenarios", "kill", "--layouts", "split,group"},
      90000);
  ASSERT_EQ(r.exit_code, 0) << r.stdout_text;
  const auto rows = testing::JsonRows(r.stdout_text, "suite", "failover");
  ASSERT_EQ(rows.size(), 2u) << r.stdout_text;
  std::set<std::string> layouts;
  for (const auto& row : rows) {
    for (const char* key :
         {"suite", "scenario", "layout", "detect_ms", "false_failures", "read_p50_us",
          "read_p99_us", "healthy_p99_us", "regen_pages_per_s", "data_loss"}) {
      EXPECT_TRUE(row.contains(key)) << key << " missing in " << row;
    }
    EXPECT_EQ(row.value("scenario", ""), "kill") << row;
    layouts.insert(row.value("layout", ""));
    EXPECT_TRUE(row["detect_ms"].is_null() || row["detect_ms"].is_number()) << row;
    EXPECT_TRUE(row["regen_pages_per_s"].is_null() || row["regen_pages_per_s"].is_number()) << row;
    EXPECT_TRUE(row["false_failures"].is_number_integer()) << row;
    EXPECT_TRUE(row["read_p99_us"].is_number()) << row;
    EXPECT_TRUE(row["healthy_p99_us"].is_number()) << row;
    EXPECT_GT(row.value("healthy_reads", 0), 0) << row;
    EXPECT_GT(row.value("fault_reads", 0), 0) << row;
    EXPECT_EQ(row.value("data_loss", -1), 0) << row;
  }
  EXPECT_EQ(layouts, (std::set<std::string>{"split", "group"}));
  const auto targets = testing::JsonRows(r.stdout_text, "suite", "failover-targets");
  EXPECT_EQ(targets.size(), 7u) << r.stdout_text;
  for (const auto& t : targets) {
    const std::string result = t.value("result", "");
    EXPECT_TRUE(result == "MET" || result == "MISSED" || result == "NOT RUN") << t;
    EXPECT_FALSE(t.value("measured", "").empty()) << t;
  }
}

TEST(BenchFailoverTest, RejectsAnUnknownScenario) {
  auto r = testing::RunTessera({"bench", "failover", "--scenarios", "meteor"}, 30000);
  EXPECT_EQ(r.exit_code, 2);
}

}  // namespace
}  // namespace tessera
