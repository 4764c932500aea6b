#include "client/remote/slab_freer.h"

#include <algorithm>
#include <chrono>

#include "client/remote/engine.h"
#include "client/remote/sim_control.h"
#include "client/remote/slab_allocator.h"
#include "common/logging.h"

namespace tessera::client::remote {

SlabFreer::SlabFreer(RemoteStore* store) : store_(store) {
  if (!store_->opt_.sim) thread_ = std::thread([this] { Loop(); });
}

SlabFreer::~SlabFreer() { Finish(Deadline::AfterMs(2000)); }

void SlabFreer::Free(uint32_t server, uint64_t slab_id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (finishing_) return;  // Only at shutdown, after Finish: the lease reclaims it.
    if (store_->opt_.sim) {
      SimFree(server, slab_id);
      return;
    }
    queue_.push_back({server, slab_id, nullptr});
  }
  cv_.notify_one();
}

void SlabFreer::SimFree(uint32_t server, uint64_t slab_id) {
  if (store_->failed_[server].load(std::memory_order_relaxed)) return;
  const uint64_t start = std::max(MonotonicNs(), sim_busy_until_);
  uint64_t takes = 0;
  const uint64_t ms = std::min<uint32_t>(store_->opt_.control_timeout_ms, 1000);
  Status st = store_->opt_.sim->FreeSlab(server, slab_id, start, ms * 1000000, &takes);
  sim_busy_until_ = start + takes;
  sim_ends_.push_back(sim_busy_until_);
  if (!st.ok() && st.code() != StatusCode::kNotFound && IsConnectionError(st)) {
    store_->ReportTrouble(server, "freeing a slab: " + st.ToString());
  }
}

void SlabFreer::SimPump() {
  std::vector<QueueJob*> done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const uint64_t now = MonotonicNs();
    while (!sim_ends_.empty() && sim_ends_.front() <= now) sim_ends_.pop_front();
    while (!sim_jobs_.empty() && sim_jobs_.front().first <= now) {
      done.push_back(sim_jobs_.front().second);
      sim_jobs_.pop_front();
    }
  }
  for (QueueJob* job : done) job->Done(Status::Ok());
}

uint64_t SlabFreer::SimNextNs() const {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t next = UINT64_MAX;
  if (!sim_ends_.empty()) next = sim_ends_.front();
  if (!sim_jobs_.empty()) next = std::min(next, sim_jobs_.front().first);
  return next;
}

void SlabFreer::After(QueueJob* job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (store_->opt_.sim && !finishing_ && sim_busy_until_ > MonotonicNs()) {
      sim_jobs_.emplace_back(sim_busy_until_, job);
      return;
    }
    if (!finishing_ && (!queue_.empty() || busy_ > 0)) {
      queue_.push_back({0, 0, job});
      cv_.notify_one();
      return;
    }
  }
  job->Done(Status::Ok());
}

size_t SlabFreer::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = busy_ + retry_.size() + sim_ends_.size();
  for (const Item& i : queue_) n += i.job == nullptr ? 1 : 0;
  return n;
}

void SlabFreer::Finish(Deadline deadline) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!finishing_) {
      finishing_ = true;
      finish_by_ = deadline;
    }
    // Simulation: nothing is made after this; the jobs still waiting are done.
    for (auto& [due, job] : sim_jobs_) job->Done(Status::Ok());
    sim_jobs_.clear();
    sim_ends_.clear();
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

bool SlabFreer::Next(std::unique_lock<std::mutex>& lock, Item* item) {
  for (;;) {
    if (!queue_.empty()) {
      *item = queue_.front();
      queue_.pop_front();
      return true;
    }
    const uint64_t now = MonotonicNs();
    if (!retry_.empty() && (finishing_ || retry_.front().due_ns <= now)) {
      *item = retry_.front();
      retry_.pop_front();
      return true;
    }
    if (finishing_) return false;
    if (retry_.empty()) {
      cv_.wait(lock);
    } else {
      cv_.wait_for(lock, std::chrono::nanoseconds(retry_.front().due_ns - now));
    }
  }
}

void SlabFreer::Loop() {
  for (;;) {
    Item item;
    Deadline bound = Deadline::Never();
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (!Next(lock, &item)) break;
      ++busy_;
      if (finishing_) bound = finish_by_;
    }
    bool again = false;
    if (item.job != nullptr) {
      item.job->Done(Status::Ok());
    } else if (!bound.Expired()) {
      // A FREE waits at most what the I/O thread used to wait (and never past Finish's bound).
      const uint64_t ms = std::min<uint32_t>(store_->opt_.control_timeout_ms, 1000);
      again = FreeOne(item, Deadline(std::min(bound.at_ns(), Deadline::AfterMs(ms).at_ns())));
    }
    std::lock_guard<std::mutex> lock(mu_);
    --busy_;
    if (again && !finishing_ && ++item.tries < kMaxTries) {
      const uint64_t backoff_ms = std::min<uint64_t>(200ull << (item.tries - 1), 10000);
      item.due_ns = MonotonicNs() + backoff_ms * 1000000;
      auto at = std::upper_bound(retry_.begin(), retry_.end(), item.due_ns,
                                 [](uint64_t due, const Item& i) { return due < i.due_ns; });
      retry_.insert(at, item);
    }
  }
  for (auto& c : ctl_) {
    if (c && c->connected()) (void)c->Close(Deadline::AfterMs(100));
  }
  ctl_.clear();
}

bool SlabFreer::FreeOne(const Item& item, Deadline deadline) {
  const uint32_t server = item.server;
  if (store_->failed_[server].load(std::memory_order_relaxed)) return false;
  auto c = OwnControl(store_, &ctl_, server, deadline);
  if (!c.ok()) {
    // Restarted (NotFound): our slabs died with the old process, and this slab id may be a new
    // slab of ours there. The monitor finds the restart on its own (the server is failed at
    // once).
    if (c.status().code() == StatusCode::kNotFound) return false;
    TLOG(DEBUG) << store_->name_ << ": cannot free slab " << item.slab_id << " on "
                << store_->server(server).endpoint.ToString() << ": " << c.status();
    store_->ReportTrouble(server, "freeing a slab: " + c.status().ToString());
    return true;
  }
  Status st = (*c)->FreeSlab(item.slab_id, deadline);
  if (st.ok() || st.code() == StatusCode::kNotFound) return false;
  // Not fatal: the data is unreachable from now on; at worst the server reclaims the slab when
  // this client's lease ends.
  TLOG(DEBUG) << store_->name_ << ": cannot free slab " << item.slab_id << " on "
              << store_->server(server).endpoint.ToString() << " (try " << item.tries + 1
              << "): " << st;
  if (!IsConnectionError(st)) return false;
  store_->ReportTrouble(server, "freeing a slab: " + st.ToString());
  return true;
}

}  // namespace tessera::client::remote
