// `tessera swap` end to end on this machine's kernel: on, a real program swapping to it in a
// cgroup-v1 memory limit, status, off; r memservers SIGKILLed while the program's pages are in
// swap (identical output, no loss); r+1 killed (SIGBUS for the process that touches a lost page,
// the lost pages named, other processes unaffected); bad input; `tessera run --pager swap`.
// Needs root, /dev/fuse, loop devices and a cgroup-v1 memory controller with swap accounting
// (skipped otherwise). Every device, cgroup and mount is removed on every exit path.
#include <fcntl.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>

#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "client/local_cluster.h"
#include "common/clock.h"
#include "common/subprocess.h"
#include "kernel_shim/swap/memory_cgroup.h"
#include "tests/support/test_util.h"

namespace tessera {
namespace {

using testing::BinDir;
using testing::RunCommand;

const std::string kScript = std::string(TESSERA_SWAP_TEST_SCRIPTS) + "/fill_verify.py";
constexpr int kFillMiB = 96;
constexpr uint64_t kLimit = 32ull << 20;

// Runs argv with its stderr captured along with its stdout (the errors are what is checked).
testing::CommandOutcome RunAll(const std::vector<std::string>& argv, int timeout_ms = 60000) {
  std::string cmd;
  for (const auto& a : argv) cmd += "'" + a + "' ";
  return RunCommand({"/bin/sh", "-c", cmd + "2>&1"}, timeout_ms);
}

std::string Name(const char* what) { return std::string(what) + "-" + std::to_string(::getpid()); }

bool InProcSwaps(const std::string& dev) {
  std::ifstream in("/proc/swaps");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(dev + " ", 0) == 0) return true;
  }
  return false;
}

class SwapTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (Status st = kernel_shim::MemoryCgroup::CheckSupported(); !st.ok()) {
      GTEST_SKIP() << st.message();
    }
    if (::access("/dev/fuse", R_OK | W_OK) != 0) GTEST_SKIP() << "no /dev/fuse";
    if (::access("/dev/loop-control", R_OK | W_OK) != 0) GTEST_SKIP() << "no loop devices";
  }
  void TearDown() override {
    for (const auto& n : names_) {
      RunCommand({BinDir() + "/tessera-swap", "off", "--name", n}, 120000);
    }
  }
  // `tessera swap on`; the device path.
  std::string On(const std::string& name, std::vector<std::string> extra = {}) {
    names_.push_back(name);
    std::vector<std::string> argv = {
        BinDir() + "/tessera-swap", "on", "--name", name, "--size", "256M", "--priority", "32767"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    auto out = RunCommand(argv, 180000, /*keep_stderr=*/true);
    EXPECT_EQ(out.exit_code, 0) << out.stdout_text;
    const size_t at = out.stdout_text.find(" on: ");
    if (at == std::string::npos) return "";
    return out.stdout_text.substr(at + 5, out.stdout_text.find(' ', at + 5) - at - 5);
  }
  // The program in a fresh cgroup limited to kLimit.
  struct Program {
    std::unique_ptr<kernel_shim::MemoryCgroup> cg;
    Subprocess p;
  };
  Program Start(const char* cg_name, const std::string& fifo) {
    Program prog;
    auto cg = kernel_shim::MemoryCgroup::Create(Name(cg_name));
    EXPECT_TRUE(cg.ok()) << cg.status();
    if (!cg.ok()) return prog;
    prog.cg = std::move(*cg);
    EXPECT_TRUE(prog.cg->SetLimit(kLimit).ok());
    const std::string cmd = "echo $$ > " + prog.cg->path() + "/cgroup.procs && exec python3 " +
                            kScript + " " + std::to_string(kFillMiB) + " " + fifo;
    auto p = Subprocess::Start({"/bin/sh", "-c", cmd}, Subprocess::Options{true, false, {}});
    EXPECT_TRUE(p.ok()) << p.status();
    if (p.ok()) prog.p = std::move(*p);
    return prog;
  }
  std::vector<std::string> names_;
};

// The digest the program prints when nothing is swapped.
std::string ExpectedDigest() {
  auto out = RunCommand(
      {"/bin/sh", "-c", "echo | python3 " + kScript + " " + std::to_string(kFillMiB)}, 120000);
  const size_t at = out.stdout_text.find("digest ");
  return at == std::string::npos ? ""
                                 : out.stdout_text.substr(at, out.stdout_text.find('\n', at) - at);
}

