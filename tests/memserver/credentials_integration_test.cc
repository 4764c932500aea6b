// Per-client credentials on real `tessera memserver` processes (issue 15): credentials made with
// the real `tessera token` tool, two clients that cannot touch each other's slabs, admins that
// can, fault injection refused to clients, damaged and forged credentials, and the rule that
// the built-in development secret is served on loopback only.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/subprocess.h"
#include "fabric/control_client.h"
#include "fabric/credential.h"
#include "fabric/transport.h"
#include "memserver/fault_state.h"
#include "tests/support/test_util.h"

namespace tessera {
namespace {

using fabric::Completion;
using fabric::CompletionKind;
using fabric::ConnectionId;
using fabric::OpKind;
using fabric::WorkRequest;
using testing::BinDir;
using testing::RunTessera;
using testing::TempDir;

constexpr int kStartMs = 10000;
constexpr uint32_t kLen = 4096;

// Runs `tessera ARGS...` with stderr folded into stdout (the tools' errors go to stderr).
testing::CommandOutcome RunTesseraWithStderr(std::vector<std::string> args, int timeout_ms = 20000) {
  std::vector<std::string> argv = {"/bin/sh", "-c", "exec \"$0\" \"$@\" 2>&1",
                                   BinDir() + "/tessera"};
  argv.insert(argv.end(), args.begin(), args.end());
  return testing::RunCommand(argv, timeout_ms);
}

struct Server {
  Subprocess proc;
  uint16_t port = 0;
  std::string output;  // Everything it printed (stdout + stderr) up to `listening on`.
  std::string endpoint() const { return "127.0.0.1:" + std::to_string(port); }
};

// Starts `tessera memserver ARGS` with stderr folded into stdout; nullopt (and the output so
// far in *failure) when it does not print `listening on` in time.
std::optional<Server> StartServer(std::vector<std::string> args, std::string* failure = nullptr) {
  std::vector<std::string> argv = {"/bin/sh", "-c", "exec \"$0\" \"$@\" 2>&1",
                                   BinDir() + "/tessera", "memserver", "--port=0",
                                   "--capacity=1M", "--slab_size=64K", "--headroom=0"};
  argv.insert(argv.end(), args.begin(), args.end());
  auto p = Subprocess::Start(argv, {.capture_stdout = true});
  if (!p.ok()) {
    ADD_FAILURE() << p.status();
    return std::nullopt;
  }
  Server s;
  s.proc = std::move(*p);
  Deadline d = Deadline::AfterMs(kStartMs);
  for (;;) {
    auto line = s.proc.ReadLine(d);
    if (!line.ok()) {
      if (failure != nullptr) *failure = s.output;
      return std::nullopt;
    }
    s.output += *line + "\n";
    if (line->rfind("listening on ", 0) == 0) {
      s.port = static_cast<uint16_t>(std::stoi(line->substr(line->rfind(':') + 1)));
      return s;
    }
  }
}

// One client: a TCP transport connection for data and a control client, both authenticated
// with `cred` (its key, and its id unless `claim_id` overrides it).
struct Client {
  std::unique_ptr<fabric::Transport> t;
  ConnectionId conn = 0;
  std::unique_ptr<fabric::ControlClient> ctl;
  uint64_t next_cookie = 1;

  static Result<Client> Connect(uint16_t port, const fabric::Credential& cred,
                                uint64_t claim_id = 0) {
    fabric::TransportOptions o;
    o.kind = fabric::TransportKind::kTcp;
    TESSERA_ASSIGN_OR_RETURN(auto t, fabric::Transport::Create(o));
    fabric::ConnectOptions co;
    co.secret = cred.key;
    co.client_id = claim_id != 0 ? claim_id : (cred.client_id != 0 ? cred.client_id : 77);
    co.deadline = Deadline::AfterMs(5000);
    const fabric::Endpoint ep{"127.0.0.1", port};
    Client c;
    TESSERA_ASSIGN_OR_RETURN(c.ctl, fabric::ControlClient::Connect(ep, co));
    TESSERA_ASSIGN_OR_RETURN(c.conn, t->Connect(ep, co));
    c.t = std::move(t);
    return c;
  }

