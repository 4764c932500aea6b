// Loop devices over a file, attached and detached with the loop ioctls (no losetup needed):
// the block device a kernel swap device is made on when the storage is a file (a FUSE file of
// `tessera swap`, an nbdfuse file, ...). Thread-safe (no shared state).
#pragma once

#include <string>

#include "common/status.h"

namespace tessera::kernel_shim {

struct LoopDevice {
  std::string path;        // /dev/loopN
  bool direct_io = false;  // The loop device reads and writes the file with O_DIRECT.
};

// Attaches a free loop device to `file` with a 4096-byte logical block size. With `direct_io`
// it asks for O_DIRECT and falls back to buffered I/O when the file or kernel refuses it (see
// LoopDevice::direct_io for what was granted).
Result<LoopDevice> AttachLoop(const std::string& file, bool direct_io);
// Detaches it (LOOP_CLR_FD); OK when nothing is attached.
Status DetachLoop(const std::string& device);
// Runs mkswap on `device` with `label` (bounded: 120 s).
Status MakeSwap(const std::string& device, const std::string& label);

}  // namespace tessera::kernel_shim
