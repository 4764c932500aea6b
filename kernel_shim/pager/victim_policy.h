// VictimChooser: which resident pages the evictor takes next (the PagerOptions::victim policy).
//
// kFifo evicts in the order pages became resident. kSmart is 2Q-like with a ghost history and
// write traps. A user-space pager sees no access bits, only faults; so it makes its own: the
// policy write-protects resident dirty pages ("arms a trap", through the callback) as they come
// round, and a write-protect fault on an armed or clean page sets kRef in the page word. New
// pages enter a probation FIFO (1/8 of the cap); a page found written there is promoted to the
// protected segment, as is a page re-faulted while its id is in the ghost list of recently
// evicted pages. Protected is a CLOCK whose pages earn a 2-bit credit for each round in which
// they were written, and spend one per round without, so frequently written pages survive
// several rounds (LFU-like memory). Probation is evicted first while it is above its share.
// Reads of resident pages stay invisible (no trap for them without unmapping the page), so
// read-only hot pages are recognised only through the ghost list.
//
// It reads and CASes the pages' state words (page_state.h), which other threads change too;
// it takes a page only by a CAS kClean/kDirty -> kEvicting, so a page busy elsewhere is skipped
// and looked at again later. Not thread-safe: one thread (the evictor) owns the object.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "client/page_store.h"
#include "kernel_shim/pager/pager.h"

namespace tessera::kernel_shim::internal {

struct Victim {
  client::PageId page;
  bool dirty;  // Mapped writable (or kDirty): needs a write-back unless its bytes are zeros.
  // Taken from the inactive list (kStagedBusy): its bytes are in staging slot `slot`, not
  // mapped in the region.
  bool staged = false;
  uint32_t slot = 0;
};

class VictimChooser {
 public:
  // states: the region's page words (not owned). arm_trap(p): write-protect resident dirty page
  // p so that its next write faults (called only when write_traps).
  VictimChooser(VictimPolicy policy, bool write_traps, std::atomic<uint64_t>* states,
                std::function<void(client::PageId)> arm_trap);

  // Page p became resident (mapped by a fault, or kept by the evictor after a failed or raced
  // write-back).
  void Admit(client::PageId p);
  // Page p became resident again from the inactive list (a minor refault: it was accessed while
  // staged): it is hot, and goes to the protected segment (kSmart; kFifo: the tail of the FIFO).
  void Activate(client::PageId p);
  // Appends up to n victims to *out, each moved to kEvicting (its old state tells `dirty`);
  // cap_pages (the current cap) sizes probation and the ghost list. Returns out->size().
  size_t Pick(size_t n, uint64_t cap_pages, std::vector<Victim>* out);

  size_t tracked() const { return probation_.size() + protected_.size(); }
  bool in_ghost(client::PageId p) const { return ghost_set_.count(p) != 0; }

 private:
  const VictimPolicy policy_;
  const bool write_traps_;
  std::atomic<uint64_t>* const states_;
  const std::function<void(client::PageId)> arm_trap_;
  std::deque<client::PageId> probation_, protected_;
  std::unordered_set<client::PageId> ghost_set_;
  std::deque<client::PageId> ghost_fifo_;
  std::unordered_map<client::PageId, uint8_t> segment_;  // 1 probation, 2 protected.
};

}  // namespace tessera::kernel_shim::internal
