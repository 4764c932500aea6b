// fork(): the forked child's side (see "fork" in pager.h; fork.cc is the parent's side and says
// how the two fit together). The child runs no pager threads but one, its evictor: it keeps the
// child under the cap the parent had at the fork by dropping pages the monitor can serve again
// (kCClean: mapped write-protected, the snapshot's bytes), oldest mapped first, and watches the
// parent: once the parent handed off or died it serves the child's faults itself.
//
// Its page words (ChildShared, shared memory) say, per page, whether it is mapped and whether
// it may be dropped; every transition is a CAS on the word, so the evictor never drops a page a
// write has reached (the monitor's write-protect fault handler makes it kCDirty first). Code
// here never takes a lock a parent thread may have held at the fork (no logging: raw writes to
// stderr).
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "kernel_shim/pager/pager_impl.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

namespace tessera::kernel_shim::internal {

void PagerImpl::ChildAfterFork() {
  if (child_) {  // Forked from a forked child: plain memory here (it was paged in, pager.h).
    child_paged_ = false;
    for (int* f : {&own_uffd_, &parent_pidfd_}) {
      if (*f >= 0) ::close(*f);
      *f = -1;
    }
    return;
  }
  child_ = true;
  if (fork_sock_[0] >= 0) ::close(fork_sock_[0]);
  fork_sock_[0] = -1;
  if (!fork_snapshot_ || cshared_ == nullptr) {  // The fallback: a full private copy.
    CloseForkSockets();
    return;
  }
  child_paged_ = true;
  ChildInit();
}

void PagerImpl::ChildInit() {
  ChildShared* h = cshared_;
  const uint64_t end = std::min<uint64_t>(max_page_.load(), pages_);
  // What the kernel copied: present pages, and which are still write-protected.
  const int fd = ::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  constexpr size_t kChunk = 512;
  uint64_t entries[kChunk];
  unsigned char incore[kChunk];
  int64_t resident = 0, dirty = 0;
  for (PageId p = 0; p < end; p += kChunk) {
    const size_t m = std::min<uint64_t>(kChunk, end - p);
    const off_t off =
        static_cast<off_t>((reinterpret_cast<uintptr_t>(Addr(p)) / kPageSize) * sizeof(uint64_t));
    const bool have_pm =
        fd >= 0 && ::pread(fd, entries, m * sizeof(uint64_t), off) ==
                       static_cast<ssize_t>(m * sizeof(uint64_t));
    if (!have_pm && ::mincore(Addr(p), m * kPageSize, incore) != 0) {
      RawLog("tessera: forked child: neither /proc/self/pagemap nor mincore tell which heap "
             "pages it has; aborting rather than read wrong bytes\n");
      ::abort();
    }
    for (size_t j = 0; j < m; ++j) {
      const PageId q = p + j;
      if (St(W(q).load(std::memory_order_relaxed)) == kUnpaged) {
        CWord(q)->store(kCUnpaged, std::memory_order_relaxed);
        continue;
      }
      const uint64_t v = q < snap_end_ ? snap_[q].load(std::memory_order_relaxed) : kSnapZero;
      const bool discarded = (marks_[q].load(std::memory_order_relaxed) & kMarkDiscarded) != 0;
      const bool present = have_pm ? ((entries[j] >> 63) & 1) != 0 : (incore[j] & 1) != 0;
      const bool wp = have_pm && ((entries[j] >> 57) & 1) != 0;  // PM_UFFD_WP
      const bool stored = v >= kSnapId && !discarded;
      uint8_t word;
      if (present) {
        ++resident;
        if (wp && stored) {
          word = kCSnap | kCClean;
          h->Push(q);  // The monitor serves nothing before `ready`: one producer.
        } else {
          word = kCDirty;
          ++dirty;
        }
      } else if (discarded || v == kSnapZero) {
        word = kCAbsent;
      } else if (stored) {
        word = kCSnap | kCAbsent;
      } else {
        word = kCPoison | kCAbsent;  // Poisoned (or, never expected, local and not mapped).
      }
      CWord(q)->store(word, std::memory_order_relaxed);
    }
  }
  if (fd >= 0) ::close(fd);
  h->resident.store(resident);
  h->dirty.store(dirty);
  RaisePeak(h->peak_resident, resident);
  RaisePeak(h->peak_dirty, dirty);
  h->max_page.store(end);
  h->ready.store(1);
  // Our own reference to our userfaultfd, which the parent's monitor sends as it reads the fork
  // event; and the parent's pidfd, to notice if it dies.
  pollfd pf{fork_sock_[1], POLLIN, 0};
  if (fork_sock_[1] >= 0 && ::poll(&pf, 1, 30000) == 1) {
    FdMessage m;
    own_uffd_ = m.Receive(fork_sock_[1]);
  }
  CloseForkSockets();
  if (own_uffd_ < 0) {
    RawLog("tessera: forked child: no userfaultfd of its own; if the paging parent dies without "
           "exiting normally, heap pages this child has not mapped read as zeros\n");
  }
  parent_pidfd_ = static_cast<int>(::syscall(SYS_pidfd_open, h->parent_pid, 0));
  if (parent_pidfd_ >= 0 && ::getppid() != h->parent_pid) {
    ::close(parent_pidfd_);  // The parent is gone already (the pid may be another process).
    parent_pidfd_ = -2;
  }
  // The evictor, which also watches the parent.
  std::thread([this] { ChildEvictLoop(); }).detach();
}

void PagerImpl::ChildSelfServe() {
  ChildShared* h = cshared_;
  const bool orphaned = !h->detached.load();
  if (orphaned) {
    char msg[300];
    std::snprintf(msg, sizeof msg,
                  "tessera: forked child %d: the paging parent died without handing over the "
                  "heap; pages this child has not mapped and that only the store held raise "
                  "SIGBUS\n",
                  static_cast<int>(::getpid()));
    RawLog(msg);
  }
  if (own_uffd_ < 0) return;
  Uffd self = Uffd::Adopt(own_uffd_, uffd_);
  uffd_msg msgs[16];
  for (;;) {
    pollfd pf{own_uffd_, POLLIN, 0};
    if (::poll(&pf, 1, -1) < 0) continue;
    const ssize_t got = ::read(own_uffd_, msgs, sizeof msgs);
    if (got <= 0) continue;
    for (size_t i = 0; i < static_cast<size_t>(got) / sizeof(uffd_msg); ++i) {
      if (msgs[i].event == UFFD_EVENT_FORK) {
        ::close(static_cast<int>(msgs[i].arg.fork.ufd));
        continue;
      }
      if (msgs[i].event != UFFD_EVENT_PAGEFAULT) continue;
      const uint64_t addr = msgs[i].arg.pagefault.address;
      const auto b = reinterpret_cast<uintptr_t>(base());
      void* const pa = reinterpret_cast<void*>(addr & ~(uint64_t{kPageSize} - 1));
      if (addr < b || addr >= b + size()) {
        (void)self.Poison(pa, kPageSize);
        self.Wake(pa, kPageSize);
        continue;
      }
      std::atomic<uint8_t>& w = *CWord((addr - b) / kPageSize);
      for (;;) {
        uint8_t v = w.load();
        const uint8_t st = v & kCStateMask;
        if (st == kCZapping || st == kCDropping) {  // Our own threads: brief.
          sched_yield();
          continue;
        }
        if (msgs[i].arg.pagefault.flags & UFFD_PAGEFAULT_FLAG_WP) {
          if (st == kCClean &&
              !w.compare_exchange_strong(v, static_cast<uint8_t>((v & ~kCStateMask) | kCDirty))) {
            continue;
          }
          if (st == kCClean || st == kCDirty) {
            if (!self.WriteProtect(pa, kPageSize, false).ok()) self.Wake(pa, kPageSize);
          } else {
            self.Wake(pa, kPageSize);
          }
          break;
        }
        if (st != kCAbsent && st != kCFilling) {  // Mapped: a stale message.
          self.Wake(pa, kPageSize);
          break;
        }
        if (v & (kCSnap | kCPoison)) {
          // Only the store had it (or the parent died while mapping it): never zeros.
          size_t mapped = 0;
          if (st == kCFilling && self.Copy(pa, kZeroRun, kPageSize, false, &mapped).code() ==
                                     StatusCode::kAlreadyExists) {
            w.store(static_cast<uint8_t>((v & ~kCStateMask) | kCDirty));  // It was mapped.
            self.Wake(pa, kPageSize);
            break;
          }
          w.store(static_cast<uint8_t>(kCPoison | kCAbsent));
          if (!self.Poison(pa, kPageSize).ok()) self.Wake(pa, kPageSize);
          break;
        }
        size_t mapped = 0;
        Status st2 = self.Copy(pa, kZeroRun, kPageSize, /*writable=*/true, &mapped);
        if (st2.ok()) {
          w.store(kCDirty);
          h->resident.fetch_add(1);
          h->dirty.fetch_add(1);
        } else {
          self.Wake(pa, kPageSize);
        }
        break;
      }
    }
  }
}

void PagerImpl::DropChildPages(const PageId* sorted, size_t n) {
  ChildShared* h = cshared_;
  size_t dropped = 0;
  for (size_t k = 0; k < n;) {
    size_t j = k + 1;
    while (j < n && sorted[j] == sorted[j - 1] + 1) ++j;
    const bool ok = ::madvise(Addr(sorted[k]), (j - k) * kPageSize, MADV_DONTNEED) == 0;
    for (size_t i = k; i < j; ++i) {
      std::atomic<uint8_t>* w = CWord(sorted[i]);
      const uint8_t v = w->load();
      // Not droppable (e.g. mlocked): kept for good.
      w->store(static_cast<uint8_t>((v & ~kCStateMask) | (ok ? kCAbsent : kCDirty)));
    }
    if (ok) {
      dropped += j - k;
    } else {
      RaisePeak(h->peak_dirty, h->dirty.fetch_add(static_cast<int64_t>(j - k)) +
                                   static_cast<int64_t>(j - k));
    }
    k = j;
  }
  h->resident.fetch_sub(static_cast<int64_t>(dropped));
  h->dropped.fetch_add(dropped);
}

void PagerImpl::ChildEvictLoop() {
  ChildShared* h = cshared_;
  const int64_t cap = static_cast<int64_t>(h->cap);
  const int64_t target = std::max<int64_t>(1, cap - std::max<int64_t>(1, cap / 20));
  PageId hand = 0;
  uint64_t swept_missed = 0;
  for (;;) {
    bool parent_gone = parent_pidfd_ == -2;
    if (parent_pidfd_ >= 0) {
      pollfd pf{parent_pidfd_, POLLIN, 0};
      parent_gone = ::poll(&pf, 1, 0) > 0;
    }
    if (h->detached.load() || parent_gone) {
      ChildSelfServe();
      return;
    }
    const uint32_t k = h->kick.load();
    // At the cap already: make room before the monitor maps more (it waits at the cap).
    if (cap == 0 || h->paused.load() || h->resident.load() < cap) {
      timespec ts{0, 20 * 1000 * 1000};
      Futex(&h->kick, FUTEX_WAIT, k, &ts);
      continue;
    }
    h->evicting.store(1);
    // Oldest mapped first: the ring.
    std::atomic<uint32_t>* ring = h->Ring();
    PageId batch[64];
    while (h->resident.load() > target && !h->paused.load()) {
      size_t n = 0;
      uint64_t tail = h->ring_tail.load(std::memory_order_relaxed);
      const uint64_t head = h->ring_head.load(std::memory_order_acquire);
      while (n < 64 && tail < head) {
        const PageId q = ring[tail % h->ring_size].load(std::memory_order_relaxed);
        ++tail;
        std::atomic<uint8_t>* w = CWord(q);
        uint8_t v = w->load();
        if ((v & kCStateMask) == kCClean &&
            w->compare_exchange_strong(v, static_cast<uint8_t>((v & ~kCStateMask) | kCDropping))) {
          batch[n++] = q;
        }
      }
      h->ring_tail.store(tail, std::memory_order_release);
      if (n == 0) break;
      std::sort(batch, batch + n);
      DropChildPages(batch, n);
    }
    // Then the pages the ring missed (it was full), in address order: only if it missed some
    // since the last whole sweep (otherwise every clean page was in it).
    const uint64_t missed = h->ring_missed.load();
    const PageId end = missed != swept_missed ? std::min<uint64_t>(h->max_page.load(), pages_) : 0;
    uint64_t scanned = 0;
    while (end > 0 && h->resident.load() > target && scanned < end && !h->paused.load()) {
      if (hand >= end) hand = 0;
      const PageId p = hand;
      size_t run = 0;
      while (run < 64 && p + run < end) {
        std::atomic<uint8_t>* w = CWord(p + run);
        uint8_t v = w->load();
        if ((v & kCStateMask) != kCClean ||
            !w->compare_exchange_strong(v, static_cast<uint8_t>((v & ~kCStateMask) | kCDropping))) {
          break;
        }
        ++run;
      }
      if (run == 0) {
        ++scanned;
        hand = p + 1;
        continue;
      }
      scanned += run;
      hand = p + run;
      for (size_t i = 0; i < run; ++i) batch[i] = p + i;
      DropChildPages(batch, run);
    }
    if (end > 0 && scanned >= end) swept_missed = missed;
    h->evicting.store(0);
    if (h->resident.load() >= cap && !h->paused.load()) {
      // A whole sweep found nothing more to drop: what it holds, it wrote.
      if (h->resident.load() > cap && !h->warned.exchange(1)) {
        char msg[400];
        std::snprintf(msg, sizeof msg,
                      "tessera: forked child %d has written %.1f MB of its paged heap since "
                      "the fork and goes over its local limit of %.1f MB: pages a forked child "
                      "writes cannot be evicted (docs/guides/what-is-paged.md, \"fork\")\n",
                      static_cast<int>(::getpid()),
                      static_cast<double>(h->dirty.load()) * kPageSize / (1 << 20),
                      static_cast<double>(cap) * kPageSize / (1 << 20));
        RawLog(msg);
      }
      timespec ts{0, 10 * 1000 * 1000};
      Futex(&h->kick, FUTEX_WAIT, h->kick.load(), &ts);
    }
  }
}

void PagerImpl::TakeChildPages(PageId first, size_t n, uint8_t to) {
  ChildShared* h = cshared_;
  int64_t resident = 0, dirty = 0;
  for (size_t i = 0; i < n; ++i) {
    std::atomic<uint8_t>* w = CWord(first + i);
    for (;;) {
      uint8_t v = w->load();
      const uint8_t st = v & kCStateMask;
      if (st == kCUnpaged) break;
      if (st == kCFilling || st == kCDropping || st == kCZapping) {
        sched_yield();  // The monitor's fill or the evictor's drop: brief.
        continue;
      }
      if (!w->compare_exchange_weak(v, to)) continue;
      resident += (st == kCClean || st == kCDirty) ? 1 : 0;
      dirty += st == kCDirty ? 1 : 0;
      break;
    }
  }
  h->resident.fetch_sub(resident);
  h->dirty.fetch_sub(dirty);
}

Status PagerImpl::ChildDiscard(PageId first, size_t n) {
  TakeChildPages(first, n, kCZapping);
  const int rc = ::madvise(Addr(first), n * kPageSize, MADV_DONTNEED);
  const int err = errno;
  // Discarded: reads as zeros from now on (the base is zeros, not the snapshot).
  for (size_t i = 0; i < n; ++i) {
    std::atomic<uint8_t>* w = CWord(first + i);
    if ((w->load() & kCStateMask) == kCZapping) w->store(kCAbsent);
  }
  if (rc != 0) {
    errno = err;
    return ErrnoError("madvise(DONTNEED)");
  }
  return Status::Ok();
}

void PagerImpl::ChildUnpage(PageId first, size_t n) { TakeChildPages(first, n, kCUnpaged); }

Status PagerImpl::ChildPrepareFork() {
  if (!child_paged_) return Status::Ok();
  // The grandchild gets no registration (ChildLoop closes its descriptor): every page it must
  // see is mapped here first, and stays mapped until after the fork.
  ChildShared* h = cshared_;
  h->paused.store(1);
  while (h->evicting.load()) sched_yield();
  const PageId end = std::min<uint64_t>(h->max_page.load(), pages_);
  for (PageId p = 0; p < end; ++p) {
    const uint8_t v = CWord(p)->load();
    if ((v & kCStateMask) == kCAbsent && (v & kCSnap)) {
      (void)*reinterpret_cast<volatile const uint8_t*>(Addr(p));
    }
  }
  return Status::Ok();
}

}  // namespace tessera::kernel_shim::internal
