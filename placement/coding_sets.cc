#include "placement/coding_sets.h"

#include <algorithm>
#include <deque>
#include <map>
#include <set>

namespace tessera::placement {
namespace {

// Rack key of a server: its rack index, or a key unique to the server when racks are not
// labelled (so "distinct racks" degenerates to "distinct servers").
uint64_t RackKey(const MembershipSnapshot& snap, size_t index) {
  if (snap.has_racks()) return snap.rack_index(index);
  return (uint64_t{1} << 32) + snap.servers()[index].id;
}

// Unassigned servers, bucketed by rack, handed out so that racks drain evenly.
class Pool {
 public:
  void Add(uint64_t rack, ServerId id) {
    buckets_[rack].push_back(id);
    ++size_;
  }
  size_t size() const { return size_; }
  // A server from the rack with the most remaining servers whose rack is not in `avoid`
  // (any rack if all are avoided); ties go to the smaller rack key, then the smaller id.
  std::pair<uint64_t, ServerId> Take(const std::set<uint64_t>& avoid) {
    auto best = buckets_.end();
    bool best_avoided = true;
    for (auto it = buckets_.begin(); it != buckets_.end(); ++it) {
      bool avoided = avoid.count(it->first) > 0;
      if (best == buckets_.end() || (best_avoided && !avoided) ||
          (best_avoided == avoided && it->second.size() > best->second.size())) {
        best = it;
        best_avoided = avoided;
      }
    }
    uint64_t rack = best->first;
    ServerId id = best->second.front();
    best->second.pop_front();
    if (best->second.empty()) buckets_.erase(best);
    --size_;
    return {rack, id};
  }

 private:
  std::map<uint64_t, std::deque<ServerId>> buckets_;
  size_t size_ = 0;
};

}  // namespace

Result<GroupLayout> CodingSets::BuildLayout(const CodingSetsOptions& o,
                                            const std::vector<std::vector<ServerId>>& previous,
                                            const MembershipSnapshot& snap) {
  const size_t need = static_cast<size_t>(o.k + o.r);
  const size_t g = need + static_cast<size_t>(o.l);
  if (snap.alive().size() < need) {
    return Unavailable("codingsets: only ", snap.alive().size(),
                       " alive servers, but a slab needs k+r=", need);
  }
  auto rack_of = [&](ServerId id) { return RackKey(snap, static_cast<size_t>(snap.IndexOf(id))); };

  std::vector<std::vector<ServerId>> groups;
  std::set<ServerId> assigned;
  for (const auto& prev : previous) {
    std::vector<ServerId> kept;
    for (ServerId id : prev) {
      if (snap.IsAlive(id)) kept.push_back(id);
    }
    if (!kept.empty()) {
      for (ServerId id : kept) assigned.insert(id);
      groups.push_back(std::move(kept));
    }
  }
  Pool pool;
  for (uint32_t i : snap.alive()) {
    ServerId id = snap.servers()[i].id;
    if (!assigned.count(id)) pool.Add(RackKey(snap, i), id);
  }
  auto racks_in = [&](const std::vector<ServerId>& group) {
    std::set<uint64_t> racks;
    for (ServerId id : group) racks.insert(rack_of(id));
    return racks;
  };

  std::vector<ServerId> final_spares;
  while (true) {
    // 1. Refill groups that lost members, smallest first.
    std::vector<size_t> order(groups.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return groups[a].size() < groups[b].size(); });
    for (size_t gi : order) {
      std::set<uint64_t> racks = racks_in(groups[gi]);
      while (groups[gi].size() < g && pool.size() > 0) {
        auto [rack, id] = pool.Take(racks);
        groups[gi].push_back(id);
        racks.insert(rack);
      }
    }
    // 2. Form new groups from what is left.
    while (pool.size() >= g || (groups.empty() && pool.size() >= need)) {
      std::vector<ServerId> group;
      std::set<uint64_t> racks;
      size_t want = pool.size() >= g ? g : pool.size();  // A first group may be short of l.
      while (group.size() < want) {
        auto [rack, id] = pool.Take(racks);
        group.push_back(id);
        racks.insert(rack);
      }
      groups.push_back(std::move(group));
    }
    // 3. Fewer than g servers left: each group takes at most one of them as extra slack
    //    (smallest groups lacking the server's rack first); the rest wait as spares until
    //    enough accumulate for a new group, or a group needs refilling.
    std::vector<ServerId> spares;
    while (pool.size() > 0) {
      auto [rack, id] = pool.Take({});
      size_t best = groups.size();
      bool best_has_rack = true;
      for (size_t gi = 0; gi < groups.size(); ++gi) {
        if (groups[gi].size() > g) continue;
        bool has_rack = racks_in(groups[gi]).count(rack) > 0;
        if (best == groups.size() || (best_has_rack && !has_rack) ||
            (best_has_rack == has_rack && groups[gi].size() < groups[best].size())) {
          best = gi;
          best_has_rack = has_rack;
        }
      }
      if (best == groups.size()) {
        spares.push_back(id);
      } else {
        groups[best].push_back(id);
      }
    }
    // 4. A group too small for a slab is dissolved and its members reassigned.
    size_t smallest = groups.size();
    for (size_t gi = 0; gi < groups.size(); ++gi) {
      if (groups[gi].size() < need &&
          (smallest == groups.size() || groups[gi].size() < groups[smallest].size())) {
        smallest = gi;
      }
    }
    if (smallest == groups.size()) {
      final_spares = std::move(spares);
      break;
    }
    for (ServerId id : spares) pool.Add(rack_of(id), id);
    for (ServerId id : groups[smallest]) pool.Add(rack_of(id), id);
    groups.erase(groups.begin() + static_cast<std::ptrdiff_t>(smallest));
  }
  if (groups.empty()) {
    return Unavailable("codingsets: cannot form a coding group of k+r=", need, " servers");
  }

