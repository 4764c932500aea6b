// OffloadRuntime: built-in functions, operators' functions from a shared library, pushback,
// optimistic retries, and misbehaving functions that must be stopped while the runtime goes on.
#include "apps/kayak/server/offload.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <cstring>
#include <future>
#include <memory>
#include <mutex>

#include "apps/kayak/wire/builtins.h"

namespace tessera::kayak {
namespace {

// The slab owner the memserver would reserve for the service (memserver/service.h).
constexpr OwnerId kOwner = memserver::ServiceOwner(0);

namespace bi = builtins;


std::vector<uint8_t> ChainValue(uint64_t next, uint64_t counter, size_t size = 100) {
  std::vector<uint8_t> v(size, 0x5a);
  bi::StoreLe64(v.data(), next);
  bi::StoreLe64(v.data() + 8, counter);
  return v;
}

struct Fixture {
  Fixture() {
    pool = SlabPool::Create({32 << 20, 1 << 20, false}).value();
    store = std::make_unique<KvStore>(pool.get(), kOwner);
    table = store->Table(1, true);
    // A ring of 100 keys: key i -> i+1 (mod 100).
    for (uint64_t i = 0; i < 100; ++i) {
      EXPECT_TRUE(table->Put(bi::KeyBytes(i), ChainValue((i + 1) % 100, 0), 0).ok());
    }
  }
  std::unique_ptr<SlabPool> pool;
  std::unique_ptr<KvStore> store;
  KvTable* table;
};

Result<InvokeResult> Call(OffloadRuntime& rt, uint32_t table, uint32_t fn,
                          std::vector<uint8_t> args, bool no_pushback = true) {
  // Shared with the callback: a reply that comes after the bounded wait below has given up
  // lands in this promise, not in a dead stack frame (or the next call's promise).
  auto p = std::make_shared<std::promise<Result<InvokeResult>>>();
  auto f = p->get_future();
  auto s = rt.Submit(table, fn, std::move(args), no_pushback,
                     [p](Result<InvokeResult> r) { p->set_value(std::move(r)); });
  if (!s.ok()) return s.status();
  if (*s == OffloadRuntime::SubmitOutcome::kPushedBack) return ResourceExhausted("pushed back");
  if (f.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
    return Timeout("no reply within 20 s");
  }
  return f.get();
}

TEST(OffloadTest, BuiltinChaseMatchesAClientSideChase) {
  Fixture fx;
  auto rt = OffloadRuntime::Create(fx.store.get(), {}).value();
  for (uint32_t hops : {1u, 2u, 4u, 7u}) {
    bi::ChaseArgs a{10, hops, 0};
    auto r = Call(*rt, 1, bi::kChase, a.Encode());
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    auto res = bi::ChaseResult::Decode(r->result);
    ASSERT_TRUE(res.ok());
    // The same steps over plain GETs.
    uint64_t key = 10, last = 10, digest = bi::kDigestSeed;
    for (uint32_t h = 0; h < hops; ++h) {
      std::vector<uint8_t> v;
      ASSERT_NE(fx.table->Get(bi::KeyBytes(key), &v), 0u);
      digest = bi::Fold(digest, v);
      last = key;
      key = *bi::NextKey(key, v);
    }
    EXPECT_EQ(res->last_key, last);
    EXPECT_EQ(res->value, digest);
    EXPECT_EQ(last, 10 + hops - 1);
    // chase_compute = chase, then Compute().
    bi::ChaseArgs c{10, hops, 5000};
    auto rc = Call(*rt, 1, bi::kChaseCompute, c.Encode());
    ASSERT_TRUE(rc.ok());
    EXPECT_EQ(bi::ChaseResult::Decode(rc->result)->value, bi::Compute(digest, 5000));
  }
  // Aggregate over found and missing keys.
  bi::AggregateArgs agg{{1, 2, 1000, 3}};
  auto ra = Call(*rt, 1, bi::kMultiGetAggregate, agg.Encode());
  ASSERT_TRUE(ra.ok());
  auto res = bi::ChaseResult::Decode(ra->result);
  EXPECT_EQ(res->last_key, 3u);
  // Errors: a broken chain, bad arguments, an unknown function.
  ASSERT_TRUE(fx.table->Delete(bi::KeyBytes(12), 0).ok());
  auto broken = Call(*rt, 1, bi::kChase, bi::ChaseArgs{10, 4, 0}.Encode());
  EXPECT_EQ(broken.status().code(), StatusCode::kNotFound) << broken.status().ToString();
  EXPECT_EQ(Call(*rt, 1, bi::kChase, {1, 2, 3}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Call(*rt, 1, 99, {}).status().code(), StatusCode::kNotFound);
}

TEST(OffloadTest, BuiltinBudgetStopsLongComputation) {
  Fixture fx;
  OffloadOptions o;
  o.budget_ns = 2'000'000;  // 2 ms
  auto rt = OffloadRuntime::Create(fx.store.get(), o).value();
  auto r = Call(*rt, 1, bi::kChaseCompute, bi::ChaseArgs{0, 1, bi::kMaxComputeIters}.Encode());
  EXPECT_EQ(r.status().code(), StatusCode::kTimeout) << r.status().ToString();
  EXPECT_EQ(rt->stats().stopped_budget, 1u);
  EXPECT_TRUE(Call(*rt, 1, bi::kChase, bi::ChaseArgs{0, 2, 0}.Encode()).ok());
}

TEST(OffloadTest, ConcurrentReadWriteFunctionsRetryAndLoseNothing) {
  Fixture fx;
  OffloadOptions o;
  o.workers = 4;
  o.max_attempts = 1000;
  auto rt = OffloadRuntime::Create(fx.store.get(), o).value();
  constexpr int kCalls = 400;
  std::mutex mu;
  std::condition_variable cv;
  int done = 0, failures = 0;
  for (int i = 0; i < kCalls; ++i) {
    // Two-hop chases from 40 and 41 both end on key 41 or 42: they conflict often.
    bi::ChaseArgs a{static_cast<uint64_t>(40 + i % 2), static_cast<uint32_t>(2 - i % 2), 0};
    auto s = rt->Submit(1, bi::kChaseIncrement, a.Encode(), true, [&](Result<InvokeResult> r) {
      std::lock_guard<std::mutex> lock(mu);
      if (!r.ok()) ++failures;
      ++done;
      cv.notify_all();
    });
    ASSERT_TRUE(s.ok());
    ASSERT_EQ(*s, OffloadRuntime::SubmitOutcome::kQueued);
  }
  std::unique_lock<std::mutex> lock(mu);
  ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(30), [&] { return done == kCalls; }));
  EXPECT_EQ(failures, 0);
  std::vector<uint8_t> v;
  fx.table->Get(bi::KeyBytes(41), &v);
  EXPECT_EQ(bi::LoadLe64(v.data() + 8), uint64_t{kCalls});
}

TEST(OffloadTest, PushesBackWhenTheQueueIsFull) {
  Fixture fx;
  OffloadOptions o;
  o.workers = 1;
  o.max_queue = 2;
  o.budget_ns = 5'000'000'000ull;
  auto rt = OffloadRuntime::Create(fx.store.get(), o).value();
  // Block the only worker until released.
  std::mutex mu;
  std::condition_variable cv;
  int finished = 0;
  auto done = [&](Result<InvokeResult>) {
    std::lock_guard<std::mutex> lock(mu);
    ++finished;
    cv.notify_all();
  };
  auto heavy = bi::ChaseArgs{0, 1, 4'000'000}.Encode();  // tens of ms each
  int queued = 0, pushed = 0;
  for (int i = 0; i < 10; ++i) {
    auto s = rt->Submit(1, bi::kChaseCompute, heavy, false, done);
    ASSERT_TRUE(s.ok());
    (*s == OffloadRuntime::SubmitOutcome::kQueued ? queued : pushed)++;
  }
  EXPECT_LE(queued, 3);  // One running, at most two waiting.
  EXPECT_GE(pushed, 7);
  EXPECT_EQ(rt->stats().pushed_back, static_cast<uint64_t>(pushed));
  std::unique_lock<std::mutex> lock(mu);
  ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(60), [&] { return finished == queued; }));
}

