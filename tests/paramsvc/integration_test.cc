// The Parameter Service as real processes: `tessera paramsvc serve` checkpointing into real
// memservers, its aggregation server SIGKILLed mid-training; the CLI; the PyTorch example.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "apps/paramsvc/client/client.h"
#include "client/hosts.h"
#include "client/local_cluster.h"
#include "common/subprocess.h"
#include "tests/paramsvc/serve_process.h"
#include "tests/support/test_util.h"

namespace tessera::paramsvc {
namespace {

using tessera::testing::BinDir;
using tessera::testing::RunCommand;
using tessera::testing::RunTessera;

JobSpec IntJob() {
  JobSpec s;
  s.name = "resilient";
  s.workers = 2;
  s.optimizer.lr = 2.0f;  // p -= sum of both workers' gradients, exactly
  s.partition_bytes = 4096;
  s.tensors = {{"w", DType::kF32, {3000}}, {"b", DType::kF32, {10}}};
  return s;
}

float F(uint64_t v, uint32_t w) { return static_cast<float>((v + 2 * w) % 5); }

TEST(ParamsvcIntegration, AggregationServerSigkilledResumesFromItsErasureCodedCheckpoint) {
  auto cluster = client::LocalCluster::Start(ThreeServers());
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto svc = StartService(cluster->get(), (*cluster)->token_path());
  ASSERT_TRUE(svc.ok()) << svc.status();

  const JobSpec spec = IntJob();
  constexpr uint64_t kTarget = 120;   // Train until every partition reaches this version.
  constexpr uint64_t kKillAt = 40;
  std::atomic<uint64_t> seen{0};
  std::atomic<uint64_t> before_kill{0}, after_restore{UINT64_MAX};
  std::atomic<bool> killed{false};
  std::vector<std::vector<uint64_t>> versions(2);
  std::vector<std::vector<float>> finals(2);
  std::vector<ClientCounters> counters(2);
  auto work = [&](uint32_t w) {
    ClientOptions o;
    o.port = svc->port;
    o.secret = (*cluster)->secret();
    o.op_timeout_ms = 20000;
    o.reconnect_ms = 30000;
    auto c = Client::Connect(o);
    ASSERT_TRUE(c.ok()) << c.status();
    ASSERT_TRUE((*c)->Join(spec, w).ok());
    std::vector<float> w0(3000, 100.0f), b0(10, 100.0f);
    std::vector<float> gw(3000), gb(10);
    void* params[2] = {w0.data(), b0.data()};
    const void* grads[2] = {gw.data(), gb.data()};
    if (w == 0) {
      ASSERT_TRUE((*c)->SetParams({params, 2}).ok());
    }
    ASSERT_TRUE((*c)->Barrier(0).ok());
    ASSERT_TRUE((*c)->Pull({params, 2}, false).ok());
    while ((*c)->min_version() < kTarget) {
      for (uint32_t p = 0; p < (*c)->layout().partitions.size(); ++p) {
        const auto& pi = (*c)->layout().partitions[p];
        float* g = pi.tensor == 0 ? gw.data() : gb.data();
        for (uint32_t i = 0; i < pi.count; ++i) g[pi.offset + i] = F((*c)->version(p), w);
      }
      const uint64_t reconnects = (*c)->counters().reconnects;
      Status s = (*c)->PushPull({grads, 2}, {params, 2});
      ASSERT_TRUE(s.ok()) << s;
      if (w == 0) {
        seen = (*c)->min_version();
        // The last version seen before the failure (a call that straddles the kill resyncs).
        if ((*c)->counters().reconnects == reconnects && after_restore.load() == UINT64_MAX) {
          before_kill = (*c)->min_version();
        }
        if ((*c)->counters().reconnects > reconnects) after_restore = (*c)->min_version();
      }
    }
    versions[w].clear();
    for (uint32_t p = 0; p < (*c)->layout().partitions.size(); ++p) versions[w].push_back((*c)->version(p));
    finals[w] = w0;
    finals[w].insert(finals[w].end(), b0.begin(), b0.end());
    counters[w] = (*c)->counters();
  };
  std::thread t0(work, 0), t1(work, 1);
  // Kill the aggregation server once training is under way (polling a counter the worker
  // publishes; bounded).
  const Deadline d = Deadline::AfterMs(60000);
  while (seen.load() < kKillAt && !d.Expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));  // Polling a counter, bounded.
  }
  ASSERT_GE(seen.load(), kKillAt) << "training did not progress";
  killed = true;
  ASSERT_EQ(::kill(svc->aggregator, SIGKILL), 0);
  auto replacement = NextAggregator(&svc->proc);
  ASSERT_TRUE(replacement.ok()) << "the supervisor did not start a replacement: " << replacement.status();
  EXPECT_NE(*replacement, svc->aggregator);
  t0.join();
  t1.join();

