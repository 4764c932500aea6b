// Authentication primitives of the fabric: SHA-256 (FIPS 180-4), HMAC-SHA256 (RFC 2104), the
// handshake MACs, and loading the shared secret.
//
// SHA-256, HMAC-SHA256 and the constant-time comparison come from nettle (Debian nettle-dev),
// not libcrypto. This code is linked into the LD_PRELOAD shim (kernel_shim/preload), so whatever
// the crypto library does when it is loaded runs inside arbitrary programs. nettle keeps no
// global state and has no initialisation call: its one load-time constructor (the "fat" build's
// CPU dispatch, fat_init) runs cpuid, reads NETTLE_FAT_VERBOSE / NETTLE_FAT_OVERRIDE and stores
// function pointers; it allocates nothing, opens no file, starts no thread and registers no
// atexit or fork handler (checked with readelf/objdump on libnettle.so.8.6: .init_array holds
// frame_dummy and fat_init only; libnettle needs only libc). libcrypto instead sets up
// OPENSSL_init state, atexit handlers, locks and config-file loading in the host process.
//
// Handshake (no secret on the wire, both sides authenticated):
//   client -> HELLO {client_nonce, client_id}
//   server -> CHALLENGE {server_nonce, server_id}
//   client -> AUTH {ClientMac(secret, transcript)}
//   server -> AUTH_OK {ServerMac(secret, transcript), ...}   (or PermissionDenied, then close)
// The two MACs use different labels, so one cannot be replayed as the other, and both cover
// both fresh nonces, so a recorded exchange cannot be replayed.
//
// Thread safety: everything here is pure or reads only its arguments; any thread may call it.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include <nettle/sha2.h>

#include "common/status.h"
#include "fabric/wire.h"

namespace tessera::fabric {

using Sha256Digest = std::array<uint8_t, 32>;

// Incremental SHA-256 (nettle's sha256_ctx). A value type; not thread-safe per object.
class Sha256 {
 public:
  Sha256() { Reset(); }
  void Reset();
  void Update(std::span<const uint8_t> data);
  void Update(std::string_view s) {
    Update(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(s.data()), s.size()));
  }
  Sha256Digest Finish();  // Leaves the object reset, ready for a new message.
  static Sha256Digest Hash(std::span<const uint8_t> data);

 private:
  sha256_ctx ctx_;
};

Sha256Digest HmacSha256(std::span<const uint8_t> key, std::span<const uint8_t> message);
inline Sha256Digest HmacSha256(std::string_view key, std::string_view message) {
  return HmacSha256(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(key.data()), key.size()),
                    std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(message.data()),
                                             message.size()));
}

// Everything both MACs cover.
struct HandshakeTranscript {
  Nonce client_nonce{};
  Nonce server_nonce{};
  uint64_t client_id = 0;
  uint64_t server_id = 0;
  // The client process's instance (HELLO's optional trailing 8 bytes; 0: none sent). Covered
  // by both MACs when non-zero, so it cannot be changed on the way.
  uint64_t instance_id = 0;
};
Mac ClientMac(std::string_view secret, const HandshakeTranscript& t);
Mac ServerMac(std::string_view secret, const HandshakeTranscript& t);
// Constant-time comparison (nettle's memeql_sec): the time taken does not depend on where, or
// whether, the two MACs differ.
bool MacEqual(const Mac& a, const Mac& b);

// Slab ownership. A memserver's slabs belong to an owner id, not to a credential: every process
// draws its own instance id (ProcessInstanceId) and sends it in HELLO, and the server makes the
// owner id OwnerIdFor(client_id, instance_id). So two processes holding one credential own
// separate slabs, and the slabs of a process that died lose their lease (memserver
// --orphan_grace) even while another process with the same credential is connected. A client
// that sends no instance (instance 0) owns slabs as its client id, as before.
// The first 8 bytes of SHA-256("tessera-v1-owner" || client_id BE || instance_id BE), top bit
// cleared (ids with it set are the memserver's own), never 0; client_id when instance_id is 0.
// ProcessInstanceId() is declared in fabric/transport.h (ConnectOptions' default).
uint64_t OwnerIdFor(uint64_t client_id, uint64_t instance_id);

// Fills `out` from the kernel's CSPRNG (getrandom). IoError if that fails.
Status RandomBytes(std::span<uint8_t> out);

// The built-in development secret used when no --auth_token_file is given. Servers accept it
// on loopback only (CheckSecretForListen); anyone can read it in the source.
inline constexpr std::string_view kDevelopmentSecret = "tessera-development-secret-do-not-deploy";

// Reads the cluster secret from `path` (trailing newlines stripped; must be 16..4096 bytes after
// that). InvalidArgument for a per-client credential file (fabric/credential.h): a server needs
// the cluster secret itself. An empty `path` returns kDevelopmentSecret and logs a warning
// saying so; `tool` names the caller in that warning.
Result<std::string> LoadAuthSecret(const std::string& path, std::string_view tool);

// The no-open-default rule for servers: OK unless `secret` is kDevelopmentSecret and
// `listen_host` is not loopback-only. Every address the host resolves to must be loopback
// (127.0.0.0/8, ::1); "", "0.0.0.0", "::" and external names are refused with an
// InvalidArgument that says how to give a real secret. fabric::Server::Create calls it.
Status CheckSecretForListen(std::string_view secret, const std::string& listen_host);

}  // namespace tessera::fabric
