// A bounded, deterministic fuzz run for CI, without libFuzzer: replays seed inputs and the
// files of a corpus directory through a libFuzzer target (LLVMFuzzerTestOneInput), then feeds it
// `iterations` mutants of them (byte flips, inserted and deleted runs, splices, truncations)
// drawn from a fixed PRNG seed, so every CI run tries the same inputs. A crash or abort fails
// the test binary; with TESSERA_FUZZ_LAST_INPUT=PATH each mutant is written to PATH before it
// runs, so the one that crashed can be added to the corpus. The real coverage-guided runs use the
// same targets built with clang -fsanitize=fuzzer (TESSERA_FUZZ=ON; see docs/operators/limits.md,
// "Fuzzing").
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace tessera::testing {

using FuzzTarget = int (*)(const uint8_t* data, size_t size);

struct FuzzSmokeResult {
  size_t corpus_files = 0;  // Files replayed from the corpus directory.
  size_t runs = 0;          // Inputs run in all (seeds, corpus files, mutants).
};

// Runs seeds, then every regular file of `corpus_dir` (may be empty or absent), then mutants
// until `iterations` have run or `max_seconds` have passed.
FuzzSmokeResult RunFuzzSmoke(FuzzTarget target, const std::vector<std::vector<uint8_t>>& seeds,
                             const std::string& corpus_dir, size_t iterations, double max_seconds,
                             uint64_t prng_seed = 1);

}  // namespace tessera::testing
