#include "placement/simulator.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <numeric>
#include <set>
#include <unordered_set>

namespace tessera::placement {
namespace {

// A small deterministic generator (splitmix64 stream) with unbiased bounded draws.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, n), n > 0 (Lemire's multiply-and-reject).
  uint64_t Below(uint64_t n) {
    while (true) {
      unsigned __int128 m = static_cast<unsigned __int128>(Next()) * n;
      uint64_t low = static_cast<uint64_t>(m);
      if (low >= n || low >= (-n) % n) return static_cast<uint64_t>(m >> 64);
    }
  }

 private:
  uint64_t state_;
};

long double LogChoose(uint64_t n, uint64_t k) {
  if (k > n) return -INFINITY;
  return lgammal(static_cast<long double>(n) + 1) - lgammal(static_cast<long double>(k) + 1) -
         lgammal(static_cast<long double>(n - k) + 1);
}

// Index of each slab's servers in the snapshot.
Result<std::vector<uint32_t>> SlabServerIndices(const PlacedSlabs& placed,
                                                const MembershipSnapshot& snap) {
  std::vector<uint32_t> out(placed.servers.size());
  for (size_t i = 0; i < placed.servers.size(); ++i) {
    int64_t idx = snap.IndexOf(placed.servers[i]);
    if (idx < 0) {
      return InvalidArgument("simulator: slab ", i / static_cast<size_t>(placed.width),
                             " is on server ", placed.servers[i], " which is not a member");
    }
    out[i] = static_cast<uint32_t>(idx);
  }
  return out;
}

}  // namespace

Result<PlacedSlabs> PlaceAll(const Placement& policy, const MembershipSnapshot& snap,
                             uint64_t num_slabs) {
  PlacedSlabs placed;
  placed.width = policy.width();
  placed.tolerance = policy.tolerance();
  placed.num_slabs = num_slabs;
  placed.iid_random = policy.iid_random_sets();
  placed.servers.reserve(num_slabs * static_cast<uint64_t>(placed.width));
  placed.load.assign(snap.size(), 0);
  for (uint64_t s = 0; s < num_slabs; ++s) {
    TESSERA_ASSIGN_OR_RETURN(std::vector<ServerId> servers,
                             policy.Place(snap, s, placed.load));
    if (servers.size() != static_cast<size_t>(placed.width)) {
      return Internal(policy.name(), " placed slab ", s, " on ", servers.size(), " servers");
    }
    for (ServerId id : servers) {
      placed.servers.push_back(id);
      ++placed.load[static_cast<size_t>(snap.IndexOf(id))];
    }
  }
  return placed;
}

LoadStats ComputeLoadStats(const MembershipSnapshot& snap, const std::vector<uint64_t>& load) {
  LoadStats st;
  if (snap.alive().empty()) return st;
  st.min = UINT64_MAX;
  uint64_t sum = 0;
  for (uint32_t i : snap.alive()) {
    st.min = std::min(st.min, load[i]);
    st.max = std::max(st.max, load[i]);
    sum += load[i];
  }
  st.mean = static_cast<double>(sum) / static_cast<double>(snap.alive().size());
  st.max_over_mean = st.mean > 0 ? static_cast<double>(st.max) / st.mean : 0;
  st.max_over_min = st.min > 0 ? static_cast<double>(st.max) / static_cast<double>(st.min)
                               : INFINITY;
  return st;
}

Result<size_t> FailedUnits(const MembershipSnapshot& snap, const FailureModel& model) {
  if (!(model.fraction >= 0.0 && model.fraction <= 1.0)) {
    return InvalidArgument("failure fraction must be in [0, 1], got ", model.fraction);
  }
  size_t units = snap.alive().size();
  if (model.mode == FailureMode::kRacks) {
    if (!snap.has_racks()) {
      return InvalidArgument("rack failures need servers with rack labels (set --racks)");
    }
    units = snap.num_racks();
  }
  auto n = static_cast<size_t>(std::llround(model.fraction * static_cast<double>(units)));
  if (model.fraction > 0 && n == 0) n = 1;
  return std::min(n, units);
}

