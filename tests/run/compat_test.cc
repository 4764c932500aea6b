// `tessera run` on the kinds of programs of the compatibility list (docs/guides/what-is-paged.md):
// each runs paged at 50% local memory on an embedded cluster and must print exactly what its
// unpaged run prints, with pages really written to the memservers and read back.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/subprocess.h"
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
  std::vector<std::string> a = {BinDir() + "/tessera",
                                "run",
                                "--local-memory",
                                local,
                                "--region",
                                region,
                                "--k",
                                "2",
                                "--r",
                                "1",
                                "--spares",
                                "0",
                                "--stats-json",
                                json,
                                "--"};
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
  const std::string j = ExpectSameOutputPaged({BinDir() + "/tessera-symbol-clash-probe", "40"},
                                              "symbol-clash-probe:");
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
    std::vector<std::string> a = {BinDir() + "/tessera",
                                  "run",
                                  "--local-memory",
                                  pct,
                                  "--k",
                                  "2",
                                  "--r",
                                  "1",
                                  "--spares",
                                  "0",
                                  "--stats-json",
                                  json,
                                  "--"};
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

// ---- fork without exec in a paged program ----------------------------------------------------

// Parent and child of a fork share the heap's pages through the store (docs/guides/
// what-is-paged.md, "fork"): a 24 MB heap at a 6 MB limit forks, the parent rewrites its heap
// while the child checks the heap of the fork, writes, frees and allocates; each sees exactly its
// own bytes, and neither holds more than about the limit locally.
TEST(Compat, ForkingProgramKeepsBothHeapsWithinTheLimit) {
  TempDir tmp;
  const std::string json = tmp.path() + "/stats.json";
  // A 24 MB heap at a 6 MB limit: the child's faults are served one at a time (about 4 ms each
  // on a 2-core VM), so a bigger heap only makes the test longer.
  auto out = RunPaged({BinDir() + "/tessera-fork-probe", "24"}, json, "6M", "1G");
  EXPECT_EQ(out.exit_code, 0) << out.stdout_text;
  EXPECT_EQ(LineWith(out.stdout_text, "fork-probe:"), "fork-probe: ok") << out.stdout_text;
  EXPECT_EQ(LineWith(out.stdout_text, "fork-probe child:"),
            "fork-probe child: 24 MB checked, 0 wrong words")
      << out.stdout_text;
  const std::string j = ReadFile(json);
  EXPECT_EQ(JsonInt(j, "fill_errors"), 0) << j;
  EXPECT_EQ(JsonInt(j, "fork_snapshots"), 1) << "the fork did not share pages: " << j;
  EXPECT_EQ(JsonInt(j, "fork_fallbacks"), 0) << j;
  EXPECT_EQ(JsonInt(j, "fork_pinned"), 0) << j;
  // The parent rewrote pages the child still read: copied aside first.
  EXPECT_GT(JsonInt(j, "fork_preserved"), 0) << j;
  const long long limit = 6 << 20 >> 12;  // Pages.
  EXPECT_EQ(JsonInt(j, "fork_child_limit_pages"), limit) << j;
  // The child read its 24 MB heap through the parent's pager ...
  EXPECT_GE(JsonInt(j, "fork_child_faults"), 24 * 256 / 2) << j;
  // ... holding about the limit on top of what it wrote, which cannot be evicted: a quarter of
  // the heap rewritten, a quarter freed and calloc()ed back (jemalloc hands the freed blocks
  // back and zeroes them: written too). The parent never paged its heap in.
  const long long wrote = JsonInt(j, "fork_child_peak_dirty_pages");
  EXPECT_LE(wrote, 12 * 256 + 256) << j;
  EXPECT_LE(JsonInt(j, "fork_child_peak_resident_pages"), limit * 5 / 4 + wrote) << j;
  EXPECT_LE(JsonInt(j, "peak_resident_pages"), limit * 5 / 4) << j;
}

// ---- redis BGSAVE (fork without exec in a paged program) -------------------------------------

std::string RedisCli(int port, const std::vector<std::string>& cmd) {
  std::vector<std::string> a = {"/usr/bin/redis-cli", "-p", std::to_string(port)};
  a.insert(a.end(), cmd.begin(), cmd.end());
  return RunCommand(a, 60000).stdout_text;
}

