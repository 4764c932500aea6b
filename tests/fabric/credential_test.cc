// Per-client credentials (fabric/credential.h): key derivation, the server's verification of
// each role, the credential file parser's errors, and the no-open-default listen rule.
#include "fabric/credential.h"

#include <gtest/gtest.h>

#include <fstream>

#include "tests/support/test_util.h"

namespace tessera::fabric {
namespace {

constexpr std::string_view kSecret = "credential-test-cluster-secret-0123";

HandshakeTranscript Transcript(uint64_t client_id) {
  HandshakeTranscript t;
  t.client_nonce.fill(7);
  t.server_nonce.fill(9);
  t.client_id = client_id;
  t.server_id = 42;
  return t;
}

TEST(CredentialTest, IdsComeFromNamesAndAreNeverZeroOrReserved) {
  EXPECT_EQ(ClientIdForName("alice"), ClientIdForName("alice"));
  EXPECT_NE(ClientIdForName("alice"), ClientIdForName("bob"));
  for (std::string_view n : {"a", "alice", "bob", "x.y_z@host-1"}) {
    EXPECT_NE(ClientIdForName(n), 0u);
    EXPECT_EQ(ClientIdForName(n) >> 63, 0u) << "top bit is reserved for the memserver";
  }
  EXPECT_TRUE(ValidateClientName("job-7.worker_3@rack2").ok());
  EXPECT_FALSE(ValidateClientName("").ok());
  EXPECT_FALSE(ValidateClientName(std::string(65, 'a')).ok());
  EXPECT_FALSE(ValidateClientName("has space").ok());
  EXPECT_FALSE(ValidateClientName("new\nline").ok());
}

// A name's id and the keys derived for it, pinned by values computed from their layout (the
// id: the first 8 bytes of the name's hash, little-endian; a key: the HMAC of the label and the
// id, little-endian) independently of this code: credentials issued before must keep working.
TEST(CredentialTest, IdsAndKeysAreUnchanged) {
  EXPECT_EQ(ClientIdForName("alice"), 7635101399123321705u);
  auto client = IssueCredential(kSecret, "alice", Role::kClient);
  auto admin = IssueCredential(kSecret, "alice", Role::kAdmin);
  ASSERT_TRUE(client.ok() && admin.ok());
  EXPECT_NE(FormatCredential(*client).find(
                " id=7635101399123321705"
                " key=bd75ad4b75425bd568e5c45429e4cc75960b79ce07a4a8e13313e9ebf8e434e2\n"),
            std::string::npos)
      << FormatCredential(*client);
  EXPECT_NE(FormatCredential(*admin).find(
                " id=7635101399123321705"
                " key=af275f4015885b7d431ab9c55b1548973ae4958cb38f464aadab2771c591aeb0\n"),
            std::string::npos)
      << FormatCredential(*admin);
}

TEST(CredentialTest, ServerTellsEachRoleApartAndRefusesOthers) {
  auto alice = IssueCredential(kSecret, "alice", Role::kClient);
  auto ops = IssueCredential(kSecret, "ops", Role::kAdmin);
  ASSERT_TRUE(alice.ok() && ops.ok());
  EXPECT_EQ(alice->key.size(), 32u);
  EXPECT_NE(alice->key, DeriveKey(kSecret, alice->client_id, Role::kAdmin));

  HandshakeTranscript t = Transcript(alice->client_id);
  auto v = VerifyClientMac(kSecret, t, ClientMac(alice->key, t));
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->role, Role::kClient);
  EXPECT_EQ(v->key, alice->key);  // The server's MAC is made with the client's key.

  HandshakeTranscript to = Transcript(ops->client_id);
  v = VerifyClientMac(kSecret, to, ClientMac(ops->key, to));
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->role, Role::kAdmin);
  EXPECT_FALSE(v->cluster_secret);

  // The cluster secret itself is an admin for any id.
  HandshakeTranscript ts = Transcript(12345);
  v = VerifyClientMac(kSecret, ts, ClientMac(kSecret, ts));
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->role, Role::kAdmin);
  EXPECT_TRUE(v->cluster_secret);

  // Alice's key claiming bob's id; a key from another cluster; a garbled key.
  auto bob = IssueCredential(kSecret, "bob", Role::kClient);
  HandshakeTranscript tb = Transcript(bob->client_id);
  EXPECT_FALSE(VerifyClientMac(kSecret, tb, ClientMac(alice->key, tb)).has_value());
  auto other = IssueCredential("another-cluster-secret-00000000", "alice", Role::kClient);
  EXPECT_FALSE(VerifyClientMac(kSecret, t, ClientMac(other->key, t)).has_value());
  std::string garbled = alice->key;
  garbled[5] ^= 1;
  EXPECT_FALSE(VerifyClientMac(kSecret, t, ClientMac(garbled, t)).has_value());
}

