// MemServerHandler: the memory server's answer to every request the fabric engine dispatches.
//
// It implements fabric::RequestHandler over a SlabPool: ALLOC/FREE slabs for the authenticated
// client (PeerInfo::owner_id is the owner: one per client process, fabric/auth.h "Slab
// ownership"), resolve READ/WRITE to bounds- and owner-checked
// slab memory (the engine copies the bytes). Client ids are authenticated per client
// (fabric/credential.h), so a client token reaches only its own slabs; an admin peer
// (PeerInfo::admin: the cluster secret or an admin token) may read, write and free any slab,
// and only admins may inject faults or evict (FAULT, the fault INVOKE function). STATS text,
// HEARTBEAT, an INVOKE registry where offload applications register functions by id, and fault
// injection (FAULT, plus a built-in INVOKE function for the fault kinds the wire op cannot carry
// yet). It is also the monitor's EvictionSink: eviction decisions become NOTICEs to the owning
// client through the Server.
//
// Slabs outlive connections: a client process that reconnects (same client id and instance id,
// so the same owner id) keeps its slabs (the resilience layer above relies on that after a
// network blip); another process, even with the same credential, is another owner. Leases: an owner
// with no open connection for `orphan_grace_ns` (--orphan_grace) loses all its slabs
// (ReclaimOrphans(), driven by the daemon's monitor tick): a client that died (SIGKILL, a
// paged program that exited without tearing its store down) does not hold memory forever. A
// reconnect within the grace cancels the countdown. Memory is also reclaimed by the resource
// monitor under memory pressure.
//
// Ownership: borrows the pool (must outlive the handler); the Server and the monitor are
// attached after construction (AttachServer/AttachMonitor, before Server::Start) and must
// outlive their use. Owns the fault state, the metrics and the INVOKE registry.
// Threads: the RequestHandler methods run on the Server's I/O threads, concurrently; the data
// path (ResolveRead/ResolveWrite/BeforeOp) takes no lock. RegisterFunction, StatsText,
// PrometheusText may be called from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "fabric/server.h"
#include "memserver/fault_state.h"
#include "memserver/metrics.h"
#include "memserver/resource_monitor.h"
#include "memserver/service.h"
#include "memserver/slab_pool.h"

namespace tessera::memserver {

class MemServerHandler : public fabric::RequestHandler, public EvictionSink {
 public:
  struct Options {
    bool fault_injection = false;  // Accept FAULT requests (and the fault INVOKE function).
    uint64_t headroom_bytes = 0;  // Reported in STATS.
    // Slabs of an owner with no open connection for this long are freed. 0: never.
    uint64_t orphan_grace_ns = 0;
    // Most slabs the owners of one client id (all processes of one credential) may hold; an
    // ALLOC beyond it fails with ResourceExhausted. 0: no quota.
    uint64_t max_slabs_per_client = 0;
    // Prometheus text put before the metrics of every scrape: tessera_build_info, from the
    // main, which knows the build (common/prometheus.h).
    std::string build_info_metrics;
  };
  struct LeaseStats {
    uint64_t orphaned_owners = 0;   // Owners now holding slabs with no connection open.
    uint64_t slab_owners = 0;       // Owners now holding slabs, connected or not.
    uint64_t owners_reclaimed = 0;  // Owners whose lease ran out (since start).
    uint64_t slabs_reclaimed = 0;   // Slabs freed by expired leases (since start).
  };
  // An offload function: gets the caller and the argument bytes, returns the result bytes
  // (<= fabric::kMaxDataLength). Runs on an I/O thread: keep it short.
  using Function =
      std::function<Result<std::vector<uint8_t>>(const fabric::PeerInfo&, std::span<const uint8_t>)>;

  MemServerHandler(SlabPool* pool, Options options);
  MemServerHandler(const MemServerHandler&) = delete;
  MemServerHandler& operator=(const MemServerHandler&) = delete;

  void AttachServer(fabric::Server* server, fabric::MemoryRegistration registration);
  void AttachMonitor(ResourceMonitor* monitor);
  // A hosted service whose StatsText() goes into STATS. Before Server::Start; it must outlive
  // the handler's use (the daemon destroys services after the network stops).
  void AttachService(Service* service) { services_.push_back(service); }

  // Registers an INVOKE function. AlreadyExists for a taken id; InvalidArgument for ids at or
  // above kReservedFunctionIdBase.
  Status RegisterFunction(uint32_t function_id, std::string name, Function fn);

