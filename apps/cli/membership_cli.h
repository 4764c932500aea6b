// Where a client tool finds its memory servers: `--cluster FILE` (a static cluster file) or
// `--etcd ENDPOINTS --cluster_name NAME` (the servers registered in etcd, followed while the
// tool runs). Shared by tessera nbd, kv, run and paramsvc serve; main files define the flags and
// pass their values here.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "client/remote_store.h"
#include "common/status.h"
#include "membership/etcd_view.h"

namespace tessera::cli {

struct ClusterSource {
  std::vector<client::RemoteServer> servers;  // The servers now.
  // --etcd only: the live view (watching etcd). Give it to membership::StoreFollower to make a
  // store follow joins and leaves.
  std::unique_ptr<membership::MembershipView> view;
  bool from_etcd() const { return view != nullptr; }
};

// Exactly one of cluster_file and etcd may be set (InvalidArgument otherwise, naming the flags);
// --cluster_name goes with --etcd. Neither: NotFound (the tool then uses its default, e.g. an
// embedded cluster). Unavailable when etcd cannot be reached or no server is registered.
Result<ClusterSource> ResolveCluster(const std::string& cluster_file, const std::string& etcd,
                                     const std::string& cluster_name);

}  // namespace tessera::cli