TEST(OffloadTest, CheapBuiltinsRunInlineAndHeavyOnesGoToThePool) {
  Fixture fx;
  OffloadOptions o;
  // Generous, so a loaded machine's preemption cannot push a cheap run past the cut-off.
  o.inline_ns = 50'000'000;
  auto rt = OffloadRuntime::Create(fx.store.get(), o).value();
  // A 4-hop chase is cheap: it runs here, with the pool's answer.
  auto cheap = bi::ChaseArgs{10, 4, 0}.Encode();
  auto here = rt->TryInline(1, bi::kChase, cheap);
  ASSERT_TRUE(here.has_value());
  ASSERT_TRUE(here->ok()) << here->status().ToString();
  auto pooled = Call(*rt, 1, bi::kChase, cheap);
  ASSERT_TRUE(pooled.ok());
  EXPECT_EQ((*here)->result, pooled->result);
  EXPECT_EQ(rt->stats().inline_completed, 1u);
  EXPECT_EQ(rt->stats().completed, 2u);
  // 200M compute rounds are not (whatever this machine's speed): the pool would run them.
  const auto heavy = bi::ChaseArgs{10, 1, 200'000'000}.Encode();
  EXPECT_GT(rt->EstimateNs(bi::kChaseCompute, heavy), o.inline_ns);
  EXPECT_FALSE(rt->TryInline(1, bi::kChaseCompute, heavy));
  // Errors are answers like any other; table 0 is refused as Submit() refuses it.
  auto broken = rt->TryInline(1, bi::kChase, bi::ChaseArgs{1000, 2, 0}.Encode());
  ASSERT_TRUE(broken.has_value());
  EXPECT_EQ(broken->status().code(), StatusCode::kNotFound);
  auto bad = rt->TryInline(1, bi::kChase, std::vector<uint8_t>(3));
  ASSERT_TRUE(bad.has_value());
  EXPECT_EQ(bad->status().code(), StatusCode::kInvalidArgument);
  auto table0 = rt->TryInline(0, bi::kChase, cheap);
  ASSERT_TRUE(table0.has_value());
  EXPECT_EQ(table0->status().code(), StatusCode::kInvalidArgument);
  // The read-write built-in commits inline.
  auto inc = rt->TryInline(1, bi::kChaseIncrement, bi::ChaseArgs{20, 2, 0}.Encode());
  ASSERT_TRUE(inc.has_value() && inc->ok());
  std::vector<uint8_t> v;
  fx.table->Get(bi::KeyBytes(21), &v);
  EXPECT_EQ(bi::LoadLe64(v.data() + 8), 1u);
  // Inline off: nothing runs here.
  OffloadOptions off;
  off.inline_ns = 0;
  auto rt_off = OffloadRuntime::Create(fx.store.get(), off).value();
  EXPECT_FALSE(rt_off->TryInline(1, bi::kChase, cheap));
}

