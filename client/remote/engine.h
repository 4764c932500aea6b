// The remote PageStore engine's shared types (internal to client/remote/; see
// client/remote_store.h for the layouts, the CRC design and the threading model).
//
// The engine is one class per I/O thread (IoThread) and one per store (RemoteStore). What
// depends on the layout is behind one Layout per I/O thread (layout.h): SplitLayout (split and
// copies) and GroupLayout. Their methods are implemented in one file per concern, the way eRPC
// splits rpc_impl/:
//   io_thread.cc         thread start, connection setup, the loop, posting, completions
//   layout.cc            the factory choosing a layout's class
//   split_layout.cc      split layout and copies: hooks, direct-read tables
//   read_path.cc         split layout: k+delta reads, verification, decode, corrupt-split repair
//   write_path.cc        split layout: encode, k+r writes, acknowledgement, per-page write queue
//   slab_alloc.cc        split layout: writes waiting for a new slab, items held behind them
//   group_layout.cc      group layout: hooks, rebuilds, direct-read tables
//   group_read.cc        group layout: one-server reads, degraded (stripe) reads, hedging
//   group_write.cc       group layout: stripe buffer, stripe writes, slabs allocated ahead,
//                        compaction, group trim
//   stripe_codec.cc      RS(k,r) across k whole pages (ISA-L)
//   slabs.cc             placement of new slabs, their allocation off the I/O thread
//                        (SlabAllocator), repair writes' end
//   trim.cc              trims and freeing remote slabs
//   recovery.cc          failed servers, eviction notices, re-placement (off the I/O thread),
//                        regeneration, op timeouts, the cap per server, reconnects
//   direct_read.cc       run-to-completion reads on the caller's thread
//   direct_publish.cc    the slab members the I/O threads publish for them; locating a page
//                        (the published tables' types: direct_tables.h)
//   failure_detector.cc  heartbeats (monitor thread), failure marking, straggler classification
//   server_list.cc       server lists, cluster files, option names
//   store.cc             RemoteStore: validation, start, Submit/Flush/Stats, the factories
//
// Threads: everything an IoThread owns (its transport, op contexts, request slots, slab table,
// its layout, ...) is touched by that thread only, without locks. What other threads touch is
// marked per field below: atomics, or the mutex named next to the field.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <boost/lockfree/queue.hpp>

#include "client/page_store.h"
#include "client/remote/direct_tables.h"
#include "client/remote/health.h"
#include "client/remote/slab_allocator.h"
#include "client/remote/slab_freer.h"
#include "client/remote/stripe_codec.h"
#include "client/remote_store.h"
#include "coding/codec.h"
#include "common/clock.h"
#include "common/fd.h"
#include "common/histogram.h"
#include "fabric/control_client.h"
#include "fabric/transport.h"
#include "placement/membership_snapshot.h"

