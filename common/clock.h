// Clocks for latency measurement and timeouts.
#pragma once

#include <time.h>

#include <atomic>
#include <cstdint>

namespace tessera {

using MonotonicClockFn = uint64_t (*)();
namespace clock_internal {
inline std::atomic<MonotonicClockFn> simulated{nullptr};
}  // namespace clock_internal

// Replaces MonotonicNs() (and so every Deadline) in the whole process with `fn`, or restores the
// real clock with nullptr. Only for deterministic simulations that drive code on one thread
// under a simulated clock (tests/client/engine_sim_test.cc); set it before that code starts.
inline void SetSimulatedClockForTesting(MonotonicClockFn fn) {
  clock_internal::simulated.store(fn, std::memory_order_release);
}

// Monotonic nanoseconds (CLOCK_MONOTONIC); never goes backwards. Cheap (vDSO; one relaxed load
// more while no simulated clock is set).
inline uint64_t MonotonicNs() {
  if (MonotonicClockFn f = clock_internal::simulated.load(std::memory_order_relaxed)) return f();
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

// A deadline on the monotonic clock, for bounded waits.
class Deadline {
 public:
  static Deadline AfterMs(uint64_t ms) { return Deadline(MonotonicNs() + ms * 1000000ull); }
  static Deadline Never() { return Deadline(UINT64_MAX); }
  explicit Deadline(uint64_t at_ns) : at_ns_(at_ns) {}
  bool Expired() const { return MonotonicNs() >= at_ns_; }
  // Remaining milliseconds, clamped to [0, INT32_MAX] (for poll(2)).
  int RemainingMs() const {
    if (at_ns_ == UINT64_MAX) return -1;
    uint64_t now = MonotonicNs();
    if (now >= at_ns_) return 0;
    uint64_t ms = (at_ns_ - now + 999999) / 1000000;
    return ms > 0x7fffffff ? 0x7fffffff : static_cast<int>(ms);
  }
  uint64_t at_ns() const { return at_ns_; }

 private:
  uint64_t at_ns_;
};

}  // namespace tessera
