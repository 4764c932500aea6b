// `tessera experiment` end to end: bad scenario files exit 2 naming the line, the quick sizes of
// the built-in scenarios pass on real memservers, and a partition is always removed (after a
// heal, at the end of the run, and when the runner is interrupted).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "apps/experiment/builtin.h"
#include "apps/experiment/partition.h"
#include "apps/experiment/scenario.h"
#include "apps/experiment/tools.h"
#include "common/clock.h"
#include "common/subprocess.h"
#include "tests/support/etcd_process.h"
#include "tests/support/test_util.h"

namespace tessera::experiment {
namespace {

using json = nlohmann::json;
using tessera::testing::BinDir;
using tessera::testing::TempDir;

std::string Exe() { return BinDir() + "/tessera-experiment"; }

std::string Write(const TempDir& dir, const std::string& name, const std::string& text) {
  std::string path = dir.path() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

ToolResult Experiment(const std::vector<std::string>& args, int timeout_ms = 240000) {
  std::vector<std::string> argv = {Exe()};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.push_back("--progress=false");
  auto r = RunTool(argv, timeout_ms);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : ToolResult{};
}

TEST(ExperimentCliTest, BadScenarioFilesExit2NamingTheLine) {
  TempDir dir;
  struct Case {
    const char* text;
    const char* want;
  } cases[] = {
      {"name = \"x\"\nduration_s = 5\n[cluster]\nmemservers = 8\nflavour = \"big\"\n"
       "[workload]\nkind = \"pagestore\"\npages = 64\n",
       "bad.toml:5: unknown key 'flavour' in [cluster]"},
      {"name = \"x\"\nduration_s = 5\n[cluster]\nmemservers = 8\n[workload]\nkind = \"pagestore\"\n"
       "pages = 64\n[[fault]]\nat_s = 1\naction = \"kill\"\ntarget = \"server:9\"\n",
       "bad.toml:11: target server:9: the cluster has servers 0..7"},
      {"name = \"x\"\nduration_s = 5\n[cluster]\nmemservers = 8\n[workload]\nkind = \"pagestore\"\n"
       "pages = 64\nqd = -4\n",
       "bad.toml:8: qd must be in [1, 1024], got -4"},
      {"name = \"x\"\nduration_s = 5\n[workload]\nkind = \"pagestore\"\npages = 64\n",
       "bad.toml:1: the scenario needs a [cluster] table"},
      {"name = \"x\"\nduration_s = 5\n[cluster]\nmemservers = 8\n[workload]\nkind = \"kv\"\n"
       "replicas = 2\nmode = \"teleport\"\n",
       "bad.toml:8: mode must be one of sync, async, kv, rpc, pushback, kayak"},
      {"name = \"x\"\nduration_s = 5\n[cluster]\nmemservers = 8\n[workload]\nkind = \"kv\"\n"
       "keys = 100\nvalue_sizes = 64\n",
       "bad.toml:8: unknown key 'value_sizes' in [workload]"},
  };
  for (const Case& c : cases) {
    std::string path = Write(dir, "bad.toml", c.text);
    ToolResult r = Experiment({"run", path, "--out", dir.path() + "/out"});
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find(c.want), std::string::npos)
        << "want: " << c.want << "\ngot: " << r.output;
  }
  ToolResult missing = Experiment({"run", dir.path() + "/none.toml"});
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_NE(missing.output.find("no such file and no built-in scenario"), std::string::npos);
  ToolResult usage = Experiment({"frobnicate"});
  EXPECT_EQ(usage.exit_code, 2);
}

TEST(ExperimentCliTest, ListAndShowTheBuiltins) {
  ToolResult list = Experiment({"list"});
  ASSERT_EQ(list.exit_code, 0) << list.output;
  for (const BuiltinScenario& b : BuiltinScenarios()) {
    EXPECT_NE(list.output.find(b.name), std::string::npos) << b.name;
    ToolResult show = Experiment({"show", b.name});
    ASSERT_EQ(show.exit_code, 0);
    auto parsed = ParseScenario(show.output, "shown");
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(parsed->name, b.name);
  }
  EXPECT_EQ(Experiment({"show", "nope"}).exit_code, 2);
}

// Runs a scenario at its quick size and checks the results it wrote.
json RunQuick(const std::string& what, const TempDir& dir, int want_exit = 0) {
  const std::string out = dir.path() + "/out";
  ToolResult r = Experiment({"run", what, "--quick", "--out", out});
  EXPECT_EQ(r.exit_code, want_exit) << r.output;
  json j = json::parse(ReadWholeFile(out + "/summary.json"), nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << "no summary.json; output:\n" << r.output;
  if (j.is_discarded()) return json();
  EXPECT_EQ(j["verdict"], want_exit == 0 ? "PASS" : "FAIL") << r.output;
  EXPECT_FALSE(j["expectations"].empty());
  for (const auto& e : j["expectations"]) {
    EXPECT_EQ(e["pass"], want_exit == 0) << e.dump();
  }
  EXPECT_FALSE(j["git_revision"].get<std::string>().empty());
  EXPECT_TRUE(j["machine"].contains("cpus"));
  // Every run wrote its timeline (100 ms samples) and plot.
  for (const auto& run : j["runs"]) {
    std::string d = out;
    if (j["runs"].size() > 1) d += "/" + run["name"].get<std::string>();
    std::string csv = ReadWholeFile(d + "/timeline.csv");
    size_t lines = static_cast<size_t>(std::count(csv.begin(), csv.end(), '\n'));
    EXPECT_GE(lines, 10u) << d;
    EXPECT_EQ(csv.rfind("t_s,ops_per_s,p50_us,p99_us,degraded_reads,regenerations_pending,", 0),
              0u);
    EXPECT_FALSE(ReadWholeFile(d + "/timeline.png").empty()) << d;
  }
  EXPECT_NE(ReadWholeFile(out + "/summary.md").find("Verdict: **"), std::string::npos);
  return j;
}

TEST(ExperimentCliTest, QuickKillDuringPython) {
  TempDir dir;
  json j = RunQuick("kill-during-python", dir);
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j["runs"][0]["server_failures"], 1);
  EXPECT_GT(j["healthy"]["completion_s"].get<double>(), 0);
}

TEST(ExperimentCliTest, QuickStragglerDelta) {
  TempDir dir;
  json j = RunQuick("straggler-delta", dir);
  ASSERT_TRUE(j.is_object());
  ASSERT_EQ(j["runs"].size(), 2u);
  // delta 0 asks exactly k members; reads needing the stopped server used to wait for it (the
  // load stalled to 0). They re-hedge now: the load may slow, never stop.
  const json& d0 = j["runs"][1];
  EXPECT_GT(d0["lowest_300ms_ops_per_s_during_faults"].get<double>(), 0.0)
      << "delta 0 stalled on the stopped server: reads waited on one server";
  EXPECT_EQ(d0["data_loss"], 0);
}

TEST(ExperimentCliTest, QuickBitflipRepair) {
  TempDir dir;
  json j = RunQuick("bitflip-repair", dir);
  ASSERT_TRUE(j.is_object());
  EXPECT_GT(j["runs"][0]["corruptions_detected"].get<int>(), 0);
}

TEST(ExperimentCliTest, QuickRackFailure) {
  TempDir dir;
  json j = RunQuick("rack-failure", dir);
  ASSERT_TRUE(j.is_object());
  ASSERT_EQ(j["runs"].size(), 2u);
  EXPECT_EQ(j["runs"][0]["server_failures"], 4);
  EXPECT_GT(j["runs"][1]["data_loss"].get<int>(), 0) << "random placement lost nothing";
}

TEST(ExperimentCliTest, QuickRPlusOne) {
  TempDir dir;
  json j = RunQuick("r-plus-one", dir);
  ASSERT_TRUE(j.is_object());
  EXPECT_GT(j["runs"][0]["pages_affected"].get<int>(), 0);
  EXPECT_EQ(j["runs"][0]["data_loss"], j["runs"][0]["pages_affected"]);
}

// Every memserver restarted in turn (kill + a fresh process on its port, joined by the store):
// nothing lost, and the slab census at the end equals the one after the fill.
TEST(ExperimentCliTest, QuickRollingRestart) {
  TempDir dir;
  json j = RunQuick("rolling-restart", dir);
  ASSERT_TRUE(j.is_object());
  const json& run = j["runs"][0];
  EXPECT_EQ(run["server_failures"], 8);
  EXPECT_EQ(run["data_loss"], 0);
  EXPECT_GT(run["slabs_after_fill"].get<int>(), 0);
  EXPECT_EQ(run["slabs_at_end"], run["slabs_after_fill"]);
}

// The runner's etcd SIGSTOPped, then SIGKILLed and restarted on its data, each for 3x the
// memservers' lease TTL, under a load whose store follows etcd membership. The leases run out
// (the store follows the leaves: evidence, never a verdict), yet no healthy server is declared
// failed, nothing is lost and the slab census is back to the baseline.
TEST(ExperimentCliTest, QuickEtcdOutage) {
  const std::string skip = tessera::testing::EtcdProcess::SkipReason();
  if (!skip.empty()) GTEST_SKIP() << skip;
  TempDir dir;
  json j = RunQuick("etcd-outage", dir);
  ASSERT_TRUE(j.is_object());
  const json& run = j["runs"][0];
  ASSERT_EQ(run["faults"].size(), 4u) << run["faults"].dump();
  for (const auto& f : run["faults"]) EXPECT_TRUE(f["ok"].get<bool>()) << f.dump();
  EXPECT_GT(run.value("etcd_leaves_followed", -1), 0)
      << "no lease expired: the outage was not longer than the TTL";
  // Every server that left came back: its next keep-alive registered it again.
  EXPECT_EQ(run.value("etcd_joins_followed", -1), 8 + run.value("etcd_leaves_followed", -1));
  EXPECT_EQ(run["false_failures"], 0);
  EXPECT_EQ(run["server_failures"], 0);
  EXPECT_EQ(run["data_loss"], 0);
  EXPECT_GT(run["reads_checked"].get<int64_t>(), 1000);
  EXPECT_GT(run["slabs_after_fill"].get<int>(), 0);
  EXPECT_EQ(run["slabs_at_end"], run["slabs_after_fill"]);
}

// A client process SIGKILLed five times, a fresh one started each time: the memservers
// reclaim every killed client's slabs after --orphan_grace, the final client and the runner's
// own load read all their pages back, and the census is back to the baseline. Without the
// orphan lease the killed clients' slabs stay, and the census says so.
TEST(ExperimentCliTest, QuickClientKillRepeated) {
  TempDir dir;
  json j = RunQuick("client-kill-repeated", dir);
  ASSERT_TRUE(j.is_object());
  const json& run = j["runs"][0];
  ASSERT_TRUE(run.contains("client_process")) << run.dump();
  const json& c = run["client_process"];
  EXPECT_EQ(c["kills"], 5) << c.dump();
  EXPECT_EQ(c["final_pages_checked"], 512) << c.dump();
  EXPECT_EQ(c["final_lost"], 0);
  EXPECT_EQ(c["final_wrong_bytes"], 0);
  EXPECT_EQ(run["data_loss"], 0);
  EXPECT_EQ(run["slabs_at_end"], run["slabs_after_fill"]);
  // 512 pages as RS(4,2) splits of 1 KiB in 64 KiB slabs: 48 slabs per client, all reclaimed.
  EXPECT_EQ(run["orphan_slabs_reclaimed"], 5 * 48);
  // Not before the 2 s grace; bounded by the census's wait.
  const double reclaimed = c.value("orphans_reclaimed_s_after_last_kill", -1.0);
  EXPECT_GE(reclaimed, 2.0);
  EXPECT_LT(reclaimed, 12.0);

  const BuiltinScenario* b = FindBuiltin("client-kill-repeated");
  ASSERT_NE(b, nullptr);
  std::string text = b->text;
  const std::string grace = "orphan_grace = \"2s\"";
  ASSERT_NE(text.find(grace), std::string::npos);
  text.replace(text.find(grace), grace.size(), "orphan_grace = \"0\"");
  TempDir dir0;
  const std::string out = dir0.path() + "/out";
  ToolResult r = Experiment({"run", Write(dir0, "no-lease.toml", text), "--quick", "--out", out});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  json n = json::parse(ReadWholeFile(out + "/summary.json"), nullptr, false);
  ASSERT_FALSE(n.is_discarded()) << r.output;
  const json& nr = n["runs"][0];
  EXPECT_EQ(nr["data_loss"], 0);
  EXPECT_EQ(nr["slabs_at_end"].get<int>(), nr["slabs_after_fill"].get<int>() + 5 * 48)
      << "the killed clients' slabs should stay without an orphan lease";
}

TEST(ExperimentCliTest, QuickParamsvcAggregatorKill) {
  TempDir dir;
  json j = RunQuick("paramsvc-aggregator-kill", dir);
  ASSERT_TRUE(j.is_object());
  const json& r = j["runs"][0];
  ASSERT_EQ(r["faults"].size(), 2u);
  EXPECT_TRUE(r["faults"][1]["ok"].get<bool>()) << r["faults"][1].dump();
  EXPECT_GE(r["reconnects"].get<int>(), 1) << "the workers never saw the aggregator die";
}

// A memserver SIGKILLed under a replicated KV load: every value checked, none lost or wrong.
// Then the same without replication: the dead server's keys fail with errors, which are
// counted as errors and never as wrong values or lost PUTs.
TEST(ExperimentCliTest, QuickKvKillReplicatedAndUnreplicated) {
  TempDir dir;
  json j = RunQuick("kv-kill-replicated", dir);
  ASSERT_TRUE(j.is_object());
  const json& r = j["runs"][0];
  ASSERT_EQ(r["faults"].size(), 1u);
  EXPECT_TRUE(r["faults"][0]["ok"].get<bool>()) << r["faults"][0].dump();
  EXPECT_GT(r["kv"]["ops"].get<int64_t>(), 1000);
  EXPECT_GT(r["kv"]["values_checked"].get<int64_t>(), 1000);
  EXPECT_EQ(r["kv"]["acknowledged_puts_lost"], 0);
  EXPECT_EQ(r["kv"]["wrong_values"], 0);
  EXPECT_GT(r["kv"]["invokes_rpc"].get<int64_t>() + r["kv"]["invokes_kv"].get<int64_t>(), 0);

  const BuiltinScenario* b = FindBuiltin("kv-kill-replicated");
  ASSERT_NE(b, nullptr);
  std::string text = b->text;
  const size_t at = text.find("replicas = 2");
  ASSERT_NE(at, std::string::npos);
  text.replace(at, 12, "replicas = 1");
  TempDir dir1;
  json u = RunQuick(Write(dir1, "unreplicated.toml", text), dir1);
  ASSERT_TRUE(u.is_object());
  const json& kv = u["runs"][0]["kv"];
  EXPECT_GT(kv["get_errors"].get<int64_t>() + kv["invoke_errors"].get<int64_t>() +
                kv["final_read_errors"].get<int64_t>(),
            0)
      << "no op failed on the killed unreplicated server: " << kv.dump();
  EXPECT_NE(kv["first_error"].get<std::string>().find("Unavailable"), std::string::npos)
      << kv.dump();
  EXPECT_EQ(kv["wrong_values"], 0);
  EXPECT_EQ(kv["acknowledged_puts_lost"], 0);
}

TEST(ExperimentCliTest, FailedExpectationExits1) {
  TempDir dir;
  // Killing r+1 servers of page 0's group and expecting no loss must fail the verdict.
  std::string path = Write(dir, "fail.toml",
                           "name = \"must-fail\"\nduration_s = 3\n[cluster]\nmemservers = 8\n"
                           "slab_size = \"64K\"\ncapacity = \"64M\"\n"
                           "[workload]\nkind = \"pagestore\"\npages = 1024\nread_ratio = 1.0\n"
                           "[[fault]]\nat_s = 0.5\naction = \"kill\"\ntarget = \"page:0\"\n"
                           "count = 3\n[expect]\ndata_loss = 0\n");
  json j = RunQuick(path, dir, 1);
  ASSERT_TRUE(j.is_object());
  EXPECT_GT(j["runs"][0]["data_loss"].get<int>(), 0);
}

const char* kPartition =
    "name = \"partition-heal\"\nseed = 2\nduration_s = DURATION\n[cluster]\nmemservers = 7\n"
    "k = 4\nr = 2\n[workload]\nkind = \"pagestore\"\npages = 1024\nqd = 8\nread_ratio = 0.8\n"
    "[[fault]]\nat_s = 0.5\naction = \"partition\"\ntarget = \"server:0\"\n"
    "HEAL[expect]\nwrong_bytes = 0\ndata_loss = 0\n";

std::string PartitionScenario(const std::string& duration, bool heal) {
  std::string s = kPartition;
  s.replace(s.find("DURATION"), 8, duration);
  s.replace(s.find("HEAL"), 4,
            heal ? "[[fault]]\nat_s = 4.5\naction = \"heal\"\ntarget = \"server:0\"\n" : "");
  return s;
}

// The machine-wide lock may be held by another tool for a long time (a swap bench): then the
// runner falls back to the drop-all fault after --lock_wait_s, and says why.
TEST(ExperimentCliTest, PartitionIsRemovedAfterTheRun) {
  TempDir dir;
  Partition probe("/tmp/tessera-experiment-test.lock");
  const bool real = probe.Available().ok();
  // The partition lasts 4 s: the earliest verdict on a silent server comes 1 s of silence plus
  // 1 s of sustained suspicion plus a failed probe after the cut, so a 2 s partition could be
  // healed before it on a busy machine (the server then counts as recovered, never failed).
  std::string path = Write(dir, "p.toml", PartitionScenario("6", true));
  const std::string out = dir.path() + "/out";
  ToolResult r = Experiment({"run", path, "--quick", "--out", out, "--lock_wait_s=20"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  json j = json::parse(ReadWholeFile(out + "/summary.json"), nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.output;
  EXPECT_EQ(j["verdict"], "PASS") << r.output;
  const std::string mode = j["runs"][0].value("partition_mode", "");
  EXPECT_EQ(ReadWholeFile(out + "/partition.txt").rfind(mode.substr(0, 20), 0), 0u);
  if (real && mode.rfind("nftables", 0) == 0) {
    std::string table = mode.substr(mode.find("tessera_exp_"));
    table = table.substr(0, table.find(','));
    EXPECT_FALSE(Partition::TableExists(table)) << table << " was left behind";
    // The partitioned server was noticed (heartbeats time out) and its data rebuilt.
    EXPECT_EQ(j["runs"][0]["server_failures"], 1);
  } else {
    EXPECT_NE(mode.find("drop-all fault (nftables not usable: "), std::string::npos) << mode;
    if (real) {
      EXPECT_NE(mode.find("held"), std::string::npos) << mode;
    }
    std::fprintf(stderr, "note: partition ran as the fallback: %s\n", mode.c_str());
  }
}

// [cluster] hosts = "netns": every memserver in a network namespace of its own; a partition
// takes that host's link down (no nftables), and the store fails it and rebuilds its data.
// (LocalCluster's teardown of the namespaces is tested in tests/client/hosts_test.cc.)
TEST(ExperimentCliTest, PartitionOfANamespaceHost) {
  if (::geteuid() != 0) GTEST_SKIP() << "network namespaces need root";
  TempDir dir;
  std::string text = PartitionScenario("6", true);
  text.replace(text.find("[cluster]\n"), 10, "[cluster]\nhosts = \"netns\"\n");
  const std::string path = Write(dir, "p.toml", text);
  const std::string out = dir.path() + "/out";
  ToolResult r = Experiment({"run", path, "--quick", "--out", out});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  json j = json::parse(ReadWholeFile(out + "/summary.json"), nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.output;
  EXPECT_EQ(j["verdict"], "PASS") << r.output;
  const json& run = j["runs"][0];
  EXPECT_EQ(run["cluster"]["hosts"], "netns") << run.dump();
  EXPECT_EQ(run.value("partition_mode", ""),
            "network namespaces: the partitioned host's veth is down");
  EXPECT_EQ(run["server_failures"], 1);
  EXPECT_EQ(run["data_loss"], 0);
}

TEST(ExperimentCliTest, PartitionIsRemovedWhenInterrupted) {
  Partition probe("/tmp/tessera-experiment-test.lock");
  if (!probe.Available().ok()) GTEST_SKIP() << "nftables not usable here: " << probe.Available();
  TempDir dir;
  std::string path = Write(dir, "p.toml", PartitionScenario("60", false));
  const std::string out = dir.path() + "/out";
  auto proc = Subprocess::Start(
      {Exe(), "run", path, "--out", out, "--progress=false", "--lock_wait_s=20"},
      Subprocess::Options{.capture_stdout = false, .quiet_stderr = true, .extra_env = {}});
  ASSERT_TRUE(proc.ok()) << proc.status();
  const std::string table = "tessera_exp_" + std::to_string(proc->pid());
  // The runner settles the partition mode before it starts the clock.
  Deadline d = Deadline::AfterMs(120000);
  std::string mode;
  while (mode.empty() && !d.Expired() && !proc->Poll()) {
    mode = ReadWholeFile(out + "/partition.txt");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // polling for the file
  }
  ASSERT_FALSE(mode.empty()) << "the runner never decided how to partition";
  const bool real = mode.rfind("nftables", 0) == 0;
  while (real && !Partition::TableExists(table) && !d.Expired() && !proc->Poll()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // polling for the rule
  }
  if (real) {
    ASSERT_TRUE(Partition::TableExists(table)) << "the partition never appeared";
  }
  ASSERT_TRUE(proc->Signal(SIGTERM).ok());
  auto ws = proc->Wait(Deadline::AfterMs(60000));
  ASSERT_TRUE(ws.ok()) << ws.status();
  EXPECT_TRUE(WIFEXITED(*ws));
  EXPECT_EQ(WEXITSTATUS(*ws), 130);
  EXPECT_FALSE(Partition::TableExists(table)) << table << " was left behind after SIGTERM";
  if (!real) GTEST_SKIP() << "the system lock was busy, the runner fell back: " << mode;
}

}  // namespace
}  // namespace tessera::experiment