namespace tessera::client::remote {

constexpr fabric::ConnectionId kNoConn = ~fabric::ConnectionId{0};  // A server never connected.
constexpr uint32_t kNoSlot = ~0u;
constexpr PageId kNoPage = ~PageId{0};
// Group layout: pages are owned by I/O threads in runs of this many consecutive pages.
constexpr uint64_t kGroupRun = 64;
constexpr size_t kMaxServersForMedian = 4096;
// Servers a store can know over its lifetime: the initial list plus every later join
// (AddServer); indices are never reused, a failed server keeps its index.
constexpr uint32_t kMaxServers = 1024;
// A finished read's request this old (500 us) is let go (IoThread::DetachLateReads).
constexpr uint64_t kLateReadNs = 500000;

inline bool IsConnectionError(const Status& s) {
  return s.code() == StatusCode::kUnavailable || s.code() == StatusCode::kCancelled ||
         s.code() == StatusCode::kTimeout;
}

// Logs the 1st, 2nd, 4th, 8th, ... occurrence of a repeated event (counter is the count after
// this occurrence).
inline bool LogThisOne(uint64_t count) { return count != 0 && (count & (count - 1)) == 0; }

// What a store is: (k data splits, r redundant splits, how redundancy is computed, and how
// pages map onto splits).
struct LayoutParams {
  int k = 1;
  int r = 0;
  bool copies = false;  // Replication: every split is the whole page.
  // Group (EC-Batch): every split is a whole page of its own; row i of a logical slab's k+r
  // remote slabs is one stripe of k data pages and r parity pages.
  bool group = false;
  size_t split = kPageSize;  // Bytes per split (copies and group: one page).
  int delta = 0;             // Extra splits asked by a (split layout / degraded group) read.
  AckPolicy ack = AckPolicy::kAll;
  GroupOptions g;            // Group layout only.
  int width() const { return k + r; }
};

class RemoteStore;
class IoThread;
class Layout;       // layout.h
class StoreLayout;  // layout.h

// One page op in progress (user read/write, or an internal regeneration).
// Owned by one IoThread.
struct Ctx {
  enum class Kind : uint8_t {
    kRead,   // A user read.
    kWrite,  // A user write (split layout: the k+r split writes of one page).
    kRegen,  // Rebuild one split (split layout) / stripe member (group) onto a replacement.
    kMove,   // Group: read a live page of a stripe being compacted (it is then rewritten).
    kStripe,  // Group: the k+r page writes of one stripe.
    kReclaim  // Group: read the garbage slots and parity of a stripe to reuse the slots.
  };
  Kind kind = Kind::kRead;
  PageOp* op = nullptr;
  PageId page = 0;
  uint32_t slab = 0;  // Index into the thread's slab table.
  uint32_t pidx = 0;  // Page index (split layout) or row (group) inside the slab.
  int col = 0;        // Group: the stripe member holding the page read.
  uint64_t start_ns = 0;
  uint32_t seq = 0;  // Page write sequence when the op started.
  uint8_t* buf = nullptr;  // width * split bytes (copies: one page, all splits alias it).
  std::array<uint32_t, kMaxWidth> crcs{};
  uint64_t asked = 0;    // Splits requested (read) / to store (write).
  uint64_t good = 0;     // Read: verified splits. Write: stored splits.
  uint64_t bad = 0;      // Failed or mismatching splits.
  uint64_t corrupt = 0;  // CRC mismatches on live servers.
  uint64_t zero = 0;     // Group: stripe members that are padding (all zeros, never stored).
  int outstanding = 0;   // Requests posted and not completed.
  int regen_split = -1;
  bool finished = false;  // The logical op is over (user notified).
  bool acked = false;
  bool repairing = false;
  bool released = false;
  bool slab_ref = false;  // Counted in its slab's refs (see IoThread::Attach).
  bool stripe_ref = false;  // Group: counted in its stripe's refs (the row is not reused).
  bool degraded = false;    // Group: the read asked the rest of the stripe.
  bool scrub = false;       // Group kRegen: rewriting a member found corrupt (not a lost one).
  bool verify = false;      // Split read: see QueueItem::verify (slow servers asked in pass 0).
  bool extend = false;      // Group kStripe: fills padding slots of the open stripe in place.
  uint64_t retried = 0;  // Write splits already posted a second time.
  // Read (both layouts): splits (members) whose request failed only because their server's data
  // connection was down (lost, being reconnected), on a server that is not failed: asked again
  // once the connection is back, rather than counted lost (IoThread::ParkRead).
  uint64_t reask = 0;
  bool read_parked = false;     // In IoThread::parked_reads_.
  uint64_t parked_since = 0;    // When ParkRead() first held it (0: never).
  // Set by DetachLateReads() while it lets this finished read's late requests go.
  bool detach = false;
  uint8_t* detach_old = nullptr;  // The buffer those requests keep.
  // Asked members whose requests are overdue (Rehedge): counted as not coming when deciding
  // whether to ask more; a late reply still counts.
  uint64_t late = 0;
  Ctx* next_write = nullptr;  // Writes of the same page queued behind this one.
  Ctx* next_free = nullptr;
};

// One posted WorkRequest (its index is the cookie). Owned by one IoThread.
struct Request {
  Ctx* ctx = nullptr;  // Null: an orphan (see IoThread::DetachLateReads).
  uint8_t* orphan_buf = nullptr;  // An orphan's reply buffer (a detached op buffer).
  int split = 0;
  uint32_t server = 0;
  uint64_t post_ns = 0;
  uint32_t next_free = 0;
  bool live = false;
  bool write = false;
};

// Group layout: one stripe (a row of a logical slab). Owned by one IoThread.
struct Stripe {
  enum class State : uint8_t { kFree, kWriting, kSealed };
  State state = State::kFree;
  uint8_t live = 0;   // Data slots whose page still lives here.
  uint16_t refs = 0;  // Op contexts reading or rebuilding members of this stripe.
  uint64_t zero = 0;  // Members that are padding (never stored, all zeros).
  uint64_t rebuilding = 0;  // Members being rebuilt or updated in place (not readable yet).
  uint32_t gen = 0;         // Bumped every time a new stripe is sealed into this row.
  std::array<PageId, coding::kMaxDataSplits> page{};  // Page of each data slot, or kNoPage.
  std::array<uint32_t, kMaxWidth> crc{};              // Of every member as stored.
};

// A logical slab: width remote slabs on width servers of one placement group, and the metadata
// of what it stores. Owned by one IoThread, except `server`, which ServersOfPage() reads from
// any thread (atomic, relaxed: a tool's snapshot).
struct Slab {
  bool allocated = false;
  uint64_t id = 0;  // Logical slab number (unique in the store; placement's key).
  std::array<std::atomic<uint32_t>, kMaxWidth> server;
  std::array<uint64_t, kMaxWidth> remote{};
  // The AllocSlab replies of the remote slabs (their address and key; for direct readers, whose
  // transports must AddSlab them). slab_id 0: none.
  std::array<fabric::AllocSlabResponse, kMaxWidth> remote_info{};
  std::array<uint32_t, kMaxWidth> regen_cursor{};  // Pages/rows below are rebuilt; pps = complete.
  std::vector<uint32_t> crc;  // pps * width.
  std::vector<uint32_t> seq;
  std::vector<uint8_t> written;
  std::vector<Ctx*> busy;  // The write in flight on each page (head of its queue).
  // A trim arrived while a write of the page was in flight (and no write was queued after the
  // trim): the page reads as zeros and becomes never-written when that write settles.
  std::vector<uint8_t> trim_after;
  // Group layout: per row.
  std::vector<Stripe> stripes;
  uint32_t stripes_used = 0;  // Rows not kFree.
  uint32_t row_cursor = 0;    // Where the search for a free row starts.
  bool draining = false;      // Compaction is emptying it: no new stripes go here.
  uint32_t written_count = 0;  // Pages with written[p] set (split layout).
  uint32_t refs = 0;           // Op contexts (user ops, regeneration) using this slab.
  bool free_wanted = false;    // A trim touched it: free the remote slabs once nothing is left.
  Slab() {
    for (auto& s : server) s.store(kNoServer, std::memory_order_relaxed);
  }
};

// A Trim() or Flush() in progress: one QueueItem per I/O thread points at it; each thread applies
// it to its own pages and calls Done(). Travelling through the queues orders it after every op
// submitted before it.
struct QueueJob {
  PageId first = 0;
  uint64_t count = 0;
  std::mutex mu;
  std::condition_variable cv;
  int left = 0;          // Guarded by mu.
  Status status;         // Guarded by mu: the first error.
  void Done(Status st) {
    std::lock_guard<std::mutex> lock(mu);
    if (status.ok() && !st.ok()) status = std::move(st);
    --left;
    cv.notify_all();
  }
};

// ServersOfPage() of the group layout asks the owning I/O thread (only it may read the page
// table) through its queue.
struct LocateJob {
  PageId page = 0;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;  // Guarded by mu.
  Result<std::vector<size_t>> result = NotFound("not located");  // Guarded by mu.
  void Done(Result<std::vector<size_t>> r) {
    std::lock_guard<std::mutex> lock(mu);
    result = std::move(r);
    done = true;
    cv.notify_all();
  }
};

// What travels through an I/O thread's queue: a page op, a trim (its own kind, so a trim is
// ordered after the writes submitted before it), or a group-layout location query.
struct QueueItem {
  enum class Kind : uint8_t { kPage, kTrim, kFlush, kLocate };
  Kind kind = Kind::kPage;
  PageOp* op = nullptr;         // kPage.
  QueueJob* trim = nullptr;      // kTrim, kFlush.
  LocateJob* locate = nullptr;  // kLocate.
  // kPage read (group layout): ask the rest of the stripe at once, as for a slow server (a
  // direct read of the page's own server just timed out).
  bool degraded = false;
  // kPage read: a direct read found a part of the page corrupt (CRC): ask it even if its server
  // is classified slow (group: the page's own member; split: slow servers in the first pass),
  // so that the corruption is counted and repaired.
  bool verify = false;
};

// Counters every thread updates (relaxed atomics; read by Stats()).
struct SharedStats {
  std::atomic<uint64_t> reads{0}, writes{0}, read_errors{0}, write_errors{0}, trims{0},
      degraded_reads{0}, decodes{0}, corruptions_detected{0}, corruptions_repaired{0},
      data_loss{0}, server_failures{0}, regenerations_done{0}, regenerations_pending{0},
      bytes_sent{0}, bytes_received{0}, slabs_freed{0}, hedged_reads{0}, compaction_moves{0},
      stripes_written{0}, padding_slots{0}, remote_slabs{0}, stored_pages{0},
      parity_updates{0}, direct_reads{0}, direct_fallbacks{0}, direct_hedged{0},
      direct_spin_hits{0}, direct_sleeps{0}, slots_reclaimed{0}, server_suspicions{0}, server_recoveries{0},
      reconnects{0}, stale_repairs{0}, verdicts_held{0}, allocs_abandoned{0};
};

// A reconnect's TCP connect and authentication handshake, tried on a thread of its own
// (IoThread::Reconnect): the thread is detached and touches nothing but this shared state, so
// a store shutting down never waits for a handshake with a stopped server.
struct ReconnectProbe {
  std::atomic<bool> done{false};  // The thread set status and server_id (release).
  Status status;
  uint64_t server_id = 0;  // The instance that answered.
  uint64_t ready_ns = 0;   // Simulation: the simulated time the handshake ends (else 0).
};

// A split (group: stripe member) that a write could not store on a live server, to rewrite from
// the other members once the server is reachable again (IoThread::RepairStale).
struct StaleSplit {
  uint32_t slab, pidx, server;
  int j;
  uint32_t seq;  // Split layout: the page's write sequence; group: the stripe's gen.
};

class IoThread {
 public:
  IoThread(RemoteStore* store, int index);
  ~IoThread();
  // Spawns the thread, connects, returns the connect status. Owner thread (the store's).
  // Simulation (RemoteStoreOptions::sim): sets the thread up on the caller's thread and spawns
  // nothing; SimTurn() then runs it, and RequestStop() tears it down on the caller's thread.
  Status Start();
  void RequestStop();
  // Simulation only: one turn of the loop (what the thread does between two sleeps) on the
  // caller's thread. Returns when the thread wants to run again (simulated MonotonicNs):
  // now after progress; else when its sleep would end or its allocator or freer would wake it,
  // whichever comes first. A reply from the transport wakes it as well (the simulation's
  // transport knows when the next one arrives).
  uint64_t SimTurn();
  // Any thread.
  void Enqueue(QueueItem item);
  void Wake();
  void CopyHistograms(LatencyHistogram* read, LatencyHistogram* write);
  Result<std::vector<size_t>> ServersOf(PageId page) const;
  // Number of acknowledged writes whose splits are not all stored yet (any thread). Group
  // layout: also the pages waiting in the stripe buffer.
  uint64_t unsettled() const { return unsettled_.load(std::memory_order_acquire); }
  // ---- direct_read.cc: any thread ----
  // Where page `page` (owned by this thread) is stored, for a read on the caller's own thread
  // (group: its stripe member; split: its k + r splits). False when it is not directly readable
  // now (ask the I/O thread).
  bool DirectLocate(PageId page, DirectTarget* out) const;
  // True when neither the page's nor its slab's location moved since DirectLocate().
  bool DirectValid(PageId page, const DirectTarget& t) const;
  // Records a direct read's latency in this thread's read histogram (Stats()).
  void RecordDirectRead(uint64_t latency_ns);
  // Servers this thread has connected to (its per-server vectors' size); AddServer() waits until
  // every thread reaches the new count. Written by the I/O thread, read by any thread.
  uint32_t synced_servers() const { return synced_servers_.load(std::memory_order_acquire); }
  // Group layout: seal the stripe buffer now instead of after fill_us (Flush()). Any thread.
  void RequestSeal() {
    seal_wanted_.store(true, std::memory_order_release);
    Wake();
  }

