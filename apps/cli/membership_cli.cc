#include "apps/cli/membership_cli.h"

namespace tessera::cli {

Result<ClusterSource> ResolveCluster(const std::string& cluster_file, const std::string& etcd,
                                     const std::string& cluster_name) {
  if (!cluster_file.empty() && !etcd.empty()) {
    return InvalidArgument("give --cluster FILE or --etcd ENDPOINTS --cluster_name NAME, not both");
  }
  if (etcd.empty() && !cluster_name.empty()) {
    return InvalidArgument("--cluster_name goes with --etcd ENDPOINTS");
  }
  ClusterSource out;
  if (!cluster_file.empty()) {
    TESSERA_ASSIGN_OR_RETURN(out.servers, client::LoadServers(cluster_file));
    return out;
  }
  if (etcd.empty()) return NotFound("no --cluster or --etcd given");
  auto eps = membership::ParseEtcdEndpoints(etcd);
  if (!eps.ok()) return InvalidArgument("--etcd: " + eps.status().message());
  if (Status st = membership::ValidateClusterName(cluster_name); !st.ok()) {
    return InvalidArgument("--etcd needs --cluster_name: " + st.message());
  }
  membership::EtcdOptions eo;
  eo.endpoints = *eps;
  TESSERA_ASSIGN_OR_RETURN(out.view, membership::MembershipView::Start(eo, cluster_name));
  auto servers = membership::ToRemoteServers(out.view->Members());
  if (!servers.ok()) {
    return Unavailable("no memory server is registered in cluster '" + cluster_name +
                       "' at " + etcd);
  }
  out.servers = std::move(*servers);
  return out;
}

}  // namespace tessera::cli
