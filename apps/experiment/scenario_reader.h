// The scenario parser's reader of TOML tables: typed values with ranges and choices, and
// errors that name the file and line. Internal to apps/experiment/: the scenario parser
// (scenario.cc, scenario_workload.cc).
//
// Threads: a Reader is used by one thread.
#pragma once

#include <toml++/toml.h>

#include <cmath>
#include <initializer_list>
#include <optional>
#include <sstream>
#include <string>

#include "common/status.h"
#include "common/units.h"

namespace tessera::experiment {

// toml++ throws toml::parse_error on a syntax error (Debian builds it with exceptions);
// ParseScenario catches it, so it never leaves the parser. Everything after parsing works on
// the node tree, through a Reader.
class Reader {
 public:
  explicit Reader(std::string origin) : origin_(std::move(origin)) {}

  Status Error(const toml::source_region& where, const std::string& msg) const {
    return InvalidArgument(origin_, ":", where.begin.line, ": ", msg);
  }
  Status Error(int line, const std::string& msg) const {
    return InvalidArgument(origin_, ":", line, ": ", msg);
  }

  // Every key of `t` must be in `allowed`.
  Status Keys(const toml::table& t, const std::string& where,
              std::initializer_list<const char*> allowed) const {
    for (const auto& [key, node] : t) {
      bool ok = false;
      for (const char* a : allowed) ok = ok || key.str() == a;
      if (!ok) {
        std::string list;
        for (const char* a : allowed) list += std::string(list.empty() ? "" : ", ") + a;
        return Error(key.source(), "unknown key '" + std::string(key.str()) + "' in " + where +
                                       " (known keys: " + list + ")");
      }
    }
    return Status::Ok();
  }

  Result<std::optional<int64_t>> Int(const toml::table& t, const char* key, int64_t lo,
                                     int64_t hi) const {
    const toml::node* n = t.get(key);
    if (n == nullptr) return std::optional<int64_t>();
    auto v = n->value_exact<int64_t>();
    if (!v) return Error(n->source(), std::string(key) + " must be an integer");
    if (*v < lo || *v > hi) {
      return Error(n->source(), std::string(key) + " must be in [" + std::to_string(lo) + ", " +
                                    std::to_string(hi) + "], got " + std::to_string(*v));
    }
    return std::optional<int64_t>(*v);
  }
  Result<std::optional<double>> Num(const toml::table& t, const char* key, double lo,
                                    double hi) const {
    const toml::node* n = t.get(key);
    if (n == nullptr) return std::optional<double>();
    std::optional<double> v;
    if (auto i = n->value_exact<int64_t>()) v = static_cast<double>(*i);
    if (auto d = n->value_exact<double>()) v = *d;
    if (!v || !std::isfinite(*v)) return Error(n->source(), std::string(key) + " must be a number");
    if (*v < lo || *v > hi) {
      std::ostringstream o;
      o << key << " must be in [" << lo << ", " << hi << "], got " << *v;
      return Error(n->source(), o.str());
    }
    return v;
  }
  Result<std::optional<std::string>> Str(const toml::table& t, const char* key,
                                         std::initializer_list<const char*> choices = {}) const {
    const toml::node* n = t.get(key);
    if (n == nullptr) return std::optional<std::string>();
    auto v = n->value_exact<std::string>();
    if (!v) return Error(n->source(), std::string(key) + " must be a string");
    if (choices.size() > 0) {
      bool ok = false;
      std::string list;
      for (const char* c : choices) {
        ok = ok || *v == c;
        list += std::string(list.empty() ? "" : ", ") + c;
      }
      if (!ok) {
        return Error(n->source(),
                     std::string(key) + " must be one of " + list + ", got '" + *v + "'");
      }
    }
    return v;
  }
  Result<std::optional<bool>> Bool(const toml::table& t, const char* key) const {
    const toml::node* n = t.get(key);
    if (n == nullptr) return std::optional<bool>();
    auto v = n->value_exact<bool>();
    if (!v) return Error(n->source(), std::string(key) + " must be true or false");
    return v;
  }
  Result<const toml::table*> Table(const toml::table& t, const char* key) const {
    const toml::node* n = t.get(key);
    if (n == nullptr) return static_cast<const toml::table*>(nullptr);
    if (!n->is_table()) return Error(n->source(), std::string("[") + key + "] must be a table");
    return n->as_table();
  }
  int Line(const toml::table& t, const char* key) const {
    const toml::node* n = t.get(key);
    return n ? static_cast<int>(n->source().begin.line) : 0;
  }

  const std::string& origin() const { return origin_; }

 private:
  std::string origin_;
};

// One grammar for sizes and durations across Tessera (common/units.h).
inline bool IsSize(const std::string& s) { return ParseSize(s).ok(); }
inline bool IsDuration(const std::string& s) { return ParseDurationNs(s).ok(); }

#define TRY_ASSIGN(lhs, expr)         \
  do {                                \
    auto _r = (expr);                 \
    if (!_r.ok()) return _r.status(); \
    if (_r->has_value()) lhs = **_r;  \
  } while (0)

}  // namespace tessera::experiment