TEST_F(SwapTest, OnSwapStatusOffWithARealProgram) {
  const std::string want = ExpectedDigest();
  ASSERT_FALSE(want.empty());
  const std::string name = Name("t-e2e");
  const std::string dev = On(name);
  ASSERT_FALSE(dev.empty());
  EXPECT_TRUE(InProcSwaps(dev));
  auto cg = kernel_shim::MemoryCgroup::Create(Name("t-e2e-cg"));
  ASSERT_TRUE(cg.ok()) << cg.status();
  ASSERT_TRUE((*cg)->SetLimit(kLimit).ok());
  auto run = RunCommand({"/bin/sh", "-c",
                         "echo $$ > " + (*cg)->path() + "/cgroup.procs && echo | exec python3 " +
                             kScript + " " + std::to_string(kFillMiB)},
                        240000);
  ASSERT_EQ(run.exit_code, 0) << run.stdout_text;
  EXPECT_NE(run.stdout_text.find(want), std::string::npos) << run.stdout_text;
  const kernel_shim::MemoryCgroupStats cs = (*cg)->Stats();
  EXPECT_LE(cs.max_usage, kLimit);
  EXPECT_GT(cs.memsw_max_usage, kLimit + (32ull << 20)) << "the program did not swap";
  auto status = RunCommand({BinDir() + "/tessera-swap", "status", "--name", name}, 30000);
  EXPECT_EQ(status.exit_code, 0) << status.stdout_text;
  EXPECT_NE(status.stdout_text.find("swap on"), std::string::npos) << status.stdout_text;
  EXPECT_NE(status.stdout_text.find("0 pages lost"), std::string::npos) << status.stdout_text;
  EXPECT_EQ(status.stdout_text.find("pages written 0,"), std::string::npos) << status.stdout_text;
  ASSERT_TRUE((*cg)->Remove().ok());
  auto off = RunCommand({BinDir() + "/tessera-swap", "off", "--name", name}, 120000, true);
  EXPECT_EQ(off.exit_code, 0) << off.stdout_text;
  EXPECT_FALSE(InProcSwaps(dev));
  struct stat st;
  EXPECT_NE(::stat(("/run/tessera-swap/" + name).c_str(), &st), 0) << "state left behind";
  if (off.exit_code == 0) names_.clear();  // Else TearDown tries again.
}

// Memservers of an external cluster die while the program's pages are in swap.
class SwapFailureTest : public SwapTest {
 protected:
  void SetUp() override {
    SwapTest::SetUp();
    if (IsSkipped()) return;
    client::LocalClusterOptions lo;
    lo.bin_dir = BinDir();
    lo.servers = Servers();
    lo.capacity = "256M";
    lo.slab_size = "1M";
    auto c = client::LocalCluster::Start(lo);
    ASSERT_TRUE(c.ok()) << c.status();
    cluster_ = std::move(*c);
  }
  // k+2r for RS(4,2): r failures leave k+r servers for new writes.
  virtual size_t Servers() const { return 8; }
  std::vector<std::string> ClusterFlags() {
    return {"--cluster",
            cluster_->cluster_file_path(),
            "--auth_token_file",
            cluster_->token_path(),
            "--k",
            "4",
            "--r",
            "2",
            "--layout",
            "split"};
  }
  // Starts the program, waits until its pages are written (most of them out to swap).
  Program Fill(const char* cg_name) {
    fifo_ = tmp_.path() + "/go";
    EXPECT_EQ(::mkfifo(fifo_.c_str(), 0600), 0);
    Program prog = Start(cg_name, fifo_);
    if (!prog.cg) return prog;
    auto line = prog.p.ReadLine(Deadline::AfterMs(240000));
    EXPECT_TRUE(line.ok() && *line == "filled") << (line.ok() ? *line : line.status().ToString());
    const kernel_shim::MemoryCgroupStats cs = prog.cg->Stats();
    EXPECT_GT(cs.swap, 32ull << 20) << "too little of the program is in swap";
    return prog;
  }
  // Lets the program read its pages back (it blocks on the named pipe until then).
  // Bounded: the program opens the pipe right after printing "filled" (which may need pages
  // back from swap). False when the program exited before it opened the pipe.
  bool Continue(Subprocess& p) {
    const Deadline d = Deadline::AfterMs(120000);
    int fd = -1;
    while ((fd = ::open(fifo_.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC)) < 0) {
      EXPECT_EQ(errno, ENXIO) << std::strerror(errno);
      if (errno != ENXIO || p.Poll()) return false;
      if (d.Expired()) {
        ADD_FAILURE() << "the program never opened " << fifo_;
        return false;
      }
      ::usleep(10000);  // Waiting for the reader to open the pipe, bounded.
    }
    EXPECT_EQ(::write(fd, "go\n", 3), 3);
    ::close(fd);
    return true;
  }
  std::unique_ptr<client::LocalCluster> cluster_;
  testing::TempDir tmp_;
  std::string fifo_;
};

