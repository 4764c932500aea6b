// Run-to-completion reads (group and erasure-coded split layouts): a thread calling the blocking
// ReadPage/ReadPages, or owning a ThreadReader, reads stored pages itself, on its own Transport,
// with no hand-off to an I/O thread and back (see "Direct reads" in client/remote_store.h).
//
// Protocol, per page:
//   1. DirectLocate: read the page's published location (slab, row, member, CRC) under its
//      seqlock, then the slab's member (server, remote slab) under the slab's seqlock.
//   2. Post one READ of the member on this thread's connection to that server (connected and
//      the slab added on first use), poll for direct_spin_us, then sleep in Wait() until
//      hedge_us (op_timeout_ms when hedging is off).
//   3. Accept the page only if the read succeeded, its CRC32C matches the published one, and
//      DirectValid: neither seqlock moved since step 1.
// Split layout, the same with the page's k + r splits: the page's published state (stored,
// zeros, or a write in flight) and the CRC of every split under the page's seqlock (a table per
// logical slab), the slab's members under the slab's; k + delta split READs (data splits first)
// and the page is assembled, or decoded with the stripe codec, from the first k whose CRC
// matches, if neither seqlock moved. The I/O thread republishes a page when a write starts
// (before posting its splits: not directly readable until it settles), when it settles, and
// when it is trimmed or unwritten, and a slab when a split moves or the slab is freed. A split
// whose CRC mismatches (corrupt, not rebuilt yet, torn) sends the page to the I/O thread,
// which repairs what is corrupt.
// Why that is enough (group): while a page is published as stored in (slab, row, member), that slot
// holds exactly the page's data: its stripe row cannot be reused before every live page left
// it, a page leaves a slot only through the I/O thread (rewrite, trim, compaction move), which
// republishes the page (version bump) before it posts anything that could overwrite the slot,
// and a member that moves to another server (failure, eviction) or a freed slab bumps the slab's
// version first. So if both versions are unchanged after the reply arrived, the reply was read
// from the slot while it held the page (the bump, the server's later write and our reply are
// ordered through the sockets). The CRC catches corruption, a replacement member not rebuilt
// yet, and torn reads of a member being rewritten. Anything else falls back to the I/O thread
// path (degraded reads, hedging, repair): never a wrong page, at worst one wasted round trip.
#include <algorithm>
#include <cstring>
#include <deque>
#include <memory>
#include <unordered_set>
#include <vector>

#include "client/remote/engine.h"
#include "client/remote/layout.h"
#include "coding/codec.h"
#include "common/logging.h"

namespace tessera::client::remote {

// ---- the caller's thread: reading ----

namespace {

constexpr size_t kBatch = 32;  // Pages per round of a direct ReadPages.
// Reply buffers of a blocking reader: a round uses up to kBatch; a read that timed out keeps
// its buffer until its reply arrives (the transport may still write it), so there are more
// than a round's worth.
constexpr size_t kBlockingSlots = 2 * kBatch;

// How a direct read ended (DirectReader::Sink).
enum class DirectOutcome : uint8_t {
  kRead,      // Read here: the page is in the caller's buffer.
  kFallback,  // Not read here: the I/O thread must read it.
  kDegraded,  // ... and its server did not answer within hedge_us: read it degraded.
  kCorrupt,   // ... and a part's CRC mismatched: the I/O thread reads that part too (repair).
};

// One thread's direct-read engine for one store: its own Transport (a Transport belongs to one
// thread), connected lazily to the servers it reads from, with the slabs it has named, and a
// fixed set of registered reply buffers ("slots", one per request). A page read ("read") asks
// one part (group: the stripe member holding the page) or k + delta parts (split layout: data
// splits first) and ends when enough parts arrived with their published CRC (group: 1; split:
// k, decoded when a data split is missing) and the page did not move meanwhile. Reads are
// started (Start, then Flush posts them in one batch), their replies reaped (Reap) and overdue
// ones given up (Expire); each started read ends exactly once through the Sink, on this
// thread. Used by a blocking ReadPages (rounds of up to kBatch pages, thread_local per store)
// and by a ThreadReader (many reads in flight; owned by its thread).
class DirectReader {
 public:
  struct Sink {
    virtual void Finished(uint64_t tag, DirectOutcome outcome) = 0;

   protected:
    ~Sink() = default;
  };
  // What Start() did with a page.
  enum class Began : uint8_t {
    kPending,   // A read is queued (posted by the next Flush), ends through the Sink.
    kZero,      // Never written or trimmed: the buffer holds zeros now (nothing to wait for).
    kFallback,  // Not directly readable now: the I/O thread must read it.
    kDegraded,  // Its server has an overdue read of ours: the I/O thread, degraded.
  };

  DirectReader(RemoteStore* store, uint32_t slots)
      : store_(store), num_slots_(slots), split_(store->layout_->DirectSplits()) {}

