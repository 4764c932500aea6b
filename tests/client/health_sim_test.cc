// A deterministic simulation of the remote store's failure detection (client/remote/health.h):
// a simulated clock and a simulated monitor drive the real HealthTracker through seeded
// schedules of reply delays, client stalls, stopped servers (that resume or not), killed
// servers and etcd lease expiries, the way RemoteStore::MonitorLoop drives it (a heartbeat to
// every server each interval, none while one is in flight, confirming probes on the tracker's
// order, the monitor's own lateness reported as a stall). Every schedule checks:
//   - no server is failed while it answers within the detector's bound (slow replies, a loaded
//     client, an etcd outage: zero false failures);
//   - a killed server is failed within fail_after + 2 probe periods + a tick of its death;
//   - a stopped server is failed within the phi bound + fail_after + a probe timeout + slack,
//     and one that resumes before it is failed becomes healthy again;
//   - every server ends healthy or failed, never suspect forever (with at most the store's
//     tolerance of servers faulty, no verdict is ever held).
// A second family of schedules stops more servers at once than the store tolerates (a machine
// whose memservers got no CPU for seconds), some resuming, some never, with a server killed
// now and then. It checks the cap on verdicts taken on silence (health.h):
//   - a verdict on silence is only ever taken with fewer than `tolerance` servers failed, so
//     never more than `tolerance` servers are failed on silence;
//   - every stopped server beyond that stays suspect (its verdict held, reported), and one
//     that resumes is healthy again; a killed server is failed within its bound regardless.
// A failing schedule prints its seed; TESSERA_SIM_SEED=N replays that one schedule and
// TESSERA_SIM_SCHEDULES=N runs N schedules (default 3000; e.g. 200000 for a long run).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "client/remote/health.h"
#include "tests/client/sim_server.h"

