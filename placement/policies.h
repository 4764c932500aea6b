// The placement policies besides CodingSets (see coding_sets.h): the baselines a user would
// pick instead. All are immutable after creation and safe to call from many threads at once.
#pragma once

#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "placement/placement.h"

namespace tessera::placement {

// Random placement (EC-Cache style), and random replication when tolerance == width - 1:
// each slab goes to `width` servers uniformly at random among the alive ones. Implemented by
// rendezvous hashing (the width servers with the highest hash(seed, slab, server)), which is
// a uniform random subset per slab and moves only the slabs of a departed server when the
// membership changes. Ignores load.
class RandomPlacement final : public Placement {
 public:
  RandomPlacement(int width, int tolerance, std::string name, uint64_t seed)
      : width_(width), tolerance_(tolerance), name_(std::move(name)), seed_(seed) {}
  std::string name() const override { return name_; }
  int width() const override { return width_; }
  int tolerance() const override { return tolerance_; }
  Result<std::vector<ServerId>> Place(const MembershipSnapshot& snap, SlabId slab,
                                      LoadView load = {}) const override;
  Result<ServerId> ChooseReplacement(const MembershipSnapshot& snap, SlabId slab,
                                     std::span<const ServerId> current, size_t failed_index,
                                     LoadView load = {}) const override;
  Result<PlacementPtr> Reconfigure(const SnapshotPtr& next) const override;
  bool iid_random_sets() const override { return true; }

 private:
  int width_;
  int tolerance_;
  std::string name_;
  uint64_t seed_;
};

// Power-of-choices (Infiniswap style): for each split, sample `choices` alive servers (not
// already holding a split of the slab) pseudo-randomly and take the least loaded.
class PowerOfChoices final : public Placement {
 public:
  PowerOfChoices(int k, int r, int choices, uint64_t seed)
      : k_(k), r_(r), choices_(choices), seed_(seed) {}
  std::string name() const override;
  int width() const override { return k_ + r_; }
  int tolerance() const override { return r_; }
  Result<std::vector<ServerId>> Place(const MembershipSnapshot& snap, SlabId slab,
                                      LoadView load = {}) const override;
  Result<ServerId> ChooseReplacement(const MembershipSnapshot& snap, SlabId slab,
                                     std::span<const ServerId> current, size_t failed_index,
                                     LoadView load = {}) const override;
  Result<PlacementPtr> Reconfigure(const SnapshotPtr& next) const override;
  bool iid_random_sets() const override { return true; }

 private:
  // One split: the least loaded of `choices` samples outside `taken`.
  Result<ServerId> PickOne(const MembershipSnapshot& snap, SlabId slab, uint64_t salt,
                           std::span<const ServerId> taken, LoadView load) const;
  int k_;
  int r_;
  int choices_;
  uint64_t seed_;
};

// CopySets (Cidon et al., ATC'13) for R-way replication: P = ceil(scatter_width / (R-1))
// seeded permutations of the servers, each cut into consecutive copysets of R; a slab's
// copies go to one copyset (the less loaded of two hashed candidates). On a membership change
// a departed server's place in each permutation is taken by the permutation's last server
// and a new server is appended, so only a few copysets change.
class CopySets final : public Placement {
 public:
  static Result<PlacementPtr> Create(int replicas, int scatter_width, uint64_t seed,
                                     const SnapshotPtr& snap);
  std::string name() const override;
  int width() const override { return replicas_; }
  int tolerance() const override { return replicas_ - 1; }
  Result<std::vector<ServerId>> Place(const MembershipSnapshot& snap, SlabId slab,
                                      LoadView load = {}) const override;
  // Prefers a server that, with the survivors, forms a copyset; if no copyset holds all
  // survivors, the least loaded alive server (the slab then sits outside the copysets and
  // IsValid() says so, so a rebalancer can move it).
  Result<ServerId> ChooseReplacement(const MembershipSnapshot& snap, SlabId slab,
                                     std::span<const ServerId> current, size_t failed_index,
                                     LoadView load = {}) const override;
  bool IsValid(const MembershipSnapshot& snap, std::span<const ServerId> servers) const override;
  Result<PlacementPtr> Reconfigure(const SnapshotPtr& next) const override;

  const std::vector<std::vector<ServerId>>& copysets() const { return copysets_; }

 private:
  CopySets(int replicas, int scatter_width, uint64_t seed)
      : replicas_(replicas), scatter_width_(scatter_width), seed_(seed) {}
  void BuildCopysets();
  int replicas_;
  int scatter_width_;
  uint64_t seed_;
  std::vector<std::vector<ServerId>> permutations_;
  std::vector<std::vector<ServerId>> copysets_;          // members sorted ascending
  std::map<std::vector<ServerId>, size_t> copyset_index_;
  std::unordered_map<ServerId, std::vector<uint32_t>> copysets_of_;
};

}  // namespace tessera::placement
