// Failure detection: heartbeats from a monitor thread (its own control clients), marking a server
// failed (placement reconfigured, I/O threads woken), and classifying stragglers from reply
// latencies.
#include "client/remote/engine.h"

#include <poll.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <chrono>
#include <memory>
#include <thread>

#include "common/logging.h"

namespace tessera::client::remote {
namespace {
bool SameEndpoint(const fabric::Endpoint& a, const fabric::Endpoint& b) {
  return a.host == b.host && a.port == b.port;
}
}  // namespace

void RemoteStore::MarkFailed(uint32_t server, const std::string& why) {
  if (failed_[server].exchange(true)) return;
  failed_at_ns_[server].store(MonotonicNs(), std::memory_order_relaxed);
  health_[server].store(static_cast<uint8_t>(HealthState::kFailed), std::memory_order_relaxed);
  stats_.server_failures.fetch_add(1);
  TLOG(WARNING) << name_ << ": server " << servers_[server].endpoint.ToString()
                << " failed: " << why;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto next = snap_->WithState(server, placement::ServerState::kFailed);
    if (next.ok()) {
      auto pol = policy_->Reconfigure(*next);
      snap_ = *next;
      if (pol.ok()) policy_ = *pol;
    }
    RebuildAvoidLocked();
  }
  failure_epoch_.fetch_add(1, std::memory_order_release);
  for (auto& t : threads_) t->Wake();
  { std::lock_guard<std::mutex> lock(monitor_mu_); }  // No lost wake-up of the monitor.
  monitor_cv_.notify_all();
}

void RemoteStore::RebuildAvoidLocked() {
  placement::SnapshotPtr next = snap_;
  bool any = false;
  for (uint32_t i = 0; i < num_servers(); ++i) {
    if (health_[i].load(std::memory_order_relaxed) !=
        static_cast<uint8_t>(HealthState::kSuspect)) {
      continue;
    }
    auto n = next->WithState(i, placement::ServerState::kDraining);
    if (!n.ok()) continue;
    next = *n;
    any = true;
  }
  if (!any) {
    avoid_snap_.reset();
    avoid_policy_.reset();
    return;
  }
  auto pol = policy_->Reconfigure(next);
  if (!pol.ok()) {
    avoid_snap_.reset();
    avoid_policy_.reset();
    return;
  }
  avoid_snap_ = next;
  avoid_policy_ = *pol;
}

Result<std::vector<placement::ServerId>> RemoteStore::PlaceLocked(uint64_t ls) {
  if (avoid_policy_) {
    auto p = avoid_policy_->Place(*avoid_snap_, ls, load_);
    if (p.ok()) return p;
  }
  return policy_->Place(*snap_, ls, load_);
}

Result<placement::ServerId> RemoteStore::ReplacementLocked(
    uint64_t ls, const std::vector<placement::ServerId>& current, int j) {
  auto pick = [&](const placement::SnapshotPtr& snap,
                  const placement::PlacementPtr& pol) -> Result<placement::ServerId> {
    auto r = pol->ChooseReplacement(*snap, ls, current, j, load_);
    if (r.ok()) return r;
    // No surviving member to anchor the choice (e.g. a single copy), or none in its group:
    // a server the policy would place the slab on now, outside the current set.
    for (uint64_t salt = 0; salt < 4; ++salt) {
      auto fresh = pol->Place(*snap, ls + salt + 1, load_);
      if (!fresh.ok()) break;
      for (placement::ServerId id : *fresh) {
        if (std::find(current.begin(), current.end(), id) == current.end()) return id;
      }
    }
    return r;
  };
  if (avoid_policy_) {
    auto r = pick(avoid_snap_, avoid_policy_);
    if (r.ok()) return r;
  }
  return pick(snap_, policy_);
}

