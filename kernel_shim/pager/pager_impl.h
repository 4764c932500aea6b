// PagerImpl: the pager's implementation, shared by its files (internal; see pager.h for the
// contract and page_state.h for the per-page state word):
//   pager.cc          creation, teardown, Discard, registration, stats;
//   fork.cc           fork(), the parent: the snapshot, the store pages kept for the child,
//                     the monitor serving the child's faults (fork_state.h: what they share);
//   fork_child.cc     fork(), the child: its page words, its evictor;
//   fault_handler.cc  the fault threads: missing and write-protect faults, fills, zero fills;
//   prefetcher.cc     the stream detector and read-ahead into pager-owned buffers;
//   evictor.cc        the eviction thread: cap, throttle, pipelined write-back batches;
//   victim_policy.cc  which pages the evictor takes (testable without userfaultfd);
//   uffd.cc           the userfaultfd descriptor and its ioctls.
//
// Who resolves a faulting thread. The kernel blocks a faulting thread until its page is mapped
// (UFFDIO_COPY wakes the waiters of the range) or it is woken (UFFDIO_WAKE, or UFFDIO_WRITEPROTECT
// clearing protection, which wakes). Every message therefore ends in exactly one of: a COPY by the
// owner of the page (a fill in flight already will wake it: duplicates are dropped); a WAKE when
// the page is mapped already or the message is stale; or, while another party owns the page in a
// transition that is about to unmap it (kDropping, kDiscarding) or to map it (kPrefetching), a
// waiter flag set by CAS in the page word: the owner reads the flags back with the same atomic
// exchange that ends its transition and resolves the waiter (fills the page or wakes). No path
// can lose a waiter because the flag and the state change in one word.
//
// Writes racing with eviction. Eviction takes kClean/kDirty pages (never one with kBusy set, i.e.
// while a write-protect fault is lifting protection) to kEvicting, write-protects the dirty ones,
// copies them into its own buffers and writes those back. A write-protect fault on a kEvicting
// page sets kRedirty and lifts protection (the write goes on); the commit step then keeps the page
// (kDirty) instead of dropping it. Commit is a CAS kEvicting -> kDropping that fails if kRedirty
// appeared, so a write either happened before the copy was taken, or keeps the page, or (once
// kDropping) waits blocked in the kernel until the page is unmapped and is then woken to re-fault
// the written-back bytes.
//
// Threads: see each member's comment; counters are atomics any thread updates.
#pragma once

#include <sys/types.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "client/page_store.h"
#include "common/clock.h"
#include "common/fd.h"
#include "common/histogram.h"
#include "kernel_shim/pager/fork_state.h"
#include "kernel_shim/pager/inactive_list.h"
#include "kernel_shim/pager/page_state.h"
#include "kernel_shim/pager/pager.h"
#include "kernel_shim/pager/prefetcher.h"
#include "kernel_shim/pager/uffd.h"
#include "kernel_shim/pager/victim_policy.h"

