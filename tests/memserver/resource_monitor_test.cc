#include "memserver/resource_monitor.h"

#include <gtest/gtest.h>

#include <vector>

#include "tests/support/test_util.h"

namespace tessera::memserver {
namespace {

constexpr uint64_t kSlab = 1 << 20;
constexpr uint64_t kMs = 1000000;

class FakeMemory : public MemorySource {
 public:
  Result<uint64_t> AvailableBytes() override {
    if (fail) return IoError("fake source down");
    return bytes;
  }
  uint64_t bytes = 0;
  bool fail = false;
};

class FakeClock : public Clock {
 public:
  uint64_t NowNs() override { return now; }
  uint64_t now = 1000 * kMs;
};

class RecordingSink : public EvictionSink {
 public:
  struct Event {
    OwnerId owner;
    uint64_t slab_id;
    uint64_t deadline_ms;
  };
  void SlabEvicting(OwnerId owner, uint64_t slab_id, uint64_t deadline_ms) override {
    notices.push_back({owner, slab_id, deadline_ms});
  }
  void SlabEvicted(OwnerId owner, uint64_t slab_id) override {
    evicted.push_back({owner, slab_id, 0});
  }
  std::vector<Event> notices, evicted;
};

class ResourceMonitorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SlabPool::Options po;
    po.slab_bytes = kSlab;
    po.capacity_bytes = 8 * kSlab;
    auto p = SlabPool::Create(po);
    ASSERT_TRUE(p.ok()) << p.status();
    pool_ = std::move(p).value();
  }
  std::unique_ptr<ResourceMonitor> Make(double smoothing = 1.0) {
    ResourceMonitor::Options o;
    o.headroom_bytes = 10 * kSlab;
    o.smoothing = smoothing;
    o.eviction_grace_ns = 500 * kMs;
    auto m = ResourceMonitor::Create(o, pool_.get(), &mem_, &clock_, &sink_);
    EXPECT_TRUE(m.ok()) << m.status();
    return std::move(*m);
  }
  std::unique_ptr<SlabPool> pool_;
  FakeMemory mem_;
  FakeClock clock_;
  RecordingSink sink_;
};

TEST_F(ResourceMonitorTest, ValidatesOptions) {
  ResourceMonitor::Options o;
  o.smoothing = 0;
  EXPECT_FALSE(ResourceMonitor::Create(o, pool_.get(), &mem_, &clock_, &sink_).ok());
  o.smoothing = 0.5;
  o.eviction_grace_ns = 0;
  EXPECT_FALSE(ResourceMonitor::Create(o, pool_.get(), &mem_, &clock_, &sink_).ok());
  o.eviction_grace_ns = 1;
  EXPECT_FALSE(ResourceMonitor::Create(o, nullptr, &mem_, &clock_, &sink_).ok());
}

TEST_F(ResourceMonitorTest, PlentyOfMemoryKeepsFullCapacity) {
  auto m = Make();
  mem_.bytes = 100 * kSlab;
  m->Tick();
  EXPECT_EQ(pool_->counts().limit_slabs, 8u);
  EXPECT_TRUE(sink_.notices.empty());
}

TEST_F(ResourceMonitorTest, CapacityFollowsSpareMemory) {
  auto m = Make();
  mem_.bytes = 13 * kSlab;  // 3 slabs above the headroom.
  m->Tick();
  EXPECT_EQ(pool_->counts().limit_slabs, 3u);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(pool_->Alloc(1).ok());
  EXPECT_EQ(pool_->Alloc(1).status().code(), StatusCode::kResourceExhausted);
  // The three slabs got written: the host has 3 slabs less, exactly at the headroom.
  mem_.bytes = 10 * kSlab;
  m->Tick();
  EXPECT_EQ(pool_->counts().limit_slabs, 3u);  // Hysteresis band: unchanged, nothing evicted.
  EXPECT_TRUE(sink_.notices.empty());
  // Memory comes back: capacity grows again.
  mem_.bytes = 20 * kSlab;
  m->Tick();
  EXPECT_EQ(pool_->counts().limit_slabs, 8u);
}

