// Scenario files: every built-in parses; bad files get an error naming the file and line.
#include "apps/experiment/scenario.h"

#include <gtest/gtest.h>

#include <string>

#include "apps/experiment/builtin.h"
#include "apps/experiment/runner.h"
#include "apps/experiment/workload.h"

namespace tessera::experiment {
namespace {

const char* kGood = R"(name = "t"
seed = 3
duration_s = 10
[cluster]
memservers = 8
racks = 2
k = 4
r = 2
[workload]
kind = "pagestore"
pages = 1024
qd = 8
read_ratio = 0.5
[[fault]]
at_s = 2
action = "kill"
target = "rack:1"
[[fault]]
at_event = "loaded"
action = "delay"
delay = "500us"
target = "server:3"
duration_s = 1.5
[expect]
data_loss = 0
wrong_bytes = 0
regenerated_within_s = 5
[quick]
duration_s = 4
time_scale = 0.5
[quick.workload]
pages = 256
)";

// Replaces the first occurrence of `from` in `base` (kGood).
std::string Edit(const std::string& from, const std::string& to, const char* base = kGood) {
  std::string s = base;
  size_t p = s.find(from);
  EXPECT_NE(p, std::string::npos) << from;
  if (p != std::string::npos) s.replace(p, from.size(), to);
  return s;
}

// Parses `text` and expects an error mentioning "f.toml:LINE:" and `words`.
void ExpectError(const std::string& text, int line, const std::string& words) {
  auto r = ParseScenario(text, "f.toml");
  ASSERT_FALSE(r.ok()) << "accepted:\n" << text;
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  const std::string& m = r.status().message();
  EXPECT_NE(m.find("f.toml:" + std::to_string(line) + ":"), std::string::npos) << m;
  EXPECT_NE(m.find(words), std::string::npos) << m;
}

TEST(ScenarioTest, ParsesEveryKey) {
  auto r = ParseScenario(kGood, "f.toml");
  ASSERT_TRUE(r.ok()) << r.status();
  const Scenario& s = *r;
  EXPECT_EQ(s.name, "t");
  EXPECT_EQ(s.seed, 3u);
  EXPECT_EQ(s.cluster.memservers, 8);
  EXPECT_EQ(s.cluster.racks, 2);
  EXPECT_EQ(s.workload.kind, WorkloadKind::kPagestore);
  EXPECT_EQ(s.workload.pagestore.pages, 1024u);
  EXPECT_EQ(s.workload.pagestore.qd, 8);
  EXPECT_DOUBLE_EQ(s.workload.pagestore.read_ratio, 0.5);
  ASSERT_EQ(s.faults.size(), 2u);
  EXPECT_EQ(s.faults[0].action, FaultAction::kKill);
  EXPECT_EQ(s.faults[0].target.kind, TargetKind::kRack);
  EXPECT_EQ(s.faults[0].target.n, 1u);
  EXPECT_EQ(s.faults[1].at_event, "loaded");
  EXPECT_EQ(s.faults[1].delay, "500us");
  EXPECT_EQ(*s.expect.data_loss, 0);
  EXPECT_DOUBLE_EQ(*s.expect.regenerated_within_s, 5);
  Scenario q = ApplyQuick(s);
  EXPECT_DOUBLE_EQ(q.duration_s, 4);
  EXPECT_EQ(q.workload.pagestore.pages, 256u);
  EXPECT_EQ(q.workload.pagestore.qd, 8);  // Not overridden.
  EXPECT_DOUBLE_EQ(*q.faults[0].at_s, 1.0);
  EXPECT_DOUBLE_EQ(q.faults[1].duration_s, 0.75);
}

TEST(ScenarioTest, UnknownKeysNameTheirLine) {
  ExpectError(Edit("seed = 3", "sede = 3"), 2, "unknown key 'sede'");
  ExpectError(Edit("racks = 2", "rakcs = 2"), 6, "unknown key 'rakcs' in [cluster]");
  ExpectError(Edit("qd = 8", "depth = 8"), 12, "unknown key 'depth' in [workload]");
  ExpectError(Edit("action = \"kill\"", "acton = \"kill\""), 16, "unknown key 'acton'");
  ExpectError(Edit("wrong_bytes = 0", "wrong_byte = 0"), 26, "unknown key 'wrong_byte'");
  ExpectError(Edit("[quick.workload]", "[quick.workloads]"), 31, "unknown key 'workloads'");
}

TEST(ScenarioTest, BadValuesNameTheirLine) {
  ExpectError(Edit("memservers = 8", "memservers = \"8\""), 5, "memservers must be an integer");
  ExpectError(Edit("memservers = 8", "memservers = 0"), 5, "memservers must be in [1, 64]");
  ExpectError(Edit("k = 4", "k = 3"), 7, "k must divide 4096");
  ExpectError(Edit("read_ratio = 0.5", "read_ratio = 1.5"), 13, "read_ratio must be in");
  ExpectError(Edit("kind = \"pagestore\"", "kind = \"pagestor\""), 10, "kind must be one of");
  ExpectError(Edit("action = \"kill\"", "action = \"explode\""), 16, "action must be one of");
  ExpectError(Edit("delay = \"500us\"", "delay = \"fast\""), 21, "delay must be a duration");
  ExpectError(Edit("at_s = 2", "at_s = 20"), 15, "at_s must be before duration_s");
  ExpectError(Edit("duration_s = 10", "duration_s = -1"), 3, "duration_s must be in");
  ExpectError(Edit("regenerated_within_s = 5", "regenerated_within_s = true"), 27,
              "regenerated_within_s must be a number");
  // A TOML syntax error names its line too.
  ExpectError(Edit("qd = 8", "qd = = 8"), 12, "");
}

TEST(ScenarioTest, BadTargetsAreRejected) {
  ExpectError(Edit("target = \"rack:1\"", "target = \"rack:2\""), 17, "racks 0..1");
  ExpectError(Edit("target = \"rack:1\"", "target = \"server:8\""), 17, "servers 0..7");
  ExpectError(Edit("target = \"rack:1\"", "target = \"host:1\""), 17, "bad target 'host:1'");
  ExpectError(Edit("target = \"rack:1\"", "target = \"server:\""), 17, "needs a number");
  ExpectError(Edit("target = \"rack:1\"", "target = \"random:9\""), 17, "random:N needs");
  ExpectError(Edit("target = \"rack:1\"", "target = \"page:1024\""), 17, "pages 0..1023");
  ExpectError(Edit("racks = 2\n", ""), 16, "the cluster has no racks");
  ExpectError(Edit("target = \"rack:1\"", "target = \"aggregator\""), 17,
              "target aggregator needs a paramsvc workload");
}

TEST(ScenarioTest, MissingFieldsAreNamed) {
  ExpectError(Edit("name = \"t\"\n", ""), 1, "needs name");
  ExpectError(Edit("duration_s = 10\n", ""), 1, "needs duration_s");
  ExpectError(Edit("memservers = 8\n", ""), 4, "needs memservers");
  ExpectError(Edit("kind = \"pagestore\"\n", ""), 9, "needs kind");
  ExpectError(Edit("pages = 1024\n", ""), 9, "needs pages");
  ExpectError(Edit("target = \"rack:1\"\n", ""), 14, "needs target");
  ExpectError(Edit("action = \"kill\"\n", ""), 14, "needs action");
  ExpectError(Edit("at_s = 2\n", ""), 14, "exactly one of at_s or at_event");
}

TEST(ScenarioTest, KeysOfTheWrongKindAreRejected) {
  ExpectError(Edit("qd = 8", "qd = 8\ncommand = [\"true\"]"), 13,
              "kind = \"run\" and \"swap\" only");
  ExpectError(Edit("wrong_bytes = 0", "identical_output = true"), 26,
              "kind = \"run\" and \"swap\" workloads");
  ExpectError(Edit("duration_s = 1.5", "duration_s = 1.5\nbits = 3"), 24, "bitflip");
  ExpectError(Edit("at_event = \"loaded\"", "at_event = \"half\""), 19, "\"loaded\"");
}

TEST(ScenarioTest, VariantsAreChecked) {
  std::string v = std::string(kGood) +
                  "[[variant]]\nname = \"a\"\ndelta = 0\n[variant.expect]\n"
                  "throughput_above_variant = \"b\"\n"
                  "[[variant]]\nname = \"b\"\nplacement = \"random\"\n";
  auto r = ParseScenario(v, "f.toml");
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->variants.size(), 2u);
  EXPECT_EQ(VariantCluster(*r, &r->variants[0]).delta, 0);
  EXPECT_EQ(VariantCluster(*r, &r->variants[1]).placement, "random");
  std::string bad = v;
  bad.replace(bad.find("\"b\"\n[["), 3, "\"c\"");
  ExpectError(bad, 33, "compares with 'c'");
  std::string dup = v;
  dup.replace(dup.rfind("name = \"b\""), 10, "name = \"a\"");
  ExpectError(dup, 39, "named twice");
}

