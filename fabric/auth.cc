#include "fabric/auth.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/random.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include <nettle/hmac.h>
#include <nettle/memops.h>
#include <nettle/sha2.h>

#include "common/coding.h"
#include "common/logging.h"
#include "fabric/transport.h"

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
  ByteWriter msg;
  msg.PutBytes(AsBytes(label))
      .PutBytes(t.client_nonce)
      .PutBytes(t.server_nonce)
      .PutFixed64(t.client_id)
      .PutFixed64(t.server_id);
  if (t.instance_id != 0) msg.PutFixed64(t.instance_id);
  return HmacSha256(AsBytes(secret), msg.Take());
}
}  // namespace

uint64_t OwnerIdFor(uint64_t client_id, uint64_t instance_id) {
  if (instance_id == 0) return client_id;
  constexpr std::string_view kLabel = "tessera-v1-owner";
  uint8_t msg[kLabel.size() + 8 + 8];
  SpanWriter(msg, sizeof msg)
      .PutBytes(AsBytes(kLabel))
      .PutFixed64(client_id)
      .PutFixed64(instance_id);
  Sha256Digest d = Sha256::Hash(msg);
  uint64_t id = 0;
  for (int i = 0; i < 8; ++i) id = (id << 8) | d[i];
  id &= ~(uint64_t{1} << 63);
  return id == 0 ? 1 : id;
}

uint64_t ProcessInstanceId() {
  static const uint64_t id = [] {
    uint64_t v = 0;
    while (v == 0) {
      std::array<uint8_t, 8> b{};
      Status st = RandomBytes(b);
      TCHECK(st.ok()) << "no random bytes for the process instance id: " << st.ToString();
      for (uint8_t x : b) v = (v << 8) | x;
    }
    return v;
  }();
  return id;
}

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
                  << "secret, which anyone can read in the source. Servers accept it on "
                  << "loopback only; give a cluster secret (`tessera token secret`) to serve "
                  << "other hosts.";
    return std::string(kDevelopmentSecret);
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("cannot open auth token file '", path, "'");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return IoError("reading auth token file '", path, "' failed");
  std::string s = ss.str();
  // A per-client credential is not a cluster secret: a server holding one would accept only
  // that client, and silently so. Say what the file is.
  if (s.compare(0, std::string_view("tessera-credential").size(), "tessera-credential") == 0 ||
      s.find("\ntessera-credential") != std::string::npos) {
    return InvalidArgument("auth token file '", path, "' holds a per-client credential (from "
                           "`tessera token issue`); ", tool, " needs the cluster secret itself");
  }
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

Status CheckSecretForListen(std::string_view secret, const std::string& listen_host) {
  if (secret != kDevelopmentSecret) return Status::Ok();
  auto refuse = [&](std::string_view why) {
    return InvalidArgument(
        "refusing to listen on '", listen_host.empty() ? "*" : listen_host, "' (", why,
        ") with the built-in development secret, which anyone can read in the source: give "
        "--auth_token_file with a cluster secret (create one with `tessera token secret > FILE`),"
        " or listen on 127.0.0.1");
  };
  if (listen_host.empty()) return refuse("every interface");
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  if (int rc = getaddrinfo(listen_host.c_str(), "0", &hints, &res); rc != 0) {
    return InvalidArgument("cannot resolve listen host '", listen_host, "': ", gai_strerror(rc));
  }
  bool all_loopback = res != nullptr;
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    if (ai->ai_family == AF_INET) {
      const auto* a = reinterpret_cast<const sockaddr_in*>(ai->ai_addr);
      if ((ntohl(a->sin_addr.s_addr) >> 24) != 127) all_loopback = false;
    } else if (ai->ai_family == AF_INET6) {
      const auto* a = reinterpret_cast<const sockaddr_in6*>(ai->ai_addr);
      bool v4_loop = IN6_IS_ADDR_V4MAPPED(&a->sin6_addr) && a->sin6_addr.s6_addr[12] == 127;
      if (!IN6_IS_ADDR_LOOPBACK(&a->sin6_addr) && !v4_loop) all_loopback = false;
    } else {
      all_loopback = false;
    }
  }
  freeaddrinfo(res);
  if (!all_loopback) return refuse("not a loopback address");
  TLOG(WARNING) << "serving on loopback (" << listen_host << ") with the built-in development "
                << "secret: fine for one host, refused on any other address";
  return Status::Ok();
}

}  // namespace tessera::fabric
