// Server health for the remote store: one state per server (healthy, suspect, failed), fed by
// every signal the store sees, decided by one pure state machine (HealthTracker) that the
// monitor thread drives and the simulation tests drive with a simulated clock.
//
// Signals, and what they do:
//   - Alive(s, t): any reply from server s at time t (a heartbeat reply on the monitor's control
//     connection, a completion on any I/O thread, a direct reader's reply, a successful probe).
//     A suspect server that answers is healthy again at once.
//   - HeartbeatReply(s, t): a heartbeat reply; also feeds the detector's inter-arrival window.
//   - Trouble(s, t, why): evidence that needs confirmation: a lost data or control connection,
//     a request without a reply within the op timeout, an etcd lease that expired, a failed
//     reconnect. The server becomes suspect at once; it is never failed on this alone.
//   - Stall(ns): the client itself did not run for ns (a descheduled monitor, a GC pause of the
//     host program, a CPU throttle): that time is excused, it never counts as a server's silence.
//   - Probe results: a confirming probe opens a fresh connection (connect, authentication, one
//     heartbeat) within the probe timeout.
//
// Suspicion from silence is phi-accrual (Hayashibara et al., in the exponential form Cassandra's
// FailureDetector uses): phi(t) = silence / mean * log10(e), where silence is the time since
// the server last answered anything (minus excused client stalls) and mean is the mean interval
// between its recent heartbeat replies (a window of `window` samples, never below the heartbeat
// interval). A loaded machine stretches the intervals, the mean grows, and the silence needed to
// reach the threshold grows with it. A server is suspect when phi >= phi_suspect and its silence
// is at least min_silence_ns (the heartbeat timeout), or on Trouble.
//
// Failed is a verdict taken only when all hold: the server has been suspect without a break for
// at least fail_after_ns; a confirming probe that ended after that point failed; and either that
// probe failed definitively (refused: nothing listens there) or the server is silent by the
// detector's own measure too (phi >= phi_suspect and silence >= min_silence_ns). A suspect server
// is probed every probe_every_ns (one probe at a time). An etcd outage, a request that timed out
// or a busy client therefore fails nothing: a live server answers its probe, or at least
// answers something often enough not to be silent.
//
// Verdicts on silence are capped by the store's tolerance. A failure verdict on silence alone
// (the confirming probe timed out; nothing refused it) is a guess: a stopped process, a machine
// that gave the servers no CPU for a while, or a partition all look like that. Failing more
// servers than the store tolerates (`tolerance`: r for the erasure-coded layouts, copies - 1 for
// copies) loses the data they share, while leaving them suspect loses nothing: reads avoid them
// and ask them only when k members cannot be had without them, and they are healthy again the
// moment they answer. So:
//   - a definitive verdict (a probe refused or reset: nothing listens there; a broken data
//     path: the server refuses data requests) is always taken, as soon as it is due;
//   - a verdict on silence is taken only while fewer than `tolerance` servers are failed
//     (by any evidence, counted for the life of the tracker), so that it leaves at most
//     `tolerance` failed. Otherwise it is held: the server stays suspect, is probed again every
//     probe_every_ns, recovers the moment it answers, and is failed at once if a later probe
//     is refused. The first hold of a suspicion is reported once (kHold).
// Why this keeps the promises: a silence verdict is only ever taken with at most tolerance - 1
// servers failed before it, so silence alone never fails more than `tolerance` servers; a held
// verdict would have made more than `tolerance` servers failed, so the data they share would be
// lost by failing it, and holding it costs time, not data. With at most `tolerance` servers
// failed or silent, no verdict is ever held, so detection is exactly as without the cap; a
// killed server is refused, so it is failed as fast as ever. The count never drops: a failed
// server stays counted even once its splits have been rebuilt elsewhere, so a long-lived store
// that has lost `tolerance` servers fails further servers only on definitive evidence.
//
// Threads: not thread-safe; one owner (the store's monitor thread, or a test) calls everything.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tessera::client::remote {

enum class HealthState : uint8_t { kHealthy = 0, kSuspect = 1, kFailed = 2 };
const char* HealthStateName(HealthState s);  // "healthy", "suspect", "failed"

struct HealthConfig {
  uint64_t interval_ns = 100'000'000;      // Heartbeat interval (floor of the detector's mean).
  uint64_t min_silence_ns = 1'000'000'000;  // No suspicion from silence below this.
  double phi_suspect = 8.0;
  uint32_t window = 100;                    // Inter-arrival samples kept per server.
  uint64_t fail_after_ns = 1'000'000'000;   // Sustained suspicion before a probe may fail it.
  uint64_t probe_every_ns = 200'000'000;    // Between the starts of two probes of one server.
  // Failed servers the store survives without losing data (see above). The default caps
  // nothing.
  uint32_t tolerance = UINT32_MAX;
};

