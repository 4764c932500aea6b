// `tessera run --layout split|group` (and `tessera nbd --layout`): the program's heap is paged
// through the chosen erasure-coded layout on real memservers and its output is the unpaged one.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/support/test_util.h"

namespace tessera {
namespace {

using testing::BinDir;
using testing::ReadFile;
using testing::RunCommand;
using testing::TempDir;

const std::string kScript = std::string(TESSERA_RUN_TEST_DIR) + "/workload.py";

TEST(RunLayout, EachLayoutPagesTheProgramAndKeepsItsOutput) {
  auto local = RunCommand({"/usr/bin/python3", kScript, "40000", "8", "3"}, 120000);
  ASSERT_EQ(local.exit_code, 0);
  for (const std::string layout : {"split", "group"}) {
    TempDir tmp;
    const std::string json = tmp.path() + "/stats.json";
    auto out = RunCommand({BinDir() + "/tessera", "run", "--layout", layout, "--local-memory",
                           "50%", "--stats-json", json, "--", "/usr/bin/python3", kScript,
                           "40000", "8", "3"},
                          240000);
    ASSERT_EQ(out.exit_code, 0) << layout;
    EXPECT_EQ(out.stdout_text, local.stdout_text) << layout;
    auto j = nlohmann::json::parse(ReadFile(json), nullptr, /*allow_exceptions=*/false);
    ASSERT_TRUE(j.is_object()) << ReadFile(json);
    EXPECT_EQ(j.value("layout", ""), layout) << j.dump();
    EXPECT_GT(j.value("remote_writes", 0), 0) << layout << ": nothing paged out: " << j.dump();
    EXPECT_GT(j.value("remote_reads", 0), 0) << layout << ": nothing paged in: " << j.dump();
    EXPECT_EQ(j.value("fill_errors", -1), 0) << j.dump();
    EXPECT_EQ(j.value("store_data_loss", -1), 0) << j.dump();
  }
}

// The group layout's fault threads read remote pages on their own threads by default (run to
// completion); --nodirect_reads sends every read through the store's I/O thread. Same output.
TEST(RunLayout, DirectReadsAreTheDefaultAndCanBeTurnedOff) {
  auto local = RunCommand({"/usr/bin/python3", kScript, "40000", "8", "3"}, 120000);
  ASSERT_EQ(local.exit_code, 0);
  for (bool direct : {true, false}) {
    TempDir tmp;
    const std::string json = tmp.path() + "/stats.json";
    std::vector<std::string> argv = {BinDir() + "/tessera", "run", "--layout", "group",
                                     "--local-memory", "50%", "--stats-json", json};
    if (!direct) argv.push_back("--nodirect_reads");
    for (const char* a : {"--", "/usr/bin/python3"}) argv.push_back(a);
    for (const std::string& a : {kScript, std::string("40000"), std::string("8"),
                                 std::string("3")}) {
      argv.push_back(a);
    }
    auto out = RunCommand(argv, 240000);
    ASSERT_EQ(out.exit_code, 0) << direct;
    EXPECT_EQ(out.stdout_text, local.stdout_text) << direct;
    auto j = nlohmann::json::parse(ReadFile(json), nullptr, /*allow_exceptions=*/false);
    ASSERT_TRUE(j.is_object()) << ReadFile(json);
    ASSERT_GT(j.value("remote_reads", 0), 0) << "nothing paged in: " << j.dump();
    if (direct) {
      EXPECT_GT(j.value("store_direct_reads", 0), 0) << j.dump();
    } else {
      EXPECT_EQ(j.value("store_direct_reads", -1), 0) << j.dump();
    }
    EXPECT_EQ(j.value("store_data_loss", -1), 0) << j.dump();
  }
}

// --fault_spin_us: fault threads poll the userfaultfd after a fault; faults found that way are
// counted (spin_hits), the output is the unpaged one, and an out-of-range value is a usage error.
// --direct_spin_us 0 (given with --fault_spin_us 0): direct reads never poll for their reply.
TEST(RunLayout, FaultSpinFindsFaultsWithoutAWakeUpAndKeepsTheOutput) {
  auto local = RunCommand({"/usr/bin/python3", kScript, "40000", "8", "3"}, 120000);
  ASSERT_EQ(local.exit_code, 0);
  for (int spin : {0, 500}) {
    TempDir tmp;
    const std::string json = tmp.path() + "/stats.json";
    auto out = RunCommand({BinDir() + "/tessera", "run", "--local-memory", "50%",
                           "--fault_spin_us", std::to_string(spin), "--direct_spin_us",
                           std::to_string(spin), "--stats-json", json, "--",
                           "/usr/bin/python3", kScript, "40000", "8", "3"},
                          240000);
    ASSERT_EQ(out.exit_code, 0) << spin;
    EXPECT_EQ(out.stdout_text, local.stdout_text) << spin;
    auto j = nlohmann::json::parse(ReadFile(json), nullptr, /*allow_exceptions=*/false);
    ASSERT_TRUE(j.is_object()) << ReadFile(json);
    ASSERT_GT(j.value("faults", 0), 0) << j.dump();
    ASSERT_GT(j.value("store_direct_reads", 0), 0) << j.dump();
    if (spin == 0) {
      EXPECT_EQ(j.value("spin_hits", -1), 0) << j.dump();
      EXPECT_EQ(j.value("store_direct_spin_hits", -1), 0) << j.dump();
      EXPECT_GT(j.value("store_direct_sleeps", 0), 0) << j.dump();
    } else {
      EXPECT_GT(j.value("spin_hits", 0), 0) << "no fault found while polling: " << j.dump();
    }
    EXPECT_EQ(j.value("fill_errors", -1), 0) << j.dump();
  }
  for (const char* flag : {"--fault_spin_us", "--direct_spin_us"}) {
    EXPECT_EQ(RunCommand({BinDir() + "/tessera", "run", flag, "1001", "--", "/bin/true"}).exit_code,
              2)
        << flag;
  }
}

TEST(RunLayout, UnknownLayoutIsAUsageError) {
  EXPECT_EQ(RunCommand({BinDir() + "/tessera", "run", "--layout", "striped", "--", "/bin/true"})
                .exit_code,
            2);
  EXPECT_EQ(RunCommand({BinDir() + "/tessera", "nbd", "--size", "64M", "--layout", "striped"})
                .exit_code,
            2);
}

}  // namespace
}  // namespace tessera
