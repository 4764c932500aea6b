#include "placement/placement.h"

#include <algorithm>
#include <cstdlib>

#include "placement/coding_sets.h"
#include "placement/policies.h"

namespace tessera::placement {
namespace {

uint64_t SplitMix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

bool Contains(std::span<const ServerId> v, ServerId id) {
  return std::find(v.begin(), v.end(), id) != v.end();
}

Result<int> ParseCount(const std::string& word, const std::string& text, int lo, int hi) {
  char* end = nullptr;
  long v = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || v < lo || v > hi) {
    return InvalidArgument("policy '", word, "': '", text, "' is not a number in [", lo, ", ",
                           hi, "]");
  }
  return static_cast<int>(v);
}

}  // namespace

uint64_t HashMix(uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
  uint64_t h = SplitMix(a);
  h = SplitMix(h ^ b);
  h = SplitMix(h ^ c);
  return SplitMix(h ^ d);
}

Status CheckLoadView(const MembershipSnapshot& snap, LoadView load) {
  if (!load.empty() && load.size() != snap.size()) {
    return InvalidArgument("placement: load view has ", load.size(), " entries for ",
                           snap.size(), " servers");
  }
  return Status::Ok();
}

Status CheckReplacementArgs(std::string_view policy, const MembershipSnapshot& snap,
                            LoadView load, std::span<const ServerId> current,
                            size_t failed_index) {
  TESSERA_RETURN_IF_ERROR(CheckLoadView(snap, load));
  if (failed_index >= current.size()) {
    return InvalidArgument(policy, ": failed index ", failed_index, " outside ", current.size(),
                           " servers");
  }
  return Status::Ok();
}

bool Placement::IsValid(const MembershipSnapshot& snap, std::span<const ServerId> servers) const {
  if (servers.size() != static_cast<size_t>(width())) return false;
  for (size_t i = 0; i < servers.size(); ++i) {
    if (!snap.IsAlive(servers[i])) return false;
    for (size_t j = 0; j < i; ++j) {
      if (servers[j] == servers[i]) return false;
    }
  }
  return true;
}

Result<PolicySpec> ParsePolicySpec(const std::string& word, const PolicySpec& defaults) {
  PolicySpec spec = defaults;
  std::string base = word;
  std::string arg;
  size_t colon = word.find(':');
  if (colon != std::string::npos) {
    base = word.substr(0, colon);
    arg = word.substr(colon + 1);
  }
  if (base == "codingsets" || base == "random") {
    if (!arg.empty()) return InvalidArgument("policy '", word, "' takes no ':' argument");
    spec.kind = base == "random" ? PolicyKind::kRandom : PolicyKind::kCodingSets;
  } else if (base == "power") {
    spec.kind = PolicyKind::kPowerOfChoices;
    if (!arg.empty()) {
      TESSERA_ASSIGN_OR_RETURN(spec.choices, ParseCount(word, arg, 1, 64));
    }
  } else if (base == "random_rep" || base == "copysets") {
    spec.kind = base == "copysets" ? PolicyKind::kCopySets : PolicyKind::kRandomReplication;
    if (!arg.empty()) {
      TESSERA_ASSIGN_OR_RETURN(spec.replicas, ParseCount(word, arg, 1, 16));
    }
  } else {
    return InvalidArgument("unknown policy '", word,
                           "' (codingsets, random, power[:D], random_rep[:R], copysets[:R])");
  }
  return spec;
}

Result<std::vector<PolicySpec>> ParsePolicyList(const std::string& list,
                                                const PolicySpec& defaults) {
  std::vector<PolicySpec> out;
  size_t start = 0;
  while (start <= list.size()) {
    size_t comma = list.find(',', start);
    if (comma == std::string::npos) comma = list.size();
    std::string word = list.substr(start, comma - start);
    if (word.empty()) return InvalidArgument("empty policy name in list '", list, "'");
    TESSERA_ASSIGN_OR_RETURN(PolicySpec spec, ParsePolicySpec(word, defaults));
    out.push_back(spec);
    start = comma + 1;
  }
  return out;
}