  // fabric::RequestHandler
  void OnConnect(const fabric::PeerInfo& peer) override;
  void OnDisconnect(const fabric::PeerInfo& peer) override;
  Result<std::span<uint8_t>> ResolveRead(const fabric::PeerInfo& peer,
                                         const fabric::ReadRequest& req) override;
  Result<std::span<uint8_t>> ResolveWrite(const fabric::PeerInfo& peer,
                                          const fabric::WriteRequest& req) override;
  Result<fabric::AllocSlabResponse> AllocSlab(const fabric::PeerInfo& peer,
                                              const fabric::AllocSlabRequest& req) override;
  Status FreeSlab(const fabric::PeerInfo& peer, const fabric::FreeSlabRequest& req) override;
  Result<std::string> Stats(const fabric::PeerInfo& peer) override;
  Result<fabric::HeartbeatResponse> Heartbeat(const fabric::PeerInfo& peer) override;
  Result<std::vector<uint8_t>> Invoke(const fabric::PeerInfo& peer, uint32_t function_id,
                                      std::span<const uint8_t> args) override;
  Status Fault(const fabric::PeerInfo& peer, const fabric::FaultRequest& req) override;
  fabric::OpPolicy BeforeOp(const fabric::PeerInfo& peer, fabric::Op op) override;

  // EvictionSink (called by the monitor).
  void SlabEvicting(OwnerId owner, uint64_t slab_id, uint64_t deadline_ms) override;
  void SlabEvicted(OwnerId owner, uint64_t slab_id) override;

  // OK for an admin peer (PeerInfo::admin); PermissionDenied naming `what` otherwise.
  static Status RequireAdmin(const fabric::PeerInfo& peer, std::string_view what);

  // Carries out one fault command (admin peers only); returns a line saying what was done.
  Result<std::string> ApplyFault(const fabric::PeerInfo& peer, const FaultSpec& spec);
  // The wire FAULT request as a FaultSpec.
  static Result<FaultSpec> FromWire(const fabric::FaultRequest& req);

  // Frees the slabs of every owner whose last connection closed at least orphan_grace_ns
  // before `now_ns` (MonotonicNs()). Returns the number of slabs freed. Any thread.
  uint64_t ReclaimOrphans(uint64_t now_ns);
  LeaseStats lease_stats();

  std::string StatsText();
  std::string PrometheusText();
  ServerMetrics& metrics() { return metrics_; }
  FaultState& faults() { return faults_; }

 private:
  // A READ's or WRITE's bytes in the peer's slab (any owner's for an admin peer), timed and
  // counted under `slot`.
  Result<std::span<uint8_t>> ResolveData(const fabric::PeerInfo& peer, OpSlot slot,
                                         uint64_t slab_id, uint64_t offset, uint32_t length);
  Result<std::string> FlipBits(const FaultSpec& spec);

  SlabPool* const pool_;
  const Options options_;
  const uint64_t start_ns_;
  std::atomic<fabric::Server*> server_{nullptr};
  std::atomic<ResourceMonitor*> monitor_{nullptr};
  std::vector<Service*> services_;  // Set before Server::Start, read-only after.
  fabric::MemoryRegistration registration_;  // Set before Start().
  FaultState faults_;
  ServerMetrics metrics_;

  // Open connections per owner, and since when an owner has none (0 while it has some).
  struct Lease {
    int64_t connections = 0;
    uint64_t idle_since_ns = 0;
  };
  std::mutex leases_mu_;
  std::map<OwnerId, Lease> leases_;  // Under leases_mu_.
  std::atomic<uint64_t> owners_reclaimed_{0}, slabs_reclaimed_{0};
  // The client id of each owner id seen (for the per-client quota), under quota_mu_ (taken after
  // leases_mu_ when both are held). Forgotten with the owner's lease once it holds no slab.
  std::mutex quota_mu_;
  std::atomic<uint64_t> quota_refusals_{0};  // ALLOCs refused by max_slabs_per_client.
  std::unordered_map<OwnerId, uint64_t> owner_client_;
  void ForgetOwnerLocked(OwnerId owner);  // Under leases_mu_.

  struct Registered {
    std::string name;
    Function fn;
  };
  std::shared_mutex functions_mu_;
  std::map<uint32_t, Registered> functions_;  // Under functions_mu_.
};

}  // namespace tessera::memserver