  // Exactness across the failure: each partition equals 100 - sum over its versions of both
  // workers' gradients: nothing applied twice, nothing lost from the restored state on.
  auto c = Client::Connect({"127.0.0.1", svc->port, (*cluster)->secret(), 0, 5000, 20000, 0});
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE((*c)->Join(spec, 0).ok());
  std::vector<float> w0(3000), b0(10);
  void* params[2] = {w0.data(), b0.data()};
  ASSERT_TRUE((*c)->Pull({params, 2}, false).ok());
  for (uint32_t p = 0; p < (*c)->layout().partitions.size(); ++p) {
    const auto& pi = (*c)->layout().partitions[p];
    const uint64_t V = (*c)->version(p);
    EXPECT_GE(V, kTarget);
    float want = 100.0f;
    for (uint64_t v = 0; v < V; ++v) want -= F(v, 0) + F(v, 1);
    const float* got = pi.tensor == 0 ? w0.data() : b0.data();
    for (uint32_t i = 0; i < pi.count; ++i) {
      ASSERT_EQ(got[pi.offset + i], want) << "partition " << p << " element " << i << " version " << V;
    }
  }
  EXPECT_GE(counters[0].reconnects, 1u);
  EXPECT_GE(counters[1].reconnects, 1u);
  ASSERT_NE(after_restore.load(), UINT64_MAX);
  EXPECT_GT(after_restore.load(), 0u) << "resumed from scratch instead of the checkpoint";
  const int64_t lost = static_cast<int64_t>(before_kill.load()) - static_cast<int64_t>(after_restore.load());
  std::printf("paramsvc failure test: version %llu before the kill, resumed at %llu (%lld iterations lost)\n",
              static_cast<unsigned long long>(before_kill.load()),
              static_cast<unsigned long long>(after_restore.load()), static_cast<long long>(lost));
  RecordProperty("iterations_lost", static_cast<int>(lost));
  // The status tool sees the job at its final version, restored (same job id).
  auto st = RunTessera({"paramsvc", "status", "127.0.0.1:" + std::to_string(svc->port), "--json",
                        "--auth_token_file=" + (*cluster)->token_path()});
  ASSERT_EQ(st.exit_code, 0) << st.stdout_text;
  auto j = nlohmann::json::parse(st.stdout_text);
  ASSERT_EQ(j["jobs"].size(), 1u);
  EXPECT_EQ(j["jobs"][0]["name"], "resilient");
  EXPECT_EQ(j["jobs"][0]["job"].get<uint32_t>(), (*c)->job());
  EXPECT_TRUE(j["checkpoints"].get<bool>());
  EXPECT_EQ(j["pid"].get<pid_t>(), *replacement);
  auto stopped = svc->proc.Stop(10000);
  ASSERT_TRUE(stopped.ok());
  EXPECT_TRUE(WIFEXITED(*stopped) && WEXITSTATUS(*stopped) == 0);
}

