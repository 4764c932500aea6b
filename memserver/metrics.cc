#include "memserver/metrics.h"

#include <sys/resource.h>
#include <unistd.h>

namespace tessera::memserver {

AtomicLatencyHistogram::AtomicLatencyHistogram()
    : counts_(new std::atomic<uint64_t>[LatencyHistogram::kBuckets]) {
  for (int i = 0; i < LatencyHistogram::kBuckets; ++i) counts_[i].store(0);
}

uint64_t AtomicLatencyHistogram::Percentile(double q) const {
  // Counts move while we read; use the sum over the buckets as the population.
  uint64_t total = 0;
  for (int i = 0; i < LatencyHistogram::kBuckets; ++i) {
    total += counts_[i].load(std::memory_order_relaxed);
  }
  if (total == 0) return 0;
  if (q < 0) q = 0;
  if (q > 1) q = 1;
  uint64_t rank = static_cast<uint64_t>(q * static_cast<double>(total - 1)) + 1;
  uint64_t seen = 0;
  for (int i = 0; i < LatencyHistogram::kBuckets; ++i) {
    seen += counts_[i].load(std::memory_order_relaxed);
    if (seen >= rank) {
      return LatencyHistogram::BucketLow(i) + LatencyHistogram::BucketWidth(i) / 2;
    }
  }
  return 0;
}

const char* OpSlotName(OpSlot s) {
  switch (s) {
    case OpSlot::kAlloc: return "alloc";
    case OpSlot::kFree: return "free";
    case OpSlot::kRead: return "read";
    case OpSlot::kWrite: return "write";
    case OpSlot::kStats: return "stats";
    case OpSlot::kHeartbeat: return "heartbeat";
    case OpSlot::kInvoke: return "invoke";
    case OpSlot::kFault: return "fault";
    case OpSlot::kCount: break;
  }
  return "unknown";
}

uint64_t ServerMetrics::total_ops() const {
  uint64_t n = 0;
  for (const auto& c : ops_) n += c.load(std::memory_order_relaxed);
  return n;
}

uint64_t ServerMetrics::total_errors() const {
  uint64_t n = 0;
  for (const auto& c : errors_) n += c.load(std::memory_order_relaxed);
  return n;
}

uint64_t ProcessCpuNs() {
  rusage ru;
  if (::getrusage(RUSAGE_SELF, &ru) != 0) return 0;
  auto ns = [](const timeval& tv) {
    return static_cast<uint64_t>(tv.tv_sec) * 1000000000ull + static_cast<uint64_t>(tv.tv_usec) * 1000ull;
  };
  return ns(ru.ru_utime) + ns(ru.ru_stime);
}

void ServerMetrics::UpdateRates(uint64_t now_ns) {
  uint64_t ops = total_ops();
  uint64_t cpu = ProcessCpuNs();
  if (last_ns_ != 0 && now_ns > last_ns_) {
    double secs = static_cast<double>(now_ns - last_ns_) / 1e9;
    ops_per_sec_milli_.store(static_cast<uint64_t>((ops - last_ops_) / secs * 1000.0),
                             std::memory_order_relaxed);
    long ncpu = ::sysconf(_SC_NPROCESSORS_ONLN);
    if (ncpu < 1) ncpu = 1;
    double busy = static_cast<double>(cpu - last_cpu_ns_) /
                  (static_cast<double>(now_ns - last_ns_) * static_cast<double>(ncpu));
    uint64_t permille = static_cast<uint64_t>(busy * 1000.0 + 0.5);
    load_permille_.store(static_cast<uint32_t>(permille > 1000 ? 1000 : permille),
                         std::memory_order_relaxed);
  }
  last_ns_ = now_ns;
  last_ops_ = ops;
  last_cpu_ns_ = cpu;
}

}  // namespace tessera::memserver
