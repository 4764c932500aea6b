#include "memserver/resource_monitor.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "common/clock.h"
#include "common/logging.h"
#include "common/units.h"

namespace tessera::memserver {

Result<uint64_t> MeminfoSource::ParseMemAvailable(std::string_view text) {
  constexpr std::string_view kKey = "MemAvailable:";
  size_t pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    std::string_view line = text.substr(pos, eol == text.npos ? text.npos : eol - pos);
    pos = eol == text.npos ? text.size() : eol + 1;
    if (line.substr(0, kKey.size()) != kKey) continue;
    std::string rest(line.substr(kKey.size()));
    unsigned long long kb = 0;
    char unit[8] = {0};
    int n = std::sscanf(rest.c_str(), " %llu %7s", &kb, unit);
    if (n < 1) return InvalidArgument("bad MemAvailable line '", line, "'");
    if (n == 2 && std::strcmp(unit, "kB") != 0) {
      return InvalidArgument("MemAvailable in unknown unit '", unit, "'");
    }
    if (kb > UINT64_MAX / 1024) return OutOfRange("MemAvailable too large");
    return static_cast<uint64_t>(kb) * 1024;
  }
  return NotFound("no MemAvailable line");
}

Result<uint64_t> MeminfoSource::AvailableBytes() {
  std::ifstream in(path_);
  if (!in) return ErrnoError("open ", path_);
  std::stringstream ss;
  ss << in.rdbuf();
  Result<uint64_t> r = ParseMemAvailable(ss.str());
  if (!r.ok()) return r.status().WithContext(path_);
  return r;
}

uint64_t MonotonicClock::NowNs() { return MonotonicNs(); }

Result<std::unique_ptr<ResourceMonitor>> ResourceMonitor::Create(const Options& options,
                                                                 SlabPool* pool,
                                                                 MemorySource* source,
                                                                 Clock* clock,
                                                                 EvictionSink* sink) {
  if (pool == nullptr || source == nullptr || clock == nullptr || sink == nullptr) {
    return InvalidArgument("resource monitor needs a pool, a memory source, a clock and a sink");
  }
  if (!(options.smoothing > 0.0 && options.smoothing <= 1.0)) {
    return InvalidArgument("smoothing must be in (0, 1], got ", options.smoothing);
  }
  if (options.eviction_grace_ns == 0) return InvalidArgument("eviction grace must be positive");
  Options o = options;
  if (o.grow_hysteresis_bytes == 0) o.grow_hysteresis_bytes = pool->slab_bytes();
  return std::unique_ptr<ResourceMonitor>(new ResourceMonitor(o, pool, source, clock, sink));
}

ResourceMonitor::ResourceMonitor(const Options& o, SlabPool* pool, MemorySource* source,
                                 Clock* clock, EvictionSink* sink)
    : options_(o), pool_(pool), source_(source), clock_(clock), sink_(sink) {}

void ResourceMonitor::Tick() {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t now = clock_->NowNs();
  pool_->AdvanceEpoch();
  FinishDue(now);

  Result<uint64_t> sample = source_->AvailableBytes();
  if (!sample.ok()) {
    // Keep the last decision; a broken source must not evict anything by itself.
    if (sample_errors_.fetch_add(1, std::memory_order_relaxed) == 0) {
      TLOG(WARNING) << "cannot read free memory: " << sample.status();
    }
    return;
  }
  last_sample_.store(*sample, std::memory_order_relaxed);
  double s = static_cast<double>(*sample);
  smoothed_ = have_sample_ ? options_.smoothing * s + (1.0 - options_.smoothing) * smoothed_ : s;
  have_sample_ = true;
  const uint64_t avail = static_cast<uint64_t>(smoothed_);
  smoothed_bytes_.store(avail, std::memory_order_relaxed);

  const SlabPool::Counts c = pool_->counts();
  const uint64_t slab = pool_->slab_bytes();
  const uint64_t staying = c.allocated_slabs - c.evicting_slabs;
  if (avail < options_.headroom_bytes) {
    const uint64_t deficit = options_.headroom_bytes - avail;
    // Slabs already on their way out will give their memory back; do not evict twice for it.
    const uint64_t releasing = c.evicting_slabs * slab;
    const uint64_t need = deficit > releasing ? deficit - releasing : 0;
    const uint64_t n = std::min<uint64_t>((need + slab - 1) / slab, staying);
    const uint64_t started = StartEvictions(n, now);
    pool_->SetLimit(staying - started);
    if (started > 0) {
      TLOG(WARNING) << "free memory " << FormatSize(avail) << " is below the headroom "
                    << FormatSize(options_.headroom_bytes) << ": evicting " << started
                    << " slab(s), allocation limit " << (staying - started);
    }
  } else if (avail >= options_.headroom_bytes + options_.grow_hysteresis_bytes) {
    const uint64_t spare_slabs = (avail - options_.headroom_bytes) / slab;
    uint64_t limit = staying + spare_slabs;
    if (limit < staying) limit = UINT64_MAX;  // overflow
    pool_->SetLimit(std::min(limit, c.max_slabs));
  }
}

