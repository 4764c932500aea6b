// CompressedTier: a compressed local tier in front of a (remote) PageStore, the way zram sits
// in front of the kernel's swap: pages written to it are LZ4-compressed into local memory and
// acknowledged at once; reads of those pages are decompressed locally (no network); a
// background thread writes every page it holds back to the store behind it.
//
// It is itself a PageStore (a decorator), so the pager pages through it unchanged; the pager
// also charges its size against the local-memory budget (PagerOptions::tier).
//
// What it holds. One entry per page: the compressed bytes (or, rarely, the raw page, see
// below), and whether the store behind has the same bytes yet ("written back"); written-back
// entries are kept in the order they were written back. A read that hits hands the page to
// the reader, which holds it from then on: the entry is dropped (once written back, at once if
// it is), so a page is not charged twice, and a clean page the pager evicts again comes back
// through AdmitClean. A write replaces the page's entry; a page that compresses to more than
// max_compressed_bytes goes straight to the store (its old entry,
// if any, is dropped) - unless a write-back of that page is still in flight, in which case it is
// kept raw until its own write-back is done (two writes of one page are never in flight at
// once, so the store's last write is always the newest). Trim drops entries and is passed on.
//
// Size. Each entry is charged its compressed size plus kEntryOverheadBytes (the index and
// allocator overhead); charged_bytes() is their sum. When a new entry would take the charge
// over the capacity, the oldest written-back entries are dropped (their pages are in the
// store); entries not yet written back are never dropped, so the charge may exceed the
// capacity while write-back catches up, and a write that finds no room goes straight to the
// store instead (when no write-back of that page is in flight). Capacity: a fixed size, or a
// share of a budget the owner sets with SetBudgetBytes (the pager does, from its local limit),
// times an adaptive scale in [1/16, 1].
//
// Why the scale. The owner charges the tier against its budget: every byte the tier holds is a
// byte its resident set does not. That pays when the tier's hits are pages a resident set with
// that room would have lost anyway (each hit is then a local fault instead of a store read),
// and costs when they are pages it would have kept (each hit is then a fault that need not have
// happened, and the smaller resident set faults more besides). The tier tells them apart by the
// eviction distance of a hit: the pages evicted into it (writes and AdmitClean) since the hit
// page was. A distance within the tier's charge in pages is a "near" hit: a resident set larger
// by the charge would still have held the page. Every adapt_window_hits hits, the scale shrinks
// by 1/5 when more than a quarter of the hits were near (averaged over about the last 8
// windows), and grows by 1/4 otherwise; written-back entries over a shrunk capacity are dropped
// at once. Measured at 50% local memory: GNU sort, whose working set sits just under the budget
// (at 36% it faults 4.6 times as much as at 50%), had 59% near hits with the full tier, and
// tripled its faults; the python workload had 5-6%, and the tier halves its store reads.
//
// Resilience. A write is acknowledged once it is in the tier: until its write-back completes,
// the page exists only in this process's memory (like a dirty resident page) and is lost if
// the process dies, while memserver failures cannot touch it. Once written back it has the
// store's resilience (an RS(k,r) store survives r memserver failures), and the tier copy is
// only a cache. Flush() writes back everything written before the call and flushes the store.
// Write-back starts writeback_delay_ms after a page enters the tier, at once when the tier is
// over 3/4 of its capacity, a Flush() waits or the tier stops (up to writeback_inflight pages
// at once, oldest first); a write-back the store refuses is retried after writeback_retry_ms.
//
// Threads. Every method may be called from any thread. One mutex guards the entries
// (compression runs outside it, decompression inside: LZ4 decodes a page in about a
// microsecond). The tier's thread submits write-backs, handles their completions, and calls the
// done() of ops it served from local memory (done() is never called inside Submit()).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "client/page_store.h"
#include "common/status.h"

