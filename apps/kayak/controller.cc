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
    const uint64_t p99 = r_samples_[k];
    if (p99 > options_.slo_ns) {
      window_ = std::max<uint32_t>(
          options_.min_window, static_cast<uint32_t>(std::floor(window_ * options_.r_decrease)));
    } else {
      window_ = std::min(options_.max_window, window_ + options_.r_increase);
    }
  }
  r_samples_.clear();
  r_start_ns_ = now_ns;
}

void Controller::RunX(uint64_t now_ns) {
  const double secs = static_cast<double>(now_ns - x_start_ns_) / 1e9;
  const double t = secs > 0 ? static_cast<double>(x_completions_) / secs : 0;
  last_throughput_ = t;
  x_completions_ = 0;
  x_start_ns_ = now_ns;
  if (options_.mode != Mode::kKayak) return;
  double step = options_.x_min_step;
  if (prev_throughput_ >= 0) {
    const double dt = t - prev_throughput_;
    if (dt < 0) direction_ = -direction_;  // The last move lowered throughput: turn back.
    const double rel = prev_throughput_ > 0 ? std::fabs(dt) / prev_throughput_ : 1.0;
    step = std::clamp(options_.x_gain * rel, options_.x_min_step, options_.x_max_step);
  }
  prev_throughput_ = t;
  double next = x_ + direction_ * step;
  if (next > 1.0 || next < 0.0) {
    // At a bound: stay there, and probe back inward next time unless throughput says otherwise.
    next = std::clamp(next, 0.0, 1.0);
    direction_ = next >= 1.0 ? 1 : -1;
  }
  x_ = next;
}

}  // namespace kayak
