// kayak::Client and `tessera kv` against real `tessera memserver` processes on loopback: KV
// operations, the same answer as RPC or KV, concurrent read-write functions from both ways,
// pushback, operators' functions that misbehave, and a memserver SIGKILLed mid-run with and
// without replication; the memserver hosting Kayak as a service beside ops it does not know.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "apps/kayak/client/client.h"
#include "apps/kayak/client/connection.h"
#include "apps/kayak/wire/builtins.h"
#include "apps/kayak/wire/wire.h"
#include "client/local_cluster.h"
#include "tests/support/test_util.h"

namespace kayak {
namespace {

namespace bi = tessera::kayak::builtins;
using tessera::client::LocalCluster;
using tessera::client::LocalClusterOptions;

std::unique_ptr<LocalCluster> StartCluster(size_t n, std::vector<std::string> extra = {}) {
  LocalClusterOptions o;
  o.bin_dir = tessera::testing::BinDir();
  o.servers = n;
  o.capacity = "64M";
  o.slab_size = "1M";
  o.extra_flags = std::move(extra);
  auto c = LocalCluster::Start(o);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(*c) : nullptr;
}

std::unique_ptr<Client> Connect(LocalCluster& cluster, Mode mode, uint32_t replicas = 1) {
  ClientOptions o;
  o.servers = cluster.endpoints();
  o.secret = cluster.secret();
  o.replicas = replicas;
  o.controller.mode = mode;
  auto c = Client::Connect(o);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(*c) : nullptr;
}

std::vector<uint8_t> ChainValue(uint64_t next, uint64_t counter = 0) {
  std::vector<uint8_t> v(100, 0x42);
  bi::StoreLe64(v.data(), next);
  bi::StoreLe64(v.data() + 8, counter);
  return v;
}

// A ring of `len` keys co-located on `server`; returns the keys in order.
std::vector<uint64_t> BuildRing(Client& c, size_t server, size_t len, uint64_t from) {
  std::vector<uint64_t> keys = c.KeysOn(server, len, from);
  for (size_t i = 0; i < keys.size(); ++i) {
    auto r = c.Put(bi::KeyBytes(keys[i]), ChainValue(keys[(i + 1) % keys.size()]));
    EXPECT_TRUE(r.ok()) << r.status().ToString();
  }
  return keys;
}

TEST(KayakIntegrationTest, KvOperationsAndErrors) {
  auto cluster = StartCluster(3);
  ASSERT_NE(cluster, nullptr);
  auto c = Connect(*cluster, Mode::kKayak);
  ASSERT_NE(c, nullptr);
  EXPECT_GT(c->rtt_ns(), 0u);
  EXPECT_GE(c->slo_ns(), c->rtt_ns());
  std::vector<uint8_t> k = {'a', 'b'}, v = {'x', 'y', 'z'};
  EXPECT_EQ(c->Get(k).status().code(), tessera::StatusCode::kNotFound);
  auto p = c->Put(k, v);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  auto g = c->Get(k);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->bytes, v);
  EXPECT_EQ(g->version, *p);
  std::vector<uint8_t> big(64 << 10, 7);
  ASSERT_TRUE(c->Put(k, big).ok());
  EXPECT_EQ(c->Get(k)->bytes, big);
  big.push_back(1);
  EXPECT_EQ(c->Put(k, big).status().code(), tessera::StatusCode::kInvalidArgument);
  std::vector<uint8_t> long_key(65, 'k');
  EXPECT_EQ(c->Put(long_key, v).status().code(), tessera::StatusCode::kInvalidArgument);
  // MultiGet over every server, with a missing key.
  std::vector<std::vector<uint8_t>> keys;
  for (uint64_t i = 0; i < 50; ++i) {
    keys.push_back(bi::KeyBytes(1000 + i));
    if (i != 7) {
      ASSERT_TRUE(c->Put(keys.back(), ChainValue(i)).ok());
    }
  }
  auto mg = c->MultiGet(keys);
  ASSERT_TRUE(mg.ok()) << mg.status().ToString();
  for (uint64_t i = 0; i < 50; ++i) {
    if (i == 7) {
      EXPECT_EQ((*mg)[i].version, 0u);
    } else {
      EXPECT_EQ(bi::LoadLe64((*mg)[i].bytes.data()), i);
    }
  }
  EXPECT_TRUE(c->Delete(k).ok());
  EXPECT_EQ(c->Delete(k).code(), tessera::StatusCode::kNotFound);
  EXPECT_EQ(c->Get(k).status().code(), tessera::StatusCode::kNotFound);
  // Unknown function, bad arguments.
  EXPECT_EQ(c->InvokeOn(k, 77, {}).status().code(), tessera::StatusCode::kNotFound);
  EXPECT_EQ(c->Invoke(bi::kChase, std::vector<uint8_t>{1, 2}).status().code(),
            tessera::StatusCode::kInvalidArgument);
}

// One request on a raw Kayak connection; the reply, or Timeout when none came within 10 s.
tessera::Result<Reply> Call(Connection& conn, tessera::fabric::Op op,
                            std::span<const uint8_t> payload) {
  auto done = std::make_shared<std::promise<tessera::Result<Reply>>>();
  auto got = done->get_future();
  conn.Send(op, payload, [done](tessera::Result<Reply> r) { done->set_value(std::move(r)); });
  if (got.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
    return tessera::Timeout("no reply within 10 s");
  }
  return got.get();
}

// `tessera memserver` hosts Kayak as a service of ops 16..21: a service op next to them that no
// service registered is answered with an error naming the services, a KV payload the service
// refuses is answered with the field it refused, and the connection serves KV ops after both.
TEST(KayakIntegrationTest, TheMemserverAnswersOpsNoServiceRegisteredWithAClearError) {
  auto cluster = StartCluster(1);
  ASSERT_NE(cluster, nullptr);
  namespace kw = tessera::kayak::wire;
  auto conn = Connection::Open(cluster->endpoints()[0], cluster->secret(), 4242,
                               tessera::Deadline::AfterMs(10000));
  ASSERT_TRUE(conn.ok()) << conn.status().ToString();

  const std::vector<uint8_t> junk = {1, 2, 3};
  auto unknown = Call(**conn, tessera::fabric::Op{kw::kLastOp + 1}, junk);
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), tessera::StatusCode::kUnsupported) << unknown.status();
  EXPECT_NE(unknown.status().message().find("no service on this server handles op 22"),
            std::string::npos)
      << unknown.status();
  EXPECT_NE(unknown.status().message().find("kayak 16..21"), std::string::npos)
      << unknown.status();

  // A KV_GET whose key length does not match the bytes that follow.
  auto bad = Call(**conn, kw::kKvGet, kw::Payload(kw::KvKeyRequest{1, 5}, junk));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), tessera::StatusCode::kProtocolError) << bad.status();
  EXPECT_NE(bad.status().message().find("key_len"), std::string::npos) << bad.status();

  const std::vector<uint8_t> key = {'k'}, value = {'v', 'w'};
  auto put = Call(**conn, kw::kKvPut,
                  kw::Payload(kw::KvPutRequest{1, 1, kw::kAnyVersion, 2}, key, value));
  ASSERT_TRUE(put.ok()) << put.status().ToString();
  auto get = Call(**conn, kw::kKvGet, kw::Payload(kw::KvKeyRequest{1, 1}, key));
  ASSERT_TRUE(get.ok()) << get.status().ToString();
  auto parsed = kw::ParseResponse(kw::kKvGet, get->payload);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(std::vector<uint8_t>(parsed->data.begin(), parsed->data.end()), value);
  EXPECT_TRUE(conn.value()->up());
}