// The rolling restart's fault and the slab census expectation (chaos scenarios).
TEST(ScenarioTest, RestartAndSlabsBackToBaseline) {
  auto r = ParseScenario(Edit("action = \"kill\"", "action = \"restart\"") +
                             "[quick.expect]\nslabs_back_to_baseline = true\n",
                         "f.toml");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->faults[0].action, FaultAction::kRestart);
  EXPECT_STREQ(FaultActionName(FaultAction::kRestart), "restart");
  EXPECT_FALSE(r->expect.slabs_back_to_baseline.has_value());
  EXPECT_EQ(ApplyQuick(*r).expect.slabs_back_to_baseline, true);
  auto bad = ParseScenario(Edit("wrong_bytes = 0", "wrong_bytes = 0\nslabs_back_to_baseline = 1"),
                           "f.toml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("slabs_back_to_baseline must be true or false"),
            std::string::npos)
      << bad.status();
  // Only a pagestore workload's store can join the fresh server.
  std::string run = Edit("kind = \"pagestore\"\npages = 1024\nqd = 8\nread_ratio = 0.5",
                         "kind = \"run\"\ncommand = [\"true\"]");
  const std::string kill = "action = \"kill\"";
  run.replace(run.find(kill), kill.size(), "action = \"restart\"");
  run = run.substr(0, run.find("[expect]"));
  ExpectError(run, 14, "restart needs a pagestore workload");
}