  Result<uint64_t> Alloc() {
    TESSERA_ASSIGN_OR_RETURN(auto r, ctl->AllocSlab({}, Deadline::AfterMs(5000)));
    TESSERA_RETURN_IF_ERROR(t->AddSlab(conn, r));
    return r.slab_id;
  }
  // Names another client's slab on this connection (as a client that learnt its id would).
  Status Adopt(uint64_t slab_id) {
    fabric::AllocSlabResponse r;
    r.slab_id = slab_id;
    r.size = 64 << 10;
    return t->AddSlab(conn, r);
  }

  Status Op(OpKind kind, uint64_t slab, void* buf, uint32_t len) {
    WorkRequest wr{conn, kind, slab, 0, len, buf, next_cookie++};
    TESSERA_RETURN_IF_ERROR(t->Post(std::span<const WorkRequest>(&wr, 1)));
    Deadline d = Deadline::AfterMs(5000);
    Completion out[8];
    while (!d.Expired()) {
      size_t n = t->Wait(out, d);
      for (size_t i = 0; i < n; ++i) {
        if (out[i].kind == CompletionKind::kData && out[i].cookie == wr.cookie) {
          return out[i].status;
        }
      }
    }
    return Timeout("no completion within 5 s");
  }
};

class CredentialsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    secret_ = dir_.path() + "/cluster.secret";
    ASSERT_EQ(RunTessera({"token", "secret", "--out", secret_}).exit_code, 0);
    for (const char* name : {"alice", "bob"}) Issue(name, false);
    Issue("ops", true);
    auto s = StartServer({"--auth_token_file=" + secret_, "--fault_injection",
                          "--log_level=warning"});
    ASSERT_TRUE(s.has_value());
    server_ = std::move(*s);
  }
  void Issue(const std::string& name, bool admin) {
    std::vector<std::string> args = {"token", "issue", "--client", name, "--secret_file",
                                     secret_, "--out", Path(name)};
    if (admin) args.push_back("--admin");
    ASSERT_EQ(RunTessera(args).exit_code, 0) << name;
  }
  std::string Path(const std::string& name) { return dir_.path() + "/" + name + ".credential"; }
  fabric::Credential Load(const std::string& path) {
    auto c = fabric::LoadCredential(path, "credentials_test");
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *c : fabric::Credential{};
  }
  Client Connect(const std::string& name) {
    auto c = Client::Connect(server_.port, Load(Path(name)));
    EXPECT_TRUE(c.ok()) << name << ": " << c.status();
    return c.ok() ? std::move(*c) : Client{};
  }

  TempDir dir_;
  std::string secret_;
  Server server_;
};

std::vector<uint8_t> Pattern(uint8_t seed) {
  std::vector<uint8_t> v(kLen);
  for (uint32_t i = 0; i < kLen; ++i) v[i] = static_cast<uint8_t>(seed + i * 7);
  return v;
}

