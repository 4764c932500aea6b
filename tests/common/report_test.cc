#include "common/report.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

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
  EXPECT_EQ(out,
            "{\"suite\": \"coding\", \"scheme\": \"RS(8,2)\", \"ns_per_page\": 312.25}\n"
            "{\"suite\": \"coding\", \"scheme\": \"rep\\\"3\", \"gbps\": 12.5, \"n\": 3}\n");
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
