// Cluster membership as placement sees it: a list of memory servers with their address,
// capacity, failure domain (rack) and state, frozen into an immutable snapshot.
//
// A MembershipSnapshot is created once (validated) and never changes afterwards; it is shared
// as std::shared_ptr<const MembershipSnapshot> between the membership view that produced it
// and every reader (placement policies, the resilient client, the simulator). A change of
// membership (join, leave, failure) produces a new snapshot with a higher epoch. Because it
// is immutable, any number of threads may read one snapshot concurrently without locking.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/status.h"

namespace tessera::placement {

using ServerId = uint32_t;
using SlabId = uint64_t;

enum class ServerState : uint8_t {
  kAlive,     // Accepts new slabs and serves existing ones.
  kDraining,  // Serves existing slabs but takes no new ones (leaving gracefully).
  kFailed,    // Unreachable; its splits are lost.
};

const char* ServerStateName(ServerState state);

// One memory server. `capacity_slabs` and `free_slabs` count slab-sized units of memory the
// server lends; `rack` names its failure domain ("" = unknown).
struct ServerInfo {
  ServerId id = 0;
  std::string address;
  uint64_t capacity_slabs = 0;
  uint64_t free_slabs = 0;
  std::string rack;
  ServerState state = ServerState::kAlive;
};

class MembershipSnapshot;
using SnapshotPtr = std::shared_ptr<const MembershipSnapshot>;

class MembershipSnapshot {
 public:
  // Validates and freezes `servers`: ids must be unique, free_slabs <= capacity_slabs, and
  // either every server carries a rack label or none does. Servers are kept sorted by id.
  static Result<SnapshotPtr> Create(uint64_t epoch, std::vector<ServerInfo> servers);

  uint64_t epoch() const { return epoch_; }
  // All servers, sorted by id. Index i of this vector is the "server index" used by load
  // vectors passed to placement policies.
  const std::vector<ServerInfo>& servers() const { return servers_; }
  size_t size() const { return servers_.size(); }
  // Indices (into servers()) of servers in state kAlive, ascending.
  const std::vector<uint32_t>& alive() const { return alive_; }
  // Index of `id` in servers(), or -1.
  int64_t IndexOf(ServerId id) const;
  bool IsAlive(ServerId id) const;

  // Racks: true when servers carry rack labels. rack_index(i) is a dense number in
  // [0, num_racks()) for server index i (racks numbered in order of first appearance by id).
  bool has_racks() const { return num_racks_ > 0; }
  size_t num_racks() const { return num_racks_; }
  uint32_t rack_index(size_t server_index) const { return rack_index_[server_index]; }

  // New snapshots derived from this one (epoch + 1), for membership changes.
  Result<SnapshotPtr> WithServerAdded(ServerInfo server) const;
  Result<SnapshotPtr> WithServerRemoved(ServerId id) const;
  Result<SnapshotPtr> WithState(ServerId id, ServerState state) const;

 private:
  MembershipSnapshot() = default;
  uint64_t epoch_ = 0;
  std::vector<ServerInfo> servers_;
  std::vector<uint32_t> alive_;
  std::vector<uint32_t> rack_index_;
  size_t num_racks_ = 0;
  std::unordered_map<ServerId, uint32_t> index_;
};

// A uniform test/simulation cluster: servers 0..n-1 at "sim://i", `capacity` slabs each,
// all free, alive; with racks > 0 server i is in rack "rack-<i*racks/n>" (contiguous blocks).
Result<SnapshotPtr> MakeUniformCluster(size_t n, uint64_t capacity, size_t racks);

}  // namespace tessera::placement
