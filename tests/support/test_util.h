// Helpers shared by Tessera's tests.
#pragma once

#include <string>
#include <vector>

namespace tessera::testing {

// build/bin: from $TESSERA_BIN_DIR (set by ctest) or the test executable's own directory.
std::string BinDir();

struct CommandOutcome {
  int exit_code = -1;     // -1 if it did not exit normally (signal, timeout).
  std::string stdout_text;
};

// Runs argv to completion (bounded by timeout_ms; killed after it) and captures stdout.
// stderr is discarded unless keep_stderr.
CommandOutcome RunCommand(const std::vector<std::string>& argv, int timeout_ms = 60000,
                          bool keep_stderr = false);

// Runs build/bin/tessera with the given arguments.
CommandOutcome RunTessera(const std::vector<std::string>& args, int timeout_ms = 60000);

// The whole content of a file ("" if it cannot be read).
std::string ReadFile(const std::string& path);

// The integer value of "key": in one-line JSON such as `tessera run --stats-json` writes;
// -1 if the key is absent.
long long JsonInt(const std::string& json, const std::string& key);

// A fresh temporary directory, removed (recursively) on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace tessera::testing
