// The Parameter Service in-process (a real Server on a loopback socket) with real clients.
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <atomic>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <thread>

#include "apps/paramsvc/client/client.h"
#include "apps/paramsvc/io.h"
#include "apps/paramsvc/server/server.h"
#include "common/clock.h"
#include "fabric/credential.h"

namespace tessera::paramsvc {
namespace {

constexpr char kSecret[] = "paramsvc-test-secret-0123456789";

std::unique_ptr<Server> StartServer(int cores = 2, uint32_t rebalance_ms = 200, bool elastic = true) {
  auto fd = Server::Listen("127.0.0.1", 0);
  EXPECT_TRUE(fd.ok()) << fd.status();
  ServerOptions o;
  o.secret = kSecret;
  o.max_cores = cores;
  o.rebalance_ms = rebalance_ms;
  o.elastic = elastic;
  auto s = Server::Start(o, std::move(*fd));
  EXPECT_TRUE(s.ok()) << s.status();
  return std::move(*s);
}

std::unique_ptr<Client> Connect(const Server& s) {
  ClientOptions o;
  o.port = s.port();
  o.secret = kSecret;
  o.op_timeout_ms = 20000;
  auto c = Client::Connect(o);
  EXPECT_TRUE(c.ok()) << c.status();
  return std::move(*c);
}

JobSpec IntSpec(const std::string& name, uint32_t workers, Mode mode = Mode::kSync,
                uint32_t staleness = 0) {
  JobSpec s;
  s.name = name;
  s.workers = workers;
  s.mode = mode;
  s.staleness = staleness;
  s.optimizer.lr = static_cast<float>(workers);  // p -= sum of the round's gradients, exactly
  s.partition_bytes = 4096;                      // 1024 elements per partition
  s.tensors = {{"w", DType::kF32, {50, 50}}, {"h", DType::kF16, {1500}}, {"b", DType::kBF16, {700}}};
  return s;
}

// Host-side tensors of a spec (fp16/bf16 as raw 16-bit values).
struct Tensors {
  std::vector<std::vector<uint8_t>> bufs;
  explicit Tensors(const JobSpec& s) {
    for (const auto& t : s.tensors) bufs.emplace_back(t.elements() * DTypeSize(t.dtype));
  }
  std::vector<const void*> cptrs() const {
    std::vector<const void*> v;
    for (auto& b : bufs) v.push_back(b.data());
    return v;
  }
  std::vector<void*> ptrs() {
    std::vector<void*> v;
    for (auto& b : bufs) v.push_back(b.data());
    return v;
  }
  void Set(const JobSpec& s, size_t t, uint64_t i, float value) {
    FromF32(bufs[t].data() + i * DTypeSize(s.tensors[t].dtype), &value, s.tensors[t].dtype, 1);
  }
  float Get(const JobSpec& s, size_t t, uint64_t i) const {
    float f;
    ToF32(&f, bufs[t].data() + i * DTypeSize(s.tensors[t].dtype), s.tensors[t].dtype, 1);
    return f;
  }
};

float F(uint64_t v, uint32_t w) { return static_cast<float>((v + w) % 3); }

// Fills each partition's gradient with F(its version, worker).
void FillGrads(const Client& c, uint32_t w, Tensors* g) {
  const JobSpec& s = c.spec();
  for (uint32_t p = 0; p < c.layout().partitions.size(); ++p) {
    const auto& pi = c.layout().partitions[p];
    for (uint64_t i = 0; i < pi.count; ++i) g->Set(s, pi.tensor, pi.offset + i, F(c.version(p), w));
  }
}

// Runs `iters` sync iterations of worker w; rank 0 sets every parameter to 250 first.
void SyncWorker(const Server& srv, const JobSpec& spec, uint32_t w, int iters,
                std::vector<uint64_t>* final_versions, Tensors* final_params,
                std::atomic<int>* progress = nullptr) {
  auto c = Connect(srv);
  ASSERT_TRUE(c->Join(spec, w).ok());
  Tensors params(spec), grads(spec);
  if (w == 0) {
    for (size_t t = 0; t < spec.tensors.size(); ++t) {
      for (uint64_t i = 0; i < spec.tensors[t].elements(); ++i) params.Set(spec, t, i, 250.0f);
    }
    ASSERT_TRUE(c->SetParams(params.cptrs()).ok());
  }
  ASSERT_TRUE(c->Barrier(0).ok());
  auto pp = params.ptrs();
  ASSERT_TRUE(c->Pull(pp, false).ok());
  for (int it = 0; it < iters; ++it) {
    FillGrads(*c, w, &grads);
    Status s = c->PushPull(grads.cptrs(), pp);
    ASSERT_TRUE(s.ok()) << s;
    if (progress) ++*progress;
  }
  if (final_versions) {
    final_versions->clear();
    for (uint32_t p = 0; p < c->layout().partitions.size(); ++p) final_versions->push_back(c->version(p));
  }
  if (final_params) *final_params = params;
}

// Every element of partition p must be 250 - sum_{v < V_p} sum_w F(v, w).
void ExpectExact(const Client& c, const std::vector<uint64_t>& versions, const Tensors& params,
                 uint32_t workers) {
  const JobSpec& s = c.spec();
  for (uint32_t p = 0; p < c.layout().partitions.size(); ++p) {
    float want = 250.0f;
    for (uint64_t v = 0; v < versions[p]; ++v) {
      for (uint32_t w = 0; w < workers; ++w) want -= F(v, w);
    }
    const auto& pi = c.layout().partitions[p];
    for (uint64_t i = 0; i < pi.count; ++i) {
      ASSERT_EQ(params.Get(s, pi.tensor, pi.offset + i), want)
          << "partition " << p << " element " << i << " version " << versions[p];
    }
  }
}

TEST(ParamsvcService, SyncSumsAreExactForFp32Fp16Bf16) {
  auto srv = StartServer();
  const JobSpec spec = IntSpec("exact", 4);
  constexpr int kIters = 20;
  std::vector<std::thread> th;
  std::vector<uint64_t> versions;
  Tensors result(spec);
  for (uint32_t w = 0; w < 4; ++w) {
    th.emplace_back([&, w] {
      SyncWorker(*srv, spec, w, kIters, w == 0 ? &versions : nullptr, w == 0 ? &result : nullptr);
    });
  }
  for (auto& t : th) t.join();
  auto c = Connect(*srv);
  ASSERT_TRUE(c->Join(spec, 0).ok());
  ASSERT_EQ(versions, std::vector<uint64_t>(c->layout().partitions.size(), kIters));
  ExpectExact(*c, versions, result, 4);
  auto ctr = srv->Counters(c->job());
  ASSERT_TRUE(ctr.ok());
  const uint64_t parts = c->layout().partitions.size();
  EXPECT_EQ(ctr->pushes, 4 * kIters * parts);
  EXPECT_EQ(ctr->applied, 4 * kIters * parts);
  EXPECT_EQ(ctr->updates, kIters * parts);
  EXPECT_EQ(ctr->pending, 0u);
  EXPECT_EQ(ctr->dropped, 0u);
}

TEST(ParamsvcService, BadRequestsGetClearErrorsAndOtherJobsAreUnaffected) {
  auto srv = StartServer();
  const JobSpec good = IntSpec("healthy", 2);
  // The healthy job trains in the background while another client sends bad requests.
  std::vector<uint64_t> versions;
  Tensors result(good);
  std::thread w0([&] { SyncWorker(*srv, good, 0, 30, &versions, &result); });
  std::thread w1([&] { SyncWorker(*srv, good, 1, 30, nullptr, nullptr); });

  auto c = Connect(*srv);
  JobSpec bad = IntSpec("victim", 1);
  bad.tensors[0].shape = {4, 0};
  EXPECT_NE(c->Join(bad, 0).message().find("dim of 0"), std::string::npos);
  // A malformed REGISTER straight on the wire (bad dtype byte).
  auto enc = IntSpec("raw", 1).Encode();
  enc[enc.size() - 10] = 9;  // The last tensor's dtype byte.
  auto r = c->Call(Op::kRegister, 0, enc);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("dtype"), std::string::npos) << r.status();

