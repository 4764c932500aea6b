// The store flags (apps/cli/store_flags.h) as a user meets them: every subcommand that opens a
// page store lists the same flags with the same defaults and help in its --help, and refuses
// the same bad values with the same message (exit 2), in either spelling.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/test_util.h"

namespace tessera {
namespace {

using testing::BinDir;
using testing::RunCommand;
using testing::RunTessera;

struct Command {
  std::vector<std::string> words;  // {"demo", "cluster"}
  std::vector<std::string> tail;   // What it needs to get past argument counting.
  std::set<std::string> flags;     // The store flags it takes (kebab-case).
  // Flags named like store flags that it defines itself, with a meaning of its own.
  std::set<std::string> own = {};
};

const std::set<std::string> kCode = {"k", "r", "layout"};
const std::set<std::string> kCluster = {"cluster", "etcd", "cluster-name", "auth-token-file"};

std::set<std::string> Union(std::initializer_list<std::set<std::string>> sets) {
  std::set<std::string> out;
  for (const auto& s : sets) out.insert(s.begin(), s.end());
  return out;
}

const std::vector<Command>& Commands() {
  static const std::vector<Command> commands = {
      {{"run"}, {"--", "/bin/true"}, Union({kCode, {"spares", "metrics-port"}, kCluster})},
      {{"nbd"}, {}, Union({kCode, {"spares", "io-threads", "metrics-port"}, kCluster})},
      {{"swap"}, {"status"}, Union({kCode, {"spares", "io-threads", "metrics-port"}, kCluster})},
      {{"demo", "cluster"}, {}, Union({kCode, {"spares"}})},
      // Its checkpoint store is found with --store or --etcd, and its --auth-token-file is
      // the service's own secret as well (docs/guides/paramsvc.md).
      {{"paramsvc", "serve"},
       {},
       Union({kCode, {"io-threads", "metrics-port"}}),
       {"etcd", "cluster-name", "auth-token-file"}},
  };
  return commands;
}

std::string Name(const Command& c) {
  std::string out = "tessera";
  for (const auto& w : c.words) out += " " + w;
  return out;
}

// "--NAME[ (also ...)] (TYPE) default VALUE" and the help line below it, by NAME.
std::map<std::string, std::string> HelpFlags(const Command& c) {
  std::vector<std::string> args = c.words;
  args.push_back("--help");
  auto o = RunTessera(args);
  EXPECT_EQ(o.exit_code, 0) << Name(c) << " --help";
  std::map<std::string, std::string> flags;
  std::istringstream in(o.stdout_text);
  std::string line, help;
  while (std::getline(in, line)) {
    if (line.rfind("  --", 0) != 0) continue;
    std::getline(in, help);
    const std::string name = line.substr(4, line.find(' ', 4) - 4);
    // From the type on: an older name's note "(also --ec-k)" before it is not compared.
    const size_t type = line.rfind(" (", line.find(") default "));
    flags[name] = line.substr(type + 1) + "\n" + help;
  }
  return flags;
}

// Exit code and stderr of `tessera WORDS ARGS TAIL`.
testing::CommandOutcome RunWithStderr(const Command& c, const std::vector<std::string>& args) {
  std::vector<std::string> argv = {"/bin/sh", "-c", "exec \"$0\" \"$@\" 2>&1",
                                   BinDir() + "/tessera"};
  argv.insert(argv.end(), c.words.begin(), c.words.end());
  argv.insert(argv.end(), args.begin(), args.end());
  argv.insert(argv.end(), c.tail.begin(), c.tail.end());
  return RunCommand(argv);
}

TEST(StoreFlags, EverySubcommandListsTheSameFlagsWithTheSameDefaults) {
  const std::map<std::string, std::string> defaults = {
      {"k", "4"},           {"r", "2"},          {"layout", "\"\""},       {"spares", "-1"},
      {"io-threads", "1"},  {"metrics-port", "-1"}, {"cluster", "\"\""},  {"etcd", "\"\""},
      {"cluster-name", "\"\""}, {"auth-token-file", "\"\""}};
  std::map<std::string, std::string> first_seen;  // Flag -> its listing in the first command.
  for (const Command& c : Commands()) {
    const auto help = HelpFlags(c);
    for (const std::string& flag : c.flags) {
      auto it = help.find(flag);
      ASSERT_NE(it, help.end()) << Name(c) << " --help does not list --" << flag;
      EXPECT_NE(it->second.find(") default " + defaults.at(flag) + "\n"), std::string::npos)
          << Name(c) << " --" << flag << ": " << it->second;
      auto [seen, inserted] = first_seen.emplace(flag, it->second);
      EXPECT_EQ(seen->second, it->second) << Name(c) << " --" << flag << " differs";
    }
    // A store flag it does not take is neither listed nor accepted.
    for (const auto& [flag, value] : defaults) {
      if (c.flags.count(flag) || c.own.count(flag)) continue;
      EXPECT_EQ(help.count(flag), 0u) << Name(c) << " lists --" << flag;
      auto o = RunWithStderr(c, {"--" + flag + "=" + (value == "\"\"" ? "x" : value)});
      EXPECT_EQ(o.exit_code, 2) << Name(c) << " --" << flag << ": " << o.stdout_text;
      EXPECT_NE(o.stdout_text.find("unknown flag"), std::string::npos) << o.stdout_text;
    }
  }
  EXPECT_EQ(first_seen.size(), defaults.size());
}

TEST(StoreFlags, BadValuesGetTheSameMessageEverywhere) {
  struct Bad {
    std::string flag;  // Kebab-case.
    std::string value;
    std::string message;
  };
  const std::string k = "--k must be 1, 2, 4, 8 or 16 (4096 must divide by k)";
  const std::vector<Bad> bad = {
      {"k", "3", k},
      {"k", "32", k},
      {"k", "0", k},
      {"r", "0", "--r must be in 1..4"},
      {"r", "5", "--r must be in 1..4"},
      {"layout", "stripe", "--layout must be split or group, not 'stripe'"},
      {"spares", "-2", "--spares must be in 0..16 (or -1: r)"},
      {"spares", "17", "--spares must be in 0..16 (or -1: r)"},
      {"io-threads", "0", "--io-threads must be in 1..16"},
      {"io-threads", "17", "--io-threads must be in 1..16"},
      {"metrics-port", "-2", "--metrics-port must be -1 (off) or in 0..65535"},
      {"metrics-port", "65536", "--metrics-port must be -1 (off) or in 0..65535"},
  };
  for (const Command& c : Commands()) {
    for (const Bad& b : bad) {
      if (!c.flags.count(b.flag)) continue;
      std::string snake = b.flag;
      for (char& ch : snake) ch = ch == '-' ? '_' : ch;
      for (const std::string& spelling : {b.flag, snake}) {
        auto o = RunWithStderr(c, {"--" + spelling + "=" + b.value});
        EXPECT_EQ(o.exit_code, 2) << Name(c) << " --" << spelling << "=" << b.value;
        EXPECT_NE(o.stdout_text.find(Name(c) + ": " + b.message + "\n"), std::string::npos)
            << Name(c) << " --" << spelling << "=" << b.value << ":\n" << o.stdout_text;
      }
    }
  }
}

TEST(StoreFlags, ClusterFlagsAreCheckedTogetherEverywhere) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> bad = {
      {{"--cluster=c", "--etcd=127.0.0.1:2379", "--cluster-name=x"},
       "give --cluster FILE or --etcd ENDPOINTS --cluster-name NAME, not both"},
      {{"--cluster-name=x"}, "--cluster-name goes with --etcd"},
      {{"--auth-token-file=t"},
       "--auth-token-file goes with --cluster or --etcd (an embedded cluster makes its own)"},
  };
  int checked = 0;
  for (const Command& c : Commands()) {
    if (!c.flags.count("cluster")) continue;
    ++checked;
    for (const auto& [args, message] : bad) {
      auto o = RunWithStderr(c, args);
      EXPECT_EQ(o.exit_code, 2) << Name(c) << " " << args[0];
      EXPECT_NE(o.stdout_text.find(Name(c) + ": " + message + "\n"), std::string::npos)
          << Name(c) << " " << args[0] << ":\n" << o.stdout_text;
    }
  }
  EXPECT_EQ(checked, 3);  // run, nbd, swap.
}

TEST(StoreFlags, OlderNamesStillWork) {
  // `tessera paramsvc serve` called the checkpoint store's code --ec-k and --ec-r.
  const Command& serve = Commands().back();
  ASSERT_EQ(Name(serve), "tessera paramsvc serve");
  for (const char* spelling : {"--ec-k=3", "--ec_k=3"}) {
    auto o = RunWithStderr(serve, {spelling});
    EXPECT_EQ(o.exit_code, 2) << spelling;
    EXPECT_NE(o.stdout_text.find("--k must be 1, 2, 4, 8 or 16"), std::string::npos)
        << spelling << ":\n" << o.stdout_text;
  }
  auto o = RunWithStderr(serve, {"--ec-r=9"});
  EXPECT_NE(o.stdout_text.find("--r must be in 1..4"), std::string::npos) << o.stdout_text;
  const auto help = HelpFlags(serve);
  ASSERT_EQ(help.count("k"), 1u);
  auto listing = RunTessera({"paramsvc", "serve", "--help"}).stdout_text;
  EXPECT_NE(listing.find("  --k (also --ec-k) (int32) default 4\n"), std::string::npos) << listing;
}

}  // namespace
}  // namespace tessera
