// libtessera_preload.so: puts an unmodified program's heap in a userfaultfd-paged region.
//
// Loaded with LD_PRELOAD by `tessera run` (apps/run), configured by the TESSERA_RUN_* variables
// of kernel_shim/preload/run_stats.h. What it does:
//
//  * At load (constructor) it binds its own dependencies' functions (see "private
//    dependencies" below), leaves its variables and LD_PRELOAD in the environment (so the
//    programs this one execs are paged too, each with its own pager: kEnvDescendant), then,
//    on a private thread with every signal blocked, it creates the erasure-coded PageStore
//    (unique random client id) and a Pager whose region becomes the heap. That thread stays as
//    the stats publisher.
//
//  * Heap: a statically linked jemalloc 5.3 whose public symbols were renamed to tjem_* at
//    build time (CMakeLists.txt), so this file defines the malloc family and jemalloc's
//    non-standard API (mallocx, mallctl, ... which redis uses) itself and routes each call:
//      - program threads: MALLOCX_ARENA(paged arena) | MALLOCX_TCACHE(the thread's explicit
//        tcache). The paged arena was created with extent hooks that carve extents out of the
//        pager region (RangeAllocator) and turn purge/decommit/dalloc into Pager::Discard;
//      - "bypass" threads (the store's and pager's threads, and any code of the shim itself):
//        jemalloc's ordinary automatic arenas and tcache, i.e. plain memory.
//      - calls from the C library, the dynamic loader, libm and libgcc (their process-wide
//        state: time zones, locales, stdio buffers, link maps) get plain memory too: pager
//        threads use that state under libc locks (localtime() when the store logs), and a
//        fault there could deadlock the pager. The caller is told by the return address.
//    Explicit tcaches keep the two kinds of memory apart: a region pointer is only ever freed
//    into a paged tcache (or no tcache), a plain pointer only into the automatic one, so a
//    bypass allocation can never return paged memory (a pager thread faulting on its own
//    region would deadlock).
//
//  * Anonymous memory: every private anonymous mmap() from program threads (any protection,
//    MAP_NORESERVE, with or without an address hint, which is honoured when it falls on a free
//    part of the region) gets a range of the region. Runtimes that reserve PROT_NONE and commit
//    with mprotect or MAP_FIXED are followed: MAP_FIXED anonymous mappings over the region are
//    fresh zero paged memory, and pages without read access are taken out of paging
//    (Pager::Unregister, content kept) until they are readable again (Pager::Register): the
//    pager must read a page to write it back. munmap, mremap and madvise(DONTNEED/FREE/REMOVE)
//    on region ranges are served from it (released ranges are discarded, so a range handed out
//    always reads as zeros). Left out, counted by kind for the summary: shared and writable
//    file mappings, stacks (MAP_STACK/GROWSDOWN), huge pages, mlocked ranges (taken out of
//    paging when mlock()ed); a file or shared mapping placed over the region with MAP_FIXED
//    takes its range out of paging until it is unmapped. mlockall() is refused (EPERM): it
//    would fault in the whole region. jemalloc's own mmap/munmap/madvise calls were renamed to
//    tessera_jemalloc_* and go straight to the kernel.
//
//  * Threads: pthread_create is wrapped only for bypass threads, whose children inherit the
//    flag. Pager threads block all signals (they inherit the init thread's mask), so the
//    program's handlers run on program threads.
//
//  * fork() (without exec): the shim's fork() calls Pager::PrepareFork() first, then
//    ChildAfterFork() in the child and ParentAfterFork(pid) in the parent: parent and child
//    share the heap's pages copy-on-write through the store, and the parent's pager serves the
//    child's faults while an evictor thread in the child keeps it under the limit (see "fork"
//    in kernel_shim/pager/pager.h; where that cannot be, the heap is paged in first and the
//    child gets a full private copy). The child releases memory through its pager object too.
//    If PrepareFork fails, fork() fails with ENOMEM rather than give the child zero pages.
//    vfork/posix_spawn/system share the parent's memory until exec
//    (the parent's pager serves any fault meanwhile); after exec the new program is paged by
//    its own pager (a child that exits with _exit() publishes its live stats only).
//
//  * At exit (library destructor, after the program's own destructors) the final stats are
//    written for the launcher; a live snapshot is rewritten every 500 ms meanwhile. The pager
//    and store are deliberately never torn down: the program may still touch its heap from
//    later exit code, and the process is about to go away.
#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "client/remote_store.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/units.h"
#include "fabric/auth.h"
#include "fabric/credential.h"
#include "kernel_shim/pager/pager.h"
#include "kernel_shim/preload/range_allocator.h"
#include "kernel_shim/preload/run_stats.h"
#include "kernel_shim/preload/span_map.h"

// ---- jemalloc, renamed -------------------------------------------------------------------
extern "C" {
struct tjem_extent_hooks;
typedef void* (*tjem_alloc_fn)(tjem_extent_hooks*, void*, size_t, size_t, bool*, bool*, unsigned);
typedef bool (*tjem_dalloc_fn)(tjem_extent_hooks*, void*, size_t, bool, unsigned);
typedef void (*tjem_destroy_fn)(tjem_extent_hooks*, void*, size_t, bool, unsigned);
typedef bool (*tjem_commit_fn)(tjem_extent_hooks*, void*, size_t, size_t, size_t, unsigned);
typedef bool (*tjem_split_fn)(tjem_extent_hooks*, void*, size_t, size_t, size_t, bool, unsigned);
typedef bool (*tjem_merge_fn)(tjem_extent_hooks*, void*, size_t, void*, size_t, bool, unsigned);
// Same layout as jemalloc 5's extent_hooks_t.
struct tjem_extent_hooks {
  tjem_alloc_fn alloc;
  tjem_dalloc_fn dalloc;
  tjem_destroy_fn destroy;
  tjem_commit_fn commit;
  tjem_commit_fn decommit;
  tjem_commit_fn purge_lazy;
  tjem_commit_fn purge_forced;
  tjem_split_fn split;
  tjem_merge_fn merge;
};

void* tjem_malloc(size_t);
void tjem_free(void*);
void* tjem_mallocx(size_t, int);
void* tjem_rallocx(void*, size_t, int);
size_t tjem_xallocx(void*, size_t, size_t, int);
size_t tjem_sallocx(const void*, int);
void tjem_dallocx(void*, int);
void tjem_sdallocx(void*, size_t, int);
size_t tjem_nallocx(size_t, int);
int tjem_mallctl(const char*, void*, size_t*, void*, size_t);
int tjem_mallctlnametomib(const char*, size_t*, size_t*);
int tjem_mallctlbymib(const size_t*, size_t, void*, size_t*, void*, size_t);
void tjem_malloc_stats_print(void (*)(void*, const char*), void*, const char*);
size_t tjem_malloc_usable_size(void*);
}

