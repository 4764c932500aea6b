// Server lists, cluster files and option names of the remote stores.
#include "client/remote_store.h"

#include "fabric/cluster_file.h"

namespace tessera::client {

const char* AckPolicyName(AckPolicy policy) {
  return policy == AckPolicy::kAll ? "all" : "first-k";
}

Result<AckPolicy> ParseAckPolicy(std::string_view name) {
  if (name == "all") return AckPolicy::kAll;
  if (name == "first-k" || name == "firstk") return AckPolicy::kFirstK;
  return InvalidArgument("unknown ack policy '" + std::string(name) + "' (all, first-k)");
}

std::string_view EcLayoutName(EcLayout layout) {
  return layout == EcLayout::kSplit ? "split" : "group";
}

Result<EcLayout> ParseEcLayout(std::string_view name) {
  if (name == "split") return EcLayout::kSplit;
  if (name == "group") return EcLayout::kGroup;
  return InvalidArgument("unknown erasure-coded layout '" + std::string(name) +
                         "' (split, group)");
}

std::string_view GroupCompactionName(GroupCompaction c) {
  return c == GroupCompaction::kRestripe ? "restripe" : "in-place";
}

Result<GroupCompaction> ParseGroupCompaction(std::string_view name) {
  if (name == "restripe") return GroupCompaction::kRestripe;
  if (name == "in-place" || name == "inplace") return GroupCompaction::kInPlace;
  return InvalidArgument("unknown group compaction '" + std::string(name) +
                         "' (restripe, in-place)");
}

Result<std::vector<RemoteServer>> ParseServerList(std::string_view list) {
  std::vector<RemoteServer> out;
  size_t pos = 0;
  while (pos <= list.size()) {
    size_t comma = list.find(',', pos);
    if (comma == std::string_view::npos) comma = list.size();
    std::string_view word = list.substr(pos, comma - pos);
    if (!word.empty()) {
      TESSERA_ASSIGN_OR_RETURN(fabric::Endpoint e, fabric::ParseEndpoint(word));
      out.push_back(RemoteServer{e, ""});
    }
    pos = comma + 1;
  }
  if (out.empty()) return InvalidArgument("empty server list");
  return out;
}

Result<std::vector<RemoteServer>> LoadServers(const std::string& cluster_file) {
  TESSERA_ASSIGN_OR_RETURN(auto members, fabric::LoadClusterFile(cluster_file));
  std::vector<RemoteServer> out;
  for (const auto& m : members) out.push_back(RemoteServer{m.endpoint, m.rack});
  return out;
}


}  // namespace tessera::client
