// `tessera-bench-dirty-tracking`: what it costs a user-space pager to learn which of its pages
// were written, two ways, on the same pages and the same writes:
//
//   traps : the pager's way today. The range is write-protected with userfaultfd (synchronous
//           write-protect mode); the first write to each page stops the writing thread, a
//           handler thread reads the fault and lifts the protection (UFFDIO_WRITEPROTECT), and
//           so learns the page was written. Each round re-protects the range with one ioctl.
//   async : UFFD_FEATURE_WP_ASYNC. The kernel resolves write-protect faults itself (no message,
//           no thread switch); one PAGEMAP_SCAN ioctl per round (PM_SCAN_WP_MATCHING) returns
//           the written pages and write-protects them again.
//
// Each round writes one byte in each of a random `fraction` of the pages, then collects the
// written set. Reported per round (median of --rounds): the writer's time, the collection's
// time, and their sum per written page. Both ways must report exactly the pages written
// (checked every round; a mismatch fails the run).
#include <fcntl.h>
#include <gflags/gflags.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"

// Newer than the distribution's headers (kernel 6.7+).
#ifndef UFFD_FEATURE_WP_ASYNC
#define UFFD_FEATURE_WP_ASYNC (1 << 15)
#endif
#ifndef PAGEMAP_SCAN
struct page_region {
  __u64 start;
  __u64 end;
  __u64 categories;
};
struct pm_scan_arg {
  __u64 size;
  __u64 flags;
  __u64 start;
  __u64 end;
  __u64 walk_end;
  __u64 vec;
  __u64 vec_len;
  __u64 max_pages;
  __u64 category_inverted;
  __u64 category_mask;
  __u64 category_anyof_mask;
  __u64 return_mask;
};
#define PAGEMAP_SCAN _IOWR('f', 16, struct pm_scan_arg)
#define PAGE_IS_WRITTEN (1 << 1)
#define PM_SCAN_WP_MATCHING (1 << 0)
#define PM_SCAN_CHECK_WPASYNC (1 << 1)
#endif

DEFINE_int32(pages, 16384, "Pages in the tracked range");
DEFINE_string(fractions, "0.01,0.1,0.5,1", "Fractions of the pages written per round");
DEFINE_int32(rounds, 7, "Rounds per fraction (medians reported)");

