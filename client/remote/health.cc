// The server health state machine (see health.h).
#include "client/remote/health.h"

#include <algorithm>

namespace tessera::client::remote {

const char* HealthStateName(HealthState s) {
  switch (s) {
    case HealthState::kHealthy:
      return "healthy";
    case HealthState::kSuspect:
      return "suspect";
    case HealthState::kFailed:
      return "failed";
  }
  return "?";
}

PhiAccrual::PhiAccrual(uint32_t window, uint64_t min_mean_ns)
    : window_(std::max<uint32_t>(1, window)), min_mean_ns_(std::max<uint64_t>(1, min_mean_ns)) {
  intervals_.reserve(window_);
}

void PhiAccrual::Arrival(uint64_t t_ns) {
  if (last_ != 0 && t_ns > last_) {
    const uint64_t iv = t_ns - last_;
    if (intervals_.size() < window_) {
      intervals_.push_back(iv);
    } else {
      sum_ -= intervals_[next_];
      intervals_[next_] = iv;
      next_ = (next_ + 1) % window_;
    }
    sum_ += iv;
  }
  if (t_ns > last_) last_ = t_ns;
}

uint64_t PhiAccrual::mean_ns() const {
  if (intervals_.empty()) return min_mean_ns_;
  return std::max<uint64_t>(min_mean_ns_, sum_ / intervals_.size());
}

double PhiAccrual::Phi(uint64_t silence_ns) const {
  // P(no arrival within `silence`) = exp(-silence / mean) under an exponential model, and
  // phi = -log10 of it.
  constexpr double kLog10E = 0.4342944819032518;
  return kLog10E * static_cast<double>(silence_ns) / static_cast<double>(mean_ns());
}

void HealthTracker::Resize(uint32_t n, uint64_t t) {
  while (s_.size() < n) {
    s_.emplace_back(cfg_);
    s_.back().last_alive = t;
    s_.back().stall_at_alive = stalled_ns_;
  }
}

void HealthTracker::Stall(uint64_t ns, uint64_t t) {
  stalled_ns_ += ns;
  if (stalls_.size() == kStallsKept) stalls_.erase(stalls_.begin());
  stalls_.emplace_back(t, ns);
}

uint64_t HealthTracker::StalledAfter(uint64_t t) const {
  uint64_t after = 0;
  for (const auto& [end, len] : stalls_) {
    if (end > t) after += std::min(len, end - t);
  }
  return after;
}

void HealthTracker::Alive(uint32_t s, uint64_t t) {
  Server& v = s_[s];
  if (t <= v.last_alive) return;
  v.last_alive = t;
  // Silence counts from t; the client's stalls after t are still excused.
  v.stall_at_alive = stalled_ns_ - std::min(stalled_ns_, StalledAfter(t));
}

void HealthTracker::HeartbeatReply(uint32_t s, uint64_t t) {
  // The detector's clock stops while the client is stalled, so an interval that spans a stall
  // of the client does not inflate the mean (and so the threshold).
  s_[s].phi.Arrival(t > stalled_ns_ ? t - stalled_ns_ : 0);
  Alive(s, t);
}

void HealthTracker::DataAlive(uint32_t s, uint64_t t) {
  Server& v = s_[s];
  if (v.broken_since != 0 && t > v.broken_since) v.broken_since = 0;
  Alive(s, t);
}

void HealthTracker::Trouble(uint32_t s, uint64_t t, const std::string& why, bool broken) {
  Server& v = s_[s];
  if (broken && v.broken_since == 0 && v.state != HealthState::kFailed) {
    v.broken_since = std::max<uint64_t>(t, 1);
    v.broken_why = why;
  }
  if (v.state != HealthState::kHealthy) return;
  if (v.trouble.empty() || t < v.trouble_at) {
    v.trouble = why;
    v.trouble_at = t;
  }
}

void HealthTracker::ProbeDone(uint32_t s, uint64_t t, bool ok, const std::string& why,
                              bool definitive) {
  Server& v = s_[s];
  v.probing = false;
  if (ok) {
    v.probe_failed = false;
    Alive(s, t);
    return;
  }
  v.probe_failed = true;
  v.probe_definitive = definitive;
  v.probe_failed_at = t;
  v.probe_why = why;
}

void HealthTracker::ForceFailed(uint32_t s) {
  if (s_[s].state != HealthState::kFailed) SetFailed(s_[s]);
}

void HealthTracker::SetFailed(Server& v) {
  v.state = HealthState::kFailed;
  v.held = false;
  ++failed_;
}

uint64_t HealthTracker::Silence(uint32_t s, uint64_t t) const {
  const Server& v = s_[s];
  const uint64_t raw = t > v.last_alive ? t - v.last_alive : 0;
  const uint64_t excused = stalled_ns_ - v.stall_at_alive;
  return raw > excused ? raw - excused : 0;
}

double HealthTracker::Phi(uint32_t s, uint64_t t) const {
  return s_[s].phi.Phi(Silence(s, t));
}

namespace {
std::string Ms(uint64_t ns) { return std::to_string(ns / 1000000) + " ms"; }
}  // namespace

void HealthTracker::Evaluate(uint64_t t, std::vector<Action>* out) {
  for (uint32_t i = 0; i < s_.size(); ++i) {
    Server& v = s_[i];
    if (v.state == HealthState::kFailed) continue;
    if (v.state == HealthState::kHealthy) {
      std::string why;
      uint64_t since = t;
      if (v.broken_since != 0) {
        why = "its data path fails: " + v.broken_why;
        since = std::min(t, v.broken_since);
      } else if (!v.trouble.empty() && v.trouble_at >= v.last_alive) {
        why = v.trouble;
        since = std::min(t, v.trouble_at);
      } else {
        const uint64_t silence = Silence(i, t);
        const double phi = v.phi.Phi(silence);
        if (silence >= cfg_.min_silence_ns && phi >= cfg_.phi_suspect) {
          why = "no reply for " + Ms(silence) + " (phi " + std::to_string(static_cast<int>(phi)) +
                ", mean heartbeat interval " + Ms(v.phi.mean_ns()) + ")";
        }
      }
      v.trouble.clear();
      if (why.empty()) continue;
      v.state = HealthState::kSuspect;
      v.suspect_since = since;
      v.probe_failed = false;
      out->push_back({Action::Kind::kSuspect, i, why});
      // Fall through: probe at once.
    } else if (v.broken_since != 0) {
      if (t - std::max(v.suspect_since, v.broken_since) >= cfg_.fail_after_ns) {
        SetFailed(v);  // It refuses data requests: not a guess, never held.
        out->push_back({Action::Kind::kFail, i,
                        "its data path has failed for " + Ms(t - v.broken_since) +
                            " (no data reply since): " + v.broken_why});
        continue;
      }
    } else if (v.last_alive > v.suspect_since) {
      // It answered since it became suspect.
      v.state = HealthState::kHealthy;
      v.probe_failed = false;
      v.held = false;
      v.trouble.clear();
      out->push_back({Action::Kind::kRecover, i, {}});
      continue;
    } else if (v.probe_failed && v.probe_failed_at >= v.suspect_since + cfg_.fail_after_ns &&
               (v.probe_definitive || (Silence(i, t) >= cfg_.min_silence_ns &&
                                       Phi(i, t) >= cfg_.phi_suspect))) {
      if (v.probe_definitive || failed_ < cfg_.tolerance) {
        SetFailed(v);
        out->push_back({Action::Kind::kFail, i,
                        "suspect for " + Ms(t - v.suspect_since) +
                            " without an answer, and a confirming probe over a fresh connection "
                            "failed: " +
                            v.probe_why});
        continue;
      }
      // Silence alone, and failing it would leave more servers failed than the store
      // survives: held (see health.h). It stays suspect and is probed again.
      if (!v.held) {
        v.held = true;
        out->push_back({Action::Kind::kHold, i,
                        "silent for " + Ms(Silence(i, t)) + " and its confirming probe timed out (" +
                            v.probe_why + "), but " + std::to_string(failed_) +
                            " servers are failed already and failing it would lose the data "
                            "that more than " +
                            std::to_string(cfg_.tolerance) +
                            " failed servers share: it stays suspect until it answers or a "
                            "probe is refused"});
      }
    }
    if (!v.probing && (v.probe_started < v.suspect_since ||
                       t - v.probe_started >= cfg_.probe_every_ns)) {
      v.probing = true;
      v.probe_started = t;
      out->push_back({Action::Kind::kProbe, i, {}});
    }
  }
}

}  // namespace tessera::client::remote
