// Placement: which memory servers hold the splits (or copies) of a slab.
//
// A Placement policy maps (membership snapshot, slab id, optional load view) to the list of
// servers for that slab: k+r servers for an erasure-coded slab (split i goes to servers[i]),
// or R servers for a replicated one. Policies are immutable after creation: every method is
// const, deterministic for the same inputs and seed, allocates only its result, and may be
// called from any number of threads at once on one object. Policies that keep a layout
// (CodingSets' coding groups, CopySets' permutations) are bound to the membership they were
// built for; on a membership change the caller asks for a Reconfigure()d policy, which
// changes the layout as little as possible, and keeps using the old object until it has the
// new one (both are shared_ptr<const>, so readers never see a half-built layout).
//
// Load: policies that balance load read a per-server count of used slab units. The caller may
// pass its own up-to-date counts (a LoadView indexed like snapshot.servers()), e.g. the
// simulator and the client count splits as they place them; without one, the snapshot's
// capacity_slabs - free_slabs is used.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <string>
#include <vector>

#include "common/status.h"
#include "placement/membership_snapshot.h"

namespace tessera::placement {

using LoadView = std::span<const uint64_t>;

class Placement {
 public:
  virtual ~Placement() = default;

  // "codingsets(8,2,2)", "random(8,2)", "power2(8,2)", "random-rep3", "copysets3(sw=4)".
  virtual std::string name() const = 0;
  // Servers per slab (k+r, or R copies) and how many of them a slab survives losing.
  virtual int width() const = 0;
  virtual int tolerance() const = 0;
  // Memory overhead: stored bytes per byte of data (1.25 for RS(8,2), 3 for 3 copies).
  double overhead() const {
    return static_cast<double>(width()) / static_cast<double>(width() - tolerance());
  }

  // Chooses width() distinct alive servers for `slab`. Unavailable when the membership
  // cannot hold a slab under this policy; InvalidArgument for a load view of the wrong size.
  virtual Result<std::vector<ServerId>> Place(const MembershipSnapshot& snap, SlabId slab,
                                              LoadView load = {}) const = 0;

  // The server to take over split `failed_index` of `slab`, whose splits are on `current`
  // (current[failed_index] is lost); never one of `current`. Rack-aware policies prefer a
  // rack none of the surviving splits is in.
  virtual Result<ServerId> ChooseReplacement(const MembershipSnapshot& snap, SlabId slab,
                                             std::span<const ServerId> current,
                                             size_t failed_index, LoadView load = {}) const = 0;

  // True if `servers` is a placement this policy could keep under its current layout: the
  // right count, distinct, all alive, and (CodingSets) within one coding group or
  // (CopySets) exactly one copyset.
  virtual bool IsValid(const MembershipSnapshot& snap, std::span<const ServerId> servers) const;

  // The policy for membership `next`, with its layout changed as little as possible.
  virtual Result<std::shared_ptr<const Placement>> Reconfigure(
      const SnapshotPtr& next) const = 0;

  // True when each slab's servers are (close to) an independent uniformly random set, so
  // the simulator's analytic mode may treat slabs as i.i.d. (random placement, random
  // replication; power-of-choices only approximately, as load skews its samples).
  virtual bool iid_random_sets() const { return false; }

  // A sentence about a constraint the layout could not meet (e.g. racks), or "".
  virtual std::string layout_note() const { return ""; }
};

using PlacementPtr = std::shared_ptr<const Placement>;

enum class PolicyKind { kCodingSets, kRandom, kPowerOfChoices, kRandomReplication, kCopySets };

// What to build; parsed from the simulator's policy list.
struct PolicySpec {
  PolicyKind kind = PolicyKind::kCodingSets;
  int k = 8;               // data splits (erasure-coded policies)
  int r = 2;               // parity splits
  int l = 2;               // CodingSets load-balancing slack
  int choices = 2;         // power-of-choices: servers sampled per split
  int replicas = 3;        // replication policies
  int scatter_width = 4;   // CopySets: each server's copies spread over this many peers
  uint64_t seed = 1;
};

// Parses one policy word: "codingsets", "random", "power" or "power:D", "random_rep" or
// "random_rep:R", "copysets" or "copysets:R". Fields not named in the word come from
// `defaults`.
Result<PolicySpec> ParsePolicySpec(const std::string& word, const PolicySpec& defaults);
// Comma-separated list of policy words.
Result<std::vector<PolicySpec>> ParsePolicyList(const std::string& list,
                                                const PolicySpec& defaults);

// Builds a policy for membership `snap` (CodingSets forms its groups, CopySets its
// permutations). InvalidArgument for impossible parameters.
Result<PlacementPtr> CreatePolicy(const PolicySpec& spec, const SnapshotPtr& snap);

// ---- helpers shared by the policies (and the client) ----

// Load of server index i: load[i] when a view is given, else capacity - free.
inline uint64_t LoadAt(const MembershipSnapshot& snap, LoadView load, size_t i) {
  if (!load.empty()) return load[i];
  const ServerInfo& s = snap.servers()[i];
  return s.capacity_slabs - s.free_slabs;
}
Status CheckLoadView(const MembershipSnapshot& snap, LoadView load);
// The argument checks every ChooseReplacement() makes: a load view of the right size and a
// failed index inside `current`. `policy` names the policy in the error.
Status CheckReplacementArgs(std::string_view policy, const MembershipSnapshot& snap,
                            LoadView load, std::span<const ServerId> current,
                            size_t failed_index);

// A 64-bit mix of the arguments (splitmix64 finaliser chained); the policies' only source
// of randomness, so equal inputs give equal choices.
uint64_t HashMix(uint64_t a, uint64_t b, uint64_t c = 0, uint64_t d = 0);

}  // namespace tessera::placement