TEST(KayakIntegrationTest, SameAnswerAsRpcOrKv) {
  auto cluster = StartCluster(2);
  ASSERT_NE(cluster, nullptr);
  auto kv = Connect(*cluster, Mode::kKv);
  auto rpc = Connect(*cluster, Mode::kRpc);
  auto kayak = Connect(*cluster, Mode::kKayak);
  ASSERT_TRUE(kv && rpc && kayak);
  std::vector<uint64_t> ring0 = BuildRing(*kv, 0, 16, 1);
  std::vector<uint64_t> ring1 = BuildRing(*kv, 1, 16, 1);
  for (auto* ring : {&ring0, &ring1}) {
    for (uint32_t hops : {1u, 2u, 4u, 20u}) {
      for (uint32_t fn : {uint32_t{bi::kChase}, uint32_t{bi::kChaseCompute}}) {
        bi::ChaseArgs a{(*ring)[3], hops, fn == bi::kChaseCompute ? 10000u : 0u};
        auto rk = kv->Invoke(fn, a.Encode());
        auto rr = rpc->Invoke(fn, a.Encode());
        ASSERT_TRUE(rk.ok()) << rk.status().ToString();
        ASSERT_TRUE(rr.ok()) << rr.status().ToString();
        EXPECT_FALSE(rk->rpc);
        EXPECT_TRUE(rr->rpc);
        EXPECT_EQ(rk->result, rr->result) << "hops " << hops << " fn " << fn;
        for (int i = 0; i < 4; ++i) {  // Kayak mixes both ways: still the same answer.
          auto ry = kayak->Invoke(fn, a.Encode());
          ASSERT_TRUE(ry.ok());
          EXPECT_EQ(ry->result, rr->result);
        }
      }
    }
  }
  bi::AggregateArgs agg{{ring0[0], ring0[5], 999999, ring0[9]}};
  auto ak = kv->Invoke(bi::kMultiGetAggregate, agg.Encode());
  auto ar = rpc->Invoke(bi::kMultiGetAggregate, agg.Encode());
  ASSERT_TRUE(ak.ok() && ar.ok());
  EXPECT_EQ(ak->result, ar->result);
  EXPECT_EQ(bi::ChaseResult::Decode(ak->result)->last_key, 3u);  // 3 of 4 keys found.
  // A chain that is not co-located: KV follows it, RPC says why it cannot.
  ASSERT_TRUE(kv->Put(bi::KeyBytes(ring0[0]), ChainValue(ring1[0])).ok());
  bi::ChaseArgs cross{ring0[0], 3, 0};
  EXPECT_TRUE(kv->Invoke(bi::kChase, cross.Encode()).ok());
  auto rc = rpc->Invoke(bi::kChase, cross.Encode());
  EXPECT_EQ(rc.status().code(), tessera::StatusCode::kNotFound);
  EXPECT_NE(rc.status().message().find("one server"), std::string::npos) << rc.status().ToString();
}

