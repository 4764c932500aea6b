// `tessera nbd` against NBD clients nobody here wrote: libnbd's nbdinfo, nbdsh and nbdcopy, and
// QEMU's qemu-io and qemu-img, over nbd:// URIs; then the same with r memservers SIGKILLed
// while a copy is running. Each test skips with a clear message when a client is not installed
// (scripts/setup.sh installs them: libnbd-bin, python3-libnbd, qemu-utils).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "client/local_cluster.h"
#include "common/subprocess.h"
#include "tests/support/test_util.h"

namespace tessera {
namespace {

using testing::BinDir;
using testing::RunCommand;
using testing::TempDir;

bool Have(const std::string& tool) {
  return RunCommand({"sh", "-c", "command -v " + tool}, 10000).exit_code == 0;
}

#define REQUIRE_TOOL(t)                                                                   \
  do {                                                                                    \
    if (!Have(t)) GTEST_SKIP() << t << " is not installed (scripts/setup.sh installs it)"; \
  } while (0)

// A running `tessera nbd`; uri() of the first export.
class NbdProcess {
 public:
  Status Start(const std::vector<std::string>& args) {
    std::vector<std::string> argv{BinDir() + "/tessera", "nbd", "--listen", "127.0.0.1:0"};
    argv.insert(argv.end(), args.begin(), args.end());
    if (std::find(args.begin(), args.end(), "--state_file") == args.end()) {
      argv.push_back("--ephemeral");  // These tests do not restart the export.
    }
    auto p = Subprocess::Start(argv, {.capture_stdout = true, .quiet_stderr = getenv("NBD_TEST_VERBOSE") == nullptr});
    if (!p.ok()) return p.status();
    proc_ = std::move(*p);
    auto line = proc_.WaitForLine("nbd export", Deadline::AfterMs(60000));
    if (!line.ok()) return line.status().WithContext("waiting for `nbd export` from tessera nbd");
    const size_t at = line->find("nbd://");
    if (at == std::string::npos) return Internal("no URI in: ", *line);
    uri_ = line->substr(at);
    port_base_ = uri_.substr(0, uri_.rfind('/') + 1);
    return Status::Ok();
  }
  const std::string& uri() const { return uri_; }
  std::string uri_of(const std::string& name) const { return port_base_ + name; }
  // SIGKILL: the export dies at once (nothing flushed, nothing freed).
  void Kill() {
    (void)proc_.Signal(SIGKILL);
    (void)proc_.Wait(Deadline::AfterMs(30000));
  }
  // SIGTERM: the export flushes and exits 0.
  int Stop() {
    auto st = proc_.Stop(20000);
    return st.ok() && WIFEXITED(*st) ? WEXITSTATUS(*st) : -1;
  }

