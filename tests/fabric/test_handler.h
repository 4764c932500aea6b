// An in-memory RequestHandler for the fabric tests: a pool of fixed-size slabs, each owned by
// the owner id (PeerInfo::owner_id: client id and process instance) that allocated it, plus
// switchable per-op fault policies. Thread-safe (the server's I/O threads call it; the test
// thread flips policies).
#pragma once

#include <array>
#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "common/logging.h"
#include "common/mmap.h"
#include "fabric/server.h"

namespace tessera::fabric::testing {

class TestHandler : public RequestHandler {
 public:
  explicit TestHandler(uint64_t slab_size = 64 * 1024, int slabs = 32)
      : slab_size_(slab_size), slabs_(slabs) {
    auto pool = MappedRegion::Anonymous(slab_size * slabs);
    TCHECK(pool.ok()) << pool.status();
    pool_ = std::move(*pool);
    for (int i = slabs - 1; i >= 0; --i) free_.push_back(i);
  }

  void SetRegistration(const MemoryRegistration& reg) { reg_ = reg; }
  uint8_t* pool() { return pool_.data(); }
  size_t pool_size() const { return pool_.size(); }
  uint64_t slab_size() const { return slab_size_; }

  void SetPolicy(Op op, OpPolicy p) {
    std::lock_guard<std::mutex> lock(mu_);
    policies_[static_cast<size_t>(op)] = p;
  }
  void ClearPolicies() {
    std::lock_guard<std::mutex> lock(mu_);
    policies_ = {};
  }

  std::atomic<int> connects{0};
  std::atomic<int> disconnects{0};
  std::atomic<int> faults{0};
  std::atomic<int> before_ops{0};  // Requests the engine ran BeforeOp for (one per frame).

  void OnConnect(const PeerInfo&) override { connects++; }
  void OnDisconnect(const PeerInfo&) override { disconnects++; }

  Result<std::span<uint8_t>> ResolveRead(const PeerInfo& peer, const ReadRequest& r) override {
    return Resolve(peer, r.slab_id, r.offset, r.length);
  }
  Result<std::span<uint8_t>> ResolveWrite(const PeerInfo& peer, const WriteRequest& r) override {
    return Resolve(peer, r.slab_id, r.offset, r.length);
  }
  Result<AllocSlabResponse> AllocSlab(const PeerInfo& peer, const AllocSlabRequest&) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (free_.empty()) return ResourceExhausted("no free slab");
    int index = free_.back();
    free_.pop_back();
    uint64_t id = next_id_++;
    owners_[id] = {peer.owner_id, index};
    AllocSlabResponse r;
    r.slab_id = id;
    r.size = slab_size_;
    r.remote_addr = reinterpret_cast<uint64_t>(pool_.data()) + index * slab_size_;
    r.rkey = reg_.rkey;
    return r;
  }
  Status FreeSlab(const PeerInfo& peer, const FreeSlabRequest& req) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = owners_.find(req.slab_id);
    if (it == owners_.end()) return NotFound("no slab ", req.slab_id);
    if (it->second.owner != peer.owner_id)
      return PermissionDenied("slab ", req.slab_id, " is not yours");
    free_.push_back(it->second.index);
    owners_.erase(it);
    return Status::Ok();
  }
  Result<std::string> Stats(const PeerInfo&) override {
    std::lock_guard<std::mutex> lock(mu_);
    return "slabs_used " + std::to_string(owners_.size()) + "\nslab_size " +
           std::to_string(slab_size_) + "\n";
  }
  Result<HeartbeatResponse> Heartbeat(const PeerInfo&) override {
    std::lock_guard<std::mutex> lock(mu_);
    HeartbeatResponse h;
    h.server_time_ns = 42;
    h.total_bytes = slab_size_ * slabs_;
    h.free_bytes = slab_size_ * free_.size();
    h.slabs_used = static_cast<uint32_t>(owners_.size());
    h.slabs_free = static_cast<uint32_t>(free_.size());
    h.load_permille = 10;
    return h;
  }
  // Function 7 returns its argument reversed; others are unknown.
  Result<std::vector<uint8_t>> Invoke(const PeerInfo&, uint32_t fn,
                                      std::span<const uint8_t> args) override {
    if (fn != 7) return NotFound("no function ", fn);
    return std::vector<uint8_t>(args.rbegin(), args.rend());
  }
  Status Fault(const PeerInfo&, const FaultRequest& req) override {
    faults++;
    if (req.action == FaultAction::kCrash) return Unsupported("the test handler does not crash");
    return Status::Ok();
  }
  OpPolicy BeforeOp(const PeerInfo&, Op op) override {
    before_ops++;
    std::lock_guard<std::mutex> lock(mu_);
    return policies_[static_cast<size_t>(op)];
  }

 private:
  struct Owned {
    uint64_t owner;
    int index;
  };
  Result<std::span<uint8_t>> Resolve(const PeerInfo& peer, uint64_t slab, uint64_t off,
                                     uint32_t len) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = owners_.find(slab);
    if (it == owners_.end()) return NotFound("no slab ", slab);
    if (it->second.owner != peer.owner_id) {
      return PermissionDenied("slab ", slab, " belongs to another client");
    }
    if (off > slab_size_ || len > slab_size_ - off) {
      return OutOfRange("offset ", off, " + length ", len, " outside slab of ", slab_size_);
    }
    return std::span<uint8_t>(pool_.data() + it->second.index * slab_size_ + off, len);
  }

  uint64_t slab_size_;
  int slabs_;
  MappedRegion pool_;
  MemoryRegistration reg_;
  std::mutex mu_;
  std::vector<int> free_;
  std::map<uint64_t, Owned> owners_;
  uint64_t next_id_ = 1;
  std::array<OpPolicy, kLastServiceOp + 1> policies_{};  // By op value, service ops too.
};

}  // namespace tessera::fabric::testing