  const JobSpec other = IntSpec("other", 1);
  ASSERT_TRUE(c->Join(other, 0).ok());
  const uint32_t job = c->job();
  JobSpec changed = other;
  changed.tensors[0].shape = {51, 50};
  auto c2 = Connect(*srv);
  EXPECT_EQ(c2->Join(changed, 0).code(), StatusCode::kAlreadyExists);

  auto push = [&](uint32_t job_id, uint32_t worker, uint32_t part, DType dt, uint32_t count,
                  size_t data_bytes) {
    std::vector<uint8_t> b(PushRequest::kFixed + data_bytes);
    PushRequest{worker, part, 0, dt, count, {}}.EncodeFixed(b.data());
    return c->Call(Op::kPush, job_id, b).status();
  };
  Status s = push(999, 0, 0, DType::kF32, 1024, 4096);
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find("unknown job 999"), std::string::npos) << s;
  s = push(job, 0, 0, DType::kF16, 1024, 2048);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("fp16"), std::string::npos) << s;
  s = push(job, 0, 0, DType::kF32, 10, 40);
  EXPECT_NE(s.message().find("10 elements"), std::string::npos) << s;
  s = push(job, 0, 0, DType::kF32, 1024, 4000);
  EXPECT_NE(s.message().find("expected 4096"), std::string::npos) << s;
  s = push(job, 3, 0, DType::kF32, 1024, 4096);
  EXPECT_NE(s.message().find("worker 3"), std::string::npos) << s;
  s = push(job, 0, 77, DType::kF32, 1024, 4096);
  EXPECT_EQ(s.code(), StatusCode::kOutOfRange) << s;
  uint8_t pr[PullRequest::kWireSize];
  PullRequest{0, DType::kBF16, 0, 100}.EncodeTo(pr);
  EXPECT_EQ(c->Call(Op::kPull, job, pr).status().code(), StatusCode::kInvalidArgument);
  PullRequest{0, DType::kF32, 5, 50}.EncodeTo(pr);  // A version that never comes: bounded wait.
  EXPECT_EQ(c->Call(Op::kPull, job, pr).status().code(), StatusCode::kTimeout);
  // The bad requests left this job untouched.
  auto ctr = srv->Counters(job);
  ASSERT_TRUE(ctr.ok());
  EXPECT_EQ(ctr->pushes, 0u);
  EXPECT_EQ(ctr->updates, 0u);

  // Unauthenticated and malformed connections.
  {
    auto fd = ConnectTcp("127.0.0.1", srv->port(), 2000);
    ASSERT_TRUE(fd.ok());
    SetSocketTimeouts(fd->get(), 5000, 5000);
    std::vector<uint8_t> b(PullRequest::kWireSize);
    ASSERT_TRUE(WriteFrame(fd->get(), {static_cast<uint8_t>(Op::kPull), 0, 0, job, 1}, b).ok());
    Header h;
    std::vector<uint8_t> p;
    ASSERT_TRUE(ReadFrame(fd->get(), &h, &p).ok());
    EXPECT_EQ(h.status, static_cast<uint16_t>(StatusCode::kPermissionDenied));
  }
  {
    auto fd = ConnectTcp("127.0.0.1", srv->port(), 2000);
    ASSERT_TRUE(fd.ok());
    SetSocketTimeouts(fd->get(), 5000, 5000);
    const char junk[kHeaderSize] = "GET / HTTP/1.1\r\n\r\n";
    ASSERT_EQ(::send(fd->get(), junk, sizeof(junk), MSG_NOSIGNAL), static_cast<ssize_t>(sizeof(junk)));
    Header h;
    std::vector<uint8_t> p;
    Status rs = ReadFrame(fd->get(), &h, &p);
    ASSERT_TRUE(rs.ok()) << rs;
    EXPECT_EQ(h.status, static_cast<uint16_t>(StatusCode::kProtocolError));
    EXPECT_NE(std::string(p.begin(), p.end()).find("magic"), std::string::npos);
    EXPECT_EQ(ReadFrame(fd->get(), &h, &p).code(), StatusCode::kUnavailable);  // Closed.
  }
  w0.join();
  w1.join();
  auto cg = Connect(*srv);
  ASSERT_TRUE(cg->Join(good, 0).ok());
  ExpectExact(*cg, versions, result, 2);
  EXPECT_EQ(versions[0], 30u);
  EXPECT_EQ(srv->Counters(cg->job())->rejected, 0u);
  // Release: the job departs; its id is unknown afterwards.
  ASSERT_TRUE(c->Release().ok());
  EXPECT_EQ(srv->Counters(job).status().code(), StatusCode::kNotFound);
}