 private:
  Subprocess proc_;
  std::string uri_, port_base_;
};

std::string WriteRandomFile(const std::string& path, size_t bytes, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint64_t> buf(bytes / 8);
  for (auto& w : buf) w = rng();
  // Some zero runs, so clients' zero detection (WRITE_ZEROES / sparse copies) is exercised.
  for (size_t i = 0; i < buf.size(); i += 40000) {
    for (size_t j = i; j < std::min(buf.size(), i + 3000); ++j) buf[j] = 0;
  }
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(buf.data()), static_cast<std::streamsize>(bytes));
  return path;
}

std::string Sha(const std::string& path) {
  auto o = RunCommand({"sha256sum", path}, 60000);
  return o.stdout_text.substr(0, 64);
}

TEST(NbdIntegrationTest, NbdinfoSeesSizeFlagsBlockSizesAndExports) {
  REQUIRE_TOOL("nbdinfo");
  NbdProcess nbd;
  ASSERT_TRUE(nbd.Start({"--exports", "swap=64M,scratch=3M", "--k", "2", "--r", "1"}).ok());
  auto info = RunCommand({"nbdinfo", nbd.uri()}, 30000, true);
  ASSERT_EQ(info.exit_code, 0) << info.stdout_text;
  const std::string& t = info.stdout_text;
  for (const char* want :
       {"export-size: 67108864", "can_flush: true", "can_fua: true", "can_trim: true",
        "can_zero: true", "can_multi_conn: true", "can_df: true", "is_read_only: false",
        "can_cache: false", "can_fast_zero: false", "block_size_minimum: 1",
        "block_size_preferred: 4096", "block_size_maximum: 33554432", "structured"}) {
    EXPECT_NE(t.find(want), std::string::npos) << "nbdinfo lacks '" << want << "':\n" << t;
  }
  auto scratch = RunCommand({"nbdinfo", "--size", nbd.uri_of("scratch")}, 30000);
  EXPECT_EQ(scratch.stdout_text, "3145728\n");
  auto list = RunCommand({"nbdinfo", "--list", nbd.uri()}, 30000);
  EXPECT_NE(list.stdout_text.find("export=\"swap\""), std::string::npos) << list.stdout_text;
  EXPECT_NE(list.stdout_text.find("export=\"scratch\""), std::string::npos) << list.stdout_text;
  auto unknown = RunCommand({"nbdinfo", nbd.uri_of("nope")}, 30000);
  EXPECT_NE(unknown.exit_code, 0) << "an unknown export name was accepted";
  EXPECT_EQ(nbd.Stop(), 0);
}

TEST(NbdIntegrationTest, NbdshReadWriteTrimZeroFlushUnaligned) {
  REQUIRE_TOOL("nbdsh");
  NbdProcess nbd;
  ASSERT_TRUE(nbd.Start({"--size", "16M", "--k", "2", "--r", "1"}).ok());
  // libnbd's Python bindings: h.pwrite/pread/trim/zero/flush, several commands in flight
  // through aio_*, and an out-of-range read that must fail with EINVAL.
  const std::string script = R"PY(
import errno, os
size = h.get_size()
assert size == 16 << 20, size
a = os.urandom(3 * 4096)
h.pwrite(a, 8192)
assert h.pread(len(a), 8192) == a
b = os.urandom(5000)
h.pwrite(b, 8192 + 1000, nbd.CMD_FLAG_FUA)
want = a[:1000] + b + a[6000:]
assert h.pread(len(a), 8192) == want
assert h.pread(7, 8192 + 999) == want[999:1006]
h.trim(4096, 12288)
assert h.pread(4096, 12288) == bytes(4096)
want = want[:4096] + bytes(4096) + want[8192:]
h.zero(110, 8192)
got = h.pread(len(a), 8192)
assert got[:110] == bytes(110) and got[110:] == want[110:], "zero"
h.zero(4096 * 10, 4096 * 20, nbd.CMD_FLAG_NO_HOLE)
assert h.pread(4096 * 10, 4096 * 20) == bytes(4096 * 10)
h.flush()
bufs = []
for i in range(64):
    d = bytes([i]) * 4096
    h.aio_pwrite(d, (1 << 20) + i * 4096)
while h.aio_in_flight() > 0:
    h.poll(-1)
for i in range(64):
    assert h.pread(4096, (1 << 20) + i * 4096) == bytes([i]) * 4096, i
try:
    h.pread(4096, size - 100)
    raise SystemExit("out-of-range read succeeded")
except nbd.Error as e:
    assert e.errnum == errno.EINVAL, e
print("NBDSH-OK")
)PY";
  // nbdsh runs `python3 -mnbd`: the distribution's python3 (which has python3-libnbd), not
  // another python3 that may come first in PATH.
  const char* path = std::getenv("PATH");
  const std::string env_path = std::string("PATH=/usr/bin:/bin:") + (path ? path : "");
  auto o = RunCommand({"env", env_path, "nbdsh", "-u", nbd.uri(), "-c", script}, 60000, true);
  EXPECT_EQ(o.exit_code, 0) << o.stdout_text;
  EXPECT_NE(o.stdout_text.find("NBDSH-OK"), std::string::npos) << o.stdout_text;
  EXPECT_EQ(nbd.Stop(), 0);
}

