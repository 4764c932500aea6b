// KvService: Kayak's service in the memserver (memserver/service.h): the answer to the KV
// frames (apps/kayak/wire/wire.h, service ops 16..21). KV_GET, KV_MULTIGET, KV_PUT, KV_DELETE
// and KV_COMMIT run at once on the I/O thread against the KV tables
// (apps/kayak/server/kv_table.h); KV_INVOKE of a cheap built-in runs there too (the offload
// runtime's TryInline), any other goes to the runtime's worker pool (apps/kayak/server/offload.h,
// on the CPU the memserver lends the service) and is answered from the worker through the
// engine's AsyncReply, or at once with "pushed back" when the pool is saturated.
//
// Plugin() is how a memserver hosts it: the daemon calls the plugin's factory at start-up, which
// builds the tables in the host's slabs (under the owner id reserved for the service), starts
// the offload runtime on the lent workers and registers the KV ops.
//
// Ownership: owns the KvStore and the OffloadRuntime; borrows the SlabPool (must outlive it).
// Threads: HandleRequest() from the I/O threads concurrently; StatsText() from any thread.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "apps/kayak/server/kv_table.h"
#include "apps/kayak/server/offload.h"
#include "apps/kayak/wire/wire.h"
#include "fabric/server.h"
#include "memserver/service.h"

namespace tessera::kayak {

class KvService : public fabric::ServiceHandler, public memserver::Service {
 public:
  static Result<std::unique_ptr<KvService>> Create(SlabPool* pool, OwnerId owner,
                                                   OffloadOptions offload);

  // fabric::ServiceHandler: a KV op (wire::ParseRequest checks the payload first).
  std::optional<Result<std::vector<uint8_t>>> HandleRequest(const fabric::PeerInfo& peer,
                                                            fabric::Op op,
                                                            std::span<const uint8_t> payload,
                                                            fabric::AsyncReply reply) override;
  // memserver::Service: the tables' and the runtime's STATS lines.
  std::string StatsText() override;
  KvStore& store() { return *store_; }
  OffloadRuntime& runtime() { return *runtime_; }

 private:
  KvService() = default;
  std::unique_ptr<KvStore> store_;
  std::unique_ptr<OffloadRuntime> runtime_;
};

// The Kayak service for DaemonOptions::services. `offload`'s workers and budget are replaced by
// the CPU the memserver lends (ServiceHost::cpu()).
memserver::ServicePlugin Plugin(OffloadOptions offload);

}  // namespace tessera::kayak
