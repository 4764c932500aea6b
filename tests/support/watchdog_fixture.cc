// A test that never ends, for support_watchdog_test: run with TESSERA_TEST_WATCHDOG_S set, the
// watchdog linked into it must name it, print its threads' stacks and abort it. Not a ctest
// case.
#include <gtest/gtest.h>

#include <future>

TEST(WatchdogFixture, WaitsForever) {
  std::promise<void> never;
  never.get_future().wait();
}