  GroupLayout layout;
  layout.racks_labelled = snap.has_racks();
  size_t unsafe_groups = 0;
  for (const auto& group : groups) {
    std::map<uint64_t, size_t> per_rack;
    for (ServerId id : group) ++per_rack[rack_of(id)];
    // The smallest per-rack cap m with sum(min(count, m)) >= need.
    int cap = 1;
    while (true) {
      size_t fit = 0;
      for (const auto& [rack, count] : per_rack) fit += std::min<size_t>(count, cap);
      if (fit >= need) break;
      ++cap;
    }
    if (cap > 1) ++unsafe_groups;
    layout.worst_splits_per_rack = std::max(layout.worst_splits_per_rack, cap);
  }
  layout.rack_safe = unsafe_groups == 0;
  if (!layout.rack_safe) {
    size_t largest = 0;
    std::map<uint32_t, size_t> rack_sizes;
    for (uint32_t i : snap.alive()) largest = std::max(largest, ++rack_sizes[snap.rack_index(i)]);
    std::string why;
    if (rack_sizes.size() < need) {
      why = internal::StrCat("only ", rack_sizes.size(), " racks hold alive servers but a slab has k+r=",
                             need, " splits");
    } else {
      why = internal::StrCat("the largest rack has ", largest, " servers but there are only ",
                             groups.size(), " coding groups");
    }
    layout.note = internal::StrCat(
        "rack constraint not met: ", why, "; in ", unsafe_groups, " of ", groups.size(),
        " groups one rack failure can cost up to ", layout.worst_splits_per_rack,
        " splits of a slab");
  }
  layout.groups = std::move(groups);
  layout.spares = std::move(final_spares);
  std::sort(layout.spares.begin(), layout.spares.end());
  return layout;
}

CodingSets::CodingSets(const CodingSetsOptions& options, SnapshotPtr snap, GroupLayout layout)
    : options_(options), snap_(std::move(snap)), layout_(std::move(layout)) {
  member_index_.resize(layout_.groups.size());
  for (size_t gi = 0; gi < layout_.groups.size(); ++gi) {
    for (ServerId id : layout_.groups[gi]) {
      group_of_[id] = static_cast<int>(gi);
      member_index_[gi].push_back(static_cast<uint32_t>(snap_->IndexOf(id)));
    }
  }
}