 private:
  // The layouts are the I/O thread's own parts: they use its engine (posting, op contexts, the
  // slab table, failure handling) directly.
  friend class SplitLayout;
  friend class GroupLayout;
  // ---- io_thread.cc ----
  // The thread's body: Prepare(), Loop() until stopped, Teardown().
  void Run(std::promise<Status>* started);
  // Sets up the allocator, the freer, the transport and its connections, op contexts and
  // request slots, and the layout.
  Status Prepare();
  // Ends the allocations, fails queued ops, gives in-flight ones a bounded time, frees the
  // remote slabs on a clean shutdown and destroys the transport.
  void Teardown();
  // One iteration of the loop without its sleep: 0 when it made progress (run it again at
  // once), else how long it may sleep.
  uint64_t Turn();
  Status Connect();
  // Connects this thread to server i (data connection + control client) and grows the
  // per-server vectors to i + 1. The I/O thread only.
  Status ConnectServer(uint32_t i);
  // Connects to servers added since the last call (RemoteStore::AddServer); a server it cannot
  // reach is marked failed. Called by the loop when store_->num_servers() grew.
  void SyncServers();
  void Loop();
  bool Drain();  // True when it took anything from the queue.
  void StartOp(PageOp* op, bool degraded = false, bool verify = false);
  bool Post(Ctx* c, int split, fabric::OpKind kind, uint8_t* local);
  // Hands the requests Post() collected to the transport in one batch (one submit for all of
  // them; frames bound for one server leave in one send).
  void FlushPosts();
  // Sleeps until a completion, a Submit() (eventfd) or `timeout_ns`.
  void Sleep(uint64_t timeout_ns);
  void OnCompletion(const fabric::Completion& comp);
  void Complete(PageOp* op, Status st, uint64_t start_ns);
  void MaybeRelease(Ctx* c);
  // Late binding leaves a finished read's extra requests in flight; one to a server that does
  // not answer (stopped) would hold the op context until the op timeout, and enough of them
  // stall the store. Requests of finished reads older than kLateReadNs are detached: the
  // context takes a spare buffer and is released, the requests keep the old buffer (returned to
  // the spare pool when their replies, ignored, arrive). I/O thread; from the timeout scan.
  void DetachLateReads(uint64_t now);
  Ctx* NewCtx();
  uint8_t* SplitBuf(Ctx* c, int j);
  void Attach(Ctx* c, uint32_t slab) {
    c->slab = slab;
    c->slab_ref = true;
    ++slabs_[slab].refs;
  }
  // ---- slabs.cc: slab allocation, off this thread ----
  // Every ALLOC control call (a new slab's members, the replacement of a member) is made by
  // allocator_'s workers; this thread places, hands the calls over, and takes the answers in
  // TakeAllocAnswers() (from the loop). It never waits on the network for a slab.
  //
  // Starts allocating slab `s` (not allocated, not being allocated): places it and asks for
  // every member; a member that cannot be had is re-placed (kMaxAllocReplacements times at
  // most) or, in the group layout (KeepsMissingMembers), left missing (up to r of them). Ends,
  // now or later, with layout_->SlabReady(slab, status): the slab is allocated (FinishSlab), or
  // what it got was given back.
  void BeginAllocate(Slab& s);
  // Slab `slab` is being allocated (its members got so far are in its Slab).
  bool Allocating(uint32_t slab) const;
  // New slabs or replacements being allocated.
  bool AllocationsPending() const { return !allocs_.empty() || !replacing_.empty(); }
  // Handles the allocator's answers; true when there were any.
  bool TakeAllocAnswers();
  // Stops waiting for the ALLOCs out to servers that turned suspect or failed (or whose data
  // connection is down) since they were asked, when another server can take the member: it is
  // asked there instead, and the late answer's slab, if any, is given back. A stopped server
  // holds a new slab (or a replacement) until its suspicion, not for the call's deadline.
  // From Housekeeping.
  void AbandonStuckAllocs();
  // Shutdown: stops allocator_ and takes its last answers (calls not made are Cancelled).
  void StopAllocations();
  // The placement of slab `s` (its id set, its servers counted in the store's load).
  Result<std::vector<placement::ServerId>> PlaceSlab(Slab& s);
  // A new slab's member j (logical slab ls) could not be allocated on servers[j] (`why`): puts
  // placement's replacement in servers[j], counted in the store's load. False when there is
  // none. A member is re-placed at most kMaxAllocReplacements times.
  bool ReplaceNewMember(uint64_t ls, std::vector<placement::ServerId>& servers, int j,
                        const Status& why);
  static constexpr int kMaxAllocReplacements = 3;
  void FinishSlab(Slab& s);
  struct PendingAlloc {
    uint32_t slab = kNoSlot;
    std::vector<placement::ServerId> servers;
    std::array<uint64_t, kMaxWidth> tag{};   // Of each member's ALLOC out.
    std::array<uint8_t, kMaxWidth> tries{};  // Replacements made per member.
    uint64_t asked = 0;                      // Members whose ALLOC is out.
    uint64_t got = 0;                        // Members allocated (known to the data transport).
    uint64_t missing = 0;  // Group layout: members left missing (see BeginAllocate).
    Status failed;         // Not ok: the allocation failed; answers still out are given back.
  };
  void AskMember(PendingAlloc& a, int j);
  // Re-places member j of `a` after `why`; false when it is not asked again (left missing, or
  // the allocation failed).
  bool ReplaceMember(PendingAlloc& a, int j, const Status& why);
  void OnAllocAnswer(SlabAllocator::Answer& answer);
  // Ends allocs_[i] once no answer is out (see BeginAllocate).
  void MaybeEndAlloc(size_t i);
  // A member being re-placed (ReplaceSplit): its old server and remote slab, the servers not
  // to choose, and the replacement whose ALLOC is out. The member stays where it is meanwhile
  // (an erasure for reads when its server failed; writes to it wait, PostOrPark).
  struct PendingReplace {
    uint64_t tag = 0;
    uint32_t slab = 0;
    int j = 0;
    uint32_t old = kNoServer;
    uint64_t old_remote = 0;
    std::vector<placement::ServerId> current;
    uint32_t chosen = kNoServer;
    int attempt = 0;
    bool cancelled = false;  // The slab was freed meanwhile: the answer is given back.
  };
  // Asks for replacing_[i]'s next replacement; erases it when there is none.
  void AskReplacement(size_t i);
  void OnReplaceAnswer(size_t i, SlabAllocator::Answer& answer);
  // Member j of `s` moves to `server`, whose remote slab `r` is known to the data transport;
  // its pages are rebuilt there by regeneration.
  void InstallReplacement(Slab& s, int j, uint32_t server, const fabric::AllocSlabResponse& r,
                          uint32_t old, uint64_t old_remote);
  // Member j of slab `slab` is being re-placed.
  bool Replacing(uint32_t slab, int j) const;
  // Trims dispatched while allocations were out complete once those ended (their slabs given
  // back if the trim left them unwanted): handed to freer_ then.
  void MaybeReleaseTrims();
  // A repair or regeneration write (of either layout) completed with `st`.
  void RepairWritten(Ctx* c, const Status& st);
  void Dispatch(const QueueItem& item);
  // Ends a queue item the thread will not serve (shutdown): its op, trim, flush or locate gets
  // Unavailable.
  void FailAtShutdown(const QueueItem& item);
  // ---- direct_read.cc (I/O thread) ----
  // Publishes slab `slab`'s members for direct readers. Call after every change of a slab's
  // servers.
  void PublishSlab(uint32_t slab);
  void PublishSettled(const Slab& s, int j);  // dslab_'s settled[j]: s.regen_cursor[j].
  // ---- trim.cc ----
  void MaybeFreeSlab(Slab& s);
  // Releases every allocated slab's remote slabs (clean shutdown; freer_->Finish bounds it).
  void FreeAllSlabs();
  // ---- recovery.cc ----
  // Something went wrong with `server` (st: the error). A lost data connection is aborted and
  // reconnected (ConnLost); anything else is reported to the monitor as trouble (suspicion,
  // which a probe must confirm before the server is failed). Never fails a server by itself.
  void ServerError(uint32_t server, const Status& st);
  // The data connection to `server` is unusable: abort it (its requests complete as Cancelled:
  // reads ask other members, writes leave that split stale, repaired after the reconnect) and
  // reconnect from Housekeeping.
  void ConnLost(uint32_t server, const std::string& why);
  // Reconnects the lost data connections that are due: a ReconnectProbe (connect and
  // handshake with the store's credential) runs on a thread of its own first, and only once the
  // server answered it does this thread connect its transport (bounded by kReconnectMs: the
  // server answered a handshake a moment ago). A Transport belongs to one thread and cannot
  // take over a connection made on another (the verbs transport's queue pair is set up on its
  // own thread), so that last connect stays here. After a failed attempt, a server the
  // monitor suspects is left to the monitor until it answers again.
  void Reconnect(uint64_t now);
  std::shared_ptr<ReconnectProbe> StartReconnectProbe(uint32_t server);
  static constexpr uint32_t kReconnectMs = 100;
  // A split (group: stripe member) that a write could not store on a live server: rewritten
  // from the other members once the server is reachable again (RepairStale).
  void NoteStale(uint32_t slab, uint32_t pidx, int j, uint32_t server);
  // Posts write split (stripe member) j of c, re-placing it first if its server is failed.
  // When its server is not failed but cannot take it now (data connection down, no request
  // slot), parks it (Park) instead. False only when there is nowhere to write it.
  bool PostOrPark(Ctx* c, int j, uint8_t* buf);
  // A write split that waits for its server to be reachable again (reconnected) or failed
  // (re-placed), for at most kParkNs; holds one of c->outstanding meanwhile (ResumeParked).
  void Park(Ctx* c, int j);
  void ResumeParked(uint64_t now);
  // A read (or regeneration read) that cannot reach k yet waits, for at most kReadParkNs, and
  // is asked again (Layout::Reask) every housekeeping tick: when the splits in c->reask have
  // their servers' data connections back (asked again) or are failed (they stay lost), and
  // (group) when the stripe it reads settles after an update in place. Without it, a read
  // during a reconnect to a live server with r other members out failed with DataLoss, and a
  // degraded read racing an update in place waited for its own (stopped) member.
  void ParkRead(Ctx* c);
  // Whether c may (still) be parked: kReadParkNs since it first was has not passed, and op
  // contexts do not run short (parked reads hold theirs, and what they wait for may need one).
  bool MayPark(const Ctx* c) const {
    return (c->parked_since == 0 || now_ns_ - c->parked_since <= kReadParkNs) &&
           (c->read_parked || free_ctx_count_ >= 8);
  }
  void ResumeParkedReads(uint64_t now);
  // Can split j of `s` be asked again once its server's connection is back? (A server that is
  // not failed, a member that exists.)
  bool Reaskable(const Slab& s, int j) const;
  // Read split (member) j of c failed with st: if it was lost with its connection
  // (Unavailable: it went down; Cancelled: aborted to reconnect) on a server that is not
  // failed, it is to be asked again once the connection is back (c->reask).
  void NoteLostRead(Ctx* c, int j, const Status& st) {
    if ((st.code() == StatusCode::kUnavailable || st.code() == StatusCode::kCancelled) &&
        Reaskable(slabs_[c->slab], j)) {
      c->reask |= 1ull << j;
    }
  }
  void RepairStale();
  // Can new requests go to `server` on this thread's data connection?
  bool Usable(uint32_t server) const;  // Defined after RemoteStore.
  // `server` holds as many of this thread's requests as it may (max_outstanding_per_server):
  // reads leave it out (AskPass), writes to it wait (PostOrPark, ResumeParked).
  bool AtCap(uint32_t server) const {
    return server < outstanding_.size() && outstanding_[server] >= cap_;
  }
  // Aborts the data connection of every server at its cap that has given this thread no reply
  // for silent_abort_ns_ while its oldest request waited as long (silent, not busy). From the
  // timeout scan.
  void AbortSilentCapped(uint64_t now);
  // Requests posted before the I/O thread itself stalled (a blocking control call, being
  // descheduled) get that time back: op timeouts measure the server, not this thread.
  void ExcuseStall(uint64_t ns);
  // Re-hedging of reads on a timer (split layout, copies, group degraded reads): a read whose
  // asked members have not all answered within the hedge time asks the members not asked yet.
  void Rehedge(uint64_t now);
  void HandleLocalFailures();
  // Moves member j of `s` to a replacement placement chooses (failed server, eviction notice):
  // its ALLOC goes to allocator_ (PendingReplace); the member moves when the slab is there.
  void ReplaceSplit(Slab& s, int j);
  // Forgets the slab in the data transport and hands its FREE to freer_ (never blocks).
  void ReleaseRemote(uint32_t server, uint64_t slab_id);
  void Housekeeping();
  void Regenerate(uint64_t now);
  void OnNotice(const fabric::Completion& comp);
  // ---- failure_detector.cc ----
  void ClassifySlow();
  // A read finished with requests still out (late binding: the first k won). A server whose
  // requests are left behind by kLateStrikes reads in a row while it has not answered anything
  // for kLateReadNs is classified slow at once: a stopped server gives no replies to measure,
  // and every read asking it would leave a request behind until the op timeout.
  void NoteLateRequests(const Ctx* c);
  static constexpr uint32_t kLateStrikes = 8;
  // Silent: kLateStrikes reads in a row left requests at the server and it has answered nothing
  // since (any reply resets its strikes). Being slow is not enough to keep reads away from it:
  // when another server is slow too, the slow pass of AskMore/GroupAskMore would ask it for
  // the extra (delta) member, and every request left at a silent server keeps a spare buffer
  // (DetachLateReads) until it answers or fails; with the spares gone, finished reads keep their
  // op contexts, and with those gone the store stalls until failure detection. So reads ask a
  // silent server only when they cannot reach k without it.
  bool Silent(uint32_t server) const {
    return server < late_strikes_.size() && late_strikes_[server] >= kLateStrikes;
  }
  // The pass of AskMore / GroupAskMore in which a split (member) on `server` is asked: 0 settled
  // on a server answering normally, 1 settled on a server classified slow, 2 not rebuilt yet
  // (`settled` false); then, only while k cannot be had without them (never for the delta
  // extras): 3 on a server at its cap that answers, 4 on a silent or suspect server, or one at
  // its cap that does not answer.
  int AskPass(uint32_t server, bool settled) const;  // Defined after RemoteStore.
  static constexpr int kAskPasses = 5;
  static constexpr int kLeftOutPass = 3;  // From this pass on: only while k cannot be had.

