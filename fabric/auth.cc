#include "fabric/auth.h"

#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "common/logging.h"

namespace tessera::fabric {
namespace {

constexpr uint32_t kK[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

inline uint32_t Rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

}  // namespace

void Sha256::Reset() {
  static constexpr uint32_t kInit[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                        0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  std::memcpy(h_, kInit, sizeof(h_));
  buf_len_ = 0;
  total_len_ = 0;
}

void Sha256::Block(const uint8_t* p) {
  uint32_t w[64];
  for (int i = 0; i < 16; ++i) {
    w[i] = (uint32_t(p[4 * i]) << 24) | (uint32_t(p[4 * i + 1]) << 16) |
           (uint32_t(p[4 * i + 2]) << 8) | uint32_t(p[4 * i + 3]);
  }
  for (int i = 16; i < 64; ++i) {
    uint32_t s0 = Rotr(w[i - 15], 7) ^ Rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
    uint32_t s1 = Rotr(w[i - 2], 17) ^ Rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  uint32_t a = h_[0], b = h_[1], c = h_[2], d = h_[3], e = h_[4], f = h_[5], g = h_[6], h = h_[7];
  for (int i = 0; i < 64; ++i) {
    uint32_t s1 = Rotr(e, 6) ^ Rotr(e, 11) ^ Rotr(e, 25);
    uint32_t ch = (e & f) ^ (~e & g);
    uint32_t t1 = h + s1 + ch + kK[i] + w[i];
    uint32_t s0 = Rotr(a, 2) ^ Rotr(a, 13) ^ Rotr(a, 22);
    uint32_t maj = (a & b) ^ (a & c) ^ (b & c);
    uint32_t t2 = s0 + maj;
    h = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  h_[0] += a; h_[1] += b; h_[2] += c; h_[3] += d;
  h_[4] += e; h_[5] += f; h_[6] += g; h_[7] += h;
}

void Sha256::Update(std::span<const uint8_t> data) {
  const uint8_t* p = data.data();
  size_t n = data.size();
  total_len_ += n;
  if (buf_len_ > 0) {
    size_t take = std::min(n, sizeof(buf_) - buf_len_);
    std::memcpy(buf_ + buf_len_, p, take);
    buf_len_ += take;
    p += take;
    n -= take;
    if (buf_len_ == sizeof(buf_)) {
      Block(buf_);
      buf_len_ = 0;
    }
  }
  while (n >= 64) {
    Block(p);
    p += 64;
    n -= 64;
  }
  if (n > 0) {
    std::memcpy(buf_, p, n);
    buf_len_ = n;
  }
}

Sha256Digest Sha256::Finish() {
  uint64_t bits = total_len_ * 8;
  uint8_t pad[72] = {0x80};
  size_t pad_len = (buf_len_ < 56) ? (56 - buf_len_) : (120 - buf_len_);
  uint8_t len_be[8];
  for (int i = 0; i < 8; ++i) len_be[i] = uint8_t(bits >> (56 - 8 * i));
  Update(std::span<const uint8_t>(pad, pad_len));
  Update(std::span<const uint8_t>(len_be, 8));
  Sha256Digest out;
  for (int i = 0; i < 8; ++i) {
    out[4 * i] = uint8_t(h_[i] >> 24);
    out[4 * i + 1] = uint8_t(h_[i] >> 16);
    out[4 * i + 2] = uint8_t(h_[i] >> 8);
    out[4 * i + 3] = uint8_t(h_[i]);
  }
  return out;
}

Sha256Digest Sha256::Hash(std::span<const uint8_t> data) {
  Sha256 s;
  s.Update(data);
  return s.Finish();
}

Sha256Digest HmacSha256(std::span<const uint8_t> key, std::span<const uint8_t> message) {
  uint8_t k[64] = {};
  if (key.size() > 64) {
    Sha256Digest d = Sha256::Hash(key);
    std::memcpy(k, d.data(), d.size());
  } else if (!key.empty()) {
    std::memcpy(k, key.data(), key.size());
  }
  uint8_t ipad[64], opad[64];
  for (int i = 0; i < 64; ++i) {
    ipad[i] = k[i] ^ 0x36;
    opad[i] = k[i] ^ 0x5c;
  }
  Sha256 inner;
  inner.Update(std::span<const uint8_t>(ipad, 64));
  inner.Update(message);
  Sha256Digest ih = inner.Finish();
  Sha256 outer;
  outer.Update(std::span<const uint8_t>(opad, 64));
  outer.Update(std::span<const uint8_t>(ih.data(), ih.size()));
  return outer.Finish();
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
  uint8_t diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= a[i] ^ b[i];
  return diff == 0;
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
