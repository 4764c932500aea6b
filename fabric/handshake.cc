// The handshake's two halves (see fabric/handshake.h).
#include "fabric/handshake.h"

#include <string>

#include "common/coding.h"
#include "fabric/credential.h"
#include "fabric/frame_builder.h"
#include "fabric/socket.h"

namespace tessera::fabric {

ClientHandshake::ClientHandshake(std::string secret, uint64_t client_id, std::string peer,
                                 uint64_t instance_id)
    : secret_(std::move(secret)), peer_(std::move(peer)) {
  transcript_.client_id = client_id;
  transcript_.instance_id = instance_id;
}

Result<std::vector<uint8_t>> ClientHandshake::Hello() {
  if (state_ != State::kStart) return InvalidArgument("HELLO already sent");
  if (transcript_.client_id == 0) return InvalidArgument("client_id must be non-zero");
  if (secret_.empty()) return InvalidArgument("secret must be non-empty");
  TESSERA_RETURN_IF_ERROR(RandomBytes(transcript_.client_nonce));
  HelloRequest hello;
  hello.client_nonce = transcript_.client_nonce;
  hello.client_id = transcript_.client_id;
  state_ = State::kSentHello;
  if (transcript_.instance_id == 0) {
    return BuildFrame(FrameHeader{Op::kHello, false, kHelloRequestId}, hello);
  }
  // HELLO with its optional trailing instance id.
  uint8_t instance[8];
  SpanWriter(instance, sizeof instance).PutFixed64(transcript_.instance_id);
  return BuildFrame(FrameHeader{Op::kHello, false, kHelloRequestId}, hello, instance);
}

Result<std::vector<uint8_t>> ClientHandshake::OnChallenge(std::span<const uint8_t> bytes) {
  if (state_ != State::kSentHello) return InvalidArgument("CHALLENGE before HELLO");
  TESSERA_ASSIGN_OR_RETURN(ParsedFrame f, ParseFrame(bytes, Direction::kResponse));
  if (f.header.op != Op::kHello || f.header.request_id != kHelloRequestId) {
    return ProtocolError("expected CHALLENGE, got ", OpName(f.header.op));
  }
  if (f.header.status != StatusCode::kOk) {
    return StatusFromErrorFrame(f).WithContext("HELLO refused");
  }
  const auto& ch = std::get<ChallengeResponse>(f.body);
  transcript_.server_nonce = ch.server_nonce;
  transcript_.server_id = ch.server_id;
  AuthRequest auth;
  auth.client_mac = ClientMac(secret_, transcript_);
  state_ = State::kSentAuth;
  return BuildFrame(FrameHeader{Op::kAuth, false, kAuthRequestId}, auth);
}

Result<AuthOkResponse> ClientHandshake::OnAuthReply(std::span<const uint8_t> bytes) {
  if (state_ != State::kSentAuth) return InvalidArgument("AUTH_OK before AUTH");
  TESSERA_ASSIGN_OR_RETURN(ParsedFrame f, ParseFrame(bytes, Direction::kResponse));
  if (f.header.op != Op::kAuth || f.header.request_id != kAuthRequestId) {
    return ProtocolError("expected AUTH_OK, got ", OpName(f.header.op));
  }
  if (f.header.status != StatusCode::kOk) return StatusFromErrorFrame(f);
  AuthOkResponse ok = std::get<AuthOkResponse>(f.body);
  if (!MacEqual(ok.server_mac, ServerMac(secret_, transcript_))) {
    return PermissionDenied("server ", peer_,
                            " failed to authenticate: its MAC does not match our secret");
  }
  state_ = State::kDone;
  return ok;
}

Result<ClientLogin> RunClientHandshake(int fd, const Endpoint& endpoint,
                                       const ConnectOptions& options) {
  ClientHandshake hs(options.secret, options.client_id, endpoint.ToString(), options.instance_id);
  const Deadline deadline = options.deadline;
  auto with_context = [&](Status st) {
    return st.WithContext("handshake with " + endpoint.ToString());
  };
  TESSERA_ASSIGN_OR_RETURN(std::vector<uint8_t> hello, hs.Hello());
  Status st = SendAll(fd, hello, deadline);
  if (!st.ok()) return with_context(st);
  auto reply = RecvFrame(fd, Direction::kResponse, deadline);
  if (!reply.ok()) return with_context(reply.status());
  TESSERA_ASSIGN_OR_RETURN(std::vector<uint8_t> auth, hs.OnChallenge(*reply));
  st = SendAll(fd, auth, deadline);
  if (!st.ok()) return with_context(st);
  reply = RecvFrame(fd, Direction::kResponse, deadline);
  if (!reply.ok()) return with_context(reply.status());
  TESSERA_ASSIGN_OR_RETURN(AuthOkResponse ok, hs.OnAuthReply(*reply));
  return ClientLogin{hs.transcript().server_id, std::move(ok)};
}

Result<ClientSocket> ConnectAndAuthenticate(const Endpoint& endpoint,
                                            const ConnectOptions& options) {
  if (options.client_id == 0) return InvalidArgument("client_id must be non-zero");
  if (options.secret.empty()) return InvalidArgument("secret must be non-empty");
  TESSERA_ASSIGN_OR_RETURN(UniqueFd fd, ConnectTcp(endpoint, options.deadline));
  TESSERA_ASSIGN_OR_RETURN(ClientLogin login, RunClientHandshake(fd.get(), endpoint, options));
  return ClientSocket{std::move(fd), std::move(login)};
}

ServerHandshake::Step ServerHandshake::OnFrame(const ParsedFrame& f,
                                               const ServerHandshakeConfig& config,
                                               ByteBuffer& out) {
  const FrameHeader& h = f.header;
  switch (state_) {
    case State::kHello: {
      if (h.op != Op::kHello) return {Outcome::kClose, OpName(h.op) + " before HELLO"};
      const auto& hello = std::get<HelloRequest>(f.body);
      if (hello.min_version > kProtocolVersion || hello.max_version < kProtocolVersion) {
        AppendError(out, Op::kHello, h.request_id,
                    Unsupported("client speaks protocol versions ", hello.min_version, "..",
                                hello.max_version, "; this server speaks ", kProtocolVersion));
        return {Outcome::kReplyThenClose, ""};
      }
      if (!f.data.empty()) {
        // The optional instance id (fabric/auth.h, "Slab ownership"); the size rule allows
        // 0..8 trailing bytes.
        SpanReader in(f.data);
        const uint64_t instance_id = in.GetFixed64("instance id");
        Status st = in.Finish("HELLO");
        if (!st.ok() || instance_id == 0) {
          return {Outcome::kClose, "HELLO: trailing bytes are not a non-zero 8-byte instance id" +
                                       (st.ok() ? std::string() : " (" + st.message() + ")")};
        }
        transcript_.instance_id = instance_id;
      }
      transcript_.client_nonce = hello.client_nonce;
      transcript_.client_id = hello.client_id;
      transcript_.server_id = config.server_id;
      Status st = RandomBytes(transcript_.server_nonce);
      if (!st.ok()) {
        AppendError(out, Op::kHello, h.request_id, st);
        return {Outcome::kReplyThenClose, "no random bytes for the challenge: " + st.message()};
      }
      ChallengeResponse ch;
      ch.server_nonce = transcript_.server_nonce;
      ch.server_id = config.server_id;
      AppendBody(out, Op::kHello, h.request_id, ch);
      state_ = State::kAuth;
      return {Outcome::kContinue, ""};
    }
    case State::kAuth: {
      if (h.op != Op::kAuth) return {Outcome::kClose, OpName(h.op) + " before AUTH"};
      const auto& auth = std::get<AuthRequest>(f.body);
      std::optional<VerifiedClient> who = VerifyClientMac(config.secret, transcript_, auth.client_mac);
      if (!who) {
        AppendError(out, Op::kAuth, h.request_id,
                    PermissionDenied("authentication failed: the credential for client id ",
                                     transcript_.client_id,
                                     " was not issued from this server's cluster secret (a "
                                     "wrong, forged or other-cluster token, or another "
                                     "client's id)"));
        return {Outcome::kReplyThenClose,
                "client_id " + std::to_string(transcript_.client_id) +
                    ": authentication failed (wrong secret or credential)"};
      }
      if (config.admit) {
        Status admitted = config.admit(transcript_.client_id);
        if (!admitted.ok()) {
          AppendError(out, Op::kAuth, h.request_id, admitted);
          return {Outcome::kReplyThenClose,
                  "client_id " + std::to_string(transcript_.client_id) + ": " + admitted.message()};
        }
      }
      role_ = who->role;
      AuthOkResponse ok;
      ok.server_mac = ServerMac(who->key, transcript_);
      ok.slab_size = config.slab_size;
      ok.capacity_bytes = config.capacity_bytes;
      if (config.issue_rdma_token) {
        ok.flags = AuthOkResponse::kRdmaOffered;
        ok.rdma_port = config.rdma_port;
        ok.rdma_host = config.rdma_host;
        rdma_token_ = config.issue_rdma_token();
        ok.rdma_token = rdma_token_;
      }
      AppendBody(out, Op::kAuth, h.request_id, ok);
      state_ = State::kDone;
      return {Outcome::kAuthenticated, ""};
    }
    case State::kDone:
      break;
  }
  return {Outcome::kClose, OpName(h.op) + " after authentication"};
}

}  // namespace tessera::fabric
