// The HELLO/CHALLENGE/AUTH handshake, both halves against each other, with no sockets: every
// frame goes through the real encoder and parser.
#include "fabric/handshake.h"

#include <gtest/gtest.h>

#include <vector>

#include "fabric/credential.h"
#include "fabric/frame_builder.h"

namespace tessera::fabric {
namespace {

constexpr char kSecret[] = "handshake-test-secret-0123456789";

ServerHandshakeConfig Config(std::string secret = kSecret) {
  ServerHandshakeConfig c;
  c.secret = std::move(secret);
  c.server_id = 77;
  c.slab_size = 1 << 20;
  c.capacity_bytes = 64 << 20;
  return c;
}

// Feeds a client request frame to the server half; returns the step and the reply bytes.
ServerHandshake::Step Serve(ServerHandshake& server, const ServerHandshakeConfig& config,
                            const std::vector<uint8_t>& request, std::vector<uint8_t>* reply) {
  auto f = ParseFrame(request, Direction::kRequest);
  EXPECT_TRUE(f.ok()) << f.status();
  ByteBuffer out;
  ServerHandshake::Step step = server.OnFrame(*f, config, out);
  reply->assign(out.data(), out.data() + out.size());
  return step;
}

TEST(HandshakeTest, BothSidesAuthenticate) {
  ServerHandshakeConfig config = Config();
  uint64_t tokens = 0;
  config.issue_rdma_token = [&] { return ++tokens + 1000; };
  config.rdma_host = "10.0.0.1";
  config.rdma_port = 4791;
  ClientHandshake client(kSecret, 42, "test-server");
  ServerHandshake server;

  auto hello = client.Hello();
  ASSERT_TRUE(hello.ok()) << hello.status();
  std::vector<uint8_t> reply;
  EXPECT_EQ(Serve(server, config, *hello, &reply).outcome, ServerHandshake::Outcome::kContinue);
  EXPECT_FALSE(server.authenticated());
  auto auth = client.OnChallenge(reply);
  ASSERT_TRUE(auth.ok()) << auth.status();
  EXPECT_EQ(client.transcript().server_id, 77u);
  EXPECT_EQ(Serve(server, config, *auth, &reply).outcome,
            ServerHandshake::Outcome::kAuthenticated);
  EXPECT_TRUE(server.authenticated());
  EXPECT_EQ(server.client_id(), 42u);
  EXPECT_EQ(server.rdma_token(), 1001u);
  auto ok = client.OnAuthReply(reply);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->slab_size, 1u << 20);
  EXPECT_EQ(ok->capacity_bytes, 64u << 20);
  EXPECT_EQ(ok->flags, AuthOkResponse::kRdmaOffered);
  EXPECT_EQ(ok->rdma_token, 1001u);
  EXPECT_EQ(ok->rdma_host, "10.0.0.1");
  EXPECT_EQ(ok->rdma_port, 4791);
  EXPECT_EQ(tokens, 1u);
}

// HELLO with the client's instance id, written out by hand from the layout (the nonce is
// random: it is taken from the transcript), and the server half reading the id back.
TEST(HandshakeTest, HelloWithInstanceIdBytesAreUnchanged) {
  ClientHandshake client(kSecret, 0x1122, "s", 0x0102030405060708);
  auto hello = client.Hello();
  ASSERT_TRUE(hello.ok()) << hello.status();
  std::vector<uint8_t> want = {
      'T', 'S', 'R', 'A', 1, 0, 1, 0,                          // magic, version, op HELLO
      1, 0, 0, 0, 0, 0, 0, 0,                                  // request id kHelloRequestId
      0, 0, 0, 0, 52, 0, 0, 0};                                // status, payload length
  const Nonce& nonce = client.transcript().client_nonce;
  want.insert(want.end(), nonce.begin(), nonce.end());
  const std::vector<uint8_t> rest = {
      0x22, 0x11, 0, 0, 0, 0, 0, 0,                            // client id
      1, 0, 1, 0,                                              // min and max version
      8, 7, 6, 5, 4, 3, 2, 1};                                 // instance id
  want.insert(want.end(), rest.begin(), rest.end());
  EXPECT_EQ(*hello, want);

  ServerHandshakeConfig config = Config();
  ServerHandshake server;
  std::vector<uint8_t> reply;
  EXPECT_EQ(Serve(server, config, *hello, &reply).outcome, ServerHandshake::Outcome::kContinue);
  EXPECT_EQ(server.instance_id(), 0x0102030405060708u);
}

// The bytes after HELLO's body must be one non-zero 8-byte instance id: anything else closes
// the connection with a reason that says so.
TEST(HandshakeTest, MalformedInstanceIdClosesTheConnection) {
  ServerHandshakeConfig config = Config();
  HelloRequest hello;
  hello.client_id = 5;
  const std::vector<uint8_t> three(3, 1), zero(8, 0);
  for (const auto* extra : {&three, &zero}) {
    ServerHandshake server;
    std::vector<uint8_t> reply;
    auto step =
        Serve(server, config,
              BuildFrame(FrameHeader{Op::kHello, false, kHelloRequestId}, hello, *extra), &reply);
    EXPECT_EQ(step.outcome, ServerHandshake::Outcome::kClose);
    EXPECT_NE(step.reason.find("instance id"), std::string::npos) << step.reason;
    EXPECT_TRUE(reply.empty());
    EXPECT_FALSE(server.authenticated());
  }
}

TEST(HandshakeTest, NoRdmaOfferWithoutTokenSource) {
  ServerHandshakeConfig config = Config();
  ClientHandshake client(kSecret, 42, "s");
  ServerHandshake server;
  std::vector<uint8_t> reply;
  Serve(server, config, *client.Hello(), &reply);
  Serve(server, config, *client.OnChallenge(reply), &reply);
  auto ok = client.OnAuthReply(reply);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->flags, 0u);
  EXPECT_EQ(server.rdma_token(), 0u);
}