// qemu-io commands writing patterned ranges at random, partly unaligned offsets, then reading
// every range back with -P verification (the last write of each slot wins).
std::vector<std::string> QemuIoPattern(uint64_t seed, int writes, uint64_t span) {
  std::mt19937_64 rng(seed);
  struct W {
    uint64_t off, len;
    int pat;
  };
  std::vector<W> ws;
  std::vector<std::string> args;
  // Slots of 64 KiB, each written once, so verification is exact; offsets inside the slot and
  // lengths are random and often not 4 KB aligned.
  const uint64_t slots = span / 65536;
  std::vector<uint64_t> order(slots);
  for (uint64_t i = 0; i < slots; ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), rng);
  for (int i = 0; i < writes && static_cast<uint64_t>(i) < slots; ++i) {
    const uint64_t base = order[static_cast<size_t>(i)] * 65536;
    const uint64_t off = base + (rng() % 2 ? (rng() % 8) * 4096 : rng() % 30000);
    const uint64_t len = (rng() % 2 ? (1 + rng() % 8) * 4096 : 1 + rng() % 30000);
    const int pat = 1 + static_cast<int>(rng() % 250);
    ws.push_back({off, len, pat});
    args.push_back("-c");
    args.push_back("aio_write -P " + std::to_string(pat) + " " + std::to_string(off) + " " +
                   std::to_string(len));
  }
  args.push_back("-c");
  args.push_back("aio_flush");
  for (const W& w : ws) {
    args.push_back("-c");
    args.push_back("read -P " + std::to_string(w.pat) + " " + std::to_string(w.off) + " " +
                   std::to_string(w.len));
  }
  return args;
}

void RunQemuIo(const std::string& uri, uint64_t seed, int writes, uint64_t span) {
  std::vector<std::string> argv{"qemu-io", "-f", "raw"};
  auto cmds = QemuIoPattern(seed, writes, span);
  argv.insert(argv.end(), cmds.begin(), cmds.end());
  argv.push_back(uri);
  auto o = RunCommand(argv, 120000, true);
  EXPECT_EQ(o.exit_code, 0) << o.stdout_text.substr(0, 2000);
  EXPECT_EQ(o.stdout_text.find("failed"), std::string::npos)
      << "qemu-io verification failed:\n" << o.stdout_text.substr(0, 4000);
  size_t reads = 0;
  for (size_t p = o.stdout_text.find("read "); p != std::string::npos;
       p = o.stdout_text.find("read ", p + 1)) {
    reads++;
  }
  EXPECT_GE(reads, static_cast<size_t>(writes)) << "qemu-io did not run every read";
}

TEST(NbdIntegrationTest, QemuIoRandomPatternsVerify) {
  REQUIRE_TOOL("qemu-io");
  NbdProcess nbd;
  ASSERT_TRUE(nbd.Start({"--size", "64M", "--k", "4", "--r", "2"}).ok());
  RunQemuIo(nbd.uri(), 7, 300, 64 << 20);
  EXPECT_EQ(nbd.Stop(), 0);
}

TEST(NbdIntegrationTest, QemuImgAndNbdcopyCopyInAndOut) {
  REQUIRE_TOOL("qemu-img");
  REQUIRE_TOOL("nbdcopy");
  TempDir dir;
  const size_t kBytes = 128u << 20;
  const std::string src = WriteRandomFile(dir.path() + "/src.img", kBytes, 42);
  NbdProcess nbd;
  ASSERT_TRUE(nbd.Start({"--exports", "a=128M,b=128M", "--k", "2", "--r", "1"}).ok());
  // qemu-img in and compare.
  auto conv = RunCommand({"qemu-img", "convert", "-n", "-f", "raw", "-O", "raw", src, nbd.uri_of("a")},
                         180000, true);
  ASSERT_EQ(conv.exit_code, 0) << conv.stdout_text;
  auto cmp = RunCommand({"qemu-img", "compare", "-f", "raw", "-F", "raw", src, nbd.uri_of("a")},
                        180000, true);
  EXPECT_EQ(cmp.exit_code, 0) << cmp.stdout_text;
  // nbdcopy in (multi-connection) to the other export, out to a file, compare checksums.
  auto in = RunCommand({"nbdcopy", src, nbd.uri_of("b")}, 180000, true);
  ASSERT_EQ(in.exit_code, 0) << in.stdout_text;
  const std::string out = dir.path() + "/out.img";
  auto outc = RunCommand({"nbdcopy", nbd.uri_of("b"), out}, 180000, true);
  ASSERT_EQ(outc.exit_code, 0) << outc.stdout_text;
  EXPECT_EQ(Sha(out), Sha(src));
  // qemu-img out of export a too.
  const std::string out2 = dir.path() + "/out2.img";
  auto conv2 = RunCommand({"qemu-img", "convert", "-f", "raw", "-O", "raw", nbd.uri_of("a"), out2},
                          180000, true);
  ASSERT_EQ(conv2.exit_code, 0) << conv2.stdout_text;
  EXPECT_EQ(Sha(out2), Sha(src));
  EXPECT_EQ(nbd.Stop(), 0);
}