TEST_F(CredentialsTest, AClientCannotTouchAnotherClientsSlabs) {
  Client alice = Connect("alice"), bob = Connect("bob");
  ASSERT_TRUE(alice.t && bob.t);
  auto slab = alice.Alloc();
  ASSERT_TRUE(slab.ok()) << slab.status();
  std::vector<uint8_t> data = Pattern(1);
  ASSERT_TRUE(alice.Op(OpKind::kWrite, *slab, data.data(), kLen).ok());

  // Bob claims alice's id with his own key: the handshake is refused (control and data).
  const fabric::Credential bob_cred = Load(Path("bob"));
  const uint64_t alice_id = fabric::ClientIdForName("alice");
  auto as_alice = Client::Connect(server_.port, bob_cred, alice_id);
  ASSERT_FALSE(as_alice.ok());
  EXPECT_EQ(as_alice.status().code(), StatusCode::kPermissionDenied) << as_alice.status();
  EXPECT_NE(as_alice.status().message().find("was not issued from this server's cluster secret"),
            std::string::npos)
      << as_alice.status();

  // Bob, as himself, names alice's slab: every op is refused.
  ASSERT_TRUE(bob.Adopt(*slab).ok());
  std::vector<uint8_t> got(kLen, 0xee), junk(kLen, 0x55);
  EXPECT_EQ(bob.Op(OpKind::kRead, *slab, got.data(), kLen).code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(got, std::vector<uint8_t>(kLen, 0xee));
  EXPECT_EQ(bob.Op(OpKind::kWrite, *slab, junk.data(), kLen).code(),
            StatusCode::kPermissionDenied);
  EXPECT_EQ(bob.ctl->FreeSlab(*slab, Deadline::AfterMs(5000)).code(),
            StatusCode::kPermissionDenied);

  // Alice's data is intact and her slab still hers.
  ASSERT_TRUE(alice.Op(OpKind::kRead, *slab, got.data(), kLen).ok());
  EXPECT_EQ(got, data);
  // Bob's own slabs work as usual.
  auto bob_slab = bob.Alloc();
  ASSERT_TRUE(bob_slab.ok());
  EXPECT_TRUE(bob.Op(OpKind::kWrite, *bob_slab, junk.data(), kLen).ok());
  EXPECT_TRUE(bob.ctl->FreeSlab(*bob_slab, Deadline::AfterMs(5000)).ok());
}

TEST_F(CredentialsTest, AdminsReachEverySlab) {
  Client alice = Connect("alice");
  ASSERT_TRUE(alice.t);
  auto slab = alice.Alloc();
  ASSERT_TRUE(slab.ok());
  std::vector<uint8_t> data = Pattern(3), got(kLen);
  ASSERT_TRUE(alice.Op(OpKind::kWrite, *slab, data.data(), kLen).ok());

  // The cluster secret itself is an admin credential (--auth_token_file as before).
  auto root = Client::Connect(server_.port, Load(secret_));
  ASSERT_TRUE(root.ok()) << root.status();
  ASSERT_TRUE(root->Adopt(*slab).ok());
  ASSERT_TRUE(root->Op(OpKind::kRead, *slab, got.data(), kLen).ok());
  EXPECT_EQ(got, data);

  // An admin token reads, writes and frees alice's slab.
  Client ops = Connect("ops");
  ASSERT_TRUE(ops.t);
  ASSERT_TRUE(ops.Adopt(*slab).ok());
  ASSERT_TRUE(ops.Op(OpKind::kRead, *slab, got.data(), kLen).ok());
  EXPECT_EQ(got, data);
  std::vector<uint8_t> fresh = Pattern(9);
  ASSERT_TRUE(ops.Op(OpKind::kWrite, *slab, fresh.data(), kLen).ok());
  ASSERT_TRUE(alice.Op(OpKind::kRead, *slab, got.data(), kLen).ok());
  EXPECT_EQ(got, fresh);
  ASSERT_TRUE(ops.ctl->FreeSlab(*slab, Deadline::AfterMs(5000)).ok());
  EXPECT_EQ(alice.Op(OpKind::kRead, *slab, got.data(), kLen).code(), StatusCode::kNotFound);
}

TEST_F(CredentialsTest, FaultInjectionAndEvictionNeedAnAdmin) {
  Client alice = Connect("alice");
  ASSERT_TRUE(alice.t);
  fabric::FaultRequest hang;
  hang.action = fabric::FaultAction::kHang;
  hang.op_mask = 1u << static_cast<int>(fabric::Op::kRead);
  Status st = alice.ctl->Fault(hang, Deadline::AfterMs(5000));
  EXPECT_EQ(st.code(), StatusCode::kPermissionDenied) << st;
  EXPECT_NE(st.message().find("admin credential"), std::string::npos) << st;
  fabric::FaultRequest evict;
  evict.action = fabric::FaultAction::kEvictSlabs;
  evict.count = 1;
  EXPECT_EQ(alice.ctl->Fault(evict, Deadline::AfterMs(5000)).code(),
            StatusCode::kPermissionDenied);
  std::string refuse = memserver::EncodeFaultSpec(memserver::FaultSpec{memserver::FaultKind::kRefuseAlloc});
  auto inv = alice.ctl->Invoke(
      memserver::kFaultFunctionId,
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(refuse.data()), refuse.size()),
      Deadline::AfterMs(5000));
  EXPECT_EQ(inv.status().code(), StatusCode::kPermissionDenied) << inv.status();
  EXPECT_TRUE(alice.Alloc().ok());  // Nothing was applied.

  // The CLI: a client credential is refused with a clear error; an admin token and the
  // cluster secret work.
  auto out = RunTesseraWithStderr(
      {"fault", server_.endpoint(), "hang", "--auth_token_file=" + Path("alice")});
  EXPECT_EQ(out.exit_code, 1) << out.stdout_text;
  EXPECT_NE(out.stdout_text.find("needs an admin credential"), std::string::npos)
      << out.stdout_text;
  out = RunTesseraWithStderr(
      {"fault", server_.endpoint(), "delay", "1ms", "--auth_token_file=" + Path("ops")});
  EXPECT_EQ(out.exit_code, 0) << out.stdout_text;
  out = RunTesseraWithStderr({"fault", server_.endpoint(), "clear", "--auth_token_file=" + secret_});
  EXPECT_EQ(out.exit_code, 0) << out.stdout_text;
}

