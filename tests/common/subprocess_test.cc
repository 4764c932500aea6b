#include "common/subprocess.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace tessera {
namespace {

TEST(SubprocessTest, CapturesLinesAndExitCode) {
  auto p = Subprocess::Start({"/bin/sh", "-c", "echo hello; echo ready 42; exit 3"},
                             {.capture_stdout = true});
  ASSERT_TRUE(p.ok()) << p.status();
  auto line = p->WaitForLine("ready", Deadline::AfterMs(10000));
  ASSERT_TRUE(line.ok()) << line.status();
  EXPECT_EQ(*line, "ready 42");
  auto st = p->Wait(Deadline::AfterMs(10000));
  ASSERT_TRUE(st.ok()) << st.status();
  ASSERT_TRUE(WIFEXITED(*st));
  EXPECT_EQ(WEXITSTATUS(*st), 3);
}

TEST(SubprocessTest, ReadLineTimesOut) {
  auto p = Subprocess::Start({"/bin/sleep", "30"}, {.capture_stdout = true});
  ASSERT_TRUE(p.ok());
  auto line = p->ReadLine(Deadline::AfterMs(50));
  EXPECT_EQ(line.status().code(), StatusCode::kTimeout);
  auto st = p->Stop(2000);
  ASSERT_TRUE(st.ok());
  EXPECT_TRUE(WIFSIGNALED(*st));
  EXPECT_EQ(WTERMSIG(*st), SIGTERM);
}

TEST(SubprocessTest, MissingProgramExits127) {
  auto p = Subprocess::Start({"/nonexistent/program"}, {.quiet_stderr = true});
  ASSERT_TRUE(p.ok());
  auto st = p->Wait(Deadline::AfterMs(10000));
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(WEXITSTATUS(*st), 127);
}

TEST(SubprocessTest, DestructorKillsRunningChild) {
  pid_t pid;
  {
    auto p = Subprocess::Start({"/bin/sleep", "30"});
    ASSERT_TRUE(p.ok());
    pid = p->pid();
  }
  // Reaped by the destructor: the pid no longer names our child.
  EXPECT_EQ(::waitpid(pid, nullptr, WNOHANG), -1);
}

// The last CPU this process may use: the child is pinned to it alone.
TEST(SubprocessTest, PinsTheChildAndMergesStderr) {
  cpu_set_t set;
  ASSERT_EQ(::sched_getaffinity(0, sizeof set, &set), 0);
  int last = -1;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) last = c;
  }
  ASSERT_GE(last, 0);
  Subprocess::Options o;
  o.capture_stdout = true;
  o.stderr_to_stdout = true;
  o.cpus = {last};
  auto p = Subprocess::Start(
      {"/bin/sh", "-c", "grep Cpus_allowed_list /proc/self/status; echo to-stderr >&2"}, o);
  ASSERT_TRUE(p.ok()) << p.status();
  auto cpus = p->ReadLine(Deadline::AfterMs(10000));
  ASSERT_TRUE(cpus.ok()) << cpus.status();
  EXPECT_EQ(cpus->substr(cpus->find_last_of("\t ") + 1), std::to_string(last));
  auto err = p->ReadLine(Deadline::AfterMs(10000));
  ASSERT_TRUE(err.ok()) << err.status();
  EXPECT_EQ(*err, "to-stderr");
  ASSERT_TRUE(p->Wait(Deadline::AfterMs(10000)).ok());
}

TEST(SubprocessTest, RefusesABadCpuOrNamespace) {
  Subprocess::Options o;
  o.cpus = {-1};
  EXPECT_EQ(Subprocess::Start({"/bin/true"}, o).status().code(), StatusCode::kInvalidArgument);
  o.cpus = {};
  o.netns_path = "/nonexistent/netns";
  auto p = Subprocess::Start({"/bin/true"}, o);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("/nonexistent/netns"), std::string::npos) << p.status();
}

// share/tessera beside the executables: build/bin -> build/share/tessera, and PREFIX/libexec/
// tessera -> PREFIX/share/tessera once installed; nothing else is looked at.
TEST(SubprocessTest, DataPathFindsShareTesseraBuiltOrInstalled) {
  namespace fs = std::filesystem;
  char tmpl[] = "/tmp/tessera-datapath-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const fs::path root = fs::canonical(tmpl);
  fs::create_directories(root / "build/bin");
  fs::create_directories(root / "build/share/tessera/workloads");
  std::ofstream(root / "build/share/tessera/workloads/w.py") << "print(1)\n";
  fs::create_directories(root / "usr/libexec/tessera");
  fs::create_directories(root / "usr/share/tessera/examples");
  std::ofstream(root / "usr/share/tessera/examples/e.py") << "print(2)\n";

  EXPECT_EQ(DataPath("workloads/w.py", (root / "build/bin").string()),
            (root / "build/share/tessera/workloads/w.py").string());
  EXPECT_EQ(DataPath("workloads", (root / "build/bin").string()),
            (root / "build/share/tessera/workloads").string());
  EXPECT_EQ(DataPath("examples/e.py", (root / "usr/libexec/tessera").string()),
            (root / "usr/share/tessera/examples/e.py").string());
  EXPECT_EQ(DataPath("examples/e.py", (root / "build/bin").string()), "");
  EXPECT_EQ(DataPath("workloads/w.py", (root / "usr/libexec/tessera").string()), "");
  fs::remove_all(root);

  // This build lays its data out that way: the test runs from build/bin.
  EXPECT_NE(DataPath("workloads/workload.py"), "") << "beside " << SelfExeDir();
}

}  // namespace
}  // namespace tessera
