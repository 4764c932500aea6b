// Moves of jobs between Parameter Services as real processes (server.h "Moves between
// servers"): two `tessera paramsvc serve`, each checkpointing into the same three real
// memservers, two workers training over loopback, `tessera paramsvc move` and `drain` as the
// operator runs them, and aggregation servers SIGKILLed at each side of a move's commit point.
//
// Every test checks the job exactly: a worker's gradient depends only on the version it was
// computed on, so each partition must equal 100 - sum over its versions of both workers'
// gradients. An update lost or applied twice (on either server) breaks that.
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <thread>

#include "apps/paramsvc/client/client.h"
#include "client/local_cluster.h"
#include "common/subprocess.h"
#include "tests/paramsvc/serve_process.h"
#include "tests/support/test_util.h"

namespace tessera::paramsvc {
namespace {

using tessera::testing::BinDir;
using tessera::testing::RunTessera;
using json = nlohmann::json;

// Waits for the line a service prints when a move reaches `phase` (--move_hold_file).
Status WaitForPhase(Subprocess* p, const std::string& phase) {
  const Deadline d = Deadline::AfterMs(60000);
  while (true) {
    auto line = p->WaitForLine("move ", d);
    if (!line.ok()) return line.status().WithContext("waiting for phase " + phase);
    if (line->ends_with("': " + phase)) return Status::Ok();
  }
}

JobSpec Spec(const std::string& name) {
  JobSpec s;
  s.name = name;
  s.workers = 2;
  s.optimizer.lr = 2.0f;  // p -= the sum of both workers' gradients, exactly
  s.partition_bytes = 4096;
  s.tensors = {{"w", DType::kF32, {3000}}, {"b", DType::kF32, {10}}};
  return s;
}

float F(uint64_t v, uint32_t w) { return static_cast<float>((v + 2 * w) % 5); }

// Two workers training `spec` from the service at `port` until every partition reaches
// `target` (by default: until Finish()), wherever the job goes and whatever restarts.
class Training {
 public:
  Training(const JobSpec& spec, uint16_t port, std::string secret, uint64_t target = UINT64_MAX)
      : spec_(spec), port_(port), secret_(std::move(secret)), target_(target) {
    for (uint32_t w = 0; w < 2; ++w) th_.emplace_back([this, w] { Work(w); });
  }
  ~Training() {
    if (target_.load() == UINT64_MAX) Finish(0);
    Join();
  }
  // The workers stop `more` versions from now (both at the same version: the target changes
  // once, while both are still training).
  uint64_t Finish(uint64_t more) {
    target_ = progress_.load() + more + 1;
    return target_.load();
  }
  void Join() {
    for (auto& t : th_) {
      if (t.joinable()) t.join();
    }
  }
  uint64_t progress() const { return progress_.load(); }
  // Waits (bounded) until worker 0 reached version v.
  bool WaitFor(uint64_t v) {
    const Deadline d = Deadline::AfterMs(60000);
    while (progress_.load() < v && !d.Expired() && errors_[0].empty() && errors_[1].empty()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));  // Polling a counter, bounded.
    }
    return progress_.load() >= v;
  }
  const std::string& error(uint32_t w) const { return errors_[w]; }
  const ClientCounters& counters(uint32_t w) const { return counters_[w]; }
  uint16_t final_port(uint32_t w) const { return final_port_[w]; }

 private:
  void Work(uint32_t w) {
    ClientOptions o;
    o.port = port_;
    o.secret = secret_;
    o.op_timeout_ms = 20000;
    o.reconnect_ms = 30000;
    auto c = Client::Connect(o);
    if (!c.ok()) return Fail(w, c.status());
    if (Status s = (*c)->Join(spec_, w); !s.ok()) return Fail(w, s);
    std::vector<float> w0(3000, 100.0f), b0(10, 100.0f), gw(3000), gb(10);
    void* params[2] = {w0.data(), b0.data()};
    const void* grads[2] = {gw.data(), gb.data()};
    if (w == 0) {
      if (Status s = (*c)->SetParams({params, 2}); !s.ok()) return Fail(w, s);
    }
    if (Status s = (*c)->Barrier(0); !s.ok()) return Fail(w, s);
    if (Status s = (*c)->Pull({params, 2}, false); !s.ok()) return Fail(w, s);
    while ((*c)->min_version() < target_.load()) {
      for (uint32_t p = 0; p < (*c)->layout().partitions.size(); ++p) {
        const auto& pi = (*c)->layout().partitions[p];
        float* g = pi.tensor == 0 ? gw.data() : gb.data();
        for (uint32_t i = 0; i < pi.count; ++i) g[pi.offset + i] = F((*c)->version(p), w);
      }
      if (Status s = (*c)->PushPull({grads, 2}, {params, 2}); !s.ok()) return Fail(w, s);
      if (w == 0) progress_ = (*c)->min_version();
    }
    counters_[w] = (*c)->counters();
    final_port_[w] = (*c)->port();
  }
  void Fail(uint32_t w, const Status& s) { errors_[w] = "worker " + std::to_string(w) + ": " + s.ToString(); }