TEST(ParamsvcService, MigrationUnderConcurrentPushesLosesAndDuplicatesNothing) {
  auto srv = StartServer(/*cores=*/4, /*rebalance_ms=*/10);
  const JobSpec spec = IntSpec("migrating", 4);
  constexpr int kIters = 60;
  std::atomic<bool> done{false};
  std::vector<uint64_t> versions;
  Tensors result(spec);
  std::vector<std::thread> th;
  for (uint32_t w = 0; w < 4; ++w) {
    th.emplace_back([&, w] {
      SyncWorker(*srv, spec, w, kIters, w == 0 ? &versions : nullptr, w == 0 ? &result : nullptr);
    });
  }
  // Forced migrations of every partition between all four cores while pushes are in flight,
  // on top of the packer's own moves (10 ms rebalance interval).
  std::thread mover([&] {
    auto admin = Connect(*srv);
    ASSERT_TRUE(admin->Join(spec, 0).ok());
    uint32_t k = 0;
    while (!done.load()) {
      for (uint32_t p = 0; p < admin->layout().partitions.size(); ++p) {
        ASSERT_TRUE(admin->Migrate(p, (p + k) % 4).ok());
      }
      ++k;
    }
  });
  for (auto& t : th) t.join();
  done = true;
  mover.join();
  auto c = Connect(*srv);
  ASSERT_TRUE(c->Join(spec, 0).ok());
  ExpectExact(*c, versions, result, 4);
  auto ctr = srv->Counters(c->job());
  ASSERT_TRUE(ctr.ok());
  const uint64_t parts = c->layout().partitions.size();
  EXPECT_EQ(ctr->applied, 4 * kIters * parts);
  EXPECT_EQ(ctr->updates, kIters * parts);
  EXPECT_EQ(ctr->pending, 0u);
  EXPECT_GT(ctr->migrations, parts);  // Partitions really moved, many times.
  auto st = nlohmann::json::parse(srv->StatusJson());
  EXPECT_EQ(st["jobs"][0]["applied"].get<uint64_t>(), ctr->applied);
}

// Pushes with chosen versions through the wire, one worker id at a time.
struct RawPusher {
  Client* c;
  uint32_t job;
  Result<PushReply> Push(uint32_t worker, uint64_t version, float value) {
    std::vector<uint8_t> b(PushRequest::kFixed + 4 * 1024);
    PushRequest{worker, 0, version, DType::kF32, 1024, {}}.EncodeFixed(b.data());
    for (int i = 0; i < 1024; ++i) std::memcpy(b.data() + PushRequest::kFixed + 4 * i, &value, 4);
    auto r = c->Call(Op::kPush, job, b);
    if (!r.ok()) return r.status();
    return PushReply::Decode(*r);
  }
  float Param() {
    uint8_t pr[PullRequest::kWireSize];
    PullRequest{0, DType::kF32, 0, 1000}.EncodeTo(pr);
    auto r = c->Call(Op::kPull, job, pr);
    EXPECT_TRUE(r.ok()) << r.status();
    auto rep = PullReply::Decode(*r);
    float f;
    std::memcpy(&f, rep->data.data(), 4);
    return f;
  }
};

JobSpec OnePartition(const std::string& name, uint32_t workers, Mode mode, uint32_t s,
                     LatePolicy late = LatePolicy::kDrop) {
  JobSpec spec;
  spec.name = name;
  spec.workers = workers;
  spec.mode = mode;
  spec.staleness = s;
  spec.late = late;
  spec.optimizer.lr = static_cast<float>(workers);
  spec.partition_bytes = 4096;
  spec.tensors = {{"w", DType::kF32, {1024}}};
  return spec;
}

TEST(ParamsvcService, BoundedModeHoldsTheBoundAndCountsExactly) {
  auto srv = StartServer();
  auto c = Connect(*srv);
  ASSERT_TRUE(c->Join(OnePartition("bounded", 2, Mode::kBounded, 1), 0).ok());
  RawPusher p{c.get(), c->job()};
  auto expect = [](const Result<PushReply>& r, PushOutcome o, uint32_t stale, uint64_t v) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->outcome, o);
    EXPECT_EQ(r->staleness, stale);
    EXPECT_EQ(r->version, v);
  };
  // Round 1: two fresh pushes on version 0 -> version 1 (p = 0 - (1 + 2)).
  expect(p.Push(0, 0, 1), PushOutcome::kPending, 0, 0);
  expect(p.Push(1, 0, 2), PushOutcome::kApplied, 0, 1);
  EXPECT_EQ(p.Param(), -3.0f);
  // Round 2: a fresh push and a push from version 0 (staleness 1 <= s): applied together.
  expect(p.Push(0, 1, 4), PushOutcome::kPending, 0, 1);
  expect(p.Push(1, 0, 8), PushOutcome::kApplied, 1, 2);
  EXPECT_EQ(p.Param(), -15.0f);
  // Staleness 2 > s = 1: dropped, the parameters do not move.
  expect(p.Push(1, 0, 100), PushOutcome::kDropped, 2, 2);
  EXPECT_EQ(p.Param(), -15.0f);
  // A fast worker may fill a round alone (no waiting for a straggler).
  expect(p.Push(0, 2, 1), PushOutcome::kPending, 0, 2);
  expect(p.Push(0, 2, 1), PushOutcome::kApplied, 0, 3);
  EXPECT_EQ(p.Param(), -17.0f);
  // A version from the future is refused.
  EXPECT_EQ(p.Push(0, 9, 1).status().code(), StatusCode::kOutOfRange);
  // One pending push stays pending.
  expect(p.Push(1, 3, 5), PushOutcome::kPending, 0, 3);
  auto ctr = srv->Counters(c->job());
  ASSERT_TRUE(ctr.ok());
  EXPECT_EQ(ctr->pushes, 8u);
  EXPECT_EQ(ctr->applied, 6u);
  EXPECT_EQ(ctr->pending, 1u);
  EXPECT_EQ(ctr->dropped, 1u);
  EXPECT_EQ(ctr->rejected, 1u);
  EXPECT_EQ(ctr->updates, 3u);
  EXPECT_EQ(ctr->staleness_max, 2u);
  EXPECT_EQ(ctr->staleness_sum, 3u);
  EXPECT_EQ(ctr->staleness_hist, (std::vector<uint64_t>{6, 1, 1}));  // 0, 1, > s

  // Late policy aggregate: late pushes are averaged into the next round as one push.
  auto c2 = Connect(*srv);
  ASSERT_TRUE(c2->Join(OnePartition("late", 2, Mode::kBounded, 0, LatePolicy::kAggregate), 0).ok());
  RawPusher q{c2.get(), c2->job()};
  expect(q.Push(0, 0, 2), PushOutcome::kPending, 0, 0);
  expect(q.Push(1, 0, 2), PushOutcome::kApplied, 0, 1);    // p = -4
  expect(q.Push(1, 0, 6), PushOutcome::kLateQueued, 1, 1);
  expect(q.Push(1, 0, 2), PushOutcome::kLateQueued, 1, 1); // late average 4
  expect(q.Push(0, 1, 1), PushOutcome::kPending, 0, 1);
  expect(q.Push(1, 1, 1), PushOutcome::kApplied, 0, 2);
  // Round of 1 + 1 + late average 4, scaled by 1/3 and lr 2: p = -4 - 2 * 6 / 3 = -8.
  EXPECT_EQ(q.Param(), -8.0f);
  auto c3 = srv->Counters(c2->job());
  EXPECT_EQ(c3->late_aggregated, 2u);
  EXPECT_EQ(c3->applied, 6u);
  EXPECT_EQ(c3->dropped, 0u);
}

