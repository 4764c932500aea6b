// The `tessera` dispatcher as a user meets it: help, unknown subcommands, exit codes.
#include <gtest/gtest.h>

#include "tests/support/test_util.h"

namespace tessera {
namespace {

using testing::RunTessera;

TEST(CliTest, HelpListsSubcommands) {
  auto o = RunTessera({"help"});
  EXPECT_EQ(o.exit_code, 0);
  EXPECT_NE(o.stdout_text.find("usage: tessera SUBCOMMAND"), std::string::npos) << o.stdout_text;
}

TEST(CliTest, NoArgumentsIsAUsageError) { EXPECT_EQ(RunTessera({}).exit_code, 2); }

TEST(CliTest, UnknownSubcommandIsAUsageError) {
  EXPECT_EQ(RunTessera({"frobnicate"}).exit_code, 2);
  EXPECT_EQ(RunTessera({"bench", "nonsense"}).exit_code, 2);
}

TEST(CliTest, Version) {
  auto o = RunTessera({"--version"});
  EXPECT_EQ(o.exit_code, 0);
  EXPECT_EQ(o.stdout_text, "tessera 0.1.0\n");
}

}  // namespace
}  // namespace tessera
