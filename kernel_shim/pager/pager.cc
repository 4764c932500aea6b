// The userfaultfd pager (see pager.h for the contract).
//
// Per-page state machine. Every page of the region has one 64-bit atomic word in `states_` (an
// untouched anonymous mapping, so only pages whose words are touched cost memory; all-zero is
// kNever). Bits 0-3 hold the state, bits 8-15 flags, bits 32-63 the index of a fill context
// (prefetch buffer) while the page is kPrefetching/kPrefetched.
//
//   kNever       never written (or discarded): a fault maps zeros, no store round trip.
//   kRemote      content in the store, not mapped.
//   kFilling     a fill owns the page (store read in flight, or the UFFDIO_COPY being made).
//   kClean       mapped write-protected; the store holds the same bytes (or it is kNever data).
//   kDirty       mapped writable (or write-protected with a write-protect fault pending).
//   kEvicting    picked by eviction: write-protected, its bytes copied out, write-back in flight.
//   kDropping    eviction is MADV_DONTNEEDing it.
//   kDiscarding  Discard() owns it.
//   kPrefetching a prefetch read is in flight into a pager-owned buffer.
//   kPrefetched  the prefetched bytes wait in that buffer for the page's first fault.
//   kPoisoned    the store could not return it: UFFDIO_POISON, accesses get SIGBUS.
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
// Victim policy (kSmart): 2Q-like with a ghost history and write traps. A user-space pager sees
// no access bits, only faults; so it makes its own: the policy write-protects resident dirty
// pages ("arms a trap") as they come round, and a write-protect fault on an armed or clean page
// sets kRef. New pages enter a probation FIFO (1/8 of the cap); a page found written there is
// promoted to the protected segment, as is a page re-faulted while its id is in the ghost list of
// recently evicted pages. Protected is a CLOCK whose pages earn a 2-bit credit for each round in
// which they were written, and spend one per round without, so frequently written pages survive
// several rounds (LFU-like memory). Probation is evicted first while it is above its share. Reads
// of resident pages stay invisible (no trap for them without unmapping the page), so read-only hot
// pages are recognised only through the ghost list. kFifo evicts in fault order, no traps.
//
// Prefetch. Each fault thread keeps the deltas of its last faults on remote pages; when a
// majority of them agree (a sequential or strided stream, Leap's majority trend), it reads ahead
// a window of pages along the stream, doubling the window on hits and halving it on misses.
// Prefetched pages are kept in pager-owned buffers (not mapped) until their fault arrives, so a
// hit is a fault served without a store round trip and is counted exactly; unused prefetched
// buffers are recycled oldest first.
#include "kernel_shim/pager/pager.h"

#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/clock.h"
#include "common/fd.h"
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
#ifndef USERFAULTFD_IOC_NEW
#define USERFAULTFD_IOC_NEW _IO(0xAA, 0x00)
#endif