TEST(ParamsvcService, AsyncAppliesEveryPushAndBoundedKeepsFastWorkersGoing) {
  auto srv = StartServer();
  auto c = Connect(*srv);
  ASSERT_TRUE(c->Join(OnePartition("async", 2, Mode::kAsync, 0), 0).ok());
  RawPusher p{c.get(), c->job()};
  for (int i = 0; i < 5; ++i) {
    auto r = p.Push(i % 2, 0, 2);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->outcome, PushOutcome::kApplied);
    EXPECT_EQ(r->version, static_cast<uint64_t>(i + 1));
    EXPECT_EQ(r->staleness, static_cast<uint32_t>(i));
  }
  EXPECT_EQ(p.Param(), -10.0f);  // Each push: lr 2 * (2 / 2 workers).

  // bounded(2) with real client threads: worker 1 pushes once while worker 0 pushes many
  // times; the bound holds for every applied push and the counters add up.
  const JobSpec spec = OnePartition("straggler", 2, Mode::kBounded, 2);
  std::atomic<bool> stop{false};
  std::thread fast([&] {
    auto w = Connect(*srv);
    ASSERT_TRUE(w->Join(spec, 0).ok());
    std::vector<float> g(1024, 1.0f), prm(1024);
    const void* gp[1] = {g.data()};
    void* pp[1] = {prm.data()};
    for (int i = 0; i < 40; ++i) ASSERT_TRUE(w->PushPull(gp, pp).ok());
    stop = true;
  });
  auto slow = Connect(*srv);
  ASSERT_TRUE(slow->Join(spec, 1).ok());
  std::vector<float> g(1024, 1.0f), prm(1024);
  const void* gp[1] = {g.data()};
  void* pp[1] = {prm.data()};
  ASSERT_TRUE(slow->Pull(pp, false).ok());
  int slow_pushes = 0;
  while (!stop.load() && slow_pushes < 3) {
    ASSERT_TRUE(slow->PushPull(gp, pp).ok());
    ++slow_pushes;
  }
  fast.join();
  auto ctr = srv->Counters(slow->job());
  ASSERT_TRUE(ctr.ok());
  EXPECT_EQ(ctr->pushes, 40u + slow_pushes);
  EXPECT_EQ(ctr->pushes, ctr->applied + ctr->pending + ctr->dropped);
  uint64_t within = 0;
  for (size_t i = 0; i + 1 < ctr->staleness_hist.size(); ++i) within += ctr->staleness_hist[i];
  EXPECT_EQ(within, ctr->applied + ctr->pending);           // Applied pushes all within s.
  EXPECT_EQ(ctr->staleness_hist.back(), ctr->dropped);       // Beyond s: exactly the drops.
  EXPECT_GE(ctr->updates, 20u);                              // The fast worker never waited.
}

}  // namespace
}  // namespace tessera::paramsvc