Result<PlacementPtr> CreatePolicy(const PolicySpec& spec, const SnapshotPtr& snap) {
  if (!snap) return InvalidArgument("placement: null membership snapshot");
  const bool coded = spec.kind == PolicyKind::kCodingSets || spec.kind == PolicyKind::kRandom ||
                     spec.kind == PolicyKind::kPowerOfChoices;
  if (coded && (spec.k < 1 || spec.r < 0 || spec.k + spec.r > 64)) {
    return InvalidArgument("placement: need k >= 1, r >= 0 and k+r <= 64 (got k=", spec.k,
                           ", r=", spec.r, ")");
  }
  if (!coded && (spec.replicas < 1 || spec.replicas > 16)) {
    return InvalidArgument("placement: replication factor must be in [1, 16], got ",
                           spec.replicas);
  }
  const int width = coded ? spec.k + spec.r : spec.replicas;
  if (snap->alive().size() < static_cast<size_t>(width)) {
    return InvalidArgument("placement: ", snap->alive().size(), " alive servers cannot hold ",
                           width, " distinct splits/copies per slab");
  }
  switch (spec.kind) {
    case PolicyKind::kCodingSets: {
      CodingSetsOptions o{spec.k, spec.r, spec.l, spec.seed};
      TESSERA_ASSIGN_OR_RETURN(auto cs, CodingSets::Create(o, snap));
      return PlacementPtr(std::move(cs));
    }
    case PolicyKind::kRandom:
      return PlacementPtr(std::make_shared<RandomPlacement>(
          width, spec.r, internal::StrCat("random(", spec.k, ",", spec.r, ")"), spec.seed));
    case PolicyKind::kPowerOfChoices:
      if (spec.choices < 1) return InvalidArgument("power-of-choices: choices must be >= 1");
      return PlacementPtr(std::make_shared<PowerOfChoices>(spec.k, spec.r, spec.choices, spec.seed));
    case PolicyKind::kRandomReplication:
      return PlacementPtr(std::make_shared<RandomPlacement>(
          width, width - 1, internal::StrCat("random-rep", width), spec.seed));
    case PolicyKind::kCopySets:
      return CopySets::Create(spec.replicas, spec.scatter_width, spec.seed, snap);
  }
  return InvalidArgument("placement: unknown policy kind");
}

// ---------------------------------------------------------------------------------------
// RandomPlacement: rendezvous hashing.

Result<std::vector<ServerId>> RandomPlacement::Place(const MembershipSnapshot& snap,
                                                     SlabId slab, LoadView load) const {
  TESSERA_RETURN_IF_ERROR(CheckLoadView(snap, load));
  const size_t w = static_cast<size_t>(width_);
  if (snap.alive().size() < w) {
    return Unavailable(name_, ": ", snap.alive().size(), " alive servers, need ", w);
  }
  // The w highest hashes, kept sorted descending in a small array.
  std::vector<std::pair<uint64_t, ServerId>> top;
  top.reserve(w + 1);
  for (uint32_t i : snap.alive()) {
    ServerId id = snap.servers()[i].id;
    uint64_t h = HashMix(seed_, slab, id);
    if (top.size() == w && h <= top.back().first) continue;
    auto pos = std::upper_bound(top.begin(), top.end(), h,
                                [](uint64_t v, const auto& e) { return v > e.first; });
    top.insert(pos, {h, id});
    if (top.size() > w) top.pop_back();
  }
  std::vector<ServerId> out;
  out.reserve(w);
  for (const auto& [h, id] : top) out.push_back(id);
  return out;
}

Result<ServerId> RandomPlacement::ChooseReplacement(const MembershipSnapshot& snap, SlabId slab,
                                                    std::span<const ServerId> current,
                                                    size_t failed_index, LoadView load) const {
  TESSERA_RETURN_IF_ERROR(CheckReplacementArgs(name_, snap, load, current, failed_index));
  bool found = false;
  uint64_t best_h = 0;
  ServerId best = 0;
  for (uint32_t i : snap.alive()) {
    ServerId id = snap.servers()[i].id;
    if (Contains(current, id)) continue;
    uint64_t h = HashMix(seed_, slab, id);
    if (!found || h > best_h) {
      found = true;
      best_h = h;
      best = id;
    }
  }
  if (!found) return Unavailable(name_, ": no alive server outside the slab's servers");
  return best;
}

Result<PlacementPtr> RandomPlacement::Reconfigure(const SnapshotPtr& next) const {
  if (!next) return InvalidArgument(name_, ": null membership snapshot");
  return PlacementPtr(std::make_shared<RandomPlacement>(*this));
}

// ---------------------------------------------------------------------------------------
// PowerOfChoices.

std::string PowerOfChoices::name() const {
  return internal::StrCat("power", choices_, "(", k_, ",", r_, ")");
}

