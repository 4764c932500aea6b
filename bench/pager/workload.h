// The memory workloads of `tessera bench pager`, header-only plain C++ (no Tessera code), so the
// standalone tessera-bench-pager-workload program runs unmodified under `tessera run` and under
// Linux swap, and the bench can run the very same kernels in-process over a Pager region.
//
//   seq    : every pass reads and rewrites every 64-byte line of the buffer in address order.
//   random : every pass does `pages * 4` read-modify-writes of one line of a uniformly random page.
//   zipf   : the same with pages drawn from Zipf(0.99) (hot pages scattered over the buffer).
// Every run first writes the whole buffer (so the footprint is all of it), and returns a checksum
// of everything it read, which must not depend on where the memory lives.
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace tessera::bench_pager {

constexpr size_t kWorkPage = 4096;

enum class Pattern { kSeq, kRandom, kZipf };

inline bool ParsePattern(const std::string& s, Pattern* p) {
  if (s == "seq") *p = Pattern::kSeq;
  else if (s == "random") *p = Pattern::kRandom;
  else if (s == "zipf") *p = Pattern::kZipf;
  else return false;
  return true;
}
inline const char* PatternName(Pattern p) {
  return p == Pattern::kSeq ? "seq" : p == Pattern::kRandom ? "random" : "zipf";
}

inline uint64_t SplitMix(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Zipf(theta) over [0, n) by inverse CDF (n up to a few million pages).
class Zipf {
 public:
  Zipf(size_t n, double theta) : cdf_(n) {
    double sum = 0;
    for (size_t i = 0; i < n; ++i) cdf_[i] = (sum += 1.0 / std::pow(static_cast<double>(i + 1), theta));
    for (auto& c : cdf_) c /= sum;
  }
  size_t Next(uint64_t& rng) const {
    double u = static_cast<double>(SplitMix(rng) >> 11) * 0x1.0p-53;
    return static_cast<size_t>(std::lower_bound(cdf_.begin(), cdf_.end(), u) - cdf_.begin()) %
           cdf_.size();
  }

 private:
  std::vector<double> cdf_;
};

// Runs `passes` passes of `pattern` over buf[0, bytes). `progress` (if set) counts finished
// page-sized steps: (passes + 1) * pages in total, for callers that act half-way.
inline uint64_t RunWorkload(uint8_t* buf, size_t bytes, Pattern pattern, int passes,
                            uint64_t seed, std::atomic<uint64_t>* progress = nullptr) {
  const size_t pages = bytes / kWorkPage;
  auto* words = reinterpret_cast<uint64_t*>(buf);
  uint64_t rng = seed;
  for (size_t i = 0; i < bytes / 8; ++i) words[i] = i * 0x2545F4914F6CDD1Dull + seed;
  if (progress) progress->store(pages);
  uint64_t sum = 0;
  // Scatter page ranks over the buffer so that hot Zipf pages are not neighbours.
  const uint64_t mult = 0x9E3779B1ull | 1;
  Zipf* zipf = pattern == Pattern::kZipf ? new Zipf(pages, 0.99) : nullptr;
  for (int pass = 0; pass < passes; ++pass) {
    if (pattern == Pattern::kSeq) {
      for (size_t p = 0; p < pages; ++p) {
        uint64_t* w = words + p * (kWorkPage / 8);
        for (size_t l = 0; l < kWorkPage / 8; l += 8) {
          sum += w[l];
          w[l] = w[l] * 31 + static_cast<uint64_t>(pass);
        }
        if (progress) progress->fetch_add(1, std::memory_order_relaxed);
      }
    } else {
      const size_t steps = pages * 4;
      for (size_t i = 0; i < steps; ++i) {
        size_t page = pattern == Pattern::kZipf ? (zipf->Next(rng) * mult) % pages
                                                : SplitMix(rng) % pages;
        size_t line = SplitMix(rng) % (kWorkPage / 64);
        uint64_t* w = words + page * (kWorkPage / 8) + line * 8;
        sum += *w;
        *w = *w * 31 + static_cast<uint64_t>(pass);
        if (progress && (i & 3) == 3) progress->fetch_add(1, std::memory_order_relaxed);
      }
    }
  }
  delete zipf;
  // Final read of everything, so the checksum covers every byte's final value.
  for (size_t i = 0; i < bytes / 8; i += 8) sum += words[i] * (i | 1);
  return sum;
}

}  // namespace tessera::bench_pager
