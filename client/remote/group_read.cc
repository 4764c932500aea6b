// Group layout (EC-Batch) read path.
//
// A page is read whole from the one server holding its stripe member: one round trip. The read
// turns degraded, asking the other members of the stripe (k + delta of them, late binding), when
// that server is failed or much slower than the others (ClassifySlow), when its reply fails or
// does not match the page's CRC, or when it has not answered within hedge_us (a hedge: the
// first of the page's own reply and the decode wins). Padding members count as known zeros.
// The page is then decoded (StripeCodec::Rebuild); a corrupt member is rewritten from the
// decode. Fewer than k good members: DataLoss naming the page. The same machinery rebuilds a
// lost member for regeneration (kRegen) and reads live pages for compaction (kMove).
#include <bit>
#include <algorithm>
#include <cstring>

#include "client/remote/group_layout.h"
#include "coding/codec.h"
#include "common/logging.h"

namespace tessera::client::remote {

void GroupLayout::StartRead(Ctx* c, bool degraded, bool verify) {
  PageLoc& L = gloc_[LocalIndex(c->page)];
  const bool move = c->kind == Ctx::Kind::kMove;
  const uint8_t* newest = nullptr;
  if (L.where == PageLoc::Where::kBuffered) {
    newest = gbuf_data_.data() + static_cast<size_t>(L.row) * kPageSize;
  } else if (L.where == PageLoc::Where::kWriting) {
    newest = io_.SplitBuf(L.writing, L.col);
  }
  if (L.where != PageLoc::Where::kStored) {
    c->finished = true;
    if (move) {
      // Rewritten or trimmed since the compaction chose it: nothing to move.
      --compact_inflight_;
      L.moving = false;
    } else {
      if (newest != nullptr) {
        std::memcpy(c->op->buf, newest, kPageSize);  // Newest data, possibly not yet acked.
      } else {
        std::memset(c->op->buf, 0, kPageSize);
      }
      io_.Complete(c->op, Status::Ok(), c->start_ns);
      c->op = nullptr;
    }
    io_.MaybeRelease(c);
    return;
  }
  io_.Attach(c, L.slab);
  c->pidx = L.row;
  c->col = L.col;
  c->seq = L.seq;
  Stripe& st = io_.slabs_[L.slab].stripes[L.row];
  if (!c->stripe_ref) {
    c->stripe_ref = true;
    ++st.refs;
  }
  c->crcs = st.crc;
  c->zero = st.zero;
  c->asked = c->good = c->bad = c->corrupt = c->late = 0;
  c->degraded = false;
  Slab& s = io_.slabs_[c->slab];
  const uint32_t server = s.server[c->col].load(std::memory_order_relaxed);
  // (A server at its cap of outstanding requests is left out like a silent one.)
  const bool silent = io_.Silent(server) || io_.AtCap(server);
  // A member a direct read just found corrupt is asked even on a slow server: unread, its
  // corruption would be neither counted nor repaired.
  const bool classified_slow =
      silent || (!verify && server < io_.slow_.size() && io_.slow_[server]);
  const bool slow = degraded || classified_slow;
  const bool settled = s.regen_cursor[c->col] > c->pidx && ((st.rebuilding >> c->col) & 1) == 0;
  c->asked |= 1ull << c->col;
  if (!slow && settled && io_.Post(c, c->col, fabric::OpKind::kRead, io_.SplitBuf(c, c->col)))
    return;
  if (!slow && settled) c->bad |= 1ull << c->col;  // Its server is failed.
  if ((classified_slow && settled) || silent) {
    // Much slower than the others (or not answering at all): the rest of the stripe first, and
    // this member only if they do not suffice (GroupAskMore's slow or silent pass). A request
    // to a stopped server would stay in flight until the op timeout.
    c->asked &= ~(1ull << c->col);
  } else if (slow || !settled) {
    // Ask it anyway (it may answer first, and an unsettled member may hold this stripe if the
    // stripe was written after the replacement), but go to the rest of the stripe at once.
    if (!io_.Post(c, c->col, fabric::OpKind::kRead, io_.SplitBuf(c, c->col)))
      c->bad |= 1ull << c->col;
  }
  c->degraded = true;
  AskMore(c);
}

void GroupLayout::AskMore(Ctx* c) {
  if (c->finished) return;
  Slab& s = io_.slabs_[c->slab];
  const uint64_t bad_others = c->bad & ~(1ull << c->col);
  const int want = lay_.k + (bad_others == 0 ? lay_.delta : 0);
  int have = std::popcount((c->good | c->zero) &
                           ~(c->kind == Ctx::Kind::kRegen ? (1ull << c->regen_split) : 0)) +
             c->outstanding - std::popcount(c->late & ~(c->good | c->bad));
  // The page's own member, still outstanding, counts (it finishes the read on its own).
  // Pass 0: settled members on servers that answer normally; pass 1: settled members on servers
  // much slower than the others; pass 2: members not rebuilt yet; passes 3 and 4: members on
  // servers at their cap of outstanding requests, then on silent or suspect servers (see
  // AskPass()), and only while fewer than k could arrive without them: never for the extra
  // delta members (a request there would hold buffers until the server fails).
  for (int pass = 0; pass < IoThread::kAskPasses; ++pass) {
    const int limit = pass >= IoThread::kLeftOutPass ? lay_.k : want;
    for (int j = 0; j < lay_.width() && have < limit; ++j) {
      const uint64_t bit = 1ull << j;
      if ((c->asked & bit) != 0 || (c->zero & bit) != 0) continue;
      if (c->regen_split == j) continue;
      const uint32_t server = s.server[j].load(std::memory_order_relaxed);
      const bool settled =
          s.regen_cursor[j] > c->pidx && ((s.stripes[c->pidx].rebuilding >> j) & 1) == 0;
      if (pass != io_.AskPass(server, settled)) continue;
      c->asked |= bit;
      if (io_.Post(c, j, fabric::OpKind::kRead, io_.SplitBuf(c, j))) {
        ++have;
      } else {
        c->bad |= bit;
        if (io_.Reaskable(s, j)) c->reask |= bit;  // Its connection is down, or no slot now.
      }
    }
  }
  if (have >= lay_.k) return;
  if (c->reask != 0 && io_.MayPark(c)) {
    // Members on live servers wait for their connection: not lost. Asked again as soon as it
    // is back, even while requests to a silent server are still out.
    io_.ParkRead(c);
    return;
  }
  if (c->kind != Ctx::Kind::kRegen) {
    if (ReadFromExtending(c)) return;
    const Stripe& st = s.stripes[c->pidx];
    const bool extending = std::any_of(extending_.begin(), extending_.end(), [&](const Ctx* e) {
      return e->slab == c->slab && e->pidx == c->pidx;
    });
    if (!extending && (st.zero != c->zero || st.crc != c->crcs)) {
      // Updated in place since this read took its snapshot: members answered with contents
      // the snapshot does not cover. Read the stripe as it is now.
      Reask(c);
      return;
    }
    if (extending && io_.MayPark(c)) {
      // Being updated in place, and this read has requests out to members the update writes:
      // wait for them (then ReadFromExtending), or for the update to settle.
      io_.ParkRead(c);
      return;
    }
  }
  if (c->outstanding > 0) return;  // Wait: more may arrive (they count toward k).
  if (c->kind == Ctx::Kind::kRead &&
      (gloc_[LocalIndex(c->page)].seq != c->seq ||
       gloc_[LocalIndex(c->page)].where != PageLoc::Where::kStored)) {
    // A write or trim raced with us: start over (the newest data may be in memory now).
    if (c->stripe_ref) {
      c->stripe_ref = false;
      Stripe& st = s.stripes[c->pidx];
      --st.refs;
      const uint32_t slab = c->slab, row = c->pidx;
      MaybeReleaseStripe(slab, row);
    }
    if (c->slab_ref) {
      c->slab_ref = false;
      --s.refs;
    }
    StartRead(c);
    return;
  }
  const int usable = std::popcount(c->good | c->zero);
  FinishRead(c, DataLoss("page " + std::to_string(c->page) + ": only " + std::to_string(usable) +
                         " of the " + std::to_string(lay_.width()) +
                         " members of its stripe are readable and intact (" +
                         std::to_string(lay_.k) + " needed); the page's data is lost"));
}

bool GroupLayout::ReadFromExtending(Ctx* c) {
  const Ctx* e = nullptr;
  for (const Ctx* x : extending_) {
    if (x->slab == c->slab && x->pidx == c->pidx) e = x;
  }
  if (e == nullptr) return false;
  const uint64_t changed = e->asked;  // The pages it fills and the parity members.
  const uint64_t out = c->asked & ~(c->good | c->bad);
  if ((changed & out) != 0) return false;  // An answer on its way may be either state.
  for (int j = 0; j < lay_.width(); ++j) {
    const uint64_t bit = 1ull << j;
    if ((changed & bit) == 0) continue;
    std::memcpy(io_.SplitBuf(c, j), io_.SplitBuf(const_cast<Ctx*>(e), j), kPageSize);
    c->crcs[j] = e->crcs[j];
  }
  c->zero = e->zero;
  c->good = (c->good & ~changed) | changed;
  c->bad &= ~changed;
  c->corrupt &= ~changed;
  c->late &= ~changed;
  c->asked |= changed;
  if (std::popcount(c->good | c->zero) < lay_.k) return false;
  FinishRead(c, Status::Ok());
  return true;
}

void GroupLayout::Reask(Ctx* c) {
  if (c->finished) return;
  const Stripe& st = io_.slabs_[c->slab].stripes[c->pidx];
  if (c->kind != Ctx::Kind::kRegen && st.rebuilding == 0 &&
      (st.zero != c->zero || st.crc != c->crcs)) {
    // Settled into a new state since the read's snapshot (an update in place filled padding
    // and rewrote the parity): take the stripe as it is now. The members that changed are
    // asked again, once none of them has a request out (its answer would be the old state).
    uint64_t changed = c->zero ^ st.zero;
    for (int j = 0; j < lay_.width(); ++j) {
      if (st.crc[j] != c->crcs[j]) changed |= 1ull << j;
    }
    const uint64_t out = c->asked & ~(c->good | c->bad);
    if ((changed & out) == 0) {
      c->crcs = st.crc;
      c->zero = st.zero;
      c->asked &= ~changed;
      c->good &= ~changed;
      c->bad &= ~changed;
      c->corrupt &= ~changed;
      c->late &= ~changed;
    }
  }
  AskMore(c);
}

void GroupLayout::OnRead(Ctx* c, int member, const Status& st) {
  const uint64_t bit = 1ull << member;
  if (c->finished) return;
  if (!st.ok()) {
    c->bad |= bit;
    io_.NoteLostRead(c, member, st);
  } else if (coding::Crc32c(io_.SplitBuf(c, member), kPageSize) == c->crcs[member]) {
    c->good |= bit;
  } else {
    c->bad |= bit;
    Slab& s = io_.slabs_[c->slab];
    const Stripe& st = s.stripes[c->pidx];
    // Corrupt only if the member is still what the read expected: a parity member updated in
    // place while the read was out (its CRC changed since) answers with its new contents.
    if (s.regen_cursor[member] > c->pidx && ((st.rebuilding >> member) & 1) == 0 &&
        st.crc[member] == c->crcs[member] &&
        (c->kind == Ctx::Kind::kRegen || gloc_[LocalIndex(c->page)].seq == c->seq)) {
      c->corrupt |= bit;
      store_->stats_.corruptions_detected.fetch_add(1, std::memory_order_relaxed);
    }
  }
  const bool own = c->kind != Ctx::Kind::kRegen && (c->good >> c->col) & 1;
  if (own || std::popcount(c->good | c->zero) >= lay_.k) {
    FinishRead(c, Status::Ok());
    return;
  }
  if (!c->degraded && (c->bad & (1ull << c->col))) c->degraded = true;
  if (c->degraded) AskMore(c);
}

void GroupLayout::Hedge(uint64_t now) {
  if (lay_.g.hedge_us == 0) return;
  const uint64_t limit = uint64_t{lay_.g.hedge_us} * 1000;
  for (Ctx& c : io_.ctxs_) {
    if (c.released || c.finished || c.degraded || c.op == nullptr) continue;
    if (c.kind != Ctx::Kind::kRead || c.outstanding == 0) continue;
    if (now - c.start_ns < limit) continue;
    c.degraded = true;
    store_->stats_.hedged_reads.fetch_add(1, std::memory_order_relaxed);
    AskMore(&c);
  }
}

void GroupLayout::FinishRead(Ctx* c, Status st) {
  c->finished = true;
  if (st.ok()) io_.NoteLateRequests(c);
  Slab& s = io_.slabs_[c->slab];
  uint8_t page[kPageSize];
  const int target = c->kind == Ctx::Kind::kRegen ? c->regen_split : c->col;
  uint8_t* out = c->kind == Ctx::Kind::kRead ? c->op->buf : page;
  const uint8_t* members[kMaxWidth];
  for (int j = 0; j < lay_.width(); ++j) {
    members[j] = (c->zero >> j) & 1 ? zero_page_.data() : io_.SplitBuf(c, j);
  }
  bool decoded = false;
  if (st.ok()) {
    if (c->kind != Ctx::Kind::kRegen && ((c->good >> target) & 1)) {
      std::memcpy(out, io_.SplitBuf(c, target), kPageSize);
    } else {
      st = store_->stripe_codec_->Rebuild(members, c->good | c->zero, target, out, kPageSize);
      decoded = st.ok();
      if (decoded) store_->stats_.decodes.fetch_add(1, std::memory_order_relaxed);
      if (!st.ok() && st.code() != StatusCode::kDataLoss) {
        st = DataLoss("page " + std::to_string(c->page) + ": " + st.ToString());
      }
    }
    if (st.ok() && c->kind == Ctx::Kind::kRead && c->degraded && ((c->good >> c->col) & 1) == 0) {
      store_->stats_.degraded_reads.fetch_add(1, std::memory_order_relaxed);
    }
    if (st.ok() && c->kind == Ctx::Kind::kRegen &&
        coding::Crc32c(out, kPageSize) != c->crcs[target]) {
      st = DataLoss("stripe member rebuilt with the wrong CRC");
    }
  } else if (st.code() == StatusCode::kDataLoss && c->kind == Ctx::Kind::kRead) {
    store_->stats_.data_loss.fetch_add(1, std::memory_order_relaxed);
  }
  PageLoc* L = c->kind == Ctx::Kind::kRegen ? nullptr : &gloc_[LocalIndex(c->page)];
  const bool unchanged = L == nullptr || (L->seq == c->seq && L->where == PageLoc::Where::kStored &&
                                          L->slab == c->slab && L->row == c->pidx);
  // Members to rewrite: the rebuilt one (regeneration) or corrupt ones (decoded from the rest).
  uint64_t rewrite = 0;
  if (st.ok()) {
    if (c->kind == Ctx::Kind::kRegen) {
      rewrite = 1ull << target;
      std::memcpy(io_.SplitBuf(c, target), out, kPageSize);
    } else if (c->corrupt != 0 && unchanged) {
      const uint64_t good = c->good | c->zero;
      if (std::popcount(good) >= lay_.k) {
        // Not into `page`: a move's result is there (out), and it is buffered below.
        uint8_t rebuilt[kPageSize];
        for (int j = 0; j < lay_.width(); ++j) {
          if (((c->corrupt >> j) & 1) == 0) continue;
          // Every outstanding request targets a member not in `corrupt`; rebuild in place.
          if (store_->stripe_codec_->Rebuild(members, good, j, rebuilt, kPageSize).ok()) {
            std::memcpy(io_.SplitBuf(c, j), rebuilt, kPageSize);
            rewrite |= 1ull << j;
          }
        }
      }
    }
  }
  // Corrupt members this read could not rebuild (it finished with its own member before k
  // others arrived): rebuild them from the rest of the stripe in the background.
  if (unchanged && c->kind != Ctx::Kind::kRegen) {
    for (int j = 0; j < lay_.width(); ++j) {
      if (((c->corrupt & ~rewrite) >> j) & 1) {
        if (io_.free_ctx_ == nullptr) break;
        RebuildMember(c->slab, c->pidx, j, /*scrub=*/true);
      }
    }
  }
  if (c->kind == Ctx::Kind::kRead) {
    io_.Complete(c->op, st, c->start_ns);
    c->op = nullptr;
  } else if (c->kind == Ctx::Kind::kMove) {
    L->moving = false;
    if (st.ok() && unchanged && !BufferFull()) {
      BufferPage(c->page, out, nullptr, 0);  // Kills the old slot; the move is buffered.
    } else {
      // (A full buffer waits for a row; the page stays where it is, and moves another time.)
      --compact_inflight_;
      if (!st.ok()) {
        TLOG(WARNING) << store_->name_ << ": compaction cannot read page " << c->page << ": " << st;
      }
    }
  } else {  // kRegen
    --io_.regen_inflight_;
    if (!st.ok()) s.stripes[c->pidx].rebuilding &= ~(1ull << target);
    if (!st.ok()) {
      const uint64_t failures = ++io_.regen_failures_;
      if (LogThisOne(failures)) {
        TLOG(WARNING) << store_->name_ << ": cannot rebuild member " << target << " of stripe "
                      << c->pidx << " of slab " << s.id << ": " << st << " (" << failures
                      << " so far on this thread)";
      }
    }
    store_->stats_.regenerations_pending.fetch_sub(1, std::memory_order_relaxed);
  }
  if (rewrite != 0) {
    c->repairing = true;
    c->asked = rewrite;
    c->good = 0;
    for (int j = 0; j < lay_.width(); ++j) {
      if ((rewrite & (1ull << j)) && !io_.Post(c, j, fabric::OpKind::kWrite, io_.SplitBuf(c, j))) {
        c->asked &= ~(1ull << j);
        if (c->kind == Ctx::Kind::kRegen) s.stripes[c->pidx].rebuilding &= ~(1ull << j);
      }
    }
  }
  io_.MaybeRelease(c);
}

Result<std::vector<size_t>> GroupLayout::Locate(PageId page) {
  const PageLoc& L = gloc_[LocalIndex(page)];
  const Slab* s = nullptr;
  int col = 0;
  if (L.where == PageLoc::Where::kStored) {
    s = &io_.slabs_[L.slab];
    col = L.col;
  } else if (L.where == PageLoc::Where::kWriting) {
    s = &io_.slabs_[L.writing->slab];
    col = L.col;
  } else {
    return NotFound(
        "page " + std::to_string(page) +
        (L.where == PageLoc::Where::kBuffered ? " is in the stripe buffer" : " is not stored"));
  }
  // The page's own server first, then the servers of the other stored members of its stripe
  // in member order (padding members are stored nowhere).
  const uint64_t zero =
      L.where == PageLoc::Where::kStored ? s->stripes[L.row].zero : L.writing->zero;
  std::vector<size_t> out;
  out.push_back(s->server[col].load(std::memory_order_relaxed));
  for (int j = 0; j < lay_.width(); ++j) {
    if (j != col && ((zero >> j) & 1) == 0) {
      out.push_back(s->server[j].load(std::memory_order_relaxed));
    }
  }
  for (size_t v : out) {
    if (v == kNoServer) return NotFound("page " + std::to_string(page) + " has no server");
  }
  return out;
}

}  // namespace tessera::client::remote