TEST(OffloadTest, AnInlineRunThatOverrunsWritesNothingAndGoesToThePool) {
  Fixture fx;
  // A 64-hop ring of 16 KiB values: estimated cheap by its hop count, but folding 1 MiB takes
  // about a millisecond (more under sanitizers), far past the inline cut-off (4 x 20 us + 20 us).
  for (uint64_t i = 0; i < 64; ++i) {
    ASSERT_TRUE(fx.table->Put(bi::KeyBytes(1000 + i), ChainValue(1000 + (i + 1) % 64, 0, 16384), 0).ok());
  }
  OffloadOptions o;
  o.inline_ns = 20'000;
  o.budget_ns = 20'000'000'000ull;  // The pool's run must finish, however slow the build.
  auto rt = OffloadRuntime::Create(fx.store.get(), o).value();
  auto args = bi::ChaseArgs{1000, 64, 0}.Encode();
  ASSERT_LE(rt->EstimateNs(bi::kChaseIncrement, args), o.inline_ns);
  EXPECT_FALSE(rt->TryInline(1, bi::kChaseIncrement, args));
  EXPECT_EQ(rt->stats().inline_overran, 1u);
  std::vector<uint8_t> v;
  fx.table->Get(bi::KeyBytes(1063), &v);
  EXPECT_EQ(bi::LoadLe64(v.data() + 8), 0u) << "an abandoned inline run wrote";
  // The pool runs it to completion with the full budget.
  auto r = Call(*rt, 1, bi::kChaseIncrement, args);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  fx.table->Get(bi::KeyBytes(1063), &v);
  EXPECT_EQ(bi::LoadLe64(v.data() + 8), 1u);
}

#ifndef TESSERA_SANITIZER_BUILD
// One worker running the test library's functions with a 20 ms budget.
OffloadOptions LibraryOptions() {
  OffloadOptions o;
  o.workers = 1;
  o.budget_ns = 20'000'000;
  o.libraries = {TESSERA_TEST_OFFLOAD_LIB};
  return o;
}

