// Integration tests: real `tessera memserver` processes on loopback (port 0), driven over the
// fabric TCP transport and by the `tessera fault` / `tessera status` tools.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <gtest/gtest.h>

#include <algorithm>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/fd.h"
#include "common/subprocess.h"
#include "fabric/control_client.h"
#include "fabric/credential.h"
#include "fabric/transport.h"
#include "fabric/wire.h"
#include "tests/support/test_util.h"

namespace tessera {
namespace {

using fabric::Completion;
using fabric::CompletionKind;
using fabric::ConnectionId;
using fabric::NoticeKind;
using fabric::OpKind;
using fabric::WorkRequest;
using testing::BinDir;
using testing::RunTessera;
using testing::TempDir;

constexpr uint64_t kSlab = 64 << 10;
constexpr int kStartMs = 10000;
const char kSecret[] = "integration-test-secret-0123456789";

// A token file in a temp dir (both the server and the clients read it).
class TokenFile {
 public:
  explicit TokenFile(const std::string& secret) : path_(dir_.path() + "/token") {
    std::ofstream(path_) << secret << "\n";
  }
  const std::string& path() const { return path_; }

 private:
  TempDir dir_;
  std::string path_;
};

// One `tessera memserver` child process on an ephemeral port.
struct Server {
  Subprocess proc;
  uint16_t port = 0;
  uint16_t metrics_port = 0;
  std::string endpoint() const { return "127.0.0.1:" + std::to_string(port); }
};

uint16_t PortOf(const std::string& line) {
  return static_cast<uint16_t>(std::stoi(line.substr(line.rfind(':') + 1)));
}

std::optional<Server> StartServer(const std::string& token_file,
                                  std::vector<std::string> extra = {}) {
  std::vector<std::string> argv = {BinDir() + "/tessera", "memserver", "--port=0",
                                   "--capacity=1M", "--slab_size=64K", "--headroom=0",
                                   "--log_level=warning", "--auth_token_file=" + token_file};
  // Fault injection is off by default; these tests inject faults unless told not to.
  if (std::find(extra.begin(), extra.end(), "--nofault_injection") == extra.end()) {
    argv.push_back("--fault_injection");
  }
  argv.insert(argv.end(), extra.begin(), extra.end());
  auto p = Subprocess::Start(argv, {.capture_stdout = true});
  if (!p.ok()) {
    ADD_FAILURE() << "cannot start memserver: " << p.status();
    return std::nullopt;
  }
  Server s;
  s.proc = std::move(*p);
  auto line = s.proc.WaitForLine("listening on ", Deadline::AfterMs(kStartMs));
  if (!line.ok()) {
    ADD_FAILURE() << "memserver did not print 'listening on' within " << kStartMs
                  << " ms: " << line.status();
    return std::nullopt;
  }
  s.port = PortOf(*line);
  for (const auto& a : extra) {
    if (a.rfind("--metrics_port", 0) == 0) {
      auto m = s.proc.WaitForLine("metrics on ", Deadline::AfterMs(kStartMs));
      if (!m.ok()) {
        ADD_FAILURE() << "no 'metrics on' line: " << m.status();
        return std::nullopt;
      }
      s.metrics_port = PortOf(*m);
    }
  }
  return s;
}

// A client: one TCP transport with one connection (data) and one control client.
struct Client {
  std::unique_ptr<fabric::Transport> t;
  ConnectionId conn = 0;
  std::unique_ptr<fabric::ControlClient> ctl;
  uint64_t next_cookie = 1;

  static Result<Client> Connect(uint16_t port, const std::string& secret, uint64_t client_id) {
    fabric::TransportOptions o;
    o.kind = fabric::TransportKind::kTcp;
    TESSERA_ASSIGN_OR_RETURN(auto t, fabric::Transport::Create(o));
    fabric::ConnectOptions co;
    co.secret = secret;
    co.client_id = client_id;
    co.deadline = Deadline::AfterMs(5000);
    TESSERA_ASSIGN_OR_RETURN(ConnectionId c,
                             t->Connect(fabric::Endpoint{"127.0.0.1", port}, co));
    Client cl;
    cl.t = std::move(t);
    cl.conn = c;
    TESSERA_ASSIGN_OR_RETURN(cl.ctl, fabric::ControlClient::Connect(
                                         fabric::Endpoint{"127.0.0.1", port}, co));
    return cl;
  }

  Result<uint64_t> Alloc() {
    TESSERA_ASSIGN_OR_RETURN(auto r, ctl->AllocSlab({}, Deadline::AfterMs(5000)));
    TESSERA_RETURN_IF_ERROR(t->AddSlab(conn, r));
    return r.slab_id;
  }