  Status Init(int wake_fd) {
    fabric::TransportOptions to;
    to.kind = store_->opt_.transport;
    to.max_inflight = num_slots_;
    to.ring_entries = std::max<uint32_t>(64, std::min<uint32_t>(num_slots_, 1024));
    TESSERA_ASSIGN_OR_RETURN(t_, store_->NewTransport(to));
    part_bytes_ = split_ ? store_->lay_.split : kPageSize;
    bufs_.assign(static_cast<size_t>(num_slots_) * part_bytes_, 0);
    TESSERA_RETURN_IF_ERROR(t_->RegisterMemory(bufs_.data(), bufs_.size()));
    if (wake_fd >= 0) TESSERA_RETURN_IF_ERROR(t_->SetWakeFd(wake_fd));
    servers_.resize(store_->num_servers());
    comps_.resize(std::min<uint32_t>(num_slots_, 256));
    slots_.resize(num_slots_);
    reads_.resize(num_slots_);  // A read holds at least one slot.
    spin_ns_ = uint64_t{store_->opt_.direct_spin_us} * 1000;
    reply_avg_ns_ = spin_ns_ / 2;  // Polls the whole bound until replies are measured.
    const uint64_t hedge = uint64_t{store_->lay_.g.hedge_us} * 1000;
    wait_ns_ = hedge != 0 ? hedge : uint64_t{store_->opt_.op_timeout_ms} * 1000000;
    need_ = split_ ? store_->lay_.k : 1;
    ask_ = split_ ? std::min(store_->lay_.width(), store_->lay_.k + store_->lay_.delta) : 1;
    for (uint32_t i = 0; i < num_slots_; ++i) free_.push_back(num_slots_ - 1 - i);
    for (uint32_t i = 0; i < num_slots_; ++i) free_reads_.push_back(num_slots_ - 1 - i);
    return Status::Ok();
  }

  // Starts a read of `page` into `out` (kPageSize bytes), reported to the Sink with `tag`.
  Began Start(PageId page, uint8_t* out, uint64_t tag) {
    if (page >= store_->opt_.capacity_pages) return Began::kFallback;  // I/O thread: OutOfRange.
    IoThread* th = store_->threads_[store_->ThreadOf(page)].get();
    DirectTarget t;
    if (!th->DirectLocate(page, &t)) return Began::kFallback;
    if (t.zero) {
      std::memset(out, 0, kPageSize);
      return Began::kZero;
    }
    // The parts to ask: group, the one member; split, k + delta splits, data first, on servers
    // with a connection and no overdue read of ours.
    std::array<int, kMaxWidth> pick{};
    std::array<int64_t, kMaxWidth> conn{};
    int picked = 0;
    uint64_t silent = 0;  // Parts on silent servers (Silent()), left for last.
    // Asks part j: connected to its server and the slab added there, or not asked.
    auto take = [&](int j) {
      const uint32_t server = t.part[j].server;
      const int64_t c = Connection(server);
      if (c < 0) return;
      if (!AddSlab(server, static_cast<fabric::ConnectionId>(c), t.part[j].remote)) return;
      pick[picked] = j;
      conn[picked] = c;
      ++picked;
    };
    for (int j = 0; j < t.parts && picked < ask_; ++j) {
      const uint32_t server = t.part[j].server;
      if (server == kNoServer || t.part[j].remote.slab_id == 0) continue;
      if (server >= servers_.size()) {
        // A server that joined after this reader started (RemoteStore::AddServer).
        if (server >= store_->num_servers()) continue;
        servers_.resize(store_->num_servers());
      }
      if (store_->Suspect(server)) {
        // The monitor suspects it: never wait on it (group: the I/O thread reads the page
        // degraded at once; split: the other splits).
        if (!split_) return Began::kDegraded;
        continue;
      }
      if (servers_[server].stuck > 0) {
        // A read of ours there is overdue: do not queue behind it. Once the store declares the
        // server failed, the connection goes (and the overdue reads with it).
        if (store_->failed_[server].load(std::memory_order_relaxed)) Drop(server);
        if (!split_) return Began::kDegraded;  // Hedge at once: the I/O thread asks the stripe.
        continue;
      }
      if (split_ && Silent(server)) {
        silent |= 1ull << j;
        continue;
      }
      take(j);
    }
    // Silent servers only while k cannot be had without them, never for the delta extras.
    for (uint64_t m = silent; m != 0 && picked < need_; m &= m - 1) take(std::countr_zero(m));
    if (picked < need_ || free_.size() < static_cast<size_t>(picked) || free_reads_.empty()) {
      return Began::kFallback;
    }
    const uint32_t ri = free_reads_.back();
    free_reads_.pop_back();
    PageRead& r = reads_[ri];
    r.active = true;
    r.counted = false;
    r.tag = tag;
    r.page = page;
    r.out = out;
    r.target = t;
    r.asked = r.good = 0;
    r.outstanding = 0;
    r.start_ns = MonotonicNs();
    for (int n = 0; n < picked; ++n) {
      const int j = pick[n];
      const uint32_t slot = free_.back();
      free_.pop_back();
      Slot& sl = slots_[slot];
      sl.busy = true;
      sl.handled = sl.stuck = sl.orphan = false;
      sl.gen++;
      sl.server = t.part[j].server;
      sl.read = ri;
      sl.part = j;
      r.slot[j] = slot;
      r.asked |= 1ull << j;
      ++r.outstanding;
      fabric::WorkRequest wr;
      wr.connection = static_cast<fabric::ConnectionId>(conn[n]);
      wr.op = fabric::OpKind::kRead;
      wr.slab_id = t.part[j].remote.slab_id;
      wr.remote_offset = t.offset;
      wr.length = t.length;
      wr.local = Buf(slot);
      wr.cookie = slot;
      wrs_.push_back(wr);
    }
    return Began::kPending;
  }

