// `tessera run` and termination signals (issue 11, section 4). `timeout` (and a shell's job
// control) signals the whole process group of `tessera run`: the program must get the signal
// and be able to finish its shutdown with its whole paged heap readable, because the embedded
// memservers stop only after the program is gone. A program that ignores SIGTERM gets SIGKILL
// after --term-grace. Each case runs a small python3 program on an embedded cluster at 50%
// local memory, so part of its heap is remote when the signal arrives.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/subprocess.h"
#include "tests/support/test_util.h"

namespace tessera {
namespace {

using testing::BinDir;
using testing::ReadFile;
using testing::TempDir;

// Builds 24 MB of distinct pages, prints their digest ("expect ..."), then "ready", waits for
// SIGTERM and in its shutdown path reads the whole heap again and prints "checksum ..." (the
// same digest when no page was lost), exiting 0. With `ignore` it ignores SIGTERM instead and
// sleeps until killed.
constexpr char kProgram[] = R"PY(
import hashlib, signal, sys, time
ignore = len(sys.argv) > 1 and sys.argv[1] == "ignore"
stop = []
if ignore:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
else:
    signal.signal(signal.SIGTERM, lambda s, f: stop.append(s))
pages = [bytes([i % 251]) * 4000 + i.to_bytes(8, "little") * 12 for i in range(6144)]
def digest():
    h = hashlib.sha256()
    for p in pages:
        h.update(p)
    return h.hexdigest()
print("expect", digest(), flush=True)
print("ready", flush=True)
while ignore or not stop:
    time.sleep(0.05)  # (signal.pause() would race with a signal arriving before it)
print("checksum", digest(), flush=True)
sys.exit(0)
)PY";

struct PagedRun {
  TempDir tmp;
  std::string json;
  Subprocess proc;
};

// Starts `tessera run` on the program in a process group of its own (as `timeout` does), so
// the test can signal that group; returns once the program printed "ready".
void StartRun(PagedRun* run, const std::vector<std::string>& extra, const std::string& mode,
              std::string* expect) {
  const std::string script = run->tmp.path() + "/prog.py";
  std::ofstream(script) << kProgram;
  run->json = run->tmp.path() + "/stats.json";
  std::vector<std::string> argv = {BinDir() + "/tessera", "run",  "--local-memory", "50%",
                                   "--region", "1G", "--k", "2", "--r", "1", "--spares", "0",
                                   "--stats-json", run->json};
  argv.insert(argv.end(), extra.begin(), extra.end());
  argv.insert(argv.end(), {"--", "/usr/bin/python3", script, mode});
  Subprocess::Options so;
  so.capture_stdout = true;
  so.own_process_group = true;
  auto p = Subprocess::Start(argv, so);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  run->proc = std::move(*p);
  auto e = run->proc.WaitForLine("expect ", Deadline::AfterMs(120000));
  ASSERT_TRUE(e.ok()) << "the program did not start: " << e.status().ToString();
  *expect = e->substr(7);
  auto r = run->proc.WaitForLine("ready", Deadline::AfterMs(60000));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
}

TEST(RunSignals, SigtermToTheGroupLetsTheProgramShutDownWithItsHeapIntact) {
  PagedRun run;
  std::string expect;
  // A generous grace: the shutdown path reads the whole heap back on a loaded 2-core machine.
  ASSERT_NO_FATAL_FAILURE(StartRun(&run, {"--term-grace", "120"}, "handle", &expect));
  // What `timeout` does: SIGTERM to tessera run, then to its whole process group.
  ASSERT_EQ(kill(run.proc.pid(), SIGTERM), 0);
  ASSERT_EQ(kill(-run.proc.pid(), SIGTERM), 0);
  auto line = run.proc.WaitForLine("checksum ", Deadline::AfterMs(120000));
  ASSERT_TRUE(line.ok()) << "the program's shutdown path did not finish (SIGBUS on a remote "
                            "page?): "
                         << line.status().ToString();
  EXPECT_EQ(line->substr(9), expect) << "the heap read at shutdown differs from the one built";
  auto ws = run.proc.Wait(Deadline::AfterMs(60000));
  ASSERT_TRUE(ws.ok()) << ws.status().ToString();
  ASSERT_TRUE(WIFEXITED(*ws)) << "tessera run died of a signal: " << *ws;
  EXPECT_EQ(WEXITSTATUS(*ws), 0);
  auto j = nlohmann::json::parse(ReadFile(run.json), nullptr, /*allow_exceptions=*/false);
  ASSERT_TRUE(j.is_object()) << "no --stats-json: " << ReadFile(run.json);
  EXPECT_EQ(j.value("exit_code", -1), 0) << j.dump();
  EXPECT_TRUE(j.value("stats_final", false)) << j.dump();
  EXPECT_GT(j.value("remote_writes", 0), 0) << "nothing was paged out: " << j.dump();
  EXPECT_GT(j.value("remote_reads", 0), 0) << "nothing was paged back in: " << j.dump();
  EXPECT_EQ(j.value("fill_errors", -1), 0) << j.dump();
  EXPECT_EQ(j.value("store_data_loss", -1), 0) << j.dump();
}

TEST(RunSignals, AProgramIgnoringSigtermIsKilledAfterTheGrace) {
  PagedRun run;
  std::string expect;
  ASSERT_NO_FATAL_FAILURE(StartRun(&run, {"--term-grace", "0.5"}, "ignore", &expect));
  const uint64_t t0 = MonotonicNs();
  ASSERT_EQ(kill(run.proc.pid(), SIGTERM), 0);
  auto ws = run.proc.Wait(Deadline::AfterMs(60000));
  ASSERT_TRUE(ws.ok()) << "tessera run did not end after --term-grace: " << ws.status().ToString();
  ASSERT_TRUE(WIFEXITED(*ws)) << *ws;
  EXPECT_EQ(WEXITSTATUS(*ws), 128 + SIGKILL);
  EXPECT_GE(MonotonicNs() - t0, 500'000'000ull) << "killed before the grace ran out";
  auto j = nlohmann::json::parse(ReadFile(run.json), nullptr, false);
  ASSERT_TRUE(j.is_object()) << ReadFile(run.json);
  EXPECT_EQ(j.value("exit_code", -1), 128 + SIGKILL) << j.dump();
}

TEST(RunSignals, BadTermGraceIsAUsageError) {
  auto out = testing::RunCommand({BinDir() + "/tessera", "run", "--term-grace", "-1", "--",
                                  "/bin/true"});
  EXPECT_EQ(out.exit_code, 2);
}

}  // namespace
}  // namespace tessera
