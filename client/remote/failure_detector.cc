// Failure detection: heartbeats from a monitor thread (its own control clients), marking a server
// failed (placement reconfigured, I/O threads woken), and classifying stragglers from reply
// latencies.
#include "client/remote/engine.h"

#include <algorithm>
#include <bit>
#include <chrono>

#include "common/logging.h"

namespace tessera::client::remote {
namespace {
bool SameEndpoint(const fabric::Endpoint& a, const fabric::Endpoint& b) {
  return a.host == b.host && a.port == b.port;
}
}  // namespace

void RemoteStore::MarkFailed(uint32_t server, const std::string& why) {
  if (failed_[server].exchange(true)) return;
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
  }
  failure_epoch_.fetch_add(1, std::memory_order_release);
  for (auto& t : threads_) t->Wake();
}

void IoThread::ClassifySlow() {
  since_classify_ = 0;
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

void RemoteStore::MonitorLoop() {
  // One control connection per server (no data path): heartbeats only. Servers added later
  // (AddServer) get a slot when the monitor sees num_servers() grow.
  std::vector<std::unique_ptr<fabric::ControlClient>> conns;
  fabric::ConnectOptions co;
  co.secret = opt_.secret;
  co.client_id = client_id_;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(monitor_mu_);
      // Also woken by AddServer: a joining server waits for the monitor's slot.
      monitor_cv_.wait_for(lock, std::chrono::milliseconds(opt_.heartbeat_interval_ms), [this] {
        return monitor_stop_.load() || num_servers() != monitor_synced_.load();
      });
      if (monitor_stop_.load()) return;
    }
    const uint32_t n = num_servers();
    if (conns.size() < n) {
      conns.resize(n);
      {
        std::lock_guard<std::mutex> lock(sync_mu_);
        monitor_synced_.store(n, std::memory_order_release);
      }
      sync_cv_.notify_all();
    }
    for (size_t i = 0; i < conns.size() && !monitor_stop_.load(); ++i) {
      if (failed_[i].load()) {
        conns[i].reset();
        continue;
      }
      if (!conns[i] || !conns[i]->connected()) {
        co.deadline = Deadline::AfterMs(opt_.heartbeat_timeout_ms);
        auto c = fabric::ControlClient::Connect(servers_[i].endpoint, co);
        if (!c.ok()) {
          MarkFailed(static_cast<uint32_t>(i), "heartbeat connection: " + c.status().ToString());
          continue;
        }
        conns[i] = std::move(*c);
      }
      auto hb = conns[i]->Heartbeat(Deadline::AfterMs(opt_.heartbeat_timeout_ms));
      if (!hb.ok()) {
        MarkFailed(static_cast<uint32_t>(i), "heartbeat: " + hb.status().ToString());
      }
      // The data connections act on notices; these copies are dropped.
      fabric::Notice drop[16];
      while (conns[i] && conns[i]->PollNotices(drop) > 0) {
      }
    }
  }
}

Status RemoteStore::AddServer(const RemoteServer& srv) {
  std::lock_guard<std::mutex> add_lock(add_mu_);
  if (threads_.empty()) return Unavailable("page store is shut down");
  const uint32_t n = num_servers();
  for (uint32_t i = 0; i < n; ++i) {
    if (SameEndpoint(servers_[i].endpoint, srv.endpoint) && !failed_[i].load()) return Status::Ok();
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
  // Check it before any thread sees it: reachable and the same slab size.
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
      MarkFailed(i, why);
      found = true;
    }
  }
  if (!found) return NotFound("no live server " + endpoint.ToString() + " in " + name_);
  return Status::Ok();
}

}  // namespace tessera::client::remote