namespace tessera::kernel_shim::internal {

using client::kPageSize;
using client::PageId;
using client::PageOp;

// One batch of write-backs. Shared by the eviction thread and the ops' callbacks (one reference
// each); the last to let go deletes it, so a store that completes an op after the eviction
// thread stopped waiting (see kWritebackTimeoutMs) still writes into live memory.
struct WbBatch {
  std::vector<uint8_t> bufs;
  std::vector<PageOp> ops;
  std::vector<uint8_t> done;  // Under mu: op i completed (its status may be read).
  std::mutex mu;
  std::condition_variable cv;
  size_t pending = 0;         // Under mu.
  std::atomic<int> refs{1};
  void Unref() {
    if (refs.fetch_sub(1) == 1) delete this;
  }
};
// The store promises every accepted op completes (its own op timeout is seconds); past this the
// pager stops waiting, keeps the batch's pages resident and dirty, and goes on.
constexpr int kWritebackTimeoutMs = 30000;

// A fill context: one op, one page buffer.
struct FillCtx {
  PageOp op;
  alignas(64) uint8_t buf[kPageSize];
  class PagerImpl* pager = nullptr;
  uint32_t index = 0;
  bool prefetch = false;
  uint64_t start_ns = 0;
};

// Zero-fill fault-around: at most this many neighbours per fault, copied from kZeroRun.
constexpr size_t kMaxFaultAround = 64;
alignas(4096) inline const uint8_t kZeroRun[(kMaxFaultAround + 1) * kPageSize] = {};

inline bool IsAllZero(const uint8_t* page) { return std::memcmp(page, kZeroRun, kPageSize) == 0; }

inline void AddFootprint(std::atomic<int64_t>& fp, std::atomic<uint64_t>& peak, int64_t d) {
  int64_t f = fp.fetch_add(d) + d;
  uint64_t pk = peak.load();
  while (f > 0 && static_cast<uint64_t>(f) > pk && !peak.compare_exchange_weak(pk, f)) {}
}

class PagerImpl final : public Pager {
 public:
  PagerImpl(uint8_t* base, size_t size, const PagerOptions& o, Uffd uffd, uint64_t* states)
      : Pager(base, size), o_(o), pages_(size / kPageSize), uffd_(std::move(uffd)),
        states_(reinterpret_cast<std::atomic<uint64_t>*>(states)),
        have_poison_(uffd_.has_poison()) {}

  Status Start();
  ~PagerImpl() override;

  Status Discard(void* addr, size_t len) override;
  Status Unregister(void* addr, size_t len, bool keep_content) override;
  Status Register(void* addr, size_t len) override;
  void HandOffChildren() override;
  Status PrepareFork() override;
  void ParentAfterFork(pid_t child) override;
  void ChildAfterFork() override;
  PagerStats Stats() const override;

  static void FillDone(PageOp* op);
  static void WriteDone(PageOp* op);

 private:
  std::atomic<uint64_t>& W(PageId p) { return states_[p]; }
  uint8_t* Addr(PageId p) const { return base() + p * kPageSize; }

  void FaultLoop(int index);
  // The fork window (see fork_window_mu_): a fault thread that saw fork_read_only_ reads the
  // userfaultfd and queues page faults for ForkWindowLoop until the window closes, allocating
  // nothing; UFFD_EVENT_FORK it hands to OnForkEvent as always.
  void ReadThroughForkWindow(int index);
  void ForkWindowLoop();
  // Opens the window and waits until every fault thread reads only (false: one did not within
  // the deadline, the window is closed again); CloseForkWindow lets them serve again.
  bool OpenForkWindow(const Deadline& deadline);
  void CloseForkWindow();
  void RingFaultThreads();
  // Polls the userfaultfd for up to fault_spin_us; true when a fault is waiting. One fault
  // thread polls at a time (spinner_): the others sleep in poll(), so that polling never takes
  // more than one CPU from the program and the memory servers it waits on.
  bool SpinForFault();
  // Serves a missing fault on page p. With `sync_buf` (a fault thread's own page buffer) a
  // remote page is read on this thread and mapped here; without, the read is submitted and the
  // store's completion callback maps it.
  void HandleMissing(PageId p, bool write, uint64_t t0, StreamDetector* stream,
                     uint8_t* sync_buf = nullptr);
  // Serves the missing faults of one wake-up (fault_thread_reads, batch_faults): the stored
  // pages among them are read with one ReadPages (posted together) on this thread and mapped;
  // the others are served one by one (HandleMissing).
  void ServeMissingBatch(const std::vector<std::pair<PageId, uint64_t>>& missing, uint64_t t0);
  // Claims (kNever -> kFilling) up to zero_fault_around_pages never-written pages after p,
  // within the cap; returns how many (a contiguous run p+1..p+n).
  size_t ClaimZeroNeighbours(PageId p);
  // Maps zeros writable at p (owned, kFilling) and its n claimed neighbours in one UFFDIO_COPY
  // and publishes them kDirty (never stored: a victim still all zeros is dropped unwritten).
  void MapZeroRun(PageId p, size_t n, uint64_t in_store, uint64_t t0);
  void HandleWp(PageId p);
  void StartFill(PageId p, FillCtx* c, uint64_t t0);
  void CompleteFill(FillCtx* c);
  void CompletePrefetch(FillCtx* c);
  void MaybePrefetch(PageId p, StreamDetector* s);
  // Maps `src` at page p (write-protected unless writable). False on failure (logged).
  bool CopyIn(PageId p, const uint8_t* src, bool writable);
  void Wake(PageId p);
  void Unprotect(PageId p);
  void Poison(PageId p, const Status& why);
  // A read of page p (owned, kFilling) failed with `why`: DataLoss poisons it at once; anything
  // else is queued for the retry thread (see pager.h, "Errors").
  void FillFailed(PageId p, const Status& why);
  // The retry thread: re-reads queued pages when their backoff is over, maps them, or requeues
  // them with twice the backoff, or poisons them (DataLoss, fill_retry_limit_ms).
  void RetryLoop();
  struct Retry {
    uint64_t due_ns = 0;
    PageId page = 0;
    uint32_t attempt = 0;     // Retries done so far.
    uint64_t backoff_ms = 0;  // The wait before the next one.
    uint64_t first_ns = 0;    // When the first read failed.
  };
  void QueueRetry(Retry r, const Status& why);
  void BecameResident(PageId p);  // Counters only.
  void RecordLatency(uint64_t t0);
  // Accounts, COPYs `src` to page p (owned by the caller in kFilling) and publishes its state
  // (kDirty if writable else kClean, plus `in_store`). On failure the page goes back to kRemote
  // (or kNever) and its waiters are woken to re-fault.
  bool MapPage(PageId p, const uint8_t* src, bool writable, uint64_t in_store, uint64_t t0);
  void ResolveWaiters(PageId p, uint64_t old_word);

