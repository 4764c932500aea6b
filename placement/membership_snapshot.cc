#include "placement/membership_snapshot.h"

#include <algorithm>

namespace tessera::placement {

const char* ServerStateName(ServerState state) {
  switch (state) {
    case ServerState::kAlive: return "alive";
    case ServerState::kDraining: return "draining";
    case ServerState::kFailed: return "failed";
  }
  return "unknown";
}

Result<SnapshotPtr> MembershipSnapshot::Create(uint64_t epoch, std::vector<ServerInfo> servers) {
  std::sort(servers.begin(), servers.end(),
            [](const ServerInfo& a, const ServerInfo& b) { return a.id < b.id; });
  size_t labelled = 0;
  for (size_t i = 0; i < servers.size(); ++i) {
    const ServerInfo& s = servers[i];
    if (i > 0 && servers[i - 1].id == s.id) {
      return InvalidArgument("membership: duplicate server id ", s.id);
    }
    if (s.free_slabs > s.capacity_slabs) {
      return InvalidArgument("membership: server ", s.id, " has free_slabs ", s.free_slabs,
                             " > capacity_slabs ", s.capacity_slabs);
    }
    if (!s.rack.empty()) ++labelled;
  }
  if (labelled != 0 && labelled != servers.size()) {
    return InvalidArgument("membership: ", labelled, " of ", servers.size(),
                           " servers carry a rack label; label all servers or none");
  }
  std::shared_ptr<MembershipSnapshot> snap(new MembershipSnapshot());
  snap->epoch_ = epoch;
  snap->servers_ = std::move(servers);
  snap->rack_index_.resize(snap->servers_.size(), 0);
  std::unordered_map<std::string, uint32_t> racks;
  for (uint32_t i = 0; i < snap->servers_.size(); ++i) {
    const ServerInfo& s = snap->servers_[i];
    snap->index_.emplace(s.id, i);
    if (s.state == ServerState::kAlive) snap->alive_.push_back(i);
    if (labelled != 0) {
      auto [it, inserted] = racks.emplace(s.rack, static_cast<uint32_t>(racks.size()));
      snap->rack_index_[i] = it->second;
    }
  }
  snap->num_racks_ = racks.size();
  return SnapshotPtr(std::move(snap));
}

int64_t MembershipSnapshot::IndexOf(ServerId id) const {
  auto it = index_.find(id);
  return it == index_.end() ? -1 : static_cast<int64_t>(it->second);
}

bool MembershipSnapshot::IsAlive(ServerId id) const {
  int64_t i = IndexOf(id);
  return i >= 0 && servers_[static_cast<size_t>(i)].state == ServerState::kAlive;
}

Result<SnapshotPtr> MembershipSnapshot::WithServerAdded(ServerInfo server) const {
  if (IndexOf(server.id) >= 0) {
    return AlreadyExists("membership: server ", server.id, " is already a member");
  }
  std::vector<ServerInfo> next = servers_;
  next.push_back(std::move(server));
  return Create(epoch_ + 1, std::move(next));
}

Result<SnapshotPtr> MembershipSnapshot::WithServerRemoved(ServerId id) const {
  int64_t i = IndexOf(id);
  if (i < 0) return NotFound("membership: server ", id, " is not a member");
  std::vector<ServerInfo> next = servers_;
  next.erase(next.begin() + i);
  return Create(epoch_ + 1, std::move(next));
}

Result<SnapshotPtr> MembershipSnapshot::WithState(ServerId id, ServerState state) const {
  int64_t i = IndexOf(id);
  if (i < 0) return NotFound("membership: server ", id, " is not a member");
  std::vector<ServerInfo> next = servers_;
  next[static_cast<size_t>(i)].state = state;
  return Create(epoch_ + 1, std::move(next));
}

Result<SnapshotPtr> MakeUniformCluster(size_t n, uint64_t capacity, size_t racks) {
  if (racks > n) return InvalidArgument("cluster: ", racks, " racks for only ", n, " servers");
  std::vector<ServerInfo> servers(n);
  for (size_t i = 0; i < n; ++i) {
    servers[i].id = static_cast<ServerId>(i);
    servers[i].address = "sim://" + std::to_string(i);
    servers[i].capacity_slabs = capacity;
    servers[i].free_slabs = capacity;
    if (racks > 0) servers[i].rack = "rack-" + std::to_string(i * racks / n);
  }
  return MembershipSnapshot::Create(1, std::move(servers));
}

}  // namespace tessera::placement