  // Posts the reads Start() queued, in one batch. If the transport refuses it (all or nothing),
  // each of them ends now as kFallback. Returns how many requests were posted.
  size_t Flush(Sink* sink) {
    if (wrs_.empty()) return 0;
    const size_t n = wrs_.size();
    if (Status st = t_->Post(wrs_); !st.ok()) {
      // Nothing was posted: every request's buffer is free to go (handled), then each read ends.
      for (const auto& wr : wrs_) slots_[wr.cookie].handled = true;
      for (const auto& wr : wrs_) {
        const uint32_t ri = slots_[wr.cookie].read;
        if (slots_[wr.cookie].busy && reads_[ri].active) End(ri, DirectOutcome::kFallback, sink);
      }
      wrs_.clear();
      return 0;
    }
    const uint64_t now = MonotonicNs();
    for (const auto& wr : wrs_) {
      const uint32_t slot = static_cast<uint32_t>(wr.cookie);
      order_.push_back({slot, slots_[slot].gen, now});
      PageRead& r = reads_[slots_[slot].read];
      if (!r.counted) {
        r.counted = true;
        ++live_;
      }
    }
    store_->stats_.bytes_received.fetch_add(n * part_bytes_, std::memory_order_relaxed);
    wrs_.clear();
    return n;
  }

  // Reaps replies (Poll, or Wait until `deadline` or the wake fd); each read that ends ends
  // through the Sink. Late replies of reads that ended earlier just free their buffers.
  // Returns how many live reads ended.
  size_t Reap(bool wait, Deadline deadline, Sink* sink) {
    const size_t got = wait ? t_->Wait(comps_, deadline) : t_->Poll(comps_);
    size_t finished = 0;
    const uint64_t now = got > 0 ? MonotonicNs() : 0;
    for (size_t c = 0; c < got; ++c) {
      const fabric::Completion& comp = comps_[c];
      if (comp.kind != fabric::CompletionKind::kData) continue;  // Notices: the I/O threads act.
      const uint64_t slot = comp.cookie;
      if (slot >= num_slots_ || !slots_[slot].busy) continue;
      Slot& sl = slots_[slot];
      servers_[sl.server].strikes = 0;  // It answered (or its connection went: a new one).
      servers_[sl.server].last_reply_ns = now;
      if (comp.status.ok() || !IsConnectionError(comp.status)) store_->NoteAlive(sl.server, now);
      if (!comp.status.ok() && IsConnectionError(comp.status)) {
        // A lost connection is dropped (reconnected later unless the store fails the server);
        // the I/O thread reads the page and notices the failure itself.
        Drop(sl.server);
      }
      if (sl.stuck || sl.orphan) {  // A late reply: its read ended already.
        ReleaseSlot(static_cast<uint32_t>(slot));
        continue;
      }
      const uint32_t ri = sl.read;
      PageRead& r = reads_[ri];
      sl.handled = true;  // Its buffer holds the reply (kept until the read ends).
      --r.outstanding;
      const int j = sl.part;
      if (comp.status.ok()) {
        if (coding::Crc32c(Buf(static_cast<uint32_t>(slot)), r.target.length) !=
            r.target.part[j].crc) {
          // Corrupt, a replacement not rebuilt yet, or a torn read of a page being rewritten:
          // the I/O thread reads the page -- that part included, even on a server it finds
          // slow, or the corruption would go uncounted and unrepaired -- and repairs it.
          ++finished;
          End(ri, DirectOutcome::kCorrupt, sink);
          continue;
        }
        r.good |= 1ull << j;
      }
      if (std::popcount(r.good) >= need_) {
        // Accept only the page as published when the read started (CRCs), and only if it has
        // not moved since (versions); anything else: the I/O thread sorts it out.
        const bool ok = Assemble(r) && store_->threads_[store_->ThreadOf(r.page)]->DirectValid(
                                           r.page, r.target);
        if (ok) {
          store_->threads_[store_->ThreadOf(r.page)]->RecordDirectRead(MonotonicNs() - r.start_ns);
        }
        ++finished;
        End(ri, ok ? DirectOutcome::kRead : DirectOutcome::kFallback, sink);
      } else if (std::popcount(r.good) + r.outstanding < need_) {
        ++finished;
        End(ri, DirectOutcome::kFallback, sink);  // Too few good parts: the I/O thread reads.
      }
    }
    return finished;
  }

  // Gives up the live reads posted wait_ns (hedge_us) or more before `now`: each ends as
  // kDegraded. Their outstanding requests keep their buffers until their replies arrive;
  // meanwhile this reader does not read from their servers directly.
  void Expire(uint64_t now, Sink* sink) {
    while (!order_.empty()) {
      const Posted p = order_.front();
      const Slot& sl = slots_[p.slot];
      if (!sl.busy || sl.stuck || sl.orphan || sl.handled || sl.gen != p.gen) {
        order_.pop_front();  // Ended already (or its reply came: the read is not waiting on it).
        continue;
      }
      if (p.post_ns + wait_ns_ > now) return;  // The oldest live read is not due yet.
      order_.pop_front();
      End(sl.read, DirectOutcome::kDegraded, sink);
    }
  }

