// The remote store's failure tests again, with 4 busy-loop processes beside them (tests/support
// CpuLoad: on a 2-core machine the memservers, the client and the tests' own threads then get a
// fraction of a core each). What must hold under load is what holds without it: a server that
// answers is never declared failed (RemoteServersFailed lists exactly the servers the test
// killed, or none), and no page is lost or read back wrong.
//
// The workload runs for a stated time (a duration of load, not a wait for an event); the
// failure verdicts and regeneration are waited for with bounded polls.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "client/local_cluster.h"
#include "client/remote_store.h"
#include "common/clock.h"
#include "tests/support/cpu_load.h"
#include "tests/support/test_util.h"

namespace tessera::client {
namespace {

constexpr int kBusyLoops = 4;
constexpr int kWaitMs = 60000;
constexpr uint64_t kPages = 1024;

void Fill(PageId page, uint32_t version, uint8_t* out) {
  uint64_t x = page * 0x9E3779B97F4A7C15ull + version * 0xC2B2AE3D27D4EB4Full + 1;
  for (size_t i = 0; i < kPageSize; i += 8) {
    x ^= x >> 29;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 32;
    std::memcpy(out + i, &x, 8);
  }
}

bool Matches(PageId page, uint32_t version, const uint8_t* got) {
  uint8_t want[kPageSize];
  Fill(page, version, want);
  return std::memcmp(want, got, kPageSize) == 0;
}

// Mixed reads and writes (2:1) from one thread on its own pages [first, first + count), each
// read checked against the version it last wrote.
struct Load {
  PageStore* store;
  std::vector<uint32_t>* versions;
  PageId first, count;
  std::atomic<uint64_t>* ops;
  std::atomic<bool>* stop;
  std::atomic<uint64_t>* lost;    // DataLoss or wrong bytes.
  std::atomic<uint64_t>* errors;  // Other failed ops.
  void operator()() {
    std::mt19937_64 rng(first + 7);
    uint8_t buf[kPageSize];
    while (!stop->load()) {
      const PageId p = first + rng() % count;
      if (rng() % 3 == 0) {
        const uint32_t v = (*versions)[p] + 1;
        Fill(p, v, buf);
        if (store->WritePage(p, buf).ok()) {
          (*versions)[p] = v;
        } else {
          errors->fetch_add(1);
        }
      } else {
        Status st = store->ReadPage(p, buf);
        if (st.code() == StatusCode::kDataLoss || (st.ok() && !Matches(p, (*versions)[p], buf))) {
          lost->fetch_add(1);
        } else if (!st.ok()) {
          errors->fetch_add(1);
        }
      }
      ops->fetch_add(1);
    }
  }
};

std::string Describe(const std::vector<bool>& failed) {
  std::ostringstream out;
  for (size_t i = 0; i < failed.size(); ++i) {
    if (failed[i]) out << i << " ";
  }
  return out.str().empty() ? "none" : out.str();
}

class RemoteStoreUnderLoadTest : public ::testing::TestWithParam<EcLayout> {
 protected:
  void SetUp() override {
    auto load = testing::CpuLoad::Start(kBusyLoops);
    ASSERT_TRUE(load.ok()) << load.status();
    load_ = std::move(*load);
    LocalClusterOptions o;
    o.bin_dir = testing::BinDir();
    o.servers = 8;
    o.capacity = "16M";
    o.slab_size = "64K";
    o.fault_injection = true;
    auto c = LocalCluster::Start(o);
    ASSERT_TRUE(c.ok()) << c.status();
    cluster_ = std::move(*c);
    // RS(4,2) with the store's default failure detection (what `tessera` uses).
    ErasureCodedStoreOptions so;
    for (const auto& e : cluster_->endpoints()) so.remote.servers.push_back(RemoteServer{e, ""});
    so.remote.secret = cluster_->secret();
    so.remote.transport = fabric::TransportKind::kTcp;
    so.remote.capacity_pages = kPages;
    so.k = 4;
    so.r = 2;
    so.layout = GetParam();
    auto s = CreateErasureCodedStore(so);
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = std::move(*s);
    versions_.assign(kPages, 1);
    std::vector<uint8_t> bufs(64 * kPageSize);
    std::vector<PageId> ids(64);
    for (PageId first = 0; first < kPages; first += 64) {
      for (size_t i = 0; i < 64; ++i) {
        ids[i] = first + i;
        Fill(first + i, 1, bufs.data() + i * kPageSize);
      }
      ASSERT_TRUE(store_->WritePages(ids.data(), 64, bufs.data()).ok());
    }
    ASSERT_TRUE(store_->Flush().ok());
  }

  void TearDown() override {
    store_.reset();
    cluster_.reset();
    if (load_) {
      EXPECT_EQ(load_->Running(), kBusyLoops) << "a busy loop died: the load was not held";
    }
    load_.reset();
  }

  // Runs the mixed load on two threads for `seconds`, calling `at(t)` once at each of the
  // given offsets (seconds from the start) from this thread.
  void RunLoad(double seconds, const std::vector<std::pair<double, std::function<void()>>>& at) {
    std::atomic<bool> stop{false};
    std::thread a(Load{store_.get(), &versions_, 0, kPages / 2, &ops_, &stop, &lost_, &errors_});
    std::thread b(
        Load{store_.get(), &versions_, kPages / 2, kPages / 2, &ops_, &stop, &lost_, &errors_});
    const auto start = std::chrono::steady_clock::now();
    for (const auto& [offset, action] : at) {
      std::this_thread::sleep_until(start + std::chrono::duration<double>(offset));
      action();
    }
    std::this_thread::sleep_until(start + std::chrono::duration<double>(seconds));
    stop.store(true);
    a.join();
    b.join();
  }