Result<ServerId> PowerOfChoices::PickOne(const MembershipSnapshot& snap, SlabId slab,
                                         uint64_t salt, std::span<const ServerId> taken,
                                         LoadView load) const {
  const auto& alive = snap.alive();
  const uint64_t n = alive.size();
  constexpr int kDrawsPerChoice = 64;
  int64_t best = -1;
  uint64_t best_load = 0;
  for (int c = 0; c < choices_; ++c) {
    for (int attempt = 0; attempt < kDrawsPerChoice; ++attempt) {
      uint32_t i = alive[HashMix(seed_, slab, salt, static_cast<uint64_t>(c) * kDrawsPerChoice +
                                                        static_cast<uint64_t>(attempt)) % n];
      if (Contains(taken, snap.servers()[i].id)) continue;
      uint64_t l = LoadAt(snap, load, i);
      if (best < 0 || l < best_load) {
        best = i;
        best_load = l;
      }
      break;
    }
  }
  if (best < 0) {
    // Nearly every server is taken (tiny clusters): the first free one by index.
    for (uint32_t i : alive) {
      if (!Contains(taken, snap.servers()[i].id)) return snap.servers()[i].id;
    }
    return Unavailable(name(), ": no alive server outside the slab's servers");
  }
  return snap.servers()[static_cast<size_t>(best)].id;
}

Result<std::vector<ServerId>> PowerOfChoices::Place(const MembershipSnapshot& snap, SlabId slab,
                                                    LoadView load) const {
  TESSERA_RETURN_IF_ERROR(CheckLoadView(snap, load));
  const size_t w = static_cast<size_t>(width());
  if (snap.alive().size() < w) {
    return Unavailable(name(), ": ", snap.alive().size(), " alive servers, need ", w);
  }
  std::vector<ServerId> out;
  out.reserve(w);
  for (size_t j = 0; j < w; ++j) {
    TESSERA_ASSIGN_OR_RETURN(ServerId id, PickOne(snap, slab, j, out, load));
    out.push_back(id);
  }
  return out;
}

Result<ServerId> PowerOfChoices::ChooseReplacement(const MembershipSnapshot& snap, SlabId slab,
                                                   std::span<const ServerId> current,
                                                   size_t failed_index, LoadView load) const {
  TESSERA_RETURN_IF_ERROR(CheckReplacementArgs(name(), snap, load, current, failed_index));
  // A salt distinct from Place()'s split salts, so the replacement is a fresh sample.
  return PickOne(snap, slab, 1000003u + failed_index, current, load);
}

Result<PlacementPtr> PowerOfChoices::Reconfigure(const SnapshotPtr& next) const {
  if (!next) return InvalidArgument(name(), ": null membership snapshot");
  return PlacementPtr(std::make_shared<PowerOfChoices>(*this));
}

// ---------------------------------------------------------------------------------------
// CopySets.

Result<PlacementPtr> CopySets::Create(int replicas, int scatter_width, uint64_t seed,
                                      const SnapshotPtr& snap) {
  if (!snap) return InvalidArgument("copysets: null membership snapshot");
  if (replicas < 2) return InvalidArgument("copysets: need at least 2 replicas, got ", replicas);
  if (scatter_width < replicas - 1) {
    return InvalidArgument("copysets: scatter width ", scatter_width, " is below R-1=",
                           replicas - 1);
  }
  if (snap->alive().size() < static_cast<size_t>(replicas)) {
    return Unavailable("copysets: ", snap->alive().size(), " alive servers, need ", replicas);
  }
  std::shared_ptr<CopySets> cs(new CopySets(replicas, scatter_width, seed));
  int perms = (scatter_width + replicas - 2) / (replicas - 1);
  for (int p = 0; p < perms; ++p) {
    std::vector<std::pair<uint64_t, ServerId>> keyed;
    for (uint32_t i : snap->alive()) {
      ServerId id = snap->servers()[i].id;
      keyed.push_back({HashMix(seed, 0xc0de, static_cast<uint64_t>(p), id), id});
    }
    std::sort(keyed.begin(), keyed.end());
    std::vector<ServerId> perm;
    for (const auto& [h, id] : keyed) perm.push_back(id);
    cs->permutations_.push_back(std::move(perm));
  }
  cs->BuildCopysets();
  return PlacementPtr(std::move(cs));
}

void CopySets::BuildCopysets() {
  copysets_.clear();
  copyset_index_.clear();
  copysets_of_.clear();
  const size_t R = static_cast<size_t>(replicas_);
  auto add = [&](std::vector<ServerId> set) {
    std::sort(set.begin(), set.end());
    if (copyset_index_.count(set)) return;
    uint32_t index = static_cast<uint32_t>(copysets_.size());
    copyset_index_.emplace(set, index);
    for (ServerId id : set) copysets_of_[id].push_back(index);
    copysets_.push_back(std::move(set));
  };
  for (const auto& perm : permutations_) {
    size_t full = perm.size() / R * R;
    for (size_t s = 0; s < full; s += R) add({perm.begin() + s, perm.begin() + s + R});
    // Leftover servers share a copyset with the tail of the last full one.
    if (full < perm.size()) add({perm.end() - static_cast<std::ptrdiff_t>(R), perm.end()});
  }
}

std::string CopySets::name() const {
  return internal::StrCat("copysets", replicas_, "(sw=", scatter_width_, ")");
}

