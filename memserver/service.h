// The service API of the memory server: what a service hosted inside the memserver process gets
// from the core (slabs, the resource monitor, fault injection, metrics), and nothing more. In
// the manner of eRPC's request-type registry and nbdkit's plugin struct: a service is a
// factory the daemon calls once at start-up (DaemonOptions::services) with a ServiceHost, and
// through that host it may do three things:
//
//   - register request types: RegisterRequestTypes(first, last, handler) gives the service the
//     service ops first..last (fabric/wire.h); the fabric engine authenticates each request,
//     consults the memserver's policy for it (MemServerHandler::BeforeOp: reserved owner ids,
//     fault injection) and hands the payload to the handler on an I/O thread (fabric/server.h
//     ServiceHandler). A service defines its frames in
//     its own folder; an op no service registered gets an Unsupported error reply.
//   - reach slabs: slabs() is the server's SlabPool; the service allocates under slab_owner(),
//     an owner id reserved for it (memserver/slab_pool.h IsServiceOwner): no client may
//     authenticate as it, and the resource monitor never evicts its slabs (a service has no
//     client to move their data to; it stops growing as the pool's limit falls instead). Its
//     slabs count against the capacity like a client's.
//   - lend CPU: cpu() is what the memserver lends the service beside its I/O threads: worker
//     threads for long requests and the CPU time one request may take on them (operator
//     flags, DaemonOptions::service_cpu). Long work runs on those workers and is answered
//     through fabric::AsyncReply, never on the I/O threads.
//
// A service also reports: StatsText() lines go into the server's STATS answer.
//
// Ownership: the daemon owns each Service and destroys it after the network has stopped (no
// request reaches it then) and before the slab pool. Threads: the factory runs on the daemon's
// thread before the server accepts connections; the host's methods may be called only from
// the factory (the registry is frozen when the server starts).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/status.h"
#include "fabric/server.h"
#include "memserver/slab_pool.h"

namespace tessera::memserver {

// The CPU the memserver lends a service beside its I/O threads.
struct CpuLoan {
  int workers = 2;                  // Threads the service may run, 1..64.
  uint64_t budget_ns = 50'000'000;  // CPU time one request may take on a worker.
};

class ServiceHost {
 public:
  virtual ~ServiceHost() = default;
  // The service ops first_op..last_op go to `handler`, which must live as long as the service.
  // Errors as fabric::Server::RegisterService (a range outside the service ops, an op another
  // service took).
  virtual Status RegisterRequestTypes(uint16_t first_op, uint16_t last_op,
                                      fabric::ServiceHandler* handler) = 0;
  virtual SlabPool& slabs() = 0;
  virtual OwnerId slab_owner() const = 0;
  virtual const CpuLoan& cpu() const = 0;
};

// A service in the memserver process.
class Service {
 public:
  virtual ~Service() = default;
  // "key value" lines appended to STATS (may be empty). Any thread.
  virtual std::string StatsText() { return {}; }
};

// How the daemon makes a service: its name (in logs, errors and the op registry) and a factory
// called once with the host.
struct ServicePlugin {
  std::string name;
  std::function<Result<std::unique_ptr<Service>>(ServiceHost& host)> create;
};

}  // namespace tessera::memserver