  // Reads every page once and counts those lost or wrong.
  uint64_t VerifyAll() {
    uint8_t buf[kPageSize];
    uint64_t bad = 0;
    for (PageId p = 0; p < kPages; ++p) {
      Status st = store_->ReadPage(p, buf);
      if (!st.ok() || !Matches(p, versions_[p], buf)) {
        if (bad++ < 5) ADD_FAILURE() << "page " << p << ": " << st;
      }
    }
    return bad;
  }

  std::vector<bool> Failed() {
    auto f = RemoteServersFailed(*store_);
    EXPECT_TRUE(f.ok()) << f.status();
    return f.ok() ? *f : std::vector<bool>{};
  }

  void WaitForRegeneration() {
    const Deadline d = Deadline::AfterMs(kWaitMs);
    while (true) {
      const auto s = store_->Stats();
      if (s.regenerations_done > 0 && s.regenerations_pending == 0) return;
      ASSERT_FALSE(d.Expired()) << "regeneration not done within " << kWaitMs << " ms ("
                                << s.regenerations_pending << " pending)";
      std::this_thread::sleep_for(std::chrono::milliseconds(10));  // Poll interval.
    }
  }

  std::unique_ptr<testing::CpuLoad> load_;
  std::unique_ptr<LocalCluster> cluster_;
  std::unique_ptr<RemotePageStore> store_;
  std::vector<uint32_t> versions_;
  std::atomic<uint64_t> ops_{0}, lost_{0}, errors_{0};
};

std::string LayoutName(const ::testing::TestParamInfo<EcLayout>& info) {
  return std::string(EcLayoutName(info.param));
}

// No fault at all: 15 s of mixed load beside the busy loops, and no server is declared failed.
TEST_P(RemoteStoreUnderLoadTest, HealthyClusterHasNoFailureVerdicts) {
  RunLoad(15, {});
  EXPECT_GT(ops_.load(), 0u);
  const std::vector<bool> failed = Failed();
  EXPECT_EQ(std::count(failed.begin(), failed.end(), true), 0)
      << "declared failed: " << Describe(failed);
  EXPECT_EQ(lost_.load(), 0u);
  EXPECT_EQ(errors_.load(), 0u);
  EXPECT_EQ(VerifyAll(), 0u);
  EXPECT_EQ(store_->Stats().data_loss, 0u);
}

// Write + read + verify with one server SIGKILLed 3 s into 12 s of load: exactly that server
// is declared failed, its splits are regenerated, nothing is lost.
TEST_P(RemoteStoreUnderLoadTest, OneKilledServerIsTheOnlyFailureAndNothingIsLost) {
  auto holders = ServersOfPage(*store_, 0);
  ASSERT_TRUE(holders.ok()) << holders.status();
  const size_t victim = (*holders)[0];
  RunLoad(12, {{3.0, [&] { ASSERT_TRUE(cluster_->Kill(victim).ok()); }}});
  WaitForRegeneration();
  std::vector<bool> expected(cluster_->size(), false);
  expected[victim] = true;
  EXPECT_EQ(Failed(), expected) << "declared failed: " << Describe(Failed()) << "; killed "
                                << victim;
  EXPECT_EQ(lost_.load(), 0u);
  EXPECT_EQ(errors_.load(), 0u);
  EXPECT_EQ(VerifyAll(), 0u);
  EXPECT_EQ(store_->Stats().data_loss, 0u);
}

// r = 2 servers SIGKILLed (at 2 s and 5 s of 12 s of load): exactly those two are declared
// failed, nothing is lost.
TEST_P(RemoteStoreUnderLoadTest, RKilledServersAreTheOnlyFailuresAndNothingIsLost) {
  auto holders = ServersOfPage(*store_, 0);
  ASSERT_TRUE(holders.ok()) << holders.status();
  ASSERT_GE(holders->size(), 2u);
  // Two servers of page 0: its stripe / splits lose exactly r members.
  const size_t v1 = (*holders)[0];
  const size_t v2 = (*holders)[1];
  RunLoad(12, {{2.0, [&] { ASSERT_TRUE(cluster_->Kill(v1).ok()); }},
               {5.0, [&] { ASSERT_TRUE(cluster_->Kill(v2).ok()); }}});
  WaitForRegeneration();
  std::vector<bool> expected(cluster_->size(), false);
  expected[v1] = expected[v2] = true;
  EXPECT_EQ(Failed(), expected) << "declared failed: " << Describe(Failed()) << "; killed " << v1
                                << " " << v2;
  EXPECT_EQ(lost_.load(), 0u);
  EXPECT_EQ(errors_.load(), 0u);
  EXPECT_EQ(VerifyAll(), 0u);
  EXPECT_EQ(store_->Stats().data_loss, 0u);
}

INSTANTIATE_TEST_SUITE_P(Layouts, RemoteStoreUnderLoadTest,
                         ::testing::Values(EcLayout::kSplit, EcLayout::kGroup), LayoutName);

}  // namespace
}  // namespace tessera::client