  // Inactive list (see inactive_list.h). Staging slot i is staging_ + i x kPageSize.
  bool staging_on() const { return staging_ != nullptr; }
  uint8_t* Slot(uint32_t slot) const { return staging_ + size_t{slot} * kPageSize; }
  // Evictor: moves victims (kEvicting, mapped) into staging slots and publishes them kStaged;
  // victims that cannot move (e.g. shared with a forked child) are appended to *fallback, still
  // kEvicting, for the write-back path.
  void Deactivate(std::vector<Victim>* victims, std::vector<Victim>* fallback);
  // Evictor: claims up to n staged pages from the list's old end (kStaged -> kStagedBusy).
  void TakeOldestStaged(size_t n, std::vector<Victim>* out);
  // Maps staged page p (owned in kUnstaging, its bytes in `slot`) back into the region: moved
  // writable if dirty, else copied write-protected (a move maps writable, and a write between
  // it and a re-protection would go unseen). Wakes the faulting threads; the page becomes kDirty
  // or kClean and is activated. Returns false if it could not be mapped (the page stays staged
  // and its waiters are woken to fault again).
  bool Unstage(PageId p, uint32_t slot, bool dirty, uint64_t in_store, uint64_t t0);
  // Moves n pages between the region and the staging area (to_staging: src is in the region,
  // else dst is; a move into the region wakes the threads faulting there). The caller owns the
  // pages (kEvicting, kUnstaging). Returns how many moved, from the start, and *st the error for
  // the next one. Where the kernel reports an error, the region's page table decides whether
  // the page moved (Uffd::Move: it may have): if it did, the move goes on after it.
  size_t MoveStaging(uint8_t* dst, uint8_t* src, size_t n, bool to_staging, Status* st);
  void ReleaseSlot(uint32_t slot);
  // Sorts ids and calls f(first, count) once per run of consecutive ids.
  template <typename F>
  static void ForEachRun(std::vector<uint64_t>* ids, F f) {
    std::sort(ids->begin(), ids->end());
    for (size_t k = 0; k < ids->size();) {
      size_t j = k;
      while (j + 1 < ids->size() && (*ids)[j + 1] == (*ids)[j] + 1) ++j;
      f((*ids)[k], j - k + 1);
      k = j + 1;
    }
  }
  // MADV_DONTNEED of the pages at base + id * kPageSize for these ids (sorted here), each run
  // of consecutive ids in one call.
  static void DropRuns(uint8_t* base, std::vector<uint64_t>* ids);
  // Evictor, at a staged victim's commit: drops it (kRemote or kNever; its slot goes to
  // *freed_slots, for the caller to empty with DropRuns), or moves it back into the region when
  // its write-back failed or a fault waits for it.
  void FinishStaged(const Victim& v, bool zero, const Status& wb,
                    std::vector<uint64_t>* freed_slots);
  // A store read of page p: the evictor tells the list's sizer (refault distance).
  void NoteRefault(PageId p);
  // Whether a stored page filled for a read fault is mapped writable (see fault_handler.cc).
  bool MapFillWritable();
  void Handoff(PageId p, bool write);

