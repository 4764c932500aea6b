// Split layout (and copies) write path: allocate the logical slab's k+r remote slabs on first
// use, encode (CRC per split), post k+r split writes, re-place splits whose server failed,
// acknowledge per the AckPolicy, and start the next queued write of the page once settled.
#include "client/remote/engine.h"
#include "client/remote/layout.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include "common/logging.h"

namespace tessera::client::remote {

Result<std::vector<placement::ServerId>> IoThread::PlaceSlab(Slab& s) {
  const uint64_t ls = static_cast<uint64_t>(&s - slabs_.data()) * store_->opt_.io_threads +
                      index_;
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
    if (!p.ok()) return Unavailable("no placement for slab " + std::to_string(ls) + ": " +
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
  const uint32_t attempt_ms =
      std::min(store_->opt_.control_timeout_ms, store_->opt_.op_timeout_ms);
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
                         store_->server(servers[j]).endpoint.ToString() + ": " +
                         last.ToString());
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

void IoThread::StartWrite(Ctx* c) {
  Slab& s = slabs_[c->slab];
  if (!s.allocated && allocator_ != nullptr) {
    AllocateThenWrite(s, c);  // Started again once the slab is allocated.
    return;
  }
  if (!s.allocated) {
    Status st = AllocateSlab(s);
    now_ns_ = MonotonicNs();  // The control calls may have blocked.
    if (!st.ok()) {
      c->finished = true;
      Complete(c->op, st, c->start_ns);
      c->op = nullptr;
      MaybeRelease(c);
      return;
    }
  }
  if (Ctx* w = s.busy[c->pidx]; w != nullptr && w != c) {
    while (w->next_write != nullptr) w = w->next_write;
    w->next_write = c;  // Started when the writes before it are settled.
    s.trim_after[c->pidx] = 0;  // This write comes after any trim of the page.
    return;
  }
  s.busy[c->pidx] = c;
  const int W = lay_.width();
  if (lay_.copies) {
    const uint32_t crc = coding::Crc32c(WriteBuf(c, 0), kPageSize);
    for (int j = 0; j < W; ++j) c->crcs[j] = crc;
  } else {
    uint8_t* parity[coding::kMaxParitySplits];
    for (int j = 0; j < lay_.r; ++j) parity[j] = SplitBuf(c, lay_.k + j);
    store_->codec_->EncodeWithCrcs(c->buf, parity, c->crcs.data());
  }
  // Publish: reads from now on are served from this ctx until it settles, then verify against
  // these CRCs.
  s.seq[c->pidx]++;
  c->seq = s.seq[c->pidx];
  std::memcpy(&s.crc[static_cast<size_t>(c->pidx) * W], c->crcs.data(), sizeof(uint32_t) * W);
  if (!s.written[c->pidx]) {
    for (int j = 0; j < W; ++j) {
      if (s.regen_cursor[j] <= c->pidx) {
        store_->stats_.regenerations_pending.fetch_add(1, std::memory_order_relaxed);
      }
    }
  }
  if (!s.written[c->pidx]) ++s.written_count;
  s.written[c->pidx] = 1;
  PublishSplitPage(s, c->pidx);  // Not directly readable until the write settles.
  c->asked = (W == 64 ? ~0ull : (1ull << W) - 1);
  c->good = c->bad = 0;
  unsettled_.fetch_add(1, std::memory_order_relaxed);
  PostWriteSplits(c, c->asked);
}

void IoThread::PostWriteSplits(Ctx* c, uint64_t mask) {
  for (int j = 0; j < lay_.width(); ++j) {
    const uint64_t bit = 1ull << j;
    if ((mask & bit) == 0) continue;
    if (!PostOrPark(c, j, WriteBuf(c, j))) c->bad |= bit;
  }
  if (c->outstanding == 0) WriteSettled(c);
  else if (!c->acked && lay_.ack == AckPolicy::kFirstK && std::popcount(c->good) >= lay_.k) {
    AckWrite(c, Status::Ok());
  }
}

void IoThread::OnWriteSplit(Ctx* c, int split, uint32_t server, const Status& st) {
  const uint64_t bit = 1ull << split;
  if (c->kind != Ctx::Kind::kWrite) {  // A repair or regeneration write.
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
    return;
  }
  if (st.ok()) {
    c->good |= bit;
  } else {
    // Re-place: the server is failed (connection loss / timeout) or dropped the slab.
    Slab& s = slabs_[c->slab];
    if (IsConnectionError(st)) ServerError(server, st);
    if (s.server[split].load(std::memory_order_relaxed) != server) {
      // Moved to a replacement meanwhile: store it there.
      if (!PostOrPark(c, split, WriteBuf(c, split))) c->bad |= bit;
    } else if (IsConnectionError(st) && server != kNoServer && !store_->failed_[server].load()) {
      // Its connection went (being reconnected) or it is not answering: wait for it to be
      // reachable again or to be failed (then the split is re-placed), not for nothing.
      Park(c, split);
    } else if ((c->retried & bit) == 0 && server != kNoServer &&
               !store_->failed_[server].load()) {
      // The server is fine and refused once: retry once.
      c->retried |= bit;
      if (!PostOrPark(c, split, WriteBuf(c, split))) c->bad |= bit;
    } else {
      c->bad |= bit;
    }
  }
  WriteProgress(c);
}

void IoThread::WriteProgress(Ctx* c) {
  if (!c->acked) {
    const int stored = std::popcount(c->good);
    const bool all_done = c->outstanding == 0;
    if ((lay_.ack == AckPolicy::kFirstK && stored >= lay_.k) ||
        (all_done && stored >= lay_.k)) {
      AckWrite(c, Status::Ok());
    } else if (all_done) {
      AckWrite(c, Unavailable("page " + std::to_string(c->page) + ": only " +
                              std::to_string(stored) + " of " + std::to_string(lay_.width()) +
                              " splits could be stored"));
    }
  }
  if (c->outstanding == 0) WriteSettled(c);
}

void IoThread::AckWrite(Ctx* c, Status st) {
  c->acked = true;
  if (!st.ok()) {
    // The page is not readable as written: forget it rather than return wrong bytes.
    Slab& s = slabs_[c->slab];
    if (s.written[c->pidx]) Unwrite(s, c->pidx);
  }
  Complete(c->op, st, c->start_ns);
  c->op = nullptr;
}

void IoThread::WriteSettled(Ctx* c) {
  if (!c->acked) {
    const int stored = std::popcount(c->good);
    AckWrite(c, stored >= lay_.k ? Status::Ok()
                                 : Unavailable("page " + std::to_string(c->page) + ": only " +
                                               std::to_string(stored) +
                                               " splits could be stored"));
  }
  c->finished = true;
  unsettled_.fetch_sub(1, std::memory_order_release);
  Slab& s = slabs_[c->slab];
  if (s.written[c->pidx] && std::popcount(c->good) >= lay_.k) {
    // Splits that could not be stored on a server that is not failed (its connection was
    // lost, or it refused): rewritten from the others once it is reachable (RepairStale).
    for (int j = 0; j < lay_.width(); ++j) {
      if (((c->good >> j) & 1) == 0) {
        NoteStale(c->slab, c->pidx, j, s.server[j].load(std::memory_order_relaxed));
      }
    }
  }
  Ctx* next = c->next_write;
  s.busy[c->pidx] = next;
  if (next == nullptr && s.trim_after[c->pidx]) {
    s.trim_after[c->pidx] = 0;
    if (s.written[c->pidx]) Unwrite(s, c->pidx);
  }
  if (next == nullptr) PublishSplitPage(s, c->pidx);  // Stored (or zeros): directly readable.
  MaybeRelease(c);
  if (next != nullptr) StartWrite(next);
}


}  // namespace tessera::client::remote
