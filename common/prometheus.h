// Prometheus text exposition (format 0.0.4) for every metrics endpoint of Tessera: the memory
// server's and the clients' (tessera nbd, tessera swap, tessera paramsvc serve) are written
// with this one writer, so names, label escaping, histogram buckets and build info agree.
//
// Latencies are histograms (never summaries, which cannot be aggregated across servers):
// cumulative buckets at fixed bounds from 10 us to 10 s, `_sum` and `_count`, made from the
// log-linear buckets of a LatencyHistogram (a bucket is counted under a bound when the bound
// lies in it or above it, so a count may include values up to 0.8% above its bound).
// Ratios are gauges in 0..1.
//
// Threads: a PrometheusWriter belongs to one thread; the functions are pure.
#pragma once

#include <cstdint>
#include <functional>
#include <sstream>
#include <string>
#include <string_view>

#include "common/histogram.h"

namespace tessera {

class PrometheusWriter {
 public:
  // `labels` (`store="x"`, already escaped; may be empty) go on every sample.
  explicit PrometheusWriter(std::string labels = "") : labels_(std::move(labels)) {}

  // `# HELP` and `# TYPE` of a metric; then Sample() once per label set.
  void Header(std::string_view name, std::string_view type, std::string_view help);
  // `extra` labels (`op="read"`, escaped) beside the writer's own.
  void Sample(std::string_view name, double value, std::string_view extra = "");

  void Counter(std::string_view name, std::string_view help, uint64_t value);
  void Gauge(std::string_view name, std::string_view help, double value);
  // A ratio in 0..1: part / whole, 0 when whole is 0.
  void Ratio(std::string_view name, std::string_view help, uint64_t part, uint64_t whole);
  // A latency histogram in seconds from nanosecond buckets: bucket(b) is the count of
  // LatencyHistogram bucket b; sum_ns the sum of the values. `_count` is the buckets' total.
  void LatencyHistogramSeconds(std::string_view name, std::string_view help,
                               const std::function<uint64_t(int)>& bucket, uint64_t sum_ns);
  void LatencyHistogramSeconds(std::string_view name, std::string_view help,
                               const LatencyHistogram& h);

  std::string str() const { return out_.str(); }

 private:
  void Labels(std::string_view extra);
  std::string labels_;
  std::ostringstream out_;
};

// A label value with backslash, double quote and newline escaped.
std::string PrometheusLabel(std::string_view value);

// `tessera_build_info{component,version,commit,features} 1`, with HELP and TYPE: which build
// a process runs. Every Tessera metrics endpoint serves it.
std::string PrometheusBuildInfo(std::string_view component, std::string_view version,
                                std::string_view commit, std::string_view features);

}  // namespace tessera
