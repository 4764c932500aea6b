// `tessera sim placement` as a user runs it: table, JSON lines, CSV, the PNG plot, --help and
// usage errors. Small configurations, so each run takes well under a second.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/test_util.h"

namespace tessera {
namespace {

using testing::RunCommand;
using testing::RunTessera;

const std::vector<std::string> kSmall = {"sim",        "placement", "--machines=120",
                                         "--slabs_per_machine=8",   "--k=4",
                                         "--r=2",      "--l=2",     "--trials=300",
                                         "--failure_fraction=0.05"};

std::vector<std::string> With(std::vector<std::string> extra) {
  std::vector<std::string> args = kSmall;
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

TEST(SimPlacementCliTest, TableListsEveryPolicyWithItsFigures) {
  auto o = RunTessera(With({}));
  ASSERT_EQ(o.exit_code, 0) << o.stdout_text;
  for (const char* s : {"codingsets(4,2,2)", "random(4,2)", "power2(4,2)", "random-rep2",
                        "random-rep3", "copysets3(sw=4)", "loss_prob", "loss_95ci",
                        "analytic_loss", "max/mean", "max/min", "moved_leave", "moved_join",
                        "6 machines of 120 fail together"}) {
    EXPECT_NE(o.stdout_text.find(s), std::string::npos) << s << "\n" << o.stdout_text;
  }
}

TEST(SimPlacementCliTest, JsonLinesOnePerPolicy) {
  auto o = RunTessera(With({"--json", "--policies=codingsets,random"}));
  ASSERT_EQ(o.exit_code, 0) << o.stdout_text;
  auto rows = testing::JsonLines(o.stdout_text);
  ASSERT_EQ(rows.size(), 2u) << o.stdout_text;
  for (const auto& j : rows) {
    for (const char* key : {"policy", "loss_prob", "loss_ci_lo", "loss_ci_hi", "analytic_loss",
                            "lost_frac", "max/mean", "moved_leave"}) {
      EXPECT_TRUE(j.contains(key)) << key << " in " << j;
    }
  }
  EXPECT_EQ(rows[0].value("policy", ""), "codingsets(4,2,2)");
  EXPECT_EQ(rows[1].value("policy", ""), "random(4,2)");
}

TEST(SimPlacementCliTest, CsvHasAHeaderAndOneRowPerPolicy) {
  auto o = RunTessera(With({"--csv", "--policies=codingsets,copysets:2"}));
  ASSERT_EQ(o.exit_code, 0) << o.stdout_text;
  auto lines = Lines(o.stdout_text);
  ASSERT_EQ(lines.size(), 3u) << o.stdout_text;
  EXPECT_EQ(lines[0].rfind("policy,overhead,failed,loss_prob,loss_ci_lo,loss_ci_hi", 0), 0u)
      << lines[0];
  // Names holding commas are quoted (RFC 4180).
  EXPECT_EQ(lines[1].rfind("\"codingsets(4,2,2)\",1.5,6,", 0), 0u) << lines[1];
  EXPECT_EQ(lines[2].rfind("copysets2(sw=4),2,6,", 0), 0u) << lines[2];
}

TEST(SimPlacementCliTest, PlotWritesAPng) {
  if (RunCommand({"/bin/sh", "-c", "command -v gnuplot"}).exit_code != 0) {
    GTEST_SKIP() << "gnuplot is not installed (Debian package gnuplot-nox); PNG not checked";
  }
  testing::TempDir dir;
  std::string png = dir.path() + "/loss.png";
  auto o = RunTessera(With({"--plot=" + png, "--plot_fractions=0.02,0.05,0.1",
                            "--plot_trials=200", "--policies=codingsets,random"}));
  ASSERT_EQ(o.exit_code, 0) << o.stdout_text;
  EXPECT_NE(o.stdout_text.find("loss probability versus f"), std::string::npos);
  std::ifstream in(png, std::ios::binary);
  ASSERT_TRUE(in.good()) << "no " << png;
  char magic[8] = {};
  in.read(magic, 8);
  EXPECT_EQ(std::string(magic + 1, 3), "PNG");
}

TEST(SimPlacementCliTest, RackFailuresAndRackNote) {
  auto o = RunTessera(With({"--racks=4", "--failure_mode=racks", "--policies=codingsets"}));
  ASSERT_EQ(o.exit_code, 0) << o.stdout_text;
  EXPECT_NE(o.stdout_text.find("1 racks of 4 fail together"), std::string::npos) << o.stdout_text;
  EXPECT_NE(o.stdout_text.find("note: codingsets(4,2,2): rack constraint not met: only 4 racks"),
            std::string::npos)
      << o.stdout_text;
}

TEST(SimPlacementCliTest, HelpShowsFlags) {
  auto o = RunTessera({"sim", "placement", "--help"});
  EXPECT_EQ(o.exit_code, 0);
  for (const char* flag : {"--machines", "--slabs-per-machine", "--failure-fraction",
                           "--policies", "--plot", "--json", "--csv", "--trials", "--seed"}) {
    EXPECT_NE(o.stdout_text.find(flag), std::string::npos) << flag;
  }
}

TEST(SimPlacementCliTest, BadFlagsAreUsageErrors) {
  EXPECT_EQ(RunTessera({"sim", "placement", "--nonsense=1"}).exit_code, 2);
  EXPECT_EQ(RunTessera(With({"--k=0"})).exit_code, 2);
  EXPECT_EQ(RunTessera(With({"--failure_fraction=1.5"})).exit_code, 2);
  EXPECT_EQ(RunTessera(With({"--policies=hydra"})).exit_code, 2);
  EXPECT_EQ(RunTessera(With({"--failure_mode=racks"})).exit_code, 2);  // no --racks
  EXPECT_EQ(RunTessera(With({"--json", "--csv"})).exit_code, 2);
  EXPECT_EQ(RunTessera(With({"--mode=guess"})).exit_code, 2);
}

}  // namespace
}  // namespace tessera