  JobSpec spec_;
  uint16_t port_;
  std::string secret_;
  std::atomic<uint64_t> target_;
  std::atomic<uint64_t> progress_{0};
  std::string errors_[2];
  ClientCounters counters_[2];
  uint16_t final_port_[2] = {};
  std::vector<std::thread> th_;
};

// Joins the job through `port` (following it) and checks every element; returns the port of
// the service holding it.
uint16_t ExpectExact(uint16_t port, const std::string& secret, const JobSpec& spec,
                     uint64_t target) {
  ClientOptions o;
  o.port = port;
  o.secret = secret;
  o.op_timeout_ms = 20000;
  o.reconnect_ms = 30000;
  auto c = Client::Connect(o);
  EXPECT_TRUE(c.ok()) << c.status();
  if (!c.ok()) return 0;
  Status s = (*c)->Join(spec, 0);
  EXPECT_TRUE(s.ok()) << s;
  std::vector<float> w0(3000), b0(10);
  void* params[2] = {w0.data(), b0.data()};
  s = (*c)->Pull({params, 2}, false);
  EXPECT_TRUE(s.ok()) << s;
  for (uint32_t p = 0; p < (*c)->layout().partitions.size(); ++p) {
    const auto& pi = (*c)->layout().partitions[p];
    const uint64_t V = (*c)->version(p);
    EXPECT_GE(V, target);
    float want = 100.0f;
    for (uint64_t v = 0; v < V; ++v) want -= F(v, 0) + F(v, 1);
    const float* got = pi.tensor == 0 ? w0.data() : b0.data();
    for (uint32_t i = 0; i < pi.count; ++i) {
      if (got[pi.offset + i] != want) {
        ADD_FAILURE() << "partition " << p << " element " << i << " at version " << V << " is "
                      << got[pi.offset + i] << ", expected " << want
                      << ": an update was lost or applied twice";
        return (*c)->port();
      }
    }
  }
  return (*c)->port();
}

json Status_(const Service& s, const std::string& token) {
  auto r = RunTessera({"paramsvc", "status", s.endpoint(), "--json", "--auth_token_file=" + token});
  EXPECT_EQ(r.exit_code, 0) << r.stdout_text;
  auto j = json::parse(r.stdout_text, nullptr, false);
  return j.is_discarded() ? json::object() : j;
}

// Polls a service's status (bounded) until `pred` holds.
bool StatusSoon(const Service& s, const std::string& token, const std::function<bool(const json&)>& pred) {
  const Deadline d = Deadline::AfterMs(30000);
  while (!d.Expired()) {
    if (pred(Status_(s, token))) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // Polling a status, bounded.
  }
  return false;
}

testing::CommandOutcome Move(const std::string& job, const Service& to, const std::string& from,
                             const std::string& token) {
  return RunTessera({"paramsvc", "move", "--job", job, "--to", to.endpoint(), "--from", from,
                     "--auth_token_file=" + token, "--json"},
                    180000);
}

json MoveReport(const testing::CommandOutcome& r) {
  auto rows = tessera::testing::JsonLines(r.stdout_text);
  return rows.size() == 1 ? rows[0] : json::object();
}

struct Pair {
  std::unique_ptr<client::LocalCluster> cluster;
  Service a, b;
  tessera::testing::TempDir dir;
  std::string hold_a() const { return dir.path() + "/hold-a"; }
  std::string hold_b() const { return dir.path() + "/hold-b"; }
};