// A learning rate set with SET_LR survives a restart of the aggregation server: the restored
// job starts from its spec's lr, and the client sends its own again when it reconnects.
TEST(ParamsvcIntegration, LearningRateIsSentAgainAfterTheAggregationServerRestarts) {
  auto cluster = client::LocalCluster::Start(ThreeServers());
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto svc = StartService(cluster->get(), (*cluster)->token_path());
  ASSERT_TRUE(svc.ok()) << svc.status();
  JobSpec spec;
  spec.name = "scheduled";
  spec.workers = 1;
  spec.optimizer.lr = 1.0f;
  spec.tensors = {{"w", DType::kF32, {8}}};
  ClientOptions o;
  o.port = svc->port;
  o.secret = (*cluster)->secret();
  o.op_timeout_ms = 20000;
  o.reconnect_ms = 30000;
  auto c = Client::Connect(o);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE((*c)->Join(spec, 0).ok());
  ASSERT_TRUE((*c)->Barrier(0).ok());
  std::vector<float> p(8), g(8, 1.0f);
  const void* gp[1] = {g.data()};
  void* pp[1] = {p.data()};
  ASSERT_TRUE((*c)->SetLr(0.25f).ok());
  ASSERT_TRUE((*c)->PushPull({gp, 1}, {pp, 1}).ok());
  ASSERT_EQ(p[0], -0.25f);
  ASSERT_EQ(::kill(svc->aggregator, SIGKILL), 0);
  auto replacement = NextAggregator(&svc->proc);
  ASSERT_TRUE(replacement.ok()) << replacement.status();
  // This call meets the dead connection: reconnect, join, SET_LR again, resynchronise (its
  // gradient is discarded). The next step is taken with the client's lr, not the spec's.
  ASSERT_TRUE((*c)->PushPull({gp, 1}, {pp, 1}).ok());
  ASSERT_GE((*c)->counters().reconnects, 1u);
  const float before = p[0];
  ASSERT_TRUE((*c)->PushPull({gp, 1}, {pp, 1}).ok());
  EXPECT_EQ(p[0], before - 0.25f) << "the restored job stepped with lr " << before - p[0];
}

// Slabs in use over every server of the cluster, from `tessera status --json`; -1 when a
// server cannot be reached.
int64_t SlabsUsed(const client::LocalCluster& c) {
  auto out = RunCommand({BinDir() + "/tessera", "status", "--json", c.cluster_file_path(),
                         "--auth_token_file", c.token_path()},
                        30000);
  int64_t total = 0;
  size_t rows = 0;
  for (const auto& row : tessera::testing::JsonLines(out.stdout_text)) {
    if (!row.contains("slabs_used") || !row["slabs_used"].is_number_integer()) return -1;
    total += row["slabs_used"].get<int64_t>();
    ++rows;
  }
  return rows == c.size() ? total : -1;
}

// The checkpoint store's slabs of a SIGKILLed `tessera paramsvc serve` are reclaimed by the
// memservers once its lease (--orphan_grace) has run out.
TEST(ParamsvcIntegration, SigkilledServeLeavesNoSlabBehindOnceItsLeaseExpired) {
  client::LocalClusterOptions co = ThreeServers();
  co.extra_flags = {"--orphan_grace=1s", "--monitor_interval=100ms"};
  auto cluster = client::LocalCluster::Start(co);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto svc = StartService(cluster->get(), (*cluster)->token_path());
  ASSERT_TRUE(svc.ok()) << svc.status();
  {
    JobSpec spec = IntJob();
    spec.name = "leased";
    spec.workers = 1;
    ClientOptions o;
    o.port = svc->port;
    o.secret = (*cluster)->secret();
    o.op_timeout_ms = 20000;
    auto c = Client::Connect(o);
    ASSERT_TRUE(c.ok()) << c.status();
    ASSERT_TRUE((*c)->Join(spec, 0).ok());
    std::vector<float> w0(3000, 1.0f), b0(10, 1.0f), gw(3000, 0.5f), gb(10, 0.5f);
    void* params[2] = {w0.data(), b0.data()};
    const void* grads[2] = {gw.data(), gb.data()};
    ASSERT_TRUE((*c)->SetParams({params, 2}).ok());
    ASSERT_TRUE((*c)->Barrier(0).ok());
    for (int i = 0; i < 5; ++i) ASSERT_TRUE((*c)->PushPull({grads, 2}, {params, 2}).ok());
  }
  // The checkpoints land in the store (bounded wait).
  Deadline d = Deadline::AfterMs(30000);
  int64_t used = SlabsUsed(**cluster);
  while (used <= 0 && !d.Expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // Polling a count, bounded.
    used = SlabsUsed(**cluster);
  }
  ASSERT_GT(used, 0) << "no checkpoint reached the store";
  ASSERT_TRUE(svc->proc.Signal(SIGKILL).ok());
  ASSERT_TRUE(svc->proc.Wait(Deadline::AfterMs(30000)).ok());
  d = Deadline::AfterMs(30000);
  while (used != 0 && !d.Expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // Polling a count, bounded.
    used = SlabsUsed(**cluster);
  }
  EXPECT_EQ(used, 0) << "slabs left behind by the killed service";
}