  // Posts one op and waits (bounded) for its completion; notices seen meanwhile are kept.
  Status Op(OpKind kind, uint64_t slab, uint64_t offset, void* buf, uint32_t len,
            int timeout_ms = 5000) {
    WorkRequest wr{conn, kind, slab, offset, len, buf, next_cookie++};
    TESSERA_RETURN_IF_ERROR(t->Post(std::span<const WorkRequest>(&wr, 1)));
    Deadline d = Deadline::AfterMs(static_cast<uint64_t>(timeout_ms));
    Completion out[8];
    while (!d.Expired()) {
      size_t n = t->Wait(out, d);
      for (size_t i = 0; i < n; ++i) {
        if (out[i].kind == CompletionKind::kNotice) {
          notices.push_back(out[i].notice);
          continue;
        }
        if (out[i].cookie == wr.cookie) return out[i].status;
      }
    }
    return Timeout("no completion within ", timeout_ms, " ms");
  }

  // Waits until a notice of `kind` arrived (bounded).
  std::optional<fabric::Notice> WaitNotice(NoticeKind kind, int timeout_ms) {
    Deadline d = Deadline::AfterMs(static_cast<uint64_t>(timeout_ms));
    for (;;) {
      for (size_t i = 0; i < notices.size(); ++i) {
        if (notices[i].kind == kind) {
          fabric::Notice n = notices[i];
          notices.erase(notices.begin() + static_cast<long>(i));
          return n;
        }
      }
      if (d.Expired()) return std::nullopt;
      Completion out[8];
      size_t n = t->Wait(out, d);
      for (size_t i = 0; i < n; ++i) {
        if (out[i].kind == CompletionKind::kNotice) notices.push_back(out[i].notice);
      }
    }
  }

  std::vector<fabric::Notice> notices;
};

// The lease test's client process: this test binary started again with
// TESSERA_TEST_LEASE_CHILD=PORT:CLIENT_ID:SLABS. It allocates SLABS slabs, writes one byte in
// each, prints "allocated N" and then waits to be SIGKILLed (it never releases anything).
// Runs from a static initializer, before gtest's main.
int RunLeaseChildIfAsked() {
  const char* spec = std::getenv("TESSERA_TEST_LEASE_CHILD");
  if (spec == nullptr) return 0;
  unsigned port = 0, slabs = 0;
  unsigned long long id = 0;
  if (std::sscanf(spec, "%u:%llu:%u", &port, &id, &slabs) != 3) _exit(3);
  auto c = Client::Connect(static_cast<uint16_t>(port), kSecret, id);
  if (!c.ok()) {
    std::fprintf(stderr, "lease child: %s\n", c.status().ToString().c_str());
    _exit(4);
  }
  for (unsigned i = 0; i < slabs; ++i) {
    auto slab = c->Alloc();
    uint8_t v = 0x77;
    if (!slab.ok() || !c->Op(OpKind::kWrite, *slab, 0, &v, 1).ok()) _exit(5);
  }
  std::printf("allocated %u\n", slabs);
  std::fflush(stdout);
  for (;;) pause();
}
[[maybe_unused]] const int kLeaseChild = RunLeaseChildIfAsked();

// A numeric field of the server's STATS text (fetched with an observer connection).
Result<uint64_t> StatField(uint16_t port, const std::string& key) {
  TESSERA_ASSIGN_OR_RETURN(Client c, Client::Connect(port, kSecret, 0x0b5e77e7));
  TESSERA_ASSIGN_OR_RETURN(std::string text, c.ctl->Stats(Deadline::AfterMs(5000)));
  std::smatch m;
  if (!std::regex_search(text, m, std::regex("(^|\n)" + key + " ([0-9]+)"))) {
    return NotFound("no ", key, " in STATS");
  }
  return std::stoull(m[2].str());
}

// Polls STATS (bounded) until `key` reaches `want`.
void WaitStat(uint16_t port, const std::string& key, uint64_t want, int timeout_ms) {
  Deadline d = Deadline::AfterMs(static_cast<uint64_t>(timeout_ms));
  uint64_t last = 0;
  for (;;) {
    auto v = StatField(port, key);
    ASSERT_TRUE(v.ok()) << v.status();
    last = *v;
    if (last == want) return;
    ASSERT_FALSE(d.Expired()) << key << " is " << last << ", expected " << want << " within "
                              << timeout_ms << " ms";
    poll(nullptr, 0, 20);  // Pace the STATS requests (the deadline bounds the wait).
  }
}

class MemServerIntegrationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = StartServer(token_.path());
    ASSERT_TRUE(s.has_value());
    server_ = std::move(*s);
  }
  Client Connect(uint64_t client_id) {
    auto c = Client::Connect(server_.port, kSecret, client_id);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : Client{};
  }
  testing::CommandOutcome Fault(std::vector<std::string> args) {
    std::vector<std::string> a = {"fault", server_.endpoint()};
    a.insert(a.end(), args.begin(), args.end());
    a.push_back("--auth_token_file=" + token_.path());
    return RunTessera(a, 20000);
  }

