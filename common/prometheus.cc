#include "common/prometheus.h"

#include <cmath>
#include <cstdio>

namespace tessera {
namespace {

// Upper bounds of the latency histograms, in seconds: 10 us .. 10 s.
constexpr double kBoundsS[] = {10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3,
                               5e-3,  10e-3, 25e-3, 50e-3,  100e-3, 250e-3, 1.0,  10.0};

// Whole numbers exactly (byte gauges exceed 9 digits), others to 9 significant digits.
std::string Num(double v) {
  char b[64];
  if (v == std::floor(v) && std::fabs(v) < 9007199254740992.0) {
    std::snprintf(b, sizeof(b), "%.0f", v);
  } else {
    std::snprintf(b, sizeof(b), "%.9g", v);
  }
  return b;
}

}  // namespace

std::string PrometheusLabel(std::string_view value) {
  std::string out;
  for (char c : value) {
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    if (c == '\\' || c == '"') out += '\\';
    out += c;
  }
  return out;
}

void PrometheusWriter::Header(std::string_view name, std::string_view type,
                              std::string_view help) {
  out_ << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n";
}

void PrometheusWriter::Labels(std::string_view extra) {
  if (labels_.empty() && extra.empty()) return;
  out_ << "{" << labels_ << (labels_.empty() || extra.empty() ? "" : ",") << extra << "}";
}

void PrometheusWriter::Sample(std::string_view name, double value, std::string_view extra) {
  out_ << name;
  Labels(extra);
  out_ << " " << Num(value) << "\n";
}

void PrometheusWriter::Counter(std::string_view name, std::string_view help, uint64_t value) {
  Header(name, "counter", help);
  out_ << name;
  Labels("");
  out_ << " " << value << "\n";  // Exact: a double would round counters above 2^53.
}

void PrometheusWriter::Gauge(std::string_view name, std::string_view help, double value) {
  Header(name, "gauge", help);
  Sample(name, value);
}

void PrometheusWriter::Ratio(std::string_view name, std::string_view help, uint64_t part,
                             uint64_t whole) {
  Gauge(name, help, whole ? static_cast<double>(part) / static_cast<double>(whole) : 0.0);
}

void PrometheusWriter::LatencyHistogramSeconds(std::string_view name, std::string_view help,
                                               const std::function<uint64_t(int)>& bucket,
                                               uint64_t sum_ns) {
  Header(name, "histogram", help);
  const std::string bucket_name = std::string(name) + "_bucket";
  uint64_t cumulative = 0;
  int b = 0;
  for (double bound : kBoundsS) {
    const int last = LatencyHistogram::BucketOf(static_cast<uint64_t>(std::llround(bound * 1e9)));
    for (; b <= last; ++b) cumulative += bucket(b);
    out_ << bucket_name;
    Labels("le=\"" + Num(bound) + "\"");
    out_ << " " << cumulative << "\n";
  }
  for (; b < LatencyHistogram::kBuckets; ++b) cumulative += bucket(b);
  out_ << bucket_name;
  Labels("le=\"+Inf\"");
  out_ << " " << cumulative << "\n";
  Sample(std::string(name) + "_sum", static_cast<double>(sum_ns) / 1e9);
  out_ << name << "_count";
  Labels("");
  out_ << " " << cumulative << "\n";
}

void PrometheusWriter::LatencyHistogramSeconds(std::string_view name, std::string_view help,
                                               const LatencyHistogram& h) {
  LatencyHistogramSeconds(name, help, [&h](int b) { return h.bucket_count(b); }, h.sum());
}

std::string PrometheusBuildInfo(std::string_view component, std::string_view version,
                                std::string_view commit, std::string_view features) {
  PrometheusWriter w;
  w.Header("tessera_build_info", "gauge",
           "Always 1: the component, version, commit and enabled features of this build.");
  w.Sample("tessera_build_info", 1,
           "component=\"" + PrometheusLabel(component) + "\",version=\"" +
               PrometheusLabel(version) + "\",commit=\"" + PrometheusLabel(commit) +
               "\",features=\"" + PrometheusLabel(features) + "\"");
  return w.str();
}

}  // namespace tessera
