// BenchCluster: what `tessera bench pagestore` needs from a cluster of real memservers on
// loopback — the stores under test built over it, and the two disturbances it measures (one
// straggler, one failed server). Built on client::LocalCluster and the remote-store factories.
//
// Threads: one bench thread creates and uses it; the stores it returns are thread-safe
// PageStores. The cluster owns the server processes (killed on destruction); stores made from
// it must be destroyed before it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "client/page_store.h"
#include "common/status.h"

namespace tessera::bench {

class BenchCluster {
 public:
  // Starts `servers` memservers (with fault injection) through the `tessera` executable in
  // bin_dir; each holds capacity_bytes in slabs of slab_bytes.
  // Remote stores it makes get RemoteStoreOptions::poll_us = poll_us (all layouts alike).
  static Result<std::unique_ptr<BenchCluster>> Start(int servers, const std::string& bin_dir,
                                                     uint64_t capacity_bytes, uint64_t slab_bytes,
                                                     uint32_t poll_us = 0);
  virtual ~BenchCluster() = default;

  // kind: "ec" (RS(8,2) split layout, delta 1), "ec-d0" (delta 0), "ec-group", "ec-group-d0"
  // (group layout), "ec-group-restripe" / "ec-group-inplace" (group, that compaction), "rep2",
  // "rep3", "single".
  virtual Result<std::unique_ptr<client::PageStore>> MakeStore(const std::string& kind,
                                                               uint64_t pages) = 0;
  virtual int servers() const = 0;
  virtual std::string endpoint(int server) const = 0;
  // Delays every read/write reply of `server` by delay_us (the memserver's fault injection).
  virtual Status SlowDown(int server, int delay_us) = 0;
  virtual Status ClearFaults(int server) = 0;
  // SIGKILLs the server process.
  virtual Status Kill(int server) = 0;
};

}  // namespace tessera::bench
