// MemoryPageStore: the in-memory, asynchronous PageStore test double every test of a page
// consumer uses (the pager, the NBD export, DiskBackedStore's primary and backup, the PageStore
// conformance suite). It keeps the PageStore contract the real stores keep: Submit() validates
// and queues, never completes an op inside the call; one store thread completes every accepted
// op exactly once (after an optional latency); never-written and trimmed pages read as zeros; a
// bad page id completes with OutOfRange and touches nothing; Trim() beyond the capacity is
// OutOfRange.
//
// On top of that it injects what a test needs to see a consumer cope with a real store:
//   - latency per batch (the store thread sleeps before completing the batch it took),
//   - completions out of submission order (a seeded shuffle of each batch),
//   - DataLoss on chosen pages: for good (FailReads) or until the page is written again
//     (LosePage), and a status for every read or every write (FailReadsWith/FailWritesWith),
//   - the next n ops of any kind failing (FailNextOps), Submit() refusing batches
//     (RejectSubmits),
//   - holding ops (all of them, or only writes) until Release(), in or against submission
//     order, to force a completion order or keep a write unacknowledged.
// It counts what reached it (per page writes, out-of-range ops, trims, flushes) and lets a test
// read or set the stored bytes directly (Page/Put).
//
// Data is copied when an op completes, not when it is submitted (a write's buffer must stay
// valid until done(), as with every store). A failed write stores nothing.
//
// Ownership and threads: the store owns its thread and its pages. Every method may be called
// from any thread, including from inside a done() callback. done() callbacks run on the store
// thread, never with the store's lock held. The destructor stops holding, completes every op
// still queued or held (normally, as if released), then joins the thread; it must not race
// with other calls.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "client/page_store.h"
#include "common/histogram.h"
#include "common/status.h"

namespace tessera::client::testing {

struct MemoryPageStoreOptions {
  uint64_t capacity_pages = 0;  // Must be > 0.
  std::string name = "memory";  // What name() returns.
  // The store thread waits this long before completing each batch it takes (0: at once).
  int64_t latency_us = 0;
  // 0: ops complete in submission order. Otherwise each batch the store thread takes completes
  // in an order shuffled by a generator seeded with this value (deterministic per run).
  uint64_t shuffle_seed = 0;
};

class MemoryPageStore final : public PageStore {
 public:
  // InvalidArgument for capacity_pages == 0 or a negative latency; the constructors abort on
  // those instead (a mistake in the test that builds the double).
  static Result<std::unique_ptr<MemoryPageStore>> Create(MemoryPageStoreOptions options);
  explicit MemoryPageStore(MemoryPageStoreOptions options);
  // Shorthand: capacity and latency, in-order completions.
  explicit MemoryPageStore(uint64_t capacity_pages, int64_t latency_us = 0);
  ~MemoryPageStore() override;
  MemoryPageStore(const MemoryPageStore&) = delete;
  MemoryPageStore& operator=(const MemoryPageStore&) = delete;

  std::string name() const override { return opt_.name; }
  uint64_t capacity_pages() const override { return opt_.capacity_pages; }
  double memory_overhead() const override { return 1.0; }
  Status Submit(std::span<PageOp* const> ops) override;
  Status Trim(PageId first, uint64_t count) override;
  // Every write acknowledged before the call is already in memory: counts the call and returns
  // the injected flush status (FailFlushWith), Ok by default.
  Status Flush() override;
  // reads/writes: ops completed (any status); read_errors/write_errors, data_loss: of those,
  // failed / failed with DataLoss; trims: pages trimmed; bytes_sent: bytes stored by writes;
  // bytes_received: bytes returned by successful reads; latencies from Submit to done().
  PageStoreStats Stats() const override;

  // --- Failure injection (each takes effect for ops completed after the call) ---
  // Every read of `page` fails with DataLoss naming the page (until HealReads).
  void FailReads(PageId page);
  void HealReads(PageId page);
  // Reads of `page` fail with DataLoss until a write of it succeeds (a lost copy, rewritten).
  void LosePage(PageId page);
  // Every read / write fails with `st` and a write stores nothing; Status::Ok() clears.
  void FailReadsWith(Status st);
  void FailWritesWith(Status st);
  // The next `n` ops of any kind fail with `st` (e.g. Unavailable: a server died under them).
  void FailNextOps(uint64_t n, Status st);
  // Submit() returns `st` (batch rejected whole, no callback); Status::Ok() clears.
  void RejectSubmits(Status st);
  // Flush() returns `st`; Status::Ok() clears.
  void FailFlushWith(Status st);
  void SetLatencyUs(int64_t latency_us);

  // --- Holding ops ---
  enum class HoldKind { kAll, kWrites };
  enum class ReleaseOrder { kSubmission, kReverse };
  // From now on, ops of that kind (all: queued in submission order; writes: as the store
  // thread meets them) are held, not completed, until Release().
  void Hold(HoldKind kind = HoldKind::kAll);
  // Stops holding and completes the held ops on the store thread in the given order (relative
  // to the order in which they were held).
  void Release(ReleaseOrder order = ReleaseOrder::kSubmission);
  // Ops held now.
  size_t held() const;
  // Waits until at least n ops are held; false when `timeout` passes first.
  bool WaitHeld(size_t n, std::chrono::milliseconds timeout = std::chrono::seconds(10)) const;

  // --- What reached the store ---
  std::vector<uint8_t> Page(PageId page) const;           // kPageSize bytes, zeros if none stored.
  void Put(PageId page, std::span<const uint8_t> bytes);  // kPageSize bytes.
  bool Holds(PageId page) const;          // Bytes are stored for `page` (written, not trimmed).
  uint64_t writes_of(PageId page) const;  // Successful writes of `page`.
  uint64_t writes_stored() const;         // Successful writes of any page.
  uint64_t reads_completed() const;       // Read ops completed (any status).
  uint64_t trimmed_pages() const;
  uint64_t trim_calls() const;
  uint64_t flushes() const;
  uint64_t out_of_range_ops() const;  // Ops and Trim calls naming pages beyond the capacity.

 private:
  struct Queued {
    PageOp* op;
    uint64_t submit_ns;
  };
  void Run();
  Status Apply(PageOp* op);  // Under mu_.
  size_t HeldLocked() const;

  const MemoryPageStoreOptions opt_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  // All below guarded by mu_.
  std::deque<Queued> queue_;     // Submitted, not yet taken by the store thread.
  std::deque<Queued> released_;  // Released by Release(), completed before queue_.
  std::deque<Queued> held_;      // Writes held by HoldKind::kWrites.
  bool hold_all_ = false;
  bool hold_writes_ = false;
  bool stop_ = false;
  int64_t latency_us_ = 0;
  std::mt19937_64 rng_;
  std::unordered_map<PageId, std::vector<uint8_t>> pages_;
  std::map<PageId, uint64_t> writes_per_page_;
  std::set<PageId> fail_reads_, lost_;
  Status read_error_, write_error_, submit_error_, flush_error_, next_ops_error_;
  uint64_t fail_next_ops_ = 0;
  uint64_t reads_ = 0, writes_ = 0, read_errors_ = 0, write_errors_ = 0, data_loss_ = 0;
  uint64_t writes_stored_ = 0, bytes_received_ = 0;
  uint64_t trimmed_ = 0, trim_calls_ = 0, flushes_ = 0, out_of_range_ = 0;
  LatencyHistogram read_latency_, write_latency_;
  std::thread thread_;  // Last: starts once every member above exists.
};

}  // namespace tessera::client::testing