  FillCtx* GetCtx(bool for_prefetch);
  void PutCtx(FillCtx* c);

  // Eviction.
  uint64_t LimitPages() const;  // The local budget (0: none).
  // What resident pages may use of it: the budget less the compressed tier's charge.
  uint64_t ResidentCap() const;
  // The most the resident set (inactive list included) may reach while eviction catches up:
  // the cap plus one pipeline's slack. Faults past it wait (Throttle), and fault-around never
  // maps beyond it. 0: no cap.
  uint64_t HardCap() const;
  void MaybeKickEviction();
  // Back-pressure: while the resident set is above HardCap() (eviction falling behind), the
  // fault thread waits as long as the evictor makes progress; it goes on only when the evictor
  // can free nothing (every resident page held), the store refuses write-backs, eviction is
  // paused for a fork, or the pager stops.
  void Throttle();
  void EvictLoop();
  // One eviction batch in flight: its victims (kEvicting), which of them were all-zero never
  // stored pages (dropped unwritten), and the write-backs submitted for the others.
  struct EvictJob {
    std::vector<Victim> victims;
    std::vector<uint8_t> zero;
    WbBatch* batch = nullptr;  // One reference held by the job.
    Status submit_status;      // Submit() refused the write-backs (no callbacks will come).
    bool submitted = false;
    // Victims whose write-back was held back: a forked child still reads their store page and
    // no spare page could take its old bytes (PreserveForChild). Kept resident.
    std::vector<uint8_t> pinned;
  };
  // Write-protects and copies out the victims and submits their write-backs; does not wait.
  std::unique_ptr<EvictJob> StartEvict(std::vector<Victim> victims);
  // Waits (bounded) for the job's write-backs, then drops the victims or keeps the ones
  // written meanwhile or whose write-back failed. Returns the number of failed write-backs.
  size_t FinishEvict(EvictJob* job);
  // Write-protects a resident dirty page (it stays kDirty): its next write faults and sets kRef.
  // Queues a write trap on resident dirty page p (the victim policy's callback); the evictor
  // sets the queued traps after each round of the chooser, runs of pages in one ioctl.
  void ArmWriteTrap(PageId p);
  // Write-protects the pages (sorted), runs of consecutive pages in one ioctl; logs failures.
  void WriteProtectRuns(const std::vector<PageId>& sorted, const char* what);
  void FlushWriteTraps();
  std::vector<PageId> traps_pending_;  // Evictor thread only.
  void NoteTouched(PageId p) {
    uint64_t m = max_page_.load(std::memory_order_relaxed);
    while (p + 1 > m && !max_page_.compare_exchange_weak(m, p + 1)) {}
  }
  void DrainPolicyEvents();

