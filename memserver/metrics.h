// Counters and a latency histogram that the request handler updates from the server's I/O
// threads, and that STATS, the Prometheus endpoint and `tessera status` read.
//
// Everything is a relaxed atomic, so recording never takes a lock and never allocates; a
// reader sees each counter exactly, and the set of counters as of roughly one moment.
//
// Threads: every method may be called from any thread.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "common/histogram.h"

namespace tessera::memserver {

// LatencyHistogram's buckets as atomics: same bucket layout and precision, shareable.
class AtomicLatencyHistogram {
 public:
  AtomicLatencyHistogram();
  void Record(uint64_t ns) {
    counts_[LatencyHistogram::BucketOf(ns)].fetch_add(1, std::memory_order_relaxed);
    count_.fetch_add(1, std::memory_order_relaxed);
    sum_.fetch_add(ns, std::memory_order_relaxed);
  }
  uint64_t count() const { return count_.load(std::memory_order_relaxed); }
  uint64_t sum() const { return sum_.load(std::memory_order_relaxed); }
  // Values recorded in bucket b (LatencyHistogram's layout).
  uint64_t bucket_count(int b) const { return counts_[b].load(std::memory_order_relaxed); }
  // Value at quantile q (bucket midpoint), 0 when empty.
  uint64_t Percentile(double q) const;

 private:
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;
  std::atomic<uint64_t> count_{0}, sum_{0};
};

// Op slots for the per-op counters (independent of wire values).
enum class OpSlot : int { kAlloc, kFree, kRead, kWrite, kStats, kHeartbeat, kInvoke, kFault, kCount };
const char* OpSlotName(OpSlot s);  // "alloc", "read", ...

class ServerMetrics {
 public:
  static constexpr int kOps = static_cast<int>(OpSlot::kCount);

  void CountOp(OpSlot op, bool ok) {
    ops_[static_cast<int>(op)].fetch_add(1, std::memory_order_relaxed);
    if (!ok) errors_[static_cast<int>(op)].fetch_add(1, std::memory_order_relaxed);
  }
  void AddBytesRead(uint64_t n) { bytes_read_.fetch_add(n, std::memory_order_relaxed); }
  void AddBytesWritten(uint64_t n) { bytes_written_.fetch_add(n, std::memory_order_relaxed); }
  void CountFaulted() { faulted_ops_.fetch_add(1, std::memory_order_relaxed); }
  // READ/WRITE requests as they arrived (a READV/WRITEV is one request of many ranges; each
  // range counts as one read/write op).
  void CountDataRequest() { data_requests_.fetch_add(1, std::memory_order_relaxed); }
  uint64_t data_requests() const { return data_requests_.load(std::memory_order_relaxed); }
  void RecordServiceNs(uint64_t ns) { service_.Record(ns); }
  void Connected() { connections_.fetch_add(1, std::memory_order_relaxed); }
  void Disconnected() { connections_.fetch_sub(1, std::memory_order_relaxed); }

  uint64_t ops(OpSlot op) const { return ops_[static_cast<int>(op)].load(std::memory_order_relaxed); }
  uint64_t errors(OpSlot op) const {
    return errors_[static_cast<int>(op)].load(std::memory_order_relaxed);
  }
  uint64_t total_ops() const;
  uint64_t total_errors() const;
  uint64_t bytes_read() const { return bytes_read_.load(std::memory_order_relaxed); }
  uint64_t bytes_written() const { return bytes_written_.load(std::memory_order_relaxed); }
  uint64_t faulted_ops() const { return faulted_ops_.load(std::memory_order_relaxed); }
  int64_t authenticated_connections() const { return connections_.load(std::memory_order_relaxed); }
  const AtomicLatencyHistogram& service() const { return service_; }

  // Rate bookkeeping, called periodically (monitor thread): ops/s over the last period and the
  // process's CPU load (permille of the whole machine) over it.
  void UpdateRates(uint64_t now_ns);
  double ops_per_sec() const { return ops_per_sec_milli_.load(std::memory_order_relaxed) / 1000.0; }
  uint32_t load_permille() const { return load_permille_.load(std::memory_order_relaxed); }

 private:
  std::array<std::atomic<uint64_t>, kOps> ops_{};
  std::array<std::atomic<uint64_t>, kOps> errors_{};
  std::atomic<uint64_t> bytes_read_{0}, bytes_written_{0}, faulted_ops_{0}, data_requests_{0};
  std::atomic<int64_t> connections_{0};
  AtomicLatencyHistogram service_;

  std::atomic<uint64_t> ops_per_sec_milli_{0};
  std::atomic<uint32_t> load_permille_{0};
  // UpdateRates() state (one caller at a time).
  uint64_t last_ns_ = 0, last_ops_ = 0, last_cpu_ns_ = 0;
};

// CPU time (user + system) this process has used, in ns.
uint64_t ProcessCpuNs();

}  // namespace tessera::memserver
