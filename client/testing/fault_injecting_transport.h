// FaultInjectingTransport: a fabric::Transport that wraps a real one and injects faults into its
// data path, the way LevelDB's fault-injection Env wraps its Env. Hand its factory to
// RemoteStoreOptions::transport_factory and the remote store runs its real code paths (CRC
// checks, degraded reads, repair, failure handling) against faults no memserver produces on
// demand: flipped bytes in read replies of chosen servers, data ops of chosen servers that
// fail with Unavailable without reaching them, and a data connection dropped on the client's
// side (whatever state the server is in, e.g. stopped). It also counts the connections the
// store's transports try to make to each server.
//
// Threads: a TransportFaults plan is shared by every transport the factory made (one per store
// thread) and may be changed from any thread at any time (mutex). Each FaultInjectingTransport
// belongs to one thread, like the transport it wraps.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "fabric/transport.h"

namespace tessera::client::testing {

// What to inject, by server endpoint ("host:port"). Counters say what was injected.
class TransportFaults {
 public:
  void CorruptReadsFrom(const std::string& endpoint, bool on);
  void FailOpsTo(const std::string& endpoint, bool on);
  // The next data op posted to `endpoint` (by any transport of the factory) aborts its
  // connection first and fails with Unavailable: the connection is lost, once.
  void DropConnectionTo(const std::string& endpoint);
  // Transport::Connect calls made to `endpoint` so far (made, not necessarily succeeded).
  uint64_t connects_to(const std::string& endpoint) const;
  bool corrupting(const std::string& endpoint) const;
  bool failing(const std::string& endpoint) const;
  bool TakeDrop(const std::string& endpoint);  // True once per DropConnectionTo.
  void NoteConnect(const std::string& endpoint);
  std::atomic<uint64_t> reads_corrupted{0};
  std::atomic<uint64_t> ops_failed{0};

 private:
  mutable std::mutex mu_;
  std::set<std::string> corrupt_;  // Guarded by mu_.
  std::set<std::string> fail_;     // Guarded by mu_.
  std::set<std::string> drop_;     // Guarded by mu_.
  std::unordered_map<std::string, uint64_t> connects_;  // Guarded by mu_.
};

class FaultInjectingTransport final : public fabric::Transport {
 public:
  FaultInjectingTransport(std::unique_ptr<fabric::Transport> inner,
                          std::shared_ptr<TransportFaults> faults)
      : inner_(std::move(inner)), faults_(std::move(faults)) {}

  fabric::TransportKind kind() const override { return inner_->kind(); }
  Result<fabric::ConnectionId> Connect(const fabric::Endpoint& endpoint,
                                       const fabric::ConnectOptions& options) override;
  Status Disconnect(fabric::ConnectionId c) override { return inner_->Disconnect(c); }
  Status Abort(fabric::ConnectionId c) override { return inner_->Abort(c); }
  Result<fabric::ServerInfo> Info(fabric::ConnectionId c) const override { return inner_->Info(c); }
  bool Connected(fabric::ConnectionId c) const override { return inner_->Connected(c); }
  Status RegisterMemory(void* addr, size_t length) override {
    return inner_->RegisterMemory(addr, length);
  }
  Status Post(std::span<const fabric::WorkRequest> batch) override;
  size_t Poll(std::span<fabric::Completion> out) override;
  size_t Wait(std::span<fabric::Completion> out, Deadline deadline) override;
  uint32_t inflight() const override {
    return inner_->inflight() + static_cast<uint32_t>(failed_.size());
  }
  Status SetWakeFd(int fd) override { return inner_->SetWakeFd(fd); }
  Status AddSlab(fabric::ConnectionId c, const fabric::AllocSlabResponse& slab) override {
    return inner_->AddSlab(c, slab);
  }
  void RemoveSlab(fabric::ConnectionId c, uint64_t slab_id) override {
    inner_->RemoveSlab(c, slab_id);
  }

 private:
  // Flips a byte of the read replies of corrupted servers; returns n.
  size_t Mangle(std::span<fabric::Completion> out, size_t n);
  size_t TakeFailed(std::span<fabric::Completion> out);

  std::unique_ptr<fabric::Transport> inner_;
  std::shared_ptr<TransportFaults> faults_;
  std::unordered_map<fabric::ConnectionId, std::string> endpoint_;
  struct ReadInfo {
    uint8_t* local = nullptr;
    uint32_t length = 0;
  };
  std::unordered_map<uint64_t, ReadInfo> to_corrupt_;  // By cookie.
  std::vector<fabric::Completion> failed_;             // Injected failures not yet returned.
  std::set<fabric::ConnectionId> dropped_;             // Connections DropConnectionTo aborted.
};

// A RemoteStoreOptions::transport_factory: real transports (fabric::Transport::Create) wrapped
// in FaultInjectingTransport, all sharing `faults`.
std::function<Result<std::unique_ptr<fabric::Transport>>(const fabric::TransportOptions&)>
FaultInjectingFactory(std::shared_ptr<TransportFaults> faults);

}  // namespace tessera::client::testing
