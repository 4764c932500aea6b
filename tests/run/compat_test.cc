// `tessera run` on the kinds of programs of the compatibility list (docs/guides/what-is-paged.md):
// each runs paged at 50% local memory on an embedded cluster and must print exactly what its
// unpaged run prints, with pages really written to the memservers and read back.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "tests/support/test_util.h"

namespace tessera {
namespace {

using testing::BinDir;
using testing::CommandOutcome;
using testing::JsonInt;
using testing::ReadFile;
using testing::RunCommand;
using testing::TempDir;

const std::string kDir = TESSERA_RUN_TEST_DIR;

// `tessera run --local-memory LOCAL --stats-json JSON -- argv...` on a small embedded cluster.
CommandOutcome RunPaged(const std::vector<std::string>& argv, const std::string& json,
                        const std::string& local = "50%", const std::string& region = "4G") {
  std::vector<std::string> a = {BinDir() + "/tessera", "run", "--local-memory", local,
                                "--region", region, "--k", "2", "--r", "1", "--spares", "0",
                                "--stats-json", json, "--"};
  a.insert(a.end(), argv.begin(), argv.end());
  return RunCommand(a, 240000, /*keep_stderr=*/false);
}

std::string LineWith(const std::string& text, const std::string& prefix) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(prefix, 0) == 0) return line;
  }
  return "";
}

// Runs argv unpaged and paged at 50% and 100%: the same `prefix` line each time, and at 50% the
// pages went to the memservers and came back. Returns the 50% run's stats JSON.
std::string ExpectSameOutputPaged(const std::vector<std::string>& argv, const std::string& prefix) {
  auto local = RunCommand(argv, 240000);
  EXPECT_EQ(local.exit_code, 0) << local.stdout_text;
  const std::string want = LineWith(local.stdout_text, prefix);
  EXPECT_FALSE(want.empty()) << "no '" << prefix << "' line in: " << local.stdout_text;
  TempDir tmp;
  std::string half_json;
  for (const std::string pct : {"100%", "50%"}) {
    const std::string json = tmp.path() + "/stats.json";
    auto out = RunPaged(argv, json, pct);
    EXPECT_EQ(out.exit_code, 0) << pct << ": " << out.stdout_text;
    EXPECT_EQ(LineWith(out.stdout_text, prefix), want) << pct;
    const std::string j = ReadFile(json);
    EXPECT_EQ(JsonInt(j, "fill_errors"), 0) << j;
    EXPECT_EQ(JsonInt(j, "store_data_loss"), 0) << j;
    if (pct == "50%") {
      EXPECT_GT(JsonInt(j, "remote_writes"), 0) << "nothing was paged out at 50%: " << j;
      EXPECT_GT(JsonInt(j, "remote_reads"), 0) << "nothing was paged back in at 50%: " << j;
      half_json = j;
    }
  }
  return half_json;
}

// A program that exports a function named like one of ISA-L's (node exports OpenSSL's gf_mul)
// used to get the pager's erasure coder calling into it at the first eviction (SIGSEGV). The
// shim binds its own dependencies' functions at load, so the program's gf_mul is never called.
TEST(Compat, ProgramExportingAnIsalFunctionNameRunsPaged) {
  const std::string j =
      ExpectSameOutputPaged({BinDir() + "/tessera-symbol-clash-probe", "40"}, "symbol-clash-probe:");
  EXPECT_GE(JsonInt(j, "rebound_symbols"), 1) << j;
}

TEST(Compat, NodeAtHalfLocalMemoryMatchesUnpaged) {
  ExpectSameOutputPaged({"/usr/bin/node", kDir + "/map_workload.js", "150000"}, "map-workload:");
}

}  // namespace
}  // namespace tessera