TEST(ParamsvcIntegration, CliRejectsBadFlagsAndReportsADeadService) {
  auto bad = RunTessera({"paramsvc", "serve", "--cores=0"});
  EXPECT_EQ(bad.exit_code, 2);
  bad = RunTessera({"paramsvc", "serve", "--target_util=1.5"});
  EXPECT_EQ(bad.exit_code, 2);
  auto dead = RunCommand({BinDir() + "/tessera", "paramsvc", "status", "127.0.0.1:1"}, 20000, true);
  EXPECT_EQ(dead.exit_code, 1);
  auto usage = RunTessera({"paramsvc", "status"});
  EXPECT_EQ(usage.exit_code, 2);
  // Without --store the service says it does not checkpoint, and serves.
  tessera::testing::TempDir dir;
  const std::string token = dir.path() + "/token";
  {
    FILE* f = std::fopen(token.c_str(), "w");
    std::fputs("paramsvc-cli-test-secret-0123456789\n", f);
    std::fclose(f);
  }
  auto svc = StartService(nullptr, token);
  ASSERT_TRUE(svc.ok()) << svc.status();
  auto st = RunTessera({"paramsvc", "status", "127.0.0.1:" + std::to_string(svc->port),
                        "--auth_token_file=" + token});
  EXPECT_EQ(st.exit_code, 0);
  EXPECT_NE(st.stdout_text.find("checkpoints off"), std::string::npos) << st.stdout_text;
  auto wrong = RunCommand({BinDir() + "/tessera", "paramsvc", "status",
                           "127.0.0.1:" + std::to_string(svc->port)}, 20000);
  EXPECT_EQ(wrong.exit_code, 1);  // The development secret is not this service's.
  // A per-client credential issued from the service's secret works (fabric/credential.h);
  // one issued from another secret does not.
  const std::string cred = dir.path() + "/worker.credential";
  ASSERT_EQ(RunTessera({"token", "issue", "--client", "worker", "--secret_file", token, "--out",
                        cred}).exit_code, 0);
  st = RunTessera({"paramsvc", "status", "127.0.0.1:" + std::to_string(svc->port),
                   "--auth_token_file=" + cred});
  EXPECT_EQ(st.exit_code, 0) << st.stdout_text;
  const std::string other = dir.path() + "/other.secret";
  ASSERT_EQ(RunTessera({"token", "secret", "--out", other}).exit_code, 0);
  const std::string foreign = dir.path() + "/foreign.credential";
  ASSERT_EQ(RunTessera({"token", "issue", "--client", "worker", "--secret_file", other, "--out",
                        foreign}).exit_code, 0);
  wrong = RunCommand({BinDir() + "/tessera", "paramsvc", "status",
                      "127.0.0.1:" + std::to_string(svc->port), "--auth_token_file=" + foreign},
                     20000);
  EXPECT_EQ(wrong.exit_code, 1);
}

TEST(ParamsvcIntegration, PyTorchExampleMatchesGlooAccuracy) {
  auto probe = RunCommand({"/usr/bin/python3", "-c", "import torch"}, 60000);
  ASSERT_EQ(probe.exit_code, 0)
      << "/usr/bin/python3 cannot import torch: install Debian's python3-torch (scripts/setup.sh)";
  // The package from the build tree (as pip would install it), the script from the source.
  auto r = RunCommand({"/usr/bin/env", "PYTHONPATH=" + BinDir() + "/../python", "/usr/bin/python3",
                       std::string(TESSERA_SOURCE_DIR) + "/python/examples/paramsvc_train.py",
                       "--backend=both", "--workers=4", "--epochs=1", "--bin_dir=" + BinDir(),
                       "--tolerance=0.02"},
                      180000, true);
  std::istringstream in(r.stdout_text);
  std::string line;
  std::vector<nlohmann::json> rows;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded()) rows.push_back(j);
  }
  ASSERT_EQ(rows.size(), 3u) << r.stdout_text;
  EXPECT_EQ(rows[0]["backend"], "paramsvc");
  EXPECT_EQ(rows[1]["backend"], "gloo");
  EXPECT_GT(rows[0]["accuracy"].get<double>(), 0.8);  // It really learned (10 classes: 0.1 chance).
  EXPECT_TRUE(rows[2]["ok"].get<bool>()) << r.stdout_text;
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(rows[0]["counters"]["rollbacks"].get<int>(), 0);
}

