// Slab census: how many slabs the memservers of an experiment's cluster have allocated, summed
// over the servers still running (a killed server's slabs are gone with it). The runner takes one
// right after the workload's pages are written and one at the end, after regeneration, for the
// `slabs_back_to_baseline` expectation: every slab a failure cost must have been replaced by
// exactly one, and nothing left behind on a server that came back (a stopped server resumed,
// a restarted one).
//
// Threads: any thread; the cluster's methods are thread-safe.
#pragma once

#include <cstdint>
#include <string>

#include "client/local_cluster.h"
#include "common/status.h"

namespace tessera::experiment {

struct SlabCensus {
  uint64_t allocated = 0;  // Sum of STATS `slabs_allocated` over the running servers.
  int servers = 0;         // Running servers counted.
  std::string per_server;  // "0:12 1:12 3:13 ..." for the report.
  std::string owners_per_server;  // STATS `slab_owners` (connected or not): "0:1 1:2 ...".
  // Sums of STATS `orphaned_owners` (owners holding slabs with no connection open: a killed
  // client before its --orphan_grace ran out) and `orphan_slabs_reclaimed` (since start).
  uint64_t orphaned_owners = 0;
  uint64_t orphan_slabs_reclaimed = 0;
};

// Asks every running server of `cluster` for its STATS (bounded by timeout_ms each). An error
// when a running server does not answer (a stopped one, say): a census must count them all.
Result<SlabCensus> TakeSlabCensus(client::LocalCluster& cluster, int timeout_ms = 5000);

}  // namespace tessera::experiment
