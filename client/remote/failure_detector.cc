// Failure detection: heartbeats from a monitor thread (its own control clients), marking a server
// failed (placement reconfigured, I/O threads woken), and classifying stragglers from reply
// latencies.
#include "client/remote/engine.h"

#include <algorithm>
#include <chrono>

#include "common/logging.h"

namespace tessera::client::remote {

void RemoteStore::MarkFailed(uint32_t server, const std::string& why) {
  if (failed_[server].exchange(true)) return;
  stats_.server_failures.fetch_add(1);
  TLOG(WARNING) << name_ << ": server " << opt_.servers[server].endpoint.ToString()
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


void RemoteStore::MonitorLoop() {
  // One control connection per server (no data path): heartbeats only.
  std::vector<std::unique_ptr<fabric::ControlClient>> conns(opt_.servers.size());
  fabric::ConnectOptions co;
  co.secret = opt_.secret;
  co.client_id = client_id_;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(monitor_mu_);
      monitor_cv_.wait_for(lock, std::chrono::milliseconds(opt_.heartbeat_interval_ms),
                           [this] { return monitor_stop_.load(); });
      if (monitor_stop_.load()) return;
    }
    for (size_t i = 0; i < opt_.servers.size() && !monitor_stop_.load(); ++i) {
      if (failed_[i].load()) continue;
      if (!conns[i] || !conns[i]->connected()) {
        co.deadline = Deadline::AfterMs(opt_.heartbeat_timeout_ms);
        auto c = fabric::ControlClient::Connect(opt_.servers[i].endpoint, co);
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
      while (conns[i]->PollNotices(drop) > 0) {
      }
    }
  }
}


}  // namespace tessera::client::remote
