#include "apps/kayak/client/controller.h"

#include <algorithm>
#include <cmath>

namespace kayak {

std::string_view ModeName(Mode m) {
  switch (m) {
    case Mode::kKv: return "kv";
    case Mode::kRpc: return "rpc";
    case Mode::kPushback: return "pushback";
    case Mode::kKayak: return "kayak";
  }
  return "?";
}

tessera::Result<Mode> ParseMode(std::string_view name) {
  if (name == "kv" || name == "kv-only") return Mode::kKv;
  if (name == "rpc" || name == "rpc-only") return Mode::kRpc;
  if (name == "pushback" || name == "pushback-only") return Mode::kPushback;
  if (name == "kayak") return Mode::kKayak;
  return tessera::InvalidArgument("unknown mode '", name, "' (kv, rpc, pushback or kayak)");
}

namespace {
// The 99th percentile of a non-empty set of latencies (reorders them).
uint64_t P99(std::vector<uint64_t>& v) {
  const size_t k = (v.size() * 99 + 99) / 100 - 1;
  std::nth_element(v.begin(), v.begin() + k, v.end());
  return v[k];
}
}  // namespace

Controller::Controller(ControllerOptions options, uint64_t now_ns)
    : options_(options),
      window_(std::clamp(options.initial_window, options.min_window, options.max_window)),
      x_(options.initial_x),
      r_start_ns_(now_ns),
      x_start_ns_(now_ns) {
  x_start_window_ = window_;
  switch (options_.mode) {
    case Mode::kKv: x_ = 0; break;
    case Mode::kRpc:
    case Mode::kPushback: x_ = 1; break;
    case Mode::kKayak: x_ = std::clamp(x_, 0.0, 1.0); break;
  }
}

bool Controller::NextIsRpc() {
  credit_ += x_;
  if (credit_ >= 1.0 - 1e-9) {  // Tolerance: 0.3 added ten times is 2.9999...
    credit_ -= 1.0;
    return true;
  }
  return false;
}

void Controller::OnComplete(uint64_t latency_ns, uint64_t now_ns) {
  r_samples_.push_back(latency_ns);
  ++x_completions_;
  Tick(now_ns);
}

void Controller::Tick(uint64_t now_ns) {
  if (now_ns - r_start_ns_ >= options_.r_interval_ns) RunR(now_ns);
  if (now_ns - x_start_ns_ >= options_.x_interval_ns) RunX(now_ns);
}

void Controller::RunR(uint64_t now_ns) {
  if (r_samples_.size() >= options_.r_min_samples && options_.slo_ns > 0) {
    last_p99_ns_ = P99(r_samples_);
    const double p99 = static_cast<double>(last_p99_ns_);
    const double slo = RTarget();
    if (p99 > slo) {
      // (Not from a probe's or its settling interval's requests: those set the p99 themselves.)
      if (x_ == base_x_ && settle_left_ == 0) reached_slo_ = true;
      const double f = std::clamp(slo / p99, options_.r_max_decrease, options_.r_decrease);
      window_ = std::max<uint32_t>(options_.min_window,
                                   static_cast<uint32_t>(std::floor(window_ * f)));
    } else {
      const double grow = std::floor(window_ * options_.r_gain * (1.0 - p99 / slo));
      const uint32_t inc = std::max<uint32_t>(options_.r_increase, static_cast<uint32_t>(grow));
      window_ = std::min(options_.max_window, window_ + inc);
    }
  }
  if (scanning_ && ++scan_r_ > options_.x_scan_skip_r) {
    // A counted R interval of a scanned point (the first x_scan_skip_r are the window adapting).
    scan_count_ += r_samples_.size();
    scan_ns_ += now_ns - r_start_ns_;
    scan_samples_.insert(scan_samples_.end(), r_samples_.begin(), r_samples_.end());
  }
  r_samples_.clear();
  r_start_ns_ = now_ns;
}

double Controller::RTarget() const {
  const double m =
      options_.r_slo_margin + (options_.mode == Mode::kKayak ? options_.r_kayak_margin : 0.0);
  return static_cast<double>(options_.slo_ns) * std::max(0.0, 1.0 - m);
}

void Controller::StartScan(double t) {
  ++scans_;
  scanning_ = true;
  level_window_ = 0;
  window_run_ = 0;
  // Point 0: the X held now, measured over the interval that just ended.
  scan_[0] = ScanPoint{x_, t, t, window_};
  const double target = RTarget();
  if (last_p99_ns_ > 0 && last_p99_ns_ > target) {
    scan_[0].t = t * target / static_cast<double>(last_p99_ns_);
  }
  // Then the pure modes and the middle, nearest first (the window adapts step by step): from a
  // bound the middle and the other bound, from inside the nearer bound and the farther one.
  scan_n_ = 1;
  auto add = [&](double x) { scan_[scan_n_++].x = x; };
  if (x_ <= 0.0) {
    add(0.5);
    add(1.0);
  } else if (x_ >= 1.0) {
    add(0.5);
    add(0.0);
  } else {
    add(x_ <= 0.5 ? 0.0 : 1.0);
    add(x_ <= 0.5 ? 1.0 : 0.0);
  }
  scan_i_ = 1;
  scan_xi_ = 0;
  x_ = scan_[1].x;  // (With the held X's window, as every point of the scan.)
  scan_r_ = 0;
  scan_count_ = scan_ns_ = 0;
  scan_samples_.clear();
}

void Controller::ScanStep() {
  if (++scan_xi_ < std::max<uint32_t>(1, options_.x_scan_intervals)) return;
  scan_xi_ = 0;
  ScanPoint& p = scan_[scan_i_];
  double raw = last_throughput_;
  double p99 = static_cast<double>(last_p99_ns_);
  if (scan_ns_ > 0 && scan_count_ > 0) {
    raw = static_cast<double>(scan_count_) / (static_cast<double>(scan_ns_) / 1e9);
    p99 = static_cast<double>(P99(scan_samples_));
  }
  const double target = RTarget();
  p.raw_t = raw;
  p.t = p99 > target ? raw * target / p99 : raw;
  p.window = window_;
  // From a bound, a middle that lost by more than x_shift: the far bound is not visited (on the
  // bench's curves the other bound is then worse still, e.g. 4-hop KV chains at a third of the
  // RPCs' throughput, and a visit there is the scan's dearest interval).
  const bool from_bound = scan_[0].x <= 0.0 || scan_[0].x >= 1.0;
  if (from_bound && scan_i_ == 1 && p.t < (1.0 - options_.x_shift) * scan_[0].t) scan_n_ = 2;
  if (++scan_i_ < scan_n_) {
    // Every point starts from the held X's window: one that inherited the previous point's
    // window started far from its own (on the bench, X = 1 after X = 0 on 4-hop chains started
    // at 37 where it runs at ~200, scored below X = 0.5 and lost the scan).
    x_ = scan_[scan_i_].x;
    window_ = scan_[0].window;
    scan_r_ = 0;
    scan_count_ = scan_ns_ = 0;
    scan_samples_.clear();
    return;
  }
  EndScan();
}

void Controller::EndScan() {
  scanning_ = false;
  uint32_t best = 0;
  double best_t = scan_[0].t * (1.0 + options_.x_scan_margin);
  for (uint32_t i = 1; i < scan_n_; ++i) {
    if (scan_[i].t > best_t) {
      best = i;
      best_t = scan_[i].t;
    }
  }
  const ScanPoint& b = scan_[best];
  const bool moved = best != scan_n_ - 1;  // X is at the last scanned point now.
  x_ = b.x;
  if (moved) window_ = std::clamp(b.window, options_.min_window, options_.max_window);
  NewBase(b.raw_t);
  // The level is taken afresh once the window has adapted to this X (see RunX).
  level_ready_ = false;
  reached_slo_ = false;
  level_wait_ = 0;
  shift_sign_ = 0;
  settle_left_ = moved ? options_.x_settle_intervals : 0;
  if (x_ <= 0.0 || x_ >= 1.0) {
    // The bound beat the middle and the other bound. Where the middle came close, the optimum
    // may lie between them (a peak near the bound, which the grid does not see): one probe
    // inward by a quarter of the grid's spacing at once. Where it clearly lost (by more than
    // x_shift), or once that probe failed, routine probes (x_bound_probe) come only after the
    // longest hold: a phase change scans again anyway.
    direction_ = x_ <= 0.0 ? 1.0 : -1.0;
    double t_mid = 0;
    for (uint32_t i = 0; i < scan_n_; ++i) {
      if (scan_[i].x > 0.0 && scan_[i].x < 1.0) t_mid = std::max(t_mid, scan_[i].t);
    }
    hold_len_ = options_.x_max_hold;
    if (t_mid >= (1.0 - options_.x_shift) * b.t) {
      step_ = std::max(options_.x_bound_probe, options_.x_initial_step * 0.5);
      hold_left_ = 0;
    } else {
      step_ = options_.x_bound_probe;
      hold_left_ = hold_len_;
    }
  } else {
    // Inside: climb towards the better bound first, by half the grid's spacing.
    double t_lo = 0, t_hi = 0;
    for (uint32_t i = 0; i < scan_n_; ++i) {
      if (scan_[i].x <= 0.0) t_lo = scan_[i].t;
      if (scan_[i].x >= 1.0) t_hi = scan_[i].t;
    }
    direction_ = t_hi >= t_lo ? 1.0 : -1.0;
    step_ = std::max(options_.x_min_step, options_.x_initial_step * 0.5);
    hold_len_ = 1;
    hold_left_ = 0;
  }
}

void Controller::MoveX() {
  const double next = std::clamp(x_ + direction_ * step_, 0.0, 1.0);
  if (next == x_) {
    // Pushing against a bound throughput favours: stay, and probe inward after the hold.
    hold_left_ = hold_len_;
    return;
  }
  x_ = next;
  move_window_ = window_;
}

void Controller::MoveBack() {
  x_ = base_x_;
  settle_left_ = options_.x_settle_intervals;
  if (options_.x_restore_window && window_ < move_window_) {
    window_ = move_window_;
  }
}

void Controller::RunX(uint64_t now_ns) {
  const double secs = static_cast<double>(now_ns - x_start_ns_) / 1e9;
  const double t = secs > 0 ? static_cast<double>(x_completions_) / secs : 0;
  last_throughput_ = t;
  x_completions_ = 0;
  x_start_ns_ = now_ns;
  // Whether the R-loop kept the window steady over this interval (see x_window_swing).
  const double sw = options_.x_window_swing;
  const uint32_t lo = std::min(x_start_window_, window_), hi = std::max(x_start_window_, window_);
  const bool steady = sw <= 0 || hi <= lo + 4 || hi <= sw * lo;
  x_start_window_ = window_;
  if (options_.mode != Mode::kKayak) return;
  if (scanning_) {
    ScanStep();
    return;
  }
  if (base_x_ < 0) {  // The first interval: a baseline, then the first step (or wait to scan).
    NewBase(t);
    step_ = options_.x_initial_step;
    if (!options_.x_scan) MoveX();
    return;
  }
  if (settle_left_ > 0) {
    --settle_left_;
    return;
  }
  auto inward = [](double x) { return x <= 0.0 ? 1.0 : -1.0; };
  // Phase change: two intervals in a row far from the level of the current X, the same way
  // (only when X is near where that level was measured: a long step moves throughput itself).
  // Until the window first holds steady (start-up) the level just follows the throughput;
  // after, an interval over which the window moved a lot neither updates the level nor
  // confirms or clears a phase change.
  const bool was_ready = level_ready_;
  if (!level_ready_) {
    level_t_ = t;
    // (Start-up lasts until the R-loop first reached the SLO: until then throughput rises with
    // the window, each interval by less than the swing, and a level learnt on the way up made
    // a false phase change and a long probe at ~0.5 s in every simulated run.)
    level_ready_ = steady && (reached_slo_ || !options_.x_level_after_slo);
  }
  if (options_.x_scan && !was_ready) {
    // X holds while the level is taken: at start-up and after each scan, until the R-loop has
    // reached its target at this X with a steady window (a throughput still rising with the
    // window would be credited to a probe, or read as a phase change: on the bench a window
    // regrowing 19 -> 300 after a scan set off two more scans in a second). At start-up the
    // first scan follows.
    ++level_wait_;
    if (!scanned_ && (level_ready_ || level_wait_ >= options_.x_scan_first_intervals)) {
      scanned_ = true;
      level_ready_ = false;
      level_wait_ = 0;
      StartScan(t);
      return;
    }
    if (!level_ready_ && level_wait_ >= options_.x_level_wait_intervals) level_ready_ = true;
    if (steady && base_t_ > 0) LearnNoise(std::min(std::fabs(t - base_t_) / base_t_, options_.x_shift));
    if (level_ready_) {
      level_wait_ = 0;
      level_window_ = window_;
    }
    base_t_ = t;
    return;
  }
  if (options_.x_scan && options_.x_window_shift > 1 && level_window_ > 0) {
    // The window far from where it was when the level was taken, for as long as a throughput
    // shift must last: a phase change the throughput level missed (a probe that "paid" while
    // a light phase regrew the window reset the level each time; on the bench the switch from
    // a heavy phase at X = 0.5, window ~30, to a light one, ~200, went unseen for 2 s).
    const uint32_t lo = std::min(level_window_, window_), hi = std::max(level_window_, window_);
    window_run_ = hi > options_.x_window_shift * lo && hi > lo + 8 ? window_run_ + 1 : 0;
    if (window_run_ >= std::max<uint32_t>(2, options_.x_shift_intervals)) {
      ++shifts_;
      shift_sign_ = 0;
      shift_run_ = 0;
      StartScan(t);
      return;
    }
  }
  const double dev = level_t_ > 0 ? (t - level_t_) / level_t_ : 0;
  if (!steady || std::fabs(x_ - base_x_) > 0.1) {
    // (Leave shift_sign_ as it is: a far probe's interval neither confirms nor clears one.)
  } else if (std::fabs(dev) > std::max(options_.x_shift, 4 * noise_)) {
    const int sign = dev > 0 ? 1 : -1;
    shift_run_ = shift_sign_ == sign ? shift_run_ + 1 : 1;
    if (shift_run_ >= std::max<uint32_t>(2, options_.x_shift_intervals)) {
      ++shifts_;
      shift_sign_ = 0;
      shift_run_ = 0;
      if (options_.x_scan) {
        StartScan(t);
        return;
      }
      step_ = std::max(step_, options_.x_initial_step);
      hold_len_ = 1;
      NewBase(t);
      if (x_ <= 0.0 || x_ >= 1.0) direction_ = inward(x_);
      MoveX();
      return;
    }
    shift_sign_ = sign;
  } else {
    shift_sign_ = 0;
    shift_run_ = 0;
  }
  const bool from_bound = base_x_ <= 0.0 || base_x_ >= 1.0;
  if (x_ == base_x_) {
    // X held for this interval: learn the noise, refresh the baseline, then probe.
    const double rel = base_t_ > 0 ? std::min(std::fabs(t - base_t_) / base_t_, options_.x_shift) : 0;
    // (An interval that may be the first of a phase change teaches neither noise nor level.
    // The first estimate starts from x_min_noise: see x_fresh_noise.)
    if (shift_sign_ == 0 && steady) {
      LearnNoise(rel);
      level_t_ = 0.7 * level_t_ + 0.3 * t;
    }
    base_t_ = t;
    if (hold_left_ > 0) {
      --hold_left_;
      return;
    }
    if (from_bound) {
      // A routine probe from a bound stays close to it (a phase change probes further).
      direction_ = inward(base_x_);
      step_ = std::min(step_, options_.x_bound_probe);
    }
    MoveX();
    return;
  }
  // X moved from base_x_ for this interval: compare with the interval before the move.
  const double rel = base_t_ > 0 ? (t - base_t_) / base_t_ : 0;
  const double tol = std::max(options_.x_min_noise, 2 * noise_);
  bool better = rel > tol;
  if (options_.x_hold_in_noise) {
    // One interval within the noise proves nothing either way: keep the evidence per side of
    // base_x_; a side pays once the mean of its n probes exceeds tol / sqrt(n) (n = 1: a
    // clear gain).
    const int side = direction_ > 0 ? 1 : 0;
    evidence_sum_[side] += rel;
    ++evidence_n_[side];
    const double n = evidence_n_[side];
    better = evidence_sum_[side] / n > tol / std::sqrt(n);
  }
  if (better) {
    // Better: keep going, faster.
    step_ = std::min(step_ * 1.5, options_.x_max_step);
    NewBase(t);
    hold_len_ = 1;
    if (options_.x_hold_in_noise) {
      // The X just left is the other side, and worse by what this move gained: a loss ahead
      // then shortens the step at once instead of probing back there first.
      const int back = direction_ > 0 ? 0 : 1;
      evidence_sum_[back] = -rel;
      evidence_n_[back] = 1;
    }
    MoveX();
  } else if (options_.x_hold_in_noise) {
    // Not (yet) better: back to the base. A clear loss halves the step once both sides were
    // tried (the other side is probed as far first), and then both are tried afresh; a move
    // within the noise and down keeps the step, at most x_bound_probe (probes from a held X
    // stay close to it); one within the noise and up keeps it (a smaller step would hide the
    // gain). The next probe goes to a side not yet tried, else to the side with the better
    // evidence: at once if that evidence is up (not yet enough to move), else after a hold
    // (doubling each time). Where throughput is flat within the noise, X stays put.
    MoveBack();
    const bool both_tried = evidence_n_[0] > 0 && evidence_n_[1] > 0;
    const double old_step = step_;
    if (rel < -tol) {
      if (both_tried || from_bound) step_ = step_ * 0.5;
    } else if (rel <= 0 && (both_tried || from_bound)) {
      step_ = std::min(step_, options_.x_bound_probe);
    }
    step_ = std::max(step_, options_.x_min_step);
    if (!from_bound && rel < -tol && step_ < old_step) {
      // Both sides lost at the old step: try both again closer in (a pattern search; evidence
      // from the longer probes would send the next probe the wrong way).
      evidence_sum_[0] = evidence_sum_[1] = 0;
      evidence_n_[0] = evidence_n_[1] = 0;
    }
    auto mean = [&](int side) { return evidence_sum_[side] / std::max<uint32_t>(1, evidence_n_[side]); };
    bool hold;
    if (from_bound) {
      direction_ = inward(base_x_);
      hold = mean(direction_ > 0 ? 1 : 0) <= 0;
    } else if (evidence_n_[0] == 0 || evidence_n_[1] == 0) {
      direction_ = evidence_n_[1] == 0 ? 1.0 : -1.0;
      hold = false;
    } else {
      direction_ = mean(1) >= mean(0) ? 1.0 : -1.0;
      hold = std::max(mean(0), mean(1)) <= 0;
    }
    if (hold) {
      hold_left_ = hold_len_;
      hold_len_ = std::min(hold_len_ * std::max<uint32_t>(2, options_.x_hold_growth), options_.x_max_hold);
    } else {
      hold_left_ = 0;
    }
  } else if (rel < -tol || from_bound) {
    // Worse, or a probe away from a bound that did not clearly pay: back to the old X and
    // turn around; smaller steps after a loss; from a bound, a longer hold before the next
    // probe each time one fails.
    MoveBack();
    direction_ = -direction_;
    if (rel < -tol) step_ = std::max(step_ * 0.5, options_.x_min_step);
    if (from_bound) {
      hold_left_ = hold_len_;
      hold_len_ = std::min(hold_len_ * std::max<uint32_t>(2, options_.x_hold_growth), options_.x_max_hold);
    } else {
      hold_left_ = 0;
    }
  } else if (rel >= 0) {
    // Within the noise but up: go on the same way with the same step.
    NewBase(t);
    MoveX();
  } else {
    // Within the noise and down: keep the new X, re-measure it, then a smaller step back.
    direction_ = -direction_;
    step_ = std::max(step_ * 0.5, options_.x_min_step);
    NewBase(t);
  }
}

void Controller::LearnNoise(double rel) {
  const double prior = options_.x_fresh_noise ? options_.x_min_noise : rel;
  noise_ = 0.8 * (noise_ == 0 ? prior : noise_) + 0.2 * rel;
}

void Controller::NewBase(double t) {
  base_x_ = x_;
  base_t_ = level_t_ = t;
  hold_left_ = 0;
  evidence_sum_[0] = evidence_sum_[1] = 0;
  evidence_n_[0] = evidence_n_[1] = 0;
}

}  // namespace kayak