void RemoteStore::ReportTrouble(uint32_t server, std::string why, bool broken) {
  if (server >= kMaxServers || failed_[server].load(std::memory_order_relaxed)) return;
  {
    std::lock_guard<std::mutex> lock(trouble_mu_);
    // Bounded: one pending report per server is enough (the monitor takes them every tick).
    for (TroubleReport& r : trouble_) {
      if (r.server == server) {
        if (broken && !r.broken) r = {server, std::move(why), true};
        return;
      }
    }
    trouble_.push_back({server, std::move(why), broken});
    trouble_pending_.store(true, std::memory_order_relaxed);
  }
  { std::lock_guard<std::mutex> lock(monitor_mu_); }
  monitor_cv_.notify_all();
}

void IoThread::ClassifySlow() {
  since_classify_ = 0;
  if (!store_->opt_.avoid_slow_servers) return;  // slow_ stays all 0.
  uint64_t v[kMaxServersForMedian];
  size_t n = 0;
  for (size_t i = 0; i < latency_ewma_ns_.size() && n < kMaxServersForMedian; ++i) {
    if (!local_failed_[i] && latency_ewma_ns_[i] != 0) v[n++] = latency_ewma_ns_[i];
  }
  if (n < 2) return;
  std::nth_element(v, v + (n - 1) / 2, v + n);
  const uint64_t median = v[(n - 1) / 2];  // The lower median (of two servers: the faster).
  for (size_t i = 0; i < latency_ewma_ns_.size(); ++i) {
    uint64_t& e = latency_ewma_ns_[i];
    slow_[i] = e > 2 * median && e > median + 100000;
    // A slow server's splits are rarely read, so its estimate would go stale: let it drift
    // down so the server is tried again now and then (writes and those reads refresh it).
    if (slow_[i]) e -= e / 128;
  }
}


void IoThread::NoteLateRequests(const Ctx* c) {
  if (!store_->opt_.avoid_slow_servers) return;  // No server is made slow or silent.
  if (c->outstanding <= 0 || c->slab >= slabs_.size()) return;
  const Slab& s = slabs_[c->slab];
  uint64_t pending = c->asked & ~(c->good | c->bad);
  while (pending != 0) {
    const int j = std::countr_zero(pending);
    pending &= pending - 1;
    const uint32_t server = s.server[j].load(std::memory_order_relaxed);
    if (server >= late_strikes_.size()) continue;
    if (now_ns_ - last_reply_ns_[server] < kLateReadNs) continue;  // It answers: just late.
    if (++late_strikes_[server] < kLateStrikes) continue;
    if (slow_[server]) continue;
    // Slow now, and kept slow by ClassifySlow() until replies bring its estimate down.
    uint64_t& e = latency_ewma_ns_[server];
    e = std::max<uint64_t>(e, 4 * kLateReadNs);
    slow_[server] = 1;
  }
}

namespace {
// One confirming probe (or, for a server the monitor has no control connection to, a connect):
// a fresh connection, authentication and one heartbeat, within the probe timeout. Runs on its
// own thread so that a stopped server holds no other server's heartbeats.
// The probe's thread is detached (it touches nothing of the store), so a store shutting down
// never waits for a probe of a stopped server; the state is shared with the monitor.
struct Probe {
  std::atomic<bool> done{false};
  Status status;                                // Set before done.
  std::unique_ptr<fabric::ControlClient> conn;  // The fresh connection, when it worked.
};
std::shared_ptr<Probe> StartProbe(fabric::Endpoint ep, fabric::ConnectOptions co,
                                  uint32_t timeout_ms) {
  auto p = std::make_shared<Probe>();
  std::thread([p, ep = std::move(ep), co, timeout_ms]() mutable {
    const Deadline d = Deadline::AfterMs(timeout_ms);
    co.deadline = d;
    auto c = fabric::ControlClient::Connect(ep, co);
    if (!c.ok()) {
      p->status = c.status();
    } else if (auto hb = (*c)->Heartbeat(d); !hb.ok()) {
      p->status = hb.status();
    } else {
      p->conn = std::move(*c);
    }
    p->done.store(true, std::memory_order_release);
  }).detach();
  return p;
}
}  // namespace

