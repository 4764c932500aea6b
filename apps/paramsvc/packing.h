// Bin packing of aggregation load onto cores (the AutoPS idea): each partition's load is the
// fraction of one core its aggregation needs (its measured bytes/s times the service's measured
// cost per byte); PackPartitions puts them on the fewest cores that keep every core at or under
// the target utilisation, preferring to leave a partition where it is (a move costs a
// migration). A partition heavier than the target gets a core of its own.
//
// Thread safety: a pure function.
#pragma once

#include <cstdint>
#include <vector>

namespace tessera::paramsvc {

struct PackItem {
  double load = 0;   // Fraction of a core (>= 0)
  int current = -1;  // Its core now (-1: none)
};

struct PackResult {
  std::vector<int> core;  // Per item: its core in [0, cores)
  int cores = 0;          // Cores used (>= 1 when there are items)
  int moves = 0;          // Items whose core changed (current >= 0)
};

// First-fit decreasing with stickiness: the number of cores is what FFD needs (at most
// max_cores; beyond that the least-loaded core takes the overflow), then items keep their core
// when it is below `cores` and still has room. target in (0, 1].
PackResult PackPartitions(const std::vector<PackItem>& items, double target, int max_cores);

}  // namespace tessera::paramsvc