// Starts redis-server (under `prefix`) on `dir`, waits until it accepts connections.
std::optional<Subprocess> StartRedis(const std::vector<std::string>& prefix, int port,
                                     const std::string& dir) {
  std::vector<std::string> argv = prefix;
  argv.insert(argv.end(), {"/usr/bin/redis-server", "--port", std::to_string(port), "--bind",
                           "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir,
                           "--enable-debug-command", "local"});
  auto server = Subprocess::Start(argv, {.capture_stdout = true});
  EXPECT_TRUE(server.ok()) << server.status().ToString();
  if (!server.ok()) return std::nullopt;
  Deadline d = Deadline::AfterMs(60000);
  for (;;) {
    auto line = server->ReadLine(d);
    if (!line.ok()) {
      ADD_FAILURE() << "redis never became ready: " << line.status().ToString();
      return std::nullopt;
    }
    if (line->find("Ready to accept connections") != std::string::npos) break;
  }
  return std::move(*server);
}

// BGSAVE forks the paged redis: the child must write a dump of exactly the parent's data, which
// an unpaged redis loads back with the same DEBUG DIGEST. Parent and child share the heap's
// pages through the store (see "fork" in docs/guides/what-is-paged.md): neither holds the whole
// heap locally, both stay near the limit.
TEST(Compat, RedisBgsaveAtHalfLocalMemoryWritesAnIntactDump) {
  TempDir tmp;
  const int port = testing::ListenPort();
  const std::string json = tmp.path() + "/stats.json";
  auto paged = StartRedis({BinDir() + "/tessera", "run", "--local-memory", "50%", "--k", "2", "--r",
                           "1", "--spares", "0", "--region", "2G", "--stats-json", json, "--"},
                          port, tmp.path());
  ASSERT_TRUE(paged.has_value());
  auto loader = RunCommand(
      {"/usr/bin/python3", kDir + "/kv_loader.py", "redis", std::to_string(port), "60000"}, 240000);
  ASSERT_EQ(loader.exit_code, 0) << loader.stdout_text;
  const std::string digest = RedisCli(port, {"DEBUG", "DIGEST"});
  ASSERT_EQ(digest.size(), 41u) << digest;
  ASSERT_NE(RedisCli(port, {"BGSAVE"}).find("Background saving started"), std::string::npos);
  Deadline d = Deadline::AfterMs(120000);
  std::string info;
  for (;;) {
    info = RedisCli(port, {"INFO", "persistence"});
    if (info.find("rdb_bgsave_in_progress:0") != std::string::npos) break;
    ASSERT_FALSE(d.Expired()) << "BGSAVE still running after 120 s: " << info;
    usleep(50000);  // Polling redis for the end of the save.
  }
  EXPECT_NE(info.find("rdb_last_bgsave_status:ok"), std::string::npos) << info;
  RedisCli(port, {"SHUTDOWN", "NOSAVE"});
  auto st = paged->Wait(Deadline::AfterMs(60000));
  ASSERT_TRUE(st.ok());
  const std::string j = ReadFile(json);
  EXPECT_GT(JsonInt(j, "remote_writes"), 0) << "redis was not paged out before the fork: " << j;
  EXPECT_EQ(JsonInt(j, "fill_errors"), 0) << j;
  EXPECT_EQ(JsonInt(j, "fork_snapshots"), 1) << "BGSAVE's fork did not share pages: " << j;
  // Near the limit, not the whole heap: the parent's peak resident set, and the child's (it
  // reads the whole dataset through the parent's pager to write the dump).
  const long long footprint = JsonInt(j, "peak_footprint_pages");
  const long long limit = JsonInt(j, "limit_pages");
  EXPECT_GT(JsonInt(j, "fork_child_faults"), footprint / 4) << j;
  EXPECT_LE(JsonInt(j, "peak_resident_pages"), limit * 5 / 4) << "parent above its limit: " << j;
  const long long child_limit = JsonInt(j, "fork_child_limit_pages");
  EXPECT_GT(child_limit, 0) << j;
  EXPECT_LE(JsonInt(j, "fork_child_peak_resident_pages"), child_limit * 5 / 4 + 256)
      << "BGSAVE child above its limit: " << j;
  EXPECT_LT(JsonInt(j, "fork_child_peak_resident_pages"), footprint * 3 / 4) << j;
  // The dump, loaded by an unpaged redis.
  const int port2 = testing::ListenPort();
  auto plain = StartRedis({}, port2, tmp.path());
  ASSERT_TRUE(plain.has_value());
  EXPECT_EQ(RedisCli(port2, {"DEBUG", "DIGEST"}), digest);
  RedisCli(port2, {"SHUTDOWN", "NOSAVE"});
  EXPECT_TRUE(plain->Wait(Deadline::AfterMs(60000)).ok());
}

}  // namespace
}  // namespace tessera