// Frees the slabs this client left on a failed server that answers again, over a fresh control
// connection, on a detached thread (same reasons as the probe). `done` is set at the end; the
// slabs it could not free are in `left` (the server's lease reclaims them anyway).
struct Reclaim {
  std::atomic<bool> done{false};
  std::vector<uint64_t> left;
  uint64_t freed = 0;
};
// instance: the server id the slabs were allocated from; another process at that address
// (restarted) holds none of them, and its own slab ids must not be touched.
std::shared_ptr<Reclaim> StartReclaim(fabric::Endpoint ep, fabric::ConnectOptions co,
                                      uint32_t timeout_ms, uint64_t instance,
                                      std::vector<uint64_t> slabs) {
  auto r = std::make_shared<Reclaim>();
  std::thread([r, ep = std::move(ep), co, timeout_ms, instance,
               slabs = std::move(slabs)]() mutable {
    co.deadline = Deadline::AfterMs(timeout_ms);
    auto c = fabric::ControlClient::Connect(ep, co);
    if (c.ok() && (instance == 0 || (*c)->info().server_id != instance)) {
      // Restarted (or never known): the slabs died with the old process. Nothing to free.
      (void)(*c)->Close(Deadline::AfterMs(timeout_ms));
      r->done.store(true, std::memory_order_release);
      return;
    }
    for (size_t i = 0; i < slabs.size(); ++i) {
      if (!c.ok() || !(*c)->connected()) {
        r->left.assign(slabs.begin() + static_cast<ptrdiff_t>(i), slabs.end());
        break;
      }
      Status st = (*c)->FreeSlab(slabs[i], Deadline::AfterMs(timeout_ms));
      if (st.ok() || st.code() == StatusCode::kNotFound) {
        r->freed += st.ok() ? 1 : 0;
      } else if (st.code() == StatusCode::kTimeout || st.code() == StatusCode::kUnavailable) {
        r->left.assign(slabs.begin() + static_cast<ptrdiff_t>(i), slabs.end());
        break;
      }
    }
    if (c.ok()) (void)(*c)->Close(Deadline::AfterMs(timeout_ms));
    r->done.store(true, std::memory_order_release);
  }).detach();
  return r;
}

