// The README's "Deploying memory servers on several machines" walkthrough, run on loopback with
// real processes: etcd, a token, memservers registering (`tessera memserver --etcd`), a paged
// program (`tessera run --etcd`) that follows a join and a SIGKILL while it runs, and
// `tessera status --etcd --json` showing the pool. Keep it in step with the README.
#include <signal.h>

#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/clock.h"
#include "common/subprocess.h"
#include "tests/support/etcd_process.h"
#include "tests/support/test_util.h"

namespace tessera {
namespace {

using testing::EtcdProcess;
using testing::JsonLines;
using testing::RunCommand;
using testing::RunTessera;
using testing::TempDir;

const std::string kPython = "/usr/bin/python3";
const std::string kWorkload = std::string(TESSERA_SOURCE_DIR) + "/tests/run/workload.py";
const std::string kRecords = "60000";

std::string Last(const std::string& text, const std::string& prefix) {
  std::string found;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) nl = text.size();
    std::string line = text.substr(pos, nl - pos);
    if (line.rfind(prefix, 0) == 0) found = line;
    pos = nl + 1;
  }
  return found;
}

class Walkthrough : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string why = EtcdProcess::SkipReason(); !why.empty()) GTEST_SKIP() << why;
    auto e = EtcdProcess::Start();
    ASSERT_TRUE(e.ok()) << e.status();
    etcd_ = std::move(*e);
    // Step 2 of the walkthrough: the cluster secret, a client credential, an admin one.
    token_ = dir_.path() + "/cluster.secret";
    client_cred_ = dir_.path() + "/alice.credential";
    admin_cred_ = dir_.path() + "/ops.credential";
    ASSERT_EQ(RunTessera({"token", "secret", "--out", token_}).exit_code, 0);
    ASSERT_EQ(RunTessera({"token", "issue", "--client", "alice", "--secret_file", token_, "--out",
                          client_cred_}).exit_code, 0);
    ASSERT_EQ(RunTessera({"token", "issue", "--client", "ops", "--admin", "--secret_file", token_,
                          "--out", admin_cred_}).exit_code, 0);
  }

  // Step 3: `tessera memserver ... --etcd E --cluster_name demo --rack R`.
  Subprocess StartMemserver(const std::string& rack) {
    auto p = Subprocess::Start(
        {testing::BinDir() + "/tessera", "memserver", "--listen", "127.0.0.1", "--port", "0",
         "--capacity", "128M", "--slab_size", "1M", "--headroom", "0", "--auth_token_file",
         token_, "--etcd", etcd_->endpoint(), "--cluster_name", "demo", "--rack", rack,
         "--etcd_ttl", "2s", "--log_level", "warning"},
        {.capture_stdout = true, .quiet_stderr = true, .own_process_group = true});
    EXPECT_TRUE(p.ok()) << p.status();
    if (!p.ok()) return Subprocess();
    auto line = p->WaitForLine("registered in etcd as ", Deadline::AfterMs(15000));
    EXPECT_TRUE(line.ok()) << line.status();
    return std::move(*p);
  }

  std::vector<nlohmann::json> Status() {
    auto out = RunTessera({"status", "--etcd", etcd_->endpoint(), "--cluster_name", "demo",
                           "--auth_token_file", admin_cred_, "--json"});
    return JsonLines(out.stdout_text);
  }

  TempDir dir_;
  std::unique_ptr<EtcdProcess> etcd_;
  std::string token_, client_cred_, admin_cred_;
};

TEST_F(Walkthrough, EtcdTokensMemserversAClientAndStatus) {
  auto unpaged = RunCommand({kPython, kWorkload, kRecords}, 120000);
  ASSERT_EQ(unpaged.exit_code, 0);
  const std::string want = Last(unpaged.stdout_text, "tessera-workload: records");
  ASSERT_FALSE(want.empty());

  std::vector<Subprocess> servers;
  for (const char* rack : {"r1", "r2", "r3"}) servers.push_back(StartMemserver(rack));
  // Step 5 first, to see the pool: three servers, each reachable, with their registration.
  auto rows = Status();
  ASSERT_EQ(rows.size(), 3u);
  for (const auto& r : rows) {
    EXPECT_EQ(r.value("health", ""), "reachable") << r.dump();
    EXPECT_EQ(r.value("server_id", "").size(), 16u) << r.dump();
    EXPECT_EQ(r.value("registered_capacity", ""), "128 MiB") << r.dump();
    EXPECT_NE(r.value("rack", "-"), "-");
  }

  // Step 4: a paged program on the pool (k=2, r=1: 3 servers). While it runs a fourth server
  // joins, then one of the first three is SIGKILLed: its splits can only be regenerated onto
  // the server that joined, and new slabs need it too, so the run succeeds only if the paged
  // program followed the join.
  const std::string stats = dir_.path() + "/run.json";
  auto run = Subprocess::Start(
      {testing::BinDir() + "/tessera", "run", "--etcd", etcd_->endpoint(), "--cluster-name",
       "demo", "--auth-token-file", client_cred_, "--k", "2", "--r", "1", "--local-memory", "50%",
       "--stats-json", stats, "--", kPython, kWorkload, kRecords},
      {.capture_stdout = true});
  ASSERT_TRUE(run.ok()) << run.status();
  auto half = run->WaitForLine("tessera-workload: half", Deadline::AfterMs(120000));
  ASSERT_TRUE(half.ok()) << half.status();
  servers.push_back(StartMemserver("r4"));
  // Wait (bounded) until the paged program has connected to the new server: its data
  // connection, control connection and heartbeat connection show up in the server's count.
  const Deadline d = Deadline::AfterMs(20000);
  for (;;) {
    auto r = Status();
    long conns = 0;
    for (const auto& row : r) {
      if (row.value("rack", "") == "r4" && row["conns"].is_number()) conns = row["conns"].get<long>();
    }
    if (conns >= 3) break;
    ASSERT_FALSE(d.Expired()) << "the paged program did not connect to the joined server";
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // Poll interval, bounded.
  }
  ASSERT_TRUE(servers[0].Signal(SIGKILL).ok());
  auto done = run->WaitForLine("tessera-workload: records", Deadline::AfterMs(180000));
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(*done, want);
  auto st = run->Wait(Deadline::AfterMs(60000));
  ASSERT_TRUE(st.ok());
  EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 0) << *st;
  auto summary = JsonLines(testing::ReadFile(stats));
  ASSERT_EQ(summary.size(), 1u);
  EXPECT_GE(summary[0].value("failures_survived", 0), 1) << summary[0].dump();

  // Step 5 again: the killed server is gone once its lease expires; the joined one is listed.
  const Deadline gone = Deadline::AfterMs(20000);
  for (;;) {
    rows = Status();
    if (rows.size() == 3) break;
    ASSERT_FALSE(gone.Expired()) << "the killed server's registration did not expire";
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // Poll interval, bounded.
  }
  bool r4 = false;
  for (const auto& r : rows) r4 |= r.value("rack", "") == "r4";
  EXPECT_TRUE(r4);
  // SIGTERM deregisters at once.
  ASSERT_TRUE(servers[1].Signal(SIGTERM).ok());
  ASSERT_TRUE(servers[1].Wait(Deadline::AfterMs(10000)).ok());
  EXPECT_EQ(Status().size(), 2u);
}

