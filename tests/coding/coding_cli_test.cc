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

// Every non-empty line must be one JSON object (parsed with nlohmann-json).
std::vector<nlohmann::json> ParseLines(const std::string& text) {
  std::vector<nlohmann::json> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    nlohmann::json obj = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    EXPECT_TRUE(obj.is_object()) << "not a JSON object: " << line;
    if (obj.is_object()) out.push_back(std::move(obj));
  }
  return out;
}

double Num(const nlohmann::json& o, const std::string& key) {
  if (!o.contains(key) || !o.at(key).is_number()) {
    ADD_FAILURE() << "missing or non-numeric field " << key << " in " << o;
    return -1;
  }
  return o.at(key).get<double>();
}

std::string Str(const nlohmann::json& o, const std::string& key) {
  return o.contains(key) && o.at(key).is_string() ? o.at(key).get<std::string>() : "";
}

TEST(BenchCodingTest, QuickJsonHasEverySchemeAndOp) {
  auto o = RunTessera({"bench", "coding", "--quick", "--json"}, 120000);
  ASSERT_EQ(o.exit_code, 0) << o.stdout_text;
  auto rows = ParseLines(o.stdout_text);
  std::set<std::tuple<std::string, std::string, std::string>> seen;
  int checks = 0;
  for (const auto& r : rows) {
    ASSERT_TRUE(r.contains("suite")) << r;
    EXPECT_EQ(Str(r, "suite"), "coding");
    if (r.contains("check")) {
      ++checks;
      EXPECT_TRUE(Str(r, "result") == "PASS" || Str(r, "result") == "MISS") << r;
      EXPECT_GT(Num(r, "ratio"), 0.0) << r;
      continue;
    }
    seen.insert({Str(r, "scheme"), Str(r, "code"), Str(r, "op")});
    EXPECT_GT(Num(r, "ns_per_page"), 0.0) << r;
    EXPECT_GT(Num(r, "gbps"), 0.0);
    EXPECT_LE(Num(r, "p50_ns"), Num(r, "p99_ns"));
    EXPECT_EQ(Num(r, "pages"), 256);
  }
  // Jerasure is optional (TESSERA_JERASURE): a build without it has no Jerasure rows or checks.
  const bool jerasure = TESSERA_WITH_JERASURE;
  EXPECT_EQ(checks, jerasure ? 4 : 2);
  for (std::string code : {"RS(8,2)", "RS(4,2)", "RS(8,3)"}) {
    for (std::string op :
         {"encode", "encode+crc", "reconstruct_1", "reconstruct_r", "reconstruct_r+crc"}) {
      EXPECT_TRUE(seen.count({"tessera", code, op})) << "tessera " << code << " " << op;
    }
    for (std::string scheme : {"isal", "jerasure"}) {
      for (std::string op : {"encode", "reconstruct_1", "reconstruct_r"}) {
        EXPECT_EQ(seen.count({scheme, code, op}), scheme == "jerasure" && !jerasure ? 0u : 1u)
            << scheme << " " << code << " " << op;
      }
    }
  }
  for (std::string code : {"2-way", "3-way"}) {
    for (std::string op : {"encode", "reconstruct_1"}) {
      EXPECT_TRUE(seen.count({"replication", code, op})) << code << " " << op;
    }
  }
  EXPECT_EQ(seen.size(), 3u * (jerasure ? 11u : 8u) + 4u);
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
  EXPECT_EQ(Str(r, "suite"), "demo");
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