void RemoteStore::MonitorLoop() {
  // Per server: the monitor's own control connection (heartbeats only), the heartbeat in
  // flight on it, and the probe (connect or confirmation) running for it.
  struct Slot {
    std::unique_ptr<fabric::ControlClient> conn;
    uint64_t hb_id = 0;  // 0: none in flight.
    uint64_t hb_sent_ns = 0;
    std::shared_ptr<Probe> probe;
    std::shared_ptr<Reclaim> reclaim;
    std::vector<uint64_t> left_behind;  // Failed server: our slabs still there.
    uint64_t next_reclaim_ns = 0;
    bool probe_is_confirm = false;  // Ordered by the tracker (else: a (re)connect).
    uint64_t next_connect_ns = 0;
    uint64_t seen_alive_ns = 0;  // last_alive_ns_ as last handed to the tracker.
    uint64_t next_hb_ns = 0;
  };
  const HealthConfig hc = MonitorHealthConfig();
  HealthTracker tracker(hc);
  std::vector<Slot> slots;
  std::vector<HealthTracker::Action> actions;
  std::vector<pollfd> pfds;
  std::vector<uint32_t> pfd_server;
  fabric::ConnectOptions co;
  co.secret = opt_.secret;
  co.client_id = client_id_;
  const uint64_t interval = hc.interval_ns;
  // The monitor judges every tick (signals from the I/O threads wake it sooner), and sends
  // heartbeats every heartbeat interval.
  const uint64_t tick = std::min<uint64_t>(interval, 50000000);
  // A tick later than planned by more than this is the client's own stall (excused).
  constexpr uint64_t kStallSlackNs = 20000000;
  uint64_t next_tick = 0;
  std::vector<TroubleReport> troubles;

  auto launch = [&](uint32_t i, bool confirm) {
    Slot& sl = slots[i];
    sl.probe_is_confirm = confirm;
    sl.probe = StartProbe(servers_[i].endpoint, co, opt_.probe_timeout_ms);
  };

  while (!monitor_stop_.load()) {
    uint64_t now = MonotonicNs();
    const uint32_t n = num_servers();
    if (slots.size() < n) {
      slots.resize(n);
      tracker.Resize(n, now);
      {
        std::lock_guard<std::mutex> lock(sync_mu_);
        monitor_synced_.store(n, std::memory_order_release);
      }
      sync_cv_.notify_all();
    }
    // Signals from the I/O threads, direct readers and membership.
    TakeTroubles(tracker, now, &troubles);
    {
      std::lock_guard<std::mutex> lock(trouble_mu_);
      for (const auto& [s, id] : left_behind_) {
        if (s < n) slots[s].left_behind.push_back(id);
      }
      left_behind_.clear();
    }
    for (uint32_t i = 0; i < n; ++i) {
      Slot& sl = slots[i];
      if (failed_[i].load()) {
        if (tracker.state(i) != HealthState::kFailed) tracker.ForceFailed(i);
        sl.conn.reset();  // Closing it starts the server's lease on our slabs there.
        // Our slabs there: if it answers again (it was paused, not dead), give them back now.
        if (sl.reclaim && sl.reclaim->done.load(std::memory_order_acquire)) {
          if (sl.reclaim->freed > 0) {
            TLOG(INFO) << name_ << ": freed " << sl.reclaim->freed << " slabs left on failed server "
                       << servers_[i].endpoint.ToString() << ", which answers again";
          }
          sl.left_behind.insert(sl.left_behind.end(), sl.reclaim->left.begin(),
                                sl.reclaim->left.end());
          sl.reclaim.reset();
        }
        if (!sl.reclaim && !sl.left_behind.empty() && now >= sl.next_reclaim_ns) {
          sl.next_reclaim_ns = now + 1000000000ull;
          sl.reclaim = StartReclaim(servers_[i].endpoint, co, opt_.probe_timeout_ms,
                                    server_ids_[i].load(), std::move(sl.left_behind));
          sl.left_behind.clear();
        }
        continue;
      }
      // Replies seen by the I/O threads and direct readers.
      const uint64_t a = last_alive_ns_[i].load(std::memory_order_relaxed);
      if (a > sl.seen_alive_ns) {
        sl.seen_alive_ns = a;
        tracker.DataAlive(i, a);
      }
      // Probes that ended.
      if (sl.probe && sl.probe->done.load(std::memory_order_acquire)) {
        std::shared_ptr<Probe> probe = std::move(sl.probe);
        Probe& r = *probe;
        const uint64_t t = MonotonicNs();
        if (r.status.ok() && r.conn && !SameInstance(i, r.conn->info().server_id)) {
          MarkFailed(i, "it was restarted (a new instance answers at its address and holds none "
                        "of this client's slabs)");
          continue;
        }
        if (r.status.ok()) {
          if (!sl.conn || !sl.conn->connected()) {
            sl.conn = std::move(r.conn);
            sl.hb_id = 0;
          }
          tracker.HeartbeatReply(i, t);
        }
        if (sl.probe_is_confirm) {
          // Refused or reset: nothing listens there. A timeout may be a stopped process, or
          // this client not running: not definitive.
          tracker.ProbeDone(i, t, r.status.ok(), r.status.ToString(),
                            !r.status.ok() && r.status.code() == StatusCode::kUnavailable);
        } else if (!r.status.ok()) {
          // Refused: trouble. Timed out: no evidence either way (a stopped server, or this
          // client too busy to finish a handshake); its silence speaks for it.
          if (r.status.code() == StatusCode::kUnavailable) {
            tracker.Trouble(i, t, "heartbeat connection: " + r.status.ToString());
          }
          sl.next_connect_ns = t + std::max<uint64_t>(interval, 200000000);
        }
      }
      // A heartbeat to every connected server that has none in flight; a connect probe for
      // the others.
      if (sl.conn && sl.conn->connected()) {
        if (sl.hb_id == 0 && now >= sl.next_hb_ns) {
          auto id = sl.conn->SendHeartbeat(Deadline::AfterMs(opt_.heartbeat_interval_ms));
          if (id.ok()) {
            sl.hb_id = *id;
            sl.hb_sent_ns = now;
            sl.next_hb_ns = now + interval;
          }
        }
      } else if (sl.conn) {
        tracker.Trouble(i, now, "heartbeat connection lost: " + sl.conn->down_reason().ToString());
        sl.conn.reset();
        sl.hb_id = 0;
      } else if (!sl.probe && now >= sl.next_connect_ns) {
        launch(i, /*confirm=*/false);
      }
    }
    // Wait for replies until the next tick, taking each as it comes.
    next_tick = MonotonicNs() + tick;
    for (;;) {
      now = MonotonicNs();
      if (now >= next_tick || monitor_stop_.load()) break;
      if (trouble_pending_.load(std::memory_order_relaxed)) break;  // Judge it now.
      pfds.clear();
      pfd_server.clear();
      for (uint32_t i = 0; i < n; ++i) {
        if (slots[i].conn && slots[i].conn->connected() && slots[i].conn->fd() >= 0) {
          pfds.push_back({slots[i].conn->fd(), POLLIN, 0});
          pfd_server.push_back(i);
        }
      }
      const int wait_ms =
          std::min(20, static_cast<int>((next_tick - now + 999999) / 1000000));
      const int got = ::poll(pfds.data(), pfds.size(), wait_ms);
      const uint64_t after = MonotonicNs();
      // Back later than asked: this thread did not run (descheduled, throttled). That time is
      // the client's stall, excused before the replies that waited meanwhile are taken.
      const uint64_t planned = now + uint64_t(wait_ms) * 1000000;
      if (after > planned + kStallSlackNs) {
        tracker.Stall(after - planned, after);
        next_tick = std::max(next_tick, after);
      }
      if (got < 0 && errno != EINTR) break;
      for (size_t p = 0; p < pfds.size() && got > 0; ++p) {
        if (pfds[p].revents == 0) continue;
        Slot& sl = slots[pfd_server[p]];
        if (sl.hb_id != 0) {
          auto r = sl.conn->PollHeartbeat(sl.hb_id);
          if (r.ok() && *r) {
            sl.hb_id = 0;
            tracker.HeartbeatReply(pfd_server[p], after);
          }
        }
        fabric::Notice drop[16];  // The data connections act on notices; these are dropped.
        while (sl.conn->connected() && sl.conn->PollNotices(drop) > 0) {
        }
      }
      if (monitor_stop_.load()) break;
    }
    if (monitor_stop_.load()) break;
    now = MonotonicNs();
    // Last look at every socket before judging anyone.
    for (uint32_t i = 0; i < n; ++i) {
      Slot& sl = slots[i];
      if (sl.hb_id != 0 && sl.conn && sl.conn->connected()) {
        auto r = sl.conn->PollHeartbeat(sl.hb_id);
        if (r.ok() && *r) {
          sl.hb_id = 0;
          tracker.HeartbeatReply(i, now);
        }
      }
      const uint64_t a = last_alive_ns_[i].load(std::memory_order_relaxed);
      if (a > sl.seen_alive_ns) {
        sl.seen_alive_ns = a;
        tracker.DataAlive(i, a);
      }
    }
    actions.clear();
    tracker.Evaluate(now, &actions);
    ApplyHealthActions(actions, [&](uint32_t i) {
      if (slots[i].probe) {
        // A connect probe is running: it confirms as well as a new one would.
        slots[i].probe_is_confirm = true;
      } else {
        launch(i, /*confirm=*/true);
      }
    });
  }
  // Probes still running end on their own within the probe timeout.
}