namespace tessera::paramsvc {
namespace {

// The `average` optimizer makes the service a reducer (the DDP hook's job): a sync round's
// result is the mean of the workers' pushes, exactly, and nothing of earlier rounds remains.
TEST(ParamsvcService, AverageJobReturnsEachRoundsMeanExactly) {
  auto srv = StartServer();
  JobSpec spec;
  spec.name = "reducer";
  spec.workers = 2;
  spec.optimizer.kind = OptimizerKind::kAverage;
  spec.partition_bytes = 4096;
  spec.tensors = {{"bucket", DType::kF32, {3000}}};
  std::vector<std::string> errors(2);
  auto work = [&](uint32_t w) {
    auto c = Connect(*srv);
    if (Status s = c->Join(spec, w); !s.ok()) { errors[w] = s.ToString(); return; }
    if (Status s = c->Barrier(0); !s.ok()) { errors[w] = s.ToString(); return; }
    std::vector<float> buf(3000);
    for (int round = 0; round < 5; ++round) {
      for (int i = 0; i < 3000; ++i) buf[i] = static_cast<float>(i % 7 + 3 * w + round);
      const void* g[1] = {buf.data()};
      void* out[1] = {buf.data()};  // In place, as the hook does.
      if (Status s = c->PushPull({g, 1}, {out, 1}); !s.ok()) { errors[w] = s.ToString(); return; }
      for (int i = 0; i < 3000; ++i) {
        const float want = static_cast<float>(2 * (i % 7) + 3 + 2 * round) / 2.0f;
        if (buf[i] != want) {
          errors[w] = "round " + std::to_string(round) + " element " + std::to_string(i) + ": " +
                      std::to_string(buf[i]) + " != " + std::to_string(want);
          return;
        }
      }
    }
  };
  std::thread t0(work, 0), t1(work, 1);
  t0.join();
  t1.join();
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
}

// SET_LR changes the step of the rounds after it; bad values and unknown jobs are refused.
TEST(ParamsvcService, SetLrChangesTheNextStepAndRefusesBadValues) {
  auto srv = StartServer();
  JobSpec spec;
  spec.name = "scheduled";
  spec.workers = 1;
  spec.optimizer.lr = 1.0f;
  spec.tensors = {{"w", DType::kF32, {4}}};
  auto c = Connect(*srv);
  ASSERT_TRUE(c->Join(spec, 0).ok());
  ASSERT_TRUE(c->Barrier(0).ok());
  std::vector<float> p(4), g(4, 1.0f);
  const void* gp[1] = {g.data()};
  void* pp[1] = {p.data()};
  ASSERT_TRUE(c->PushPull({gp, 1}, {pp, 1}).ok());
  EXPECT_EQ(p[0], -1.0f);
  ASSERT_TRUE(c->SetLr(0.25f).ok());
  ASSERT_TRUE(c->PushPull({gp, 1}, {pp, 1}).ok());
  EXPECT_EQ(p[0], -1.25f);
  for (float bad : {-1.0f, std::numeric_limits<float>::quiet_NaN(),
                    std::numeric_limits<float>::infinity()}) {
    uint8_t b[SetLrRequest::kWireSize];
    SetLrRequest{bad}.EncodeTo(b);
    auto rep = c->Call(Op::kSetLr, c->job(), b);
    ASSERT_FALSE(rep.ok()) << bad;
    EXPECT_EQ(rep.status().code(), StatusCode::kInvalidArgument) << rep.status();
    EXPECT_NE(rep.status().message().find("SET_LR"), std::string::npos) << rep.status();
  }
  uint8_t b[SetLrRequest::kWireSize];
  SetLrRequest{0.5f}.EncodeTo(b);
  auto rep = c->Call(Op::kSetLr, c->job() + 100, b);
  EXPECT_EQ(rep.status().code(), StatusCode::kNotFound) << rep.status();
  rep = c->Call(Op::kSetLr, c->job(), {b, 3});
  EXPECT_FALSE(rep.ok());
  ASSERT_TRUE(c->PushPull({gp, 1}, {pp, 1}).ok());
  EXPECT_EQ(p[0], -1.5f) << "a refused SET_LR changed the lr";
}

}  // namespace
}  // namespace tessera::paramsvc

// ---- Moves between servers (server.h "Moves between servers"), two in-process servers ----

namespace tessera::paramsvc {
namespace {

std::string Where(const Server& s) { return "127.0.0.1:" + std::to_string(s.port()); }

// Moves job `name` from whichever of `servers` holds it to the other one; returns the index
// of the server holding it afterwards (the same one when the move failed; `err` says why).
int MoveOnce(std::vector<std::unique_ptr<Client>>& admins, Server* servers[2], int at,
             const std::string& name, std::string* err, uint32_t timeout_ms = 10000) {
  const int to = 1 - at;
  auto r = admins[at]->MoveJob(name, Where(*servers[to]), timeout_ms, false);
  if (!r.ok()) {
    *err = r.status().ToString();
    return at;
  }
  auto j = nlohmann::json::parse(*r);
  EXPECT_EQ(j["to"], Where(*servers[to]));
  EXPECT_EQ(j["job"], name);
  return to;
}

TEST(ParamsvcMove, SyncJobMovedBackAndForthUnderConcurrentPushesLosesAndDuplicatesNothing) {
  auto a = StartServer(/*cores=*/2), b = StartServer(/*cores=*/2);
  Server* servers[2] = {a.get(), b.get()};
  const JobSpec spec = IntSpec("travelling", 4);
  constexpr int kIters = 60;
  std::atomic<int> moves{0}, progress{0};
  std::vector<uint64_t> versions;
  Tensors result(spec);
  std::vector<std::thread> th;
  for (uint32_t w = 0; w < 4; ++w) {
    th.emplace_back([&, w] {
      SyncWorker(*a, spec, w, kIters, w == 0 ? &versions : nullptr, w == 0 ? &result : nullptr,
                 w == 0 ? &progress : nullptr);
    });
  }
  // The job moves A -> B -> A -> ... while the four workers push, pull, set its initial values
  // and meet at its barrier: as soon as it exists, then every 8 iterations of worker 0.
  std::thread mover([&] {
    std::vector<std::unique_ptr<Client>> admins;
    admins.push_back(Connect(*a));
    admins.push_back(Connect(*b));
    int at = 0;
    for (int next = 0; next < kIters - 4;) {
      const Deadline d = Deadline::AfterMs(20000);
      while (progress.load() < next && !d.Expired()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));  // Polling a counter, bounded.
      }
      std::string err;
      const int now = MoveOnce(admins, servers, at, "travelling", &err);
      if (now == at) {
        // Not registered yet is the only expected refusal.
        ASSERT_NE(err.find("no job 'travelling'"), std::string::npos) << err;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        continue;
      }
      moves++;
      at = now;
      next += 8;
    }
  });
  for (auto& t : th) t.join();
  mover.join();
  ASSERT_EQ(moves.load(), 7) << "the job did not move as often as asked";  // At 0, 8, ..., 48
  auto c = Connect(*a);
  ASSERT_TRUE(c->Join(spec, 0).ok());  // Follows the job from A to wherever it is.
  const Server& holder = c->port() == a->port() ? *a : *b;
  ASSERT_EQ(versions, std::vector<uint64_t>(c->layout().partitions.size(), kIters));
  ExpectExact(*c, versions, result, 4);
  // The counters travelled with the job: every push applied once, over all the moves.
  auto ctr = holder.Counters(c->job());
  ASSERT_TRUE(ctr.ok()) << ctr.status();
  const uint64_t parts = c->layout().partitions.size();
  EXPECT_EQ(ctr->applied, 4 * kIters * parts);
  EXPECT_EQ(ctr->pushes, 4 * kIters * parts);
  EXPECT_EQ(ctr->updates, kIters * parts);
  EXPECT_EQ(ctr->pending, 0u);
  EXPECT_EQ(ctr->rejected, 0u);
  auto st = nlohmann::json::parse(holder.StatusJson());
  ASSERT_EQ(st["jobs"].size(), 1u);
  EXPECT_EQ(st["jobs"][0]["moves"].get<int>(), moves.load());
  EXPECT_EQ(st["jobs"][0]["place"], "active");
  // The other server keeps tombstones: its last id of the job leads to the holder (its older
  // ids, from before the job came back to it, to itself, where a client joins by name).
  const Server& other = &holder == a.get() ? *b : *a;
  auto ost = nlohmann::json::parse(other.StatusJson());
  EXPECT_EQ(ost["jobs"].size(), 0u);
  int to_holder = 0;
  for (const auto& m : ost["moved"]) {
    EXPECT_EQ(m["name"], "travelling");
    EXPECT_TRUE(m["to"] == Where(holder) || m["to"] == Where(other)) << m;
    EXPECT_TRUE(m["acknowledged"].get<bool>()) << m;
    to_holder += m["to"] == Where(holder);
  }
  EXPECT_EQ(to_holder, 1) << ost.dump();
}

