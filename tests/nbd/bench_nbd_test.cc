// `tessera bench nbd --quick --direct_reads both`: runs end to end (memservers, two tessera nbd
// exports with and without run-to-completion READs, nbdkit, the libnbd driver, a SIGKILLed
// memserver) and prints every workload for every target with no wrong byte, and the
// direct/nodirect ratios.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "tests/support/test_util.h"

namespace tessera {
namespace {

TEST(BenchNbdTest, QuickRunReportsEveryTargetTheVerdictAndDirectReadRatios) {
  if (testing::RunCommand({"sh", "-c", "command -v nbdkit && /usr/bin/python3 -c 'import nbd'"},
                          30000)
          .exit_code != 0) {
    GTEST_SKIP() << "nbdkit or python3-libnbd missing (scripts/setup.sh installs them)";
  }
  auto o = testing::RunTessera({"bench", "nbd", "--quick", "--k", "2", "--r", "1", "--direct_reads", "both", "--json"}, 300000);
  ASSERT_EQ(o.exit_code, 0) << o.stdout_text;
  const std::string& t = o.stdout_text;
  const auto rows = testing::JsonLines(t);
  for (const char* target : {"tessera", "tessera(nodirect)", "file(nbdkit)"}) {
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
  size_t direct_rows = 0;
  for (const auto& j : rows) {
    if (j.contains("mismatches")) {
      ++with_mismatches;
      if (j["mismatches"] == 0) ++clean;
    }
    metric |= j.value("metric", "") == "rand-read-4k p50 QD1";
    if (j.value("suite", "") == "nbd-direct") {
      ++direct_rows;
      EXPECT_GT(j.value("p50_ratio", 0.0), 0.0) << j.dump();
      EXPECT_GT(j.value("ops_ratio", 0.0), 0.0) << j.dump();
    }
    const std::string v = j.value("verdict", "");
    verdict |= v == "PASS" || v == "MISS";
  }
  EXPECT_EQ(with_mismatches, 48u) << t;  // 2 scenarios x 3 targets x 4 x 2 QDs.
  EXPECT_EQ(clean, 48u) << "wrong bytes read back:\n" << t;
  EXPECT_EQ(direct_rows, 8u) << t;  // 2 scenarios x 2 reads x 2 QDs.
  EXPECT_TRUE(metric) << t;
  EXPECT_TRUE(verdict) << t;
}

}  // namespace
}  // namespace tessera