Result<std::shared_ptr<const CodingSets>> CodingSets::Create(const CodingSetsOptions& options,
                                                             const SnapshotPtr& snap) {
  if (options.k < 1 || options.r < 0 || options.l < 0 || options.k + options.r > 64) {
    return InvalidArgument("codingsets: need k >= 1, r >= 0, l >= 0, k+r <= 64 (got k=",
                           options.k, " r=", options.r, " l=", options.l, ")");
  }
  if (!snap) return InvalidArgument("codingsets: null membership snapshot");
  TESSERA_ASSIGN_OR_RETURN(GroupLayout layout, BuildLayout(options, {}, *snap));
  return std::shared_ptr<const CodingSets>(new CodingSets(options, snap, std::move(layout)));
}

Result<PlacementPtr> CodingSets::Reconfigure(const SnapshotPtr& next) const {
  if (!next) return InvalidArgument("codingsets: null membership snapshot");
  TESSERA_ASSIGN_OR_RETURN(GroupLayout layout, BuildLayout(options_, layout_.groups, *next));
  return PlacementPtr(new CodingSets(options_, next, std::move(layout)));
}

std::string CodingSets::name() const {
  return internal::StrCat("codingsets(", options_.k, ",", options_.r, ",", options_.l, ")");
}

int CodingSets::GroupOf(ServerId id) const {
  auto it = group_of_.find(id);
  return it == group_of_.end() ? -1 : it->second;
}

const std::vector<uint32_t>& CodingSets::AliveMembers(const MembershipSnapshot& snap,
                                                      size_t group,
                                                      std::vector<uint32_t>* scratch) const {
  // The layout holds only servers alive in snap_, so for it the cached indices are exact.
  if (&snap == snap_.get()) return member_index_[group];
  scratch->clear();
  for (ServerId id : layout_.groups[group]) {
    int64_t i = snap.IndexOf(id);
    if (i >= 0 && snap.servers()[static_cast<size_t>(i)].state == ServerState::kAlive) {
      scratch->push_back(static_cast<uint32_t>(i));
    }
  }
  return *scratch;
}

void CodingSets::PickLeastLoaded(const MembershipSnapshot& snap, SlabId slab,
                                 const std::vector<uint32_t>& members, size_t count,
                                 LoadView load, std::vector<uint64_t> used_racks,
                                 std::vector<uint32_t>* out) const {
  struct Cand {
    uint64_t load;
    uint64_t tie;
    uint32_t index;
  };
  std::vector<Cand> cands;
  cands.reserve(members.size());
  for (uint32_t i : members) {
    cands.push_back({LoadAt(snap, load, i), HashMix(options_.seed, slab, snap.servers()[i].id),
                     i});
  }
  std::sort(cands.begin(), cands.end(), [](const Cand& a, const Cand& b) {
    return a.load != b.load ? a.load < b.load : (a.tie != b.tie ? a.tie < b.tie : a.index < b.index);
  });
  // (rack, splits) pairs; groups are small, so a linear scan beats a map.
  std::vector<std::pair<uint64_t, int>> per_rack;
  auto rack_count = [&](uint64_t rack) -> int& {
    for (auto& [r, n] : per_rack) {
      if (r == rack) return n;
    }
    per_rack.emplace_back(rack, 0);
    return per_rack.back().second;
  };
  for (uint64_t rack : used_racks) ++rack_count(rack);
  std::vector<bool> taken(cands.size(), false);
  out->clear();
  for (int cap = 1; out->size() < count; ++cap) {
    bool progress = false;
    for (size_t c = 0; c < cands.size() && out->size() < count; ++c) {
      if (taken[c]) continue;
      uint64_t rack = RackKey(snap, cands[c].index);
      int& used = rack_count(rack);
      if (used >= cap) continue;
      taken[c] = true;
      ++used;
      out->push_back(cands[c].index);
      progress = true;
    }
    if (!progress && cap > static_cast<int>(cands.size()) + static_cast<int>(used_racks.size())) {
      break;  // Fewer candidates than asked for; the caller checks the count.
    }
  }
}