  TokenFile token_{kSecret};
  Server server_;
};

TEST_F(MemServerIntegrationTest, WriteThenReadRoundTrip) {
  Client c = Connect(11);
  ASSERT_TRUE(c.t);
  auto slab = c.Alloc();
  ASSERT_TRUE(slab.ok()) << slab.status();
  std::vector<uint8_t> data(4096), back(4096, 0);
  std::mt19937 rng(7);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  ASSERT_TRUE(c.Op(OpKind::kWrite, *slab, 8192, data.data(), 4096).ok());
  ASSERT_TRUE(c.Op(OpKind::kRead, *slab, 8192, back.data(), 4096).ok());
  EXPECT_EQ(data, back);
  // Bounds are checked on the server: the last byte is fine, one past it is not.
  EXPECT_TRUE(c.Op(OpKind::kRead, *slab, kSlab - 1, back.data(), 1).ok());
  EXPECT_EQ(c.Op(OpKind::kRead, *slab, kSlab - 1, back.data(), 2).code(),
            StatusCode::kOutOfRange);
  // Freed slabs are gone.
  ASSERT_TRUE(c.ctl->FreeSlab(*slab, Deadline::AfterMs(5000)).ok());
  EXPECT_EQ(c.Op(OpKind::kRead, *slab, 0, back.data(), 16).code(), StatusCode::kNotFound);
}

TEST_F(MemServerIntegrationTest, SlabsSurviveAReconnectOfTheSameClient) {
  uint64_t slab = 0;
  uint8_t v = 0x5a, r = 0;
  {
    Client c = Connect(21);
    ASSERT_TRUE(c.t);
    slab = *c.Alloc();
    ASSERT_TRUE(c.Op(OpKind::kWrite, slab, 0, &v, 1).ok());
  }
  Client again = Connect(21);
  ASSERT_TRUE(again.t);
  ASSERT_TRUE(again.Op(OpKind::kRead, slab, 0, &r, 1).ok());
  EXPECT_EQ(r, v);
}

TEST_F(MemServerIntegrationTest, WrongSecretIsRefused) {
  auto c = Client::Connect(server_.port, "not-the-secret-at-all-0000", 5);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kPermissionDenied) << c.status();
  // The server goes on.
  Client ok = Connect(6);
  ASSERT_TRUE(ok.t);
  EXPECT_TRUE(ok.ctl->Heartbeat(Deadline::AfterMs(5000)).ok());
}

TEST_F(MemServerIntegrationTest, AnotherClientsSlabIsRefused) {
  // Client credentials (fabric/credential.h): the cluster secret itself is an admin, which may
  // touch any slab (tests/memserver/credentials_integration_test.cc covers both).
  auto a_or = Client::Connect(server_.port, fabric::DeriveKey(kSecret, 100, fabric::Role::kClient), 100);
  auto b_or = Client::Connect(server_.port, fabric::DeriveKey(kSecret, 200, fabric::Role::kClient), 200);
  ASSERT_TRUE(a_or.ok() && b_or.ok());
  Client a = std::move(*a_or), b = std::move(*b_or);
  ASSERT_TRUE(a.t && b.t);
  uint64_t slab = *a.Alloc();
  uint8_t secret_byte = 0x42, got = 0;
  ASSERT_TRUE(a.Op(OpKind::kWrite, slab, 0, &secret_byte, 1).ok());
  EXPECT_EQ(b.Op(OpKind::kRead, slab, 0, &got, 1).code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(b.Op(OpKind::kWrite, slab, 0, &got, 1).code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(b.ctl->FreeSlab(slab, Deadline::AfterMs(5000)).code(),
            StatusCode::kPermissionDenied);
  EXPECT_EQ(got, 0);
  ASSERT_TRUE(a.Op(OpKind::kRead, slab, 0, &got, 1).ok());
  EXPECT_EQ(got, 0x42);
}

// Connects a raw TCP socket to the server.
UniqueFd RawConnect(uint16_t port) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) return UniqueFd();
  return fd;
}