namespace tessera::client::remote {
namespace {

constexpr uint64_t kMs = 1000000;

// What one server does over the schedule.
struct Behaviour : StopsAndKills {
  uint64_t max_delay_ns = 5 * kMs;  // Heartbeat replies take 0..max_delay.
  uint64_t lease_expiry_at = 0;     // An etcd lease expiry reported (0: none).
};

struct Schedule {
  uint64_t seed = 0;
  HealthConfig cfg;
  uint64_t probe_timeout_ns = 1000 * kMs;
  uint64_t length_ns = 20000 * kMs;
  std::vector<Behaviour> servers;
  // Client stalls: [start, start + len) the monitor does not run.
  std::vector<std::pair<uint64_t, uint64_t>> stalls;
};

// Seeded uniform integers in [lo, hi].
struct Uniform {
  explicit Uniform(uint64_t seed) : rng(seed) {}
  uint64_t operator()(uint64_t lo, uint64_t hi) {
    return std::uniform_int_distribution<uint64_t>(lo, hi)(rng);
  }
  std::mt19937_64 rng;
};

Schedule MakeSchedule(uint64_t seed) {
  Uniform uni(seed);
  Schedule s;
  s.seed = seed;
  s.cfg.tolerance = 2;  // At most 2 faults below: the cap never holds a verdict here.
  const int n = static_cast<int>(uni(3, 8));
  s.servers.resize(n);
  for (Behaviour& b : s.servers) {
    // Most servers answer quickly; some are loaded (replies up to 600 ms: a memserver starved
    // of CPU by 4x oversubscription).
    b.max_delay_ns = uni(0, 3) == 0 ? uni(50, 600) * kMs : uni(1, 10) * kMs;
  }
  // Faults: a few servers are killed or stopped; the rest stay up.
  const int faults = static_cast<int>(uni(0, 2));
  for (int f = 0; f < faults; ++f) {
    Behaviour& b = s.servers[uni(0, n - 1)];
    const uint64_t at = uni(2000, 8000) * kMs;
    switch (uni(0, 2)) {
      case 0:
        if (b.kill_at == 0) b.kill_at = at;
        break;
      case 1:  // Stopped for good.
        if (b.stop_at == 0) b.stop_at = at;
        break;
      default:  // Stopped briefly (a GC pause, a cgroup throttle, a short SIGSTOP).
        if (b.stop_at == 0) {
          b.stop_at = at;
          b.resume_at = at + uni(100, 900) * kMs;
        }
        break;
    }
  }
  // An etcd outage: every lease expires, and every live server must survive it.
  if (uni(0, 3) == 0) {
    const uint64_t at = uni(1000, 12000) * kMs;
    for (Behaviour& b : s.servers) b.lease_expiry_at = at;
  }
  // The client stalls now and then (descheduled, a GC pause of the paged program): up to 5 s.
  for (int i = static_cast<int>(uni(0, 4)); i > 0; --i) {
    s.stalls.emplace_back(uni(500, 15000) * kMs, uni(30, 5000) * kMs);
  }
  std::sort(s.stalls.begin(), s.stalls.end());
  return s;
}

struct Outcome {
  std::vector<uint64_t> failed_at;   // 0: never failed.
  std::vector<HealthState> final_state;
  std::vector<std::vector<std::pair<uint64_t, HealthState>>> transitions;
  // Per server: its verdict came from a refused probe (it was dead), and how many servers
  // were failed before it; when its verdict was first held (0: never) and how many servers
  // were failed then.
  std::vector<bool> fail_definitive;
  std::vector<uint32_t> failed_before;
  std::vector<uint64_t> held_at;
  std::vector<uint32_t> failed_when_held;
};

// Runs the monitor over the schedule with the real tracker.
Outcome Simulate(const Schedule& s) {
  const uint32_t n = static_cast<uint32_t>(s.servers.size());
  HealthTracker tracker(s.cfg);
  tracker.Resize(n, 0);
  std::mt19937_64 rng(s.seed ^ 0x9e3779b97f4a7c15ull);
  struct Hb {
    bool inflight = false;
    uint64_t answer_at = 0;  // 0: never.
    bool conn_down = false;
    uint64_t next_connect = 0;  // The monitor's next connect attempt after conn_down.
  };
  struct ProbeRun {
    bool running = false;
    uint64_t done_at = 0;
    bool ok = false;
    bool definitive = false;
  };
  std::vector<Hb> hb(n);
  std::vector<ProbeRun> probe(n);
  Outcome out;
  out.failed_at.assign(n, 0);
  out.transitions.resize(n);
  out.fail_definitive.assign(n, false);
  out.failed_before.assign(n, 0);
  out.held_at.assign(n, 0);
  out.failed_when_held.assign(n, 0);
  uint32_t failed = 0;
  std::vector<HealthTracker::Action> actions;
  const uint64_t interval = s.cfg.interval_ns;
  uint64_t t = 0;
  size_t next_stall = 0;
  std::vector<bool> expiry_reported(n, false);
  while (t < s.length_ns) {
    uint64_t tick = t + interval;
    // A client stall starting within this tick delays the monitor's next run.
    uint64_t wake = tick;
    while (next_stall < s.stalls.size() && s.stalls[next_stall].first < tick) {
      wake = std::max(wake, s.stalls[next_stall].first + s.stalls[next_stall].second);
      ++next_stall;
    }
    // What happened while the monitor ran (up to `tick`) is taken at its own time; then the
    // monitor notices its lateness (as MonitorLoop does after each poll) and takes what
    // completed while it did not run, at the time it reads it (`wake`).
    for (int phase = 0; phase < 2; ++phase) {
      const uint64_t until = phase == 0 ? tick : wake;
      if (phase == 1) {
        if (wake == tick) break;
        if (wake > tick + 20 * kMs) tracker.Stall(wake - tick, wake);
      }
      for (uint32_t i = 0; i < n; ++i) {
        if (hb[i].inflight && hb[i].answer_at != 0 && hb[i].answer_at <= until) {
          hb[i].inflight = false;
          tracker.HeartbeatReply(i, phase == 0 ? hb[i].answer_at : wake);
        }
        if (!hb[i].conn_down && s.servers[i].Dead(until)) {
          // The kernel resets the heartbeat connection of a killed process.
          hb[i].conn_down = true;
          hb[i].inflight = false;
          tracker.Trouble(i, phase == 0 ? std::max(s.servers[i].kill_at, t) : wake,
                          "heartbeat connection lost");
          hb[i].next_connect = until + 200 * kMs;
        } else if (hb[i].conn_down && until >= hb[i].next_connect) {
          // The monitor's connect attempts are refused: trouble each time.
          tracker.Trouble(i, until, "heartbeat connection: connection refused");
          hb[i].next_connect = until + 200 * kMs;
        }
        if (!expiry_reported[i] && s.servers[i].lease_expiry_at != 0 &&
            s.servers[i].lease_expiry_at <= until) {
          expiry_reported[i] = true;
          tracker.Trouble(i, until, "etcd: lease expired");
        }
        if (probe[i].running && probe[i].done_at <= until) {
          probe[i].running = false;
          const uint64_t at = phase == 0 ? probe[i].done_at : wake;
          if (probe[i].ok) tracker.HeartbeatReply(i, at);
          tracker.ProbeDone(i, at, probe[i].ok, probe[i].ok ? "" : "probe failed",
                            probe[i].definitive);
        }
      }
    }
    t = wake;
    actions.clear();
    tracker.Evaluate(t, &actions);
    for (const auto& a : actions) {
      const uint32_t i = a.server;
      switch (a.kind) {
        case HealthTracker::Action::Kind::kSuspect:
          out.transitions[i].emplace_back(t, HealthState::kSuspect);
          break;
        case HealthTracker::Action::Kind::kRecover:
          out.transitions[i].emplace_back(t, HealthState::kHealthy);
          break;
        case HealthTracker::Action::Kind::kFail:
          out.transitions[i].emplace_back(t, HealthState::kFailed);
          out.failed_at[i] = t;
          out.fail_definitive[i] = s.servers[i].Dead(t);
          out.failed_before[i] = failed++;
          break;
        case HealthTracker::Action::Kind::kHold:
          if (out.held_at[i] == 0) {
            out.held_at[i] = t;
            out.failed_when_held[i] = failed;
          }
          break;
        case HealthTracker::Action::Kind::kProbe: {
          const Behaviour& b = s.servers[i];
          probe[i].running = true;
          const uint64_t lat = std::uniform_int_distribution<uint64_t>(1, 3)(rng) * kMs +
                               std::uniform_int_distribution<uint64_t>(0, b.max_delay_ns)(rng);
          if (b.Dead(t)) {
            probe[i].ok = false;
            probe[i].definitive = true;
            probe[i].done_at = t + kMs;  // Connection refused.
          } else {
            probe[i].definitive = false;
            const uint64_t at = b.AnswerAt(t, lat);
            probe[i].ok = at != 0 && at - t <= s.probe_timeout_ns;
            probe[i].done_at = probe[i].ok ? at : t + s.probe_timeout_ns;
          }
          break;
        }
      }
    }
    // Heartbeats to every server with a connection and none in flight.
    for (uint32_t i = 0; i < n; ++i) {
      if (tracker.state(i) == HealthState::kFailed || hb[i].conn_down || hb[i].inflight) continue;
      const uint64_t delay =
          std::uniform_int_distribution<uint64_t>(0, s.servers[i].max_delay_ns)(rng);
      hb[i].inflight = true;
      hb[i].answer_at = s.servers[i].AnswerAt(t, delay);
    }
  }
  for (uint32_t i = 0; i < n; ++i) out.final_state.push_back(tracker.state(i));
  return out;
}

// The longest a faulty server can stay unfailed after its fault: a stopped (silent) one needs
// up to max(min_silence, phi_suspect / log10(e) * mean) of silence to be suspect, where the
// mean is at most the longest reply delay plus an interval; then (as a killed one) fail_after,
// a probe timeout, two probe periods and a few ticks of slack; plus excused client stalls,
// which stop the clock.
uint64_t FailBound(const Schedule& s, const Behaviour& b, bool silent) {
  const uint64_t tick = s.cfg.interval_ns;
  uint64_t stalls = 0;
  for (const auto& [at, len] : s.stalls) stalls += len;
  const double mean = static_cast<double>(b.max_delay_ns + 2 * tick);
  const uint64_t suspect_bound = std::max<uint64_t>(
      s.cfg.min_silence_ns, static_cast<uint64_t>(s.cfg.phi_suspect / 0.4342944819 * mean));
  const uint64_t probe_bound =
      s.cfg.fail_after_ns + s.probe_timeout_ns + 2 * s.cfg.probe_every_ns + 4 * tick;
  return (silent ? suspect_bound : 0) + probe_bound + stalls;
}

// Checks one schedule; returns a description of the first violation, or "".
std::string Check(const Schedule& s, const Outcome& o) {
  for (size_t i = 0; i < s.servers.size(); ++i) {
    const Behaviour& b = s.servers[i];
    const std::string who = "server " + std::to_string(i);
    const bool long_stop = b.stop_at != 0 && b.resume_at == 0;
    if (b.kill_at == 0 && !long_stop) {
      // Answers throughout (or after a short stop): never failed, and healthy at the end.
      if (o.failed_at[i] != 0) {
        return who + " failed at " + std::to_string(o.failed_at[i] / kMs) +
               " ms although it answers within the detector's bound (max reply delay " +
               std::to_string(b.max_delay_ns / kMs) + " ms, stop " +
               std::to_string(b.stop_at / kMs) + ".." + std::to_string(b.resume_at / kMs) +
               " ms)";
      }
      if (o.final_state[i] != HealthState::kHealthy) {
        return who + " ends " + HealthStateName(o.final_state[i]) + ", not healthy";
      }
      continue;
    }
    const bool killed_first = b.kill_at != 0 && (b.stop_at == 0 || b.kill_at <= b.stop_at);
    const bool short_stop_then_kill = b.kill_at != 0 && !killed_first && !long_stop;
    const uint64_t fault_at = killed_first || short_stop_then_kill ? b.kill_at : b.stop_at;
    const uint64_t bound = FailBound(s, b, long_stop && !killed_first);
    if (fault_at + bound < s.length_ns &&
        (o.failed_at[i] == 0 || o.failed_at[i] > fault_at + bound)) {
      return who + (long_stop && !killed_first ? " stopped at " : " killed at ") +
             std::to_string(fault_at / kMs) + " ms was " +
             (o.failed_at[i] == 0 ? std::string("never failed")
                                  : "failed only at " + std::to_string(o.failed_at[i] / kMs) +
                                        " ms") +
             " (bound " + std::to_string(bound / kMs) + " ms)";
    }
    const uint64_t first_fault =
        long_stop ? std::min(b.stop_at, b.kill_at == 0 ? b.stop_at : b.kill_at) : fault_at;
    if (o.failed_at[i] != 0 && o.failed_at[i] < first_fault) {
      return who + " failed at " + std::to_string(o.failed_at[i] / kMs) +
             " ms, before its fault at " + std::to_string(first_fault / kMs) + " ms";
    }
  }
  return "";
}

// What happened in a schedule, for a failure message.
std::string Story(const Schedule& s, const Outcome& o) {
  std::string story = "\n  tolerance " + std::to_string(s.cfg.tolerance);
  for (size_t i = 0; i < o.transitions.size(); ++i) {
    const Behaviour& b = s.servers[i];
    story += "\n  server " + std::to_string(i) + " (delay<=" + std::to_string(b.max_delay_ns / kMs) +
             " kill " + std::to_string(b.kill_at / kMs) + " stop " +
             std::to_string(b.stop_at / kMs) + ".." + std::to_string(b.resume_at / kMs) +
             " lease " + std::to_string(b.lease_expiry_at / kMs) + "):";
    for (const auto& [t, st] : o.transitions[i]) {
      story += " " + std::to_string(t / kMs) + "=" + HealthStateName(st);
    }
    if (o.held_at[i] != 0) story += " (held at " + std::to_string(o.held_at[i] / kMs) + ")";
  }
  for (const auto& [at, len] : s.stalls) {
    story += "\n  client stall " + std::to_string(at / kMs) + "+" + std::to_string(len / kMs);
  }
  return story;
}

// More servers stop at once than the store tolerates (tolerance 1..3): within 1.1 s of each
// other, as when a loaded machine gives its memservers no CPU; each resumes after 3..9 s or
// never. Now and then another server is killed. The client stalls too, now and then.
Schedule MakeMassStopSchedule(uint64_t seed) {
  Uniform uni(seed);
  Schedule s;
  s.seed = seed;
  s.length_ns = 25000 * kMs;
  const uint32_t n = static_cast<uint32_t>(uni(4, 9));
  s.cfg.tolerance = static_cast<uint32_t>(uni(1, std::min<uint32_t>(3, n - 2)));
  s.servers.resize(n);
  for (Behaviour& b : s.servers) {
    b.max_delay_ns = uni(0, 3) == 0 ? uni(50, 600) * kMs : uni(1, 10) * kMs;
  }
  std::vector<uint32_t> order(n);
  for (uint32_t i = 0; i < n; ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), uni.rng);
  const uint32_t stopped =
      static_cast<uint32_t>(uni(s.cfg.tolerance + 1, std::min(n, s.cfg.tolerance + 3)));
  const uint64_t at = uni(2000, 6000) * kMs;
  for (uint32_t j = 0; j < stopped; ++j) {
    Behaviour& b = s.servers[order[j]];
    b.stop_at = at + uni(0, 1100) * kMs;
    if (uni(0, 1) == 0) b.resume_at = b.stop_at + uni(3000, 9000) * kMs;
  }
  if (stopped < n && uni(0, 2) == 0) s.servers[order[stopped]].kill_at = uni(2000, 12000) * kMs;
  for (int i = static_cast<int>(uni(0, 2)); i > 0; --i) {
    s.stalls.emplace_back(uni(500, 15000) * kMs, uni(30, 2500) * kMs);
  }
  std::sort(s.stalls.begin(), s.stalls.end());
  return s;
}

// Checks a mass-stop schedule; returns a description of the first violation, or "".
std::string CheckMassStop(const Schedule& s, const Outcome& o) {
  const uint32_t tol = s.cfg.tolerance;
  uint32_t on_silence = 0;
  for (size_t i = 0; i < s.servers.size(); ++i) {
    const Behaviour& b = s.servers[i];
    const std::string who = "server " + std::to_string(i);
    if (o.failed_at[i] != 0 && !o.fail_definitive[i]) {
      ++on_silence;
      if (o.failed_before[i] >= tol) {
        return who + " failed on silence at " + std::to_string(o.failed_at[i] / kMs) + " ms with " +
               std::to_string(o.failed_before[i]) + " servers failed already (tolerance " +
               std::to_string(tol) + ")";
      }
    }
    if (b.kill_at != 0) {
      // Refused: failed within its bound, whatever else is failed.
      const uint64_t bound = FailBound(s, b, /*silent=*/false);
      if (o.failed_at[i] == 0 || o.failed_at[i] < b.kill_at || o.failed_at[i] > b.kill_at + bound) {
        return who + " killed at " + std::to_string(b.kill_at / kMs) + " ms was failed at " +
               std::to_string(o.failed_at[i] / kMs) + " ms (bound " + std::to_string(bound / kMs) +
               " ms)";
      }
      continue;
    }
    if (b.stop_at == 0) {
      if (o.failed_at[i] != 0 || o.final_state[i] != HealthState::kHealthy) {
        return who + " never stopped but ends " + HealthStateName(o.final_state[i]);
      }
      continue;
    }
    const uint64_t bound = FailBound(s, b, /*silent=*/true);
    if (o.failed_at[i] != 0) {
      // One of the first `tolerance` verdicts: while it was stopped (or as it resumed, a probe
      // already out), and within the detector's bound.
      const uint64_t last = b.resume_at == 0 ? s.length_ns : b.resume_at + s.probe_timeout_ns;
      if (o.failed_at[i] < b.stop_at || o.failed_at[i] > std::min(last, b.stop_at + bound)) {
        return who + " stopped at " + std::to_string(b.stop_at / kMs) + " ms was failed at " +
               std::to_string(o.failed_at[i] / kMs) + " ms (bound " + std::to_string(bound / kMs) +
               " ms)";
      }
      continue;
    }
    // Not failed: its verdict was held (only ever with `tolerance` servers failed), or it
    // resumed before one was due.
    if (o.held_at[i] != 0 && o.failed_when_held[i] < tol) {
      return who + " was held at " + std::to_string(o.held_at[i] / kMs) + " ms with only " +
             std::to_string(o.failed_when_held[i]) + " servers failed";
    }
    if (b.resume_at == 0) {
      if (o.final_state[i] != HealthState::kSuspect) {
        return who + " stopped for good ends " + HealthStateName(o.final_state[i]) +
               ", not suspect";
      }
      if (b.stop_at + bound < s.length_ns &&
          (o.held_at[i] == 0 || o.held_at[i] > b.stop_at + bound)) {
        return who + " stopped at " + std::to_string(b.stop_at / kMs) +
               " ms was neither failed nor held within its bound (" + std::to_string(bound / kMs) +
               " ms)";
      }
    } else if (o.final_state[i] != HealthState::kHealthy) {
      return who + " resumed at " + std::to_string(b.resume_at / kMs) + " ms ends " +
             HealthStateName(o.final_state[i]) + ", not healthy";
    }
  }
  if (on_silence > tol) {
    return std::to_string(on_silence) + " servers failed on silence, tolerance " +
           std::to_string(tol);
  }
  return "";
}

uint64_t EnvU64(const char* name, uint64_t def) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return def;
  return std::strtoull(v, nullptr, 10);
}

