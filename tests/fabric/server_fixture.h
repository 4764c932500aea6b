// The fabric tests' in-process server (fabric::Server over an in-memory TestHandler), the
// bounded waits for a transport's completions, and a raw peer that speaks the wire by hand.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/fd.h"
#include "common/logging.h"
#include "fabric/auth.h"
#include "fabric/wire.h"
#include "fabric/server.h"
#include "fabric/transport.h"
#include "tests/fabric/test_handler.h"

namespace tessera::fabric::testing {

inline constexpr char kSecret[] = "conformance-test-secret-0123456789";
inline constexpr uint64_t kClientA = 1001;
inline constexpr uint64_t kClientB = 2002;

// Waits (bounded) until `n` data completions arrived; fails the test with a message otherwise.
inline std::vector<Completion> WaitData(Transport& t, size_t n, int timeout_ms = 10000) {
  std::vector<Completion> got;
  Deadline d = Deadline::AfterMs(timeout_ms);
  Completion buf[64];
  while (got.size() < n) {
    size_t k = t.Wait(buf, d);
    if (k == 0) {
      ADD_FAILURE() << "only " << got.size() << " of " << n << " completions within "
                    << timeout_ms << " ms";
      break;
    }
    for (size_t i = 0; i < k; ++i) {
      if (buf[i].kind == CompletionKind::kData) got.push_back(buf[i]);
    }
  }
  return got;
}

// Waits (bounded) for the next notice; data completions seen meanwhile go to `data` if given.
inline Completion WaitNotice(Transport& t, std::vector<Completion>* data = nullptr,
                      int timeout_ms = 10000) {
  Deadline d = Deadline::AfterMs(timeout_ms);
  Completion buf[1];
  while (true) {
    size_t k = t.Wait(buf, d);
    if (k == 0) {
      ADD_FAILURE() << "no notice within " << timeout_ms << " ms";
      return Completion{};
    }
    if (buf[0].kind == CompletionKind::kNotice) return buf[0];
    if (data) data->push_back(buf[0]);
  }
}

class ServerFixture {
 public:
  // `before_start` runs on the created server before Start() (RegisterService, say).
  explicit ServerFixture(bool rdma = false, const std::function<void(ServerOptions&)>& tune = {},
                         const std::function<void(Server&)>& before_start = {}) {
    ServerOptions o;
    if (tune) tune(o);
    o.secret = kSecret;
    o.slab_size = handler_.slab_size();
    o.capacity_bytes = handler_.pool_size();
    o.enable_rdma = rdma;
    auto s = Server::Create(o, &handler_);
    TCHECK(s.ok()) << s.status();
    server_ = std::move(*s);
    auto reg = server_->RegisterMemory(handler_.pool(), handler_.pool_size());
    TCHECK(reg.ok()) << reg.status();
    handler_.SetRegistration(*reg);
    if (before_start) before_start(*server_);
    TCHECK_OK(server_->Start());
  }
  Endpoint endpoint() const { return Endpoint{"127.0.0.1", server_->port()}; }
  TestHandler handler_;
  std::unique_ptr<Server> server_;
};

// A blocking socket client that speaks the wire protocol by hand.
class RawPeer {
 public:
  explicit RawPeer(uint16_t port) {
    fd_.Reset(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    TCHECK(::connect(fd_.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  }
  void Send(std::span<const uint8_t> b) {
    TCHECK(::send(fd_.get(), b.data(), b.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(b.size()));
  }
  // Reads one frame; nullopt when the server closed the connection. Bounded by 5 s.
  std::optional<std::vector<uint8_t>> Recv() {
    std::vector<uint8_t> b(kHeaderSize);
    if (!RecvAll(b.data(), kHeaderSize)) return std::nullopt;
    uint32_t len = GetU32(b.data() + 20);
    b.resize(kHeaderSize + len);
    if (!RecvAll(b.data() + kHeaderSize, len)) return std::nullopt;
    return b;
  }
  // True when the server closed the connection (EOF) within 5 s.
  bool ClosedByServer() {
    uint8_t tmp[256];
    Deadline d = Deadline::AfterMs(5000);
    while (true) {
      pollfd p{fd_.get(), POLLIN, 0};
      if (::poll(&p, 1, d.RemainingMs()) <= 0) return false;
      ssize_t n = ::recv(fd_.get(), tmp, sizeof(tmp), 0);
      if (n <= 0) return true;
    }
  }
  void Handshake(const std::string& secret, uint64_t client_id) {
    HandshakeTranscript t;
    t.client_id = client_id;
    TCHECK_OK(RandomBytes(t.client_nonce));
    HelloRequest h;
    h.client_nonce = t.client_nonce;
    h.client_id = client_id;
    Send(BuildFrame(FrameHeader{Op::kHello, false, 1}, h));
    auto ch = Recv();
    TCHECK(ch.has_value());
    auto f = ParseFrame(*ch, Direction::kResponse);
    TCHECK(f.ok()) << f.status();
    t.server_nonce = std::get<ChallengeResponse>(f->body).server_nonce;
    t.server_id = std::get<ChallengeResponse>(f->body).server_id;
    Send(BuildFrame(FrameHeader{Op::kAuth, false, 2}, AuthRequest{ClientMac(secret, t)}));
    auto ok = Recv();
    TCHECK(ok.has_value());
    TCHECK(ParseFrame(*ok, Direction::kResponse).ok());
  }
  int fd() const { return fd_.get(); }

 private:
  bool RecvAll(uint8_t* p, size_t n) {
    size_t off = 0;
    Deadline d = Deadline::AfterMs(5000);
    while (off < n) {
      pollfd pf{fd_.get(), POLLIN, 0};
      if (::poll(&pf, 1, d.RemainingMs()) <= 0) return false;
      ssize_t k = ::recv(fd_.get(), p + off, n - off, 0);
      if (k <= 0) return false;
      off += static_cast<size_t>(k);
    }
    return true;
  }
  UniqueFd fd_;
};

}  // namespace tessera::fabric::testing
