#include "tests/support/cpu_load.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <fstream>
#include <string>

namespace tessera::testing {
namespace {

constexpr const char* kCpuRoot = "/sys/fs/cgroup/cpu";

[[noreturn]] void BusyLoop(pid_t parent) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(0);  // The parent died before prctl took effect.
  volatile uint64_t x = 0;
  for (;;) x = x + 1;
}

Status WriteFile(const std::string& path, const std::string& value) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return ErrnoError("open " + path);
  const bool ok = std::fputs(value.c_str(), f) >= 0;
  const int close_rc = std::fclose(f);  // cgroup files report errors at write-back.
  if (!ok || close_rc != 0) return ErrnoError("write '" + value + "' to " + path);
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<CpuLoad>> CpuLoad::Start(int processes) {
  if (processes < 1 || processes > 256) {
    return InvalidArgument("CpuLoad: processes must be 1..256, got ", processes);
  }
  std::unique_ptr<CpuLoad> load(new CpuLoad());
  const pid_t self = ::getpid();
  for (int i = 0; i < processes; ++i) {
    const pid_t pid = ::fork();
    if (pid < 0) return ErrnoError("fork");  // ~CpuLoad kills those started.
    if (pid == 0) BusyLoop(self);
    load->pids_.push_back(pid);
  }
  return load;
}

CpuLoad::~CpuLoad() { Stop(); }

int CpuLoad::Running() const {
  int n = 0;
  for (pid_t pid : pids_) {
    // A zombie (exited, not reaped) is not running: WNOHANG|WNOWAIT peeks without reaping.
    siginfo_t info{};
    if (::waitid(P_PID, pid, &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == 0) n++;
  }
  return n;
}

void CpuLoad::Stop() {
  for (pid_t pid : pids_) ::kill(pid, SIGKILL);
  for (pid_t pid : pids_) {
    while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
    }
  }
  pids_.clear();
}

std::string CpuQuota::Unavailable() {
  struct stat st;
  const std::string quota = std::string(kCpuRoot) + "/cpu.cfs_quota_us";
  if (::stat(quota.c_str(), &st) != 0) {
    return "no cgroup-v1 cpu controller at " + std::string(kCpuRoot);
  }
  if (::access(kCpuRoot, W_OK) != 0) return std::string(kCpuRoot) + " is not writable (root?)";
  return "";
}

Result<std::unique_ptr<CpuQuota>> CpuQuota::Create(double cpus) {
  if (std::string why = Unavailable(); !why.empty()) return Unsupported(why);
  static std::atomic<int> seq{0};
  std::unique_ptr<CpuQuota> q(new CpuQuota());
  const std::string path = std::string(kCpuRoot) + "/tessera-quota-" + std::to_string(::getpid()) +
                           "-" + std::to_string(seq++);
  if (::mkdir(path.c_str(), 0755) != 0) return ErrnoError("mkdir " + path);
  q->path_ = path;
  TESSERA_RETURN_IF_ERROR(WriteFile(path + "/cpu.cfs_period_us", "100000"));
  TESSERA_RETURN_IF_ERROR(q->SetCpus(cpus));
  return q;
}

Status CpuQuota::SetCpus(double cpus) {
  if (!(cpus >= 0.01 && cpus <= 64)) return InvalidArgument("CpuQuota: cpus must be 0.01..64");
  const long quota_us = static_cast<long>(cpus * 100000);
  return WriteFile(path_ + "/cpu.cfs_quota_us", std::to_string(quota_us));
}

Status CpuQuota::Add(pid_t pid) {
  TESSERA_RETURN_IF_ERROR(WriteFile(path_ + "/cgroup.procs", std::to_string(pid)));
  added_.push_back(pid);
  return Status::Ok();
}

CpuQuota::~CpuQuota() {
  if (path_.empty()) return;
  // Processes still alive go back to the root cgroup; a cgroup with members cannot be removed.
  for (pid_t pid : added_) {
    if (::kill(pid, 0) == 0)
      (void)WriteFile(std::string(kCpuRoot) + "/cgroup.procs", std::to_string(pid));
  }
  ::rmdir(path_.c_str());
}

}  // namespace tessera::testing