// Phi-accrual over heartbeat reply inter-arrival times (exponential distribution).
class PhiAccrual {
 public:
  PhiAccrual(uint32_t window, uint64_t min_mean_ns);
  void Arrival(uint64_t t_ns);  // A heartbeat reply arrived at t_ns.
  // Phi of a silence of `silence_ns`; 0 before the first arrival's interval is known.
  double Phi(uint64_t silence_ns) const;
  uint64_t mean_ns() const;

 private:
  uint32_t window_;
  uint64_t min_mean_ns_;
  std::vector<uint64_t> intervals_;  // Ring of the last window_ intervals.
  size_t next_ = 0;
  uint64_t sum_ = 0;
  uint64_t last_ = 0;  // 0: no arrival yet.
};

class HealthTracker {
 public:
  explicit HealthTracker(HealthConfig config) : cfg_(config) {}

  struct Action {
    enum class Kind : uint8_t {
      kSuspect,  // healthy -> suspect (why says on what).
      kRecover,  // suspect -> healthy (it answered).
      kProbe,    // start a confirming probe of `server` now (report it with ProbeDone()).
      kFail,     // suspect -> failed: the verdict (why says on what).
      kHold      // A verdict on silence held back (why says why); once per suspicion.
    };
    Kind kind;
    uint32_t server;
    std::string why;
  };

  // Servers 0..n-1 are tracked (n only grows); a new one starts healthy, alive at `t`.
  void Resize(uint32_t n, uint64_t t);
  uint32_t size() const { return static_cast<uint32_t>(s_.size()); }

  void Alive(uint32_t s, uint64_t t);
  void HeartbeatReply(uint32_t s, uint64_t t);
  // broken: the data path to it fails (requests refused or connections lost again and again)
  // although it may still answer heartbeats and probes: it stays suspect until a data reply
  // arrives (DataAlive), and is failed after fail_after_ns of that, probe or not.
  void Trouble(uint32_t s, uint64_t t, const std::string& why, bool broken = false);
  // A reply on the data path (an I/O thread's or direct reader's completion). Also Alive().
  void DataAlive(uint32_t s, uint64_t t);
  // The client itself did not run for the `ns` before `t`. A reply timestamped before the end
  // of a stall (a data reply an I/O thread took just before the whole process stalled, read by
  // the monitor after it) keeps the part of the stall after it excused.
  void Stall(uint64_t ns, uint64_t t);
  // A probe of `s` started by a kProbe action ended at `t`. definitive: it failed in a way only
  // a dead server fails (connection refused or reset: nothing listens there any more), not by
  // running out of time (a stopped or very slow server, or a client that did not run).
  void ProbeDone(uint32_t s, uint64_t t, bool ok, const std::string& why,
                 bool definitive = false);
  // Marks `s` failed from outside (a server that announced its shutdown, a store shutting down).
  void ForceFailed(uint32_t s);

  // Takes the state transitions due at `t` and the probes to start; appends them to `out`.
  void Evaluate(uint64_t t, std::vector<Action>* out);

  HealthState state(uint32_t s) const { return s_[s].state; }
  // Its verdict on silence is held back now (it stays suspect).
  bool held(uint32_t s) const { return s_[s].held; }
  // Servers failed, by any evidence, over the life of the tracker.
  uint32_t failed_count() const { return failed_; }
  bool probing(uint32_t s) const { return s_[s].probing; }
  // The server's silence at `t` (client stalls excused) and its phi.
  uint64_t Silence(uint32_t s, uint64_t t) const;
  double Phi(uint32_t s, uint64_t t) const;
  const HealthConfig& config() const { return cfg_; }

 private:
  struct Server {
    HealthState state = HealthState::kHealthy;
    uint64_t last_alive = 0;
    uint64_t stall_at_alive = 0;  // stalled_ns_ when last_alive was set.
    uint64_t suspect_since = 0;
    std::string trouble;          // Pending Trouble() reason, taken by Evaluate().
    uint64_t trouble_at = 0;
    uint64_t broken_since = 0;    // 0: the data path is not known broken.
    std::string broken_why;
    bool probing = false;
    uint64_t probe_started = 0;
    bool probe_failed = false;    // The last probe ended in failure ...
    bool probe_definitive = false;
    uint64_t probe_failed_at = 0;  // ... at this time,
    std::string probe_why;         // ... for this reason.
    bool held = false;             // Its verdict on silence is held back (reported once).
    PhiAccrual phi;
    explicit Server(const HealthConfig& c) : phi(c.window, c.interval_ns) {}
  };
  HealthConfig cfg_;
  std::vector<Server> s_;
  uint64_t stalled_ns_ = 0;
  // The latest stalls (end, length), at most kStallsKept: Alive() excuses the part of each that
  // came after the reply.
  static constexpr size_t kStallsKept = 16;
  std::vector<std::pair<uint64_t, uint64_t>> stalls_;
  // Stall time (of the ones kept) after `t`.
  uint64_t StalledAfter(uint64_t t) const;
  uint32_t failed_ = 0;  // Servers in state kFailed.

  // Moves `s` to kFailed and counts it.
  void SetFailed(Server& v);
};

}  // namespace tessera::client::remote