TEST(HealthSimTest, SeededSchedulesKeepTheDetectorsPromises) {
  const char* one = std::getenv("TESSERA_SIM_SEED");
  const uint64_t first = one != nullptr ? EnvU64("TESSERA_SIM_SEED", 1) : 1;
  const uint64_t count = one != nullptr ? 1 : EnvU64("TESSERA_SIM_SCHEDULES", 3000);
  uint64_t faults = 0, failures = 0, stalls = 0, outages = 0;
  for (uint64_t seed = first; seed < first + count; ++seed) {
    const Schedule s = MakeSchedule(seed);
    const Outcome o = Simulate(s);
    const std::string bad = Check(s, o);
    ASSERT_EQ(bad, "") << "schedule seed " << seed << " (replay: TESSERA_SIM_SEED=" << seed
                       << " client_health_sim_test)" << Story(s, o);
    for (const Behaviour& b : s.servers) faults += (b.kill_at != 0 || b.stop_at != 0) ? 1 : 0;
    for (uint64_t f : o.failed_at) failures += f != 0 ? 1 : 0;
    stalls += s.stalls.size();
    outages += s.servers[0].lease_expiry_at != 0 ? 1 : 0;
  }
  // The schedules exercise what they claim to.
  if (count >= 1000) {
    EXPECT_GT(faults, count / 2);
    EXPECT_GT(failures, count / 4);
    EXPECT_GT(stalls, count);
    EXPECT_GT(outages, count / 8);
  }
}