Result<std::vector<ServerId>> CopySets::Place(const MembershipSnapshot& snap, SlabId slab,
                                              LoadView load) const {
  TESSERA_RETURN_IF_ERROR(CheckLoadView(snap, load));
  // The less loaded of two hashed candidate copysets whose members are all alive.
  int64_t best = -1;
  uint64_t best_load = 0;
  const size_t n = copysets_.size();
  for (uint64_t c = 0, found = 0; c < 2 * n && found < 2; ++c) {
    size_t cand = HashMix(seed_, slab, 0x5e7, c) % n;
    uint64_t total = 0;
    bool ok = true;
    for (ServerId id : copysets_[cand]) {
      int64_t i = snap.IndexOf(id);
      if (i < 0 || snap.servers()[static_cast<size_t>(i)].state != ServerState::kAlive) {
        ok = false;
        break;
      }
      total += LoadAt(snap, load, static_cast<size_t>(i));
    }
    if (!ok) continue;
    ++found;
    if (best < 0 || total < best_load) {
      best = static_cast<int64_t>(cand);
      best_load = total;
    }
  }
  if (best < 0) {
    return Unavailable(name(), ": no copyset with all members alive was found for slab ", slab,
                       "; reconfigure with the current membership");
  }
  return copysets_[static_cast<size_t>(best)];
}

Result<ServerId> CopySets::ChooseReplacement(const MembershipSnapshot& snap, SlabId slab,
                                             std::span<const ServerId> current,
                                             size_t failed_index, LoadView load) const {
  TESSERA_RETURN_IF_ERROR(CheckReplacementArgs(name(), snap, load, current, failed_index));
  std::vector<ServerId> survivors;
  for (size_t i = 0; i < current.size(); ++i) {
    if (i != failed_index) survivors.push_back(current[i]);
  }
  int64_t best = -1;
  uint64_t best_load = 0;
  auto consider = [&](ServerId id) {
    int64_t i = snap.IndexOf(id);
    if (i < 0 || snap.servers()[static_cast<size_t>(i)].state != ServerState::kAlive) return;
    if (Contains(current, id)) return;
    uint64_t l = LoadAt(snap, load, static_cast<size_t>(i));
    if (best < 0 || l < best_load) {
      best = i;
      best_load = l;
    }
  };
  if (!survivors.empty()) {
    auto it = copysets_of_.find(survivors.front());
    if (it != copysets_of_.end()) {
      for (uint32_t c : it->second) {
        const auto& set = copysets_[c];
        bool holds_all = std::all_of(survivors.begin(), survivors.end(), [&](ServerId s) {
          return std::binary_search(set.begin(), set.end(), s);
        });
        if (holds_all) {
          for (ServerId id : set) consider(id);
        }
      }
    }
  }
  if (best < 0) {
    for (uint32_t i : snap.alive()) consider(snap.servers()[i].id);
  }
  if (best < 0) return Unavailable(name(), ": no alive server outside the slab's servers");
  (void)slab;
  return snap.servers()[static_cast<size_t>(best)].id;
}

bool CopySets::IsValid(const MembershipSnapshot& snap, std::span<const ServerId> servers) const {
  if (!Placement::IsValid(snap, servers)) return false;
  std::vector<ServerId> sorted(servers.begin(), servers.end());
  std::sort(sorted.begin(), sorted.end());
  return copyset_index_.count(sorted) > 0;
}

Result<PlacementPtr> CopySets::Reconfigure(const SnapshotPtr& next) const {
  if (!next) return InvalidArgument(name(), ": null membership snapshot");
  if (next->alive().size() < static_cast<size_t>(replicas_)) {
    return Unavailable(name(), ": ", next->alive().size(), " alive servers, need ", replicas_);
  }
  std::shared_ptr<CopySets> cs(new CopySets(replicas_, scatter_width_, seed_));
  for (size_t p = 0; p < permutations_.size(); ++p) {
    std::vector<ServerId> perm = permutations_[p];
    // A departed server's slot is taken by the permutation's last server.
    for (size_t i = 0; i < perm.size();) {
      if (next->IsAlive(perm[i])) {
        ++i;
        continue;
      }
      perm[i] = perm.back();
      perm.pop_back();
    }
    std::vector<std::pair<uint64_t, ServerId>> joined;
    for (uint32_t i : next->alive()) {
      ServerId id = next->servers()[i].id;
      if (std::find(perm.begin(), perm.end(), id) == perm.end()) {
        joined.push_back({HashMix(seed_, 0xc0de, p, id), id});
      }
    }
    std::sort(joined.begin(), joined.end());
    for (const auto& [h, id] : joined) perm.push_back(id);
    cs->permutations_.push_back(std::move(perm));
  }
  cs->BuildCopysets();
  return PlacementPtr(std::move(cs));
}

}  // namespace tessera::placement
