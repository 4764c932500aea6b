#include "kernel_shim/pager/pager_impl.h"

#include <linux/userfaultfd.h>
#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <string>

#include "common/clock.h"
#include "common/logging.h"

namespace tessera::kernel_shim::internal {

bool PagerImpl::CopyIn(PageId p, const uint8_t* src, bool writable) {
  size_t mapped = 0;
  Status st = uffd_.Copy(Addr(p), src, kPageSize, writable, &mapped);
  if (st.ok()) return true;
  if (st.code() == StatusCode::kAlreadyExists) {  // Mapped already (someone else won): wake.
    Wake(p);
    return true;
  }
  TLOG(ERROR) << "pager: page " << p << ": " << st.ToString();
  return false;
}

void PagerImpl::Wake(PageId p) { uffd_.Wake(Addr(p), kPageSize); }

void PagerImpl::Unprotect(PageId p) {
  Status st = uffd_.WriteProtect(Addr(p), kPageSize, /*protect=*/false);
  if (st.ok()) return;
  TLOG(ERROR) << "pager: clearing write protection of page " << p << ": " << st.ToString();
  Wake(p);
}

void PagerImpl::Poison(PageId p, const Status& why) {
  fill_errors_.fetch_add(1);
  TLOG(ERROR) << "pager: page " << p << " cannot be read back (" << why.ToString()
              << "): the access gets SIGBUS";
  if (have_poison_) {
    Status st = uffd_.Poison(Addr(p), kPageSize);
    if (st.ok()) {
      W(p).store(kPoisoned);
      Wake(p);
      return;
    }
    TLOG(ERROR) << "pager: page " << p << ": " << st.ToString();
  }
  // No poison support: never map zeros; leave the page remote and let the access retry.
  W(p).store(kRemote | kInStore);
  Wake(p);
}

void PagerImpl::FillFailed(PageId p, const Status& why) {
  if (why.code() == StatusCode::kDataLoss) {
    Poison(p, why);
    return;
  }
  Retry r;
  r.page = p;
  r.first_ns = MonotonicNs();
  r.backoff_ms = o_.fill_retry_initial_ms;
  QueueRetry(r, why);
}

void PagerImpl::QueueRetry(Retry r, const Status& why) {
  uint64_t now = MonotonicNs();
  uint64_t failing_ms = (now - r.first_ns) / 1000000;
  if (o_.fill_retry_limit_ms > 0 && failing_ms >= o_.fill_retry_limit_ms) {
    Poison(r.page,
           Status(why.code(), "still failing after " + std::to_string(failing_ms) + " ms and " +
                                  std::to_string(r.attempt) + " retries: " + why.message()));
    return;
  }
  // A log line for the first failure and then at retries 1, 2, 4, 8, ...: a page failing for
  // an hour logs a few dozen lines, not one per retry.
  const uint32_t next = r.attempt + 1;
  if ((next & (next - 1)) == 0) {
    TLOG(WARNING) << "pager: reading page " << r.page << " failed (" << why.ToString()
                  << "); retry " << next << " in " << r.backoff_ms
                  << " ms (the faulting thread waits; SIGBUS only for DataLoss)";
  }
  r.due_ns = now + r.backoff_ms * 1000000;
  {
    std::lock_guard<std::mutex> l(retry_mu_);
    retries_.push_back(r);
  }
  retry_cv_.notify_all();
}

void PagerImpl::RetryLoop() {
  std::vector<uint8_t> buf(kPageSize + 4096);
  uint8_t* page_buf = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(buf.data()) + 4095) &
                                                 ~uintptr_t{4095});
  std::unique_lock<std::mutex> l(retry_mu_);
  while (!stopping_.load()) {
    if (retries_.empty()) {
      retry_cv_.wait(l, [&] { return stopping_.load() || !retries_.empty(); });
      continue;
    }
    auto it = std::min_element(retries_.begin(), retries_.end(),
                               [](const Retry& a, const Retry& b) { return a.due_ns < b.due_ns; });
    uint64_t now = MonotonicNs();
    if (it->due_ns > now) {
      // The backoff of the earliest entry (or a newer, earlier one, or stop).
      retry_cv_.wait_for(l, std::chrono::nanoseconds(it->due_ns - now));
      continue;
    }
    Retry r = *it;
    retries_.erase(it);
    l.unlock();
    ++r.attempt;
    fill_retries_.fetch_add(1);
    Status st = o_.store->ReadPage(r.page, page_buf);
    if (st.ok()) {
      TLOG(INFO) << "pager: page " << r.page << " read back after " << r.attempt
                 << (r.attempt == 1 ? " retry" : " retries");
      MapPage(r.page, page_buf, (W(r.page).load() & kFillWrite) != 0, kInStore, 0);
    } else if (st.code() == StatusCode::kDataLoss) {
      Poison(r.page, st);
    } else {
      r.backoff_ms = std::min<uint64_t>(r.backoff_ms * 2, o_.fill_retry_max_backoff_ms);
      QueueRetry(r, st);
    }
    l.lock();
  }
}