HealthConfig RemoteStore::MonitorHealthConfig() const {
  HealthConfig hc;
  hc.interval_ns = uint64_t{opt_.heartbeat_interval_ms} * 1000000;
  hc.min_silence_ns = uint64_t{opt_.heartbeat_timeout_ms} * 1000000;
  hc.phi_suspect = opt_.suspect_phi;
  hc.fail_after_ns = uint64_t{opt_.fail_after_ms} * 1000000;
  hc.probe_every_ns = 200000000;  // Only while suspect: cheap, and bounds how late a verdict is.
  // r (copies: copies - 1): more failed servers than that lose the data they share, so a
  // verdict on silence alone that would go past it is held (health.h).
  hc.tolerance = static_cast<uint32_t>(std::max(0, lay_.r));
  return hc;
}

void RemoteStore::TakeTroubles(HealthTracker& tracker, uint64_t now,
                               std::vector<TroubleReport>* scratch) {
  {
    std::lock_guard<std::mutex> lock(trouble_mu_);
    scratch->swap(trouble_);
    trouble_pending_.store(false, std::memory_order_relaxed);
  }
  const uint32_t n = num_servers();
  for (const TroubleReport& r : *scratch) {
    if (r.server < n) tracker.Trouble(r.server, now, r.why, r.broken);
  }
  scratch->clear();
}

