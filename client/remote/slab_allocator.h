// SlabAllocator: the ALLOC control calls of one I/O thread, made on a thread of their own, so
// that an I/O thread never waits on the network for a slab (an allocation from a server that
// has stopped answering takes up to its deadline, and every request of the I/O thread would
// wait behind it): the members of a new slab (both layouts) and the replacement of a member
// whose server failed or evicted it (IoThread::BeginAllocate, IoThread::ReplaceSplit).
//
// The I/O thread chooses the server of every member (placement, replacements) and hands each
// ALLOC here with a tag; the allocator makes the calls in the order given, over its own control
// connections (the store's credential and owner id, on the server instance the store knows),
// and hands every answer back through Take(), waking the I/O thread with `wake`. The I/O thread
// makes each new slab known to its data transport itself. The connection to a server marked
// failed is closed (at the next call, or within a second), so that the server's lease on our
// slabs starts.
//
// Threads: Alloc/Take from the owning I/O thread; Finish from it at shutdown.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
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

  // Asks `server` for a slab, waiting at most timeout_ms for the answer.
  void Alloc(uint64_t tag, uint32_t server, uint32_t timeout_ms);
  // Moves the answers that arrived into *out (appended); false when there were none.
  bool Take(std::vector<Answer>* out);
  // Stops the thread: the call in progress ends at its deadline, calls not started are answered
  // Cancelled. Idempotent.
  void Finish();
  // Simulation (RemoteStoreOptions::sim; no thread): when the next answer is due (simulated
  // MonotonicNs), UINT64_MAX when none is out.
  uint64_t SimNextNs() const;

 private:
  struct Ask {
    uint64_t tag;
    uint32_t server;
    uint32_t timeout_ms;
  };
  void Loop();
  void CloseFailed();  // The allocator thread only.
  // Simulation: makes the call on the simulated control plane at once, one after the other as
  // the thread would (each starts when the one before it ended), and keeps the answer in
  // sim_out_ until its simulated end.
  void SimAlloc(const Ask& ask);

  RemoteStore* const store_;
  const std::function<void()> wake_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Ask> queue_;       // Guarded by mu_.
  std::vector<Answer> done_;    // Guarded by mu_.
  bool finishing_ = false;      // Guarded by mu_.
  // The allocator's own control connections, by server index (the allocator thread only).
  std::vector<std::unique_ptr<fabric::ControlClient>> ctl_;
  std::thread thread_;
  // Simulation only (the owning I/O thread): answers not due yet, by due time, and when the
  // last call made ends.
  std::deque<std::pair<uint64_t, Answer>> sim_out_;
  uint64_t sim_busy_until_ = 0;
};

}  // namespace tessera::client::remote