TEST(ScenarioTest, AfterRecoveryHoldsAFaultForThePagestore) {
  auto r = ParseScenario(Edit("action = \"kill\"", "action = \"kill\"\nafter_recovery = true"),
                         "f.toml");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->faults[0].after_recovery);
  EXPECT_FALSE(r->faults[1].after_recovery);
  ExpectError(Edit("action = \"kill\"", "action = \"kill\"\nafter_recovery = 1"), 17,
              "after_recovery");
  // Only a pagestore workload has a store whose recovery can be waited for.
  std::string run = Edit("kind = \"pagestore\"\npages = 1024\nqd = 8\nread_ratio = 0.5",
                         "kind = \"run\"\ncommand = [\"true\"]");
  const std::string kill = "action = \"kill\"";
  run.replace(run.find(kill), kill.size(), "action = \"kill\"\nafter_recovery = true");
  run = run.substr(0, run.find("[expect]"));
  ExpectError(run, 15, "after_recovery needs a pagestore workload");
}

TEST(ScenarioTest, HostsAreLoopbackOrNetns) {
  auto r = ParseScenario(kGood, "f.toml");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->cluster.hosts, "loopback");
  auto n = ParseScenario(Edit("[cluster]\n", "[cluster]\nhosts = \"netns\"\n"), "f.toml");
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(n->cluster.hosts, "netns");
  ExpectError(Edit("[cluster]\n", "[cluster]\nhosts = \"moon\"\n"), 5, "hosts");
}

