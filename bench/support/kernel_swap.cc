#include "bench/support/kernel_swap.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/swap.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "common/clock.h"
#include "kernel_shim/swap/loop_device.h"

namespace tessera::bench {
namespace {

Status WriteSys(const std::string& path, const std::string& value) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("open ", path);
  const ssize_t n = ::write(fd, value.data(), value.size());
  const int err = errno;
  ::close(fd);
  if (n != static_cast<ssize_t>(value.size())) {
    errno = err;
    return ErrnoError("write ", value, " to ", path);
  }
  return Status::Ok();
}

bool Executable(const char* path) { return ::access(path, X_OK) == 0; }

// The path of `tool` in /usr/bin, /usr/sbin, /bin or /sbin; empty when it is not installed.
std::string FindTool(const char* tool) {
  for (const char* dir : {"/usr/bin/", "/usr/sbin/", "/bin/", "/sbin/"}) {
    const std::string p = std::string(dir) + tool;
    if (Executable(p.c_str())) return p;
  }
  return "";
}

// Runs argv to completion (bounded); its output in the error.
Status RunTool(const std::vector<std::string>& argv, std::string* out, int timeout_ms = 300000) {
  auto p = Subprocess::Start(argv, Subprocess::Options{true, true, {}});
  if (!p.ok()) return p.status().WithContext(argv[0]);
  std::string all;
  const Deadline d = Deadline::AfterMs(static_cast<uint64_t>(timeout_ms));
  for (;;) {
    auto line = p->ReadLine(d);
    if (!line.ok()) break;
    all += *line + "\n";
  }
  auto ws = p->Wait(Deadline::AfterMs(static_cast<uint64_t>(timeout_ms)));
  if (out) *out = all;
  if (!ws.ok()) return ws.status().WithContext(argv[0]);
  if (!WIFEXITED(*ws) || WEXITSTATUS(*ws) != 0) {
    std::string cmd;
    for (const auto& a : argv) cmd += (cmd.empty() ? "" : " ") + a;
    return Unavailable("`", cmd, "` failed", all.empty() ? "" : ": " + all);
  }
  return Status::Ok();
}

}  // namespace

const char* KernelSwapKindName(KernelSwapKind kind) {
  switch (kind) {
    case KernelSwapKind::kSwapfile:
      return "swapfile";
    case KernelSwapKind::kZram:
      return "zram";
    case KernelSwapKind::kNbd:
      return "nbd";
    case KernelSwapKind::kTesseraSwap:
      return "tessera_swap";
  }
  return "?";
}

Result<std::unique_ptr<KernelSwapDevice>> KernelSwapDevice::Start(const KernelSwapOptions& o) {
  if (::geteuid() != 0) return Unsupported("kernel swap devices need root");
  if (o.bytes < (16ull << 20) || o.bytes % 4096 != 0) {
    return InvalidArgument("swap device size must be a multiple of 4096 of at least 16 MiB");
  }
  std::unique_ptr<KernelSwapDevice> d(new KernelSwapDevice());
  d->options_ = o;
  Status st;
  switch (o.kind) {
    case KernelSwapKind::kSwapfile:
      st = d->StartSwapfile();
      break;
    case KernelSwapKind::kZram:
      st = d->StartZram();
      break;
    case KernelSwapKind::kNbd:
      st = d->StartNbd();
      break;
    case KernelSwapKind::kTesseraSwap:
      st = d->StartTessera();
      break;
  }
  if (!st.ok()) {
    (void)d->Stop();
    return st;
  }
  return d;
}

KernelSwapDevice::~KernelSwapDevice() { (void)Stop(); }

Status KernelSwapDevice::SwapOn() {
  TESSERA_RETURN_IF_ERROR(kernel_shim::MakeSwap(device_, "tessera-bench"));
  if (::swapon(device_.c_str(), SWAP_FLAG_PREFER | 32767) != 0) {
    return ErrnoError("swapon ", device_);
  }
  swap_on_ = true;
  return Status::Ok();
}

Status KernelSwapDevice::StartSwapfile() {
  swapfile_ =
      options_.swap_dir + "/tessera-" + options_.name + "-swap-" + std::to_string(::getpid());
  // Written out (not fallocated): swap files must have no holes or unwritten extents.
  FILE* f = std::fopen(swapfile_.c_str(), "w");
  if (!f) return ErrnoError("create ", swapfile_);
  std::vector<char> zeros(1 << 20);
  for (uint64_t done = 0; done < options_.bytes; done += zeros.size()) {
    if (std::fwrite(zeros.data(), 1, zeros.size(), f) != zeros.size()) {
      std::fclose(f);
      return ErrnoError("write ", swapfile_);
    }
  }
  if (std::fclose(f) != 0) return ErrnoError("close ", swapfile_);
  ::chmod(swapfile_.c_str(), 0600);
  device_ = swapfile_;
  return SwapOn();
}

Status KernelSwapDevice::StartZram() {
  if (::access("/sys/class/zram-control/hot_add", R_OK) != 0) {
    return Unsupported("no zram in this kernel (/sys/class/zram-control is missing)");
  }
  std::ifstream add("/sys/class/zram-control/hot_add");
  int id = -1;
  if (!(add >> id) || id < 0) return Unavailable("zram hot_add failed");
  zram_id_ = id;
  const std::string sys = "/sys/block/zram" + std::to_string(id);
  TESSERA_RETURN_IF_ERROR(WriteSys(sys + "/disksize", std::to_string(options_.bytes)));
  device_ = "/dev/zram" + std::to_string(id);
  return SwapOn();
}