namespace tessera::kernel_shim {

struct CompressedTierOptions {
  client::PageStore* store = nullptr;  // Behind the tier; not owned, must outlive it. Required.
  // Fixed capacity in bytes (at most 3/4 of the budget given to SetBudgetBytes, if one is);
  // 0: budget_share x that budget.
  uint64_t capacity_bytes = 0;
  double budget_share = 0.25;           // In (0, 0.75] (auto capacity only).
  size_t max_compressed_bytes = 3072;   // 256..4096: larger results go to the store.
  size_t writeback_inflight = 32;       // 1..1024 write-backs in flight at most.
  uint32_t writeback_retry_ms = 20;     // 1..10000: wait after a refused write-back.
  // 0..60000: a page entering the tier is written back this long after, not at once, unless
  // the tier is over 3/4 of its capacity, a Flush() waits, or the tier stops. A page read back
  // and evicted again within that time replaces its entry before any write-back: one store
  // write instead of one per eviction.
  uint32_t writeback_delay_ms = 1000;
  // 0..65536 (0: a fixed capacity): the capacity adapts every this many hits (see "Size").
  uint32_t adapt_window_hits = 256;
};

struct CompressedTierStats {
  uint64_t stored = 0;          // Writes kept in the tier (compressed).
  uint64_t incompressible = 0;  // Writes that went straight to the store.
  uint64_t kept_raw = 0;        // Incompressible writes kept raw (a write-back was in flight).
  uint64_t admitted_clean = 0;  // Clean pages admitted (AdmitClean).
  uint64_t bypassed_full = 0;   // Compressible writes sent to the store: no room in the tier.
  uint64_t hits = 0;            // Reads served from the tier.
  // Hits on pages that entered the tier fewer evictions ago than the tier's charge in pages:
  // a resident set given the tier's room would still have held them (no fault at all).
  uint64_t hits_near = 0;
  uint64_t shrinks = 0;         // Windows of hits that shrank the capacity (see "Size").
  uint64_t grows = 0;           // ... that grew it back.
  uint64_t misses = 0;          // Reads passed to the store.
  uint64_t writebacks = 0;      // Pages written back to the store (acknowledged).
  uint64_t writeback_errors = 0;
  uint64_t dropped = 0;         // Written-back entries dropped to make room.
  uint64_t entries = 0;         // Now.
  uint64_t dirty_entries = 0;   // Now: not written back yet.
  uint64_t compressed_bytes = 0;  // Now: compressed bytes held (without the overhead).
  uint64_t charged_bytes = 0;   // Now: what counts against the local budget.
  uint64_t capacity_bytes = 0;  // Now.
  double capacity_scale = 1;    // Now: the adaptive share of the configured capacity.
};

class CompressedTier final : public client::PageStore {
 public:
  static constexpr uint64_t kEntryOverheadBytes = 64;

  static Result<std::unique_ptr<CompressedTier>> Create(const CompressedTierOptions& options);
  // Stops the thread after the write-backs in flight complete; pages not written back are
  // dropped (call Flush() first to keep them).
  ~CompressedTier() override;

  std::string name() const override;
  uint64_t capacity_pages() const override { return store_->capacity_pages(); }
  double memory_overhead() const override { return store_->memory_overhead(); }
  Status Submit(std::span<client::PageOp* const> ops) override;
  Status Trim(client::PageId first, uint64_t count) override;
  Status Flush() override;
  // The store's stats (what went over the network); the tier's own are TierStats().
  client::PageStoreStats Stats() const override { return store_->Stats(); }
  Result<std::vector<size_t>> ServersOfPage(client::PageId page) const override {
    return store_->ServersOfPage(page);
  }
  // A tier hit is decompressed on the caller's thread; a miss is the store's ReadPage.
  Status ReadPage(client::PageId page, uint8_t* out) override;
  // Hits decompressed on the caller's thread; the misses are one ReadPages of the store.
  Status ReadPages(const client::PageId* pages, size_t count, uint8_t* out) override;

  // A clean page the owner drops (the store holds these bytes): kept compressed, as written
  // back, if it compresses well and there is room, so that its next read is local. Nothing
  // happens when the tier has an entry for the page already. The pager calls it for clean
  // victims.
  void AdmitClean(client::PageId page, const uint8_t* bytes);

