// Split layout (and copies) write path: start allocating the logical slab's k+r remote slabs on
// first use (slab_alloc.cc), encode (CRC per split), post k+r split writes, re-place splits whose
// server failed, acknowledge per the AckPolicy, and start the next queued write of the page once
// settled.
#include "client/remote/split_layout.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include "common/logging.h"

namespace tessera::client::remote {

void SplitLayout::Unwrite(Slab& s, uint32_t p) {
  s.written[p] = 0;
  --s.written_count;
  ++s.seq[p];              // Reads and regenerations in flight on the old contents see the change.
  PublishSplitPage(s, p);  // Zeros (or, under a write in flight, not directly readable).
  // The page no longer needs rebuilding on splits whose regeneration has not reached it.
  for (int j = 0; j < lay_.width(); ++j) {
    if (s.regen_cursor[j] <= p) {
      store_->stats_.regenerations_pending.fetch_sub(1, std::memory_order_relaxed);
    }
  }
}

void SplitLayout::StartWrite(Ctx* c) {
  Slab& s = io_.slabs_[c->slab];
  if (!s.allocated) {
    AllocateThenWrite(s, c);  // Started again once the slab is allocated.
    return;
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
    for (int j = 0; j < lay_.r; ++j) parity[j] = io_.SplitBuf(c, lay_.k + j);
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
  io_.unsettled_.fetch_add(1, std::memory_order_relaxed);
  PostWriteSplits(c, c->asked);
}

void SplitLayout::PostWriteSplits(Ctx* c, uint64_t mask) {
  for (int j = 0; j < lay_.width(); ++j) {
    const uint64_t bit = 1ull << j;
    if ((mask & bit) == 0) continue;
    if (!io_.PostOrPark(c, j, WriteBuf(c, j))) c->bad |= bit;
  }
  if (c->outstanding == 0) WriteSettled(c);
  else if (!c->acked && lay_.ack == AckPolicy::kFirstK && std::popcount(c->good) >= lay_.k) {
    AckWrite(c, Status::Ok());
  }
}

void SplitLayout::OnWriteSplit(Ctx* c, int split, uint32_t server, const Status& st) {
  const uint64_t bit = 1ull << split;
  if (c->kind != Ctx::Kind::kWrite) {  // A repair or regeneration write.
    io_.RepairWritten(c, st);
    return;
  }
  if (st.ok()) {
    c->good |= bit;
  } else {
    // Re-place: the server is failed (connection loss / timeout) or dropped the slab.
    Slab& s = io_.slabs_[c->slab];
    if (IsConnectionError(st)) io_.ServerError(server, st);
    if (s.server[split].load(std::memory_order_relaxed) != server) {
      // Moved to a replacement meanwhile: store it there.
      if (!io_.PostOrPark(c, split, WriteBuf(c, split))) c->bad |= bit;
    } else if (IsConnectionError(st) && server != kNoServer && !store_->failed_[server].load()) {
      // Its connection went (being reconnected) or it is not answering: wait for it to be
      // reachable again or to be failed (then the split is re-placed), not for nothing.
      io_.Park(c, split);
    } else if ((c->retried & bit) == 0 && server != kNoServer &&
               !store_->failed_[server].load()) {
      // The server is fine and refused once: retry once.
      c->retried |= bit;
      if (!io_.PostOrPark(c, split, WriteBuf(c, split))) c->bad |= bit;
    } else {
      c->bad |= bit;
    }
  }
  WriteProgress(c);
}

void SplitLayout::WriteProgress(Ctx* c) {
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

void SplitLayout::AckWrite(Ctx* c, Status st) {
  c->acked = true;
  if (!st.ok()) {
    // The page is not readable as written: forget it rather than return wrong bytes.
    Slab& s = io_.slabs_[c->slab];
    if (s.written[c->pidx]) Unwrite(s, c->pidx);
  }
  io_.Complete(c->op, st, c->start_ns);
  c->op = nullptr;
}

void SplitLayout::WriteSettled(Ctx* c) {
  if (!c->acked) {
    const int stored = std::popcount(c->good);
    AckWrite(c, stored >= lay_.k ? Status::Ok()
                                 : Unavailable("page " + std::to_string(c->page) + ": only " +
                                               std::to_string(stored) +
                                               " splits could be stored"));
  }
  c->finished = true;
  io_.unsettled_.fetch_sub(1, std::memory_order_release);
  Slab& s = io_.slabs_[c->slab];
  if (s.written[c->pidx] && std::popcount(c->good) >= lay_.k) {
    // Splits that could not be stored on a server that is not failed (its connection was
    // lost, or it refused): rewritten from the others once it is reachable (RepairStale).
    for (int j = 0; j < lay_.width(); ++j) {
      if (((c->good >> j) & 1) == 0) {
        io_.NoteStale(c->slab, c->pidx, j, s.server[j].load(std::memory_order_relaxed));
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
  io_.MaybeRelease(c);
  if (next != nullptr) StartWrite(next);
}

}  // namespace tessera::client::remote