  // When the oldest live read is due (Expire), or far away when none is live.
  Deadline NextExpiry() {
    while (!order_.empty()) {
      const Posted p = order_.front();
      const Slot& sl = slots_[p.slot];
      if (sl.busy && !sl.stuck && !sl.orphan && !sl.handled && sl.gen == p.gen) {
        return Deadline(p.post_ns + wait_ns_);
      }
      order_.pop_front();
    }
    return Deadline(MonotonicNs() + wait_ns_);
  }

  // Blocking: reads pages[0..n) (n <= kBatch) into out[i * kPageSize]; done[i] = 1 for each
  // page read here, degraded[i] = 1 for each whose server is not answering in time (hedge
  // now), 2 for each with a corrupt part (QueueItem::verify). Pages left undone go to the I/O
  // threads.
  void Read(const PageId* pages, size_t n, uint8_t* out, uint8_t* done, uint8_t* degraded) {
    struct RoundSink final : Sink {
      uint8_t* done;
      uint8_t* degraded;
      void Finished(uint64_t tag, DirectOutcome o) override {
        if (o == DirectOutcome::kRead) done[tag] = 1;
        if (o == DirectOutcome::kDegraded) degraded[tag] = 1;
        if (o == DirectOutcome::kCorrupt) degraded[tag] = 2;
      }
    } sink;
    sink.done = done;
    sink.degraded = degraded;
    const uint64_t start = MonotonicNs();
    if (stuck_ > 0 || orphans_ > 0) (void)Reap(false, Deadline(start), &sink);  // Late replies.
    for (size_t i = 0; i < n; ++i) {
      done[i] = 0;
      degraded[i] = 0;
      switch (Start(pages[i], out + i * kPageSize, i)) {
        case Began::kZero:
          done[i] = 1;
          store_->threads_[store_->ThreadOf(pages[i])]->RecordDirectRead(0);
          break;
        case Began::kDegraded: degraded[i] = 1; break;
        case Began::kPending:
        case Began::kFallback: break;
      }
    }
    const bool posted = Flush(&sink) > 0;
    bool slept = false;
    const uint64_t spin_until = start + DirectSpinWindowNs(reply_avg_ns_, spin_ns_);
    bool expired = false;
    while (live_ > 0) {
      if (MonotonicNs() < spin_until) {
        (void)Reap(false, Deadline(0), &sink);
      } else {
        slept = true;
        (void)Reap(true, NextExpiry(), &sink);
      }
      const size_t before = live_;
      Expire(MonotonicNs(), &sink);
      expired |= live_ != before;
    }
    if (posted && !expired) {
      // A moving average (1/8 new) of the round's reply time, a wake-up included if it slept.
      const uint64_t took = MonotonicNs() - start;
      reply_avg_ns_ = reply_avg_ns_ - reply_avg_ns_ / 8 + took / 8;
    }
    uint64_t served = 0;
    for (size_t i = 0; i < n; ++i) served += done[i];
    SharedStats& s = store_->stats_;
    if (served > 0) {
      s.reads.fetch_add(served, std::memory_order_relaxed);
      s.direct_reads.fetch_add(served, std::memory_order_relaxed);
    }
    if (posted) (slept ? s.direct_sleeps : s.direct_spin_hits).fetch_add(1);
  }

  size_t live() const { return live_; }
  // Requests whose read ended before their reply came (given up: stuck; or finished from other
  // parts: orphans). They hold their buffers, and a stuck one keeps its server out of new reads
  // (Start), until Reap() sees their replies.
  size_t late() const { return stuck_ + orphans_; }

 private:
  struct Server {
    int64_t conn = -1;         // In t_, or -1.
    uint64_t retry_ns = 0;     // No connection attempt before this (after a failure).
    uint32_t backoff_ms = 0;   // The next failure's backoff (doubles up to 1 s).
    uint32_t stuck = 0;        // Requests there that timed out and have not completed yet.
    uint32_t strikes = 0;      // Reads in a row that left a request there (see Silent()).
    uint64_t last_reply_ns = 0;  // When a reply of it was last reaped.
    bool dropped = false;      // Its connection was dropped: the next one is a reconnect.
    std::unordered_set<uint64_t> slabs;  // Added to t_ on `conn`.
  };
  struct Slot {
    bool busy = false;     // A request is queued or posted into this buffer.
    bool handled = false;  // ... and its reply was handled (the buffer holds it for its read).
    bool stuck = false;    // ... its read was given up (Expire): the server is overdue.
    bool orphan = false;   // ... its read ended without it (enough other parts came).
    uint32_t gen = 0;     // Bumped per use (order_ entries of earlier uses are stale).
    uint32_t server = 0;
    uint32_t read = 0;    // Index into reads_.
    int part = 0;
  };
  struct PageRead {
    bool active = false;   // Started and not ended (else on free_reads_).
    bool counted = false;  // Counted in live_ (posted).
    uint64_t tag = 0;
    PageId page = 0;
    uint8_t* out = nullptr;  // The caller's buffer.
    uint64_t start_ns = 0;
    DirectTarget target;
    uint64_t asked = 0;   // Parts requested.
    uint64_t good = 0;    // Parts arrived with their CRC.
    int outstanding = 0;  // Requests whose replies were not handled yet.
    std::array<uint32_t, kMaxWidth> slot{};  // Of each asked part.
  };
  struct Posted {
    uint32_t slot;
    uint32_t gen;
    uint64_t post_ns;
  };

