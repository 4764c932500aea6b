// Slabs of either layout: placement of a new logical slab (its members re-placed when they
// cannot be allocated), its allocation off this thread (the ALLOC calls are made by the
// SlabAllocator's workers; answers come back through TakeAllocAnswers), and what makes an
// allocated slab usable; and the end of a repair or regeneration write. The re-placement of a
// member after a failure or an eviction is recovery.cc's, over the same allocator.
#include "client/remote/engine.h"
#include "client/remote/layout.h"

#include <algorithm>
#include <bit>

#include "common/logging.h"

namespace tessera::client::remote {

Result<std::vector<placement::ServerId>> IoThread::PlaceSlab(Slab& s) {
  const uint64_t ls = static_cast<uint64_t>(&s - slabs_.data()) * store_->opt_.io_threads + index_;
  std::vector<placement::ServerId> servers;
  {
    std::lock_guard<std::mutex> lock(store_->mu_);
    auto p = store_->PlaceLocked(ls);
    if (!p.ok() && layout_->KeepsMissingMembers()) {
      // Group layout: no coding group has k+r live servers any more, but writes still need
      // stripes. Reuse the servers of a slab of ours that kept at least k live members; the
      // failed ones stay missing (see below).
      for (const Slab& o : UsedSlabs()) {
        if (!o.allocated) continue;
        int live = 0;
        std::vector<placement::ServerId> set(lay_.width());
        for (int j = 0; j < lay_.width(); ++j) {
          set[j] = o.server[j].load(std::memory_order_relaxed);
          live += set[j] != kNoServer && !store_->failed_[set[j]].load() ? 1 : 0;
        }
        if (live >= lay_.k) {
          p = set;
          break;
        }
      }
    }
    if (!p.ok())
      return Unavailable("no placement for slab " + std::to_string(ls) + ": " +
                         p.status().ToString());
    servers = *p;
    for (auto id : servers) store_->load_[id]++;
  }
  s.id = ls;
  return servers;
}

bool IoThread::ReplaceNewMember(uint64_t ls, std::vector<placement::ServerId>& servers, int j,
                                const Status& why) {
  // servers[j] stays in `servers` until replaced: never chosen again.
  const uint32_t server = servers[j];
  std::lock_guard<std::mutex> lock(store_->mu_);
  auto rep = store_->ReplacementLocked(ls, servers, j);
  if (!rep.ok()) return false;
  const uint64_t n = ++alloc_replacements_;
  if ((n & (n - 1)) == 0) {  // Log at 1, 2, 4, ... (a full server would flood the log).
    TLOG(INFO) << store_->name_ << ": slab " << ls << " split " << j << ": "
               << store_->server(server).endpoint.ToString() << " could not allocate (" << why
               << "); placing it on " << store_->server(*rep).endpoint.ToString() << " (" << n
               << " splits re-placed so far on this thread)";
  }
  if (store_->load_[server] > 0) store_->load_[server]--;
  store_->load_[*rep]++;
  servers[j] = *rep;
  return true;
}

void IoThread::BeginAllocate(Slab& s) {
  const uint32_t slab = static_cast<uint32_t>(&s - slabs_.data());
  NoteSlabUsed(s);
  Result<std::vector<placement::ServerId>> servers = stop_.load(std::memory_order_relaxed)
                                                         ? Cancelled("page store is shutting down")
                                                         : PlaceSlab(s);
  if (!servers.ok()) {
    layout_->SlabReady(slab, servers.status());
    return;
  }
  allocs_.emplace_back();
  PendingAlloc& a = allocs_.back();
  a.slab = slab;
  a.servers = std::move(*servers);
  for (int j = 0; j < lay_.width() && a.failed.ok(); ++j) AskMember(a, j);
  MaybeEndAlloc(allocs_.size() - 1);
}

bool IoThread::Allocating(uint32_t slab) const {
  return std::any_of(allocs_.begin(), allocs_.end(),
                     [slab](const PendingAlloc& a) { return a.slab == slab; });
}

void IoThread::AskMember(PendingAlloc& a, int j) {
  for (;;) {
    const uint32_t server = a.servers[j];
    // A suspect server is skipped while there is another choice (it may be stopped), and asked
    // as the last resort. A server that does not answer within the op timeout counts as a
    // failed allocation there, as for data ops.
    if (Usable(server) && (!store_->Suspect(server) || a.tries[j] == kMaxAllocReplacements)) {
      a.tag[j] = ++next_tag_;
      allocator_->Alloc(a.tag[j], server,
                        std::min(store_->opt_.control_timeout_ms, store_->opt_.op_timeout_ms));
      a.asked |= 1ull << j;
      return;
    }
    if (!ReplaceMember(a, j, Unavailable("server is failed, suspect or not connected"))) return;
  }
}

bool IoThread::ReplaceMember(PendingAlloc& a, int j, const Status& why) {
  if (!a.failed.ok()) return false;
  if (a.tries[j] < kMaxAllocReplacements &&
      ReplaceNewMember(slabs_[a.slab].id, a.servers, j, why)) {
    ++a.tries[j];
    return true;
  }
  if (layout_->KeepsMissingMembers() && std::popcount(a.missing) < lay_.r &&
      IsConnectionError(why) && why.code() != StatusCode::kCancelled) {
    // Group layout: every write may need a new slab, so a cluster that lost servers (and has
    // no spare in the coding group) must still take writes. The member stays on its server,
    // allocated nowhere: its writes fail (stripes are stored with fewer members, at least k)
    // and reads treat it as an erasure, as for a slab whose server failed after allocation. At
    // most r members of a slab can be missing.
    Slab& s = slabs_[a.slab];
    a.missing |= 1ull << j;
    s.server[j].store(a.servers[j], std::memory_order_relaxed);
    s.remote[j] = 0;
    s.remote_info[j] = fabric::AllocSlabResponse{};
    s.regen_cursor[j] = static_cast<uint32_t>(store_->pages_per_slab_);
    store_->ReportTrouble(a.servers[j], "cannot allocate a slab there: " + why.ToString());
    return false;
  }
  a.failed = Unavailable("cannot allocate a slab on " +
                         store_->server(a.servers[j]).endpoint.ToString() + ": " + why.ToString());
  return false;
}

bool IoThread::TakeAllocAnswers() {
  if (allocator_ == nullptr || !allocator_->Take(&answers_)) return false;
  std::vector<SlabAllocator::Answer> answers;
  answers.swap(answers_);
  for (SlabAllocator::Answer& answer : answers) OnAllocAnswer(answer);
  MaybeReleaseTrims();
  return true;
}

void IoThread::OnAllocAnswer(SlabAllocator::Answer& answer) {
  const uint32_t server = answer.server;
  for (size_t i = 0; i < replacing_.size(); ++i) {
    if (replacing_[i].tag == answer.tag) {
      OnReplaceAnswer(i, answer);
      return;
    }
  }
  size_t i = 0;
  int j = 0;
  for (; i < allocs_.size(); ++i) {
    for (j = 0; j < lay_.width(); ++j) {
      if (((allocs_[i].asked >> j) & 1) && allocs_[i].tag[j] == answer.tag) break;
    }
    if (j < lay_.width()) break;
  }
  if (i == allocs_.size()) {  // Abandoned (AbandonStuckAllocs): a slab got is given back.
    if (answer.slab.ok()) freer_->Free(server, answer.slab->slab_id);
    return;
  }
  PendingAlloc& a = allocs_[i];
  a.asked &= ~(1ull << j);
  Slab& s = slabs_[a.slab];
  Status why;
  if (answer.slab.ok()) {
    const fabric::AllocSlabResponse& r = *answer.slab;
    if (!a.failed.ok()) {
      freer_->Free(server, r.slab_id);  // The allocation failed meanwhile: give it back.
    } else if (Status added = Usable(server) ? t_->AddSlab(conn_[server], r)
                                             : Unavailable("data connection down");
               added.ok()) {
      s.server[j].store(server, std::memory_order_relaxed);
      s.remote[j] = r.slab_id;
      s.remote_info[j] = r;
      s.regen_cursor[j] = static_cast<uint32_t>(store_->pages_per_slab_);
      a.got |= 1ull << j;
    } else {
      freer_->Free(server, r.slab_id);
      why = added;
    }
  } else {
    why = answer.slab.status();
    if (why.code() == StatusCode::kCancelled) {
      if (a.failed.ok()) a.failed = why;  // Shutting down: no replacement.
    } else if (IsConnectionError(why)) {
      store_->ReportTrouble(server, "slab allocation: " + why.ToString());
    }
  }
  if (!why.ok() && a.failed.ok() && ReplaceMember(a, j, why)) AskMember(a, j);
  MaybeEndAlloc(i);
}

void IoThread::AbandonStuckAllocs() {
  auto stuck = [&](uint32_t server) { return !Usable(server) || store_->Suspect(server); };
  const Status why = Unavailable("its server turned suspect while the ALLOC was out");
  // Downwards: ending an allocation erases it, and what its end starts is appended.
  for (size_t i = allocs_.size(); i-- > 0;) {
    PendingAlloc& a = allocs_[i];
    if (!a.failed.ok()) continue;
    for (uint64_t m = a.asked; m != 0; m &= m - 1) {
      const int j = std::countr_zero(m);
      // The last try of a member asks a suspect server on purpose (AskMember); with no other
      // server to take it, waiting for the call is all there is.
      if (!stuck(a.servers[j]) || a.tries[j] >= kMaxAllocReplacements ||
          !ReplaceNewMember(slabs_[a.slab].id, a.servers, j, why)) {
        continue;
      }
      ++a.tries[j];
      a.asked &= ~(1ull << j);
      a.tag[j] = 0;  // Its answer matches nothing now.
      store_->stats_.allocs_abandoned.fetch_add(1, std::memory_order_relaxed);
      AskMember(a, j);
    }
    MaybeEndAlloc(i);
  }
  for (size_t i = replacing_.size(); i-- > 0;) {
    PendingReplace& r = replacing_[i];
    if (r.cancelled || r.chosen == kNoServer || r.attempt >= 3 || !stuck(r.chosen)) continue;
    {
      // Only when another server can take it (AskReplacement gives up otherwise).
      std::vector<placement::ServerId> current = r.current;
      current[r.j] = r.chosen;
      std::lock_guard<std::mutex> lock(store_->mu_);
      auto other = store_->ReplacementLocked(slabs_[r.slab].id + static_cast<uint64_t>(r.attempt),
                                             current, r.j);
      if (!other.ok() || stuck(*other)) continue;
      if (store_->load_[r.chosen] > 0) store_->load_[r.chosen]--;
    }
    store_->stats_.allocs_abandoned.fetch_add(1, std::memory_order_relaxed);
    r.current[r.j] = r.chosen;  // Not chosen again.
    r.chosen = kNoServer;
    r.tag = 0;
    AskReplacement(i);  // Erases it when there is no other server.
  }
}

void IoThread::MaybeEndAlloc(size_t i) {
  PendingAlloc& a = allocs_[i];
  if (a.asked != 0) return;
  const uint32_t slab = a.slab;
  Slab& s = slabs_[slab];
  const Status failed = a.failed;
  if (!failed.ok()) {
    for (uint64_t m = a.got; m != 0; m &= m - 1) {
      const int j = std::countr_zero(m);
      const uint32_t srv = s.server[j].load(std::memory_order_relaxed);
      if (!local_failed_[srv] && !store_->failed_[srv].load()) ReleaseRemote(srv, s.remote[j]);
      s.remote[j] = 0;
      s.remote_info[j] = fabric::AllocSlabResponse{};
    }
    for (int j = 0; j < lay_.width(); ++j) s.server[j].store(kNoServer);
    std::lock_guard<std::mutex> lock(store_->mu_);
    for (auto id : a.servers) {
      if (store_->load_[id] > 0) store_->load_[id]--;
    }
  } else {
    FinishSlab(s);
    // A member whose server was failed while the others were being allocated (after
    // HandleLocalFailures went over the allocated slabs) is re-placed like any other.
    for (int j = 0; j < lay_.width(); ++j) {
      const uint32_t srv = s.server[j].load(std::memory_order_relaxed);
      if (srv != kNoServer && local_failed_[srv]) ReplaceSplit(s, j);
    }
  }
  allocs_.erase(allocs_.begin() + static_cast<std::ptrdiff_t>(i));
  layout_->SlabReady(slab, failed);
}

void IoThread::StopAllocations() {
  if (allocator_ == nullptr) return;
  allocator_->Finish();  // Every call not made is answered Cancelled.
  while (AllocationsPending() && TakeAllocAnswers()) {
  }
  for (QueueJob* job : trims_after_allocs_) freer_->After(job);
  trims_after_allocs_.clear();
}

void IoThread::MaybeReleaseTrims() {
  if (AllocationsPending() || trims_after_allocs_.empty()) return;
  for (QueueJob* job : trims_after_allocs_) freer_->After(job);
  trims_after_allocs_.clear();
}

void IoThread::FinishSlab(Slab& s) {
  s.free_wanted = false;
  s.allocated = true;
  NoteSlabUsed(s);
  layout_->SlabAllocated(s);
  PublishSlab(static_cast<uint32_t>(&s - slabs_.data()));
}

void IoThread::RepairWritten(Ctx* c, const Status& st) {
  if (st.ok()) {
    if (c->kind == Ctx::Kind::kRegen && !c->scrub) {
      store_->stats_.regenerations_done.fetch_add(1, std::memory_order_relaxed);
    } else {
      store_->stats_.corruptions_repaired.fetch_add(1, std::memory_order_relaxed);
    }
  } else if (IsConnectionError(st)) {
    // The replacement's server failed too; the split will be re-placed and rebuilt.
  }
  MaybeRelease(c);
}

}  // namespace tessera::client::remote
