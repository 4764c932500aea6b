// Recovery: a failed server's splits (and an evicted slab's) move to replacements chosen by
// placement; the pages are rebuilt there in the background (rate-limited regeneration); ops
// without a reply within the op timeout fail their server.
#include "client/remote/engine.h"
#include "client/remote/sim_control.h"
#include "client/remote/layout.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "common/logging.h"

namespace tessera::client::remote {

void IoThread::OnNotice(const fabric::Completion& comp) {
  uint32_t server = kNoServer;
  for (size_t i = 0; i < conn_.size(); ++i) {
    if (conn_[i] == comp.connection) server = static_cast<uint32_t>(i);
  }
  if (server == kNoServer) return;
  if (comp.notice.kind == fabric::NoticeKind::kShuttingDown) {
    // The server's own word: a verdict, no confirmation needed.
    store_->MarkFailed(server, "it is shutting down");
    HandleLocalFailures();
    return;
  }
  // Eviction: move that split of the slab elsewhere now, rebuild it in the background.
  for (Slab& s : UsedSlabs()) {
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

void IoThread::ServerError(uint32_t server, const Status& st) {
  if (server >= conn_.size() || local_failed_[server] || store_->failed_[server].load()) return;
  // The other requests of a connection found lost (ConnLost): the loss is one error, however
  // many requests it took with it (our own Abort() cancels them; a reset fails them).
  if (conn_down_[server]) return;
  if (st.code() == StatusCode::kUnavailable && ++errors_in_a_row_[server] == kBrokenAfter) {
    // Refused or lost again and again with no good reply in between (the server may still
    // answer heartbeats): its data path is broken. Reported once per run of errors.
    store_->ReportTrouble(server,
                          std::to_string(kBrokenAfter) + " data requests in a row failed: " +
                              st.ToString(),
                          /*broken=*/true);
  }
  if (!t_->Connected(conn_[server])) {
    ConnLost(server, st.ToString());
    return;
  }
  store_->ReportTrouble(server, st.ToString());
}

void IoThread::ConnLost(uint32_t server, const std::string& why) {
  if (server >= conn_.size() || conn_down_[server] || local_failed_[server]) return;
  conn_down_[server] = 1;
  reconnect_at_[server] = now_ns_;  // At once (next housekeeping), then with backoff.
  // Every request still out on it completes with Cancelled: reads ask other members, writes
  // leave their split stale (rewritten after the reconnect).
  (void)t_->Abort(conn_[server]);
  TLOG(INFO) << store_->name_ << ": data connection to "
             << store_->server(server).endpoint.ToString() << " lost (" << why
             << "); reconnecting";
}

std::shared_ptr<ReconnectProbe> IoThread::StartReconnectProbe(uint32_t server) {
  auto p = std::make_shared<ReconnectProbe>();
  fabric::ConnectOptions co;
  co.secret = store_->opt_.secret;
  co.client_id = store_->client_id_;
  if (store_->opt_.sim) {
    // Simulation: the handshake is the simulated control plane's; its answer counts once the
    // simulated time it takes has passed (Reconnect).
    const uint64_t now = MonotonicNs();
    uint64_t takes = 0;
    auto info = store_->opt_.sim->Hello(
        server, now, uint64_t{store_->opt_.connect_timeout_ms} * 1000000, &takes);
    if (info.ok()) {
      p->server_id = info->server_id;
    } else {
      p->status = info.status();
    }
    p->ready_ns = now + takes;
    p->done.store(true, std::memory_order_release);
    return p;
  }
  std::thread([p, ep = store_->server(server).endpoint, co,
               ms = store_->opt_.connect_timeout_ms]() mutable {
    co.deadline = Deadline::AfterMs(ms);
    auto c = fabric::ControlClient::Connect(ep, co);
    if (c.ok()) {
      p->server_id = (*c)->info().server_id;
      (void)(*c)->Close(Deadline::AfterMs(100));
    } else {
      p->status = c.status();
    }
    p->done.store(true, std::memory_order_release);
  }).detach();
  return p;
}

void IoThread::Reconnect(uint64_t now) {
  const RemoteStoreOptions& o = store_->opt_;
  for (uint32_t i = 0; i < conn_down_.size(); ++i) {
    std::shared_ptr<ReconnectProbe>& probe = probes_[i];
    if (!conn_down_[i] || local_failed_[i] || store_->failed_[i].load()) {
      probe.reset();  // (One still out ends on its own.)
      continue;
    }
    if (!probe) {
      if (now < reconnect_at_[i]) continue;
      // A suspect server may be stopped: after a failed attempt, wait until it answers the
      // monitor again (or is failed) rather than keep a handshake with it out.
      if (reconnect_fails_[i] > 0 && store_->Suspect(i)) continue;
      probe = StartReconnectProbe(i);  // The connect and handshake, off this thread.
      continue;
    }
    if (!probe->done.load(std::memory_order_acquire) || now < probe->ready_ns) continue;  // Out.
    Status st = probe->status;
    const uint64_t id = probe->server_id;
    probe.reset();
    if (st.ok() && !store_->SameInstance(i, id)) {
      // A new process on the same address (restarted): our slabs died with the old one.
      store_->MarkFailed(i,
                         "it was restarted (a new instance answers at its address and holds "
                         "none of this client's slabs)");
      HandleLocalFailures();
      continue;
    }
    Result<fabric::ConnectionId> c = Unavailable("not connected");
    if (st.ok()) {
      // It answered a handshake a moment ago: the transport's own takes a round trip or two.
      // Bounded all the same (it may have stopped since), and excused like any stall.
      fabric::ConnectOptions co;
      co.secret = o.secret;
      co.client_id = store_->client_id_;
      co.deadline = Deadline::AfterMs(std::min(o.connect_timeout_ms, kReconnectMs));
      c = t_->Connect(store_->server(i).endpoint, co);
      st = c.ok() ? Status::Ok() : c.status();
    }
    if (c.ok()) {
      auto info = t_->Info(*c);
      if (info.ok() && !store_->SameInstance(i, info->server_id)) {
        (void)t_->Abort(*c);
        store_->MarkFailed(i, "it was restarted (a new instance answers at its address and holds "
                              "none of this client's slabs)");
        HandleLocalFailures();
        continue;
      }
      // The memserver kept our slabs (they belong to the client id, not the connection).
      for (const Slab& s : UsedSlabs()) {
        // Also the members a slab being allocated has got so far (slabs.cc).
        const uint32_t idx = static_cast<uint32_t>(&s - slabs_.data());
        if (!s.allocated && !Allocating(idx)) continue;
        for (int j = 0; j < lay_.width() && st.ok(); ++j) {
          if (s.server[j].load(std::memory_order_relaxed) == i && s.remote_info[j].slab_id != 0) {
            st = t_->AddSlab(*c, s.remote_info[j]);
          }
        }
      }
      if (!st.ok()) (void)t_->Abort(*c);
    }
    if (st.ok()) {
      conn_[i] = *c;
      conn_down_[i] = 0;
      reconnect_fails_[i] = 0;
      store_->stats_.reconnects.fetch_add(1, std::memory_order_relaxed);
      store_->NoteAlive(i, MonotonicNs());
      TLOG(INFO) << store_->name_ << ": data connection to "
                 << store_->server(i).endpoint.ToString() << " re-established";
      continue;
    }
    const uint32_t fails = ++reconnect_fails_[i];
    reconnect_at_[i] = now + std::min<uint64_t>(2000000000ull, 50000000ull << std::min(fails, 6u));
    store_->ReportTrouble(i, "cannot reconnect the data connection (" + std::to_string(fails) +
                                 " tries): " + st.ToString());
  }
}

void IoThread::NoteStale(uint32_t slab, uint32_t pidx, int j, uint32_t server) {
  if (server == kNoServer || server >= conn_.size() || store_->failed_[server].load()) return;
  const Slab& s = slabs_[slab];
  const uint32_t seq = layout_->StaleSeq(s, pidx);
  for (const StaleSplit& e : stale_) {
    if (e.slab == slab && e.pidx == pidx && e.j == j && e.seq == seq) return;
  }
  stale_.push_back({slab, pidx, server, j, seq});
  store_->stats_.regenerations_pending.fetch_add(1, std::memory_order_relaxed);
}

void IoThread::RepairStale() {
  size_t keep = 0;
  for (size_t i = 0; i < stale_.size(); ++i) {
    const StaleSplit e = stale_[i];
    Slab& s = slabs_[e.slab];
    const bool drop = !s.allocated || s.server[e.j].load(std::memory_order_relaxed) != e.server ||
                      local_failed_[e.server] || store_->failed_[e.server].load() ||
                      layout_->StaleObsolete(s, e);
    if (drop) {
      // Rewritten, trimmed or re-placed since (a re-placed split is rebuilt whole).
      store_->stats_.regenerations_pending.fetch_sub(1, std::memory_order_relaxed);
      continue;
    }
    const bool busy = layout_->StaleBusy(s, e);
    if (!Usable(e.server) || store_->Suspect(e.server) || busy || regen_inflight_ >= 16 ||
        free_ctx_count_ < 4) {
      stale_[keep++] = e;  // Later: the server is not reachable yet, or no budget now.
      continue;
    }
    store_->stats_.stale_repairs.fetch_add(1, std::memory_order_relaxed);
    layout_->RepairStale(e);
  }
  stale_.resize(keep);
}

void IoThread::Rehedge(uint64_t now) {
  if (t_->inflight() == 0) return;
  const uint64_t base = lay_.g.hedge_us != 0 ? uint64_t{lay_.g.hedge_us} * 1000
                                             : uint64_t{store_->opt_.op_timeout_ms} * 500000;
  for (const Request& rq : reqs_) {
    if (!rq.live || rq.write || rq.ctx == nullptr) continue;
    Ctx* c = rq.ctx;
    if (c->finished || c->repairing) continue;
    const uint64_t bit = 1ull << rq.split;
    if ((c->late & bit) != 0 || (c->asked & bit) == 0) continue;
    // A server whose replies are usually slow gets more time before it counts as late.
    const uint64_t ewma = rq.server < latency_ewma_ns_.size() ? latency_ewma_ns_[rq.server] : 0;
    if (now <= rq.post_ns || now - rq.post_ns < std::max(base, 4 * ewma)) continue;
    layout_->Rehedge(c, bit);
  }
}

bool IoThread::PostOrPark(Ctx* c, int j, uint8_t* buf) {
  const Slab& s = slabs_[c->slab];
  uint32_t server = s.server[j].load(std::memory_order_relaxed);
  if (server != kNoServer && s.remote[j] != 0 && Usable(server) && AtCap(server)) {
    Park(c, j);  // Posted once the server holds fewer of our requests than the cap.
    return true;
  }
  if (Post(c, j, fabric::OpKind::kWrite, buf)) return true;
  if (server != kNoServer && store_->failed_[server].load()) {
    HandleLocalFailures();  // Starts re-placing it.
    if (Post(c, j, fabric::OpKind::kWrite, buf)) return true;
    server = s.server[j].load(std::memory_order_relaxed);
  }
  if (Replacing(c->slab, j) || (server != kNoServer && server < conn_.size() &&
                                !local_failed_[server] && store_->failed_[server].load())) {
    // Written to the replacement once its slab is allocated (a server failed a moment ago,
    // whose failure this thread has not taken in yet, is re-placed when it does).
    Park(c, j);
    return true;
  }
  if (server == kNoServer || server >= conn_.size() || store_->failed_[server].load() ||
      local_failed_[server] || s.remote[j] == 0) {
    return false;
  }
  Park(c, j);
  return true;
}

void IoThread::Park(Ctx* c, int j) {
  ++c->outstanding;
  parked_.push_back({c, j, now_ns_});
}

void IoThread::ResumeParked(uint64_t now) {
  if (parked_.empty()) return;
  const uint64_t limit =
      std::max<uint64_t>(30000000000ull, 4ull * store_->opt_.op_timeout_ms * 1000000);
  std::vector<Parked> todo;
  todo.swap(parked_);
  for (const Parked& p : todo) {
    Ctx* c = p.c;
    const Slab& s = slabs_[c->slab];
    const uint32_t server = s.server[p.split].load(std::memory_order_relaxed);
    const bool give_up = now - p.since > limit;
    const bool failed = server == kNoServer || store_->failed_[server].load();
    const bool replacing =
        Replacing(c->slab, p.split) || (failed && server != kNoServer && !local_failed_[server]);
    if (!give_up && (replacing || (!failed && (!Usable(server) || AtCap(server))))) {
      // Still unreachable (or at its cap) and not failed, or its replacement is being
      // allocated: keep waiting.
      parked_.push_back(p);
      continue;
    }
    --c->outstanding;
    uint8_t* buf = layout_->WriteBuf(c, p.split);
    if (give_up || !Post(c, p.split, fabric::OpKind::kWrite, buf)) {
      if (!give_up && !failed) {
        ++c->outstanding;
        parked_.push_back(p);  // No request slot now.
        continue;
      }
      c->bad |= 1ull << p.split;
      layout_->WriteGivenUp(c);
    }
  }
}

bool IoThread::Reaskable(const Slab& s, int j) const {
  const uint32_t server = s.server[j].load(std::memory_order_relaxed);
  return server != kNoServer && server < local_failed_.size() && !local_failed_[server] &&
         !store_->failed_[server].load(std::memory_order_relaxed) && s.remote[j] != 0;
}

void IoThread::ParkRead(Ctx* c) {
  if (c->parked_since == 0) c->parked_since = now_ns_;
  if (c->read_parked) return;
  c->read_parked = true;
  parked_reads_.push_back(c);
}

void IoThread::ResumeParkedReads(uint64_t now) {
  if (parked_reads_.empty()) return;
  std::vector<Ctx*> todo;
  todo.swap(parked_reads_);
  for (Ctx* c : todo) {
    c->read_parked = false;
    if (c->finished) continue;
    const Slab& s = slabs_[c->slab];
    const bool expired = now - c->parked_since > kReadParkNs;
    for (int j = 0; j < lay_.width(); ++j) {
      const uint64_t bit = 1ull << j;
      if ((c->reask & bit) == 0) continue;
      const uint32_t server = s.server[j].load(std::memory_order_relaxed);
      if (!Reaskable(s, j) || expired) {
        c->reask &= ~bit;  // Failed (or moved) meanwhile, or not back in time: it stays lost.
      } else if (Usable(server) && !AtCap(server)) {
        c->reask &= ~bit;  // Back: ask it again.
        c->asked &= ~bit;
        c->bad &= ~bit;
        c->late &= ~bit;
      }
    }
    layout_->Reask(c);  // Asks what it may, parks it again, or finishes it.
  }
}

void IoThread::ExcuseStall(uint64_t ns) {
  if (ns < 1000000) return;  // Under a millisecond: noise, not a stall.
  for (Request& rq : reqs_) {
    // Never past now: a request is at most as old as zero.
    if (rq.live) rq.post_ns = std::min(rq.post_ns + ns, now_ns_);
  }
  // Nor is a server's silence (AbortSilentCapped) ours.
  for (uint64_t& t : last_reply_ns_) {
    if (t != 0) t = std::min(t + ns, now_ns_);
  }
}

void IoThread::AbortSilentCapped(uint64_t now) {
  for (uint32_t i = 0; i < outstanding_.size(); ++i) {
    if (outstanding_[i] < cap_ || conn_down_[i] || local_failed_[i] ||
        store_->failed_[i].load(std::memory_order_relaxed)) {
      continue;
    }
    // Busy, not stuck: it answered us lately (its replies come back while requests wait).
    if (last_reply_ns_[i] != 0 && now - last_reply_ns_[i] <= silent_abort_ns_) continue;
    uint64_t oldest = now;
    for (const Request& rq : reqs_) {
      if (rq.live && rq.server == i) oldest = std::min(oldest, rq.post_ns);
    }
    if (now - oldest <= silent_abort_ns_) continue;  // Reached the cap just now: give it time.
    const std::string why = std::to_string(outstanding_[i]) +
                            " requests outstanding (the cap per server) and no reply for " +
                            std::to_string((now - oldest) / 1000000) + " ms";
    store_->ReportTrouble(i, why);  // Suspect: asked last until it answers again.
    ConnLost(i, why);  // Reconnected off this thread (Reconnect) once it answers a handshake.
  }
}

void IoThread::HandleLocalFailures() {
  const uint64_t epoch = store_->failure_epoch_.load(std::memory_order_acquire);
  if (epoch == seen_failure_epoch_) return;
  seen_failure_epoch_ = epoch;
  for (uint32_t i = 0; i < conn_.size(); ++i) {
    if (local_failed_[i] || !store_->failed_[i].load()) continue;
    local_failed_[i] = 1;
    regen_not_before_ns_ =
        std::max(regen_not_before_ns_,
                 store_->failed_at_ns_[i].load(std::memory_order_relaxed) +
                     uint64_t{store_->opt_.regeneration_grace_ms} * 1000000);
    // In-flight ops to it complete with Cancelled (reads then ask other splits, writes re-place).
    // No GOODBYE exchange: a stopped server would hold this thread for its whole timeout.
    (void)t_->Abort(conn_[i]);
    for (Slab& s : UsedSlabs()) {
      if (!s.allocated) continue;
      for (int j = 0; j < lay_.width(); ++j) {
        if (s.server[j].load(std::memory_order_relaxed) != i) continue;
        if (s.remote[j] != 0) store_->LeaveBehind(i, s.remote[j]);
        ReplaceSplit(s, j);
      }
    }
  }
}

void IoThread::ReplaceSplit(Slab& s, int j) {
  const uint32_t slab = static_cast<uint32_t>(&s - slabs_.data());
  if (Replacing(slab, j)) return;  // Under way (an eviction notice, then the server failed).
  PendingReplace r;
  r.slab = slab;
  r.j = j;
  r.old = s.server[j].load(std::memory_order_relaxed);
  r.old_remote = s.remote[j];
  r.current.resize(lay_.width());
  for (int i = 0; i < lay_.width(); ++i) r.current[i] = s.server[i].load();
  replacing_.push_back(std::move(r));
  AskReplacement(replacing_.size() - 1);
}

bool IoThread::Replacing(uint32_t slab, int j) const {
  return std::any_of(replacing_.begin(), replacing_.end(), [&](const PendingReplace& r) {
    return r.slab == slab && r.j == j && !r.cancelled;
  });
}

void IoThread::AskReplacement(size_t i) {
  PendingReplace& r = replacing_[i];
  const Slab& s = slabs_[r.slab];
  while (r.attempt < 3 && !stop_.load(std::memory_order_relaxed)) {
    placement::ServerId chosen;
    {
      std::lock_guard<std::mutex> lock(store_->mu_);
      auto c = store_->ReplacementLocked(s.id + static_cast<uint64_t>(r.attempt), r.current, r.j);
      if (!c.ok()) {
        // Logged at 1, 2, 4, ... per thread: when servers go away, every slab they held asks.
        if (LogThisOne(++no_replacement_)) {
          TLOG(WARNING) << store_->name_ << ": no replacement for split " << r.j
                        << " of logical slab " << s.id << ": " << c.status() << " ("
                        << no_replacement_ << " splits so far on this thread)";
        }
        break;
      }
      chosen = *c;
    }
    ++r.attempt;
    if (!Usable(chosen)) {
      r.current[r.j] = chosen;  // Failed or not connected now: another one.
      continue;
    }
    {
      std::lock_guard<std::mutex> lock(store_->mu_);
      store_->load_[chosen]++;
    }
    r.chosen = chosen;
    r.tag = ++next_tag_;
    allocator_->Alloc(r.tag, chosen, store_->opt_.control_timeout_ms);
    return;
  }
  // No replacement: the member stays where it is (an erasure while its server is failed).
  replacing_.erase(replacing_.begin() + static_cast<std::ptrdiff_t>(i));
}

void IoThread::OnReplaceAnswer(size_t i, SlabAllocator::Answer& answer) {
  PendingReplace& r = replacing_[i];
  Slab& s = slabs_[r.slab];
  const uint32_t chosen = r.chosen;
  // Still the member it was asked for (not freed, and not moved by anything else).
  const bool wanted = !r.cancelled && s.allocated &&
                      s.server[r.j].load(std::memory_order_relaxed) == r.old &&
                      s.remote[r.j] == r.old_remote;
  Status why;
  if (answer.slab.ok()) {
    const fabric::AllocSlabResponse& a = *answer.slab;
    if (!wanted) {
      why = Cancelled("not wanted any more");
    } else if (Status added = Usable(chosen) ? t_->AddSlab(conn_[chosen], a)
                                             : Unavailable("data connection down");
               added.ok()) {
      const int j = r.j;
      const uint32_t old = r.old;
      const uint64_t old_remote = r.old_remote;
      replacing_.erase(replacing_.begin() + static_cast<std::ptrdiff_t>(i));
      InstallReplacement(s, j, chosen, a, old, old_remote);
      return;
    } else {
      why = added;
    }
    freer_->Free(chosen, a.slab_id);
  } else {
    why = answer.slab.status();
    if (why.code() != StatusCode::kCancelled) {
      TLOG(WARNING) << store_->name_ << ": cannot allocate a replacement slab on "
                    << store_->server(chosen).endpoint.ToString() << ": " << why;
      if (IsConnectionError(why)) {
        store_->ReportTrouble(chosen, "replacement slab allocation: " + why.ToString());
      }
    }
  }
  {
    std::lock_guard<std::mutex> lock(store_->mu_);
    if (store_->load_[chosen] > 0) store_->load_[chosen]--;
  }
  if (!wanted || why.code() == StatusCode::kCancelled) {
    replacing_.erase(replacing_.begin() + static_cast<std::ptrdiff_t>(i));
    return;
  }
  r.current[r.j] = chosen;  // Do not pick it again.
  r.chosen = kNoServer;
  r.tag = 0;
  AskReplacement(i);
}

void IoThread::InstallReplacement(Slab& s, int j, uint32_t server,
                                  const fabric::AllocSlabResponse& a, uint32_t old,
                                  uint64_t old_remote) {
  s.server[j].store(server, std::memory_order_relaxed);
  s.remote[j] = a.slab_id;
  s.remote_info[j] = a;
  const uint32_t pps = static_cast<uint32_t>(store_->pages_per_slab_);
  // What needs rebuilding: written pages (split layout), or rows in use whose member j is
  // not padding (group layout).
  auto needs = [&](uint32_t p) -> uint64_t { return layout_->NeedsRebuild(s, p, j) ? 1 : 0; };
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
  PublishSlab(static_cast<uint32_t>(&s - slabs_.data()));  // With nothing of j settled yet.
  store_->stats_.regenerations_pending.fetch_add(pending, std::memory_order_relaxed);
  if (old != kNoServer) {
    std::lock_guard<std::mutex> lock(store_->mu_);
    if (store_->load_[old] > 0) store_->load_[old]--;
  }
  if (old != kNoServer && old_remote != 0 && !store_->failed_[old].load() && !local_failed_[old]) {
    // Eviction: give the old slab back (the server drops it anyway).
    ReleaseRemote(old, old_remote);
  }
}

void IoThread::Regenerate(uint64_t now) {
  // Regeneration waits regeneration_grace_ms after the newest failure it would rebuild for,
  // so a burst of verdicts (or a verdict taken back by the operator) costs no rebuild traffic
  // at once. Reads of the missing splits are degraded meanwhile.
  if (now < regen_not_before_ns_) {
    last_tick_ns_ = now;
    return;
  }
  const uint64_t rate = store_->opt_.regeneration_pages_per_sec;
  const double elapsed = static_cast<double>(now - last_tick_ns_) / 1e9;
  last_tick_ns_ = now;
  if (rate == 0) {
    regen_tokens_ = 1e9;
  } else {
    regen_tokens_ = std::min<double>(regen_tokens_ + elapsed * static_cast<double>(rate),
                                     std::max<double>(8.0, static_cast<double>(rate) / 100));
  }
  for (Slab& s : UsedSlabs()) {
    if (!s.allocated) continue;
    for (int j = 0; j < lay_.width(); ++j) {
      if (!layout_->Regenerate(s, j)) return;
    }
  }
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
    if (detachable(rq) && !rq.ctx->detach && now > rq.post_ns && now - rq.post_ns > kLateReadNs) {
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
      // A request past the op timeout is trouble (the monitor suspects the server and probes
      // it), never a verdict by itself; one past twice the op timeout on a server the monitor
      // still finds alive is stuck on its connection: that connection is aborted and
      // reconnected, which gives back every request slot and buffer it held.
      uint32_t reported = kNoServer;
      for (const Request& rq : reqs_) {
        if (!rq.live || local_failed_[rq.server] || now <= rq.post_ns ||
            now - rq.post_ns <= limit) {
          continue;
        }
        if (now - rq.post_ns > 2 * limit && !conn_down_[rq.server] &&
            !store_->Suspect(rq.server)) {
          ConnLost(rq.server, "a request got no reply within twice the op timeout");
          continue;
        }
        if (rq.server != reported) {
          reported = rq.server;
          store_->ReportTrouble(rq.server, "no reply within the op timeout (" +
                                               std::to_string(store_->opt_.op_timeout_ms) +
                                               " ms)");
        }
      }
      DetachLateReads(now);
      AbortSilentCapped(now);
    }
    Rehedge(now);
    if (AllocationsPending()) AbandonStuckAllocs();
    Reconnect(now);
    ResumeParked(now);
    ResumeParkedReads(now);
    if (!stale_.empty()) RepairStale();
  }
  layout_->Housekeeping(now);
  if (regen_active_ > 0 || regen_inflight_ > 0) {
    Regenerate(now);
  } else {
    last_tick_ns_ = now;
  }
}


}  // namespace tessera::client::remote
