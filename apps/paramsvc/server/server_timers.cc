// The Parameter Service server's background work: pull deadlines, elastic packing of the
// partitions onto as few cores as the load needs, and checkpoints.
#include <poll.h>

#include <algorithm>

#include "apps/paramsvc/server/server_impl.h"
#include "common/clock.h"

namespace tessera::paramsvc {

void Server::Impl::TimerLoop() {
  uint64_t last_pack = MonotonicNs();
  uint64_t last_tick = last_pack;
  std::vector<uint64_t> last_busy(cores.size(), 0);
  while (!stop.load()) {
    pollfd pfd{wake_fd.get(), POLLIN, 0};
    ::poll(&pfd, 1, 10);
    if (stop.load()) return;
    const uint64_t now = MonotonicNs();
    core_us += static_cast<uint64_t>(active.load()) * (now - last_tick) / 1000;
    last_tick = now;
    ExpireWaiters(now);
    if (now - last_pack >= opt.rebalance_ms * 1000000ull) {
      Rebalance(now - last_pack, &last_busy);
      last_pack = now;
    }
  }
}

std::vector<std::shared_ptr<Server::Impl::Job>> Server::Impl::AllJobs() {
  std::lock_guard<std::mutex> l(jobs_mu);
  std::vector<std::shared_ptr<Job>> v;
  for (auto& [_, j] : jobs) v.push_back(j);
  return v;
}

void Server::Impl::ExpireWaiters(uint64_t now) {
  for (auto& job : AllJobs()) {
    for (auto& p : job->parts) {
      std::lock_guard<std::mutex> l(p->mu);
      for (auto it = p->waiters.begin(); it != p->waiters.end();) {
        if (now >= it->deadline_ns) {
          it->conn->SendError(
              static_cast<uint8_t>(Op::kPull), job->id, it->rid,
              Timeout("partition ", p->index, " did not reach version ", it->req.min_version,
                      " within ", it->req.timeout_ms, " ms (at ", p->st.version, ")"));
          it = p->waiters.erase(it);
        } else {
          ++it;
        }
      }
    }
    std::lock_guard<std::mutex> l(job->bmu);
    for (auto bit = job->barriers.begin(); bit != job->barriers.end();) {
      auto& ws = bit->second.waiters;
      for (auto it = ws.begin(); it != ws.end();) {
        if (now >= it->deadline_ns) {
          it->conn->SendError(static_cast<uint8_t>(Op::kBarrier), job->id, it->rid,
                              Timeout("barrier ", bit->first, ": ", bit->second.count, " of ",
                                      job->spec.workers, " workers arrived"));
          it = ws.erase(it);
        } else {
          ++it;
        }
      }
      ++bit;
    }
  }
}

void Server::Impl::Rebalance(uint64_t dt_ns, std::vector<uint64_t>* last_busy) {
  auto all = AllJobs();
  std::vector<Partition*> parts;
  uint64_t bytes = 0;
  for (auto& j : all) {
    for (auto& p : j->parts) {
      const uint64_t b = p->bytes.load();
      const uint64_t d = b - p->last_bytes;
      p->last_bytes = b;
      const double r = static_cast<double>(d) * 1e9 / static_cast<double>(dt_ns);
      p->rate = p->rate == 0 ? r : 0.5 * p->rate + 0.5 * r;
      bytes += d;
      parts.push_back(p.get());
    }
  }
  uint64_t busy = 0;
  for (size_t i = 0; i < cores.size(); ++i) {
    const uint64_t b = cores[i]->busy_ns.load();
    busy += b - (*last_busy)[i];
    (*last_busy)[i] = b;
  }
  if (bytes > (1u << 16)) {
    const double npb = static_cast<double>(busy) / static_cast<double>(bytes);
    ns_per_byte = ns_per_byte == 0 ? npb : 0.7 * ns_per_byte + 0.3 * npb;
  }
  if (parts.empty()) {
    active = elastic.load() ? 0 : max_cores.load();
    return;
  }
  if (!elastic.load()) {
    active = max_cores.load();
    return;
  }
  std::vector<PackItem> items(parts.size());
  for (size_t i = 0; i < parts.size(); ++i) {
    const int t = parts[i]->target.load();
    items[i].load = parts[i]->rate * ns_per_byte / 1e9;
    items[i].current = t >= 0 ? t : parts[i]->core.load();
  }
  PackResult pr = PackPartitions(items, opt.target_utilisation, max_cores.load());
  // Shrink only after three intervals in a row asked for fewer cores (bursty jobs).
  int cur = 0;
  for (const auto& it : items) cur = std::max(cur, it.current + 1);
  if (pr.cores < cur) {
    if (++shrink_streak < 3) {
      active = CountActive(parts);
      return;
    }
  }
  shrink_streak = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (pr.core[i] != items[i].current) Migrate(*parts[i], pr.core[i]);
  }
  active = CountActive(parts);
}

int Server::Impl::CountActive(const std::vector<Partition*>& parts) {
  uint64_t mask[4] = {};
  int n = 0;
  for (Partition* p : parts) {
    for (int c : {p->core.load(), p->target.load()}) {
      if (c < 0) continue;
      if (!(mask[c / 64] & (1ull << (c % 64)))) {
        mask[c / 64] |= 1ull << (c % 64);
        ++n;
      }
    }
  }
  return n;
}

void Server::Impl::CheckpointLoop() {
  while (true) {
    {
      std::unique_lock<std::mutex> l(ckpt_mu);
      ckpt_cv.wait(l, [&] { return stop.load() || ckpt_pending; });
      if (stop.load()) return;
      ckpt_pending = false;
    }
    for (auto& job : AllJobs()) {
      for (auto& p : job->parts) {
        PartitionState copy;
        {
          std::lock_guard<std::mutex> l(p->mu);
          if (!p->dirty) continue;
          p->dirty = false;
          copy = p->st;
        }
        if (job->released.load()) break;
        opt.checkpoint->SavePartition(job->id, p->index, copy);
      }
    }
  }
}

}  // namespace tessera::paramsvc