// Read-write functions from concurrent clients, half the KV way (commit with versions) and half
// as RPC (optimistic on the server): every increment lands exactly once.
TEST(KayakIntegrationTest, ConcurrentReadWriteFunctionsFromBothWays) {
  auto cluster = StartCluster(2);
  ASSERT_NE(cluster, nullptr);
  auto setup = Connect(*cluster, Mode::kKv);
  ASSERT_NE(setup, nullptr);
  std::vector<uint64_t> ring = BuildRing(*setup, 1, 4, 1);
  constexpr int kThreads = 4, kPerThread = 150;
  std::atomic<int> failures{0};
  std::atomic<uint64_t> max_counter{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto c = Connect(*cluster, t % 2 == 0 ? Mode::kKv : Mode::kRpc);
      if (!c) {
        failures += kPerThread;
        return;
      }
      for (int i = 0; i < kPerThread; ++i) {
        // Chases of 1 and 2 hops from ring[0] end on ring[0] and ring[1]: contention on both.
        bi::ChaseArgs a{ring[0], static_cast<uint32_t>(1 + i % 2), 0};
        auto r = c->Invoke(bi::kChaseIncrement, a.Encode());
        if (!r.ok()) {
          ++failures;
          ADD_FAILURE() << r.status().ToString();
          continue;
        }
        uint64_t counter = bi::ChaseResult::Decode(r->result)->value;
        uint64_t prev = max_counter.load();
        while (counter > prev && !max_counter.compare_exchange_weak(prev, counter)) {
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  auto v0 = setup->Get(bi::KeyBytes(ring[0]));
  auto v1 = setup->Get(bi::KeyBytes(ring[1]));
  ASSERT_TRUE(v0.ok() && v1.ok());
  const uint64_t c0 = bi::LoadLe64(v0->bytes.data() + 8), c1 = bi::LoadLe64(v1->bytes.data() + 8);
  EXPECT_EQ(c0 + c1, uint64_t{kThreads} * kPerThread) << "lost or doubled increments";
  EXPECT_EQ(c0, uint64_t{kThreads} * kPerThread / 2);
  // The chain links were never clobbered.
  EXPECT_EQ(bi::LoadLe64(v0->bytes.data()), ring[1]);
}

TEST(KayakIntegrationTest, PushbackRunsTheKvWayWithTheSameAnswer) {
  auto cluster = StartCluster(1, {"--offload_workers=1", "--offload_queue=1"});
  ASSERT_NE(cluster, nullptr);
  auto c = Connect(*cluster, Mode::kPushback);
  auto ref = Connect(*cluster, Mode::kKv);
  ASSERT_TRUE(c && ref);
  std::vector<uint64_t> ring = BuildRing(*c, 0, 8, 1);
  bi::ChaseArgs a{ring[0], 4, 300000};  // ~1 ms of compute each on the one worker.
  auto want = ref->Invoke(bi::kChaseCompute, a.Encode());
  ASSERT_TRUE(want.ok());
  std::mutex mu;
  std::condition_variable cv;
  int done = 0, pushed = 0, wrong = 0;
  constexpr int kCalls = 40;
  for (int i = 0; i < kCalls; ++i) {
    c->Invoke(bi::kChaseCompute, a.Encode(), [&](tessera::Result<InvokeResult> r) {
      std::lock_guard<std::mutex> lock(mu);
      if (!r.ok() || r->result != want->result) ++wrong;
      if (r.ok() && r->pushed_back) ++pushed;
      ++done;
      cv.notify_all();
    });
  }
  std::unique_lock<std::mutex> lock(mu);
  ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(60), [&] { return done == kCalls; }));
  EXPECT_EQ(wrong, 0);
  EXPECT_GT(pushed, 0) << "40 concurrent 1 ms calls on 1 worker with a queue of 1: none pushed back";
  EXPECT_EQ(c->counters().pushed_back, static_cast<uint64_t>(pushed));
}

TEST(KayakIntegrationTest, MisbehavingOperatorFunctionsAreStoppedAndTheServerServes) {
  const std::string lib = tessera::testing::BinDir() + "/../lib/libtessera_test_offload.so";
  auto cluster = StartCluster(1, {"--offload_lib=" + lib, "--offload_budget=30ms"});
  ASSERT_NE(cluster, nullptr);
  auto c = Connect(*cluster, Mode::kRpc);
  ASSERT_NE(c, nullptr);
  std::vector<uint8_t> key = bi::KeyBytes(5);
  ASSERT_TRUE(c->Put(key, ChainValue(40)).ok());
  for (int round = 0; round < 2; ++round) {
    auto spin = c->InvokeOn(key, 302, {});
    EXPECT_EQ(spin.status().code(), tessera::StatusCode::kTimeout) << spin.status().ToString();
    EXPECT_NE(spin.status().message().find("budget"), std::string::npos);
    EXPECT_EQ(c->InvokeOn(key, 303, {}).status().code(), tessera::StatusCode::kTimeout);
    auto segv = c->InvokeOn(key, 304, {});
    EXPECT_EQ(segv.status().code(), tessera::StatusCode::kOutOfRange) << segv.status().ToString();
    EXPECT_EQ(c->InvokeOn(key, 305, {}).status().code(), tessera::StatusCode::kOutOfRange);
    EXPECT_EQ(c->InvokeOn(key, 306, key).status().code(), tessera::StatusCode::kOutOfRange);
    // Still serving: a good function and plain GETs.
    auto sum = c->InvokeOn(key, 300, key);
    ASSERT_TRUE(sum.ok()) << sum.status().ToString();
    EXPECT_EQ(bi::LoadLe64(sum->result.data()), 40u);
    EXPECT_TRUE(c->Get(key).ok());
  }
  EXPECT_TRUE(cluster->Running(0));
}

// 3 servers, 2-way replication: a server SIGKILLed while writers run loses no acknowledged PUT.
TEST(KayakIntegrationTest, ReplicatedTableLosesNoAcknowledgedPutWhenAServerIsKilled) {
  auto cluster = StartCluster(3);
  ASSERT_NE(cluster, nullptr);
  constexpr int kWriters = 3;
  std::mutex mu;
  std::map<uint64_t, uint64_t> acked;  // key -> last acknowledged value
  std::atomic<bool> stop{false};
  std::atomic<int> writes{0};
  std::atomic<int> errors{0};
  std::vector<std::thread> writers;
  for (int w = 0; w < kWriters; ++w) {
    writers.emplace_back([&, w] {
      auto c = Connect(*cluster, Mode::kKv, 2);
      if (!c) return;
      for (uint64_t i = 1; !stop.load(); ++i) {
        const uint64_t key = 100 + w * 1000 + (i % 200);
        auto r = c->Put(bi::KeyBytes(key), ChainValue(i));
        if (!r.ok()) {
          ++errors;
          ADD_FAILURE() << "replicated PUT failed: " << r.status().ToString();
          continue;
        }
        std::lock_guard<std::mutex> lock(mu);
        acked[key] = i;
        ++writes;
      }
    });
  }
  auto wait_writes = [&](int n) {
    for (int i = 0; i < 3000 && writes.load() < n; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  };
  wait_writes(500);
  ASSERT_TRUE(cluster->Kill(1).ok());
  const int at_kill = writes.load();
  wait_writes(at_kill + 1000);
  stop = true;
  for (auto& t : writers) t.join();
  EXPECT_GE(writes.load(), at_kill + 1000) << "writers stalled after the kill";
  EXPECT_EQ(errors.load(), 0);
  ClientOptions o;
  o.servers = cluster->endpoints();
  o.secret = cluster->secret();
  o.replicas = 2;
  auto strict = Client::Connect(o);
  EXPECT_EQ(strict.status().code(), tessera::StatusCode::kUnavailable) << strict.status().ToString();
  o.tolerate_unreachable = true;
  auto reader = Client::Connect(o);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  std::lock_guard<std::mutex> lock(mu);
  int lost = 0;
  for (auto& [key, value] : acked) {
    auto r = (*reader)->Get(bi::KeyBytes(key));
    if (!r.ok() || bi::LoadLe64(r->bytes.data()) != value) {
      ++lost;
      ADD_FAILURE() << "key " << key << ": acknowledged " << value << ", read "
                    << (r.ok() ? std::to_string(bi::LoadLe64(r->bytes.data())) : r.status().ToString());
      if (lost > 5) break;
    }
  }
  EXPECT_EQ(lost, 0);
  EXPECT_GT(acked.size(), 100u);
}

// Without replication a dead server's keys fail with a clear error; the others keep working.
TEST(KayakIntegrationTest, UnreplicatedTableGivesAClearErrorWhenAServerIsKilled) {
  auto cluster = StartCluster(2);
  ASSERT_NE(cluster, nullptr);
  auto c = Connect(*cluster, Mode::kKayak);
  ASSERT_NE(c, nullptr);
  std::vector<uint64_t> on0 = c->KeysOn(0, 20, 1), on1 = c->KeysOn(1, 20, 1);
  for (uint64_t k : on0) ASSERT_TRUE(c->Put(bi::KeyBytes(k), ChainValue(k)).ok());
  for (uint64_t k : on1) ASSERT_TRUE(c->Put(bi::KeyBytes(k), ChainValue(k)).ok());
  ASSERT_TRUE(cluster->Kill(1).ok());
  const std::string dead = cluster->endpoints()[1].ToString();
  for (uint64_t k : on1) {
    auto r = c->Get(bi::KeyBytes(k));
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), tessera::StatusCode::kUnavailable);
    EXPECT_NE(r.status().message().find(dead), std::string::npos) << r.status().ToString();
    EXPECT_EQ(c->Put(bi::KeyBytes(k), ChainValue(1)).status().code(),
              tessera::StatusCode::kUnavailable);
  }
  for (uint64_t k : on0) {
    auto r = c->Get(bi::KeyBytes(k));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(bi::LoadLe64(r->bytes.data()), k);
  }
  auto inv = c->Invoke(bi::kChase, bi::ChaseArgs{on1[0], 1, 0}.Encode());
  EXPECT_EQ(inv.status().code(), tessera::StatusCode::kUnavailable);
}

