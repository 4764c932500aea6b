#include "tests/support/test_util.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/subprocess.h"
#include "fabric/connect.h"

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
  nlohmann::json j = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains(key) || !j[key].is_number_integer()) return -1;
  return j[key].get<long long>();
}

std::vector<nlohmann::json> JsonLines(const std::string& text) {
  std::vector<nlohmann::json> out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    if (line.empty() || line[0] != '{') continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object()) out.push_back(std::move(j));
  }
  return out;
}

std::vector<nlohmann::json> JsonRows(const std::string& text, const std::string& key,
                                     const std::string& value) {
  std::vector<nlohmann::json> out;
  for (nlohmann::json& j : JsonLines(text)) {
    if (j.contains(key) && j[key].is_string() && j[key].get<std::string>() == value) {
      out.push_back(std::move(j));
    }
  }
  return out;
}

std::string HttpGet(uint16_t port, const std::string& path) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return "";
  timeval tv{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string out;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
    const std::string req = "GET " + path + " HTTP/1.1\r\nHost: localhost\r\n\r\n";
    if (::write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size())) {
      char buf[65536];
      ssize_t n;
      while ((n = ::read(fd, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
    }
  }
  ::close(fd);
  return out;
}

uint16_t MetricsPortIn(const std::string& text) {
  const size_t at = text.find("metrics on ");
  if (at == std::string::npos) return 0;
  const size_t end = text.find('\n', at);
  const std::string line = text.substr(at, end == std::string::npos ? end : end - at);
  const size_t colon = line.rfind(':');
  if (colon == std::string::npos) return 0;
  return static_cast<uint16_t>(std::strtoul(line.c_str() + colon + 1, nullptr, 10));
}

int ListenPort() {
  auto port = fabric::PickListenPort();
  EXPECT_TRUE(port.ok()) << port.status();
  return port.ok() ? *port : 0;
}

}  // namespace tessera::testing
