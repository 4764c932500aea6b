// `tessera bench pager --quick`: a smoke test of the whole bench.
#include <dirent.h>
#include <gtest/gtest.h>

#include <string>

#include "tests/support/test_util.h"

namespace tessera {
namespace {

bool LeftoverSwapfile() {
  DIR* d = opendir("/var/tmp");
  if (!d) return false;
  bool found = false;
  while (dirent* e = readdir(d)) {
    if (std::string(e->d_name).rfind("tessera-bench-swap-", 0) == 0) found = true;
  }
  closedir(d);
  return found;
}

TEST(PagerBenchTest, QuickRunsEverySection) {
  auto out = testing::RunTessera({"bench", "pager", "--quick"}, 150000);
  ASSERT_EQ(out.exit_code, 0) << out.stdout_text;
  const std::string& s = out.stdout_text;
  EXPECT_NE(s.find("raw PageStore::ReadPage"), std::string::npos) << s;
  EXPECT_NE(s.find("pager-workload"), std::string::npos) << s;
  EXPECT_NE(s.find("zipf, smart victims"), std::string::npos) << s;
  EXPECT_NE(s.find("pager-failure"), std::string::npos) << s;
  // Whatever the timings, the bytes are right everywhere.
  size_t at = s.find("checksums identical in every mode");
  ASSERT_NE(at, std::string::npos) << s;
  EXPECT_NE(s.substr(at, s.find('\n', at) - at).find("PASS"), std::string::npos) << s;
  EXPECT_EQ(s.find("MISMATCH"), std::string::npos) << s;
  EXPECT_FALSE(LeftoverSwapfile());
}

}  // namespace
}  // namespace tessera
