// The userfaultfd pager (see pager.h for the contract, pager_impl.h for how its files divide
// the work): creation, teardown, Discard, registration and stats (fork is fork.cc).
#include "kernel_shim/pager/pager.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>

#include "common/clock.h"
#include "common/logging.h"
#include "kernel_shim/pager/pager_impl.h"

namespace tessera::kernel_shim {
namespace internal {

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
  // The list moves pages with UFFDIO_MOVE and must read the page table to know where a page is
  // when a move reports an error (Uffd::Move).
  const Result<bool> page_table = Uffd::HasPage(base());
  if (o_.inactive_list && !page_table.ok()) {
    TLOG(WARNING) << "pager: inactive list off: " << page_table.status().ToString();
  }
  if (o_.inactive_list && uffd_.has_move() && page_table.ok() &&
      (o_.local_limit_bytes > 0 || o_.local_fraction > 0)) {
    // Half the region's pages at most can be staged (the list's target is at most half the
    // cap); virtual space only, a slot costs memory while it holds a page.
    staging_slots_ = std::max<size_t>(pages_ / 2, 1024);
    void* st = ::mmap(nullptr, staging_slots_ * kPageSize, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (st == MAP_FAILED) return ErrnoError("mmap of the staging area");
    ::madvise(st, staging_slots_ * kPageSize, MADV_NOHUGEPAGE);
    Status reg = uffd_.RegisterMissing(st, staging_slots_ * kPageSize);
    if (!reg.ok()) {
      ::munmap(st, staging_slots_ * kPageSize);
      return reg;
    }
    staging_ = static_cast<uint8_t*>(st);
    ring_ = std::make_unique<InactiveRing>(staging_slots_);
  }
  // fork: store pages beyond the region are spares for the pages a forked child shares.
  spare_total_ = o_.store->capacity_pages() > pages_ ? o_.store->capacity_pages() - pages_ : 0;
  if (uffd_.has_fork_events() && spare_total_ > 0) {
    int cw = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (cw < 0) return ErrnoError("eventfd");
    child_wake_.Reset(cw);
  }
  int nthreads = std::clamp(o_.fault_threads, 1, 8);
  fault_threads_ = nthreads;
  if (uffd_.has_fork_events()) {
    // fork() waits on a reader of uffd_: the fork window's bells, queue and server.
    for (int i = 0; i < nthreads; ++i) {
      int bell = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
      if (bell < 0) return ErrnoError("eventfd");
      fault_bells_.emplace_back(bell);
    }
    window_q_ = std::make_unique<QueuedFault[]>(kForkWindowQueue);
    threads_->emplace_back([this] { ForkWindowLoop(); });
  }
  for (int i = 0; i < nthreads; ++i) threads_->emplace_back([this, i] { FaultLoop(i); });
  if (child_wake_.valid()) threads_->emplace_back([this] { ChildLoop(); });
  const bool traps = o_.write_traps == WriteTraps::kOn ||
                     (o_.write_traps == WriteTraps::kAuto && !staging_on());
  chooser_ = std::make_unique<VictimChooser>(o_.victim, traps, states_,
                                             [this](PageId p) { ArmWriteTrap(p); });
  threads_->emplace_back([this] { EvictLoop(); });
  threads_->emplace_back([this] { RetryLoop(); });
  return Status::Ok();
}

PagerImpl::~PagerImpl() {
  if (child_) {
    // The threads and the store exist only in the parent: leak their handles, keep the region
    // (it holds the child's private copy of the data).
    return;
  }
  HandOffChildren();  // A forked child still sharing pages gets them all first.
  stopping_.store(true);
  uint64_t one = 1;
  (void)!::write(stop_fd_.get(), &one, sizeof one);
  {
    std::lock_guard<std::mutex> l(evict_mu_);
    evict_kick_ = true;
  }
  evict_cv_.notify_all();
  { std::lock_guard<std::mutex> l(retry_mu_); }
  retry_cv_.notify_all();
  {
    std::lock_guard<std::mutex> l(child_mu_);
    if (child_wake_.valid()) (void)!::write(child_wake_.get(), &one, sizeof one);
  }
  child_cv_.notify_all();
  { std::lock_guard<std::mutex> l(fork_window_mu_); }
  fork_window_cv_.notify_all();
  RingFaultThreads();
  for (auto& t : *threads_) t.join();
  ReleaseSnapshot();
  CloseForkSockets();
  delete threads_;
  // Store callbacks may still be running for fills/prefetches: wait for them (bounded by the
  // store's own timeouts).
  while (fills_in_flight_.load() > 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
  uffd_.Close();
  ::munmap(base(), size());
  if (staging_ != nullptr) ::munmap(staging_, staging_slots_ * kPageSize);
  ::munmap(states_, pages_ * sizeof(uint64_t));
  if (snap_ != nullptr) ::munmap(snap_, pages_ * sizeof(uint64_t));
  if (marks_ != nullptr) ::munmap(marks_, pages_);
  delete ctxs_;
}

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
    if (child_paged_) return ChildDiscard(first, n);
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
                      st == kPrefetched || st == kPoisoned || st == kUnpaged ||
                      st == kStaged) &&
                     !(s & kBusy);
      if (st == kUnpaged) {  // Not paged: only the madvise below applies; it stays unpaged.
        old[i] = s;
        break;
      }
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
  MarkForkDiscards(first, n);
  Status result;
  if (::madvise(addr, len, MADV_DONTNEED) != 0) result = ErrnoError("madvise(DONTNEED)");
  TrimForParent(first, n, old);
  for (size_t i = 0; i < n; ++i) {
    PageId p = first + i;
    uint64_t s = old[i];
    uint64_t st = St(s);
    if (st == kClean || st == kDirty) {
      resident_.fetch_sub(1);
      AddFootprint(footprint_, peak_footprint_, -1);
    } else if (st == kStaged) {
      // Its bytes sit in a staging slot: release them (the list's entry becomes a hole).
      ReleaseSlot(CtxOf(s));
      staged_.fetch_sub(1);
      resident_.fetch_sub(1);
      AddFootprint(footprint_, peak_footprint_, -1);
    } else if (st == kRemote || st == kPrefetched || st == kPoisoned) {
      AddFootprint(footprint_, peak_footprint_, -1);
    }
    if (st == kUnpaged) continue;
    if (st == kPrefetched) PutCtx(&(*ctxs_)[CtxOf(s)]);
    if (st != kNever) discarded_.fetch_add(1);
    uint64_t waiters = W(p).exchange(kNever);
    ResolveWaiters(p, waiters);
  }
  return result;
}

Status PagerImpl::Unregister(void* addr, size_t len, bool keep_content) {
  auto a = reinterpret_cast<uintptr_t>(addr);
  if (len == 0) return Status::Ok();
  if (a % kPageSize != 0 || len % kPageSize != 0 || !Contains(addr, len)) {
    return InvalidArgument("Unregister(", addr, ", ", len,
                           "): not page-aligned or not inside the paged region");
  }
  const PageId first = (a - reinterpret_cast<uintptr_t>(base())) / kPageSize;
  const size_t n = len / kPageSize;
  if (child_) {
    // A forked child cannot unregister (the parent holds its userfaultfd). Content kept: the
    // pages stay served (an mlocked page is then never dropped). Otherwise the range is being
    // replaced by a mapping of another kind: its pages leave the child's paging.
    if (child_paged_ && !keep_content) ChildUnpage(first, n);
    return Status::Ok();
  }
  // Own every page as Discard() does; with keep_content, remote pages are filled first (the
  // fill maps them, then they are owned like any resident page). Staged pages are moved back
  // either way (a local move; a staged page would otherwise wait for the evictor to drop it).
  std::vector<uint64_t> old(n);
  bool any_paged = false;
  auto bring_back = [keep_content](uint64_t s) {
    const uint64_t st = St(s);
    return !(s & kBusy) &&
           (st == kStaged || (keep_content && (st == kRemote || st == kPrefetched)));
  };
  // Start the reads of all remote pages first, so they overlap.
  for (size_t i = 0; i < n; ++i) {
    if (bring_back(W(first + i).load())) HandleMissing(first + i, false, 0, nullptr);
  }
  for (size_t i = 0; i < n; ++i) {
    const PageId p = first + i;
    auto& w = W(p);
    for (;;) {
      uint64_t s = w.load();
      const uint64_t st = St(s);
      if (st == kUnpaged) {
        old[i] = s;
        break;
      }
      if (bring_back(s)) {
        HandleMissing(p, false, 0, nullptr);
        continue;
      }
      const bool settled = (st == kNever || st == kRemote || st == kClean || st == kDirty ||
                            st == kPrefetched || st == kPoisoned) &&
                           !(s & kBusy);
      if (!settled) {
        sched_yield();
        continue;
      }
      if (w.compare_exchange_weak(s, kDiscarding)) {
        old[i] = s;
        any_paged = true;
        break;
      }
    }
  }
  if (!any_paged) return Status::Ok();
  if (!keep_content) MarkForkDiscards(first, n);
  // The runs of pages that were paged (others may be mlocked or foreign mappings, which
  // neither madvise nor UFFDIO_UNREGISTER may touch).
  Status failed;
  for (size_t k = 0; k < n && failed.ok();) {
    if (St(old[k]) == kUnpaged) {
      ++k;
      continue;
    }
    size_t e = k;
    while (e < n && St(old[e]) != kUnpaged) ++e;
    void* run = Addr(first + k);
    const size_t run_len = (e - k) * kPageSize;
    if (!keep_content && ::madvise(run, run_len, MADV_DONTNEED) != 0) {
      failed = ErrnoError("madvise(DONTNEED)");
    } else {
      // Unregistering wakes the threads faulting there: they retry as ordinary faults.
      failed = uffd_.Unregister(run, run_len);
    }
    if (failed.ok()) k = e;
  }
  if (!failed.ok()) {
    // Nothing was unregistered for good: re-register what may have been (harmless where it
    // still is) and give every page its state back; without keep_content the dropped pages
    // read as zeros now.
    (void)uffd_.Register(addr, len);
    for (size_t i = 0; i < n; ++i) {
      const uint64_t st = St(old[i]);
      if (st == kUnpaged) continue;
      uint64_t back = old[i];
      if (!keep_content) {
        if (st == kClean || st == kDirty) resident_.fetch_sub(1);
        if (st == kClean || st == kDirty || st == kRemote || st == kPrefetched || st == kPoisoned) {
          AddFootprint(footprint_, peak_footprint_, -1);
        }
        if (st == kPrefetched) PutCtx(&(*ctxs_)[CtxOf(old[i])]);
        back = kNever;
      }
      ResolveWaiters(first + i, W(first + i).exchange(back));
    }
    uffd_.Wake(addr, len);
    return failed;
  }
  TrimForParent(first, n, old);
  for (size_t i = 0; i < n; ++i) {
    const uint64_t st = St(old[i]);
    if (st == kUnpaged) continue;
    if (st == kClean || st == kDirty) resident_.fetch_sub(1);
    if (st == kClean || st == kDirty || st == kRemote || st == kPrefetched || st == kPoisoned) {
      AddFootprint(footprint_, peak_footprint_, -1);
    }
    if (st == kPrefetched) PutCtx(&(*ctxs_)[CtxOf(old[i])]);
    // Waiters were woken by the unregistration; faults there no longer reach the pager.
    W(first + i).store(kUnpaged);
  }
  return Status::Ok();
}

Status PagerImpl::Register(void* addr, size_t len) {
  auto a = reinterpret_cast<uintptr_t>(addr);
  if (len == 0) return Status::Ok();
  if (a % kPageSize != 0 || len % kPageSize != 0 || !Contains(addr, len)) {
    return InvalidArgument("Register(", addr, ", ", len,
                           "): not page-aligned or not inside the paged region");
  }
  if (child_) return Status::Ok();
  const PageId first = (a - reinterpret_cast<uintptr_t>(base())) / kPageSize;
  const size_t n = len / kPageSize;
  // Own the unregistered pages (kUnpaged -> kFilling): a fault that reaches the pager before
  // their state is known waits as a duplicate of a fill and is woken below.
  std::vector<uint8_t> mine(n, 0);
  bool any = false;
  for (size_t i = 0; i < n; ++i) {
    uint64_t s = kUnpaged;
    if (W(first + i).compare_exchange_strong(s, kFilling)) {
      mine[i] = 1;
      any = true;
    }
  }
  if (!any) return Status::Ok();
  auto give_back = [&] {
    for (size_t i = 0; i < n; ++i) {
      if (mine[i]) W(first + i).store(kUnpaged);
    }
  };
  Status reg = uffd_.Register(addr, len);
  if (!reg.ok()) {
    give_back();
    return reg;
  }
  // Which pages hold data: /proc/self/pagemap (bit 63 present, bit 62 swapped).
  int fd = ::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    Status st = ErrnoError("open /proc/self/pagemap");
    (void)uffd_.Unregister(addr, len);
    give_back();
    return st;
  }
  constexpr size_t kChunk = 512;
  uint64_t entries[kChunk];
  int64_t became_resident = 0;
  Status result;
  for (size_t i = 0; i < n; i += kChunk) {
    const size_t m = std::min(kChunk, n - i);
    const off_t off = static_cast<off_t>((a / kPageSize + i) * sizeof(uint64_t));
    const ssize_t got = ::pread(fd, entries, m * sizeof(uint64_t), off);
    if (got != static_cast<ssize_t>(m * sizeof(uint64_t))) {
      // Unknown: treat as holding data (a resident dirty page is written back if evicted; a
      // never-written one would be zero-filled over data).
      for (size_t j = 0; j < m; ++j) entries[j] = 1ull << 63;
      if (result.ok()) result = ErrnoError("read /proc/self/pagemap");
    }
    for (size_t j = 0; j < m; ++j) {
      if (!mine[i + j]) continue;
      const PageId p = first + i + j;
      const bool data = (entries[j] >> 62) != 0;
      if (data) {
        BecameResident(p);
        AddFootprint(footprint_, peak_footprint_, 1);
        NoteTouched(p);
        ++became_resident;
        W(p).store(kDirty);
      } else {
        W(p).store(kNever);
      }
    }
  }
  ::close(fd);
  if (became_resident > 0) {
    std::lock_guard<std::mutex> l(events_mu_);
    for (size_t i = 0; i < n; ++i) {
      if (mine[i] && St(W(first + i).load()) == kDirty) resident_events_.push_back(first + i);
    }
  }
  uffd_.Wake(addr, len);  // Faults that came while the pages were owned retry now.
  MaybeKickEviction();
  if (!result.ok()) {
    TLOG(WARNING) << "pager: Register: " << result.ToString()
                  << "; every page of the range was taken as holding data";
  }
  return Status::Ok();
}