// Holds the moves of a service started with that file at `phase` ("": lets them go on).
void Hold(const std::string& file, const std::string& phase) {
  FILE* f = std::fopen(file.c_str(), "w");
  ASSERT_NE(f, nullptr) << file;
  std::fprintf(f, "%s\n", phase.c_str());
  std::fclose(f);
}

// Three memservers and two services; with_holds: each service takes a hold file.
void StartPair(Pair* p, bool with_holds = false) {
  auto cluster = client::LocalCluster::Start(ThreeServers());
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  p->cluster = std::move(*cluster);
  auto hold = [&](const std::string& f) {
    return with_holds ? std::vector<std::string>{"--move_hold_file=" + f} : std::vector<std::string>{};
  };
  auto a = StartService(p->cluster.get(), p->cluster->token_path(), hold(p->hold_a()));
  ASSERT_TRUE(a.ok()) << a.status();
  p->a = std::move(*a);
  auto b = StartService(p->cluster.get(), p->cluster->token_path(), hold(p->hold_b()));
  ASSERT_TRUE(b.ok()) << b.status();
  p->b = std::move(*b);
}

bool HasJob(const json& st, const std::string& name, const std::string& place = "active") {
  for (const auto& j : st.value("jobs", json::array())) {
    if (j.value("name", std::string()) == name && j.value("place", std::string()) == place) return true;
  }
  return false;
}

bool HasTombstone(const json& st, const std::string& name, const std::string& to) {
  for (const auto& m : st.value("moved", json::array())) {
    if (m.value("name", std::string()) == name && m.value("to", std::string()) == to) return true;
  }
  return false;
}

TEST(ParamsvcMoveProcesses, JobMovesBackAndForthWithTheCliWhileTwoWorkersTrain) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(StartPair(&p));
  const std::string token = p.cluster->token_path();
  const JobSpec spec = Spec("roaming");
  Training t(spec, p.a.port, p.cluster->secret());
  const std::string both = p.a.endpoint() + "," + p.b.endpoint();
  const Service* to[4] = {&p.b, &p.a, &p.b, &p.a};
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(t.WaitFor(20 + 40 * i)) << t.error(0) << t.error(1);
    auto r = Move("roaming", *to[i], both, token);
    ASSERT_EQ(r.exit_code, 0) << r.stdout_text;
    const json rep = MoveReport(r);
    EXPECT_TRUE(rep.value("moved", false)) << rep;
    EXPECT_EQ(rep.value("to", std::string()), to[i]->endpoint()) << rep;
    EXPECT_TRUE(rep.value("durable", false)) << "the destination checkpoints: " << rep;
    EXPECT_EQ(rep.value("partitions", 0), 4) << rep;
  }
  const uint64_t kTarget = t.Finish(20);
  t.Join();
  ASSERT_EQ(t.error(0), "");
  ASSERT_EQ(t.error(1), "");
  EXPECT_EQ(ExpectExact(p.b.port, p.cluster->secret(), spec, kTarget), p.a.port);
  for (uint32_t w = 0; w < 2; ++w) {
    EXPECT_EQ(t.final_port(w), p.a.port);
    EXPECT_EQ(t.counters(w).rollbacks, 0u) << "a move cost an iteration";
    EXPECT_EQ(t.counters(w).reconnects, 0u);
    EXPECT_GE(t.counters(w).redirects, 1u);
  }
  // The counters travelled with the job: every push applied once over the four moves.
  const json sa = Status_(p.a, token);
  ASSERT_EQ(sa["jobs"].size(), 1u) << sa;
  EXPECT_EQ(sa["jobs"][0]["moves"].get<int>(), 4);
  EXPECT_EQ(sa["jobs"][0]["applied"].get<uint64_t>(), 2 * kTarget * 4);
  EXPECT_EQ(sa["jobs"][0]["rejected"].get<uint64_t>(), 0u);
  EXPECT_TRUE(HasTombstone(Status_(p.b, token), "roaming", p.a.endpoint()));
  // The table says where it went; moving it where it is is a no-op; a job nobody has is not found.
  auto table = RunTessera({"paramsvc", "status", p.b.endpoint(), "--auth_token_file=" + token});
  EXPECT_NE(table.stdout_text.find("moved away: job"), std::string::npos) << table.stdout_text;
  EXPECT_NE(table.stdout_text.find("'roaming' -> " + p.a.endpoint()), std::string::npos) << table.stdout_text;
  auto again = RunTessera({"paramsvc", "move", "--job", "roaming", "--to", p.a.endpoint(), "--from",
                           p.b.endpoint(), "--auth_token_file=" + token});
  EXPECT_EQ(again.exit_code, 0) << again.stdout_text;
  EXPECT_NE(again.stdout_text.find("already"), std::string::npos) << again.stdout_text;
  auto none = RunTessera({"paramsvc", "move", "--job", "ghost", "--to", p.a.endpoint(), "--from",
                          p.b.endpoint(), "--auth_token_file=" + token});
  EXPECT_EQ(none.exit_code, 1);
  EXPECT_EQ(RunTessera({"paramsvc", "move", "--job", "roaming", "--to", p.a.endpoint()}).exit_code, 2);
}

