// SlabAllocator: the ALLOC control calls of one I/O thread, made on a thread of their own, so
// that an I/O thread never waits on the network for a slab (an allocation from a server that
// has stopped answering takes up to its deadline, and every request of the I/O thread would
// wait behind it): the members of a new slab (both layouts) and the replacement of a member
// whose server failed or evicted it (IoThread::BeginAllocate, IoThread::ReplaceSplit).
//
// The I/O thread chooses the server of every member (placement, replacements) and hands each
// ALLOC here with a tag; the allocator makes the calls over its own control connections (the
// store's credential and owner id, on the server instance the store knows), and hands every
// answer back through Take(), waking the I/O thread with `wake`. The I/O thread makes each new
// slab known to its data transport itself. The connection to a server marked failed is closed
// (at the next call, or within a second), so that the server's lease on our slabs starts.
//
// Calls to different servers run at once, on a pool of worker threads that grows on demand (up
// to kMaxWorkers); calls to one server run one after another, in the order given. So a server
// that stopped answering holds up only the calls to itself, each for its deadline, and a new
// slab's k + r ALLOCs take one round trip, not k + r. (The I/O thread gives up waiting for a
// call to a server that turns suspect, and asks another server: IoThread::AbandonStuckAllocs.)
//
// Threads: Alloc/Take from the owning I/O thread; Finish from it at shutdown.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "fabric/control_client.h"

namespace tessera::client::remote {

class RemoteStore;

// The control connection to `server` in `ctl` (a thread's own set, by server index), made (or
// made again, when it was lost) with the store's credential and owner id. NotFound when the
// server answering is not the instance the store knows (it was restarted: it holds none of our
// slabs).
Result<fabric::ControlClient*> OwnControl(RemoteStore* store,
                                          std::vector<std::unique_ptr<fabric::ControlClient>>* ctl,
                                          uint32_t server, Deadline deadline);
// The same for one server's connection slot.
Result<fabric::ControlClient*> OwnControl(RemoteStore* store,
                                          std::unique_ptr<fabric::ControlClient>* slot,
                                          uint32_t server, Deadline deadline);

class SlabAllocator {
 public:
  struct Answer {
    uint64_t tag = 0;
    uint32_t server = 0;
    Result<fabric::AllocSlabResponse> slab = Unavailable("not asked");
  };
  SlabAllocator(RemoteStore* store, std::function<void()> wake);
  ~SlabAllocator();  // Finish() if it was not called.
  SlabAllocator(const SlabAllocator&) = delete;
  SlabAllocator& operator=(const SlabAllocator&) = delete;

  // Worker threads at most: as many servers as can hang calls at once without holding up the
  // calls to the others.
  static constexpr size_t kMaxWorkers = 16;

  // Asks `server` for a slab, waiting at most timeout_ms for the answer.
  void Alloc(uint64_t tag, uint32_t server, uint32_t timeout_ms);
  // Moves the answers that arrived into *out (appended); false when there were none.
  bool Take(std::vector<Answer>* out);
  // Stops the workers: the calls in progress are cut short (their connections shut down; one
  // still connecting ends at its deadline), and they and the calls not started are answered
  // Cancelled. Idempotent.
  void Finish();
  // Worker threads started so far (tests).
  size_t workers() const;
  // Simulation (RemoteStoreOptions::sim; no thread): when the next answer is due (simulated
  // MonotonicNs), UINT64_MAX when none is out.
  uint64_t SimNextNs() const;

 private:
  struct Ask {
    uint64_t tag;
    uint32_t server;
    uint32_t timeout_ms;
  };
  void Worker();
  // Takes the first queued call whose server no worker is calling (marking it busy); false when
  // there is none. mu_ held.
  bool TakeRunnableLocked(Ask* ask);
  // Queued calls a worker could start now, one per server. mu_ held.
  size_t RunnableLocked() const;
  bool BusyLocked(uint32_t server) const { return server < busy_.size() && busy_[server]; }
  // Closes the connections to failed servers that no worker is using. mu_ held (the connections
  // are destroyed by the caller, after unlocking: *closed).
  void TakeFailedLocked(std::vector<std::unique_ptr<fabric::ControlClient>>* closed);
  // Simulation: makes the call on the simulated control plane at once, after the calls to the
  // same server made before it (as a worker would), and keeps the answer in sim_out_ until its
  // simulated end.
  void SimAlloc(const Ask& ask);

  RemoteStore* const store_;
  const std::function<void()> wake_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Ask> queue_;       // Guarded by mu_.
  std::vector<Answer> done_;    // Guarded by mu_.
  bool finishing_ = false;      // Guarded by mu_.
  std::vector<bool> busy_;      // By server: a worker is calling it. Guarded by mu_.
  // By server: the socket of the call in progress, -1 while none (or while connecting): Finish
  // shuts it down. The worker's connection keeps the descriptor open until it clears this.
  // Guarded by mu_.
  std::vector<int> calling_fd_;
  size_t idle_ = 0;             // Workers not making a call. Guarded by mu_.
  std::vector<std::thread> workers_;  // Started under mu_; joined by Finish.
  // The allocator's own control connections, by server. The map is changed under mu_ (its
  // nodes never move); a server's connection is used only by the worker that marked the server
  // busy, or under mu_ while no worker does.
  std::map<uint32_t, std::unique_ptr<fabric::ControlClient>> ctl_;
  // Simulation only (the owning I/O thread): answers not due yet with their due times, and
  // when the last call made to each server ends.
  std::vector<std::pair<uint64_t, Answer>> sim_out_;
  std::vector<uint64_t> sim_busy_until_;
};

}  // namespace tessera::client::remote