  RemoteStore* const store_;
  const int index_;
  const LayoutParams lay_;
  // What depends on the layout (layout.h); made with the thread, so that direct readers may
  // call it as soon as Start() returned.
  const std::unique_ptr<Layout> layout_;
  std::thread thread_;
  bool sim_prepared_ = false;  // Simulation: set up by Start(), not torn down yet (owner thread).
  std::atomic<bool> stop_{false};      // Any thread sets; the I/O thread reads.
  std::atomic<bool> sleeping_{false};  // The I/O thread sets; Enqueue() reads (to wake it).
  std::atomic<bool> seal_wanted_{false};  // Flush() sets; the I/O thread clears.
  UniqueFd event_fd_;                  // Written by any thread (Wake), read by the I/O thread.
  boost::lockfree::queue<QueueItem> queue_{4096};  // MPSC: any thread pushes, I/O thread pops.
  std::atomic<uint64_t> unsettled_{0};  // I/O thread writes, Flush() reads.
  std::atomic<uint32_t> synced_servers_{0};  // I/O thread writes (after SyncServers), any reads.

  // Everything below: the I/O thread only (set up in Run() before the loop starts).
  std::unique_ptr<fabric::Transport> t_;                       // The data path.
  std::unique_ptr<SlabFreer> freer_;  // FREE control calls, off this thread.
  std::vector<fabric::ConnectionId> conn_;                      // Per server, in t_.
  std::unique_ptr<SlabAllocator> allocator_;  // ALLOC control calls, off this thread.
  std::vector<PendingAlloc> allocs_;          // New slabs being allocated (a few at most).
  std::vector<PendingReplace> replacing_;     // Members being re-placed.
  std::vector<SlabAllocator::Answer> answers_;
  uint64_t next_tag_ = 0;                      // Of the ALLOCs handed to allocator_.
  std::vector<QueueJob*> trims_after_allocs_;  // See MaybeReleaseTrims().
  std::vector<uint8_t> local_failed_;
  // Per server: the data connection is lost and not reconnected yet; when to try next; failed
  // attempts in a row (backoff).
  std::vector<uint8_t> conn_down_;
  std::vector<uint64_t> reconnect_at_;
  std::vector<uint32_t> reconnect_fails_;
  std::vector<std::shared_ptr<ReconnectProbe>> probes_;  // Per server: the probe out, if any.
  // Per server: data requests failed with Unavailable since its last good reply. Past
  // kBrokenAfter the data path is reported broken (HealthTracker::Trouble).
  std::vector<uint32_t> errors_in_a_row_;
  // Per server: requests posted on this thread's data connection and not completed (orphans
  // too), and the cap on them (RemoteStoreOptions::max_outstanding_per_server; see AtCap). A
  // server at its cap that gave no reply for silent_abort_ns_ is aborted (AbortSilentCapped).
  std::vector<uint32_t> outstanding_;
  uint32_t cap_ = 0;
  uint64_t silent_abort_ns_ = 0;
  static constexpr uint32_t kBrokenAfter = 16;
  std::vector<StaleSplit> stale_;
  struct Parked {
    Ctx* c;
    int split;
    uint64_t since;
  };
  std::vector<Parked> parked_;
  std::vector<Ctx*> parked_reads_;  // ParkRead().
  static constexpr uint64_t kReadParkNs = 2000000000;
  uint64_t last_loop_ns_ = 0;     // When the previous loop iteration started.
  uint64_t loop_allowance_ns_ = 0;  // How long that iteration was allowed to take (its sleep).
  uint64_t last_rehedge_ns_ = 0;
  // Regeneration waits until then (the newest failure's time plus the grace period).
  uint64_t regen_not_before_ns_ = 0;
  // Reply latency per server (EWMA, 1/8 weight, from this thread's data ops) and which servers
  // are much slower than the rest (ClassifySlow(), every 64 completions): reads ask their
  // splits last.
  std::vector<uint64_t> latency_ewma_ns_;
  std::vector<uint8_t> slow_;
  std::vector<uint32_t> late_strikes_;  // Per server: see NoteLateRequests().
  std::vector<uint64_t> last_reply_ns_;  // Per server: when its last completion arrived.
  uint32_t since_classify_ = 0;
  uint64_t seen_failure_epoch_ = 0;
  // The slab table: logical slab ls lives at index ls / io_threads of thread ls % io_threads.
  std::vector<Slab> slabs_;
  // One past the highest slab index ever allocated or being allocated: every slab at or above
  // it is unallocated, so scans for allocated slabs stop there (UsedSlabs). The table is sized
  // for the whole region; a program uses the first few slabs of it.
  size_t slabs_hi_ = 0;
  std::span<Slab> UsedSlabs() { return {slabs_.data(), slabs_hi_}; }
  std::span<const Slab> UsedSlabs() const { return {slabs_.data(), slabs_hi_}; }
  void NoteSlabUsed(const Slab& s) {
    slabs_hi_ = std::max<size_t>(slabs_hi_, static_cast<size_t>(&s - slabs_.data()) + 1);
  }
  std::vector<Ctx> ctxs_;
  std::vector<uint8_t> bufs_;  // Op buffers (one per context) and kSpareBufs spare ones.
  size_t buf_bytes_ = 0;       // Bytes per op buffer.
  std::vector<uint8_t*> spare_bufs_;   // Op buffers no context or request uses.
  std::vector<uint16_t> buf_orphans_;  // Per op buffer: orphan requests whose reply lands there.
  Ctx* free_ctx_ = nullptr;
  int free_ctx_count_ = 0;
  std::vector<Request> reqs_;
  uint32_t free_req_ = 0;
  std::vector<fabric::Completion> comps_;
  std::vector<fabric::WorkRequest> pending_wrs_;  // Posted by Post(), not yet by FlushPosts().
  std::vector<fabric::WorkRequest> flushing_;

