// KernelSwapDevice: one swap device of the kernel-paging peers of the benches, on while the
// object lives, removed by Stop() or the destructor (in the reverse order of its set-up):
//
//   swapfile      a file on local disk (written out), mkswap, swapon
//   zram          a zram device (hot_add, disksize), mkswap, swapon: compressed pages in RAM,
//                 the floor for kernel paging without a network
//   nbd           remote RAM the way it is done without Tessera on a kernel with no nbd module:
//                 nbdkit's memory plugin on a unix socket, nbdfuse exposing it as a file, a
//                 loop device over that file (buffered: nbdfuse refuses direct I/O), swapon
//   tessera_swap  `tessera swap on` (a FUSE file with direct I/O served from the erasure-coded
//                 store, a loop device, swapon) and `tessera swap off`
//
// Each is swapon'd at priority 32767, so it takes the swapping while it is on; turn on one at a
// time to measure one. Needs root (Unsupported otherwise, or when a tool or kernel feature is
// missing, naming it). Threads: one owner thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/subprocess.h"

namespace tessera::bench {

enum class KernelSwapKind { kSwapfile, kZram, kNbd, kTesseraSwap };
// "swapfile", "zram", "nbd", "tessera_swap".
const char* KernelSwapKindName(KernelSwapKind kind);

struct KernelSwapOptions {
  KernelSwapKind kind = KernelSwapKind::kSwapfile;
  uint64_t bytes = 0;                 // Size of the device (a multiple of 4096).
  std::string swap_dir = "/var/tmp";  // swapfile: where the file goes (local disk).
  std::string work_dir;  // nbd: sockets and mount points (a private temp dir). Required.
  std::string bin_dir;   // tessera_swap: holds tessera-swap.
  std::vector<std::string> tessera_flags;  // tessera_swap: --cluster, --auth_token_file, --k, ...
  std::string name = "bench";              // Distinguishes devices of concurrent owners.
};

class KernelSwapDevice {
 public:
  static Result<std::unique_ptr<KernelSwapDevice>> Start(const KernelSwapOptions& options);
  ~KernelSwapDevice();
  KernelSwapDevice(const KernelSwapDevice&) = delete;
  KernelSwapDevice& operator=(const KernelSwapDevice&) = delete;

  // swapoff and tear down. Idempotent; the first error is returned, every step is attempted.
  Status Stop();
  const std::string& device() const { return device_; }
  KernelSwapKind kind() const { return options_.kind; }

  // zram: the most RAM the device used since the last ResetZramPeak (mm_stat mem_used_max,
  // bytes): its compressed pages are not charged to any memory cgroup. 0 for other kinds.
  uint64_t ZramPeakBytes() const;
  void ResetZramPeak();

 private:
  KernelSwapDevice() = default;
  Status StartSwapfile();
  Status StartZram();
  Status StartNbd();
  Status StartTessera();
  Status SwapOn();

  KernelSwapOptions options_;
  std::string device_;  // What was swapon'd (empty until then).
  bool swap_on_ = false;
  std::string swapfile_;         // swapfile
  int zram_id_ = -1;             // zram
  std::string loop_;             // nbd
  std::string mount_;            // nbd
  Subprocess nbdkit_, nbdfuse_;  // nbd
  bool tessera_on_ = false;      // tessera_swap
};

}  // namespace tessera::bench
