#include "kernel_shim/pager/uffd.h"

#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "common/logging.h"

// Newer than the distribution's headers (kernel 6.6+).
#ifndef UFFD_FEATURE_POISON
#define UFFD_FEATURE_POISON (1 << 14)
#endif
#ifndef UFFDIO_POISON
struct uffdio_poison {
  struct uffdio_range range;
  __u64 mode;
  __s64 updated;
};
#define _UFFDIO_POISON (0x08)
#define UFFDIO_POISON _IOWR(UFFDIO, _UFFDIO_POISON, struct uffdio_poison)
#endif
#ifndef UFFD_FEATURE_MOVE
#define UFFD_FEATURE_MOVE (1 << 16)
#endif
#ifndef UFFDIO_MOVE
struct uffdio_move {
  __u64 dst;
  __u64 src;
  __u64 len;
  __u64 mode;
  __s64 move;
};
#define UFFDIO_MOVE_MODE_DONTWAKE ((__u64)1 << 0)
#define _UFFDIO_MOVE (0x05)
#define UFFDIO_MOVE _IOWR(UFFDIO, _UFFDIO_MOVE, struct uffdio_move)
#endif
#ifndef USERFAULTFD_IOC_NEW
#define USERFAULTFD_IOC_NEW _IO(0xAA, 0x00)
#endif

namespace tessera::kernel_shim::internal {
namespace {

constexpr int kMaxAttempts = 100000;

std::atomic<uint32_t> g_misreport_every{0};
std::atomic<uint64_t> g_moves[2];  // Moves that do not wake, that wake.

Result<UniqueFd> OpenFd() {
  int dev = ::open("/dev/userfaultfd", O_RDWR | O_CLOEXEC);
  if (dev >= 0) {
    int fd = ::ioctl(dev, USERFAULTFD_IOC_NEW, O_CLOEXEC | O_NONBLOCK);
    int e = errno;
    ::close(dev);
    if (fd >= 0) return UniqueFd(fd);
    errno = e;
  }
  int fd = static_cast<int>(::syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK));
  if (fd < 0) {
    return ErrnoError("userfaultfd unavailable (need /dev/userfaultfd access or "
                      "vm.unprivileged_userfaultfd=1 / CAP_SYS_PTRACE)");
  }
  return UniqueFd(fd);
}

}  // namespace

Result<Uffd> Uffd::Open(void* base, size_t len) {
  // Probe the features, then open the real descriptor asking for what we use.
  uint64_t features = 0;
  {
    TESSERA_ASSIGN_OR_RETURN(UniqueFd probe, OpenFd());
    uffdio_api api{};
    api.api = UFFD_API;
    if (::ioctl(probe.get(), UFFDIO_API, &api) != 0) return ErrnoError("UFFDIO_API probe");
    features = api.features;
  }
  if (!(features & UFFD_FEATURE_PAGEFAULT_FLAG_WP)) {
    return Unsupported("this kernel's userfaultfd has no write-protect mode for anonymous memory "
                       "(needed for dirty tracking)");
  }
  Uffd u;
  u.poison_ = (features & UFFD_FEATURE_POISON) != 0;
  if (!u.poison_) {
    TLOG(WARNING) << "pager: kernel lacks UFFDIO_POISON (6.6+): a page the store cannot return "
                     "is retried instead of raising SIGBUS";
  }
  u.move_ = (features & UFFD_FEATURE_MOVE) != 0;
  u.fork_events_ = (features & UFFD_FEATURE_EVENT_FORK) != 0;
  for (;;) {
    TESSERA_ASSIGN_OR_RETURN(u.fd_, OpenFd());
    uffdio_api api{};
    api.api = UFFD_API;
    api.features = UFFD_FEATURE_PAGEFAULT_FLAG_WP | (u.poison_ ? UFFD_FEATURE_POISON : 0) |
                   (u.move_ ? UFFD_FEATURE_MOVE : 0) |
                   (u.fork_events_ ? UFFD_FEATURE_EVENT_FORK : 0);
    if (::ioctl(u.fd_.get(), UFFDIO_API, &api) == 0) break;
    if (errno == EPERM && u.fork_events_) {
      // Fork events need CAP_SYS_PTRACE: without it a fork() pages the heap in (pager.h).
      TLOG(INFO) << "pager: userfaultfd fork events need CAP_SYS_PTRACE; a fork() without exec "
                    "pages the heap back in first";
      u.fork_events_ = false;
      continue;
    }
    return ErrnoError("UFFDIO_API");
  }
  TESSERA_RETURN_IF_ERROR(u.Register(base, len));
  return u;
}

Uffd Uffd::Adopt(int fd, const Uffd& parent) {
  Uffd u;
  u.fd_.Reset(fd);
  u.poison_ = parent.poison_;
  u.move_ = parent.move_;
  u.fork_events_ = parent.fork_events_;
  return u;
}

Status Uffd::Register(void* addr, size_t len) {
  uffdio_register reg{};
  reg.range = {reinterpret_cast<uintptr_t>(addr), len};
  reg.mode = UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_WP;
  if (::ioctl(fd_.get(), UFFDIO_REGISTER, &reg) != 0) {
    return ErrnoError("UFFDIO_REGISTER missing|wp");
  }
  return Status::Ok();
}

Status Uffd::Unregister(void* addr, size_t len) {
  uffdio_range r{reinterpret_cast<uintptr_t>(addr), len};
  if (::ioctl(fd_.get(), UFFDIO_UNREGISTER, &r) != 0) return ErrnoError("UFFDIO_UNREGISTER");
  return Status::Ok();
}

