// What an I/O thread publishes for threads that read on their own (direct reads, direct_read.cc;
// published in direct_publish.cc): per page and per slab, under seqlocks, and what a reader
// makes of them. Internal to client/remote/ (engine.h includes it).
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>

#include "coding/codec.h"
#include "fabric/wire.h"

namespace tessera::client::remote {

constexpr int kMaxWidth = coding::kMaxSplits;  // Members of a slab: k + r at most.
constexpr uint32_t kNoServer = ~0u;

// How long a direct read polls for its reply before it sleeps: twice the recent reply time
// (avg_reply_ns, a moving average of this reader's rounds), so a reply that comes in the usual
// time is caught without a wake-up, but never more than bound_ns (direct_spin_us). A server
// whose replies take longer than the bound is not polled for at all (polling could not catch
// them): the read sleeps at once, and the average, which then includes the wake-up, comes back
// under the bound when the server speeds up again.
inline uint64_t DirectSpinWindowNs(uint64_t avg_reply_ns, uint64_t bound_ns) {
  if (avg_reply_ns > bound_ns) return 0;
  return std::min(bound_ns, 2 * avg_reply_ns);
}
// What a thread reading on its own needs to know about a page, published by the owning I/O
// thread (the only writer) and read by any thread. Guarded by a seqlock: `ver` is odd while the
// I/O thread changes the other fields and bumped to the next even value after; a reader
// accepts what it read between two equal even loads of `ver`. All fields are relaxed atomics
// (so racing reads are defined); the fences are in PublishPage()/DirectLocate().
constexpr uint32_t kDirectZero = ~0u;     // DirectLoc's slab: never written or trimmed (zeros).
constexpr uint32_t kDirectNo = ~0u - 1;   // DirectLoc's slab: not directly readable now.
// All zero bytes is a never-written page, so a table of them can be lazily zeroed memory.
struct DirectLoc {
  std::atomic<uint32_t> ver{0};
  // ~slab: the index into the thread's slab table, or one of the above (0: kDirectZero).
  std::atomic<uint32_t> slab_inv{0};
  std::atomic<uint32_t> row_col{0};         // Row << 8 | stripe member.
  std::atomic<uint32_t> crc{0};             // CRC32C of the page as stored.
};
// Per logical slab, same protocol: the server and remote slab of every member. `ver` also moves
// when a member is re-placed (failure, eviction) or the slab is freed, so a reader whose slab
// version moved during its read throws the data away.
struct DirectSlab {
  std::atomic<uint32_t> ver{0};
  std::array<std::atomic<uint32_t>, kMaxWidth> server;
  std::array<std::atomic<uint64_t>, kMaxWidth> id, addr, size;
  std::array<std::atomic<uint32_t>, kMaxWidth> rkey;
  // Split layout: member j holds its splits of pages below settled[j] (the regeneration
  // cursor of a replacement; the whole slab otherwise). Reset under the seqlock when the member
  // is re-placed, then only raised, outside it, as regeneration goes on.
  std::array<std::atomic<uint32_t>, kMaxWidth> settled;
  DirectSlab() {
    for (int j = 0; j < kMaxWidth; ++j) {
      settled[j].store(UINT32_MAX, std::memory_order_relaxed);
      server[j].store(kNoServer, std::memory_order_relaxed);
      id[j].store(0, std::memory_order_relaxed);
      addr[j].store(0, std::memory_order_relaxed);
      size[j].store(0, std::memory_order_relaxed);
      rkey[j].store(0, std::memory_order_relaxed);
    }
  }
};
// Split layout: the pages of one logical slab as published for direct readers, allocated the
// first time the slab is allocated and kept (never freed or moved) while the I/O thread lives.
// Per page, (2 + width) words: a seqlock version (same protocol as DirectLoc), the state
// (kSplitZero, kSplitStored, kSplitNo), then the CRC32C of every split as stored.
constexpr uint32_t kSplitZero = 0;    // Never written or trimmed: reads as zeros.
constexpr uint32_t kSplitStored = 1;  // Every split holds the write whose CRCs follow.
constexpr uint32_t kSplitNo = 2;      // A write is in flight (the I/O thread serves the page).
// One part of a page to read directly: the whole page (group: the stripe member holding it)
// or split j (split layout: part j is split j).
struct DirectPart {
  uint32_t server = kNoServer;
  uint32_t crc = 0;
  fabric::AllocSlabResponse remote;
};
// Reads member j of a published slab (under its seqlock, checked by the caller).
inline void LoadDirectMember(const DirectSlab& ds, int j, DirectPart* p) {
  p->server = ds.server[j].load(std::memory_order_relaxed);
  p->remote.slab_id = ds.id[j].load(std::memory_order_relaxed);
  p->remote.remote_addr = ds.addr[j].load(std::memory_order_relaxed);
  p->remote.size = ds.size[j].load(std::memory_order_relaxed);
  p->remote.rkey = ds.rkey[j].load(std::memory_order_relaxed);
}
// A page located for a direct read (DirectLocate), re-checked after the read (DirectValid).
struct DirectTarget {
  bool zero = false;  // Reads as zeros; nothing else is set.
  uint32_t page_ver = 0;
  uint32_t slab_ver = 0;
  uint32_t slab = 0;
  uint64_t offset = 0;  // Of every part in its remote slab.
  uint32_t length = 0;  // Bytes per part: kPageSize (group), the split size (split layout).
  int parts = 0;        // Group: 1 (the stripe member holding the page). Split: k + r.
  std::array<DirectPart, kMaxWidth> part;
};

}  // namespace tessera::client::remote
