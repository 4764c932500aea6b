// The pager's per-page state word (see pager.h for the pager's contract).
//
// Every page of the paged region has one 64-bit atomic word (an untouched anonymous mapping, so
// only pages whose words are touched cost memory; all-zero is kNever). Bits 0-3 hold the state,
// bits 8-24 flags, bits 32-63 the index of a fill context (prefetch buffer) while the page is
// kPrefetching/kPrefetched, or of its staging slot while kStaged/kUnstaging/kStagedBusy. Every
// transition is a CAS on the word, so a flag and a state change are seen together; the fault
// handler, the prefetcher, the evictor and Discard() all go through it (see the state list below,
// and pager.cc for who resolves a waiting fault).
//
// States:
//   kNever       never written (or discarded): a fault maps zeros, no store round trip.
//   kRemote      content in the store, not mapped.
//   kFilling     a fill owns the page (store read in flight, or the UFFDIO_COPY being made).
//   kClean       mapped write-protected; the store holds the same bytes (or it is kNever data).
//   kDirty       mapped writable (or write-protected with a write-protect fault pending).
//   kEvicting    picked by eviction: write-protected, its bytes copied out, write-back in flight.
//   kDropping    eviction is MADV_DONTNEEDing it.
//   kDiscarding  Discard() owns it.
//   kPrefetching a prefetch read is in flight into a pager-owned buffer.
//   kPrefetched  the prefetched bytes wait in that buffer for the page's first fault.
//   kPoisoned    the store could not return it: UFFDIO_POISON, accesses get SIGBUS.
//   kUnpaged     taken out of paging (Pager::Unregister): not registered with userfaultfd,
//                plain memory the pager never maps, evicts or counts.
//   kStaged      on the inactive list: moved (UFFDIO_MOVE) out of the region into staging slot
//                CtxOf(word); kStagedDirty if its bytes are newer than the store's.
//   kUnstaging   a fault thread is moving it back from its slot (a minor refault).
//   kStagedBusy  the evictor is writing it back from its slot or dropping it.
//
// The word is plain data: any thread may read and CAS it. Who may make which transition is
// the pager's protocol (fault_handler.cc, evictor.cc), not enforced here.
#pragma once

#include <cstdint>

namespace tessera::kernel_shim::internal {

enum State : uint64_t {
  kNever = 0,
  kRemote = 1,
  kFilling = 2,
  kClean = 3,
  kDirty = 4,
  kEvicting = 5,
  kDropping = 6,
  kDiscarding = 7,
  kPrefetching = 8,
  kPrefetched = 9,
  kPoisoned = 10,
  kUnpaged = 11,
  kStaged = 12,
  kUnstaging = 13,
  kStagedBusy = 14,
};
constexpr uint64_t kStateMask = 0xf;
// Flags.
constexpr uint64_t kWaitMissing = 1ull << 8;  // A missing fault waits for the owner.
constexpr uint64_t kWaitWrite = 1ull << 9;    // ... and it was a write.
constexpr uint64_t kWaitWp = 1ull << 10;      // A write-protect fault waits (kDropping etc.).
constexpr uint64_t kRedirty = 1ull << 11;     // Written while kEvicting: keep it.
constexpr uint64_t kBusy = 1ull << 12;        // A WP fault is lifting protection.
constexpr uint64_t kInStore = 1ull << 13;     // The store holds a copy (written back once).
constexpr uint64_t kRef = 1ull << 14;         // Written since last considered (policy hint).
constexpr uint64_t kFillWrite = 1ull << 15;   // The fill serves a write fault: map writable.
constexpr uint64_t kArmed = 1ull << 16;      // Write-protected by the policy to see writes.
constexpr uint64_t kStagedDirty = 1ull << 19;  // kStaged/kStagedBusy: needs a write-back.
constexpr int kCreditShift = 17;              // 2-bit count of recent rounds with a write.
constexpr uint64_t kCreditMask = 3ull << kCreditShift;
inline uint64_t Credits(uint64_t w) { return (w & kCreditMask) >> kCreditShift; }
inline uint64_t WithCredits(uint64_t w, uint64_t c) {
  return (w & ~kCreditMask) | (c << kCreditShift);
}
constexpr int kCtxShift = 32;

inline uint64_t St(uint64_t w) { return w & kStateMask; }
inline uint64_t With(uint64_t w, uint64_t state) { return (w & ~kStateMask) | state; }
inline uint32_t CtxOf(uint64_t w) { return static_cast<uint32_t>(w >> kCtxShift); }
inline uint64_t WithCtx(uint64_t w, uint32_t ctx) {
  return (w & 0xffffffffull) | (static_cast<uint64_t>(ctx) << kCtxShift);
}


}  // namespace tessera::kernel_shim::internal
