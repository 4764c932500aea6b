#include "common/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>

namespace tessera {

Subprocess::~Subprocess() {
  if (running()) {
    ::kill(pid_, SIGKILL);
    int st;
    while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
    }
  }
}

Subprocess::Subprocess(Subprocess&& o) noexcept
    : pid_(std::exchange(o.pid_, -1)), stdout_(std::move(o.stdout_)),
      buffer_(std::move(o.buffer_)), exit_status_(std::exchange(o.exit_status_, std::nullopt)) {}

Subprocess& Subprocess::operator=(Subprocess&& o) noexcept {
  if (this != &o) {
    this->~Subprocess();
    new (this) Subprocess(std::move(o));
  }
  return *this;
}

Result<Subprocess> Subprocess::Start(const std::vector<std::string>& argv, Options options) {
  if (argv.empty()) return InvalidArgument("Subprocess::Start: empty argv");
  int pipefd[2] = {-1, -1};
  if (options.capture_stdout && ::pipe2(pipefd, O_CLOEXEC) != 0) return ErrnoError("pipe2");
  // Build argv/envp before fork: only async-signal-safe calls after it.
  std::vector<char*> cargv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  std::vector<std::string> env_storage;
  for (char** e = environ; *e != nullptr; ++e) env_storage.emplace_back(*e);
  for (const auto& e : options.extra_env) env_storage.push_back(e);
  std::vector<char*> cenv;
  for (auto& e : env_storage) cenv.push_back(e.data());
  cenv.push_back(nullptr);
  int devnull = options.quiet_stderr ? ::open("/dev/null", O_WRONLY | O_CLOEXEC) : -1;
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  for (int c : options.cpus) {
    if (c < 0 || c >= CPU_SETSIZE) {
      if (pipefd[0] >= 0) { ::close(pipefd[0]); ::close(pipefd[1]); }
      if (devnull >= 0) ::close(devnull);
      return InvalidArgument("Subprocess::Start: no CPU ", c);
    }
    CPU_SET(c, &cpus);
  }
  UniqueFd netns;
  if (!options.netns_path.empty()) {
    netns.Reset(::open(options.netns_path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!netns) {
      const int err = errno;
      if (pipefd[0] >= 0) { ::close(pipefd[0]); ::close(pipefd[1]); }
      if (devnull >= 0) ::close(devnull);
      errno = err;
      return ErrnoError("Subprocess::Start: cannot open network namespace ", options.netns_path);
    }
  }

  pid_t parent = ::getpid();
  // vfork, not fork: the child shares the parent's memory until it execs, so starting a helper
  // from a process with a large heap (an experiment runner, a bench) neither copies its page
  // tables nor write-protects its pages (after a fork, every page the parent writes next takes
  // a fault: a latency spike for whatever the parent is measuring). Only the calling thread
  // waits for the exec; the child below makes async-signal-safe calls only and touches no
  // memory of the parent's.
  pid_t pid = ::vfork();
  if (pid < 0) {
    int err = errno;
    if (pipefd[0] >= 0) { ::close(pipefd[0]); ::close(pipefd[1]); }
    if (devnull >= 0) ::close(devnull);
    errno = err;
    return ErrnoError("vfork");
  }
  if (pid == 0) {
    if (options.capture_stdout) ::dup2(pipefd[1], STDOUT_FILENO);
    if (devnull >= 0) ::dup2(devnull, STDERR_FILENO);
    if (options.capture_stdout && options.stderr_to_stdout) ::dup2(pipefd[1], STDERR_FILENO);
    if (netns && ::setns(netns.get(), CLONE_NEWNET) != 0) {
      const char msg[] = "Subprocess: setns into the network namespace failed\n";
      (void)!::write(STDERR_FILENO, msg, sizeof(msg) - 1);
      ::_exit(127);
    }
    if (!options.cpus.empty() && ::sched_setaffinity(0, sizeof cpus, &cpus) != 0) {
      const char msg[] = "Subprocess: sched_setaffinity failed\n";
      (void)!::write(STDERR_FILENO, msg, sizeof(msg) - 1);
      ::_exit(127);
    }
    // Die with the parent, so a crashed test or bench never leaves servers behind.
    // (PR_SET_PDEATHSIG fires when the thread that forked exits: start children from a
    // long-lived thread.)
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    if (options.own_process_group) ::setpgid(0, 0);
    if (std::strchr(cargv[0], '/') != nullptr) {
      ::execve(cargv[0], cargv.data(), cenv.data());
    } else {
      ::execvpe(cargv[0], cargv.data(), cenv.data());
    }
    const char msg[] = "Subprocess: exec failed: ";
    (void)!::write(STDERR_FILENO, msg, sizeof(msg) - 1);
    (void)!::write(STDERR_FILENO, cargv[0], std::strlen(cargv[0]));
    (void)!::write(STDERR_FILENO, "\n", 1);
    ::_exit(127);
  }
  if (devnull >= 0) ::close(devnull);
  Subprocess sp;
  sp.pid_ = pid;
  if (options.capture_stdout) {
    ::close(pipefd[1]);
    sp.stdout_.Reset(pipefd[0]);
  }
  return sp;
}

Result<std::string> Subprocess::ReadLine(Deadline deadline) {
  if (!stdout_.valid()) return InvalidArgument("stdout of pid ", pid_, " is not captured");
  for (;;) {
    size_t nl = buffer_.find('\n');
    if (nl != std::string::npos) {
      std::string line = buffer_.substr(0, nl);
      buffer_.erase(0, nl + 1);
      return line;
    }
    pollfd pfd{stdout_.get(), POLLIN, 0};
    int rc = ::poll(&pfd, 1, deadline.RemainingMs());
    if (rc < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("poll");
    }
    if (rc == 0) return Timeout("no line from pid ", pid_, " before the deadline");
    char buf[4096];
    ssize_t n = ::read(stdout_.get(), buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return ErrnoError("read from child stdout");
    }
    if (n == 0) return Unavailable("pid ", pid_, " closed its stdout (exited?)");
    buffer_.append(buf, static_cast<size_t>(n));
  }
}

Result<std::string> Subprocess::WaitForLine(const std::string& prefix, Deadline deadline) {
  for (;;) {
    TESSERA_ASSIGN_OR_RETURN(std::string line, ReadLine(deadline));
    if (line.rfind(prefix, 0) == 0) return line;
  }
}

Status Subprocess::Signal(int sig) {
  if (!running()) return Unavailable("process ", pid_, " is not running");
  if (::kill(pid_, sig) != 0) return ErrnoError("kill ", pid_);
  return Status::Ok();
}

bool Subprocess::Poll() {
  if (pid_ <= 0) return true;
  if (exit_status_) return true;
  int st;
  pid_t r = ::waitpid(pid_, &st, WNOHANG);
  if (r == pid_) {
    exit_status_ = st;
    return true;
  }
  return false;
}

Result<int> Subprocess::Wait(Deadline deadline) {
  if (pid_ <= 0) return InvalidArgument("no process");
  // Poll with a short backoff: waitpid has no timeout, and a SIGCHLD handler would be
  // process-global state a library must not take.
  useconds_t backoff = 100;
  while (!Poll()) {
    if (deadline.Expired()) return Timeout("pid ", pid_, " did not exit before the deadline");
    ::usleep(backoff);
    if (backoff < 10000) backoff *= 2;
  }
  return *exit_status_;
}

Result<int> Subprocess::Stop(int grace_ms) {
  if (!running()) {
    if (exit_status_) return *exit_status_;
    return InvalidArgument("no process");
  }
  ::kill(pid_, SIGTERM);
  auto st = Wait(Deadline::AfterMs(static_cast<uint64_t>(grace_ms)));
  if (st.ok()) return st;
  ::kill(pid_, SIGKILL);
  return Wait(Deadline::AfterMs(10000));
}

std::string DataPath(std::string_view rel, const std::string& bin_dir) {
  for (const char* up : {"/../share/tessera/", "/../../share/tessera/"}) {
    const std::string path = bin_dir + up + std::string(rel);
    char real[PATH_MAX];
    if (::realpath(path.c_str(), real)) return real;
  }
  return "";
}

std::string SelfExeDir() {
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  buf[n] = '\0';
  std::string path(buf);
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

}  // namespace tessera
