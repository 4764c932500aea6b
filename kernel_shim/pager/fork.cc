// fork() in a paged program, the parent's side (see "fork" in pager.h, and
// docs/guides/what-is-paged.md for why it works this way).
//
// PrepareFork writes back every dirty resident page and records, per page, where
// the child will find its bytes (snap_: zeros, or a store page). The child inherits the
// region's registration (UFFD_FEATURE_EVENT_FORK); the fault thread that reads the
// UFFD_EVENT_FORK message hands the child's descriptor to ChildLoop, which serves the child's
// faults from the snapshot. While the snapshot lives the parent never overwrites a store page it
// names (PreserveForChild copies the old bytes to a spare store page first) nor trims one
// (TrimForParent leaves it, kMarkOwed); ReleaseSnapshot frees both once the child's address
// space is gone (its pidfd, or ESRCH from its userfaultfd after an exec).
//
// What the child has mapped at the fork is what the kernel copied: the pages resident in the
// parent (write-protected and equal to their store page after the write-back, unless written
// since) and nothing else. Operations of other parent threads that raced with the fork are read
// back by the child from its own copy of the parent's memory, which is exactly the state at the
// copy: its page table (pagemap: present, uffd-wp), snap_, and kMarkDiscarded (set by Discard
// before its madvise while a fork is being made).
//
// The child's side (its page words, its evictor, serving itself once the parent is gone) is
// fork_child.cc; what both processes share is fork_state.h.
#include <fcntl.h>
#include <linux/futex.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <new>
#include <string>
#include <thread>

#include "common/clock.h"
#include "common/logging.h"
#include "kernel_shim/pager/pager_impl.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

