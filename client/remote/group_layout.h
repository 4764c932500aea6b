// Internal to client/remote/: the group layout (EC-Batch), one per I/O thread (see layout.h).
//
// A page lives whole on one server; k pages on the k data members of a row of a logical slab
// form a stripe with r parity pages. The layout owns the page table (where each page is: never
// written, in the stripe buffer, in a stripe write in flight, or stored), the stripe buffer,
// the open stripe whose padding later pages fill in place, compaction and in-place reclaim, and
// the page locations published for direct readers. Its read path is group_read.cc, its write
// path, compaction and trims group_write.cc, and its hooks into setup, failure handling and
// direct reads group_layout.cc, with GroupStoreLayout (what the store decides for it).
//
// Threads: the owning I/O thread only, except DirectLocate()/DirectPageValid() (any thread,
// reading dloc_ under its seqlocks).
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <memory>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "client/remote/engine.h"
#include "client/remote/layout.h"
#include "common/mmap.h"

namespace tessera::client::remote {

class GroupStoreLayout final : public StoreLayout {
 public:
  explicit GroupStoreLayout(const LayoutParams& lay) : lay_(lay) {}
  Status MakeCodecs(RemoteStore& store) const override;
  uint64_t NumSlabs(const RemoteStoreOptions& o, uint64_t pages_per_slab) const override;
  long double TableBytes(const RemoteStoreOptions& o, uint64_t num_slabs) const override;
  void Placement(placement::PolicySpec* spec) const override;
  bool PlacementFallback(placement::PolicySpec*) const override { return false; }
  // Pages are owned in runs of kGroupRun.
  size_t ThreadOf(PageId page, uint64_t, uint64_t T) const override {
    return static_cast<size_t>((page / kGroupRun) % T);
  }
  bool LocateOnIoThread() const override { return true; }
  bool DirectReads() const override { return true; }
  bool DirectSplits() const override { return false; }
  uint32_t DirectPartsPerPage() const override { return 1; }  // The stripe member holding it.

 private:
  const LayoutParams lay_;
};

class GroupLayout final : public Layout {
 public:
  GroupLayout(IoThread& io, const LayoutParams& lay);

  uint64_t SlabCount() const override;
  void Setup(uint32_t nctx) override;
  void Stop() override;
  void StoreBuffered() override;
  void AbandonCtx(size_t i, Ctx& c) override;
  void StartOp(PageOp* op, uint64_t now, bool degraded, bool verify) override;
  void OnReply(Ctx* c, int member, uint32_t server, bool write, const Status& st) override;
  uint8_t* WriteBuf(Ctx* c, int j) override { return io_.SplitBuf(c, j); }
  void WriteGivenUp(Ctx* c) override;
  void ReleaseCtx(Ctx* c) override;
  bool Hold(const QueueItem& item) override;
  bool Flush() override;
  bool Poll() override;
  uint64_t SleepBound(uint64_t timeout) const override;
  void SlabAllocated(Slab& s) override;
  void SlabReady(uint32_t slab, const Status& st) override;
  uint32_t InUse(const Slab& s) const override { return s.stripes_used; }
  void SlabFreed(Slab& s) override;
  bool KeepsMissingMembers() const override { return true; }
  uint32_t StaleSeq(const Slab& s, uint32_t pidx) const override { return s.stripes[pidx].gen; }
  bool StaleObsolete(const Slab& s, const StaleSplit& e) const override;
  bool StaleBusy(const Slab& s, const StaleSplit& e) const override;
  void RepairStale(const StaleSplit& e) override;
  void Rehedge(Ctx* c, uint64_t bit) override;
  void Reask(Ctx* c) override;
  bool NeedsRebuild(const Slab& s, uint32_t p, int j) const override;
  bool Regenerate(Slab& s, int j) override;
  bool DirectLocate(PageId page, DirectTarget* out) const override;
  bool DirectPageValid(PageId page, const DirectTarget& t) const override;

 private:
  IoThread& io_;
  RemoteStore* const store_;
  const LayoutParams& lay_;