// [cluster] membership = "etcd" and the fault target etcd; the client process of a pagestore
// workload and the fault target client; orphan_grace; the false_failures expectation.
const char* kProcesses = R"(name = "p"
duration_s = 10
[cluster]
memservers = 8
membership = "etcd"
etcd_ttl_s = 2
orphan_grace = "2s"
[workload]
kind = "pagestore"
pages = 1024
client_pages = 64
[[fault]]
at_s = 1
action = "stop"
target = "etcd"
duration_s = 3
[[fault]]
at_s = 5
action = "kill"
target = "etcd"
duration_s = 3
[[fault]]
at_s = 6
action = "kill"
target = "client"
[expect]
false_failures = 0
slabs_back_to_baseline = true
)";

std::string EditProcesses(const std::string& from, const std::string& to) {
  return Edit(from, to, kProcesses);
}

TEST(ScenarioTest, EtcdMembershipAndTheClientProcess) {
  auto r = ParseScenario(kProcesses, "f.toml");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->cluster.membership, "etcd");
  EXPECT_EQ(r->cluster.etcd_ttl_s, 2);
  EXPECT_EQ(r->cluster.orphan_grace, "2s");
  EXPECT_EQ(r->workload.pagestore.client_pages, 64u);
  EXPECT_EQ(r->faults[0].target.kind, TargetKind::kEtcd);
  EXPECT_EQ(r->faults[1].action, FaultAction::kKill);
  EXPECT_DOUBLE_EQ(r->faults[1].duration_s, 3);
  EXPECT_EQ(r->faults[2].target.kind, TargetKind::kClient);
  EXPECT_EQ(r->expect.false_failures, 0);
  // The defaults: static membership, no orphan lease, no client process.
  auto g = ParseScenario(kGood, "f.toml");
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->cluster.membership, "static");
  EXPECT_EQ(g->cluster.orphan_grace, "0");
  EXPECT_EQ(g->workload.pagestore.client_pages, 0u);

  ExpectError(EditProcesses("membership = \"etcd\"", "membership = \"zookeeper\""), 5,
              "membership must be one of static, etcd");
  ExpectError(EditProcesses("membership = \"etcd\"\n", ""), 5,
              "etcd_ttl_s applies to membership = \"etcd\" only");
  ExpectError(EditProcesses("etcd_ttl_s = 2", "etcd_ttl_s = 1"), 6, "etcd_ttl_s must be in [2, 60]");
  ExpectError(EditProcesses("etcd_ttl_s = 2", "racks = 2"), 6, "register without rack labels");
  ExpectError(EditProcesses("orphan_grace = \"2s\"", "orphan_grace = \"soon\""), 7,
              "orphan_grace must be");
  // The target etcd needs the runner's etcd, and is killed, stopped or resumed only.
  ExpectError(EditProcesses("membership = \"etcd\"\netcd_ttl_s = 2\n", ""), 13,
              "target etcd needs [cluster] membership = \"etcd\"");
  ExpectError(EditProcesses("action = \"stop\"", "action = \"bitflip\""), 15,
              "etcd can be killed, stopped or resumed only");
  // duration_s with kill: of etcd only (a killed server is not brought back by a timer).
  ExpectError(EditProcesses("action = \"kill\"\ntarget = \"etcd\"", "action = \"kill\"\ntarget = \"server:1\""),
              21, "duration_s applies to stop, delay, drop, partition and a kill of etcd only");
  // The target client needs client_pages, and is only killed.
  ExpectError(EditProcesses("client_pages = 64\n", ""), 24, "target client needs a pagestore workload");
  ExpectError(EditProcesses("target = \"client\"", "target = \"client\"\nduration_s = 1"), 26,
              "duration_s applies to");
  ExpectError(EditProcesses("action = \"kill\"\ntarget = \"client\"",
                            "action = \"stop\"\ntarget = \"client\""),
              25, "the client can be killed only");
  ExpectError(EditProcesses("client_pages = 64", "client_pages = 4"), 11, "client_pages must be in");
  // Only the pagestore's store follows the runner's etcd.
  std::string kv = kProcesses;
  kv = kv.substr(0, kv.find("[workload]")) + "[workload]\nkind = \"kv\"\nkeys = 100\n";
  ExpectError(kv, 5, "membership = \"etcd\" needs a pagestore workload");
}