// A stopped (SIGSTOP) server keeps its connections open but never answers: requests to it fail
// with Timeout naming it after request_timeout_ms, requests to the others go on, and after
// SIGCONT it serves again (late replies to expired requests are dropped).
TEST(KayakIntegrationTest, AStoppedServerTimesRequestsOutWithAClearError) {
  auto cluster = StartCluster(2);
  ASSERT_NE(cluster, nullptr);
  ClientOptions o;
  o.servers = cluster->endpoints();
  o.secret = cluster->secret();
  o.controller.mode = Mode::kRpc;
  o.request_timeout_ms = 300;
  auto c = Client::Connect(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  std::vector<uint64_t> on0 = (*c)->KeysOn(0, 4, 1), on1 = (*c)->KeysOn(1, 4, 1);
  for (uint64_t k : on0) ASSERT_TRUE((*c)->Put(bi::KeyBytes(k), ChainValue(k)).ok());
  for (uint64_t k : on1) ASSERT_TRUE((*c)->Put(bi::KeyBytes(k), ChainValue(k)).ok());
  ASSERT_TRUE(cluster->Stop(1).ok());
  const std::string stopped = cluster->endpoints()[1].ToString();
  const auto t0 = std::chrono::steady_clock::now();
  auto r = (*c)->Get(bi::KeyBytes(on1[0]));
  const auto waited = std::chrono::steady_clock::now() - t0;
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), tessera::StatusCode::kTimeout) << r.status().ToString();
  EXPECT_NE(r.status().message().find(stopped), std::string::npos) << r.status().ToString();
  EXPECT_GE(waited, std::chrono::milliseconds(300));
  EXPECT_LT(waited, std::chrono::seconds(20)) << "the timeout did not fire in time";
  auto inv = (*c)->Invoke(bi::kChase, bi::ChaseArgs{on1[1], 1, 0}.Encode());
  EXPECT_EQ(inv.status().code(), tessera::StatusCode::kTimeout) << inv.status().ToString();
  // The other server is unaffected.
  auto ok = (*c)->Get(bi::KeyBytes(on0[0]));
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  ASSERT_TRUE(cluster->Cont(1).ok());
  // Served again after SIGCONT (the late replies of the expired requests are dropped).
  auto again = (*c)->Get(bi::KeyBytes(on1[2]));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(bi::LoadLe64(again->bytes.data()), on1[2]);
}

