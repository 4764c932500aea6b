// Internal to fabric/: Server::Impl, the state the Server facade (fabric/server.h) and its I/O
// threads (fabric/server_io_thread.h) share: options, the handler, the listening threads, the
// optional verbs listener, the handshake configuration and the connection counters.
//
// Ownership: owned by Server; owns the I/O threads and the verbs listener.
// Threads: the public methods are the facade's (thread-safe as documented there); the I/O
// threads read options_, handler_, services_, handshake_ and verbs_ (immutable after Start())
// and update the atomic counters.
#pragma once

#include <array>
#include <atomic>
#include <memory>
#include <string>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

#include "fabric/handshake.h"
#include "fabric/server.h"
#include "fabric/server_io_thread.h"
#include "fabric/verbs.h"

namespace tessera::fabric {

class Server::Impl {
 public:
  Impl(ServerOptions options, RequestHandler* handler);
  ~Impl();

  Status Init();
  Status Start();
  void Stop(Deadline grace);
  Status Notify(std::optional<uint64_t> client_id, const Notice& notice);
  Status Disconnect(uint64_t client_id);
  Result<MemoryRegistration> RegisterMemory(void* addr, size_t length);
  Status RegisterService(std::string name, uint16_t first_op, uint16_t last_op,
                         ServiceHandler* handler);
  // The service registered for a service op, or nullptr; "services: a 16..21, b 40..40" (or
  // "no services registered") for error messages. I/O threads, after Start().
  ServiceHandler* ServiceFor(Op op) const;
  std::string ServiceNames() const;

  ServerOptions options_;
  RequestHandler* handler_;
  uint64_t server_id_ = 0;
  uint16_t port_ = 0;
  ServerHandshakeConfig handshake_;  // Final once Start() has run.
  std::vector<std::unique_ptr<ServerIoThread>> threads_;
  std::unique_ptr<VerbsListener> verbs_;
  struct Service {
    std::string name;
    uint16_t first_op;
    uint16_t last_op;
    ServiceHandler* handler;
  };
  std::vector<Service> services_;  // Set before Start(), read-only after.
  // Index into services_ of each service op (minus kFirstServiceOp); -1: none.
  std::array<int16_t, kLastServiceOp - kFirstServiceOp + 1> service_of_op_;
  bool verbs_started_ = false;
  std::atomic<bool> started_{false};
  std::atomic<bool> stopped_{false};
  std::mutex stop_mu_;
  std::atomic<uint64_t> next_conn_id_{1};
  std::atomic<uint32_t> open_connections_{0};
  std::atomic<uint64_t> reply_pauses_{0};  // See Server::reply_backpressure_pauses().

  // Authenticated connections per client id (max_connections_per_client). TakeClientSlot runs
  // in the handshake after the MAC is verified (so no one can use up another client's slots);
  // ReleaseClientSlot when such a connection closes. Any I/O thread.
  Status TakeClientSlot(uint64_t client_id);
  void ReleaseClientSlot(uint64_t client_id);
  std::mutex clients_mu_;
  std::unordered_map<uint64_t, uint32_t> client_connections_;  // Under clients_mu_.
};

}  // namespace tessera::fabric
