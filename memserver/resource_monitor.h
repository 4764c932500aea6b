// ResourceMonitor: keeps a memory server from starving its own host, in the spirit of the
// Infiniswap/Hydra daemons.
//
// Every Tick() it samples the host's available memory (a MemorySource: /proc/meminfo
// MemAvailable in production, a fake in tests), smooths it (EWMA), and compares it with the
// headroom the host must keep free:
//   - below the headroom: it lowers the pool's allocation limit (no new slabs) and, if that is
//     not enough, picks the least recently used allocated slabs, marks them evicting and asks
//     the EvictionSink to tell their owners (a NOTICE with a deadline). At the deadline the slab
//     is freed and its pages go back to the kernel. A client that frees it earlier is fine.
//   - comfortably above the headroom (more than `grow_hysteresis` above): it raises the limit
//     again, up to the configured capacity, by what the spare memory can hold.
//   - in between: nothing changes (hysteresis, so the limit does not flap).
//
// Time comes from a Clock so tests drive it by hand; nothing here sleeps. The daemon calls
// Tick() from one monitor thread every `interval`.
//
// Ownership: the monitor borrows the pool, the source, the clock and the sink; all must outlive
// it. Threads: Tick() and EvictNow() may be called from any thread (one mutex serialises them;
// the sink is called under it, so the sink must not call back into the monitor); stats() from
// any thread without blocking.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>

#include "common/status.h"
#include "memserver/slab_pool.h"

namespace tessera::memserver {

// Where free host memory is read from.
class MemorySource {
 public:
  virtual ~MemorySource() = default;
  virtual Result<uint64_t> AvailableBytes() = 0;
};

// Reads "MemAvailable: N kB" from a meminfo-format file (default /proc/meminfo). Tests and the
// hidden daemon flag point it at a file they write. Each call re-reads the file.
class MeminfoSource : public MemorySource {
 public:
  explicit MeminfoSource(std::string path = "/proc/meminfo") : path_(std::move(path)) {}
  Result<uint64_t> AvailableBytes() override;
  // Parses meminfo text; exposed for tests.
  static Result<uint64_t> ParseMemAvailable(std::string_view text);

 private:
  std::string path_;
};

class Clock {
 public:
  virtual ~Clock() = default;
  virtual uint64_t NowNs() = 0;
};
class MonotonicClock : public Clock {
 public:
  uint64_t NowNs() override;
};

// Told about each eviction decision; the daemon sends the NOTICE through the fabric server.
class EvictionSink {
 public:
  virtual ~EvictionSink() = default;
  virtual void SlabEvicting(OwnerId owner, uint64_t slab_id, uint64_t deadline_ms) = 0;
  virtual void SlabEvicted(OwnerId owner, uint64_t slab_id) { (void)owner, (void)slab_id; }
};

class ResourceMonitor {
 public:
  struct Options {
    uint64_t headroom_bytes = 1ull << 30;  // Keep at least this much host memory available.
    uint64_t grow_hysteresis_bytes = 0;    // Grow only above headroom + this. 0: one slab.
    double smoothing = 0.5;                // Weight of a new sample in the EWMA, (0, 1].
    uint64_t eviction_grace_ns = 2000000000ull;  // Time an owner gets to move a slab's data.
  };

  struct Stats {
    uint64_t smoothed_available_bytes = 0;
    uint64_t last_sample_bytes = 0;
    uint64_t notices_sent = 0;     // Slabs marked evicting (one NOTICE each).
    uint64_t evictions = 0;        // Slabs freed at their deadline.
    uint64_t released_early = 0;   // Evicting slabs their owner freed before the deadline.
    uint64_t sample_errors = 0;
    uint64_t pending = 0;          // Evictions waiting for their deadline.
  };

  // Validates the options.
  static Result<std::unique_ptr<ResourceMonitor>> Create(const Options& options, SlabPool* pool,
                                                         MemorySource* source, Clock* clock,
                                                         EvictionSink* sink);

  // One round: sample, adjust the limit, start evictions, finish due ones.
  void Tick();
  // Starts the eviction of up to `n` LRU slabs now, whatever the memory says (fault
  // injection's `evict N`). Returns how many were started.
  uint64_t EvictNow(uint64_t n);

  Stats stats() const;
  const Options& options() const { return options_; }

 private:
  struct Pending {
    uint64_t slab_id;
    OwnerId owner;
    uint64_t deadline_ns;
  };
  ResourceMonitor(const Options& o, SlabPool* pool, MemorySource* source, Clock* clock,
                  EvictionSink* sink);
  uint64_t StartEvictions(uint64_t n, uint64_t now_ns);
  void FinishDue(uint64_t now_ns);

  const Options options_;
  SlabPool* pool_;
  MemorySource* source_;
  Clock* clock_;
  EvictionSink* sink_;

  std::mutex mu_;
  bool have_sample_ = false;    // Under mu_.
  double smoothed_ = 0;         // Under mu_.
  std::deque<Pending> pending_; // Under mu_ (ordered by deadline: the grace is constant).

  std::atomic<uint64_t> smoothed_bytes_{0}, last_sample_{0}, notices_{0}, evictions_{0},
      released_early_{0}, sample_errors_{0}, pending_count_{0};
};

}  // namespace tessera::memserver
