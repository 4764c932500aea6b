#include "memserver/slab_pool.h"

#include <sys/mman.h>

#include <cstring>

#include "common/logging.h"
#include "common/units.h"

namespace tessera::memserver {
namespace {

constexpr uint64_t kSmallPage = 4096;
constexpr uint64_t kHugePage = 2ull << 20;
// Slot indices are 32-bit and kNoSlot is reserved.
constexpr uint64_t kMaxSlabs = (1ull << 32) - 2;

uint64_t MakeTag(uint32_t gen, SlabPool::SlabState s) {
  return (static_cast<uint64_t>(gen) << 32) | static_cast<uint32_t>(s);
}
uint32_t TagGen(uint64_t tag) { return static_cast<uint32_t>(tag >> 32); }
SlabPool::SlabState TagState(uint64_t tag) {
  return static_cast<SlabPool::SlabState>(static_cast<uint32_t>(tag));
}

}  // namespace

Result<std::unique_ptr<SlabPool>> SlabPool::Create(const Options& options) {
  const uint64_t slab = options.slab_bytes;
  if (slab == 0 || slab % kSmallPage != 0) {
    return InvalidArgument("slab size must be a positive multiple of 4 KiB, got ", slab);
  }
  if (options.huge_pages && slab % kHugePage != 0) {
    return InvalidArgument("with huge pages the slab size must be a multiple of 2 MiB, got ",
                           FormatSize(slab));
  }
  if (options.capacity_bytes < slab) {
    return InvalidArgument("capacity (", FormatSize(options.capacity_bytes),
                           ") must hold at least one slab of ", FormatSize(slab));
  }
  if (options.capacity_bytes % slab != 0) {
    return InvalidArgument("capacity (", FormatSize(options.capacity_bytes),
                           ") must be a multiple of the slab size (", FormatSize(slab), ")");
  }
  const uint64_t n = options.capacity_bytes / slab;
  if (n > kMaxSlabs) return InvalidArgument("too many slabs (", n, "); use larger slabs");
  // MAP_NORESERVE semantics come from the kernel's overcommit: untouched pages cost nothing.
  MappedRegion::Options mo;
  mo.huge_pages = options.huge_pages;
  TESSERA_ASSIGN_OR_RETURN(MappedRegion region,
                           MappedRegion::Anonymous(options.capacity_bytes, mo));
  return std::unique_ptr<SlabPool>(new SlabPool(std::move(region), slab, n));
}

SlabPool::SlabPool(MappedRegion region, uint64_t slab_bytes, uint64_t max_slabs)
    : region_(std::move(region)),
      slab_bytes_(slab_bytes),
      max_slabs_(max_slabs),
      slots_(new Slot[max_slabs]) {
  // Free list in index order, so the lowest slabs are used first.
  for (uint64_t i = 0; i < max_slabs_; ++i) {
    slots_[i].next_free = (i + 1 < max_slabs_) ? static_cast<uint32_t>(i + 1) : kNoSlot;
  }
  free_head_ = 0;
  limit_ = max_slabs_;
}

Result<uint64_t> SlabPool::Alloc(OwnerId owner) {
  if (owner == 0) return InvalidArgument("owner id 0 is reserved");
  std::lock_guard<std::mutex> lock(mu_);
  if (allocated_ >= limit_ || free_head_ == kNoSlot) {
    return ResourceExhausted("no slab available (", allocated_, " of ", limit_,
                             " allowed slabs allocated, capacity ", max_slabs_, ")");
  }
  uint32_t index = free_head_;
  Slot& s = slots_[index];
  free_head_ = s.next_free;
  s.next_free = kNoSlot;
  uint32_t gen = TagGen(s.tag.load(std::memory_order_relaxed)) + 1;
  if (gen == 0) gen = 1;  // Generation 0 never names a live slab.
  s.owner.store(owner, std::memory_order_relaxed);
  s.last_access.store(epoch_.load(std::memory_order_relaxed), std::memory_order_relaxed);
  s.tag.store(MakeTag(gen, SlabState::kAllocated), std::memory_order_release);
  ++allocated_;
  return (static_cast<uint64_t>(gen) << 32) | index;
}

Result<SlabPool::Slot*> SlabPool::LiveSlot(uint64_t slab_id) const {
  uint32_t index = IndexOf(slab_id);
  if (index >= max_slabs_) return NotFound("no slab ", slab_id);
  Slot* s = &slots_[index];
  uint64_t tag = s->tag.load(std::memory_order_acquire);
  if (TagGen(tag) != GenerationOf(slab_id) || TagState(tag) == SlabState::kFree) {
    return NotFound("no slab ", slab_id, " (freed, evicted or never allocated)");
  }
  return s;
}

Status SlabPool::FreeLocked(Slot* slot, uint32_t index) {
  uint64_t tag = slot->tag.load(std::memory_order_relaxed);
  if (TagState(tag) == SlabState::kEvicting) --evicting_;
  slot->tag.store(MakeTag(TagGen(tag), SlabState::kFree), std::memory_order_release);
  slot->owner.store(0, std::memory_order_relaxed);
  --allocated_;
  // Give the pages back to the kernel and make the next owner start from zeros.
  uint8_t* p = region_.data() + static_cast<uint64_t>(index) * slab_bytes_;
  if (::madvise(p, slab_bytes_, MADV_DONTNEED) != 0) {
    // hugetlb mappings on old kernels refuse MADV_DONTNEED: zero explicitly instead.
    std::memset(p, 0, slab_bytes_);
  }
  slot->next_free = free_head_;
  free_head_ = index;
  return Status::Ok();
}

Status SlabPool::Free(OwnerId owner, uint64_t slab_id) {
  std::lock_guard<std::mutex> lock(mu_);
  TESSERA_ASSIGN_OR_RETURN(Slot * s, LiveSlot(slab_id));
  if (s->owner.load(std::memory_order_relaxed) != owner) {
    return PermissionDenied("slab ", slab_id, " belongs to another client");
  }
  return FreeLocked(s, IndexOf(slab_id));
}

Status SlabPool::ForceFree(uint64_t slab_id) {
  std::lock_guard<std::mutex> lock(mu_);
  TESSERA_ASSIGN_OR_RETURN(Slot * s, LiveSlot(slab_id));
  return FreeLocked(s, IndexOf(slab_id));
}

Result<OwnerId> SlabPool::MarkEvicting(uint64_t slab_id) {
  std::lock_guard<std::mutex> lock(mu_);
  TESSERA_ASSIGN_OR_RETURN(Slot * s, LiveSlot(slab_id));
  uint64_t tag = s->tag.load(std::memory_order_relaxed);
  if (TagState(tag) == SlabState::kEvicting) {
    return InvalidArgument("slab ", slab_id, " is already being evicted");
  }
  s->tag.store(MakeTag(TagGen(tag), SlabState::kEvicting), std::memory_order_release);
  ++evicting_;
  return s->owner.load(std::memory_order_relaxed);
}

Result<std::span<uint8_t>> SlabPool::Resolve(OwnerId owner, uint64_t slab_id, uint64_t offset,
                                             uint64_t length) {
  return ResolveChecked(&owner, slab_id, offset, length);
}

Result<std::span<uint8_t>> SlabPool::ResolveAnyOwner(uint64_t slab_id, uint64_t offset,
                                                     uint64_t length) {
  return ResolveChecked(nullptr, slab_id, offset, length);
}

Result<OwnerId> SlabPool::OwnerOf(uint64_t slab_id) {
  std::lock_guard<std::mutex> lock(mu_);
  TESSERA_ASSIGN_OR_RETURN(Slot * s, LiveSlot(slab_id));
  return s->owner.load(std::memory_order_relaxed);
}

Result<std::span<uint8_t>> SlabPool::ResolveChecked(const OwnerId* owner, uint64_t slab_id,
                                                    uint64_t offset, uint64_t length) {
  uint32_t index = IndexOf(slab_id);
  if (index >= max_slabs_) return NotFound("no slab ", slab_id);
  if (length == 0) return InvalidArgument("zero-length access to slab ", slab_id);
  if (offset > slab_bytes_ || length > slab_bytes_ - offset) {
    return OutOfRange("access [", offset, ", +", length, ") is outside slab ", slab_id, " of ",
                      slab_bytes_, " bytes");
  }
  Slot& s = slots_[index];
  uint64_t t1 = s.tag.load(std::memory_order_acquire);
  uint64_t o = s.owner.load(std::memory_order_acquire);
  uint64_t t2 = s.tag.load(std::memory_order_acquire);
  if (t1 != t2 || TagGen(t1) != GenerationOf(slab_id) || TagState(t1) == SlabState::kFree) {
    return NotFound("no slab ", slab_id, " (freed, evicted or never allocated)");
  }
  if (owner != nullptr && o != *owner) {
    return PermissionDenied("slab ", slab_id, " belongs to another client");
  }
  uint64_t e = epoch_.load(std::memory_order_relaxed);
  if (s.last_access.load(std::memory_order_relaxed) != e) {
    s.last_access.store(e, std::memory_order_relaxed);
  }
  return std::span<uint8_t>(region_.data() + static_cast<uint64_t>(index) * slab_bytes_ + offset,
                            length);
}

Result<std::span<uint8_t>> SlabPool::RawSlab(uint64_t slab_id) {
  std::lock_guard<std::mutex> lock(mu_);
  TESSERA_ASSIGN_OR_RETURN(Slot * s, LiveSlot(slab_id));
  (void)s;
  return std::span<uint8_t>(region_.data() + static_cast<uint64_t>(IndexOf(slab_id)) * slab_bytes_,
                            slab_bytes_);
}

Result<uint64_t> SlabPool::OffsetOf(uint64_t slab_id) const {
  uint32_t index = IndexOf(slab_id);
  if (index >= max_slabs_) return NotFound("no slab ", slab_id);
  return static_cast<uint64_t>(index) * slab_bytes_;
}

void SlabPool::SetLimit(uint64_t slabs) {
  std::lock_guard<std::mutex> lock(mu_);
  limit_ = slabs > max_slabs_ ? max_slabs_ : slabs;
}

SlabPool::Counts SlabPool::counts() const {
  std::lock_guard<std::mutex> lock(mu_);
  return Counts{max_slabs_, limit_, allocated_, evicting_};
}

std::vector<SlabPool::SlabInfo> SlabPool::AllocatedSlabs() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<SlabInfo> out;
  out.reserve(allocated_);
  for (uint64_t i = 0; i < max_slabs_ && out.size() < allocated_; ++i) {
    const Slot& s = slots_[i];
    uint64_t tag = s.tag.load(std::memory_order_relaxed);
    if (TagState(tag) == SlabState::kFree) continue;
    out.push_back(SlabInfo{(static_cast<uint64_t>(TagGen(tag)) << 32) | i,
                           s.owner.load(std::memory_order_relaxed), TagState(tag),
                           s.last_access.load(std::memory_order_relaxed)});
  }
  return out;
}

uint64_t SlabPool::SlabsOwnedBy(OwnerId owner) const {
  uint64_t n = 0;
  for (const SlabInfo& s : AllocatedSlabs()) n += s.owner == owner;
  return n;
}

}  // namespace tessera::memserver
