// `tessera bench pager --quick`: a smoke test of the whole bench, both layouts in one run.
#include <dirent.h>
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "tests/support/test_util.h"

namespace tessera {
namespace {

bool LeftoverSwapfile() {
  DIR* d = opendir("/var/tmp");
  if (!d) return false;
  bool found = false;
  while (dirent* e = readdir(d)) {
    if (std::string(e->d_name).rfind("tessera-bench-swap-", 0) == 0) found = true;
  }
  closedir(d);
  return found;
}

// Both erasure-coded layouts in one run: every section reports rows for each, the layouts sit
// side by side against Linux swap, and the bytes are right everywhere.
TEST(PagerBenchTest, QuickRunsEverySectionForBothLayouts) {
  auto out = testing::RunTessera({"bench", "pager", "--quick", "--json"}, 150000);
  ASSERT_EQ(out.exit_code, 0) << out.stdout_text;
  const std::string& s = out.stdout_text;
  for (const char* suite : {"pager-latency", "pager-workload", "pager-policy", "pager-failure",
                            "pager-vs-swap", "pager-targets"}) {
    std::set<std::string> layouts;
    for (const auto& row : testing::JsonRows(s, "suite", suite)) {
      ASSERT_TRUE(row.contains("layout")) << row.dump();
      layouts.insert(row["layout"].get<std::string>());
    }
    EXPECT_EQ(layouts, (std::set<std::string>{"split", "group"})) << suite << "\n" << s;
  }
  bool raw_read = false;
  for (const auto& row : testing::JsonRows(s, "suite", "pager-latency")) {
    raw_read = raw_read || row["path"] == "raw PageStore::ReadPage";
  }
  EXPECT_TRUE(raw_read) << s;
  // The group layout against swap and against split: the same pattern and local memory.
  int group_vs_split = 0;
  for (const auto& row : testing::JsonRows(s, "suite", "pager-vs-swap")) {
    EXPECT_TRUE(row.contains("swap_ms")) << row.dump();  // null when swap could not run.
    EXPECT_GT(row["tessera_ms"].get<double>(), 0) << row.dump();
    if (row["layout"] == "group") {
      ASSERT_TRUE(row.contains("ratio_to_split")) << row.dump();
      group_vs_split++;
    }
  }
  EXPECT_EQ(group_vs_split, 3) << "one row per pattern at 50% local memory\n" << s;
  // Whatever the timings, the bytes are right everywhere.
  int checksum_verdicts = 0;
  for (const auto& row : testing::JsonRows(s, "suite", "pager-targets")) {
    if (row["target"] == "checksums identical in every mode") {
      EXPECT_EQ(row["verdict"], "PASS") << row.dump();
      checksum_verdicts++;
    }
  }
  EXPECT_EQ(checksum_verdicts, 2);
  EXPECT_EQ(s.find("MISMATCH"), std::string::npos) << s;
  EXPECT_FALSE(LeftoverSwapfile());
}

TEST(PagerBenchTest, OneLayoutAndBadLayouts) {
  auto one = testing::RunTessera(
      {"bench", "pager", "--quick", "--json", "--layouts", "group", "--sections", "latency"},
      60000);
  ASSERT_EQ(one.exit_code, 0) << one.stdout_text;
  auto rows = testing::JsonRows(one.stdout_text, "suite", "pager-latency");
  ASSERT_FALSE(rows.empty()) << one.stdout_text;
  for (const auto& row : rows) EXPECT_EQ(row["layout"], "group") << row.dump();
  for (auto bad : std::vector<std::vector<std::string>>{{"--layouts", "split,stripes"},
                                                        {"--layouts", "group,group"},
                                                        {"--layouts", ""},
                                                        {"--layout", "split,group"}}) {
    std::vector<std::string> args = {"bench", "pager", "--quick"};
    args.insert(args.end(), bad.begin(), bad.end());
    auto r = testing::RunTessera(args, 30000);
    EXPECT_NE(r.exit_code, 0) << bad[0] << " " << bad[1];
    EXPECT_TRUE(testing::JsonLines(r.stdout_text).empty());
  }
}

}  // namespace
}  // namespace tessera
