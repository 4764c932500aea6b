// Command-line handling shared by every Tessera main file.
//
// gflags is used only in main files (and the shared flag sets of apps/cli, such as the store
// flags); this is the one helper they share. InitCli() parses the flags the calling tool
// defined or shares (CliSpec::shared_flags), rejects any other flag and wrong positional
// argument counts with the usage text (exit 2), handles --help (exit 0), and applies
// --log_level. After it returns, argv holds the program name and the positional arguments.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace tessera::cli {

struct CliSpec {
  const char* name;         // "tessera bench coding"
  const char* synopsis;     // "[--json] [--reps N]"
  const char* description;  // One paragraph.
  const char* main_file;    // __FILE__ of the main: only its flags are listed in the usage.
  int min_positional = 0;
  int max_positional = 0;   // -1: unlimited (e.g. `tessera run -- PROGRAM ARGS`).
  // Flags defined outside main_file that this tool takes (snake_case), e.g. the shared store
  // flags (store_flags.h): listed in the usage and accepted; any other flag defined outside
  // main_file is refused as unknown.
  std::vector<std::string> shared_flags = {};
  // Older names kept working: {old, current} (snake_case), e.g. {"ec_k", "k"}. The usage
  // names them beside the current flag.
  std::vector<std::pair<std::string, std::string>> aliases = {};
};

void InitCli(const CliSpec& spec, int* argc, char*** argv);

// Prints "NAME: message" and the usage, exits 2. For flag values that parse but are invalid.
[[noreturn]] void UsageError(const CliSpec& spec, const std::string& message);

}  // namespace tessera::cli