uint64_t ResourceMonitor::EvictNow(uint64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  return StartEvictions(n, clock_->NowNs());
}

uint64_t ResourceMonitor::StartEvictions(uint64_t n, uint64_t now_ns) {
  if (n == 0) return 0;
  std::vector<SlabPool::SlabInfo> slabs = pool_->AllocatedSlabs();
  // Least recently used first; ties by id so the choice is deterministic.
  std::sort(slabs.begin(), slabs.end(), [](const auto& a, const auto& b) {
    if (a.last_access_epoch != b.last_access_epoch) {
      return a.last_access_epoch < b.last_access_epoch;
    }
    return a.slab_id < b.slab_id;
  });
  uint64_t started = 0;
  const uint64_t deadline_ms = (options_.eviction_grace_ns + 999999) / 1000000;
  for (const auto& s : slabs) {
    if (started == n) break;
    if (s.state != SlabPool::SlabState::kAllocated) continue;
    // A service's slabs have no client to move their data to; they are never evicted (the
    // service stops growing instead, as the pool's limit falls).
    if (IsServiceOwner(s.owner)) continue;
    Result<OwnerId> owner = pool_->MarkEvicting(s.slab_id);
    if (!owner.ok()) continue;  // Freed meanwhile.
    pending_.push_back(Pending{s.slab_id, *owner, now_ns + options_.eviction_grace_ns});
    sink_->SlabEvicting(*owner, s.slab_id, deadline_ms);
    ++started;
  }
  notices_.fetch_add(started, std::memory_order_relaxed);
  pending_count_.store(pending_.size(), std::memory_order_relaxed);
  return started;
}

void ResourceMonitor::FinishDue(uint64_t now_ns) {
  while (!pending_.empty() && pending_.front().deadline_ns <= now_ns) {
    Pending p = pending_.front();
    pending_.pop_front();
    if (pool_->ForceFree(p.slab_id).ok()) {
      evictions_.fetch_add(1, std::memory_order_relaxed);
      sink_->SlabEvicted(p.owner, p.slab_id);
    } else {
      released_early_.fetch_add(1, std::memory_order_relaxed);
    }
  }
  pending_count_.store(pending_.size(), std::memory_order_relaxed);
}

ResourceMonitor::Stats ResourceMonitor::stats() const {
  Stats s;
  s.smoothed_available_bytes = smoothed_bytes_.load(std::memory_order_relaxed);
  s.last_sample_bytes = last_sample_.load(std::memory_order_relaxed);
  s.notices_sent = notices_.load(std::memory_order_relaxed);
  s.evictions = evictions_.load(std::memory_order_relaxed);
  s.released_early = released_early_.load(std::memory_order_relaxed);
  s.sample_errors = sample_errors_.load(std::memory_order_relaxed);
  s.pending = pending_count_.load(std::memory_order_relaxed);
  return s;
}

}  // namespace tessera::memserver
