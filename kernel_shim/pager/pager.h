// Pager: serves the page faults of one paged memory region from a PageStore, through
// userfaultfd, and keeps the region's resident set under a local-memory limit by writing dirty
// pages back to the store and dropping them. This is what lets an unmodified program run with
// only part of its memory local (the LD_PRELOAD interposer in kernel_shim/preload puts the
// program's heap in the region; tests and benches may use the region directly).
//
// The region. Create() maps one private anonymous region of `region_bytes` (MAP_NORESERVE, so
// only touched pages cost memory) and registers it with userfaultfd in missing + write-protect
// mode. Page i of the region is PageId i of the store, so the store's capacity_pages() must
// cover the region (pages beyond it are spares for forked children: see "fork"). Every page is
// in one of these states:
//   never written  - first touch is served with zeros, no store round trip (mapped writable,
//                    with up to zero_fault_around_pages never-written neighbours; such a page
//                    still all zeros when evicted is dropped without a write-back);
//   resident clean - mapped write-protected; its latest content is in the store;
//   resident dirty - mapped writable (a write-protect fault marked it dirty);
//   staged         - on the inactive list: moved out of the region into a local staging slot;
//                    an access faults and moves it back, no store round trip (see
//                    PagerOptions::inactive_list);
//   remote         - not mapped; its content is in the store (a fault reads it back).
// Eviction write-protects a batch of victims, writes the dirty ones back (one batched Submit;
// up to 4 batches in flight, so write-backs overlap and a fault waits only when eviction cannot
// keep the cap),
// and MADV_DONTNEEDs them once the store acknowledged; clean victims are dropped without a
// write-back. A write that races with eviction keeps the page (it is never dropped with data
// newer than the store's copy). Eviction runs when the resident set exceeds the high watermark
// of the limit and stops at the low one.
//
// The limit. `local_limit_bytes` is a fixed cap on resident pages of the region. Instead,
// `local_fraction` f in (0, 1] caps residency at f x the peak footprint so far (pages holding
// data: resident or remote), with a floor of `min_local_bytes`, so at the end the local share is
// f of the program's peak footprint. Neither set: no limit (everything stays resident).
//
// Errors. A page read that fails for a reason that may pass (Unavailable, Timeout, anything but
// DataLoss: a server restarting, a network blip, the store re-placing a split) is retried with
// bounded exponential backoff (fill_retry_initial_ms doubling up to fill_retry_max_backoff_ms)
// by the pager's retry thread, with a log line on the first failure and at each doubling; the
// faulting thread stays blocked meanwhile and the retries are counted in
// PagerStats::fill_retries. Only a page the store reports as DataLoss (more splits lost than
// the code repairs), or one still failing after fill_retry_limit_ms when that is set, is
// poisoned: it is never served as zeros or stale bytes, the faulting access gets SIGBUS
// (UFFDIO_POISON) and the page is named in the log and counted in PagerStats::fill_errors.
// A failed write-back keeps the page resident.
//
// fork. A fork() without exec keeps parent and child within the local limit: they share the
// pages through the store, copy-on-write (docs/guides/what-is-paged.md, "fork", says why this
// way). Call PrepareFork() before fork() (a pthread_atfork prepare handler, or the preload
// shim's fork()), ChildAfterFork() in the child and ParentAfterFork(pid) in the parent.
//   PrepareFork pauses eviction, writes back every dirty resident page (it stays resident,
//   clean: at most the limit's worth of writes) and records which store page holds each page's
//   bytes: the snapshot. The child inherits the region's registration (UFFD_FEATURE_EVENT_FORK)
//   and the parent's monitor thread is handed the child's userfaultfd: a page the child does not
//   have mapped is served from the snapshot (zeros for a page without data), write-protected.
//   While the child lives the parent never overwrites nor trims a store page the snapshot names:
//   before writing back such a page it copies the old bytes to a spare store page (the store's
//   capacity_pages beyond the region; one extra read and write per page the parent writes back
//   while the child lives, once per page). When the child exits (pidfd) or execs, the pages
//   kept for it are trimmed.
//   The child's resident set: ChildAfterFork starts an evictor thread in the child that drops
//   (MADV_DONTNEED) pages it holds unwritten since they were mapped - the monitor serves them
//   again from the snapshot - and keeps the child under the cap the parent had at the fork; the
//   monitor holds the child's faults back while it is above it. Pages the child writes cannot be
//   dropped (nothing stores them): a child that writes more than its cap goes above it, and
//   says so once on stderr. Never zeros or stale bytes: a page is dropped only while
//   write-protected and known equal to what the snapshot returns.
// Falls back to paging every remote page back in before the fork (the child then holds a full
// private copy as plain memory), with the pager object inert in the child, when there is no
// limit (everything is resident: nothing to page in, nothing to share), when the kernel
// refuses fork events (they need CAP_SYS_PTRACE), the store has no spare pages, or a previous
// child still shares pages. With the inactive list on, its pages are first moved back into the
// region (the child finds a page's bytes mapped or in the store, never in a staging slot; pages
// it shares cannot move while it lives and are written back instead). A forked child that
// forks again pages its own heap in first (the grandchild gets plain memory). Pager::Stats
// counts both kinds of fork.
// The child holds its own reference to its userfaultfd: when the parent exits it first maps
// every page the child has not (HandOffChildren), and if it dies without doing so (SIGKILL, a
// crash), the child serves its own faults: zeros where the snapshot says zeros, SIGBUS (with a
// line on stderr) where only the store had the bytes.
// If PrepareFork fails, fork must not happen (the shim fails it with ENOMEM). From PrepareFork's
// return until ParentAfterFork the fault threads only read the userfaultfd (fork() waits until
// its fork event is read, while the C library holds its allocator's locks): the faults of other
// threads in that window are served by one thread that may wait for fork() to return, so call
// fork() and ParentAfterFork right after PrepareFork.
//
// Threads. All methods are thread-safe. The pager owns its threads (fault handling, eviction)
// and the store's done() callbacks may run pager code on store threads; none of them ever
// touches the paged region except through userfaultfd ioctls and copies into and out of
// buffers the pager owns. Callers must not hold the pager's region pages as arguments it reads
// (e.g. PagerOptions strings) - they are copied at Create().
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "client/page_store.h"
#include "common/histogram.h"
#include "common/status.h"
#include "kernel_shim/pager/compressed_tier.h"

