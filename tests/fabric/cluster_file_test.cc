#include "fabric/cluster_file.h"

#include <gtest/gtest.h>

namespace tessera::fabric {
namespace {

TEST(ClusterFileTest, ParsesServersRacksCommentsAndBlankLines) {
  auto m = ParseClusterFile(
      "# three servers\n"
      "\n"
      "10.0.0.1:7700 rack=r1\n"
      "  host-b.example:7701   # no rack\n"
      "[::1]:7702 rack=r_2.x\n");
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->size(), 3u);
  EXPECT_EQ((*m)[0].endpoint.host, "10.0.0.1");
  EXPECT_EQ((*m)[0].endpoint.port, 7700);
  EXPECT_EQ((*m)[0].rack, "r1");
  EXPECT_EQ((*m)[0].line, 3);
  EXPECT_EQ((*m)[1].endpoint.host, "host-b.example");
  EXPECT_EQ((*m)[1].rack, "");
  EXPECT_EQ((*m)[2].endpoint.host, "::1");
  EXPECT_EQ((*m)[2].endpoint.ToString(), "[::1]:7702");
}

void ExpectError(const std::string& text, const std::string& needle) {
  auto m = ParseClusterFile(text, "c.txt");
  ASSERT_FALSE(m.ok()) << "accepted: " << text;
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find(needle), std::string::npos) << m.status();
}

TEST(ClusterFileTest, RejectsBadLinesWithLineNumbers) {
  ExpectError("a:1\nb\n", "c.txt:2: ");
  ExpectError("a:0\n", "port");
  ExpectError("a:65536\n", "port");
  ExpectError("a:12x\n", "port");
  ExpectError(":5\n", "empty host");
  ExpectError("a:1 zone=x\n", "unknown attribute");
  ExpectError("a:1 rack=\n", "bad rack");
  ExpectError("a:1 rack=a/b\n", "bad rack");
  ExpectError("a:1 rack=x extra\n", "words");
  ExpectError("a:1\n# c\na:1\n", "c.txt:3: duplicate");
  ExpectError("::1:5\n", "IPv6");
  ExpectError("[::1\n", "']'");
}

TEST(ClusterFileTest, EmptyFileParsesToNothingButLoadRefuses) {
  auto m = ParseClusterFile("# nothing\n\n");
  ASSERT_TRUE(m.ok());
  EXPECT_TRUE(m->empty());
  EXPECT_EQ(LoadClusterFile("/nonexistent/cluster").status().code(), StatusCode::kNotFound);
}

TEST(EndpointTest, ParseAndTransportKinds) {
  EXPECT_EQ(ParseEndpoint("127.0.0.1:80")->port, 80);
  EXPECT_FALSE(ParseEndpoint("127.0.0.1").ok());
  EXPECT_FALSE(ParseEndpoint("").ok());
  EXPECT_EQ(*ParseTransportKind("tcp"), TransportKind::kTcp);
  EXPECT_EQ(*ParseTransportKind("auto"), TransportKind::kAuto);
  EXPECT_FALSE(ParseTransportKind("udp").ok());
}

}  // namespace
}  // namespace tessera::fabric
