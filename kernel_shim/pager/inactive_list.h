// The inactive list: where the pager keeps eviction candidates for a while before it writes
// them back and drops them, so that reads (which a user-space pager cannot otherwise see) count.
//
// The victim policy (victim_policy.h) picks pages to deactivate. With the inactive list on, the
// evictor moves each such page out of the program's mapping with UFFDIO_MOVE into a slot of a
// staging area (no copy; the page's bytes go along with its page-table entry, so a write before
// the move is in the slot and a write after it faults). Any access to a staged page - a read as
// well as a write - faults; the fault moves the page back (a minor fault: no network) and the
// policy marks it hot. Only pages that reach the old end of the list untouched are written back
// (if dirty) and dropped. Staged pages stay local memory and count against the budget.
//
// InactiveRing is the list's order: a ring of staging slots, filled at the head and emptied at
// the tail. A page that leaves early (its refault moved it back) leaves a hole that the tail
// skips; who holds which slot is the page's state word, the ring is only the order (the pager
// checks the word before it drops anything). Single-threaded: the evictor owns it.
//
// InactiveSizer sizes the list from refaults, the way the kernel's workingset detection does
// (mm/workingset.c): every page dropped from the list leaves a shadow entry with the drop count
// at that moment; when it faults back (a major fault), the refault distance is the number of
// pages dropped since. A distance within the active set means a longer inactive list would have
// caught the page while it was still local: the list grows. A page that reaches the end of the
// list untouched shows the list holds cold pages: it shrinks, a little. Single-threaded.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <unordered_map>
#include <vector>

#include "client/page_store.h"

namespace tessera::kernel_shim::internal {

class InactiveRing {
 public:
  static constexpr client::PageId kHole = ~client::PageId{0};

  // The entries grow with the first lap round the ring (memory only for slots used).
  explicit InactiveRing(size_t slots) : capacity_(slots) {}

  size_t capacity() const { return capacity_; }
  // Slots between tail and head (staged pages and holes).
  size_t span() const { return static_cast<size_t>(head_ - tail_); }
  // Free slots at the head before the ring is full.
  size_t room() const { return capacity() - span(); }
  // Consecutive free slots from the head before the ring wraps (a run moved in one ioctl).
  size_t contiguous_room() const {
    return std::min(room(), capacity() - static_cast<size_t>(head_ % capacity()));
  }

  // Puts page p in the head slot and returns the slot. Requires room() > 0.
  size_t Push(client::PageId p) {
    size_t slot = static_cast<size_t>(head_ % capacity());
    if (slot == slots_.size())
      slots_.push_back(p);
    else
      slots_[slot] = p;
    ++head_;
    return slot;
  }
  // Takes the entry at the tail: *p (kHole for a slot emptied early) and *slot. False if empty.
  bool PopTail(client::PageId* p, size_t* slot) {
    if (head_ == tail_) return false;
    *slot = static_cast<size_t>(tail_ % capacity());
    *p = slots_[*slot];
    slots_[*slot] = kHole;
    ++tail_;
    return true;
  }
  // The page that was pushed into `slot` and is still recorded there (kHole if none).
  client::PageId At(size_t slot) const { return slot < slots_.size() ? slots_[slot] : kHole; }

 private:
  const size_t capacity_;
  std::vector<client::PageId> slots_;
  uint64_t head_ = 0, tail_ = 0;
};

struct InactiveSizerOptions {
  double initial_fraction = 0.125;  // Of the cap, at start.
  double min_fraction = 1.0 / 16;
  double max_fraction = 0.25;
  double grow_step = 1.0 / 256;     // Per refault that a longer list would have caught.
  double shrink_step = 1.0 / 4096;  // Per page dropped untouched.
};

class InactiveSizer {
 public:
  explicit InactiveSizer(InactiveSizerOptions o = {}) : o_(o), fraction_(o.initial_fraction) {}

  // The list's target length for a cap of `cap_pages` local pages.
  size_t Target(uint64_t cap_pages) const {
    return static_cast<size_t>(fraction_ * static_cast<double>(cap_pages));
  }
  double fraction() const { return fraction_; }

  // Page p was dropped from the end of the list (it was never touched while staged).
  void Dropped(client::PageId p, uint64_t cap_pages);
  // Page p faulted back from the store (a major fault). `active_pages`: the local pages not on
  // the inactive list now. Returns true if p's refault distance was within them.
  bool Refaulted(client::PageId p, uint64_t active_pages);

  uint64_t drops() const { return drops_; }
  uint64_t near_refaults() const { return near_refaults_; }

 private:
  const InactiveSizerOptions o_;
  double fraction_;
  uint64_t drops_ = 0, near_refaults_ = 0;
  // Shadow entries: page -> drop count when it was dropped; oldest first in shadow_fifo_
  // (bounded to the cap: a page dropped longer ago than that is far anyway).
  std::unordered_map<client::PageId, uint64_t> shadow_;
  std::deque<std::pair<client::PageId, uint64_t>> shadow_fifo_;
};

}  // namespace tessera::kernel_shim::internal