// Per-client credentials (fabric/credential.h): the server learns the role the key proves, and
// the client checks the server's MAC made with its own key.
TEST(HandshakeTest, RolesFollowTheCredential) {
  ServerHandshakeConfig config = Config();
  auto alice = IssueCredential(kSecret, "alice", Role::kClient);
  auto ops = IssueCredential(kSecret, "ops", Role::kAdmin);
  ASSERT_TRUE(alice.ok() && ops.ok());
  struct Case {
    std::string key;
    uint64_t id;
    Role role;
  };
  for (const Case& c : {Case{alice->key, alice->client_id, Role::kClient},
                        Case{ops->key, ops->client_id, Role::kAdmin},
                        Case{kSecret, 5, Role::kAdmin}}) {
    ClientHandshake client(c.key, c.id, "s");
    ServerHandshake server;
    std::vector<uint8_t> reply;
    Serve(server, config, *client.Hello(), &reply);
    EXPECT_EQ(Serve(server, config, *client.OnChallenge(reply), &reply).outcome,
              ServerHandshake::Outcome::kAuthenticated);
    EXPECT_EQ(server.role(), c.role);
    EXPECT_EQ(server.client_id(), c.id);
    auto ok = client.OnAuthReply(reply);
    EXPECT_TRUE(ok.ok()) << ok.status();
  }
  // Alice's key claiming ops' id: refused at AUTH, and the reason names the id.
  ClientHandshake thief(alice->key, ops->client_id, "s");
  ServerHandshake server;
  std::vector<uint8_t> reply;
  Serve(server, config, *thief.Hello(), &reply);
  ServerHandshake::Step step = Serve(server, config, *thief.OnChallenge(reply), &reply);
  EXPECT_EQ(step.outcome, ServerHandshake::Outcome::kReplyThenClose);
  EXPECT_NE(step.reason.find(std::to_string(ops->client_id)), std::string::npos) << step.reason;
  EXPECT_FALSE(server.authenticated());
  auto refused = thief.OnAuthReply(reply);
  EXPECT_EQ(refused.status().code(), StatusCode::kPermissionDenied);
  EXPECT_NE(refused.status().message().find("was not issued from this server's cluster secret"),
            std::string::npos)
      << refused.status();
}

TEST(HandshakeTest, WrongClientSecretIsRefusedAndReported) {
  ServerHandshakeConfig config = Config();
  ClientHandshake client("another-secret-of-some-length", 42, "s");
  ServerHandshake server;
  std::vector<uint8_t> reply;
  Serve(server, config, *client.Hello(), &reply);
  ServerHandshake::Step step = Serve(server, config, *client.OnChallenge(reply), &reply);
  EXPECT_EQ(step.outcome, ServerHandshake::Outcome::kReplyThenClose);
  EXPECT_NE(step.reason.find("wrong secret"), std::string::npos) << step.reason;
  EXPECT_FALSE(server.authenticated());
  auto ok = client.OnAuthReply(reply);
  EXPECT_EQ(ok.status().code(), StatusCode::kPermissionDenied);
}