TEST_F(SwapFailureTest, RMemserversKilledIdenticalOutputNoLoss) {
  const std::string want = ExpectedDigest();
  ASSERT_FALSE(want.empty());
  const std::string name = Name("t-kill-r");
  ASSERT_FALSE(On(name, ClusterFlags()).empty());
  Program prog = Fill("t-kill-r-cg");
  ASSERT_TRUE(prog.cg);
  ASSERT_TRUE(cluster_->Kill(1).ok());
  ASSERT_TRUE(cluster_->Kill(5).ok());
  ASSERT_TRUE(Continue(prog.p)) << "the program died with r memservers killed";
  auto line = prog.p.ReadLine(Deadline::AfterMs(240000));
  ASSERT_TRUE(line.ok()) << line.status();
  EXPECT_EQ(*line, want);
  auto ws = prog.p.Wait(Deadline::AfterMs(60000));
  ASSERT_TRUE(ws.ok());
  EXPECT_TRUE(WIFEXITED(*ws) && WEXITSTATUS(*ws) == 0);
  auto status = RunCommand({BinDir() + "/tessera-swap", "status", "--name", name}, 30000);
  EXPECT_NE(status.stdout_text.find("0 pages lost"), std::string::npos) << status.stdout_text;
}

// k+r servers exactly: every page has a split on each, so r+1 killed lose every page.
class SwapLossTest : public SwapFailureTest {
 protected:
  size_t Servers() const override { return 6; }
};

TEST_F(SwapLossTest, RPlusOneKilledSigbusForTheToucherOthersRun) {
  const std::string name = Name("t-kill-r1");
  ASSERT_FALSE(On(name, ClusterFlags()).empty());
  Program prog = Fill("t-kill-r1-cg");
  ASSERT_TRUE(prog.cg);
  // A bystander in its own cgroup, with nothing in swap: it must keep running.
  auto bystander = Subprocess::Start({"/bin/sleep", "600"});
  ASSERT_TRUE(bystander.ok());
  for (size_t i : {0, 2, 4}) ASSERT_TRUE(cluster_->Kill(i).ok());
  (void)Continue(prog.p);  // It may touch a lost page (and die) before it reads the pipe.
  auto ws = prog.p.Wait(Deadline::AfterMs(240000));
  ASSERT_TRUE(ws.ok()) << ws.status();
  ASSERT_TRUE(WIFSIGNALED(*ws)) << "the program exited with " << WEXITSTATUS(*ws)
                                << " although 3 of its 6 servers were lost";
  EXPECT_EQ(WTERMSIG(*ws), SIGBUS);
  EXPECT_FALSE(bystander->Poll()) << "a process that swapped nothing was affected";
  // The daemon rewrites its stats twice a second: wait (bounded) for the loss to show.
  testing::CommandOutcome status;
  const Deadline shown = Deadline::AfterMs(20000);
  do {
    status = RunCommand({BinDir() + "/tessera-swap", "status", "--name", name}, 30000);
    if (status.stdout_text.find(" 0 pages lost") == std::string::npos) break;
    ::usleep(100000);  // Polling the stats file, bounded by `shown`.
  } while (!shown.Expired());
  EXPECT_EQ(status.stdout_text.find(" 0 pages lost"), std::string::npos) << status.stdout_text;
  EXPECT_NE(status.stdout_text.find("last pages: "), std::string::npos) << status.stdout_text;
  prog.cg.reset();
  // Off still works: the lost slots belonged to the dead process and were freed with it.
  auto off = RunCommand({BinDir() + "/tessera-swap", "off", "--name", name}, 120000, true);
  EXPECT_EQ(off.exit_code, 0) << off.stdout_text;
  if (off.exit_code == 0) names_.clear();  // Else TearDown tries again.
}

