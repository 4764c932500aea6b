// Smoke test of `tessera bench fabric --quick`: real memserver and memcached processes, every
// row present and sane. No timing assertions (speed targets are the bench's job).
#include <gtest/gtest.h>

#include <unistd.h>

#include <string>

#include "client/hosts.h"
#include "tests/support/test_util.h"

namespace tessera {
namespace {

TEST(BenchFabricTest, QuickRunReportsEveryPointForBothSystems) {
  auto r = testing::RunTessera({"bench", "fabric", "--quick", "--json"}, 180000);
  ASSERT_EQ(r.exit_code, 0) << r.stdout_text;
  int tessera_rows = 0, memcached_rows = 0;
  for (const auto& row : testing::JsonRows(r.stdout_text, "suite", "fabric")) {
    EXPECT_GT(row.value("ops_per_s", -1.0), 0) << row;
    EXPECT_GT(row.value("p50_us", -1.0), 0) << row;
    EXPECT_GE(row.value("p99_us", -1.0), row.value("p50_us", -1.0)) << row;
    const std::string system = row.value("system", "");
    if (system == "memcached") {
      memcached_rows++;
    } else if (system.rfind("tessera-", 0) == 0) {
      tessera_rows++;
    }
  }
  auto targets = testing::JsonRows(r.stdout_text, "suite", "fabric-target");
  for (const auto& t : targets) {
    const std::string result = t.value("result", "");
    EXPECT_TRUE(result == "PASS" || result == "MISS") << t;
  }
  // --quick: 4096 B x {read,write} x QD {1,8} x servers {1,2}.
  EXPECT_EQ(tessera_rows, 8) << r.stdout_text;
  EXPECT_EQ(memcached_rows, 8) << r.stdout_text;
  EXPECT_EQ(targets.size(), 2u) << r.stdout_text;
}

// --hosts netns --pin auto: memserver i and memcached i in namespace i, on the server CPUs;
// every row says which set-up it came from.
TEST(BenchFabricTest, NetnsHostsArePutInTheRows) {
  if (::geteuid() != 0) GTEST_SKIP() << "network namespaces need root";
  auto r = testing::RunTessera(
      {"bench", "fabric", "--quick", "--json", "--hosts", "netns", "--pin", "auto"}, 180000);
  ASSERT_EQ(r.exit_code, 0) << r.stdout_text;
  const std::string pin = client::FormatPin(client::AutoPin(client::AllowedCpus()));
  int rows = 0;
  for (const char* suite : {"fabric", "fabric-target"}) {
    for (const auto& row : testing::JsonRows(r.stdout_text, "suite", suite)) {
      ++rows;
      EXPECT_EQ(row.value("hosts", ""), "netns") << row;
      EXPECT_EQ(row.value("pin", ""), pin) << row;
      if (std::string(suite) == "fabric") {
        EXPECT_GT(row.value("ops_per_s", -1.0), 0) << row;
      }
    }
  }
  EXPECT_EQ(rows, 18) << r.stdout_text;  // As the loopback run above: 16 points, 2 targets.
}

TEST(BenchFabricTest, BadFlagsAreUsageErrors) {
  EXPECT_EQ(testing::RunTessera({"bench", "fabric", "--hosts", "veth"}).exit_code, 2);
  EXPECT_EQ(testing::RunTessera({"bench", "fabric", "--pin", "client:0-"}).exit_code, 2);
  EXPECT_EQ(testing::RunTessera({"bench", "fabric", "--qds", "0"}).exit_code, 2);
  EXPECT_EQ(testing::RunTessera({"bench", "fabric", "--transport", "udp"}).exit_code, 2);
  EXPECT_EQ(testing::RunTessera({"bench", "fabric", "--no_such_flag"}).exit_code, 2);
}

}  // namespace
}  // namespace tessera