namespace tessera::kernel_shim {

// Write traps (PagerOptions::write_traps): kAuto sets them only when the inactive list is not
// in use. The list sees every access to a victim (a read too) before it leaves, which is what
// the traps were for; with it, their write-protect faults cost more than they give (GNU sort at
// 50%: 160k trap faults, the same store reads, about twice the time; see
// docs/concepts/paging-policy.md).
enum class WriteTraps : uint8_t { kAuto, kOn, kOff };

// How victims are chosen among resident pages.
enum class VictimPolicy : uint8_t {
  kFifo,   // First faulted in, first out: the baseline the bench compares with.
  kSmart,  // The default: recency/frequency aware (see pager.cc); fewer faults on skewed access.
};

struct PagerOptions {
  client::PageStore* store = nullptr;  // Not owned; must outlive the Pager. Required.
  // A compressed local tier (compressed_tier.h) in front of the remote store: when set, `store`
  // must be this tier. Its charged bytes count against the local budget (the resident set's
  // cap is the budget less the tier's charge), and the pager gives it the budget to size
  // itself from (the tier then shrinks itself while its hits are pages the resident set would
  // have kept with its room: compressed_tier.h, "Size"). Clean victims, from the inactive
  // list's end or not, are offered to it (AdmitClean). Not owned; must outlive the Pager.
  CompressedTier* tier = nullptr;
  size_t region_bytes = 0;             // > 0, a multiple of 4096, <= store capacity.

  uint64_t local_limit_bytes = 0;      // Fixed cap on resident bytes (0: none).
  double local_fraction = 0;           // Cap = fraction x peak footprint (0: none).
  uint64_t min_local_bytes = 4 << 20;  // Floor of the fractional cap.
  double high_watermark = 1.0;         // Evict when resident > high x cap ...
  double low_watermark = 0.95;         // ... down to low x cap.
  size_t evict_batch = 64;             // Pages per batched write-protect / write-back / madvise.