// ---------------------------------------------------------------------------------------------
// Fault handling.

void PagerImpl::FaultLoop(int index) {
  (void)index;
  constexpr int kBatch = 64;
  uffd_msg msgs[kBatch];
  std::vector<std::pair<PageId, uint64_t>> missing;  // page, write flag
  std::vector<PageId> wps;
  std::vector<std::pair<PageId, bool>> handed;
  // This thread's page buffer for the reads it serves itself (fault_thread_reads).
  alignas(64) static thread_local uint8_t sync_page[kPageSize];
  uint8_t* const sync_buf = o_.fault_thread_reads ? sync_page : nullptr;
  const int bell = fault_bells_.empty() ? -1 : fault_bells_[index].get();
  while (!stopping_.load(std::memory_order_relaxed)) {
    if (fork_read_only_.load()) {
      ReadThroughForkWindow(index);
      continue;
    }
    pollfd fds[3] = {{uffd_.fd(), POLLIN, 0}, {stop_fd_.get(), POLLIN, 0}, {bell, POLLIN, 0}};
    int n = ::poll(fds, bell >= 0 ? 3 : 2, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      TLOG(ERROR) << "pager: poll: " << strerror(errno);
      return;
    }
    if (stopping_.load()) return;
    if (bell >= 0 && (fds[2].revents & POLLIN)) {
      uint64_t v;
      (void)!::read(bell, &v, sizeof v);
      if (fork_read_only_.load()) continue;  // Handoffs and faults wait for the window's end.
    }
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
      if (fork_read_only_.load()) break;  // A fork is under way: read only (above).
      ssize_t got = ::read(uffd_.fd(), msgs, sizeof msgs);
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
        if (msgs[i].event == UFFD_EVENT_FORK) {
          // fork() in the parent waits until this message is read: the child's descriptor.
          OnForkEvent(static_cast<int>(msgs[i].arg.fork.ufd));
          continue;
        }
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
      if (sync_buf != nullptr && o_.batch_faults && missing.size() > 1) {
        // Several faults in one wake-up (threads faulting at once): their store reads are
        // posted together and served on this thread.
        ServeMissingBatch(missing, t0);
      } else {
        // All but the last are submitted to the store, so their reads overlap; the last is
        // served on this thread.
        for (size_t i = 0; i < missing.size(); ++i) {
          HandleMissing(missing[i].first, missing[i].second != 0, t0,
                        o_.prefetch ? &stream_ : nullptr,
                        i + 1 == missing.size() ? sync_buf : nullptr);
        }
      }
      for (PageId p : wps) HandleWp(p);
      if (static_cast<size_t>(got) < sizeof msgs && !SpinForFault()) break;
    }
  }
}

