// Recovery: a failed server's splits (and an evicted slab's) move to replacements chosen by
// placement; the pages are rebuilt there in the background (rate-limited regeneration); ops
// without a reply within the op timeout fail their server.
#include "client/remote/engine.h"

#include <algorithm>
#include <cstring>

#include "common/logging.h"

namespace tessera::client::remote {

void IoThread::OnNotice(const fabric::Completion& comp) {
  uint32_t server = kNoServer;
  for (size_t i = 0; i < conn_.size(); ++i) {
    if (conn_[i] == comp.connection) server = static_cast<uint32_t>(i);
  }
  if (server == kNoServer) return;
  if (comp.notice.kind == fabric::NoticeKind::kShuttingDown) {
    FailServer(server, "it is shutting down");
    return;
  }
  // Eviction: move that split of the slab elsewhere now, rebuild it in the background.
  for (Slab& s : slabs_) {
    if (!s.allocated) continue;
    for (int j = 0; j < lay_.width(); ++j) {
      if (s.server[j].load(std::memory_order_relaxed) == server &&
          s.remote[j] == comp.notice.slab_id) {
        TLOG(INFO) << store_->name_ << ": slab " << comp.notice.slab_id << " on "
                   << store_->server(server).endpoint.ToString()
                   << " is being evicted; moving split " << j << " of logical slab " << s.id;
        ReplaceSplit(s, j);
      }
    }
  }
}

void IoThread::FailServer(uint32_t server, const std::string& why) {
  store_->MarkFailed(server, why);
  HandleLocalFailures();
}

void IoThread::HandleLocalFailures() {
  const uint64_t epoch = store_->failure_epoch_.load(std::memory_order_acquire);
  if (epoch == seen_failure_epoch_) return;
  seen_failure_epoch_ = epoch;
  for (uint32_t i = 0; i < conn_.size(); ++i) {
    if (local_failed_[i] || !store_->failed_[i].load()) continue;
    local_failed_[i] = 1;
    // In-flight ops to it complete with Cancelled (reads then ask other splits, writes re-place).
    // No GOODBYE exchange: a stopped server would hold this thread for its whole timeout.
    (void)t_->Abort(conn_[i]);
    for (Slab& s : slabs_) {
      if (!s.allocated) continue;
      for (int j = 0; j < lay_.width(); ++j) {
        if (s.server[j].load(std::memory_order_relaxed) == i) ReplaceSplit(s, j);
      }
    }
  }
}

void IoThread::ReplaceSplit(Slab& s, int j) {
  ReplaceSplitOnce(s, j);
  now_ns_ = MonotonicNs();  // AllocSlab / FreeSlab may have blocked.
}

void IoThread::ReplaceSplitOnce(Slab& s, int j) {
  const uint32_t old = s.server[j].load(std::memory_order_relaxed);
  std::vector<placement::ServerId> current(lay_.width());
  for (int i = 0; i < lay_.width(); ++i) current[i] = s.server[i].load();
  for (int attempt = 0; attempt < 3; ++attempt) {
    placement::ServerId chosen;
    {
      std::lock_guard<std::mutex> lock(store_->mu_);
      auto r = store_->policy_->ChooseReplacement(*store_->snap_, s.id, current, j,
                                                  store_->load_);
      if (!r.ok()) {
        // No surviving split to anchor the choice (e.g. a single copy): take a server the
        // policy would place the slab on now, outside the current set.
        auto fresh = store_->policy_->Place(*store_->snap_, s.id + attempt, store_->load_);
        if (fresh.ok()) {
          for (placement::ServerId id : *fresh) {
            if (std::find(current.begin(), current.end(), id) == current.end()) {
              r = id;
              break;
            }
          }
        }
      }
      if (!r.ok()) {
        // Logged at 1, 2, 4, ... per thread: when servers go away, every slab they held asks.
        if (LogThisOne(++no_replacement_)) {
          TLOG(WARNING) << store_->name_ << ": no replacement for split " << j
                        << " of logical slab " << s.id << ": " << r.status() << " ("
                        << no_replacement_ << " splits so far on this thread)";
        }
        return;
      }
      chosen = *r;
      store_->load_[chosen]++;
    }
    if (local_failed_[chosen]) continue;
    auto a = AllocRemote(chosen, Deadline::AfterMs(store_->opt_.control_timeout_ms));
    if (!a.ok()) {
      TLOG(WARNING) << store_->name_ << ": cannot allocate a replacement slab on "
                    << store_->server(chosen).endpoint.ToString() << ": " << a.status();
      if (IsConnectionError(a.status())) store_->MarkFailed(chosen, a.status().ToString());
      current[j] = chosen;  // Do not pick it again.
      continue;
    }
    const uint64_t old_remote = s.remote[j];
    s.server[j].store(chosen, std::memory_order_relaxed);
    s.remote[j] = a->slab_id;
    s.remote_info[j] = *a;
    PublishSlab(static_cast<uint32_t>(&s - slabs_.data()));
    const uint32_t pps = static_cast<uint32_t>(store_->pages_per_slab_);
    // What needs rebuilding: written pages (split layout), or rows in use whose member j is
    // not padding (group layout).
    auto needs = [&](uint32_t p) -> uint64_t {
      if (!lay_.group) return s.written[p];
      const Stripe& st = s.stripes[p];
      return st.state != Stripe::State::kFree && ((st.zero >> j) & 1) == 0 ? 1 : 0;
    };
    uint64_t pending = 0;
    for (uint32_t p = 0; p < pps; ++p) pending += needs(p);
    // Pages the previous rebuild of this split had not reached yet are counted again below.
    const uint32_t was = s.regen_cursor[j];
    if (was < pps) {
      uint64_t left = 0;
      for (uint32_t p = was; p < pps; ++p) left += needs(p);
      store_->stats_.regenerations_pending.fetch_sub(left, std::memory_order_relaxed);
    } else {
      ++regen_active_;
    }
    s.regen_cursor[j] = 0;
    store_->stats_.regenerations_pending.fetch_add(pending, std::memory_order_relaxed);
    if (old != kNoServer && !store_->failed_[old].load() && !local_failed_[old]) {
      // Eviction: give the old slab back (the server drops it anyway).
      (void)FreeRemote(old, old_remote, Deadline::AfterMs(100));
    }
    return;
  }
}

void IoThread::Regenerate(uint64_t now) {
  const uint64_t rate = store_->opt_.regeneration_pages_per_sec;
  const double elapsed = static_cast<double>(now - last_tick_ns_) / 1e9;
  last_tick_ns_ = now;
  if (rate == 0) {
    regen_tokens_ = 1e9;
  } else {
    regen_tokens_ = std::min<double>(regen_tokens_ + elapsed * static_cast<double>(rate),
                                     std::max<double>(8.0, static_cast<double>(rate) / 100));
  }
  const uint32_t pps = static_cast<uint32_t>(store_->pages_per_slab_);
  for (Slab& s : slabs_) {
    if (!s.allocated) continue;
    for (int j = 0; j < lay_.width(); ++j) {
      if (lay_.group) {
        if (s.regen_cursor[j] < pps && !GroupRegenerate(s, j)) return;
        continue;
      }
      while (s.regen_cursor[j] < pps) {
        if (regen_tokens_ < 1 || regen_inflight_ >= 16 || free_ctx_count_ < 4) return;
        const uint32_t p = s.regen_cursor[j]++;
        if (s.regen_cursor[j] == pps) --regen_active_;
        if (!s.written[p]) continue;
        if (s.busy[p] != nullptr) {  // The write in flight stores the split itself.
          store_->stats_.regenerations_pending.fetch_sub(1, std::memory_order_relaxed);
          continue;
        }
        regen_tokens_ -= 1;
        Ctx* c = NewCtx();
        c->kind = Ctx::Kind::kRegen;
        c->page = s.id * pps + p;
        Attach(c, static_cast<uint32_t>(&s - slabs_.data()));
        c->pidx = p;
        c->regen_split = j;
        c->seq = s.seq[p];
        std::memcpy(c->crcs.data(), &s.crc[static_cast<size_t>(p) * lay_.width()],
                    sizeof(uint32_t) * lay_.width());
        c->asked = 1ull << j;  // Never read the split being rebuilt.
        ++regen_inflight_;
        AskMore(c);
      }
    }
  }
}

bool IoThread::GroupRegenerate(Slab& s, int j) {
  const uint32_t rows = static_cast<uint32_t>(store_->pages_per_slab_);
  while (s.regen_cursor[j] < rows) {
    if (regen_tokens_ < 1 || regen_inflight_ >= 16 || free_ctx_count_ < 4) return false;
    const uint32_t row = s.regen_cursor[j];
    Stripe& st = s.stripes[row];
    if (st.state == Stripe::State::kWriting) {
      // The stripe write in flight stores (or re-places) the member itself; wait for it.
      return true;
    }
    ++s.regen_cursor[j];
    if (s.regen_cursor[j] == rows) --regen_active_;
    if (st.state == Stripe::State::kFree || ((st.zero >> j) & 1)) continue;
    regen_tokens_ -= 1;
    GroupRebuildMember(static_cast<uint32_t>(&s - slabs_.data()), row, j, /*scrub=*/false);
  }
  return true;
}

void IoThread::GroupRebuildMember(uint32_t slab, uint32_t row, int j, bool scrub) {
  Slab& s = slabs_[slab];
  Stripe& st = s.stripes[row];
  Ctx* c = NewCtx();
  c->kind = Ctx::Kind::kRegen;
  c->scrub = scrub;
  c->page = kNoPage;
  Attach(c, slab);
  c->pidx = row;
  c->col = j;
  c->regen_split = j;
  c->crcs = st.crc;
  c->zero = st.zero;
  c->stripe_ref = true;
  ++st.refs;
  st.rebuilding |= 1ull << j;  // Cleared when the rebuilt member is stored (or given up).
  c->asked = 1ull << j;  // Never read the member being rebuilt.
  c->degraded = true;
  ++regen_inflight_;
  if (scrub) store_->stats_.regenerations_pending.fetch_add(1, std::memory_order_relaxed);
  GroupAskMore(c);
}

void IoThread::DetachLateReads(uint64_t now) {
  if (spare_bufs_.empty()) return;
  auto detachable = [&](const Request& rq) {
    const Ctx* c = rq.ctx;
    return rq.live && !rq.write && c != nullptr && c->finished && !c->released &&
           !c->repairing && (c->kind == Ctx::Kind::kRead || c->kind == Ctx::Kind::kMove);
  };
  bool any = false;
  for (const Request& rq : reqs_) {
    if (detachable(rq) && !rq.ctx->detach && now - rq.post_ns > kLateReadNs) {
      rq.ctx->detach = true;
      any = true;
    }
  }
  if (!any) return;
  // Every live request of a chosen context goes (their replies all land in its buffer).
  for (Request& rq : reqs_) {
    if (!detachable(rq) || !rq.ctx->detach) continue;
    Ctx* c = rq.ctx;
    if (c->detach_old == nullptr) {
      if (spare_bufs_.empty()) {
        c->detach = false;  // Kept whole: it is released when its replies arrive.
        continue;
      }
      c->detach_old = c->buf;
      c->buf = spare_bufs_.back();
      spare_bufs_.pop_back();
    }
    rq.orphan_buf = c->detach_old;
    rq.ctx = nullptr;
    --c->outstanding;
    ++buf_orphans_[static_cast<size_t>(c->detach_old - bufs_.data()) / buf_bytes_];
  }
  for (Ctx& c : ctxs_) {
    if (!c.detach) continue;
    c.detach = false;
    c.detach_old = nullptr;
    MaybeRelease(&c);
  }
}

void IoThread::Housekeeping() {
  HandleLocalFailures();
  const uint64_t now = MonotonicNs();
  // Op timeouts: scan at most every millisecond.
  if (now - last_timeout_scan_ns_ > 1000000) {
    last_timeout_scan_ns_ = now;
    if (since_classify_ > 0) ClassifySlow();
    const uint64_t limit = static_cast<uint64_t>(store_->opt_.op_timeout_ms) * 1000000;
    if (t_->inflight() > 0) {
      for (const Request& rq : reqs_) {
        if (rq.live && now - rq.post_ns > limit && !local_failed_[rq.server]) {
          FailServer(rq.server, "no reply within the op timeout (" +
                                    std::to_string(store_->opt_.op_timeout_ms) + " ms)");
        }
      }
      DetachLateReads(now);
    }
  }
  if (lay_.group) GroupHousekeeping(now);
  if (regen_active_ > 0 || regen_inflight_ > 0) {
    Regenerate(now);
  } else {
    last_tick_ns_ = now;
  }
}


}  // namespace tessera::client::remote