TEST_F(Walkthrough, ParamsvcCheckpointsToTheServersInEtcd) {
  std::vector<Subprocess> servers;
  for (const char* rack : {"r1", "r2", "r3"}) servers.push_back(StartMemserver(rack));
  auto serve = Subprocess::Start(
      {testing::BinDir() + "/tessera", "paramsvc", "serve", "--port", "0", "--cores", "1",
       "--store_mb", "16", "--k", "2", "--r", "1", "--etcd", etcd_->endpoint(),
       "--cluster_name", "demo",
       "--auth_token_file", token_},
      {.capture_stdout = true, .quiet_stderr = true, .own_process_group = true});
  ASSERT_TRUE(serve.ok()) << serve.status();
  auto line = serve->WaitForLine("checkpoints ", Deadline::AfterMs(30000));
  ASSERT_TRUE(line.ok()) << line.status();
  EXPECT_EQ(*line, "checkpoints on") << "the checkpoint store did not open on etcd's servers";
  // Its checkpoint store connected to the registered servers (I/O, control and heartbeat
  // connections on each).
  for (const auto& row : Status()) {
    EXPECT_GE(row.value("conns", 0), 2) << row.dump();
  }
  auto st = serve->Stop(10000);
  ASSERT_TRUE(st.ok());
  auto both = RunTessera({"paramsvc", "serve", "--store", "127.0.0.1:1", "--etcd",
                          etcd_->endpoint(), "--cluster_name", "demo"});
  EXPECT_EQ(both.exit_code, 2);
}

TEST_F(Walkthrough, BadMembershipFlagsGetClearErrors) {
  auto both = RunTessera({"status", "cluster", "--etcd", etcd_->endpoint(), "--cluster_name", "x"});
  EXPECT_EQ(both.exit_code, 2);
  auto no_name = RunTessera({"status", "--etcd", etcd_->endpoint()});
  EXPECT_EQ(no_name.exit_code, 2);
  auto run_both = RunTessera({"run", "--cluster", "f", "--etcd", etcd_->endpoint(),
                              "--cluster-name", "x", "--", "/bin/true"});
  EXPECT_EQ(run_both.exit_code, 2);
  auto ms_wild = RunTessera({"memserver", "--listen", "0.0.0.0", "--port", "0", "--etcd",
                             etcd_->endpoint(), "--cluster_name", "demo"});
  EXPECT_EQ(ms_wild.exit_code, 2) << "--listen 0.0.0.0 with --etcd needs --advertise";
  auto bad_name = RunTessera({"memserver", "--port", "0", "--etcd", etcd_->endpoint(),
                              "--cluster_name", "a/b"});
  EXPECT_EQ(bad_name.exit_code, 2);
  // etcd unreachable: a clear error and exit 1, not a hang.
  auto down = RunCommand({testing::BinDir() + "/tessera", "nbd", "--size", "64M", "--ephemeral",
                          "--etcd", "127.0.0.1:1", "--cluster_name", "demo", "--auth_token_file",
                          client_cred_},
                         30000, true);
  EXPECT_EQ(down.exit_code, 1);
  auto empty = RunTessera({"status", "--etcd", etcd_->endpoint(), "--cluster_name", "nobody"});
  EXPECT_EQ(empty.exit_code, 1) << "an empty pool is not healthy";
  auto ms_down = RunCommand({testing::BinDir() + "/tessera", "memserver", "--port", "0",
                             "--capacity", "16M", "--slab_size", "1M", "--headroom", "0",
                             "--auth_token_file", token_, "--etcd", "127.0.0.1:1",
                             "--cluster_name", "demo"},
                            30000, true);
  EXPECT_EQ(ms_down.exit_code, 1) << "a memserver that cannot register must not run silently";
}

}  // namespace
}  // namespace tessera