TEST(ParamsvcIntegration, BenchQuickPrintsEverySectionWithTheContractKeysAndPlots) {
  tessera::testing::TempDir dir;
  auto r = RunCommand({BinDir() + "/tessera", "bench", "paramsvc", "--quick", "--json",
                       "--out_dir=" + dir.path()},
                      240000);
  ASSERT_EQ(r.exit_code, 0) << r.stdout_text;
  std::istringstream in(r.stdout_text);
  std::string line;
  std::map<std::string, int> sections;
  const char* keys[] = {"suite", "section", "system", "jobs", "workers", "model_mb", "iter_ms_p50",
                        "iter_ms_p99", "cpu_core_s", "cores_avg", "gbps", "final_loss",
                        "staleness_max"};
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << line;
    for (const char* k : keys) ASSERT_TRUE(j.contains(k)) << k << " missing in " << line;
    EXPECT_EQ(j["suite"], "paramsvc");
    EXPECT_EQ(j["hosts"], "loopback") << line;
    EXPECT_EQ(j["pin"], "none") << line;
    const std::string sec = j["section"];
    sections[sec]++;
    if (sec == "summation") {
      EXPECT_GT(j["gbps"].get<double>(), 0.0) << line;
    }
    if (sec == "packing" && j["jobs"].is_number() && j["jobs"].get<int>() >= 8) {
      EXPECT_GT(j["cpu_core_s"].get<double>(), 0.0) << line;
      EXPECT_GT(j["cores_avg"].get<double>(), 0.0) << line;
    }
    if (sec == "vs_allreduce" || sec == "staleness") {
      EXPECT_GT(j["iter_ms_p50"].get<double>(), 0.0) << line;
      EXPECT_TRUE(j["final_loss"].is_number()) << line;
    }
    if (sec == "staleness") {
      EXPECT_TRUE(j["staleness_max"].is_number()) << line;
    }
  }
  EXPECT_EQ(sections["summation"], 4);      // memcpy, fp32, fp16, bf16
  EXPECT_EQ(sections["packing"], 2 * 8 + 2);  // Per job, both systems, then the totals
  EXPECT_EQ(sections["vs_allreduce"], 3);  // The optimizer, the DDP hook, gloo
  EXPECT_EQ(sections["staleness"], 5);
  for (const char* png : {"summation", "packing", "vs_allreduce", "staleness"}) {
    EXPECT_TRUE(std::filesystem::exists(dir.path() + "/" + png + ".png")) << png;
  }
}

// --hosts netns --pin auto: the services in a network namespace of their own on the server
// CPUs, the workers (the PyTorch example's too) here on the client CPUs; every row says so.
TEST(ParamsvcIntegration, BenchOnNetnsHostsSaysSoInEveryRow) {
  if (::geteuid() != 0) GTEST_SKIP() << "network namespaces need root";
  tessera::testing::TempDir dir;
  auto r = RunCommand({BinDir() + "/tessera", "bench", "paramsvc", "--quick", "--json",
                       "--hosts=netns", "--pin=auto", "--sections=vs_allreduce,staleness",
                       "--out_dir=" + dir.path()},
                      240000);
  ASSERT_EQ(r.exit_code, 0) << r.stdout_text;
  const std::string pin =
      tessera::client::FormatPin(tessera::client::AutoPin(tessera::client::AllowedCpus()));
  std::map<std::string, int> sections;
  for (const auto& j : tessera::testing::JsonRows(r.stdout_text, "suite", "paramsvc")) {
    EXPECT_EQ(j["hosts"], "netns") << j;
    EXPECT_EQ(j["pin"], pin) << j;
    EXPECT_GT(j["iter_ms_p50"].get<double>(), 0.0) << j;
    sections[j["section"].get<std::string>()]++;
  }
  EXPECT_EQ(sections["vs_allreduce"], 3);  // The optimizer, the DDP hook, gloo
  EXPECT_EQ(sections["staleness"], 5);
  auto bad = RunCommand({BinDir() + "/tessera", "bench", "paramsvc", "--pin=servers:"}, 30000);
  EXPECT_EQ(bad.exit_code, 2);
}

}  // namespace
}  // namespace tessera::paramsvc