Interval WilsonInterval(uint64_t successes, uint64_t trials, double z) {
  if (trials == 0) return {0, 1};
  double n = static_cast<double>(trials);
  double p = static_cast<double>(successes) / n;
  double z2 = z * z;
  double denom = 1 + z2 / n;
  double center = (p + z2 / (2 * n)) / denom;
  double half = z * std::sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / denom;
  Interval ci{std::max(0.0, center - half), std::min(1.0, center + half)};
  if (successes == 0) ci.lo = 0;
  if (successes == trials) ci.hi = 1;
  return ci;
}

Result<MonteCarloResult> RunMonteCarlo(const PlacedSlabs& placed, const MembershipSnapshot& snap,
                                       const FailureModel& model, uint64_t trials,
                                       uint64_t seed) {
  if (trials == 0) return InvalidArgument("simulator: need at least one trial");
  TESSERA_ASSIGN_OR_RETURN(size_t failed_units, FailedUnits(snap, model));
  TESSERA_ASSIGN_OR_RETURN(std::vector<uint32_t> idx, SlabServerIndices(placed, snap));
  const size_t w = static_cast<size_t>(placed.width);
  // Inverted index: server index -> slabs with a split on it (CSR).
  std::vector<uint32_t> start(snap.size() + 1, 0);
  for (uint32_t i : idx) ++start[i + 1];
  std::partial_sum(start.begin(), start.end(), start.begin());
  std::vector<uint32_t> slabs_of(idx.size());
  {
    std::vector<uint32_t> fill(start.begin(), start.end() - 1);
    for (size_t p = 0; p < idx.size(); ++p) slabs_of[fill[idx[p]]++] = static_cast<uint32_t>(p / w);
  }
  // Failure units: single machines, or the alive members of each rack.
  std::vector<std::vector<uint32_t>> units;
  if (model.mode == FailureMode::kRacks) {
    units.resize(snap.num_racks());
    for (uint32_t i : snap.alive()) units[snap.rack_index(i)].push_back(i);
  } else {
    for (uint32_t i : snap.alive()) units.push_back({i});
  }
  std::vector<uint32_t> order(units.size());
  std::iota(order.begin(), order.end(), 0);
  std::vector<uint8_t> count(placed.num_slabs, 0);
  std::vector<uint32_t> touched;
  const uint8_t lose_at = static_cast<uint8_t>(placed.tolerance + 1);
  Rng rng(seed);
  MonteCarloResult res;
  res.trials = trials;
  double sum = 0;
  double sum_sq = 0;
  for (uint64_t t = 0; t < trials; ++t) {
    uint64_t lost = 0;
    for (size_t f = 0; f < failed_units; ++f) {
      size_t j = f + rng.Below(order.size() - f);
      std::swap(order[f], order[j]);
      for (uint32_t server : units[order[f]]) {
        for (uint32_t p = start[server]; p < start[server + 1]; ++p) {
          uint32_t s = slabs_of[p];
          if (count[s] == 0) touched.push_back(s);
          if (++count[s] == lose_at) ++lost;
        }
      }
    }
    for (uint32_t s : touched) count[s] = 0;
    touched.clear();
    if (lost > 0) ++res.loss_events;
    double frac = static_cast<double>(lost) / static_cast<double>(placed.num_slabs);
    sum += frac;
    sum_sq += frac * frac;
  }
  double n = static_cast<double>(trials);
  res.loss_prob = static_cast<double>(res.loss_events) / n;
  res.loss_ci = WilsonInterval(res.loss_events, trials);
  res.mean_lost_fraction = sum / n;
  double var = trials > 1 ? std::max(0.0, (sum_sq - sum * sum / n) / (n - 1)) : 0;
  res.lost_fraction_ci_half = 1.959963984540054 * std::sqrt(var / n);
  return res;
}

