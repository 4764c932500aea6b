// The key hash of Kayak: how a client picks the server of a key (its shard and replicas) and how
// a server's table places the key in its index. Client and server share it, so both sides agree
// on where a key lives; a seed keeps the two uses independent.
//
// Header-only, pure; any thread.
#pragma once

#include <cstdint>
#include <span>

namespace tessera::kayak::wire {

// splitmix64's finish: a bijection that spreads every input bit over the output.
inline uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// 64-bit hash of a key (FNV-1a with a splitmix64 finish), seeded so that different users of the
// hash (server index, client sharding) are independent.
inline uint64_t KvKeyHash(std::span<const uint8_t> key, uint64_t seed) {
  uint64_t h = 0xcbf29ce484222325ull ^ Mix64(seed);
  for (uint8_t b : key) {
    h ^= b;
    h *= 0x100000001b3ull;
  }
  return Mix64(h ^ key.size());
}

}  // namespace tessera::kayak::wire
