// The store flags that say where the memservers are (store_flags.h), in a file of their own:
// only the tools that take them link these definitions.
#include <gflags/gflags.h>

#include "apps/cli/store_flags.h"

DEFINE_string(cluster, "",
              "Cluster file of running memservers (default: start an embedded cluster of "
              "k+r+spares on loopback)");
DEFINE_string(etcd, "",
              "etcd endpoints (HOST:PORT,...): use the memservers registered in --cluster_name "
              "and follow joins and leaves (instead of --cluster)");
DEFINE_string(cluster_name, "", "Cluster registered in etcd (with --etcd)");
DEFINE_string(auth_token_file, "",
              "Credential file (`tessera token issue`) or the cluster secret of the servers of "
              "--cluster or --etcd (an embedded cluster makes its own)");

namespace tessera::cli {

ClusterFlags ReadClusterFlags(const CliSpec& spec) {
  if (!FLAGS_cluster.empty() && !FLAGS_etcd.empty()) {
    UsageError(spec, "give --cluster FILE or --etcd ENDPOINTS --cluster-name NAME, not both");
  }
  if (FLAGS_etcd.empty() && !FLAGS_cluster_name.empty()) {
    UsageError(spec, "--cluster-name goes with --etcd");
  }
  if (!FLAGS_auth_token_file.empty() && FLAGS_cluster.empty() && FLAGS_etcd.empty()) {
    UsageError(spec, "--auth-token-file goes with --cluster or --etcd (an embedded cluster "
                     "makes its own)");
  }
  return ClusterFlags{FLAGS_cluster, FLAGS_etcd, FLAGS_cluster_name, FLAGS_auth_token_file};
}

}  // namespace tessera::cli