PagerStats PagerImpl::Stats() const {
  PagerStats s;
  s.faults = faults_.load();
  s.wp_faults = wp_faults_.load();
  s.trap_faults = trap_faults_.load();
  s.zero_fills = zero_fills_.load();
  s.zero_fill_around = zero_fill_around_.load();
  s.zero_drops = zero_drops_.load();
  s.throttle_giveups = throttle_giveups_.load();
  s.traps_armed = traps_armed_.load();
  s.trap_ioctls = trap_ioctls_.load();
  s.fills_writable = fills_writable_.load();
  s.remote_reads = remote_reads_.load();
  s.remote_writes = remote_writes_.load();
  s.clean_drops = clean_drops_.load();
  s.evictions = evictions_.load();
  s.prefetch_issued = prefetch_issued_.load();
  s.prefetch_hits = prefetch_hits_.load();
  s.discarded = discarded_.load();
  s.deactivated = deactivated_.load();
  s.minor_refaults = minor_refaults_.load();
  s.inactive_drops = inactive_drops_.load();
  s.near_refaults = near_refaults_.load();
  s.staged_pages = static_cast<uint64_t>(std::max<int64_t>(0, staged_.load()));
  s.inactive_target_pages = inactive_target_.load();
  s.spin_hits = spin_hits_.load();
  s.fault_batches = fault_batches_.load();
  s.fault_batch_pages = fault_batch_pages_.load();
  s.fill_errors = fill_errors_.load();
  s.fill_retries = fill_retries_.load();
  s.writeback_errors = writeback_errors_.load();
  s.resident_pages = static_cast<uint64_t>(std::max<int64_t>(0, resident_.load()));
  s.peak_resident_pages = peak_resident_.load();
  s.footprint_pages = static_cast<uint64_t>(std::max<int64_t>(0, footprint_.load()));
  s.peak_footprint_pages = peak_footprint_.load();
  s.limit_pages = LimitPages();
  s.fork_snapshots = fork_snapshots_.load();
  s.fork_fallbacks = fork_fallbacks_.load();
  s.fork_window_faults = fork_window_faults_.load();
  s.fork_preserved = fork_preserved_.load();
  s.fork_pinned = fork_pinned_.load();
  s.fork_child_faults = fork_child_served_.load();
  s.fork_child_dropped = fork_child_dropped_.load();
  s.fork_child_limit_pages = fork_child_limit_.load();
  s.fork_child_peak_resident_pages = fork_child_peak_resident_.load();
  s.fork_child_peak_dirty_pages = fork_child_peak_dirty_.load();
  {
    // A child living now: its figures so far.
    std::lock_guard<std::mutex> cl(child_mu_);
    if (child_active_ && cshared_ != nullptr) {
      s.fork_child_faults += cshared_->served.load();
      s.fork_child_dropped += cshared_->dropped.load();
      s.fork_child_peak_resident_pages =
          std::max(s.fork_child_peak_resident_pages, cshared_->peak_resident.load());
      s.fork_child_peak_dirty_pages =
          std::max(s.fork_child_peak_dirty_pages, cshared_->peak_dirty.load());
    }
  }
  std::lock_guard<std::mutex> l(hist_mu_);
  s.fault_latency = fault_latency_;
  s.remote_fault_latency = remote_fault_latency_;
  return s;
}

}  // namespace internal

