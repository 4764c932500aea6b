// Integration tests of the LD_PRELOAD interposer through `tessera run`: each case runs the
// probe program (tests/run/preload_probe.cc) paged at a few MB of local memory on an embedded
// cluster, so its heap really goes to real memservers and back, and checks its verdict, the
// exit code passed through, and the stats the launcher reports.
#include <gtest/gtest.h>

#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/test_util.h"

namespace tessera {
namespace {

using testing::BinDir;
using testing::CommandOutcome;
using testing::RunCommand;
using testing::JsonInt;
using testing::ReadFile;
using testing::TempDir;

std::string Probe() { return BinDir() + "/tessera-preload-probe"; }

CommandOutcome RunPaged(const std::vector<std::string>& probe_args, const std::string& json = "",
                        const std::string& local = "6M",
                        const std::vector<std::string>& extra = {}) {
  std::vector<std::string> argv = {BinDir() + "/tessera", "run", "--local-memory", local,
                                   "--region", "1G", "--k", "2", "--r", "1", "--spares", "0"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  if (!json.empty()) {
    argv.push_back("--stats-json");
    argv.push_back(json);
  }
  argv.push_back("--");
  argv.push_back(Probe());
  argv.insert(argv.end(), probe_args.begin(), probe_args.end());
  return RunCommand(argv, 180000, /*keep_stderr=*/true);
}



TEST(Preload, HeapIsPagedAndThreadsSeeTheirBytes) {
  TempDir tmp;
  const std::string json = tmp.path() + "/stats.json";
  auto out = RunPaged({"threads", "4", "2"}, json, "24M");
  ASSERT_EQ(out.exit_code, 0) << out.stdout_text;
  const std::string j = ReadFile(json);
  EXPECT_EQ(JsonInt(j, "exit_code"), 0) << j;
  EXPECT_GT(JsonInt(j, "faults"), 0) << j;
  // The probe's 32 MB ballast alone exceeds the 24 MB cap, so the threads' held blocks go to
  // the store and come back, however the threads interleaved.
  EXPECT_GT(JsonInt(j, "remote_writes"), 0) << "nothing went remote at 24M local: " << j;
  EXPECT_GT(JsonInt(j, "remote_reads"), 0) << "nothing came back at 24M local: " << j;
  EXPECT_EQ(JsonInt(j, "fill_errors"), 0) << j;
}

// Write traps default to "auto": none while the inactive list sees the victims' accesses, on
// without the list; --write-traps and --nowrite-traps force them. The threads probe evicts at
// 24M whatever the interleaving (its ballast), so the smart policy always comes round dirty
// pages.
TEST(Preload, WriteTrapsAreSetOnlyWithoutTheInactiveListUnlessForced) {
  struct Case {
    std::vector<std::string> flags;
    bool traps;
  };
  const std::vector<Case> cases = {{{}, false},
                                   {{"--write-traps"}, true},
                                   {{"--noinactive-list"}, true},
                                   {{"--noinactive-list", "--nowrite-traps"}, false}};
  for (const Case& c : cases) {
    std::string what = "flags:";
    for (const auto& f : c.flags) what += " " + f;
    TempDir tmp;
    const std::string json = tmp.path() + "/stats.json";
    auto out = RunPaged({"threads", "4", "2"}, json, "24M", c.flags);
    ASSERT_EQ(out.exit_code, 0) << what << "\n" << out.stdout_text;
    const std::string j = ReadFile(json);
    EXPECT_GT(JsonInt(j, "remote_writes"), 0) << what << ": " << j;
    if (c.traps) {
      EXPECT_GT(JsonInt(j, "traps_armed"), 0) << what << ": " << j;
    } else {
      EXPECT_EQ(JsonInt(j, "traps_armed"), 0) << what << ": " << j;
      EXPECT_EQ(JsonInt(j, "trap_faults"), 0) << what << ": " << j;
    }
  }
}

TEST(Preload, MmapMunmapMremapMadviseSemantics) {
  TempDir tmp;
  const std::string json = tmp.path() + "/stats.json";
  auto out = RunPaged({"mmap"}, json);
  ASSERT_EQ(out.exit_code, 0) << out.stdout_text;
  const std::string j = ReadFile(json);
  EXPECT_GT(JsonInt(j, "mmaps"), 0) << j;
  EXPECT_GT(JsonInt(j, "remote_reads"), 0) << "the 48 MB mapping never came back from the store: " << j;
  EXPECT_GT(JsonInt(j, "discarded"), 0) << j;
}

TEST(Preload, ForkWithoutExecGivesTheChildAFullCopy) {
  // 32 MB of heap at 6 MB local: most of it is remote when the program forks. The child sees
  // every byte, served through the parent's pager (docs/guides/what-is-paged.md, "fork").
  TempDir tmp;
  const std::string json = tmp.path() + "/stats.json";
  auto out = RunPaged({"fork", "32"}, json);
  EXPECT_EQ(out.exit_code, 0) << out.stdout_text;
  const std::string j = ReadFile(json);
  EXPECT_EQ(JsonInt(j, "fork_snapshots"), 1) << j;
  EXPECT_GT(JsonInt(j, "fork_child_faults"), 0) << j;
  EXPECT_EQ(JsonInt(j, "fill_errors"), 0) << j;
}

// The same with the compressed tier in the path (the probe's pages are random bytes: the tier
// sends them straight to the store): a forked child still gets every page, discards reach the
// store.
TEST(Preload, ForkAndMmapSemanticsHoldWithTheCompressedTier) {
  TempDir tmp;
  const std::vector<std::string> tier = {"--compressed-tier", "2M"};
  auto fork = RunPaged({"fork", "32"}, tmp.path() + "/fork.json", "6M", tier);
  EXPECT_EQ(fork.exit_code, 0) << fork.stdout_text;
  const std::string f = ReadFile(tmp.path() + "/fork.json");
  EXPECT_GT(JsonInt(f, "tier_stored") + JsonInt(f, "tier_incompressible"), 0)
      << "no page reached the tier: " << f;
  auto mm = RunPaged({"mmap"}, tmp.path() + "/mmap.json", "6M", tier);
  ASSERT_EQ(mm.exit_code, 0) << mm.stdout_text;
  const std::string j = ReadFile(tmp.path() + "/mmap.json");
  EXPECT_GT(JsonInt(j, "remote_reads"), 0) << j;
  EXPECT_GT(JsonInt(j, "discarded"), 0) << j;
  EXPECT_EQ(JsonInt(j, "fill_errors"), 0) << j;
}

TEST(Preload, ExecedChildrenArePagedToo) {
  TempDir tmp;
  const std::string json = tmp.path() + "/stats.json";
  auto out = RunPaged({"exec"}, json);
  EXPECT_EQ(out.exit_code, 0) << out.stdout_text;
  // The probe, its fork+exec'd child, the probe system() runs (the shell may exec it in its
  // own place) and the posix_spawn'ed probe: at least four processes, each with its own pager.
  EXPECT_GE(JsonInt(ReadFile(json), "processes"), 4) << ReadFile(json);
  auto region = RunPaged({"region"});
  EXPECT_EQ(region.stdout_text, "paged\n");
}

// What managed runtimes do with their heaps (PROT_NONE reservations, mprotect and MAP_FIXED
// commits, decommits, mlock, a shared mapping over a reservation), with the data going remote
// at 6 MB of local memory and coming back intact; what cannot be paged is counted.
TEST(Preload, RuntimeReservationsArePaged) {
  TempDir tmp;
  const std::string json = tmp.path() + "/stats.json";
  auto out = RunPaged({"runtime", "12"}, json);
  ASSERT_EQ(out.exit_code, 0) << out.stdout_text;
  const std::string j = ReadFile(json);
  EXPECT_GT(JsonInt(j, "remote_writes"), 0) << j;
  EXPECT_GT(JsonInt(j, "remote_reads"), 0) << j;
  EXPECT_EQ(JsonInt(j, "fill_errors"), 0) << j;
  EXPECT_EQ(JsonInt(j, "registration_errors"), 0) << j;
  EXPECT_EQ(JsonInt(j, "not_paged_locked_peak_bytes"), 8 * 4096) << j;
  EXPECT_EQ(JsonInt(j, "not_paged_shared_peak_bytes"), 16 * 4096) << j;
  // The 24 MB reservation was paged: the peak footprint holds it and the 12 MB of malloc.
  EXPECT_GE(JsonInt(j, "peak_footprint_pages"), (36 << 20) / 4096) << j;
}

TEST(Preload, SignalHandlersRunOnProgramThreads) {
  auto out = RunPaged({"signal"});
  EXPECT_EQ(out.exit_code, 0) << out.stdout_text;
}

TEST(Run, ExitCodesPassThroughLikeAShell) {
  EXPECT_EQ(RunPaged({"exit", "0"}).exit_code, 0);
  EXPECT_EQ(RunPaged({"exit", "7"}).exit_code, 7);
  EXPECT_EQ(RunPaged({"raise", "9"}).exit_code, 128 + 9);
  EXPECT_EQ(RunPaged({"raise", "15"}).exit_code, 128 + 15);
  auto missing = RunCommand({BinDir() + "/tessera", "run", "--", "/no/such/program"}, 30000, true);
  EXPECT_EQ(missing.exit_code, 127);
  auto missing_path = RunCommand({BinDir() + "/tessera", "run", "--", "no-such-program-xyz"}, 30000, true);
  EXPECT_EQ(missing_path.exit_code, 127);
  auto not_exec = RunCommand({BinDir() + "/tessera", "run", "--", "/etc/hostname"}, 30000, true);
  EXPECT_EQ(not_exec.exit_code, 126);
}

TEST(Run, BadFlagsAreUsageErrors) {
  const std::string t = BinDir() + "/tessera";
  for (const auto& args : std::vector<std::vector<std::string>>{
           {t, "run", "--local-memory", "0%", "--", "/bin/true"},
           {t, "run", "--local-memory", "lots", "--", "/bin/true"},
           {t, "run", "--k", "3", "--", "/bin/true"},
           {t, "run", "--r", "0", "--", "/bin/true"},
           {t, "run", "--region", "1M", "--", "/bin/true"},
           {t, "run", "--no-such-flag", "--", "/bin/true"},
           {t, "run", "--auth-token-file", "/tmp/x", "--", "/bin/true"},
           {t, "run", "--compressed-tier", "fast", "--", "/bin/true"},
           {t, "run", "--compressed-tier", "512K", "--", "/bin/true"},
           {t, "run", "--local-memory", "64M", "--compressed-tier", "64M", "--", "/bin/true"},
           {t, "run", "--pager", "swap", "--compressed-tier", "auto", "--", "/bin/true"},
           {t, "run"}}) {
    EXPECT_EQ(RunCommand(args, 30000, true).exit_code, 2) << args[2];
  }
  TempDir tmp;
  auto bad_cluster = RunCommand({t, "run", "--cluster", tmp.path() + "/missing", "--", "/bin/true"},
                                30000, true);
  EXPECT_EQ(bad_cluster.exit_code, 2);
}

TEST(Run, UnreachableClusterIsAClearFailure) {
  TempDir tmp;
  const std::string cluster = tmp.path() + "/cluster";
  {
    std::ofstream f(cluster);
    for (int i = 1; i <= 3; ++i) f << "127.0.0.1:" << i << "\n";  // nothing listens there
  }
  auto out = RunCommand({BinDir() + "/tessera", "run", "--cluster", cluster, "--k", "2", "--r",
                         "1", "--", "/bin/true"},
                        60000, true);
  EXPECT_EQ(out.exit_code, 1);
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

// As an unprivileged user on a machine with vm.unprivileged_userfaultfd=0 and a root-only
// /dev/userfaultfd, `tessera run` must say why it cannot page and exit non-zero.
TEST(Run, SaysSoWhenUserfaultfdIsUnavailable) {
  std::ifstream sysctl("/proc/sys/vm/unprivileged_userfaultfd");
  int unprivileged = 1;
  sysctl >> unprivileged;
  if (geteuid() != 0 || unprivileged != 0 || access("/usr/bin/setpriv", X_OK) != 0) {
    GTEST_SKIP() << "needs root, vm.unprivileged_userfaultfd=0 and setpriv to run as nobody";
  }
  auto out = RunCommand({"/bin/sh", "-c",
                         "/usr/bin/setpriv --reuid=65534 --regid=65534 --clear-groups " +
                             BinDir() + "/tessera run -- /bin/true 2>&1"},
                        30000);
  EXPECT_EQ(out.exit_code, 1);
  EXPECT_NE(out.stdout_text.find("userfaultfd is not available"), std::string::npos)
      << out.stdout_text;
}

}  // namespace
}  // namespace tessera