// Async and bounded(1): every push accepted is applied exactly once or (bounded) dropped,
// across moves; a constant gradient of 1 makes the parameter count the applied pushes.
void CountingWorkers(Mode mode, uint32_t staleness) {
  auto a = StartServer(2), b = StartServer(2);
  Server* servers[2] = {a.get(), b.get()};
  JobSpec spec = OnePartition(std::string("counting-") + ModeName(mode), 3, mode, staleness);
  constexpr int kIters = 80;
  std::vector<ClientCounters> cc(3);
  std::atomic<int> moves{0};
  {
    auto c0 = Connect(*a);
    ASSERT_TRUE(c0->Join(spec, 0).ok());  // Registered before the mover looks for it.
  }
  std::vector<std::thread> th;
  for (uint32_t w = 0; w < 3; ++w) {
    th.emplace_back([&, w] {
      auto c = Connect(*a);
      ASSERT_TRUE(c->Join(spec, w).ok());
      std::vector<float> g(1024, 1.0f), prm(1024);
      const void* gp[1] = {g.data()};
      void* pp[1] = {prm.data()};
      ASSERT_TRUE(c->Pull(pp, false).ok());
      // At least kIters pushes each, and on until the job moved 6 times.
      for (int i = 0; i < kIters || moves.load() < 6; ++i) {
        Status s = c->PushPull(gp, pp);
        ASSERT_TRUE(s.ok()) << s;
      }
      cc[w] = c->counters();
    });
  }
  std::thread mover([&] {
    std::vector<std::unique_ptr<Client>> admins;
    admins.push_back(Connect(*a));
    admins.push_back(Connect(*b));
    // Six moves while the workers push (they go on until the sixth): a bounded job's last
    // round may stay open once they stop, and then it has no boundary to move at.
    int at = 0;
    while (moves.load() < 6) {
      std::string err;
      const int now = MoveOnce(admins, servers, at, spec.name, &err);
      ASSERT_NE(now, at) << err;
      at = now;
      moves++;
    }
  });
  for (auto& t : th) t.join();
  mover.join();
  ASSERT_EQ(moves.load(), 6);
  auto c = Connect(*a);
  ASSERT_TRUE(c->Join(spec, 0).ok());
  const Server& holder = c->port() == a->port() ? *a : *b;
  auto ctr = holder.Counters(c->job());
  ASSERT_TRUE(ctr.ok());
  uint64_t pushes = 0, accepted = 0, dropped = 0, redirects = 0;
  for (const auto& x : cc) {
    pushes += x.pushes;
    accepted += x.applied;
    dropped += x.dropped;
    redirects += x.redirects;
  }
  EXPECT_GE(pushes, 3u * kIters);
  EXPECT_EQ(ctr->pushes, pushes);
  EXPECT_EQ(ctr->applied + ctr->pending, accepted);
  EXPECT_EQ(ctr->dropped, dropped);
  EXPECT_EQ(ctr->rejected, 0u);
  EXPECT_GT(redirects, 0u) << "no worker followed a move";
  RawPusher p{c.get(), c->job()};
  EXPECT_EQ(p.Param(), -static_cast<float>(ctr->applied)) << "an applied push is missing or doubled";
}

TEST(ParamsvcMove, AsyncJobMovedUnderPushesAppliesEveryPushOnce) { CountingWorkers(Mode::kAsync, 0); }

TEST(ParamsvcMove, BoundedJobMovedUnderPushesAppliesOrDropsEveryPushOnce) {
  CountingWorkers(Mode::kBounded, 1);
}