// A closed loop that sends its next request from the reply callback writes many requests per
// send() under load (the reader's SendBatch), and every answer is still right.
TEST(KayakIntegrationTest, RequestsSentFromCallbacksAreCoalesced) {
  auto cluster = StartCluster(1);
  ASSERT_NE(cluster, nullptr);
  auto c = Connect(*cluster, Mode::kRpc);
  ASSERT_NE(c, nullptr);
  std::vector<uint64_t> ring = BuildRing(*c, 0, 16, 1);
  auto want = c->Invoke(bi::kChase, bi::ChaseArgs{ring[0], 3, 0}.Encode());
  ASSERT_TRUE(want.ok());
  std::mutex mu;
  std::condition_variable cv;
  int done = 0, wrong = 0;
  constexpr int kLoops = 32, kPerLoop = 200;
  std::function<void(int)> next = [&](int left) {
    c->Invoke(bi::kChase, bi::ChaseArgs{ring[0], 3, 0}.Encode(), [&, left](tessera::Result<InvokeResult> r) {
      {
        std::lock_guard<std::mutex> lock(mu);
        if (!r.ok() || r->result != want->result) ++wrong;
      }
      if (left > 1) return next(left - 1);
      std::lock_guard<std::mutex> lock(mu);
      ++done;
      cv.notify_all();
    });
  };
  const auto before = c->send_stats();
  for (int i = 0; i < kLoops; ++i) next(kPerLoop);
  std::unique_lock<std::mutex> lock(mu);
  ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(60), [&] { return done == kLoops; }));
  EXPECT_EQ(wrong, 0);
  const auto after = c->send_stats();
  const uint64_t frames = after.frames - before.frames, calls = after.send_calls - before.send_calls;
  EXPECT_EQ(frames, uint64_t{kLoops} * kPerLoop);
  EXPECT_LT(calls, frames) << "32 requests in flight, every one sent by its own send()";
}

