#include "apps/cli/cli.h"

#include <gflags/gflags.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "apps/cli/version.h"
#include "common/logging.h"

DEFINE_string(log_level, "info", "Log level: debug, info, warning or error");

namespace tessera::cli {
namespace {

// gflags' own flags that a user may legitimately pass.
const std::set<std::string> kGflagsBuiltins = {"flagfile", "fromenv", "tryfromenv", "undefok",
                                               "help", "helpfull", "helpshort", "version"};

// Flag names in prose written --snake_case, shown --kebab-case like the flag list below.
std::string KebabFlags(const char* text) {
  std::string out(text);
  for (size_t i = 0; i + 2 < out.size(); ++i) {
    if (out[i] != '-' || out[i + 1] != '-' || (i > 0 && out[i - 1] != ' ' && out[i - 1] != '[' &&
                                                out[i - 1] != '(' && out[i - 1] != '`' &&
                                                out[i - 1] != '\n' && out[i - 1] != '|')) {
      continue;
    }
    for (size_t j = i + 2; j < out.size(); ++j) {
      const char c = out[j];
      if (c == '_') {
        out[j] = '-';
      } else if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'))) {
        break;
      }
    }
  }
  return out;
}

bool Shared(const CliSpec& spec, const std::string& name) {
  for (const auto& s : spec.shared_flags) {
    if (s == name) return true;
  }
  return false;
}

// A flag of this tool: defined in its main file, shared with it, or --log_level.
bool Mine(const CliSpec& spec, const gflags::CommandLineFlagInfo& f) {
  return f.filename == spec.main_file || f.name == "log_level" || Shared(spec, f.name);
}

std::string Kebab(std::string name) {
  for (char& c : name) c = c == '_' ? '-' : c;
  return name;
}

void PrintUsage(const CliSpec& spec, FILE* out) {
  std::fprintf(out, "usage: %s %s\n\n%s\n", spec.name, KebabFlags(spec.synopsis).c_str(),
               KebabFlags(spec.description).c_str());
  std::vector<gflags::CommandLineFlagInfo> flags;
  gflags::GetAllFlags(&flags);
  bool header = false;
  for (const auto& f : flags) {
    if (!Mine(spec, f)) continue;
    if (!header) {
      std::fprintf(out, "\nflags:\n");
      header = true;
    }
    std::string def = f.type == "string" ? "\"" + f.default_value + "\"" : f.default_value;
    // Shown kebab-case; the snake_case spelling works too (NormalizeFlagNames).
    std::string also;
    for (const auto& [old_name, current] : spec.aliases) {
      if (current == f.name) also += (also.empty() ? " (also --" : ", --") + Kebab(old_name);
    }
    if (!also.empty()) also += ")";
    std::fprintf(out, "  --%s%s (%s) default %s\n      %s\n", Kebab(f.name).c_str(),
                 also.c_str(), f.type.c_str(), def.c_str(),
                 KebabFlags(f.description.c_str()).c_str());
  }
}

}  // namespace

void UsageError(const CliSpec& spec, const std::string& message) {
  std::fprintf(stderr, "%s: %s\n\n", spec.name, message.c_str());
  PrintUsage(spec, stderr);
  std::exit(2);
}

// Flags are declared snake_case (gflags); a user may write them kebab-case too:
// --auth-token-file is --auth_token_file, and an older name (CliSpec::aliases) is its current
// one. Only flag names change, never values, and nothing after "--".
static void NormalizeFlagNames(const CliSpec& spec, int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    if (std::strcmp(a, "--") == 0) break;
    if (a[0] != '-' || a[1] == '\0') continue;
    const char* name = a + (a[1] == '-' ? 2 : 1);
    const char* end = std::strchr(name, '=');
    size_t len = end ? static_cast<size_t>(end - name) : std::strlen(name);
    std::string flag(name, len);
    for (char& c : flag) c = c == '-' ? '_' : c;
    for (const auto& [old_name, current] : spec.aliases) {
      if (flag == old_name) flag = current;
    }
    if (flag == std::string_view(name, len)) continue;
    std::string fixed(a, static_cast<size_t>(name - a));
    fixed += flag;
    if (end) fixed += end;
    argv[i] = ::strdup(fixed.c_str());  // Lives as long as the process, as argv does.
  }
}

void InitCli(const CliSpec& spec, int* argc, char*** argv) {
  NormalizeFlagNames(spec, *argc, *argv);
  gflags::SetUsageMessage(std::string(spec.name) + " " + KebabFlags(spec.synopsis));
  // Validate flag names before gflags sees them, so an unknown flag prints our usage.
  std::vector<gflags::CommandLineFlagInfo> flags;
  gflags::GetAllFlags(&flags);
  std::set<std::string> known;
  std::set<std::string> bools;
  for (const auto& f : flags) {
    if (!Mine(spec, f)) continue;  // Another tool's shared flag linked in: not this one's.
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
    if (name == "version") {
      std::fputs(version::Text(spec.name).c_str(), stdout);
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