  // Regeneration.
  int regen_active_ = 0;  // (slab, split) pairs whose regeneration cursor is not at the end.
  uint64_t regen_failures_ = 0;  // Pages this thread could not regenerate (logged at 1, 2, 4..).
  uint64_t alloc_replacements_ = 0;  // New-slab splits placed on a replacement server.
  uint64_t no_replacement_ = 0;      // Splits left without a replacement (logged at 1, 2, 4..).
  double regen_tokens_ = 0;
  uint64_t last_tick_ns_ = 0;
  int regen_inflight_ = 0;
  uint64_t last_timeout_scan_ns_ = 0;
  uint64_t poll_ns_ = 0;           // RemoteStoreOptions::poll_us.
  // A recent MonotonicNs() for request timestamps (refreshed every loop iteration, every op
  // start and after blocking control calls): one clock read per op instead of one per split.
  uint64_t now_ns_ = 0;
  uint64_t last_progress_ns_ = 0;  // When polling without progress began (0: not polling).

  // Direct reads: slabs_ as published for other threads (see DirectSlab): written by this I/O
  // thread only, read by any thread under its seqlock. Allocated in Run() before Start()
  // returns; never resized.
  std::unique_ptr<DirectSlab[]> dslab_;  // By slab index (both layouts).

  std::mutex hist_mu_;  // Guards the histograms against Stats() readers (uncontended).
  LatencyHistogram read_hist_, write_hist_;  // Guarded by hist_mu_.
};

class RemoteStore final : public RemotePageStore {
 public:
  RemoteStore(const RemoteStoreOptions& o, LayoutParams lay, std::string name);
  ~RemoteStore() override;

