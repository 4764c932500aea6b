// Internal to client/remote/: the Layout seam of the remote store's I/O thread.
//
// An IoThread (engine.h) owns the loop, posting, completions, op contexts and request slots,
// op timeouts, connections and the health of each server. What depends on how pages map onto
// servers is behind one Layout per I/O thread, created with the thread by NewLayout():
//   SplitLayout (split_layout.h)  a page cut into k splits plus r parity splits, or copies
//                                 (replication: k = 1 and r more whole copies of the page)
//   GroupLayout (group_layout.h)  whole pages on one server each, k pages of a stripe plus r
//                                 parity pages (EC-Batch), written through a stripe buffer
// The I/O thread calls its layout to start page ops, to hand it the replies of the op contexts
// the layout started, to trim, flush and locate pages, and at the points of failure handling
// (stale members, hedging, regeneration) where the layouts differ; the layout calls back into
// the engine (Post, NewCtx, Complete, the slab table) as a friend of IoThread.
// What the store itself decides per layout (codecs, the slab table's size, placement, which
// I/O thread owns a page, direct reads) is a StoreLayout, one per store (NewStoreLayout).
//
// Threads: every method runs on the owning I/O thread, except DirectLocate() and
// DirectValid(), which any thread calls (they read only what the layout publishes under
// seqlocks, see engine.h DirectLoc).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "client/remote/engine.h"

namespace tessera::client::remote {

class Layout {
 public:
  virtual ~Layout() = default;

  // ---- setup and shutdown (I/O thread, Run()) ----
  // Entries of this thread's slab table.
  virtual uint64_t SlabCount() const = 0;
  // After the slab table and `nctx` op contexts exist: the layout's own tables.
  virtual void Setup(uint32_t nctx) = 0;
  // Shutdown, before the queue is emptied: ends what the layout waits for (its ops fail).
  virtual void Stop() = 0;
  // Shutdown, after the queue was emptied: stores what the layout still buffers, or fails it.
  virtual void StoreBuffered() = 0;
  // Shutdown, for op context `i` that did not settle in time: completes (as failed) the user
  // ops the layout attached to it.
  virtual void AbandonCtx(size_t i, Ctx& c) = 0;

  // ---- page ops and replies ----
  // A page op in range. degraded/verify: see QueueItem.
  virtual void StartOp(PageOp* op, uint64_t now, bool degraded, bool verify) = 0;
  // The reply to request `member` (posted by Post(), `write` for a write) of an op context the
  // layout started, `server` the server it went to.
  virtual void OnReply(Ctx* c, int member, uint32_t server, bool write, const Status& st) = 0;
  // The buffer write member j of `c` is posted from.
  virtual uint8_t* WriteBuf(Ctx* c, int j) = 0;
  // A write member that was parked (PostOrPark) could not be written after all.
  virtual void WriteGivenUp(Ctx* c) = 0;
  // Op context `c` is being released: let go of what it held besides its slab.
  virtual void ReleaseCtx(Ctx* c) = 0;

  // ---- queue items ----
  // True when `item` must wait behind something the layout waits for (it is then the layout's
  // to dispatch, in order, later); false: dispatch it now.
  virtual bool Hold(const QueueItem& item) = 0;
  virtual Result<std::vector<size_t>> Locate(PageId page) = 0;
  // Flush(): ops queued before it must be stored soon. False: retry later (RequestSeal).
  virtual bool Flush() = 0;
  virtual void Trim(PageId first, uint64_t count) = 0;

  // ---- the loop ----
  // Every iteration: acts on what the layout waited for; true when that was anything.
  virtual bool Poll() = 0;
  virtual void Housekeeping(uint64_t now) = 0;
  // How long the loop may sleep at most (ns) given what the layout waits for; `timeout` when
  // it waits for nothing. 0: do not sleep.
  virtual uint64_t SleepBound(uint64_t timeout) const = 0;