  uint8_t* Buf(uint32_t slot) { return bufs_.data() + static_cast<size_t>(slot) * part_bytes_; }

  // Writes the page into the read's buffer from its good parts (decoding when a data split is
  // missing). False when the parts do not decode.
  bool Assemble(const PageRead& r) {
    if (!split_) {
      std::memcpy(r.out, Buf(r.slot[std::countr_zero(r.good)]), kPageSize);
      return true;
    }
    const int k = store_->lay_.k;
    const uint64_t data_mask = (1ull << k) - 1;
    if ((r.good & data_mask) == data_mask) {
      for (int j = 0; j < k; ++j) {
        std::memcpy(r.out + static_cast<size_t>(j) * part_bytes_, Buf(r.slot[j]), part_bytes_);
      }
      return true;
    }
    const uint8_t* splits[kMaxWidth] = {};
    uint64_t use = 0;
    for (int j = 0, n = 0; j < store_->lay_.width() && n < k; ++j) {
      if ((r.good & (1ull << j)) == 0) continue;
      splits[j] = Buf(r.slot[j]);
      use |= 1ull << j;
      ++n;
    }
    if (!store_->codec_->ReconstructTrusted(splits, use, r.out).ok()) return false;
    // Counted as the I/O thread counts its reads: not from the preferred (data) splits alone.
    store_->stats_.decodes.fetch_add(1, std::memory_order_relaxed);
    store_->stats_.degraded_reads.fetch_add(1, std::memory_order_relaxed);
    return true;
  }

  // Ends read `ri` (once): the buffers of its handled requests are freed; its outstanding
  // requests keep theirs until their replies arrive, as orphans, or as stuck when the read was
  // given up (kDegraded: their servers are overdue, see Start).
  void End(uint32_t ri, DirectOutcome outcome, Sink* sink) {
    PageRead& r = reads_[ri];
    if (r.counted) {
      r.counted = false;
      --live_;
    }
    for (uint64_t m = r.asked; m != 0; m &= m - 1) {
      const uint32_t slot = r.slot[std::countr_zero(m)];
      Slot& sl = slots_[slot];
      if (sl.handled) {
        ReleaseSlot(slot);
      } else if (outcome == DirectOutcome::kDegraded) {
        sl.stuck = true;
        ++stuck_;
        ++servers_[sl.server].stuck;
      } else {
        sl.orphan = true;
        ++orphans_;
        NoteLeftBehind(sl.server);
      }
    }
    r.active = false;
    free_reads_.push_back(ri);
    sink->Finished(r.tag, outcome);
  }

  // A read ended with a request still at `server` (the reply keeps its buffer until it comes).
  void NoteLeftBehind(uint32_t server) {
    if (!store_->opt_.avoid_slow_servers) return;  // No server is made silent.
    Server& sv = servers_[server];
    if (MonotonicNs() - sv.last_reply_ns < kLateReadNs) return;  // It answers: just late.
    if (sv.strikes < kLateStrikes) ++sv.strikes;
  }

  // Split layout: kLateStrikes reads in a row ended with a request left at the server, and it
  // has answered nothing since (any reply resets the strikes). Each such request holds a reply
  // buffer until it is answered: a server that stopped answering (descheduled on a loaded
  // machine, stopped) and kept being asked for the delta extra would take every buffer within
  // a few hundred reads, and then no read could start here although k other servers answer.
  // So reads ask a silent server only when they cannot reach k without it.
  bool Silent(uint32_t server) const { return servers_[server].strikes >= kLateStrikes; }
  static constexpr uint32_t kLateStrikes = 8;

  void ReleaseSlot(uint32_t slot) {
    Slot& sl = slots_[slot];
    if (sl.stuck) {
      --stuck_;
      --servers_[sl.server].stuck;
    }
    if (sl.orphan) --orphans_;
    sl.busy = sl.handled = sl.stuck = sl.orphan = false;
    free_.push_back(slot);
  }