// A restarted export over the same memservers never serves zeros for the blocks a previous run
// stored: with --state_file it refuses with a clear error (the page map died with the process)
// until the operator deletes the file; a run that never wrote restarts freely.
TEST(NbdIntegrationTest, ARestartAfterWritesRefusesInsteadOfServingZeros) {
  REQUIRE_TOOL("nbdcopy");
  client::LocalClusterOptions lo;
  lo.bin_dir = BinDir();
  lo.servers = 3;
  lo.capacity = "64M";
  auto cluster = client::LocalCluster::Start(lo);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  TempDir dir;
  const std::string state = dir.path() + "/export.state";
  const std::vector<std::string> flags = {"--size",
                                          "16M",
                                          "--k",
                                          "2",
                                          "--r",
                                          "1",
                                          "--cluster",
                                          (*cluster)->cluster_file_path(),
                                          "--auth_token_file",
                                          (*cluster)->token_path(),
                                          "--state_file",
                                          state};
  // Runs `tessera nbd` with `flags` (stderr into the captured output); a refusing export exits
  // at once, one that serves is killed at the bound.
  auto restart = [&] {
    std::vector<std::string> a{
        "/bin/sh",  "-c",         "exec \"$0\" \"$@\" 2>&1", BinDir() + "/tessera", "nbd",
        "--listen", "127.0.0.1:0"};
    a.insert(a.end(), flags.begin(), flags.end());
    return RunCommand(a, 30000);
  };

  // A run that never changes data: killed, it restarts and serves.
  {
    NbdProcess nbd;
    ASSERT_TRUE(nbd.Start(flags).ok());
    const std::string zeros = dir.path() + "/zeros.img";
    ASSERT_EQ(RunCommand({"nbdcopy", nbd.uri(), zeros}, 60000, true).exit_code, 0);
    nbd.Kill();
  }
  // 8 MiB written and read back intact, then SIGKILL.
  const std::string src = WriteRandomFile(dir.path() + "/src.img", 8u << 20, 5);
  {
    NbdProcess nbd;
    ASSERT_TRUE(nbd.Start(flags).ok()) << "a run that wrote nothing could not restart";
    auto in = RunCommand({"nbdcopy", src, nbd.uri()}, 120000, true);
    ASSERT_EQ(in.exit_code, 0) << in.stdout_text;
    const std::string out = dir.path() + "/out.img";
    ASSERT_EQ(RunCommand({"nbdcopy", nbd.uri(), out}, 120000, true).exit_code, 0);
    EXPECT_EQ(RunCommand({"cmp", "-n", std::to_string(8u << 20), src, out}, 30000).exit_code, 0);
    nbd.Kill();
  }
  // The same flags over the same memservers: refused, with the reason and the way out.
  auto refused = restart();
  EXPECT_EQ(refused.exit_code, 1) << refused.stdout_text;
  EXPECT_NE(refused.stdout_text.find("refusing to serve"), std::string::npos)
      << refused.stdout_text;
  EXPECT_NE(refused.stdout_text.find("accepted writes"), std::string::npos) << refused.stdout_text;
  EXPECT_EQ(refused.stdout_text.find("nbd export"), std::string::npos)
      << "the refused export served anyway: " << refused.stdout_text;
  // Still refused on the next try (nothing was reset by the refusal).
  EXPECT_EQ(restart().exit_code, 1);
  // A file that is not a state file is not taken over either.
  const std::string other = dir.path() + "/notes.txt";
  std::ofstream(other) << "important notes\n";
  auto foreign =
      RunCommand({"/bin/sh", "-c", "exec \"$0\" \"$@\" 2>&1", BinDir() + "/tessera", "nbd",
                  "--listen", "127.0.0.1:0", "--size", "16M", "--state_file", other},
                 30000);
  EXPECT_EQ(foreign.exit_code, 1) << foreign.stdout_text;
  EXPECT_EQ(testing::ReadFile(other), "important notes\n");
  // Neither --state_file nor --ephemeral: a usage error.
  EXPECT_EQ(RunCommand({BinDir() + "/tessera", "nbd", "--size", "16M"}, 30000).exit_code, 2);
  // The operator deletes the file to start over: a fresh, empty device.
  ASSERT_EQ(::unlink(state.c_str()), 0);
  NbdProcess fresh;
  ASSERT_TRUE(fresh.Start(flags).ok());
  const std::string after = dir.path() + "/after.img";
  ASSERT_EQ(RunCommand({"nbdcopy", fresh.uri(), after}, 60000, true).exit_code, 0);
  EXPECT_EQ(
      RunCommand({"cmp", "-n", std::to_string(16u << 20), after, "/dev/zero"}, 30000).exit_code, 0)
      << "a fresh export must read as zeros";
  EXPECT_EQ(fresh.Stop(), 0);
}