TEST(ParamsvcMoveProcesses, DrainMovesEveryJobAwayAndSendsNewJobsElsewhere) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(StartPair(&p));
  const std::string token = p.cluster->token_path();
  // Two jobs trained a little on A, idle when it drains.
  for (const char* name : {"first", "second"}) {
    Training t(Spec(name), p.a.port, p.cluster->secret(), 10);
    t.Join();
    ASSERT_EQ(t.error(0) + t.error(1), "");
  }
  auto r = RunTessera({"paramsvc", "drain", p.a.endpoint(), "--to", p.b.endpoint(),
                       "--auth_token_file=" + token});
  ASSERT_EQ(r.exit_code, 0) << r.stdout_text;
  EXPECT_NE(r.stdout_text.find("2 of 2 jobs moved"), std::string::npos) << r.stdout_text;
  json sa = Status_(p.a, token);
  EXPECT_EQ(sa["jobs"].size(), 0u) << sa;
  EXPECT_TRUE(sa["draining"].get<bool>());
  EXPECT_EQ(sa["drain_to"], p.b.endpoint());
  for (const char* name : {"first", "second"}) {
    EXPECT_EQ(ExpectExact(p.a.port, p.cluster->secret(), Spec(name), 10), p.b.port) << name;
  }
  // A new job registered through A lands on B, and trains there.
  {
    Training t(Spec("newcomer"), p.a.port, p.cluster->secret(), 5);
    t.Join();
    ASSERT_EQ(t.error(0) + t.error(1), "");
    EXPECT_EQ(t.final_port(0), p.b.port);
  }
  EXPECT_TRUE(HasJob(Status_(p.b, token), "newcomer"));
  // The drain outlives a restart of A's aggregation server.
  ASSERT_EQ(::kill(p.a.aggregator, SIGKILL), 0);
  ASSERT_TRUE(NextAggregator(&p.a.proc).ok());
  EXPECT_TRUE(StatusSoon(p.a, token, [](const json& j) { return j.value("draining", false); }));
  // Undo: A takes new jobs again.
  r = RunTessera({"paramsvc", "drain", p.a.endpoint(), "--undo", "--auth_token_file=" + token});
  ASSERT_EQ(r.exit_code, 0) << r.stdout_text;
  {
    Training t(Spec("homecoming"), p.a.port, p.cluster->secret(), 5);
    t.Join();
    ASSERT_EQ(t.error(0) + t.error(1), "");
    EXPECT_EQ(t.final_port(0), p.a.port);
  }
  // rebalance reads both services' measured load (the jobs are idle now: nothing to move).
  auto rb = RunTessera({"paramsvc", "rebalance", p.a.endpoint() + "," + p.b.endpoint(), "--above=0",
                        "--dry_run", "--json", "--auth_token_file=" + token});
  EXPECT_EQ(rb.exit_code, 0) << rb.stdout_text;
  auto rows = tessera::testing::JsonLines(rb.stdout_text);
  ASSERT_GE(rows.size(), 2u) << rb.stdout_text;
  EXPECT_EQ(rows[0]["service"], p.a.endpoint());
  EXPECT_DOUBLE_EQ(rows[0]["capacity_cores"].get<double>(), 2 * 0.6);  // --cores=2, target 0.6
  EXPECT_EQ(rows[1]["job_loads"].size(), 3u) << rows[1];  // first, second, newcomer on B
  // Bad uses.
  EXPECT_EQ(RunTessera({"paramsvc", "rebalance", p.a.endpoint()}).exit_code, 2);
  EXPECT_EQ(RunTessera({"paramsvc", "drain", p.a.endpoint()}).exit_code, 2);
  EXPECT_EQ(RunTessera({"paramsvc", "drain", p.a.endpoint(), "--to", p.a.endpoint()}).exit_code, 2);
}