  int64_t Connection(uint32_t server) {
    if (server >= servers_.size()) {
      // A server that joined after this reader started (RemoteStore::AddServer).
      if (server >= store_->num_servers()) return -1;
      servers_.resize(store_->num_servers());
    }
    Server& sv = servers_[server];
    if (store_->failed_[server].load(std::memory_order_relaxed)) {
      if (sv.conn >= 0) Drop(server);
      return -1;  // A failed server is never used again by this store.
    }
    if (sv.conn >= 0 && t_->Connected(static_cast<fabric::ConnectionId>(sv.conn))) return sv.conn;
    if (sv.conn >= 0) Drop(server);
    const uint64_t now = MonotonicNs();
    if (now < sv.retry_ns) return -1;
    fabric::ConnectOptions co;
    co.secret = store_->opt_.secret;
    co.client_id = store_->client_id_;
    // Short: a stopped server would hold this (faulting) thread for the whole deadline.
    co.deadline = Deadline::AfterMs(std::min<uint32_t>(store_->opt_.connect_timeout_ms, 200));
    auto c = t_->Connect(store_->server(server).endpoint, co);
    if (!c.ok()) {
      // No attempt for a while: 10 ms, doubling up to 1 s.
      sv.backoff_ms = std::min<uint32_t>(sv.backoff_ms == 0 ? 10 : sv.backoff_ms * 2, 1000);
      sv.retry_ns = MonotonicNs() + uint64_t{sv.backoff_ms} * 1000000;
      return -1;
    }
    sv.conn = *c;
    sv.backoff_ms = 0;
    if (sv.dropped) {
      sv.dropped = false;
      store_->stats_.reconnects.fetch_add(1, std::memory_order_relaxed);
    }
    sv.slabs.clear();
    return sv.conn;
  }

  bool AddSlab(uint32_t server, fabric::ConnectionId conn, const fabric::AllocSlabResponse& r) {
    Server& sv = servers_[server];
    if (sv.slabs.count(r.slab_id) != 0) return true;
    if (sv.slabs.size() >= 4096) {  // Slabs come and go: forget the old ones now and then.
      for (uint64_t id : sv.slabs) t_->RemoveSlab(conn, id);
      sv.slabs.clear();
    }
    if (!t_->AddSlab(conn, r).ok()) return false;
    sv.slabs.insert(r.slab_id);
    return true;
  }

  // Closes this thread's connection to the server (its in-flight reads complete as Cancelled).
  void Drop(uint32_t server) {
    Server& sv = servers_[server];
    if (sv.conn >= 0) {
      (void)t_->Abort(static_cast<fabric::ConnectionId>(sv.conn));
      sv.dropped = true;
    }
    sv.conn = -1;
    sv.slabs.clear();
    sv.strikes = 0;
  }

  RemoteStore* const store_;
  const uint32_t num_slots_;
  const bool split_;       // Split layout (k + delta parts per page) or group (one).
  size_t part_bytes_ = 0;  // Bytes per request: the split size, or a page.
  int need_ = 1;           // Good parts that make a page.
  int ask_ = 1;            // Parts asked per page.
  std::unique_ptr<fabric::Transport> t_;
  std::vector<uint8_t> bufs_;  // num_slots_ registered parts: replies land here.
  std::vector<Slot> slots_;
  std::vector<uint32_t> free_;  // Slots not busy.
  std::vector<PageRead> reads_;
  std::vector<uint32_t> free_reads_;  // reads_ not active.
  std::deque<Posted> order_;    // Posted requests, oldest first (Expire); stale entries skipped.
  uint32_t stuck_ = 0;          // Slots stuck.
  uint32_t orphans_ = 0;        // Slots orphaned.
  size_t live_ = 0;             // Reads posted and not ended.
  std::vector<Server> servers_;
  std::vector<fabric::Completion> comps_;
  std::vector<fabric::WorkRequest> wrs_;  // Started, not posted yet (Flush).
  uint64_t spin_ns_ = 0;       // The polling bound of a blocking round (direct_spin_us).
  uint64_t reply_avg_ns_ = 0;  // Recent rounds' reply time (see DirectSpinWindowNs).
  uint64_t wait_ns_ = 0;
};

// This thread's readers, one per store it read from. A reader whose store shut down is
// destroyed here, on its own thread, the next time this thread looks a reader up (or at exit).
struct ReaderEntry {
  uint64_t uid = 0;
  std::weak_ptr<int> alive;
  std::unique_ptr<DirectReader> reader;  // Null: its Init() failed (no direct reads here).
};
thread_local std::vector<ReaderEntry> t_readers;

DirectReader* ReaderFor(RemoteStore* store, uint64_t uid, const std::shared_ptr<int>& alive) {
  for (size_t i = 0; i < t_readers.size();) {
    if (t_readers[i].alive.expired()) {
      t_readers.erase(t_readers.begin() + static_cast<std::ptrdiff_t>(i));
      continue;
    }
    if (t_readers[i].uid == uid) {
      return t_readers[i].reader.get();
    }
    ++i;
  }
  // A round asks up to kBatch pages of one part each (group) or k + delta (split).
  const uint32_t per_page = store->layout_->DirectPartsPerPage();
  auto reader = std::make_unique<DirectReader>(store, kBlockingSlots * per_page);
  if (Status st = reader->Init(-1); !st.ok()) {
    TLOG(WARNING) << store->name_ << ": direct reads off on this thread: " << st;
    reader.reset();
  }
  t_readers.push_back(ReaderEntry{uid, alive, std::move(reader)});
  return t_readers.back().reader.get();
}

// RemoteStore::NewThreadReader: a DirectReader owned by one thread with many reads in flight;
// what it cannot read goes to the owning I/O thread's queue like a Submit()ted op (degraded
// when its server did not answer within hedge_us).
class RemoteThreadReader final : public ThreadReader, private DirectReader::Sink {
 public:
  RemoteThreadReader(RemoteStore* store, uint32_t slots) : store_(store), reader_(store, slots) {}
  ~RemoteThreadReader() override {
    while (inflight() > 0) (void)Wait(Deadline::AfterMs(100));
  }

