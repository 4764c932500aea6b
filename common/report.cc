#include "common/report.h"

#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

namespace tessera {

Report::Row& Report::Row::Put(std::string key, Value v) {
  for (auto& [k, val] : fields_) {
    if (k == key) {
      val = std::move(v);
      return *this;
    }
  }
  fields_.emplace_back(std::move(key), std::move(v));
  return *this;
}

std::string Report::Format(const Value& v) {
  if (const auto* s = std::get_if<std::string>(&v)) return *s;
  if (const auto* i = std::get_if<int64_t>(&v)) return std::to_string(*i);
  if (const auto* u = std::get_if<uint64_t>(&v)) return std::to_string(*u);
  double d = std::get<double>(v);
  char buf[64];
  if (!std::isfinite(d)) return std::isnan(d) ? "nan" : (d > 0 ? "inf" : "-inf");
  double a = std::fabs(d);
  if (a != 0 && (a < 1e-3 || a >= 1e9)) {
    std::snprintf(buf, sizeof(buf), "%.3e", d);
  } else if (a >= 1000) {
    std::snprintf(buf, sizeof(buf), "%.0f", d);
  } else if (a >= 10) {
    std::snprintf(buf, sizeof(buf), "%.1f", d);
  } else {
    std::snprintf(buf, sizeof(buf), "%.3f", d);
  }
  return buf;
}

std::string Report::ToJson(const Row& row) {
  nlohmann::ordered_json obj = nlohmann::ordered_json::object();
  for (const auto& [k, v] : row.fields()) {
    if (const auto* s = std::get_if<std::string>(&v)) {
      obj[k] = *s;
    } else if (const auto* i = std::get_if<int64_t>(&v)) {
      obj[k] = *i;
    } else if (const auto* u = std::get_if<uint64_t>(&v)) {
      obj[k] = *u;
    } else {
      const double d = std::get<double>(v);
      if (std::isfinite(d)) {
        obj[k] = d;
      } else {
        obj[k] = nullptr;
      }
    }
  }
  // Invalid UTF-8 in a string is replaced (U+FFFD) instead of throwing.
  return obj.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

void Report::Title(std::string title) {
  if (json_) return;
  Flush();
  title_ = std::move(title);
}

void Report::Add(Row row) {
  if (json_) {
    std::fprintf(out_, "%s\n", ToJson(row).c_str());
    std::fflush(out_);
    return;
  }
  rows_.push_back(std::move(row));
}

void Report::Flush() {
  if (json_ || rows_.empty()) {
    if (!title_.empty() && !json_) std::fprintf(out_, "%s\n", title_.c_str());
    title_.clear();
    return;
  }
  std::vector<std::string> cols;
  for (const auto& r : rows_)
    for (const auto& [k, v] : r.fields())
      if (std::find(cols.begin(), cols.end(), k) == cols.end()) cols.push_back(k);
  std::vector<std::vector<std::string>> cells;
  std::vector<size_t> width(cols.size());
  for (size_t c = 0; c < cols.size(); ++c) width[c] = cols[c].size();
  for (const auto& r : rows_) {
    std::vector<std::string> line(cols.size(), "-");
    for (const auto& [k, v] : r.fields()) {
      size_t c = static_cast<size_t>(std::find(cols.begin(), cols.end(), k) - cols.begin());
      line[c] = Format(v);
    }
    for (size_t c = 0; c < cols.size(); ++c) width[c] = std::max(width[c], line[c].size());
    cells.push_back(std::move(line));
  }
  if (!title_.empty()) std::fprintf(out_, "\n%s\n", title_.c_str());
  auto print_line = [&](const std::vector<std::string>& l) {
    std::string s;
    for (size_t c = 0; c < l.size(); ++c) {
      if (c) s += "  ";
      s += l[c];
      if (c + 1 < l.size()) s.append(width[c] - l[c].size(), ' ');
    }
    std::fprintf(out_, "%s\n", s.c_str());
  };
  print_line(cols);
  std::vector<std::string> rule;
  for (size_t c = 0; c < cols.size(); ++c) rule.emplace_back(width[c], '-');
  print_line(rule);
  for (const auto& l : cells) print_line(l);
  std::fflush(out_);
  rows_.clear();
  title_.clear();
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  size_t n = v.size();
  std::nth_element(v.begin(), v.begin() + n / 2, v.end());
  double hi = v[n / 2];
  if (n % 2) return hi;
  double lo = *std::max_element(v.begin(), v.begin() + n / 2);
  return (lo + hi) / 2;
}

}  // namespace tessera