// True when the peer closes `fd` within the deadline (reads and discards anything sent).
bool ClosedByPeer(int fd, int timeout_ms) {
  Deadline d = Deadline::AfterMs(static_cast<uint64_t>(timeout_ms));
  char buf[256];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    int ms = d.RemainingMs();
    if (ms == 0 || ::poll(&p, 1, ms) <= 0) return false;
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n == 0) return true;
    if (n < 0 && errno == ECONNRESET) return true;
    if (n < 0 && errno != EINTR && errno != EAGAIN) return true;
  }
}

TEST_F(MemServerIntegrationTest, GarbageClosesOnlyThatConnection) {
  Client good = Connect(7);
  ASSERT_TRUE(good.t);
  uint64_t slab = *good.Alloc();
  uint8_t v = 9;
  ASSERT_TRUE(good.Op(OpKind::kWrite, slab, 0, &v, 1).ok());

  UniqueFd garbage = RawConnect(server_.port);
  ASSERT_TRUE(garbage.valid());
  const char junk[] = "GET / HTTP/1.1\r\nthis is not a tessera frame at all\r\n\r\n";
  ASSERT_GT(::send(garbage.get(), junk, sizeof(junk), MSG_NOSIGNAL), 0);
  EXPECT_TRUE(ClosedByPeer(garbage.get(), 10000)) << "server kept a garbage connection open";

  // A well-formed READ before any AUTH: unauthenticated peers get nothing, only a close.
  UniqueFd sneaky = RawConnect(server_.port);
  ASSERT_TRUE(sneaky.valid());
  fabric::FrameHeader h;
  h.op = fabric::Op::kRead;
  h.request_id = 1;
  fabric::ReadRequest rr;
  rr.slab_id = slab;
  rr.length = 1;
  auto frame = fabric::BuildFrame(h, rr);
  ASSERT_GT(::send(sneaky.get(), frame.data(), frame.size(), MSG_NOSIGNAL), 0);
  char buf[64];
  pollfd p{sneaky.get(), POLLIN, 0};
  ASSERT_GT(::poll(&p, 1, 10000), 0) << "no reaction to an unauthenticated READ";
  ssize_t n = ::recv(sneaky.get(), buf, sizeof(buf), 0);
  EXPECT_LE(n, 0) << "an unauthenticated peer got " << n << " bytes back";

  // The authenticated client and its data are untouched.
  uint8_t r = 0;
  ASSERT_TRUE(good.Op(OpKind::kRead, slab, 0, &r, 1).ok());
  EXPECT_EQ(r, 9);
  EXPECT_TRUE(server_.proc.running());
}

TEST_F(MemServerIntegrationTest, FaultDelayHoldsRepliesBack) {
  Client c = Connect(8);
  ASSERT_TRUE(c.t);
  uint64_t slab = *c.Alloc();
  auto o = Fault({"delay", "300ms"});
  ASSERT_EQ(o.exit_code, 0) << o.stdout_text;
  EXPECT_NE(o.stdout_text.find("delay 300ms: injected"), std::string::npos) << o.stdout_text;
  uint8_t b = 0;
  uint64_t t0 = MonotonicNs();
  ASSERT_TRUE(c.Op(OpKind::kRead, slab, 0, &b, 1, 10000).ok());
  // A lower bound only: an injected delay can never make the reply come sooner.
  EXPECT_GE(MonotonicNs() - t0, 300ull * 1000000);
  // Control calls are not in the default op mask.
  EXPECT_TRUE(c.ctl->Heartbeat(Deadline::AfterMs(5000)).ok());
  ASSERT_EQ(Fault({"clear"}).exit_code, 0);
  EXPECT_TRUE(c.Op(OpKind::kRead, slab, 0, &b, 1).ok());
}

TEST_F(MemServerIntegrationTest, FaultHangStopsAnswersUntilCleared) {
  Client c = Connect(9);
  ASSERT_TRUE(c.t);
  uint64_t slab = *c.Alloc();
  ASSERT_EQ(Fault({"hang", "--ops=read"}).exit_code, 0);
  uint8_t b = 0;
  EXPECT_EQ(c.Op(OpKind::kRead, slab, 0, &b, 1, 500).code(), StatusCode::kTimeout);
  // Writes are not hung; `clear` goes through even now.
  EXPECT_TRUE(c.Op(OpKind::kWrite, slab, 0, &b, 1).ok());
  ASSERT_EQ(Fault({"clear"}).exit_code, 0);
  EXPECT_TRUE(c.Op(OpKind::kRead, slab, 1, &b, 1).ok());
}

