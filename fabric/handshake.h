// Internal to fabric/: the HELLO/CHALLENGE/AUTH handshake (fabric/auth.h describes the protocol
// and the MACs) as functions over frames, one class per side, with no sockets in them, so both
// halves are unit-tested against each other byte for byte (tests/fabric/handshake_test.cc).
// RunClientHandshake() drives the client half over a socket for the TCP transport and the
// control client; the server engine drives ServerHandshake from its io_uring loop.
//
// Ownership: plain values; each object is one connection's handshake state.
// Threads: one thread per object.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "common/fd.h"
#include "common/status.h"
#include "fabric/auth.h"
#include "fabric/credential.h"
#include "fabric/byte_buffer.h"
#include "fabric/connect.h"
#include "fabric/transport.h"
#include "fabric/wire.h"

namespace tessera::fabric {

// Request ids the client uses for its two handshake requests.
inline constexpr uint64_t kHelloRequestId = 1;
inline constexpr uint64_t kAuthRequestId = 2;

// The client half. Call Hello(), send its frame, feed the reply to OnChallenge(), send the
// frame it returns, feed that reply to OnAuthReply().
class ClientHandshake {
 public:
  // `peer` names the server in error messages.
  // `instance_id` non-zero: sent in HELLO (fabric/auth.h, "Slab ownership").
  ClientHandshake(std::string secret, uint64_t client_id, std::string peer,
                  uint64_t instance_id = 0);

  // The HELLO frame, with a fresh client nonce. InvalidArgument for client_id 0 or an empty
  // secret; IoError when no random bytes are available.
  Result<std::vector<uint8_t>> Hello();
  // The server's reply to HELLO (a whole response frame): CHALLENGE -> the AUTH frame. The
  // server's error (e.g. Unsupported version) comes back with "HELLO refused" context;
  // ProtocolError for anything else.
  Result<std::vector<uint8_t>> OnChallenge(std::span<const uint8_t> frame);
  // The server's reply to AUTH: AUTH_OK, returned once the server's MAC proves it knows the
  // secret (PermissionDenied otherwise); the server's error (PermissionDenied for a wrong
  // secret) as is.
  Result<AuthOkResponse> OnAuthReply(std::span<const uint8_t> frame);

  const HandshakeTranscript& transcript() const { return transcript_; }

 private:
  enum class State : uint8_t { kStart, kSentHello, kSentAuth, kDone };
  std::string secret_;
  std::string peer_;
  HandshakeTranscript transcript_;
  State state_ = State::kStart;
};

// Runs ClientHandshake over `fd` (connected, non-blocking) within options.deadline.
// (ClientLogin, ClientSocket and ConnectAndAuthenticate, which runs it over a new socket, are
// public: fabric/connect.h.)
Result<ClientLogin> RunClientHandshake(int fd, const Endpoint& endpoint,
                                       const ConnectOptions& options);

// What the server half needs from its server.
struct ServerHandshakeConfig {
  std::string secret;  // The cluster secret (fabric/credential.h derives client keys from it).
  uint64_t server_id = 0;
  uint64_t slab_size = 0;       // Advertised in AUTH_OK.
  uint64_t capacity_bytes = 0;  // Advertised in AUTH_OK.
  // RDMA offer: when set, AUTH_OK offers RDMA on rdma_host:rdma_port with a login token from
  // this function (called once per successful AUTH; the caller revokes it on close).
  std::function<uint64_t()> issue_rdma_token;
  std::string rdma_host;
  uint16_t rdma_port = 0;
  // Called once the client's MAC is verified, before AUTH_OK: an error refuses the login (the
  // client gets it as AUTH's error reply, then the connection closes). Empty: always admitted.
  std::function<Status(uint64_t client_id)> admit;
};

// The server half of one connection: fed every request frame until it says kAuthenticated.
class ServerHandshake {
 public:
  enum class Outcome : uint8_t {
    kContinue,        // Reply appended; wait for the next frame.
    kAuthenticated,   // AUTH_OK appended; the connection is now authenticated.
    kReplyThenClose,  // An error reply appended; close once it is sent.
    kClose,           // Close now without a reply (a frame out of order).
  };
  struct Step {
    Outcome outcome = Outcome::kContinue;
    // Why the connection is closed (kClose / kReplyThenClose); empty for an ordinary refusal
    // (unsupported version) that needs no warning.
    std::string reason;
  };

  // Handles one parsed request frame; appends the reply to `out`.
  Step OnFrame(const ParsedFrame& frame, const ServerHandshakeConfig& config, ByteBuffer& out);

  bool authenticated() const { return state_ == State::kDone; }
  uint64_t client_id() const { return transcript_.client_id; }  // From HELLO.
  uint64_t instance_id() const { return transcript_.instance_id; }  // From HELLO (0: none).
  // The owner id of the connection's slabs: OwnerIdFor(client_id, instance_id).
  uint64_t owner_id() const { return OwnerIdFor(transcript_.client_id, transcript_.instance_id); }
  // The role AUTH proved (fabric/credential.h): kAdmin for the cluster secret or an admin token.
  Role role() const { return role_; }
  uint64_t rdma_token() const { return rdma_token_; }  // Issued at AUTH_OK (0: none).

 private:
  enum class State : uint8_t { kHello, kAuth, kDone };
  State state_ = State::kHello;
  HandshakeTranscript transcript_;
  Role role_ = Role::kClient;
  uint64_t rdma_token_ = 0;
};

}  // namespace tessera::fabric