// A round that never closes: the move gives up at its bound, the job stays, and the push it
// parked meanwhile is applied once it resumes.
TEST(ParamsvcMove, NoBoundaryWithinTheBoundAbortsAndTheParkedPushIsAppliedHere) {
  auto a = StartServer(2), b = StartServer(2);
  JobSpec spec = OnePartition("stuck", 2, Mode::kSync, 0);
  spec.tensors = {{"w", DType::kF32, {2048}}};  // Two partitions of 1024
  auto c = Connect(*a);
  ASSERT_TRUE(c->Join(spec, 0).ok());
  auto raw_push = [&](Client* cl, uint32_t worker, uint32_t part, float value) {
    std::vector<uint8_t> buf(PushRequest::kFixed + 4 * 1024);
    PushRequest{worker, part, 0, DType::kF32, 1024, {}}.EncodeFixed(buf.data());
    for (int i = 0; i < 1024; ++i) std::memcpy(buf.data() + PushRequest::kFixed + 4 * i, &value, 4);
    return cl->Call(Op::kPush, c->job(), buf);
  };
  ASSERT_TRUE(raw_push(c.get(), 0, 0, 1.0f).ok());  // Partition 0: a round open, 1 of 2.
  auto admin = Connect(*a);
  std::atomic<bool> moving{true};
  Status move_status;
  std::thread mover([&] {
    move_status = admin->MoveJob("stuck", Where(*b), 5000, false).status();
    moving = false;
  });
  // While it freezes, worker 0's push to partition 1 (at a boundary) is parked: no reply yet.
  auto c2 = Connect(*a);
  const Deadline d = Deadline::AfterMs(20000);
  while (nlohmann::json::parse(a->StatusJson())["jobs"][0]["place"] != "freezing" && !d.Expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));  // Polling the status, bounded.
  }
  ASSERT_TRUE(moving.load()) << "the move gave up before the test could push";
  auto parked = raw_push(c2.get(), 0, 1, 4.0f);
  mover.join();
  EXPECT_EQ(move_status.code(), StatusCode::kTimeout) << move_status;
  EXPECT_NE(move_status.message().find("partition 0 has a round open with 1 of 2"), std::string::npos)
      << move_status;
  ASSERT_TRUE(parked.ok()) << parked.status();  // Answered after the abort: applied here.
  auto rep = PushReply::Decode(*parked);
  ASSERT_TRUE(rep.ok());
  EXPECT_EQ(rep->outcome, PushOutcome::kPending);
  // Worker 1 closes both rounds: each partition = 0 - (worker 0 + worker 1), exactly once.
  ASSERT_TRUE(raw_push(c.get(), 1, 0, 2.0f).ok());
  ASSERT_TRUE(raw_push(c.get(), 1, 1, 8.0f).ok());
  std::vector<float> w(2048);
  void* pp[1] = {w.data()};
  ASSERT_TRUE(c->Pull(pp, false).ok());
  EXPECT_EQ(w[0], -3.0f);
  EXPECT_EQ(w[1500], -12.0f);
  auto ctr = a->Counters(c->job());
  EXPECT_EQ(ctr->applied, 4u);
  EXPECT_EQ(ctr->parked, 1u);
  // The destination dropped its staged copy (IMPORT_ABORT); the source never moved the job.
  auto bst = nlohmann::json::parse(b->StatusJson());
  EXPECT_EQ(bst["jobs"].size(), 0u) << bst.dump();
  auto ast = nlohmann::json::parse(a->StatusJson());
  EXPECT_EQ(ast["jobs"][0]["place"], "active");
  EXPECT_EQ(ast["moved"].size(), 0u);
}

TEST(ParamsvcMove, RefusedMovesLeaveTheJobWhereItIs) {
  auto a = StartServer(2), b = StartServer(2);
  const JobSpec spec = OnePartition("staying", 1, Mode::kSync, 0);
  auto c = Connect(*a);
  ASSERT_TRUE(c->Join(spec, 0).ok());
  auto admin = Connect(*a);
  // Nowhere to go, no such job, a bad address, itself.
  auto r = admin->MoveJob("staying", "127.0.0.1:1", 1000, false);
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable) << r.status();
  EXPECT_NE(r.status().message().find("destination 127.0.0.1:1"), std::string::npos) << r.status();
  r = admin->MoveJob("nobody", Where(*b), 1000, false);
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound) << r.status();
  r = admin->MoveJob("staying", "no-port", 1000, false);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status();
  r = admin->MoveJob("staying", Where(*a), 1000, false);
  EXPECT_NE(r.status().message().find("already on"), std::string::npos) << r.status();
  // The destination has a job of that name already.
  auto cb = Connect(*b);
  ASSERT_TRUE(cb->Join(spec, 0).ok());
  r = admin->MoveJob("staying", Where(*b), 1000, false);
  EXPECT_EQ(r.status().code(), StatusCode::kAlreadyExists) << r.status();
  // A worker's credential may not move jobs, nor stage one.
  auto cred = fabric::IssueCredential(kSecret, "worker", fabric::Role::kClient);
  ASSERT_TRUE(cred.ok());
  ClientOptions o;
  o.port = a->port();
  o.secret = cred->key;
  o.client_id = cred->client_id;
  auto worker = Client::Connect(o);
  ASSERT_TRUE(worker.ok()) << worker.status();
  r = (*worker)->MoveJob("staying", Where(*b), 1000, false);
  EXPECT_EQ(r.status().code(), StatusCode::kPermissionDenied) << r.status();
  EXPECT_EQ((*worker)->Call(Op::kImportBegin, 0, ImportBegin{7, Where(*a), spec}.Encode()).status().code(),
            StatusCode::kPermissionDenied);
  // The job trains on A as before.
  std::vector<float> g(1024, 1.0f), p(1024);
  const void* gp[1] = {g.data()};
  void* pp[1] = {p.data()};
  ASSERT_TRUE(c->PushPull(gp, pp).ok());
  EXPECT_EQ(p[0], -1.0f);
  EXPECT_EQ(c->port(), a->port());
  auto bst = nlohmann::json::parse(b->StatusJson());
  EXPECT_EQ(bst["jobs"].size(), 1u);  // Only B's own job of that name.
}