  Status Init();
  void Shutdown();

  std::string name() const override { return name_; }
  uint64_t capacity_pages() const override { return opt_.capacity_pages; }
  double memory_overhead() const override {
    return static_cast<double>(lay_.width()) / static_cast<double>(lay_.k);
  }
  Status Submit(std::span<PageOp* const> ops) override;
  Status Trim(PageId first, uint64_t count) override;
  Status Flush() override;
  PageStoreStats Stats() const override;
  Result<std::vector<size_t>> ServersOfPage(PageId page) const override;
  // Group layout with direct_reads: read on the caller's thread (direct_read.cc); otherwise
  // Submit + wait.
  Status ReadPage(PageId page, uint8_t* out) override;
  Status ReadPages(const PageId* pages, size_t count, uint8_t* out) override;
  // Erasure-coded layouts (group, split) with direct_reads: a reader that reads directly with
  // many reads in flight on the calling thread (direct_read.cc); otherwise Unsupported.
  Result<std::unique_ptr<ThreadReader>> NewThreadReader(const ThreadReaderOptions& options) override;

  // Which I/O thread owns page `page` (split layout: by logical slab; group: by kGroupRun run).
  size_t ThreadOf(PageId page) const;

  // Creates a transport through the options' factory (or fabric::Transport::Create).
  Result<std::unique_ptr<fabric::Transport>> NewTransport(const fabric::TransportOptions& to) const;

