// MembershipSnapshot: validation of outside input and derived snapshots.
#include "placement/membership_snapshot.h"

#include <gtest/gtest.h>

namespace tessera::placement {
namespace {

ServerInfo Server(ServerId id, std::string rack = "") {
  ServerInfo s;
  s.id = id;
  s.address = "10.0.0." + std::to_string(id);
  s.capacity_slabs = 100;
  s.free_slabs = 40;
  s.rack = std::move(rack);
  return s;
}

TEST(MembershipTest, SortsByIdAndIndexes) {
  auto snap = MembershipSnapshot::Create(7, {Server(5), Server(2), Server(9)});
  ASSERT_TRUE(snap.ok()) << snap.status();
  EXPECT_EQ((*snap)->epoch(), 7u);
  ASSERT_EQ((*snap)->size(), 3u);
  EXPECT_EQ((*snap)->servers()[0].id, 2u);
  EXPECT_EQ((*snap)->IndexOf(9), 2);
  EXPECT_EQ((*snap)->IndexOf(4), -1);
  EXPECT_TRUE((*snap)->IsAlive(5));
  EXPECT_FALSE((*snap)->has_racks());
}

TEST(MembershipTest, RejectsDuplicateIds) {
  auto snap = MembershipSnapshot::Create(1, {Server(1), Server(1)});
  ASSERT_FALSE(snap.ok());
  EXPECT_EQ(snap.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(snap.status().message().find("duplicate server id 1"), std::string::npos);
}

TEST(MembershipTest, RejectsFreeAboveCapacity) {
  ServerInfo s = Server(1);
  s.free_slabs = 101;
  auto snap = MembershipSnapshot::Create(1, {s});
  ASSERT_FALSE(snap.ok());
  EXPECT_NE(snap.status().message().find("free_slabs"), std::string::npos);
}

TEST(MembershipTest, RejectsPartialRackLabels) {
  auto snap = MembershipSnapshot::Create(1, {Server(1, "a"), Server(2)});
  ASSERT_FALSE(snap.ok());
  EXPECT_NE(snap.status().message().find("rack label"), std::string::npos);
}

TEST(MembershipTest, RackIndicesAreDense) {
  auto snap = MembershipSnapshot::Create(1, {Server(1, "b"), Server(2, "a"), Server(3, "b")});
  ASSERT_TRUE(snap.ok());
  EXPECT_TRUE((*snap)->has_racks());
  EXPECT_EQ((*snap)->num_racks(), 2u);
  EXPECT_EQ((*snap)->rack_index(0), (*snap)->rack_index(2));
  EXPECT_NE((*snap)->rack_index(0), (*snap)->rack_index(1));
}

TEST(MembershipTest, DerivedSnapshotsBumpEpochAndLeaveTheOriginalAlone) {
  auto snap = *MembershipSnapshot::Create(3, {Server(1), Server(2)});
  auto added = snap->WithServerAdded(Server(3));
  ASSERT_TRUE(added.ok());
  EXPECT_EQ((*added)->epoch(), 4u);
  EXPECT_EQ((*added)->size(), 3u);
  EXPECT_EQ(snap->size(), 2u);
  EXPECT_EQ(snap->WithServerAdded(Server(1)).status().code(), StatusCode::kAlreadyExists);
  auto removed = snap->WithServerRemoved(1);
  ASSERT_TRUE(removed.ok());
  EXPECT_EQ((*removed)->IndexOf(1), -1);
  EXPECT_EQ(snap->WithServerRemoved(42).status().code(), StatusCode::kNotFound);
  auto failed = snap->WithState(2, ServerState::kFailed);
  ASSERT_TRUE(failed.ok());
  EXPECT_FALSE((*failed)->IsAlive(2));
  EXPECT_EQ((*failed)->alive().size(), 1u);
}

TEST(MembershipTest, UniformClusterUsesContiguousRacks) {
  auto snap = MakeUniformCluster(10, 5, 2);
  ASSERT_TRUE(snap.ok());
  EXPECT_EQ((*snap)->servers()[4].rack, "rack-0");
  EXPECT_EQ((*snap)->servers()[5].rack, "rack-1");
  EXPECT_FALSE(MakeUniformCluster(3, 5, 4).ok());
}

}  // namespace
}  // namespace tessera::placement