namespace tessera::kernel_shim {
namespace {

constexpr int MallocxLgAlign(size_t align) { return __builtin_ctzl(align); }
constexpr int kMallocxZero = 0x40;
constexpr int MallocxTcache(unsigned tc) { return static_cast<int>((tc + 2) << 8); }
constexpr int kMallocxTcacheNone = 1 << 8;
constexpr int MallocxArena(unsigned a) { return static_cast<int>((a + 1) << 20); }
constexpr size_t kPage = 4096;
// The store holds region/8 spare pages (pager.h, "fork"): the client's page tables grow by an
// eighth; a parent may write back that many pages that a forked child still reads.
constexpr uint64_t kForkSpareDivisor = 8;

// ---- raw system calls ------------------------------------------------------------------
void* RawMmap(void* addr, size_t len, int prot, int flags, int fd, off_t off) {
  long r = syscall(SYS_mmap, addr, len, prot, flags, fd, off);
  return r == -1 ? MAP_FAILED : reinterpret_cast<void*>(r);
}
int RawMunmap(void* addr, size_t len) { return static_cast<int>(syscall(SYS_munmap, addr, len)); }
int RawMadvise(void* addr, size_t len, int advice) {
  return static_cast<int>(syscall(SYS_madvise, addr, len, advice));
}
void RawWrite(int fd, const char* s) {
  size_t n = strlen(s);
  while (n > 0) {
    ssize_t w = ::write(fd, s, n);
    if (w <= 0) return;
    s += w;
    n -= static_cast<size_t>(w);
  }
}

// ---- process and thread state ------------------------------------------------------------
// Set once initialisation finished; never cleared (a forked child stays "active" over plain
// memory).
std::atomic<bool> g_active{false};
bool g_child = false;          // This process was forked from the paged one.
pid_t g_owner_pid = 0;         // The process that owns the pager.
uintptr_t g_region_base = 0;   // The paged region, constant once active.
uintptr_t g_region_end = 0;
unsigned g_paged_arena = 0;
Pager* g_pager = nullptr;                  // Leaked on purpose (see the file comment).
client::PageStore* g_store = nullptr;     // The remote store.
CompressedTier* g_tier = nullptr;         // In front of it (kEnvCompressedTier), or null.
RangeAllocator* g_ranges = nullptr;
pthread_key_t g_tcache_key;
bool g_tcache_key_ok = false;
uint64_t g_start_ns = 0;
std::string* g_stats_path = nullptr;
std::string* g_live_path = nullptr;
std::atomic<bool> g_exiting{false};
std::atomic<uint64_t> g_mmaps{0};
std::atomic<uint64_t> g_discard_errors{0};

struct ThreadState {
  bool bypass;        // Allocations and mmaps of this thread use plain memory.
  bool in_tc_create;  // Creating this thread's tcache (a nested malloc must not recurse).
  bool tc_dead;       // Thread exit destroyed the tcache: use none from now on.
  unsigned tc_paged;  // Explicit tcache index + 1 (0: none yet).
};
__attribute__((tls_model("initial-exec"))) thread_local ThreadState t_state = {};

class BypassScope {
 public:
  BypassScope() : prev_(t_state.bypass) { t_state.bypass = true; }
  ~BypassScope() { t_state.bypass = prev_; }
  BypassScope(const BypassScope&) = delete;
  BypassScope& operator=(const BypassScope&) = delete;