// A move of `job` from A to B while two workers train on A, with `holder`'s moves held at
// `phase` and `victim`'s aggregation server SIGKILLed there (then restarted by its
// supervisor); `meanwhile` runs before the hold is released. The training then runs 30 more
// versions and stops; `target` is where.
struct KilledMove {
  Pair p;
  std::unique_ptr<Training> t;
  testing::CommandOutcome cli;
  json report;
  uint64_t target = 0;
  std::string token() const { return p.cluster->token_path(); }
};

void KillDuringMove(KilledMove* k, const std::string& job, char holder, const std::string& phase,
                    char victim, const std::function<void()>& meanwhile = {}) {
  Pair& p = k->p;
  ASSERT_NO_FATAL_FAILURE(StartPair(&p, /*with_holds=*/true));
  Service& held = holder == 'a' ? p.a : p.b;
  Service& killed = victim == 'a' ? p.a : p.b;
  const std::string hold = holder == 'a' ? p.hold_a() : p.hold_b();
  ASSERT_NO_FATAL_FAILURE(Hold(hold, phase));
  k->t = std::make_unique<Training>(Spec(job), p.a.port, p.cluster->secret());
  ASSERT_TRUE(k->t->WaitFor(20)) << k->t->error(0) << k->t->error(1);
  std::thread cli([&] { k->cli = Move(job, p.b, p.a.endpoint(), k->token()); });
  Status s = WaitForPhase(&held.proc, phase);
  if (s.ok() && ::kill(killed.aggregator, SIGKILL) != 0) s = ErrnoError("kill");
  if (s.ok()) s = NextAggregator(&killed.proc).status();
  if (s.ok() && meanwhile) meanwhile();
  Hold(hold, "");
  cli.join();
  ASSERT_TRUE(s.ok()) << s;
  k->report = MoveReport(k->cli);
  k->target = k->t->Finish(30);
  k->t->Join();
  ASSERT_EQ(k->t->error(0), "");
  ASSERT_EQ(k->t->error(1), "");
}

// The destination dies after persisting its staged copy but before answering PREPARE: the
// move aborts, the job stays on the source and never stopped training there; the restarted
// destination asks the source, hears "unknown" and drops its copy.
TEST(ParamsvcMoveProcesses, DestinationKilledBeforeTheCommitPointLeavesTheJobOnTheSource) {
  KilledMove k;
  ASSERT_NO_FATAL_FAILURE(KillDuringMove(&k, "anchored", 'b', "staged", 'b'));
  const Pair& p = k.p;
  EXPECT_EQ(k.cli.exit_code, 1) << k.cli.stdout_text;
  EXPECT_FALSE(k.report.value("moved", true)) << k.report;
  EXPECT_NE(k.report.value("message", std::string()).find("stays on " + p.a.endpoint()),
            std::string::npos) << k.report;
  EXPECT_EQ(ExpectExact(p.a.port, p.cluster->secret(), Spec("anchored"), k.target), p.a.port);
  for (uint32_t w = 0; w < 2; ++w) {
    EXPECT_EQ(k.t->final_port(w), p.a.port);
    EXPECT_EQ(k.t->counters(w).redirects, 0u);
    EXPECT_EQ(k.t->counters(w).rollbacks, 0u) << "the aborted move cost an iteration";
  }
  // The restarted destination restored the staged copy, asked, and dropped it.
  EXPECT_TRUE(StatusSoon(p.b, k.token(), [](const json& j) { return j.value("jobs", json::array()).empty(); }))
      << Status_(p.b, k.token());
  EXPECT_FALSE(HasTombstone(Status_(p.a, k.token()), "anchored", p.b.endpoint()));
}

