// Uffd: a userfaultfd descriptor registered over the pager's region, and the ioctls the pager
// makes on it (copy pages in, wake waiters, write-protect, poison), each retried on EAGAIN (the
// kernel asks again while the address space is changing) a bounded number of times.
//
// Owns the descriptor (closed on destruction; move-only). Every method may be called from any
// thread at once: the kernel serialises the ioctls.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/fd.h"
#include "common/status.h"

namespace tessera::kernel_shim::internal {

class Uffd {
 public:
  // Opens a userfaultfd (through /dev/userfaultfd, else the syscall), negotiates the API with
  // write-protect faults (and UFFD_FEATURE_POISON when the kernel has it), and registers
  // [base, base + len) in missing + write-protect mode. Unsupported if the kernel has no
  // write-protect mode for anonymous memory.
  static Result<Uffd> Open(void* base, size_t len);

  // Takes over the descriptor a UFFD_EVENT_FORK message handed the monitor: the forked child's
  // registration, with the features of `parent` (the kernel copies them to the child's).
  static Uffd Adopt(int fd, const Uffd& parent);

  Uffd() = default;
  Uffd(Uffd&&) = default;
  Uffd& operator=(Uffd&&) = default;

  int fd() const { return fd_.get(); }
  bool has_poison() const { return poison_; }
  bool has_move() const { return move_; }  // UFFDIO_MOVE (kernel 6.8+).
  // UFFD_FEATURE_EVENT_FORK: a fork() child keeps the registration, and the monitor is handed a
  // new descriptor for the child's address space (a UFFD_EVENT_FORK message).
  bool has_fork_events() const { return fork_events_; }
  void Close() { fd_.Reset(); }

  // Maps len bytes of src at dst (page-aligned, unmapped), write-protected unless writable,
  // waking the threads faulting there. *mapped: bytes mapped from the start (on success len).
  // AlreadyExists when a page of the range is mapped already (the bytes before it are mapped).
  Status Copy(void* dst, const void* src, size_t len, bool writable, size_t* mapped);
  // Wakes threads faulting in [addr, addr + len) so they retry their access.
  void Wake(void* addr, size_t len);
  // Sets or clears write protection (clearing wakes the faulting threads).
  Status WriteProtect(void* addr, size_t len, bool protect, int max_attempts = 100000);
  // Registers another range (the pager's staging area) in missing mode on this descriptor, so
  // that pages can be moved between it and the region.
  Status RegisterMissing(void* base, size_t len);
  // Moves the pages of [src, src + len) to [dst, dst + len) (page-table entries, no copy; dst
  // unmapped, both ranges registered here), waking threads faulting at dst if `wake`.
  // *moved: bytes moved from the start. An error for the page at *moved (e.g. Busy: a page
  // shared with a forked child cannot move) - but that page may have moved all the same: the
  // kernel's move loop (6.18) keeps an EAGAIN from one attempt at a page after a retry moved
  // it, tries the page again and reports EEXIST (its destination is now taken), with *moved not
  // counting it; and then it wakes nobody. Only the page tables tell (HasPage).
  Status Move(void* dst, void* src, size_t len, bool wake, size_t* moved);
  // Whether the page at addr (page-aligned, this process) has a page-table entry: mapped, or
  // swapped out (/proc/self/pagemap). An error if the page table cannot be read.
  static Result<bool> HasPage(const void* addr);
  // Makes accesses to [addr, addr + len) raise SIGBUS (needs has_poison()).
  Status Poison(void* addr, size_t len);
  // Registers [addr, addr + len) (page-aligned, a private anonymous mapping) in missing +
  // write-protect mode, or unregisters it (waking the threads faulting there: they retry as
  // ordinary faults). Registering a range registered already is harmless.
  Status Register(void* addr, size_t len);
  Status Unregister(void* addr, size_t len);

 private:
  UniqueFd fd_;
  bool poison_ = false;
  bool move_ = false;
  bool fork_events_ = false;
};

// Tests only: from now on every `every`-th call of Uffd::Move (0: none) in this process, counted
// apart for moves that wake and moves that do not, moves the first page of its range and then
// reports EEXIST for it, *moved not counting it and nobody woken - what the kernel's move loop
// does when an attempt at that page met EAGAIN.
void MisreportMovesForTesting(uint32_t every);

}  // namespace tessera::kernel_shim::internal