TEST_F(SwapFailureTest, OffCleansUpAfterTheDaemonCrashedAndSwappedPagesAreLost) {
  const std::string name = Name("t-crash");
  const std::string dev = On(name, ClusterFlags());
  ASSERT_FALSE(dev.empty());
  Program prog = Fill("t-crash-cg");
  ASSERT_TRUE(prog.cg);
  // The daemon dies with the page map of everything in swap.
  std::ifstream state("/run/tessera-swap/" + name + "/state");
  pid_t daemon = 0;
  for (std::string key; state >> key;) {
    if (key == "pid") state >> daemon;
  }
  ASSERT_GT(daemon, 0);
  ASSERT_EQ(::kill(daemon, SIGKILL), 0);
  // Until it is gone, swapoff would read the pages back (into a cgroup at its limit: ENOMEM).
  const Deadline gone = Deadline::AfterMs(30000);
  for (;;) {
    std::ifstream st("/proc/" + std::to_string(daemon) + "/stat");
    std::string line;
    std::getline(st, line);
    const size_t paren = line.rfind(')');
    if (line.empty() ||
        (paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] == 'Z')) {
      break;
    }
    ASSERT_FALSE(gone.Expired()) << "the SIGKILLed daemon did not exit";
    ::usleep(10000);  // Bounded wait for the kill to take effect.
  }
  // swapoff charges each page it brings back to the page's cgroup before it reads it (and
  // finds it lost): give the program's cgroup room, as off's ENOMEM message asks.
  ASSERT_TRUE(prog.cg->SetLimit(1ull << 30).ok());
  auto off = RunAll({BinDir() + "/tessera-swap", "off", "--name", name}, 120000);
  EXPECT_EQ(off.exit_code, 0) << off.stdout_text;
  EXPECT_NE(off.stdout_text.find("daemon had exited"), std::string::npos) << off.stdout_text;
  EXPECT_FALSE(InProcSwaps(dev));
  struct stat st;
  EXPECT_NE(::stat(("/run/tessera-swap/" + name).c_str(), &st), 0) << "state left behind";
  if (off.exit_code == 0) names_.clear();  // Else TearDown tries again.
  // Its swapped-out pages are gone: the program gets SIGBUS when it touches them.
  (void)Continue(prog.p);
  auto ws = prog.p.Wait(Deadline::AfterMs(120000));
  ASSERT_TRUE(ws.ok()) << ws.status();
  EXPECT_TRUE(WIFSIGNALED(*ws) && WTERMSIG(*ws) == SIGBUS);
}

