// kayak::Controller: Kayak's two control loops, as pure logic over an injected clock.
//
//   R-loop (fast, every r_interval_ns): the window of requests in flight. If the p99 latency of
//     the requests completed in the last interval exceeds the SLO the window shrinks
//     multiplicatively (r_decrease); otherwise it grows by r_increase (AIMD), within
//     [min_window, max_window]. So the system runs as fast as it can while p99 stays at the SLO.
//   X-loop (slow, every x_interval_ns, a multiple of the R-loop's): X, the fraction of requests
//     sent as RPC (ship compute) rather than KV (ship data), by bounded gradient ascent on the
//     measured throughput: X moves in the direction that raised throughput last time (turning
//     back when throughput fell), with a step proportional to the relative throughput change
//     (x_gain), bounded to [x_min_step, x_max_step], and X clamped to [0, 1].
//   Which requests go RPC: a deterministic credit counter, so exactly X of them (not a coin).
//
// Every constant is an Options field with a documented default. The published Kayak uses a
// p99 SLO of about 100 us over DPDK; over loopback TCP the default is slo_rtt_multiple times the
// measured round trip (the caller measures it; see kayak::Client).
//
// Modes fix X: kv (0), rpc and pushback (1; pushback lets the server refuse and the client then
// runs KV), kayak (the X-loop). All modes run the R-loop, so they are compared at the same SLO.
//
// Threads: not thread-safe; kayak::Client guards it with a mutex. Times are nanoseconds.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace kayak {

enum class Mode { kKv, kRpc, kPushback, kKayak };
std::string_view ModeName(Mode m);  // "kv", "rpc", "pushback", "kayak"
tessera::Result<Mode> ParseMode(std::string_view name);

struct ControllerOptions {
  Mode mode = Mode::kKayak;
  uint64_t slo_ns = 0;             // p99 target; 0: set by the client from the round trip.
  double slo_rtt_multiple = 20.0;  // Default SLO = this x the measured round trip.
  // R-loop.
  uint64_t r_interval_ns = 20'000'000;  // 20 ms
  uint32_t min_window = 1;
  uint32_t max_window = 256;
  uint32_t initial_window = 8;
  uint32_t r_increase = 1;     // Added per interval while p99 <= SLO.
  double r_decrease = 0.75;    // Multiplied per interval while p99 > SLO.
  uint32_t r_min_samples = 8;  // Fewer completions in an interval: no R decision.
  // X-loop.
  uint64_t x_interval_ns = 100'000'000;  // 100 ms (5 R intervals)
  double initial_x = 0.5;
  double x_gain = 1.0;        // Step = x_gain * |dT| / T, bounded below.
  double x_min_step = 0.02;
  double x_max_step = 0.2;
};

class Controller {
 public:
  explicit Controller(ControllerOptions options, uint64_t now_ns);

  // Whether the next request goes as RPC.
  bool NextIsRpc();
  // A request finished after `latency_ns`.
  void OnComplete(uint64_t latency_ns, uint64_t now_ns);
  // Runs the loops whose interval has passed (called by OnComplete too).
  void Tick(uint64_t now_ns);

  uint32_t window() const { return window_; }
  double x() const { return x_; }
  uint64_t slo_ns() const { return options_.slo_ns; }
  void set_slo_ns(uint64_t slo) { options_.slo_ns = slo; }
  const ControllerOptions& options() const { return options_; }
  // Throughput (completions/s) over the last X interval; 0 before the first.
  double last_throughput() const { return last_throughput_; }

 private:
  void RunR(uint64_t now_ns);
  void RunX(uint64_t now_ns);

  ControllerOptions options_;
  uint32_t window_;
  double x_;
  double credit_ = 0;
  // R-loop state.
  uint64_t r_start_ns_;
  std::vector<uint64_t> r_samples_;
  // X-loop state.
  uint64_t x_start_ns_;
  uint64_t x_completions_ = 0;
  double last_throughput_ = 0;
  double prev_throughput_ = -1;  // Throughput measured at the previous X.
  double direction_ = 1;
};

}  // namespace kayak