  // Marks a server failed (idempotent): reconfigures placement and wakes every I/O thread.
  // Any thread. Only the monitor's verdict (HealthTracker), a server announcing its shutdown,
  // a server that cannot join, and Shutdown() call it.
  void MarkFailed(uint32_t server, const std::string& why);
  // Health signals (failure_detector.cc), any thread. NoteAlive: a reply from `server` at `now`
  // (cheap: one relaxed load, and a store at most every 100 us). ReportTrouble: evidence of a
  // problem (see HealthTracker::Trouble), handled by the monitor thread. Suspect: the monitor
  // suspects the server (reads ask it last and never wait on it).
  void NoteAlive(uint32_t server, uint64_t now) {
    std::atomic<uint64_t>& a = last_alive_ns_[server];
    if (now > a.load(std::memory_order_relaxed) + 100000) a.store(now, std::memory_order_relaxed);
  }
  // broken: see HealthTracker::Trouble.
  void ReportTrouble(uint32_t server, std::string why, bool broken = false);
  bool Suspect(uint32_t server) const {
    return server < kMaxServers &&
           health_[server].load(std::memory_order_relaxed) ==
               static_cast<uint8_t>(HealthState::kSuspect);
  }

  // The monitor's judgement (failure_detector.cc), shared by the monitor thread and the
  // simulation's monitor (sim_control.h). MonitorHealthConfig: the HealthTracker's settings
  // from the options. TakeTroubles: hands the trouble reported since the last call to
  // `tracker` (scratch: a vector to reuse). ApplyHealthActions: acts on the tracker's decisions
  // (suspect, recover, fail, hold); `probe(i)` starts a confirming probe of server i.
  struct TroubleReport {
    uint32_t server;
    std::string why;
    bool broken;
  };
  HealthConfig MonitorHealthConfig() const;
  void TakeTroubles(HealthTracker& tracker, uint64_t now, std::vector<TroubleReport>* scratch);
  void ApplyHealthActions(const std::vector<HealthTracker::Action>& actions,
                          const std::function<void(uint32_t)>& probe);
  // Simulation only (RemoteStoreOptions::sim): one turn of every I/O thread (IoThread::SimTurn)
  // on the caller's thread; returns the earliest simulated time one of them wants to run again.
  uint64_t SimTurn();

  // Membership changes of a running store (client/remote_store.h AddRemoteServer /
  // RemoveRemoteServer). Any thread but the store's own threads; serialised by add_mu_.
  // AddServer: checks the server (reachable, same slab size, rack labels consistent with the
  // others), appends it, waits until every I/O thread and the monitor are connected to it, and
  // only then lets placement use it (so no thread ever sees a server index it has no
  // connection for).
  Status AddServer(const RemoteServer& server) override;
  // Marks the live server at `endpoint` failed (its splits are regenerated elsewhere); NotFound
  // when no live server has that endpoint.
  Status RemoveServer(const fabric::Endpoint& endpoint, const std::string& why) override;
  std::vector<RemoteServer> Servers() const override;
  std::vector<bool> ServersFailed() const override;

  // The server list: the options' servers, then the ones AddServer appended. Entries below
  // num_servers() never change, so any thread may read them without a lock.
  uint32_t num_servers() const { return num_servers_.load(std::memory_order_acquire); }
  const RemoteServer& server(uint32_t i) const { return servers_[i]; }

  // Immutable after Init() (read by every thread).
  const RemoteStoreOptions opt_;
  const LayoutParams lay_;
  const std::unique_ptr<const StoreLayout> layout_;  // What the store decides per layout.
  const std::string name_;
  std::optional<coding::Codec> codec_;
  std::optional<StripeCodec> stripe_codec_;  // Group layout.
  uint64_t slab_size_ = 0;
  uint64_t pages_per_slab_ = 0;  // Pages per logical slab (slots per remote slab).
  uint64_t num_slabs_ = 0;       // Split: logical slabs. Group: slab table size per thread.
  uint64_t client_id_ = 0;

