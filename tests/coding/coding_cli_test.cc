// `tessera bench coding` and `tessera demo` as a user runs them: real processes, their JSON
// output parsed and checked for completeness and correctness figures (no timing assertions).
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "tests/support/test_util.h"

namespace tessera {
namespace {

using testing::RunTessera;

// A flat JSON object of string, number and null values, as common/report.h prints them.
using JsonObject = std::map<std::string, std::string>;

bool ParseString(const std::string& s, size_t* i, std::string* out) {
  if (*i >= s.size() || s[*i] != '"') return false;
  ++*i;
  out->clear();
  while (*i < s.size() && s[*i] != '"') {
    if (s[*i] == '\\') {
      if (++*i >= s.size()) return false;
      char c = s[*i];
      if (c == 'u') {
        if (*i + 4 >= s.size()) return false;
        *i += 4;
        out->push_back('?');
      } else {
        out->push_back(c == 'n' ? '\n' : c == 't' ? '\t' : c);
      }
    } else {
      out->push_back(s[*i]);
    }
    ++*i;
  }
  if (*i >= s.size()) return false;
  ++*i;
  return true;
}

void SkipSpace(const std::string& s, size_t* i) {
  while (*i < s.size() && s[*i] == ' ') ++*i;
}

// Parses one line; numbers are kept as their text. Returns false on malformed input.
bool ParseJsonLine(const std::string& s, JsonObject* obj) {
  size_t i = 0;
  SkipSpace(s, &i);
  if (i >= s.size() || s[i] != '{') return false;
  ++i;
  SkipSpace(s, &i);
  if (i < s.size() && s[i] == '}') return i + 1 == s.size();
  for (;;) {
    SkipSpace(s, &i);
    std::string key, value;
    if (!ParseString(s, &i, &key)) return false;
    SkipSpace(s, &i);
    if (i >= s.size() || s[i] != ':') return false;
    ++i;
    SkipSpace(s, &i);
    if (i < s.size() && s[i] == '"') {
      if (!ParseString(s, &i, &value)) return false;
    } else {
      size_t start = i;
      while (i < s.size() && s[i] != ',' && s[i] != '}') ++i;
      value = s.substr(start, i - start);
      while (!value.empty() && value.back() == ' ') value.pop_back();
      if (value != "null") {
        char* end = nullptr;
        std::strtod(value.c_str(), &end);
        if (value.empty() || *end != '\0') return false;
      }
    }
    (*obj)[key] = value;
    SkipSpace(s, &i);
    if (i >= s.size()) return false;
    if (s[i] == '}') return i + 1 == s.size();
    if (s[i] != ',') return false;
    ++i;
  }
}

std::vector<JsonObject> ParseLines(const std::string& text) {
  std::vector<JsonObject> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    JsonObject obj;
    EXPECT_TRUE(ParseJsonLine(line, &obj)) << "not a JSON object: " << line;
    out.push_back(std::move(obj));
  }
  return out;
}

double Num(const JsonObject& o, const std::string& key) {
  auto it = o.find(key);
  if (it == o.end()) {
    ADD_FAILURE() << "missing field " << key;
    return -1;
  }
  return std::strtod(it->second.c_str(), nullptr);
}

TEST(JsonLineTest, ParserAcceptsReportOutputAndRejectsGarbage) {
  JsonObject o;
  EXPECT_TRUE(ParseJsonLine(R"({"a": "x \"y\"", "b": 1.5e+03, "c": -2, "d": null})", &o));
  EXPECT_EQ(o["a"], "x \"y\"");
  EXPECT_EQ(o["b"], "1.5e+03");
  EXPECT_EQ(o["d"], "null");
  JsonObject bad;
  EXPECT_FALSE(ParseJsonLine(R"({"a": 1,)", &bad));
  EXPECT_FALSE(ParseJsonLine(R"({"a": abc})", &bad));
  EXPECT_FALSE(ParseJsonLine("RS(8,2)", &bad));
}

TEST(BenchCodingTest, QuickJsonHasEverySchemeAndOp) {
  auto o = RunTessera({"bench", "coding", "--quick", "--json"}, 120000);
  ASSERT_EQ(o.exit_code, 0) << o.stdout_text;
  auto rows = ParseLines(o.stdout_text);
  std::set<std::tuple<std::string, std::string, std::string>> seen;
  int checks = 0;
  for (const auto& r : rows) {
    ASSERT_EQ(r.count("suite"), 1u);
    EXPECT_EQ(r.at("suite"), "coding");
    if (r.count("check")) {
      ++checks;
      EXPECT_TRUE(r.at("result") == "PASS" || r.at("result") == "MISS") << r.at("result");
      EXPECT_GT(Num(r, "ratio"), 0.0) << r.at("check");
      continue;
    }
    seen.insert({r.at("scheme"), r.at("code"), r.at("op")});
    EXPECT_GT(Num(r, "ns_per_page"), 0.0) << r.at("scheme") << " " << r.at("op");
    EXPECT_GT(Num(r, "gbps"), 0.0);
    EXPECT_LE(Num(r, "p50_ns"), Num(r, "p99_ns"));
    EXPECT_EQ(Num(r, "pages"), 256);
  }
  EXPECT_EQ(checks, 4);
  for (std::string code : {"RS(8,2)", "RS(4,2)", "RS(8,3)"}) {
    for (std::string op :
         {"encode", "encode+crc", "reconstruct_1", "reconstruct_r", "reconstruct_r+crc"}) {
      EXPECT_TRUE(seen.count({"tessera", code, op})) << "tessera " << code << " " << op;
    }
    for (std::string scheme : {"isal", "jerasure"}) {
      for (std::string op : {"encode", "reconstruct_1", "reconstruct_r"}) {
        EXPECT_TRUE(seen.count({scheme, code, op})) << scheme << " " << code << " " << op;
      }
    }
  }
  for (std::string code : {"2-way", "3-way"}) {
    for (std::string op : {"encode", "reconstruct_1"}) {
      EXPECT_TRUE(seen.count({"replication", code, op})) << code << " " << op;
    }
  }
  EXPECT_EQ(seen.size(), 3u * 11u + 4u);
}

TEST(BenchCodingTest, BadFlagsAreUsageErrors) {
  EXPECT_EQ(RunTessera({"bench", "coding", "--reps", "0"}).exit_code, 2);
  EXPECT_EQ(RunTessera({"bench", "coding", "--pages", "1"}).exit_code, 2);
  EXPECT_EQ(RunTessera({"bench", "coding", "--no_such_flag"}).exit_code, 2);
}

void RunDemo(const std::vector<std::string>& extra, int pages) {
  std::vector<std::string> args = {"demo", "--json", "--pages", std::to_string(pages)};
  args.insert(args.end(), extra.begin(), extra.end());
  auto o = RunTessera(args, 60000);
  ASSERT_EQ(o.exit_code, 0) << o.stdout_text;
  auto rows = ParseLines(o.stdout_text);
  ASSERT_EQ(rows.size(), 1u) << o.stdout_text;
  const auto& r = rows[0];
  EXPECT_EQ(r.at("suite"), "demo");
  EXPECT_EQ(Num(r, "pages"), pages);
  EXPECT_EQ(Num(r, "bytes"), pages * 4096.0);
  EXPECT_EQ(Num(r, "mismatches"), 0);
  EXPECT_EQ(Num(r, "unrepairable_returned_ok"), 0);
  EXPECT_EQ(Num(r, "repairable_not_rebuilt"), 0);
  EXPECT_GT(Num(r, "corruptions_injected"), 0);
  EXPECT_EQ(Num(r, "corruptions_detected"), Num(r, "corruptions_injected"));
  EXPECT_EQ(Num(r, "pages_rebuilt") + Num(r, "unrepairable_reported"), pages);
  EXPECT_GT(Num(r, "splits_lost"), 0);
  EXPECT_GT(Num(r, "loss_patterns"), 1);
  EXPECT_GT(Num(r, "rebuild_p50_ns"), 0);
}

TEST(DemoTest, Rs8x2SmallRunRebuildsEveryRepairablePage) {
  RunDemo({"--corrupt_share", "0.2", "--beyond_share", "0.05"}, 400);
}

TEST(DemoTest, OtherCodes) {
  RunDemo({"--k", "4", "--r", "2", "--seed", "7", "--beyond_share", "0.05"}, 200);
  RunDemo({"--k", "16", "--r", "4", "--seed", "9", "--beyond_share", "0.05"}, 200);
  RunDemo({"--k", "32", "--r", "4", "--seed", "3", "--beyond_share", "0.05"}, 200);
}

TEST(DemoTest, BadFlagsAreUsageErrors) {
  EXPECT_EQ(RunTessera({"demo", "--k", "3"}).exit_code, 2);
  EXPECT_EQ(RunTessera({"demo", "--r", "5"}).exit_code, 2);
  EXPECT_EQ(RunTessera({"demo", "--pages", "0"}).exit_code, 2);
  EXPECT_EQ(RunTessera({"demo", "--corrupt_share", "1.5"}).exit_code, 2);
  EXPECT_EQ(RunTessera({"demo", "extra_argument"}).exit_code, 2);
}

}  // namespace
}  // namespace tessera
