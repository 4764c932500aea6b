#include "common/units.h"

#include <gtest/gtest.h>

namespace tessera {
namespace {

TEST(UnitsTest, ParsesSizes) {
  EXPECT_EQ(*ParseSize("4096"), 4096u);
  EXPECT_EQ(*ParseSize("64K"), 64u << 10);
  EXPECT_EQ(*ParseSize("16M"), 16u << 20);
  EXPECT_EQ(*ParseSize("16MiB"), 16u << 20);
  EXPECT_EQ(*ParseSize("1g"), 1ull << 30);
  EXPECT_EQ(*ParseSize("1GB"), 1ull << 30);
  EXPECT_EQ(*ParseSize("2T"), 2ull << 40);
  EXPECT_EQ(*ParseSize("512b"), 512u);
  EXPECT_EQ(*ParseSize("0"), 0u);
}

TEST(UnitsTest, RejectsBadSizes) {
  for (const char* bad : {"", "G", "1X", "1.5G", "-1", "1 G", "1GG", "1Bi", "16MiBs", " 1"}) {
    auto r = ParseSize(bad);
    EXPECT_FALSE(r.ok()) << bad;
  }
  EXPECT_EQ(ParseSize("99999999999999999999").status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(ParseSize("17000000000T").status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(ParseSize("1X").status().message().find("'1X'"), std::string::npos);
}

TEST(UnitsTest, ParsesDurations) {
  EXPECT_EQ(*ParseDurationNs("250ns"), 250u);
  EXPECT_EQ(*ParseDurationNs("200us"), 200000u);
  EXPECT_EQ(*ParseDurationNs("5ms"), 5000000u);
  EXPECT_EQ(*ParseDurationNs("2s"), 2000000000u);
  EXPECT_FALSE(ParseDurationNs("200").ok());  // A unit is required.
  EXPECT_EQ(*ParseDurationNs("2m"), 120000000000u);
  EXPECT_EQ(*ParseDurationNs("1h"), 3600000000000u);
  EXPECT_EQ(*ParseDurationNs("1.5s"), 1500000000u);
  EXPECT_EQ(*ParseDurationNs("0.25ms"), 250000u);
  EXPECT_EQ(*ParseDurationNs("1.5h"), 5400000000000u);
  EXPECT_FALSE(ParseDurationNs("1.5ns").ok());  // Finer than a nanosecond.
  EXPECT_FALSE(ParseDurationNs("1.s").ok());
  EXPECT_FALSE(ParseDurationNs("2d").ok());
  EXPECT_FALSE(ParseDurationNs("us").ok());
  EXPECT_EQ(ParseDurationNs("99999999999999999999s").status().code(), StatusCode::kOutOfRange);
}

TEST(UnitsTest, Formats) {
  EXPECT_EQ(FormatSize(512), "512 B");
  EXPECT_EQ(FormatSize(16u << 20), "16 MiB");
  EXPECT_EQ(FormatSize(3ull << 29), "1.5 GiB");
  EXPECT_EQ(FormatDurationNs(200000), "200us");
  EXPECT_EQ(FormatDurationNs(1500000), "1.5ms");
  EXPECT_EQ(FormatDurationNs(2000000000), "2s");
}

}  // namespace
}  // namespace tessera
