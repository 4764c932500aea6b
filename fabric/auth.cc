#include "fabric/auth.h"

#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include <nettle/hmac.h>
#include <nettle/memops.h>
#include <nettle/sha2.h>

#include "common/logging.h"

namespace tessera::fabric {

// SHA-256 and HMAC-SHA256 are nettle's (Debian nettle-dev); see the header for why nettle.
static_assert(sizeof(Sha256Digest) == SHA256_DIGEST_SIZE);
static_assert(sizeof(Mac) == SHA256_DIGEST_SIZE);

void Sha256::Reset() { sha256_init(&ctx_); }

void Sha256::Update(std::span<const uint8_t> data) {
  sha256_update(&ctx_, data.size(), data.data());
}

Sha256Digest Sha256::Finish() {
  Sha256Digest out;
  sha256_digest(&ctx_, out.size(), out.data());  // Also re-initialises the context.
  return out;
}

Sha256Digest Sha256::Hash(std::span<const uint8_t> data) {
  Sha256 s;
  s.Update(data);
  return s.Finish();
}

Sha256Digest HmacSha256(std::span<const uint8_t> key, std::span<const uint8_t> message) {
  hmac_sha256_ctx ctx;
  hmac_sha256_set_key(&ctx, key.size(), key.data());
  hmac_sha256_update(&ctx, message.size(), message.data());
  Sha256Digest out;
  hmac_sha256_digest(&ctx, out.size(), out.data());
  // The context holds the key's inner and outer pad states: do not leave them on the stack.
  ::explicit_bzero(&ctx, sizeof(ctx));
  return out;
}

namespace {
Mac TranscriptMac(std::string_view label, std::string_view secret, const HandshakeTranscript& t) {
  uint8_t msg[64 + 2 * kNonceSize + 16];
  size_t n = 0;
  std::memcpy(msg, label.data(), label.size());
  n += label.size();
  std::memcpy(msg + n, t.client_nonce.data(), kNonceSize);
  n += kNonceSize;
  std::memcpy(msg + n, t.server_nonce.data(), kNonceSize);
  n += kNonceSize;
  PutU64(msg + n, t.client_id);
  n += 8;
  PutU64(msg + n, t.server_id);
  n += 8;
  return HmacSha256(
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(secret.data()), secret.size()),
      std::span<const uint8_t>(msg, n));
}
}  // namespace

Mac ClientMac(std::string_view secret, const HandshakeTranscript& t) {
  return TranscriptMac("tessera-v1-client-auth", secret, t);
}
Mac ServerMac(std::string_view secret, const HandshakeTranscript& t) {
  return TranscriptMac("tessera-v1-server-auth", secret, t);
}

bool MacEqual(const Mac& a, const Mac& b) {
  // memeql_sec's running time depends only on the length, not on where the MACs differ.
  return memeql_sec(a.data(), b.data(), a.size()) != 0;
}

Status RandomBytes(std::span<uint8_t> out) {
  size_t done = 0;
  while (done < out.size()) {
    ssize_t n = ::getrandom(out.data() + done, out.size() - done, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("getrandom");
    }
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

Result<std::string> LoadAuthSecret(const std::string& path, std::string_view tool) {
  if (path.empty()) {
    TLOG(WARNING) << tool << ": no --auth_token_file given; using the built-in development "
                  << "secret, which anyone can read in the source. Do not use it outside a test "
                  << "setup.";
    return std::string(kDevelopmentSecret);
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("cannot open auth token file '", path, "'");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return IoError("reading auth token file '", path, "' failed");
  std::string s = ss.str();
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  if (s.size() < 16) {
    return InvalidArgument("auth token file '", path, "' holds ", s.size(),
                           " bytes; the secret must be at least 16 bytes");
  }
  if (s.size() > 4096) {
    return InvalidArgument("auth token file '", path, "' is larger than 4096 bytes");
  }
  return s;
}

}  // namespace tessera::fabric