// The source dies after its commit record, before telling the destination: the restarted
// source restores the tombstone (not the job) and finishes the commit; the workers find the
// job on the destination, which holds the handoff snapshot: nothing lost, nothing twice.
TEST(ParamsvcMoveProcesses, SourceKilledAfterTheCommitPointResumesOnTheDestination) {
  KilledMove k;
  ASSERT_NO_FATAL_FAILURE(KillDuringMove(&k, "committed", 'a', "committed", 'a'));
  const Pair& p = k.p;
  EXPECT_EQ(k.cli.exit_code, 0) << k.cli.stdout_text;
  EXPECT_NE(k.report.value("message", std::string()).find("after the move's commit point"),
            std::string::npos) << k.report;
  EXPECT_EQ(ExpectExact(p.a.port, p.cluster->secret(), Spec("committed"), k.target), p.b.port);
  for (uint32_t w = 0; w < 2; ++w) EXPECT_EQ(k.t->final_port(w), p.b.port);
  const json sa = Status_(p.a, k.token());
  EXPECT_FALSE(HasJob(sa, "committed")) << "the restarted source brought the job back: " << sa;
  EXPECT_TRUE(HasTombstone(sa, "committed", p.b.endpoint())) << sa;
  EXPECT_TRUE(StatusSoon(p.a, k.token(), [](const json& j) {
    for (const auto& m : j.value("moved", json::array())) {
      if (!m.value("acknowledged", false)) return false;
    }
    return true;
  }));
  EXPECT_TRUE(HasJob(Status_(p.b, k.token()), "committed"));
}

// The destination dies after the source's commit record: the job is the destination's; its
// restarted aggregation server restores the staged copy from its checkpoint, asks the source
// (committed, the source still being held) and serves it; the workers, sent there, wait for
// it and resend what the source did not apply. Not even an iteration is rolled back.
TEST(ParamsvcMoveProcesses, DestinationKilledAfterTheCommitPointResumesFromItsCheckpointThere) {
  KilledMove k;
  ASSERT_NO_FATAL_FAILURE(KillDuringMove(&k, "landed", 'a', "committed", 'b', [&k] {
    EXPECT_TRUE(StatusSoon(k.p.b, k.token(), [](const json& j) { return HasJob(j, "landed"); }))
        << Status_(k.p.b, k.token());
  }));
  const Pair& p = k.p;
  EXPECT_EQ(k.cli.exit_code, 0) << k.cli.stdout_text;
  EXPECT_EQ(ExpectExact(p.a.port, p.cluster->secret(), Spec("landed"), k.target), p.b.port);
  for (uint32_t w = 0; w < 2; ++w) {
    EXPECT_EQ(k.t->final_port(w), p.b.port);
    EXPECT_EQ(k.t->counters(w).rollbacks, 0u) << "the destination's checkpoint lost the snapshot";
    EXPECT_GE(k.t->counters(w).redirects, 1u);
  }
  EXPECT_TRUE(StatusSoon(p.a, k.token(), [&](const json& j) { return HasTombstone(j, "landed", p.b.endpoint()); }));
}

// The source dies after the destination prepared, before its commit record: the job is the
// source's; it restarts from its own checkpoint there (the workers resynchronise, as after any
// restart) and the destination drops its staged copy.
TEST(ParamsvcMoveProcesses, SourceKilledBeforeTheCommitPointKeepsTheJobOnTheSource) {
  KilledMove k;
  ASSERT_NO_FATAL_FAILURE(KillDuringMove(&k, "stayed", 'a', "prepared", 'a'));
  const Pair& p = k.p;
  EXPECT_EQ(k.cli.exit_code, 1) << k.cli.stdout_text;
  EXPECT_NE(k.report.value("message", std::string()).find("before the move's commit point"),
            std::string::npos) << k.report;
  EXPECT_EQ(ExpectExact(p.a.port, p.cluster->secret(), Spec("stayed"), k.target), p.a.port);
  for (uint32_t w = 0; w < 2; ++w) {
    EXPECT_EQ(k.t->final_port(w), p.a.port);
    EXPECT_GE(k.t->counters(w).reconnects, 1u);
  }
  EXPECT_TRUE(StatusSoon(p.b, k.token(), [](const json& j) { return j.value("jobs", json::array()).empty(); }))
      << Status_(p.b, k.token());
  EXPECT_FALSE(HasTombstone(Status_(p.a, k.token()), "stayed", p.b.endpoint()));
}

}  // namespace
}  // namespace tessera::paramsvc