TEST(HealthSimTest, MoreServersStoppedThanTheStoreToleratesAreNotAllFailed) {
  const char* one = std::getenv("TESSERA_SIM_SEED");
  const uint64_t first = one != nullptr ? EnvU64("TESSERA_SIM_SEED", 1) : 1;
  const uint64_t count = one != nullptr ? 1 : EnvU64("TESSERA_SIM_SCHEDULES", 3000) / 3;
  uint64_t held = 0, held_then_healthy = 0, on_silence = 0, killed = 0;
  for (uint64_t seed = first; seed < first + count; ++seed) {
    const Schedule s = MakeMassStopSchedule(seed);
    const Outcome o = Simulate(s);
    const std::string bad = CheckMassStop(s, o);
    ASSERT_EQ(bad, "") << "mass-stop schedule seed " << seed << " (replay: TESSERA_SIM_SEED="
                       << seed << " client_health_sim_test)" << Story(s, o);
    for (size_t i = 0; i < s.servers.size(); ++i) {
      held += o.held_at[i] != 0 ? 1 : 0;
      held_then_healthy +=
          o.held_at[i] != 0 && o.final_state[i] == HealthState::kHealthy ? 1 : 0;
      on_silence += o.failed_at[i] != 0 && !o.fail_definitive[i] ? 1 : 0;
      killed += s.servers[i].kill_at != 0 ? 1 : 0;
    }
  }
  // The schedules exercise what they claim to: verdicts held, held servers that resumed,
  // verdicts on silence up to the tolerance, and killed servers failed regardless.
  if (count >= 300) {
    EXPECT_GT(held, count / 2);
    EXPECT_GT(held_then_healthy, count / 8);
    EXPECT_GT(on_silence, count);
    EXPECT_GT(killed, count / 8);
  }
}

