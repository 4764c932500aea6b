// Fault injection for a memory server: what a `tessera fault` command asks for, and the state
// the request path consults.
//
// Faults are off unless asked for. A FaultSpec is one command (parsed from the CLI words, or
// decoded from a FAULT control call); FaultState holds the faults in force: extra latency on
// chosen ops, hang (never answer), drop the connection, refuse slab allocation. Each lasts until
// `clear` or for a given duration. One-shot actions (crash, bit flips, evictions) are carried
// out by the request handler, which owns the slabs; FaultState only validates them.
//
// Op masks use bit (1 << op) with the fabric wire op values (fabric/wire.h Op; the handler
// static_asserts that the values agree). Mask 0 means READ and WRITE, as on the wire. FAULT
// itself is never delayed, hung or dropped, so `tessera fault SERVER clear` always works.
//
// Threads: Apply() and Decide() may be called from any thread concurrently. Decide() costs one
// relaxed atomic load while no fault is active.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <string_view>

#include "common/status.h"

namespace tessera::memserver {

// Wire op values (fabric::Op) for the masks.
namespace op_bits {
inline constexpr uint16_t kAllocSlab = 3, kFreeSlab = 4, kRead = 5, kWrite = 6, kStats = 7,
                          kHeartbeat = 8, kInvoke = 9, kFault = 10;
}  // namespace op_bits

enum class FaultKind : uint32_t {
  kClear,
  kDelay,        // Delay replies of matching ops by delay_ns.
  kHang,         // Never reply to matching ops.
  kDrop,         // Close the connection of a matching op.
  kCrash,        // Abort the daemon at once.
  kBitFlip,      // Flip `count` random bits in slab_id (0: in random allocated slabs).
  kRefuseAlloc,  // ALLOC_SLAB fails with ResourceExhausted.
  kEvict,        // Evict `count` slabs the normal way (notice, grace period, free).
};
std::string_view FaultKindName(FaultKind k);

struct FaultSpec {
  FaultKind kind = FaultKind::kClear;
  uint32_t op_mask = 0;      // kDelay/kHang/kDrop; 0 = READ|WRITE.
  uint64_t delay_ns = 0;     // kDelay.
  uint64_t duration_ns = 0;  // 0: until cleared. (Not for one-shot actions.)
  uint64_t count = 0;        // kBitFlip, kEvict.
  uint64_t slab_id = 0;      // kBitFlip: 0 = random allocated slabs.
};

// Parses the words after the server on a `tessera fault` command line:
//   clear | delay DURATION | hang | drop | crash | bitflip N [SLAB_ID] | refuse-alloc | evict N
// plus the optional op list ("read,write,alloc,free,stats,heartbeat,invoke"; empty = default)
// and duration ("5s"; empty = until cleared). Errors name the bad word.
Result<FaultSpec> ParseFaultCommand(std::span<const std::string> words, std::string_view ops,
                                    std::string_view duration);
// "alloc,read" -> mask. Unknown names are errors.
Result<uint32_t> ParseOpMask(std::string_view ops);
// Checks the fields of a spec from the wire (counts bounded, delay bounded, ...).
Status ValidateFaultSpec(const FaultSpec& spec);

class FaultState {
 public:
  struct Decision {
    uint64_t delay_ns = 0;
    bool hang = false;
    bool drop = false;
  };

  // Installs a persistent fault (delay, hang, drop, refuse-alloc) or clears all. One-shot
  // kinds are rejected here (the handler performs them). `now_ns` is CLOCK_MONOTONIC.
  Status Apply(const FaultSpec& spec, uint64_t now_ns);
  // What to do with a request of wire op `op` arriving at `now_ns`.
  Decision Decide(uint16_t op, uint64_t now_ns);
  bool RefuseAlloc(uint64_t now_ns);
  // "none" or e.g. "delay=200us ops=0x60; refuse-alloc" for STATS.
  std::string Describe(uint64_t now_ns);

 private:
  struct Rule {
    bool on = false;
    uint64_t until_ns = 0;  // UINT64_MAX: until cleared.
    uint32_t op_mask = 0;
    bool Active(uint64_t now) const { return on && now < until_ns; }
  };
  void RecomputeActiveLocked();

  std::atomic<bool> any_{false};
  std::mutex mu_;
  Rule delay_, hang_, drop_, refuse_alloc_;  // Under mu_.
  uint64_t delay_ns_ = 0;                    // Under mu_.
};

}  // namespace tessera::memserver

namespace tessera::memserver {

// Built-in INVOKE functions live at or above this id; applications register below it.
inline constexpr uint32_t kReservedFunctionIdBase = 0xFFFF0000u;
// INVOKE function that carries any FaultSpec (for the fault kinds the wire's FAULT op cannot
// express yet: bit flips and refused allocations). Its argument is EncodeFaultSpec(); its
// result is a text line describing what was done.
inline constexpr uint32_t kFaultFunctionId = 0xFFFF0001u;
inline constexpr size_t kFaultSpecWireSize = 4 + 4 + 8 + 8 + 8 + 8;
std::string EncodeFaultSpec(const FaultSpec& spec);
// Exact length, known kind, then ValidateFaultSpec().
Result<FaultSpec> DecodeFaultSpec(std::string_view bytes);

}  // namespace tessera::memserver
