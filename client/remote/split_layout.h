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
// write_path.cc and slab_alloc.cc, and the tables it publishes for direct readers
// direct_publish.cc; split_layout.cc holds its hooks into the I/O thread.
//
// Threads: the owning I/O thread only, except DirectLocate()/DirectPageValid() (any thread).
#pragma once

#include <cstdint>
#include <vector>

#include "client/remote/engine.h"
#include "client/remote/layout.h"

namespace tessera::client::remote {

class SplitLayout final : public Layout {
 public:
  SplitLayout(IoThread& io, const LayoutParams& lay);

  uint64_t SlabCount() const override;
  void Setup(uint32_t nctx) override;
  void StoreBuffered() override {}  // Nothing is buffered: every write has its op context.
  void AbandonCtx(size_t, Ctx&) override {}
  void StartOp(PageOp* op, uint64_t now, bool degraded, bool verify) override;
  void OnReply(Ctx* c, int member, uint32_t server, bool write, const Status& st) override;
  void WriteGivenUp(Ctx* c) override;
  void ReleaseCtx(Ctx*) override {}
  Result<std::vector<size_t>> Locate(PageId page) override;
  bool Flush() override { return true; }  // Writes are posted as they come.
  void Trim(PageId first, uint64_t count) override;
  void Housekeeping(uint64_t) override {}
  uint64_t SleepBound(uint64_t timeout) const override { return timeout; }
  void SlabAllocated(Slab& s) override;
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
  bool NeedsRebuild(const Slab& s, uint32_t p, int) const override { return s.written[p] != 0; }
  bool Regenerate(Slab& s, int j) override;
  bool DirectLocate(PageId page, DirectTarget* out) const override;
  bool DirectPageValid(PageId page, const DirectTarget& t) const override;

 private:
  // A kRegen op context rebuilding split j of page p of slab s from the other splits.
  void RebuildSplit(Slab& s, uint32_t p, int j);

  IoThread& io_;
  RemoteStore* const store_;
  const LayoutParams& lay_;
};

}  // namespace tessera::client::remote