TEST_F(MemServerIntegrationTest, FaultDropClosesTheConnection) {
  Client c = Connect(10);
  ASSERT_TRUE(c.t);
  uint64_t slab = *c.Alloc();
  ASSERT_EQ(Fault({"drop"}).exit_code, 0);
  uint8_t b = 0;
  Status s = c.Op(OpKind::kRead, slab, 0, &b, 1);
  EXPECT_FALSE(s.ok());
  EXPECT_FALSE(c.t->Connected(c.conn)) << s;
  ASSERT_EQ(Fault({"clear"}).exit_code, 0);
  Client again = Connect(10);
  ASSERT_TRUE(again.t);
  EXPECT_TRUE(again.Op(OpKind::kRead, slab, 0, &b, 1).ok());
}

TEST_F(MemServerIntegrationTest, FaultBitflipChangesExactlyTheReportedBits) {
  Client c = Connect(12);
  ASSERT_TRUE(c.t);
  uint64_t slab = *c.Alloc();
  std::vector<uint8_t> data(kSlab), back(kSlab);
  std::mt19937 rng(3);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  ASSERT_TRUE(c.Op(OpKind::kWrite, slab, 0, data.data(), kSlab).ok());
  auto o = Fault({"bitflip", "5", std::to_string(slab)});
  ASSERT_EQ(o.exit_code, 0) << o.stdout_text;
  // "flipped 5 bit(s): slab=S,byte=B,bit=K ..."
  std::regex flip("slab=(\\d+),byte=(\\d+),bit=(\\d+)");
  std::vector<uint8_t> expect = data;
  int flips = 0;
  for (std::sregex_iterator it(o.stdout_text.begin(), o.stdout_text.end(), flip), end; it != end;
       ++it) {
    EXPECT_EQ(std::stoull((*it)[1]), slab);
    expect[std::stoull((*it)[2])] ^= static_cast<uint8_t>(1u << std::stoi((*it)[3]));
    ++flips;
  }
  EXPECT_EQ(flips, 5) << o.stdout_text;
  ASSERT_TRUE(c.Op(OpKind::kRead, slab, 0, back.data(), kSlab).ok());
  EXPECT_EQ(back, expect);
  EXPECT_NE(back, data);
}

TEST_F(MemServerIntegrationTest, FaultRefuseAllocThenClear) {
  Client c = Connect(13);
  ASSERT_TRUE(c.t);
  ASSERT_EQ(Fault({"refuse-alloc"}).exit_code, 0);
  auto r = c.ctl->AllocSlab({}, Deadline::AfterMs(5000));
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted) << r.status();
  ASSERT_EQ(Fault({"clear"}).exit_code, 0);
  EXPECT_TRUE(c.Alloc().ok());
}

TEST(MemServerProcessTest, FaultsAreRefusedUnlessEnabled) {
  TokenFile token{kSecret};
  auto server = StartServer(token.path(), {"--nofault_injection"});
  ASSERT_TRUE(server.has_value());
  for (std::vector<std::string> action : {std::vector<std::string>{"crash"}, {"bitflip", "1"}}) {
    std::vector<std::string> a = {"fault", server->endpoint()};
    a.insert(a.end(), action.begin(), action.end());
    a.push_back("--auth_token_file=" + token.path());
    auto o = RunTessera(a, 20000);
    EXPECT_NE(o.exit_code, 0) << action[0] << " was accepted by a server without --fault_injection";
  }
  EXPECT_FALSE(server->proc.Poll()) << "a refused crash fault still killed the server";
}

TEST_F(MemServerIntegrationTest, FaultCrashKillsTheServer) {
  auto o = Fault({"crash"});
  EXPECT_EQ(o.exit_code, 0) << o.stdout_text;
  auto st = server_.proc.Wait(Deadline::AfterMs(10000));
  ASSERT_TRUE(st.ok()) << "server still running after crash: " << st.status();
  EXPECT_TRUE(WIFSIGNALED(*st) && WTERMSIG(*st) == SIGABRT) << "wait status " << *st;
}

TEST_F(MemServerIntegrationTest, FaultEvictSendsANoticeThenFrees) {
  Client c = Connect(14);
  ASSERT_TRUE(c.t);
  uint64_t slab = *c.Alloc();
  ASSERT_EQ(Fault({"evict", "1"}).exit_code, 0);
  auto n = c.WaitNotice(NoticeKind::kSlabEvicting, 10000);
  ASSERT_TRUE(n.has_value()) << "no eviction notice";
  EXPECT_EQ(n->slab_id, slab);
  EXPECT_EQ(n->deadline_ms, 2000u);  // The default --eviction_grace.
}

