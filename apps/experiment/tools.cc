#include "apps/experiment/tools.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <climits>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "common/clock.h"
#include "common/fd.h"
#include "common/subprocess.h"

namespace tessera::experiment {

Result<ToolResult> RunTool(const std::vector<std::string>& argv, int timeout_ms) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return ErrnoError("pipe2");
  UniqueFd rd(fds[0]), wr(fds[1]);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = ::fork();
  if (pid < 0) return ErrnoError("fork");
  if (pid == 0) {
    ::dup2(wr.get(), 1);
    ::dup2(wr.get(), 2);
    int devnull = ::open("/dev/null", O_RDONLY);
    if (devnull >= 0) ::dup2(devnull, 0);
    ::execvp(args[0], args.data());
    std::fprintf(stderr, "%s: %s\n", args[0], std::strerror(errno));
    ::_exit(127);
  }
  wr.Reset();
  ToolResult out;
  Deadline deadline = Deadline::AfterMs(static_cast<uint64_t>(timeout_ms));
  bool timed_out = false;
  char buf[4096];
  for (;;) {
    pollfd p{rd.get(), POLLIN, 0};
    int n = ::poll(&p, 1, deadline.RemainingMs());
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) {
      timed_out = true;
      ::kill(pid, SIGKILL);
      break;
    }
    ssize_t got = ::read(rd.get(), buf, sizeof(buf));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    if (out.output.size() < (1u << 20)) out.output.append(buf, static_cast<size_t>(got));
  }
  int ws = 0;
  while (::waitpid(pid, &ws, 0) < 0 && errno == EINTR) {
  }
  if (timed_out) return Timeout(argv[0], " did not finish within ", timeout_ms, " ms");
  out.exit_code = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
  while (!out.output.empty() && out.output.back() == '\n') out.output.pop_back();
  return out;
}

bool ProcUsage(pid_t pid, uint64_t* cpu_ticks, uint64_t* rss_bytes) {
  std::string stat = ReadWholeFile("/proc/" + std::to_string(pid) + "/stat");
  size_t close = stat.rfind(')');
  if (stat.empty() || close == std::string::npos) return false;
  std::istringstream in(stat.substr(close + 2));
  std::string field;
  // Fields after the command: state(3) ... utime(14) stime(15) ... rss(24), 1-based.
  uint64_t utime = 0, stime = 0, rss_pages = 0;
  for (int i = 3; i <= 24 && (in >> field); ++i) {
    if (i == 3 && (field == "Z" || field == "X")) return false;
    if (i == 14) utime = std::strtoull(field.c_str(), nullptr, 10);
    if (i == 15) stime = std::strtoull(field.c_str(), nullptr, 10);
    if (i == 24) rss_pages = std::strtoull(field.c_str(), nullptr, 10);
  }
  *cpu_ticks = utime + stime;
  *rss_bytes = rss_pages * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  return true;
}

std::string ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

Status WriteWholeFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return ErrnoError("open ", path);
  out << text;
  out.close();
  if (!out) return IoError("writing ", path);
  return Status::Ok();
}

std::string DataDir(const std::string& bin_dir) {
  const std::string workloads = DataPath("workloads", bin_dir);
  return workloads.empty() ? "" : workloads.substr(0, workloads.rfind('/'));
}

}  // namespace tessera::experiment