void RemoteStore::ApplyHealthActions(const std::vector<HealthTracker::Action>& actions,
                                     const std::function<void(uint32_t)>& probe) {
  for (const auto& act : actions) {
    const uint32_t i = act.server;
    const std::string ep = servers_[i].endpoint.ToString();
    switch (act.kind) {
      case HealthTracker::Action::Kind::kSuspect:
        health_[i].store(static_cast<uint8_t>(HealthState::kSuspect), std::memory_order_relaxed);
        {
          std::lock_guard<std::mutex> lock(mu_);
          RebuildAvoidLocked();
        }
        stats_.server_suspicions.fetch_add(1, std::memory_order_relaxed);
        TLOG(WARNING) << name_ << ": server " << ep << " is suspect: " << act.why;
        for (auto& t : threads_) t->Wake();
        break;
      case HealthTracker::Action::Kind::kRecover:
        health_[i].store(static_cast<uint8_t>(HealthState::kHealthy), std::memory_order_relaxed);
        {
          std::lock_guard<std::mutex> lock(mu_);
          RebuildAvoidLocked();
        }
        stats_.server_recoveries.fetch_add(1, std::memory_order_relaxed);
        TLOG(INFO) << name_ << ": server " << ep << " answers again: healthy";
        for (auto& t : threads_) t->Wake();
        break;
      case HealthTracker::Action::Kind::kProbe:
        probe(i);
        break;
      case HealthTracker::Action::Kind::kFail:
        MarkFailed(i, act.why);
        break;
      case HealthTracker::Action::Kind::kHold:
        stats_.verdicts_held.fetch_add(1, std::memory_order_relaxed);
        TLOG(ERROR) << name_ << ": NOT failing server " << ep << ", although it is " << act.why;
        break;
    }
  }
}

