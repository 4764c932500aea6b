// Internal to the NBD export: PageLockTable, asynchronous per-page locks shared by every
// connection and export of one NbdServer. A request that changes data holds the lock of each
// page it touches from before its first store op until after its last, taking them in
// ascending page order (so there is no deadlock); a request that finds a page held queues
// behind it and is handed the lock by Release() (its connection then gets a grant event).
//
// Thread-safe (one mutex); never blocks beyond it. Does not own the waiters.
#pragma once

#include <deque>
#include <mutex>
#include <unordered_map>

#include "client/page_store.h"
#include "common/logging.h"

namespace tessera::nbd {

struct Request;

class PageLockTable {
 public:
  // True: granted now. False: queued; the grant arrives later through Release()'s return value.
  bool Acquire(client::PageId page, Request* r) {
    std::lock_guard<std::mutex> lk(mu_);
    auto [it, inserted] = held_.try_emplace(page);
    if (inserted) return true;
    it->second.push_back(r);
    return false;
  }
  // Releases `page`; returns the waiter that now holds it (nullptr: none).
  Request* Release(client::PageId page) {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = held_.find(page);
    TCHECK(it != held_.end());
    if (it->second.empty()) {
      held_.erase(it);
      return nullptr;
    }
    Request* next = it->second.front();
    it->second.pop_front();
    return next;
  }

 private:
  std::mutex mu_;
  std::unordered_map<client::PageId, std::deque<Request*>> held_;
};

}  // namespace tessera::nbd
