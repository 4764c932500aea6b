// Properties every placement policy must have: distinct alive servers, determinism,
// thread safety, replacements outside the slab, validation of bad input, and how little
// moves on a membership change.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <thread>

#include "placement/placement.h"
#include "placement/policies.h"
#include "placement/simulator.h"

namespace tessera::placement {
namespace {

std::vector<PolicySpec> AllSpecs(uint64_t seed = 1) {
  PolicySpec d;
  d.k = 4;
  d.r = 2;
  d.l = 2;
  d.seed = seed;
  std::vector<PolicySpec> out;
  for (const char* w : {"codingsets", "random", "power:2", "random_rep:2", "copysets:3"}) {
    out.push_back(*ParsePolicySpec(w, d));
  }
  return out;
}

SnapshotPtr Cluster(size_t n, size_t racks = 0) { return *MakeUniformCluster(n, 1000, racks); }

TEST(PolicySpecTest, ParsesWordsAndRejectsUnknown) {
  PolicySpec d;
  auto list = ParsePolicyList("codingsets,power:3,random_rep,copysets:2", d);
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->size(), 4u);
  EXPECT_EQ((*list)[1].kind, PolicyKind::kPowerOfChoices);
  EXPECT_EQ((*list)[1].choices, 3);
  EXPECT_EQ((*list)[2].replicas, d.replicas);
  EXPECT_EQ((*list)[3].replicas, 2);
  EXPECT_FALSE(ParsePolicyList("codingsets,,random", d).ok());
  EXPECT_FALSE(ParsePolicySpec("hydra", d).ok());
  EXPECT_FALSE(ParsePolicySpec("power:x", d).ok());
  EXPECT_FALSE(ParsePolicySpec("random:2", d).ok());
}

TEST(PolicyTest, PlacesOnDistinctAliveServers) {
  auto snap = Cluster(50);
  for (const auto& spec : AllSpecs()) {
    auto policy = CreatePolicy(spec, snap);
    ASSERT_TRUE(policy.ok()) << policy.status();
    auto placed = PlaceAll(**policy, *snap, 500);
    ASSERT_TRUE(placed.ok()) << placed.status();
    const size_t w = static_cast<size_t>((*policy)->width());
    for (uint64_t s = 0; s < 500; ++s) {
      std::set<ServerId> distinct(placed->servers.begin() + s * w,
                                  placed->servers.begin() + s * w + w);
      ASSERT_EQ(distinct.size(), w) << (*policy)->name() << " slab " << s;
      for (ServerId id : distinct) ASSERT_TRUE(snap->IsAlive(id));
      ASSERT_TRUE((*policy)->IsValid(*snap, {placed->servers.data() + s * w, w}))
          << (*policy)->name() << " slab " << s;
    }
  }
}

TEST(PolicyTest, NeverPlacesOnFailedOrDrainingServers) {
  auto snap = *(*Cluster(30)->WithState(3, ServerState::kFailed))->WithState(
      7, ServerState::kDraining);
  for (const auto& spec : AllSpecs()) {
    auto policy = *CreatePolicy(spec, snap);
    for (SlabId s = 0; s < 200; ++s) {
      auto servers = policy->Place(*snap, s);
      ASSERT_TRUE(servers.ok()) << servers.status();
      for (ServerId id : *servers) {
        ASSERT_NE(id, 3u) << policy->name();
        ASSERT_NE(id, 7u) << policy->name();
      }
    }
  }
}

TEST(PolicyTest, DeterministicForTheSameSnapshotAndSeed) {
  auto snap = Cluster(64);
  for (const auto& spec : AllSpecs(42)) {
    auto a = *CreatePolicy(spec, snap);
    auto b = *CreatePolicy(spec, Cluster(64));  // an equal snapshot, built separately
    auto pa = *PlaceAll(*a, *snap, 300);
    auto pb = *PlaceAll(*b, *snap, 300);
    EXPECT_EQ(pa.servers, pb.servers) << a->name();
  }
  // A different seed gives a different random placement.
  PolicySpec d = AllSpecs(1)[1];
  PolicySpec e = d;
  e.seed = 2;
  EXPECT_NE(PlaceAll(**CreatePolicy(d, snap), *snap, 50)->servers,
            PlaceAll(**CreatePolicy(e, snap), *snap, 50)->servers);
}

TEST(PolicyTest, ConcurrentCallsOnOnePolicyAgreeWithSequentialOnes) {
  auto snap = Cluster(48);
  std::vector<uint64_t> load(snap->size());
  for (size_t i = 0; i < load.size(); ++i) load[i] = (i * 7) % 13;
  for (const auto& spec : AllSpecs()) {
    auto policy = *CreatePolicy(spec, snap);
    constexpr SlabId kSlabs = 400;
    std::vector<std::vector<ServerId>> expected(kSlabs);
    for (SlabId s = 0; s < kSlabs; ++s) expected[s] = *policy->Place(*snap, s, load);
    constexpr int kThreads = 4;
    std::vector<int> mismatches(kThreads, 0);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        for (int round = 0; round < 3; ++round) {
          for (SlabId s = 0; s < kSlabs; ++s) {
            SlabId slab = (s + static_cast<SlabId>(t) * 97) % kSlabs;
            auto got = policy->Place(*snap, slab, load);
            if (!got.ok() || *got != expected[slab]) ++mismatches[t];
            auto rep = policy->ChooseReplacement(*snap, slab, expected[slab], 0, load);
            if (!rep.ok()) ++mismatches[t];
          }
        }
      });
    }
    for (auto& th : threads) th.join();
    for (int t = 0; t < kThreads; ++t) EXPECT_EQ(mismatches[t], 0) << policy->name();
  }
}

