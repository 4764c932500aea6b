// Internal to client/remote/: the split layout (EC-Split) and copies, one per I/O thread (see
// layout.h).
//
// A page is cut into k splits plus r parity splits, split j of every page of a logical slab on
// member j's server. Copies is the same layout with k = 1 and r more whole copies of the page
// (every split is the page; no codec): placement, slab allocation off the I/O thread, the k+r
// member writes with their per-page write queue, k+delta reads with late binding, stale
// repairs and regeneration are the same code, and copies differs only in encoding (the page's
// CRC for every member) and in which members a read asks first. So one class serves both.
//
// The layout's per-page state (CRCs, write sequences, written and busy flags, trims pending
// behind a write) lives in each Slab; its read path is read_path.cc, its write path
// write_path.cc and slab_alloc.cc; split_layout.cc holds its hooks into the I/O thread, the
// page tables it publishes for direct readers, and SplitStoreLayout (what the store decides for
// it).
//
// Threads: the owning I/O thread only, except DirectLocate()/DirectPageValid() (any thread).
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <utility>
#include <vector>

#include "client/remote/engine.h"
#include "client/remote/layout.h"

namespace tessera::client::remote {

class SplitStoreLayout final : public StoreLayout {
 public:
  explicit SplitStoreLayout(const LayoutParams& lay) : lay_(lay) {}
  Status MakeCodecs(RemoteStore& store) const override;
  uint64_t NumSlabs(const RemoteStoreOptions& o, uint64_t pages_per_slab) const override;
  long double TableBytes(const RemoteStoreOptions& o, uint64_t num_slabs) const override;
  void Placement(placement::PolicySpec* spec) const override;
  bool PlacementFallback(placement::PolicySpec* spec) const override;
  // Pages are owned by logical slab.
  size_t ThreadOf(PageId page, uint64_t pages_per_slab, uint64_t T) const override {
    return static_cast<size_t>((page / pages_per_slab) % T);
  }
  bool LocateOnIoThread() const override { return false; }
  // Copies publish no page tables.
  bool DirectReads() const override { return !lay_.copies; }
  bool DirectSplits() const override { return true; }
  uint32_t DirectPartsPerPage() const override {
    return static_cast<uint32_t>(std::min(lay_.width(), lay_.k + lay_.delta));
  }

 private:
  const LayoutParams lay_;
};

class SplitLayout final : public Layout {
 public:
  SplitLayout(IoThread& io, const LayoutParams& lay);

  uint64_t SlabCount() const override;
  void Setup(uint32_t nctx) override;
  void Stop() override;
  void StoreBuffered() override {}  // Nothing is buffered: every write has its op context.
  void AbandonCtx(size_t, Ctx&) override {}
  void StartOp(PageOp* op, uint64_t now, bool degraded, bool verify) override;
  void OnReply(Ctx* c, int member, uint32_t server, bool write, const Status& st) override;
  // Copies all come from the one page at the start of the buffer.
  uint8_t* WriteBuf(Ctx* c, int j) override { return lay_.copies ? c->buf : io_.SplitBuf(c, j); }
  void WriteGivenUp(Ctx* c) override;
  void ReleaseCtx(Ctx*) override {}
  Result<std::vector<size_t>> Locate(PageId page) override;
  bool Hold(const QueueItem& item) override;
  bool Flush() override { return true; }  // Writes are posted as they come.
  void Trim(PageId first, uint64_t count) override;
  bool Poll() override;
  void Housekeeping(uint64_t) override {}
  uint64_t SleepBound(uint64_t timeout) const override { return timeout; }
  void SlabAllocated(Slab& s) override;
  void SlabReady(uint32_t slab, const Status& st) override;
  uint32_t InUse(const Slab& s) const override { return s.written_count; }
  void SlabFreed(Slab&) override {}
  bool KeepsMissingMembers() const override { return false; }
  uint32_t StaleSeq(const Slab& s, uint32_t pidx) const override { return s.seq[pidx]; }
  bool StaleObsolete(const Slab& s, const StaleSplit& e) const override {
    return !s.written[e.pidx] || s.seq[e.pidx] != e.seq;
  }
  bool StaleBusy(const Slab& s, const StaleSplit& e) const override {
    return s.busy[e.pidx] != nullptr;
  }
  void RepairStale(const StaleSplit& e) override;
  void Rehedge(Ctx* c, uint64_t bit) override;
  void Reask(Ctx* c) override { AskMore(c); }
  bool NeedsRebuild(const Slab& s, uint32_t p, int) const override { return s.written[p] != 0; }
  bool Regenerate(Slab& s, int j) override;
  bool DirectLocate(PageId page, DirectTarget* out) const override;
  bool DirectPageValid(PageId page, const DirectTarget& t) const override;

