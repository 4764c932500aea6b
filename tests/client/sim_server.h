// What a simulated memory server does over a seeded schedule: stopped (SIGSTOP) for a window,
// resumed or not, and killed at a time. Shared by the deterministic simulations of the failure
// detector (health_sim_test.cc) and of the engine (engine_sim_test.cc).
#pragma once

#include <algorithm>
#include <cstdint>

namespace tessera::client::remote {

struct StopsAndKills {
  uint64_t stop_at = 0, resume_at = 0;  // SIGSTOP window (0: none); resume 0 = never.
  uint64_t kill_at = 0;                 // SIGKILL (0: never).
  bool Dead(uint64_t t) const { return kill_at != 0 && t >= kill_at; }
  bool Stopped(uint64_t t) const {
    return stop_at != 0 && t >= stop_at && (resume_at == 0 || t < resume_at);
  }
  // When a request sent at `t` that takes `delay` is answered (0: never).
  uint64_t AnswerAt(uint64_t t, uint64_t delay) const {
    if (Dead(t)) return 0;
    uint64_t at = t + delay;
    if (Stopped(t) || Stopped(at)) {
      if (resume_at == 0) return 0;
      at = std::max(at, resume_at + delay);
    }
    if (kill_at != 0 && at >= kill_at) return 0;
    return at;
  }
};

}  // namespace tessera::client::remote