// The cases the simulation generates at random, one by one, with exact expectations.
class HealthTrackerTest : public ::testing::Test {
 protected:
  HealthTrackerTest() : tracker_(Config()) { tracker_.Resize(1, 0); }
  static HealthConfig Config() {
    HealthConfig c;
    c.interval_ns = 100 * kMs;
    c.min_silence_ns = 1000 * kMs;
    c.phi_suspect = 8;
    c.fail_after_ns = 1000 * kMs;
    c.probe_every_ns = 200 * kMs;
    return c;
  }
  // Heartbeat replies every 100 ms from `from` to `to` (exclusive), evaluating at each.
  void Beat(uint64_t from, uint64_t to) {
    for (uint64_t t = from; t < to; t += 100 * kMs) {
      tracker_.HeartbeatReply(0, t);
      Eval(t);
    }
  }
  std::vector<HealthTracker::Action::Kind> Eval(uint64_t t) {
    std::vector<HealthTracker::Action> a;
    tracker_.Evaluate(t, &a);
    std::vector<HealthTracker::Action::Kind> kinds;
    for (const auto& x : a) kinds.push_back(x.kind);
    return kinds;
  }
  HealthTracker tracker_;
};

using K = HealthTracker::Action::Kind;

TEST_F(HealthTrackerTest, SilenceMakesSuspectThenAProbeThatFailsAfterFailAfterFails) {
  Beat(100 * kMs, 3000 * kMs);  // Mean interval 100 ms: phi 8 at ~1.84 s of silence.
  const uint64_t last = 2900 * kMs;
  EXPECT_TRUE(Eval(last + 1500 * kMs).empty());  // 1.5 s: phi 6.5.
  EXPECT_EQ(tracker_.state(0), HealthState::kHealthy);
  EXPECT_EQ(Eval(last + 1900 * kMs), (std::vector<K>{K::kSuspect, K::kProbe}));
  EXPECT_EQ(tracker_.state(0), HealthState::kSuspect);
  // A probe that fails before fail_after is not enough.
  tracker_.ProbeDone(0, last + 2000 * kMs, false, "timeout");
  EXPECT_EQ(Eval(last + 2100 * kMs), (std::vector<K>{K::kProbe}));
  tracker_.ProbeDone(0, last + 2850 * kMs, false, "timeout");
  EXPECT_EQ(tracker_.state(0), HealthState::kSuspect);
  EXPECT_EQ(Eval(last + 3000 * kMs), (std::vector<K>{K::kProbe}));
  tracker_.ProbeDone(0, last + 3100 * kMs, false, "connection refused", /*definitive=*/true);
  EXPECT_EQ(Eval(last + 3100 * kMs), (std::vector<K>{K::kFail}));
  EXPECT_EQ(tracker_.state(0), HealthState::kFailed);
  // Failed is final for the tracker: nothing more about it.
  tracker_.HeartbeatReply(0, last + 4000 * kMs);
  EXPECT_TRUE(Eval(last + 4000 * kMs).empty());
}

