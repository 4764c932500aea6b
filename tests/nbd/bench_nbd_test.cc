// `tessera bench nbd --quick`: runs end to end (memservers, tessera nbd, nbdkit, the libnbd
// driver, a SIGKILLed memserver) and prints every workload for both targets with no wrong byte.
#include <gtest/gtest.h>

#include <algorithm>
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
  const auto rows = testing::JsonLines(t);
  for (const char* target : {"tessera", "file(nbdkit)"}) {
    for (const char* w : {"seq-read-4k", "seq-write-4k", "rand-read-4k", "rand-write-4k"}) {
      for (const char* sc : {"healthy", "1-killed"}) {
        const bool found = std::any_of(rows.begin(), rows.end(), [&](const auto& j) {
          return j.value("scenario", "") == sc && j.value("target", "") == target &&
                 j.value("workload", "") == w;
        });
        EXPECT_TRUE(found) << "missing " << sc << " / " << target << " / " << w << " in\n" << t;
      }
    }
  }
  size_t with_mismatches = 0, clean = 0;
  bool metric = false, verdict = false;
  for (const auto& j : rows) {
    if (j.contains("mismatches")) {
      ++with_mismatches;
      if (j["mismatches"] == 0) ++clean;
    }
    metric |= j.value("metric", "") == "rand-read-4k p50 QD1";
    const std::string v = j.value("verdict", "");
    verdict |= v == "PASS" || v == "MISS";
  }
  EXPECT_EQ(with_mismatches, 32u) << t;  // 2 scenarios x 2 targets x 4 x 2 QDs.
  EXPECT_EQ(clean, 32u) << "wrong bytes read back:\n" << t;
  EXPECT_TRUE(metric) << t;
  EXPECT_TRUE(verdict) << t;
}

}  // namespace
}  // namespace tessera