TEST(HandshakeTest, ReplayedAuthOkFailsTheServerMac) {
  // An AUTH_OK recorded from one login does not authenticate a server in another (fresh
  // nonces): the client refuses it.
  ServerHandshakeConfig config = Config();
  std::vector<uint8_t> recorded;
  {
    ClientHandshake client(kSecret, 42, "s");
    ServerHandshake server;
    std::vector<uint8_t> reply;
    Serve(server, config, *client.Hello(), &reply);
    Serve(server, config, *client.OnChallenge(reply), &recorded);
    ASSERT_TRUE(client.OnAuthReply(recorded).ok());
  }
  ClientHandshake client(kSecret, 42, "impostor:1");
  ServerHandshake server;
  std::vector<uint8_t> reply;
  Serve(server, config, *client.Hello(), &reply);
  ASSERT_TRUE(client.OnChallenge(reply).ok());
  auto ok = client.OnAuthReply(recorded);
  EXPECT_EQ(ok.status().code(), StatusCode::kPermissionDenied);
  EXPECT_NE(ok.status().message().find("impostor:1 failed to authenticate"), std::string::npos)
      << ok.status();
}

TEST(HandshakeTest, UnsupportedVersionIsRefusedWithAReply) {
  ServerHandshakeConfig config = Config();
  HelloRequest hello;
  hello.client_id = 5;
  hello.min_version = kProtocolVersion + 1;
  hello.max_version = kProtocolVersion + 1;
  ServerHandshake server;
  std::vector<uint8_t> reply;
  ServerHandshake::Step step =
      Serve(server, config, BuildFrame(FrameHeader{Op::kHello, false, kHelloRequestId}, hello),
            &reply);
  EXPECT_EQ(step.outcome, ServerHandshake::Outcome::kReplyThenClose);
  // The client side of the same refusal.
  ClientHandshake client(kSecret, 5, "s");
  ASSERT_TRUE(client.Hello().ok());
  auto auth = client.OnChallenge(reply);
  EXPECT_EQ(auth.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(auth.status().message().find("HELLO refused"), std::string::npos) << auth.status();
}

TEST(HandshakeTest, FramesOutOfOrderCloseTheConnection) {
  ServerHandshakeConfig config = Config();
  std::vector<uint8_t> reply;
  {
    ServerHandshake server;  // AUTH first.
    AuthRequest auth;
    auto step = Serve(server, config, BuildFrame(FrameHeader{Op::kAuth, false, 2}, auth), &reply);
    EXPECT_EQ(step.outcome, ServerHandshake::Outcome::kClose);
    EXPECT_EQ(step.reason, "AUTH before HELLO");
    EXPECT_TRUE(reply.empty());
  }
  {
    ServerHandshake server;  // A data op after HELLO.
    ClientHandshake client(kSecret, 9, "s");
    Serve(server, config, *client.Hello(), &reply);
    auto step = Serve(server, config,
                      BuildFrame(FrameHeader{Op::kRead, false, 3}, ReadRequest{1, 0, 8}), &reply);
    EXPECT_EQ(step.outcome, ServerHandshake::Outcome::kClose);
    EXPECT_EQ(step.reason, "READ before AUTH");
  }
  {
    ServerHandshake server;  // A second HELLO after authentication.
    ClientHandshake client(kSecret, 9, "s");
    auto hello = *client.Hello();
    Serve(server, config, hello, &reply);
    Serve(server, config, *client.OnChallenge(reply), &reply);
    ASSERT_TRUE(server.authenticated());
    auto step = Serve(server, config, hello, &reply);
    EXPECT_EQ(step.outcome, ServerHandshake::Outcome::kClose);
  }
}

TEST(HandshakeTest, ClientRejectsBadInputAndWrongReplies) {
  EXPECT_EQ(ClientHandshake(kSecret, 0, "s").Hello().status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ClientHandshake("", 1, "s").Hello().status().code(), StatusCode::kInvalidArgument);
  ClientHandshake early(kSecret, 1, "s");
  EXPECT_EQ(early.OnChallenge({}).status().code(), StatusCode::kInvalidArgument);

  ClientHandshake client(kSecret, 1, "s");
  ASSERT_TRUE(client.Hello().ok());
  // A heartbeat reply where the CHALLENGE belongs.
  ByteBuffer out;
  AppendBody(out, Op::kHeartbeat, kHelloRequestId, HeartbeatResponse{});
  auto r = client.OnChallenge(std::span<const uint8_t>(out.data(), out.size()));
  EXPECT_EQ(r.status().code(), StatusCode::kProtocolError);
  // Garbage bytes.
  std::vector<uint8_t> junk(30, 0xab);
  ClientHandshake client2(kSecret, 1, "s");
  ASSERT_TRUE(client2.Hello().ok());
  EXPECT_FALSE(client2.OnChallenge(junk).ok());
}

}  // namespace
}  // namespace tessera::fabric
