// The test watchdog (support/watchdog.cc): a test still running after TESSERA_TEST_WATCHDOG_S
// is named, the stacks of its threads are printed, and the process aborts, so that a hang in CI
// leaves the evidence of where it waits. A test that ends in time is left alone.
#include <gtest/gtest.h>

#include <string>

#include "tests/support/test_util.h"

namespace tessera::testing {
namespace {

// Runs a test executable with the watchdog set to `seconds`; its stdout and stderr.
CommandOutcome RunWithWatchdog(const std::string& exe, int seconds) {
  return RunCommand({"/bin/sh", "-c",
                     "TESSERA_TEST_WATCHDOG_S=" + std::to_string(seconds) + " exec '" + BinDir() +
                         "/" + exe + "' 2>&1"},
                    120000);
}

TEST(TestWatchdog, AHangingTestIsNamedWithItsStacksAndAborted) {
  const CommandOutcome out = RunWithWatchdog("support_watchdog_fixture", 1);
  const std::string& text = out.stdout_text;
  EXPECT_EQ(out.exit_code, -1) << "the hanging test was not ended by a signal:\n" << text;
  EXPECT_NE(text.find("watchdog: WatchdogFixture.WaitsForever has run for 1 s"),
            std::string::npos)
      << text;
  // gdb's backtrace names the waiting test's frame; without gdb, /proc's view of each thread.
  const bool gdb = text.find("WatchdogFixture_WaitsForever_Test::TestBody") != std::string::npos;
  const bool proc =
      text.find("no gdb here") != std::string::npos && text.find("wchan") != std::string::npos;
  EXPECT_TRUE(gdb || proc) << "no stacks:\n" << text;
  EXPECT_NE(text.find("watchdog: aborting WatchdogFixture.WaitsForever"), std::string::npos)
      << text;
}

TEST(TestWatchdog, ATestThatEndsInTimeIsLeftAlone) {
  const CommandOutcome out = RunWithWatchdog("support_status_matchers_test", 30);
  EXPECT_EQ(out.exit_code, 0) << out.stdout_text;
  EXPECT_EQ(out.stdout_text.find("watchdog:"), std::string::npos) << out.stdout_text;
}

}  // namespace
}  // namespace tessera::testing
