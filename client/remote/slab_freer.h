// SlabFreer: the FREE control calls of one I/O thread, made on a thread of their own, so that an
// I/O thread never waits on the network to give remote memory back (a FREE to a server that
// has stopped answering takes up to its deadline, and every request of the I/O thread would
// wait behind it).
//
// The I/O thread forgets the slab in its data transport first (no request can reach it any
// more), then hands the FREE here. Frees run in the order given, over the freer's own control
// connections (the store's credential and owner id, so the server accepts them), and only on
// the server instance the store knows (RemoteStore::server_ids_): a server restarted since holds
// none of our slabs, and its own slab ids must not be touched. A FREE that times out or finds
// the server unreachable is tried again later (backing off from 200 ms to 10 s, 10 tries), until
// the server is failed; one that still cannot be made is dropped, and the server's lease
// reclaims the slab when this client goes away (memserver --orphan-grace).
//
// After(job) completes a QueueJob once every FREE handed over before it has been made (or tried
// once), so a Trim or a Flush still returns only when the remote memory it released is back on
// the servers that answer.
//
// Threads: Free/After/pending from the owning I/O thread; Finish from it at shutdown.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "fabric/control_client.h"

namespace tessera::client::remote {

class RemoteStore;
struct QueueJob;

class SlabFreer {
 public:
  explicit SlabFreer(RemoteStore* store);
  ~SlabFreer();  // Finish() with a 2 s bound if it was not called.
  SlabFreer(const SlabFreer&) = delete;
  SlabFreer& operator=(const SlabFreer&) = delete;

  void Free(uint32_t server, uint64_t slab_id);
  // job->Done(Ok) once the frees handed over before it are done; at once when none is pending.
  void After(QueueJob* job);
  // Frees queued, in progress or waiting to be tried again.
  size_t pending() const;
  // Makes the queued frees (until `deadline`; the rest are dropped, their jobs completed) and
  // stops the thread. Idempotent.
  void Finish(Deadline deadline);
  // Simulation (RemoteStoreOptions::sim; no thread): completes the jobs whose frees have ended
  // by now, and tells when the next free or job is due (UINT64_MAX: none).
  void SimPump();
  uint64_t SimNextNs() const;

 private:
  struct Item {
    uint32_t server = 0;
    uint64_t slab_id = 0;
    QueueJob* job = nullptr;  // Set: a barrier, no free.
    uint32_t tries = 0;       // FREEs of this slab that timed out or found no connection.
    uint64_t due_ns = 0;      // In retry_: when to try again.
  };
  static constexpr uint32_t kMaxTries = 10;
  void Loop();
  // Takes the next item (the queue first, then a retry that is due; every retry at once when
  // finishing); false when finishing and nothing is left. Called with mu_ held.
  bool Next(std::unique_lock<std::mutex>& lock, Item* item);
  // True: worth trying again later (timed out or unreachable, and the server is not failed).
  bool FreeOne(const Item& item, Deadline deadline);

  RemoteStore* const store_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;     // Guarded by mu_.
  std::deque<Item> retry_;     // Guarded by mu_; by due_ns.
  size_t busy_ = 0;            // Guarded by mu_: items taken by the thread, not done yet.
  bool finishing_ = false;     // Guarded by mu_.
  Deadline finish_by_ = Deadline::AfterMs(0);  // Guarded by mu_; valid once finishing_.
  // The freer's own control connections, by server index (the freer thread only).
  std::vector<std::unique_ptr<fabric::ControlClient>> ctl_;
  std::thread thread_;
  // Simulation only (the owning I/O thread): a FREE is made on the simulated control plane at
  // once, one after the other as the thread would make them, and tried once (one that cannot
  // be made is reported as trouble and left to the server's lease). The end of each free not
  // ended yet, and the jobs waiting for them.
  void SimFree(uint32_t server, uint64_t slab_id);
  std::deque<uint64_t> sim_ends_;
  std::deque<std::pair<uint64_t, QueueJob*>> sim_jobs_;
  uint64_t sim_busy_until_ = 0;
};

}  // namespace tessera::client::remote
