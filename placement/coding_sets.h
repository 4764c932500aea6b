// CodingSets (Hydra, FAST'22): the servers are partitioned into disjoint coding groups of
// k+r+l; each slab is assigned to one group and its k+r splits go to the k+r least-loaded
// members of that group. Because a slab's splits never leave its group, data is lost only
// when r+1 failures hit the same group, which makes simultaneous failures far less likely to
// lose data than random placement, while the l spare members keep the load balanced.
//
// Group choice: the group with the least load per alive member (ties broken by a hash of the
// slab), so slabs are spread evenly across groups.
//
// Failure domains: when servers carry rack labels, groups are formed from distinct racks
// (greedily from the racks with the most unassigned servers), and a slab takes at most one
// member per rack, so one rack failure costs at most one split of any slab. When the cluster
// shape does not allow that (fewer racks than k+r, or a rack larger than the number of
// groups), the layout says so in layout_note() and GroupLayout::rack_safe is false.
//
// Membership changes: Reconfigure() keeps every surviving group; departed servers leave their
// group, new servers (and spares) first refill groups below k+r+l, then form new groups of
// k+r+l, then join groups as one extra member of slack each; any rest wait as spares. A group that falls below k+r members is dissolved and its
// members reassigned. So a join moves no slab and a leave moves only the slabs that had a
// split on the departed server (unless its group had to be dissolved).
//
// Immutable after Create()/Reconfigure(); every method may be called from any thread.
#pragma once

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "placement/placement.h"

namespace tessera::placement {

struct CodingSetsOptions {
  int k = 8;
  int r = 2;
  int l = 2;
  uint64_t seed = 1;
};

struct GroupLayout {
  std::vector<std::vector<ServerId>> groups;  // disjoint; each has >= k+r members
  // Alive servers in no group yet (hold no slabs): fewer than k+r+l joined since the last
  // group was formed and every group already has one extra member. They refill groups that
  // lose members and form a new group once there are k+r+l of them.
  std::vector<ServerId> spares;
  bool racks_labelled = false;
  // True when every group has at least k+r distinct racks, so that a slab never puts two
  // splits in one rack. Always true without rack labels (nothing to check).
  bool rack_safe = true;
  // The most splits of one slab that a single rack failure can take.
  int worst_splits_per_rack = 1;
  std::string note;  // Why rack_safe is false, else "".
};

class CodingSets final : public Placement {
 public:
  static Result<std::shared_ptr<const CodingSets>> Create(const CodingSetsOptions& options,
                                                          const SnapshotPtr& snap);

  std::string name() const override;
  int width() const override { return options_.k + options_.r; }
  int tolerance() const override { return options_.r; }
  Result<std::vector<ServerId>> Place(const MembershipSnapshot& snap, SlabId slab,
                                      LoadView load = {}) const override;
  Result<ServerId> ChooseReplacement(const MembershipSnapshot& snap, SlabId slab,
                                     std::span<const ServerId> current, size_t failed_index,
                                     LoadView load = {}) const override;
  bool IsValid(const MembershipSnapshot& snap, std::span<const ServerId> servers) const override;
  Result<PlacementPtr> Reconfigure(const SnapshotPtr& next) const override;
  std::string layout_note() const override { return layout_.note; }

  const GroupLayout& layout() const { return layout_; }
  // Group index of `id`, or -1 when it is in no group.
  int GroupOf(ServerId id) const;

 private:
  CodingSets(const CodingSetsOptions& options, SnapshotPtr snap, GroupLayout layout);
  static Result<GroupLayout> BuildLayout(const CodingSetsOptions& options,
                                         const std::vector<std::vector<ServerId>>& previous,
                                         const MembershipSnapshot& snap);
  // Indices into snap.servers() of the group's alive members (in `scratch`, or cached
  // when `snap` is the snapshot the layout was built for).
  const std::vector<uint32_t>& AliveMembers(const MembershipSnapshot& snap, size_t group,
                                            std::vector<uint32_t>* scratch) const;
  // Picks `count` of `members` for `slab`: least loaded first (ties by hash), at most one
  // per rack (counting racks already in `used_racks`), allowing more per rack only when the
  // members' racks leave no other way.
  void PickLeastLoaded(const MembershipSnapshot& snap, SlabId slab,
                       const std::vector<uint32_t>& members, size_t count, LoadView load,
                       std::vector<uint64_t> used_racks, std::vector<uint32_t>* out) const;

  CodingSetsOptions options_;
  SnapshotPtr snap_;  // The membership the layout was built for (fast index path).
  GroupLayout layout_;
  std::vector<std::vector<uint32_t>> member_index_;  // per group, indices into snap_
  std::unordered_map<ServerId, int> group_of_;
};

}  // namespace tessera::placement