TEST(ScenarioTest, EveryBuiltinParsesAndCanRun) {
  ASSERT_EQ(BuiltinScenarios().size(), 12u);
  for (const BuiltinScenario& b : BuiltinScenarios()) {
    auto r = ParseScenario(b.text, b.name);
    ASSERT_TRUE(r.ok()) << b.name << ": " << r.status();
    EXPECT_EQ(r->name, b.name);
    EXPECT_TRUE(r->quick.present) << b.name << " has no [quick] size for CI";
    EXPECT_TRUE(CheckRunnable(*r).ok()) << b.name << ": " << CheckRunnable(*r);
  }
  EXPECT_NE(FindBuiltin("rack-failure"), nullptr);
  EXPECT_EQ(FindBuiltin("nope"), nullptr);
}

TEST(ScenarioTest, LayoutsApplyToThePagestoreAndRunButNotParamsvc) {
  auto group = ParseScenario(Edit("k = 4", "layout = \"group\"\nk = 4"), "f.toml");
  ASSERT_TRUE(group.ok()) << group.status();
  EXPECT_EQ(group->cluster.layout, "group");
  EXPECT_TRUE(CheckRunnable(*group).ok()) << CheckRunnable(*group);
  ExpectError(Edit("k = 4", "layout = \"stripes\"\nk = 4"), 7,
              "layout must be one of split, group");
  // kind = run passes the layout to `tessera run --layout`.
  const BuiltinScenario* python = FindBuiltin("kill-during-python");
  ASSERT_NE(python, nullptr);
  std::string text = python->text;
  text.replace(text.find("k = 4"), 5, "layout = \"split\"\nk = 4");
  auto run = ParseScenario(text, "python.toml");
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->cluster.layout, "split");
  EXPECT_TRUE(CheckRunnable(*run).ok()) << CheckRunnable(*run);
  // The Parameter Service's checkpoint store has no layout setting.
  const BuiltinScenario* ps = FindBuiltin("paramsvc-aggregator-kill");
  ASSERT_NE(ps, nullptr);
  text = ps->text;
  const size_t at = text.find("[cluster]\n");
  ASSERT_NE(at, std::string::npos);
  text.insert(at + 10, "layout = \"group\"\n");
  auto svc = ParseScenario(text, "ps.toml");
  ASSERT_TRUE(svc.ok()) << svc.status();
  Status st = CheckRunnable(*svc);
  EXPECT_EQ(st.code(), StatusCode::kUnsupported) << st;
  EXPECT_NE(st.message().find("layout applies to kind = \"pagestore\", \"run\" and \"swap\" only"),
            std::string::npos)
      << st;
}

