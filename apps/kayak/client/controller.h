// kayak::Controller: Kayak's two control loops, as pure logic over an injected clock.
//
//   R-loop (fast, every r_interval_ns): the window of requests in flight, steered by the p99
//     latency of the requests completed in the last interval against its target, (1 -
//     r_slo_margin) x the SLO in every mode (so the run's p99 lands within the SLO). Above it the
//     window shrinks in proportion to the overshoot (x SLO/p99, bounded to [r_max_decrease,
//     r_decrease]); below it it grows in proportion to the headroom (by r_gain x window x
//     (1 - p99/SLO), at least r_increase), within [min_window, max_window]. So it runs as fast
//     as it can while p99 stays at the SLO, and recovers in a few intervals after a dip
//     (Kayak's R-loop is proportional to SLO - p99 too; plain AIMD took ~10 intervals).
//   X-loop (slow, every x_interval_ns, a multiple of the R-loop's): X, the fraction of requests
//     sent as RPC (ship compute) rather than KV (ship data), by bounded gradient ascent on the
//     measured throughput, done as paired comparisons: X moves by a step, and the throughput
//     of that interval is compared with the one just before it at the old X (so a drift of the
//     machine affects both alike). Better by more than the noise (tol = 2x the noise learnt
//     from intervals where X did not move): keep going, step x1.5 (up to x_max_step).
//     Otherwise X goes back to the old X (x_hold_in_noise): one interval within the noise
//     proves nothing, so the changes measured on each side of the held X add up as evidence,
//     and X moves once the mean of n probes one way exceeds tol/sqrt(n). The next probe goes
//     to the side with the better evidence (the X just left counts as a loss), at once while
//     it is up, else after a hold of 1, 4, 16, ... intervals (x_hold_growth, up to x_max_hold); once both
//     sides clearly lost, the step halves and both are tried again (a pattern search). So X
//     leaves a held point only when moving clearly pays, and where KV and RPC are within the
//     noise of each other it stays put instead of wandering. At a bound (X = 0 or 1) probes go inward by at most
//     x_bound_probe: an optimum at a bound costs little exploration. After X goes back, the
//     window goes back to what it was before the move (x_restore_window: the move's requests,
//     e.g. a few slow KV chains, set the p99 and cut it) and the next interval is ignored
//     (x_settle_intervals). Phase change: when two intervals in a row land more than x_shift
//     (or 4x the noise) from the throughput level of the current X, the same way, the hold
//     and the evidence end and the step goes back to at least x_initial_step, so X follows a
//     new optimum within a few intervals. Only intervals over which the window held steady
//     (x_window_swing) count for the level and for phase changes, and only once the R-loop has
//     first reached the SLO (x_level_after_slo). The noise estimate starts from x_min_noise
//     (x_fresh_noise), so one start-up comparison cannot set it.
//   Scan (x_scan): the gradient assumes throughput concave in X, which it is not where the
//     client and the memservers share cores (the slower kind of request in a mix sets the p99,
//     so throughput at the SLO sags between the bounds). So at start-up (after
//     x_scan_first_intervals, or once the level is taken) and after each detected phase
//     change, X visits 0, 0.5 and 1 (those it does not hold) for x_scan_intervals each, every
//     one from the held X's window, scores each by its throughput at the SLO (x min(1, target
//     / p99), the first x_scan_skip_r R intervals not counted; from a bound, a middle that lost
//     by more than x_shift ends the scan), and goes to the best with the window it had there;
//     the gradient goes on from that point (once the level is taken there). At a
//     bound that the middle came close to, one probe a quarter of the grid inward follows;
//     otherwise only routine probes after the longest hold.
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
  uint32_t max_window = 1024;
  uint32_t initial_window = 8;
  uint32_t r_increase = 1;       // Least growth per interval while p99 <= SLO.
  double r_gain = 0.5;           // Growth = r_gain x window x (1 - p99/SLO) (at least r_increase).
  double r_decrease = 0.9;       // Largest factor per interval while p99 > SLO ...
  double r_max_decrease = 0.5;   // ... and the smallest: window x clamp(SLO/p99, these two).
  uint32_t r_min_samples = 8;    // Fewer completions in an interval: no R decision.
  // Every mode's R-loop steers the p99 of an interval to (1 - this) x SLO. The window moves
  // every interval, so intervals land on both sides of its target and the run's p99 (over all
  // of them) comes out above the target: steered to the SLO itself, the fixed modes' run p99
  // ended 0.5-5% over the SLO on half of the bench's points, i.e. their throughput was not
  // throughput at the SLO. The same margin for every mode (and for the bench's Redis client)
  // compares them all at the same target.
  double r_slo_margin = 0.05;
  // Kayak mode's extra margin on top of r_slo_margin: room for the X-loop's probes, which send
  // a few requests the slow way (e.g. 4-hop KV chains from X = 1) and add to the run's tail.
  // Until the X-loop scanned the pure modes (x_scan) kayak probed often and needed 0.05 here
  // (its run p99 was 0-5% over the SLO on 12 of 14 bench workloads without it).
  double r_kayak_margin = 0.0;
  // X-loop.
  uint64_t x_interval_ns = 60'000'000;  // 60 ms (3 R intervals)
  double initial_x = 0.5;
  double x_initial_step = 0.25;  // First step, and the step after a detected phase change.
  double x_min_step = 0.05;
  double x_max_step = 0.3;
  double x_min_noise = 0.02;     // A relative throughput change below this is noise.
  double x_shift = 0.2;          // Relative change at an unchanged X taken as a phase change ...
  // ... when this many steady intervals in a row (at least 2) land that far from the level, the
  // same way. With x_scan a false phase change costs a scan, so one more than the 2 that
  // sufficed for the gradient's step: hiccups of the 2-core machine last 100-150 ms.
  uint32_t x_shift_intervals = 3;
  // With x_scan, a window that stays more than this factor (and 8) from the window the level
  // was taken at after the last scan, for x_shift_intervals X intervals, is a phase change
  // too: the throughput level can miss one while probes "pay" on a regrowing window (the bench's
  // switch from a heavy phase at X = 0.5, window ~30, to a light one, ~200). 0: off.
  double x_window_shift = 3.0;
  uint32_t x_max_hold = 16;      // Most X intervals between probes away from a held X.
  // Each failed probe multiplies the hold before the next by this (at least 2). A probe from
  // a bound sends a few requests the slow way (the bench's 4-hop KV chains from X = 1 are 3-4x
  // an RPC's latency), which set that interval's p99 and cut the window; at 2 a 1.5 s run made
  // probes at 1, 2, 4 and 8 intervals, at 4 it makes them at 1, 4 and 16.
  uint32_t x_hold_growth = 4;
  double x_bound_probe = 0.05;   // Largest routine probe away from a bound (or, with
                                 // x_hold_in_noise, from a held X after a probe down).
  // Intervals ignored after X goes back from a move that did not pay: the window is still
  // recovering from the move's requests (e.g. a probe's slow KV chains set the p99), so their
  // throughput is neither a baseline, nor noise, nor a sign of a phase change.
  uint32_t x_settle_intervals = 1;
  // When X goes back from a move that did not pay, the window goes back to at least what it
  // was before the move: it met the SLO at that X, and what cut it since were the move's
  // requests (e.g. 5% KV chains 4x slower than the RPCs set the p99). Without this, regrowing
  // the window after every probe costs more throughput than the probe itself.
  bool x_restore_window = true;
  // An X interval over which the R-loop moved the window by more than this factor (and by
  // more than 4) is not steady: its throughput says what the window did (start-up, regrowth
  // after a stall of the machine, or the R-loop following a phase change), so it neither
  // updates the throughput level nor confirms a phase change; the level is first taken once
  // the window holds steady. (On the bench a window still growing 45 -> 70 after start-up
  // raised throughput 20% above a level learnt while it grew from 8: a false phase change,
  // and a probe to X = 0.75 that cost 30% for two intervals.) 0: every interval is steady.
  double x_window_swing = 1.5;
  // The level is first taken only once the R-loop has reached the SLO (a p99 above its target),
  // not at the first steady interval: a window growing by less than x_window_swing per interval
  // still raises throughput interval after interval.
  bool x_level_after_slo = true;
  // A move whose throughput change is within the noise goes back and holds as a failed probe
  // from a bound does, unless n such probes the same way average more than the tolerance /
  // sqrt(n) (true); or X goes on the way the sign points (false: X wanders where throughput
  // is flat, e.g. where KV and RPC are within the noise of each other).
  bool x_hold_in_noise = true;
  // The noise estimate (a moving average of |relative change| between held intervals) starts
  // from x_min_noise rather than from its first sample. That sample compares with a base
  // measured before the first probe, while the window is still growing at start-up: on the
  // simulated chain1-compute20 curve it was 0.15-0.19, the tolerance twice that, and a 10-15%
  // gain one probe away went unseen for ~0.6 s (X stayed near 0.5).
  bool x_fresh_noise = true;
  // A direct comparison of the pure modes (and the middle), besides the gradient: at start-up
  // (see x_scan_first_intervals) and after each detected phase change, X visits 0, 0.5 and 1
  // (those it does not hold already) for x_scan_intervals X intervals each and goes to
  // whichever gave the most throughput at the SLO (its throughput x
  // min(1, target / its p99), so a window too large for that X does not win by breaking the
  // SLO); the gradient ascent goes on from there. Kayak's gradient ascent assumes throughput
  // concave in X (client and server CPUs apart). Where the client and the memservers share
  // cores, mixing two kinds of request whose slower kind sets the p99 makes throughput sag
  // between the bounds (`tessera bench kayak --x_sweep`: X = 0.5 a local maximum on three of
  // four workloads), and a climb from X = 0.5 stopped there where KV was best (0.69-0.85x kv).
  bool x_scan = true;
  // X intervals each scanned point is measured for. One interval's throughput moves +-10-30%
  // on the 2-core machine (its p99 more); two halve the chance that a hiccup picks the point.
  uint32_t x_scan_intervals = 2;
  // R intervals at the start of each scanned point that are not counted: the window adapting
  // to the new X (and the previous X's requests still in flight).
  uint32_t x_scan_skip_r = 1;
  // A scanned point must beat the X held before the scan by this much (relative) to be taken:
  // a short measurement each, so the held X wins a tie.
  double x_scan_margin = 0.02;
  // X holds after each scan until the level is taken (the R-loop reached its target at a
  // steady window), but at most this many X intervals (e.g. a load too light to reach the
  // target at max_window); then the gradient goes on anyway.
  uint32_t x_level_wait_intervals = 10;
  // The start-up scan begins after this many X intervals at initial_x (or once the level is
  // taken, if sooner). Each point then starts from the same window and grows over the same
  // time, so the way with the lower latency at the SLO grows faster and wins, as it should.
  // Waiting for the level first cost the bench's RPC-best workloads 15-20%: at X = 0.5 the
  // KV chains hold the window small, the level came at 0.4-0.6 s, and X reached 1 only after
  // the 0.45 s warm-up.
  uint32_t x_scan_first_intervals = 2;
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
  // The p99 latency of the last R interval that had enough samples (ns); 0 before the first.
  uint64_t last_p99_ns() const { return last_p99_ns_; }
  // The X-loop's current step and its estimate of the throughput noise (relative).
  double x_step() const { return step_; }
  double x_noise() const { return noise_; }
  // Phase changes the X-loop detected so far.
  uint64_t x_shifts() const { return shifts_; }
  // Scans of the pure modes (x_scan) begun so far, and whether one is under way.
  uint64_t x_scans() const { return scans_; }
  bool x_scanning() const { return scanning_; }

 private:
  void RunR(uint64_t now_ns);
  void RunX(uint64_t now_ns);
  void MoveX();            // x_ += direction_ * step_, clamped; a move that clamps to nothing holds.
  void NewBase(double t);  // X stays at x_ as the new base measured at throughput t.
  void MoveBack();         // X back to base_x_ after a move that did not pay.
  void StartScan(double t);  // x_scan: visit the pure modes and the middle; t was measured at x_.
  void ScanStep();         // x_scan: an X interval of the scan ended.
  void EndScan();          // x_scan: go to the best point and resume the gradient from there.
  double RTarget() const;  // The p99 the R-loop steers to (ns).
  // One |relative change| of throughput between two intervals at the same X, into noise_.
  void LearnNoise(double rel);

  ControllerOptions options_;
  uint32_t window_;
  double x_;
  double credit_ = 0;
  // R-loop state.
  uint64_t r_start_ns_;
  std::vector<uint64_t> r_samples_;
  uint64_t last_p99_ns_ = 0;
  // X-loop state.
  uint64_t x_start_ns_;
  uint64_t x_completions_ = 0;
  double last_throughput_ = 0;
  double base_x_ = -1;        // The X the last comparison's baseline was measured at.
  double base_t_ = 0;         // Throughput measured at base_x_ (the interval before a move).
  double level_t_ = 0;        // Smoothed throughput while X holds (phase-change detector).
  double direction_ = 1;
  double step_ = 0;
  double noise_ = 0;          // Smoothed |relative change| between intervals at one X.
  uint32_t hold_left_ = 0;    // Intervals to stay at base_x_ before the next probe.
  uint32_t hold_len_ = 1;     // The hold after a failed probe from a bound (doubles).
  uint32_t settle_left_ = 0;  // Intervals still ignored after a move back (x_settle_intervals).
  uint32_t move_window_ = 0;  // The window when X last moved from its base.
  uint32_t x_start_window_ = 0;  // The window when this X interval began.
  bool level_ready_ = false;     // level_t_ was taken at a steady window.
  bool reached_slo_ = false;     // The R-loop has seen a p99 above its target.
  double evidence_sum_[2] = {0, 0};  // Relative changes of probes within the noise from base_x_,
  uint32_t evidence_n_[2] = {0, 0};  // down [0] and up [1] (x_hold_in_noise).
  int shift_sign_ = 0;        // A first far move at an unchanged X (+1 up, -1 down), unconfirmed.
  uint32_t shift_run_ = 0;    // Far intervals in a row that way.
  uint32_t level_window_ = 0; // x_scan: the window when the level was last taken after a scan.
  uint32_t window_run_ = 0;   // Intervals in a row with the window x_window_shift from it.
  uint64_t shifts_ = 0;
  // x_scan state. A scan visits up to 3 points; point 0 is the X held when it began.
  struct ScanPoint {
    double x = 0;
    double t = 0;        // Throughput at the SLO (x min(1, target/p99)), completions/s.
    double raw_t = 0;    // Throughput as measured.
    uint32_t window = 0; // The window the point ended with.
  };
  bool scanning_ = false;
  ScanPoint scan_[3];
  uint32_t scan_n_ = 0;         // Points scheduled.
  uint32_t scan_i_ = 0;         // The point being measured.
  uint32_t scan_r_ = 0;         // R intervals of the current point so far.
  uint32_t scan_xi_ = 0;        // X intervals of the current point so far.
  uint64_t scan_count_ = 0;     // Completions in the counted R intervals of the current point.
  uint64_t scan_ns_ = 0;        // Their length.
  std::vector<uint64_t> scan_samples_;  // Their latencies.
  bool scanned_ = false;         // The start-up scan has begun.
  uint32_t level_wait_ = 0;      // X intervals spent waiting for the level (x_scan).
  uint64_t scans_ = 0;
};

}  // namespace kayak