Result<std::vector<ServerId>> CodingSets::Place(const MembershipSnapshot& snap, SlabId slab,
                                                LoadView load) const {
  TESSERA_RETURN_IF_ERROR(CheckLoadView(snap, load));
  const size_t need = static_cast<size_t>(width());
  size_t best = layout_.groups.size();
  double best_score = 0;
  uint64_t best_tie = 0;
  std::vector<uint32_t> scratch;
  for (size_t gi = 0; gi < layout_.groups.size(); ++gi) {
    const std::vector<uint32_t>& members = AliveMembers(snap, gi, &scratch);
    if (members.size() < need) continue;
    uint64_t sum = 0;
    for (uint32_t i : members) sum += LoadAt(snap, load, i);
    double score = static_cast<double>(sum) / static_cast<double>(members.size());
    uint64_t tie = HashMix(options_.seed, slab, gi, 0x67);
    if (best == layout_.groups.size() || score < best_score ||
        (score == best_score && tie < best_tie)) {
      best = gi;
      best_score = score;
      best_tie = tie;
    }
  }
  if (best == layout_.groups.size()) {
    return Unavailable("codingsets: no coding group has k+r=", need,
                       " alive servers; reconfigure with the current membership");
  }
  const std::vector<uint32_t>& members = AliveMembers(snap, best, &scratch);
  std::vector<uint32_t> picked;
  PickLeastLoaded(snap, slab, members, need, load, {}, &picked);
  std::vector<ServerId> out;
  out.reserve(need);
  for (uint32_t i : picked) out.push_back(snap.servers()[i].id);
  return out;
}

Result<ServerId> CodingSets::ChooseReplacement(const MembershipSnapshot& snap, SlabId slab,
                                               std::span<const ServerId> current,
                                               size_t failed_index, LoadView load) const {
  TESSERA_RETURN_IF_ERROR(
      CheckReplacementArgs("codingsets", snap, load, current, failed_index));
  // The slab's group: the one holding most of its surviving splits.
  std::map<int, int> votes;
  for (size_t i = 0; i < current.size(); ++i) {
    if (i == failed_index) continue;
    int gi = GroupOf(current[i]);
    if (gi >= 0) ++votes[gi];
  }
  if (votes.empty()) {
    return Unavailable("codingsets: no surviving split of slab ", slab,
                       " is in a coding group; place the slab anew");
  }
  int group = std::max_element(votes.begin(), votes.end(), [](const auto& a, const auto& b) {
                return a.second < b.second;
              })->first;
  std::vector<uint32_t> scratch;
  const std::vector<uint32_t>& members = AliveMembers(snap, static_cast<size_t>(group), &scratch);
  std::vector<uint32_t> candidates;
  for (uint32_t i : members) {
    ServerId id = snap.servers()[i].id;
    if (std::find(current.begin(), current.end(), id) == current.end()) candidates.push_back(i);
  }
  if (candidates.empty()) {
    return Unavailable("codingsets: coding group ", group, " has no alive member outside slab ",
                       slab, "'s servers; reconfigure with the current membership");
  }
  std::vector<uint64_t> used_racks;
  for (size_t i = 0; i < current.size(); ++i) {
    if (i == failed_index) continue;
    int64_t idx = snap.IndexOf(current[i]);
    if (idx >= 0) used_racks.push_back(RackKey(snap, static_cast<size_t>(idx)));
  }
  std::vector<uint32_t> picked;
  PickLeastLoaded(snap, slab, candidates, 1, load, used_racks, &picked);
  return snap.servers()[picked.front()].id;
}

bool CodingSets::IsValid(const MembershipSnapshot& snap, std::span<const ServerId> servers) const {
  if (!Placement::IsValid(snap, servers)) return false;
  int group = GroupOf(servers.front());
  if (group < 0) return false;
  for (ServerId id : servers) {
    if (GroupOf(id) != group) return false;
  }
  return true;
}

}  // namespace tessera::placement
