// The placement failure simulator behind `tessera sim placement`.
//
// It places num_slabs slabs with a policy (tracking per-server load as it goes, the way the
// client does), then estimates by Monte Carlo the chance that a simultaneous, correlated
// failure (f*N machines chosen at random, or whole racks) loses data, and computes the same
// figures analytically from the hypergeometric distribution. Also measures load imbalance
// and how many slabs must move on a membership change. Single-threaded; the functions are
// pure apart from their outputs, so distinct calls may run on distinct threads.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "placement/membership_snapshot.h"
#include "placement/placement.h"

namespace tessera::placement {

// Slab s is on servers[s*width .. s*width+width) (ServerIds).
struct PlacedSlabs {
  int width = 0;
  int tolerance = 0;
  uint64_t num_slabs = 0;
  bool iid_random = false;  // the policy's iid_random_sets()
  std::vector<ServerId> servers;
  std::vector<uint64_t> load;  // splits per server index of the snapshot, after placement
};

// Places slabs 0..num_slabs-1 in order, each seeing the load of those before it.
Result<PlacedSlabs> PlaceAll(const Placement& policy, const MembershipSnapshot& snap,
                             uint64_t num_slabs);

struct LoadStats {
  uint64_t min = 0;
  uint64_t max = 0;
  double mean = 0;
  double max_over_mean = 0;
  double max_over_min = 0;  // +inf when some alive server holds nothing
};
LoadStats ComputeLoadStats(const MembershipSnapshot& snap, const std::vector<uint64_t>& load);

enum class FailureMode { kMachines, kRacks };

struct FailureModel {
  FailureMode mode = FailureMode::kMachines;
  double fraction = 0.01;
};

// Machines (or racks) failing together under `model`: round(fraction * count), at least 1
// when fraction > 0. InvalidArgument when the fraction is outside [0, 1] or racks are asked
// for without rack labels.
Result<size_t> FailedUnits(const MembershipSnapshot& snap, const FailureModel& model);

// A 95% confidence interval (Wilson score) for a binomial proportion.
struct Interval {
  double lo = 0;
  double hi = 0;
};
Interval WilsonInterval(uint64_t successes, uint64_t trials, double z = 1.959963984540054);

struct MonteCarloResult {
  uint64_t trials = 0;
  uint64_t loss_events = 0;          // trials in which at least one slab lost data
  double loss_prob = 0;
  Interval loss_ci;
  double mean_lost_fraction = 0;     // of slabs (i.e. of data)
  double lost_fraction_ci_half = 0;  // 95% half-width (normal approximation)
};

// `trials` independent failure events; deterministic for a given seed.
Result<MonteCarloResult> RunMonteCarlo(const PlacedSlabs& placed, const MembershipSnapshot& snap,
                                       const FailureModel& model, uint64_t trials, uint64_t seed);

struct AnalyticResult {
  bool available = false;
  long double loss_prob = 0;      // P(at least one slab loses data)
  long double lost_fraction = 0;  // expected fraction of slabs lost (exact: hypergeometric)
  // "exact": every group of servers that share slabs is small enough to enumerate, so the
  // probability is exact for this placement. "iid-random": 1 - (1 - p)^slabs, exact in
  // expectation over random placements (random, random replication; approximate for
  // power-of-choices). "independent-sets": 1 - (1 - p)^(distinct server sets), an
  // approximation for structured placements (CopySets with several permutations). Else why
  // it is not available.
  std::string method;
};

// Machine failures only (rack failures: available = false with the reason in `method`).
AnalyticResult ComputeAnalytic(const PlacedSlabs& placed, const MembershipSnapshot& snap,
                               const FailureModel& model);

// P(X > tolerance) for X ~ Hypergeometric(population n, failed f, draws w), in long double.
long double HypergeometricTail(uint64_t n, uint64_t f, uint64_t w, uint64_t tolerance);

struct ChurnResult {
  uint64_t slabs_moved = 0;   // slabs that had to change at least one server
  uint64_t splits_moved = 0;  // splits/copies written to a new server
};

// Applies a membership change (`next`) to a placement made under `snap`: reconfigures the
// policy and counts the slabs that must move to stay valid (a lost server replaced with
// ChooseReplacement, or the whole slab placed anew when its layout dissolved).
Result<ChurnResult> SimulateChurn(const Placement& policy, const MembershipSnapshot& snap,
                                  const PlacedSlabs& placed, const SnapshotPtr& next);

}  // namespace tessera::placement