  // ---- group_read.cc ----
  // degraded: also ask the rest of the stripe at once (see QueueItem::degraded).
  void StartRead(Ctx* c, bool degraded = false, bool verify = false);
  // Asks stripe members other than the page's own until good + zero + outstanding reaches
  // k + delta; finishes with DataLoss when fewer than k can still arrive.
  void AskMore(Ctx* c);
  // A degraded read of a stripe being updated in place (extending_): the parity members
  // hold the new state remotely (or are being written), while the read's snapshot is the old
  // one. Takes the new state from the update's own buffers (new parity, new pages) when none
  // of those members has a request of this read out, and finishes the read if that gives k.
  // True when it finished the read.
  bool ReadFromExtending(Ctx* c);
  void OnRead(Ctx* c, int member, const Status& st);
  void FinishRead(Ctx* c, Status st);
  void Hedge(uint64_t now);
  Result<std::vector<size_t>> Locate(PageId page) override;
  // ---- group_write.cc ----
  void StartWrite(PageOp* op, uint64_t start_ns);
  // Puts a page's newest data in the stripe buffer (a user write, or a compaction move when
  // op is null); its old slot becomes garbage.
  void BufferPage(PageId page, const uint8_t* data, PageOp* op, uint64_t start_ns);
  // Stores the stripe buffer: in the open stripe's free slots, else in a new stripe. all=false
  // (the buffer reached its threshold): a partial fill of the open stripe may leave pages
  // buffered. False: no op context or no stripe space free now (retried later).
  bool Seal(bool all = true);
  // The open stripe: the newest stripe sealed with padding, whose parity this thread keeps
  // (open_parity_), so later pages can fill its padding slots with an in-place parity update
  // (ISA-L ec_encode_data_update) instead of starting a new, mostly empty stripe. Null when
  // there is none or it cannot take `n` pages now.
  Stripe* OpenStripe(int n);
  void CloseOpenStripe() {
    open_slab_ = kNoSlot;
    open_reclaimed_ = 0;
  }
  // Fills the open stripe's free slots with buffered pages (as many as fit; the rest stay).
  void Extend(Stripe& st);
  void OnStripeWrite(Ctx* c, int member, uint32_t server, const Status& st);
  // Writes every member in c->asked of a stripe write (a failed server's member re-placed and
  // asked once more; one that still cannot be posted counts as bad), then settles it if nothing
  // is outstanding.
  void PostAsked(Ctx* c);
  void StripeSettled(Ctx* c);
  void StripeProgress(Ctx* c);  // The same for a stripe write.
  void Kill(PageId page);       // The page's stored slot (if any) becomes garbage.
  void MaybeReleaseStripe(uint32_t slab, uint32_t row);
  void Compact();
  // GroupCompaction::kInPlace: reads the garbage slots and parity of stripe (slab, row); when
  // they arrive intact, takes the garbage out of a copy of the parity and queues the stripe
  // (reclaim_ready_) to become the open stripe with those slots free. False when no op
  // context is free.
  bool StartReclaim(uint32_t slab, uint32_t row);
  void OnReclaimRead(Ctx* c, int member, const Status& st);
  // Makes the first still-valid reclaimed stripe the open stripe; false when none is.
  bool InstallReclaimed();
  void ForgetReclaim(uint32_t slab, uint32_t row);
  // Data slots of the open stripe that new pages may fill: padding, and reclaimed garbage.
  uint64_t OpenFree(const Stripe& st) const {
    return (st.zero | open_reclaimed_) & ((1ull << lay_.k) - 1);
  }
  void Housekeeping(uint64_t now) override;
  void Trim(PageId first, uint64_t count) override;
  // A free row for a new stripe: of a healthy slab, else (while a new slab is being allocated,
  // or when none can be) of a slab with up to r members missing, else of a draining slab. False
  // with *wait set: none now, but the slab being allocated will have them (the stripe buffer
  // waits); false otherwise: none at all (*why).
  bool FreeRow(uint32_t* slab, uint32_t* row, Status* why, bool* wait);
  // Members of `s` on failed servers, or allocated nowhere (left missing).
  int Missing(const Slab& s) const;
  // Free rows of the slabs that take new stripes (allocated, not draining, at most r members
  // missing), but for `except`.
  uint64_t SpareRows(const Slab* except) const;