TEST_F(HealthTrackerTest, ATimedOutProbeAfterTroubleFailsOnlyASilentServer) {
  Beat(100 * kMs, 2000 * kMs);
  tracker_.Trouble(0, 2000 * kMs, "etcd: lease expired");
  EXPECT_EQ(Eval(2000 * kMs), (std::vector<K>{K::kSuspect, K::kProbe}));
  // Paused: the probe times out after 1 s; 1.1 s of silence at phi ~5 is not silent enough.
  tracker_.ProbeDone(0, 3000 * kMs, false, "timeout");
  EXPECT_EQ(Eval(3000 * kMs), (std::vector<K>{K::kProbe}));
  EXPECT_EQ(tracker_.state(0), HealthState::kSuspect);
  // Still nothing at 2 s of silence (phi 8.7): the next probe that times out fails it.
  tracker_.ProbeDone(0, 3800 * kMs, false, "timeout");
  EXPECT_EQ(Eval(3800 * kMs), (std::vector<K>{K::kFail}));
}

TEST_F(HealthTrackerTest, ABrokenDataPathFailsAServerThatStillAnswersHeartbeats) {
  Beat(100 * kMs, 2000 * kMs);
  tracker_.Trouble(0, 2000 * kMs, "16 data requests in a row failed", /*broken=*/true);
  EXPECT_EQ(Eval(2000 * kMs), (std::vector<K>{K::kSuspect, K::kProbe}));
  // Heartbeats and the probe still work: not enough to clear a broken data path.
  tracker_.ProbeDone(0, 2005 * kMs, true, "");
  Beat(2100 * kMs, 3000 * kMs);
  EXPECT_EQ(tracker_.state(0), HealthState::kSuspect);
  EXPECT_EQ(Eval(3000 * kMs), (std::vector<K>{K::kFail}));
}