  uint64_t charged_bytes() const { return charged_.load(std::memory_order_relaxed); }
  // The owner's local budget: sizes an auto capacity (budget_share x budget_bytes) and bounds a
  // fixed one (3/4 of it).
  void SetBudgetBytes(uint64_t budget_bytes);
  CompressedTierStats TierStats() const;

 private:
  struct Entry {
    std::unique_ptr<uint8_t[]> data;
    uint32_t len = 0;           // Compressed length, or kPageSize for a raw page.
    bool raw = false;
    bool written_back = false;  // The store holds these bytes.
    bool read = false;          // Read since it was stored (dropped once written back).
    uint64_t gen = 0;           // Bumped by every write of the page.
    uint64_t evicted_at = 0;    // evictions_ when the page last left the owner's memory.
    std::list<client::PageId>::iterator lru;  // In lru_ once written back.
  };
  struct Writeback;

  explicit CompressedTier(const CompressedTierOptions& o);
  void Loop();
  // Under mu_: decompresses page p's entry into out.
  void Decode(const Entry& e, uint8_t* out) const;
  // Under mu_: serves a read of the entry into out (see "What it holds"), and counts the hit
  // towards the capacity's adaptation (see "Size").
  void HitLocked(std::unordered_map<client::PageId, Entry>::iterator it, uint8_t* out);
  // Under mu_: removes p's entry and its charge.
  void EraseLocked(std::unordered_map<client::PageId, Entry>::iterator it);
  // Under mu_: drops the oldest written-back entries until `need` more bytes fit; false if
  // they do not.
  bool MakeRoomLocked(uint64_t need);
  uint64_t CapacityLocked() const;
  void StartWritebacksLocked(uint64_t now, std::vector<client::PageOp*>* submit);
  // Under mu_: write-backs are due at once (a flush waits, the tier stops or is filling up).
  bool UrgentLocked() const;
  static void WritebackDone(client::PageOp* op);

  const CompressedTierOptions o_;
  client::PageStore* const store_;

  mutable std::mutex mu_;
  std::condition_variable cv_;        // Wakes the thread: work queued, or stop.
  std::condition_variable flush_cv_;  // Wakes Flush(): a write-back completed.
  bool stopping_ = false;
  std::unordered_map<client::PageId, Entry> entries_;
  // Written-back entries, in the order they were written back (or admitted clean): the ones a
  // full tier drops first. Entries not written back are in no list (dirty_queue_ orders them).
  std::list<client::PageId> lru_;
  // Pages to write back, oldest first, with the generation queued (stale ones are skipped) and
  // when the write-back is due (writeback_delay_ms after the write).
  struct Dirty {
    client::PageId page;
    uint64_t gen;
    uint64_t due_ns;
  };
  std::deque<Dirty> dirty_queue_;
  int flushing_ = 0;  // Flush() calls waiting: every queued write-back is due now.
  // Pages with a write-back in flight, and whether a Trim came meanwhile.
  std::unordered_map<client::PageId, bool> inflight_;
  std::vector<Writeback*> free_wb_;
  std::vector<std::unique_ptr<Writeback>> wb_pool_;
  std::vector<Writeback*> wb_done_;        // Completed write-backs for the thread.
  std::vector<client::PageOp*> complete_;  // Ops served locally, for the thread to complete.
  uint64_t next_gen_ = 1;
  // Pages the owner evicted into the tier (writes and AdmitClean calls): the clock of the
  // hits' eviction distances.
  uint64_t evictions_ = 0;
  uint64_t budget_bytes_ = 0;
  double scale_ = 1;  // The adaptive share of the capacity (see "Size").
  uint32_t window_hits_ = 0, window_near_ = 0;
  double near_share_ = 0;        // Of the hits, averaged over windows.
  uint64_t retry_after_ns_ = 0;  // A write-back was refused: wait until then.
  uint64_t dirty_ = 0, compressed_ = 0;
  std::atomic<uint64_t> charged_{0};
  CompressedTierStats counts_;  // Counters only, under mu_.
  std::thread thread_;
};

}  // namespace tessera::kernel_shim
