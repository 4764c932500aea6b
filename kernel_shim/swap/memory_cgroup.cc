#include "kernel_shim/swap/memory_cgroup.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "common/clock.h"

namespace tessera::kernel_shim {
namespace {

constexpr const char* kRoot = "/sys/fs/cgroup/memory";

Status WriteValue(const std::string& path, const std::string& value) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("open ", path);
  const ssize_t n = ::write(fd, value.data(), value.size());
  const int err = errno;
  ::close(fd);
  if (n != static_cast<ssize_t>(value.size())) {
    if (err == EBUSY)
      return Unavailable("write ", value, " to ", path,
                         ": the kernel could not reclaim down to it");
    errno = err;
    return ErrnoError("write ", value, " to ", path);
  }
  return Status::Ok();
}

uint64_t ReadNumber(const std::string& path) {
  std::ifstream in(path);
  uint64_t v = 0;
  in >> v;
  return v;
}

}  // namespace

Status MemoryCgroup::CheckSupported() {
  if (::geteuid() != 0) return Unsupported("needs root (cgroup-v1 memory limits and swapon)");
  if (::access((std::string(kRoot) + "/memory.limit_in_bytes").c_str(), F_OK) != 0) {
    return Unsupported("no cgroup-v1 memory controller at ", kRoot);
  }
  if (::access((std::string(kRoot) + "/memory.memsw.limit_in_bytes").c_str(), F_OK) != 0) {
    return Unsupported(
        "the cgroup-v1 memory controller has no swap accounting "
        "(memory.memsw.*; boot with swapaccount=1)");
  }
  return Status::Ok();
}

Result<std::unique_ptr<MemoryCgroup>> MemoryCgroup::Create(const std::string& name) {
  if (::geteuid() != 0) return Unsupported("a memory cgroup needs root");
  if (::access((std::string(kRoot) + "/memory.limit_in_bytes").c_str(), F_OK) != 0) {
    return Unsupported("no cgroup-v1 memory controller at ", kRoot);
  }
  if (name.empty() || name.find('/') != std::string::npos) {
    return InvalidArgument("bad cgroup name '", name, "'");
  }
  std::unique_ptr<MemoryCgroup> cg(new MemoryCgroup());
  const std::string path = std::string(kRoot) + "/" + name;
  if (::mkdir(path.c_str(), 0755) != 0) {
    if (errno == EEXIST) return AlreadyExists("memory cgroup ", path, " exists");
    return ErrnoError("mkdir ", path);
  }
  cg->path_ = path;
  return cg;
}

MemoryCgroup::~MemoryCgroup() { (void)Remove(); }

Status MemoryCgroup::SetLimit(uint64_t bytes) {
  return WriteValue(path_ + "/memory.limit_in_bytes", std::to_string(bytes));
}

Status MemoryCgroup::SetOomKillDisable(bool disable) {
  return WriteValue(path_ + "/memory.oom_control", disable ? "1" : "0");
}

Status MemoryCgroup::ResetPeak() {
  TESSERA_RETURN_IF_ERROR(WriteValue(path_ + "/memory.max_usage_in_bytes", "0"));
  if (::access((path_ + "/memory.memsw.max_usage_in_bytes").c_str(), F_OK) == 0) {
    TESSERA_RETURN_IF_ERROR(WriteValue(path_ + "/memory.memsw.max_usage_in_bytes", "0"));
  }
  return Status::Ok();
}

Status MemoryCgroup::Add(pid_t pid) {
  return WriteValue(path_ + "/cgroup.procs", std::to_string(pid));
}

bool MemoryCgroup::EnterFromChild(const char* procs_path) {
  const int fd = ::open(procs_path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[24];
  int n = 0;
  char digits[24];
  int d = 0;
  for (pid_t p = ::getpid(); p > 0; p /= 10) digits[d++] = static_cast<char>('0' + p % 10);
  while (d > 0) buf[n++] = digits[--d];
  const bool ok = ::write(fd, buf, static_cast<size_t>(n)) == n;
  ::close(fd);
  return ok;
}

MemoryCgroupStats MemoryCgroup::Stats() const {
  MemoryCgroupStats s;
  if (path_.empty()) return s;
  s.usage = ReadNumber(path_ + "/memory.usage_in_bytes");
  s.max_usage = ReadNumber(path_ + "/memory.max_usage_in_bytes");
  s.memsw_max_usage = ReadNumber(path_ + "/memory.memsw.max_usage_in_bytes");
  {
    std::ifstream in(path_ + "/memory.stat");
    std::string key;
    uint64_t v;
    while (in >> key >> v) {
      if (key == "total_swap") s.swap = v;
      if (key == "total_pgmajfault") s.pgmajfault = v;
    }
  }
  {
    std::ifstream in(path_ + "/memory.oom_control");
    std::string key;
    uint64_t v;
    while (in >> key >> v) {
      if (key == "oom_kill") s.oom_kills = v;
      if (key == "under_oom") s.under_oom = v != 0;
    }
  }
  return s;
}

Status MemoryCgroup::KillAll() {
  if (path_.empty()) return Status::Ok();
  const Deadline d = Deadline::AfterMs(10000);
  for (;;) {
    std::ifstream in(path_ + "/cgroup.procs");
    bool any = false;
    for (pid_t p; in >> p;) {
      any = true;
      ::kill(p, SIGKILL);
    }
    if (!any) return Status::Ok();
    if (d.Expired()) return Timeout("processes of ", path_, " did not exit within 10 s of SIGKILL");
    ::usleep(10000);  // Bounded wait for the killed processes to leave the cgroup.
  }
}

Status MemoryCgroup::Remove() {
  if (path_.empty()) return Status::Ok();
  Status st = KillAll();
  // A task stopped by OOM with the killer disabled needs the limit lifted to die promptly.
  (void)WriteValue(path_ + "/memory.oom_control", "0");
  const Deadline d = Deadline::AfterMs(10000);
  while (::rmdir(path_.c_str()) != 0) {
    if (errno != EBUSY || d.Expired()) {
      Status err = ErrnoError("rmdir ", path_);
      path_.clear();
      return err;
    }
    ::usleep(10000);  // Bounded wait for the last exiting task to be uncharged.
  }
  path_.clear();
  return st;
}

}  // namespace tessera::kernel_shim
