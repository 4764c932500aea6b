// fork() of a paged process with the real pager and a real fork(): the child is served from the
// store (a snapshot of the pages as of the fork), both processes stay near the local limit, and
// neither ever sees the other's later writes, zeros for data, or stale bytes (pager.h, "fork").
// Over MemoryPageStore (the asynchronous in-memory store double) with spare pages beyond the
// region; pager_integration_test.cc forks over the erasure-coded store on memservers.
#include <gtest/gtest.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <atomic>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "client/testing/memory_page_store.h"
#include "common/clock.h"
#include "kernel_shim/pager/pager.h"
#include "tests/pager/page_patterns.h"

namespace tessera::kernel_shim {
namespace {

using client::testing::MemoryPageStore;
using testing::CheckPage;
using testing::FillPage;
constexpr size_t kPage = 4096;

// Bounded wait, longer than the default: forks on a loaded machine.
bool WaitFor(const std::function<bool()>& cond) { return testing::WaitFor(cond, 20000); }

bool IsZero(const uint8_t* p) {
  for (size_t off = 0; off < kPage; ++off) {
    if (p[off] != 0) return false;
  }
  return true;
}

// A pager over `pages` pages capped at `cap`, on a store with as many spare pages again.
struct Rig {
  explicit Rig(size_t pages, size_t cap, size_t spare = 0, bool inactive_list = false)
      : pages(pages), store(pages + (spare ? spare : pages)) {
    PagerOptions o;
    o.store = &store;
    o.region_bytes = pages * kPage;
    o.local_limit_bytes = cap * kPage;
    o.evict_batch = 16;
    o.inactive_list = inactive_list;
    auto r = Pager::Create(o);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (r.ok()) pager = std::move(r).value();
  }
  uint8_t* Page(size_t p) const { return pager->base() + p * kPage; }
  void FillAll(uint32_t round) {
    for (size_t p = 0; p < pages; ++p) FillPage(Page(p), p, round);
  }
  size_t pages;
  MemoryPageStore store;
  std::unique_ptr<Pager> pager;
};

// One byte through a pipe: the other process may go on.
void Signal(int fd) {
  char c = 1;
  ASSERT_EQ(::write(fd, &c, 1), 1);
}
bool Await(int fd) {
  char c;
  return ::read(fd, &c, 1) == 1;
}

// Forks with the pager's protocol; the child runs `child` and exits with its result (0: good).
pid_t Fork(Pager* pager, const std::function<int()>& child) {
  EXPECT_TRUE(pager->PrepareFork().ok());
  const pid_t pid = ::fork();
  if (pid == 0) {
    pager->ChildAfterFork();
    ::_exit(child());
  }
  pager->ParentAfterFork(pid);
  return pid;
}

int Reap(pid_t pid) {
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// The pages the snapshot kept beyond the region are trimmed once the child is gone.
bool SparePagesFreed(const Rig& rig) {
  for (size_t q = rig.pages; q < rig.store.capacity_pages(); ++q) {
    if (!IsZero(rig.store.Page(q).data())) return false;
  }
  return true;
}

// With the inactive list, its pages are moved back into the region before the fork (the child
// finds a page's bytes mapped or in the store only), and the fork shares pages all the same.
void ChildIsServedFromTheStore(bool inactive_list) {
  constexpr size_t kPages = 1024, kCap = 64;
  Rig rig(kPages, kCap, 0, inactive_list);
  ASSERT_TRUE(rig.pager);
  rig.FillAll(1);
  ASSERT_TRUE(WaitFor([&] { return rig.pager->Stats().resident_pages <= kCap; }));
  if (inactive_list) {
    ASSERT_GT(rig.pager->Stats().staged_pages, 0u);
  }
  int to_child[2], from_child[2];
  ASSERT_EQ(::pipe(to_child), 0);
  ASSERT_EQ(::pipe(from_child), 0);
  const pid_t pid = Fork(rig.pager.get(), [&] {
    if (!Await(to_child[0])) return 10;
    // The parent rewrote every page (and wrote them back) meanwhile: the child still reads the
    // bytes of the fork, twice (its evictor dropped most of them in between).
    for (int pass = 0; pass < 2; ++pass) {
      for (size_t p = 0; p < kPages; ++p) {
        if (!CheckPage(rig.Page(p), p, 1)) return 20 + pass;
      }
    }
    // Its own writes stay its own; what it discards reads as zeros.
    for (size_t p = 0; p < 16; ++p) FillPage(rig.Page(p), p, 7);
    if (!rig.pager->Discard(rig.Page(16), 16 * kPage).ok()) return 30;
    for (size_t p = 0; p < kPages; ++p) {
      if (p < 16 && !CheckPage(rig.Page(p), p, 7)) return 31;
      if (p >= 16 && p < 32 && !IsZero(rig.Page(p))) return 32;
      if (p >= 32 && !CheckPage(rig.Page(p), p, 1)) return 33;
    }
    return 0;
  });
  ASSERT_GT(pid, 0);
  rig.FillAll(2);
  ASSERT_TRUE(WaitFor([&] { return rig.pager->Stats().resident_pages <= kCap; }));
  Signal(to_child[1]);
  EXPECT_EQ(Reap(pid), 0) << "the child saw wrong bytes (its exit code says where)";
  for (size_t p = 0; p < kPages; ++p) ASSERT_TRUE(CheckPage(rig.Page(p), p, 2)) << p;
  const PagerStats s = rig.pager->Stats();
  EXPECT_EQ(s.fork_snapshots, 1u);
  EXPECT_EQ(s.fork_fallbacks, 0u);
  EXPECT_EQ(s.fill_errors, 0u);
  // The parent wrote back pages the child still read: their old bytes were copied aside.
  EXPECT_GT(s.fork_preserved, 0u);
  EXPECT_EQ(s.fork_pinned, 0u);
  // The child read its whole heap through the monitor, within its cap (plus the monitor's
  // bounded wait for its evictor); the parent never paged the heap in.
  EXPECT_GE(s.fork_child_faults, kPages);
  EXPECT_GT(s.fork_child_dropped, kPages);
  EXPECT_EQ(s.fork_child_limit_pages, kCap);
  EXPECT_LE(s.fork_child_peak_resident_pages, kCap + kCap / 4) << "the child went over its cap";
  EXPECT_LE(s.peak_resident_pages, 2 * kCap) << "the parent paged its heap in for the fork";
  EXPECT_TRUE(WaitFor([&] { return SparePagesFreed(rig); })) << "spare store pages not trimmed";
  // A second fork shares pages again (the first child's snapshot is gone).
  const pid_t again = Fork(rig.pager.get(), [&] {
    for (size_t p = 0; p < kPages; ++p) {
      if (!CheckPage(rig.Page(p), p, 2)) return 1;
    }
    return 0;
  });
  EXPECT_EQ(Reap(again), 0);
  EXPECT_EQ(rig.pager->Stats().fork_snapshots, 2u);
  if (inactive_list) {
    // The list went on after the forks: pages staged again, and written back from it.
    EXPECT_GT(rig.pager->Stats().deactivated, kPages);
    EXPECT_GT(rig.pager->Stats().inactive_drops, 0u);
  }
}

TEST(PagerForkTest, ChildIsServedFromTheStoreAndBothStayNearTheLimit) {
  ChildIsServedFromTheStore(false);
}

TEST(PagerForkTest, ChildIsServedFromTheStoreWithTheInactiveList) {
  ChildIsServedFromTheStore(true);
}

TEST(PagerForkTest, ParentDiscardsKeepTheChildsPagesUntilItExits) {
  constexpr size_t kPages = 512, kCap = 32;
  Rig rig(kPages, kCap);
  ASSERT_TRUE(rig.pager);
  rig.FillAll(3);
  ASSERT_TRUE(WaitFor([&] { return rig.pager->Stats().resident_pages <= kCap; }));
  int to_child[2];
  ASSERT_EQ(::pipe(to_child), 0);
  const pid_t pid = Fork(rig.pager.get(), [&] {
    if (!Await(to_child[0])) return 10;
    for (size_t p = 0; p < kPages; ++p) {
      if (!CheckPage(rig.Page(p), p, 3)) return 11;
    }
    return 0;
  });
  // The parent frees its whole heap (jemalloc purging, munmap): the store pages stay for the
  // child, and the parent reads zeros.
  ASSERT_TRUE(rig.pager->Discard(rig.Page(0), kPages * kPage).ok());
  for (size_t p = 0; p < kPages; ++p) ASSERT_TRUE(IsZero(rig.Page(p))) << p;
  Signal(to_child[1]);
  EXPECT_EQ(Reap(pid), 0);
  // Once the child is gone the trims held back for it are made.
  EXPECT_TRUE(WaitFor([&] {
    for (size_t q = 0; q < rig.store.capacity_pages(); ++q) {
      if (!IsZero(rig.store.Page(q).data())) return false;
    }
    return true;
  })) << "store pages of discarded pages not trimmed after the child exited: " << [&] {
    std::string bad;
    for (size_t q = 0; q < rig.store.capacity_pages(); ++q) {
      if (!IsZero(rig.store.Page(q).data())) bad += std::to_string(q) + " ";
    }
    return bad;
  }();
}

TEST(PagerForkTest, ChildThatWritesMoreThanItsCapKeepsEveryByte) {
  constexpr size_t kPages = 512, kCap = 32;
  Rig rig(kPages, kCap);
  ASSERT_TRUE(rig.pager);
  rig.FillAll(4);
  ASSERT_TRUE(WaitFor([&] { return rig.pager->Stats().resident_pages <= kCap; }));
  const pid_t pid = Fork(rig.pager.get(), [&] {
    // Pages a child writes cannot be evicted: it goes over its cap (and says so), correctly.
    for (size_t p = 0; p < kPages; ++p) {
      if (!CheckPage(rig.Page(p), p, 4)) return 1;
      FillPage(rig.Page(p), p, 5);
    }
    for (size_t p = 0; p < kPages; ++p) {
      if (!CheckPage(rig.Page(p), p, 5)) return 2;
    }
    return 0;
  });
  EXPECT_EQ(Reap(pid), 0);
  for (size_t p = 0; p < kPages; ++p) ASSERT_TRUE(CheckPage(rig.Page(p), p, 4)) << p;
  EXPECT_GE(rig.pager->Stats().fork_child_peak_dirty_pages, kPages);
}

TEST(PagerForkTest, ForkedChildForksAgain) {
  constexpr size_t kPages = 512, kCap = 32;
  Rig rig(kPages, kCap);
  ASSERT_TRUE(rig.pager);
  rig.FillAll(6);
  ASSERT_TRUE(WaitFor([&] { return rig.pager->Stats().resident_pages <= kCap; }));
  Pager* pager = rig.pager.get();
  const pid_t pid = Fork(pager, [&] {
    // The child pages its heap in and the grandchild gets it as plain memory.
    const pid_t g = Fork(pager, [&] {
      for (size_t p = 0; p < kPages; ++p) {
        if (!CheckPage(rig.Page(p), p, 6)) return 1;
      }
      for (size_t p = 0; p < kPages; ++p) FillPage(rig.Page(p), p, 8);
      return 0;
    });
    if (g < 0 || Reap(g) != 0) return 2;
    for (size_t p = 0; p < kPages; ++p) {
      if (!CheckPage(rig.Page(p), p, 6)) return 3;
    }
    return 0;
  });
  EXPECT_EQ(Reap(pid), 0);
  for (size_t p = 0; p < kPages; ++p) ASSERT_TRUE(CheckPage(rig.Page(p), p, 6)) << p;
}

// Threads of the parent keep writing and freeing pages while it forks: the child must see
// exactly the parent's memory at the fork. Each page holds (page, version) in every word, or
// zeros once discarded; a plain-memory mirror says which, and `busy` names the one page a
// writer may be in the middle of (the child cannot know how far it got).
TEST(PagerForkTest, ForkRacingWithWritesAndDiscards) {
  constexpr size_t kPages = 1024, kCap = 64;
  Rig rig(kPages, kCap);
  ASSERT_TRUE(rig.pager);
  std::vector<std::atomic<uint64_t>> versions(kPages);
  std::atomic<int64_t> busy{-1};
  auto write_page = [&](size_t p, uint64_t v) {
    auto* w = reinterpret_cast<uint64_t*>(rig.Page(p));
    for (size_t i = 0; i < kPage / 8; ++i) w[i] = (uint64_t{p} << 40) | v;
  };
  for (size_t p = 0; p < kPages; ++p) {
    write_page(p, 1);
    versions[p].store(1);
  }
  ASSERT_TRUE(WaitFor([&] { return rig.pager->Stats().resident_pages <= kCap; }));
  std::atomic<bool> stop{false}, failed{false};
  std::mutex mu;  // One writer at a time.
  auto churn = [&](uint64_t x) {
    while (!stop.load()) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      const size_t p = (x >> 33) % kPages;
      std::lock_guard<std::mutex> l(mu);
      busy.store(static_cast<int64_t>(p));
      if ((x >> 20) % 8 == 0) {
        if (!rig.pager->Discard(rig.Page(p), kPage).ok()) failed.store(true);
        versions[p].store(0);
      } else {
        const uint64_t v = versions[p].load() + 1;
        write_page(p, v);
        versions[p].store(v);
      }
      busy.store(-1);
    }
  };
  std::thread t1(churn, 1), t2(churn, 2);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  for (int round = 0; round < 4; ++round) {
    const pid_t pid = Fork(rig.pager.get(), [&] {
      const int64_t skip = busy.load();
      for (size_t p = 0; p < kPages; ++p) {
        if (static_cast<int64_t>(p) == skip) continue;
        const uint64_t v = versions[p].load();
        const auto* w = reinterpret_cast<const uint64_t*>(rig.Page(p));
        const uint64_t want = v == 0 ? 0 : ((uint64_t{p} << 40) | v);
        for (size_t i = 0; i < kPage / 8; ++i) {
          if (w[i] != want) {
            fprintf(stderr, "child: page %zu word %zu is %llx, the parent had %llx (busy page %lld)\n", p, i,
                    (unsigned long long)w[i], (unsigned long long)want, (long long)skip);
            return v == 0 ? 1 : (w[i] == 0 ? 2 : 3);
          }
        }
      }
      return 0;
    });
    EXPECT_EQ(Reap(pid), 0) << "round " << round << ": 1 data for a discarded page, 2 zeros "
                            << "for data, 3 other bytes than the parent's at the fork";
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  stop.store(true);
  t1.join();
  t2.join();
  EXPECT_FALSE(failed.load());
  EXPECT_EQ(rig.pager->Stats().fork_snapshots, 4u);
  EXPECT_EQ(rig.pager->Stats().fill_errors, 0u);
}

// fork() of a multithreaded paged process while another thread faults. fork() waits in the
// kernel until the pager reads its UFFD_EVENT_FORK, and the C library holds its allocator's
// locks around the copy; a fault thread that allocates while serving another thread's fault in
// that moment would block until fork() returns, so fork() would wait forever (the whole process
// stuck in the kernel). The store below allocates in a loop in Submit until fork() has returned,
// for a read submitted from inside fork() (a fork handler makes a thread fault on a stored page
// and waits until its read reaches the store), so the serving thread is sure to allocate while
// the locks are held. The scenario runs in a subprocess, so that a deadlock is a bounded wait.
std::atomic<bool> g_gate_armed{false}, g_gate_entered{false}, g_fork_returned{false};
std::atomic<int> g_touch_request{0};

class AllocatingStore final : public client::PageStore {
 public:
  explicit AllocatingStore(uint64_t pages) : inner_(pages) {}
  std::string name() const override { return "allocating"; }
  uint64_t capacity_pages() const override { return inner_.capacity_pages(); }
  double memory_overhead() const override { return 1.0; }
  Status Submit(std::span<client::PageOp* const> ops) override {
    bool read = false;
    for (const client::PageOp* op : ops) read |= op != nullptr && op->kind == client::PageOp::Kind::kRead;
    if (read && g_gate_armed.exchange(false)) {
      g_gate_entered.store(true);
      const Deadline give_up = Deadline::AfterMs(30000);
      while (!g_fork_returned.load() && !give_up.Expired()) {
        void* volatile p = ::malloc(512);
        ::free(p);
        sched_yield();
      }
    }
    return inner_.Submit(ops);
  }
  Status Trim(client::PageId first, uint64_t count) override { return inner_.Trim(first, count); }
  Status Flush() override { return inner_.Flush(); }
  client::PageStoreStats Stats() const override { return inner_.Stats(); }

 private:
  MemoryPageStore inner_;
};

void ForkPrepare() {
  if (g_touch_request.load() != 1) return;
  g_gate_armed.store(true);
  g_touch_request.store(2);  // The toucher thread faults now.
  const Deadline d = Deadline::AfterMs(20000);
  while (!g_gate_entered.load() && !d.Expired()) sched_yield();
}
void ForkParent() { g_fork_returned.store(true); }

// Exit codes of the subprocess.
enum : int { kScenarioOk = 0, kNoPager = 10, kNoStoredPage, kReadNotSubmitted, kForkFailed,
             kChildFailed, kWrongBytes, kNotThroughWindow };

int ForkWhileServingScenario() {
  constexpr size_t kPages = 256, kCap = 32;
  AllocatingStore store(2 * kPages);
  PagerOptions o;
  o.store = &store;
  o.region_bytes = kPages * kPage;
  o.local_limit_bytes = kCap * kPage;
  o.evict_batch = 16;
  o.fault_threads = 1;  // One reader: nobody else could read the fork event.
  o.prefetch = false;
  auto r = Pager::Create(o);
  if (!r.ok()) return kNoPager;
  std::unique_ptr<Pager> pager = std::move(r).value();
  auto page = [&](size_t p) { return pager->base() + p * kPage; };
  for (size_t p = 0; p < kPages; ++p) FillPage(page(p), p, 1);
  if (!testing::WaitFor([&] { return pager->Stats().resident_pages <= kCap; }, 20000)) {
    return kNoStoredPage;
  }
  // A page only the store holds (mincore: not mapped), so that touching it reads the store.
  size_t target = kPages;
  std::vector<unsigned char> vec(kPages);
  if (::mincore(pager->base(), kPages * kPage, vec.data()) != 0) return kNoStoredPage;
  for (size_t p = 0; p < kPages && target == kPages; ++p) {
    if (!(vec[p] & 1)) target = p;
  }
  if (target == kPages) return kNoStoredPage;
  std::atomic<bool> toucher_ok{false};
  std::thread toucher([&] {
    const Deadline d = Deadline::AfterMs(30000);
    while (g_touch_request.load() != 2 && !d.Expired()) sched_yield();
    toucher_ok.store(CheckPage(page(target), target, 1));
  });
  ::pthread_atfork(ForkPrepare, ForkParent, nullptr);
  g_touch_request.store(1);
  if (!pager->PrepareFork().ok()) return kForkFailed;
  const pid_t pid = ::fork();
  if (pid == 0) {
    pager->ChildAfterFork();
    ::_exit(CheckPage(page(target), target, 1) ? 0 : 1);
  }
  pager->ParentAfterFork(pid);
  toucher.join();
  if (pid < 0) return kForkFailed;
  if (!g_gate_entered.load()) return kReadNotSubmitted;
  if (Reap(pid) != 0) return kChildFailed;
  if (!toucher_ok.load()) return kWrongBytes;
  if (pager->Stats().fork_window_faults == 0) return kNotThroughWindow;
  return kScenarioOk;
}

TEST(PagerForkTest, ForkWhileAFaultThreadWouldAllocateDoesNotDeadlock) {
  // A deadlocked fork() never returns (the process sits in the kernel): -1 after the bound.
  const int rc = testing::RunInChild(ForkWhileServingScenario, 60000);
  ASSERT_NE(rc, -1) << "fork() in a paged process deadlocked: its UFFD_EVENT_FORK was never "
                       "read while a fault thread served another thread's fault";
  EXPECT_EQ(rc, kScenarioOk)
      << "10 no pager, 11 no stored page, 12 the read never reached the store, 13 fork "
         "failed, 14 the child read wrong bytes, 15 the faulting thread read wrong bytes, 16 "
         "the fault was not served through the fork window";
}

// The paging parent goes away while its child still shares pages. A "middle" process (forked
// from the test, so that the test can kill it) owns the pager and forks the child; the child
// reports through a pipe, since its parent is gone when it reads its heap.
sigjmp_buf g_jmp;
void OnSigbus(int) { siglongjmp(g_jmp, 1); }

// The child's verdict on its heap once its parent is gone: pages right, pages that raised
// SIGBUS, pages wrong (zeros or other bytes).
struct Verdict {
  uint32_t right = 0, sigbus = 0, wrong = 0;
};

void OrphanedChild(bool kill_parent) {
  constexpr size_t kPages = 512, kCap = 32;
  int result[2], child_ready[2], parent_go[2];
  ASSERT_EQ(::pipe(result), 0);
  ASSERT_EQ(::pipe(child_ready), 0);
  ASSERT_EQ(::pipe(parent_go), 0);
  const pid_t middle = ::fork();
  ASSERT_GE(middle, 0);
  if (middle == 0) {
    Rig rig(kPages, kCap);
    if (!rig.pager) ::_exit(2);
    rig.FillAll(9);
    if (!WaitFor([&] { return rig.pager->Stats().resident_pages <= kCap; })) ::_exit(3);
    const pid_t child = Fork(rig.pager.get(), [&] {
      const pid_t parent = ::getppid();
      // Map a few pages while the parent serves, then let it go away.
      for (size_t p = 0; p < 8; ++p) (void)*reinterpret_cast<volatile uint8_t*>(rig.Page(p));
      Signal(child_ready[1]);
      while (::getppid() == parent) ::usleep(1000);
      Verdict v;
      struct sigaction sa {}, old{};
      sa.sa_handler = OnSigbus;
      sigaction(SIGBUS, &sa, &old);
      for (size_t p = 0; p < kPages; ++p) {
        if (sigsetjmp(g_jmp, 1) == 0) {
          if (CheckPage(rig.Page(p), p, 9)) ++v.right;
          else ++v.wrong;
        } else {
          ++v.sigbus;
        }
      }
      (void)!::write(result[1], &v, sizeof v);
      return 0;
    });
    if (child <= 0) ::_exit(4);
    if (!Await(child_ready[0])) ::_exit(5);
    if (kill_parent) {
      Signal(parent_go[1]);
      ::pause();  // SIGKILLed by the test: no hand-off.
    }
    rig.pager.reset();  // Exiting normally: the child gets every page first.
    ::_exit(0);
  }
  if (kill_parent) {
    ASSERT_TRUE(Await(parent_go[0]));
    ::kill(middle, SIGKILL);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(middle, &status, 0), middle);
  if (!kill_parent) {
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  }
  Verdict v;
  ASSERT_EQ(::read(result[0], &v, sizeof v), static_cast<ssize_t>(sizeof v));
  EXPECT_EQ(v.wrong, 0u) << "the orphaned child read zeros or other bytes";
  if (kill_parent) {
    // What it had mapped it keeps (about its cap's worth); the rest only the store had: SIGBUS.
    EXPECT_GT(v.right, 0u);
    EXPECT_GT(v.sigbus, 0u);
  } else {
    EXPECT_EQ(v.right, kPages);
    EXPECT_EQ(v.sigbus, 0u);
  }
}

TEST(PagerForkTest, ParentExitingHandsTheChildItsPages) { OrphanedChild(false); }

TEST(PagerForkTest, ParentKilledLeavesTheChildSigbusNeverZeros) { OrphanedChild(true); }

}  // namespace
}  // namespace tessera::kernel_shim
