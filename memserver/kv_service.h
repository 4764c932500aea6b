// KvService: the memserver's answer to the KV frames (fabric/wire.h ops 16..31): KV_GET,
// KV_MULTIGET, KV_PUT, KV_DELETE and KV_COMMIT run at once on the I/O thread against the KV
// tables (memserver/kv_table.h); KV_INVOKE of a cheap built-in runs there too (the offload
// runtime's TryInline), any other goes to the runtime's worker pool (memserver/offload.h) and is
// answered from the worker through the engine's AsyncReply, or at once with "pushed back" when
// the pool is saturated.
//
// Ownership: owns the KvStore and the OffloadRuntime; borrows the SlabPool (must outlive it).
// Threads: Handle() from the I/O threads concurrently; StatsText() from any thread.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fabric/server.h"
#include "memserver/kv_table.h"
#include "memserver/offload.h"

namespace tessera::memserver {

class KvService {
 public:
  static Result<std::unique_ptr<KvService>> Create(SlabPool* pool, OffloadOptions offload);

  std::optional<Result<std::vector<uint8_t>>> Handle(const fabric::ParsedFrame& frame,
                                                     fabric::AsyncReply reply);
  std::string StatsText();
  KvStore& store() { return *store_; }
  OffloadRuntime& runtime() { return *runtime_; }

 private:
  KvService() = default;
  std::unique_ptr<KvStore> store_;
  std::unique_ptr<OffloadRuntime> runtime_;
};

}  // namespace tessera::memserver
