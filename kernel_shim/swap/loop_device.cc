#include "kernel_shim/swap/loop_device.h"

#include <fcntl.h>
#include <linux/loop.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include "common/clock.h"
#include "common/fd.h"
#include "common/subprocess.h"

namespace tessera::kernel_shim {

Result<LoopDevice> AttachLoop(const std::string& file, bool direct_io) {
  UniqueFd ctl(::open("/dev/loop-control", O_RDWR | O_CLOEXEC));
  if (!ctl.valid()) return ErrnoError("open /dev/loop-control (no loop device support?)");
  UniqueFd backing(::open(file.c_str(), O_RDWR | O_CLOEXEC | (direct_io ? O_DIRECT : 0)));
  if (!backing.valid() && direct_io) {
    backing = UniqueFd(::open(file.c_str(), O_RDWR | O_CLOEXEC));
    direct_io = false;
  }
  if (!backing.valid()) return ErrnoError("open ", file);
  for (int attempt = 0; attempt < 8; ++attempt) {
    const int n = ::ioctl(ctl.get(), LOOP_CTL_GET_FREE);
    if (n < 0) return ErrnoError("LOOP_CTL_GET_FREE");
    const std::string dev = "/dev/loop" + std::to_string(n);
    UniqueFd loop(::open(dev.c_str(), O_RDWR | O_CLOEXEC));
    if (!loop.valid()) return ErrnoError("open ", dev);
    loop_config cfg{};
    cfg.fd = static_cast<uint32_t>(backing.get());
    cfg.block_size = 4096;
    cfg.info.lo_flags = direct_io ? LO_FLAGS_DIRECT_IO : 0;
    std::snprintf(reinterpret_cast<char*>(cfg.info.lo_file_name), LO_NAME_SIZE, "%s", file.c_str());
    if (::ioctl(loop.get(), LOOP_CONFIGURE, &cfg) == 0) {
      loop_info64 info{};
      LoopDevice out;
      out.path = dev;
      out.direct_io = ::ioctl(loop.get(), LOOP_GET_STATUS64, &info) == 0 &&
                      (info.lo_flags & LO_FLAGS_DIRECT_IO) != 0;
      return out;
    }
    if (errno == EBUSY) continue;  // Taken between GET_FREE and CONFIGURE: ask again.
    if (direct_io && errno == EINVAL) {
      direct_io = false;  // The file refuses O_DIRECT through the loop driver: buffered.
      continue;
    }
    return ErrnoError("LOOP_CONFIGURE ", dev);
  }
  return Unavailable("no free loop device after 8 attempts");
}

Status DetachLoop(const std::string& device) {
  UniqueFd loop(::open(device.c_str(), O_RDWR | O_CLOEXEC));
  if (!loop.valid()) return ErrnoError("open ", device);
  if (::ioctl(loop.get(), LOOP_CLR_FD) != 0 && errno != ENXIO) {
    return ErrnoError("LOOP_CLR_FD ", device);
  }
  return Status::Ok();
}

Status MakeSwap(const std::string& device, const std::string& label) {
  auto mk = Subprocess::Start({"mkswap", "-L", label, device}, Subprocess::Options{true, true, {}});
  if (!mk.ok()) return mk.status().WithContext("mkswap");
  auto ws = mk->Wait(Deadline::AfterMs(120000));
  if (!ws.ok()) return ws.status().WithContext("mkswap " + device);
  if (!WIFEXITED(*ws) || WEXITSTATUS(*ws) != 0) return Unavailable("mkswap ", device, " failed");
  return Status::Ok();
}

}  // namespace tessera::kernel_shim
