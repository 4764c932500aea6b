#include "apps/kayak/controller.h"

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
    size_t k = (r_samples_.size() * 99 + 99) / 100 - 1;
    std::nth_element(r_samples_.begin(), r_samples_.begin() + k, r_samples_.end());
    last_p99_ns_ = r_samples_[k];
    const double p99 = static_cast<double>(r_samples_[k]);
    const double slo = static_cast<double>(options_.slo_ns) *
                       (options_.mode == Mode::kKayak ? 1.0 - options_.r_kayak_margin : 1.0);
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
  r_samples_.clear();
  r_start_ns_ = now_ns;
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
  if (base_x_ < 0) {  // The first interval: a baseline, then the first step.
    NewBase(t);
    step_ = options_.x_initial_step;
    MoveX();
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
  if (!level_ready_) {
    level_t_ = t;
    // (Start-up lasts until the R-loop first reached the SLO: until then throughput rises with
    // the window, each interval by less than the swing, and a level learnt on the way up made
    // a false phase change and a long probe at ~0.5 s in every simulated run.)
    level_ready_ = steady && (reached_slo_ || !options_.x_level_after_slo);
  }
  const double dev = level_t_ > 0 ? (t - level_t_) / level_t_ : 0;
  if (!steady) {
    // (Leave shift_sign_ as it is.)
  } else if (std::fabs(x_ - base_x_) <= 0.1 && std::fabs(dev) > std::max(options_.x_shift, 4 * noise_)) {
    const int sign = dev > 0 ? 1 : -1;
    if (shift_sign_ == sign) {
      ++shifts_;
      shift_sign_ = 0;
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
  }
  const bool from_bound = base_x_ <= 0.0 || base_x_ >= 1.0;
  if (x_ == base_x_) {
    // X held for this interval: learn the noise, refresh the baseline, then probe.
    const double rel = base_t_ > 0 ? std::min(std::fabs(t - base_t_) / base_t_, options_.x_shift) : 0;
    // (An interval that may be the first of a phase change teaches neither noise nor level.
    // The first estimate starts from x_min_noise: see x_fresh_noise.)
    if (shift_sign_ == 0 && steady) {
      const double prior = options_.x_fresh_noise ? options_.x_min_noise : rel;
      noise_ = 0.8 * (noise_ == 0 ? prior : noise_) + 0.2 * rel;
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

void Controller::NewBase(double t) {
  base_x_ = x_;
  base_t_ = level_t_ = t;
  hold_left_ = 0;
  evidence_sum_[0] = evidence_sum_[1] = 0;
  evidence_n_[0] = evidence_n_[1] = 0;
}

}  // namespace kayak
