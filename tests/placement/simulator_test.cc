// The failure simulator: the hypergeometric maths, Monte Carlo against the analytic mode, and
// the targets at N=1000, S=32, k=8, r=2, f=1% (analytic where Monte Carlo would need
// too many trials; all with fixed seeds, so deterministic).
#include "placement/simulator.h"

#include <gtest/gtest.h>

#include "common/logging.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "placement/coding_sets.h"

namespace tessera::placement {
namespace {

double ChooseD(int n, int k) {
  if (k < 0 || k > n) return 0;
  double c = 1;
  for (int i = 1; i <= k; ++i) c = c * (n - k + i) / i;
  return c;
}

struct Scenario {
  SnapshotPtr snap;
  PlacementPtr policy;
  PlacedSlabs placed;
};

Scenario Build(size_t n, uint64_t slabs, const std::string& word, int k, int r, int l,
            int replicas = 3, uint64_t seed = 1) {
  Scenario s;
  s.snap = *MakeUniformCluster(n, 1u << 30, 0);
  PolicySpec d;
  d.k = k;
  d.r = r;
  d.l = l;
  d.replicas = replicas;
  d.seed = seed;
  auto spec = ParsePolicySpec(word, d);
  TCHECK(spec.ok()) << spec.status();
  auto policy = CreatePolicy(*spec, s.snap);
  TCHECK(policy.ok()) << policy.status();
  s.policy = *policy;
  auto placed = PlaceAll(*s.policy, *s.snap, slabs);
  TCHECK(placed.ok()) << placed.status();
  s.placed = std::move(*placed);
  return s;
}

TEST(SimulatorTest, HypergeometricTailMatchesDirectCounting) {
  // N=30, 5 failed, 6 drawn: P(X >= 2).
  double direct = 0;
  for (int x = 2; x <= 5; ++x) direct += ChooseD(5, x) * ChooseD(25, 6 - x) / ChooseD(30, 6);
  EXPECT_NEAR(static_cast<double>(HypergeometricTail(30, 5, 6, 1)), direct, 1e-15);
  EXPECT_EQ(HypergeometricTail(30, 1, 6, 1), 0.0L);  // cannot lose 2 with 1 failure
  // Tiny probabilities keep their relative precision: N=1e6, 3 failed, 3 drawn.
  long double tiny = HypergeometricTail(1000000, 3, 3, 2);
  long double exact = 6.0L / (1000000.0L * 999999.0L * 999998.0L);
  EXPECT_NEAR(static_cast<double>(tiny / exact), 1.0, 1e-12);
}

TEST(SimulatorTest, WilsonIntervalCoversAndHandlesZero) {
  Interval ci = WilsonInterval(50, 100);
  EXPECT_LT(ci.lo, 0.5);
  EXPECT_GT(ci.hi, 0.5);
  EXPECT_NEAR(ci.hi - ci.lo, 2 * 1.96 * 0.05, 0.01);
  Interval zero = WilsonInterval(0, 10000);
  EXPECT_EQ(zero.lo, 0);
  EXPECT_NEAR(zero.hi, 3.84 / 10000, 1e-5);  // the "rule of three" region
}

TEST(SimulatorTest, MonteCarloIsDeterministicForASeed) {
  Scenario s = Build(60, 240, "random", 4, 1, 0);
  FailureModel m{FailureMode::kMachines, 0.1};
  auto a = RunMonteCarlo(s.placed, *s.snap, m, 500, 9);
  auto b = RunMonteCarlo(s.placed, *s.snap, m, 500, 9);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->loss_events, b->loss_events);
  EXPECT_EQ(a->mean_lost_fraction, b->mean_lost_fraction);
}

TEST(SimulatorTest, FailedUnitsValidatesAndRounds) {
  auto snap = *MakeUniformCluster(1000, 10, 0);
  EXPECT_EQ(*FailedUnits(*snap, {FailureMode::kMachines, 0.01}), 10u);
  EXPECT_EQ(*FailedUnits(*snap, {FailureMode::kMachines, 0.0001}), 1u);
  EXPECT_EQ(*FailedUnits(*snap, {FailureMode::kMachines, 0.0}), 0u);
  EXPECT_FALSE(FailedUnits(*snap, {FailureMode::kMachines, 1.5}).ok());
  auto racks = FailedUnits(*snap, {FailureMode::kRacks, 0.1});
  ASSERT_FALSE(racks.ok());
  EXPECT_NE(racks.status().message().find("rack labels"), std::string::npos);
  auto ranked = *MakeUniformCluster(1000, 10, 20);
  EXPECT_EQ(*FailedUnits(*ranked, {FailureMode::kRacks, 0.1}), 2u);
}

// The exact analytic mode agrees with a closed form: with 3 failures and r = 2, data is lost
// iff all three fall in one coding group whose slabs cover every 3-subset.
TEST(SimulatorTest, ExactAnalyticMatchesClosedFormAtSmallProbabilities) {
  Scenario s = Build(1000, 32000, "codingsets", 8, 2, 2);
  FailureModel m{FailureMode::kMachines, 0.003};
  AnalyticResult an = ComputeAnalytic(s.placed, *s.snap, m);
  ASSERT_TRUE(an.available);
  EXPECT_EQ(an.method, "exact");
  const auto& groups = static_cast<const CodingSets&>(*s.policy).layout().groups;
  long double closed = 0;
  for (const auto& g : groups) closed += ChooseD(static_cast<int>(g.size()), 3);
  closed /= ChooseD(1000, 3);
  EXPECT_NEAR(static_cast<double>(an.loss_prob / closed), 1.0, 1e-9)
      << static_cast<double>(an.loss_prob) << " vs " << static_cast<double>(closed);
  EXPECT_LT(an.loss_prob, 2e-4L);
  // With only r = 2 failures nothing can be lost: exactly 0, not rounding noise.
  AnalyticResult none = ComputeAnalytic(s.placed, *s.snap, {FailureMode::kMachines, 0.002});
  EXPECT_EQ(none.loss_prob, 0.0L);
  EXPECT_EQ(none.lost_fraction, 0.0L);
}

// Monte Carlo and analytic agree within the Monte Carlo 95% CI, on loss probability and lost
// fraction. CodingSets' analytic value is exact for its placement; random placement's is the
// expectation over random placements, so its Monte Carlo pools trials over several placements.
TEST(SimulatorTest, MonteCarloAgreesWithAnalytic) {
  struct Case {
    const char* word;
    double f;
    int placements;
  };
  for (const Case& c : {Case{"codingsets", 0.06, 1}, Case{"random", 0.04, 8},
                        Case{"random_rep", 0.05, 8}}) {
    const uint64_t kTrials = 16000;
    uint64_t events = 0;
    double lost_sum = 0;
    double lost_ci_half = 0;
    AnalyticResult an;
    for (int p = 0; p < c.placements; ++p) {
      Scenario s = Build(100, 200, c.word, 4, 1, 1, 2, 5 + static_cast<uint64_t>(p));
      FailureModel m{FailureMode::kMachines, c.f};
      uint64_t trials = kTrials / static_cast<uint64_t>(c.placements);
      auto mc = RunMonteCarlo(s.placed, *s.snap, m, trials, 11 + static_cast<uint64_t>(p));
      ASSERT_TRUE(mc.ok()) << mc.status();
      events += mc->loss_events;
      lost_sum += mc->mean_lost_fraction * static_cast<double>(trials);
      lost_ci_half = std::max(lost_ci_half, mc->lost_fraction_ci_half);
      an = ComputeAnalytic(s.placed, *s.snap, m);
      ASSERT_TRUE(an.available) << an.method;
    }
    Interval ci = WilsonInterval(events, kTrials);
    double a = static_cast<double>(an.loss_prob);
    EXPECT_EQ(an.method, c.placements == 1 ? "exact" : "iid-random") << c.word;
    EXPECT_GT(a, 0.05) << c.word;  // a regime where the trials resolve it well
    EXPECT_LT(a, 0.95) << c.word;
    double mc_p = static_cast<double>(events) / kTrials;
    EXPECT_GE(a, ci.lo) << c.word << " mc=" << mc_p;
    EXPECT_LE(a, ci.hi) << c.word << " mc=" << mc_p;
    // Lost fraction: exact for any placement (linearity of expectation).
    double lf = static_cast<double>(an.lost_fraction);
    EXPECT_NEAR(lost_sum / kTrials, lf, lost_ci_half) << c.word;
  }
}

TEST(SimulatorTest, AnalyticSaysWhyNotForRackFailures) {
  Scenario s = Build(60, 60, "random", 4, 1, 0);
  AnalyticResult an = ComputeAnalytic(s.placed, *s.snap, {FailureMode::kRacks, 0.1});
  EXPECT_FALSE(an.available);
  EXPECT_NE(an.method.find("machine failures only"), std::string::npos);
}

// The targets at N=1000, S=32, k=8, r=2, l=2, f=1%, from one placement per policy
// (one test, so the placements are built once per test process).
TEST(TargetsTest, CodingSetsBeatsRandomPowerOfTwoAndTwoWayReplication) {
#ifdef TESSERA_SANITIZER_BUILD
  GTEST_SKIP() << "numeric targets are checked in the release pass (~0.5 s there, ~10 s under "
                  "ASan); the same code paths run under the sanitizers in the smaller tests";
#endif
  std::map<std::string, long double> loss;
  std::map<std::string, double> imbalance;
  for (const char* w : {"codingsets", "random", "power:2", "random_rep:2"}) {
    Scenario s = Build(1000, 32000, w, 8, 2, 2, 2);
    AnalyticResult an = ComputeAnalytic(s.placed, *s.snap, {FailureMode::kMachines, 0.01});
    ASSERT_TRUE(an.available) << an.method;
    if (std::string(w) == "codingsets") {
      EXPECT_EQ(an.method, "exact");
    }
    loss[w] = an.loss_prob;
    imbalance[w] = ComputeLoadStats(*s.snap, s.placed.load).max_over_mean;
  }
  auto d = [](long double v) { return static_cast<double>(v); };
  // Loses data at least 10x less often than random placement (same 1.25x overhead).
  EXPECT_LE(loss["codingsets"] * 10, loss["random"])
      << d(loss["codingsets"]) << " vs " << d(loss["random"]);
  // Load imbalance (max/mean) at most 1.10 and no worse than power-of-two-choices.
  EXPECT_LE(imbalance["codingsets"], 1.10);
  EXPECT_LE(imbalance["codingsets"], imbalance["power:2"]);
  // At 1.25x memory, at least 50x less often than 2-way random replication at 2x.
  EXPECT_LE(loss["codingsets"] * 50, loss["random_rep:2"])
      << d(loss["codingsets"]) << " vs " << d(loss["random_rep:2"]);
}

}  // namespace
}  // namespace tessera::placement