  // ---- group_write.cc: slabs allocated ahead of need ----
  // New slabs are allocated off this thread (IoThread::BeginAllocate), one at a time, and ahead
  // of need: whenever the free rows of the slabs that take stripes drop below one slab's worth
  // (SpareRows), the next slab is allocated, so a stripe finds a free row at once and an
  // allocation (which may take until its deadline, when a server has stopped answering) only
  // holds up writes when a whole slab of rows was filled while it was out. Empty slabs are given
  // back only while the others keep a slab's worth of free rows (MaybeReleaseStripe, Compact),
  // so the two rules never undo each other; a thread that holds no page keeps no slab
  // (MaybeFreeSpare). The cost: up to one slab per I/O thread more remote memory.
  // Starts allocating the next slab (none is being allocated, the thread is not stopping, and,
  // unless `needed`, no failure is being backed off from); false when it did not.
  bool StartAllocation(uint64_t now, bool needed);
  void MaybeAllocateAhead(uint64_t now);
  // No page of this thread is stored, being written, buffered or waiting.
  bool HoldsNothing() const { return gused_ == 0 && gbuf_.empty() && held_.empty(); }
  // When HoldsNothing(): gives every empty slab back.
  void MaybeFreeSpare();
  bool BufferFull() const { return gbuf_.size() >= static_cast<size_t>(lay_.k); }
  // Queue items that must wait while the stripe buffer is full (a write), or behind one that
  // waits (a read of a page whose write waits; a trim, flush or locate, and everything after
  // it): held_, in order, released by Poll().
  bool MustHold(const QueueItem& item) const;
  void HoldItem(const QueueItem& item);
  void ReleaseHeld();
  // This thread's index of page p (its runs of kGroupRun pages, packed).
  uint64_t LocalIndex(PageId p) const {
    const uint64_t T = static_cast<uint64_t>(store_->opt_.io_threads);
    return (p / kGroupRun / T) * kGroupRun + p % kGroupRun;
  }

  // Rebuilds member j of a row from the rest of its stripe and rewrites it in place (kRegen);
  // scrub: a corrupt member a read could not repair itself. Needs a free op context.
  void RebuildMember(uint32_t slab, uint32_t row, int j, bool scrub);
  // Publishes page `page`'s location (from gloc_) for direct readers. Call after every change
  // of a page's `where` (stored, none).
  void PublishPage(PageId page);