// `tessera kv` end to end, parsing its --json output.
TEST(KayakIntegrationTest, KvCommandLine) {
  auto cluster = StartCluster(2);
  ASSERT_NE(cluster, nullptr);
  auto kv = [&](std::vector<std::string> args) {
    std::vector<std::string> argv = {"kv", "--cluster", cluster->cluster_file_path(),
                                     "--auth_token_file", cluster->token_path(), "--json"};
    argv.insert(argv.end(), args.begin(), args.end());
    return tessera::testing::RunTessera(argv, 30000);
  };
  auto put = kv({"put", "greeting", "hello"});
  ASSERT_EQ(put.exit_code, 0) << put.stdout_text;
  auto get = kv({"get", "greeting"});
  ASSERT_EQ(get.exit_code, 0);
  auto j = nlohmann::json::parse(get.stdout_text, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << get.stdout_text;
  EXPECT_EQ(j["value"], "hello");
  EXPECT_GT(j["version"].get<uint64_t>(), 0u);
  // A chain on one server, invoked both ways.
  ClientOptions o;
  o.servers = cluster->endpoints();
  o.secret = cluster->secret();
  o.measure_rtt = false;
  auto c = Client::Connect(o);
  ASSERT_TRUE(c.ok());
  std::vector<uint64_t> keys = (*c)->KeysOn(0, 3, 1);
  for (size_t i = 0; i < 3; ++i) {
    auto p = kv({"--key_format=u64", "--value_format=chain", "put", std::to_string(keys[i]),
                 std::to_string(keys[(i + 1) % 3])});
    ASSERT_EQ(p.exit_code, 0) << p.stdout_text;
  }
  std::string digest[2];
  int n = 0;
  for (const char* mode : {"--mode=rpc", "--mode=kv"}) {
    auto r = kv({mode, "invoke", "chase", std::to_string(keys[0]), "3"});
    ASSERT_EQ(r.exit_code, 0) << r.stdout_text;
    auto jr = nlohmann::json::parse(r.stdout_text, nullptr, false);
    ASSERT_FALSE(jr.is_discarded()) << r.stdout_text;
    EXPECT_EQ(jr["last_key"].get<uint64_t>(), keys[2]);
    EXPECT_EQ(jr["ran_as"], std::string(mode).substr(7));
    digest[n++] = jr["result_hex"];
  }
  EXPECT_EQ(digest[0], digest[1]);
  auto del = kv({"del", "greeting"});
  EXPECT_EQ(del.exit_code, 0);
  auto gone = kv({"get", "greeting"});
  EXPECT_EQ(gone.exit_code, 1);
  auto jg = nlohmann::json::parse(gone.stdout_text, nullptr, false);
  ASSERT_FALSE(jg.is_discarded()) << gone.stdout_text;
  EXPECT_EQ(jg["ok"], false);
  EXPECT_NE(jg["error"].get<std::string>().find("NotFound"), std::string::npos);
  EXPECT_EQ(kv({"frobnicate", "x"}).exit_code, 2);
  EXPECT_EQ(kv({"get"}).exit_code, 2);
  EXPECT_EQ(kv({"--mode=fast", "get", "x"}).exit_code, 2);
}

}  // namespace
}  // namespace kayak
