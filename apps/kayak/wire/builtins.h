// The built-in offload functions of the Kayak service (the Kayak benchmark workloads), as pure
// pieces shared by the server runtime (apps/kayak/server/offload.h, which runs them next to the
// data) and the Kayak client (apps/kayak/client, which runs the same steps over KV GETs): so a
// function gives the same answer either way. Their ids and argument and result encodings are
// part of Kayak's wire format.
//
// Keys of the chase workloads are 8-byte little-endian integers; the first 8 bytes of each
// value name the next key; bytes 8..15 of a value are a counter (the read-write function).
//
//   kChase (1)           args ChaseArgs{start, hops, compute_iters = 0}
//                        result ChaseResult{last key read, digest of the values read}
//   kChaseCompute (2)    the same, then `compute_iters` rounds of Compute() on the digest
//   kMultiGetAggregate (3) args u32 count, u32 0, count x u64 keys (1..kMaxAggregateKeys)
//                        result AggregateResult{keys found, digest of the found values in order}
//   kChaseIncrement (4)  read-write: chase, then add 1 to the counter of the last value read
//                        and write it back; result ChaseResult{last key, new counter value}
//
// Header-only, pure; any thread.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "apps/kayak/wire/key_hash.h"
#include "common/status.h"

namespace tessera::kayak::builtins {

enum FunctionId : uint32_t {
  kChase = 1,
  kChaseCompute = 2,
  kMultiGetAggregate = 3,
  kChaseIncrement = 4,
};
inline constexpr uint32_t kMaxBuiltinId = 4;
inline constexpr uint32_t kMaxHops = 64;
inline constexpr uint32_t kMaxAggregateKeys = 32;
inline constexpr uint32_t kMaxComputeIters = 1u << 28;

inline bool IsBuiltin(uint32_t id) { return id >= 1 && id <= kMaxBuiltinId; }
inline bool IsReadWrite(uint32_t id) { return id == kChaseIncrement; }
inline const char* Name(uint32_t id) {
  switch (id) {
    case kChase: return "chase";
    case kChaseCompute: return "chase_compute";
    case kMultiGetAggregate: return "multiget_aggregate";
    case kChaseIncrement: return "chase_increment";
  }
  return "unknown";
}

using wire::Mix64;
inline uint64_t LoadLe64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
inline void StoreLe64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = uint8_t(v >> (8 * i));
}
inline std::vector<uint8_t> KeyBytes(uint64_t key) {
  std::vector<uint8_t> k(8);
  StoreLe64(k.data(), key);
  return k;
}

// Folds one value into a digest.
inline uint64_t Fold(uint64_t digest, std::span<const uint8_t> value) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (uint8_t b : value) {
    h ^= b;
    h *= 0x100000001b3ull;
  }
  return Mix64(digest ^ h ^ value.size());
}
inline constexpr uint64_t kDigestSeed = 0x6b61796b61ull;  // "kayak"

// The configurable computation: `iters` dependent rounds of a 64-bit mix (about 1-3 ns each;
// the bench calibrates iterations per microsecond). `check` is called every 4096 rounds and
// returns false to stop early (the budget); then the result is meaningless.
template <typename Check>
inline uint64_t Compute(uint64_t digest, uint32_t iters, Check check) {
  for (uint32_t i = 0; i < iters; ++i) {
    digest = Mix64(digest + i);
    if ((i & 4095) == 4095 && !check()) break;
  }
  return digest;
}
inline uint64_t Compute(uint64_t digest, uint32_t iters) {
  return Compute(digest, iters, [] { return true; });
}

