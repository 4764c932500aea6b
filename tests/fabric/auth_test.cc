#include "fabric/auth.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "tests/support/test_util.h"

namespace tessera::fabric {
namespace {

std::string Hex(std::span<const uint8_t> d) {
  static const char* k = "0123456789abcdef";
  std::string s;
  for (uint8_t b : d) {
    s += k[b >> 4];
    s += k[b & 15];
  }
  return s;
}
std::span<const uint8_t> Bytes(std::string_view s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

// FIPS 180-2 / NIST example vectors.
TEST(Sha256Test, FipsVectors) {
  EXPECT_EQ(Hex(Sha256::Hash(Bytes(""))),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Hex(Sha256::Hash(Bytes("abc"))),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Hex(Sha256::Hash(Bytes("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"))),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  // One million 'a', fed in uneven pieces to exercise the block buffering.
  Sha256 s;
  std::string chunk(997, 'a');
  size_t left = 1000000;
  while (left > 0) {
    size_t n = std::min(left, chunk.size());
    s.Update(std::string_view(chunk).substr(0, n));
    left -= n;
  }
  EXPECT_EQ(Hex(s.Finish()), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  // Finish() leaves the object ready for a new message.
  s.Update("abc");
  EXPECT_EQ(Hex(s.Finish()), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

// RFC 4231 test cases 1-4, 6, 7 (5 is a truncated output).
TEST(HmacSha256Test, Rfc4231Vectors) {
  EXPECT_EQ(Hex(HmacSha256(std::string(20, '\x0b'), "Hi There")),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  EXPECT_EQ(Hex(HmacSha256("Jefe", "what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  EXPECT_EQ(Hex(HmacSha256(std::string(20, '\xaa'), std::string(50, '\xdd'))),
            "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe");
  std::string key4;
  for (int i = 1; i <= 25; ++i) key4 += static_cast<char>(i);
  EXPECT_EQ(Hex(HmacSha256(key4, std::string(50, '\xcd'))),
            "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b");
  EXPECT_EQ(Hex(HmacSha256(std::string(131, '\xaa'),
                           "Test Using Larger Than Block-Size Key - Hash Key First")),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  EXPECT_EQ(Hex(HmacSha256(std::string(131, '\xaa'),
                           "This is a test using a larger than block-size key and a larger than "
                           "block-size data. The key needs to be hashed before being used by the "
                           "HMAC algorithm.")),
            "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2");
}

HandshakeTranscript SampleTranscript() {
  HandshakeTranscript t;
  t.client_nonce.fill(1);
  t.server_nonce.fill(2);
  t.client_id = 3;
  t.server_id = 4;
  return t;
}

TEST(AuthTest, MacsDependOnEveryInputAndDiffer) {
  const HandshakeTranscript t = SampleTranscript();
  Mac c = ClientMac("secret-secret-secret", t);
  Mac s = ServerMac("secret-secret-secret", t);
  EXPECT_FALSE(MacEqual(c, s));
  EXPECT_TRUE(MacEqual(c, ClientMac("secret-secret-secret", t)));
  EXPECT_FALSE(MacEqual(c, ClientMac("secret-secret-secreT", t)));
  HandshakeTranscript t2 = t;
  t2.server_nonce[31] ^= 1;
  EXPECT_FALSE(MacEqual(c, ClientMac("secret-secret-secret", t2)));
  t2 = t;
  t2.client_id = 5;
  EXPECT_FALSE(MacEqual(c, ClientMac("secret-secret-secret", t2)));
}

// The MACs' input (label, both nonces, client and server id little-endian, then the instance
// id when HELLO carried one) and the owner id's, pinned by values computed from that layout
// independently of this code: another layout would lock out every peer built before it.
TEST(AuthTest, MacAndOwnerIdInputsAreUnchanged) {
  HandshakeTranscript t = SampleTranscript();
  EXPECT_EQ(Hex(ClientMac("secret-secret-secret", t)),
            "a159da72ccfba7190cebfa563a2ae31463681243ae2ea0efcf7692d5e4fadb59");
  EXPECT_EQ(Hex(ServerMac("secret-secret-secret", t)),
            "95e9e0e931474ce684d66718cc2d689c0352e9f05fa4095fc2e3bb93b121b220");
  t.instance_id = 0x0102030405060708;
  EXPECT_EQ(Hex(ClientMac("secret-secret-secret", t)),
            "a4994a79ddcd908e634d1144d87a5ba88f1e3cd9d454a54d69275b53b2cef955");
  EXPECT_EQ(Hex(ServerMac("secret-secret-secret", t)),
            "5e03f5a72376a521d0d68f7ee93906c6301d9c35e705c584fedcfa77651ecb43");
  EXPECT_EQ(OwnerIdFor(3, 0x0102030405060708), 0x193c4fb848056994u);
}

// MacEqual (nettle's memeql_sec) must not stop at the first difference: every single-bit
// difference, at every position, makes the MACs unequal, and equal MACs compare equal.
TEST(AuthTest, MacEqualSeesEveryBit) {
  Mac a;
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<uint8_t>(i * 37 + 11);
  EXPECT_TRUE(MacEqual(a, a));
  for (size_t i = 0; i < a.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      Mac b = a;
      b[i] ^= static_cast<uint8_t>(1u << bit);
      EXPECT_FALSE(MacEqual(a, b)) << "byte " << i << " bit " << bit;
      EXPECT_FALSE(MacEqual(b, a)) << "byte " << i << " bit " << bit;
    }
  }
  Mac zero{}, ones;
  ones.fill(0xff);
  EXPECT_FALSE(MacEqual(zero, ones));
  EXPECT_TRUE(MacEqual(zero, Mac{}));
}

TEST(AuthTest, RandomBytesAreNotConstant) {
  Nonce a{}, b{};
  ASSERT_TRUE(RandomBytes(a).ok());
  ASSERT_TRUE(RandomBytes(b).ok());
  EXPECT_NE(a, b);
}

TEST(AuthTest, LoadAuthSecret) {
  testing::TempDir dir;
  auto dev = LoadAuthSecret("", "auth_test");
  ASSERT_TRUE(dev.ok());
  EXPECT_EQ(*dev, kDevelopmentSecret);
  std::string path = dir.path() + "/token";
  std::ofstream(path) << "0123456789abcdef-long-enough\n";
  auto s = LoadAuthSecret(path, "auth_test");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(*s, "0123456789abcdef-long-enough");
  std::ofstream(path) << "short\n";
  EXPECT_EQ(LoadAuthSecret(path, "auth_test").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(LoadAuthSecret(dir.path() + "/missing", "auth_test").status().code(),
            StatusCode::kNotFound);
}

}  // namespace
}  // namespace tessera::fabric