  struct PageLoc {
    enum class Where : uint8_t { kNone, kStored, kBuffered, kWriting };
    Where where = Where::kNone;  // kNone: never written (or trimmed): reads as zeros.
    uint8_t col = 0;             // kStored / kWriting: stripe member.
    uint32_t slab = 0;           // kStored: slab index.
    uint32_t row = 0;            // kStored: row; kBuffered: slot in gbuf_.
    uint32_t seq = 0;            // Bumped by every write and trim of the page.
    bool moving = false;         // kStored: a compaction move is reading it.
    Ctx* writing = nullptr;      // kWriting: the stripe write holding the newest data.
  };
  static_assert(std::is_trivially_copyable_v<PageLoc> && std::is_trivially_destructible_v<PageLoc>,
                "gloc_ lives in lazily zeroed memory, never constructed or destroyed");
  // By LocalIndex(), gloc_size_ of them, in lazily zeroed memory (Setup): all zero bytes is a
  // default PageLoc (kNone, never written).
  MappedRegion gloc_mem_;
  PageLoc* gloc_ = nullptr;
  uint64_t gloc_size_ = 0;
  // Direct reads: gloc_ as published for other threads (see DirectLoc): written by this I/O
  // thread only, read by any thread under its seqlock. Allocated by Setup() before Start()
  // returns; never resized.
  MappedRegion dloc_mem_;
  DirectLoc* dloc_ = nullptr;  // By LocalIndex(), gloc_size_ of them, lazily zeroed.
  struct Buffered {  // A page in the stripe buffer (data: gbuf_data_ + slot * 4096).
    PageId page = 0;
    uint32_t seq = 0;
    bool move = false;  // Buffered by a compaction move (not a user write).
  };
  std::vector<Buffered> gbuf_;      // Up to k pages waiting for a stripe.
  std::vector<uint8_t> gbuf_data_;  // k pages.
  // User writes to acknowledge when the buffered pages' stripe settles (a page rewritten in the
  // buffer has several). Moved to stripe_ops_[ctx] at seal.
  std::vector<std::pair<PageOp*, uint64_t>> gbuf_ops_;
  uint64_t gbuf_since_ns_ = 0;  // When the oldest buffered page arrived.
  uint32_t gbuf_moves_ = 0;     // Compaction moves in the buffer.
  // Per op context (index in ctxs_) of a stripe write: its user writes, the pages' sequences,
  // and how many compaction moves it carries.
  std::vector<std::vector<std::pair<PageOp*, uint64_t>>> stripe_ops_;
  std::vector<std::array<uint32_t, coding::kMaxDataSplits>> stripe_seq_;
  std::vector<uint32_t> stripe_moves_;
  std::vector<uint8_t> zero_page_;  // kPageSize zeros (padding members).
  uint64_t glive_ = 0;              // Pages stored in sealed stripes.
  uint64_t gused_ = 0;       // Data slots of rows not free (live + garbage + padding + writing).
  uint32_t gslab_rows_ = 0;  // Rows per slab (pages per remote slab).
  uint32_t compact_inflight_ = 0;  // Compaction moves read or buffered, not yet settled.
  uint64_t last_hedge_scan_ns_ = 0;
  uint32_t open_slab_ = kNoSlot;  // The open stripe (see GroupOpenStripe()).
  uint32_t open_row_ = 0;
  // The updates in place (Extend) in flight: their buffers hold their stripes' new state. A
  // few at most (one per open stripe whose update waits for a server).
  std::vector<Ctx*> extending_;
  uint32_t open_gen_ = 0;
  // r pages: the open stripe's parity as stored, minus the reclaimed slots' old contents.
  std::vector<uint8_t> open_parity_;
  // Garbage slots of the open stripe taken out of open_parity_ (not of the stored parity: until
  // an in-place update lands they are still data members with their old CRC for decodes).
  uint64_t open_reclaimed_ = 0;
  // GroupCompaction::kInPlace: stripes whose garbage was read and taken out of a copy of their
  // parity, waiting to become the open stripe (GroupInstallReclaimed), and the rows being
  // reclaimed or waiting (so compaction does not pick them twice).
  struct Reclaimed {
    uint32_t slab = 0, row = 0, gen = 0;
    uint64_t garbage = 0;
    std::vector<uint8_t> parity;  // r pages.
  };
  std::vector<Reclaimed> reclaim_ready_;
  std::vector<std::pair<uint32_t, uint32_t>> reclaiming_;  // (slab, row): in flight or ready.
  int reclaim_inflight_ = 0;
  uint64_t out_of_space_ = 0;  // Seals refused for want of stripe space (logged 1, 2, 4, ...).
  // Slabs allocated ahead (StartAllocation): the stripe buffer waits for the slab being
  // allocated (Seal found no row); the allocation it waited for failed, so the next seal fails
  // its writes instead of waiting again; no slab is allocated ahead before alloc_retry_ns_
  // (after a failure: alloc_backoff_ns_, doubling from 200 ms up to 5 s); and the last failure,
  // which seals that cannot wait fail with.
  bool waiting_alloc_ = false;
  bool fail_next_seal_ = false;
  uint64_t alloc_retry_ns_ = 0;
  uint64_t alloc_backoff_ns_ = 0;
  Status alloc_failure_;
  uint64_t alloc_failures_ = 0;  // Logged at 1, 2, 4, ...
  // Held queue items (MustHold); how many writes of each page and how many barriers are held.
  std::deque<QueueItem> held_;
  std::unordered_map<PageId, uint32_t> held_writes_;
  uint32_t held_barriers_ = 0;
};

}  // namespace tessera::client::remote