TEST(CredentialTest, FormatThenParseRoundTrips) {
  for (Role role : {Role::kClient, Role::kAdmin}) {
    auto c = IssueCredential(kSecret, "worker-1", role);
    ASSERT_TRUE(c.ok());
    std::string text = FormatCredential(*c);
    auto p = ParseCredential(text, "t");
    ASSERT_TRUE(p.ok()) << p.status() << "\n" << text;
    EXPECT_EQ(p->role, role);
    EXPECT_FALSE(p->cluster_secret);
    EXPECT_EQ(p->name, "worker-1");
    EXPECT_EQ(p->client_id, c->client_id);
    EXPECT_EQ(p->key, c->key);
  }
  // A plain secret stays a cluster secret (the --auth_token_file of before).
  auto s = ParseCredential(std::string(kSecret) + "\n", "t");
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(s->cluster_secret);
  EXPECT_EQ(s->role, Role::kAdmin);
  EXPECT_EQ(s->key, kSecret);
  EXPECT_EQ(s->client_id, 0u);
}

// Every way a credential file can be damaged gets an InvalidArgument that says what is wrong.
TEST(CredentialTest, DamagedFilesGetClearErrors) {
  auto c = IssueCredential(kSecret, "alice", Role::kClient);
  ASSERT_TRUE(c.ok());
  const std::string good = FormatCredential(*c);
  const std::string line = good.substr(good.find("tessera-credential"));
  const std::string id = std::to_string(c->client_id);
  const std::string key_hex = line.substr(line.find("key=") + 4, 64);
  auto expect_error = [](const std::string& text, const std::string& fragment) {
    auto p = ParseCredential(text, "'f'");
    ASSERT_FALSE(p.ok()) << "accepted: " << text;
    EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(p.status().message().find(fragment), std::string::npos)
        << "'" << fragment << "' not in: " << p.status().message();
  };
  auto with = [&](const std::string& from, const std::string& to) {
    std::string s = line;
    s.replace(s.find(from), from.size(), to);
    return s;
  };
  expect_error(with(key_hex, key_hex.substr(0, 63)), "exactly 64 hex digits");
  expect_error(with(key_hex, key_hex + "0"), "exactly 64 hex digits");
  expect_error(with(key_hex, "zz" + key_hex.substr(2)), "non-hex character at position 0");
  expect_error(with(key_hex, key_hex.substr(0, 10) + "g" + key_hex.substr(11)),
               "non-hex character at position 10");
  expect_error(with("id=" + id, "id=" + std::to_string(c->client_id + 2)),
               "does not belong to name 'alice'");
  expect_error(with("id=" + id, "id=0"), "non-zero decimal");
  expect_error(with("id=" + id, "id=12x"), "non-zero decimal");
  expect_error(with("role=client", "role=root"), "neither 'client' nor 'admin'");
  expect_error(with(" name=alice", ""), "missing field 'name'");
  expect_error(with(" id=", " id=" + id + " id="), "appears twice");
  expect_error(with(" key=", " color=blue key="), "unknown field 'color'");
  expect_error(with(" key=", " junk key="), "not a key=value field");
  expect_error(with("v1", "v2"), "unsupported credential version 'v2'");
  expect_error(with("name=alice", "name=al ice"), "not a key=value field");
  expect_error(with("name=alice", "name=al/ice"), "may hold only letters");
  expect_error(line + line, "exactly one line");
  expect_error("short\n", "at least 16 bytes");
  expect_error(std::string(5000, 'x'), "larger than 4096");
}

TEST(CredentialTest, LoadCredentialReadsFilesAndTheDevelopmentDefault) {
  testing::TempDir dir;
  auto dev = LoadCredential("", "credential_test");
  ASSERT_TRUE(dev.ok());
  EXPECT_TRUE(dev->cluster_secret);
  EXPECT_EQ(dev->key, kDevelopmentSecret);
  EXPECT_EQ(LoadCredential(dir.path() + "/missing", "t").status().code(), StatusCode::kNotFound);
  auto c = IssueCredential(kSecret, "bob", Role::kAdmin);
  std::ofstream(dir.path() + "/bob") << FormatCredential(*c);
  auto l = LoadCredential(dir.path() + "/bob", "t");
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->role, Role::kAdmin);
  EXPECT_EQ(l->client_id, ClientIdForName("bob"));
  // A server's secret loader refuses a credential: it needs the cluster secret.
  auto s = LoadAuthSecret(dir.path() + "/bob", "tessera memserver");
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("per-client credential"), std::string::npos) << s.status();
}

TEST(CredentialTest, DevelopmentSecretOnlyOnLoopback) {
  for (std::string host : {"127.0.0.1", "127.3.4.5", "::1", "localhost"}) {
    EXPECT_TRUE(CheckSecretForListen(kDevelopmentSecret, host).ok()) << host;
  }
  for (std::string host : {"0.0.0.0", "::", "", "10.1.2.3", "192.168.0.7"}) {
    Status st = CheckSecretForListen(kDevelopmentSecret, host);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << host;
    EXPECT_NE(st.message().find("development secret"), std::string::npos) << st;
    EXPECT_NE(st.message().find("--auth_token_file"), std::string::npos) << st;
  }
  // A real secret may listen anywhere.
  EXPECT_TRUE(CheckSecretForListen(kSecret, "0.0.0.0").ok());
  EXPECT_TRUE(CheckSecretForListen(kSecret, "").ok());
}

}  // namespace
}  // namespace tessera::fabric