Status Uffd::RegisterMissing(void* base, size_t len) {
  uffdio_register reg{};
  reg.range = {reinterpret_cast<uintptr_t>(base), len};
  reg.mode = UFFDIO_REGISTER_MODE_MISSING;
  if (::ioctl(fd_.get(), UFFDIO_REGISTER, &reg) != 0) return ErrnoError("UFFDIO_REGISTER missing");
  return Status::Ok();
}

void MisreportMovesForTesting(uint32_t every) {
  g_misreport_every.store(every);
  for (auto& n : g_moves) n.store(0);
}

Result<bool> Uffd::HasPage(const void* addr) {
  UniqueFd fd(::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return ErrnoError("open /proc/self/pagemap");
  uint64_t entry = 0;
  const off_t off = static_cast<off_t>(reinterpret_cast<uintptr_t>(addr) / 4096 * sizeof entry);
  if (::pread(fd.get(), &entry, sizeof entry, off) != static_cast<ssize_t>(sizeof entry)) {
    return ErrnoError("reading /proc/self/pagemap");
  }
  return (entry >> 62) != 0;  // Bit 63: present; bit 62: swapped.
}

Status Uffd::Move(void* dst, void* src, size_t len, bool wake, size_t* moved) {
  *moved = 0;
  if (const uint32_t every = g_misreport_every.load(std::memory_order_relaxed);
      every > 0 && (g_moves[wake ? 1 : 0].fetch_add(1) + 1) % every == 0) {
    uffdio_move m{};
    m.dst = reinterpret_cast<uintptr_t>(dst);
    m.src = reinterpret_cast<uintptr_t>(src);
    m.len = 4096;
    m.mode = UFFDIO_MOVE_MODE_DONTWAKE;
    if (::ioctl(fd_.get(), UFFDIO_MOVE, &m) == 0) errno = EEXIST;
    return ErrnoError("UFFDIO_MOVE");
  }
  for (int attempt = 0; *moved < len && attempt < kMaxAttempts; ++attempt) {
    uffdio_move m{};
    m.dst = reinterpret_cast<uintptr_t>(dst) + *moved;
    m.src = reinterpret_cast<uintptr_t>(src) + *moved;
    m.len = len - *moved;
    m.mode = wake ? 0 : UFFDIO_MOVE_MODE_DONTWAKE;
    if (::ioctl(fd_.get(), UFFDIO_MOVE, &m) == 0) {
      *moved = len;
      return Status::Ok();
    }
    const int err = errno;
    if (m.move > 0) {  // A prefix moved; the kernel asks for the rest again.
      *moved += static_cast<size_t>(m.move);
      continue;
    }
    if (err != EAGAIN) {
      errno = err;
      return ErrnoError("UFFDIO_MOVE");
    }
    sched_yield();
  }
  if (*moved == len) return Status::Ok();
  return Unavailable("UFFDIO_MOVE: still EAGAIN after ", kMaxAttempts, " attempts");
}

Status Uffd::Copy(void* dst, const void* src, size_t len, bool writable, size_t* mapped) {
  *mapped = 0;
  for (int attempt = 0; *mapped < len && attempt < kMaxAttempts; ++attempt) {
    uffdio_copy c{};
    c.dst = reinterpret_cast<uintptr_t>(dst) + *mapped;
    c.src = reinterpret_cast<uintptr_t>(src) + *mapped;
    c.len = len - *mapped;
    c.mode = writable ? 0 : UFFDIO_COPY_MODE_WP;
    if (::ioctl(fd_.get(), UFFDIO_COPY, &c) == 0) {
      *mapped = len;
      return Status::Ok();
    }
    const int err = errno;
    if (c.copy > 0) {  // A prefix was mapped; the kernel asks for the rest again.
      *mapped += static_cast<size_t>(c.copy);
      continue;
    }
    if (err == EEXIST) return AlreadyExists("UFFDIO_COPY: page mapped already");
    if (err != EAGAIN) {
      errno = err;
      return ErrnoError("UFFDIO_COPY");
    }
    sched_yield();
  }
  if (*mapped == len) return Status::Ok();
  return Unavailable("UFFDIO_COPY: still EAGAIN after ", kMaxAttempts, " attempts");
}

void Uffd::Wake(void* addr, size_t len) {
  uffdio_range r{reinterpret_cast<uintptr_t>(addr), len};
  ::ioctl(fd_.get(), UFFDIO_WAKE, &r);
}

Status Uffd::WriteProtect(void* addr, size_t len, bool protect, int max_attempts) {
  uffdio_writeprotect wp{};
  wp.range = {reinterpret_cast<uintptr_t>(addr), len};
  wp.mode = protect ? UFFDIO_WRITEPROTECT_MODE_WP : 0;
  for (int attempt = 0; attempt < max_attempts; ++attempt) {
    if (::ioctl(fd_.get(), UFFDIO_WRITEPROTECT, &wp) == 0) return Status::Ok();
    if (errno != EAGAIN) return ErrnoError("UFFDIO_WRITEPROTECT");
    sched_yield();
  }
  return Unavailable("UFFDIO_WRITEPROTECT: still EAGAIN after ", max_attempts, " attempts");
}

Status Uffd::Poison(void* addr, size_t len) {
  uffdio_poison po{};
  po.range = {reinterpret_cast<uintptr_t>(addr), len};
  for (int attempt = 0; attempt < kMaxAttempts; ++attempt) {
    if (::ioctl(fd_.get(), UFFDIO_POISON, &po) == 0 || errno == EEXIST) return Status::Ok();
    if (errno != EAGAIN) return ErrnoError("UFFDIO_POISON");
    sched_yield();
  }
  return Unavailable("UFFDIO_POISON: still EAGAIN after ", kMaxAttempts, " attempts");
}

}  // namespace tessera::kernel_shim::internal
