// tessera-preload-probe: a small program the interposer tests run under `tessera run`.
// Each mode exercises one thing the LD_PRELOAD shim must get right and exits 0 only when every
// check passed (it prints what failed otherwise). Sizes are chosen so that, at a few MB of
// local memory, most of the data really goes to the memservers and comes back.
//   region           print "paged" or "unpaged" (whether the shim's region is active)
//   threads N MB     N threads malloc/realloc/free with per-block patterns, MB each in flight;
//                    they hold their last blocks while a 32 MB ballast pushes them out
//   mmap             private anonymous mmap/munmap/mremap/madvise semantics on paged memory
//   fork MB          fill MB of heap, fork without exec, the child verifies every byte
//   exec             fork+exec, system() and posix_spawn of `region`: children are paged too
//   signal           handlers run on program threads and may touch paged memory
//   runtime MB       what managed runtimes do: a PROT_NONE reservation committed with mprotect
//                    and MAP_FIXED, decommitted with MAP_FIXED PROT_NONE, protections taken
//                    away and given back, partial madvise, mremap growth, mlock, a shared
//                    mapping placed over the reservation; MB of data paged out and back
//   exit CODE        exit with CODE after touching some heap
//   raise SIG        kill itself with signal SIG
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <latch>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace {

int g_failures = 0;
#define CHECK_OR_FAIL(cond, ...)                        \
  do {                                                  \
    if (!(cond)) {                                      \
      std::fprintf(stderr, "probe: FAILED %s: ", #cond); \
      std::fprintf(stderr, __VA_ARGS__);                \
      std::fprintf(stderr, "\n");                       \
      ++g_failures;                                     \
    }                                                   \
  } while (0)

using RegionFn = bool (*)(void**, size_t*);

bool Region(uintptr_t* base, size_t* size) {
  auto fn = reinterpret_cast<RegionFn>(dlsym(RTLD_DEFAULT, "tessera_preload_region"));
  void* b = nullptr;
  if (fn == nullptr || !fn(&b, size)) return false;
  *base = reinterpret_cast<uintptr_t>(b);
  return true;
}

bool Paged(const void* p) {
  uintptr_t base;
  size_t size;
  if (!Region(&base, &size)) return false;
  auto a = reinterpret_cast<uintptr_t>(p);
  return a >= base && a < base + size;
}

uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

void Fill(uint8_t* p, size_t n, uint64_t seed) {
  for (size_t i = 0; i < n; i += 8) {
    uint64_t v = Mix(seed + i);
    std::memcpy(p + i, &v, n - i < 8 ? n - i : 8);
  }
}
bool Check(const uint8_t* p, size_t n, uint64_t seed) {
  for (size_t i = 0; i < n; i += 8) {
    uint64_t v = Mix(seed + i);
    if (std::memcmp(p + i, &v, n - i < 8 ? n - i : 8) != 0) return false;
  }
  return true;
}

int ModeThreads(int threads, int mb) {
  std::atomic<int> bad{0}, unpaged{0};
  std::latch held(threads), ballast_done(1);
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      struct Block {
        uint8_t* p;
        size_t n;
        uint64_t seed;
      };
      std::vector<Block> blocks;
      size_t live = 0;
      const size_t budget = static_cast<size_t>(mb) << 20;
      uint64_t rng = Mix(static_cast<uint64_t>(t) + 1);
      for (int i = 0; i < 4000; ++i) {
        rng = Mix(rng);
        const int op = static_cast<int>(rng % 10);
        if (op < 6 || blocks.empty()) {
          size_t n = 16 + (Mix(rng + 1) % (rng % 7 == 0 ? (1 << 20) : 4096));
          auto* p = static_cast<uint8_t*>(op == 0 ? calloc(1, n) : malloc(n));
          if (op == 0) {
            for (size_t k = 0; k < n; ++k) {
              if (p[k] != 0) {
                bad++;
                break;
              }
            }
          }
          if (!Paged(p)) unpaged++;
          Fill(p, n, rng);
          blocks.push_back({p, n, rng});
          live += n;
        } else if (op < 8) {
          size_t idx = rng % blocks.size();
          Block& b = blocks[idx];
          if (!Check(b.p, b.n, b.seed)) bad++;
          size_t n = b.n * 2 + 100;  // realloc growth keeps the old bytes
          auto* p = static_cast<uint8_t*>(realloc(b.p, n));
          if (!Check(p, b.n, b.seed)) bad++;
          Fill(p, n, rng);
          live += n - b.n;
          b = {p, n, rng};
        } else {
          size_t idx = rng % blocks.size();
          if (!Check(blocks[idx].p, blocks[idx].n, blocks[idx].seed)) bad++;
          live -= blocks[idx].n;
          free(blocks[idx].p);
          blocks[idx] = blocks.back();
          blocks.pop_back();
        }
        while (live > budget && !blocks.empty()) {
          if (!Check(blocks.front().p, blocks.front().n, blocks.front().seed)) bad++;
          live -= blocks.front().n;
          free(blocks.front().p);
          blocks.erase(blocks.begin());
        }
      }
      // Hold the blocks until the ballast below has pushed them out, then read them back.
      held.count_down();
      ballast_done.wait();
      for (auto& b : blocks) {
        if (!Check(b.p, b.n, b.seed)) bad++;
        free(b.p);
      }
    });
  }
  // How much of the threads' data is live at once depends on how they interleave; whether it
  // fits a cap must not. Once every thread holds its last blocks, a ballast of kBallastMb (more
  // than the tests' cap) is written: the older blocks go to the store, and the threads then
  // read every byte of them back.
  constexpr size_t kBallastMb = 32;
  held.wait();
  auto* ballast = static_cast<uint8_t*>(malloc(kBallastMb << 20));
  CHECK_OR_FAIL(ballast != nullptr && Paged(ballast), "the ballast is not in the paged region");
  if (ballast != nullptr) Fill(ballast, kBallastMb << 20, 0xba11a57);
  ballast_done.count_down();
  for (auto& t : ts) t.join();
  if (ballast != nullptr) {
    CHECK_OR_FAIL(Check(ballast, kBallastMb << 20, 0xba11a57), "the ballast had wrong bytes");
    free(ballast);
  }
  CHECK_OR_FAIL(bad == 0, "%d blocks had wrong bytes", bad.load());
  CHECK_OR_FAIL(unpaged == 0, "%d blocks were not in the paged region", unpaged.load());
  // Aligned allocation family.
  void* a = nullptr;
  CHECK_OR_FAIL(posix_memalign(&a, 4096, 10000) == 0 && reinterpret_cast<uintptr_t>(a) % 4096 == 0,
                "posix_memalign");
  free(a);
  a = aligned_alloc(64, 640);
  CHECK_OR_FAIL(a != nullptr && reinterpret_cast<uintptr_t>(a) % 64 == 0, "aligned_alloc");
  free(a);
  a = valloc(100);
  CHECK_OR_FAIL(a != nullptr && reinterpret_cast<uintptr_t>(a) % 4096 == 0, "valloc");
  free(a);
  auto* s = new std::string(100000, 'x');
  CHECK_OR_FAIL(Paged(s->data()), "operator new is not paged");
  delete s;
  return g_failures == 0 ? 0 : 1;
}

