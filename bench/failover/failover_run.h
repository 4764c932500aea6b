// One run of `tessera bench failover`: a fresh embedded cluster of memservers, one erasure-coded
// store over it (split or group layout), a reader thread doing blocking ReadPage of random
// written pages and checking every byte, a watcher polling which servers the store has declared
// failed (RemoteServersFailed), and one disturbance of the cluster held for a stated time:
//
//   kill           one server holding data SIGKILLed; the window runs until regeneration of
//                  its splits is done, at least kill_min_window_s, at most kill_window_s
//   stop           one server SIGSTOPped for stop_s, then SIGCONTed
//   reset          one server's data connections closed: the memserver's fault hook `drop` on
//                  READ and WRITE for reset_ms (every data request in that time gets its
//                  connection closed), then reset_window_s of reads after it
//   oversubscribe  busy_loops busy-loop processes beside the cluster for oversubscribe_s
//                  (8 on 2 cores: 4x oversubscribed); no fault
//   etcd-outage    memservers registered in a private etcd with a lease of etcd_ttl_s, the
//                  store following that membership (membership::StoreFollower); etcd SIGSTOPped
//                  for 3 x the TTL, then resumed, then etcd_ttl_s + 2 s to let late lease
//                  expiries arrive
//
// Reads are timed from the start of the ReadPage call and counted in the phase they started
// in: healthy (before the fault) or fault window. After the window every written page is read
// back once more and checked.
//
// Threads: RunFailover is called from the bench's main thread; it starts and joins its own.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "client/remote_store.h"
#include "common/status.h"

namespace tessera::bench {

struct FailoverConfig {
  std::string scenario;  // kill | stop | reset | oversubscribe | etcd-outage
  client::EcLayout layout = client::EcLayout::kSplit;
  std::string bin_dir;  // Holds `tessera` (memservers are started through it).
  int servers = 8;
  int k = 4;
  int r = 2;
  uint64_t pages = 4096;
  double healthy_s = 3;
  double kill_window_s = 10;     // Longest kill window.
  double kill_min_window_s = 2;  // Shortest kill window (regeneration may end sooner).
  double stop_s = 10;
  int reset_ms = 100;
  double reset_window_s = 3;
  double oversubscribe_s = 60;
  int busy_loops = 8;
  int etcd_ttl_s = 3;
  uint32_t seed = 1;
};

struct FailoverResult {
  std::optional<double> detect_ms;  // Fault -> the faulted server declared failed.
  int false_failures = 0;           // Servers declared failed that were not faulted.
  bool faulted_declared_failed = false;
  double read_p50_us = 0;  // Reads started in the fault window.
  double read_p99_us = 0;
  double read_max_us = 0;
  double healthy_p99_us = 0;  // Reads started before the fault.
  uint64_t healthy_reads = 0;
  uint64_t fault_reads = 0;
  double fault_window_s = 0;  // How long the fault window lasted.
  // Regeneration (kill): splits rebuilt per second from the first rebuilt to the last, and
  // from the failed verdict to the first rebuilt.
  std::optional<double> regen_pages_per_s;
  std::optional<double> regen_start_ms;
  uint64_t regenerated = 0;
  uint64_t data_loss = 0;    // Reads returning wrong bytes or DataLoss (window and final check).
  uint64_t read_errors = 0;  // Other failed reads (Unavailable, Timeout, ...).
  uint64_t membership_leaves = 0;  // etcd-outage: leaves the store followed.
};

Result<FailoverResult> RunFailover(const FailoverConfig& config);

}  // namespace tessera::bench