namespace {

constexpr size_t kPage = 4096;

int OpenUffd(uint64_t features) {
  int fd = static_cast<int>(::syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK));
  if (fd < 0) return -1;
  uffdio_api api{};
  api.api = UFFD_API;
  api.features = features;
  if (::ioctl(fd, UFFDIO_API, &api) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

bool Protect(int fd, uint8_t* base, size_t len, bool on) {
  uffdio_writeprotect wp{};
  wp.range = {reinterpret_cast<uintptr_t>(base), len};
  wp.mode = on ? UFFDIO_WRITEPROTECT_MODE_WP : 0;
  for (int i = 0; i < 1000; ++i) {
    if (::ioctl(fd, UFFDIO_WRITEPROTECT, &wp) == 0) return true;
    if (errno != EAGAIN) return false;
  }
  return false;
}

uint64_t SplitMix(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

std::vector<size_t> Pick(size_t pages, double fraction, uint64_t seed) {
  std::vector<size_t> all(pages);
  for (size_t i = 0; i < pages; ++i) all[i] = i;
  for (size_t i = pages; i > 1; --i) std::swap(all[i - 1], all[SplitMix(seed) % i]);
  all.resize(std::max<size_t>(1, static_cast<size_t>(fraction * static_cast<double>(pages))));
  return all;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

struct Round {
  double write_us = 0, collect_us = 0;
};

// Synchronous write-protect faults served by a handler thread.
bool RunTraps(size_t pages, double fraction, int rounds, std::vector<Round>* out) {
  const size_t len = pages * kPage;
  auto* base = static_cast<uint8_t*>(
      ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  if (base == MAP_FAILED) return false;
  ::madvise(base, len, MADV_NOHUGEPAGE);
  std::memset(base, 1, len);
  int fd = OpenUffd(UFFD_FEATURE_PAGEFAULT_FLAG_WP);
  bool ok = fd >= 0;
  uffdio_register reg{};
  reg.range = {reinterpret_cast<uintptr_t>(base), len};
  reg.mode = UFFDIO_REGISTER_MODE_WP;
  ok = ok && ::ioctl(fd, UFFDIO_REGISTER, &reg) == 0;
  std::atomic<bool> stop{false};
  std::vector<uint8_t> seen(pages, 0);
  std::thread handler([&] {
    uffd_msg msgs[64];
    while (ok && !stop.load()) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 10) <= 0) continue;
      ssize_t got = ::read(fd, msgs, sizeof msgs);
      for (ssize_t i = 0; i < got / static_cast<ssize_t>(sizeof(uffd_msg)); ++i) {
        if (msgs[i].event != UFFD_EVENT_PAGEFAULT) continue;
        uintptr_t a = msgs[i].arg.pagefault.address & ~(kPage - 1);
        seen[(a - reinterpret_cast<uintptr_t>(base)) / kPage] = 1;
        Protect(fd, reinterpret_cast<uint8_t*>(a), kPage, false);
      }
    }
  });
  for (int r = 0; ok && r < rounds; ++r) {
    std::vector<size_t> w = Pick(pages, fraction, 7 + r);
    std::fill(seen.begin(), seen.end(), 0);
    uint64_t t0 = tessera::MonotonicNs();
    ok = Protect(fd, base, len, true);
    uint64_t t1 = tessera::MonotonicNs();
    for (size_t p : w) base[p * kPage] += 1;
    uint64_t t2 = tessera::MonotonicNs();
    size_t found = static_cast<size_t>(std::count(seen.begin(), seen.end(), 1));
    if (found != w.size()) {
      std::fprintf(stderr, "traps: %zu pages written, %zu seen\n", w.size(), found);
      ok = false;
    }
    out->push_back(Round{(t2 - t1) / 1e3, (t1 - t0) / 1e3});
  }
  stop = true;
  handler.join();
  if (fd >= 0) ::close(fd);
  ::munmap(base, len);
  return ok;
}

// UFFD_FEATURE_WP_ASYNC + PAGEMAP_SCAN.
bool RunAsync(size_t pages, double fraction, int rounds, std::vector<Round>* out) {
  const size_t len = pages * kPage;
  auto* base = static_cast<uint8_t*>(
      ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  if (base == MAP_FAILED) return false;
  ::madvise(base, len, MADV_NOHUGEPAGE);
  std::memset(base, 1, len);
  int fd = OpenUffd(UFFD_FEATURE_PAGEFAULT_FLAG_WP | UFFD_FEATURE_WP_ASYNC);
  int pm = ::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  bool ok = fd >= 0 && pm >= 0;
  if (!ok) std::fprintf(stderr, "async: userfaultfd with WP_ASYNC or pagemap unavailable\n");
  uffdio_register reg{};
  reg.range = {reinterpret_cast<uintptr_t>(base), len};
  reg.mode = UFFDIO_REGISTER_MODE_WP;
  ok = ok && ::ioctl(fd, UFFDIO_REGISTER, &reg) == 0;
  ok = ok && Protect(fd, base, len, true);
  std::vector<page_region> vec(pages);
  for (int r = 0; ok && r < rounds; ++r) {
    std::vector<size_t> w = Pick(pages, fraction, 7 + r);
    uint64_t t1 = tessera::MonotonicNs();
    for (size_t p : w) base[p * kPage] += 1;
    uint64_t t2 = tessera::MonotonicNs();
    pm_scan_arg arg{};
    arg.size = sizeof arg;
    arg.flags = PM_SCAN_WP_MATCHING | PM_SCAN_CHECK_WPASYNC;
    arg.start = reinterpret_cast<uintptr_t>(base);
    arg.end = arg.start + len;
    arg.vec = reinterpret_cast<uintptr_t>(vec.data());
    arg.vec_len = vec.size();
    arg.category_mask = PAGE_IS_WRITTEN;
    arg.return_mask = PAGE_IS_WRITTEN;
    long n = ::ioctl(pm, PAGEMAP_SCAN, &arg);
    uint64_t t3 = tessera::MonotonicNs();
    if (n < 0) {
      std::fprintf(stderr, "async: PAGEMAP_SCAN: %s\n", strerror(errno));
      ok = false;
      break;
    }
    size_t found = 0;
    for (long i = 0; i < n; ++i) found += (vec[i].end - vec[i].start) / kPage;
    if (found != w.size()) {
      std::fprintf(stderr, "async: %zu pages written, %zu reported\n", w.size(), found);
      ok = false;
    }
    out->push_back(Round{(t2 - t1) / 1e3, (t3 - t2) / 1e3});
  }
  if (pm >= 0) ::close(pm);
  if (fd >= 0) ::close(fd);
  ::munmap(base, len);
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage(
      "Dirty tracking: userfaultfd write-protect traps vs WP_ASYNC + "
      "PAGEMAP_SCAN on the same writes");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  if (FLAGS_pages < 16 || FLAGS_rounds < 1) {
    std::fprintf(stderr, "--pages >= 16 and --rounds >= 1\n");
    return 2;
  }
  std::vector<double> fractions;
  std::stringstream ss(FLAGS_fractions);
  for (std::string f; std::getline(ss, f, ',');) fractions.push_back(std::stod(f));
  std::printf("%-6s %9s %8s %12s %12s %12s\n", "mode", "fraction", "written", "write_us",
              "collect_us", "ns_per_page");
  bool all_ok = true;
  for (double f : fractions) {
    for (const char* mode : {"traps", "async"}) {
      std::vector<Round> rounds;
      const bool ok = std::strcmp(mode, "traps") == 0
                          ? RunTraps(FLAGS_pages, f, FLAGS_rounds, &rounds)
                          : RunAsync(FLAGS_pages, f, FLAGS_rounds, &rounds);
      all_ok = all_ok && ok;
      std::vector<double> wr, co, per;
      const double written =
          std::max(1.0, static_cast<double>(static_cast<size_t>(f * FLAGS_pages)));
      for (const Round& r : rounds) {
        wr.push_back(r.write_us);
        co.push_back(r.collect_us);
        per.push_back((r.write_us + r.collect_us) * 1e3 / written);
      }
      std::printf("%-6s %9.2f %8.0f %12.0f %12.0f %12.0f%s\n", mode, f, written, Median(wr),
                  Median(co), Median(per), ok ? "" : "  FAILED");
    }
  }
  return all_ok ? 0 : 1;
}
