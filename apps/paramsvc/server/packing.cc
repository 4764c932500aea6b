#include "apps/paramsvc/server/packing.h"

#include <algorithm>
#include <numeric>

namespace tessera::paramsvc {
namespace {

// Plain FFD: how many bins of capacity `target` the loads need.
int FfdBins(const std::vector<PackItem>& items, const std::vector<size_t>& order, double target) {
  std::vector<double> bins;
  for (size_t i : order) {
    const double l = items[i].load;
    bool placed = false;
    for (double& b : bins) {
      if (b + l <= target) {
        b += l;
        placed = true;
        break;
      }
    }
    if (!placed) bins.push_back(l);
  }
  return static_cast<int>(bins.size());
}

}  // namespace

PackResult PackPartitions(const std::vector<PackItem>& items, double target, int max_cores) {
  PackResult r;
  r.core.assign(items.size(), 0);
  if (items.empty()) return r;
  if (max_cores < 1) max_cores = 1;
  std::vector<size_t> order(items.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return items[a].load > items[b].load; });
  const int cores = std::clamp(FfdBins(items, order, target), 1, max_cores);
  std::vector<double> used(cores, 0.0);
  std::vector<bool> done(items.size(), false);
  // Sticky pass: heaviest first, keep the current core when it exists and has room.
  for (size_t i : order) {
    const int c = items[i].current;
    if (c >= 0 && c < cores && used[c] + items[i].load <= target) {
      used[c] += items[i].load;
      r.core[i] = c;
      done[i] = true;
    }
  }
  // The rest: first fit, else the least-loaded core (overload when max_cores is too small).
  for (size_t i : order) {
    if (done[i]) continue;
    int pick = -1;
    for (int c = 0; c < cores; ++c) {
      if (used[c] + items[i].load <= target) {
        pick = c;
        break;
      }
    }
    if (pick < 0) pick = static_cast<int>(std::min_element(used.begin(), used.end()) - used.begin());
    used[pick] += items[i].load;
    r.core[i] = pick;
    if (items[i].current >= 0 && items[i].current != pick) ++r.moves;
  }
  r.cores = cores;
  return r;
}

std::vector<PlannedMove> PlanJobMoves(std::vector<ServerLoad> servers, double above,
                                      int max_moves) {
  std::vector<PlannedMove> plan;
  if (servers.size() < 2) return plan;
  std::vector<double> load(servers.size(), 0);
  for (size_t i = 0; i < servers.size(); ++i) {
    if (!(servers[i].capacity > 0)) servers[i].capacity = 1e-9;
    for (const auto& [_, l] : servers[i].jobs) load[i] += l;
  }
  auto util = [&](size_t i) { return load[i] / servers[i].capacity; };
  for (int k = 0; k < max_moves; ++k) {
    size_t src = 0, dst = 0;
    for (size_t i = 1; i < servers.size(); ++i) {
      if (util(i) > util(src)) src = i;
      if (util(i) < util(dst)) dst = i;
    }
    if (src == dst || util(src) <= above) break;
    const double before = util(src);
    int best = -1;
    double best_max = before;
    for (size_t j = 0; j < servers[src].jobs.size(); ++j) {
      const double l = servers[src].jobs[j].second;
      if (!(l > 0)) continue;
      const double us = (load[src] - l) / servers[src].capacity;
      const double ud = (load[dst] + l) / servers[dst].capacity;
      const double m = std::max(us, ud);
      if (m < best_max - 1e-9) {
        best_max = m;
        best = static_cast<int>(j);
      }
    }
    if (best < 0) break;
    auto job = servers[src].jobs[best];
    servers[src].jobs.erase(servers[src].jobs.begin() + best);
    servers[dst].jobs.push_back(job);
    load[src] -= job.second;
    load[dst] += job.second;
    plan.push_back({job.first, static_cast<int>(src), static_cast<int>(dst), job.second});
  }
  return plan;
}

}  // namespace tessera::paramsvc
