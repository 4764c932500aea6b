// Group layout (EC-Batch) write path: the stripe buffer, stripe writes, garbage and
// compaction, and group trims.
//
// A write copies the page into the stripe buffer (gbuf_); the page's old slot, if any, becomes
// garbage at once (its newest data is in memory from now on and reads are served from there).
// When the buffer holds k pages, or its oldest page has waited fill_us, or Flush() asks, the
// buffer is sealed: a free row becomes the stripe, parity is encoded across the k pages (missing
// pages are padding: zeros that are neither sent nor read), and the k+r members are posted to
// the k+r servers of the slab. When the stripe settles, the pages whose newest data it holds
// point at it and their writes are acknowledged (AckPolicy::kFirstK: once any k members are
// stored). A row whose pages all died (rewritten or trimmed) is free again; a slab whose rows
// are all free is given back. Compaction re-stripes the live pages of the stripes with the most
// garbage (read, then buffered like a write) whenever the used data slots exceed
// max_garbage_factor x the live pages (+ two stripes). New slabs are allocated off the I/O
// thread, one ahead of need (see GroupLayout::StartAllocation); while the buffer waits for one
// (a whole slab filled up while its ALLOC was out), writes wait behind it (held_).
#include <algorithm>
#include <bit>
#include <cstring>

#include "client/remote/group_layout.h"
#include "coding/codec.h"
#include "common/logging.h"