  VictimPolicy victim = VictimPolicy::kSmart;
  // kSmart only: write-protect resident dirty pages as they come round ("write traps") so that
  // a later write shows the page is in use. False: only first writes to clean pages and the
  // ghost list inform the policy (no trap ioctls, no trap faults). kAuto: on only without the
  // inactive list.
  WriteTraps write_traps = WriteTraps::kAuto;
  // The inactive list (inactive_list.h): victims are first moved (UFFDIO_MOVE) out of the region
  // into a local staging area; an access to a staged page - a read too - is a minor fault that
  // moves it back and marks it referenced; only pages reaching the list's end are written back
  // and dropped. Staged pages count against the cap. Needs UFFDIO_MOVE (kernel 6.8+) and a
  // readable /proc/self/pagemap: without them, or with false, victims are written back and
  // dropped at once. At 50% local memory it cut GNU sort's store reads by 20-40% and left the
  // python workload's even or a little lower (docs/concepts/paging-policy.md).
  bool inactive_list = true;
  bool prefetch = true;                // Sequential / strided fault streams fetch ahead.
  size_t prefetch_max_pages = 32;      // Largest prefetch window.
  // Threads reading userfaultfd messages (1..8). Two by default: a fault thread blocks while it
  // reads a remote page (fault_thread_reads), so a second one serves the faults of the
  // program's other threads meanwhile.
  int fault_threads = 2;
  // Zero-fill fault-around: a fault on a never-written page also maps up to this many
  // never-written pages after it (one UFFDIO_COPY), within the cap, so sequential first touches
  // cost one userfaultfd round trip per window. 0 disables; at most 64.
  size_t zero_fault_around_pages = 16;
  // A fault thread serves a missing fault end to end: it reads the page with the store's
  // blocking ReadPage on its own thread and maps it (no hand-off to a store callback). False:
  // the read is submitted and the store's completion callback maps the page.
  bool fault_thread_reads = true;
  // With fault_thread_reads: a fault thread that wakes to several queued faults (threads of the
  // program faulting at once) posts the store reads of all of them together (one ReadPages) and
  // maps them, instead of handing all but one to the store's I/O thread one by one.
  bool batch_faults = true;
  // After serving a fault, a fault thread polls the userfaultfd this long (0..1000 us) before it
  // sleeps in poll(): a program's next fault often follows within microseconds, and a sleeping
  // fault thread costs a wake-up per fault. Bounded so the servers sharing the cores still run.
  uint32_t fault_spin_us = 0;
  // When most stored pages mapped write-protected for a read fault are written soon after (a
  // write-protect fault each), map such fills writable (dirty) instead; every 8th stays clean
  // to keep measuring. False: read faults always map clean.
  bool adaptive_writable_fills = true;
  // Retrying reads that fail with anything but DataLoss (see "Errors" above): the first retry
  // after fill_retry_initial_ms (1..10000), each next one after twice the wait before, at most
  // fill_retry_max_backoff_ms (>= initial, <= 60000). fill_retry_limit_ms > 0 gives up after
  // that long and poisons the page (SIGBUS); 0 retries until the store answers.
  uint32_t fill_retry_initial_ms = 2;
  uint32_t fill_retry_max_backoff_ms = 1000;
  uint64_t fill_retry_limit_ms = 0;
};

struct PagerStats {
  uint64_t faults = 0;           // Missing-page faults served (excluding duplicates).
  uint64_t wp_faults = 0;        // Write-protect faults (clean page became dirty).
  uint64_t trap_faults = 0;      // Write-protect faults on the smart policy's write traps (a
                                 // dirty page re-protected to see whether it is written again).
  uint64_t traps_armed = 0;      // Write traps set (pages).
  uint64_t trap_ioctls = 0;      // UFFDIO_WRITEPROTECT calls that set them (runs of pages).
  uint64_t fills_writable = 0;   // Read faults on stored pages mapped writable (adaptive).
  uint64_t zero_fills = 0;       // Faults on never-written pages (no store round trip).
  uint64_t zero_fill_around = 0; // Never-written neighbours mapped with such a fault.
  uint64_t zero_drops = 0;       // Never-stored victims still all zeros: dropped, not written.
  uint64_t remote_reads = 0;     // Pages read from the store (faults and prefetches).
  uint64_t remote_writes = 0;    // Dirty pages written back to the store.
  uint64_t clean_drops = 0;      // Clean pages dropped without a write-back.
  uint64_t evictions = 0;        // Pages evicted (written back or dropped).
  // Faults that went on over the hard cap because the evictor freed no page for 500 ms while
  // running (every victim re-written as it left): the cap is soft by that page.
  uint64_t throttle_giveups = 0;
  uint64_t prefetch_issued = 0;  // Pages read ahead.
  // Faults served from a prefetch buffer: prefetched pages wait unmapped in pager-owned buffers
  // (at most 256 + 2 x prefetch_max_pages of them, not counted as resident) until their first
  // fault, so a hit is exact (an access, served without a store round trip); unused buffers are
  // recycled oldest first.
  uint64_t prefetch_hits = 0;
  uint64_t discarded = 0;        // Pages released by Discard().
  // Inactive list (PagerOptions::inactive_list).
  uint64_t deactivated = 0;     // Pages moved to the staging area.
  uint64_t minor_refaults = 0;  // Faults served by moving a staged page back (no store read).
  uint64_t inactive_drops = 0;  // Staged pages that reached the list's end: written back or
                                // dropped (counted in evictions too).
  uint64_t near_refaults = 0;   // Store reads of pages dropped so recently that a longer list
                                // would have kept them (they grow its target).
  uint64_t staged_pages = 0;    // Now (part of resident_pages).
  uint64_t inactive_target_pages = 0;  // The list's current target length.
  uint64_t fault_batches = 0;      // Wake-ups whose store reads were posted together (>= 2).
  uint64_t fault_batch_pages = 0;  // Pages read in those batches.
  uint64_t spin_hits = 0;        // Fault batches a fault thread found while polling the uffd
                                 // (fault_spin_us) instead of being woken for them.
  uint64_t fill_errors = 0;      // Faults the store could not serve (SIGBUS to the program).
  uint64_t fill_retries = 0;     // Page reads retried after a failure that was not DataLoss.
  uint64_t writeback_errors = 0; // Write-backs the store rejected (page kept resident).
  uint64_t resident_pages = 0;   // Now: local pages, mapped or staged.
  uint64_t peak_resident_pages = 0;
  uint64_t footprint_pages = 0;  // Pages holding data now (resident or remote).
  uint64_t peak_footprint_pages = 0;
  uint64_t limit_pages = 0;      // The current cap (0: none).
  // fork (see "fork" above).
  uint64_t fork_snapshots = 0;   // Forks whose child shared pages through the store.
  uint64_t fork_fallbacks = 0;   // Forks that paged everything in first.
  uint64_t fork_preserved = 0;   // Store pages copied aside for a child before a write-back.
  uint64_t fork_pinned = 0;      // Write-backs held back (no spare store page): page kept.
  uint64_t fork_window_faults = 0;  // Faults of the parent served while a fork() was made.
  uint64_t fork_child_faults = 0;           // Missing faults served to children.
  uint64_t fork_child_dropped = 0;          // Pages children's evictors dropped.
  uint64_t fork_child_limit_pages = 0;      // The last child's cap.
  uint64_t fork_child_peak_resident_pages = 0;  // Over all children.
  uint64_t fork_child_peak_dirty_pages = 0;     // Pages a child wrote (could not drop), peak.
  LatencyHistogram fault_latency;  // Missing fault read from the uffd to its page mapped, ns.
  LatencyHistogram remote_fault_latency;  // The same, for faults served by a store read only.
};

class Pager {
 public:
  static Result<std::unique_ptr<Pager>> Create(const PagerOptions& options);
  // Stops the pager's threads, unregisters and unmaps the region. No fault may be pending.
  virtual ~Pager() = default;
  Pager(const Pager&) = delete;
  Pager& operator=(const Pager&) = delete;