void PagerImpl::ReadThroughForkWindow(int index) {
  // Says "reading only" once per window (a thread still here from the last one says it again
  // for the next); false once the window is closed.
  uint64_t acked = 0;
  auto ack = [&] {
    {
      std::lock_guard<std::mutex> l(fork_window_mu_);
      if (!fork_read_only_.load()) return false;
      if (acked == fork_window_gen_) return true;
      acked = fork_window_gen_;
      ++read_only_threads_;
    }
    fork_window_cv_.notify_all();
    return true;
  };
  if (!ack()) return;
  // From here until the window closes: no allocation, no lock but fork_window_mu_ (which no
  // holder keeps across an allocation), no logging.
  constexpr int kBatch = 64;
  uffd_msg msgs[kBatch];
  const int bell = fault_bells_[index].get();
  while (!stopping_.load(std::memory_order_relaxed)) {
    pollfd fds[2] = {{uffd_.fd(), POLLIN, 0}, {bell, POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;  // The normal loop reports it.
    }
    if (fds[1].revents & POLLIN) {
      uint64_t v;
      (void)!::read(bell, &v, sizeof v);
      if (!ack()) return;
    }
    if (!(fds[0].revents & POLLIN)) continue;
    for (;;) {
      const ssize_t got = ::read(uffd_.fd(), msgs, sizeof msgs);
      if (got < 0) {
        if (errno == EINTR) continue;
        break;
      }
      const size_t count = static_cast<size_t>(got) / sizeof(uffd_msg);
      for (size_t i = 0; i < count; ++i) {
        if (msgs[i].event == UFFD_EVENT_FORK) {
          // Read: fork() goes on (and releases the allocator) while this runs.
          OnForkEvent(static_cast<int>(msgs[i].arg.fork.ufd));
        } else if (msgs[i].event == UFFD_EVENT_PAGEFAULT) {
          const uint64_t addr = msgs[i].arg.pagefault.address;
          bool queued = false;
          {
            std::lock_guard<std::mutex> l(fork_window_mu_);
            if (window_count_ < kForkWindowQueue) {
              window_q_[(window_head_ + window_count_) % kForkWindowQueue] =
                  QueuedFault{addr, msgs[i].arg.pagefault.flags};
              ++window_count_;
              queued = true;
            }
          }
          if (queued) {
            fork_window_cv_.notify_all();
          } else {
            // Full (thousands of threads faulting at once): the thread retries its access,
            // and its fault comes back.
            uffd_.Wake(reinterpret_cast<void*>(addr & ~(uint64_t{kPageSize} - 1)), kPageSize);
          }
        }
      }
      if (static_cast<size_t>(got) < sizeof msgs) break;
    }
  }
}

void PagerImpl::ForkWindowLoop() {
  std::unique_lock<std::mutex> l(fork_window_mu_);
  for (;;) {
    fork_window_cv_.wait(l, [&] { return window_count_ > 0 || stopping_.load(); });
    if (window_count_ == 0) return;  // Stopping.
    const QueuedFault f = window_q_[window_head_];
    window_head_ = (window_head_ + 1) % kForkWindowQueue;
    --window_count_;
    l.unlock();
    const uintptr_t b = reinterpret_cast<uintptr_t>(base());
    if (f.addr >= b && f.addr < b + size()) {
      const PageId p = (f.addr - b) / kPageSize;
      fork_window_faults_.fetch_add(1, std::memory_order_relaxed);
      if (f.flags & UFFD_PAGEFAULT_FLAG_WP) {
        HandleWp(p);
      } else {
        HandleMissing(p, (f.flags & UFFD_PAGEFAULT_FLAG_WRITE) != 0, MonotonicNs(), nullptr);
      }
    }
    l.lock();
  }
}

void PagerImpl::RingFaultThreads() {
  const uint64_t one = 1;
  for (const UniqueFd& bell : fault_bells_) (void)!::write(bell.get(), &one, sizeof one);
}

bool PagerImpl::OpenForkWindow(const Deadline& deadline) {
  if (fault_bells_.empty()) return true;  // No fork events: fork() waits on no reader.
  {
    std::lock_guard<std::mutex> l(fork_window_mu_);
    ++fork_window_gen_;
    read_only_threads_ = 0;
    fork_read_only_.store(true);
  }
  RingFaultThreads();
  bool all = false;
  {
    std::unique_lock<std::mutex> l(fork_window_mu_);
    while (!(all = read_only_threads_ >= fault_threads_) && !deadline.Expired()) {
      fork_window_cv_.wait_for(l, std::chrono::milliseconds(std::max(1, deadline.RemainingMs())));
    }
  }
  if (!all) CloseForkWindow();
  return all;
}

void PagerImpl::CloseForkWindow() {
  if (fault_bells_.empty()) return;
  {
    std::lock_guard<std::mutex> l(fork_window_mu_);
    fork_read_only_.store(false);
    read_only_threads_ = 0;
  }
  RingFaultThreads();
}

void PagerImpl::ServeMissingBatch(const std::vector<std::pair<PageId, uint64_t>>& missing,
                                  uint64_t t0) {
  constexpr size_t kMax = 64;  // FaultLoop reads at most 64 messages at once.
  alignas(64) static thread_local uint8_t bufs[kMax * kPageSize];
  PageId pages[kMax];
  bool writes[kMax];
  size_t n = 0;
  StreamDetector* stream = o_.prefetch ? &stream_ : nullptr;
  // Claim the stored pages (kRemote -> kFilling); every other state is served as one fault.
  for (const auto& [p, w] : missing) {
    auto& word = W(p);
    uint64_t s = word.load();
    const uint64_t want = With(s, kFilling) | (w ? kFillWrite : 0);
    if (n < kMax && St(s) == kRemote && word.compare_exchange_strong(s, want)) {
      NoteTouched(p);
      faults_.fetch_add(1);
      remote_reads_.fetch_add(1);
      NoteRefault(p);
      pages[n] = p;
      writes[n++] = w != 0;
      continue;
    }
    HandleMissing(p, w != 0, t0, stream, nullptr);
  }
  if (n == 0) return;
  if (n > 1) {
    fault_batches_.fetch_add(1, std::memory_order_relaxed);
    fault_batch_pages_.fetch_add(n, std::memory_order_relaxed);
  }
  const Status all = n == 1 ? o_.store->ReadPage(pages[0], bufs)
                            : o_.store->ReadPages(pages, n, bufs);
  for (size_t i = 0; i < n; ++i) {
    uint8_t* b = bufs + i * kPageSize;
    // ReadPages returns the first error only: re-read each page to learn its own.
    Status st = all.ok() ? Status::Ok() : o_.store->ReadPage(pages[i], b);
    if (!st.ok()) {
      FillFailed(pages[i], st);
    } else if (MapPage(pages[i], b, writes[i], kInStore, t0)) {
      uint64_t dt = MonotonicNs() - t0;
      std::lock_guard<std::mutex> l(hist_mu_);
      remote_fault_latency_.Record(dt);
    }
  }
  if (stream) {
    for (size_t i = 0; i < n; ++i) MaybePrefetch(pages[i], stream);
  }
}

bool PagerImpl::SpinForFault() {
  if (o_.fault_spin_us == 0 || spinner_.exchange(true, std::memory_order_acquire)) return false;
  const uint64_t until = MonotonicNs() + uint64_t{o_.fault_spin_us} * 1000;
  bool hit = false;
  while (!stopping_.load(std::memory_order_relaxed)) {
    pollfd p{uffd_.fd(), POLLIN, 0};
    if (::poll(&p, 1, 0) > 0) {
      spin_hits_.fetch_add(1, std::memory_order_relaxed);
      hit = true;
      break;
    }
    if (MonotonicNs() >= until) break;
  }
  spinner_.store(false, std::memory_order_release);
  return hit;
}

void PagerImpl::Handoff(PageId p, bool write) {
  {
    std::lock_guard<std::mutex> l(handoff_mu_);
    handoff_.emplace_back(p, write);
  }
  uint64_t one = 1;
  (void)!::write(stop_fd_.get(), &one, sizeof one);
}

bool PagerImpl::MapFillWritable() {
  // Most stored pages mapped clean get written soon after (a write-protect fault each): then
  // map them writable (their eviction writes them back, as it would have after the fault).
  // Every 8th fill stays clean, so the ratio keeps being measured and the choice turns back within
  // a few thousand fills when the program stops writing what it reads.
  const uint64_t n = fill_seq_.fetch_add(1, std::memory_order_relaxed);
  const uint64_t clean = filled_clean_.load(std::memory_order_relaxed);
  const uint64_t written = written_after_fill_.load(std::memory_order_relaxed);
  if (n % 8 != 0 && clean >= 64 && written * 4 >= clean * 3) {
    fills_writable_.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  if (filled_clean_.fetch_add(1, std::memory_order_relaxed) + 1 >= 256) {
    // Decay (approximate under races): recent behaviour counts most.
    filled_clean_.store(128, std::memory_order_relaxed);
    written_after_fill_.store(written / 2, std::memory_order_relaxed);
  }
  return false;
}

bool PagerImpl::MapPage(PageId p, const uint8_t* src, bool writable, uint64_t in_store,
                        uint64_t t0) {
  if (!writable && in_store && o_.adaptive_writable_fills) writable = MapFillWritable();
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

void PagerImpl::HandleMissing(PageId p, bool write, uint64_t t0, StreamDetector* stream,
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
          NoteRefault(p);
          Status st = o_.store->ReadPage(p, sync_buf);
          if (!st.ok()) {
            FillFailed(p, st);
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
        NoteRefault(p);
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
      case kStaged: {
        // On the inactive list: move it back, no store round trip (a minor refault).
        if (!w.compare_exchange_weak(s, With(s, kUnstaging))) continue;
        if (t0) faults_.fetch_add(1);
        minor_refaults_.fetch_add(1, std::memory_order_relaxed);
        Unstage(p, CtxOf(s), (s & kStagedDirty) != 0 || write, s & kInStore, t0);
        return;
      }
      case kEvicting:
        // Mapped (a stale message: wake it) unless the inactive list is moving it out to a
        // staging slot: then the evictor resolves it once the page is staged.
        if (!staging_on()) {
          Wake(p);
          return;
        }
        [[fallthrough]];
      case kDropping:
      case kDiscarding:
      case kStagedBusy:
        if (!w.compare_exchange_weak(s, s | kWaitMissing | (write ? kWaitWrite : 0))) continue;
        return;  // The owner resolves it when its transition ends.
      case kFilling:
      case kUnstaging:
        return;  // Duplicate: the fill (or move back) in flight wakes it.
      default:
        // Mapped (kClean, kDirty, kEvicting) or poisoned: a stale message. Wake it; if it
        // still cannot proceed it faults again.
        Wake(p);
        return;
    }
  }
}

void PagerImpl::NoteRefault(PageId p) {
  if (!staging_on()) return;
  std::lock_guard<std::mutex> l(events_mu_);
  refault_events_.push_back(p);
}

bool PagerImpl::Unstage(PageId p, uint32_t slot, bool dirty, uint64_t in_store, uint64_t t0) {
  auto& w = W(p);
  bool mapped = false;
  if (dirty) {
    // Dirty: the page itself moves back, writable (it will be written back when evicted).
    Status st;
    mapped = MoveStaging(Addr(p), Slot(slot), 1, /*to_staging=*/false, &st) == 1;
    if (!mapped) TLOG(WARNING) << "pager: moving staged page " << p << " back: " << st.ToString();
  }
  if (!mapped) {
    // Clean (or the move failed): copy it back (write-protected when clean), free the slot.
    size_t copied = 0;
    Status st = uffd_.Copy(Addr(p), Slot(slot), kPageSize, /*writable=*/dirty, &copied);
    if (st.ok() || st.code() == StatusCode::kAlreadyExists) {
      mapped = st.ok();
      if (!mapped) Wake(p);
    }
    if (!mapped) {
      TLOG(ERROR) << "pager: mapping staged page " << p << " back: " << st.ToString();
      w.store(WithCtx(kStaged | in_store | (dirty ? kStagedDirty : 0), slot));
      Wake(p);
      return false;
    }
    ReleaseSlot(slot);
  }
  staged_.fetch_sub(1);
  // Accessed while staged: kRef, as a write-protect fault would set it, so the policy's CLOCK
  // gives the page a second chance instead of taking it again at its next look.
  w.store(in_store | kRef | (dirty ? kDirty : kClean));
  RecordLatency(t0);
  {
    std::lock_guard<std::mutex> l(events_mu_);
    activated_events_.push_back(p);
  }
  MaybeKickEviction();
  return true;
}

size_t PagerImpl::MoveStaging(uint8_t* dst, uint8_t* src, size_t n, bool to_staging,
                               Status* st) {
  size_t done = 0;
  while (done < n) {
    size_t bytes = 0;
    *st = uffd_.Move(dst + done * kPageSize, src + done * kPageSize, (n - done) * kPageSize,
                     /*wake=*/!to_staging, &bytes);
    if (st->ok()) return n;
    done += bytes / kPageSize;
    // The kernel stopped at page `done` with an error, which is not proof that the page stayed
    // (uffd.h, Move). Its entry in the region is: the caller owns the page (kEvicting or
    // kUnstaging), so only this move maps or unmaps it there.
    uint8_t* const region = (to_staging ? src : dst) + done * kPageSize;
    Result<bool> in_region = Uffd::HasPage(region);
    if (!in_region.ok()) {
      TLOG(ERROR) << "pager: after " << st->ToString() << ": " << in_region.status().ToString();
      return done;
    }
    if (*in_region == to_staging) return done;  // It did not move: the error stands.
    const uint64_t n_mis = move_misreports_.fetch_add(1) + 1;
    if ((n_mis & (n_mis - 1)) == 0) {
      TLOG(INFO) << "pager: page " << (region - base()) / kPageSize << " moved although "
                 << st->ToString() << " was reported (the kernel retried it; " << n_mis
                 << " such moves so far)";
    }
    if (!to_staging) Wake((region - base()) / kPageSize);  // An error wakes nobody.
    ++done;
  }
  *st = Status::Ok();
  return n;
}

void PagerImpl::ReleaseSlot(uint32_t slot) {
  if (::madvise(Slot(slot), kPageSize, MADV_DONTNEED) != 0) {
    TLOG(ERROR) << "pager: madvise(DONTNEED) of a staging slot: " << strerror(errno);
  }
}

size_t PagerImpl::ClaimZeroNeighbours(PageId p) {
  size_t want = std::min(o_.zero_fault_around_pages, kMaxFaultAround);
  if (want == 0) return 0;
  if (uint64_t cap = ResidentCap(); cap > 0) {
    // Staged pages are the coldest local pages: fault-around may take their room (the evictor
    // then drops them from the list's end), but never past the hard cap, which faults wait
    // for (Throttle): a list that is long, or whose drops are in flight, lends no more.
    const int64_t resident = resident_.load();
    const int64_t room = std::min(static_cast<int64_t>(cap) - (resident - staged_.load()),
                                  static_cast<int64_t>(HardCap()) - resident) - 1;
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
  // One UFFDIO_COPY for the run (it may map a prefix only, on failure).
  size_t mapped = 0;
  // Writable: a write needs no write-protect fault (see IsAllZero in eviction).
  Status st = uffd_.Copy(Addr(p), kZeroRun, total * kPageSize, /*writable=*/true, &mapped);
  mapped /= kPageSize;
  if (!st.ok()) {
    TLOG(ERROR) << "pager: mapping zeros at page " << p + mapped << ": " << st.ToString();
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
        if (s & kInStore) written_after_fill_.fetch_add(1, std::memory_order_relaxed);
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
    FillFailed(p, why);
    return;
  }
  if (MapPage(p, c->buf, (s & kFillWrite) != 0, kInStore, c->start_ns) && c->start_ns) {
    uint64_t dt = MonotonicNs() - c->start_ns;
    std::lock_guard<std::mutex> l(hist_mu_);
    remote_fault_latency_.Record(dt);
  }
  PutCtx(c);
}

}  // namespace tessera::kernel_shim::internal
