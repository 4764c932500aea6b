#include "common/subprocess.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

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

}  // namespace
}  // namespace tessera