// Signal-based stops are not exercised under ASan (it owns SIGSEGV); the integration test runs
// the same library in a real memserver.
TEST(OffloadTest, OperatorFunctionsAndMisbehavingOnesAreStopped) {
  Fixture fx;
  const OffloadOptions o = LibraryOptions();
  auto created = OffloadRuntime::Create(fx.store.get(), o);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  auto rt = std::move(*created);
  EXPECT_NE(rt->FunctionList().find("300 sum"), std::string::npos) << rt->FunctionList();
  auto keys = [](std::initializer_list<uint64_t> ks) {
    std::vector<uint8_t> a;
    for (uint64_t k : ks) {
      auto b = bi::KeyBytes(k);
      a.insert(a.end(), b.begin(), b.end());
    }
    return a;
  };
  auto sum = Call(*rt, 1, 300, keys({1, 2, 3}));
  ASSERT_TRUE(sum.ok()) << sum.status().ToString();
  ASSERT_EQ(sum->result.size(), 8u);
  EXPECT_EQ(bi::LoadLe64(sum->result.data()), 2u + 3u + 4u);

  for (int round = 0; round < 2; ++round) {  // A stopped worker serves the next call fine.
    auto spin = Call(*rt, 1, 302, {});
    EXPECT_EQ(spin.status().code(), StatusCode::kTimeout) << spin.status().ToString();
    auto spin_yield = Call(*rt, 1, 303, {});
    EXPECT_EQ(spin_yield.status().code(), StatusCode::kTimeout) << spin_yield.status().ToString();
    auto segv = Call(*rt, 1, 304, {});
    EXPECT_EQ(segv.status().code(), StatusCode::kOutOfRange) << segv.status().ToString();
    EXPECT_NE(segv.status().message().find("memory fault"), std::string::npos);
    auto bad = Call(*rt, 1, 305, {});
    EXPECT_EQ(bad.status().code(), StatusCode::kOutOfRange) << bad.status().ToString();
    EXPECT_NE(bad.status().message().find("key length"), std::string::npos);
    auto wild = Call(*rt, 1, 306, keys({5}));
    EXPECT_EQ(wild.status().code(), StatusCode::kOutOfRange) << wild.status().ToString();
    auto again = Call(*rt, 1, 300, keys({1}));
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    EXPECT_EQ(bi::LoadLe64(again->result.data()), 2u);
  }
  // The yielding spinner's writes never landed.
  EXPECT_EQ(fx.table->Get(std::vector<uint8_t>{'s', 'p', 'i', 'n', 0, 0, 0, 0}, nullptr), 0u);
  auto st = rt->stats();
  EXPECT_EQ(st.stopped_budget, 4u);
  EXPECT_EQ(st.stopped_fault, 6u);
  // A read-write operator function commits.
  std::vector<uint8_t> add = keys({777});
  auto delta = bi::KeyBytes(5);
  add.insert(add.end(), delta.begin(), delta.end());
  ASSERT_TRUE(Call(*rt, 1, 301, add).ok());
  auto r2 = Call(*rt, 1, 301, add);
  ASSERT_TRUE(r2.ok());
  EXPECT_EQ(bi::LoadLe64(r2->result.data()), 10u);
}

TEST(OffloadTest, TimeAWorkerSpendsOffTheCpuIsNotChargedToItsBudget) {
  Fixture fx;
  const OffloadOptions o = LibraryOptions();
  auto created = OffloadRuntime::Create(fx.store.get(), o);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  auto rt = std::move(*created);
  // Three budgets off the CPU (as a worker descheduled on a busy machine), microseconds on it.
  std::vector<uint8_t> off(8);
  bi::StoreLe64(off.data(), 3 * o.budget_ns);
  auto r = Call(*rt, 1, 307, off);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(rt->stats().stopped_budget, 0u);
  // A function that uses the CPU is still stopped at its budget.
  EXPECT_EQ(Call(*rt, 1, 302, {}).status().code(), StatusCode::kTimeout);
  EXPECT_EQ(rt->stats().stopped_budget, 1u);
}

TEST(OffloadTest, BadLibrariesAreRefusedAtStartUp) {
  Fixture fx;
  OffloadOptions o;
  o.libraries = {"/nonexistent/libnothing.so"};
  auto r = OffloadRuntime::Create(fx.store.get(), o);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  o.libraries = {TESSERA_TEST_OFFLOAD_LIB, TESSERA_TEST_OFFLOAD_LIB};
  r = OffloadRuntime::Create(fx.store.get(), o);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("also defined"), std::string::npos) << r.status().ToString();
}
#endif

}  // namespace
}  // namespace tessera::kayak