TEST_F(ResourceMonitorTest, DropBelowHeadroomNotifiesThenFreesAtDeadline) {
  auto m = Make();
  mem_.bytes = 100 * kSlab;
  m->Tick();
  std::vector<uint64_t> ids;
  for (int i = 0; i < 4; ++i) ids.push_back(*pool_->Alloc(static_cast<OwnerId>(10 + i)));
  // Slabs 1..3 are used after an epoch change; slab 0 is the least recently used.
  m->Tick();
  for (int i = 1; i < 4; ++i) ASSERT_TRUE(pool_->Resolve(10 + i, ids[i], 0, 8).ok());

  mem_.bytes = 8 * kSlab + kSlab / 2;  // 1.5 slabs short: evict 2.
  clock_.now += 10 * kMs;
  m->Tick();
  ASSERT_EQ(sink_.notices.size(), 2u);
  EXPECT_EQ(sink_.notices[0].slab_id, ids[0]);  // LRU first.
  EXPECT_EQ(sink_.notices[0].owner, 10u);
  EXPECT_EQ(sink_.notices[0].deadline_ms, 500u);
  EXPECT_EQ(pool_->counts().evicting_slabs, 2u);
  EXPECT_EQ(pool_->counts().limit_slabs, 2u);  // No new slabs while short.
  EXPECT_EQ(pool_->Alloc(99).status().code(), StatusCode::kResourceExhausted);
  // Still readable by the owner during the grace period.
  EXPECT_TRUE(pool_->Resolve(10, ids[0], 0, 8).ok());

  // Same shortage again before the deadline: nothing more to evict (already releasing).
  clock_.now += 100 * kMs;
  m->Tick();
  EXPECT_EQ(sink_.notices.size(), 2u);
  EXPECT_TRUE(sink_.evicted.empty());

  // The deadline passes: both are freed (the tick frees before it samples, and the host sees
  // the two slabs' pages come back).
  clock_.now += 400 * kMs;
  mem_.bytes = 10 * kSlab + kSlab / 2;
  m->Tick();
  EXPECT_EQ(sink_.evicted.size(), 2u);
  EXPECT_EQ(pool_->counts().allocated_slabs, 2u);
  EXPECT_EQ(pool_->Resolve(10, ids[0], 0, 8).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(m->stats().evictions, 2u);
  EXPECT_EQ(m->stats().notices_sent, 2u);
  EXPECT_EQ(m->stats().pending, 0u);
}

TEST_F(ResourceMonitorTest, OwnerFreeingEarlyIsCounted) {
  auto m = Make();
  mem_.bytes = 100 * kSlab;
  m->Tick();
  uint64_t id = *pool_->Alloc(3);
  mem_.bytes = 9 * kSlab;
  m->Tick();
  ASSERT_EQ(sink_.notices.size(), 1u);
  ASSERT_TRUE(pool_->Free(3, id).ok());  // The client moved its data and let go.
  pool_->SetLimit(8);                    // (Memory recovered meanwhile.)
  uint64_t reused = *pool_->Alloc(4);    // Same slot, new owner: must not be evicted by mistake.
  (void)reused;
  clock_.now += 600 * kMs;
  mem_.bytes = 10 * kSlab;
  m->Tick();
  EXPECT_EQ(m->stats().evictions, 0u);
  EXPECT_EQ(m->stats().released_early, 1u);
  EXPECT_EQ(pool_->counts().allocated_slabs, 1u);
}

TEST_F(ResourceMonitorTest, SmoothingDampsASingleDip) {
  auto m = Make(/*smoothing=*/0.25);
  mem_.bytes = 20 * kSlab;
  m->Tick();
  ASSERT_TRUE(pool_->Alloc(1).ok());
  mem_.bytes = 8 * kSlab;  // One bad sample: EWMA = 0.25*8 + 0.75*20 = 17 slabs: fine.
  m->Tick();
  EXPECT_TRUE(sink_.notices.empty());
  EXPECT_EQ(m->stats().last_sample_bytes, 8 * kSlab);
  EXPECT_EQ(m->stats().smoothed_available_bytes, 17 * kSlab);
  // A sustained drop gets through within a few ticks.
  for (int i = 0; i < 10 && sink_.notices.empty(); ++i) m->Tick();
  EXPECT_EQ(sink_.notices.size(), 1u);
}

TEST_F(ResourceMonitorTest, BrokenSourceEvictsNothing) {
  auto m = Make();
  ASSERT_TRUE(pool_->Alloc(1).ok());
  mem_.fail = true;
  m->Tick();
  m->Tick();
  EXPECT_TRUE(sink_.notices.empty());
  EXPECT_EQ(m->stats().sample_errors, 2u);
  EXPECT_EQ(pool_->counts().limit_slabs, 8u);
}

TEST_F(ResourceMonitorTest, EvictNowPicksLruSlabs) {
  auto m = Make();
  mem_.bytes = 100 * kSlab;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(pool_->Alloc(1).ok());
  EXPECT_EQ(m->EvictNow(2), 2u);
  EXPECT_EQ(m->EvictNow(5), 1u);  // Only one left that is not already evicting.
  EXPECT_EQ(sink_.notices.size(), 3u);
  clock_.now += 500 * kMs;
  m->Tick();
  EXPECT_EQ(pool_->counts().allocated_slabs, 0u);
}

// A hosted service's slabs (memserver/service.h) have no client to move their data to: the
// monitor passes them over, however it is asked, and evicts the clients' slabs around them.
TEST_F(ResourceMonitorTest, ServiceSlabsAreNeverEvicted) {
  auto m = Make();
  mem_.bytes = 100 * kSlab;
  const uint64_t service_slab = *pool_->Alloc(ServiceOwner(0));  // Least recently used.
  const uint64_t last_service_slab = *pool_->Alloc(ServiceOwner(kMaxServices - 1));
  const uint64_t client_slab = *pool_->Alloc(7);
  EXPECT_EQ(m->EvictNow(3), 1u);
  ASSERT_EQ(sink_.notices.size(), 1u);
  EXPECT_EQ(sink_.notices[0].slab_id, client_slab);
  clock_.now += 500 * kMs;
  m->Tick();
  EXPECT_TRUE(pool_->Resolve(ServiceOwner(0), service_slab, 0, 8).ok());
  EXPECT_TRUE(pool_->Resolve(ServiceOwner(kMaxServices - 1), last_service_slab, 0, 8).ok());
  EXPECT_EQ(pool_->counts().allocated_slabs, 2u);
  EXPECT_TRUE(IsServiceOwner(ServiceOwner(0)));
  EXPECT_FALSE(IsServiceOwner(ServiceOwner(kMaxServices)));
  EXPECT_FALSE(IsServiceOwner(~OwnerId{0}));
}

TEST(MeminfoSourceTest, ParsesMemAvailable) {
  EXPECT_EQ(*MeminfoSource::ParseMemAvailable("MemTotal: 10 kB\nMemAvailable:   2048 kB\n"),
            2048u * 1024);
  EXPECT_EQ(MeminfoSource::ParseMemAvailable("MemTotal: 10 kB\n").status().code(),
            StatusCode::kNotFound);
  EXPECT_FALSE(MeminfoSource::ParseMemAvailable("MemAvailable: lots\n").ok());
  EXPECT_FALSE(MeminfoSource::ParseMemAvailable("MemAvailable: 5 MB\n").ok());
}

TEST(MeminfoSourceTest, ReadsTheRealFileAndATestFile) {
  MeminfoSource real;
  auto r = real.AvailableBytes();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_GT(*r, 0u);
  testing::TempDir dir;
  std::string path = dir.path() + "/meminfo";
  FILE* f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs("MemAvailable: 4 kB\n", f);
  std::fclose(f);
  EXPECT_EQ(*MeminfoSource(path).AvailableBytes(), 4096u);
  EXPECT_FALSE(MeminfoSource(dir.path() + "/missing").AvailableBytes().ok());
}

}  // namespace
}  // namespace tessera::memserver
