// Report: the output of every benchmark and simulator, as an aligned table or JSON lines
// (written with nlohmann-json: strings escaped per RFC 8259, doubles printed so they read back
// exactly, unsigned 64-bit values kept unsigned, non-finite doubles as null).
//
//   Report rep(json);
//   rep.Add(Report::Row().Set("suite", "coding").Set("scheme", "RS(8,2)").Set("ns_per_page", 312.5));
//   rep.Flush();   // prints the table (JSON rows are printed as they are added)
//
// Columns appear in the order they are first set. Not thread-safe.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace tessera {

class Report {
 public:
  using Value = std::variant<std::string, double, int64_t, uint64_t>;
  class Row {
   public:
    Row& Set(std::string key, std::string v) { return Put(std::move(key), Value(std::move(v))); }
    Row& Set(std::string key, const char* v) { return Put(std::move(key), Value(std::string(v))); }
    Row& Set(std::string key, double v) { return Put(std::move(key), Value(v)); }
    Row& Set(std::string key, int64_t v) { return Put(std::move(key), Value(v)); }
    Row& Set(std::string key, int v) { return Put(std::move(key), Value(int64_t{v})); }
    Row& Set(std::string key, uint64_t v) { return Put(std::move(key), Value(v)); }
    const std::vector<std::pair<std::string, Value>>& fields() const { return fields_; }

   private:
    Row& Put(std::string key, Value v);
    std::vector<std::pair<std::string, Value>> fields_;
  };

  // json: one JSON object per line on `out` as rows are added; else a table on Flush().
  explicit Report(bool json, FILE* out = stdout) : json_(json), out_(out) {}
  ~Report() { Flush(); }
  Report(const Report&) = delete;
  Report& operator=(const Report&) = delete;

  void Add(Row row);
  // Prints a heading line before the next table (ignored in JSON mode).
  void Title(std::string title);
  void Flush();

  // One JSON object, keys in column order, no newline.
  static std::string ToJson(const Row& row);
  static std::string Format(const Value& v);

 private:
  bool json_;
  FILE* out_;
  std::string title_;
  std::vector<Row> rows_;
};

// Median of a sample (the mean of the two middle values for even sizes); 0 for empty input.
double Median(std::vector<double> values);

}  // namespace tessera
