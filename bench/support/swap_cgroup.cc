#include "bench/support/swap_cgroup.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/swap.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "common/clock.h"
#include "common/subprocess.h"

namespace tessera::bench {
namespace {

std::atomic<SwapCgroup*> g_active{nullptr};

void TeardownActive() {
  if (SwapCgroup* s = g_active.load()) s->Teardown();
}

void OnSignal(int sig) {
  TeardownActive();
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

}  // namespace

Status SwapCgroup::Setup(const std::string& swap_dir, const std::string& name,
                         uint64_t swap_bytes) {
  if (::geteuid() != 0) return Unsupported("Linux swap comparison needs root");
  struct stat st;
  if (::stat("/sys/fs/cgroup/memory/memory.limit_in_bytes", &st) != 0) {
    return Unsupported("no cgroup-v1 memory controller at /sys/fs/cgroup/memory");
  }
  SwapCgroup* expected = nullptr;
  if (!g_active.compare_exchange_strong(expected, this)) {
    return InvalidArgument("a swap cgroup is already set up in this process");
  }
  std::snprintf(swapfile_, sizeof swapfile_, "%s/%s-swap-%d", swap_dir.c_str(), name.c_str(),
                static_cast<int>(::getpid()));
  static bool handlers = false;
  if (!handlers) {
    handlers = true;
    ::atexit(TeardownActive);
    ::signal(SIGINT, OnSignal);
    ::signal(SIGTERM, OnSignal);
    ::signal(SIGHUP, OnSignal);
  }
  {
    // Written out (not fallocated): swap files must have no holes or unwritten extents.
    FILE* f = std::fopen(swapfile_, "w");
    if (!f) return ErrnoError("create ", swapfile_);
    std::vector<char> zeros(1 << 20);
    for (uint64_t done = 0; done < swap_bytes; done += zeros.size()) {
      if (std::fwrite(zeros.data(), 1, zeros.size(), f) != zeros.size()) {
        std::fclose(f);
        return ErrnoError("write ", swapfile_);
      }
    }
    std::fclose(f);
    ::chmod(swapfile_, 0600);
  }
  auto mk = Subprocess::Start({"mkswap", swapfile_}, Subprocess::Options{true, true, {}});
  if (!mk.ok()) return mk.status().WithContext("mkswap");
  auto ws = mk->Wait(Deadline::AfterMs(60000));
  if (!ws.ok() || !WIFEXITED(*ws) || WEXITSTATUS(*ws) != 0) return Unavailable("mkswap failed");
  if (::swapon(swapfile_, 0) != 0) return ErrnoError("swapon ", swapfile_);
  swap_on_ = true;
  std::snprintf(cgroup_, sizeof cgroup_, "/sys/fs/cgroup/memory/%s-%d", name.c_str(),
                static_cast<int>(::getpid()));
  if (::mkdir(cgroup_, 0755) != 0) {
    Status err = ErrnoError("mkdir ", cgroup_);
    cgroup_[0] = 0;
    return err;
  }
  return Status::Ok();
}

Status SwapCgroup::SetLimit(uint64_t bytes) {
  if (!active()) return InvalidArgument("no swap cgroup is set up");
  const std::string path = std::string(cgroup_) + "/memory.limit_in_bytes";
  std::ofstream f(path);
  f << bytes;
  f.flush();
  if (!f) return Internal("cannot write ", path);
  return Status::Ok();
}

std::vector<std::string> SwapCgroup::Wrap(const std::vector<std::string>& argv) const {
  std::string cmd = "echo $$ > " + std::string(cgroup_) + "/cgroup.procs && exec";
  for (const auto& a : argv) cmd += " '" + a + "'";
  return {"/bin/sh", "-c", cmd};
}

void SwapCgroup::Teardown() {
  if (cgroup_[0]) {
    ::rmdir(cgroup_);
    cgroup_[0] = 0;
  }
  if (swap_on_.exchange(false)) ::swapoff(swapfile_);
  if (swapfile_[0]) {
    ::unlink(swapfile_);
    swapfile_[0] = 0;
  }
  SwapCgroup* self = this;
  g_active.compare_exchange_strong(self, nullptr);
}

}  // namespace tessera::bench
