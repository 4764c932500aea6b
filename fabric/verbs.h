// Internal to fabric/: the RDMA verbs pieces (server-side listener, client-side transport).
//
// VerbsListener is the server half: it owns a protection domain on the first RDMA device,
// registers the slab pool as a memory region (remote READ/WRITE), and accepts RC queue pairs
// through an rdma_cm listener. A client may connect a QP only by presenting (in the rdma_cm
// private data) a token issued to its authenticated TCP connection in AUTH_OK, so only
// authenticated clients reach the memory. After setup the server CPU takes no part in data
// movement. One thread (its own) services rdma_cm events; IssueToken/RevokeToken/Register may be
// called from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"
#include "fabric/server.h"

namespace tessera::fabric {

class VerbsListener {
 public:
  // Opens the first RDMA device and a PD, and binds an rdma_cm listener to host:port.
  // Unsupported (with the reason) when no device exists.
  static Result<std::unique_ptr<VerbsListener>> Create(const std::string& host, uint16_t port);
  virtual ~VerbsListener() = default;
  virtual Result<MemoryRegistration> Register(void* addr, size_t length) = 0;
  virtual Status Start() = 0;
  virtual void Stop() = 0;
  virtual uint16_t port() const = 0;
  virtual uint64_t IssueToken() = 0;
  virtual void RevokeToken(uint64_t token) = 0;
};

}  // namespace tessera::fabric