TEST_F(HealthTrackerTest, ADataReplyClearsABrokenDataPath) {
  Beat(100 * kMs, 2000 * kMs);
  tracker_.Trouble(0, 2000 * kMs, "16 data requests in a row failed", /*broken=*/true);
  EXPECT_EQ(Eval(2000 * kMs), (std::vector<K>{K::kSuspect, K::kProbe}));
  tracker_.DataAlive(0, 2300 * kMs);
  EXPECT_EQ(Eval(2300 * kMs), (std::vector<K>{K::kRecover}));
  EXPECT_TRUE(Eval(3500 * kMs).empty());
}

TEST_F(HealthTrackerTest, ASuspectThatAnswersIsHealthyAgainAtOnce) {
  Beat(100 * kMs, 2000 * kMs);
  tracker_.Trouble(0, 2050 * kMs, "no reply within the op timeout");
  EXPECT_EQ(Eval(2060 * kMs), (std::vector<K>{K::kSuspect, K::kProbe}));
  tracker_.Alive(0, 2070 * kMs);  // A data reply on an I/O thread.
  EXPECT_EQ(Eval(2080 * kMs), (std::vector<K>{K::kRecover}));
  EXPECT_EQ(tracker_.state(0), HealthState::kHealthy);
}

TEST_F(HealthTrackerTest, TroubleThatAnAnswerAlreadyContradictedIsIgnored) {
  Beat(100 * kMs, 2000 * kMs);
  tracker_.Trouble(0, 1850 * kMs, "op timeout");  // Older than the last reply (1900 ms).
  EXPECT_TRUE(Eval(1950 * kMs).empty());
  EXPECT_EQ(tracker_.state(0), HealthState::kHealthy);
}

TEST_F(HealthTrackerTest, AProbeThatSucceedsClearsSuspicionAnEtcdOutageFailsNothing) {
  Beat(100 * kMs, 2000 * kMs);
  tracker_.Trouble(0, 2000 * kMs, "etcd: lease expired");
  EXPECT_EQ(Eval(2000 * kMs), (std::vector<K>{K::kSuspect, K::kProbe}));
  tracker_.ProbeDone(0, 2003 * kMs, true, "");
  EXPECT_EQ(Eval(2010 * kMs), (std::vector<K>{K::kRecover}));
}

TEST_F(HealthTrackerTest, TheClientsOwnStallIsNotTheServersSilence) {
  Beat(100 * kMs, 2000 * kMs);
  // The client did not run for 5 s; the reply it reads after the stall is timestamped then.
  tracker_.Stall(5000 * kMs, 6900 * kMs);
  EXPECT_LT(tracker_.Silence(0, 6950 * kMs), 100 * kMs);
  EXPECT_TRUE(Eval(6950 * kMs).empty());
  EXPECT_EQ(tracker_.state(0), HealthState::kHealthy);
}

TEST_F(HealthTrackerTest, AReplyTakenBeforeAStallAndSeenAfterItKeepsTheStallExcused) {
  Beat(100 * kMs, 2000 * kMs);
  // The whole client did not run over [2050, 5050) ms. An I/O thread took a data reply at
  // 2040 ms, just before; the monitor hands it to the tracker after the stall, with its time.
  tracker_.Stall(3000 * kMs, 5050 * kMs);
  tracker_.DataAlive(0, 2040 * kMs);
  EXPECT_LT(tracker_.Silence(0, 5100 * kMs), 100 * kMs);
  EXPECT_TRUE(Eval(5100 * kMs).empty());
  EXPECT_EQ(tracker_.state(0), HealthState::kHealthy);
}

TEST_F(HealthTrackerTest, SlowHeartbeatsRaiseTheThreshold) {
  // Replies every 400 ms (a loaded server): 2 s of silence is phi ~2, not a suspicion.
  for (uint64_t t = 400 * kMs; t <= 8000 * kMs; t += 400 * kMs) {
    tracker_.HeartbeatReply(0, t);
    EXPECT_TRUE(Eval(t).empty());
  }
  EXPECT_TRUE(Eval(10000 * kMs).empty());
  EXPECT_LT(tracker_.Phi(0, 10000 * kMs), 3.0);
}