namespace tessera::kernel_shim::internal {
// ---- the parent ---------------------------------------------------------------------------

Status PagerImpl::PrepareFork() {
  if (child_) return ChildPrepareFork();
  fork_mu_.lock();
  // The child starts with what is resident now: let eviction bring it to the cap first (it may
  // lag behind a burst of faults by up to the throttle's slack).
  if (const uint64_t cap = ResidentCap(); cap > 0) {
    const Deadline settle = Deadline::AfterMs(2000);
    while (static_cast<uint64_t>(std::max<int64_t>(0, resident_.load())) > cap &&
           !settle.Expired() && !evict_failing_.load()) {
      MaybeKickEviction();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  {
    std::unique_lock<std::mutex> l(evict_mu_);
    evict_paused_++;
    evict_idle_cv_.wait(l, [&] { return !evict_running_; });
  }
  // The inactive list's pages go back into the region first (moves, no store reads): the child
  // must find every page's bytes mapped or in the store, and a staging slot is neither.
  const Status unstaged = staging_on() ? PageIn(/*staged_only=*/true) : Status::Ok();
  std::string why;
  // Without a limit everything is resident: the child's full private copy costs nothing to
  // make, and sharing through the store would first write the whole heap back.
  const bool no_limit = LimitPages() == 0;
  if (!no_limit) AwaitEndedChild(Deadline::AfterMs(10000));
  bool in_use = false;
  {
    std::lock_guard<std::mutex> l(snap_mu_);
    in_use = snap_ != nullptr && (snap_live_.load() || snap_end_ != 0);
  }
  if (no_limit) {
    why = "no local-memory limit";
  } else if (!uffd_.has_fork_events()) {
    why = "the kernel gives this process no userfaultfd fork events (they need CAP_SYS_PTRACE)";
  } else if (!child_wake_.valid()) {
    why = "the store has no spare pages beyond the region";
  } else if (!unstaged.ok()) {
    why = unstaged.ToString();
  } else if (in_use) {
    why = "an earlier forked child still shares pages with this process";
  }
  fork_snapshot_ = why.empty();
  if (fork_snapshot_) {
    const Deadline deadline = Deadline::AfterMs(kForkTimeoutMs);
    Status st = WriteBackForFork(deadline);
    if (st.ok()) st = BuildSnapshot(deadline);
    if (!st.ok()) {
      why = st.ToString();
      ReleaseSnapshot();
      fork_snapshot_ = false;
    }
  }
  if (!fork_snapshot_) {
    static std::atomic<bool> logged{false};
    if (!no_limit && !logged.exchange(true)) {
      TLOG(WARNING) << "pager: fork: the child cannot share pages through the store (" << why
                    << "): the heap is paged back in first, and parent and child hold it "
                       "all locally for the moment of the fork";
    }
    Status st = PageIn(/*staged_only=*/false);
    if (!st.ok()) {
      ParentAfterFork(-1);
      return st;
    }
  }
  {
    std::lock_guard<std::mutex> l(child_mu_);
    expect_child_ = fork_snapshot_;
  }
  // Last: from here until ParentAfterFork the fault threads only read (see fork_read_only_).
  if (!OpenForkWindow(Deadline::AfterMs(kForkTimeoutMs))) {
    ParentAfterFork(-1);
    return Timeout("pager: fork: a fault thread was still serving a fault after ",
                   kForkTimeoutMs / 1000, " s");
  }
  return Status::Ok();
}

void PagerImpl::AwaitEndedChild(const Deadline& deadline) {
  // A child that has exited, whose end the monitor (ChildLoop) has not handled yet: a program
  // forking its children one after another would otherwise page its whole heap in for the next
  // one. A child still running keeps sharing; the fallback applies then.
  std::unique_lock<std::mutex> l(child_mu_);
  auto released = [&] { return !child_active_ && !snap_live_.load() && snap_end_.load() == 0; };
  if (released()) return;
  if (child_active_) {
    if (child_pidfd_ < 0) return;
    pollfd p{child_pidfd_, POLLIN, 0};
    if (::poll(&p, 1, 0) <= 0) return;  // Still running.
  }
  if (child_wake_.valid()) {
    uint64_t one = 1;
    (void)!::write(child_wake_.get(), &one, sizeof one);
  }
  while (!released() && !deadline.Expired()) {
    child_cv_.wait_for(l, std::chrono::milliseconds(std::max(1, deadline.RemainingMs())));
  }
}

Status PagerImpl::PageIn(bool staged_only) {
  // Page every remote (or only every staged) page back in, then wait until none is in transit.
  Deadline deadline = Deadline::AfterMs(kForkTimeoutMs);
  for (;;) {
    uint64_t end = max_page_.load();
    bool pending = false;
    for (PageId p = 0; p < end; ++p) {
      const uint64_t st = St(W(p).load());
      const bool staged = st == kStaged || st == kUnstaging || st == kStagedBusy;
      const bool remote = st == kRemote || st == kPrefetched || st == kFilling ||
                          st == kPrefetching || st == kEvicting || st == kDropping;
      if (st == kStaged || (!staged_only && (st == kRemote || st == kPrefetched))) {
        HandleMissing(p, false, 0, nullptr);
      }
      if (staged || (!staged_only && remote)) pending = true;
    }
    if (!pending) return Status::Ok();
    if (deadline.Expired()) {
      return Timeout("pager: paging ", staged_only ? "the inactive list" : "the region",
                     " back in before fork took over ", kForkTimeoutMs / 1000, " s");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

Status PagerImpl::WriteBackForFork(const Deadline& deadline) {
  // Own every dirty page (and clean one never stored) as eviction does (kEvicting: a write now
  // sets kRedirty and goes on), write-protect, copy, write back; they stay mapped.
  const uint64_t end = std::min<uint64_t>(max_page_.load(), pages_);
  std::vector<PageId> pages;
  for (PageId p = 0; p < end; ++p) {
    auto& w = W(p);
    for (;;) {
      uint64_t s = w.load();
      const uint64_t st = St(s);
      if (!(st == kDirty || (st == kClean && !(s & kInStore)))) break;
      if (s & kBusy) {  // A write-protect fault is lifting protection right now.
        if (deadline.Expired()) return Timeout("pager: fork: a page stayed busy");
        sched_yield();
        continue;
      }
      if (w.compare_exchange_weak(s, With(s, kEvicting) & ~kRedirty)) {
        pages.push_back(p);
        break;
      }
    }
  }
  WriteProtectRuns(pages, "fork: write-protecting dirty pages");
  constexpr size_t kChunk = 256;
  std::vector<uint8_t> bufs(kChunk * kPageSize);
  std::vector<PageOp> ops(kChunk);
  std::vector<PageOp*> ptrs(kChunk);
  size_t written = 0, failed = 0;
  Status first_error;
  for (size_t k = 0; k < pages.size(); k += kChunk) {
    const size_t m = std::min(kChunk, pages.size() - k);
    for (size_t i = 0; i < m; ++i) {
      std::memcpy(bufs.data() + i * kPageSize, Addr(pages[k + i]), kPageSize);
      ops[i] = PageOp{};
      ops[i].kind = PageOp::Kind::kWrite;
      ops[i].page = pages[k + i];
      ops[i].buf = bufs.data() + i * kPageSize;
      ptrs[i] = &ops[i];
    }
    client::OpWaiter waiter;
    waiter.Arm(ops.data(), m);
    Status sub = o_.store->Submit(std::span<PageOp* const>(ptrs.data(), m));
    if (sub.ok()) {
      (void)waiter.Wait(ops.data(), m);
    } else {
      for (size_t i = 0; i < m; ++i) ops[i].status = sub;
    }
    for (size_t i = 0; i < m; ++i) {
      const PageId p = pages[k + i];
      const bool ok = ops[i].status.ok();
      if (!ok && first_error.ok()) first_error = ops[i].status;
      auto& w = W(p);
      for (;;) {
        uint64_t s = w.load();
        if (s & kBusy) {
          sched_yield();
          continue;
        }
        constexpr uint64_t kOff = kRedirty | kWaitMissing | kWaitWrite | kWaitWp;
        const bool clean = ok && !(s & kRedirty);
        const uint64_t fin = clean ? (With(s, kClean) | kInStore) & ~(kOff | kArmed)
                                   : (With(s, kDirty) | (ok ? kInStore : 0)) & ~kOff;
        if (!w.compare_exchange_weak(s, fin)) continue;
        // A page left dirty is left writable: the child then knows it holds the only copy.
        if (!ok && !(s & kRedirty)) Unprotect(p);
        if (s & (kWaitMissing | kWaitWp)) Wake(p);
        break;
      }
      ok ? ++written : ++failed;
    }
  }
  remote_writes_.fetch_add(written);
  if (failed > 0) {
    TLOG(WARNING) << "pager: fork: " << failed << " dirty pages could not be written back ("
                  << first_error.ToString() << "); the child keeps them mapped";
  }
  return Status::Ok();
}

Status PagerImpl::BuildSnapshot(const Deadline& deadline) {
  if (snap_ == nullptr) {
    // Untouched anonymous memory: only the words written cost memory (zeroed again after each
    // child).
    void* s = ::mmap(nullptr, pages_ * sizeof(uint64_t), PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (s == MAP_FAILED) return ErrnoError("mmap of the fork snapshot");
    void* m = ::mmap(nullptr, pages_, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) {
      Status st = ErrnoError("mmap of the fork marks");
      ::munmap(s, pages_ * sizeof(uint64_t));
      return st;
    }
    snap_ = static_cast<std::atomic<uint64_t>*>(s);
    marks_ = static_cast<std::atomic<uint8_t>*>(m);
  }
  const size_t words_end = kChildWordsOffset + (pages_ + kPageSize - 1) / kPageSize * kPageSize;
  const size_t bytes = words_end + kChildRingSize * sizeof(uint32_t);
  void* sh = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                    MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (sh == MAP_FAILED) return ErrnoError("mmap of the area shared with the forked child");
  auto* h = new (sh) ChildShared();
  h->cap = ResidentCap();
  h->pages = pages_;
  h->parent_pid = static_cast<int32_t>(::getpid());
  h->ring_offset = words_end;
  h->ring_size = kChildRingSize;
  CloseForkSockets();
  if (::socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, fork_sock_) != 0) {
    Status st = ErrnoError("socketpair");
    ::munmap(sh, bytes);
    return st;
  }
  {
    std::lock_guard<std::mutex> l(child_mu_);
    cshared_ = h;
    cshared_bytes_ = bytes;
  }
  // From here on a discard is marked before its madvise; the scan below waits for those that
  // began before (kDiscarding), so either the scan sees the page discarded or the child sees
  // the mark (both are sequentially consistent).
  {
    std::lock_guard<std::mutex> l(snap_mu_);
    fork_window_.store(true);
    snap_end_ = std::min<uint64_t>(max_page_.load(), pages_);
  }
  const uint64_t end = snap_end_;
  for (PageId p = 0; p < end; ++p) {
    for (;;) {
      const uint64_t s = W(p).load();
      const uint64_t st = St(s);
      if (st == kDiscarding || st == kUnstaging || st == kEvicting || st == kDropping ||
          st == kStagedBusy) {
        if (deadline.Expired()) return Timeout("pager: fork: page ", p, " stayed in transition");
        sched_yield();
        continue;
      }
      uint64_t v = kSnapZero;
      switch (st) {
        case kRemote:
        case kPrefetching:
        case kPrefetched:
          v = kSnapId + p;
          break;
        case kFilling:  // A fill in flight: from the store, or zeros.
          v = (s & kInStore) ? kSnapId + p : kSnapZero;
          break;
        case kClean:
          v = (s & kInStore) ? kSnapId + p : kSnapLocal;
          break;
        case kDirty:
        case kStaged:
          v = kSnapLocal;
          break;
        case kPoisoned:
          v = kSnapPoison;
          break;
        default:  // kNever, kUnpaged.
          break;
      }
      if (v != kSnapZero) snap_[p].store(v, std::memory_order_relaxed);
      break;
    }
  }
  {
    std::lock_guard<std::mutex> l(snap_mu_);
    snap_live_.store(true);
  }
  fork_child_limit_.store(h->cap);
  return Status::Ok();
}

void PagerImpl::OnForkEvent(int fd) {
  {
    std::lock_guard<std::mutex> l(child_mu_);
    if (fd >= 0 && expect_child_ && !child_active_) {
      expect_child_ = false;
      child_uffd_ = Uffd::Adopt(fd, uffd_);
      child_active_ = true;
      child_pidfd_ = -1;
      handoff_requested_ = false;
      handoff_done_ = false;
      // The child's own reference (ChildInit receives it): its registration outlives us.
      FdMessage m;
      if (!m.Send(fork_sock_[0], fd)) {
        TLOG(WARNING) << "pager: fork: cannot pass the child its userfaultfd (" << strerror(errno)
                      << "): if this process dies without exiting normally, the child's pages "
                         "it has not mapped read as zeros";
      }
      uint64_t one = 1;
      (void)!::write(child_wake_.get(), &one, sizeof one);
      child_cv_.notify_all();
      return;
    }
  }
  // A child that does not share pages (the fallback paged everything in first, or a fork the
  // shim did not see): closing the descriptor drops its registration, so its region is plain
  // memory.
  if (fd >= 0) ::close(fd);
}

void PagerImpl::ParentAfterFork(pid_t child) {
  if (child_) {  // A forked child that forked in turn: its evictor goes on.
    if (child_paged_ && cshared_ != nullptr) cshared_->paused.store(0);
    return;
  }
  CloseForkWindow();  // fork() has returned: the fault threads serve again.
  if (fork_snapshot_) {
    bool attached = false, active = false;
    {
      std::unique_lock<std::mutex> l(child_mu_);
      if (child > 0) {
        // fork() returned once the event was read; the fault thread hands it over right after.
        attached = child_cv_.wait_for(l, std::chrono::seconds(30), [&] { return child_active_; });
        if (attached) {
          const int pfd = static_cast<int>(::syscall(SYS_pidfd_open, child, 0));
          if (pfd < 0) {
            TLOG(WARNING) << "pager: pidfd_open(" << child << "): " << strerror(errno)
                          << "; the store pages kept for the child are freed when its address "
                             "space is gone";
          }
          child_pidfd_ = pfd;
          uint64_t one = 1;
          (void)!::write(child_wake_.get(), &one, sizeof one);
        } else {
          TLOG(ERROR) << "pager: fork: no UFFD_EVENT_FORK for child " << child
                      << " within 30 s; the child's region is not paged";
        }
      }
      expect_child_ = false;
      active = child_active_;
      fork_window_.store(false);
    }
    CloseForkSockets();  // Sent (or not) by now: the child holds its end.
    if (attached) {
      fork_snapshots_.fetch_add(1);
    } else if (!active) {
      ReleaseSnapshot();  // No child reads it. (An active one is released by ChildLoop.)
    }
  } else if (child > 0) {
    fork_fallbacks_.fetch_add(1);
  }
  {
    std::lock_guard<std::mutex> l(evict_mu_);
    if (evict_paused_ > 0) evict_paused_--;
    evict_kick_ = true;
  }
  evict_cv_.notify_one();
  fork_mu_.unlock();
}

void PagerImpl::CloseForkSockets() {
  for (int& f : fork_sock_) {
    if (f >= 0) ::close(f);
    f = -1;
  }
}

void PagerImpl::HandOffChildren() {
  if (child_) return;
  std::unique_lock<std::mutex> l(child_mu_);
  if (!child_active_ || !child_wake_.valid()) return;
  handoff_requested_ = true;
  uint64_t one = 1;
  (void)!::write(child_wake_.get(), &one, sizeof one);
  child_cv_.wait(l, [&] { return handoff_done_ || !child_active_ || stopping_.load(); });
}

void PagerImpl::HandOffChild() {
  ChildShared* h = cshared_;
  h->paused.store(1);  // Its evictor drops nothing from now on.
  for (int i = 0; h->evicting.load(); ++i) {
    SleepUs(100);
    if (i % 1000 == 999 && !ChildAlive()) return;
  }
  const PageId end = std::min<uint64_t>(std::max<uint64_t>(snap_end_, h->max_page.load()), pages_);
  alignas(64) static thread_local uint8_t buf[kPageSize];
  uint64_t mapped_pages = 0, lost = 0;
  for (PageId p = 0; p < end; ++p) {
    std::atomic<uint8_t>& w = *CWord(p);
    uint8_t v = w.load();
    for (;;) {
      const uint8_t st = v & kCStateMask;
      if (st == kCZapping) {  // The child is discarding it: it reads zeros after.
        if (!WaitChildWord(w, &v)) return;
        continue;
      }
      break;
    }
    if ((v & kCStateMask) != kCAbsent || !(v & (kCSnap | kCPoison))) continue;
    if (!w.compare_exchange_strong(v, static_cast<uint8_t>((v & ~kCStateMask) | kCFilling))) {
      --p;  // Changed meanwhile (a discard): look again.
      continue;
    }
    const uint8_t base_bits = v & ~kCStateMask;
    Status why;
    // The process is exiting: a page the store does not return within ~20 retries is lost.
    const SnapRead got =
        (base_bits & kCPoison) ? SnapRead::kLost : ReadSnapshotPage(p, buf, 20, &why);
    if (got == SnapRead::kChildGone) return;
    if (got == SnapRead::kZeros) std::memset(buf, 0, kPageSize);
    const bool poison = got == SnapRead::kLost;
    void* pa = Addr(p);
    if (poison) {
      ++lost;
      if (have_poison_) (void)child_uffd_.Poison(pa, kPageSize);
      w.store(static_cast<uint8_t>(kCPoison | kCAbsent));
      continue;
    }
    // Writable: nothing drops it any more, and no write needs to be seen.
    size_t mapped = 0;
    Status st = child_uffd_.Copy(pa, buf, kPageSize, /*writable=*/true, &mapped);
    if (!st.ok() && st.code() != StatusCode::kAlreadyExists) {
      w.store(static_cast<uint8_t>(base_bits | kCAbsent));
      if (!ChildAlive()) return;
      continue;
    }
    w.store(static_cast<uint8_t>(base_bits | kCDirty));
    h->resident.fetch_add(1);
    h->dirty.fetch_add(1);
    ++mapped_pages;
  }
  RaisePeak(h->peak_resident, h->resident.load());
  RaisePeak(h->peak_dirty, h->dirty.load());
  h->detached.store(1);
  KickChild(h);
  TLOG(INFO) << "pager: exiting: mapped the " << mapped_pages << " pages a forked child had not"
             << (lost ? " (some lost: SIGBUS there)" : "") << "; it serves its own faults now";
}

PagerImpl::SnapRead PagerImpl::ReadSnapshotPage(PageId p, uint8_t* buf, uint32_t max_retries,
                                                 Status* why) {
  uint64_t backoff_ms = std::max<uint64_t>(o_.fill_retry_initial_ms, 2);
  for (uint32_t attempt = 0;; ++attempt) {
    const uint64_t sv = p < snap_end_ ? snap_[p].load() : kSnapZero;
    if (sv == kSnapZero) return SnapRead::kZeros;
    if (sv < kSnapId) {
      *why = DataLoss(sv == kSnapLocal ? "not in the store at the fork" : "poisoned");
      return SnapRead::kLost;
    }
    Status st = o_.store->ReadPage(sv - kSnapId, buf);
    if (st.ok()) {
      if (snap_[p].load() != sv) continue;  // Copied aside meanwhile: read the copy.
      return SnapRead::kBytes;
    }
    if (st.code() == StatusCode::kDataLoss || (max_retries > 0 && attempt >= max_retries)) {
      *why = st;
      return SnapRead::kLost;
    }
    if ((attempt & (attempt + 1)) == 0) {
      TLOG(WARNING) << "pager: reading page " << p << " for the forked child failed ("
                    << st.ToString() << "); retrying in " << backoff_ms << " ms";
    }
    if (!ChildAlive()) return SnapRead::kChildGone;
    SleepUs(static_cast<long>(backoff_ms * 1000));
    backoff_ms = std::min<uint64_t>(backoff_ms * 2, o_.fill_retry_max_backoff_ms);
  }
}

bool PagerImpl::ChildAlive() {
  if (child_pidfd_ >= 0) {
    pollfd p{child_pidfd_, POLLIN, 0};
    if (::poll(&p, 1, 0) > 0) return false;
  }
  // Write-protecting page 0 of the child's region: ESRCH once its address space is gone (it
  // exited, or exec'd). Harmless otherwise: a page the child wrote faults once more when it
  // writes again, and the monitor lifts the protection.
  uffdio_writeprotect wp{};
  wp.range = {reinterpret_cast<uintptr_t>(base()), kPageSize};
  wp.mode = UFFDIO_WRITEPROTECT_MODE_WP;
  if (::ioctl(child_uffd_.fd(), UFFDIO_WRITEPROTECT, &wp) != 0 && errno == ESRCH) return false;
  return true;
}

bool PagerImpl::WaitChildWord(std::atomic<uint8_t>& w, uint8_t* out) {
  for (int i = 0;; ++i) {
    const uint8_t v = w.load();
    const uint8_t st = v & kCStateMask;
    if (st != kCFilling && st != kCDropping && st != kCZapping) {
      *out = v;
      return true;
    }
    if (i < 64) {
      sched_yield();
    } else {
      SleepUs(50);
      if (i % 256 == 0 && !ChildAlive()) return false;
    }
  }
}

void PagerImpl::ChildLoop() {
  constexpr int kBatch = 32;
  uffd_msg msgs[kBatch];
  while (!stopping_.load()) {
    int ufd = -1, pfd = -1;
    {
      std::unique_lock<std::mutex> l(child_mu_);
      child_cv_.wait(l, [&] { return stopping_.load() || child_active_; });
      if (stopping_.load()) return;
      ufd = child_uffd_.fd();
      pfd = child_pidfd_;
    }
    pollfd fds[3] = {{ufd, POLLIN, 0}, {child_wake_.get(), POLLIN, 0}, {pfd, POLLIN, 0}};
    const int n = ::poll(fds, pfd >= 0 ? 3 : 2, 200);
    if (stopping_.load()) return;
    if (n < 0) {
      if (errno != EINTR) {
        TLOG(ERROR) << "pager: poll (forked child): " << strerror(errno);
        SleepUs(10000);
      }
      continue;
    }
    if (fds[1].revents & POLLIN) {
      uint64_t v;
      (void)!::read(child_wake_.get(), &v, sizeof v);
    }
    bool gone = pfd >= 0 && (fds[2].revents & POLLIN);
    bool handoff = false;
    {
      std::lock_guard<std::mutex> l(child_mu_);
      handoff = handoff_requested_;
    }
    if (handoff) {
      if (!gone) HandOffChild();
      ReleaseSnapshot();  // Our reference goes; the child's own keeps its registration.
      {
        std::lock_guard<std::mutex> l(child_mu_);
        handoff_done_ = true;
      }
      child_cv_.notify_all();
      continue;
    }
    if (!gone && (fds[0].revents & POLLIN)) {
      for (;;) {
        const ssize_t got = ::read(ufd, msgs, sizeof msgs);
        if (got < 0) {
          if (errno == EINTR) continue;
          break;
        }
        const size_t count = static_cast<size_t>(got) / sizeof(uffd_msg);
        for (size_t i = 0; i < count; ++i) {
          if (msgs[i].event == UFFD_EVENT_PAGEFAULT) {
            ServeChildFault(msgs[i].arg.pagefault.address, msgs[i].arg.pagefault.flags);
          } else if (msgs[i].event == UFFD_EVENT_FORK) {
            // The child forked in turn, having paged its heap in first: the grandchild's region
            // is plain memory.
            ::close(static_cast<int>(msgs[i].arg.fork.ufd));
          }
        }
        if (static_cast<size_t>(got) < sizeof msgs) break;
      }
    } else if (!gone && n == 0) {
      gone = !ChildAlive();  // Idle: did it exec?
    }
    if (gone) ReleaseSnapshot();
  }
}

void PagerImpl::ServeChildFault(uint64_t addr, uint64_t flags) {
  ChildShared* h = cshared_;
  const auto b = reinterpret_cast<uintptr_t>(base());
  void* const pa = reinterpret_cast<void*>(addr & ~(uint64_t{kPageSize} - 1));
  if (addr < b || addr >= b + size() || h == nullptr) {
    // Not the region (the child moved part of it elsewhere with mremap): nothing to serve it from.
    TLOG(ERROR) << "pager: forked child faulted at " << pa
                << ", outside the paged region: the access gets SIGBUS";
    if (have_poison_) (void)child_uffd_.Poison(pa, kPageSize);
    child_uffd_.Wake(pa, kPageSize);
    return;
  }
  for (int i = 0; !h->ready.load(); ++i) {  // The child is still setting its words.
    SleepUs(100);
    if (i % 1000 == 999 && !ChildAlive()) return;
  }
  const PageId p = (addr - b) / kPageSize;
  std::atomic<uint8_t>& w = *CWord(p);
  if (flags & UFFD_PAGEFAULT_FLAG_WP) {
    for (;;) {
      uint8_t v = w.load();
      switch (v & kCStateMask) {
        case kCClean: {
          if (!w.compare_exchange_weak(v, static_cast<uint8_t>((v & ~kCStateMask) | kCDirty))) {
            continue;
          }
          RaisePeak(h->peak_dirty, h->dirty.fetch_add(1) + 1);
          [[fallthrough]];
        }
        case kCDirty: {
          if (!child_uffd_.WriteProtect(pa, kPageSize, false).ok()) child_uffd_.Wake(pa, kPageSize);
          return;
        }
        case kCFilling:
        case kCDropping:
        case kCZapping:
          if (!WaitChildWord(w, &v)) return;
          continue;
        default:  // Not mapped any more: the access faults again as a missing one.
          child_uffd_.Wake(pa, kPageSize);
          return;
      }
    }
  }
  uint8_t v = 0;
  for (;;) {
    v = w.load();
    const uint8_t st = v & kCStateMask;
    if (st == kCFilling || st == kCDropping || st == kCZapping) {
      if (!WaitChildWord(w, &v)) return;
      continue;
    }
    if (st != kCAbsent) {  // Mapped already (a duplicate message), or not paged: retry.
      child_uffd_.Wake(pa, kPageSize);
      return;
    }
    // Above its cap: give the child's evictor a moment (bounded) before mapping more.
    if (h->cap > 0) {
      for (int i = 0; i < 400; ++i) {
        const int64_t r = h->resident.load();
        if (r < static_cast<int64_t>(h->cap) || r - h->dirty.load() <= 0 || h->paused.load()) {
          break;
        }
        KickChild(h);
        SleepUs(500);
      }
    }
    if (w.compare_exchange_strong(v, static_cast<uint8_t>((v & ~kCStateMask) | kCFilling))) break;
  }
  const uint8_t base_bits = v & ~kCStateMask;
  Status why = DataLoss("poisoned in the parent");
  const uint8_t* src = kZeroRun;
  alignas(64) static thread_local uint8_t buf[kPageSize];
  SnapRead got = (base_bits & kCPoison) ? SnapRead::kLost : SnapRead::kZeros;
  if (got != SnapRead::kLost && (base_bits & kCSnap)) got = ReadSnapshotPage(p, buf, 0, &why);
  if (got == SnapRead::kChildGone) {
    w.store(static_cast<uint8_t>(base_bits | kCAbsent));
    return;
  }
  if (got == SnapRead::kBytes) src = buf;
  const bool poison = got == SnapRead::kLost;
  if (poison) {
    fill_errors_.fetch_add(1);
    TLOG(ERROR) << "pager: page " << p << " of the forked child cannot be read back ("
                << why.ToString() << "): the access gets SIGBUS";
    w.store(static_cast<uint8_t>(kCPoison | kCAbsent));
    if (!have_poison_ || !child_uffd_.Poison(pa, kPageSize).ok()) child_uffd_.Wake(pa, kPageSize);
    return;
  }
  size_t mapped = 0;
  Status st = child_uffd_.Copy(pa, src, kPageSize, /*writable=*/false, &mapped);
  if (st.ok()) {
    w.store(static_cast<uint8_t>(base_bits | kCClean));
    h->Push(p);
    RaisePeak(h->peak_resident, h->resident.fetch_add(1) + 1);
    h->served.fetch_add(1);
    uint64_t m = h->max_page.load();
    while (p + 1 > m && !h->max_page.compare_exchange_weak(m, p + 1)) {
    }
  } else if (st.code() == StatusCode::kAlreadyExists) {
    // Mapped without the monitor (never expected): keep what is there and never drop it.
    w.store(static_cast<uint8_t>(base_bits | kCDirty));
    RaisePeak(h->peak_resident, h->resident.fetch_add(1) + 1);
    RaisePeak(h->peak_dirty, h->dirty.fetch_add(1) + 1);
    child_uffd_.Wake(pa, kPageSize);
  } else {
    // The child is gone (ESRCH), or the copy failed: its next fault tries again.
    w.store(static_cast<uint8_t>(base_bits | kCAbsent));
    child_uffd_.Wake(pa, kPageSize);
    return;
  }
  if (h->cap > 0 && h->resident.load() >= static_cast<int64_t>(h->cap)) KickChild(h);
}

void PagerImpl::ReleaseSnapshot() {
  {
    std::lock_guard<std::mutex> l(child_mu_);
    if (child_active_) {
      child_uffd_.Close();
      child_active_ = false;
      child_cv_.notify_all();
    }
    if (child_pidfd_ >= 0) {
      ::close(child_pidfd_);
      child_pidfd_ = -1;
    }
    expect_child_ = false;
    if (ChildShared* h = cshared_; h != nullptr) {
      fork_child_served_.fetch_add(h->served.load());
      fork_child_dropped_.fetch_add(h->dropped.load());
      RaisePeak(fork_child_peak_resident_, static_cast<int64_t>(h->peak_resident.load()));
      RaisePeak(fork_child_peak_dirty_, static_cast<int64_t>(h->peak_dirty.load()));
      cshared_ = nullptr;
      ::munmap(h, cshared_bytes_);
    }
  }
  uint64_t end = 0;
  {
    std::lock_guard<std::mutex> l(snap_mu_);
    snap_live_.store(false);
    fork_window_.store(false);
    if (snap_ == nullptr) return;
    end = std::max<uint64_t>(snap_end_, std::min<uint64_t>(max_page_.load(), pages_));
  }
  // Spare pages holding the child's copies, and the trims held back for it.
  std::vector<uint64_t> spares;
  std::vector<std::pair<PageId, uint64_t>> owned;  // Pages taken to trim, and their words.
  std::vector<PageId> busy;                         // Mapped pages held kBusy to trim.
  for (PageId p = 0; p < end; ++p) {
    const uint64_t v = p < snap_end_ ? snap_[p].load(std::memory_order_relaxed) : kSnapZero;
    if (v >= kSnapId && v - kSnapId >= pages_) spares.push_back(v - kSnapId);
    if (!(marks_[p].load(std::memory_order_relaxed) & kMarkOwed)) continue;
    // Trim it only while it holds no data of the parent's (a page written back meanwhile holds
    // the parent's bytes), owned so that nothing maps it meanwhile.
    auto& w = W(p);
    uint64_t s = w.load();
    if ((s == kNever || s == kUnpaged) && w.compare_exchange_strong(s, kDiscarding)) {
      owned.emplace_back(p, s);
    } else if (St(s) == kDirty && !(s & (kInStore | kBusy)) &&
               w.compare_exchange_strong(s, s | kBusy)) {
      // Mapped and never written back since its discard: the store page is not its copy.
      // kBusy keeps eviction (and so any write-back of it) away until the trim is made.
      busy.push_back(p);
    }
  }
  auto trim_runs = [&](std::vector<uint64_t>& ids) {
    ForEachRun(&ids, [&](uint64_t first, size_t n) {
      Status t = o_.store->Trim(first, n);
      if (!t.ok()) TLOG(WARNING) << "pager: Trim of store page " << first << ": " << t.ToString();
    });
  };
  std::vector<uint64_t> ids(busy.begin(), busy.end());
  for (const auto& [p, s] : owned) ids.push_back(p);
  trim_runs(ids);
  for (const auto& [p, s] : owned) ResolveWaiters(p, W(p).exchange(s));
  for (PageId p : busy) W(p).fetch_and(~kBusy);
  trim_runs(spares);
  for (uint64_t id : spares) FreeSpare(id);
  ::madvise(snap_, pages_ * sizeof(uint64_t), MADV_DONTNEED);
  ::madvise(marks_, pages_, MADV_DONTNEED);
  {
    std::lock_guard<std::mutex> l(snap_mu_);
    snap_end_ = 0;
  }
  { std::lock_guard<std::mutex> l(child_mu_); }  // AwaitEndedChild checks under child_mu_.
  child_cv_.notify_all();
}

bool PagerImpl::AllocSpare(uint64_t* id) {
  std::lock_guard<std::mutex> l(spare_mu_);
  if (!spare_free_.empty()) {
    *id = spare_free_.back();
    spare_free_.pop_back();
    return true;
  }
  if (spare_next_ >= spare_total_) return false;
  *id = pages_ + spare_next_++;
  return true;
}

void PagerImpl::FreeSpare(uint64_t id) {
  std::lock_guard<std::mutex> l(spare_mu_);
  spare_free_.push_back(id);
}

void PagerImpl::PreserveForChild(std::vector<PageOp*>* submit, std::vector<uint8_t>* pinned,
                                 const std::vector<PageOp>& ops) {
  std::lock_guard<std::mutex> l(snap_mu_);
  if (!snap_live_.load()) return;
  std::vector<size_t> idx;  // Into *submit: the ops the snapshot still reads the page of.
  for (size_t k = 0; k < submit->size(); ++k) {
    const PageId p = (*submit)[k]->page;
    if (p < snap_end_ && snap_[p].load() == kSnapId + p) idx.push_back(k);
  }
  if (idx.empty()) return;
  const size_t n = idx.size();
  std::vector<PageId> from(n);
  std::vector<uint64_t> to(n, ~uint64_t{0});
  std::vector<uint8_t> bufs(n * kPageSize);
  std::vector<uint8_t> done(n, 0);
  for (size_t i = 0; i < n; ++i) {
    from[i] = (*submit)[idx[i]]->page;
    if (!AllocSpare(&to[i])) to[i] = ~uint64_t{0};
  }
  // The snapshot's bytes, then onto the spare pages.
  const Status all = o_.store->ReadPages(from.data(), n, bufs.data());
  std::vector<PageOp> wops;
  std::vector<size_t> wix;
  wops.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    if (to[i] == ~uint64_t{0}) continue;
    Status st = all.ok() ? Status::Ok() : o_.store->ReadPage(from[i], bufs.data() + i * kPageSize);
    if (st.code() == StatusCode::kDataLoss) {
      // Lost already: the child gets SIGBUS for it either way; the parent's write goes on.
      snap_[from[i]].store(kSnapPoison);
      FreeSpare(to[i]);
      to[i] = ~uint64_t{0};
      done[i] = 1;
      continue;
    }
    if (!st.ok()) continue;
    PageOp op;
    op.kind = PageOp::Kind::kWrite;
    op.page = to[i];
    op.buf = bufs.data() + i * kPageSize;
    wops.push_back(op);
    wix.push_back(i);
  }
  if (!wops.empty()) {
    std::vector<PageOp*> ptrs;
    for (auto& op : wops) ptrs.push_back(&op);
    client::OpWaiter waiter;
    waiter.Arm(wops.data(), wops.size());
    Status sub = o_.store->Submit(ptrs);
    if (sub.ok()) {
      (void)waiter.Wait(wops.data(), wops.size());
    } else {
      for (auto& op : wops) op.status = sub;
    }
    for (size_t j = 0; j < wops.size(); ++j) {
      const size_t i = wix[j];
      if (!wops[j].status.ok()) continue;
      snap_[from[i]].store(kSnapId + to[i]);
      done[i] = 1;
      fork_preserved_.fetch_add(1);
    }
  }
  size_t held = 0;
  std::vector<uint8_t> drop(submit->size(), 0);
  for (size_t i = 0; i < n; ++i) {
    if (done[i]) continue;
    if (to[i] != ~uint64_t{0}) {
      (void)o_.store->Trim(to[i], 1);
      FreeSpare(to[i]);
    }
    drop[idx[i]] = 1;
    (*pinned)[static_cast<size_t>((*submit)[idx[i]] - ops.data())] = 1;
    ++held;
  }
  if (held == 0) return;
  size_t k = 0;
  for (size_t j = 0; j < submit->size(); ++j) {
    if (!drop[j]) (*submit)[k++] = (*submit)[j];
  }
  submit->resize(k);
  const uint64_t total = fork_pinned_.fetch_add(held) + held;
  if ((total & (total - 1)) == 0 || total == held) {
    TLOG(WARNING) << "pager: a forked child still reads " << held << " pages the parent is "
                  << "writing back, and their old bytes could not be copied aside (no spare "
                  << "store page left, or the store failed): they stay resident, above the local "
                  << "limit, until the child exits (" << total << " so far)";
  }
}

void PagerImpl::TrimForParent(PageId first, size_t n, const std::vector<uint64_t>& old) {
  auto trim = [&](PageId a, size_t m) {
    Status t = o_.store->Trim(a, m);
    if (!t.ok()) TLOG(WARNING) << "pager: Trim of pages " << a << "+" << m << ": " << t.ToString();
  };
  if (!fork_window_.load() && !snap_live_.load()) {
    trim(first, n);
    return;
  }
  std::lock_guard<std::mutex> l(snap_mu_);
  if (!fork_window_.load() && !snap_live_.load()) {
    trim(first, n);
    return;
  }
  // A forked child may read their store pages: keep them, trimmed at its end (kMarkOwed). A
  // page is held if the snapshot names its store page (discarded and rewritten since, its word
  // no longer says so), was held already, or had store data when taken (the snapshot may not
  // have reached it yet: the fork's scan waits for no discard that started before it).
  auto held = [&](size_t i) {
    const PageId p = first + i;
    const uint64_t s = old[i], st = St(s);
    return (s & kInStore) != 0 || st == kRemote || st == kPrefetched || st == kPoisoned ||
           (p < snap_end_ && snap_[p].load() == kSnapId + p) ||
           (marks_[p].load() & kMarkOwed) != 0;
  };
  for (size_t k = 0; k < n;) {
    if (held(k)) {
      marks_[first + k].fetch_or(kMarkOwed);
      ++k;
      continue;
    }
    size_t e = k;
    while (e < n && !held(e)) ++e;
    trim(first + k, e - k);
    k = e;
  }
}

void PagerImpl::MarkForkDiscards(PageId first, size_t n) {
  if (!fork_window_.load()) return;
  for (size_t i = 0; i < n; ++i) marks_[first + i].fetch_or(kMarkDiscarded);
}

}  // namespace tessera::kernel_shim::internal