// Drain: new jobs are sent elsewhere; a moved job's old id and name lead to its new server.
TEST(ParamsvcMove, DrainSendsNewJobsAwayAndTombstonesLeadToTheJob) {
  auto a = StartServer(2), b = StartServer(2);
  auto admin = Connect(*a);
  ASSERT_TRUE(admin->Drain(true, Where(*b)).ok());
  auto c = Connect(*a);
  ASSERT_TRUE(c->Join(OnePartition("fresh", 1, Mode::kSync, 0), 0).ok());
  EXPECT_EQ(c->port(), b->port()) << "a new job registered on a draining server";
  EXPECT_EQ(c->counters().redirects, 1u);
  // Draining without a destination refuses new jobs; existing ones stay.
  ASSERT_TRUE(admin->Drain(true, "").ok());
  auto c2 = Connect(*a);
  EXPECT_EQ(c2->Join(OnePartition("refused", 1, Mode::kSync, 0), 0).code(), StatusCode::kUnavailable);
  ASSERT_TRUE(admin->Drain(false, "").ok());
  auto c3 = Connect(*a);
  ASSERT_TRUE(c3->Join(OnePartition("local", 1, Mode::kSync, 0), 0).ok());
  EXPECT_EQ(c3->port(), a->port());
  const uint32_t old_id = c3->job();
  // Move it; a raw request with the old id gets kStatusMoved B, a join by name follows.
  auto r = admin->MoveJob("local", Where(*b), 1000, false);
  ASSERT_TRUE(r.ok()) << r.status();
  auto c4 = Connect(*a);
  uint8_t pr[PullRequest::kWireSize];
  PullRequest{0, DType::kF32, 0, 100}.EncodeTo(pr);
  auto rep = c4->Call(Op::kPull, old_id, pr);
  EXPECT_EQ(rep.status().code(), StatusCode::kUnavailable) << rep.status();
  EXPECT_NE(rep.status().message().find("moved to " + Where(*b)), std::string::npos) << rep.status();
  ASSERT_TRUE(c4->Join(OnePartition("local", 1, Mode::kSync, 0), 0).ok());
  EXPECT_EQ(c4->port(), b->port());
  // The worker that was on A follows at its next call.
  std::vector<float> g(1024, 1.0f), p(1024);
  const void* gp[1] = {g.data()};
  void* pp[1] = {p.data()};
  ASSERT_TRUE(c3->PushPull(gp, pp).ok());
  EXPECT_EQ(c3->port(), b->port());
  EXPECT_EQ(p[0], -1.0f);
  EXPECT_EQ(c3->counters().rollbacks, 0u);
  // Moving it back: A's tombstone of it now leads to A itself (a client naming the old id
  // joins the job again by name).
  auto admin_b = Connect(*b);
  ASSERT_TRUE(admin_b->MoveJob("local", Where(*a), 1000, false).ok());
  auto ast = nlohmann::json::parse(a->StatusJson());
  ASSERT_EQ(ast["moved"].size(), 1u) << ast.dump();
  EXPECT_EQ(ast["moved"][0]["to"], Where(*a));
  auto c5 = Connect(*a);
  auto again = c5->Call(Op::kPull, old_id, pr);
  EXPECT_NE(again.status().message().find("moved to " + Where(*a)), std::string::npos) << again.status();
  ASSERT_TRUE(c3->PushPull(gp, pp).ok());
  EXPECT_EQ(c3->port(), a->port());
  EXPECT_EQ(p[0], -2.0f);
}

// GET_STATE / PUT_STATE: a job's whole state (momentum included) into a fresh server continues
// exactly as the original does.
TEST(ParamsvcMove, StateCarriedToAFreshServerContinuesBitIdentically) {
  auto a = StartServer(2), b = StartServer(2);
  JobSpec spec;
  spec.name = "momentum";
  spec.workers = 1;
  spec.optimizer.lr = 0.1f;
  spec.optimizer.momentum = 0.9f;
  spec.optimizer.weight_decay = 0.01f;
  spec.partition_bytes = 4096;
  spec.tensors = {{"w", DType::kF32, {1500}}, {"h", DType::kF16, {300}}};
  auto ca = Connect(*a);
  ASSERT_TRUE(ca->Join(spec, 0).ok());
  Tensors pa(spec), grads(spec);
  for (size_t t = 0; t < 2; ++t) {
    for (uint64_t i = 0; i < spec.tensors[t].elements(); ++i) pa.Set(spec, t, i, 0.5f + 0.001f * i);
  }
  ASSERT_TRUE(ca->SetParams(pa.cptrs()).ok());
  auto step = [&](Client* c, Tensors* params, int it) {
    for (size_t t = 0; t < 2; ++t) {
      for (uint64_t i = 0; i < spec.tensors[t].elements(); ++i) {
        grads.Set(spec, t, i, static_cast<float>((i * 7 + it * 3) % 11) * 0.25f - 1.0f);
      }
    }
    auto pp = params->ptrs();
    return c->PushPull(grads.cptrs(), pp);
  };
  for (int it = 0; it < 5; ++it) ASSERT_TRUE(step(ca.get(), &pa, it).ok());
  std::vector<PartitionState> saved;
  ASSERT_TRUE(ca->GetState(&saved).ok());
  ASSERT_EQ(saved.size(), ca->layout().partitions.size());
  for (const auto& s : saved) {
    EXPECT_EQ(s.version, 5u);
    EXPECT_EQ(s.mom.size(), s.param.size()) << "no momentum in the state";
  }
  auto cb = Connect(*b);
  ASSERT_TRUE(cb->Join(spec, 0).ok());
  ASSERT_TRUE(cb->PutState(saved).ok());
  Tensors pb(spec);
  auto pbp = pb.ptrs();
  ASSERT_TRUE(cb->Pull(pbp, false).ok());
  EXPECT_EQ(cb->min_version(), 5u);
  for (int it = 5; it < 12; ++it) {
    ASSERT_TRUE(step(ca.get(), &pa, it).ok());
    ASSERT_TRUE(step(cb.get(), &pb, it).ok());
  }
  EXPECT_EQ(pa.bufs, pb.bufs) << "the restored job diverged from the original";
  std::vector<PartitionState> sa, sb;
  ASSERT_TRUE(ca->GetState(&sa).ok());
  ASSERT_TRUE(cb->GetState(&sb).ok());
  for (size_t i = 0; i < sa.size(); ++i) {
    EXPECT_EQ(sa[i].param, sb[i].param);
    EXPECT_EQ(sa[i].mom, sb[i].mom);
    EXPECT_EQ(sa[i].version, 12u);
  }
  // Refusals: a round open; momentum for a job that keeps none; a wrong size.
  JobSpec two = spec;
  two.name = "two-workers";
  two.workers = 2;
  auto c2 = Connect(*b);
  ASSERT_TRUE(c2->Join(two, 0).ok());
  std::vector<PartitionState> fresh;
  ASSERT_TRUE(c2->GetState(&fresh).ok());
  std::vector<uint8_t> buf(PushRequest::kFixed + 4 * 1024);
  PushRequest{0, 0, 0, DType::kF32, 1024, {}}.EncodeFixed(buf.data());
  ASSERT_TRUE(c2->Call(Op::kPush, c2->job(), buf).ok());
  Status s = c2->PutState(fresh);
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("round open"), std::string::npos) << s;
  JobSpec plain = spec;
  plain.name = "plain";
  plain.optimizer.momentum = 0;
  auto c3 = Connect(*b);
  ASSERT_TRUE(c3->Join(plain, 0).ok());
  s = c3->PutState(saved);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  saved.pop_back();
  EXPECT_EQ(c3->PutState(saved).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tessera::paramsvc
