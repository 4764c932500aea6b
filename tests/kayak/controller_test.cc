// kayak::Controller on a simulated server with known throughput curves: the X-loop finds the
// best RPC fraction, the R-loop keeps p99 at the SLO, and both follow a phase change.
#include "apps/kayak/controller.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>

namespace kayak {
namespace {

// A closed-loop server: with `window` requests in flight and capacity C(X) ops/s, a request
// takes max(base, window / C) (queueing once the window exceeds what the base latency covers);
// its latency varies +-10% uniformly (so p99 ~ 1.1 x the mean). Measured throughput = window /
// latency, with +-2% noise.
struct SimServer {
  std::function<double(double)> capacity;  // ops/s at X
  double base_ns = 50'000;
};

struct SimResult {
  double final_x = 0;
  double final_window = 0;
  double slo_met_fraction = 0;  // Of the R intervals after warm-up.
  double mean_throughput = 0;   // After warm-up.
  double mean_x = 0;            // After warm-up (X hill-climbs: it oscillates a step around).
};

// Runs `ns` of simulated time in 1 ms steps, starting from `c`.
SimResult Simulate(Controller& c, const SimServer& s, uint64_t start_ns, uint64_t ns, uint64_t warmup_ns,
              std::mt19937_64& rng) {
  std::uniform_real_distribution<double> jitter(0.9, 1.1), noise(0.98, 1.02);
  SimResult r;
  uint64_t intervals = 0, met = 0;
  double tput_sum = 0;
  uint64_t tput_n = 0;
  double carry = 0;
  for (uint64_t t = start_ns; t < start_ns + ns; t += 1'000'000) {
    const double cap = s.capacity(c.x());
    const double lat = std::max(s.base_ns, c.window() / cap * 1e9);
    const double rate = c.window() / lat * 1e9 * noise(rng);  // ops/s
    carry += rate / 1000.0;
    double worst = 0;
    while (carry >= 1) {
      carry -= 1;
      const double l = lat * jitter(rng);
      worst = std::max(worst, l);
      c.OnComplete(static_cast<uint64_t>(l), t);
    }
    c.Tick(t);
    if (t >= start_ns + warmup_ns) {
      r.mean_x += c.x();
      tput_sum += rate;
      ++tput_n;
      if (t % c.options().r_interval_ns == 0) {
        ++intervals;
        if (lat * 1.1 <= c.slo_ns() * 1.05) ++met;
      }
    }
  }
  r.final_x = c.x();
  r.final_window = c.window();
  r.slo_met_fraction = intervals ? static_cast<double>(met) / intervals : 0;
  r.mean_throughput = tput_n ? tput_sum / tput_n : 0;
  r.mean_x = tput_n ? r.mean_x / tput_n : 0;
  return r;
}

// Two CPUs, as in Kayak's model: a request costs the client `kv_client` us of CPU the KV way
// (its GETs and the computation) and `rpc_client` us as RPC; it costs the server `kv_server` us
// the KV way (serving GETs) and `rpc_server` us as RPC (the chase and the computation). With a
// fraction X as RPC the throughput is bounded by whichever CPU saturates first, so it peaks
// where the two costs cross: x* = (a - c) / (a - b + d - c).
std::function<double(double)> TwoCpu(double kv_client, double rpc_client, double kv_server,
                                     double rpc_server) {
  return [=](double x) {
    const double client = kv_client * (1 - x) + rpc_client * x;
    const double server = kv_server * (1 - x) + rpc_server * x;
    // Costs in units of 4 us: up to ~100k ops/s, few enough completions that the
    // simulation stays fast under sanitizers.
    return 2.5e5 / std::max(client, server);
  };
}
double PeakX(double a, double b, double c, double d) { return (a - c) / (a - b + d - c); }
// A curve with its peak at x_star.
std::function<double(double)> Peak(double x_star) {
  // Fix b = 1, c = 1, a = 1 + 8 x_star, d: solve x* = (a - c) / (a - b + d - c).
  const double a = 1 + 8 * x_star, b = 1, c = 1;
  const double d = (a - c) / x_star - a + b + c;
  return TwoCpu(a, b, c, d);
}

ControllerOptions Opts(Mode m) {
  ControllerOptions o;
  o.mode = m;
  o.slo_ns = 500'000;  // 500 us
  return o;
}

TEST(ControllerTest, FindsTheBestRpcFractionAndHoldsTheSlo) {
  for (double x_star : {0.15, 0.5, 0.85}) {
    SCOPED_TRACE(x_star);
    std::mt19937_64 rng(7);
    SimServer s{Peak(x_star)};
    Controller c(Opts(Mode::kKayak), 0);
    SimResult r = Simulate(c, s, 0, 10'000'000'000ull, 4'000'000'000ull, rng);
    EXPECT_NEAR(r.mean_x, x_star, 0.12);
    EXPECT_NEAR(r.final_x, x_star, 0.3);
    EXPECT_GE(r.slo_met_fraction, 0.8);
    // Throughput at the SLO close to the best the curve allows.
    EXPECT_GE(r.mean_throughput, 0.8 * s.capacity(x_star));
  }
}

TEST(ControllerTest, BeatsBothFixedModesOnACurveWithAnInteriorPeak) {
  std::mt19937_64 rng(11);
  SimServer s{TwoCpu(8, 2, 2, 8)};  // Peak at 0.5; either pure mode 1/8 us.
  double t[4];
  Mode modes[4] = {Mode::kKv, Mode::kRpc, Mode::kPushback, Mode::kKayak};
  for (int i = 0; i < 4; ++i) {
    Controller c(Opts(modes[i]), 0);
    t[i] = Simulate(c, s, 0, 8'000'000'000ull, 3'000'000'000ull, rng).mean_throughput;
  }
  EXPECT_GE(t[3], std::max(t[0], t[1]));
  EXPECT_GE(t[3], 1.3 * std::min(t[0], t[1]));
}

TEST(ControllerTest, FollowsAPhaseChangeWithinOneSecond) {
  std::mt19937_64 rng(3);
  Controller c(Opts(Mode::kKayak), 0);
  SimServer light{TwoCpu(6, 2, 4, 8)};    // Light compute: x* = 0.25.
  SimServer heavy{TwoCpu(30, 2, 4, 12)};  // Heavy compute: x* = 0.72.
  ASSERT_NEAR(PeakX(6, 2, 4, 8), 0.25, 1e-9);
  ASSERT_NEAR(PeakX(30, 2, 4, 12), 0.722, 1e-3);
  SimResult a = Simulate(c, light, 0, 6'000'000'000ull, 3'000'000'000ull, rng);
  EXPECT_NEAR(a.mean_x, 0.25, 0.12);
  // After the switch, X must be on the heavy side within 2 s (10 X-intervals at most
  // x_max_step 0.2 each plus noise) and stay there.
  // Within 1 s of the switch X is on the heavy side, and over the next second it stays near
  // the new optimum.
  SimResult b = Simulate(c, heavy, 6'000'000'000ull, 2'000'000'000ull, 1'000'000'000ull, rng);
  EXPECT_GT(b.mean_x, 0.5) << "X did not follow the phase change within 1 s";
  SimResult b2 = Simulate(c, heavy, 8'000'000'000ull, 3'000'000'000ull, 0, rng);
  EXPECT_NEAR(b2.mean_x, 0.72, 0.12);
  EXPECT_GE(b2.slo_met_fraction, 0.8);
}

TEST(ControllerTest, RLoopShrinksTheWindowWhenTheServerSlowsDown) {
  std::mt19937_64 rng(5);
  Controller c(Opts(Mode::kKv), 0);
  SimServer fast{[](double) { return 100'000.0; }};
  Simulate(c, fast, 0, 2'000'000'000ull, 0, rng);
  const uint32_t w_fast = c.window();
  SimServer slow{[](double) { return 40'000.0; }};
  SimResult r = Simulate(c, slow, 2'000'000'000ull, 3'000'000'000ull, 1'000'000'000ull, rng);
  EXPECT_LT(c.window(), w_fast / 2);
  EXPECT_GE(r.slo_met_fraction, 0.8);
  EXPECT_EQ(c.x(), 0.0);  // kv mode never sends RPCs.
  int rpc = 0;
  for (int i = 0; i < 100; ++i) rpc += c.NextIsRpc();
  EXPECT_EQ(rpc, 0);
}

TEST(ControllerTest, RpcFractionIsExact) {
  ControllerOptions o = Opts(Mode::kKayak);
  o.initial_x = 0.3;
  Controller c(o, 0);
  int rpc = 0;
  for (int i = 0; i < 1000; ++i) rpc += c.NextIsRpc();
  EXPECT_EQ(rpc, 300);
  EXPECT_EQ(ParseMode("pushback-only").value(), Mode::kPushback);
  EXPECT_FALSE(ParseMode("fast").ok());
}

}  // namespace
}  // namespace kayak