long double HypergeometricTail(uint64_t n, uint64_t f, uint64_t w, uint64_t tolerance) {
  if (w > n || f > n) return 0;
  long double total = 0;
  long double log_all = LogChoose(n, w);
  for (uint64_t x = tolerance + 1; x <= std::min(w, f); ++x) {
    if (w - x > n - f) continue;
    total += expl(LogChoose(f, x) + LogChoose(n - f, w - x) - log_all);
  }
  return std::min(total, 1.0L);
}

AnalyticResult ComputeAnalytic(const PlacedSlabs& placed, const MembershipSnapshot& snap,
                               const FailureModel& model) {
  AnalyticResult out;
  if (model.mode != FailureMode::kMachines) {
    out.method = "n/a: the analytic mode covers machine failures only";
    return out;
  }
  auto failed_or = FailedUnits(snap, model);
  auto idx_or = SlabServerIndices(placed, snap);
  if (!failed_or.ok() || !idx_or.ok()) {
    out.method = "n/a: " + (failed_or.ok() ? idx_or.status() : failed_or.status()).message();
    return out;
  }
  const uint64_t F = *failed_or;
  const std::vector<uint32_t>& idx = *idx_or;
  const uint64_t N = snap.alive().size();
  const size_t w = static_cast<size_t>(placed.width);
  const uint64_t tol = static_cast<uint64_t>(placed.tolerance);
  const long double p = HypergeometricTail(N, F, w, tol);
  out.available = true;
  out.lost_fraction = p;

  // Servers that share slabs, transitively (union-find over server indices).
  std::vector<uint32_t> parent(snap.size());
  std::iota(parent.begin(), parent.end(), 0);
  auto find = [&](uint32_t x) {
    while (parent[x] != x) x = parent[x] = parent[parent[x]];
    return x;
  };
  for (size_t s = 0; s < placed.num_slabs; ++s) {
    for (size_t j = 1; j < w; ++j) parent[find(idx[s * w + j])] = find(idx[s * w]);
  }
  std::vector<std::vector<uint32_t>> members(snap.size());
  for (uint32_t i : snap.alive()) members[find(i)].push_back(i);
  size_t largest = 0;
  for (const auto& m : members) largest = std::max(largest, m.size());
  constexpr size_t kMaxExactComponent = 22;
  const bool fits = LogChoose(N, F) < 11000.0L;  // long double headroom for the counts
  if (largest <= kMaxExactComponent && fits && w <= 32) {
    // Exact: count the F-subsets of failed servers that lose nothing. Per component, the
    // m-subsets that leave every slab with <= tol failed splits; the components combine by
    // polynomial product, and the F-th coefficient over C(N, F) is P(no loss).
    std::vector<int32_t> local(snap.size(), -1);
    std::vector<std::unordered_set<uint32_t>> masks(snap.size());
    for (const auto& m : members) {
      for (size_t b = 0; b < m.size(); ++b) local[m[b]] = static_cast<int32_t>(b);
    }
    for (size_t s = 0; s < placed.num_slabs; ++s) {
      uint32_t mask = 0;
      for (size_t j = 0; j < w; ++j) mask |= 1u << local[idx[s * w + j]];
      masks[find(idx[s * w])].insert(mask);
    }
    // poly: F-subsets losing nothing; all: every F-subset, built the same way so that the
    // ratio is exactly 1 when nothing can be lost (no lgamma rounding in the denominator).
    std::vector<long double> poly(F + 1, 0.0L);
    std::vector<long double> all(F + 1, 0.0L);
    poly[0] = 1;
    all[0] = 1;
    for (size_t root = 0; root < members.size(); ++root) {
      size_t c = members[root].size();
      if (c == 0) continue;
      std::vector<uint32_t> slab_masks(masks[root].begin(), masks[root].end());
      std::vector<long double> good(c + 1, 0.0L);
      for (uint32_t sub = 0; sub < (1u << c); ++sub) {
        int pc = std::popcount(sub);
        if (static_cast<uint64_t>(pc) > F) continue;
        bool lost = false;
        if (static_cast<uint64_t>(pc) > tol) {
          for (uint32_t sm : slab_masks) {
            if (static_cast<uint64_t>(std::popcount(sub & sm)) > tol) {
              lost = true;
              break;
            }
          }
        }
        if (!lost) good[static_cast<size_t>(pc)] += 1;
      }
      std::vector<long double> choose(c + 1, 1.0L);
      for (size_t m = 1; m <= c; ++m) {
        choose[m] = choose[m - 1] * static_cast<long double>(c - m + 1) / static_cast<long double>(m);
      }
      std::vector<long double> next(F + 1, 0.0L);
      std::vector<long double> next_all(F + 1, 0.0L);
      for (size_t a = 0; a <= F; ++a) {
        for (size_t m = 0; m <= c && a + m <= F; ++m) {
          next[a + m] += poly[a] * good[m];
          next_all[a + m] += all[a] * choose[m];
        }
      }
      poly.swap(next);
      all.swap(next_all);
    }
    out.loss_prob = std::clamp((all[F] - poly[F]) / all[F], 0.0L, 1.0L);
    out.method = "exact";
    return out;
  }
  if (placed.iid_random) {
    out.loss_prob =
        p >= 1 ? 1.0L
               : -expm1l(static_cast<long double>(placed.num_slabs) * log1pl(-p));
    out.method = "iid-random";
    return out;
  }
  // Independent sets: distinct server sets, each lost with probability p.
  std::set<std::vector<ServerId>> distinct;
  for (size_t s = 0; s < placed.num_slabs; ++s) {
    std::vector<ServerId> set(placed.servers.begin() + static_cast<std::ptrdiff_t>(s * w),
                              placed.servers.begin() + static_cast<std::ptrdiff_t>(s * w + w));
    std::sort(set.begin(), set.end());
    distinct.insert(std::move(set));
  }
  out.loss_prob = p >= 1 ? 1.0L
                         : -expm1l(static_cast<long double>(distinct.size()) * log1pl(-p));
  out.method = "independent-sets";
  return out;
}

