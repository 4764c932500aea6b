// Slabs of either layout: placement of a new logical slab (its members re-placed when they
// cannot be allocated), blocking allocation (the group layout's: its stripe buffer cannot wait
// for an allocation off this thread), and what makes an allocated slab usable; and the end of
// a repair or regeneration write.
#include "client/remote/engine.h"
#include "client/remote/layout.h"

#include <algorithm>

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
      for (const Slab& o : slabs_) {
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

Status IoThread::AllocateSlab(Slab& s) {
  TESSERA_ASSIGN_OR_RETURN(std::vector<placement::ServerId> servers, PlaceSlab(s));
  const uint64_t ls = s.id;
  const size_t pps = store_->pages_per_slab_;
  // A server that does not answer an allocation within the op timeout is declared failed, as
  // for data ops; a split whose server failed or refused (full) is placed on the replacement
  // placement chooses, a few times at most, instead of failing the write.
  const uint32_t attempt_ms = std::min(store_->opt_.control_timeout_ms, store_->opt_.op_timeout_ms);
  int missing = 0;  // Group layout: members left on a failed server (see below).
  for (int j = 0; j < lay_.width(); ++j) {
    Status last;
    bool done = false;
    for (int attempt = 0; attempt <= kMaxAllocReplacements && !done; ++attempt) {
      const uint32_t server = servers[j];
      // A suspect server is skipped while there is another choice (it may be stopped: an
      // allocation there would hold this thread until the deadline), tried as the last resort.
      if (Usable(server) && (!store_->Suspect(server) || attempt == kMaxAllocReplacements)) {
        auto r = AllocRemote(server, Deadline::AfterMs(attempt_ms));
        if (r.ok()) {
          s.server[j].store(server, std::memory_order_relaxed);
          s.remote[j] = r->slab_id;
          s.remote_info[j] = *r;
          s.regen_cursor[j] = static_cast<uint32_t>(pps);
          done = true;
          break;
        }
        last = r.status();
        if (IsConnectionError(r.status())) {
          store_->ReportTrouble(server, "slab allocation: " + r.status().ToString());
        }
      } else {
        last = Unavailable("server is failed, suspect or not connected");
      }
      if (attempt == kMaxAllocReplacements || !ReplaceNewMember(ls, servers, j, last)) break;
    }
    if (!done && layout_->KeepsMissingMembers() && missing < lay_.r && IsConnectionError(last)) {
      // Group layout: every write may need a new slab, so a cluster that lost servers (and has
      // no spare in the coding group) must still take writes. The member stays on its failed
      // server: its writes fail (stripes are stored with fewer members, at least k) and reads
      // treat it as an erasure, as for a slab whose server failed after allocation. At most r
      // members of a slab can be missing.
      ++missing;
      s.server[j].store(servers[j], std::memory_order_relaxed);
      s.remote[j] = 0;
      s.remote_info[j] = fabric::AllocSlabResponse{};
      s.regen_cursor[j] = static_cast<uint32_t>(pps);
      store_->ReportTrouble(servers[j], "cannot allocate a slab there: " + last.ToString());
      continue;
    }
    if (!done) {
      // Roll back what we took.
      for (int i = 0; i < j; ++i) {
        const uint32_t srv = s.server[i].load();
        if (!local_failed_[srv] && !store_->failed_[srv].load()) {
          ReleaseRemote(srv, s.remote[i]);
        }
        s.server[i].store(kNoServer);
      }
      {
        std::lock_guard<std::mutex> lock(store_->mu_);
        for (auto id : servers) {
          if (store_->load_[id] > 0) store_->load_[id]--;
        }
      }
      return Unavailable("cannot allocate a slab on " +
                         store_->server(servers[j]).endpoint.ToString() + ": " + last.ToString());
    }
  }
  FinishSlab(s);
  return Status::Ok();
}

void IoThread::FinishSlab(Slab& s) {
  s.free_wanted = false;
  s.allocated = true;
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