  Status Init(int wake_fd) { return reader_.Init(wake_fd); }

  Status Submit(std::span<PageOp* const> ops) override {
    TESSERA_RETURN_IF_ERROR(PageStore::ValidateBatch(ops));
    for (size_t i = 0; i < ops.size(); ++i) {
      if (ops[i]->kind != PageOp::Kind::kRead) {
        return InvalidArgument("op ", i, " (page ", ops[i]->page, ") is not a read: a ThreadReader "
                               "only reads");
      }
    }
    if (store_->threads_.empty()) return Unavailable("page store is shut down");
    // Hand-overs are queued first and enqueued last: once an op is enqueued it may complete
    // (and its owner free the batch) at any moment, so nothing here touches an op after that.
    for (PageOp* op : ops) {
      switch (reader_.Start(op->page, op->buf, reinterpret_cast<uint64_t>(op))) {
        case DirectReader::Began::kPending: ++pending_; break;
        case DirectReader::Began::kZero:
          op->status = Status::Ok();
          store_->threads_[store_->ThreadOf(op->page)]->RecordDirectRead(0);
          CountServed(1);
          ready_.push_back(op);
          break;
        case DirectReader::Began::kFallback: HandOver(op, false, false); break;
        case DirectReader::Began::kDegraded: HandOver(op, true, false); break;
      }
    }
    EnqueueHandoffs();  // The queued reads are posted by the next Poll() or Wait().
    return Status::Ok();
  }

  size_t Poll() override {
    (void)reader_.Flush(this);  // A refused batch: every op of it is handed over.
    size_t n = 0;
    // Late replies are reaped even when no read is live: a server with a request of ours given
    // up is left out of new reads until its reply is reaped, so after a stall longer than the
    // hedge time on every server (or with every buffer held by late requests) no read can be
    // started here, and reaping only for live reads would hand every later read over for good.
    if (reader_.live() > 0 || reader_.late() > 0) n += reader_.Reap(false, Deadline(0), this);
    return n + Finish(n > 0 ? &SharedStats::direct_spin_hits : nullptr);
  }

  size_t Wait(Deadline deadline) override {
    (void)reader_.Flush(this);
    if (!ready_.empty() || !handoff_.empty() || reader_.live() == 0) return Poll();
    const Deadline expiry = reader_.NextExpiry();
    const size_t n =
        reader_.Reap(true, expiry.at_ns() < deadline.at_ns() ? expiry : deadline, this);
    return n + Finish(n > 0 ? &SharedStats::direct_sleeps : nullptr);
  }

  size_t inflight() const override { return pending_ + ready_.size(); }

 private:
  void Finished(uint64_t tag, DirectOutcome outcome) override {
    auto* op = reinterpret_cast<PageOp*>(tag);
    --pending_;  // Every read that ends was counted pending when Start() began it.
    if (outcome == DirectOutcome::kRead) {
      op->status = Status::Ok();
      CountServed(1);
      ready_.push_back(op);
      return;
    }
    HandOver(op, outcome == DirectOutcome::kDegraded, outcome == DirectOutcome::kCorrupt);
  }

  // Gives up the due reads, hands over what must be (also what Reap() just gave up), then calls
  // done() of everything ready.
  size_t Finish(std::atomic<uint64_t> SharedStats::*counter) {
    if (counter != nullptr) (store_->stats_.*counter).fetch_add(1, std::memory_order_relaxed);
    const size_t before = pending_;
    reader_.Expire(MonotonicNs(), this);
    const size_t expired = before - pending_;
    EnqueueHandoffs();
    // done() may destroy ops or submit more: run it over a list of our own.
    done_.swap(ready_);
    for (PageOp* op : done_) op->done(op);
    const size_t n = done_.size();
    done_.clear();
    return n + expired;
  }

  void CountServed(uint64_t n) {
    store_->stats_.reads.fetch_add(n, std::memory_order_relaxed);
    store_->stats_.direct_reads.fetch_add(n, std::memory_order_relaxed);
  }

  void HandOver(PageOp* op, bool degraded, bool verify) {
    const size_t thread =
        op->page >= store_->opt_.capacity_pages ? 0 : store_->ThreadOf(op->page);
    handoff_.push_back({op, thread, degraded, verify});
  }

  void EnqueueHandoffs() {
    if (handoff_.empty()) return;
    store_->stats_.direct_fallbacks.fetch_add(handoff_.size(), std::memory_order_relaxed);
    uint64_t hedged = 0;
    for (const Handoff& h : handoff_) hedged += h.degraded && !h.verify ? 1 : 0;
    if (hedged > 0) store_->stats_.direct_hedged.fetch_add(hedged, std::memory_order_relaxed);
    for (const Handoff& h : handoff_) {
      QueueItem item;
      item.op = h.op;
      item.degraded = h.degraded;
      item.verify = h.verify;
      store_->threads_[h.thread]->Enqueue(item);
    }
    handoff_.clear();
  }