TEST(PolicyTest, ReplacementIsAliveAndOutsideTheSlab) {
  auto snap = Cluster(40);
  for (const auto& spec : AllSpecs()) {
    auto policy = *CreatePolicy(spec, snap);
    for (SlabId s = 0; s < 100; ++s) {
      auto servers = *policy->Place(*snap, s);
      for (size_t i = 0; i < servers.size(); ++i) {
        auto after = *snap->WithState(servers[i], ServerState::kFailed);
        auto rep = policy->ChooseReplacement(*after, s, servers, i);
        ASSERT_TRUE(rep.ok()) << policy->name() << ": " << rep.status();
        EXPECT_TRUE(after->IsAlive(*rep));
        EXPECT_EQ(std::count(servers.begin(), servers.end(), *rep), 0) << policy->name();
      }
    }
  }
}

TEST(PolicyTest, RejectsBadInput) {
  auto snap = Cluster(20);
  for (const auto& spec : AllSpecs()) {
    auto policy = *CreatePolicy(spec, snap);
    std::vector<uint64_t> short_load(3, 0);
    auto placed = policy->Place(*snap, 1, short_load);
    EXPECT_EQ(placed.status().code(), StatusCode::kInvalidArgument) << policy->name();
    auto servers = *policy->Place(*snap, 1);
    auto rep = policy->ChooseReplacement(*snap, 1, servers, servers.size());
    EXPECT_EQ(rep.status().code(), StatusCode::kInvalidArgument) << policy->name();
  }
  PolicySpec too_wide = AllSpecs()[1];
  too_wide.k = 30;
  auto p = CreatePolicy(too_wide, snap);
  EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(p.status().message().find("20 alive servers cannot hold 32"), std::string::npos)
      << p.status();
}

TEST(PolicyTest, PowerOfChoicesPrefersTheLessLoaded) {
  auto snap = Cluster(100);
  PolicySpec spec = AllSpecs()[2];
  spec.choices = 8;
  auto policy = *CreatePolicy(spec, snap);
  // Servers 0..49 are heavily loaded; with 8 samples per split almost no split lands there.
  std::vector<uint64_t> load(100, 0);
  for (size_t i = 0; i < 50; ++i) load[i] = 1000;
  int on_loaded = 0;
  for (SlabId s = 0; s < 200; ++s) {
    std::vector<ServerId> servers = *policy->Place(*snap, s, load);
    for (ServerId id : servers) on_loaded += id < 50 ? 1 : 0;
  }
  EXPECT_LT(on_loaded, 10);  // expected 1200 * 2^-8 ~ 5
}

// Minimal movement: a join moves nothing; a leave moves only the slabs with a split on the
// departed server (the lower bound), one split each.
TEST(PolicyTest, MembershipChangeMovesOnlyWhatMust) {
  auto snap = Cluster(60);
  ServerInfo joiner;
  joiner.id = 1000;
  joiner.capacity_slabs = joiner.free_slabs = 1000;
  auto joined = *snap->WithServerAdded(joiner);
  const ServerId leaving = 17;
  auto left = *snap->WithServerRemoved(leaving);
  for (const auto& spec : AllSpecs()) {
    if (spec.kind == PolicyKind::kCopySets) continue;  // checked below
    auto policy = *CreatePolicy(spec, snap);
    auto placed = *PlaceAll(*policy, *snap, 600);
    auto join = SimulateChurn(*policy, *snap, placed, joined);
    ASSERT_TRUE(join.ok()) << join.status();
    EXPECT_EQ(join->slabs_moved, 0u) << policy->name();
    uint64_t on_leaving = static_cast<uint64_t>(
        std::count(placed.servers.begin(), placed.servers.end(), leaving));
    auto leave = SimulateChurn(*policy, *snap, placed, left);
    ASSERT_TRUE(leave.ok()) << leave.status();
    EXPECT_EQ(leave->slabs_moved, on_leaving) << policy->name();
    EXPECT_EQ(leave->splits_moved, on_leaving) << policy->name();
  }
}

TEST(PolicyTest, CopySetsReconfigureChangesFewCopysets) {
  auto snap = Cluster(60);
  auto policy = *CreatePolicy(AllSpecs()[4], snap);
  auto next = *snap->WithServerRemoved(5);
  auto moved = policy->Reconfigure(next);
  ASSERT_TRUE(moved.ok());
  const auto& before = static_cast<const CopySets&>(*policy).copysets();
  const auto& after = static_cast<const CopySets&>(**moved).copysets();
  size_t kept = 0;
  for (const auto& set : after) kept += std::count(before.begin(), before.end(), set) ? 1 : 0;
  // Two permutations of 20 copysets; each loses at most the departed server's copyset, the
  // tail copyset and the one that received the tail server.
  EXPECT_GE(kept, after.size() - 6);
  for (const auto& set : after) EXPECT_EQ(std::count(set.begin(), set.end(), 5u), 0);
}

}  // namespace
}  // namespace tessera::placement