TEST_F(MemServerIntegrationTest, SigtermNotifiesClientsAndExitsZero) {
  Client c = Connect(15);
  ASSERT_TRUE(c.t);
  ASSERT_TRUE(c.ctl->Heartbeat(Deadline::AfterMs(5000)).ok());
  ASSERT_TRUE(server_.proc.Signal(SIGTERM).ok());
  auto n = c.WaitNotice(NoticeKind::kShuttingDown, 10000);
  EXPECT_TRUE(n.has_value()) << "no shutting-down notice";
  auto st = server_.proc.Wait(Deadline::AfterMs(10000));
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 0) << "wait status " << *st;
}

TEST_F(MemServerIntegrationTest, StatusListsReachableAndUnreachableServers) {
  TempDir dir;
  std::string cluster = dir.path() + "/cluster";
  // Port 1 on loopback: nothing listens there.
  std::ofstream(cluster) << "# test cluster\n" << server_.endpoint() << " rack=r1\n"
                         << "127.0.0.1:1 rack=r2\n";
  auto o = RunTessera({"status", cluster, "--timeout=3s", "--auth_token_file=" + token_.path()},
                      30000);
  EXPECT_EQ(o.exit_code, 1) << o.stdout_text;  // One server is down.
  EXPECT_NE(o.stdout_text.find(server_.endpoint()), std::string::npos) << o.stdout_text;
  EXPECT_NE(o.stdout_text.find("reachable"), std::string::npos);
  EXPECT_NE(o.stdout_text.find("unreachable"), std::string::npos);
  EXPECT_NE(o.stdout_text.find("refused"), std::string::npos) << o.stdout_text;
  auto j = RunTessera({"status", server_.endpoint(), "--json",
                       "--auth_token_file=" + token_.path()}, 30000);
  EXPECT_EQ(j.exit_code, 0) << j.stdout_text;
  auto rows = testing::JsonLines(j.stdout_text);
  ASSERT_EQ(rows.size(), 1u) << j.stdout_text;
  EXPECT_EQ(rows[0].value("slabs_free", -1), 16) << rows[0];
}

TEST(MemServerProcessTest, EvictsUnderASimulatedMemoryDrop) {
  TokenFile token(kSecret);
  TempDir dir;
  const std::string meminfo = dir.path() + "/meminfo";
  auto write_meminfo = [&](uint64_t kb) {
    std::ofstream(meminfo + ".tmp") << "MemTotal: 99999999 kB\nMemAvailable: " << kb << " kB\n";
    std::rename((meminfo + ".tmp").c_str(), meminfo.c_str());  // Atomic for the reader.
  };
  write_meminfo(64 << 10);  // 64 MiB available, headroom 16 MiB: plenty.
  auto s = StartServer(token.path(), {"--headroom=16M", "--meminfo_path=" + meminfo,
                                      "--monitor_interval=20ms", "--eviction_grace=300ms"});
  ASSERT_TRUE(s.has_value());
  auto c = Client::Connect(s->port, kSecret, 31);
  ASSERT_TRUE(c.ok()) << c.status();
  uint64_t a = *c->Alloc(), b = *c->Alloc();
  uint8_t v = 1;
  ASSERT_TRUE(c->Op(OpKind::kWrite, a, 0, &v, 1).ok());
  ASSERT_TRUE(c->Op(OpKind::kWrite, b, 0, &v, 1).ok());

  // The host runs short: 1 MiB under the headroom, more than both slabs can give back.
  write_meminfo((16 << 10) - 1024);
  auto n1 = c->WaitNotice(NoticeKind::kSlabEvicting, 10000);
  ASSERT_TRUE(n1.has_value()) << "no eviction notice after the memory drop";
  EXPECT_EQ(n1->deadline_ms, 300u);
  EXPECT_TRUE(n1->slab_id == a || n1->slab_id == b);
  auto n2 = c->WaitNotice(NoticeKind::kSlabEvicting, 10000);
  ASSERT_TRUE(n2.has_value()) << "only one eviction notice";
  EXPECT_NE(n1->slab_id, n2->slab_id);
  // After each deadline the slab is gone. Poll (bounded) until the monitor freed both.
  Deadline d = Deadline::AfterMs(10000);
  Status after_a, after_b;
  uint8_t r = 0;
  while (!d.Expired()) {
    after_a = c->Op(OpKind::kRead, a, 0, &r, 1);
    after_b = c->Op(OpKind::kRead, b, 0, &r, 1);
    if (after_a.code() == StatusCode::kNotFound && after_b.code() == StatusCode::kNotFound) break;
    c->WaitNotice(NoticeKind::kShuttingDown, 20);  // Paces the poll; no such notice comes.
  }
  EXPECT_EQ(after_a.code(), StatusCode::kNotFound) << after_a;
  EXPECT_EQ(after_b.code(), StatusCode::kNotFound) << after_b;
  // While short of memory the server lends nothing new.
  EXPECT_EQ(c->ctl->AllocSlab({}, Deadline::AfterMs(5000)).status().code(),
            StatusCode::kResourceExhausted);
  auto stats = c->ctl->Stats(Deadline::AfterMs(5000));
  ASSERT_TRUE(stats.ok());
  EXPECT_NE(stats->find("evictions 2\n"), std::string::npos) << *stats;
  EXPECT_NE(stats->find("slabs_allocated 0\n"), std::string::npos) << *stats;
}