// kind = kv: its keys parse, apply to kv only, and bad values name their line.
TEST(ScenarioTest, KvWorkloadKeysAreChecked) {
  const std::string head = "name = \"t\"\nduration_s = 5\n[cluster]\nmemservers = 4\nk = 2\nr = 1\n[workload]\n";
  auto kv = ParseScenario(head + "kind = \"kv\"\nkeys = 100\nvalue_size = 64\nreplicas = 2\n"
                                 "clients = 3\nput_ratio = 0.5\ninvoke_ratio = 0.1\nhops = 2\n",
                          "f.toml");
  ASSERT_TRUE(kv.ok()) << kv.status();
  EXPECT_EQ(kv->workload.kind, WorkloadKind::kKv);
  EXPECT_EQ(kv->workload.kv.keys, 100u);
  EXPECT_EQ(kv->workload.kv.value_size, 64u);
  EXPECT_EQ(kv->workload.kv.replicas, 2);
  EXPECT_EQ(kv->workload.kv.clients, 3);
  EXPECT_EQ(kv->workload.kv.hops, 2);
  EXPECT_DOUBLE_EQ(kv->workload.kv.put_ratio, 0.5);
  EXPECT_DOUBLE_EQ(kv->workload.kv.invoke_ratio, 0.1);
  EXPECT_EQ(kv->workload.kv.mode, "kayak");  // the default mode for kv
  EXPECT_TRUE(CheckRunnable(*kv).ok()) << CheckRunnable(*kv);
  ExpectError(head + "kind = \"kv\"\nmode = \"sync\"\n", 9,
              "mode for kind = \"kv\" must be one of kv, rpc, pushback, kayak");
  ExpectError(head + "kind = \"kv\"\nreplicas = 5\n", 9, "replicas (5) must be at most memservers");
  ExpectError(head + "kind = \"kv\"\nput_ratio = 0.7\ninvoke_ratio = 0.5\n", 10,
              "put_ratio + invoke_ratio must be at most 1");
  ExpectError(head + "kind = \"kv\"\nvalue_size = 8\n", 9, "value_size must be in [16, 65536]");
  ExpectError(head + "kind = \"kv\"\nqd = 4\n", 9, "qd applies to kind = \"pagestore\" only");
  ExpectError(head + "kind = \"pagestore\"\npages = 64\nhops = 4\n", 10,
              "hops applies to kind = \"kv\" only");
  ExpectError(head + "kind = \"paramsvc\"\niterations = 4\nmode = \"rpc\"\n", 10,
              "mode for kind = \"paramsvc\" must be sync or async");
  // A stop for good would block the client's requests for ever: refused with the line.
  const std::string kv_head = head + "kind = \"kv\"\n[[fault]]\nat_s = 1\naction = \"stop\"\n"
                                     "target = \"server:1\"\n";
  auto stop = ParseScenario(kv_head, "f.toml");
  ASSERT_TRUE(stop.ok()) << stop.status();
  Status st = CheckRunnable(*stop);
  EXPECT_EQ(st.code(), StatusCode::kUnsupported) << st;
  EXPECT_NE(st.message().find("f.toml:9: with kind = \"kv\" a stop needs duration_s or a later "
                              "resume"),
            std::string::npos)
      << st;
  auto timed = ParseScenario(kv_head + "duration_s = 0.5\n", "f.toml");
  ASSERT_TRUE(timed.ok()) << timed.status();
  EXPECT_TRUE(CheckRunnable(*timed).ok()) << CheckRunnable(*timed);
  // The KV tables are replicated, not erasure-coded: a layout is refused with the reason.
  auto lay = ParseScenario("name = \"t\"\nduration_s = 5\n[cluster]\nmemservers = 4\n"
                           "layout = \"group\"\nk = 2\nr = 1\n[workload]\nkind = \"kv\"\n",
                           "f.toml");
  ASSERT_TRUE(lay.ok()) << lay.status();
  EXPECT_EQ(CheckRunnable(*lay).code(), StatusCode::kUnsupported);
}

// The kind is parsed once into an enum; an unknown one is refused naming the known kinds, and
// every kind has its implementation registered.
TEST(ScenarioTest, WorkloadKindsParseOnceAndEachHasAType) {
  for (WorkloadKind k :
       {WorkloadKind::kRun, WorkloadKind::kSwap, WorkloadKind::kPagestore, WorkloadKind::kKv,
        WorkloadKind::kParamsvc}) {
    auto parsed = ParseWorkloadKind(WorkloadKindName(k));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, k);
    EXPECT_EQ(TypeOf(k).kind, k) << WorkloadKindName(k);
  }
  auto bad = ParseWorkloadKind("zram");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("kind must be one of run, swap, pagestore, kv, paramsvc, "
                                        "got 'zram'"),
            std::string::npos)
      << bad.status();
  ExpectError(Edit("kind = \"pagestore\"", "kind = \"zram\""), 10,
              "kind must be one of run, swap, pagestore, kv, paramsvc, got 'zram'");
  ExpectError(Edit("kind = \"pagestore\"", "kind = 3"), 10, "kind must be a string");
}