  struct Handoff {
    PageOp* op;
    size_t thread;
    bool degraded;
    bool verify;
  };
  RemoteStore* const store_;
  DirectReader reader_;
  size_t pending_ = 0;            // Ops whose direct read is posted (or queued) and not ended.
  std::vector<PageOp*> ready_;    // Read here (or zeros): done() at the next Poll()/Wait().
  std::vector<PageOp*> done_;
  std::vector<Handoff> handoff_;  // For the I/O threads, enqueued at the end of the call.
};

}  // namespace

Result<std::unique_ptr<ThreadReader>> RemoteStore::NewThreadReader(
    const ThreadReaderOptions& options) {
  if (!layout_->DirectReads()) {
    return Unsupported(name_, ": run-to-completion reads need an erasure-coded layout (split or "
                       "group), not copies");
  }
  if (!opt_.direct_reads) return Unsupported(name_, ": direct reads are turned off");
  if (threads_.empty()) return Unavailable("page store is shut down");
  if (options.max_inflight < 1 || options.max_inflight > 4096) {
    return InvalidArgument("ThreadReaderOptions::max_inflight must be in 1..4096, got ",
                           options.max_inflight);
  }
  auto r = std::make_unique<RemoteThreadReader>(this, options.max_inflight);
  TESSERA_RETURN_IF_ERROR(r->Init(options.wake_fd));
  return std::unique_ptr<ThreadReader>(std::move(r));
}

uint64_t RemoteStore::NextUid() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

void RemoteStore::DropThreadReader() {
  for (size_t i = 0; i < t_readers.size(); ++i) {
    if (t_readers[i].uid == uid_) {
      t_readers.erase(t_readers.begin() + static_cast<std::ptrdiff_t>(i));
      return;
    }
  }
}

Status RemoteStore::ReadPage(PageId page, uint8_t* out) {
  return ReadPages(&page, 1, out);
}

Status RemoteStore::ReadPages(const PageId* pages, size_t count, uint8_t* out) {
  if (count == 0) return Status::Ok();
  if (pages == nullptr || out == nullptr) return InvalidArgument("null pages or buffer");
  DirectReader* reader = nullptr;
  // Group layout, and the erasure-coded split layout (not copies: no published tables).
  if (layout_->DirectReads() && opt_.direct_reads && !threads_.empty()) {
    reader = ReaderFor(this, uid_, alive_);
  }
  if (reader == nullptr) return ReadThroughIoThreads(pages, count, out, nullptr);
  Status first;
  std::array<uint8_t, kBatch> done{}, degraded{};
  std::array<PageId, kBatch> left{};
  std::array<uint8_t, kBatch> left_degraded{};
  std::array<uint8_t, kBatch * kPageSize>* scratch = nullptr;
  std::unique_ptr<std::array<uint8_t, kBatch * kPageSize>> scratch_owner;
  for (size_t base = 0; base < count; base += kBatch) {
    const size_t n = std::min(kBatch, count - base);
    uint8_t* chunk = out + base * kPageSize;
    reader->Read(pages + base, n, chunk, done.data(), degraded.data());
    size_t m = 0;
    for (size_t i = 0; i < n; ++i) {
      if (done[i]) continue;
      left[m] = pages[base + i];
      left_degraded[m] = degraded[i];
      ++m;
    }
    if (m == 0) continue;
    stats_.direct_fallbacks.fetch_add(m, std::memory_order_relaxed);
    const auto hedged = std::count(left_degraded.begin(), left_degraded.begin() + m, uint8_t{1});
    if (hedged > 0) stats_.direct_hedged.fetch_add(hedged, std::memory_order_relaxed);
    Status st;
    if (m == n) {
      st = ReadThroughIoThreads(left.data(), m, chunk, left_degraded.data());
    } else {
      // Some pages of the chunk were read here: the rest go through a scratch buffer.
      if (scratch == nullptr) {
        scratch_owner = std::make_unique<std::array<uint8_t, kBatch * kPageSize>>();
        scratch = scratch_owner.get();
      }
      st = ReadThroughIoThreads(left.data(), m, scratch->data(), left_degraded.data());
      size_t k = 0;
      for (size_t i = 0; i < n; ++i) {
        if (done[i]) continue;
        std::memcpy(chunk + i * kPageSize, scratch->data() + k * kPageSize, kPageSize);
        ++k;
      }
    }
    if (first.ok() && !st.ok()) first = st;
  }
  return first;
}

Status RemoteStore::ReadThroughIoThreads(const PageId* pages, size_t count, uint8_t* out,
                                         const uint8_t* degraded) {
  if (threads_.empty()) return Unavailable("page store is shut down");
  std::unique_ptr<PageOp[]> ops(new PageOp[count]);
  OpWaiter waiter;
  waiter.Arm(ops.get(), count);
  for (size_t i = 0; i < count; ++i) {
    PageOp& op = ops[i];
    op.kind = PageOp::Kind::kRead;
    op.page = pages[i];
    op.buf = out + i * kPageSize;
    QueueItem item;
    item.op = &op;
    item.degraded = degraded != nullptr && degraded[i] == 1;
    item.verify = degraded != nullptr && degraded[i] == 2;
    threads_[op.page >= opt_.capacity_pages ? 0 : ThreadOf(op.page)]->Enqueue(item);
  }
  return waiter.Wait(ops.get(), count);
}

}  // namespace tessera::client::remote
