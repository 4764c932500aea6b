#include "apps/paramsvc/packing.h"

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

}  // namespace tessera::paramsvc
