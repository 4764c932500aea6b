// Smoke test of `tessera bench fabric --quick`: real memserver and memcached processes, every
// row present and sane. No timing assertions (speed targets are the bench's job).
#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/test_util.h"

namespace tessera {
namespace {

double Field(const std::string& line, const std::string& name) {
  std::string key = "\"" + name + "\":";
  size_t at = line.find(key);
  if (at == std::string::npos) return -1;
  return std::stod(line.substr(at + key.size()));
}

TEST(BenchFabricTest, QuickRunReportsEveryPointForBothSystems) {
  auto r = testing::RunTessera({"bench", "fabric", "--quick", "--json"}, 180000);
  ASSERT_EQ(r.exit_code, 0) << r.stdout_text;
  std::istringstream in(r.stdout_text);
  std::string line;
  int tessera_rows = 0, memcached_rows = 0, targets = 0;
  while (std::getline(in, line)) {
    // Compare without whitespace ({"suite": "fabric", ...} -> {"suite":"fabric",...}).
    line.erase(std::remove(line.begin(), line.end(), ' '), line.end());
    if (line.find("\"suite\":\"fabric\"") != std::string::npos) {
      EXPECT_GT(Field(line, "ops_per_s"), 0) << line;
      EXPECT_GT(Field(line, "p50_us"), 0) << line;
      EXPECT_GE(Field(line, "p99_us"), Field(line, "p50_us")) << line;
      if (line.find("\"system\":\"memcached\"") != std::string::npos) {
        memcached_rows++;
      } else if (line.find("\"system\":\"tessera-") != std::string::npos) {
        tessera_rows++;
      }
    } else if (line.find("\"suite\":\"fabric-target\"") != std::string::npos) {
      EXPECT_TRUE(line.find("PASS") != std::string::npos || line.find("MISS") != std::string::npos)
          << line;
      targets++;
    }
  }
  // --quick: 4096 B x {read,write} x QD {1,8} x servers {1,2}.
  EXPECT_EQ(tessera_rows, 8) << r.stdout_text;
  EXPECT_EQ(memcached_rows, 8) << r.stdout_text;
  EXPECT_EQ(targets, 2) << r.stdout_text;
}

TEST(BenchFabricTest, BadFlagsAreUsageErrors) {
  EXPECT_EQ(testing::RunTessera({"bench", "fabric", "--qds", "0"}).exit_code, 2);
  EXPECT_EQ(testing::RunTessera({"bench", "fabric", "--transport", "udp"}).exit_code, 2);
  EXPECT_EQ(testing::RunTessera({"bench", "fabric", "--no_such_flag"}).exit_code, 2);
}

}  // namespace
}  // namespace tessera