// The cap on verdicts taken on silence (health.h), with three servers and tolerance 1.
class HealthTrackerCapTest : public ::testing::Test {
 protected:
  using Acts = std::vector<std::pair<uint32_t, HealthTracker::Action::Kind>>;
  HealthTrackerCapTest() : tracker_(Config()) {
    tracker_.Resize(3, 0);
    // All answer every 100 ms until 1.9 s; at 2 s all three are in trouble (suspect, probed).
    for (uint64_t t = 100 * kMs; t < 2000 * kMs; t += 100 * kMs) {
      for (uint32_t i = 0; i < 3; ++i) tracker_.HeartbeatReply(i, t);
      EXPECT_TRUE(Eval(t).empty());
    }
    for (uint32_t i = 0; i < 3; ++i) tracker_.Trouble(i, 2000 * kMs, "op timeout");
    EXPECT_EQ(Eval(2000 * kMs), (Acts{{0, K::kSuspect}, {0, K::kProbe}, {1, K::kSuspect},
                                      {1, K::kProbe}, {2, K::kSuspect}, {2, K::kProbe}}));
    // Their probes time out at 3 s (1.1 s of silence: phi 4.8, not silent enough) ...
    for (uint32_t i = 0; i < 3; ++i) tracker_.ProbeDone(i, 3000 * kMs, false, "timeout");
    EXPECT_EQ(Eval(3000 * kMs), (Acts{{0, K::kProbe}, {1, K::kProbe}, {2, K::kProbe}}));
  }
  static HealthConfig Config() {
    HealthConfig c;  // The defaults: as the tests above.
    c.tolerance = 1;
    return c;
  }
  Acts Eval(uint64_t t) {
    std::vector<HealthTracker::Action> a;
    tracker_.Evaluate(t, &a);
    Acts acts;
    for (const auto& x : a) acts.emplace_back(x.server, x.kind);
    return acts;
  }
  HealthTracker tracker_;
};

TEST_F(HealthTrackerCapTest, ADefinitiveVerdictIsNeverHeld) {
  // ... and again at 3.8 s (1.9 s of silence, phi 8.3): every verdict is due. Server 0 is
  // failed on silence (the tolerance), server 1's verdict is held, server 2 was refused.
  tracker_.ProbeDone(0, 3800 * kMs, false, "timeout");
  tracker_.ProbeDone(1, 3800 * kMs, false, "timeout");
  tracker_.ProbeDone(2, 3800 * kMs, false, "connection refused", /*definitive=*/true);
  EXPECT_EQ(Eval(3800 * kMs), (Acts{{0, K::kFail}, {1, K::kHold}, {1, K::kProbe}, {2, K::kFail}}));
  EXPECT_EQ(tracker_.state(1), HealthState::kSuspect);
  EXPECT_TRUE(tracker_.held(1));
  EXPECT_EQ(tracker_.failed_count(), 2u);
  // The held server's next probe is refused: nothing listens there, it is failed at once.
  tracker_.ProbeDone(1, 3900 * kMs, false, "connection refused", /*definitive=*/true);
  EXPECT_EQ(Eval(3900 * kMs), (Acts{{1, K::kFail}}));
  EXPECT_EQ(tracker_.failed_count(), 3u);
}

TEST_F(HealthTrackerCapTest, AHeldServerStaysSuspectIsProbedAndRecoversWhenItAnswers) {
  tracker_.ProbeDone(0, 3800 * kMs, false, "timeout");
  tracker_.ProbeDone(1, 3800 * kMs, false, "timeout");
  tracker_.ProbeDone(2, 3800 * kMs, false, "timeout");
  EXPECT_EQ(Eval(3800 * kMs),
            (Acts{{0, K::kFail}, {1, K::kHold}, {1, K::kProbe}, {2, K::kHold}, {2, K::kProbe}}));
  // Silent for longer: probed again, still held, and the hold is not reported again.
  tracker_.ProbeDone(1, 4800 * kMs, false, "timeout");
  tracker_.ProbeDone(2, 4800 * kMs, false, "timeout");
  EXPECT_EQ(Eval(4800 * kMs), (Acts{{1, K::kProbe}, {2, K::kProbe}}));
  EXPECT_EQ(tracker_.state(1), HealthState::kSuspect);
  EXPECT_EQ(tracker_.state(2), HealthState::kSuspect);
  EXPECT_EQ(tracker_.failed_count(), 1u);
  // Server 1 answers its probe, server 2 a heartbeat: both are healthy again at once.
  tracker_.ProbeDone(1, 5000 * kMs, true, "");
  tracker_.HeartbeatReply(2, 5000 * kMs);
  EXPECT_EQ(Eval(5000 * kMs), (Acts{{1, K::kRecover}, {2, K::kRecover}}));
  EXPECT_EQ(tracker_.state(1), HealthState::kHealthy);
  EXPECT_EQ(tracker_.state(2), HealthState::kHealthy);
  EXPECT_FALSE(tracker_.held(1));
  EXPECT_FALSE(tracker_.held(2));
}

}  // namespace
}  // namespace tessera::client::remote