Status KernelSwapDevice::StartNbd() {
  const std::string nbdkit = FindTool("nbdkit"), nbdfuse = FindTool("nbdfuse");
  if (nbdkit.empty() || nbdfuse.empty()) {
    return Unsupported("nbdkit or nbdfuse is not installed (Debian packages nbdkit, libnbd-bin)");
  }
  if (::access("/dev/fuse", R_OK | W_OK) != 0) return Unsupported("no /dev/fuse");
  if (options_.work_dir.empty()) return InvalidArgument("nbd swap needs a work_dir");
  const std::string sock = options_.work_dir + "/nbdkit-" + options_.name + ".sock";
  mount_ = options_.work_dir + "/nbdfuse-" + options_.name;
  if (::mkdir(mount_.c_str(), 0700) != 0 && errno != EEXIST) return ErrnoError("mkdir ", mount_);
  Subprocess::Options so{false, true, {}};
  so.own_process_group = true;
  auto kit =
      Subprocess::Start({nbdkit, "-f", "-U", sock, "memory", std::to_string(options_.bytes)}, so);
  if (!kit.ok()) return kit.status().WithContext("nbdkit");
  nbdkit_ = std::move(*kit);
  const Deadline d = Deadline::AfterMs(30000);
  struct stat st;
  while (::stat(sock.c_str(), &st) != 0) {
    if (d.Expired() || nbdkit_.Poll()) return Unavailable("nbdkit did not create ", sock);
    ::usleep(10000);  // Bounded wait for the socket.
  }
  const std::string pidfile = options_.work_dir + "/nbdfuse-" + options_.name + ".pid";
  auto fuse = Subprocess::Start({nbdfuse, "-P", pidfile, mount_, "--unix", sock}, so);
  if (!fuse.ok()) return fuse.status().WithContext("nbdfuse");
  nbdfuse_ = std::move(*fuse);
  // nbdfuse writes its pid file once the file system is mounted.
  while (::stat(pidfile.c_str(), &st) != 0 || st.st_size == 0) {
    if (d.Expired() || nbdfuse_.Poll()) return Unavailable("nbdfuse did not mount ", mount_);
    ::usleep(10000);  // Bounded wait for the mount.
  }
  ::unlink(pidfile.c_str());
  auto loop = kernel_shim::AttachLoop(mount_ + "/nbd", /*direct_io=*/false);
  if (!loop.ok()) return loop.status().WithContext("loop over nbdfuse");
  loop_ = loop->path;
  device_ = loop_;
  return SwapOn();
}

Status KernelSwapDevice::StartTessera() {
  const std::string bin = options_.bin_dir + "/tessera-swap";
  if (!Executable(bin.c_str())) return Unsupported(bin, " is not built");
  std::vector<std::string> argv = {bin,           "on",     "--name",
                                   options_.name, "--size", std::to_string(options_.bytes),
                                   "--priority",  "32767"};
  argv.insert(argv.end(), options_.tessera_flags.begin(), options_.tessera_flags.end());
  std::string out;
  TESSERA_RETURN_IF_ERROR(RunTool(argv, &out));
  tessera_on_ = true;
  // "tessera swap: NAME on: /dev/loopN (...)"
  const size_t at = out.find(" on: ");
  if (at == std::string::npos) return Internal("unexpected `tessera swap on` output: ", out);
  device_ = out.substr(at + 5, out.find(' ', at + 5) - (at + 5));
  swap_on_ = false;  // `tessera swap off` owns the swapoff.
  return Status::Ok();
}

uint64_t KernelSwapDevice::ZramPeakBytes() const {
  if (zram_id_ < 0) return 0;
  std::ifstream in("/sys/block/zram" + std::to_string(zram_id_) + "/mm_stat");
  uint64_t f[5] = {};
  for (auto& v : f) in >> v;
  return f[4];  // orig_data_size compr_data_size mem_used_total mem_limit mem_used_max
}

void KernelSwapDevice::ResetZramPeak() {
  if (zram_id_ < 0) return;
  (void)WriteSys("/sys/block/zram" + std::to_string(zram_id_) + "/mem_used_max", "0");
}

Status KernelSwapDevice::Stop() {
  Status first;
  auto note = [&](Status st) {
    if (!st.ok() && first.ok()) first = std::move(st);
  };
  if (swap_on_) {
    swap_on_ = false;
    if (::swapoff(device_.c_str()) != 0) note(ErrnoError("swapoff ", device_));
  }
  if (tessera_on_) {
    tessera_on_ = false;
    note(RunTool({options_.bin_dir + "/tessera-swap", "off", "--name", options_.name}, nullptr));
  }
  if (!loop_.empty()) {
    note(kernel_shim::DetachLoop(loop_));
    loop_.clear();
  }
  if (!mount_.empty()) {
    if (nbdfuse_.running()) {
      ::umount2(mount_.c_str(), 0);  // nbdfuse exits when its file system is unmounted.
      auto ws = nbdfuse_.Wait(Deadline::AfterMs(20000));
      if (!ws.ok()) {
        ::umount2(mount_.c_str(), MNT_DETACH);
        (void)nbdfuse_.Stop(1000);
      }
    }
    if (nbdkit_.running()) (void)nbdkit_.Stop(5000);
    ::rmdir(mount_.c_str());
    ::unlink((options_.work_dir + "/nbdkit-" + options_.name + ".sock").c_str());
    mount_.clear();
  }
  if (zram_id_ >= 0) {
    const std::string sys = "/sys/block/zram" + std::to_string(zram_id_);
    note(WriteSys(sys + "/reset", "1"));
    note(WriteSys("/sys/class/zram-control/hot_remove", std::to_string(zram_id_)));
    zram_id_ = -1;
  }
  if (!swapfile_.empty()) {
    ::unlink(swapfile_.c_str());
    swapfile_.clear();
  }
  return first;
}

}  // namespace tessera::bench
