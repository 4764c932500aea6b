// `tessera bench nbd --quick`: runs end to end (memservers, tessera nbd, nbdkit, the libnbd
// driver, a SIGKILLed memserver) and prints every workload for both targets with no wrong byte.
#include <gtest/gtest.h>

#include <string>

#include "tests/support/test_util.h"

namespace tessera {
namespace {

TEST(BenchNbdTest, QuickRunReportsBothTargetsAndTheVerdict) {
  if (testing::RunCommand({"sh", "-c", "command -v nbdkit && /usr/bin/python3 -c 'import nbd'"},
                          30000)
          .exit_code != 0) {
    GTEST_SKIP() << "nbdkit or python3-libnbd missing (scripts/setup.sh installs them)";
  }
  auto o = testing::RunTessera({"bench", "nbd", "--quick", "--k", "2", "--r", "1", "--json"}, 300000);
  ASSERT_EQ(o.exit_code, 0) << o.stdout_text;
  const std::string& t = o.stdout_text;
  for (const char* target : {"\"tessera\"", "\"file(nbdkit)\""}) {
    for (const char* w : {"seq-read-4k", "seq-write-4k", "rand-read-4k", "rand-write-4k"}) {
      for (const char* sc : {"healthy", "1-killed"}) {
        const std::string needle = std::string("\"scenario\": \"") + sc + "\", \"target\": " +
                                   target + ", \"workload\": \"" + w + "\"";
        EXPECT_NE(t.find(needle), std::string::npos) << "missing " << needle << " in\n" << t;
      }
    }
  }
  auto count = [&](const std::string& needle) {
    size_t n = 0;
    for (size_t p = t.find(needle); p != std::string::npos; p = t.find(needle, p + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count("\"mismatches\": "), 32u) << t;  // 2 scenarios x 2 targets x 4 x 2 QDs.
  EXPECT_EQ(count("\"mismatches\": 0}"), 32u) << "wrong bytes read back:\n" << t;
  EXPECT_NE(t.find("\"metric\": \"rand-read-4k p50 QD1\""), std::string::npos) << t;
  EXPECT_TRUE(t.find("\"verdict\": \"PASS\"") != std::string::npos ||
              t.find("\"verdict\": \"MISS\"") != std::string::npos)
      << t;
}

}  // namespace
}  // namespace tessera
