#include "client/remote/slab_allocator.h"

#include "client/remote/engine.h"
#include "client/remote/sim_control.h"

#include <sys/socket.h>

#include <algorithm>

namespace tessera::client::remote {

Result<fabric::ControlClient*> OwnControl(RemoteStore* store,
                                          std::unique_ptr<fabric::ControlClient>* slot,
                                          uint32_t server, Deadline deadline) {
  std::unique_ptr<fabric::ControlClient>& c = *slot;
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

Result<fabric::ControlClient*> OwnControl(RemoteStore* store,
                                          std::vector<std::unique_ptr<fabric::ControlClient>>* ctl,
                                          uint32_t server, Deadline deadline) {
  if (ctl->size() <= server) ctl->resize(server + 1);
  return OwnControl(store, &(*ctl)[server], server, deadline);
}

SlabAllocator::SlabAllocator(RemoteStore* store, std::function<void()> wake)
    : store_(store), wake_(std::move(wake)) {}

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
    // One more worker when the idle ones cannot start every call that could run now: a worker
    // calling a server that stopped answering must not hold up the calls to the others.
    if (RunnableLocked() > idle_ && workers_.size() < kMaxWorkers) {
      workers_.emplace_back([this] { Worker(); });
      ++idle_;  // Idle from its start: it takes a call only once it runs.
    }
  }
  cv_.notify_one();
}

size_t SlabAllocator::RunnableLocked() const {
  std::vector<uint32_t> seen;
  for (const Ask& a : queue_) {
    if (BusyLocked(a.server) || std::find(seen.begin(), seen.end(), a.server) != seen.end()) {
      continue;
    }
    seen.push_back(a.server);
  }
  return seen.size();
}

bool SlabAllocator::TakeRunnableLocked(Ask* ask) {
  for (auto it = queue_.begin(); it != queue_.end(); ++it) {
    if (BusyLocked(it->server)) continue;
    *ask = *it;
    queue_.erase(it);
    if (busy_.size() <= ask->server) busy_.resize(ask->server + 1, false);
    busy_[ask->server] = true;
    return true;
  }
  return false;
}

size_t SlabAllocator::workers() const {
  std::lock_guard<std::mutex> lock(mu_);
  return workers_.size();
}

void SlabAllocator::SimAlloc(const Ask& ask) {
  if (sim_busy_until_.size() <= ask.server) sim_busy_until_.resize(ask.server + 1, 0);
  const uint64_t start = std::max(MonotonicNs(), sim_busy_until_[ask.server]);
  uint64_t takes = 0;
  Answer answer{ask.tag, ask.server, Unavailable("not asked")};
  if (store_->failed_[ask.server].load(std::memory_order_relaxed)) {
    answer.slab = Unavailable("the server is failed");
  } else {
    answer.slab = store_->opt_.sim->AllocSlab(ask.server, start,
                                              uint64_t{ask.timeout_ms} * 1000000, &takes);
  }
  sim_busy_until_[ask.server] = start + takes;
  sim_out_.emplace_back(start + takes, std::move(answer));
}

uint64_t SlabAllocator::SimNextNs() const {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t next = UINT64_MAX;
  for (const auto& [due, a] : sim_out_) next = std::min(next, due);
  return next;
}

bool SlabAllocator::Take(std::vector<Answer>* out) {
  std::lock_guard<std::mutex> lock(mu_);
  if (store_->opt_.sim) {
    // In the order they end (ties in the order asked), as the workers would hand them over.
    std::stable_sort(sim_out_.begin(), sim_out_.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    const uint64_t now = MonotonicNs();
    size_t n = 0;
    while (n < sim_out_.size() && sim_out_[n].first <= now) {
      done_.push_back(std::move(sim_out_[n].second));
      ++n;
    }
    sim_out_.erase(sim_out_.begin(), sim_out_.begin() + static_cast<std::ptrdiff_t>(n));
  }
  if (done_.empty()) return false;
  for (Answer& a : done_) out->push_back(std::move(a));
  done_.clear();
  return true;
}

void SlabAllocator::Finish() {
  std::vector<std::thread> workers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    finishing_ = true;
    // Simulation: the calls still out end as the workers' would at shutdown.
    for (auto& [due, a] : sim_out_) {
      done_.push_back({a.tag, a.server, Cancelled("page store is shutting down")});
    }
    sim_out_.clear();
    workers.swap(workers_);
    // A call waiting for a server that stopped answering would hold shutdown for its deadline.
    for (int fd : calling_fd_) {
      if (fd >= 0) (void)::shutdown(fd, SHUT_RDWR);
    }
  }
  cv_.notify_all();
  for (std::thread& w : workers) w.join();
  std::map<uint32_t, std::unique_ptr<fabric::ControlClient>> ctl;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Calls no worker started (there was none left to start them).
    for (const Ask& a : queue_) {
      done_.push_back({a.tag, a.server, Cancelled("page store is shutting down")});
    }
    queue_.clear();
    ctl.swap(ctl_);
  }
  for (auto& [server, c] : ctl) {
    if (c && c->connected()) (void)c->Close(Deadline::AfterMs(100));
  }
}

void SlabAllocator::TakeFailedLocked(std::vector<std::unique_ptr<fabric::ControlClient>>* closed) {
  // Closing our control connection to a failed server starts its lease on our slabs there (it
  // reclaims them after its orphan grace if it comes back), as the other connections close.
  for (auto& [server, c] : ctl_) {
    if (c && !BusyLocked(server) && store_->failed_[server].load(std::memory_order_relaxed)) {
      closed->push_back(std::move(c));
    }
  }
}

void SlabAllocator::Worker() {
  std::vector<std::unique_ptr<fabric::ControlClient>> closed;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    Ask ask;
    while (!finishing_ && !TakeRunnableLocked(&ask)) {
      if (cv_.wait_for(lock, std::chrono::seconds(1)) == std::cv_status::timeout) {
        TakeFailedLocked(&closed);
        lock.unlock();
        closed.clear();
        lock.lock();
      }
    }
    if (finishing_) return;
    --idle_;
    TakeFailedLocked(&closed);
    std::unique_ptr<fabric::ControlClient>* slot = &ctl_[ask.server];  // Ours while busy.
    lock.unlock();
    closed.clear();
    const Deadline deadline = Deadline::AfterMs(ask.timeout_ms);
    Answer answer{ask.tag, ask.server, Unavailable("not asked")};
    auto ctl = OwnControl(store_, slot, ask.server, deadline);
    if (!ctl.ok()) {
      answer.slab = ctl.status();
    } else {
      lock.lock();
      const bool calling = !finishing_;
      if (calling) {
        if (calling_fd_.size() <= ask.server) calling_fd_.resize(ask.server + 1, -1);
        calling_fd_[ask.server] = (*ctl)->fd();
      }
      lock.unlock();
      answer.slab = calling ? (*ctl)->AllocSlab({}, deadline)
                            : Result<fabric::AllocSlabResponse>(Cancelled("page store is shutting down"));
    }
    lock.lock();
    if (ask.server < calling_fd_.size()) calling_fd_[ask.server] = -1;
    if (finishing_ && !answer.slab.ok()) {
      answer.slab = Cancelled("page store is shutting down");  // Cut short by Finish().
    }
    ++idle_;
    busy_[ask.server] = false;
    done_.push_back(std::move(answer));
    lock.unlock();
    cv_.notify_one();  // A call to the same server may be waiting for this one.
    wake_();
    lock.lock();
  }
}

}  // namespace tessera::client::remote