struct ChaseArgs {
  static constexpr size_t kSize = 16;
  uint64_t start = 0;
  uint32_t hops = 1;           // 1..kMaxHops
  uint32_t compute_iters = 0;  // kChase: must be 0.
  std::vector<uint8_t> Encode() const {
    std::vector<uint8_t> b(kSize);
    StoreLe64(b.data(), start);
    StoreLe64(b.data() + 8, uint64_t{hops} | (uint64_t{compute_iters} << 32));
    return b;
  }
  static Result<ChaseArgs> Decode(uint32_t id, std::span<const uint8_t> b) {
    if (b.size() != kSize) return InvalidArgument(Name(id), ": arguments must be 16 bytes, got ", b.size());
    ChaseArgs a;
    a.start = LoadLe64(b.data());
    uint64_t w = LoadLe64(b.data() + 8);
    a.hops = static_cast<uint32_t>(w);
    a.compute_iters = static_cast<uint32_t>(w >> 32);
    if (a.hops == 0 || a.hops > kMaxHops) {
      return InvalidArgument(Name(id), ": hops ", a.hops, " outside 1..", kMaxHops);
    }
    if (id == kChase && a.compute_iters != 0) {
      return InvalidArgument("chase: compute_iters must be 0 (use chase_compute)");
    }
    if (a.compute_iters > kMaxComputeIters) {
      return InvalidArgument(Name(id), ": compute_iters ", a.compute_iters, " above ", kMaxComputeIters);
    }
    return a;
  }
};

struct ChaseResult {
  static constexpr size_t kSize = 16;
  uint64_t last_key = 0;
  uint64_t value = 0;  // The digest (chase, chase_compute) or the new counter (chase_increment).
  std::vector<uint8_t> Encode() const {
    std::vector<uint8_t> b(kSize);
    StoreLe64(b.data(), last_key);
    StoreLe64(b.data() + 8, value);
    return b;
  }
  static Result<ChaseResult> Decode(std::span<const uint8_t> b) {
    if (b.size() != kSize) return ProtocolError("chase result must be 16 bytes, got ", b.size());
    return ChaseResult{LoadLe64(b.data()), LoadLe64(b.data() + 8)};
  }
};

// The next key named by a chained value.
inline Result<uint64_t> NextKey(uint64_t key, std::span<const uint8_t> value) {
  if (value.size() < 8) {
    return InvalidArgument("value of key ", key, " has ", value.size(),
                           " bytes: a chained value needs 8 (the next key)");
  }
  return LoadLe64(value.data());
}

// chase_increment: the new value (counter + 1) written back to the last key.
inline Result<std::vector<uint8_t>> Incremented(uint64_t key, std::span<const uint8_t> value,
                                                uint64_t* counter) {
  if (value.size() < 16) {
    return InvalidArgument("value of key ", key, " has ", value.size(),
                           " bytes: chase_increment needs 16 (next key, counter)");
  }
  std::vector<uint8_t> v(value.begin(), value.end());
  *counter = LoadLe64(v.data() + 8) + 1;
  StoreLe64(v.data() + 8, *counter);
  return v;
}

struct AggregateArgs {
  std::vector<uint64_t> keys;
  std::vector<uint8_t> Encode() const {
    std::vector<uint8_t> b(8 + 8 * keys.size(), 0);
    StoreLe64(b.data(), keys.size());
    for (size_t i = 0; i < keys.size(); ++i) StoreLe64(b.data() + 8 + 8 * i, keys[i]);
    return b;
  }
  static Result<AggregateArgs> Decode(std::span<const uint8_t> b) {
    if (b.size() < 16 || (b.size() - 8) % 8 != 0) {
      return InvalidArgument("multiget_aggregate: bad argument size ", b.size());
    }
    uint64_t n = LoadLe64(b.data());
    if (n == 0 || n > kMaxAggregateKeys || b.size() != 8 + 8 * n) {
      return InvalidArgument("multiget_aggregate: ", n, " keys (1..", kMaxAggregateKeys,
                             ") in ", b.size(), " argument bytes");
    }
    AggregateArgs a;
    for (uint64_t i = 0; i < n; ++i) a.keys.push_back(LoadLe64(b.data() + 8 + 8 * i));
    return a;
  }
};

}  // namespace tessera::kayak::builtins
