// CpuLoad starts busy loops that really burn CPU and are gone after the scope; CpuQuota really
// throttles the processes put in it.
#include "tests/support/cpu_load.h"

#include <signal.h>

#include <cerrno>
#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "common/clock.h"
#include "tests/support/test_util.h"

namespace tessera::testing {
namespace {

// utime + stime of a process in clock ticks (/proc/PID/stat fields 14 and 15); -1 if gone.
long CpuTicks(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t paren = text.rfind(')');
  if (paren == std::string::npos) return -1;
  std::istringstream rest(text.substr(paren + 2));
  std::string field;
  long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14) utime = std::stol(field);
    if (i == 15) stime = std::stol(field);
  }
  return utime + stime;
}

// Polls (bounded) until every pid has used at least `ticks` of CPU.
bool AllBurned(const std::vector<pid_t>& pids, long ticks, int timeout_ms) {
  const Deadline d = Deadline::AfterMs(timeout_ms);
  while (!d.Expired()) {
    bool all = true;
    for (pid_t pid : pids) all = all && CpuTicks(pid) >= ticks;
    if (all) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // Poll interval.
  }
  return false;
}

TEST(CpuLoadTest, BusyLoopsBurnCpuUntilTheScopeEnds) {
  std::vector<pid_t> pids;
  {
    auto load = CpuLoad::Start(2);
    ASSERT_TRUE(load.ok()) << load.status();
    pids = (*load)->pids();
    ASSERT_EQ(pids.size(), 2u);
    EXPECT_EQ((*load)->Running(), 2);
    // 5 ticks (50 ms at USER_HZ 100) each: they spin rather than sleep.
    EXPECT_TRUE(AllBurned(pids, 5, 20000)) << "busy loops did not use CPU";
  }
  for (pid_t pid : pids) {
    EXPECT_EQ(::kill(pid, 0), -1) << "child " << pid << " outlived its CpuLoad";
    EXPECT_EQ(errno, ESRCH);
  }
}

TEST(CpuLoadTest, RejectsBadCounts) {
  EXPECT_FALSE(CpuLoad::Start(0).ok());
  EXPECT_FALSE(CpuLoad::Start(257).ok());
}

// cpu.stat's nr_throttled, -1 if unreadable.
long Throttled(const std::string& cgroup) {
  std::ifstream f(cgroup + "/cpu.stat");
  std::string key;
  long value = 0;
  while (f >> key >> value) {
    if (key == "nr_throttled") return value;
  }
  return -1;
}

TEST(CpuQuotaTest, ThrottlesTheProcessesAdded) {
  if (std::string why = CpuQuota::Unavailable(); !why.empty()) GTEST_SKIP() << why;
  std::string path;
  {
    auto quota = CpuQuota::Create(0.05);
    ASSERT_TRUE(quota.ok()) << quota.status();
    path = (*quota)->path();
    auto load = CpuLoad::Start(1);
    ASSERT_TRUE(load.ok()) << load.status();
    ASSERT_TRUE((*quota)->Add((*load)->pids()[0]).ok());
    // A busy loop limited to 5 ms per 100 ms period is throttled in every period.
    const Deadline d = Deadline::AfterMs(20000);
    while (Throttled(path) < 3 && !d.Expired()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));  // Poll interval.
    }
    EXPECT_GE(Throttled(path), 3) << "the quota never throttled the busy loop";
    EXPECT_FALSE((*quota)->SetCpus(0).ok());
  }
  EXPECT_NE(::access(path.c_str(), F_OK), 0) << path << " was not removed";
}

}  // namespace
}  // namespace tessera::testing