TEST_F(CredentialsTest, ForgedAndDamagedCredentialsGetClearErrors) {
  const std::string good = [&] {
    std::ifstream in(Path("alice"));
    std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    return s;
  }();
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir_.path() + "/" + name) << text;
    return dir_.path() + "/" + name;
  };
  auto replace_key = [&](const std::string& key) {
    std::string s = good;
    size_t k = s.find("key=") + 4;
    s.replace(k, s.find('\n', k) - k, key);
    return s;
  };
  // Well-formed but forged: the right shape, a key not derived from this cluster's secret.
  fabric::Credential forged = Load(write("forged", replace_key(std::string(64, 'a'))));
  auto c = Client::Connect(server_.port, forged);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kPermissionDenied) << c.status();
  EXPECT_NE(c.status().message().find("authentication failed"), std::string::npos) << c.status();

  // Damaged files are refused by every tool before anything is sent.
  struct Case {
    std::string text, fragment;
  };
  std::vector<Case> cases = {
      {replace_key(std::string(63, 'a')), "exactly 64 hex digits"},
      {replace_key(std::string(62, 'a') + "xy"), "non-hex character at position 62"},
      {"tessera-credential v1 role=client name=alice\n", "missing field 'id'"},
      {"short\n", "at least 16 bytes"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string path = write("bad" + std::to_string(i), cases[i].text);
    auto out = RunTesseraWithStderr({"token", "show", "--token_file", path});
    EXPECT_EQ(out.exit_code, 1) << cases[i].text;
    EXPECT_NE(out.stdout_text.find(cases[i].fragment), std::string::npos) << out.stdout_text;
    out = RunTesseraWithStderr({"fault", server_.endpoint(), "clear", "--auth_token_file=" + path});
    EXPECT_EQ(out.exit_code, 1);
    EXPECT_NE(out.stdout_text.find(cases[i].fragment), std::string::npos) << out.stdout_text;
  }
  // `tessera token show` describes a good one as JSON.
  auto out = RunTessera({"token", "show", "--token_file", Path("alice")});
  ASSERT_EQ(out.exit_code, 0);
  auto j = nlohmann::json::parse(out.stdout_text);
  EXPECT_EQ(j["role"], "client");
  EXPECT_EQ(j["name"], "alice");
  EXPECT_EQ(j["client_id"].get<uint64_t>(), fabric::ClientIdForName("alice"));
  // A memserver refuses to start with a client credential instead of the cluster secret.
  std::string failure;
  EXPECT_FALSE(StartServer({"--auth_token_file=" + Path("alice")}, &failure).has_value());
  EXPECT_NE(failure.find("per-client credential"), std::string::npos) << failure;
}

