// deploy/systemd/tessera-memserver.service and memserver.env: systemd-analyze verifies the unit
// (skipped, with a message, where systemd-analyze is not installed), every flag its ExecStart
// passes (after systemd's ${VAR}/$VAR expansion from the environment file) is a flag of
// `tessera memserver`, and the memserver starts with those values (moved to loopback and a
// small capacity) and stops cleanly on SIGTERM, as systemd would stop it.
#include <signal.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/subprocess.h"
#include "tests/support/etcd_process.h"
#include "tests/support/test_util.h"

namespace tessera {
namespace {

using testing::BinDir;
using testing::RunCommand;
using testing::RunTessera;
using testing::TempDir;

const std::string kDeployDir = std::string(TESSERA_SOURCE_DIR) + "/deploy/systemd";
const std::string kUnit = kDeployDir + "/tessera-memserver.service";
const std::string kEnv = kDeployDir + "/memserver.env";

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string Replace(std::string s, const std::string& from, const std::string& to) {
  for (size_t p = s.find(from); p != std::string::npos; p = s.find(from, p + to.size())) {
    s.replace(p, from.size(), to);
  }
  return s;
}

// The value of `key=` in the unit's [Service] section, with backslash-continued lines joined.
std::string ServiceValue(const std::string& unit, const std::string& key) {
  std::istringstream in(unit);
  std::string line, value;
  bool in_value = false;
  while (std::getline(in, line)) {
    if (in_value) {
      bool more = !line.empty() && line.back() == '\\';
      value += " " + (more ? line.substr(0, line.size() - 1) : line);
      if (!more) return value;
      continue;
    }
    if (line.rfind(key + "=", 0) == 0) {
      value = line.substr(key.size() + 1);
      if (value.empty() || value.back() != '\\') return value;
      value.pop_back();
      in_value = true;
    }
  }
  return value;
}

// NAME=value lines of a systemd EnvironmentFile (comments and blank lines skipped).
std::map<std::string, std::string> ParseEnvFile(const std::string& text) {
  std::map<std::string, std::string> env;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    size_t eq = line.find('=');
    if (eq == std::string::npos) {
      ADD_FAILURE() << "environment file line without '=': " << line;
      continue;
    }
    env[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return env;
}

std::vector<std::string> Words(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  std::string w;
  while (in >> w) out.push_back(w);
  return out;
}

// systemd's ExecStart expansion: "${VAR}" inside a word substitutes the value into that word;
// a word that is exactly "$VAR" becomes the value split at whitespace (nothing when empty).
std::vector<std::string> ExpandExecStart(const std::string& exec,
                                         const std::map<std::string, std::string>& env) {
  std::vector<std::string> out;
  for (const std::string& w : Words(exec)) {
    if (w.size() > 1 && w[0] == '$' && w[1] != '{') {
      auto it = env.find(w.substr(1));
      EXPECT_NE(it, env.end()) << w << " is not set in the environment file";
      if (it != env.end()) {
        for (const auto& part : Words(it->second)) out.push_back(part);
      }
      continue;
    }
    std::string s = w;
    std::smatch m;
    while (std::regex_search(s, m, std::regex(R"(\$\{([A-Za-z_][A-Za-z0-9_]*)\})"))) {
      auto it = env.find(m[1].str());
      EXPECT_NE(it, env.end()) << "${" << m[1].str() << "} is not set in the environment file";
      s.replace(static_cast<size_t>(m.position(0)), static_cast<size_t>(m.length(0)),
                it == env.end() ? "" : it->second);
    }
    out.push_back(s);
  }
  return out;
}

TEST(DeploySystemd, UnitPassesSystemdAnalyzeVerify) {
  if (RunCommand({"/bin/sh", "-c", "command -v systemd-analyze"}).exit_code != 0) {
    GTEST_SKIP() << "systemd-analyze is not installed here: the unit was not verified";
  }
  // The installed paths, pointed at this build and a temp dir (verify checks that the
  // command is executable).
  TempDir dir;
  std::string unit = ReadAll(kUnit);
  unit = Replace(unit, "/usr/local/bin/tessera", BinDir() + "/tessera");
  unit = Replace(unit, "/etc/tessera/", dir.path() + "/");
  const std::string path = dir.path() + "/tessera-memserver.service";
  std::ofstream(path) << unit;
  std::ofstream(dir.path() + "/memserver.env") << ReadAll(kEnv);
  std::ofstream(dir.path() + "/cluster.secret") << "0123456789abcdef0123456789abcdef\n";
  auto out = RunCommand({"/bin/sh", "-c", "exec systemd-analyze verify --man=no \"$0\" 2>&1", path},
                        60000);
  EXPECT_EQ(out.exit_code, 0) << out.stdout_text;
  // verify exits 0 on unknown keys and bad values (it ignores them): any remark about our
  // unit is a failure.
  std::istringstream lines(out.stdout_text);
  std::string line;
  while (std::getline(lines, line)) {
    EXPECT_EQ(line.find(path), std::string::npos) << "systemd-analyze: " << line;
  }
}

TEST(DeploySystemd, ExecStartFlagsAreTheMemserversAndItStartsWithThem) {
  TempDir dir;
  ASSERT_EQ(RunTessera({"token", "secret", "--out", dir.path() + "/cluster.secret"}).exit_code, 0);
  std::map<std::string, std::string> env = ParseEnvFile(ReadAll(kEnv));
  env["CREDENTIALS_DIRECTORY"] = dir.path();  // Where LoadCredential= puts cluster.secret.
  const std::string exec = ServiceValue(ReadAll(kUnit), "ExecStart");
  ASSERT_FALSE(exec.empty()) << "no ExecStart in " << kUnit;
  std::vector<std::string> argv = ExpandExecStart(exec, env);
  ASSERT_GE(argv.size(), 3u);
  EXPECT_EQ(argv[0], "/usr/local/bin/tessera");
  EXPECT_EQ(argv[1], "memserver");

  // Every flag is one `tessera memserver --help` lists.
  auto help = RunTessera({"memserver", "--help"});
  ASSERT_EQ(help.exit_code, 0);
  const bool etcd_built = help.stdout_text.find("  --etcd (") != std::string::npos;
  const std::vector<std::string> etcd_words = Words(env["TESSERA_ETCD_ARGS"]);
  EXPECT_FALSE(etcd_words.empty()) << "the example environment file shows the etcd flags";
  // With etcd installed, the real start below registers in a real etcd on loopback.
  std::unique_ptr<testing::EtcdProcess> etcd;
  if (etcd_built && testing::EtcdProcess::SkipReason().empty()) {
    auto e = testing::EtcdProcess::Start();
    ASSERT_TRUE(e.ok()) << e.status();
    etcd = std::move(*e);
  } else {
    std::printf("note: the etcd flags are not exercised: %s\n",
                etcd_built ? testing::EtcdProcess::SkipReason().c_str()
                           : "this build's memserver has no --etcd");
  }
  std::vector<std::string> run = {BinDir() + "/tessera", "memserver"};
  for (size_t i = 2; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    ASSERT_EQ(a.rfind("--", 0), 0u) << "not a --flag=value word: '" << a << "'";
    const std::string name = a.substr(2, a.find('=') - 2);
    const bool is_etcd = std::find(etcd_words.begin(), etcd_words.end(), a) != etcd_words.end();
    if (is_etcd && !etcd_built) continue;
    EXPECT_NE(help.stdout_text.find("  --" + name + " ("), std::string::npos)
        << "--" << name << " (from ExecStart) is not a flag of tessera memserver";
    if (is_etcd && !etcd) continue;
    // The file's etcd and advertised addresses are another network's: use this host's.
    if (name == "etcd") {
      run.push_back("--etcd=" + etcd->endpoint());
    } else if (name == "advertise") {
      run.push_back("--advertise=127.0.0.1");
    } else {
      run.push_back(a);
    }
  }
  // The file's values, moved to loopback and a small pool (later flags win in gflags).
  for (const char* o : {"--listen=127.0.0.1", "--port=0", "--capacity=4M", "--slab_size=1M",
                        "--headroom=0", "--metrics_port=0", "--transport=tcp"}) {
    run.push_back(o);
  }
  auto p = Subprocess::Start(run, {.capture_stdout = true});
  ASSERT_TRUE(p.ok()) << p.status();
  auto line = p->WaitForLine("listening on 127.0.0.1:", Deadline::AfterMs(10000));
  ASSERT_TRUE(line.ok()) << "the memserver did not start with the unit's flags: " << line.status();
  auto metrics = p->WaitForLine("metrics on ", Deadline::AfterMs(10000));
  EXPECT_TRUE(metrics.ok()) << metrics.status();
  if (etcd) {
    auto reg = p->WaitForLine("registered in etcd as /tessera/prod/servers/",
                              Deadline::AfterMs(10000));
    EXPECT_TRUE(reg.ok()) << "no etcd registration with the unit's flags: " << reg.status();
  }
  // systemd stops it with SIGTERM (KillSignal=); a graceful stop exits 0.
  ASSERT_TRUE(p->Signal(SIGTERM).ok());
  auto code = p->Wait(Deadline::AfterMs(10000));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0);
}

}  // namespace
}  // namespace tessera
