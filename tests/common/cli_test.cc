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

TEST(CliTest, VersionComesFromTheProjectVersion) {
  auto o = RunTessera({"--version"});
  EXPECT_EQ(o.exit_code, 0);
  EXPECT_EQ(o.stdout_text.rfind(std::string("tessera ") + TESSERA_PROJECT_VERSION + " (commit ", 0),
            0u)
      << o.stdout_text;
  EXPECT_NE(o.stdout_text.find("\nfeatures: "), std::string::npos) << o.stdout_text;
  // Every subcommand prints the same version under its own name.
  auto sub = RunTessera({"status", "--version"});
  EXPECT_EQ(sub.exit_code, 0);
  EXPECT_EQ(sub.stdout_text.rfind(std::string("tessera status ") + TESSERA_PROJECT_VERSION, 0), 0u)
      << sub.stdout_text;
}

TEST(CliTest, GroupHelpListsItsSubcommands) {
  auto o = RunTessera({"bench", "--help"});
  EXPECT_EQ(o.exit_code, 0);
  EXPECT_NE(o.stdout_text.find("usage: tessera bench SUBCOMMAND"), std::string::npos);
  EXPECT_NE(o.stdout_text.find("bench coding"), std::string::npos) << o.stdout_text;
  EXPECT_EQ(o.stdout_text.find("memserver"), std::string::npos) << o.stdout_text;
  auto p = RunTessera({"paramsvc", "--help"});
  EXPECT_EQ(p.exit_code, 0);
  EXPECT_NE(p.stdout_text.find("paramsvc serve"), std::string::npos) << p.stdout_text;
  // The group alone is still a usage error, with the list on stderr.
  auto alone =
      testing::RunCommand({"/bin/sh", "-c", "'" + testing::BinDir() + "/tessera' sim 2>&1"});
  EXPECT_EQ(alone.exit_code, 2);
  EXPECT_NE(alone.stdout_text.find("sim placement"), std::string::npos) << alone.stdout_text;
}

TEST(CliTest, FlagsTakeKebabAndSnakeCase) {
  auto kebab =
      RunTessera({"demo", "--json", "--pages=50", "--corrupt-share", "0.2", "--beyond-share=0"});
  EXPECT_EQ(kebab.exit_code, 0) << kebab.stdout_text;
  auto snake =
      RunTessera({"demo", "--json", "--pages=50", "--corrupt_share", "0.2", "--beyond_share=0"});
  EXPECT_EQ(snake.exit_code, 0) << snake.stdout_text;
  // The same flags took effect: the same damage, seeded alike.
  EXPECT_GT(testing::JsonInt(kebab.stdout_text, "corruptions_injected"), 0) << kebab.stdout_text;
  EXPECT_EQ(testing::JsonInt(kebab.stdout_text, "corruptions_injected"),
            testing::JsonInt(snake.stdout_text, "corruptions_injected"));
  EXPECT_EQ(RunTessera({"demo", "--no-such-flag"}).exit_code, 2);
  // --help shows the kebab-case spelling.
  auto help = RunTessera({"demo", "--help"});
  EXPECT_NE(help.stdout_text.find("  --corrupt-share ("), std::string::npos) << help.stdout_text;
}

}  // namespace
}  // namespace tessera