  uint8_t* base() const { return base_; }
  size_t size() const { return size_; }
  bool Contains(const void* p, size_t len = 1) const {
    auto a = reinterpret_cast<uintptr_t>(p), b = reinterpret_cast<uintptr_t>(base_);
    return a >= b && len <= size_ && a - b <= size_ - len;
  }

  // The program released [addr, addr + len) (munmap, MADV_DONTNEED, an allocator purge): the
  // pages read as zeros afterwards and their store copies are trimmed. Page-aligned, inside
  // the region; InvalidArgument otherwise.
  virtual Status Discard(void* addr, size_t len) = 0;

  // Registration. The whole region starts paged. Unregister() takes a page-aligned part of it
  // out of paging, so that the program may change it in ways the pager cannot follow (take
  // away read access, place a file or shared mapping over it, mlock it): with keep_content its
  // remote pages are read back in first, without it the range is discarded (reads as zeros);
  // then it is unregistered from userfaultfd, its store copies are trimmed, and its pages leave
  // the resident set and the footprint. Faults there are the kernel's from then on; Discard()
  // on such pages only drops them (MADV_DONTNEED). Register() puts unregistered pages back under
  // paging; [addr, addr + len) must then be a readable private anonymous mapping again: pages
  // present in memory (or in the kernel's swap) become resident dirty pages, the others
  // never-written. Pages already in the asked state are left as they are. InvalidArgument for a
  // range not page-aligned or not inside the region.
  virtual Status Unregister(void* addr, size_t len, bool keep_content) = 0;
  virtual Status Register(void* addr, size_t len) = 0;

  // See "fork" in the file comment. `child` is fork()'s return value in the parent (-1: the
  // fork failed).
  virtual Status PrepareFork() = 0;
  virtual void ParentAfterFork(pid_t child) = 0;
  virtual void ChildAfterFork() = 0;
  // The process is about to exit (the shim calls it at exit; the destructor does too): a forked
  // child still sharing pages gets every page it has not mapped, and serves its own faults from
  // then on. Blocks until that is done (a store read per page the child has not mapped).
  virtual void HandOffChildren() = 0;

  virtual PagerStats Stats() const = 0;

 protected:
  // The implementation (pager.cc) derives from Pager.
  Pager(uint8_t* base, size_t size) : base_(base), size_(size) {}

 private:
  uint8_t* const base_;
  const size_t size_;
};

}  // namespace tessera::kernel_shim
