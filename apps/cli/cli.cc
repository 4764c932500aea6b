#include "apps/cli/cli.h"

#include <gflags/gflags.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "common/logging.h"

DEFINE_string(log_level, "info", "Log level: debug, info, warning or error");

namespace tessera::cli {
namespace {

// gflags' own flags that a user may legitimately pass.
const std::set<std::string> kGflagsBuiltins = {"flagfile", "fromenv", "tryfromenv", "undefok",
                                               "help", "helpfull", "helpshort", "version"};

void PrintUsage(const CliSpec& spec, FILE* out) {
  std::fprintf(out, "usage: %s %s\n\n%s\n", spec.name, spec.synopsis, spec.description);
  std::vector<gflags::CommandLineFlagInfo> flags;
  gflags::GetAllFlags(&flags);
  bool header = false;
  for (const auto& f : flags) {
    bool mine = f.filename == spec.main_file || f.name == "log_level";
    if (!mine) continue;
    if (!header) {
      std::fprintf(out, "\nflags:\n");
      header = true;
    }
    std::string def = f.type == "string" ? "\"" + f.default_value + "\"" : f.default_value;
    std::fprintf(out, "  --%s (%s) default %s\n      %s\n", f.name.c_str(), f.type.c_str(),
                 def.c_str(), f.description.c_str());
  }
}

}  // namespace

void UsageError(const CliSpec& spec, const std::string& message) {
  std::fprintf(stderr, "%s: %s\n\n", spec.name, message.c_str());
  PrintUsage(spec, stderr);
  std::exit(2);
}

void InitCli(const CliSpec& spec, int* argc, char*** argv) {
  gflags::SetUsageMessage(std::string(spec.name) + " " + spec.synopsis);
  // Validate flag names before gflags sees them, so an unknown flag prints our usage.
  std::vector<gflags::CommandLineFlagInfo> flags;
  gflags::GetAllFlags(&flags);
  std::set<std::string> known;
  std::set<std::string> bools;
  for (const auto& f : flags) {
    known.insert(f.name);
    if (f.type == "bool") bools.insert(f.name);
  }
  for (int i = 1; i < *argc; ++i) {
    const char* a = (*argv)[i];
    if (std::strcmp(a, "--") == 0) break;
    if (a[0] != '-' || a[1] == '\0') continue;
    std::string name = a + (a[1] == '-' ? 2 : 1);
    size_t eq = name.find('=');
    bool has_value = eq != std::string::npos;
    if (has_value) name.resize(eq);
    if (name == "help" || name == "h") {
      PrintUsage(spec, stdout);
      std::exit(0);
    }
    if (kGflagsBuiltins.count(name)) continue;
    if (known.count(name)) {
      // A non-bool flag given as "--flag value" consumes the next argument.
      if (!has_value && !bools.count(name)) ++i;
      continue;
    }
    if (name.rfind("no", 0) == 0 && bools.count(name.substr(2))) continue;
    UsageError(spec, "unknown flag '" + std::string(a) + "'");
  }
  gflags::ParseCommandLineFlags(argc, argv, /*remove_flags=*/true);
  LogLevel level;
  if (!ParseLogLevel(FLAGS_log_level, &level)) {
    UsageError(spec, "bad --log_level '" + FLAGS_log_level + "' (debug, info, warning, error)");
  }
  SetMinLogLevel(level);
  int positional = *argc - 1;
  if (positional < spec.min_positional ||
      (spec.max_positional >= 0 && positional > spec.max_positional)) {
    UsageError(spec, "wrong number of arguments (" + std::to_string(positional) + ")");
  }
}

}  // namespace tessera::cli