 private:
  // A kRegen op context rebuilding split j of page p of slab s from the other splits.
  void RebuildSplit(Slab& s, uint32_t p, int j);
  // ---- read_path.cc ----
  void StartRead(Ctx* c);
  void AskMore(Ctx* c);
  void OnReadSplit(Ctx* c, int split, const Status& st);
  void FinishRead(Ctx* c, Status st);
  // ---- slab_alloc.cc: slab allocation off this thread ----
  // Starts allocating slab `s` (IoThread::BeginAllocate); the write `c` starts once it is
  // allocated (SlabReady), or fails with the allocation. Queue items that must come after that
  // write (SlabIndexOf, HoldItem) wait in held_ meanwhile; everything else goes on.
  void AllocateThenWrite(Slab& s, Ctx* c);
  // Split layout: the index in slabs_ of page `page`'s slab (this thread's).
  uint32_t SlabIndexOf(PageId page) const {
    return static_cast<uint32_t>(page / store_->pages_per_slab_ / store_->opt_.io_threads);
  }
  // While allocations are out: true when `item` must wait (held_) because it must come after
  // a write that waits for its slab, or after an item already waiting (a trim, flush or locate
  // waits for everything before it, and everything after it waits for it).
  bool MustHold(const QueueItem& item) const;
  void HoldItem(const QueueItem& item);
  // Starts the held items that need not wait any more, in their order. From the loop.
  void ReleaseHeld();
  // ---- write_path.cc ----
  void StartWrite(Ctx* c);
  void PostWriteSplits(Ctx* c, uint64_t mask);
  void OnWriteSplit(Ctx* c, int split, uint32_t server, const Status& st);
  void WriteSettled(Ctx* c);
  // After a split write completed or gave up: acknowledges / settles the write when due.
  void WriteProgress(Ctx* c);
  void AckWrite(Ctx* c, Status st);
  // Page p of `s` becomes never-written (a trim, or a write that could not be stored).
  void Unwrite(Slab& s, uint32_t p);
  // ---- direct reads (split_layout.cc) ----
  // Publishes page `pidx` of slab `s` (state from busy/written, CRCs from crc).
  // Call after every change of its busy, written or crc, before posting anything that could
  // change its splits on the servers.
  void PublishSplitPage(const Slab& s, uint32_t pidx);
  // Allocates slab `s`'s page table on its first allocation (all kSplitZero).
  void EnsureSplitTable(const Slab& s);

  IoThread& io_;
  RemoteStore* const store_;
  const LayoutParams& lay_;
  // Per slab being allocated (a few at most): the writes that start once it is.
  std::vector<std::pair<uint32_t, std::vector<Ctx*>>> waiting_;
  // Queue items waiting for an allocation (MustHold), in their order; per slab index, how many
  // of them touch it; how many are barriers (trim, flush, locate).
  std::deque<QueueItem> held_;
  std::vector<uint32_t> held_per_slab_;
  uint32_t held_barriers_ = 0;
  // Direct reads: per slab index, its pages' table (see kSplitZero), allocated by the slab's
  // first allocation and published through dsplit_ptr_ (release) before the slab is.
  std::vector<std::unique_ptr<std::atomic<uint32_t>[]>> dsplit_;
  std::unique_ptr<std::atomic<std::atomic<uint32_t>*>[]> dsplit_ptr_;
};

}  // namespace tessera::client::remote
