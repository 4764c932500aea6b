// libtessera_preload.so: puts an unmodified program's heap in a userfaultfd-paged region.
// This file holds the heap, initialisation and the exported allocator; mappings.cc the
// program's anonymous mappings; private_deps.cc the binding of the shim's own dependencies;
// shim_config.cc the configuration; shim_state.h the state they share.
//
// Loaded with LD_PRELOAD by `tessera run` (apps/run), configured by the TESSERA_RUN_* variables
// of kernel_shim/preload/run_stats.h. What it does:
//
//  * At load (constructor) it binds its own dependencies' functions (private_deps.h), leaves its variables and LD_PRELOAD in the environment (so the
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
#include "common/file.h"
#include "common/logging.h"
#include "common/units.h"
#include "fabric/auth.h"
#include "fabric/credential.h"
#include "kernel_shim/pager/pager.h"
#include "kernel_shim/preload/range_allocator.h"
#include "kernel_shim/preload/private_deps.h"
#include "kernel_shim/preload/run_stats.h"
#include "kernel_shim/preload/shim_config.h"
#include "kernel_shim/preload/shim_state.h"
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
// The store holds region/8 spare pages (pager.h, "fork"): the client's page tables grow by an
// eighth; a parent may write back that many pages that a forked child still reads.
constexpr uint64_t kForkSpareDivisor = 8;

}  // namespace

// ---- process and thread state (shim_state.h) -----------------------------------------------
namespace shim {
std::atomic<bool> g_active{false};
bool g_child = false;
uintptr_t g_region_base = 0;
uintptr_t g_region_end = 0;
Pager* g_pager = nullptr;
RangeAllocator* g_ranges = nullptr;
std::atomic<uint64_t> g_mmaps{0};
constinit __attribute__((tls_model("initial-exec"))) thread_local ThreadState t_state = {};
}  // namespace shim

namespace {
using namespace shim;  // NOLINT(build/namespaces): the state this file shares.

pid_t g_owner_pid = 0;                 // The process that owns the pager.
unsigned g_paged_arena = 0;
client::RemotePageStore* g_store = nullptr;  // The remote store.
CompressedTier* g_tier = nullptr;      // In front of it (kEnvCompressedTier), or null.
pthread_key_t g_tcache_key;
bool g_tcache_key_ok = false;
uint64_t g_start_ns = 0;
std::string* g_stats_path = nullptr;
std::string* g_live_path = nullptr;
std::atomic<bool> g_exiting{false};
uint64_t g_rebound = 0;  // GOT slots rebound (private_deps.h), for the stats.
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
  g_rebound = BindPrivateDependencies();
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
