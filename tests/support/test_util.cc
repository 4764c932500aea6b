#include "tests/support/test_util.h"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/subprocess.h"

namespace tessera::testing {

std::string BinDir() {
  const char* d = std::getenv("TESSERA_BIN_DIR");
  return (d && *d) ? d : SelfExeDir();
}

CommandOutcome RunCommand(const std::vector<std::string>& argv, int timeout_ms, bool keep_stderr) {
  CommandOutcome o;
  auto p = Subprocess::Start(argv, {.capture_stdout = true, .quiet_stderr = !keep_stderr});
  if (!p.ok()) {
    ADD_FAILURE() << "cannot start " << argv[0] << ": " << p.status();
    return o;
  }
  Deadline deadline = Deadline::AfterMs(static_cast<uint64_t>(timeout_ms));
  for (;;) {
    auto line = p->ReadLine(deadline);
    if (!line.ok()) {
      if (line.status().code() == StatusCode::kTimeout) {
        ADD_FAILURE() << argv[0] << " produced no output end within " << timeout_ms << " ms";
      }
      break;
    }
    o.stdout_text += *line + "\n";
  }
  auto st = p->Wait(deadline);
  if (!st.ok()) {
    ADD_FAILURE() << argv[0] << " did not exit within " << timeout_ms << " ms: " << st.status();
    return o;
  }
  if (WIFEXITED(*st)) o.exit_code = WEXITSTATUS(*st);
  return o;
}

CommandOutcome RunTessera(const std::vector<std::string>& args, int timeout_ms) {
  std::vector<std::string> argv{BinDir() + "/tessera"};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunCommand(argv, timeout_ms);
}

TempDir::TempDir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "tessera-test-XXXXXX").string();
  char* p = ::mkdtemp(tmpl.data());
  if (p == nullptr) std::abort();
  path_ = p;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

long long JsonInt(const std::string& json, const std::string& key) {
  const size_t at = json.find("\"" + key + "\":");
  if (at == std::string::npos) return -1;
  return std::strtoll(json.c_str() + at + key.size() + 3, nullptr, 10);
}

}  // namespace tessera::testing