namespace tessera::kernel_shim {
namespace {

using client::kPageSize;
using client::PageId;
using client::PageOp;

enum State : uint64_t {
  kNever = 0,
  kRemote = 1,
  kFilling = 2,
  kClean = 3,
  kDirty = 4,
  kEvicting = 5,
  kDropping = 6,
  kDiscarding = 7,
  kPrefetching = 8,
  kPrefetched = 9,
  kPoisoned = 10,
};
constexpr uint64_t kStateMask = 0xf;
// Flags.
constexpr uint64_t kWaitMissing = 1ull << 8;  // A missing fault waits for the owner.
constexpr uint64_t kWaitWrite = 1ull << 9;    // ... and it was a write.
constexpr uint64_t kWaitWp = 1ull << 10;      // A write-protect fault waits (kDropping etc.).
constexpr uint64_t kRedirty = 1ull << 11;     // Written while kEvicting: keep it.
constexpr uint64_t kBusy = 1ull << 12;        // A WP fault is lifting protection.
constexpr uint64_t kInStore = 1ull << 13;     // The store holds a copy (written back once).
constexpr uint64_t kRef = 1ull << 14;         // Written since last considered (policy hint).
constexpr uint64_t kFillWrite = 1ull << 15;   // The fill serves a write fault: map writable.
constexpr uint64_t kArmed = 1ull << 16;      // Write-protected by the policy to see writes.
constexpr int kCreditShift = 17;              // 2-bit count of recent rounds with a write.
constexpr uint64_t kCreditMask = 3ull << kCreditShift;
inline uint64_t Credits(uint64_t w) { return (w & kCreditMask) >> kCreditShift; }
inline uint64_t WithCredits(uint64_t w, uint64_t c) {
  return (w & ~kCreditMask) | (c << kCreditShift);
}
constexpr int kCtxShift = 32;

inline uint64_t St(uint64_t w) { return w & kStateMask; }
inline uint64_t With(uint64_t w, uint64_t state) { return (w & ~kStateMask) | state; }
inline uint32_t CtxOf(uint64_t w) { return static_cast<uint32_t>(w >> kCtxShift); }
inline uint64_t WithCtx(uint64_t w, uint32_t ctx) {
  return (w & 0xffffffffull) | (static_cast<uint64_t>(ctx) << kCtxShift);
}

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

Result<UniqueFd> OpenUffd() {
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

// Zero-fill fault-around: at most this many neighbours per fault, copied from kZeroRun.
constexpr size_t kMaxFaultAround = 64;
alignas(4096) const uint8_t kZeroRun[(kMaxFaultAround + 1) * kPageSize] = {};

bool IsAllZero(const uint8_t* page) { return std::memcmp(page, kZeroRun, kPageSize) == 0; }

// Probation holds 1/8 of the cap (new pages prove themselves there; measured on zipf(0.99):
// 1/10 faults 0.86x FIFO, 1/4 0.89x).
constexpr size_t kProbationDivisor = 8;

class PagerImpl final : public Pager {
 public:
  PagerImpl(uint8_t* base, size_t size, const PagerOptions& o, UniqueFd uffd, uint64_t* states,
            bool poison)
      : Pager(base, size), o_(o), pages_(size / kPageSize), uffd_(std::move(uffd)),
        states_(reinterpret_cast<std::atomic<uint64_t>*>(states)), have_poison_(poison) {}

  Status Start();
  ~PagerImpl() override;

  Status Discard(void* addr, size_t len) override;
  Status PrepareFork() override;
  void ParentAfterFork() override;
  void ChildAfterFork() override;
  PagerStats Stats() const override;

  static void FillDone(PageOp* op);
  static void WriteDone(PageOp* op);

 private:
  struct PrefetchStream {
    uint64_t last = UINT64_MAX;
    std::deque<int64_t> deltas;
    size_t window = 4;
    uint64_t issued_at_hits = 0;
  };

  std::atomic<uint64_t>& W(PageId p) { return states_[p]; }
  uint8_t* Addr(PageId p) const { return base() + p * kPageSize; }

  void FaultLoop(int index);
  // Serves a missing fault on page p. With `sync_buf` (a fault thread's own page buffer) a
  // remote page is read on this thread and mapped here; without, the read is submitted and the
  // store's completion callback maps it.
  void HandleMissing(PageId p, bool write, uint64_t t0, PrefetchStream* stream,
                     uint8_t* sync_buf = nullptr);
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
  void MaybePrefetch(PageId p, PrefetchStream* s);
  // Maps `src` at page p (write-protected unless writable). False on failure (logged).
  bool CopyIn(PageId p, const uint8_t* src, bool writable);
  void Wake(PageId p);
  void Unprotect(PageId p);
  void Poison(PageId p, const Status& why);
  void BecameResident(PageId p);  // Counters only.
  void RecordLatency(uint64_t t0);
  // Accounts, COPYs `src` to page p (owned by the caller in kFilling) and publishes its state
  // (kDirty if writable else kClean, plus `in_store`). On failure the page goes back to kRemote
  // (or kNever) and its waiters are woken to re-fault.
  bool MapPage(PageId p, const uint8_t* src, bool writable, uint64_t in_store, uint64_t t0);
  void ResolveWaiters(PageId p, uint64_t old_word);
  void Handoff(PageId p, bool write);

  FillCtx* GetCtx(bool for_prefetch);
  void PutCtx(FillCtx* c);

  // Eviction.
  uint64_t LimitPages() const;
  void MaybeKickEviction();
  // Back-pressure: while the resident set is well above the cap (eviction falling behind),
  // the fault thread waits for eviction progress (bounded) before mapping more pages.
  void Throttle();
  void EvictLoop();
  struct Victim {
    PageId page;
    bool dirty;
  };
  size_t PickVictims(std::vector<Victim>* out, size_t n);
  // One eviction batch in flight: its victims (kEvicting), which of them were all-zero never
  // stored pages (dropped unwritten), and the write-backs submitted for the others.
  struct EvictJob {
    std::vector<Victim> victims;
    std::vector<uint8_t> zero;
    WbBatch* batch = nullptr;  // One reference held by the job.
    Status submit_status;      // Submit() refused the write-backs (no callbacks will come).
    bool submitted = false;
  };
  // Write-protects and copies out the victims and submits their write-backs; does not wait.
  std::unique_ptr<EvictJob> StartEvict(std::vector<Victim> victims);
  // Waits (bounded) for the job's write-backs, then drops the victims or keeps the ones
  // written meanwhile or whose write-back failed. Returns the number of failed write-backs.
  size_t FinishEvict(EvictJob* job);
  // Write-protects a resident dirty page (it stays kDirty): its next write faults and sets kRef.
  void ArmWriteTrap(PageId p);
  void NoteTouched(PageId p) {
    uint64_t m = max_page_.load(std::memory_order_relaxed);
    while (p + 1 > m && !max_page_.compare_exchange_weak(m, p + 1)) {}
  }
  void DrainPolicyEvents();

  const PagerOptions o_;
  const size_t pages_;
  UniqueFd uffd_;
  UniqueFd stop_fd_;  // eventfd: stop, or a handoff is queued.
  std::atomic<uint64_t>* states_;
  const bool have_poison_;
  std::atomic<bool> stopping_{false};
  bool child_ = false;

  std::vector<std::thread>* threads_ = new std::vector<std::thread>();

  // Fill contexts.
  static constexpr size_t kDemandReserve = 64;
  std::vector<FillCtx>* ctxs_ = nullptr;
  std::mutex ctx_mu_;
  std::condition_variable ctx_cv_;
  std::vector<uint32_t> free_ctx_;
  std::deque<uint32_t> prefetched_fifo_;  // Under ctx_mu_.
  std::atomic<int64_t> fills_in_flight_{0};

  // Work handed to the fault threads from store callbacks.
  std::mutex handoff_mu_;
  std::vector<std::pair<PageId, bool>> handoff_;

  // Policy events (page became resident / was written) for the eviction thread.
  std::mutex events_mu_;
  std::vector<PageId> resident_events_;
  // Eviction thread state (owned by it).
  std::deque<PageId> probation_, protected_;
  std::unordered_set<PageId> ghost_set_;
  std::deque<PageId> ghost_fifo_;
  std::unordered_map<PageId, uint8_t> segment_;  // 1 probation, 2 protected.

  std::mutex evict_mu_;
  std::condition_variable evict_cv_;
  bool evict_kick_ = false;
  int evict_paused_ = 0;     // PrepareFork pauses.
  bool evict_running_ = false;
  std::condition_variable evict_idle_cv_;
  std::atomic<uint64_t> max_page_{0};
  std::atomic<bool> evict_failing_{false};  // The last eviction batch had failed write-backs.  // One past the highest page ever faulted.

  // Counters.
  std::atomic<uint64_t> zero_fill_around_{0}, zero_drops_{0}, traps_armed_{0};
  std::atomic<uint64_t> faults_{0}, wp_faults_{0}, trap_faults_{0}, zero_fills_{0}, remote_reads_{0},
      remote_writes_{0}, clean_drops_{0}, evictions_{0}, prefetch_issued_{0}, prefetch_hits_{0},
      discarded_{0}, fill_errors_{0}, writeback_errors_{0};
  std::atomic<int64_t> resident_{0}, footprint_{0};
  std::atomic<uint64_t> peak_resident_{0}, peak_footprint_{0};
  mutable std::mutex hist_mu_;
  LatencyHistogram fault_latency_;
  LatencyHistogram remote_fault_latency_;
};

// ---------------------------------------------------------------------------------------------
// Setup and teardown.

Status PagerImpl::Start() {
  int efd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (efd < 0) return ErrnoError("eventfd");
  stop_fd_.Reset(efd);
  size_t nctx = 256 + 2 * o_.prefetch_max_pages;
  ctxs_ = new std::vector<FillCtx>(nctx);
  free_ctx_.reserve(nctx);
  for (size_t i = 0; i < nctx; ++i) {
    (*ctxs_)[i].pager = this;
    (*ctxs_)[i].index = static_cast<uint32_t>(i);
    free_ctx_.push_back(static_cast<uint32_t>(nctx - 1 - i));
  }
  int nthreads = std::clamp(o_.fault_threads, 1, 8);
  for (int i = 0; i < nthreads; ++i) threads_->emplace_back([this, i] { FaultLoop(i); });
  threads_->emplace_back([this] { EvictLoop(); });
  return Status::Ok();
}

PagerImpl::~PagerImpl() {
  if (child_) {
    // The threads and the store exist only in the parent: leak their handles, keep the region
    // (it holds the child's private copy of the data).
    return;
  }
  stopping_.store(true);
  uint64_t one = 1;
  (void)!::write(stop_fd_.get(), &one, sizeof one);
  {
    std::lock_guard<std::mutex> l(evict_mu_);
    evict_kick_ = true;
  }
  evict_cv_.notify_all();
  for (auto& t : *threads_) t.join();
  delete threads_;
  // Store callbacks may still be running for fills/prefetches: wait for them (bounded by the
  // store's own timeouts).
  while (fills_in_flight_.load() > 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
  uffd_.Reset();
  ::munmap(base(), size());
  ::munmap(states_, pages_ * sizeof(uint64_t));
  delete ctxs_;
}

// ---------------------------------------------------------------------------------------------
// ioctls.

bool PagerImpl::CopyIn(PageId p, const uint8_t* src, bool writable) {
  uffdio_copy c{};
  c.dst = reinterpret_cast<uintptr_t>(Addr(p));
  c.src = reinterpret_cast<uintptr_t>(src);
  c.len = kPageSize;
  c.mode = writable ? 0 : UFFDIO_COPY_MODE_WP;
  for (int attempt = 0;; ++attempt) {
    c.copy = 0;
    if (::ioctl(uffd_.get(), UFFDIO_COPY, &c) == 0) return true;
    if (errno == EEXIST) {  // Mapped already (someone else won): wake and go on.
      Wake(p);
      return true;
    }
    if (errno == EAGAIN && attempt < 100000) {
      if (c.copy > 0) return true;
      sched_yield();
      continue;
    }
    TLOG(ERROR) << "pager: UFFDIO_COPY page " << p << " failed: " << strerror(errno);
    return false;
  }
}

void PagerImpl::Wake(PageId p) {
  uffdio_range r{reinterpret_cast<uintptr_t>(Addr(p)), kPageSize};
  ::ioctl(uffd_.get(), UFFDIO_WAKE, &r);
}

void PagerImpl::Unprotect(PageId p) {
  uffdio_writeprotect wp{};
  wp.range = {reinterpret_cast<uintptr_t>(Addr(p)), kPageSize};
  wp.mode = 0;  // Clear protection and wake.
  for (int attempt = 0; attempt < 100000; ++attempt) {
    if (::ioctl(uffd_.get(), UFFDIO_WRITEPROTECT, &wp) == 0) return;
    if (errno != EAGAIN) break;
    sched_yield();
  }
  TLOG(ERROR) << "pager: UFFDIO_WRITEPROTECT(clear) page " << p << ": " << strerror(errno);
  Wake(p);
}

void PagerImpl::Poison(PageId p, const Status& why) {
  fill_errors_.fetch_add(1);
  TLOG(ERROR) << "pager: page " << p << " cannot be read back (" << why.ToString()
              << "): the access gets SIGBUS";
  if (have_poison_) {
    uffdio_poison po{};
    po.range = {reinterpret_cast<uintptr_t>(Addr(p)), kPageSize};
    for (int attempt = 0; attempt < 100000; ++attempt) {
      if (::ioctl(uffd_.get(), UFFDIO_POISON, &po) == 0 || errno == EEXIST) {
        W(p).store(kPoisoned);
        Wake(p);
        return;
      }
      if (errno != EAGAIN) break;
      sched_yield();
    }
    TLOG(ERROR) << "pager: UFFDIO_POISON page " << p << ": " << strerror(errno);
  }
  // No poison support: never map zeros; leave the page remote and let the access retry.
  W(p).store(kRemote | kInStore);
  Wake(p);
}

// ---------------------------------------------------------------------------------------------
// Fault handling.

void PagerImpl::FaultLoop(int index) {
  (void)index;
  constexpr int kBatch = 64;
  uffd_msg msgs[kBatch];
  PrefetchStream stream;
  std::vector<std::pair<PageId, uint64_t>> missing;  // page, write flag
  std::vector<PageId> wps;
  std::vector<std::pair<PageId, bool>> handed;
  // This thread's page buffer for the reads it serves itself (fault_thread_reads).
  alignas(64) static thread_local uint8_t sync_page[kPageSize];
  uint8_t* const sync_buf = o_.fault_thread_reads ? sync_page : nullptr;
  while (!stopping_.load(std::memory_order_relaxed)) {
    pollfd fds[2] = {{uffd_.get(), POLLIN, 0}, {stop_fd_.get(), POLLIN, 0}};
    int n = ::poll(fds, 2, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      TLOG(ERROR) << "pager: poll: " << strerror(errno);
      return;
    }
    if (stopping_.load()) return;
    if (fds[1].revents & POLLIN) {
      uint64_t v;
      (void)!::read(stop_fd_.get(), &v, sizeof v);
      {
        std::lock_guard<std::mutex> l(handoff_mu_);
        handed.swap(handoff_);
      }
      for (auto [p, w] : handed) HandleMissing(p, w, 0, nullptr);  // Counted already.
      handed.clear();
    }
    if (!(fds[0].revents & POLLIN)) continue;
    for (;;) {
      ssize_t got = ::read(uffd_.get(), msgs, sizeof msgs);
      if (got < 0) {
        if (errno == EINTR) continue;
        if (errno != EAGAIN) TLOG(ERROR) << "pager: read(uffd): " << strerror(errno);
        break;
      }
      uint64_t t0 = MonotonicNs();
      size_t count = static_cast<size_t>(got) / sizeof(uffd_msg);
      missing.clear();
      wps.clear();
      for (size_t i = 0; i < count; ++i) {
        if (msgs[i].event != UFFD_EVENT_PAGEFAULT) continue;
        uint64_t addr = msgs[i].arg.pagefault.address;
        uintptr_t b = reinterpret_cast<uintptr_t>(base());
        if (addr < b || addr >= b + size()) continue;
        PageId p = (addr - b) / kPageSize;
        uint64_t fl = msgs[i].arg.pagefault.flags;
        if (fl & UFFD_PAGEFAULT_FLAG_WP) {
          wps.push_back(p);
        } else {
          missing.emplace_back(p, (fl & UFFD_PAGEFAULT_FLAG_WRITE) ? 1 : 0);
        }
      }
      // De-duplicate: one handling per page, a write if any of its faults was a write. Keep
      // fault order (the prefetch detector reads it), so dedupe without sorting the batch.
      if (missing.size() > 1) {
        std::vector<std::pair<PageId, uint64_t>> uniq;
        uniq.reserve(missing.size());
        for (auto& m : missing) {
          auto it = std::find_if(uniq.begin(), uniq.end(),
                                 [&](const auto& u) { return u.first == m.first; });
          if (it == uniq.end()) uniq.push_back(m); else it->second |= m.second;
        }
        missing.swap(uniq);
      }
      std::sort(wps.begin(), wps.end());
      wps.erase(std::unique(wps.begin(), wps.end()), wps.end());
      if (!missing.empty()) Throttle();
      // Several faults in one batch (threads faulting at once): all but the last are submitted
      // to the store, so their reads overlap; the last is served on this thread.
      for (size_t i = 0; i < missing.size(); ++i) {
        HandleMissing(missing[i].first, missing[i].second != 0, t0,
                      o_.prefetch ? &stream : nullptr,
                      i + 1 == missing.size() ? sync_buf : nullptr);
      }
      for (PageId p : wps) HandleWp(p);
      if (static_cast<size_t>(got) < sizeof msgs) break;
    }
  }
}

void PagerImpl::Handoff(PageId p, bool write) {
  {
    std::lock_guard<std::mutex> l(handoff_mu_);
    handoff_.emplace_back(p, write);
  }
  uint64_t one = 1;
  (void)!::write(stop_fd_.get(), &one, sizeof one);
}

bool PagerImpl::MapPage(PageId p, const uint8_t* src, bool writable, uint64_t in_store,
                        uint64_t t0) {
  BecameResident(p);
  if (!CopyIn(p, src, writable)) {
    resident_.fetch_sub(1);
    W(p).store(in_store ? (kRemote | kInStore) : kNever);
    Wake(p);
    return false;
  }
  W(p).store(in_store | (writable ? kDirty : kClean));
  RecordLatency(t0);
  // Bookkeeping off the latency path (the COPY has woken the faulting thread already).
  {
    std::lock_guard<std::mutex> l(events_mu_);
    resident_events_.push_back(p);
  }
  MaybeKickEviction();
  return true;
}

void PagerImpl::RecordLatency(uint64_t t0) {
  if (t0 == 0) return;
  uint64_t dt = MonotonicNs() - t0;
  std::lock_guard<std::mutex> l(hist_mu_);
  fault_latency_.Record(dt);
}

// Accounting for a page about to be mapped (done before the COPY so that the woken thread
// sees consistent stats; undone by Unresident if the COPY fails).
void PagerImpl::BecameResident(PageId) {
  int64_t r = resident_.fetch_add(1) + 1;
  uint64_t pr = peak_resident_.load();
  while (static_cast<uint64_t>(r) > pr && !peak_resident_.compare_exchange_weak(pr, r)) {}
}

static void AddFootprint(std::atomic<int64_t>& fp, std::atomic<uint64_t>& peak, int64_t d) {
  int64_t f = fp.fetch_add(d) + d;
  uint64_t pk = peak.load();
  while (f > 0 && static_cast<uint64_t>(f) > pk && !peak.compare_exchange_weak(pk, f)) {}
}

void PagerImpl::HandleMissing(PageId p, bool write, uint64_t t0, PrefetchStream* stream,
                              uint8_t* sync_buf) {
  auto& w = W(p);
  NoteTouched(p);
  for (;;) {
    uint64_t s = w.load();
    switch (St(s)) {
      case kNever: {
        if (!w.compare_exchange_weak(s, With(s, kFilling))) continue;
        if (t0) faults_.fetch_add(1);
        zero_fills_.fetch_add(1);
        MapZeroRun(p, s == kNever ? ClaimZeroNeighbours(p) : 0, s & kInStore, t0);
        return;
      }
      case kRemote: {
        if (sync_buf != nullptr) {
          // Served end to end on this thread: read, map, then read ahead while the program
          // runs again.
          uint64_t want = With(s, kFilling) | (write ? kFillWrite : 0);
          if (!w.compare_exchange_strong(s, want)) continue;
          if (t0) faults_.fetch_add(1);
          remote_reads_.fetch_add(1);
          Status st = o_.store->ReadPage(p, sync_buf);
          if (!st.ok()) {
            Poison(p, st);
          } else if (MapPage(p, sync_buf, write, kInStore, t0) && t0) {
            uint64_t dt = MonotonicNs() - t0;
            std::lock_guard<std::mutex> l(hist_mu_);
            remote_fault_latency_.Record(dt);
          }
          if (stream) MaybePrefetch(p, stream);
          return;
        }
        FillCtx* c = GetCtx(false);
        uint64_t want = With(s, kFilling) | (write ? kFillWrite : 0);
        if (!w.compare_exchange_strong(s, want)) {
          PutCtx(c);
          continue;
        }
        if (t0) faults_.fetch_add(1);
        if (stream) MaybePrefetch(p, stream);
        StartFill(p, c, t0);
        return;
      }
      case kPrefetching: {
        if (!w.compare_exchange_weak(s, s | kWaitMissing | (write ? kWaitWrite : 0))) continue;
        if (t0) faults_.fetch_add(1);
        if (stream) MaybePrefetch(p, stream);
        return;  // CompletePrefetch maps it.
      }
      case kPrefetched: {
        uint32_t ci = CtxOf(s);
        if (!w.compare_exchange_weak(s, With(s, kFilling) & 0xffffffffull)) continue;
        if (t0) faults_.fetch_add(1);
        prefetch_hits_.fetch_add(1);
        FillCtx* c = &(*ctxs_)[ci];
        MapPage(p, c->buf, write, kInStore, t0);
        PutCtx(c);
        if (stream) MaybePrefetch(p, stream);
        return;
      }
      case kDropping:
      case kDiscarding:
        if (!w.compare_exchange_weak(s, s | kWaitMissing | (write ? kWaitWrite : 0))) continue;
        return;  // The owner resolves it when its transition ends.
      case kFilling:
        return;  // Duplicate: the fill in flight wakes it.
      default:
        // Mapped (kClean, kDirty, kEvicting) or poisoned: a stale message. Wake it; if it
        // still cannot proceed it faults again.
        Wake(p);
        return;
    }
  }
}

size_t PagerImpl::ClaimZeroNeighbours(PageId p) {
  size_t want = std::min(o_.zero_fault_around_pages, kMaxFaultAround);
  if (want == 0) return 0;
  if (uint64_t cap = LimitPages(); cap > 0) {
    const int64_t room = static_cast<int64_t>(cap) - resident_.load() - 1;
    want = std::min<size_t>(want, static_cast<size_t>(std::max<int64_t>(0, room)));
  }
  size_t n = 0;
  for (; n < want && p + 1 + n < pages_; ++n) {
    uint64_t z = kNever;
    if (!W(p + 1 + n).compare_exchange_strong(z, kFilling)) break;
  }
  if (n > 0) NoteTouched(p + n);
  return n;
}

void PagerImpl::MapZeroRun(PageId p, size_t n, uint64_t in_store, uint64_t t0) {
  const size_t total = n + 1;
  AddFootprint(footprint_, peak_footprint_, static_cast<int64_t>(total));
  {
    int64_t r = resident_.fetch_add(static_cast<int64_t>(total)) + static_cast<int64_t>(total);
    uint64_t pr = peak_resident_.load();
    while (static_cast<uint64_t>(r) > pr && !peak_resident_.compare_exchange_weak(pr, r)) {}
  }
  // One UFFDIO_COPY for the run; it may map a prefix and ask for the rest again (EAGAIN).
  size_t mapped = 0;
  for (int attempt = 0; mapped < total && attempt < 100000; ++attempt) {
    uffdio_copy c{};
    c.dst = reinterpret_cast<uintptr_t>(Addr(p + mapped));
    c.src = reinterpret_cast<uintptr_t>(kZeroRun);
    c.len = (total - mapped) * kPageSize;
    c.mode = 0;  // Writable: a write needs no write-protect fault (see IsAllZero in eviction).
    if (::ioctl(uffd_.get(), UFFDIO_COPY, &c) == 0) {
      mapped = total;
      break;
    }
    const int err = errno;
    if (c.copy > 0) {
      mapped += static_cast<size_t>(c.copy) / kPageSize;
      continue;
    }
    if (err == EAGAIN) {
      sched_yield();
      continue;
    }
    TLOG(ERROR) << "pager: UFFDIO_COPY of zeros at page " << p + mapped << " failed: "
                << strerror(err);
    break;
  }
  for (size_t i = 0; i < total; ++i) {
    const PageId q = p + i;
    if (i < mapped) {
      W(q).store((i == 0 ? in_store : 0) | kDirty);
      continue;
    }
    // Not mapped: back to what it was; a fault waiting on it is woken to fault again.
    W(q).store(i == 0 && in_store ? (kRemote | kInStore) : kNever);
    Wake(q);
  }
  if (mapped < total) {
    resident_.fetch_sub(static_cast<int64_t>(total - mapped));
    AddFootprint(footprint_, peak_footprint_, -static_cast<int64_t>(total - mapped));
  }
  if (mapped == 0) return;
  zero_fill_around_.fetch_add(mapped - 1);
  RecordLatency(t0);
  {
    std::lock_guard<std::mutex> l(events_mu_);
    for (size_t i = 0; i < mapped; ++i) resident_events_.push_back(p + i);
  }
  MaybeKickEviction();
}

void PagerImpl::HandleWp(PageId p) {
  auto& w = W(p);
  for (;;) {
    uint64_t s = w.load();
    if (s & kBusy) {  // Another thread is lifting protection right now.
      sched_yield();
      continue;
    }
    switch (St(s)) {
      case kClean:
        if (!w.compare_exchange_weak(s, (With(s, kDirty) | kBusy | kRef) & ~kArmed)) continue;
        wp_faults_.fetch_add(1);
        Unprotect(p);
        w.fetch_and(~kBusy);
        return;
      case kDirty:
        if (!w.compare_exchange_weak(s, (s | kBusy | kRef) & ~kArmed)) continue;
        if (s & kArmed) trap_faults_.fetch_add(1);
        Unprotect(p);
        w.fetch_and(~kBusy);
        return;
      case kEvicting:
        if (!w.compare_exchange_weak(s, (s | kRedirty | kBusy | kRef) & ~kArmed)) continue;
        wp_faults_.fetch_add(1);
        Unprotect(p);
        w.fetch_and(~kBusy);
        return;
      case kDropping:
      case kDiscarding:
        if (!w.compare_exchange_weak(s, s | kWaitWp)) continue;
        return;
      default:
        // Not mapped any more (evicted since) or not yet: wake; the access re-faults as missing.
        Wake(p);
        return;
    }
  }
}

void PagerImpl::ResolveWaiters(PageId p, uint64_t old) {
  if (old & kWaitMissing) HandleMissing(p, (old & kWaitWrite) != 0, MonotonicNs(), nullptr);
  else if (old & kWaitWp) Wake(p);
}

// ---------------------------------------------------------------------------------------------
// Fills and prefetch.

FillCtx* PagerImpl::GetCtx(bool for_prefetch) {
  std::unique_lock<std::mutex> l(ctx_mu_);
  for (;;) {
    // Recycle the oldest unused prefetch buffers when running short.
    while (free_ctx_.size() < kDemandReserve && !prefetched_fifo_.empty()) {
      uint32_t ci = prefetched_fifo_.front();
      prefetched_fifo_.pop_front();
      FillCtx& c = (*ctxs_)[ci];
      PageId p = c.op.page;
      uint64_t s = W(p).load();
      while (St(s) == kPrefetched && CtxOf(s) == ci) {
        if (W(p).compare_exchange_weak(s, (s & kInStore) | kRemote)) {
          free_ctx_.push_back(ci);
          break;
        }
      }
    }
    if (for_prefetch) {
      if (free_ctx_.size() <= kDemandReserve) return nullptr;
    } else if (free_ctx_.empty()) {
      ctx_cv_.wait(l);
      continue;
    }
    uint32_t ci = free_ctx_.back();
    free_ctx_.pop_back();
    return &(*ctxs_)[ci];
  }
}

void PagerImpl::PutCtx(FillCtx* c) {
  {
    std::lock_guard<std::mutex> l(ctx_mu_);
    free_ctx_.push_back(c->index);
  }
  ctx_cv_.notify_one();
}

void PagerImpl::StartFill(PageId p, FillCtx* c, uint64_t t0) {
  c->op = PageOp{};
  c->op.kind = PageOp::Kind::kRead;
  c->op.page = p;
  c->op.buf = c->buf;
  c->op.done = &PagerImpl::FillDone;
  c->op.user = c;
  c->prefetch = false;
  c->start_ns = t0;
  remote_reads_.fetch_add(1);
  PageOp* ops[1] = {&c->op};
  fills_in_flight_.fetch_add(1);
  Status st = o_.store->Submit(ops);
  if (!st.ok()) {
    fills_in_flight_.fetch_sub(1);
    c->op.status = st;
    CompleteFill(c);
  }
}

void PagerImpl::FillDone(PageOp* op) {
  auto* c = static_cast<FillCtx*>(op->user);
  PagerImpl* self = c->pager;
  if (c->prefetch) self->CompletePrefetch(c);
  else self->CompleteFill(c);
  self->fills_in_flight_.fetch_sub(1);
}

void PagerImpl::CompleteFill(FillCtx* c) {
  PageId p = c->op.page;
  auto& w = W(p);
  uint64_t s = w.load();
  if (!c->op.status.ok()) {
    Status why = c->op.status;
    PutCtx(c);
    Poison(p, why);
    return;
  }
  if (MapPage(p, c->buf, (s & kFillWrite) != 0, kInStore, c->start_ns) && c->start_ns) {
    uint64_t dt = MonotonicNs() - c->start_ns;
    std::lock_guard<std::mutex> l(hist_mu_);
    remote_fault_latency_.Record(dt);
  }
  PutCtx(c);
}

void PagerImpl::MaybePrefetch(PageId p, PrefetchStream* s) {
  constexpr size_t kHistory = 8;
  if (s->last != UINT64_MAX) {
    s->deltas.push_back(static_cast<int64_t>(p) - static_cast<int64_t>(s->last));
    if (s->deltas.size() > kHistory) s->deltas.pop_front();
  }
  s->last = p;
  if (s->deltas.size() < 3) return;
  // Boyer-Moore majority vote over the recent deltas.
  int64_t cand = 0;
  int votes = 0;
  for (int64_t d : s->deltas) {
    if (votes == 0) { cand = d; votes = 1; }
    else if (d == cand) ++votes;
    else --votes;
  }
  size_t agree = std::count(s->deltas.begin(), s->deltas.end(), cand);
  if (cand == 0 || agree * 2 <= s->deltas.size()) {
    s->window = std::max<size_t>(2, s->window / 2);
    return;
  }
  // Adapt the window: grow while the stream keeps hitting prefetched pages.
  uint64_t hits = prefetch_hits_.load(std::memory_order_relaxed);
  if (hits > s->issued_at_hits) s->window = std::min(o_.prefetch_max_pages, s->window * 2);
  s->issued_at_hits = hits;
  std::vector<PageOp*> ops;
  ops.reserve(s->window);
  for (size_t i = 1; i <= s->window; ++i) {
    int64_t q = static_cast<int64_t>(p) + cand * static_cast<int64_t>(i);
    if (q < 0 || static_cast<uint64_t>(q) >= pages_) break;
    auto& w = W(q);
    uint64_t st = w.load();
    if (St(st) != kRemote) continue;
    FillCtx* c = GetCtx(true);
    if (!c) break;
    if (!w.compare_exchange_strong(st, WithCtx(With(st, kPrefetching), c->index))) {
      PutCtx(c);
      continue;
    }
    c->op = PageOp{};
    c->op.kind = PageOp::Kind::kRead;
    c->op.page = static_cast<PageId>(q);
    c->op.buf = c->buf;
    c->op.done = &PagerImpl::FillDone;
    c->op.user = c;
    c->prefetch = true;
    c->start_ns = MonotonicNs();
    ops.push_back(&c->op);
  }
  if (ops.empty()) return;
  prefetch_issued_.fetch_add(ops.size());
  remote_reads_.fetch_add(ops.size());
  fills_in_flight_.fetch_add(static_cast<int64_t>(ops.size()));
  Status st = o_.store->Submit(ops);
  if (!st.ok()) {
    fills_in_flight_.fetch_sub(static_cast<int64_t>(ops.size()));
    for (PageOp* op : ops) {
      op->status = st;
      CompletePrefetch(static_cast<FillCtx*>(op->user));
    }
  }
}

void PagerImpl::CompletePrefetch(FillCtx* c) {
  PageId p = c->op.page;
  auto& w = W(p);
  for (;;) {
    uint64_t s = w.load();
    if (!c->op.status.ok()) {
      // A failed read ahead is forgotten; a fault waiting on it is re-served by a demand fill
      // (which poisons the page if the store still cannot return it).
      if (!w.compare_exchange_weak(s, (s & kInStore) | kRemote)) continue;
      PutCtx(c);
      if (s & kWaitMissing) Handoff(p, (s & kWaitWrite) != 0);
      return;
    }
    if (s & kWaitMissing) {
      bool writable = (s & kWaitWrite) != 0;
      if (!w.compare_exchange_weak(s, (s & kInStore) | kFilling)) continue;
      prefetch_hits_.fetch_add(1);
      MapPage(p, c->buf, writable, kInStore, 0);
      PutCtx(c);
      return;
    }
    if (!w.compare_exchange_weak(s, With(s, kPrefetched))) continue;
    std::lock_guard<std::mutex> l(ctx_mu_);
    prefetched_fifo_.push_back(c->index);
    return;
  }
}

// ---------------------------------------------------------------------------------------------
// Eviction.

uint64_t PagerImpl::LimitPages() const {
  if (o_.local_limit_bytes > 0) return std::max<uint64_t>(1, o_.local_limit_bytes / kPageSize);
  if (o_.local_fraction > 0) {
    uint64_t floor_pages = o_.min_local_bytes / kPageSize;
    uint64_t f = static_cast<uint64_t>(o_.local_fraction *
                                       static_cast<double>(peak_footprint_.load()));
    return std::max<uint64_t>(std::max<uint64_t>(floor_pages, f), 1);
  }
  return 0;
}

void PagerImpl::MaybeKickEviction() {
  uint64_t cap = LimitPages();
  if (cap == 0) return;
  if (static_cast<double>(resident_.load()) <= o_.high_watermark * static_cast<double>(cap)) return;
  {
    std::lock_guard<std::mutex> l(evict_mu_);
    if (evict_kick_) return;
    evict_kick_ = true;
  }
  evict_cv_.notify_one();
}

void PagerImpl::Throttle() {
  uint64_t cap = LimitPages();
  if (cap == 0) return;
  // Write-backs failing (the store refuses writes): the cap cannot be kept; waiting would only
  // slow the program down to no purpose.
  if (evict_failing_.load(std::memory_order_relaxed)) return;
  uint64_t hard = cap + std::max<uint64_t>(2 * o_.evict_batch, cap / 8);
  std::unique_lock<std::mutex> l(evict_mu_);
  for (int i = 0; i < 20 && static_cast<uint64_t>(resident_.load()) > hard; ++i) {
    if (evict_paused_ > 0 || stopping_.load()) return;
    evict_kick_ = true;
    evict_cv_.notify_one();
    evict_idle_cv_.wait_for(l, std::chrono::milliseconds(1));
  }
}

void PagerImpl::DrainPolicyEvents() {
  std::vector<PageId> ev;
  {
    std::lock_guard<std::mutex> l(events_mu_);
    ev.swap(resident_events_);
  }
  for (PageId p : ev) {
    if (o_.victim == VictimPolicy::kSmart && ghost_set_.erase(p)) {
      protected_.push_back(p);
      segment_[p] = 2;
    } else {
      probation_.push_back(p);
      segment_[p] = 1;
    }
  }
}

size_t PagerImpl::PickVictims(std::vector<Victim>* out, size_t n) {
  uint64_t cap = LimitPages();
  size_t probation_target = std::max<size_t>(1, cap / kProbationDivisor);
  size_t guard = (probation_.size() + protected_.size()) * 2 + 16;
  while (out->size() < n && guard-- > 0 && (!probation_.empty() || !protected_.empty())) {
    bool from_probation = o_.victim == VictimPolicy::kFifo || protected_.empty() ||
                          (probation_.size() > probation_target && !probation_.empty());
    std::deque<PageId>& q = from_probation ? probation_ : protected_;
    PageId p = q.front();
    q.pop_front();
    auto it = segment_.find(p);
    if (it == segment_.end() || it->second != (from_probation ? 1 : 2)) continue;  // Stale.
    auto& w = W(p);
    uint64_t s = w.load();
    if ((St(s) != kClean && St(s) != kDirty) || (s & kBusy)) {
      if (St(s) == kClean || St(s) == kDirty || St(s) == kFilling) q.push_back(p);  // Later.
      else segment_.erase(it);
      continue;
    }
    if (o_.victim == VictimPolicy::kSmart) {
      if (s & kRef) {
        // Written since it was last looked at: a second chance (protected) or a promotion
        // (probation), with the write trap set again.
        uint64_t credits = std::min<uint64_t>(3, Credits(s) + 1);
        if (!w.compare_exchange_strong(s, WithCredits((s & ~kRef) | kArmed, credits))) {
          q.push_back(p);
          continue;
        }
        if (St(s) == kDirty && o_.write_traps) ArmWriteTrap(p);
        if (from_probation) {
          protected_.push_back(p);
          it->second = 2;
        } else {
          q.push_back(p);
        }
        continue;
      }
      if (!(s & kArmed)) {
        // Never observed: set the write trap (dirty pages are mapped writable; clean ones are
        // write-protected already) and look again when it comes round.
        if (w.compare_exchange_strong(s, s | kArmed) && St(s) == kDirty && o_.write_traps) {
          ArmWriteTrap(p);
        }
        q.push_back(p);
        continue;
      }
      if (!from_probation && Credits(s) > 0) {
        // Written in earlier rounds: spend one credit (an LFU-like memory beyond one round).
        (void)w.compare_exchange_strong(s, WithCredits(s, Credits(s) - 1));  // Lost race: retry later.
        q.push_back(p);
        continue;
      }
    }
    if (!w.compare_exchange_strong(s, With(s, kEvicting) & ~(kRedirty | kRef))) {
      q.push_back(p);
      continue;
    }
    segment_.erase(it);
    out->push_back(Victim{p, St(s) == kDirty});
    if (o_.victim == VictimPolicy::kSmart) {
      ghost_set_.insert(p);
      ghost_fifo_.push_back(p);
      size_t ghost_cap = std::max<size_t>(cap, 64);
      while (ghost_fifo_.size() > ghost_cap) {
        ghost_set_.erase(ghost_fifo_.front());
        ghost_fifo_.pop_front();
      }
    }
  }
  return out->size();
}

void PagerImpl::ArmWriteTrap(PageId p) {
  traps_armed_.fetch_add(1, std::memory_order_relaxed);
  uffdio_writeprotect wp{};
  wp.range = {reinterpret_cast<uintptr_t>(Addr(p)), kPageSize};
  wp.mode = UFFDIO_WRITEPROTECT_MODE_WP;
  for (int attempt = 0; attempt < 1000; ++attempt) {
    if (::ioctl(uffd_.get(), UFFDIO_WRITEPROTECT, &wp) == 0 || errno != EAGAIN) return;
    sched_yield();
  }
}

void PagerImpl::WriteDone(PageOp* op) {
  auto* batch = static_cast<WbBatch*>(op->user);
  {
    std::lock_guard<std::mutex> l(batch->mu);
    batch->done[static_cast<size_t>(op - batch->ops.data())] = 1;
    if (--batch->pending == 0) batch->cv.notify_all();
  }
  batch->Unref();
}

std::unique_ptr<PagerImpl::EvictJob> PagerImpl::StartEvict(std::vector<Victim> victims_in) {
  auto job = std::make_unique<EvictJob>();
  job->victims = std::move(victims_in);
  const std::vector<Victim>& victims = job->victims;
  size_t n = victims.size();
  // 1. Write-protect the dirty victims, runs of consecutive pages in one ioctl (clean pages are
  //    mapped write-protected already).
  std::vector<PageId> dirty_pages;
  for (const Victim& v : victims) if (v.dirty) dirty_pages.push_back(v.page);
  std::sort(dirty_pages.begin(), dirty_pages.end());
  for (size_t k = 0; k < dirty_pages.size();) {
    size_t j = k;
    while (j + 1 < dirty_pages.size() && dirty_pages[j + 1] == dirty_pages[j] + 1) ++j;
    uffdio_writeprotect wp{};
    wp.range = {reinterpret_cast<uintptr_t>(Addr(dirty_pages[k])), (j - k + 1) * kPageSize};
    wp.mode = UFFDIO_WRITEPROTECT_MODE_WP;
    for (int attempt = 0; attempt < 100000; ++attempt) {
      if (::ioctl(uffd_.get(), UFFDIO_WRITEPROTECT, &wp) == 0) break;
      if (errno != EAGAIN) {
        TLOG(ERROR) << "pager: UFFDIO_WRITEPROTECT: " << strerror(errno);
        break;
      }
      sched_yield();
    }
    k = j + 1;
  }
  // 2. Copy the dirty pages out (a write after the protection faults and sets kRedirty) and
  //    write them back in one batch.
  auto* batch = new WbBatch();
  batch->bufs.resize(n * kPageSize);
  batch->ops.resize(n);
  batch->done.assign(n, 1);
  std::vector<PageOp*> submit;
  // Victims never stored whose bytes are still all zeros (zero-filled, never written): dropped
  // without a write-back, back to never-written.
  job->zero.assign(n, 0);
  std::vector<uint8_t>& zero = job->zero;
  for (size_t i = 0; i < n; ++i) {
    if (!victims[i].dirty) continue;
    uint8_t* b = batch->bufs.data() + i * kPageSize;
    std::memcpy(b, Addr(victims[i].page), kPageSize);
    if (!(W(victims[i].page).load() & kInStore) && IsAllZero(b)) {
      zero[i] = 1;
      continue;
    }
    PageOp& op = batch->ops[i];
    op.kind = PageOp::Kind::kWrite;
    op.page = victims[i].page;
    op.buf = b;
    op.done = &PagerImpl::WriteDone;
    op.user = batch;
    batch->done[i] = 0;
    submit.push_back(&op);
  }
  job->batch = batch;
  if (!submit.empty()) {
    batch->pending = submit.size();
    batch->refs.fetch_add(static_cast<int>(submit.size()));
    job->submit_status = o_.store->Submit(submit);
    if (!job->submit_status.ok()) {
      batch->refs.fetch_sub(static_cast<int>(submit.size()));  // No callback will come.
    } else {
      job->submitted = true;
    }
  }
  return job;
}

size_t PagerImpl::FinishEvict(EvictJob* job) {
  size_t failures = 0;
  const std::vector<Victim>& victims = job->victims;
  const std::vector<uint8_t>& zero = job->zero;
  const size_t n = victims.size();
  WbBatch* batch = job->batch;
  // Per victim: the write-back's outcome (OK for clean and all-zero victims).
  std::vector<Status> wb_status(n);
  if (!job->submit_status.ok()) {
    for (size_t i = 0; i < n; ++i) {
      if (victims[i].dirty && !zero[i]) wb_status[i] = job->submit_status;
    }
  } else if (job->submitted) {
    {
      std::unique_lock<std::mutex> l(batch->mu);
      if (!batch->cv.wait_for(l, std::chrono::milliseconds(kWritebackTimeoutMs),
                              [&] { return batch->pending == 0; })) {
        TLOG(ERROR) << "pager: " << batch->pending << " write-backs got no completion from the "
                    << "store in " << kWritebackTimeoutMs / 1000 << " s (a store bug); their "
                    << "pages stay resident";
      }
      for (size_t i = 0; i < n; ++i) {
        if (!victims[i].dirty || zero[i]) continue;
        wb_status[i] = batch->done[i] ? batch->ops[i].status
                                      : Timeout("no completion from the store");
      }
    }
  }
  batch->Unref();
  job->batch = nullptr;
  // 3. Commit: drop each victim unless it was written meanwhile or its write-back failed.
  std::vector<size_t> drop;  // Indices into victims.
  std::vector<PageId> kept;
  for (size_t i = 0; i < n; ++i) {
    PageId p = victims[i].page;
    auto& w = W(p);
    bool wb_ok = wb_status[i].ok();
    if (victims[i].dirty && !zero[i]) {
      if (wb_ok) remote_writes_.fetch_add(1);
      else {
        failures++;
        uint64_t n_err = writeback_errors_.fetch_add(1) + 1;
        if ((n_err & (n_err - 1)) == 0) {  // Logged at 1, 2, 4, 8, ... failures.
          TLOG(WARNING) << "pager: write-back of page " << p << " failed ("
                        << wb_status[i].ToString() << "); the page stays resident ("
                        << n_err << " failed write-backs so far)";
        }
      }
    }
    for (;;) {
      uint64_t s = w.load();
      uint64_t in_store = (victims[i].dirty && !zero[i] && wb_ok) ? kInStore : 0;
      if (!wb_ok || (s & kRedirty)) {
        // Keep it: dirty (the write-back is stale or missing).
        if (!w.compare_exchange_weak(s, (With(s, kDirty) & ~kRedirty) | in_store)) continue;
        kept.push_back(p);
        break;
      }
      if (!w.compare_exchange_weak(s, With(s, kDropping) | in_store)) continue;
      drop.push_back(i);
      break;
    }
  }
  // 4. MADV_DONTNEED the dropped pages, runs in one call.
  std::vector<PageId> sorted;
  for (size_t i : drop) sorted.push_back(victims[i].page);
  std::sort(sorted.begin(), sorted.end());
  for (size_t k = 0; k < sorted.size();) {
    size_t j = k;
    while (j + 1 < sorted.size() && sorted[j + 1] == sorted[j] + 1) ++j;
    if (::madvise(Addr(sorted[k]), (j - k + 1) * kPageSize, MADV_DONTNEED) != 0) {
      TLOG(ERROR) << "pager: madvise(DONTNEED): " << strerror(errno);
    }
    k = j + 1;
  }
  // 5. End the transitions; resolve faults that arrived meanwhile.
  for (size_t i : drop) {
    const PageId p = victims[i].page;
    auto& w = W(p);
    uint64_t s = w.load();
    uint64_t fin;
    do {
      fin = (s & kInStore) ? (kRemote | kInStore) : kNever;
    } while (!w.compare_exchange_weak(s, fin));
    resident_.fetch_sub(1);
    evictions_.fetch_add(1);
    if (!(s & kInStore)) AddFootprint(footprint_, peak_footprint_, -1);
    if (zero[i]) zero_drops_.fetch_add(1);
    else if (!victims[i].dirty) clean_drops_.fetch_add(1);
    ResolveWaiters(p, s);
  }
  if (!kept.empty()) {
    std::lock_guard<std::mutex> l(events_mu_);
    for (PageId p : kept) resident_events_.push_back(p);
  }
  return failures;
}

void PagerImpl::EvictLoop() {
  // Up to kEvictPipeline batches are in flight at once: the next batch is picked, protected and
  // submitted while earlier write-backs are on the wire, so eviction keeps up with a fault
  // stream and faults wait (Throttle) only when the cap truly cannot be kept.
  constexpr size_t kEvictPipeline = 4;
  std::deque<std::unique_ptr<EvictJob>> inflight;
  int64_t inflight_pages = 0;
  auto finish_oldest = [&]() -> size_t {
    std::unique_ptr<EvictJob> job = std::move(inflight.front());
    inflight.pop_front();
    inflight_pages -= static_cast<int64_t>(job->victims.size());
    size_t failed = FinishEvict(job.get());
    evict_failing_.store(failed > 0);
    evict_idle_cv_.notify_all();
    return failed;
  };
  while (true) {
    {
      std::unique_lock<std::mutex> l(evict_mu_);
      evict_cv_.wait(l, [&] { return evict_kick_ || stopping_.load(); });
      evict_kick_ = false;
      if (stopping_.load()) return;
      if (evict_paused_ > 0) continue;
      evict_running_ = true;
    }
    for (;;) {
      DrainPolicyEvents();
      uint64_t cap = LimitPages();
      if (cap == 0 || stopping_.load()) break;
      {
        std::lock_guard<std::mutex> l(evict_mu_);
        if (evict_paused_ > 0) break;
      }
      double low = o_.low_watermark * static_cast<double>(cap);
      int64_t r = resident_.load() - inflight_pages;  // What stays once the jobs commit.
      if (static_cast<double>(r) <= low) break;
      size_t want = std::min<size_t>(o_.evict_batch,
                                     static_cast<size_t>(static_cast<double>(r) - low) + 1);
      std::vector<Victim> victims;
      if (PickVictims(&victims, want) == 0) {
        if (inflight.empty()) break;
        finish_oldest();  // Its kept pages may become victims again.
        continue;
      }
      inflight_pages += static_cast<int64_t>(victims.size());
      inflight.push_back(StartEvict(std::move(victims)));
      if (inflight.size() >= kEvictPipeline && finish_oldest() > 0) {
        // The store rejects writes: back off instead of spinning on the same pages.
        while (!inflight.empty()) finish_oldest();
        std::unique_lock<std::mutex> l(evict_mu_);
        evict_cv_.wait_for(l, std::chrono::milliseconds(20), [&] { return stopping_.load(); });
      }
    }
    while (!inflight.empty()) finish_oldest();
    {
      std::lock_guard<std::mutex> l(evict_mu_);
      evict_running_ = false;
    }
    evict_idle_cv_.notify_all();
  }
}

// ---------------------------------------------------------------------------------------------

// Discard, fork.

Status PagerImpl::Discard(void* addr, size_t len) {
  auto a = reinterpret_cast<uintptr_t>(addr);
  if (len == 0) return Status::Ok();
  if (a % kPageSize != 0 || len % kPageSize != 0 || !Contains(addr, len)) {
    return InvalidArgument("Discard(", addr, ", ", len,
                           "): not page-aligned or not inside the paged region");
  }
  PageId first = (a - reinterpret_cast<uintptr_t>(base())) / kPageSize;
  size_t n = len / kPageSize;
  if (child_) {
    if (::madvise(addr, len, MADV_DONTNEED) != 0) return ErrnoError("madvise(DONTNEED)");
    return Status::Ok();
  }
  // Own every page (waiting for fills, prefetches and evictions in flight to settle).
  std::vector<uint64_t> old(n);
  for (size_t i = 0; i < n; ++i) {
    auto& w = W(first + i);
    uint64_t s = w.load();
    if (s == kNever) {  // Common for never-touched ranges: own it cheaply.
      if (w.compare_exchange_strong(s, kDiscarding)) { old[i] = kNever; continue; }
    }
    for (;;) {
      s = w.load();
      uint64_t st = St(s);
      bool settled = (st == kNever || st == kRemote || st == kClean || st == kDirty ||
                      st == kPrefetched || st == kPoisoned) && !(s & kBusy);
      if (!settled) {
        sched_yield();
        continue;
      }
      if (w.compare_exchange_weak(s, kDiscarding)) {
        old[i] = s;
        break;
      }
    }
  }
  Status result;
  if (::madvise(addr, len, MADV_DONTNEED) != 0) result = ErrnoError("madvise(DONTNEED)");
  Status trim = o_.store->Trim(first, n);
  if (!trim.ok()) {
    TLOG(WARNING) << "pager: Trim of pages " << first << "+" << n << ": " << trim.ToString();
  }
  for (size_t i = 0; i < n; ++i) {
    PageId p = first + i;
    uint64_t s = old[i];
    uint64_t st = St(s);
    if (st == kClean || st == kDirty) {
      resident_.fetch_sub(1);
      AddFootprint(footprint_, peak_footprint_, -1);
    } else if (st == kRemote || st == kPrefetched || st == kPoisoned) {
      AddFootprint(footprint_, peak_footprint_, -1);
    }
    if (st == kPrefetched) PutCtx(&(*ctxs_)[CtxOf(s)]);
    if (st != kNever) discarded_.fetch_add(1);
    uint64_t waiters = W(p).exchange(kNever);
    ResolveWaiters(p, waiters);
  }
  return result;
}

Status PagerImpl::PrepareFork() {
  if (child_) return Status::Ok();
  {
    std::unique_lock<std::mutex> l(evict_mu_);
    evict_paused_++;
    evict_idle_cv_.wait(l, [&] { return !evict_running_; });
  }
  // Page every remote page back in, then wait until no read is in flight.
  Deadline deadline = Deadline::AfterMs(120000);
  for (;;) {
    uint64_t end = max_page_.load();
    bool pending = false;
    for (PageId p = 0; p < end; ++p) {
      uint64_t st = St(W(p).load());
      if (st == kRemote || st == kPrefetched) HandleMissing(p, false, 0, nullptr);
      if (st == kRemote || st == kPrefetched || st == kFilling || st == kPrefetching ||
          st == kEvicting || st == kDropping) {
        pending = true;
      }
    }
    if (!pending) break;
    if (deadline.Expired()) {
      ParentAfterFork();
      return Timeout("pager: paging the region back in before fork took over 120 s");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return Status::Ok();
}

void PagerImpl::ParentAfterFork() {
  if (child_) return;
  {
    std::lock_guard<std::mutex> l(evict_mu_);
    if (evict_paused_ > 0) evict_paused_--;
    evict_kick_ = true;
  }
  evict_cv_.notify_one();
}

void PagerImpl::ChildAfterFork() {
  // The registration is not inherited: the region is plain private memory here, holding every
  // page PrepareFork paged in. No pager thread exists in the child.
  child_ = true;
}

PagerStats PagerImpl::Stats() const {
  PagerStats s;
  s.faults = faults_.load();
  s.wp_faults = wp_faults_.load();
  s.trap_faults = trap_faults_.load();
  s.zero_fills = zero_fills_.load();
  s.zero_fill_around = zero_fill_around_.load();
  s.zero_drops = zero_drops_.load();
  s.traps_armed = traps_armed_.load();
  s.remote_reads = remote_reads_.load();
  s.remote_writes = remote_writes_.load();
  s.clean_drops = clean_drops_.load();
  s.evictions = evictions_.load();
  s.prefetch_issued = prefetch_issued_.load();
  s.prefetch_hits = prefetch_hits_.load();
  s.discarded = discarded_.load();
  s.fill_errors = fill_errors_.load();
  s.writeback_errors = writeback_errors_.load();
  s.resident_pages = static_cast<uint64_t>(std::max<int64_t>(0, resident_.load()));
  s.peak_resident_pages = peak_resident_.load();
  s.footprint_pages = static_cast<uint64_t>(std::max<int64_t>(0, footprint_.load()));
  s.peak_footprint_pages = peak_footprint_.load();
  s.limit_pages = LimitPages();
  std::lock_guard<std::mutex> l(hist_mu_);
  s.fault_latency = fault_latency_;
  s.remote_fault_latency = remote_fault_latency_;
  return s;
}

}  // namespace

// ---------------------------------------------------------------------------------------------

Result<std::unique_ptr<Pager>> Pager::Create(const PagerOptions& o) {
  if (o.store == nullptr) return InvalidArgument("PagerOptions.store is required");
  if (o.region_bytes == 0 || o.region_bytes % kPageSize != 0) {
    return InvalidArgument("PagerOptions.region_bytes must be a positive multiple of 4096, got ",
                           o.region_bytes);
  }
  uint64_t pages = o.region_bytes / kPageSize;
  if (pages > o.store->capacity_pages()) {
    return InvalidArgument("region of ", pages, " pages exceeds the store capacity of ",
                           o.store->capacity_pages(), " pages");
  }
  if (o.local_fraction < 0 || o.local_fraction > 1) {
    return InvalidArgument("PagerOptions.local_fraction must be in [0, 1], got ", o.local_fraction);
  }
  if (o.local_limit_bytes > 0 && o.local_fraction > 0) {
    return InvalidArgument("set local_limit_bytes or local_fraction, not both");
  }
  if (!(o.low_watermark > 0 && o.low_watermark <= o.high_watermark && o.high_watermark <= 1.0)) {
    return InvalidArgument("watermarks must satisfy 0 < low <= high <= 1, got low=",
                           o.low_watermark, " high=", o.high_watermark);
  }
  if (o.evict_batch == 0 || o.evict_batch > 4096) {
    return InvalidArgument("PagerOptions.evict_batch must be in [1, 4096]");
  }
  if (o.fault_threads < 1 || o.fault_threads > 8) {
    return InvalidArgument("PagerOptions.fault_threads must be in [1, 8]");
  }
  if (o.zero_fault_around_pages > kMaxFaultAround) {
    return InvalidArgument("PagerOptions.zero_fault_around_pages must be <= ", kMaxFaultAround);
  }
  if (o.prefetch_max_pages > 1024) {
    return InvalidArgument("PagerOptions.prefetch_max_pages must be <= 1024");
  }

  // Probe the features, then open the real descriptor asking for what we use.
  uint64_t features = 0;
  {
    TESSERA_ASSIGN_OR_RETURN(UniqueFd probe, OpenUffd());
    uffdio_api api{};
    api.api = UFFD_API;
    if (::ioctl(probe.get(), UFFDIO_API, &api) != 0) return ErrnoError("UFFDIO_API probe");
    features = api.features;
  }
  if (!(features & UFFD_FEATURE_PAGEFAULT_FLAG_WP)) {
    return Unsupported("this kernel's userfaultfd has no write-protect mode for anonymous memory "
                       "(needed for dirty tracking)");
  }
  bool poison = (features & UFFD_FEATURE_POISON) != 0;
  if (!poison) {
    TLOG(WARNING) << "pager: kernel lacks UFFDIO_POISON (6.6+): a page the store cannot return "
                     "is retried instead of raising SIGBUS";
  }
  TESSERA_ASSIGN_OR_RETURN(UniqueFd uffd, OpenUffd());
  uffdio_api api{};
  api.api = UFFD_API;
  api.features = UFFD_FEATURE_PAGEFAULT_FLAG_WP | (poison ? UFFD_FEATURE_POISON : 0);
  if (::ioctl(uffd.get(), UFFDIO_API, &api) != 0) return ErrnoError("UFFDIO_API");

  void* states = ::mmap(nullptr, pages * sizeof(uint64_t), PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (states == MAP_FAILED) return ErrnoError("mmap of the page-state array");
  void* region = ::mmap(nullptr, o.region_bytes, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (region == MAP_FAILED) {
    Status st = ErrnoError("mmap of the paged region (", o.region_bytes, " bytes)");
    ::munmap(states, pages * sizeof(uint64_t));
    return st;
  }
  ::madvise(region, o.region_bytes, MADV_NOHUGEPAGE);
  uffdio_register reg{};
  reg.range = {reinterpret_cast<uintptr_t>(region), o.region_bytes};
  reg.mode = UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_WP;
  if (::ioctl(uffd.get(), UFFDIO_REGISTER, &reg) != 0) {
    Status st = ErrnoError("UFFDIO_REGISTER missing|wp");
    ::munmap(region, o.region_bytes);
    ::munmap(states, pages * sizeof(uint64_t));
    return st;
  }
  auto impl = std::unique_ptr<PagerImpl>(
      new PagerImpl(static_cast<uint8_t*>(region), o.region_bytes, o, std::move(uffd),
                    static_cast<uint64_t*>(states), poison));
  TESSERA_RETURN_IF_ERROR(impl->Start());
  return std::unique_ptr<Pager>(std::move(impl));
}

}  // namespace tessera::kernel_shim