TEST(MemServerProcessTest, MetricsEndpointIsScraped) {
  TokenFile token(kSecret);
  auto s = StartServer(token.path(), {"--metrics_port=0"});
  ASSERT_TRUE(s.has_value());
  ASSERT_NE(s->metrics_port, 0);
  auto c = Client::Connect(s->port, kSecret, 41);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(c->Alloc().ok());
  UniqueFd fd = RawConnect(s->metrics_port);
  ASSERT_TRUE(fd.valid());
  const char req[] = "GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n";
  ASSERT_GT(::send(fd.get(), req, sizeof(req) - 1, MSG_NOSIGNAL), 0);
  std::string body;
  Deadline d = Deadline::AfterMs(10000);
  char buf[4096];
  for (;;) {
    pollfd p{fd.get(), POLLIN, 0};
    ASSERT_GT(::poll(&p, 1, d.RemainingMs()), 0) << "metrics endpoint did not answer";
    ssize_t n = ::recv(fd.get(), buf, sizeof(buf), 0);
    if (n <= 0) break;
    body.append(buf, static_cast<size_t>(n));
  }
  EXPECT_EQ(body.rfind("HTTP/1.1 200 OK", 0), 0u) << body;
  EXPECT_NE(body.find("tessera_memserver_ops_total{op=\"alloc\"} 1\n"), std::string::npos) << body;
  EXPECT_NE(body.find("tessera_memserver_slabs{state=\"allocated\"} 1\n"), std::string::npos);
  EXPECT_NE(body.find("tessera_memserver_capacity_bytes 1048576\n"), std::string::npos);
}

TEST(MemServerProcessTest, BadFlagsExitTwo) {
  for (std::vector<std::string> args : std::vector<std::vector<std::string>>{
           {"memserver", "--capacity=lots"},
           {"memserver", "--slab_size=1000"},
           {"memserver", "--capacity=1M", "--slab_size=3M"},
           {"memserver", "--transport=pigeon"},
           {"memserver", "--port=70000"},
           {"memserver", "--no_such_flag"},
           {"memserver", "extra-argument"},
           {"memserver", "--huge_pages", "--slab_size=1M"},
           {"fault", "127.0.0.1:1", "explode"},
           {"fault", "127.0.0.1:1", "delay"},
           {"fault", "not-an-endpoint", "clear"},
           {"status"},
           {"status", "no-such-file-or-endpoint"},
       }) {
    auto o = RunTessera(args, 20000);
    std::string joined;
    for (const auto& a : args) joined += a + " ";
    EXPECT_EQ(o.exit_code, 2) << joined;
  }
}

TEST(MemServerProcessTest, RdmaWithoutADeviceIsAClearError) {
  if (fabric::ProbeRdma().ok()) GTEST_SKIP() << "this machine has RDMA";
  TokenFile token(kSecret);
  auto o = testing::RunCommand({BinDir() + "/tessera", "memserver", "--port=0", "--capacity=1M",
                                "--slab_size=64K", "--transport=rdma",
                                "--auth_token_file=" + token.path()},
                               20000);
  EXPECT_EQ(o.exit_code, 1);
  EXPECT_EQ(o.stdout_text.find("listening on"), std::string::npos);
}


