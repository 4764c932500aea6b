// Helpers shared by Tessera's tests.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

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

// A loopback port for a child process to listen on (fabric::PickListenPort); on error, records
// a test failure and returns 0.
int ListenPort();

// The reply to `GET PATH` on 127.0.0.1:PORT (status line, headers and body), read until the
// server closes (each read bounded by 10 s); "" when nothing answers.
std::string HttpGet(uint16_t port, const std::string& path);

// The port of a `metrics on HOST:PORT` line in `text`, 0 if there is none.
uint16_t MetricsPortIn(const std::string& text);

// The integer value of "key" in one JSON object (such as `tessera run --stats-json` writes),
// parsed with nlohmann-json; -1 if the text is not a JSON object or the key is absent or not an
// integer.
long long JsonInt(const std::string& json, const std::string& key);
// Every line of `text` that is a JSON object, parsed (other lines, e.g. tables or log lines,
// are skipped). For `--json` outputs of benches and tools.
std::vector<nlohmann::json> JsonLines(const std::string& text);
// The objects of JsonLines(text) whose `key` is the string `value` (e.g. "suite", "fabric").
std::vector<nlohmann::json> JsonRows(const std::string& text, const std::string& key,
                                     const std::string& value);

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
