// Bin packing of aggregation load onto cores (the AutoPS idea): each partition's load is the
// fraction of one core its aggregation needs (its measured bytes/s times the service's measured
// cost per byte); PackPartitions puts them on the fewest cores that keep every core at or under
// the target utilisation, preferring to leave a partition where it is (a move costs a
// migration). A partition heavier than the target gets a core of its own.
//
// Thread safety: a pure function.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
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

// Across servers (`tessera paramsvc rebalance`): each server's capacity in cores (max_cores x
// target utilisation) and its jobs' loads (cores; the service's measured bytes/s times its
// cost per byte).
struct ServerLoad {
  std::string name;
  double capacity = 1;
  std::vector<std::pair<std::string, double>> jobs;  // Job name, load
};
struct PlannedMove {
  std::string job;
  int from = 0, to = 0;  // Indexes into the servers
  double load = 0;
};
// Greedy: while the most utilised server (load / capacity) is above `above`, move the one of
// its jobs that most lowers the larger utilisation of it and the least utilised server (a
// move that does not lower it is not made). At most max_moves moves. `above` = 0 spreads the
// load evenly (a server just added takes its share); 0.8 only relieves overloaded servers.
std::vector<PlannedMove> PlanJobMoves(std::vector<ServerLoad> servers, double above,
                                      int max_moves);

// First-fit decreasing with stickiness: the number of cores is what FFD needs (at most
// max_cores; beyond that the least-loaded core takes the overflow), then items keep their core
// when it is below `cores` and still has room. target in (0, 1].
PackResult PackPartitions(const std::vector<PackItem>& items, double target, int max_cores);

}  // namespace tessera::paramsvc
