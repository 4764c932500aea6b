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

// The program's anonymous memory in its unpaged run (its "rss-anon-kb N" line), bytes.
long long LocalAnonBytes(const std::vector<std::string>& argv) {
  auto out = RunCommand(argv, 240000);
  const std::string line = LineWith(out.stdout_text, "rss-anon-kb ");
  EXPECT_FALSE(line.empty()) << out.stdout_text;
  return line.empty() ? -1 : std::stoll(line.substr(12)) * 1024;
}

// Managed runtimes reserve their heaps PROT_NONE (or MAP_NORESERVE) and commit them with
// mprotect or MAP_FIXED: all of that is paged. Half or more of the program's anonymous
// memory must be in the paged footprint (docs/guides/what-is-paged.md gives the measured
// shares and what makes up the rest: thread stacks, the JVM's class-data archive, the pager's
// own memory).
void ExpectManagedHeapPaged(const std::vector<std::string>& argv, const std::string& prefix) {
  const std::string j = ExpectSameOutputPaged(argv, prefix);
  const long long anon = LocalAnonBytes(argv);
  const long long footprint = JsonInt(j, "peak_footprint_pages") * 4096;
  EXPECT_GE(footprint * 2, anon) << "paged footprint " << footprint << " B of " << anon
                                 << " B of anonymous memory: " << j;
  EXPECT_EQ(JsonInt(j, "registration_errors"), 0) << j;
}

TEST(Compat, NodeAtHalfLocalMemoryMatchesUnpaged) {
  ExpectManagedHeapPaged({"/usr/bin/node", kDir + "/map_workload.js", "150000"}, "map-workload:");
}

// A JVM with a 128 MB heap holding about 55 MB (G1: the heap is reserved PROT_NONE and
// committed region by region with MAP_FIXED).
TEST(Compat, JvmAtHalfLocalMemoryMatchesUnpaged) {
  ExpectManagedHeapPaged({"/usr/bin/java", "-Xmx128m", "-XX:TieredStopAtLevel=1",
                          kDir + "/HeapWorkload.java", "100000"},
                         "heap-workload:");
}

// Ruby (Debian's ruby package): a mark-and-sweep GC walking its whole object heap, half of
// it remote.
TEST(Compat, RubyAtHalfLocalMemoryMatchesUnpaged) {
  ExpectManagedHeapPaged({"/usr/bin/ruby", kDir + "/hash_workload.rb", "60000"}, "hash-workload:");
}

// A pipeline under a shell: every process the shell starts is paged (one budget each).
TEST(Compat, ShellPipelineIsPagedEndToEnd) {
  const std::string script =
      "/usr/bin/python3 -c 'import random; r = random.Random(7); "
      "print(\"\\n\".join(\"%016x %d\" % (r.getrandbits(64), i) for i in range(150000)))' "
      "| sort | sha256sum | sed 's/^/pipeline: /'";
  const std::string j = ExpectSameOutputPaged({"/bin/sh", "-c", script}, "pipeline:");
  // python3, sort, sha256sum and sed (and sh) each ran with a pager of their own.
  EXPECT_GE(JsonInt(j, "processes"), 4) << j;
}

// A statically linked program: LD_PRELOAD cannot reach it. tessera run says so and runs it
// unpaged, with its output intact.
TEST(Compat, StaticallyLinkedProgramRunsUnpagedWithAWarning) {
  const std::vector<std::string> argv = {BinDir() + "/tessera-static-probe", "24"};
  auto local = RunCommand(argv, 60000);
  ASSERT_EQ(local.exit_code, 0);
  const std::string want = LineWith(local.stdout_text, "static-probe:");
  ASSERT_FALSE(want.empty()) << local.stdout_text;
  TempDir tmp;
  for (const std::string pct : {"100%", "50%"}) {
    const std::string json = tmp.path() + "/stats.json";
    std::vector<std::string> a = {BinDir() + "/tessera", "run", "--local-memory", pct, "--k", "2",
                                  "--r", "1", "--spares", "0", "--stats-json", json, "--"};
    a.insert(a.end(), argv.begin(), argv.end());
    // Through a shell that merges tessera run's stderr (the warning, the summary) into stdout.
    a.insert(a.begin(), {"/bin/sh", "-c", "exec \"$0\" \"$@\" 2>&1"});
    auto out = RunCommand(a, 120000);
    EXPECT_EQ(out.exit_code, 0) << out.stdout_text;
    EXPECT_EQ(LineWith(out.stdout_text, "static-probe:"), want);
    EXPECT_NE(out.stdout_text.find("is statically linked"), std::string::npos) << out.stdout_text;
    EXPECT_NE(out.stdout_text.find("not paged: the whole program"), std::string::npos)
        << out.stdout_text;
    const std::string j = ReadFile(json);
    EXPECT_EQ(JsonInt(j, "remote_writes"), -1) << "a static program has no pager: " << j;
    EXPECT_NE(j.find("\"statically_linked\":true"), std::string::npos) << j;
  }
}

}  // namespace
}  // namespace tessera