// The export on a cluster this test owns: r memservers SIGKILLed while nbdcopy copies in, then
// the image compared, then qemu-io patterns verified on the degraded cluster.
TEST(NbdIntegrationTest, SurvivesRMemserversKilledMidCopy) {
  REQUIRE_TOOL("qemu-img");
  REQUIRE_TOOL("nbdcopy");
  REQUIRE_TOOL("qemu-io");
  constexpr int kK = 4, kR = 2;
  client::LocalClusterOptions lo;
  lo.bin_dir = BinDir();
  // Room to re-place the splits of r killed servers, plus one spare: on a loaded 2-core box a
  // live server is sometimes declared failed too (heartbeat timeout), and with fewer than k+r
  // live servers new writes cannot be placed at all.
  lo.servers = kK + 2 * kR + 1;
  lo.capacity = "96M";
  auto cluster = client::LocalCluster::Start(lo);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  TempDir dir;
  const size_t kBytes = 96u << 20;
  const std::string src = WriteRandomFile(dir.path() + "/src.img", kBytes, 9);
  NbdProcess nbd;
  ASSERT_TRUE(nbd.Start({"--size", "128M", "--k", std::to_string(kK), "--r", std::to_string(kR),
                         "--cluster", (*cluster)->cluster_file_path(), "--auth_token_file",
                         (*cluster)->token_path()})
                  .ok());
  auto copy = Subprocess::Start({"nbdcopy", "--flush", src, nbd.uri()}, {});
  ASSERT_TRUE(copy.ok()) << copy.status();
  // Kill r servers while the copy runs (wherever it is: the result must be right regardless).
  for (int i = 0; i < kR; ++i) ASSERT_TRUE((*cluster)->Kill(static_cast<size_t>(2 * i + 1)).ok());
  auto st = copy->Wait(Deadline::AfterMs(240000));
  ASSERT_TRUE(st.ok()) << st.status();
  ASSERT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 0) << "nbdcopy failed with r servers killed";
  auto cmp = RunCommand({"qemu-img", "compare", "-f", "raw", "-F", "raw", src, nbd.uri()}, 180000, true);
  EXPECT_EQ(cmp.exit_code, 0) << cmp.stdout_text;
  // More writes and verified reads on the degraded cluster (beyond the copied image).
  RunQemuIo(nbd.uri(), 11, 120, 128 << 20);
  EXPECT_EQ(nbd.Stop(), 0);
}

}  // namespace
}  // namespace tessera
