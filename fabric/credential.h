// Per-client credentials derived from the cluster secret, and how a server tells which one a
// client holds.
//
// Every memserver of a cluster holds one cluster secret (--auth_token_file). From it the
// operator issues credentials (`tessera token issue --client NAME [--admin]`):
//
//   client id  = ClientIdForName(NAME)   (SHA-256 of the name, 63 bits, never 0)
//   client key = HMAC-SHA256(cluster secret, "tessera-v1-client-key" || id as 8 bytes BE)
//   admin key  = HMAC-SHA256(cluster secret, "tessera-v1-admin-key"  || id as 8 bytes BE)
//
// A client runs the usual handshake (fabric/auth.h) with its key as the MAC key and the id as
// its client_id. The server recomputes both keys for the claimed id from the cluster secret and
// checks the client's MAC against each of them and against the cluster secret itself (all three,
// in constant time, whichever matches): no key ever crosses the wire, and a key is only good for
// the one id it was issued for. So a client can act only as itself; the memserver's per-owner
// slab checks (memserver/slab_pool.h) then keep it out of other clients' slabs.
//
// Roles: a client key authenticates an ordinary client (its own slabs only; no FAULT, no
// eviction). An admin key, or the cluster secret itself, authenticates an admin: it may claim
// any id (the cluster secret) or its own (an admin token), touch any slab, inject faults and
// evict. The cluster secret being an admin credential is what keeps `--auth_token_file SECRET`
// working everywhere it worked before (the embedded single-host flows use it).
//
// The credential file (what `tessera token issue` prints; what clients read with
// --auth_token_file): '#' comment lines, then one line
//
//   tessera-credential v1 role=client name=alice id=5012345678901234567 key=<64 hex digits>
//
// A file whose first non-comment line does not start with "tessera-credential" is a cluster
// secret (16..4096 bytes; trailing newlines stripped).
//
// Thread safety: pure functions of their arguments; any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "common/status.h"
#include "fabric/auth.h"

namespace tessera::fabric {

enum class Role : uint8_t { kClient, kAdmin };
std::string_view RoleName(Role role);  // "client" / "admin".

inline constexpr std::string_view kCredentialMagic = "tessera-credential";
inline constexpr size_t kMaxClientNameLength = 64;

// What a client authenticates with.
struct Credential {
  Role role = Role::kAdmin;
  bool cluster_secret = false;  // The cluster secret itself (role admin, any client id).
  std::string name;             // From a token; empty for the cluster secret.
  uint64_t client_id = 0;       // From a token; 0 for the cluster secret (the caller picks).
  std::string key;              // The handshake's MAC key (raw bytes).
};

// The client id a name maps to: the first 8 bytes of SHA-256("tessera-v1-client-id\n" NAME),
// top bit cleared (ids with the top bit set are reserved for the memserver), never 0.
uint64_t ClientIdForName(std::string_view name);
// InvalidArgument unless 1..64 characters of [A-Za-z0-9._@-].
Status ValidateClientName(std::string_view name);

// The 32-byte key of `client_id` for `role` (see the top of this file).
std::string DeriveKey(std::string_view cluster_secret, uint64_t client_id, Role role);

// A token for `name`: role, name, id and key filled in.
Result<Credential> IssueCredential(std::string_view cluster_secret, std::string_view name,
                                   Role role);
// The file text of a token credential (a comment line, then the credential line, then '\n').
std::string FormatCredential(const Credential& c);

// Parses credential-file text (`origin` names it in errors). A token line is checked strictly:
// every field present once, no unknown field, a valid name, an id that matches the name, a key
// of exactly 64 hex digits. Text that is not a token is a cluster secret (16..4096 bytes).
Result<Credential> ParseCredential(std::string_view text, std::string_view origin);
// Reads and parses the file at `path`. An empty `path` gives the built-in development secret
// (kDevelopmentSecret, as a cluster secret) with a warning naming `tool`.
Result<Credential> LoadCredential(const std::string& path, std::string_view tool);

// Server side: which credential the client's AUTH MAC proves for transcript `t`, or nullopt when
// none does. Always computes and compares all three candidates (constant time in which matched).
struct VerifiedClient {
  Role role = Role::kClient;
  bool cluster_secret = false;
  std::string key;  // Key the ServerMac must be made with.
};
std::optional<VerifiedClient> VerifyClientMac(std::string_view cluster_secret,
                                              const HandshakeTranscript& t, const Mac& client_mac);

}  // namespace tessera::fabric
