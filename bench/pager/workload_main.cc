// tessera-bench-pager-workload: a standalone memory workload (no Tessera code linked), run by
// `tessera bench pager` unmodified under `tessera run`, under Linux swap in a memory cgroup, and
// plain. Allocates MIB MiB with malloc, runs the pattern, prints one line:
//   workload=zipf mib=64 passes=3 checksum=0x... elapsed_ms=1234.5
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>

#include "bench/pager/workload.h"

namespace {
double NowMs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}
int Usage() {
  std::fprintf(stderr,
               "usage: tessera-bench-pager-workload --pattern seq|random|zipf --mib N "
               "[--passes P] [--seed S]\n");
  return 2;
}
}  // namespace

int main(int argc, char** argv) {
  using namespace tessera::bench_pager;
  Pattern pattern = Pattern::kSeq;
  bool have_pattern = false;
  long mib = 0, passes = 3;
  unsigned long long seed = 42;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](const char* name) -> const char* {
      if (a == name && i + 1 < argc) return argv[++i];
      std::string pre = std::string(name) + "=";
      if (a.rfind(pre, 0) == 0) return argv[i] + pre.size();
      return nullptr;
    };
    if (const char* v = value("--pattern")) {
      if (!ParsePattern(v, &pattern)) return Usage();
      have_pattern = true;
    } else if (const char* v = value("--mib")) {
      mib = std::strtol(v, nullptr, 10);
    } else if (const char* v = value("--passes")) {
      passes = std::strtol(v, nullptr, 10);
    } else if (const char* v = value("--seed")) {
      seed = std::strtoull(v, nullptr, 10);
    } else {
      return Usage();
    }
  }
  if (!have_pattern || mib < 1 || mib > 65536 || passes < 1 || passes > 1000) return Usage();
  size_t bytes = static_cast<size_t>(mib) << 20;
  auto* buf = static_cast<uint8_t*>(std::malloc(bytes));
  if (!buf) {
    std::fprintf(stderr, "tessera-bench-pager-workload: malloc(%zu) failed\n", bytes);
    return 1;
  }
  double t0 = NowMs();
  uint64_t sum = RunWorkload(buf, bytes, pattern, static_cast<int>(passes), seed);
  double ms = NowMs() - t0;
  std::printf("workload=%s mib=%ld passes=%ld checksum=0x%016llx elapsed_ms=%.1f\n",
              PatternName(pattern), mib, passes, static_cast<unsigned long long>(sum), ms);
  std::free(buf);
  return 0;
}