// kind = swap takes the keys of kind = run (a program, its local memory, its output compared
// with a local run's) and refuses what only a checked load has.
TEST(ScenarioTest, SwapKindTakesTheProgramKeys) {
  const BuiltinScenario* swap = FindBuiltin("kill-during-swap");
  ASSERT_NE(swap, nullptr);
  auto s = ParseScenario(swap->text, "swap.toml");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->workload.kind, WorkloadKind::kSwap);
  EXPECT_EQ(s->workload.run.local_memory, "50%");
  ASSERT_FALSE(s->workload.run.command.empty());
  EXPECT_EQ(s->workload.run.command[0], "/usr/bin/python3");
  EXPECT_TRUE(s->expect.identical_output.value_or(false));
  std::string text = swap->text;
  text.replace(text.find("command = ["), 0, "# ");  // The full-size command, commented out.
  auto no_command = ParseScenario(text, "swap.toml");
  ASSERT_FALSE(no_command.ok());
  EXPECT_NE(no_command.status().message().find("kind = \"swap\" needs command"),
            std::string::npos)
      << no_command.status();
  text = swap->text;
  text.replace(text.find("data_loss = 0"), 13, "wrong_bytes = 0");
  auto wrong = ParseScenario(text, "swap.toml");
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("wrong_bytes applies to"), std::string::npos)
      << wrong.status();
}

// Each kind has its own options: `mode` is the training mode of a paramsvc workload and the
// controller mode of a kv workload, and [quick.workload] overrides the kind's own keys.
TEST(ScenarioTest, EachKindHasItsOwnOptions) {
  const std::string head =
      "name = \"t\"\nduration_s = 5\n[cluster]\nmemservers = 4\nk = 2\nr = 1\n[workload]\n";
  auto ps = ParseScenario(head +
                              "kind = \"paramsvc\"\niterations = 40\nworkers = 3\n"
                              "elements = 1024\nmode = \"async\"\n[quick.workload]\n"
                              "iterations = 8\n",
                          "f.toml");
  ASSERT_TRUE(ps.ok()) << ps.status();
  EXPECT_EQ(ps->workload.kind, WorkloadKind::kParamsvc);
  EXPECT_EQ(ps->workload.paramsvc.iterations, 40u);
  EXPECT_EQ(ps->workload.paramsvc.workers, 3);
  EXPECT_EQ(ps->workload.paramsvc.elements, 1024u);
  EXPECT_EQ(ps->workload.paramsvc.mode, ParamsvcMode::kAsync);
  EXPECT_EQ(ps->workload.kv.mode, "kayak");  // Untouched: not this kind's.
  const Scenario q = ApplyQuick(*ps);
  EXPECT_EQ(q.workload.paramsvc.iterations, 8u);
  EXPECT_EQ(q.workload.paramsvc.mode, ParamsvcMode::kAsync);  // Not overridden.
  EXPECT_EQ(q.workload.paramsvc.workers, 3);

  auto kv = ParseScenario(head +
                              "kind = \"kv\"\nmode = \"rpc\"\nops = 500\n"
                              "verify_at_end = false\n",
                          "f.toml");
  ASSERT_TRUE(kv.ok()) << kv.status();
  EXPECT_EQ(kv->workload.kv.mode, "rpc");
  EXPECT_EQ(kv->workload.kv.ops, 500u);
  EXPECT_FALSE(kv->workload.kv.verify_at_end);
  EXPECT_EQ(kv->workload.paramsvc.mode, ParamsvcMode::kSync);  // Untouched: not this kind's.
  EXPECT_EQ(kv->workload.pagestore.ops, 0u);

  auto run = ParseScenario(head +
                               "kind = \"run\"\ncommand = [\"true\", \"${data_dir}/x\"]\n"
                               "local_memory = \"25%\"\n",
                           "f.toml");
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->workload.run.local_memory, "25%");
  EXPECT_EQ(ExpandCommand(run->workload.run.command, "/d"),
            (std::vector<std::string>{"true", "/d/x"}));
}

}  // namespace
}  // namespace tessera::experiment
