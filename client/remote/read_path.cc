// Split layout (and copies) read path: ask k + delta splits (data first, stragglers last),
// verify each against its CRC, finish with the first k good ones (decode when a data split is
// missing), rewrite corrupt splits, or fail with DataLoss naming the page.
#include "client/remote/split_layout.h"

#include <bit>
#include <cstring>

#include "common/logging.h"

namespace tessera::client::remote {

void SplitLayout::StartRead(Ctx* c) {
  Slab& s = io_.slabs_[c->slab];
  if (!s.allocated || !s.written[c->pidx]) {
    std::memset(c->op->buf, 0, kPageSize);
    c->finished = true;
    io_.Complete(c->op, Status::Ok(), c->start_ns);
    c->op = nullptr;
    io_.MaybeRelease(c);
    return;
  }
  if (Ctx* w = s.busy[c->pidx]) {
    while (w->next_write != nullptr) w = w->next_write;
    if (s.trim_after[c->pidx]) {
      std::memset(c->op->buf, 0, kPageSize);  // Trimmed after the write in flight.
    } else {
      std::memcpy(c->op->buf, w->buf, kPageSize);  // Newest data, possibly not yet acked.
    }
    c->finished = true;
    io_.Complete(c->op, Status::Ok(), c->start_ns);
    c->op = nullptr;
    io_.MaybeRelease(c);
    return;
  }
  c->seq = s.seq[c->pidx];
  std::memcpy(c->crcs.data(), &s.crc[static_cast<size_t>(c->pidx) * lay_.width()],
              sizeof(uint32_t) * lay_.width());
  c->asked = c->good = c->bad = c->corrupt = c->late = 0;
  AskMore(c);
}

// Asks splits until good + outstanding reaches k + delta (or nothing is left to ask), preferring
// data splits, then splits whose regeneration has passed this page. Finishes with DataLoss when
// fewer than k can still arrive.
void SplitLayout::AskMore(Ctx* c) {
  Slab& s = io_.slabs_[c->slab];
  const int want = (c->finished ? 0 : lay_.k + (c->bad == 0 ? lay_.delta : 0));
  // Overdue requests (Rehedge) are not counted on: their members are replaced by others.
  int have = std::popcount(c->good) + c->outstanding -
             std::popcount(c->late & ~(c->good | c->bad));
  // Pass 0: settled splits on servers that answer normally (data splits first, so an
  // undisturbed read needs no decode); pass 1: settled splits on servers currently much slower
  // than the others (a straggler is asked only when the others do not suffice); pass 2: splits
  // whose regeneration has not reached this page yet; passes 3 and 4: splits on servers at
  // their cap of outstanding requests, then on silent or suspect servers (see AskPass()), and
  // only while fewer than k could arrive without them: never for the extra delta splits (a
  // request there would hold buffers until the server fails).
  for (int pass = 0; pass < IoThread::kAskPasses; ++pass) {
    const int limit = pass >= IoThread::kLeftOutPass ? std::min(want, lay_.k) : want;
    for (int j = 0; j < lay_.width() && have < limit; ++j) {
      const uint64_t bit = 1ull << j;
      if ((c->asked & bit) != 0) continue;
      if (c->regen_split == j) continue;
      const uint32_t server = s.server[j].load(std::memory_order_relaxed);
      const bool settled = s.regen_cursor[j] > c->pidx;
      int ask_pass = io_.AskPass(server, settled);
      // A split a direct read found corrupt may be on a slow server: ask it in its usual turn.
      if (c->verify && ask_pass == 1) ask_pass = 0;
      if (pass != ask_pass) continue;
      c->asked |= bit;
      if (io_.Post(c, j, fabric::OpKind::kRead, io_.SplitBuf(c, j))) {
        ++have;
      } else {
        c->bad |= bit;
        if (io_.Reaskable(s, j)) c->reask |= bit;  // Its connection is down, or no slot now.
      }
    }
  }
  if (have >= lay_.k || c->finished) return;
  if (c->reask != 0 && io_.MayPark(c)) {
    // Splits on live servers wait for their connection: not lost. Asked again as soon as it
    // is back, even while requests to a silent server are still out.
    io_.ParkRead(c);
    return;
  }
  if (c->outstanding > 0) return;  // Wait: more may arrive (they count toward k).
  if (s.seq[c->pidx] != c->seq || s.busy[c->pidx] != nullptr) {
    if (c->kind == Ctx::Kind::kRead) {  // A write raced with us: start over.
      StartRead(c);
      return;
    }
  }
  FinishRead(c, DataLoss("page " + std::to_string(c->page) + ": only " +
                         std::to_string(std::popcount(c->good)) + " of the " +
                         std::to_string(lay_.width()) + " splits are readable and intact (" +
                         std::to_string(lay_.k) + " needed); the page's data is lost"));
}

void SplitLayout::OnReadSplit(Ctx* c, int split, const Status& st) {
  const uint64_t bit = 1ull << split;
  if (c->finished) return;
  if (!st.ok()) {
    c->bad |= bit;
    io_.NoteLostRead(c, split, st);
  } else {
    uint32_t crc = coding::Crc32c(io_.SplitBuf(c, split), lay_.split);
    if (crc == c->crcs[split]) {
      c->good |= bit;
    } else {
      c->bad |= bit;
      Slab& s = io_.slabs_[c->slab];
      if (s.regen_cursor[split] > c->pidx && s.seq[c->pidx] == c->seq) {
        c->corrupt |= bit;
        store_->stats_.corruptions_detected.fetch_add(1, std::memory_order_relaxed);
      }
    }
  }
  if (std::popcount(c->good) >= lay_.k) {
    FinishRead(c, Status::Ok());
    return;
  }
  AskMore(c);
}

void SplitLayout::FinishRead(Ctx* c, Status st) {
  c->finished = true;
  if (st.ok()) io_.NoteLateRequests(c);
  Slab& s = io_.slabs_[c->slab];
  uint8_t page[kPageSize];
  uint8_t* out = c->kind == Ctx::Kind::kRead ? c->op->buf : page;
  if (st.ok()) {
    if (lay_.copies) {
      std::memcpy(out, io_.SplitBuf(c, std::countr_zero(c->good)), kPageSize);
    } else {
      const uint64_t data_mask = (1ull << lay_.k) - 1;
      if ((c->good & data_mask) == data_mask) {
        std::memcpy(out, c->buf, kPageSize);
      } else {
        const uint8_t* splits[kMaxWidth];
        for (int j = 0; j < lay_.width(); ++j) splits[j] = io_.SplitBuf(c, j);
        auto info = store_->codec_->ReconstructTrusted(splits, c->good, out);
        if (!info.ok()) {
          st = info.status();
        } else {
          store_->stats_.decodes.fetch_add(1, std::memory_order_relaxed);
        }
      }
    }
    const uint64_t preferred = lay_.copies ? 1 : (1ull << lay_.k) - 1;
    if (c->kind == Ctx::Kind::kRead && (c->good & preferred) != preferred) {
      store_->stats_.degraded_reads.fetch_add(1, std::memory_order_relaxed);
    }
  } else if (st.code() == StatusCode::kDataLoss) {
    store_->stats_.data_loss.fetch_add(c->kind == Ctx::Kind::kRead ? 1 : 0);
  }
  // Splits to rewrite: corrupt ones (read) or the regenerated one; only if no write raced.
  uint64_t rewrite = c->kind == Ctx::Kind::kRegen ? (1ull << c->regen_split) : c->corrupt;
  if (!st.ok() || s.seq[c->pidx] != c->seq || s.busy[c->pidx] != nullptr) rewrite = 0;
  if (c->kind == Ctx::Kind::kRead) {
    if (rewrite != 0) {
      // The caller owns (and may free or reuse) op->buf once done() ran: the repair below
      // works from a copy (an NBD READ's buffer is freed as soon as its reply is sent).
      std::memcpy(page, out, kPageSize);
      out = page;
    }
    io_.Complete(c->op, st, c->start_ns);
    c->op = nullptr;
  } else {
    --io_.regen_inflight_;
    if (!st.ok()) {
      const uint64_t failures = ++io_.regen_failures_;
      if ((failures & (failures - 1)) == 0) {  // Log at 1, 2, 4, ... failures.
        TLOG(WARNING) << store_->name_ << ": cannot regenerate page " << c->page << ": " << st
                      << " (" << failures << " pages so far on this thread)";
      }
    }
    store_->stats_.regenerations_pending.fetch_sub(1, std::memory_order_relaxed);
  }
  if (rewrite != 0) {
    // Rebuild the full split set from the page into the ctx buffer, then write the chosen ones.
    // Requests still in flight target the ctx buffer, so wait for them: only the splits being
    // rewritten are touched and they are not in flight (they completed, wrongly).
    if (lay_.copies) {
      for (int j = 0; j < lay_.width(); ++j) {
        if (rewrite & (1ull << j)) std::memcpy(io_.SplitBuf(c, j), out, kPageSize);
      }
    } else {
      for (int j = 0; j < lay_.k; ++j) {
        if (rewrite & (1ull << j)) {
          std::memcpy(io_.SplitBuf(c, j), out + j * lay_.split, lay_.split);
        }
      }
      if (rewrite >> lay_.k) {
        uint8_t parity_buf[coding::kMaxParitySplits][kPageSize];
        uint8_t* parity[coding::kMaxParitySplits];
        for (int j = 0; j < lay_.r; ++j) parity[j] = parity_buf[j];
        store_->codec_->Encode(out, parity);
        for (int j = 0; j < lay_.r; ++j) {
          if (rewrite & (1ull << (lay_.k + j))) {
            std::memcpy(io_.SplitBuf(c, lay_.k + j), parity[j], lay_.split);
          }
        }
      }
    }
    c->repairing = true;
    c->asked = rewrite;
    c->good = 0;
    for (int j = 0; j < lay_.width(); ++j) {
      if ((rewrite & (1ull << j)) && !io_.Post(c, j, fabric::OpKind::kWrite, io_.SplitBuf(c, j))) {
        c->asked &= ~(1ull << j);
      }
    }
  }
  io_.MaybeRelease(c);
}

}  // namespace tessera::client::remote
