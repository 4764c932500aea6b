// Internal to kernel_shim/preload/: the state libtessera_preload.so's files share (shim.cc owns
// the heap, initialisation and the exported allocator; mappings.cc the program's anonymous
// mappings and what is left out of paging). See shim.cc for the design.
//
// Everything here is reached from interposed malloc/mmap calls, possibly before any static
// constructor ran: every variable is constant-initialised (no dynamic initialiser), and all
// of it has hidden visibility (one object, direct references, never exported).
#pragma once

#include <pthread.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/status.h"

namespace tessera::client {
class PageStore;
}
namespace tessera::kernel_shim {
class CompressedTier;
class Pager;
class RangeAllocator;
class SpanMap;
}  // namespace tessera::kernel_shim

#pragma GCC visibility push(hidden)
namespace tessera::kernel_shim::shim {

constexpr size_t kPage = 4096;

// ---- raw system calls (never the interposed ones) ----
inline void* RawMmap(void* addr, size_t len, int prot, int flags, int fd, off_t off) {
  long r = syscall(SYS_mmap, addr, len, prot, flags, fd, off);
  return r == -1 ? MAP_FAILED : reinterpret_cast<void*>(r);
}
inline int RawMunmap(void* addr, size_t len) {
  return static_cast<int>(syscall(SYS_munmap, addr, len));
}
inline int RawMadvise(void* addr, size_t len, int advice) {
  return static_cast<int>(syscall(SYS_madvise, addr, len, advice));
}
inline int RawMprotect(uintptr_t a, size_t len, int prot) {
  return static_cast<int>(syscall(SYS_mprotect, a, len, prot));
}
inline void RawWrite(int fd, const char* s) {
  size_t n = strlen(s);
  while (n > 0) {
    ssize_t w = ::write(fd, s, n);
    if (w <= 0) return;
    s += w;
    n -= static_cast<size_t>(w);
  }
}

// ---- process state (defined in shim.cc) ----
// Set once initialisation finished; never cleared (a forked child stays "active" over plain
// memory).
extern std::atomic<bool> g_active;
extern bool g_child;                 // This process was forked from the paged one.
extern uintptr_t g_region_base;      // The paged region, constant once active.
extern uintptr_t g_region_end;
extern Pager* g_pager;               // Leaked on purpose (see shim.cc).
extern RangeAllocator* g_ranges;     // Free and used ranges of the region.
extern std::atomic<uint64_t> g_mmaps;

// ---- thread state (defined in shim.cc) ----
struct ThreadState {
  bool bypass;        // Allocations and mmaps of this thread use plain memory.
  bool in_tc_create;  // Creating this thread's tcache (a nested malloc must not recurse).
  bool tc_dead;       // Thread exit destroyed the tcache: use none from now on.
  unsigned tc_paged;  // Explicit tcache index + 1 (0: none yet).
};
extern constinit __attribute__((tls_model("initial-exec"))) thread_local ThreadState t_state;

class BypassScope {
 public:
  BypassScope() : prev_(t_state.bypass) { t_state.bypass = true; }
  ~BypassScope() { t_state.bypass = prev_; }
  BypassScope(const BypassScope&) = delete;
  BypassScope& operator=(const BypassScope&) = delete;

 private:
  bool prev_;
};

inline bool InRegion(const void* p) {
  auto a = reinterpret_cast<uintptr_t>(p);
  return a >= g_region_base && a < g_region_end;
}
inline bool RangeInRegion(const void* p, size_t len) {
  auto a = reinterpret_cast<uintptr_t>(p);
  return a >= g_region_base && a < g_region_end && len <= g_region_end - a;
}
inline bool RangeTouchesRegion(const void* p, size_t len) {
  auto a = reinterpret_cast<uintptr_t>(p);
  return a < g_region_end && a + len > g_region_base;
}

// ---- what is not paged (mappings.cc) ----
// Parts of the region taken out of paging (Pager::Unregister), by reason.
enum UnpagedWhy : int {
  kNoAccess = 0,  // Protection without read access (a reservation, a guard): the pager could
                  // not read such a page to write it back.
  kLocked = 1,    // mlock()ed: must stay resident.
  kForeign = 2,   // A file or shared mapping (or another kind the pager cannot page) placed
                  // over the range with MAP_FIXED.
};
// Mappings left out of paging, by kind: what the summary's "not paged" line reports.
enum LeftOutKind : int {
  kLeftShared = 0,
  kLeftFile = 1,
  kLeftLocked = 2,
  kLeftStack = 3,
  kLeftHuge = 4,
  kLeftOutside = 5,
  kLeftRegionFull = 6,
  kLeftKinds = 7,
};
extern const char* const kLeftOutKey[kLeftKinds];
extern SpanMap* g_unpaged;  // Region parts not paged (UnpagedWhy).
extern SpanMap* g_left;     // Mappings not paged (LeftOutKind), inside the region or not.
extern std::atomic<uint64_t> g_unpaged_anon_peak;  // Peak of RssAnon minus the paged resident set.
extern std::atomic<uint64_t> g_registration_errors;
extern std::atomic<uint64_t> g_discard_errors;

// Pager::Discard on [addr, addr + len), warning once if it fails.
void DiscardRange(void* addr, size_t len);
// [addr, addr + len) is fresh zero paged memory again, back in the range allocator.
void ReleaseRange(void* addr, size_t len);
// RssAnon of this process, bytes (0 if unknown).
uint64_t RssAnonBytes();

}  // namespace tessera::kernel_shim::shim
#pragma GCC visibility pop
