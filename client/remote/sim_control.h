// The control plane of a simulated cluster, through which the deterministic simulation of the
// engine (tests/client/engine_sim_test.cc) runs the real engine: RemoteStoreOptions::sim.
//
// With `sim` set, the store starts no thread of its own. Init() sets every I/O thread up on the
// caller's thread; RemoteStore::SimTurn() runs one turn of each I/O thread's loop (what the
// thread does between two sleeps) and tells when each wants to run again; the monitor thread
// is replaced by the simulation's own heartbeats, which feed the store's real HealthTracker
// and act on its verdicts through the same functions the monitor uses (TakeHealthSignals,
// ApplyHealthActions). The control calls that threads of their own make off the I/O thread
// (slab ALLOC and FREE, the reconnect probe's handshake) are made through this interface
// instead, on the I/O thread's turn, in the order the real allocator and freer make them (the
// freer one at a time; the allocator one at a time per server, different servers at once),
// and their answers are taken only once the simulated time they take
// has passed. The data path is the simulation's fabric::Transport
// (RemoteStoreOptions::transport_factory), and time is the simulated clock
// (SetSimulatedClockForTesting).
//
// Servers are named by their index in the store's server list. `now` is the simulated time the
// call starts; *takes_ns is set to how long it takes (a server that does not answer: the whole
// timeout, then Timeout; one that refuses: Unavailable at once).
#pragma once

#include <cstdint>

#include "common/status.h"
#include "fabric/transport.h"
#include "fabric/wire.h"

namespace tessera::client::remote {

class SimControl {
 public:
  virtual ~SimControl() = default;
  // A fresh control connection: connect, authenticate, one heartbeat. The server's info.
  virtual Result<fabric::ServerInfo> Hello(uint32_t server, uint64_t now, uint64_t timeout_ns,
                                           uint64_t* takes_ns) = 0;
  virtual Result<fabric::AllocSlabResponse> AllocSlab(uint32_t server, uint64_t now,
                                                      uint64_t timeout_ns, uint64_t* takes_ns) = 0;
  virtual Status FreeSlab(uint32_t server, uint64_t slab_id, uint64_t now, uint64_t timeout_ns,
                          uint64_t* takes_ns) = 0;
};

}  // namespace tessera::client::remote