// The client tools take a per-client credential in --auth_token_file: tessera kv stores and
// reads as alice, tessera status reports with her credential, a forged one is refused by both.
TEST_F(CredentialsTest, ClientToolsWorkWithAClientCredential) {
  const std::string cluster = dir_.path() + "/cluster";
  std::ofstream(cluster) << server_.endpoint() << "\n";
  auto out = RunTesseraWithStderr({"kv", "--cluster", cluster, "--auth_token_file", Path("alice"),
                                   "put", "greeting", "hello"});
  ASSERT_EQ(out.exit_code, 0) << out.stdout_text;
  out = RunTessera({"kv", "--cluster", cluster, "--auth_token_file", Path("alice"), "--json",
                    "get", "greeting"});
  ASSERT_EQ(out.exit_code, 0) << out.stdout_text;
  EXPECT_EQ(nlohmann::json::parse(out.stdout_text)["value"], "hello") << out.stdout_text;

  out = RunTessera({"status", server_.endpoint(), "--json", "--auth_token_file", Path("bob")});
  ASSERT_EQ(out.exit_code, 0) << out.stdout_text;
  EXPECT_EQ(nlohmann::json::parse(out.stdout_text)["health"], "reachable") << out.stdout_text;

  std::string text;
  {
    std::ifstream in(Path("bob"));
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  size_t k = text.find("key=") + 4;
  text[k] = text[k] == 'f' ? 'e' : 'f';
  const std::string forged = dir_.path() + "/forged-bob";
  std::ofstream(forged) << text;
  out = RunTessera({"status", server_.endpoint(), "--json", "--auth_token_file", forged});
  EXPECT_EQ(out.exit_code, 1) << out.stdout_text;
  auto row = nlohmann::json::parse(out.stdout_text);
  EXPECT_EQ(row["health"], "unreachable");
  EXPECT_NE(row["reason"].get<std::string>().find("authentication failed"), std::string::npos)
      << out.stdout_text;
  out = RunTesseraWithStderr({"kv", "--cluster", cluster, "--auth_token_file", forged, "get",
                              "greeting"});
  EXPECT_EQ(out.exit_code, 1) << out.stdout_text;
  EXPECT_NE(out.stdout_text.find("authentication failed"), std::string::npos) << out.stdout_text;
}

TEST(DevelopmentSecretTest, RefusedBeyondLoopbackWarnedOnLoopback) {
  for (const char* host : {"0.0.0.0", "::"}) {
    const uint64_t start = MonotonicNs();
    auto out = RunTesseraWithStderr({"memserver", std::string("--listen=") + host, "--port=0",
                                     "--capacity=1M", "--slab_size=64K", "--headroom=0"},
                                    10000);
    EXPECT_EQ(out.exit_code, 1) << host << ": " << out.stdout_text;
    EXPECT_NE(out.stdout_text.find("refusing to listen on '" + std::string(host) + "'"),
              std::string::npos)
        << out.stdout_text;
    EXPECT_NE(out.stdout_text.find("--auth_token_file"), std::string::npos) << out.stdout_text;
    EXPECT_EQ(out.stdout_text.find("listening on"), std::string::npos) << out.stdout_text;
    EXPECT_LT(MonotonicNs() - start, 5'000'000'000ull) << "should fail fast";
  }
  // Loopback: it serves, with a warning on stderr.
  auto s = StartServer({"--listen=127.0.0.1"});
  ASSERT_TRUE(s.has_value());
  EXPECT_NE(s->output.find("development secret"), std::string::npos) << s->output;
  EXPECT_TRUE(s->proc.Stop().ok());
  // With a real secret, every interface is fine.
  TempDir dir;
  ASSERT_EQ(RunTessera({"token", "secret", "--out", dir.path() + "/s"}).exit_code, 0);
  auto any = StartServer({"--listen=0.0.0.0", "--auth_token_file=" + dir.path() + "/s"});
  ASSERT_TRUE(any.has_value());
  EXPECT_EQ(any->output.find("development secret"), std::string::npos) << any->output;
  EXPECT_TRUE(any->proc.Stop().ok());
}

}  // namespace
}  // namespace tessera