 private:
  bool prev_;
};

// Code of the C library, the dynamic loader and libgcc. Memory they allocate on a program
// thread (time-zone tables, locale data, stdio buffers, link maps of dlopen()ed libraries,
// ...) is process-wide state that the pager's and store's own threads use too (e.g. localtime()
// under a lock when the store logs): if it were paged, a pager thread could fault on it while
// holding that lock, and the thread that must serve the fault might be waiting for the same
// lock. So allocations whose caller is in these libraries get plain memory.
struct CodeRange {
  uintptr_t start, end;
};
constexpr int kMaxCodeRanges = 16;
CodeRange g_plain_code[kMaxCodeRanges];
int g_plain_code_count = 0;

inline bool PlainCaller(const void* ra) {
  auto a = reinterpret_cast<uintptr_t>(ra);
  for (int i = 0; i < g_plain_code_count; ++i) {
    if (a >= g_plain_code[i].start && a < g_plain_code[i].end) return true;
  }
  return false;
}

int CollectPlainCode(struct dl_phdr_info* info, size_t, void*) {
  const char* name = info->dlpi_name != nullptr ? info->dlpi_name : "";
  if (strstr(name, "/libc.so") == nullptr && strstr(name, "/ld-linux") == nullptr &&
      strstr(name, "/libgcc_s.so") == nullptr && strstr(name, "/libm.so") == nullptr) {
    return 0;
  }
  for (int i = 0; i < info->dlpi_phnum && g_plain_code_count < kMaxCodeRanges; ++i) {
    const auto& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_LOAD || (ph.p_flags & PF_X) == 0) continue;
    const uintptr_t start = info->dlpi_addr + ph.p_vaddr;
    g_plain_code[g_plain_code_count++] = {start, start + ph.p_memsz};
  }
  return 0;
}

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
inline bool PagedThread() { return g_active.load(std::memory_order_acquire) && !t_state.bypass; }

void DestroyTcache(void*) {
  if (t_state.tc_paged != 0) {
    unsigned idx = t_state.tc_paged - 1;
    t_state.tc_paged = 0;
    tjem_mallctl("tcache.destroy", nullptr, nullptr, &idx, sizeof(idx));
  }
  t_state.tc_dead = true;
}

// The tcache flag for paged allocations of this thread.
int PagedTcache() {
  ThreadState& t = t_state;
  if (t.tc_paged != 0) return MallocxTcache(t.tc_paged - 1);
  if (t.tc_dead || t.in_tc_create) return kMallocxTcacheNone;
  t.in_tc_create = true;
  unsigned idx = 0;
  size_t sz = sizeof(idx);
  if (tjem_mallctl("tcache.create", &idx, &sz, nullptr, 0) == 0) {
    t.tc_paged = idx + 1;
    if (g_tcache_key_ok) pthread_setspecific(g_tcache_key, reinterpret_cast<void*>(1));
  }
  t.in_tc_create = false;
  return t.tc_paged != 0 ? MallocxTcache(t.tc_paged - 1) : kMallocxTcacheNone;
}

inline int PagedFlags() { return MallocxArena(g_paged_arena) | PagedTcache(); }

void* Alloc(size_t n, int extra_flags, const void* caller) {
  if (n == 0) n = 1;
  if (PagedThread() && !PlainCaller(caller)) {
    void* p = tjem_mallocx(n, PagedFlags() | extra_flags);
    if (p != nullptr) return p;
    // The region is full: plain memory is better than failing.
  }
  void* p = extra_flags == 0 ? tjem_malloc(n) : tjem_mallocx(n, extra_flags);
  if (p == nullptr) errno = ENOMEM;
  return p;
}

void Free(void* p) {
  if (p == nullptr) return;
  if (g_active.load(std::memory_order_relaxed) && InRegion(p)) {
    tjem_dallocx(p, t_state.bypass ? kMallocxTcacheNone : PagedTcache());
  } else {
    tjem_free(p);
  }
}

void* Realloc(void* p, size_t n, int extra_flags, const void* caller) {
  if (p == nullptr) return Alloc(n, extra_flags, caller);
  if (n == 0) n = 1;
  const bool region = g_active.load(std::memory_order_relaxed) && InRegion(p);
  const bool paged = PagedThread() && !PlainCaller(caller);
  if (region == paged) {
    void* q = paged ? tjem_rallocx(p, n, PagedFlags() | extra_flags)
                    : tjem_rallocx(p, n, extra_flags);
    if (q == nullptr) errno = ENOMEM;
    return q;
  }
  // The block moves between plain and paged memory (e.g. allocated before the pager started).
  void* q = Alloc(n, extra_flags, caller);
  if (q == nullptr) return nullptr;
  size_t old = tjem_sallocx(p, 0);
  memcpy(q, p, old < n ? old : n);
  Free(p);
  return q;
}

void* AlignedAlloc(size_t align, size_t n, const void* caller) {
  if (align < sizeof(void*)) align = sizeof(void*);
  return Alloc(n, MallocxLgAlign(align), caller);
}

// ---- releasing region memory -------------------------------------------------------------
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

// ---- what is not paged -------------------------------------------------------------------
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
const char* const kLeftOutKey[kLeftKinds] = {"shared",  "file",    "locked",     "stack",
                                             "hugetlb", "outside", "region_full"};
SpanMap* g_unpaged = nullptr;  // Region parts not paged (UnpagedWhy).
SpanMap* g_left = nullptr;     // Mappings not paged (LeftOutKind), inside the region or not.
std::atomic<uint64_t> g_unpaged_anon_peak{0};  // Peak of RssAnon minus the paged resident set.
std::atomic<uint64_t> g_registration_errors{0};

void RawWarn(const char* what, const tessera::Status& st) {
  if (g_registration_errors.fetch_add(1) != 0) return;
  RawWrite(2, "tessera preload: ");
  RawWrite(2, what);
  RawWrite(2, ": ");
  RawWrite(2, st.ToString().c_str());
  RawWrite(2, "\n");
}

// RssAnon of this process, bytes (0 if unknown).
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

int RawMprotect(uintptr_t a, size_t len, int prot) {
  return static_cast<int>(syscall(SYS_mprotect, a, len, prot));
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

void ReleaseRange(void* addr, size_t len) {
  const auto a = reinterpret_cast<uintptr_t>(addr);
  ResetToPaged(a, len);
  BypassScope bypass;
  if (!g_unpaged->Intersects(a, a + len)) g_ranges->Release(a, len);
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

// ---- jemalloc extent hooks of the paged arena --------------------------------------------
void* HookAlloc(tjem_extent_hooks*, void* new_addr, size_t size, size_t alignment, bool* zero,
                bool* commit, unsigned) {
  BypassScope bypass;
  uintptr_t a = 0;
  if (new_addr != nullptr) {
    if (!g_ranges->AllocateAt(reinterpret_cast<uintptr_t>(new_addr), size)) return nullptr;
    a = reinterpret_cast<uintptr_t>(new_addr);
  } else {
    a = g_ranges->Allocate(size, alignment);
    if (a == 0) return nullptr;
  }
  // Free ranges always read as zeros (they were discarded when released).
  *zero = true;
  *commit = true;
  return reinterpret_cast<void*>(a);
}
bool HookDalloc(tjem_extent_hooks*, void* addr, size_t size, bool, unsigned) {
  ReleaseRange(addr, size);
  return false;
}
void HookDestroy(tjem_extent_hooks*, void* addr, size_t size, bool, unsigned) {
  ReleaseRange(addr, size);
}
bool HookCommit(tjem_extent_hooks*, void*, size_t, size_t, size_t, unsigned) { return false; }
bool HookPurge(tjem_extent_hooks*, void* addr, size_t, size_t offset, size_t length, unsigned) {
  DiscardRange(static_cast<uint8_t*>(addr) + offset, length);
  return false;
}
bool HookSplit(tjem_extent_hooks*, void*, size_t, size_t, size_t, bool, unsigned) { return false; }
bool HookMerge(tjem_extent_hooks*, void*, size_t, void*, size_t, bool, unsigned) { return false; }

tjem_extent_hooks g_hooks = {HookAlloc,  HookDalloc, HookDestroy, HookCommit, HookPurge,
                             HookPurge,  HookPurge,  HookSplit,   HookMerge};

// ---- threads -----------------------------------------------------------------------------
using PthreadCreateFn = int (*)(pthread_t*, const pthread_attr_t*, void* (*)(void*), void*);
using ForkFn = pid_t (*)();
std::atomic<PthreadCreateFn> g_real_pthread_create{nullptr};
std::atomic<ForkFn> g_real_fork{nullptr};

PthreadCreateFn RealPthreadCreate() {
  PthreadCreateFn f = g_real_pthread_create.load(std::memory_order_acquire);
  if (f == nullptr) {
    f = reinterpret_cast<PthreadCreateFn>(dlsym(RTLD_NEXT, "pthread_create"));
    g_real_pthread_create.store(f, std::memory_order_release);
  }
  return f;
}
ForkFn RealFork() {
  ForkFn f = g_real_fork.load(std::memory_order_acquire);
  if (f == nullptr) {
    f = reinterpret_cast<ForkFn>(dlsym(RTLD_NEXT, "fork"));
    g_real_fork.store(f, std::memory_order_release);
  }
  return f;
}

struct BypassStart {
  void* (*fn)(void*);
  void* arg;
};
void* BypassTrampoline(void* p) {
  t_state.bypass = true;
  BypassStart s = *static_cast<BypassStart*>(p);
  delete static_cast<BypassStart*>(p);
  return s.fn(s.arg);
}

// ---- private dependencies ----------------------------------------------------------------
// The store and the pager run inside the paged program, on shared libraries the shim needs
// (ISA-L, liburing, nettle, verbs). The dynamic linker resolves their calls through the
// global scope, where the program's executable comes first: a program that exports a function
// of the same name captures those calls. node exports OpenSSL's gf_mul(gf c, gf a, gf b), so
// ISA-L's internal calls to its own gf_mul(a, b) (and the codec's) went into OpenSSL and
// crashed the first time the store encoded a page, i.e. at the first eviction. So at load,
// before the store exists, every GOT slot of the shim and of its private dependencies that
// names a function one of those dependencies defines is bound to that definition.
constexpr int kMaxPrivate = 16;
struct PrivateObject {
  char name[128];  // DT_NEEDED name of the shim (e.g. "libisal.so.2"); "" for the shim itself.
  uintptr_t base = 0;
  const ElfW(Dyn) * dynamic = nullptr;
  uintptr_t relro_start = 0, relro_end = 0;
  void* handle = nullptr;
};
PrivateObject g_private[kMaxPrivate];
int g_private_count = 0;
uint64_t g_rebound = 0;  // GOT slots rebound (for the stats).

bool SystemLibrary(const char* name) {
  static const char* const kSystem[] = {"libc.so",  "libm.so",  "libstdc++.so",  "libgcc_s.so",
                                        "ld-linux", "libdl.so", "libpthread.so", "librt.so"};
  for (const char* s : kSystem) {
    if (strstr(name, s) != nullptr) return true;
  }
  return false;
}

uintptr_t DynPtr(uintptr_t base, ElfW(Addr) v) { return v < base ? base + v : v; }

int FindPrivateObjects(struct dl_phdr_info* info, size_t, void* self_addr) {
  const ElfW(Dyn)* dyn = nullptr;
  uintptr_t relro_start = 0, relro_end = 0;
  bool self = false;
  const auto self_a = reinterpret_cast<uintptr_t>(self_addr);
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const auto& ph = info->dlpi_phdr[i];
    if (ph.p_type == PT_DYNAMIC)
      dyn = reinterpret_cast<const ElfW(Dyn)*>(info->dlpi_addr + ph.p_vaddr);
    if (ph.p_type == PT_GNU_RELRO) {
      relro_start = info->dlpi_addr + ph.p_vaddr;
      relro_end = relro_start + ph.p_memsz;
    }
    if (ph.p_type == PT_LOAD && self_a >= info->dlpi_addr + ph.p_vaddr &&
        self_a < info->dlpi_addr + ph.p_vaddr + ph.p_memsz) {
      self = true;
    }
  }
  if (dyn == nullptr || g_private_count >= kMaxPrivate) return 0;
  const char* name = info->dlpi_name != nullptr ? info->dlpi_name : "";
  if (!self) {
    // A dependency named in the shim's DT_NEEDED list (collected from the shim first: the
    // shim is loaded before its dependencies, so dl_iterate_phdr reaches it first).
    if (g_private_count == 0) return 0;
    const PrivateObject& shim = g_private[0];
    uintptr_t strtab = 0;
    for (const ElfW(Dyn)* d = shim.dynamic; d->d_tag != DT_NULL; ++d) {
      if (d->d_tag == DT_STRTAB) strtab = DynPtr(shim.base, d->d_un.d_ptr);
    }
    bool needed = false;
    for (const ElfW(Dyn)* d = shim.dynamic; d->d_tag != DT_NULL && strtab != 0; ++d) {
      if (d->d_tag != DT_NEEDED) continue;
      const char* n = reinterpret_cast<const char*>(strtab + d->d_un.d_val);
      const char* slash = strrchr(name, '/');
      if (!SystemLibrary(n) && strcmp(slash != nullptr ? slash + 1 : name, n) == 0) needed = true;
    }
    if (!needed) return 0;
  } else if (g_private_count != 0) {
    return 0;
  }
  PrivateObject& o = g_private[g_private_count++];
  const char* slash = strrchr(name, '/');
  snprintf(o.name, sizeof(o.name), "%s", self ? "" : (slash != nullptr ? slash + 1 : name));
  o.base = info->dlpi_addr;
  o.dynamic = dyn;
  o.relro_start = relro_start;
  o.relro_end = relro_end;
  return 0;
}

void RebindSlots(const PrivateObject& o) {
  uintptr_t symtab = 0, strtab = 0, jmprel = 0, rela = 0;
  size_t pltrelsz = 0, relasz = 0;
  for (const ElfW(Dyn)* d = o.dynamic; d->d_tag != DT_NULL; ++d) {
    switch (d->d_tag) {
      case DT_SYMTAB:
        symtab = DynPtr(o.base, d->d_un.d_ptr);
        break;
      case DT_STRTAB:
        strtab = DynPtr(o.base, d->d_un.d_ptr);
        break;
      case DT_JMPREL:
        jmprel = DynPtr(o.base, d->d_un.d_ptr);
        break;
      case DT_PLTRELSZ:
        pltrelsz = d->d_un.d_val;
        break;
      case DT_RELA:
        rela = DynPtr(o.base, d->d_un.d_ptr);
        break;
      case DT_RELASZ:
        relasz = d->d_un.d_val;
        break;
      default:
        break;
    }
  }
  if (symtab == 0 || strtab == 0) return;
  const auto* syms = reinterpret_cast<const ElfW(Sym)*>(symtab);
  auto one = [&](const ElfW(Rela) & r) {
    const auto type = ELF64_R_TYPE(r.r_info);
#if defined(__x86_64__)
    if (type != R_X86_64_JUMP_SLOT && type != R_X86_64_GLOB_DAT) return;
#elif defined(__aarch64__)
    if (type != R_AARCH64_JUMP_SLOT && type != R_AARCH64_GLOB_DAT) return;
#else
    (void)type;
    return;
#endif
    const ElfW(Sym)& sym = syms[ELF64_R_SYM(r.r_info)];
    if (sym.st_name == 0) return;
    const char* name = reinterpret_cast<const char*>(strtab + sym.st_name);
    // The definition among the private dependencies (not the shim's own exports: those are
    // meant to be found through the global scope).
    void* def = nullptr;
    for (int i = 1; i < g_private_count && def == nullptr; ++i) {
      if (g_private[i].handle == nullptr) continue;
      void* d = dlsym(g_private[i].handle, name);
      Dl_info di;
      void* entry = nullptr;
      if (d == nullptr || dladdr1(d, &di, &entry, RTLD_DL_SYMENT) == 0 || di.dli_fname == nullptr ||
          entry == nullptr) {
        continue;
      }
      const auto* def_sym = static_cast<const ElfW(Sym)*>(entry);
      // Functions only: a data object may have been copied into the executable (a copy
      // relocation), and then the executable's copy is the one every object must use.
      const int t = ELF64_ST_TYPE(def_sym->st_info);
      if (t != STT_FUNC && t != STT_GNU_IFUNC) continue;
      const char* slash = strrchr(di.dli_fname, '/');
      const char* base = slash != nullptr ? slash + 1 : di.dli_fname;
      for (int j = 1; j < g_private_count; ++j) {
        if (strcmp(base, g_private[j].name) == 0) def = d;
      }
    }
    if (def == nullptr || dlsym(RTLD_DEFAULT, name) == def) return;
    auto* slot = reinterpret_cast<void**>(o.base + r.r_offset);
    if (*slot == def) return;
    const bool relro = reinterpret_cast<uintptr_t>(slot) >= o.relro_start &&
                       reinterpret_cast<uintptr_t>(slot) < o.relro_end;
    const uintptr_t page = reinterpret_cast<uintptr_t>(slot) & ~(kPage - 1);
    if (relro && syscall(SYS_mprotect, page, kPage, PROT_READ | PROT_WRITE) != 0) return;
    *slot = def;
    if (relro) syscall(SYS_mprotect, page, kPage, PROT_READ);
    ++g_rebound;
  };
  for (size_t i = 0; jmprel != 0 && i < pltrelsz / sizeof(ElfW(Rela)); ++i) {
    one(reinterpret_cast<const ElfW(Rela)*>(jmprel)[i]);
  }
  for (size_t i = 0; rela != 0 && i < relasz / sizeof(ElfW(Rela)); ++i) {
    one(reinterpret_cast<const ElfW(Rela)*>(rela)[i]);
  }
}

void BindPrivateDependencies() {
  static int anchor;
  dl_iterate_phdr(FindPrivateObjects, &anchor);
  for (int i = 1; i < g_private_count; ++i) {
    g_private[i].handle = dlopen(g_private[i].name, RTLD_LAZY | RTLD_NOLOAD);
  }
  for (int i = 0; i < g_private_count; ++i) RebindSlots(g_private[i]);
}

// ---- configuration and initialisation ----------------------------------------------------
struct Config {
  std::string cluster, token, stats, live, log_level;
  int k = 4, r = 2;
  bool write_traps = true;
  bool inactive_list = true;   // kEnvInactiveList
  bool direct_reads = true;
  bool batch_faults = true;    // kEnvBatchFaults
  uint32_t fault_spin_us = 0;  // kEnvFaultSpin
  int direct_spin_us = -1;     // kEnvDirectSpin; -1: the store's default
  std::string layout;  // "" = the store's default
  bool follow = false;  // kEnvFollow: re-read the cluster file when it changes.
  LocalMemory local;
  CompressedTierSetting tier;  // kEnvCompressedTier
  uint64_t region = 8ull << 30;
  bool descendant = false;  // Exec'd by the program `tessera run` started, or its descendants.
};

// Copies the shim's variables. They (and LD_PRELOAD) stay in the environment, so the programs
// this one execs are paged too; kEnvDescendant tells them they are descendants. Without
// kEnvCluster (the library preloaded by hand) this library is removed from LD_PRELOAD.
bool TakeConfig(Config* c, std::string* error) {
  auto take = [](const char* name, std::string* out) {
    const char* v = getenv(name);
    if (v == nullptr) return false;
    *out = v;
    return true;
  };
  const bool configured = take(kEnvCluster, &c->cluster);
  if (configured) {
    // The variable holds the first program's pid: a shell that execs its last command in
    // place is still the first program.
    const char* root = getenv(kEnvDescendant);
    c->descendant = root != nullptr && strtol(root, nullptr, 10) != getpid();
    if (root == nullptr) setenv(kEnvDescendant, std::to_string(getpid()).c_str(), 1);
  }
  std::string k, r, local, region;
  take(kEnvToken, &c->token);
  take(kEnvStats, &c->stats);
  take(kEnvLive, &c->live);
  take(kEnvLogLevel, &c->log_level);
  const bool has_k = take(kEnvK, &k), has_r = take(kEnvR, &r);
  std::string traps, direct, batch, inactive;
  const bool has_traps = take(kEnvWriteTraps, &traps);
  const bool has_inactive = take(kEnvInactiveList, &inactive);
  const bool has_batch = take(kEnvBatchFaults, &batch);
  const bool has_direct = take(kEnvDirectReads, &direct);
  std::string spin, dspin;
  const bool has_spin = take(kEnvFaultSpin, &spin);
  const bool has_dspin = take(kEnvDirectSpin, &dspin);
  take(kEnvLayout, &c->layout);
  std::string follow;
  if (take(kEnvFollow, &follow)) c->follow = follow == "1";
  const bool has_local = take(kEnvLocal, &local), has_region = take(kEnvRegion, &region);
  std::string tier;
  const bool has_tier = take(kEnvCompressedTier, &tier);
  if (const char* pre = configured ? nullptr : getenv("LD_PRELOAD")) {
    std::string kept, entry;
    std::string all = pre;
    size_t i = 0;
    while (i <= all.size()) {
      size_t j = all.find_first_of(": ", i);
      if (j == std::string::npos) j = all.size();
      entry = all.substr(i, j - i);
      if (!entry.empty() && entry.find(kPreloadName) == std::string::npos) {
        kept += (kept.empty() ? "" : ":") + entry;
      }
      i = j + 1;
    }
    if (kept.empty()) unsetenv("LD_PRELOAD");
    else setenv("LD_PRELOAD", kept.c_str(), 1);
  }
  if (!configured) return false;
  // A switch: "0" or "1".
  auto on_off = [error](const char* name, const std::string& v, bool* out) {
    if (v != "0" && v != "1") {
      *error = "bad " + std::string(name) + " '" + v + "' (0 or 1)";
      return false;
    }
    *out = v == "1";
    return true;
  };
  if (has_traps && !on_off(kEnvWriteTraps, traps, &c->write_traps)) return true;
  if (has_inactive && !on_off(kEnvInactiveList, inactive, &c->inactive_list)) return true;
  if (has_batch && !on_off(kEnvBatchFaults, batch, &c->batch_faults)) return true;
  if (has_direct && !on_off(kEnvDirectReads, direct, &c->direct_reads)) return true;
  // A spin time: 0..1000 microseconds, digits only.
  auto micros = [error](const char* name, const std::string& v, int* out) {
    const bool digits = !v.empty() && v.size() <= 4 &&
                        v.find_first_not_of("0123456789") == std::string::npos;
    if (!digits || atoi(v.c_str()) > 1000) {
      *error = "bad " + std::string(name) + " '" + v + "' (0..1000 microseconds)";
      return false;
    }
    *out = atoi(v.c_str());
    return true;
  };
  if (has_spin) {
    int us = 0;
    if (!micros(kEnvFaultSpin, spin, &us)) return true;
    c->fault_spin_us = static_cast<uint32_t>(us);
  }
  if (has_dspin && !micros(kEnvDirectSpin, dspin, &c->direct_spin_us)) return true;
  if (has_k) c->k = atoi(k.c_str());
  if (has_r) c->r = atoi(r.c_str());
  if (has_local) {
    auto lm = ParseLocalMemory(local);
    if (!lm.ok()) {
      *error = lm.status().ToString();
      return true;
    }
    c->local = *lm;
  }
  if (has_tier) {
    auto t = ParseCompressedTier(tier);
    if (!t.ok()) {
      *error = "bad " + std::string(kEnvCompressedTier) + ": " + t.status().message();
      return true;
    }
    c->tier = *t;
  }
  if (has_region) {
    auto b = ParseSize(region);
    if (!b.ok() || *b < (64ull << 20) || *b % kPage != 0) {
      *error = "bad " + std::string(kEnvRegion) + " '" + region + "'";
      return true;
    }
    c->region = *b;
  }
  return true;
}

void WriteStats(bool final) {
  const std::string* path = final ? g_stats_path : g_live_path;
  if (path == nullptr || path->empty() || g_pager == nullptr) return;
  BypassScope bypass;
  auto stats = std::make_unique<PagerStats>(g_pager->Stats());
  auto sstats = std::make_unique<client::PageStoreStats>(g_store->Stats());
  RunStats r = CollectRunStats(*stats, *sstats, MonotonicNs() - g_start_ns, final);
  if (g_tier != nullptr) AddTierStats(g_tier->TierStats(), &r);
  r["mmaps"] = g_mmaps.load();
  r["rebound_symbols"] = g_rebound;
  // Anonymous memory of the process the pager does not hold (its own threads' memory, stacks,
  // what was left out), at its peak over the snapshots.
  const uint64_t anon = RssAnonBytes(), paged = stats->resident_pages * kPage;
  const uint64_t unpaged = anon > paged ? anon - paged : 0;
  uint64_t pk = g_unpaged_anon_peak.load();
  while (unpaged > pk && !g_unpaged_anon_peak.compare_exchange_weak(pk, unpaged)) {
  }
  r["unpaged_anon_peak_bytes"] = g_unpaged_anon_peak.load();
  for (int k = 0; k < kLeftKinds; ++k) {
    r[std::string("not_paged_") + kLeftOutKey[k] + "_peak_bytes"] = g_left->PeakBytes(k);
  }
  r["unpaged_no_access_bytes"] = g_unpaged->Bytes(kNoAccess);
  r["registration_errors"] = g_registration_errors.load();
  r["discard_errors"] = g_discard_errors.load();
  (void)WriteFileAtomically(*path, FormatRunStats(r));
}

void FailInit(const Config& c, const std::string& message) {
  RawWrite(2, "tessera preload: cannot page this program: ");
  RawWrite(2, message.c_str());
  RawWrite(2, "\n");
  if (!c.stats.empty()) (void)WriteFileAtomically(c.stats, FormatRunStats({}, message));
  _exit(1);
}

struct InitShared {
  Config* config;
  std::string skip;  // Why this process runs unpaged (no error: it just is not paged).
  pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
  bool done = false;
  std::string error;
};

// kEnvFollow: when the cluster file changed since `seen`, makes the store's live servers match
// it: listed endpoints the store has no live server for are added (AddRemoteServer), live
// servers no longer listed are failed (RemoveRemoteServer; their splits are regenerated).
void FollowClusterFile(const std::string& path, struct timespec* seen) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return;
  if (st.st_mtim.tv_sec == seen->tv_sec && st.st_mtim.tv_nsec == seen->tv_nsec) return;
  *seen = st.st_mtim;
  auto listed = client::LoadServers(path);
  if (!listed.ok()) {
    TLOG(WARNING) << "tessera run: membership file " << path << ": " << listed.status();
    return;
  }
  auto have = client::RemoteServersOf(*g_store);
  auto failed = client::RemoteServersFailed(*g_store);
  if (!have.ok() || !failed.ok()) return;
  auto same = [](const fabric::Endpoint& a, const fabric::Endpoint& b) {
    return a.host == b.host && a.port == b.port;
  };
  for (const auto& want : *listed) {
    bool live = false;
    for (size_t i = 0; i < have->size(); ++i) {
      live |= !(*failed)[i] && same((*have)[i].endpoint, want.endpoint);
    }
    if (live) continue;
    Status added = client::AddRemoteServer(*g_store, want);
    if (!added.ok()) {
      TLOG(WARNING) << "tessera run: cannot use new server " << want.endpoint.ToString() << ": "
                    << added;
    }
  }
  for (size_t i = 0; i < have->size(); ++i) {
    if ((*failed)[i]) continue;
    bool listed_now = false;
    for (const auto& want : *listed) listed_now |= same((*have)[i].endpoint, want.endpoint);
    if (!listed_now) {
      (void)client::RemoveRemoteServer(*g_store, (*have)[i].endpoint,
                                       "its etcd registration is gone");
    }
  }
}

// The init thread (bypass, all signals blocked): creates the store and the pager, then
// publishes live stats until the process exits.
void* InitThread(void* arg) {
  t_state.bypass = true;
  auto* sh = static_cast<InitShared*>(arg);
  const Config& c = *sh->config;
  std::string error;
  do {
    auto servers = client::LoadServers(c.cluster);
    if (!servers.ok()) {
      error = "cluster file " + c.cluster + ": " + servers.status().ToString();
      break;
    }
    // A per-client credential or the cluster secret (fabric/credential.h).
    auto cred = fabric::LoadCredential(c.token, "tessera run");
    if (!cred.ok()) {
      error = cred.status().ToString();
      break;
    }
    if (c.descendant && cred->client_id != 0) {
      // A per-client credential names one client: a second process paging under the same
      // id would share its namespace on the memservers.
      sh->skip = "a per-client credential pages only the program tessera run started";
      break;
    }
    client::ErasureCodedStoreOptions eo;
    eo.remote.servers = *servers;
    eo.remote.secret = cred->key;
    eo.remote.client_id = cred->client_id;  // 0 (the cluster secret): a random id.
    // Beyond the region: spare store pages, where a forked child's copies of the pages the
    // parent writes back while the child lives go (pager.h, "fork").
    eo.remote.capacity_pages = c.region / kPage + c.region / kPage / kForkSpareDivisor;
    eo.k = c.k;
    eo.r = c.r;
    eo.remote.direct_reads = c.direct_reads;
    if (c.direct_spin_us >= 0) eo.remote.direct_spin_us = static_cast<uint32_t>(c.direct_spin_us);
    if (!c.layout.empty()) {
      auto layout = client::ParseEcLayout(c.layout);
      if (!layout.ok()) {
        error = "bad " + std::string(kEnvLayout) + ": " + layout.status().ToString();
        break;
      }
      eo.layout = *layout;
    }
    auto store = client::CreateErasureCodedStore(eo);
    if (!store.ok()) {
      error = "page store: " + store.status().ToString();
      break;
    }
    std::unique_ptr<CompressedTier> tier;
    if (c.tier.enabled) {
      CompressedTierOptions to;
      to.store = store->get();
      to.capacity_bytes = c.tier.capacity_bytes;
      auto t = CompressedTier::Create(to);
      if (!t.ok()) {
        error = "compressed tier: " + t.status().ToString();
        break;
      }
      tier = std::move(*t);
    }
    PagerOptions po;
    po.store = tier ? static_cast<client::PageStore*>(tier.get()) : store->get();
    po.tier = tier.get();
    po.region_bytes = c.region;
    po.local_limit_bytes = c.local.bytes;
    po.local_fraction = c.local.fraction;
    po.write_traps = c.write_traps;
    po.inactive_list = c.inactive_list;
    po.fault_spin_us = c.fault_spin_us;
    po.batch_faults = c.batch_faults;
    auto pager = Pager::Create(po);
    if (!pager.ok()) {
      error = "pager: " + pager.status().ToString();
      break;
    }
    g_store = store->release();
    g_tier = tier.release();
    g_pager = pager->release();
  } while (false);
  const bool stop = !error.empty() || !sh->skip.empty();
  pthread_mutex_lock(&sh->mu);
  sh->error = error;
  sh->done = true;
  pthread_cond_signal(&sh->cv);
  pthread_mutex_unlock(&sh->mu);
  if (stop) return nullptr;
  // Live stats publisher (and, with kEnvFollow, the membership follower).
  struct timespec seen = {0, 0};
  if (c.follow) {
    struct stat st;
    if (stat(c.cluster.c_str(), &st) == 0) seen = st.st_mtim;
  }
  while (!g_exiting.load(std::memory_order_acquire)) {
    struct timespec ts = {0, 500 * 1000 * 1000};
    nanosleep(&ts, nullptr);
    if (g_exiting.load(std::memory_order_acquire) || g_child) break;
    if (c.follow) FollowClusterFile(c.cluster, &seen);
    WriteStats(false);
  }
  return nullptr;
}

__attribute__((constructor)) void ShimInit() {
  RealPthreadCreate();
  RealFork();
  BindPrivateDependencies();
  g_tcache_key_ok = pthread_key_create(&g_tcache_key, DestroyTcache) == 0;
  dl_iterate_phdr(CollectPlainCode, nullptr);
  static Config config;  // Lives for the process (read by the init thread).
  std::string error;
  if (!TakeConfig(&config, &error)) return;  // Not configured: a plain jemalloc heap.
  if (!error.empty()) FailInit(config, error);
  LogLevel level = LogLevel::kWarning;
  if (!config.log_level.empty()) ParseLogLevel(config.log_level, &level);
  SetMinLogLevel(level);
  g_start_ns = MonotonicNs();
  g_owner_pid = getpid();
  if (config.descendant) {
    // Its stats go to a file of its own next to the first program's: live snapshots (many
    // programs end with _exit, which runs no destructor), then the final ones.
    g_stats_path =
        new std::string(config.stats.empty() ? "" : config.stats + "." + std::to_string(getpid()));
    g_live_path = new std::string(*g_stats_path);
    config.stats = *g_stats_path;
  } else {
    g_stats_path = new std::string(config.stats);
    g_live_path = new std::string(config.live);
  }

  InitShared sh;
  sh.config = &config;
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  pthread_t tid;
  int rc = RealPthreadCreate()(&tid, nullptr, InitThread, &sh);
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  if (rc != 0) FailInit(config, std::string("cannot start the pager thread: ") + strerror(rc));
  pthread_detach(tid);
  pthread_mutex_lock(&sh.mu);
  while (!sh.done) pthread_cond_wait(&sh.cv, &sh.mu);
  pthread_mutex_unlock(&sh.mu);
  if (!sh.error.empty() && config.descendant) {
    // A program started by the paged one: better unpaged than not run at all.
    RawWrite(2, "tessera preload: running this program unpaged: ");
    RawWrite(2, sh.error.c_str());
    RawWrite(2, "\n");
    return;
  }
  if (!sh.error.empty()) FailInit(config, sh.error);
  if (!sh.skip.empty()) {
    RawWrite(2, "tessera preload: running this program unpaged: ");
    RawWrite(2, sh.skip.c_str());
    RawWrite(2, "\n");
    return;
  }

  {
    BypassScope bypass;
    g_ranges = new RangeAllocator(reinterpret_cast<uintptr_t>(g_pager->base()), g_pager->size());
    g_unpaged = new SpanMap();
    g_left = new SpanMap();
  }
  // The paged arena: extents from the region, but its metadata (jemalloc's "base": extent
  // descriptors, slab bitmaps) in plain memory. jemalloc writes metadata while holding locks
  // that the pager's own threads may need (arenas_lock when a thread first allocates), so
  // metadata in paged memory could fault with such a lock held and deadlock the pager.
  // jemalloc 5.3's experimental.arenas_create_ext takes an arena_config_t (same layout here).
  struct {
    tjem_extent_hooks* extent_hooks;
    bool metadata_use_hooks;
  } arena_config = {&g_hooks, false};
  unsigned arena = 0;
  size_t sz = sizeof(arena);
  g_region_base = reinterpret_cast<uintptr_t>(g_pager->base());
  g_region_end = g_region_base + g_pager->size();
  if (tjem_mallctl("experimental.arenas_create_ext", &arena, &sz, &arena_config,
                   sizeof(arena_config)) != 0) {
    FailInit(config, "jemalloc: experimental.arenas_create_ext failed (jemalloc 5.3 needed)");
  }
  // Freed heap pages go back to the pager (and the store is trimmed) after 1 s, not 10 s:
  // pages kept for reuse would otherwise count against the local-memory limit.
  ssize_t dirty_ms = 1000, muzzy_ms = 0;
  std::string prefix = "arena." + std::to_string(arena) + ".";
  tjem_mallctl((prefix + "dirty_decay_ms").c_str(), nullptr, nullptr, &dirty_ms, sizeof(dirty_ms));
  tjem_mallctl((prefix + "muzzy_decay_ms").c_str(), nullptr, nullptr, &muzzy_ms, sizeof(muzzy_ms));
  g_paged_arena = arena;
  g_active.store(true, std::memory_order_release);
}

__attribute__((destructor)) void ShimFini() {
  if (!g_active.load() || g_child || getpid() != g_owner_pid) return;
  g_exiting.store(true, std::memory_order_release);
  {
    // A forked child still sharing the heap's pages (a daemon's parent exiting) gets every page
    // it has not mapped before this process, which serves them, goes away.
    BypassScope bypass;
    g_pager->HandOffChildren();
  }
  WriteStats(true);
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
}  // namespace tessera::kernel_shim

using namespace tessera::kernel_shim;  // NOLINT: the exported C entry points below.

// ---- exported entry points -----------------------------------------------------------------
extern "C" {

__attribute__((visibility("default"))) void* tessera_jemalloc_mmap(void* addr, size_t len,
                                                                   int prot, int flags, int fd,
                                                                   off_t off) {
  return RawMmap(addr, len, prot, flags, fd, off);
}
__attribute__((visibility("default"))) int tessera_jemalloc_munmap(void* addr, size_t len) {
  return RawMunmap(addr, len);
}
__attribute__((visibility("default"))) int tessera_jemalloc_madvise(void* addr, size_t len,
                                                                    int advice) {
  return RawMadvise(addr, len, advice);
}

// For tests and tools: the paged region of this process (false when paging is off, e.g. in
// a program started without `tessera run`). Find it with dlsym(RTLD_DEFAULT, ...).
__attribute__((visibility("default"))) bool tessera_preload_region(void** base, size_t* size) {
  if (!g_active.load(std::memory_order_acquire)) return false;
  *base = reinterpret_cast<void*>(g_region_base);
  *size = g_region_end - g_region_base;
  return true;
}

#define TESSERA_CALLER __builtin_return_address(0)
void* malloc(size_t n) noexcept { return Alloc(n, 0, TESSERA_CALLER); }
void free(void* p) noexcept { Free(p); }
void* calloc(size_t n, size_t m) noexcept {
  size_t total;
  if (__builtin_mul_overflow(n, m, &total)) {
    errno = ENOMEM;
    return nullptr;
  }
  return Alloc(total, kMallocxZero, TESSERA_CALLER);
}
void* realloc(void* p, size_t n) noexcept {
  if (p != nullptr && n == 0) {
    Free(p);
    return nullptr;
  }
  return Realloc(p, n, 0, TESSERA_CALLER);
}
int posix_memalign(void** out, size_t align, size_t n) noexcept {
  if (align < sizeof(void*) || (align & (align - 1)) != 0) return EINVAL;
  void* p = AlignedAlloc(align, n, TESSERA_CALLER);
  if (p == nullptr) return ENOMEM;
  *out = p;
  return 0;
}
void* aligned_alloc(size_t align, size_t n) noexcept {
  if (align == 0 || (align & (align - 1)) != 0) {
    errno = EINVAL;
    return nullptr;
  }
  return AlignedAlloc(align, n, TESSERA_CALLER);
}
void* memalign(size_t align, size_t n) noexcept {
  if (align == 0) align = 1;
  if ((align & (align - 1)) != 0) align = size_t{1} << (64 - __builtin_clzl(align));
  return AlignedAlloc(align, n, TESSERA_CALLER);
}
void* valloc(size_t n) noexcept { return AlignedAlloc(kPage, n, TESSERA_CALLER); }
void* pvalloc(size_t n) noexcept {
  return AlignedAlloc(kPage, (n + kPage - 1) & ~(kPage - 1), TESSERA_CALLER);
}
size_t malloc_usable_size(void* p) noexcept { return p == nullptr ? 0 : tjem_sallocx(p, 0); }

// jemalloc's own API (redis calls mallctl, nallocx, malloc_stats_print). Calls that name an
// arena or tcache themselves are passed through as they are.
void* mallocx(size_t n, int flags) {
  if ((flags & ~0x7f) != 0) return tjem_mallocx(n, flags);
  return Alloc(n, flags, TESSERA_CALLER);
}
void* rallocx(void* p, size_t n, int flags) {
  if ((flags & ~0x7f) != 0) return tjem_rallocx(p, n, flags);
  return Realloc(p, n, flags, TESSERA_CALLER);
}
size_t xallocx(void* p, size_t n, size_t extra, int flags) {
  return tjem_xallocx(p, n, extra, flags & 0x7f);
}
size_t sallocx(const void* p, int flags) { return tjem_sallocx(p, flags); }
void dallocx(void* p, int flags) {
  if ((flags & ~0x7f) != 0) return tjem_dallocx(p, flags);
  Free(p);
}
void sdallocx(void* p, size_t, int flags) { dallocx(p, flags); }
size_t nallocx(size_t n, int flags) { return tjem_nallocx(n, flags); }
int mallctl(const char* name, void* oldp, size_t* oldlenp, void* newp, size_t newlen) {
  return tjem_mallctl(name, oldp, oldlenp, newp, newlen);
}
int mallctlnametomib(const char* name, size_t* mibp, size_t* miblenp) {
  return tjem_mallctlnametomib(name, mibp, miblenp);
}
int mallctlbymib(const size_t* mib, size_t miblen, void* oldp, size_t* oldlenp, void* newp,
                 size_t newlen) {
  return tjem_mallctlbymib(mib, miblen, oldp, oldlenp, newp, newlen);
}
void malloc_stats_print(void (*write_cb)(void*, const char*), void* cbopaque, const char* opts) {
  tjem_malloc_stats_print(write_cb, cbopaque, opts);
}

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

int pthread_create(pthread_t* thread, const pthread_attr_t* attr, void* (*fn)(void*),
                   void* arg) noexcept {
  PthreadCreateFn real = RealPthreadCreate();
  if (!t_state.bypass) return real(thread, attr, fn, arg);
  // A pager/store thread starting a thread: the new one is a bypass thread too.
  auto* s = new BypassStart{fn, arg};
  int rc = real(thread, attr, BypassTrampoline, s);
  if (rc != 0) delete s;
  return rc;
}

pid_t fork() noexcept {
  ForkFn real = RealFork();
  if (!g_active.load(std::memory_order_acquire)) return real();
  {
    // A forked child forking again goes through here too (it pages its heap in first: the
    // grandchild gets plain memory).
    BypassScope bypass;
    tessera::Status st = g_pager->PrepareFork();
    if (!st.ok()) {
      RawWrite(2, "tessera preload: fork refused, the heap could not be prepared for the child: ");
      RawWrite(2, st.ToString().c_str());
      RawWrite(2, "\n");
      // A failed PrepareFork has already resumed eviction (fork.cc).
      errno = ENOMEM;
      return -1;
    }
  }
  pid_t pid = real();
  const int err = errno;
  BypassScope bypass;  // The child's evictor thread (ChildAfterFork) must be a bypass thread.
  if (pid == 0) {
    g_child = true;
    g_pager->ChildAfterFork();
  } else {
    g_pager->ParentAfterFork(pid);
  }
  errno = err;
  return pid;
}

}  // extern "C"

// ---- C++ operator new/delete ------------------------------------------------------------
// Defined here (and exported) rather than left to libstdc++: a program linked against a
// malloc library that also defines them (Debian's redis-server links libjemalloc.so.2, which
// does) would otherwise allocate from that library and free into ours.
namespace {

void* NewImpl(size_t n, size_t align, bool nothrow, const void* caller) {
  for (;;) {
    void* p = align > alignof(std::max_align_t)
                  ? tessera::kernel_shim::AlignedAlloc(align, n, caller)
                  : tessera::kernel_shim::Alloc(n, 0, caller);
    if (p != nullptr) return p;
    std::new_handler h = std::get_new_handler();
    if (h == nullptr) {
      if (nothrow) return nullptr;
      throw std::bad_alloc();
    }
    h();
  }
}

}  // namespace

#define TESSERA_EXPORT __attribute__((visibility("default")))
TESSERA_EXPORT void* operator new(size_t n) { return NewImpl(n, 0, false, TESSERA_CALLER); }
TESSERA_EXPORT void* operator new[](size_t n) { return NewImpl(n, 0, false, TESSERA_CALLER); }
TESSERA_EXPORT void* operator new(size_t n, const std::nothrow_t&) noexcept {
  try {
    return NewImpl(n, 0, true, TESSERA_CALLER);
  } catch (...) {
    return nullptr;
  }
}
TESSERA_EXPORT void* operator new[](size_t n, const std::nothrow_t&) noexcept {
  try {
    return NewImpl(n, 0, true, TESSERA_CALLER);
  } catch (...) {
    return nullptr;
  }
}
TESSERA_EXPORT void* operator new(size_t n, std::align_val_t a) {
  return NewImpl(n, static_cast<size_t>(a), false, TESSERA_CALLER);
}
TESSERA_EXPORT void* operator new[](size_t n, std::align_val_t a) {
  return NewImpl(n, static_cast<size_t>(a), false, TESSERA_CALLER);
}
TESSERA_EXPORT void* operator new(size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  try {
    return NewImpl(n, static_cast<size_t>(a), true, TESSERA_CALLER);
  } catch (...) {
    return nullptr;
  }
}
TESSERA_EXPORT void* operator new[](size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  try {
    return NewImpl(n, static_cast<size_t>(a), true, TESSERA_CALLER);
  } catch (...) {
    return nullptr;
  }
}
TESSERA_EXPORT void operator delete(void* p) noexcept { tessera::kernel_shim::Free(p); }
TESSERA_EXPORT void operator delete[](void* p) noexcept { tessera::kernel_shim::Free(p); }
TESSERA_EXPORT void operator delete(void* p, const std::nothrow_t&) noexcept {
  tessera::kernel_shim::Free(p);
}
TESSERA_EXPORT void operator delete[](void* p, const std::nothrow_t&) noexcept {
  tessera::kernel_shim::Free(p);
}
TESSERA_EXPORT void operator delete(void* p, size_t) noexcept { tessera::kernel_shim::Free(p); }
TESSERA_EXPORT void operator delete[](void* p, size_t) noexcept { tessera::kernel_shim::Free(p); }
TESSERA_EXPORT void operator delete(void* p, std::align_val_t) noexcept {
  tessera::kernel_shim::Free(p);
}
TESSERA_EXPORT void operator delete[](void* p, std::align_val_t) noexcept {
  tessera::kernel_shim::Free(p);
}
TESSERA_EXPORT void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept {
  tessera::kernel_shim::Free(p);
}
TESSERA_EXPORT void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept {
  tessera::kernel_shim::Free(p);
}
TESSERA_EXPORT void operator delete(void* p, size_t, std::align_val_t) noexcept {
  tessera::kernel_shim::Free(p);
}
TESSERA_EXPORT void operator delete[](void* p, size_t, std::align_val_t) noexcept {
  tessera::kernel_shim::Free(p);
}
