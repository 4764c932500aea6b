#include "common/report.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tessera {
namespace {

std::string Capture(bool json, void (*fill)(Report&)) {
  char* buf = nullptr;
  size_t len = 0;
  FILE* f = open_memstream(&buf, &len);
  {
    Report r(json, f);
    fill(r);
  }
  std::fclose(f);
  std::string out(buf, len);
  free(buf);
  return out;
}

void Fill(Report& r) {
  r.Add(Report::Row().Set("suite", "coding").Set("scheme", "RS(8,2)").Set("ns_per_page", 312.25));
  r.Add(Report::Row().Set("suite", "coding").Set("scheme", "rep\"3").Set("gbps", 12.5).Set("n", 3));
}

TEST(ReportTest, JsonLines) {
  std::string out = Capture(true, Fill);
  std::vector<nlohmann::ordered_json> rows;
  size_t pos = 0;
  while (pos < out.size()) {
    const size_t nl = out.find('\n', pos);
    ASSERT_NE(nl, std::string::npos) << "every row ends its line: " << out;
    rows.push_back(nlohmann::ordered_json::parse(out.substr(pos, nl - pos), nullptr, false));
    pos = nl + 1;
  }
  ASSERT_EQ(rows.size(), 2u) << out;
  const auto want = nlohmann::ordered_json::parse(
      "{\"suite\": \"coding\", \"scheme\": \"RS(8,2)\", \"ns_per_page\": 312.25}");
  EXPECT_EQ(rows[0], want);
  EXPECT_EQ(rows[1]["scheme"], "rep\"3");  // Escaped on the way out, intact on the way in.
  EXPECT_EQ(rows[1]["n"], 3);
  // Columns keep the order in which they were set.
  std::vector<std::string> keys;
  for (const auto& [k, v] : rows[1].items()) keys.push_back(k);
  EXPECT_EQ(keys, (std::vector<std::string>{"suite", "scheme", "gbps", "n"}));
}

TEST(ReportTest, JsonKeepsUint64AndDoublesExactly) {
  const uint64_t big = (uint64_t{1} << 63) + 12345;  // Beyond int64.
  const double third = 1.0 / 3.0;                    // Needs 17 significant digits.
  Report::Row row;
  row.Set("big", big).Set("third", third).Set("neg", int64_t{-7}).Set("nan", std::nan(""));
  row.Set("ctl", std::string("a\x01b\nc"));
  auto j = nlohmann::json::parse(Report::ToJson(row));
  EXPECT_TRUE(j["big"].is_number_unsigned());
  EXPECT_EQ(j["big"].get<uint64_t>(), big);
  EXPECT_EQ(j["third"].get<double>(), third);
  EXPECT_EQ(j["neg"].get<int64_t>(), -7);
  EXPECT_TRUE(j["nan"].is_null());
  EXPECT_EQ(j["ctl"].get<std::string>(), "a\x01b\nc");
  // Invalid UTF-8 does not throw; it is replaced.
  Report::Row bad;
  bad.Set("s", std::string("\xff\xfe"));
  EXPECT_TRUE(nlohmann::json::parse(Report::ToJson(bad))["s"].is_string());
}

TEST(ReportTest, TableHasAllColumnsAligned) {
  std::string out = Capture(false, Fill);
  EXPECT_EQ(out,
            "suite   scheme   ns_per_page  gbps  n\n"
            "------  -------  -----------  ----  -\n"
            "coding  RS(8,2)  312.2        -     -\n"
            "coding  rep\"3    -            12.5  3\n");
}

}  // namespace
}  // namespace tessera
