// `tessera demo cluster` as a user runs it (the README's main job): real memservers, r of them
// SIGKILLed, every page verified. Small sizes for CI.
#include <gtest/gtest.h>

#include <string>

#include "tests/support/test_util.h"

namespace tessera {
namespace {

using testing::RunTessera;

bool Has(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

TEST(DemoClusterTest, KillsRServersAndEveryPageReadsBack) {
  auto o = RunTessera({"demo", "cluster", "--k", "4", "--r", "2", "--spares", "1", "--pages",
                       "1500", "--json", "--log_level=error"},
                      120000);
  ASSERT_EQ(o.exit_code, 0) << o.stdout_text;
  EXPECT_TRUE(Has(o.stdout_text, "\"suite\": \"demo-cluster\"")) << o.stdout_text;
  EXPECT_TRUE(Has(o.stdout_text, "\"memservers\": 7")) << o.stdout_text;
  EXPECT_TRUE(Has(o.stdout_text, "\"killed\": 2")) << o.stdout_text;
  EXPECT_TRUE(Has(o.stdout_text, "\"server_failures\": 2")) << o.stdout_text;
  EXPECT_TRUE(Has(o.stdout_text, "\"regeneration_finished\": \"yes\"")) << o.stdout_text;
  EXPECT_TRUE(Has(o.stdout_text, "\"errors\": 0")) << o.stdout_text;
  EXPECT_TRUE(Has(o.stdout_text, "\"mismatches\": 0")) << o.stdout_text;
  EXPECT_FALSE(Has(o.stdout_text, "\"decodes\": 0,")) << "reads after the kill must decode";
}

TEST(DemoClusterTest, BadFlagsExitTwo) {
  EXPECT_EQ(RunTessera({"demo", "cluster", "--kill", "3", "--r", "2"}).exit_code, 2);
  EXPECT_EQ(RunTessera({"demo", "cluster", "--k", "3"}).exit_code, 2);
  EXPECT_EQ(RunTessera({"demo", "cluster", "--pages", "0"}).exit_code, 2);
  EXPECT_EQ(RunTessera({"demo", "cluster", "--bogus"}).exit_code, 2);
}

}  // namespace
}  // namespace tessera