namespace tessera::client::remote {

void GroupLayout::StartWrite(PageOp* op, uint64_t start_ns) {
  BufferPage(op->page, op->buf, op, start_ns);
}

void GroupLayout::BufferPage(PageId page, const uint8_t* data, PageOp* op, uint64_t start_ns) {
  PageLoc& L = gloc_[LocalIndex(page)];
  if (L.where == PageLoc::Where::kBuffered && gbuf_[L.row].seq == L.seq) {
    // Rewritten before its stripe was sealed: replace the buffered copy.
    std::memcpy(gbuf_data_.data() + static_cast<size_t>(L.row) * kPageSize, data, kPageSize);
    ++L.seq;
    gbuf_[L.row].seq = L.seq;
    if (op != nullptr) gbuf_ops_.emplace_back(op, start_ns);
    return;
  }
  Kill(page);  // Its stored slot (if any) is garbage now.
  const uint32_t slot = static_cast<uint32_t>(gbuf_.size());
  std::memcpy(gbuf_data_.data() + static_cast<size_t>(slot) * kPageSize, data, kPageSize);
  ++L.seq;
  L.where = PageLoc::Where::kBuffered;
  L.row = slot;
  L.writing = nullptr;
  gbuf_.push_back(Buffered{page, L.seq, op == nullptr});
  PublishPage(page);  // Not directly readable while its newest data is in memory.
  if (op != nullptr) {
    gbuf_ops_.emplace_back(op, start_ns);
  } else {
    ++gbuf_moves_;
  }
  io_.unsettled_.fetch_add(1, std::memory_order_relaxed);
  if (gbuf_.size() == 1) gbuf_since_ns_ = io_.now_ns_;
  // Seal once k pages wait, or as many as the open stripe has reclaimed slots for (so they are
  // filled in place rather than left for a new row).
  size_t seal_at = static_cast<size_t>(lay_.k);
  if (open_slab_ == kNoSlot && !reclaim_ready_.empty()) (void)InstallReclaimed();
  if (open_reclaimed_ != 0 && open_slab_ != kNoSlot) {
    const int f = std::popcount(OpenFree(io_.slabs_[open_slab_].stripes[open_row_]));
    if (f > 0) seal_at = std::min(seal_at, static_cast<size_t>(f));
  }
  // (Sealing early only pays if the open stripe takes the pages now; else wait for k.)
  if (gbuf_.size() >= static_cast<size_t>(lay_.k) ||
      (gbuf_.size() >= seal_at && OpenStripe(static_cast<int>(gbuf_.size())) != nullptr)) {
    (void)Seal(/*all=*/false);
  }
}

void GroupLayout::Kill(PageId page) {
  PageLoc& L = gloc_[LocalIndex(page)];
  if (L.where != PageLoc::Where::kStored) return;
  Slab& s = io_.slabs_[L.slab];
  Stripe& st = s.stripes[L.row];
  st.page[L.col] = kNoPage;
  --st.live;
  --glive_;
  store_->stats_.stored_pages.fetch_sub(1, std::memory_order_relaxed);
  L.where = PageLoc::Where::kNone;
  L.moving = false;
  MaybeReleaseStripe(L.slab, L.row);
}

void GroupLayout::MaybeReleaseStripe(uint32_t slab, uint32_t row) {
  Slab& s = io_.slabs_[slab];
  Stripe& st = s.stripes[row];
  if (st.state != Stripe::State::kSealed || st.live > 0 || st.refs > 0) return;
  st.state = Stripe::State::kFree;
  if (open_slab_ == slab && open_row_ == row) CloseOpenStripe();
  --s.stripes_used;
  gused_ -= static_cast<uint64_t>(lay_.k);
  // Members of a free row need no regeneration.
  for (int j = 0; j < lay_.width(); ++j) {
    if (s.regen_cursor[j] <= row) {
      store_->stats_.regenerations_pending.fetch_sub((st.zero >> j) & 1 ? 0 : 1,
                                                     std::memory_order_relaxed);
    }
  }
  st.zero = 0;
  st.rebuilding = 0;
  if (s.stripes_used == 0) {
    // Give an empty slab back when a trim asked for it or when the other slabs keep a slab's
    // worth of free rows without it (the spare MaybeAllocateAhead keeps: so a steady write load
    // does not allocate and free in turn).
    if (SpareRows(&s) >= gslab_rows_) s.free_wanted = true;
    io_.MaybeFreeSlab(s);  // Once no op context uses it (else when the last one is released).
  }
}

int GroupLayout::Missing(const Slab& s) const {
  int n = 0;
  for (int j = 0; j < lay_.width(); ++j) {
    const uint32_t server = s.server[j].load(std::memory_order_relaxed);
    n += server == kNoServer || s.remote[j] == 0 || io_.local_failed_[server] ||
                 store_->failed_[server].load()
             ? 1
             : 0;
  }
  return n;
}

uint64_t GroupLayout::SpareRows(const Slab* except) const {
  uint64_t rows = 0;
  for (const Slab& s : io_.UsedSlabs()) {
    if (!s.allocated || s.draining || &s == except || Missing(s) > lay_.r) continue;
    rows += gslab_rows_ - s.stripes_used;
  }
  return rows;
}

bool GroupLayout::StartAllocation(uint64_t now, bool needed) {
  if (!io_.allocs_.empty() || io_.stop_.load(std::memory_order_relaxed)) return false;
  if (!needed && now < alloc_retry_ns_) return false;
  for (Slab& s : io_.slabs_) {
    if (s.allocated) continue;
    io_.BeginAllocate(s);  // SlabReady() when it ends (maybe at once).
    return true;
  }
  return false;  // The slab table is full (compaction keeps it from filling up).
}

void GroupLayout::MaybeAllocateAhead(uint64_t now) {
  if (!io_.allocs_.empty() || HoldsNothing()) return;
  if (SpareRows(nullptr) < gslab_rows_) (void)StartAllocation(now, /*needed=*/false);
}

void GroupLayout::MaybeFreeSpare() {
  if (!HoldsNothing()) return;
  for (Slab& s : io_.UsedSlabs()) {
    if (!s.allocated || s.stripes_used != 0) continue;
    s.free_wanted = true;
    io_.MaybeFreeSlab(s);
  }
}

void GroupLayout::SlabReady(uint32_t /*slab*/, const Status& st) {
  const uint64_t now = MonotonicNs();
  auto back_off = [&] {
    alloc_backoff_ns_ = std::clamp<uint64_t>(2 * alloc_backoff_ns_, 200'000'000, 5'000'000'000);
    alloc_retry_ns_ = now + alloc_backoff_ns_;
  };
  if (st.ok()) {
    alloc_backoff_ns_ = 0;
    alloc_retry_ns_ = 0;
    alloc_failure_ = Status::Ok();
    MaybeFreeSpare();  // A trim emptied this thread while the slab was being allocated.
  } else {
    alloc_failure_ = st;
    back_off();
    // The buffer that waited for it stores its pages elsewhere or fails them (FreeRow), rather
    // than wait for allocation after allocation.
    if (waiting_alloc_) fail_next_seal_ = true;
    if (st.code() != StatusCode::kCancelled && LogThisOne(++alloc_failures_)) {
      TLOG(WARNING) << store_->name_ << ": cannot allocate a stripe slab: " << st << " ("
                    << alloc_failures_ << " so far on this thread)";
    }
  }
  if (waiting_alloc_) {
    // The stripe buffer waited for it: seal at the next housekeeping (not from here: this may
    // run inside Seal, through BeginAllocate).
    waiting_alloc_ = false;
    io_.seal_wanted_.store(true, std::memory_order_relaxed);
  }
}

bool GroupLayout::FreeRow(uint32_t* slab, uint32_t* row, Status* why, bool* wait) {
  // Members of a slab on failed servers (no replacement was found): stripes there are stored
  // with fewer members, so new stripes go to healthy slabs first.
  // Fill the fullest healthy slab first (so emptier ones drain and can be given back).
  auto pick = [&](int max_missing) {
    int best = -1;
    for (size_t i = 0; i < io_.UsedSlabs().size(); ++i) {
      const Slab& s = io_.slabs_[i];
      if (!s.allocated || s.draining || s.stripes_used >= gslab_rows_) continue;
      if (Missing(s) > max_missing) continue;
      if (best < 0 || s.stripes_used > io_.slabs_[best].stripes_used) best = static_cast<int>(i);
    }
    return best;
  };
  int best = pick(0);
  if (best < 0) best = pick(lay_.r);  // Degraded: still at least k members.
  // No row at all: the slab allocated ahead is late (its ALLOCs are out; or a failure took the
  // spare). Wait for it, or allocate one now -- unless the last allocation, which the buffer
  // waited for, failed: then fail the buffered writes (below) rather than wait for another.
  const bool may_allocate = !fail_next_seal_;
  fail_next_seal_ = false;
  if (best < 0 && may_allocate) (void)StartAllocation(io_.now_ns_, /*needed=*/true);
  if (best < 0 && !io_.allocs_.empty()) {
    *wait = true;
    return false;
  }
  if (best < 0) {
    // Out of slabs: stop draining one rather than fail.
    for (size_t i = 0; i < io_.UsedSlabs().size() && best < 0; ++i) {
      Slab& s = io_.slabs_[i];
      if (s.allocated && s.draining && s.stripes_used < gslab_rows_ && Missing(s) <= lay_.r) {
        s.draining = false;
        s.free_wanted = false;
        best = static_cast<int>(i);
      }
    }
  }
  if (best < 0) {
    *why = !alloc_failure_.ok()
               ? alloc_failure_
               : ResourceExhausted("group layout: no stripe slot of this I/O thread is free on " +
                                   std::to_string(lay_.k + 1) +
                                   " or more live servers; compaction has not caught up");
    return false;
  }
  Slab& s = io_.slabs_[best];
  for (uint32_t n = 0; n < gslab_rows_; ++n) {
    const uint32_t r = (s.row_cursor + n) % gslab_rows_;
    if (s.stripes[r].state == Stripe::State::kFree) {
      s.row_cursor = (r + 1) % gslab_rows_;
      *slab = static_cast<uint32_t>(best);
      *row = r;
      return true;
    }
  }
  *why = Internal("slab row count out of step");
  return false;
}

bool GroupLayout::Seal(bool all) {
  while (!gbuf_.empty()) {
    if (io_.free_ctx_ == nullptr) return false;
    // Pages trimmed (or rewritten into a later buffer) since they were buffered are dropped.
    int n = 0;
    for (const Buffered& b : gbuf_) n += gloc_[LocalIndex(b.page)].seq == b.seq ? 1 : 0;
    if (n > 0) {
      // In-place compaction fills reclaimed slots a few at a time: the open stripe may take part
      // of the buffer. Re-striping fills padding only with the whole buffer.
      const bool partial = lay_.g.compaction == GroupCompaction::kInPlace;
      if (Stripe* open = OpenStripe(partial ? 1 : n)) {
        const bool whole = std::popcount(OpenFree(*open)) >= n;
        Extend(*open);
        if (whole || !all) return true;
        continue;  // The rest: the next reclaimed stripe, or a new one.
      }
    }
    uint32_t slab = 0, row = 0;
    Status why;
    bool wait = false;
    if (n > 0 && !FreeRow(&slab, &row, &why, &wait)) {
      if (wait) {
        // A slab is being allocated (off this thread): the buffered pages wait for it (writes
        // coming meanwhile wait in held_ once the buffer is full; reads go on).
        waiting_alloc_ = true;
        return false;
      }
      // No stripe space: fail the buffered writes (their pages become never-written) rather than
      // block the thread; logged at 1, 2, 4, ...
      if (LogThisOne(++out_of_space_)) {
        TLOG(WARNING) << store_->name_ << ": cannot seal a stripe: " << why << " (" << out_of_space_
                      << " so far on this thread)";
      }
      for (const Buffered& b : gbuf_) {
        PageLoc& L = gloc_[LocalIndex(b.page)];
        if (L.seq == b.seq) {
          L.where = PageLoc::Where::kNone;
          ++L.seq;
          PublishPage(b.page);
        }
      }
      for (auto& [op, start] : gbuf_ops_) {
        io_.Complete(op, Unavailable("page " + std::to_string(op->page) + ": " + why.ToString()),
                     start);
      }
      compact_inflight_ -= std::min(compact_inflight_, gbuf_moves_);
      io_.unsettled_.fetch_sub(gbuf_.size(), std::memory_order_relaxed);
      gbuf_.clear();
      gbuf_ops_.clear();
      gbuf_moves_ = 0;
      return true;
    }
    Ctx* c = io_.NewCtx();
    const size_t ci = static_cast<size_t>(c - io_.ctxs_.data());
    c->kind = Ctx::Kind::kStripe;
    c->start_ns = io_.now_ns_;
    stripe_ops_[ci].swap(gbuf_ops_);
    gbuf_ops_.clear();
    stripe_moves_[ci] = gbuf_moves_;
    const uint64_t settle_count = gbuf_.size();
    if (n == 0) {
      // Everything buffered died: nothing to store, acknowledge the writes.
      c->finished = true;
      c->pidx = 0;
      c->seq = static_cast<uint32_t>(settle_count);
      c->asked = c->good = 0;
      c->zero = 0;
      c->slab = kNoSlot;
      gbuf_.clear();
      gbuf_moves_ = 0;
      StripeSettled(c);
      return true;
    }
    io_.Attach(c, slab);
    c->pidx = row;
    Slab& s = io_.slabs_[slab];
    Stripe& st = s.stripes[row];
    st.state = Stripe::State::kWriting;
    st.live = 0;
    st.rebuilding = 0;
    ++st.gen;
    ++s.stripes_used;
    gused_ += static_cast<uint64_t>(lay_.k);
    int m = 0;
    for (const Buffered& b : gbuf_) {
      PageLoc& L = gloc_[LocalIndex(b.page)];
      if (L.seq != b.seq) continue;
      std::memcpy(io_.SplitBuf(c, m), gbuf_data_.data() + static_cast<size_t>(L.row) * kPageSize,
                  kPageSize);
      st.page[m] = b.page;
      stripe_seq_[ci][m] = b.seq;
      L.where = PageLoc::Where::kWriting;
      L.writing = c;
      L.col = static_cast<uint8_t>(m);
      ++m;
    }
    c->zero = 0;
    for (int j = m; j < lay_.k; ++j) {
      st.page[j] = kNoPage;
      std::memset(io_.SplitBuf(c, j), 0, kPageSize);
      c->zero |= 1ull << j;
    }
    st.zero = c->zero;
    store_->stats_.padding_slots.fetch_add(static_cast<uint64_t>(lay_.k - m),
                                           std::memory_order_relaxed);
    const uint8_t* data[coding::kMaxDataSplits];
    uint8_t* parity[coding::kMaxParitySplits];
    for (int j = 0; j < lay_.k; ++j) data[j] = io_.SplitBuf(c, j);
    for (int j = 0; j < lay_.r; ++j) parity[j] = io_.SplitBuf(c, lay_.k + j);
    store_->stripe_codec_->Encode(data, parity, kPageSize);
    for (int j = 0; j < lay_.width(); ++j) {
      st.crc[j] = (c->zero >> j) & 1 ? 0 : coding::Crc32c(io_.SplitBuf(c, j), kPageSize);
    }
    c->crcs = st.crc;
    c->seq = static_cast<uint32_t>(settle_count);  // Given back to unsettled_ when it settles.
    gbuf_.clear();
    gbuf_moves_ = 0;
    store_->stats_.stripes_written.fetch_add(1, std::memory_order_relaxed);
    const uint64_t all = (lay_.width() == 64 ? ~0ull : (1ull << lay_.width()) - 1);
    c->asked = all & ~c->zero;
    c->good = c->bad = 0;
    PostAsked(c);
    MaybeAllocateAhead(io_.now_ns_);  // The row taken may leave less than a spare slab's worth.
    return true;
  }
  return true;
}

Stripe* GroupLayout::OpenStripe(int n) {
  if (io_.free_ctx_ == nullptr) return nullptr;
  if (open_slab_ == kNoSlot && !InstallReclaimed()) return nullptr;
  Slab& s = io_.slabs_[open_slab_];
  Stripe& st = s.stripes[open_row_];
  const uint64_t data_mask = (1ull << lay_.k) - 1;
  (void)data_mask;
  if (!s.allocated || s.draining || st.gen != open_gen_ || st.state != Stripe::State::kSealed ||
      OpenFree(st) == 0) {
    CloseOpenStripe();
    if (!InstallReclaimed()) return nullptr;
    return OpenStripe(n);  // The reclaimed stripe just installed.
  }
  // Reads in flight on the stripe use its CRCs and padding as they were: wait for them.
  if (st.refs > 0 || st.rebuilding != 0 || std::popcount(OpenFree(st)) < n) {
    return nullptr;
  }
  for (int j = 0; j < lay_.width(); ++j) {
    const uint32_t server = s.server[j].load(std::memory_order_relaxed);
    if (server == kNoServer || io_.local_failed_[server] || store_->failed_[server].load() ||
        s.regen_cursor[j] <= open_row_) {
      CloseOpenStripe();  // Being rebuilt: no in-place update.
      return nullptr;
    }
  }
  return &st;
}

// Fills free slots of the open stripe with the buffered pages: padding, or garbage slots a
// reclaim took out of the kept parity (open_reclaimed_). Either way the kept parity counts the
// slot as zeros, so the update is parity_j ^= coef(j, slot) * page (ec_encode_data_update);
// then the new pages and the r parity pages are written in place (n + r writes, no new row).
// Until they settle, the stripe's CRCs and padding mask are the old ones and its parity members
// count as being rebuilt (a read decodes with the old, consistent state -- reclaimed slots
// still as the data they hold -- and never takes a half-updated member for a good one). When
// it settles, reclaimed slots not filled become padding: the new parity no longer covers them.
void GroupLayout::Extend(Stripe& st) {
  Ctx* c = io_.NewCtx();
  const size_t ci = static_cast<size_t>(c - io_.ctxs_.data());
  c->kind = Ctx::Kind::kStripe;
  c->extend = true;
  extending_.push_back(c);
  c->start_ns = io_.now_ns_;
  io_.Attach(c, open_slab_);
  c->pidx = open_row_;
  st.state = Stripe::State::kWriting;
  uint8_t* parity[coding::kMaxParitySplits];
  for (int j = 0; j < lay_.r; ++j) {
    parity[j] = io_.SplitBuf(c, lay_.k + j);
    std::memcpy(parity[j], open_parity_.data() + static_cast<size_t>(j) * kPageSize, kPageSize);
  }
  const uint64_t free_mask = OpenFree(st);
  uint64_t free_slots = free_mask;
  uint64_t chosen = 0;
  std::vector<size_t> keep;  // Live buffered pages that do not fit: they stay buffered.
  uint32_t moves = 0;        // Compaction moves among the pages this stripe takes.
  for (size_t i = 0; i < gbuf_.size(); ++i) {
    const Buffered& b = gbuf_[i];
    PageLoc& L = gloc_[LocalIndex(b.page)];
    if (L.seq != b.seq) {
      moves += b.move ? 1 : 0;  // Dead: settles with this stripe.
      continue;
    }
    if (free_slots == 0) {
      keep.push_back(i);
      continue;
    }
    moves += b.move ? 1 : 0;
    const int j = std::countr_zero(free_slots);
    free_slots &= free_slots - 1;
    chosen |= 1ull << j;
    std::memcpy(io_.SplitBuf(c, j), gbuf_data_.data() + static_cast<size_t>(L.row) * kPageSize,
                kPageSize);
    store_->stripe_codec_->UpdateParity(j, io_.SplitBuf(c, j), parity, kPageSize);
    st.page[j] = b.page;
    stripe_seq_[ci][j] = b.seq;
    L.where = PageLoc::Where::kWriting;
    L.writing = c;
    L.col = static_cast<uint8_t>(j);
  }
  const uint64_t pmask = ((1ull << lay_.r) - 1) << lay_.k;
  c->zero = (st.zero | free_mask) & ~chosen;
  c->crcs = st.crc;
  for (int j = 0; j < lay_.width(); ++j) {
    if (((chosen | pmask) >> j) & 1) c->crcs[j] = coding::Crc32c(io_.SplitBuf(c, j), kPageSize);
  }
  st.rebuilding |= pmask;
  // The user writes of the pages taken (and of dead ones) settle with this stripe; those of the
  // pages kept stay with the buffer, which is compacted to its front.
  c->seq = static_cast<uint32_t>(gbuf_.size() - keep.size());
  stripe_moves_[ci] = moves;
  gbuf_moves_ -= std::min(gbuf_moves_, moves);
  if (keep.empty()) {
    stripe_ops_[ci].swap(gbuf_ops_);
    gbuf_ops_.clear();
    gbuf_.clear();
  } else {
    std::vector<PageId> kept_pages;
    for (size_t i : keep) kept_pages.push_back(gbuf_[i].page);
    std::vector<std::pair<PageOp*, uint64_t>> stay;
    stripe_ops_[ci].clear();
    for (auto& e : gbuf_ops_) {
      const bool kept =
          std::find(kept_pages.begin(), kept_pages.end(), e.first->page) != kept_pages.end();
      (kept ? stay : stripe_ops_[ci]).push_back(e);
    }
    gbuf_ops_.swap(stay);
    std::vector<Buffered> rest;
    for (size_t i : keep) {
      const Buffered& b = gbuf_[i];
      PageLoc& L = gloc_[LocalIndex(b.page)];
      const uint32_t slot = static_cast<uint32_t>(rest.size());
      if (L.row != slot) {
        std::memmove(gbuf_data_.data() + static_cast<size_t>(slot) * kPageSize,
                     gbuf_data_.data() + static_cast<size_t>(L.row) * kPageSize, kPageSize);
        L.row = slot;
      }
      rest.push_back(b);
    }
    gbuf_.swap(rest);
  }
  store_->stats_.parity_updates.fetch_add(1, std::memory_order_relaxed);
  const uint64_t all = (lay_.width() == 64 ? ~0ull : (1ull << lay_.width()) - 1);
  c->asked = chosen | pmask;
  c->good = all & ~c->zero & ~c->asked;  // The members left as they are.
  open_reclaimed_ = 0;  // The stripe is being written: GroupOpenStripe() refuses it meanwhile.
  c->bad = 0;
  PostAsked(c);
}

void GroupLayout::PostAsked(Ctx* c) {
  for (int j = 0; j < lay_.width(); ++j) {
    const uint64_t bit = 1ull << j;
    if ((c->asked & bit) == 0) continue;
    // A member whose server failed is re-placed first; one whose server cannot take it now
    // waits (PostOrPark).
    if (!io_.PostOrPark(c, j, io_.SplitBuf(c, j))) c->bad |= bit;
  }
  if (c->outstanding == 0) StripeSettled(c);
}

void GroupLayout::OnStripeWrite(Ctx* c, int member, uint32_t server, const Status& st) {
  const uint64_t bit = 1ull << member;
  Slab& slab = io_.slabs_[c->slab];
  if (st.ok() && slab.server[member].load(std::memory_order_relaxed) != server &&
      (c->retried & bit) == 0) {
    // Stored on a server the member has since moved away from (failure or eviction notice
    // while in flight): store it at the replacement too, or it would be missing there.
    c->retried |= bit;
    if (io_.Post(c, member, fabric::OpKind::kWrite, io_.SplitBuf(c, member))) return;
    c->bad |= bit;
  } else if (st.ok()) {
    c->good |= bit;
  } else {
    Slab& s = slab;
    if (IsConnectionError(st)) io_.ServerError(server, st);
    if (s.server[member].load(std::memory_order_relaxed) != server) {
      if (!io_.PostOrPark(c, member, io_.SplitBuf(c, member)))
        c->bad |= bit;  // At the replacement.
    } else if (IsConnectionError(st) && server != kNoServer && !store_->failed_[server].load()) {
      io_.Park(c, member);  // Until it is reachable again or failed (then re-placed).
    } else if ((c->retried & bit) == 0 && server != kNoServer &&
               !store_->failed_[server].load()) {
      c->retried |= bit;  // Refused once: retry once.
      if (!io_.PostOrPark(c, member, io_.SplitBuf(c, member))) c->bad |= bit;
    } else {
      c->bad |= bit;
    }
  }
  StripeProgress(c);
}

void GroupLayout::StripeProgress(Ctx* c) {
  const int stored = std::popcount(c->good | c->zero);
  if (!c->acked && lay_.ack == AckPolicy::kFirstK && stored >= lay_.k) {
    // Readable now (any k members rebuild every page): acknowledge, settle later.
    c->acked = true;
    const size_t ci = static_cast<size_t>(c - io_.ctxs_.data());
    for (auto& [op, start] : stripe_ops_[ci]) io_.Complete(op, Status::Ok(), start);
    stripe_ops_[ci].clear();
  }
  if (c->outstanding == 0) StripeSettled(c);
}

void GroupLayout::StripeSettled(Ctx* c) {
  extending_.erase(std::remove(extending_.begin(), extending_.end(), c), extending_.end());
  const size_t ci = static_cast<size_t>(c - io_.ctxs_.data());
  const bool stored_ok = c->slab == kNoSlot || std::popcount(c->good | c->zero) >= lay_.k;
  Status fail;
  if (!stored_ok) {
    fail = Unavailable("only " + std::to_string(std::popcount(c->good)) + " of " +
                       std::to_string(lay_.width() - std::popcount(c->zero)) +
                       " stripe members could be stored");
  }
  if (c->slab != kNoSlot) {
    Slab& s = io_.slabs_[c->slab];
    Stripe& st = s.stripes[c->pidx];
    st.state = Stripe::State::kSealed;
    if (stored_ok) {
      // Members that could not be stored on a server that is not failed: rebuilt from the
      // rest of the stripe once it is reachable (RepairStale).
      const uint64_t missing = c->asked & ~c->good & ~c->zero;
      for (int j = 0; j < lay_.width(); ++j) {
        if (((missing >> j) & 1) && s.remote[j] != 0) {
          io_.NoteStale(c->slab, c->pidx, j, s.server[j].load(std::memory_order_relaxed));
        }
      }
    }
    const uint64_t pmask = ((1ull << lay_.r) - 1) << lay_.k;
    if (c->extend) {
      // The new state (even if a write failed: a member whose write may or may not have landed
      // must not match its old CRC, so it reads as an erasure, never as stale parity).
      for (int j = 0; j < lay_.width(); ++j) {
        if ((c->asked >> j) & 1) st.crc[j] = c->crcs[j];
      }
      st.zero = c->zero;
      st.rebuilding &= ~pmask;
    }
    const bool all_stored = (c->good & c->asked) == c->asked;
    const uint64_t data_mask = (1ull << lay_.k) - 1;
    const bool keep_reclaimed = open_reclaimed_ != 0 && open_slab_ != kNoSlot &&
                                !(open_slab_ == c->slab && open_row_ == c->pidx);
    if (all_stored && stored_ok && (c->zero & data_mask) != 0 && !keep_reclaimed) {
      // Padding left: this is the open stripe now (unless reclaimed garbage slots of another
      // stripe wait to be filled); keep its parity for in-place updates.
      open_reclaimed_ = 0;  // The parity just stored covers every zero slot as zeros.
      open_slab_ = c->slab;
      open_row_ = c->pidx;
      open_gen_ = st.gen;
      for (int j = 0; j < lay_.r; ++j) {
        std::memcpy(open_parity_.data() + static_cast<size_t>(j) * kPageSize,
                    io_.SplitBuf(c, lay_.k + j), kPageSize);
      }
    } else if (open_slab_ == c->slab && open_row_ == c->pidx) {
      CloseOpenStripe();
    }
    for (int m = 0; m < lay_.k; ++m) {
      if (c->extend && ((c->asked >> m) & 1) == 0) continue;  // Pages already there.
      const PageId p = st.page[m];
      if (p == kNoPage) continue;
      PageLoc& L = gloc_[LocalIndex(p)];
      if (L.where == PageLoc::Where::kWriting && L.writing == c && L.seq == stripe_seq_[ci][m]) {
        if (stored_ok) {
          L.where = PageLoc::Where::kStored;
          L.slab = c->slab;
          L.row = c->pidx;
          L.col = static_cast<uint8_t>(m);
          L.writing = nullptr;
          ++st.live;
          ++glive_;
          store_->stats_.stored_pages.fetch_add(1, std::memory_order_relaxed);
          PublishPage(p);
          // A member whose rebuild has not reached this row yet was just written whole.
          continue;
        }
        // Not readable as written: forget the page rather than return wrong bytes.
        L.where = PageLoc::Where::kNone;
        L.writing = nullptr;
        ++L.seq;
        PublishPage(p);
      }
      st.page[m] = kNoPage;  // Rewritten or trimmed meanwhile: garbage from the start.
    }
  }
  if (!c->acked) {
    c->acked = true;
    for (auto& [op, start] : stripe_ops_[ci]) {
      io_.Complete(op,
                   stored_ok
                       ? Status::Ok()
                       : Unavailable("page " + std::to_string(op->page) + ": " + fail.ToString()),
                   start);
    }
    stripe_ops_[ci].clear();
  }
  compact_inflight_ -= std::min(compact_inflight_, stripe_moves_[ci]);
  store_->stats_.compaction_moves.fetch_add(stripe_moves_[ci], std::memory_order_relaxed);
  stripe_moves_[ci] = 0;
  io_.unsettled_.fetch_sub(c->seq, std::memory_order_release);
  c->finished = true;
  const uint32_t slab = c->slab, row = c->pidx;
  const bool had_slab = c->slab != kNoSlot;
  if (!had_slab) c->slab_ref = false;
  io_.MaybeRelease(c);
  if (had_slab) MaybeReleaseStripe(slab, row);
}

// Compaction keeps two bounds.
//  - Garbage: while the used data slots exceed max_garbage_factor x (live + in flight) + two
//    stripes, re-stripe the live pages of the sealed stripes with the most garbage.
//  - Scattered free rows: when the allocated slabs hold more than one slab's worth of free rows,
//    drain the emptiest slab (no new stripes go there; its live pages move) and give it back.
// Each move reads the page (one round trip, degraded if need be) and buffers it like a write;
// its old slot becomes garbage once it is buffered, and a row is free once its last live page
// has moved. At most 64 moves are in flight, and only while op contexts are plentiful.
void GroupLayout::Compact() {
  constexpr uint32_t kMaxMoves = 64;
  // (Not while the stripe buffer waits for a slab: a move needs a row as a write does.)
  if (compact_inflight_ >= kMaxMoves || io_.free_ctx_count_ < 8 || waiting_alloc_) return;
  Stripe* open = open_slab_ == kNoSlot ? nullptr : &io_.slabs_[open_slab_].stripes[open_row_];
  auto move_stripe = [&](Stripe& st) {
    if (&st == open) return;  // Filling up in place; not garbage.
    for (int m = 0; m < lay_.k && compact_inflight_ < kMaxMoves && io_.free_ctx_count_ >= 8; ++m) {
      const PageId p = st.page[m];
      if (p == kNoPage) continue;
      PageLoc& L = gloc_[LocalIndex(p)];
      if (L.where != PageLoc::Where::kStored || L.moving) continue;
      L.moving = true;  // Cleared when the move's read finishes.
      Ctx* c = io_.NewCtx();
      c->kind = Ctx::Kind::kMove;
      c->page = p;
      c->start_ns = io_.now_ns_;
      ++compact_inflight_;
      StartRead(c);
    }
  };
  // Scattered free rows: pick a slab to drain when none is draining, if the other slabs that
  // take stripes have room for its rows and still a slab's worth of free rows (the spare
  // MaybeAllocateAhead keeps) after taking them.
  Slab* draining = nullptr;
  Slab* emptiest = nullptr;
  for (Slab& s : io_.UsedSlabs()) {
    if (!s.allocated) continue;
    if (s.draining) {
      draining = &s;
      continue;
    }
    if (emptiest == nullptr || s.stripes_used < emptiest->stripes_used) emptiest = &s;
  }
  if (draining == nullptr && emptiest != nullptr &&
      SpareRows(emptiest) >= uint64_t{emptiest->stripes_used} + gslab_rows_) {
    draining = emptiest;
    draining->draining = true;
    draining->free_wanted = true;  // Given back once empty.
    if (open_slab_ == static_cast<uint32_t>(draining - io_.slabs_.data())) {
      CloseOpenStripe();
      open = nullptr;
    }
  }
  if (draining != nullptr) {
    // (An empty one, e.g. a spare the others' free rows make surplus, goes back at once: no
    // stripe release is left to give it back.)
    if (draining->stripes_used == 0) io_.MaybeFreeSlab(*draining);
    for (uint32_t row = 0; row < gslab_rows_ && compact_inflight_ < kMaxMoves; ++row) {
      if (!draining->allocated) break;
      Stripe& st = draining->stripes[row];
      if (st.state == Stripe::State::kSealed && st.live > 0) move_stripe(st);
    }
    if (compact_inflight_ > 0) return;
  }
  // Garbage.
  const uint64_t k = static_cast<uint64_t>(lay_.k);
  const uint64_t pending = io_.unsettled_.load(std::memory_order_relaxed);
  const double bound = lay_.g.max_garbage_factor * static_cast<double>(glive_ + pending) + 2.0 * k;
  if (static_cast<double>(gused_) <= bound) return;
  if (lay_.g.compaction == GroupCompaction::kInPlace) {
    // One stripe at a time: reclaim the garbage of the sealed stripe with the most, once the
    // slots reclaimed before are filled. Re-stripe only when no stripe can be reclaimed.
    constexpr size_t kMaxReclaims = 8;  // Read or waiting to be filled.
    if (reclaiming_.size() >= kMaxReclaims) return;
    const uint64_t data_mask = (1ull << lay_.k) - 1;
    struct Candidate {
      int g;
      uint32_t slab, row;
    };
    std::vector<Candidate> candidates;
    for (size_t si = 0; si < io_.UsedSlabs().size(); ++si) {
      Slab& s = io_.slabs_[si];
      if (!s.allocated || s.draining) continue;
      bool healthy = true;
      for (int j = 0; j < lay_.width() && healthy; ++j) {
        const uint32_t server = s.server[j].load(std::memory_order_relaxed);
        healthy =
            server != kNoServer && !io_.local_failed_[server] && !store_->failed_[server].load();
      }
      if (!healthy) continue;
      for (uint32_t row = 0; row < gslab_rows_; ++row) {
        Stripe& st = s.stripes[row];
        if (st.state != Stripe::State::kSealed || st.live == 0 || st.rebuilding != 0) continue;
        if (&st == open) continue;
        const int g = std::popcount(data_mask & ~st.zero) - st.live;
        if (g <= 0) continue;
        bool settled = true;
        for (int j = 0; j < lay_.width() && settled; ++j) settled = s.regen_cursor[j] > row;
        if (!settled) continue;
        const auto key = std::make_pair(static_cast<uint32_t>(si), row);
        if (std::find(reclaiming_.begin(), reclaiming_.end(), key) != reclaiming_.end()) continue;
        candidates.push_back({g, static_cast<uint32_t>(si), row});
      }
    }
    if (!candidates.empty()) {
      // The stripes with the most garbage first.
      const size_t n = std::min(candidates.size(), kMaxReclaims - reclaiming_.size());
      std::partial_sort(candidates.begin(), candidates.begin() + n, candidates.end(),
                        [](const Candidate& a, const Candidate& b) { return a.g > b.g; });
      for (size_t i = 0; i < n && io_.free_ctx_count_ >= 8; ++i) {
        (void)StartReclaim(candidates[i].slab, candidates[i].row);
      }
      return;
    }
  }
  // The sealed stripes with the fewest live pages (most garbage) first, up to the move budget.
  for (int live_limit = 1; live_limit < lay_.k && compact_inflight_ < kMaxMoves; ++live_limit) {
    for (size_t si = 0; si < io_.UsedSlabs().size() && compact_inflight_ < kMaxMoves; ++si) {
      Slab& s = io_.slabs_[si];
      if (!s.allocated) continue;
      for (uint32_t row = 0; row < gslab_rows_ && compact_inflight_ < kMaxMoves; ++row) {
        Stripe& st = s.stripes[row];
        if (st.state != Stripe::State::kSealed || st.live == 0 || st.live > live_limit) continue;
        if (io_.free_ctx_count_ < 8) return;
        move_stripe(st);
      }
    }
    if (compact_inflight_ > 0) return;  // Work started at this level; continue next tick.
  }
}

void GroupLayout::Housekeeping(uint64_t now) {
  if (io_.seal_wanted_.exchange(false, std::memory_order_acq_rel) ||
      (!gbuf_.empty() && now - gbuf_since_ns_ >= uint64_t{lay_.g.fill_us} * 1000)) {
    if (!Seal()) io_.seal_wanted_.store(true, std::memory_order_relaxed);  // Retry next tick.
  }
  if (now - last_hedge_scan_ns_ >= 500000) {
    last_hedge_scan_ns_ = now;
    Hedge(now);
    Compact();
    MaybeAllocateAhead(now);
  }
}

void GroupLayout::Trim(PageId first, uint64_t count) {
  const uint64_t end = std::min<uint64_t>(first + count, store_->opt_.capacity_pages);
  const uint64_t T = static_cast<uint64_t>(store_->opt_.io_threads);
  for (PageId p = first; p < end;) {
    const uint64_t run = p / kGroupRun;
    const PageId run_end = std::min<uint64_t>((run + 1) * kGroupRun, end);
    if (run % T != static_cast<uint64_t>(io_.index_)) {
      p = run_end;
      continue;
    }
    for (; p < run_end; ++p) {
      PageLoc& L = gloc_[LocalIndex(p)];
      if (L.where == PageLoc::Where::kNone) continue;
      if (L.where == PageLoc::Where::kStored) {
        Slab& s = io_.slabs_[L.slab];
        s.free_wanted = true;
        Kill(p);
      }
      // Buffered or being written: the newer sequence makes its slot garbage when it settles.
      L.where = PageLoc::Where::kNone;
      L.writing = nullptr;
      ++L.seq;
      PublishPage(p);
    }
  }
  // Slabs a trim emptied are given back (GroupMaybeReleaseStripe did it for rows freed now),
  // and the spare too when the thread is left with no page.
  for (Slab& s : io_.UsedSlabs()) {
    if (s.allocated && s.free_wanted && s.stripes_used == 0) io_.MaybeFreeSlab(s);
  }
  MaybeFreeSpare();
}

}  // namespace tessera::client::remote

namespace tessera::client::remote {

bool GroupLayout::StartReclaim(uint32_t slab, uint32_t row) {
  if (io_.free_ctx_ == nullptr) return false;
  Stripe& st = io_.slabs_[slab].stripes[row];
  const uint64_t data_mask = (1ull << lay_.k) - 1;
  uint64_t garbage = 0;
  for (int j = 0; j < lay_.k; ++j) {
    if (((st.zero >> j) & 1) == 0 && st.page[j] == kNoPage) garbage |= 1ull << j;
  }
  garbage &= data_mask;
  if (garbage == 0) return false;
  Ctx* c = io_.NewCtx();
  c->kind = Ctx::Kind::kReclaim;
  c->page = kNoPage;
  c->start_ns = io_.now_ns_;
  io_.Attach(c, slab);
  c->pidx = row;
  c->stripe_ref = true;  // The row stays sealed (not freed, not reused) while we read it.
  ++st.refs;
  c->seq = st.gen;
  c->crcs = st.crc;
  c->zero = garbage;  // Here: the slots to reclaim.
  const uint64_t pmask = ((1ull << lay_.r) - 1) << lay_.k;
  c->asked = garbage | pmask;
  c->good = c->bad = 0;
  ++reclaim_inflight_;
  reclaiming_.emplace_back(slab, row);
  for (int j = 0; j < lay_.width(); ++j) {
    if (((c->asked >> j) & 1) == 0) continue;
    if (!io_.Post(c, j, fabric::OpKind::kRead, io_.SplitBuf(c, j))) c->bad |= 1ull << j;
  }
  if (c->outstanding == 0) {
    c->finished = true;  // Nothing could be asked (a server failed): try another time.
    --reclaim_inflight_;
    ForgetReclaim(slab, row);
    io_.MaybeRelease(c);
  }
  return true;
}

void GroupLayout::OnReclaimRead(Ctx* c, int member, const Status& st) {
  const uint64_t bit = 1ull << member;
  if (st.ok() && coding::Crc32c(io_.SplitBuf(c, member), kPageSize) == c->crcs[member]) {
    c->good |= bit;
  } else {
    c->bad |= bit;  // A failed or corrupt member: leave this stripe as it is (reads repair it).
  }
  if (c->outstanding > 0 || c->finished) return;
  c->finished = true;
  --reclaim_inflight_;
  Slab& s = io_.slabs_[c->slab];
  Stripe& stripe = s.stripes[c->pidx];
  const uint64_t garbage = c->zero;
  // Still the same sealed stripe, healthy, and its garbage still garbage (a sealed stripe's
  // slots only ever die; its row cannot be reused while we hold a reference).
  if (c->bad != 0 || stripe.state != Stripe::State::kSealed || stripe.gen != c->seq ||
      stripe.rebuilding != 0 || !s.allocated || s.draining) {
    ForgetReclaim(c->slab, c->pidx);
    return;
  }
  // The parity as if the garbage slots were zeros: parity_j ^= coef(j, slot) * old (XOR is
  // its own inverse in GF(2^8)), kept in client memory only.
  uint8_t* parity[coding::kMaxParitySplits];
  for (int j = 0; j < lay_.r; ++j) parity[j] = io_.SplitBuf(c, lay_.k + j);
  for (int j = 0; j < lay_.k; ++j) {
    if ((garbage >> j) & 1) {
      store_->stripe_codec_->UpdateParity(j, io_.SplitBuf(c, j), parity, kPageSize);
    }
  }
  Reclaimed r;
  r.slab = c->slab;
  r.row = c->pidx;
  r.gen = stripe.gen;
  r.garbage = garbage;
  r.parity.resize(static_cast<size_t>(lay_.r) * kPageSize);
  for (int j = 0; j < lay_.r; ++j) {
    std::memcpy(r.parity.data() + static_cast<size_t>(j) * kPageSize, parity[j], kPageSize);
  }
  reclaim_ready_.push_back(std::move(r));
  if (open_slab_ == kNoSlot) (void)InstallReclaimed();
}

void GroupLayout::ForgetReclaim(uint32_t slab, uint32_t row) {
  auto it = std::find(reclaiming_.begin(), reclaiming_.end(), std::make_pair(slab, row));
  if (it != reclaiming_.end()) reclaiming_.erase(it);
}

bool GroupLayout::InstallReclaimed() {
  while (!reclaim_ready_.empty()) {
    Reclaimed r = std::move(reclaim_ready_.front());
    reclaim_ready_.erase(reclaim_ready_.begin());
    ForgetReclaim(r.slab, r.row);
    Slab& s = io_.slabs_[r.slab];
    const Stripe& st = s.stripes[r.row];
    // Still the stripe whose parity was read (the row was not freed and reused), sealed, and
    // not being rebuilt; its garbage slots stay garbage (a sealed stripe's slots only die).
    bool ok = s.allocated && !s.draining && st.state == Stripe::State::kSealed && st.gen == r.gen &&
              st.rebuilding == 0 && st.live > 0;
    for (int j = 0; j < lay_.width() && ok; ++j) {
      const uint32_t server = s.server[j].load(std::memory_order_relaxed);
      ok = server != kNoServer && !io_.local_failed_[server] && !store_->failed_[server].load() &&
           s.regen_cursor[j] > r.row;
    }
    if (!ok) continue;
    open_slab_ = r.slab;
    open_row_ = r.row;
    open_gen_ = r.gen;
    std::memcpy(open_parity_.data(), r.parity.data(), r.parity.size());
    open_reclaimed_ = r.garbage;
    store_->stats_.slots_reclaimed.fetch_add(static_cast<uint64_t>(std::popcount(r.garbage)),
                                             std::memory_order_relaxed);
    return true;
  }
  return false;
}

}  // namespace tessera::client::remote
