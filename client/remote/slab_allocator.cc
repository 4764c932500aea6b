#include "client/remote/slab_allocator.h"

#include "client/remote/engine.h"
#include "client/remote/sim_control.h"

#include <algorithm>

namespace tessera::client::remote {

Result<fabric::ControlClient*> OwnControl(RemoteStore* store,
                                          std::vector<std::unique_ptr<fabric::ControlClient>>* ctl,
                                          uint32_t server, Deadline deadline) {
  if (ctl->size() <= server) ctl->resize(server + 1);
  std::unique_ptr<fabric::ControlClient>& c = (*ctl)[server];
  if (!c || !c->connected()) {
    fabric::ConnectOptions co;
    co.secret = store->opt_.secret;
    co.client_id = store->client_id_;
    co.deadline = deadline;
    TESSERA_ASSIGN_OR_RETURN(c, fabric::ControlClient::Connect(store->server(server).endpoint, co));
  }
  const uint64_t known = store->server_ids_[server].load(std::memory_order_relaxed);
  if (known != 0 && c->info().server_id != known) {
    // Restarted: our slabs died with the old process. The monitor finds the restart on its own
    // (the server is failed at once).
    return NotFound("it was restarted (a new instance answers at its address)");
  }
  return c.get();
}

SlabAllocator::SlabAllocator(RemoteStore* store, std::function<void()> wake)
    : store_(store), wake_(std::move(wake)) {
  if (!store_->opt_.sim) thread_ = std::thread([this] { Loop(); });
}

SlabAllocator::~SlabAllocator() { Finish(); }

void SlabAllocator::Alloc(uint64_t tag, uint32_t server, uint32_t timeout_ms) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (finishing_) {
      done_.push_back({tag, server, Cancelled("page store is shutting down")});
      return;
    }
    if (store_->opt_.sim) {
      SimAlloc({tag, server, timeout_ms});
      return;
    }
    queue_.push_back({tag, server, timeout_ms});
  }
  cv_.notify_one();
}

void SlabAllocator::SimAlloc(const Ask& ask) {
  const uint64_t start = std::max(MonotonicNs(), sim_busy_until_);
  uint64_t takes = 0;
  Answer answer{ask.tag, ask.server, Unavailable("not asked")};
  if (store_->failed_[ask.server].load(std::memory_order_relaxed)) {
    answer.slab = Unavailable("the server is failed");
  } else {
    answer.slab = store_->opt_.sim->AllocSlab(ask.server, start,
                                              uint64_t{ask.timeout_ms} * 1000000, &takes);
  }
  sim_busy_until_ = start + takes;
  sim_out_.emplace_back(sim_busy_until_, std::move(answer));
}

uint64_t SlabAllocator::SimNextNs() const {
  std::lock_guard<std::mutex> lock(mu_);
  return sim_out_.empty() ? UINT64_MAX : sim_out_.front().first;
}

bool SlabAllocator::Take(std::vector<Answer>* out) {
  std::lock_guard<std::mutex> lock(mu_);
  if (store_->opt_.sim) {
    const uint64_t now = MonotonicNs();
    while (!sim_out_.empty() && sim_out_.front().first <= now) {
      done_.push_back(std::move(sim_out_.front().second));
      sim_out_.pop_front();
    }
  }
  if (done_.empty()) return false;
  for (Answer& a : done_) out->push_back(std::move(a));
  done_.clear();
  return true;
}

void SlabAllocator::Finish() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    finishing_ = true;
    // Simulation: the calls still out end as the thread's would at shutdown.
    for (auto& [due, a] : sim_out_) {
      done_.push_back({a.tag, a.server, Cancelled("page store is shutting down")});
    }
    sim_out_.clear();
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void SlabAllocator::CloseFailed() {
  // Closing our control connection to a failed server starts its lease on our slabs there (it
  // reclaims them after its orphan grace if it comes back), as the other connections close.
  for (size_t i = 0; i < ctl_.size(); ++i) {
    if (ctl_[i] && store_->failed_[i].load(std::memory_order_relaxed)) ctl_[i].reset();
  }
}

void SlabAllocator::Loop() {
  for (;;) {
    Ask ask;
    {
      std::unique_lock<std::mutex> lock(mu_);
      while (!finishing_ && queue_.empty()) {
        if (cv_.wait_for(lock, std::chrono::seconds(1)) == std::cv_status::timeout) {
          lock.unlock();
          CloseFailed();
          lock.lock();
        }
      }
      if (finishing_) {
        for (const Ask& a : queue_) {
          done_.push_back({a.tag, a.server, Cancelled("page store is shutting down")});
        }
        queue_.clear();
        break;
      }
      ask = queue_.front();
      queue_.pop_front();
    }
    CloseFailed();
    const Deadline deadline = Deadline::AfterMs(ask.timeout_ms);
    Answer answer{ask.tag, ask.server, Unavailable("not asked")};
    auto ctl = OwnControl(store_, &ctl_, ask.server, deadline);
    if (!ctl.ok()) {
      answer.slab = ctl.status();
    } else {
      answer.slab = (*ctl)->AllocSlab({}, deadline);
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_.push_back(std::move(answer));
    }
    wake_();
  }
  for (auto& c : ctl_) {
    if (c && c->connected()) (void)c->Close(Deadline::AfterMs(100));
  }
  ctl_.clear();
}

}  // namespace tessera::client::remote