// ---------------------------------------------------------------------------------------------

Result<std::unique_ptr<Pager>> Pager::Create(const PagerOptions& o) {
  if (o.store == nullptr) return InvalidArgument("PagerOptions.store is required");
  if (o.tier != nullptr && o.store != o.tier) {
    return InvalidArgument("PagerOptions.tier is set: PagerOptions.store must be that tier");
  }
  if (o.region_bytes == 0 || o.region_bytes % client::kPageSize != 0) {
    return InvalidArgument("PagerOptions.region_bytes must be a positive multiple of 4096, got ",
                           o.region_bytes);
  }
  uint64_t pages = o.region_bytes / client::kPageSize;
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
  if (o.fault_spin_us > 1000) return InvalidArgument("fault_spin_us must be 0..1000");
  if (o.fill_retry_initial_ms < 1 || o.fill_retry_initial_ms > 10000 ||
      o.fill_retry_max_backoff_ms < o.fill_retry_initial_ms ||
      o.fill_retry_max_backoff_ms > 60000) {
    return InvalidArgument(
        "PagerOptions: fill_retry_initial_ms must be 1..10000 and "
        "fill_retry_max_backoff_ms initial..60000, got ",
        o.fill_retry_initial_ms, " and ", o.fill_retry_max_backoff_ms);
  }
  if (o.fault_threads < 1 || o.fault_threads > 8) {
    return InvalidArgument("PagerOptions.fault_threads must be in [1, 8]");
  }
  if (o.zero_fault_around_pages > internal::kMaxFaultAround) {
    return InvalidArgument("PagerOptions.zero_fault_around_pages must be <= ", internal::kMaxFaultAround);
  }
  if (o.prefetch_max_pages > 1024) {
    return InvalidArgument("PagerOptions.prefetch_max_pages must be <= 1024");
  }

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
  auto uffd = internal::Uffd::Open(region, o.region_bytes);
  if (!uffd.ok()) {
    ::munmap(region, o.region_bytes);
    ::munmap(states, pages * sizeof(uint64_t));
    return uffd.status();
  }
  auto impl = std::unique_ptr<internal::PagerImpl>(
      new internal::PagerImpl(static_cast<uint8_t*>(region), o.region_bytes, o,
                              std::move(*uffd), static_cast<uint64_t*>(states)));
  TESSERA_RETURN_IF_ERROR(impl->Start());
  return std::unique_ptr<Pager>(std::move(impl));
}

}  // namespace tessera::kernel_shim