int ModeMmap() {
  const size_t page = 4096, n = 64 * page;
  auto* p = static_cast<uint8_t*>(
      mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  CHECK_OR_FAIL(p != MAP_FAILED && Paged(p), "anonymous mmap not in the region");
  bool zero = true;
  for (size_t i = 0; i < n; ++i) zero &= p[i] == 0;
  CHECK_OR_FAIL(zero, "fresh mapping is not zero");
  Fill(p, n, 7);
  // madvise(DONTNEED) reads back as zeros; the rest is kept.
  CHECK_OR_FAIL(madvise(p + 4 * page, 4 * page, MADV_DONTNEED) == 0, "madvise");
  zero = true;
  for (size_t i = 4 * page; i < 8 * page; ++i) zero &= p[i] == 0;
  CHECK_OR_FAIL(zero, "MADV_DONTNEED range is not zero");
  CHECK_OR_FAIL(Check(p, 4 * page, 7), "bytes before the discarded range changed");
  CHECK_OR_FAIL(Check(p + 8 * page, n - 8 * page, 7 + 8 * page), "bytes after it changed");
  // munmap of the middle; the tail keeps its data.
  CHECK_OR_FAIL(munmap(p + 16 * page, 16 * page) == 0, "munmap middle");
  CHECK_OR_FAIL(Check(p + 32 * page, 32 * page, 7 + 32 * page), "tail after partial munmap");
  // A new mapping may reuse the hole and must read zeros.
  auto* q = static_cast<uint8_t*>(
      mmap(nullptr, 16 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  zero = true;
  for (size_t i = 0; i < 16 * page; ++i) zero &= q[i] == 0;
  CHECK_OR_FAIL(zero, "reused range is not zero");
  // mremap: grow (in place or moved) keeps the bytes; new part is zero.
  auto* r = static_cast<uint8_t*>(mmap(nullptr, 8 * page, PROT_READ | PROT_WRITE,
                                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  Fill(r, 8 * page, 99);
  auto* r2 = static_cast<uint8_t*>(mremap(r, 8 * page, 1024 * page, MREMAP_MAYMOVE));
  CHECK_OR_FAIL(r2 != MAP_FAILED && Paged(r2), "mremap grow");
  CHECK_OR_FAIL(Check(r2, 8 * page, 99), "mremap grow lost bytes");
  zero = true;
  for (size_t i = 8 * page; i < 1024 * page; i += 512) zero &= r2[i] == 0;
  CHECK_OR_FAIL(zero, "mremap grown part is not zero");
  auto* r3 = static_cast<uint8_t*>(mremap(r2, 1024 * page, 4 * page, 0));
  CHECK_OR_FAIL(r3 == r2 && Check(r3, 4 * page, 99), "mremap shrink");
  CHECK_OR_FAIL(munmap(r3, 4 * page) == 0 && munmap(q, 16 * page) == 0, "munmap");
  CHECK_OR_FAIL(munmap(p, 16 * page) == 0 && munmap(p + 32 * page, 32 * page) == 0, "munmap rest");
  // A shared or fixed mapping is left to the kernel.
  auto* sh = mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  CHECK_OR_FAIL(sh != MAP_FAILED && !Paged(sh), "shared mapping went to the region");
  munmap(sh, page);
  // A big mapping at a low local limit: written, then read back (through the store).
  const size_t big = 48u << 20;
  auto* b = static_cast<uint8_t*>(
      mmap(nullptr, big, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  Fill(b, big, 1234);
  CHECK_OR_FAIL(Check(b, big, 1234), "48 MB mapping read back wrong");
  munmap(b, big);
  return g_failures == 0 ? 0 : 1;
}

int ModeFork(int mb) {
  const size_t n = static_cast<size_t>(mb) << 20;
  auto* p = static_cast<uint8_t*>(malloc(n));
  Fill(p, n, 42);
  CHECK_OR_FAIL(Paged(p), "heap not paged");
  pid_t pid = fork();
  if (pid < 0) {
    std::perror("probe: fork");
    return 1;
  }
  if (pid == 0) {
    // The child: a private copy, every byte as the parent wrote it; it may write and allocate.
    bool ok = Check(p, n, 42);
    Fill(p, n / 2, 43);
    auto* q = static_cast<uint8_t*>(malloc(1 << 20));
    Fill(q, 1 << 20, 44);
    ok = ok && Check(q, 1 << 20, 44) && Check(p, n / 2, 43);
    free(q);
    _exit(ok ? 0 : 3);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  CHECK_OR_FAIL(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child saw wrong bytes (status %d)", st);
  CHECK_OR_FAIL(Check(p, n, 42), "parent's bytes changed by the child");
  free(p);
  return g_failures == 0 ? 0 : 1;
}

int ModeExec(const char* self) {
  std::vector<char*> big;
  for (int i = 0; i < 16; ++i) {
    big.push_back(static_cast<char*>(malloc(1 << 20)));
    std::memset(big.back(), i, 1 << 20);
  }
  // fork + exec
  int pipefd[2];
  CHECK_OR_FAIL(pipe(pipefd) == 0, "pipe");
  pid_t pid = fork();
  if (pid == 0) {
    dup2(pipefd[1], 1);
    execl(self, self, "region", static_cast<char*>(nullptr));
    _exit(127);
  }
  close(pipefd[1]);
  char buf[64] = {};
  ssize_t got = read(pipefd[0], buf, sizeof(buf) - 1);
  close(pipefd[0]);
  int st = 0;
  waitpid(pid, &st, 0);
  CHECK_OR_FAIL(got > 0 && std::strncmp(buf, "paged", 5) == 0, "exec'ed child said '%s'", buf);
  // system() and posix_spawn (vfork-style clone sharing our paged memory until exec)
  std::string cmd = std::string(self) + " region >/dev/null";
  CHECK_OR_FAIL(system(cmd.c_str()) == 0, "system()");
  pid_t sp;
  char* argv[] = {const_cast<char*>(self), const_cast<char*>("exit"), const_cast<char*>("7"),
                  nullptr};
  CHECK_OR_FAIL(posix_spawn(&sp, self, nullptr, nullptr, argv, environ) == 0, "posix_spawn");
  waitpid(sp, &st, 0);
  CHECK_OR_FAIL(WIFEXITED(st) && WEXITSTATUS(st) == 7, "posix_spawn child status %d", st);
  for (int i = 0; i < 16; ++i) {
    bool ok = true;
    for (int k = 0; k < (1 << 20); k += 4096) ok &= big[i][k] == static_cast<char>(i);
    CHECK_OR_FAIL(ok, "heap block %d changed", i);
    free(big[i]);
  }
  // The shim stays in LD_PRELOAD, so what this program execs is paged too.
  const char* pre = getenv("LD_PRELOAD");
  CHECK_OR_FAIL(pre != nullptr && std::strstr(pre, "tessera") != nullptr,
                "LD_PRELOAD lost the shim: %s", pre == nullptr ? "(unset)" : pre);
  return g_failures == 0 ? 0 : 1;
}

bool IsZero(const uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (p[i] != 0) return false;
  }
  return true;
}

int ModeRuntime(int mb) {
  const size_t half = static_cast<size_t>(mb) << 20, kPg = 4096;
  // A reservation of 2 x MB, nothing accessible yet (a JVM's heap, V8's cage).
  auto* r = static_cast<uint8_t*>(
      mmap(nullptr, 2 * half, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));
  CHECK_OR_FAIL(r != MAP_FAILED, "reserve");
  if (r == MAP_FAILED) return 1;
  CHECK_OR_FAIL(Paged(r), "the reservation is not in the paged region");
  // Commit the first half with mprotect, the second with MAP_FIXED.
  CHECK_OR_FAIL(mprotect(r, half, PROT_READ | PROT_WRITE) == 0, "mprotect commit");
  void* fixed =
      mmap(r + half, half, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
  CHECK_OR_FAIL(fixed == r + half, "MAP_FIXED commit");
  CHECK_OR_FAIL(IsZero(r, 2 * half), "committed memory is not zero");
  Fill(r, 2 * half, 11);
  // More data than the local memory, so most of the reservation goes remote.
  std::vector<uint8_t*> extra;
  for (int i = 0; i < mb; ++i) {
    extra.push_back(static_cast<uint8_t*>(malloc(1 << 20)));
    Fill(extra.back(), 1 << 20, 100 + i);
  }
  CHECK_OR_FAIL(Check(r, 2 * half, 11), "reservation data after paging");
  // Take access away (the data must survive) and give it back.
  CHECK_OR_FAIL(mprotect(r, 64 * kPg, PROT_NONE) == 0, "mprotect NONE");
  for (int i = 0; i < mb; ++i) CHECK_OR_FAIL(Check(extra[i], 1 << 20, 100 + i), "extra %d", i);
  CHECK_OR_FAIL(mprotect(r, 64 * kPg, PROT_READ) == 0, "mprotect READ");
  CHECK_OR_FAIL(Check(r, 64 * kPg, 11), "data after PROT_NONE and back");
  CHECK_OR_FAIL(mprotect(r, 64 * kPg, PROT_READ | PROT_WRITE) == 0, "mprotect RW");
  // Decommit a part the JVM way, then commit it again: zeros.
  CHECK_OR_FAIL(
      mmap(r + 128 * kPg, 32 * kPg, PROT_NONE,
           MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0) == r + 128 * kPg,
      "decommit");
  CHECK_OR_FAIL(mprotect(r + 128 * kPg, 32 * kPg, PROT_READ | PROT_WRITE) == 0, "recommit");
  CHECK_OR_FAIL(IsZero(r + 128 * kPg, 32 * kPg), "recommitted memory is not zero");
  CHECK_OR_FAIL(Check(r + 160 * kPg, 64 * kPg, 11 + 160 * kPg), "data after the decommitted part");
  // madvise(DONTNEED) on a part: zeros there, the rest intact.
  CHECK_OR_FAIL(madvise(r + 256 * kPg, 16 * kPg, MADV_DONTNEED) == 0, "madvise");
  CHECK_OR_FAIL(IsZero(r + 256 * kPg, 16 * kPg), "DONTNEED part is not zero");
  CHECK_OR_FAIL(Check(r + 272 * kPg, 16 * kPg, 11 + 272 * kPg), "data after the DONTNEED part");
  // mlock a part: it stays readable and leaves paging.
  CHECK_OR_FAIL(mlock(r + 320 * kPg, 8 * kPg) == 0, "mlock: %s", strerror(errno));
  CHECK_OR_FAIL(Check(r + 320 * kPg, 8 * kPg, 11 + 320 * kPg), "mlocked data");
  // A shared mapping placed over a part of the reservation, written and read back.
  auto* sh = static_cast<uint8_t*>(mmap(r + 400 * kPg, 16 * kPg, PROT_READ | PROT_WRITE,
                                        MAP_SHARED | MAP_ANONYMOUS | MAP_FIXED, -1, 0));
  CHECK_OR_FAIL(sh == r + 400 * kPg, "MAP_FIXED shared");
  CHECK_OR_FAIL(IsZero(sh, 16 * kPg), "new shared mapping not zero");
  Fill(sh, 16 * kPg, 77);
  CHECK_OR_FAIL(Check(sh, 16 * kPg, 77), "shared mapping data");
  CHECK_OR_FAIL(Check(r + 416 * kPg, 64 * kPg, 11 + 416 * kPg), "data after the shared part");
  // mremap growth of a mapping with data.
  auto* m = static_cast<uint8_t*>(
      mmap(nullptr, 64 * kPg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  Fill(m, 64 * kPg, 5);
  auto* g = static_cast<uint8_t*>(mremap(m, 64 * kPg, 4096 * kPg, MREMAP_MAYMOVE));
  CHECK_OR_FAIL(g != MAP_FAILED && Check(g, 64 * kPg, 5) && IsZero(g + 64 * kPg, 64 * kPg),
                "mremap growth");
  CHECK_OR_FAIL(munmap(g, 4096 * kPg) == 0, "munmap grown");
  // Unmap everything; fresh mappings read as zeros and are paged again.
  CHECK_OR_FAIL(munmap(r, 2 * half) == 0, "munmap reservation");
  auto* again = static_cast<uint8_t*>(
      mmap(nullptr, 2 * half, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  CHECK_OR_FAIL(again != MAP_FAILED && Paged(again), "mapping after the reservation");
  CHECK_OR_FAIL(IsZero(again, 2 * half), "fresh mapping not zero");
  Fill(again, 2 * half, 99);
  CHECK_OR_FAIL(Check(again, 2 * half, 99), "fresh mapping data");
  for (uint8_t* e : extra) free(e);
  return g_failures == 0 ? 0 : 1;
}

std::atomic<int> g_handled{0};
std::atomic<bool> g_handler_on_pager_thread{false};
uint8_t* g_signal_data = nullptr;
pthread_t g_main_thread;

void Handler(int) {
  // Touch paged data from the handler (async-signal-safe: plain loads).
  uint64_t sum = 0;
  for (size_t i = 0; i < (8u << 20); i += 4096) sum += g_signal_data[i];
  if (sum != (8u << 20) / 4096 * 5) g_handled.fetch_add(1000);
  g_handled.fetch_add(1);
}

int ModeSignal() {
  g_main_thread = pthread_self();
  g_signal_data = static_cast<uint8_t*>(malloc(8u << 20));
  std::memset(g_signal_data, 5, 8u << 20);
  struct sigaction sa = {};
  sa.sa_handler = Handler;
  sigaction(SIGUSR1, &sa, nullptr);
  // Process-directed signals: the kernel picks a thread that does not block the signal; the
  // shim's threads block everything, so it must be one of ours.
  for (int i = 0; i < 20; ++i) kill(getpid(), SIGUSR1);
  std::thread t([] {
    for (int i = 0; i < 20; ++i) pthread_kill(g_main_thread, SIGUSR1);
  });
  t.join();
  // Delivery of the last signals may lag; wait (bounded) until all are counted.
  for (int i = 0; i < 2000 && g_handled.load() < 21; ++i) usleep(1000);
  CHECK_OR_FAIL(g_handled.load() >= 21 && g_handled.load() < 1000,
                "handled %d signals (>=1000: a handler saw wrong data)", g_handled.load());
  free(g_signal_data);
  return g_failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s MODE [ARGS]\n", argv[0]);
    return 2;
  }
  std::string mode = argv[1];
  if (mode == "region") {
    uintptr_t base;
    size_t size;
    std::printf("%s\n", Region(&base, &size) ? "paged" : "unpaged");
    return 0;
  }
  if (mode == "threads" && argc == 4) return ModeThreads(atoi(argv[2]), atoi(argv[3]));
  if (mode == "mmap") return ModeMmap();
  if (mode == "fork" && argc == 3) return ModeFork(atoi(argv[2]));
  if (mode == "exec") return ModeExec(argv[0]);
  if (mode == "signal") return ModeSignal();
  if (mode == "runtime" && argc == 3) return ModeRuntime(atoi(argv[2]));
  if (mode == "hold" && argc == 3) {
    // Touches MB MiB of heap, says so, then waits for a signal (the lease tests SIGKILL the
    // `tessera run` above it while its pages are held remotely).
    const size_t bytes = static_cast<size_t>(atoi(argv[2])) << 20;
    auto* p = static_cast<char*>(malloc(bytes));
    if (p == nullptr) return 1;
    std::memset(p, 0x5a, bytes);
    std::printf("holding %zu bytes\n", bytes);
    std::fflush(stdout);
    for (;;) pause();
  }
  if (mode == "exit" && argc == 3) {
    auto* p = static_cast<char*>(malloc(1 << 20));
    std::memset(p, 1, 1 << 20);
    free(p);
    return atoi(argv[2]);
  }
  if (mode == "raise" && argc == 3) {
    raise(atoi(argv[2]));
    return 0;
  }
  std::fprintf(stderr, "probe: unknown mode %s\n", mode.c_str());
  return 2;
}
