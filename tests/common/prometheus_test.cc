// PrometheusWriter (common/prometheus.h): the text every metrics endpoint serves.
#include "common/prometheus.h"

#include <gtest/gtest.h>

#include <string>

namespace tessera {
namespace {

TEST(Prometheus, CountersGaugesAndRatiosCarryTheWritersLabels) {
  PrometheusWriter w("store=\"a\"");
  w.Counter("x_total", "Things.", 18446744073709551615ull);
  w.Gauge("bytes", "Bytes.", 68719476736.0);
  w.Ratio("share_ratio", "A share.", 1, 4);
  w.Ratio("empty_ratio", "Nothing yet.", 0, 0);
  EXPECT_EQ(w.str(),
            "# HELP x_total Things.\n# TYPE x_total counter\n"
            "x_total{store=\"a\"} 18446744073709551615\n"
            "# HELP bytes Bytes.\n# TYPE bytes gauge\nbytes{store=\"a\"} 68719476736\n"
            "# HELP share_ratio A share.\n# TYPE share_ratio gauge\nshare_ratio{store=\"a\"} 0.25\n"
            "# HELP empty_ratio Nothing yet.\n# TYPE empty_ratio gauge\n"
            "empty_ratio{store=\"a\"} 0\n");
}

TEST(Prometheus, LabelValuesAreEscaped) {
  EXPECT_EQ(PrometheusLabel("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
  PrometheusWriter w;
  w.Header("m", "gauge", "M.");
  w.Sample("m", 2, "op=\"" + PrometheusLabel("x\"y") + "\"");
  EXPECT_EQ(w.str(), "# HELP m M.\n# TYPE m gauge\nm{op=\"x\\\"y\"} 2\n");
}

TEST(Prometheus, LatencyHistogramIsCumulativeWithSumAndCount) {
  LatencyHistogram h;
  h.Record(5'000);          // 5 us: under the first bound (10 us).
  h.Record(30'000);         // 30 us: under 50 us.
  h.Record(30'000);
  h.Record(2'000'000);      // 2 ms: under 2.5 ms.
  h.Record(20'000'000'000);  // 20 s: only +Inf.
  PrometheusWriter w("store=\"s\"");
  w.LatencyHistogramSeconds("lat_seconds", "Latency.", h);
  const std::string t = w.str();
  EXPECT_NE(t.find("# TYPE lat_seconds histogram\n"), std::string::npos) << t;
  EXPECT_NE(t.find("lat_seconds_bucket{store=\"s\",le=\"1e-05\"} 1\n"), std::string::npos) << t;
  EXPECT_NE(t.find("lat_seconds_bucket{store=\"s\",le=\"2.5e-05\"} 1\n"), std::string::npos);
  EXPECT_NE(t.find("lat_seconds_bucket{store=\"s\",le=\"5e-05\"} 3\n"), std::string::npos);
  EXPECT_NE(t.find("lat_seconds_bucket{store=\"s\",le=\"0.001\"} 3\n"), std::string::npos);
  EXPECT_NE(t.find("lat_seconds_bucket{store=\"s\",le=\"0.0025\"} 4\n"), std::string::npos);
  EXPECT_NE(t.find("lat_seconds_bucket{store=\"s\",le=\"10\"} 4\n"), std::string::npos);
  EXPECT_NE(t.find("lat_seconds_bucket{store=\"s\",le=\"+Inf\"} 5\n"), std::string::npos);
  EXPECT_NE(t.find("lat_seconds_sum{store=\"s\"} 20.002065\n"), std::string::npos) << t;
  EXPECT_NE(t.find("lat_seconds_count{store=\"s\"} 5\n"), std::string::npos);
  EXPECT_EQ(t.find("quantile"), std::string::npos);
}

TEST(Prometheus, AnEmptyHistogramHasEveryBucketAtZero) {
  PrometheusWriter w;
  w.LatencyHistogramSeconds("lat_seconds", "Latency.", LatencyHistogram());
  const std::string t = w.str();
  EXPECT_NE(t.find("lat_seconds_bucket{le=\"1e-05\"} 0\n"), std::string::npos) << t;
  EXPECT_NE(t.find("lat_seconds_bucket{le=\"+Inf\"} 0\n"), std::string::npos);
  EXPECT_NE(t.find("lat_seconds_sum 0\nlat_seconds_count 0\n"), std::string::npos);
}

TEST(Prometheus, BuildInfoNamesComponentVersionCommitAndFeatures) {
  EXPECT_EQ(PrometheusBuildInfo("nbd", "0.1.0", "abc", "tcp-io_uring etcd"),
            "# HELP tessera_build_info Always 1: the component, version, commit and enabled "
            "features of this build.\n# TYPE tessera_build_info gauge\n"
            "tessera_build_info{component=\"nbd\",version=\"0.1.0\",commit=\"abc\","
            "features=\"tcp-io_uring etcd\"} 1\n");
}

}  // namespace
}  // namespace tessera