// Leases (--orphan_grace): a SIGKILLed client's slabs are freed after the grace; a client that
// stays connected, and one that reconnects within the grace, keep theirs.
TEST(MemServerProcessTest, OrphanedSlabsAreFreedAfterTheGraceOthersAreKept) {
  TokenFile token(kSecret);
  auto server = StartServer(token.path(), {"--orphan_grace=1500ms", "--monitor_interval=50ms"});
  ASSERT_TRUE(server.has_value());
  const uint16_t port = server->port;
  EXPECT_EQ(*StatField(port, "orphan_grace_ms"), 1500u);

  // The client process that dies.
  auto child = Subprocess::Start(
      {"/proc/self/exe"},
      {.capture_stdout = true,
       .extra_env = {"TESSERA_TEST_LEASE_CHILD=" + std::to_string(port) + ":41:3"}});
  ASSERT_TRUE(child.ok()) << child.status();
  auto line = child->WaitForLine("allocated ", Deadline::AfterMs(10000));
  ASSERT_TRUE(line.ok()) << "lease child: " << line.status();

  // A client that stays connected, and one that drops its connection and comes back at once.
  auto stay = Client::Connect(port, kSecret, 42);
  ASSERT_TRUE(stay.ok()) << stay.status();
  auto stay_slab = stay->Alloc();
  ASSERT_TRUE(stay_slab.ok());
  uint8_t a = 0xa1, b = 0xb2, r = 0;
  ASSERT_TRUE(stay->Op(OpKind::kWrite, *stay_slab, 100, &a, 1).ok());
  uint64_t back_slab = 0;
  {
    auto first = Client::Connect(port, kSecret, 43);
    ASSERT_TRUE(first.ok());
    back_slab = *first->Alloc();
    ASSERT_TRUE(first->Op(OpKind::kWrite, back_slab, 200, &b, 1).ok());
  }  // Disconnected: its countdown starts.
  auto back = Client::Connect(port, kSecret, 43);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*StatField(port, "slabs_allocated"), 5u);

  ASSERT_TRUE(child->Signal(SIGKILL).ok());
  ASSERT_TRUE(child->Wait(Deadline::AfterMs(5000)).ok());
  // Orphaned until the grace runs out, then freed (bounded poll of STATS).
  WaitStat(port, "orphan_slabs_reclaimed", 3, 20000);
  EXPECT_EQ(*StatField(port, "orphan_owners_reclaimed"), 1u);
  EXPECT_EQ(*StatField(port, "slabs_allocated"), 2u);
  EXPECT_EQ(*StatField(port, "orphaned_owners"), 0u);
  // More than the grace has passed since client 43 disconnected, but it came back in time.
  ASSERT_TRUE(stay->Op(OpKind::kRead, *stay_slab, 100, &r, 1).ok());
  EXPECT_EQ(r, a);
  ASSERT_TRUE(back->Op(OpKind::kRead, back_slab, 200, &r, 1).ok());
  EXPECT_EQ(r, b);

  // Client 43 leaves for good (both its connections): its slab goes too, client 42's stays.
  back->t.reset();
  back->ctl.reset();
  WaitStat(port, "orphan_slabs_reclaimed", 4, 20000);
  EXPECT_EQ(*StatField(port, "slabs_allocated"), 1u);
  ASSERT_TRUE(stay->Op(OpKind::kRead, *stay_slab, 100, &r, 1).ok());
  EXPECT_EQ(r, a);
}

TEST(MemServerProcessTest, OrphanGraceZeroNeverFreesAndBadValuesAreRefused) {
  TokenFile token(kSecret);
  auto bad = testing::RunCommand({BinDir() + "/tessera", "memserver", "--port=0",
                                  "--orphan_grace=soon", "--auth_token_file=" + token.path()},
                                 20000);
  EXPECT_EQ(bad.exit_code, 2) << bad.stdout_text;
  auto server = StartServer(token.path(), {"--orphan_grace=0", "--monitor_interval=20ms"});
  ASSERT_TRUE(server.has_value());
  EXPECT_EQ(*StatField(server->port, "orphan_grace_ms"), 0u);
  {
    auto c = Client::Connect(server->port, kSecret, 51);
    ASSERT_TRUE(c.ok());
    ASSERT_TRUE(c->Alloc().ok());
  }
  // Two seconds of the server's own clock (uptime_s, bounded poll) with the monitor ticking
  // every 20 ms: with the lease off, the disconnected client keeps its slab.
  const uint64_t t0 = *StatField(server->port, "uptime_s");
  Deadline d = Deadline::AfterMs(10000);
  while (*StatField(server->port, "uptime_s") < t0 + 2) {
    ASSERT_FALSE(d.Expired()) << "server uptime does not advance";
    poll(nullptr, 0, 50);
  }
  auto again = Client::Connect(server->port, kSecret, 51);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*StatField(server->port, "slabs_allocated"), 1u);
  EXPECT_EQ(*StatField(server->port, "orphan_slabs_reclaimed"), 0u);
}

}  // namespace
}  // namespace tessera
