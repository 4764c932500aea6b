// SlabPool: the memory a memory server lends, cut into fixed-size slabs.
//
// The pool reserves `capacity` bytes of page-aligned anonymous memory once (one MappedRegion,
// optionally on huge pages) and hands it out in slabs of `slab_size` bytes. Pages are touched
// only when a client writes them, and a freed slab's pages are returned to the kernel
// (MADV_DONTNEED), so a slab that is not allocated costs no host memory and the next owner
// always starts from zeros: no client ever sees another client's bytes.
//
// A slab belongs to the client that allocated it (an OwnerId, never 0). A slab id packs a
// generation with the slot index, so an id that was freed (or evicted) and whose slot was
// reused never resolves again. Every access is checked: owner, generation, offset and length.
//
// Ownership: the pool owns its memory; spans returned by Resolve() stay mapped for the pool's
// whole lifetime (the region is never unmapped before the pool), so an engine copying into a
// span that is concurrently freed cannot fault; it only writes bytes nobody will read.
//
// Threads: every method may be called from any thread. Alloc/Free/limit changes take one
// mutex (O(1) under it: a free-list stack). Resolve() — the data path — takes no lock: it
// reads per-slot atomics with a generation check (seqlock style).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "common/mmap.h"
#include "common/status.h"

namespace tessera::memserver {

// The authenticated identity of a client, as the memserver knows it. 0 means "nobody".
using OwnerId = uint64_t;

// Owner ids reserved for the services hosted in the memserver (memserver/service.h), one each:
// the kMaxServices ids just below ~0. No client may authenticate as one (the handler drops such
// a connection), and the resource monitor never evicts their slabs.
inline constexpr uint32_t kMaxServices = 16;
inline constexpr OwnerId ServiceOwner(uint32_t index) { return ~OwnerId{0} - 1 - index; }
inline constexpr bool IsServiceOwner(OwnerId owner) {
  return owner >= ServiceOwner(kMaxServices - 1) && owner <= ServiceOwner(0);
}

class SlabPool {
 public:
  struct Options {
    uint64_t capacity_bytes = 0;  // Multiple of slab_bytes.
    uint64_t slab_bytes = 0;      // Multiple of 4 KiB (of 2 MiB with huge pages).
    bool huge_pages = false;      // Ask for huge pages; falls back (logged) when none.
  };

  enum class SlabState : uint32_t { kFree = 0, kAllocated = 1, kEvicting = 2 };

  struct SlabInfo {
    uint64_t slab_id = 0;
    OwnerId owner = 0;
    SlabState state = SlabState::kFree;
    uint64_t last_access_epoch = 0;
  };

  struct Counts {
    uint64_t max_slabs = 0;        // capacity / slab size
    uint64_t limit_slabs = 0;      // allocations allowed now (the resource monitor moves it)
    uint64_t allocated_slabs = 0;  // includes evicting
    uint64_t evicting_slabs = 0;
  };

  // Validates the options and reserves the memory.
  static Result<std::unique_ptr<SlabPool>> Create(const Options& options);

  SlabPool(const SlabPool&) = delete;
  SlabPool& operator=(const SlabPool&) = delete;

  // Allocates a slab for `owner`. ResourceExhausted when the limit is reached.
  Result<uint64_t> Alloc(OwnerId owner);
  // Frees `owner`'s slab. NotFound for an unknown/stale id, PermissionDenied for another
  // client's slab.
  Status Free(OwnerId owner, uint64_t slab_id);
  // Frees a slab whatever its owner (eviction). NotFound when it is already gone.
  Status ForceFree(uint64_t slab_id);
  // Marks an allocated slab as being evicted (it stays readable and writable by its owner
  // until freed). Returns its owner. NotFound when stale, FailedPrecondition-like
  // InvalidArgument when already evicting.
  Result<OwnerId> MarkEvicting(uint64_t slab_id);

