// `tessera demo cluster` as a user runs it (the README's main job): real memservers, r of them
// SIGKILLed, every page verified. Small sizes for CI.
#include <gtest/gtest.h>

#include <string>

#include "tests/support/test_util.h"

namespace tessera {
namespace {

using testing::RunTessera;

TEST(DemoClusterTest, KillsRServersAndEveryPageReadsBack) {
  auto o = RunTessera({"demo", "cluster", "--k", "4", "--r", "2", "--spares", "1", "--pages",
                       "1500", "--json", "--log_level=error"},
                      120000);
  ASSERT_EQ(o.exit_code, 0) << o.stdout_text;
  auto rows = testing::JsonRows(o.stdout_text, "suite", "demo-cluster");
  ASSERT_EQ(rows.size(), 1u) << o.stdout_text;
  const auto& j = rows[0];
  EXPECT_EQ(j.value("memservers", -1), 7) << j;
  EXPECT_EQ(j.value("killed", -1), 2) << j;
  EXPECT_EQ(j.value("server_failures", -1), 2) << j;
  EXPECT_EQ(j.value("regeneration_finished", ""), "yes") << j;
  EXPECT_EQ(j.value("errors", -1), 0) << j;
  EXPECT_EQ(j.value("mismatches", -1), 0) << j;
  EXPECT_GT(j.value("decodes", 0), 0) << "reads after the kill must decode: " << j;
}

TEST(DemoClusterTest, BadFlagsExitTwo) {
  EXPECT_EQ(RunTessera({"demo", "cluster", "--kill", "3", "--r", "2"}).exit_code, 2);
  EXPECT_EQ(RunTessera({"demo", "cluster", "--k", "3"}).exit_code, 2);
  EXPECT_EQ(RunTessera({"demo", "cluster", "--pages", "0"}).exit_code, 2);
  EXPECT_EQ(RunTessera({"demo", "cluster", "--bogus"}).exit_code, 2);
}

}  // namespace
}  // namespace tessera