  // ---- slabs ----
  // Slab `s` was allocated: the layout's per-slab state (before it is published).
  virtual void SlabAllocated(Slab& s) = 0;
  // The allocation IoThread::BeginAllocate started for slab `slab` ended: OK (it is allocated;
  // SlabAllocated ran), or failed (nothing of it is left). May be called from BeginAllocate.
  virtual void SlabReady(uint32_t slab, const Status& st) = 0;
  // Pages (rows) of `s` in use: the slab is freed only at zero.
  virtual uint32_t InUse(const Slab& s) const = 0;
  // Slab `s` is being freed.
  virtual void SlabFreed(Slab& s) = 0;
  // True when a slab may be used with up to r members missing (never allocated because their
  // server failed) rather than failing its allocation.
  virtual bool KeepsMissingMembers() const = 0;

  // ---- failure handling ----
  // The version of page/row `pidx` of `s` a stale member was written for (StaleSplit::seq).
  virtual uint32_t StaleSeq(const Slab& s, uint32_t pidx) const = 0;
  // The stale member no longer needs a repair (rewritten, trimmed), or cannot be repaired now.
  virtual bool StaleObsolete(const Slab& s, const StaleSplit& e) const = 0;
  virtual bool StaleBusy(const Slab& s, const StaleSplit& e) const = 0;
  // Rewrites the stale member from the others (an op context is free).
  virtual void RepairStale(const StaleSplit& e) = 0;
  // Read request `bit` of `c` is overdue: ask more members if the layout hedges this read.
  virtual void Rehedge(Ctx* c, uint64_t bit) = 0;
  // A parked read (IoThread::ParkRead) may go on: ask what it may ask now, or finish it.
  virtual void Reask(Ctx* c) = 0;
  // Member j of page/row p of `s` holds data to rebuild after a re-placement.
  virtual bool NeedsRebuild(const Slab& s, uint32_t p, int j) const = 0;
  // Rebuilds member j of the next pages/rows of `s`; false when out of budget for now.
  virtual bool Regenerate(Slab& s, int j) = 0;

  // ---- direct reads (any thread) ----
  virtual bool DirectLocate(PageId page, DirectTarget* out) const = 0;
  // The page's own published version did not move since DirectLocate (the slab's is checked
  // by the caller).
  virtual bool DirectPageValid(PageId page, const DirectTarget& t) const = 0;
};

// What the store (RemoteStore) decides per layout: codecs, the slab table, placement, which
// I/O thread owns a page, and which reads may go direct. One per store, immutable, any thread.
class StoreLayout {
 public:
  virtual ~StoreLayout() = default;
  // Init(): the codec(s) the layout encodes with.
  virtual Status MakeCodecs(RemoteStore& store) const = 0;
  // Entries of the store's slab table (RemoteStore::num_slabs_) for `pages_per_slab`.
  virtual uint64_t NumSlabs(const RemoteStoreOptions& o, uint64_t pages_per_slab) const = 0;
  // Bytes of client-side tables a store of `num_slabs` needs (a bound checked at Init()).
  virtual long double TableBytes(const RemoteStoreOptions& o, uint64_t num_slabs) const = 0;
  // The placement of a slab's members (spec->k, r, replicas from the layout); when the policy
  // the first spec was refused: PlacementFallback makes another, false when there is none.
  virtual void Placement(placement::PolicySpec* spec) const = 0;
  virtual bool PlacementFallback(placement::PolicySpec* spec) const = 0;
  // The I/O thread owning page `page` (of T threads).
  virtual size_t ThreadOf(PageId page, uint64_t pages_per_slab, uint64_t T) const = 0;
  // Only the owning I/O thread may locate a page (ServersOfPage goes through its queue).
  virtual bool LocateOnIoThread() const = 0;
  // Pages are readable directly (the I/O threads publish their locations).
  virtual bool DirectReads() const = 0;
  // A direct read reads splits (decoded from k of them), not one whole page.
  virtual bool DirectSplits() const = 0;
  // Parts a direct read of one page asks at first.
  virtual uint32_t DirectPartsPerPage() const = 0;
};

// The factories: the one place that chooses a layout's classes. NewLayout: the layout of
// `lay` for I/O thread `io`; NewStoreLayout: the store's.
std::unique_ptr<Layout> NewLayout(IoThread& io, const LayoutParams& lay);
std::unique_ptr<StoreLayout> NewStoreLayout(const LayoutParams& lay);

}  // namespace tessera::client::remote