  // fork (fork.cc; see "fork" in pager.h).
  // Pages every remote page back in (the fallback: the child gets a full private copy).
  // With staged_only, the inactive list's pages only (moved back: the child then shares the rest
  // through the store).
  Status PageIn(bool staged_only);
  // Waits (bounded) until an earlier child that has exited is released (ReleaseSnapshot).
  void AwaitEndedChild(const Deadline& deadline);
  // Writes back every dirty resident page (kept resident, clean and write-protected), so that
  // every page of the child has its bytes in the store or mapped write-protected.
  Status WriteBackForFork(const Deadline& deadline);
  // Builds the snapshot (snap_) and the child's shared area; fork_window_ is set.
  Status BuildSnapshot(const Deadline& deadline);
  // The monitor: a UFFD_EVENT_FORK message on uffd_ handed the child's descriptor.
  void OnForkEvent(int fd);
  // The monitor's thread: serves the child's faults, notices its end.
  void ChildLoop();
  void ServeChildFault(uint64_t addr, uint64_t flags);
  // Waits while the child's transition on page p (its evictor or a discard) is under way; false
  // when the child is gone.
  bool WaitChildWord(std::atomic<uint8_t>& w, uint8_t* out);
  // The snapshot's bytes of page p into buf (a copy-aside made meanwhile is followed). Retries a
  // failure that is not DataLoss with backoff, at most max_retries times (0: while the child
  // lives); *why says why a page is lost.
  enum class SnapRead { kBytes, kZeros, kLost, kChildGone };
  SnapRead ReadSnapshotPage(PageId p, uint8_t* buf, uint32_t max_retries, Status* why);
  bool ChildAlive();
  // The child is gone (or the fork failed): the store pages kept for it are freed.
  void ReleaseSnapshot();
  // Before the write-back of victims whose store page the snapshot still names: their old bytes
  // are copied aside to a spare page first (snap_ follows). Ops that cannot be (no spare page,
  // the copy failed) are taken out of *submit and flagged in *pinned (kept resident).
  void PreserveForChild(std::vector<PageOp*>* submit, std::vector<uint8_t>* pinned,
                        const std::vector<PageOp>& ops);
  // Trims the store copies of pages [first, first + n) (old: their words before Discard or
  // Unregister took them), except those a forked child may still read.
  void TrimForParent(PageId first, size_t n, const std::vector<uint64_t>& old);
  // While a fork is being made: marks pages whose discard starts now (before their madvise).
  void MarkForkDiscards(PageId first, size_t n);
  bool AllocSpare(uint64_t* id);
  void FreeSpare(uint64_t id);
  // The parent maps every page the child has not and lets it serve itself (ChildLoop, on
  // handoff_requested_).
  void HandOffChild();
  // In a forked child (child_paged_): its side of the protocol.
  void ChildInit();
  // The parent stopped serving (it handed off, or died): the child serves its own faults from
  // then on, from its own reference to its userfaultfd: zeros where the snapshot says zeros,
  // SIGBUS where only the store had the bytes, never wrong bytes.
  void ChildSelfServe();
  void ChildEvictLoop();
  Status ChildDiscard(PageId first, size_t n);
  void ChildUnpage(PageId first, size_t n);
  // Takes the child's pages [first, first + n) to state `to` once no transition is under way
  // (unpaged ones stay so), and takes them out of its counts.
  void TakeChildPages(PageId first, size_t n, uint8_t to);
  // The evictor: drops the child's pages (sorted, owned in kCDropping), runs in one madvise.
  void DropChildPages(const PageId* sorted, size_t n);
  Status ChildPrepareFork();
  void CloseForkSockets();
  std::atomic<uint8_t>* CWord(PageId p) const {
    return reinterpret_cast<std::atomic<uint8_t>*>(reinterpret_cast<uint8_t*>(cshared_) +
                                                   kChildWordsOffset) + p;
  }

  const PagerOptions o_;
  const size_t pages_;
  Uffd uffd_;
  UniqueFd stop_fd_;  // eventfd: stop, or a handoff is queued.
  std::atomic<uint64_t>* states_;
  const bool have_poison_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> spinner_{false};  // A fault thread is in SpinForFault.
  bool child_ = false;        // This copy of the pager lives in a forked child.
  bool child_paged_ = false;  // ... whose region the parent's monitor serves (ChildInit).