Result<ChurnResult> SimulateChurn(const Placement& policy, const MembershipSnapshot& snap,
                                  const PlacedSlabs& placed, const SnapshotPtr& next) {
  if (!next) return InvalidArgument("simulator: null membership snapshot");
  TESSERA_ASSIGN_OR_RETURN(PlacementPtr moved_policy, policy.Reconfigure(next));
  std::vector<uint64_t> load(next->size(), 0);
  for (size_t i = 0; i < snap.size(); ++i) {
    int64_t j = next->IndexOf(snap.servers()[i].id);
    if (j >= 0) load[static_cast<size_t>(j)] = placed.load[i];
  }
  auto add_load = [&](ServerId id, int64_t delta) {
    int64_t j = next->IndexOf(id);
    if (j >= 0) load[static_cast<size_t>(j)] += static_cast<uint64_t>(delta);
  };
  const size_t w = static_cast<size_t>(placed.width);
  ChurnResult res;
  std::vector<ServerId> current(w);
  for (uint64_t s = 0; s < placed.num_slabs; ++s) {
    std::span<const ServerId> old(placed.servers.data() + s * w, w);
    if (moved_policy->IsValid(*next, old)) continue;
    ++res.slabs_moved;
    current.assign(old.begin(), old.end());
    uint64_t replaced = 0;
    bool repaired = true;
    for (size_t i = 0; i < w; ++i) {
      if (next->IsAlive(current[i])) continue;
      auto id = moved_policy->ChooseReplacement(*next, s, current, i, load);
      if (!id.ok()) {
        repaired = false;
        break;
      }
      current[i] = *id;
      ++replaced;
    }
    if (!repaired || !moved_policy->IsValid(*next, current)) {
      TESSERA_ASSIGN_OR_RETURN(current, moved_policy->Place(*next, s, load));
      replaced = 0;
      for (ServerId id : current) {
        if (std::find(old.begin(), old.end(), id) == old.end()) ++replaced;
      }
    }
    for (ServerId id : old) add_load(id, -1);
    for (ServerId id : current) add_load(id, 1);
    res.splits_moved += replaced;
  }
  return res;
}

}  // namespace tessera::placement