Status RemoteStore::AddServer(const RemoteServer& srv) {
  std::lock_guard<std::mutex> add_lock(add_mu_);
  if (threads_.empty()) return Unavailable("page store is shut down");
  // Check it before any thread sees it: reachable and the same slab size.
  uint64_t instance = 0;
  {
    fabric::ConnectOptions co;
    co.secret = opt_.secret;
    co.client_id = client_id_;
    co.deadline = Deadline::AfterMs(opt_.connect_timeout_ms);
    auto c = fabric::ControlClient::Connect(srv.endpoint, co);
    if (!c.ok()) {
      return Unavailable("cannot connect to new server " + srv.endpoint.ToString() + ": " +
                         c.status().ToString());
    }
    if ((*c)->info().slab_size != slab_size_) {
      return InvalidArgument("new server " + srv.endpoint.ToString() + " has slab size " +
                             std::to_string((*c)->info().slab_size) + ", the store uses " +
                             std::to_string(slab_size_));
    }
    instance = (*c)->info().server_id;
  }
  const uint32_t n = num_servers();
  for (uint32_t i = 0; i < n; ++i) {
    if (!SameEndpoint(servers_[i].endpoint, srv.endpoint) || failed_[i].load()) continue;
    if (SameInstance(i, instance)) return Status::Ok();  // A member already.
    // A new process at a member's address (restarted faster than it was found failed): the
    // old member is gone with our slabs on it; the new one joins as a new member.
    MarkFailed(i, "it was restarted (a new instance answers at its address and holds none of "
                  "this client's slabs)");
  }
  if (n >= kMaxServers) {
    return ResourceExhausted(name_ + ": cannot add " + srv.endpoint.ToString() + ": " +
                             std::to_string(kMaxServers) + " servers known already");
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (snap_->has_racks() != !srv.rack.empty()) {
      return InvalidArgument(name_ + ": cannot add " + srv.endpoint.ToString() +
                             (srv.rack.empty() ? " without a rack: the other servers have racks"
                                               : " with a rack: the other servers have none"));
    }
  }
  servers_[n] = srv;
  failed_[n].store(false);
  num_servers_.store(n + 1, std::memory_order_release);
  for (auto& t : threads_) t->Wake();
  { std::lock_guard<std::mutex> lock(monitor_mu_); }  // No lost wake-up of the monitor.
  monitor_cv_.notify_all();
  // Wait until every I/O thread and the monitor have a slot (and the I/O threads a
  // connection) for it. Bounded: a thread that cannot connect marks it failed instead.
  const Deadline d = Deadline::AfterMs(2ull * opt_.connect_timeout_ms + 2000);
  {
    std::unique_lock<std::mutex> lock(sync_mu_);
    const bool synced = sync_cv_.wait_until(
        lock, std::chrono::steady_clock::now() + std::chrono::milliseconds(d.RemainingMs()),
        [&] {
          if (monitor_synced_.load() <= n) return false;
          for (const auto& t : threads_) {
            if (t->synced_servers() <= n) return false;
          }
          return true;
        });
    if (!synced) {
      lock.unlock();
      MarkFailed(n, "not connected by every I/O thread in time after joining");
      return Timeout("new server " + srv.endpoint.ToString() +
                     ": I/O threads did not connect in time");
    }
  }
  if (failed_[n].load()) {
    return Unavailable("new server " + srv.endpoint.ToString() + " failed while joining");
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    placement::ServerInfo si;
    si.id = n;
    si.address = srv.endpoint.ToString();
    si.capacity_slabs = 1 << 20;
    si.free_slabs = si.capacity_slabs;
    si.rack = srv.rack;
    TESSERA_ASSIGN_OR_RETURN(auto next, snap_->WithServerAdded(si));
    TESSERA_ASSIGN_OR_RETURN(auto pol, policy_->Reconfigure(next));
    snap_ = next;
    policy_ = pol;
    RebuildAvoidLocked();
    load_.resize(n + 1, 0);
  }
  TLOG(INFO) << name_ << ": server " << srv.endpoint.ToString() << " joined"
             << (srv.rack.empty() ? "" : " (rack " + srv.rack + ")");
  return Status::Ok();
}

Status RemoteStore::RemoveServer(const fabric::Endpoint& endpoint, const std::string& why) {
  std::lock_guard<std::mutex> add_lock(add_mu_);
  const uint32_t n = num_servers();
  bool found = false;
  for (uint32_t i = 0; i < n; ++i) {
    if (SameEndpoint(servers_[i].endpoint, endpoint) && !failed_[i].load()) {
      // Trouble, not a verdict: a live server answers the confirming probe (an etcd outage
      // that expired every lease fails nothing), a dead one does not.
      ReportTrouble(i, why);
      found = true;
    }
  }
  if (!found) return NotFound("no live server " + endpoint.ToString() + " in " + name_);
  return Status::Ok();
}

}  // namespace tessera::client::remote