  // fork: one at a time, PrepareFork to ParentAfterFork.
  std::mutex fork_mu_;
  bool fork_snapshot_ = false;            // This fork shares pages through the store.
  std::atomic<bool> fork_window_{false};  // PrepareFork .. ParentAfterFork (discards marked).
  std::atomic<bool> snap_live_{false};    // A child may read the snapshot's store pages.
  std::mutex snap_mu_;                    // Orders preserve / trim decisions with the release.
  std::atomic<uint64_t>* snap_ = nullptr;  // pages_ words (private: the child has a copy).
  std::atomic<uint8_t>* marks_ = nullptr;  // pages_ marks (private).
  std::atomic<uint64_t> snap_end_{0};    // Pages of the snapshot ([0, snap_end_)).
  // Spare store pages [pages_, capacity): copies of snapshot pages the parent overwrote.
  uint64_t spare_total_ = 0;
  std::mutex spare_mu_;
  uint64_t spare_next_ = 0;
  std::vector<uint64_t> spare_free_;
  // The child (at most one): its shared area, descriptor and pidfd; under child_mu_.
  mutable std::mutex child_mu_;
  std::condition_variable child_cv_;
  ChildShared* cshared_ = nullptr;
  size_t cshared_bytes_ = 0;
  bool expect_child_ = false;  // The next UFFD_EVENT_FORK is this fork's child.
  bool child_active_ = false;  // child_uffd_ is the child's.
  Uffd child_uffd_;
  std::atomic<int> child_pidfd_{-1};
  UniqueFd child_wake_;        // eventfd: ChildLoop re-reads its descriptors (or stops).
  // The child gets its own reference to its userfaultfd over this socketpair ([0] the parent's
  // end, [1] the child's), so that the registration outlives the parent.
  int fork_sock_[2] = {-1, -1};
  bool handoff_requested_ = false;  // Under child_mu_: the process is exiting.
  bool handoff_done_ = false;
  // In the child: its own userfaultfd and the parent's pidfd (-1: none).
  int own_uffd_ = -1;
  int parent_pidfd_ = -1;
  std::atomic<uint64_t> fork_snapshots_{0}, fork_fallbacks_{0}, fork_preserved_{0},
      fork_pinned_{0}, fork_child_served_{0}, fork_child_peak_resident_{0},
      fork_child_peak_dirty_{0}, fork_child_limit_{0}, fork_child_dropped_{0};

  std::vector<std::thread>* threads_ = new std::vector<std::thread>();

  // The fork window, from PrepareFork's return to ParentAfterFork. fork() waits inside the
  // kernel until a reader of uffd_ reads its UFFD_EVENT_FORK, and the C library holds its
  // allocator's locks around that copy: a fault thread that allocates while serving a fault of
  // another thread (the store's Submit, a vector) would block until fork() returns, and fork()
  // would wait for it forever. So in the window the fault threads only read: page faults go to
  // a fixed queue that ForkWindowLoop serves (it may block in an allocation until fork()
  // returns; the readers go on and read the fork event). Faults of the forking thread itself
  // before the copy (fork handlers) are served by it the same way.
  std::atomic<bool> fork_read_only_{false};
  std::vector<UniqueFd> fault_bells_;  // An eventfd per fault thread: look at fork_read_only_.
  int fault_threads_ = 0;
  std::mutex fork_window_mu_;
  std::condition_variable fork_window_cv_;  // Queued faults, a thread reading only, or stop.
  uint64_t fork_window_gen_ = 0;            // Windows opened, under fork_window_mu_.
  int read_only_threads_ = 0;               // In this window, under fork_window_mu_.
  struct QueuedFault {
    uint64_t addr = 0, flags = 0;
  };
  static constexpr size_t kForkWindowQueue = 4096;
  std::unique_ptr<QueuedFault[]> window_q_;  // Ring under fork_window_mu_.
  size_t window_head_ = 0, window_count_ = 0;
  std::atomic<uint64_t> fork_window_faults_{0};

  // Fill contexts.
  static constexpr size_t kDemandReserve = 64;
  std::vector<FillCtx>* ctxs_ = nullptr;
  std::mutex ctx_mu_;
  std::condition_variable ctx_cv_;
  std::vector<uint32_t> free_ctx_;
  std::deque<uint32_t> prefetched_fifo_;  // Under ctx_mu_.
  std::atomic<int64_t> fills_in_flight_{0};

