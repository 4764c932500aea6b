// The state a fork() shares between the parent's pager and the forked child (see "fork" in
// pager.h; fork.cc is the parent's side, fork_child.cc the child's): the snapshot's words, the
// parent's per-page marks, the child's page words and the area both processes map. Internal.
#pragma once

#include <linux/futex.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace tessera::kernel_shim::internal {

// The snapshot a forked child is served from: one word per page (snap_), as of the fork.
constexpr uint64_t kSnapZero = 0;    // No data at the fork: the child gets zeros.
constexpr uint64_t kSnapLocal = 1;   // Only in local memory (its write-back failed): the child
                                     // holds it mapped and never drops it.
constexpr uint64_t kSnapPoison = 2;  // The store could not return it: SIGBUS in the child too.
constexpr uint64_t kSnapId = 3;      // kSnapId + id: the store page holding its bytes.
// Per-page marks (marks_), parent side.
constexpr uint8_t kMarkDiscarded = 1;  // Discarded while a fork was being made (the child reads
                                       // its copy: discarded before the fork means zeros).
constexpr uint8_t kMarkOwed = 2;       // Its store copy was kept for a child instead of trimmed.
// The child's page words (ChildShared, shared memory): the state in the child's address space.
constexpr uint8_t kCAbsent = 0;    // Not mapped in the child; a fault is served from the base.
constexpr uint8_t kCClean = 1;     // Mapped write-protected, the base's bytes: may be dropped.
constexpr uint8_t kCDirty = 2;     // Written by the child (or not droppable): stays mapped.
constexpr uint8_t kCFilling = 3;   // The parent's monitor is mapping it.
constexpr uint8_t kCDropping = 4;  // The child's evictor is dropping it.
constexpr uint8_t kCZapping = 5;   // The child is discarding it.
constexpr uint8_t kCUnpaged = 6;   // The child took it out of paging (plain memory).
constexpr uint8_t kCStateMask = 7;
constexpr uint8_t kCSnap = 8;      // Base: the snapshot (else zeros).
constexpr uint8_t kCPoison = 16;   // Base: poisoned (SIGBUS).

// Shared (MAP_SHARED) between the parent's monitor and one forked child; the page words follow
// the header at kChildWordsOffset.
struct ChildShared {
  std::atomic<uint32_t> ready{0};   // The child has set its words.
  std::atomic<uint32_t> kick{0};    // Futex word: the monitor wakes the child's evictor.
  std::atomic<uint32_t> paused{0};  // The child is forking in turn: its evictor waits.
  std::atomic<uint32_t> evicting{0};
  std::atomic<uint32_t> warned{0};  // The child said once that it could not keep its cap.
  std::atomic<int64_t> resident{0};  // Pages mapped in the child's paged region.
  std::atomic<int64_t> dirty{0};     // Of them, those it may not drop.
  std::atomic<uint64_t> peak_resident{0};
  std::atomic<uint64_t> peak_dirty{0};
  std::atomic<uint64_t> max_page{0};  // One past the highest page the child may have mapped.
  std::atomic<uint64_t> served{0};    // Missing faults the monitor served.
  std::atomic<uint64_t> dropped{0};   // Pages the child's evictor dropped.
  // The parent mapped every page the child may need (it is exiting) and stopped serving: the
  // child serves its remaining faults itself and drops nothing any more.
  std::atomic<uint32_t> detached{0};
  uint64_t cap = 0;                   // The child's resident cap (pages; 0: none).
  uint64_t pages = 0;
  int32_t parent_pid = 0;
  // The pages mapped clean, in the order they were (the evictor's first victims): a ring of
  // ring_size page numbers at ring_offset, one producer (the monitor; ChildInit before it) and
  // one consumer (the child's evictor). Full: a page is not recorded (the sweep finds it).
  std::atomic<uint64_t> ring_head{0};
  std::atomic<uint64_t> ring_tail{0};
  uint64_t ring_offset = 0;
  uint64_t ring_size = 0;
  std::atomic<uint32_t>* Ring() {
    return reinterpret_cast<std::atomic<uint32_t>*>(reinterpret_cast<uint8_t*>(this) + ring_offset);
  }
  std::atomic<uint64_t> ring_missed{0};  // Pages not recorded (the ring was full).
  void Push(uint64_t page) {
    const uint64_t hd = ring_head.load(std::memory_order_relaxed);
    if (hd - ring_tail.load(std::memory_order_acquire) >= ring_size) {
      ring_missed.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    Ring()[hd % ring_size].store(static_cast<uint32_t>(page), std::memory_order_relaxed);
    ring_head.store(hd + 1, std::memory_order_release);
  }
};
constexpr uint64_t kChildRingSize = 65536;
constexpr size_t kChildWordsOffset = 4096;
static_assert(sizeof(ChildShared) <= kChildWordsOffset);

inline void RawLog(const char* s) {
  size_t n = std::strlen(s);
  while (n > 0) {
    ssize_t w = ::write(2, s, n);
    if (w <= 0) return;
    s += w;
    n -= static_cast<size_t>(w);
  }
}

inline long Futex(std::atomic<uint32_t>* w, int op, uint32_t val, const timespec* ts) {
  // Not FUTEX_PRIVATE: the word is shared between the parent and the child.
  return ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(w), op, val, ts, nullptr, 0);
}

inline void KickChild(ChildShared* h) {
  h->kick.fetch_add(1);
  Futex(&h->kick, FUTEX_WAKE, 1, nullptr);
}

inline void RaisePeak(std::atomic<uint64_t>& peak, int64_t v) {
  if (v <= 0) return;
  uint64_t pk = peak.load();
  while (static_cast<uint64_t>(v) > pk && !peak.compare_exchange_weak(pk, v)) {
  }
}

inline void SleepUs(long us) {
  timespec ts{us / 1000000, (us % 1000000) * 1000};
  ::nanosleep(&ts, nullptr);
}

inline constexpr int kForkTimeoutMs = 120000;

// One descriptor passed over a unix socket (SCM_RIGHTS) with a one-byte payload: the parent's
// monitor hands the child its own reference to its userfaultfd.
struct FdMessage {
  char byte = 0;
  iovec iov{&byte, 1};
  alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  FdMessage() {
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = ctl;
    msg.msg_controllen = sizeof ctl;
  }
  FdMessage(const FdMessage&) = delete;
  FdMessage& operator=(const FdMessage&) = delete;
  // Sends fd; false on failure (errno set).
  bool Send(int sock, int fd) {
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
    return ::sendmsg(sock, &msg, MSG_NOSIGNAL | MSG_DONTWAIT) == 1;
  }
  // The descriptor received (close-on-exec), or -1.
  int Receive(int sock) {
    if (::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC) != 1) return -1;
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    if (c == nullptr || c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) return -1;
    int fd = -1;
    std::memcpy(&fd, CMSG_DATA(c), sizeof(int));
    return fd;
  }
};

}  // namespace tessera::kernel_shim::internal
