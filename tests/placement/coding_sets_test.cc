// CodingSets: group layout, load balance, failure domains and regrouping on membership change.
#include "placement/coding_sets.h"

#include <gtest/gtest.h>

#include "common/logging.h"

#include <algorithm>
#include <map>
#include <set>

#include "placement/simulator.h"

namespace tessera::placement {
namespace {

std::shared_ptr<const CodingSets> Make(const SnapshotPtr& snap, int k, int r, int l) {
  auto cs = CodingSets::Create({k, r, l, 1}, snap);
  TCHECK(cs.ok()) << cs.status();
  return *cs;
}

// Groups are disjoint, cover every alive server, and hold at least k+r each.
void ExpectPartition(const CodingSets& cs, const MembershipSnapshot& snap, size_t need) {
  std::set<ServerId> seen;
  for (const auto& g : cs.layout().groups) {
    EXPECT_GE(g.size(), need);
    for (ServerId id : g) {
      EXPECT_TRUE(seen.insert(id).second) << "server " << id << " in two groups";
      EXPECT_TRUE(snap.IsAlive(id));
    }
  }
  for (ServerId id : cs.layout().spares) {
    EXPECT_TRUE(seen.insert(id).second) << "spare " << id << " also in a group";
  }
  EXPECT_EQ(seen.size(), snap.alive().size());
}

TEST(CodingSetsTest, PartitionsIntoGroupsOfKPlusRPlusL) {
  auto snap = *MakeUniformCluster(100, 1000, 0);
  auto cs = Make(snap, 8, 2, 2);
  ExpectPartition(*cs, *snap, 10);
  // 100 = 8 * 12 + 4: eight groups, four of them with one extra member.
  ASSERT_EQ(cs->layout().groups.size(), 8u);
  size_t with_extra = 0;
  for (const auto& g : cs->layout().groups) with_extra += g.size() == 13 ? 1 : 0;
  EXPECT_EQ(with_extra, 4u);
  EXPECT_EQ(cs->name(), "codingsets(8,2,2)");
  EXPECT_DOUBLE_EQ(cs->overhead(), 1.25);
}

TEST(CodingSetsTest, SlabsStayInOneGroupOnTheLeastLoadedMembersAndBalance) {
  auto snap = *MakeUniformCluster(120, 1000, 0);
  auto cs = Make(snap, 8, 2, 2);
  auto placed = PlaceAll(*cs, *snap, 120 * 16);
  ASSERT_TRUE(placed.ok()) << placed.status();
  for (uint64_t s = 0; s < placed->num_slabs; ++s) {
    int g = cs->GroupOf(placed->servers[s * 10]);
    for (size_t j = 1; j < 10; ++j) ASSERT_EQ(cs->GroupOf(placed->servers[s * 10 + j]), g);
  }
  LoadStats ls = ComputeLoadStats(*snap, placed->load);
  EXPECT_LE(ls.max_over_mean, 1.01);
  // Least loaded first: with a view where member 0 of group 0 is far ahead, it is skipped.
  std::vector<uint64_t> load(snap->size(), 0);
  ServerId busy = cs->layout().groups[0][0];
  load[static_cast<size_t>(snap->IndexOf(busy))] = 100;
  for (SlabId s = 0; s < 50; ++s) {
    auto servers = *cs->Place(*snap, s, load);
    EXPECT_EQ(std::count(servers.begin(), servers.end(), busy), 0);
  }
}

TEST(CodingSetsTest, RackAwareGroupsPutOneSplitPerRack) {
  auto snap = *MakeUniformCluster(144, 1000, 12);  // 12 racks of 12
  auto cs = Make(snap, 6, 2, 2);                    // groups of 10 -> 14 groups
  EXPECT_TRUE(cs->layout().racks_labelled);
  EXPECT_TRUE(cs->layout().rack_safe) << cs->layout_note();
  EXPECT_EQ(cs->layout_note(), "");
  ExpectPartition(*cs, *snap, 8);
  auto placed = *PlaceAll(*cs, *snap, 144 * 8);
  for (uint64_t s = 0; s < placed.num_slabs; ++s) {
    std::set<uint32_t> racks;
    for (size_t j = 0; j < 8; ++j) {
      racks.insert(snap->rack_index(static_cast<size_t>(snap->IndexOf(placed.servers[s * 8 + j]))));
    }
    ASSERT_EQ(racks.size(), 8u) << "slab " << s << " has two splits in one rack";
  }
  // So losing any one rack never loses data (r = 2 >= 1).
  auto mc = RunMonteCarlo(placed, *snap, {FailureMode::kRacks, 1.0 / 12}, 200, 3);
  ASSERT_TRUE(mc.ok()) << mc.status();
  EXPECT_EQ(mc->loss_events, 0u);
  // Two racks can cost two splits: still no loss with r = 2.
  mc = RunMonteCarlo(placed, *snap, {FailureMode::kRacks, 2.0 / 12}, 200, 3);
  EXPECT_EQ(mc->loss_events, 0u);
}

TEST(CodingSetsTest, SaysWhenTooFewRacks) {
  auto snap = *MakeUniformCluster(40, 1000, 4);  // 4 racks, slabs of 6 splits
  auto cs = Make(snap, 4, 2, 2);
  EXPECT_FALSE(cs->layout().rack_safe);
  EXPECT_EQ(cs->layout().worst_splits_per_rack, 2);
  EXPECT_NE(cs->layout_note().find("only 4 racks hold alive servers but a slab has k+r=6"),
            std::string::npos)
      << cs->layout_note();
  EXPECT_NE(cs->layout_note().find("up to 2 splits"), std::string::npos) << cs->layout_note();
  // Placement still works and spreads each slab as evenly over racks as it can.
  auto placed = *PlaceAll(*cs, *snap, 100);
  for (uint64_t s = 0; s < placed.num_slabs; ++s) {
    std::map<uint32_t, int> per_rack;
    for (size_t j = 0; j < 6; ++j) {
      ++per_rack[snap->rack_index(static_cast<size_t>(snap->IndexOf(placed.servers[s * 6 + j])))];
    }
    for (const auto& [rack, n] : per_rack) ASSERT_LE(n, 2);
  }
}

TEST(CodingSetsTest, SaysWhenOneRackIsTooLarge) {
  // 30 servers in rack "big", 2 in each of 10 others: 50 servers, 5 groups of 10.
  std::vector<ServerInfo> servers;
  for (ServerId i = 0; i < 50; ++i) {
    ServerInfo s;
    s.id = i;
    s.capacity_slabs = s.free_slabs = 100;
    s.rack = i < 30 ? "big" : "r" + std::to_string(i % 10);
    servers.push_back(s);
  }
  auto snap = *MembershipSnapshot::Create(1, servers);
  auto cs = Make(snap, 6, 2, 2);
  EXPECT_FALSE(cs->layout().rack_safe);
  EXPECT_NE(cs->layout_note().find("the largest rack has 30 servers but there are only 5"),
            std::string::npos)
      << cs->layout_note();
}

TEST(CodingSetsTest, LeaveAndJoinKeepOtherGroupsIntact) {
  auto snap = *MakeUniformCluster(96, 1000, 0);  // 8 groups of 12, no extras
  auto cs = Make(snap, 8, 2, 2);
  const auto before = cs->layout().groups;
  auto left = *snap->WithServerRemoved(before[3][5]);
  auto next = cs->Reconfigure(left);
  ASSERT_TRUE(next.ok()) << next.status();
  const auto& after = static_cast<const CodingSets&>(**next).layout().groups;
  ASSERT_EQ(after.size(), before.size());
  for (size_t g = 0; g < before.size(); ++g) {
    if (g == 3) {
      EXPECT_EQ(after[g].size(), 11u);
    } else {
      EXPECT_EQ(after[g], before[g]);
    }
  }
  // The joiner refills the group that lost a member.
  ServerInfo joiner;
  joiner.id = 500;
  joiner.capacity_slabs = joiner.free_slabs = 1000;
  auto joined = *left->WithServerAdded(joiner);
  auto again = (*next)->Reconfigure(joined);
  ASSERT_TRUE(again.ok());
  const auto& cs2 = static_cast<const CodingSets&>(**again);
  EXPECT_EQ(cs2.GroupOf(500), 3);
  ExpectPartition(cs2, *joined, 10);
}

TEST(CodingSetsTest, NewServersFormANewGroupOnceThereAreEnough) {
  auto snap = *MakeUniformCluster(24, 1000, 0);  // 2 groups of 12 (k=8,r=2,l=2)
  auto cs = Make(snap, 8, 2, 2);
  PlacementPtr current = cs;
  SnapshotPtr members = snap;
  auto layout = [&]() -> const GroupLayout& {
    return static_cast<const CodingSets&>(*current).layout();
  };
  for (ServerId id = 100; id < 114; ++id) {
    ServerInfo s;
    s.id = id;
    s.capacity_slabs = s.free_slabs = 1000;
    members = *members->WithServerAdded(s);
    current = *current->Reconfigure(members);
    ExpectPartition(static_cast<const CodingSets&>(*current), *members, 10);
    if (id == 101) {
      // The first two joiners are one extra member each; later ones wait as spares.
      EXPECT_EQ(layout().groups[0].size(), 13u);
      EXPECT_EQ(layout().groups[1].size(), 13u);
    }
    if (id == 112) {
      EXPECT_EQ(layout().spares.size(), 11u);
    }
  }
  // The twelfth spare completes a new group of k+r+l.
  ASSERT_EQ(layout().groups.size(), 3u);
  EXPECT_EQ(layout().groups[2].size(), 12u);
  EXPECT_TRUE(layout().spares.empty());
}

TEST(CodingSetsTest, DissolvesAGroupThatFallsBelowKPlusR) {
  auto snap = *MakeUniformCluster(6, 1000, 0);
  auto cs = Make(snap, 2, 1, 0);  // two groups of 3
  ASSERT_EQ(cs->layout().groups.size(), 2u);
  ServerId gone = cs->layout().groups[0][0];
  auto left = *snap->WithServerRemoved(gone);
  auto next = cs->Reconfigure(left);
  ASSERT_TRUE(next.ok()) << next.status();
  const auto& cs2 = static_cast<const CodingSets&>(**next);
  ExpectPartition(cs2, *left, 3);
  EXPECT_EQ(cs2.layout().groups.size(), 1u);
  EXPECT_TRUE((*next)->Place(*left, 9).ok());
}

TEST(CodingSetsTest, UnavailableWhenTooFewServers) {
  auto snap = *MakeUniformCluster(9, 1000, 0);
  auto cs = CodingSets::Create({8, 2, 2, 1}, snap);
  ASSERT_FALSE(cs.ok());
  EXPECT_EQ(cs.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(cs.status().message().find("only 9 alive servers"), std::string::npos);
  EXPECT_EQ(CodingSets::Create({0, 2, 2, 1}, snap).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(CodingSetsTest, ReplacementStaysInTheGroupAndAvoidsSurvivorRacks) {
  auto snap = *MakeUniformCluster(144, 1000, 12);
  auto cs = Make(snap, 6, 2, 2);
  for (SlabId s = 0; s < 50; ++s) {
    auto servers = *cs->Place(*snap, s);
    auto failed = *snap->WithState(servers[2], ServerState::kFailed);
    ServerId rep = *cs->ChooseReplacement(*failed, s, servers, 2);
    EXPECT_EQ(cs->GroupOf(rep), cs->GroupOf(servers[0]));
    std::set<uint32_t> racks;
    for (size_t j = 0; j < servers.size(); ++j) {
      if (j != 2) racks.insert(snap->rack_index(static_cast<size_t>(snap->IndexOf(servers[j]))));
    }
    EXPECT_EQ(racks.count(snap->rack_index(static_cast<size_t>(snap->IndexOf(rep)))), 0u);
  }
}

}  // namespace
}  // namespace tessera::placement