  // The fault stream the prefetcher follows: one for all fault threads (a program's sequential
  // faults are read by whichever thread is free), under stream_mu_.
  std::mutex stream_mu_;
  StreamDetector stream_{o_.prefetch_max_pages};

  // Work handed to the fault threads from store callbacks.
  std::mutex handoff_mu_;
  std::vector<std::pair<PageId, bool>> handoff_;

  // Pages waiting for a retried read (kFilling), under retry_mu_; retry_cv_ wakes the retry
  // thread for a new entry or to stop.
  std::mutex retry_mu_;
  std::condition_variable retry_cv_;
  std::vector<Retry> retries_;

  // Policy events (page became resident / was written) for the eviction thread.
  std::mutex events_mu_;
  std::vector<PageId> resident_events_;
  std::vector<PageId> activated_events_;  // Minor refaults (Activate in the chooser).
  std::vector<PageId> refault_events_;    // Store reads (InactiveSizer::Refaulted).
  // Eviction thread state (owned by it).
  std::unique_ptr<VictimChooser> chooser_;
  // The staging area (null when the inactive list is off): staging_slots_ pages, registered in
  // missing mode on uffd_ (nothing ever touches it but moves, copies and the evictor's reads of
  // slots it owns).
  uint8_t* staging_ = nullptr;
  size_t staging_slots_ = 0;
  std::unique_ptr<InactiveRing> ring_;       // Evictor thread only.
  InactiveSizer sizer_;                      // Evictor thread only.
  std::atomic<int64_t> staged_{0};           // Pages kStaged, kUnstaging or kStagedBusy.
  std::atomic<int64_t> staged_inflight_{0};  // Staged victims being written back (slots busy).
  std::atomic<uint64_t> inactive_target_{0};
  std::atomic<uint64_t> move_errors_{0};
  std::atomic<uint64_t> move_misreports_{0};  // Moves reported failed that moved (MoveStaging).
  std::atomic<uint64_t> deactivated_{0}, minor_refaults_{0}, inactive_drops_{0}, near_refaults_{0};

  std::mutex evict_mu_;
  std::condition_variable evict_cv_;
  bool evict_kick_ = false;
  int evict_paused_ = 0;     // PrepareFork pauses.
  bool evict_running_ = false;
  // The evictor's last pass ended above the low watermark with nothing it could pick (every
  // resident page in a transition or held): a throttled fault goes on rather than wait on it.
  bool evict_stuck_ = false;
  std::condition_variable evict_idle_cv_;
  std::atomic<uint64_t> max_page_{0};  // One past the highest page ever faulted.
  std::atomic<bool> evict_failing_{false};  // The last eviction batch had failed write-backs.

  // Counters.
  std::atomic<uint64_t> zero_fill_around_{0}, zero_drops_{0}, traps_armed_{0}, trap_ioctls_{0};
  std::atomic<uint64_t> throttle_giveups_{0};
  // Adaptive writable fills (MapFillWritable): stored pages mapped clean, and how many of them
  // took a write-protect fault; fills mapped writable because of it.
  std::atomic<uint64_t> fill_seq_{0}, filled_clean_{0}, written_after_fill_{0}, fills_writable_{0};
  std::atomic<uint64_t> faults_{0}, wp_faults_{0}, trap_faults_{0}, zero_fills_{0},
      remote_reads_{0}, remote_writes_{0}, clean_drops_{0}, evictions_{0}, prefetch_issued_{0},
      prefetch_hits_{0}, discarded_{0}, fill_errors_{0}, writeback_errors_{0}, spin_hits_{0},
      fill_retries_{0}, fault_batches_{0}, fault_batch_pages_{0};
  std::atomic<int64_t> resident_{0}, footprint_{0};
  std::atomic<uint64_t> peak_resident_{0}, peak_footprint_{0};
  mutable std::mutex hist_mu_;
  LatencyHistogram fault_latency_;
  LatencyHistogram remote_fault_latency_;
};

}  // namespace tessera::kernel_shim::internal
