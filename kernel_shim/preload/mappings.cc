// The program's anonymous mappings in libtessera_preload.so: the interposed mmap, munmap,
// mprotect, mlock, mlock2, mlockall, madvise and mremap, and the parts of the region they take
// out of paging or give back (see "Anonymous memory" in shim.cc's comment).
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>

#include "kernel_shim/pager/pager.h"
#include "kernel_shim/preload/range_allocator.h"
#include "kernel_shim/preload/shim_state.h"
#include "kernel_shim/preload/span_map.h"

namespace tessera::kernel_shim::shim {

const char* const kLeftOutKey[kLeftKinds] = {"shared",  "file",    "locked",     "stack",
                                             "hugetlb", "outside", "region_full"};
SpanMap* g_unpaged = nullptr;
SpanMap* g_left = nullptr;
std::atomic<uint64_t> g_unpaged_anon_peak{0};
std::atomic<uint64_t> g_registration_errors{0};
std::atomic<uint64_t> g_discard_errors{0};

void DiscardRange(void* addr, size_t len) {
  if (len == 0) return;
  // In a forked child too: the pager tells the parent's monitor that the pages read as zeros
  // now (or, when the child holds a private copy, just drops them).
  BypassScope bypass;
  Status st = g_pager->Discard(addr, len);
  if (!st.ok() && g_discard_errors.fetch_add(1) == 0) {
    RawWrite(2, "tessera preload: Pager::Discard failed: ");
    RawWrite(2, st.ToString().c_str());
    RawWrite(2, "\n");
  }
}

uint64_t RssAnonBytes() {
  int fd = ::open("/proc/self/status", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char buf[4096];
  ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
  ::close(fd);
  if (n <= 0) return 0;
  buf[n] = 0;
  const char* p = strstr(buf, "RssAnon:");
  return p == nullptr ? 0 : strtoull(p + 8, nullptr, 10) * 1024;
}

namespace {

void RawWarn(const char* what, const tessera::Status& st) {
  if (g_registration_errors.fetch_add(1) != 0) return;
  RawWrite(2, "tessera preload: ");
  RawWrite(2, what);
  RawWrite(2, ": ");
  RawWrite(2, st.ToString().c_str());
  RawWrite(2, "\n");
}

// [a, a + len) of the region becomes fresh, zero, paged read/write memory, whatever it was
// (paged, unregistered, or a foreign mapping).
void ResetToPaged(uintptr_t a, size_t len) {
  if (len == 0) return;
  BypassScope bypass;
  if (!g_unpaged->Intersects(a, a + len)) {
    DiscardRange(reinterpret_cast<void*>(a), len);
    return;
  }
  Status st = g_pager->Unregister(reinterpret_cast<void*>(a), len, /*keep_content=*/false);
  if (!st.ok()) {
    // The pager still pages parts of it: replacing the mapping under it would lose them. The
    // range stays as it is, out of the allocator (never handed out again).
    RawWarn("Pager::Unregister", st);
    g_unpaged->Set(a, a + len, kForeign);
    return;
  }
  if (RawMmap(reinterpret_cast<void*>(a), len, PROT_READ | PROT_WRITE,
              MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0) == MAP_FAILED) {
    // The range stays out of paging (still counted as such); never reused while unpaged.
    RawWarn("re-creating a part of the paged region", ErrnoError("mmap"));
    g_unpaged->Set(a, a + len, kForeign);
    return;
  }
  RawMadvise(reinterpret_cast<void*>(a), len, MADV_NOHUGEPAGE);
  st = g_pager->Register(reinterpret_cast<void*>(a), len);
  if (!st.ok()) {
    RawWarn("Pager::Register", st);
    g_unpaged->Set(a, a + len, kForeign);
    return;
  }
  g_unpaged->Erase(a, a + len);
  g_left->Erase(a, a + len);
}

// Protection `prot` on [a, a + len) of the region: readable pages stay (or become again)
// paged; pages without read access are taken out of paging first (their content kept).
int SetRegionProt(uintptr_t a, size_t len, int prot) {
  BypassScope bypass;
  if (prot & PROT_READ) {
    if (RawMprotect(a, len, prot) != 0) return -1;
    for (const SpanMap::Part& part : g_unpaged->Parts(a, a + len)) {
      if (part.tag != kNoAccess) continue;
      Status st = g_pager->Register(reinterpret_cast<void*>(part.start), part.end - part.start);
      if (!st.ok()) {
        RawWarn("Pager::Register", st);
        continue;
      }
      g_unpaged->Erase(part.start, part.end);
    }
    return 0;
  }
  for (const SpanMap::Part& part : g_unpaged->Parts(a, a + len)) {
    if (part.tag != SpanMap::kNone) continue;
    Status st = g_pager->Unregister(reinterpret_cast<void*>(part.start), part.end - part.start,
                                    /*keep_content=*/true);
    if (!st.ok()) {
      RawWarn("Pager::Unregister", st);
      errno = ENOMEM;
      return -1;
    }
    g_unpaged->Set(part.start, part.end, kNoAccess);
  }
  return RawMprotect(a, len, prot);
}

// mlock on [a, a + len) of the region: its pages leave paging for good (until unmapped).
void LockRegion(uintptr_t a, size_t len) {
  BypassScope bypass;
  for (const SpanMap::Part& part : g_unpaged->Parts(a, a + len)) {
    if (part.tag == kLocked || part.tag == kForeign) continue;
    if (part.tag == SpanMap::kNone) {
      Status st = g_pager->Unregister(reinterpret_cast<void*>(part.start), part.end - part.start,
                                      /*keep_content=*/true);
      if (!st.ok()) {
        RawWarn("Pager::Unregister", st);
        continue;
      }
    }
    g_unpaged->Set(part.start, part.end, kLocked);
    g_left->Set(part.start, part.end, kLeftLocked);
  }
}

// Whether a mapping of these flags can be paged: private anonymous memory, except stacks
// (the kernel writes signal frames there; a fault in that path cannot wait for the pager),
// huge pages, MAP_32BIT and MAP_LOCKED.
bool PageableFlags(int flags) {
  if ((flags & MAP_ANONYMOUS) == 0 || (flags & MAP_TYPE) != MAP_PRIVATE) return false;
  return (flags & (MAP_STACK | MAP_GROWSDOWN | MAP_HUGETLB | MAP_32BIT | MAP_LOCKED)) == 0;
}

// What a mapping the shim leaves to the kernel counts as (kLeftKinds: not counted, e.g. a
// read-only file mapping, which the kernel's page cache handles already).
int LeftOutKindOf(int prot, int flags) {
  if ((flags & MAP_ANONYMOUS) == 0 && (prot & PROT_WRITE) == 0) return kLeftKinds;
  if ((flags & MAP_TYPE) != MAP_PRIVATE) return kLeftShared;
  if ((flags & MAP_ANONYMOUS) == 0) return kLeftFile;
  if (flags & MAP_LOCKED) return kLeftLocked;
  if (flags & (MAP_STACK | MAP_GROWSDOWN)) return kLeftStack;
  if (flags & MAP_HUGETLB) return kLeftHuge;
  return kLeftOutside;
}

inline bool Managing() { return !t_state.bypass && g_active.load(std::memory_order_acquire); }

}  // namespace

void ReleaseRange(void* addr, size_t len) {
  const auto a = reinterpret_cast<uintptr_t>(addr);
  ResetToPaged(a, len);
  BypassScope bypass;
  if (!g_unpaged->Intersects(a, a + len)) g_ranges->Release(a, len);
}

}  // namespace tessera::kernel_shim::shim

using namespace tessera::kernel_shim;        // NOLINT: the exported C entry points below.
using namespace tessera::kernel_shim::shim;  // NOLINT

extern "C" {

void* mmap(void* addr, size_t len, int prot, int flags, int fd, off_t off) noexcept {
  if (!Managing() || len == 0) return RawMmap(addr, len, prot, flags, fd, off);
  const auto a = reinterpret_cast<uintptr_t>(addr);
  const size_t rounded = (len + kPage - 1) & ~(kPage - 1);
  const bool fixed = (flags & (MAP_FIXED | MAP_FIXED_NOREPLACE)) != 0;
  if (fixed && RangeTouchesRegion(addr, rounded)) {
    if (a % kPage != 0 || !RangeInRegion(addr, rounded)) {
      errno = EINVAL;  // Straddles the paged region's edge: no program asks for that.
      return MAP_FAILED;
    }
    BypassScope bypass;
    if ((flags & MAP_FIXED_NOREPLACE) && !(flags & MAP_FIXED) && !g_ranges->IsFree(a, rounded)) {
      errno = EEXIST;
      return MAP_FAILED;
    }
    g_ranges->Claim(a, rounded);
    if (PageableFlags(flags)) {
      // A fresh private anonymous mapping over a part of the region (a runtime committing or
      // decommitting its reservation): zeros, paged, then the asked protection.
      ResetToPaged(a, rounded);
      if (prot != (PROT_READ | PROT_WRITE) && SetRegionProt(a, rounded, prot) != 0) {
        return MAP_FAILED;
      }
      g_mmaps.fetch_add(1, std::memory_order_relaxed);
      return addr;
    }
    // A file, shared or other mapping the pager cannot page, over a part of the region.
    tessera::Status st = g_pager->Unregister(addr, rounded, /*keep_content=*/false);
    if (!st.ok()) {
      RawWarn("Pager::Unregister", st);
      errno = ENOMEM;
      return MAP_FAILED;
    }
    g_unpaged->Set(a, a + rounded, kForeign);
    void* r = RawMmap(addr, len, prot, flags, fd, off);
    if (r == MAP_FAILED) {
      const int err = errno;
      ResetToPaged(a, rounded);
      if (!g_unpaged->Intersects(a, a + rounded)) g_ranges->Release(a, rounded);
      errno = err;
      return MAP_FAILED;
    }
    const int kind = LeftOutKindOf(prot, flags);
    if (kind < kLeftKinds) g_left->Set(a, a + rounded, kind);
    return r;
  }
  if (!fixed && PageableFlags(flags)) {
    uintptr_t got = 0;
    {
      BypassScope bypass;
      // The program's address hint is honoured when it falls on a free part of the region.
      if (a != 0 && a % kPage == 0 && RangeInRegion(addr, rounded) &&
          g_ranges->AllocateAt(a, rounded)) {
        got = a;
      } else {
        got = g_ranges->Allocate(rounded, kPage);
      }
    }
    if (got != 0) {
      if (prot != (PROT_READ | PROT_WRITE) && SetRegionProt(got, rounded, prot) != 0) {
        const int err = errno;
        ReleaseRange(reinterpret_cast<void*>(got), rounded);
        errno = err;
        return MAP_FAILED;
      }
      g_mmaps.fetch_add(1, std::memory_order_relaxed);
      return reinterpret_cast<void*>(got);
    }
    void* r = RawMmap(addr, len, prot, flags, fd, off);  // The region is full.
    // A reservation without access holds no memory (a wasm guard region can be many GB):
    // counted only when mapped accessible.
    if (r != MAP_FAILED && prot != PROT_NONE) {
      BypassScope bypass;
      g_left->Set(reinterpret_cast<uintptr_t>(r), reinterpret_cast<uintptr_t>(r) + rounded,
                  kLeftRegionFull);
    }
    return r;
  }
  void* r = RawMmap(addr, len, prot, flags, fd, off);
  if (r != MAP_FAILED) {
    const int kind = LeftOutKindOf(prot, flags);
    BypassScope bypass;
    const auto b = reinterpret_cast<uintptr_t>(r);
    if (kind < kLeftKinds)
      g_left->Set(b, b + rounded, kind);
    else
      g_left->Erase(b, b + rounded);
  }
  return r;
}
void* mmap64(void* addr, size_t len, int prot, int flags, int fd, off_t off) noexcept
    __attribute__((alias("mmap")));

int munmap(void* addr, size_t len) noexcept {
  if (!Managing() || len == 0) return RawMunmap(addr, len);
  const size_t rounded = (len + kPage - 1) & ~(kPage - 1);
  const auto a = reinterpret_cast<uintptr_t>(addr);
  if (RangeTouchesRegion(addr, rounded)) {
    if (a % kPage != 0 || !RangeInRegion(addr, rounded)) {
      errno = EINVAL;
      return -1;
    }
    ReleaseRange(addr, rounded);
    return 0;
  }
  int r = RawMunmap(addr, len);
  if (r == 0) {
    BypassScope bypass;
    g_left->Erase(a, a + rounded);
  }
  return r;
}

int mprotect(void* addr, size_t len, int prot) noexcept {
  const auto a = reinterpret_cast<uintptr_t>(addr);
  const size_t rounded = (len + kPage - 1) & ~(kPage - 1);
  if (!Managing() || len == 0 || !RangeTouchesRegion(addr, rounded)) {
    return RawMprotect(a, len, prot);
  }
  if (a % kPage != 0 || !RangeInRegion(addr, rounded)) {
    errno = EINVAL;
    return -1;
  }
  return SetRegionProt(a, rounded, prot);
}

int mlock(const void* addr, size_t len) noexcept {
  const auto a = reinterpret_cast<uintptr_t>(addr) & ~(kPage - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(addr) + len + kPage - 1) & ~(kPage - 1);
  if (Managing() && len != 0) {
    if (RangeTouchesRegion(reinterpret_cast<void*>(a), end - a)) {
      const uintptr_t s = a < g_region_base ? g_region_base : a;
      const uintptr_t e = end > g_region_end ? g_region_end : end;
      LockRegion(s, e - s);
    } else {
      BypassScope bypass;
      g_left->Set(a, end, kLeftLocked);
    }
  }
  return static_cast<int>(syscall(SYS_mlock, addr, len));
}

int mlock2(const void* addr, size_t len, unsigned int flags) noexcept {
  const auto a = reinterpret_cast<uintptr_t>(addr) & ~(kPage - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(addr) + len + kPage - 1) & ~(kPage - 1);
  if (Managing() && len != 0 && RangeTouchesRegion(reinterpret_cast<void*>(a), end - a)) {
    const uintptr_t s = a < g_region_base ? g_region_base : a;
    const uintptr_t e = end > g_region_end ? g_region_end : end;
    LockRegion(s, e - s);
  }
  return static_cast<int>(syscall(SYS_mlock2, addr, len, flags));
}

// mlockall would lock (and so fault in) the whole paged region: refused, once with a warning.
int mlockall(int flags) noexcept {
  if (!g_active.load(std::memory_order_acquire) || g_child) {
    return static_cast<int>(syscall(SYS_mlockall, flags));
  }
  static std::atomic<bool> warned{false};
  if (!warned.exchange(true)) {
    RawWrite(2, "tessera preload: mlockall refused (EPERM): the heap is paged to remote memory\n");
  }
  errno = EPERM;
  return -1;
}

int madvise(void* addr, size_t len, int advice) noexcept {
  if (Managing() && len != 0 && RangeTouchesRegion(addr, len)) {
    if (reinterpret_cast<uintptr_t>(addr) % kPage != 0 || !RangeInRegion(addr, len)) {
      errno = EINVAL;
      return -1;
    }
    const auto a = reinterpret_cast<uintptr_t>(addr);
    const size_t rounded = (len + kPage - 1) & ~(kPage - 1);
    switch (advice) {
      case MADV_DONTNEED:
      case MADV_FREE:
      case MADV_REMOVE: {
        std::vector<SpanMap::Part> parts;
        {
          BypassScope bypass;
          parts = g_unpaged->Parts(a, a + rounded);
        }
        for (const SpanMap::Part& part : parts) {
          if (part.tag == SpanMap::kNone) {
            DiscardRange(reinterpret_cast<void*>(part.start), part.end - part.start);
          } else if (part.tag != kForeign || advice != MADV_REMOVE) {
            RawMadvise(reinterpret_cast<void*>(part.start), part.end - part.start,
                       advice == MADV_REMOVE ? MADV_DONTNEED : advice);
          }
        }
        BypassScope bypass;
        parts.clear();
        parts.shrink_to_fit();
        return 0;
      }
      case MADV_NORMAL:
      case MADV_RANDOM:
      case MADV_SEQUENTIAL:
      case MADV_WILLNEED:
      case MADV_HUGEPAGE:
      case MADV_NOHUGEPAGE:
      case MADV_DONTDUMP:
      case MADV_DODUMP:
      case MADV_COLD:
      case MADV_PAGEOUT:
      case MADV_MERGEABLE:
      case MADV_UNMERGEABLE:
        return 0;  // Hints: the pager decides what is resident.
      default:
        // DONTFORK, WIPEONFORK, HWPOISON, ...: not supported on paged memory.
        errno = EINVAL;
        return -1;
    }
  }
  return RawMadvise(addr, len, advice);
}

void* mremap(void* old_addr, size_t old_size, size_t new_size, int flags, ...) noexcept {
  void* new_addr = nullptr;
  if (flags & MREMAP_FIXED) {
    va_list ap;
    va_start(ap, flags);
    new_addr = va_arg(ap, void*);
    va_end(ap);
  }
  if (Managing() && RangeTouchesRegion(old_addr, old_size == 0 ? 1 : old_size)) {
    const uintptr_t old = reinterpret_cast<uintptr_t>(old_addr);
    old_size = (old_size + kPage - 1) & ~(kPage - 1);
    new_size = (new_size + kPage - 1) & ~(kPage - 1);
    if (old % kPage != 0 || old_size == 0 || new_size == 0 ||
        (flags & ~MREMAP_MAYMOVE) != 0 || !RangeInRegion(old_addr, old_size)) {
      errno = EINVAL;  // MREMAP_FIXED / MREMAP_DONTUNMAP are not supported on paged memory.
      return MAP_FAILED;
    }
    if (new_size <= old_size) {
      if (new_size < old_size) ReleaseRange(reinterpret_cast<void*>(old + new_size), old_size - new_size);
      return old_addr;
    }
    bool unpaged;
    {
      BypassScope bypass;
      unpaged = g_unpaged->Intersects(old, old + old_size);
      if (!unpaged && g_ranges->AllocateAt(old + old_size, new_size - old_size)) return old_addr;
    }
    if ((flags & MREMAP_MAYMOVE) == 0) {
      errno = ENOMEM;
      return MAP_FAILED;
    }
    if (unpaged) {
      // Parts of it are not paged (protections, a foreign mapping): the kernel moves it out of
      // the region, where it stays unpaged, and the hole it leaves is paged memory again.
      {
        BypassScope bypass;
        tessera::Status st = g_pager->Unregister(old_addr, old_size, /*keep_content=*/true);
        if (!st.ok()) {
          RawWarn("Pager::Unregister", st);
          errno = ENOMEM;
          return MAP_FAILED;
        }
        g_unpaged->Set(old, old + old_size, kForeign);
      }
      long r = syscall(SYS_mremap, old_addr, old_size, new_size, MREMAP_MAYMOVE);
      if (r == -1) return MAP_FAILED;
      ReleaseRange(old_addr, old_size);
      BypassScope bypass;
      g_left->Set(static_cast<uintptr_t>(r), static_cast<uintptr_t>(r) + new_size, kLeftOutside);
      return reinterpret_cast<void*>(r);
    }
    uintptr_t a;
    {
      BypassScope bypass;
      a = g_ranges->Allocate(new_size, kPage);
    }
    if (a == 0) {
      errno = ENOMEM;
      return MAP_FAILED;
    }
    memcpy(reinterpret_cast<void*>(a), old_addr, old_size);
    ReleaseRange(old_addr, old_size);
    return reinterpret_cast<void*>(a);
  }
  if (flags & MREMAP_FIXED) {
    return reinterpret_cast<void*>(syscall(SYS_mremap, old_addr, old_size, new_size, flags, new_addr));
  }
  long r = syscall(SYS_mremap, old_addr, old_size, new_size, flags);
  return r == -1 ? MAP_FAILED : reinterpret_cast<void*>(r);
}

}  // extern "C"