TEST_F(SwapTest, BadInputGetsClearErrors) {
  // No --size.
  auto a = RunAll({BinDir() + "/tessera-swap", "on"}, 30000);
  EXPECT_EQ(a.exit_code, 2);
  // Not root.
  auto b = RunAll({"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                   BinDir() + "/tessera-swap", "on", "--size", "64M", "--name", Name("t-nr")},
                  30000);
  EXPECT_EQ(b.exit_code, 1);
  EXPECT_NE(b.stdout_text.find("needs root"), std::string::npos) << b.stdout_text;
  // Off / status of a device that is not on.
  auto c = RunAll({BinDir() + "/tessera-swap", "status", "--name", Name("t-none")}, 30000);
  EXPECT_EQ(c.exit_code, 1);
  EXPECT_NE(c.stdout_text.find("is on"), std::string::npos) << c.stdout_text;
  // The FUSE mount point already in use.
  const std::string busy = Name("t-busy");
  const std::string dir = "/run/tessera-swap/" + busy;
  ::mkdir("/run/tessera-swap", 0700);
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
  ASSERT_EQ(::mkdir((dir + "/mnt").c_str(), 0700), 0);
  ASSERT_EQ(::mount("tmpfs", (dir + "/mnt").c_str(), "tmpfs", 0, "size=1m"), 0);
  auto d = RunAll({BinDir() + "/tessera-swap", "on", "--size", "64M", "--name", busy}, 30000);
  ::umount2((dir + "/mnt").c_str(), MNT_DETACH);
  ::rmdir((dir + "/mnt").c_str());
  ::rmdir(dir.c_str());
  EXPECT_EQ(d.exit_code, 1);
  EXPECT_NE(d.stdout_text.find("already in use"), std::string::npos) << d.stdout_text;
  // Twice.
  const std::string name = Name("t-twice");
  ASSERT_FALSE(On(name).empty());
  auto e = RunAll({BinDir() + "/tessera-swap", "on", "--size", "64M", "--name", name}, 30000);
  EXPECT_EQ(e.exit_code, 1);
  EXPECT_NE(e.stdout_text.find("already on"), std::string::npos) << e.stdout_text;
}

TEST_F(SwapFailureTest, ASizeBeyondTheClustersCapacityIsRefused) {
  // 8 servers of 256M lend 2G; 4G at RS(4,2) needs 6G.
  const std::string name = Name("t-big");
  std::vector<std::string> argv = {
      BinDir() + "/tessera-swap", "on", "--name", name, "--size", "4G"};
  for (const auto& f : ClusterFlags()) argv.push_back(f);
  auto out = RunAll(argv, 120000);
  EXPECT_EQ(out.exit_code, 1);
  EXPECT_NE(out.stdout_text.find("lend"), std::string::npos) << out.stdout_text;
  struct stat st;
  EXPECT_NE(::stat(("/run/tessera-swap/" + name).c_str(), &st), 0) << "state left behind";
}

TEST_F(SwapTest, RunPagerSwapRunsAProgramWithIdenticalOutput) {
  const std::string want = ExpectedDigest();
  ASSERT_FALSE(want.empty());
  testing::TempDir tmp;
  const std::string stats = tmp.path() + "/stats.json";
  const std::string live = tmp.path() + "/live";
  auto out = RunCommand({"/bin/sh", "-c",
                         "echo | " + BinDir() +
                             "/tessera run --pager swap --local-memory 40% "
                             "--swap-size 256M --stats-json " +
                             stats + " --live-stats-file " + live + " -- python3 " + kScript +
                             " " + std::to_string(kFillMiB)},
                        300000);
  ASSERT_EQ(out.exit_code, 0) << out.stdout_text;
  EXPECT_NE(out.stdout_text.find(want), std::string::npos) << out.stdout_text;
  const std::string j = testing::ReadFile(stats);
  EXPECT_GT(testing::JsonInt(j, "remote_writes"), 0) << j;
  EXPECT_EQ(testing::JsonInt(j, "store_data_loss"), 0) << j;
  EXPECT_GT(testing::JsonInt(j, "peak_footprint_bytes"), kFillMiB << 20) << j;
  EXPECT_LT(testing::JsonInt(j, "limit_bytes"), 0.45 * testing::JsonInt(j, "peak_footprint_bytes"))
      << j;
  EXPECT_EQ(testing::JsonInt(j, "store_server_failures"), 0) << j;
  // The live file's last rewrite, after the program: the summary's figures under the uffd
  // pager's names.
  std::map<std::string, int64_t> l;
  std::istringstream in(testing::ReadFile(live));
  std::string key;
  int64_t v;
  while (in >> key >> v) l[key] = v;
  EXPECT_EQ(l["final"], 1) << testing::ReadFile(live);
  EXPECT_EQ(l["remote_writes"], testing::JsonInt(j, "remote_writes"));
  EXPECT_EQ(l["faults"], testing::JsonInt(j, "faults"));
  EXPECT_EQ(l["store_data_loss"], 0);
  EXPECT_GT(l["elapsed_ns"], 0);
}

// The swap path in a failure-injection experiment: the built-in `kill-during-swap` scenario at
// its quick size, r = 2 of 8 memservers SIGKILLed at the program's half-way line.
TEST_F(SwapTest, ExperimentKillDuringSwapPasses) {
  testing::TempDir tmp;
  const std::string dir = tmp.path() + "/out";
  auto out = RunAll({BinDir() + "/tessera-experiment", "run", "kill-during-swap", "--quick",
                     "--progress=false", "--out", dir},
                    300000);
  EXPECT_EQ(out.exit_code, 0) << out.stdout_text;
  auto j = nlohmann::json::parse(testing::ReadFile(dir + "/summary.json"), nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << "no summary.json; output:\n" << out.stdout_text;
  EXPECT_EQ(j["verdict"], "PASS") << out.stdout_text;
  EXPECT_EQ(j["workload"]["kind"], "swap");
  for (const auto& e : j["expectations"]) EXPECT_EQ(e["pass"], true) << e.dump();
  ASSERT_EQ(j["runs"].size(), 1u);
  EXPECT_EQ(j["runs"][0]["server_failures"], 2) << "the swap device saw other failures";
  EXPECT_EQ(j["runs"][0]["data_loss"], 0);
}

}  // namespace
}  // namespace tessera
