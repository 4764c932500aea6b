// The flags of every subcommand that opens an erasure-coded page store, declared once so that
// their names, defaults, help and validation are the same in each (`tessera run`, `tessera
// nbd`, `tessera swap`, `tessera demo cluster`, `tessera paramsvc serve`):
//
//   the code           --k 4, --r 2, --layout (default: the store's, group)
//   embedded cluster   --spares -1 (= r): memservers beyond k+r when a tool starts its own
//   the store          --io-threads 1
//   client metrics     --metrics-port -1 (off)
//   where servers are  --cluster, --etcd, --cluster-name, --auth-token-file
//
// The first four groups are defined in store_flags.cc, the last in cluster_flags.cc (a tool
// that finds its servers its own way, like `tessera paramsvc serve --store`, links only the
// first). A tool names the flags it takes in its CliSpec::shared_flags (StoreFlagNames); InitCli
// lists only those in --help and refuses the others.
//
// Threads: call from main after InitCli, before other threads start.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "apps/cli/cli.h"
#include "client/remote_store.h"

namespace tessera::cli {

enum StoreFlagGroup : unsigned {
  kCodeFlags = 1,      // --k, --r, --layout
  kEmbeddedFlags = 2,  // --spares
  kIoFlags = 4,        // --io-threads
  kMetricsFlags = 8,   // --metrics-port
  kClusterFlags = 16,  // --cluster, --etcd, --cluster-name, --auth-token-file
};

// The snake_case names of the flags of `groups` (a mask of StoreFlagGroup), for
// CliSpec::shared_flags.
std::vector<std::string> StoreFlagNames(unsigned groups);

struct StoreFlags {
  int k = 4;
  int r = 2;
  std::optional<client::EcLayout> layout;  // Unset: the store's default.
  int spares = 2;                          // Resolved: -1 became r.
  int io_threads = 1;
  int metrics_port = -1;  // -1: off; 0: ephemeral.

  // Memservers of an embedded cluster: k + r + spares.
  size_t EmbeddedServers() const { return static_cast<size_t>(k + r + spares); }
  // Sets k, r, layout (when given) and the I/O threads.
  void ApplyTo(client::ErasureCodedStoreOptions* options) const;
};

// The values of the store flags, validated (UsageError, exit 2, on a bad one; the same message
// in every tool).
StoreFlags ReadStoreFlags(const CliSpec& spec);

struct ClusterFlags {
  std::string cluster;  // Cluster file.
  std::string etcd;     // etcd endpoints.
  std::string cluster_name;
  std::string auth_token_file;
  bool given() const { return !cluster.empty() || !etcd.empty(); }
};

// --cluster, --etcd, --cluster-name, --auth-token-file (cluster_flags.cc), validated together:
// not --cluster and --etcd both, --cluster-name only with --etcd, --auth-token-file only with
// one of them (without, the tool starts an embedded cluster that makes its own).
ClusterFlags ReadClusterFlags(const CliSpec& spec);

}  // namespace tessera::cli