  // The memory for [offset, offset+length) of `owner`'s slab. Lock-free. Errors: NotFound
  // (no such slab / stale id), PermissionDenied (someone else's slab), OutOfRange (bounds).
  // A zero length is InvalidArgument.
  Result<std::span<uint8_t>> Resolve(OwnerId owner, uint64_t slab_id, uint64_t offset,
                                     uint64_t length);
  // Resolve() without the owner check, for an admin client (PeerInfo::admin). Same errors
  // otherwise; stamps the access epoch the same way.
  Result<std::span<uint8_t>> ResolveAnyOwner(uint64_t slab_id, uint64_t offset, uint64_t length);
  // The owner of an allocated slab; NotFound when it is free or the id is stale.
  Result<OwnerId> OwnerOf(uint64_t slab_id);
  // The whole memory of an allocated slab, without an owner check. For privileged callers
  // only (fault injection's bit flips); never reachable from a client request.
  Result<std::span<uint8_t>> RawSlab(uint64_t slab_id);

  // Allowed number of allocated slabs, clamped to [0, max_slabs]. Lowering it below the
  // number allocated evicts nothing by itself; it only refuses new allocations.
  void SetLimit(uint64_t slabs);
  // Advances the access epoch that Resolve() stamps on slabs (for LRU eviction).
  void AdvanceEpoch() { epoch_.fetch_add(1, std::memory_order_relaxed); }

  Counts counts() const;
  // All allocated (and evicting) slabs, a consistent snapshot.
  std::vector<SlabInfo> AllocatedSlabs() const;
  // Number of slabs `owner` holds.
  uint64_t SlabsOwnedBy(OwnerId owner) const;

  uint64_t slab_bytes() const { return slab_bytes_; }
  uint64_t capacity_bytes() const { return max_slabs_ * slab_bytes_; }
  bool huge_pages() const { return region_.huge_pages(); }
  // The registered-memory view (for an RDMA memory region over the whole pool).
  uint8_t* base() const { return region_.data(); }
  size_t region_bytes() const { return region_.size(); }
  // Byte offset of a slab inside the region (remote_addr = base + offset for verbs).
  Result<uint64_t> OffsetOf(uint64_t slab_id) const;

  static uint32_t IndexOf(uint64_t slab_id) { return static_cast<uint32_t>(slab_id); }
  static uint32_t GenerationOf(uint64_t slab_id) { return static_cast<uint32_t>(slab_id >> 32); }

 private:
  // Resolve() with the owner check when `owner` is non-null.
  Result<std::span<uint8_t>> ResolveChecked(const OwnerId* owner, uint64_t slab_id,
                                            uint64_t offset, uint64_t length);
  struct Slot {
    // (generation << 32) | SlabState. Written under mu_, read lock-free.
    std::atomic<uint64_t> tag{0};
    std::atomic<uint64_t> owner{0};
    std::atomic<uint64_t> last_access{0};
    uint32_t next_free = 0;  // Under mu_.
  };
  static constexpr uint32_t kNoSlot = UINT32_MAX;

  SlabPool(MappedRegion region, uint64_t slab_bytes, uint64_t max_slabs);
  // Checks `slab_id` against the slot's tag; returns the slot or NotFound.
  Result<Slot*> LiveSlot(uint64_t slab_id) const;
  Status FreeLocked(Slot* slot, uint32_t index);

  MappedRegion region_;
  const uint64_t slab_bytes_;
  const uint64_t max_slabs_;
  std::unique_ptr<Slot[]> slots_;
  std::atomic<uint64_t> epoch_{1};

  mutable std::mutex mu_;
  uint32_t free_head_ = kNoSlot;  // Under mu_.
  uint64_t limit_ = 0;            // Under mu_.
  uint64_t allocated_ = 0;        // Under mu_.
  uint64_t evicting_ = 0;         // Under mu_.
};

}  // namespace tessera::memserver
