// The bounded CI fuzz run (see tests/support/fuzz_smoke.h).
#include "tests/support/fuzz_smoke.h"

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>

namespace tessera::testing {
namespace {

std::vector<uint8_t> Mutate(const std::vector<std::vector<uint8_t>>& pool, std::mt19937_64& rng) {
  std::vector<uint8_t> in = pool[rng() % pool.size()];
  const int steps = 1 + static_cast<int>(rng() % 4);
  for (int s = 0; s < steps; ++s) {
    switch (rng() % 6) {
      case 0:  // Flip bits of a byte.
        if (!in.empty()) in[rng() % in.size()] ^= static_cast<uint8_t>(1u << (rng() % 8));
        break;
      case 1:  // A byte set to an interesting value.
        if (!in.empty()) {
          static constexpr uint8_t kVals[] = {0, 1, 0x7f, 0x80, 0xff, 0x40, 0x10};
          in[rng() % in.size()] = kVals[rng() % sizeof(kVals)];
        }
        break;
      case 2: {  // Insert a run of random bytes.
        const size_t at = in.empty() ? 0 : rng() % (in.size() + 1);
        std::vector<uint8_t> run(1 + rng() % 16);
        for (auto& b : run) b = static_cast<uint8_t>(rng());
        in.insert(in.begin() + static_cast<std::ptrdiff_t>(at), run.begin(), run.end());
        break;
      }
      case 3:  // Delete a run.
        if (in.size() > 1) {
          const size_t at = rng() % in.size();
          const size_t n = std::min<size_t>(1 + rng() % 16, in.size() - at);
          in.erase(in.begin() + static_cast<std::ptrdiff_t>(at),
                   in.begin() + static_cast<std::ptrdiff_t>(at + n));
        }
        break;
      case 4: {  // Splice the tail of another input.
        const auto& other = pool[rng() % pool.size()];
        if (!other.empty()) {
          const size_t cut = in.empty() ? 0 : rng() % in.size();
          const size_t from = rng() % other.size();
          in.resize(cut);
          in.insert(in.end(), other.begin() + static_cast<std::ptrdiff_t>(from), other.end());
        }
        break;
      }
      case 5:  // Truncate.
        if (!in.empty()) in.resize(rng() % in.size());
        break;
    }
  }
  return in;
}

}  // namespace

FuzzSmokeResult RunFuzzSmoke(FuzzTarget target, const std::vector<std::vector<uint8_t>>& seeds,
                             const std::string& corpus_dir, size_t iterations, double max_seconds,
                             uint64_t prng_seed) {
  FuzzSmokeResult r;
  std::vector<std::vector<uint8_t>> pool = seeds;
  for (const auto& s : seeds) {
    target(s.data(), s.size());
    ++r.runs;
  }
  std::error_code ec;
  if (!corpus_dir.empty() && std::filesystem::is_directory(corpus_dir, ec)) {
    for (const auto& e : std::filesystem::directory_iterator(corpus_dir)) {
      if (!e.is_regular_file()) continue;
      std::ifstream f(e.path(), std::ios::binary);
      std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)),
                                 std::istreambuf_iterator<char>());
      target(bytes.data(), bytes.size());
      ++r.runs;
      ++r.corpus_files;
      pool.push_back(std::move(bytes));
    }
  }
  if (pool.empty()) pool.push_back({});
  std::mt19937_64 rng(prng_seed);
  const char* save = std::getenv("TESSERA_FUZZ_LAST_INPUT");
  const std::string last_input = save != nullptr ? save : "";
  const auto start = std::chrono::steady_clock::now();
  for (size_t i = 0; i < iterations; ++i) {
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (elapsed > max_seconds) break;
    std::vector<uint8_t> m = Mutate(pool, rng);
    if (!last_input.empty()) {
      // Kept on disk while it runs: after a crash it is the input to add to the corpus.
      std::ofstream(last_input, std::ios::binary | std::ios::trunc)
          .write(reinterpret_cast<const char*>(m.data()), static_cast<std::streamsize>(m.size()));
    }
    target(m.data(), m.size());
    ++r.runs;
  }
  return r;
}

}  // namespace tessera::testing