  // Fixed capacity kMaxServers; slot i is written once (Init or AddServer, under add_mu_)
  // before num_servers_ is raised past i (release), and read-only afterwards.
  std::unique_ptr<RemoteServer[]> servers_;
  std::atomic<uint32_t> num_servers_{0};
  std::mutex add_mu_;  // Serialises AddServer / RemoveServer.
  // I/O threads and the monitor notify after connecting to new servers (AddServer waits).
  std::mutex sync_mu_;
  std::condition_variable sync_cv_;
  std::atomic<uint32_t> monitor_synced_{0};  // Servers the monitor has heartbeat slots for.

  // Atomics shared by every thread (kMaxServers entries).
  std::unique_ptr<std::atomic<bool>[]> failed_;
  std::unique_ptr<std::atomic<uint8_t>[]> health_;          // HealthState; the monitor writes.
  std::unique_ptr<std::atomic<uint64_t>[]> last_alive_ns_;  // NoteAlive().
  // The server id (fabric ServerInfo) each server had when the store first connected to it. A
  // server that answers a reconnect or a probe with another id was restarted: a new process
  // that holds none of our slabs, which is a failure (its splits must be regenerated), not a
  // recovery. 0: not known yet. Set once (compare-exchange), by any thread.
  std::unique_ptr<std::atomic<uint64_t>[]> server_ids_;
  // Records `id` for `server` if none is known; false when another id is (it was restarted).
  bool SameInstance(uint32_t server, uint64_t id) {
    uint64_t known = 0;
    if (id == 0 || server_ids_[server].compare_exchange_strong(known, id)) return true;
    return known == id;
  }
  // When each failed server was declared failed (MonotonicNs; 0: not failed): regeneration of
  // its splits waits RemoteStoreOptions::regeneration_grace_ms after it.
  std::unique_ptr<std::atomic<uint64_t>[]> failed_at_ns_;
  std::atomic<uint64_t> failure_epoch_{0};
  mutable SharedStats stats_;

  // Membership, placement and slab counts per server: control path, under mu_.
  std::mutex mu_;
  placement::SnapshotPtr snap_;      // Guarded by mu_.
  placement::PlacementPtr policy_;   // Guarded by mu_.
  // The same with every suspect server draining (serves its slabs, takes no new ones); null
  // while no server is suspect. New slabs and replacements are placed with it first, and with
  // snap_/policy_ only when it has no room (a suspect may well be alive). Guarded by mu_.
  placement::SnapshotPtr avoid_snap_;
  placement::PlacementPtr avoid_policy_;
  // Rebuilds avoid_snap_/avoid_policy_ from snap_ and health_. Caller holds mu_.
  void RebuildAvoidLocked();
  // Placement of logical slab `ls` (salt: another try) and a replacement for its member j,
  // avoiding suspect servers when possible. Caller holds mu_.
  Result<std::vector<placement::ServerId>> PlaceLocked(uint64_t ls);
  Result<placement::ServerId> ReplacementLocked(uint64_t ls,
                                                const std::vector<placement::ServerId>& current,
                                                int j);
  std::vector<uint64_t> load_;       // Guarded by mu_.

  // Set up by Init(), cleared by Shutdown() (the store's owner thread).
  std::vector<std::unique_ptr<IoThread>> threads_;

  // Direct readers: each thread that reads directly keeps one reader (transport, connections)
  // per store in a thread_local list, keyed by uid_; alive_ expires at Shutdown() so a thread
  // destroys its stale readers itself (a Transport is destroyed by the thread that used it).
  const uint64_t uid_ = NextUid();
  std::shared_ptr<int> alive_ = std::make_shared<int>(0);

 private:
  static uint64_t NextUid();
  // Destroys the calling thread's direct reader of this store, if any (Shutdown()).
  void DropThreadReader();
  // Blocking read of `count` pages through the I/O threads; degraded[i]: 1 for
  // QueueItem::degraded, 2 for QueueItem::verify. Returns the first error.
  Status ReadThroughIoThreads(const PageId* pages, size_t count, uint8_t* out,
                              const uint8_t* degraded);
  // ---- failure_detector.cc ----
  void MonitorLoop();
  std::mutex trouble_mu_;  // Guards trouble_ (ReportTrouble -> the monitor).
  std::vector<TroubleReport> trouble_;
  std::atomic<bool> trouble_pending_{false};  // trouble_ is not empty (the monitor's poll loop).
  // Remote slabs left on failed servers (their splits were re-placed): freed by the monitor if
  // the server answers again (a long pause, not a crash), so its memory does not wait for the
  // server's orphan lease. Guarded by trouble_mu_.
  std::vector<std::pair<uint32_t, uint64_t>> left_behind_;
 public:
  void LeaveBehind(uint32_t server, uint64_t slab_id) {
    std::lock_guard<std::mutex> lock(trouble_mu_);
    left_behind_.emplace_back(server, slab_id);
  }

 private:
  std::thread monitor_;
  std::atomic<bool> monitor_stop_{false};
  std::mutex monitor_mu_;               // Pairs with monitor_cv_ (monitor_stop_ wake-ups).
  std::condition_variable monitor_cv_;
};

inline bool IoThread::Usable(uint32_t server) const {
  return server < conn_down_.size() && !local_failed_[server] && !conn_down_[server] &&
         !store_->failed_[server].load(std::memory_order_relaxed);
}

inline int IoThread::AskPass(uint32_t server, bool settled) const {
  // Silent (see Silent()) and suspect servers: asked only when k cannot be had without, last.
  if (Silent(server) || store_->Suspect(server)) return 4;
  // At its cap (AtCap()): only when k cannot be had without too, but before those while it
  // answers (busy); one that has not answered for kLateReadNs waits with them.
  if (AtCap(server)) {
    return server < last_reply_ns_.size() && now_ns_ - last_reply_ns_[server] <= kLateReadNs ? 3
                                                                                             : 4;
  }
  if (!settled) return 2;
  return server < slow_.size() && slow_[server] ? 1 : 0;
}

}  // namespace tessera::client::remote
