// `tessera bench programs --quick` end to end: the python3 workload and GNU sort run locally and
// under `tessera run` at 50% local memory on real memservers; every row has the documented keys,
// the paged outputs equal the local ones, and bad flags are usage errors.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>

#include "tests/support/test_util.h"

namespace tessera {
namespace {

using testing::BinDir;
using testing::RunCommand;

TEST(BenchPrograms, QuickRunsEveryProgramAndOutputsMatch) {
  auto out = RunCommand({BinDir() + "/tessera", "bench", "programs", "--quick", "--json",
                         "--noswap"},
                        600000, /*keep_stderr=*/false);
  ASSERT_EQ(out.exit_code, 0) << out.stdout_text;
  std::istringstream in(out.stdout_text);
  std::set<std::string> programs, tiers;
  int targets = 0;
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    ASSERT_TRUE(j.is_object()) << "not JSON: " << line;
    if (j.value("suite", "") == "programs-targets") {
      ++targets;
      continue;
    }
    ASSERT_EQ(j.value("suite", ""), "programs") << line;
    for (const char* key : {"program", "local_memory", "layout", "local_s", "tessera_s", "swap_s",
                            "ratio", "identical"}) {
      ASSERT_TRUE(j.contains(key)) << key << " missing: " << line;
    }
    programs.insert(j["program"].get<std::string>());
    // Every `tessera run` row says what the runs did; with the tier on, its hits.
    const std::string tier = j.value("compressed_tier", "");
    tiers.insert(tier);
    ASSERT_TRUE(j["faults"].is_number() && j["store_reads"].is_number() &&
                j["store_writes"].is_number() && j["fault_p99_us"].is_number())
        << line;
    EXPECT_GT(j["faults"].get<double>(), 0) << line;
    if (tier == "auto") {
      ASSERT_TRUE(j["tier_hits"].is_number()) << line;
      EXPECT_GT(j["tier_hits"].get<double>(), 0) << "the tier served no fault: " << line;
    } else {
      EXPECT_TRUE(j["tier_hits"].is_null()) << "tier off, yet tier hits: " << line;
    }
    EXPECT_EQ(j["local_memory"], "50%") << line;
    EXPECT_EQ(j["layout"], "group") << "--quick runs the store's default layout: " << line;
    ASSERT_TRUE(j["identical"].is_boolean()) << line;
    EXPECT_TRUE(j["identical"].get<bool>()) << "paged output differs from the local one: " << line;
    EXPECT_TRUE(j["swap_s"].is_null()) << "--noswap, yet a swap time: " << line;
    ASSERT_TRUE(j["local_s"].is_number() && j["tessera_s"].is_number()) << line;
    const double local_s = j["local_s"], tessera_s = j["tessera_s"], ratio = j["ratio"];
    EXPECT_GT(local_s, 0) << line;
    EXPECT_GT(tessera_s, 0) << line;
    EXPECT_NEAR(ratio, tessera_s / local_s, 1e-6 * ratio) << line;
  }
  EXPECT_EQ(programs, (std::set<std::string>{"workload", "sort"})) << out.stdout_text;
  EXPECT_EQ(tiers, (std::set<std::string>{"off", "auto"})) << out.stdout_text;
  EXPECT_GE(targets, 3) << out.stdout_text;
}

// The other programs of the bench (an in-memory database, a script's hash table, a managed
// runtime), at small sizes: paged at 50% with output identical to the local run's.
TEST(BenchPrograms, DatabaseHashTableAndManagedRuntimeRunPagedWithIdenticalOutput) {
  auto out = RunCommand({BinDir() + "/tessera", "bench", "programs", "--json", "--noswap",
                         "--runs", "1", "--programs", "sqlite,hashtable,node", "--local_memory",
                         "50%", "--layouts", "group", "--compressed_tier", "off", "--sqlite_rows",
                         "20000", "--hashtable_keys", "20000", "--node_entries", "20000"},
                        600000, /*keep_stderr=*/false);
  ASSERT_EQ(out.exit_code, 0) << out.stdout_text;
  std::istringstream in(out.stdout_text);
  std::set<std::string> programs;
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    ASSERT_TRUE(j.is_object()) << "not JSON: " << line;
    if (j.value("suite", "") != "programs") continue;
    programs.insert(j["program"].get<std::string>());
    EXPECT_EQ(j["identical"], true) << "paged output differs from the local one: " << line;
    ASSERT_TRUE(j["faults"].is_number() && j["local_peak_rss"].is_number()) << line;
    EXPECT_GT(j["faults"].get<double>(), 0) << "nothing was paged: " << line;
    EXPECT_GT(j["local_peak_rss"].get<double>(), 4e6) << line;
  }
  EXPECT_EQ(programs, (std::set<std::string>{"sqlite", "hashtable", "node"})) << out.stdout_text;
}

TEST(BenchPrograms, BadFlagsAreUsageErrors) {
  for (auto flags : std::vector<std::vector<std::string>>{{"--programs", "nosuch"},
                                                          {"--local_memory", "150%"},
                                                          {"--layouts", "striped"},
                                                          {"--runs", "0"},
                                                          {"--compressed_tier", "fast"},
                                                          {"--compressed_tier", ""},
                                                          {"--sqlite_rows", "10"},
                                                          {"--compress_mb", "0"}}) {
    std::vector<std::string> argv = {BinDir() + "/tessera", "bench", "programs", "--noswap"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    EXPECT_EQ(RunCommand(argv).exit_code, 2) << flags[0] << " " << flags[1];
  }
}

}  // namespace
}  // namespace tessera
