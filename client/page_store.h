// PageStore: the seam between page consumers (the userfaultfd pager, the NBD export, benches)
// and the ways Tessera stores 4 KB pages: the resilient erasure-coded remote store, and the
// simpler layouts kept for comparison and for users who want them (single copy, n-way
// replication, single copy with an asynchronous local-disk backup, local SSD).
//
// Pages are addressed by PageId in [0, capacity_pages()). A page never written (or trimmed)
// reads as zeros. A read never returns bytes older than the last acknowledged write of that
// page, and never returns wrong bytes silently: if a page cannot be rebuilt, its op fails with
// DataLoss naming the page, and other pages are unaffected.
//
// Asynchronous use: the caller fills PageOp structs it owns and Submit()s a batch of pointers.
// Submit() never blocks on the network; it either accepts the whole batch (each op then
// completes exactly once: op->status is set and op->done(op) is called from a store thread,
// never from inside Submit) or rejects it whole with an error (no op accepted, no callback).
// Per-op failures (DataLoss, OutOfRange for a bad page id, Unavailable) are reported through
// op->status, not by Submit. The op and its buffer belong to the caller and must stay valid,
// and for a write unmodified, until done() is called. ReadPage()/WritePage() are blocking
// conveniences built on Submit().
//
// Threads: every method may be called concurrently from any number of threads. done()
// callbacks run on store threads and must be short and must not block on the store (hand the
// result off instead, e.g. through a lock-free queue or an atomic flag).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/histogram.h"
#include "common/status.h"

namespace tessera::client {

inline constexpr size_t kPageSize = 4096;
using PageId = uint64_t;

struct PageOp {
  enum class Kind : uint8_t { kRead, kWrite };
  Kind kind = Kind::kRead;
  PageId page = 0;
  // kPageSize bytes: filled by a read; the source of a write. Any alignment.
  uint8_t* buf = nullptr;
  // Set by the store before done() is called.
  Status status;
  // Called exactly once per accepted op, from a store thread.
  void (*done)(PageOp* op) = nullptr;
  void* user = nullptr;  // The caller's context; the store never touches it.
};

// Counters and latency histograms of one store since it was created.
struct PageStoreStats {
  uint64_t reads = 0;
  uint64_t writes = 0;
  uint64_t read_errors = 0;
  uint64_t write_errors = 0;
  uint64_t trims = 0;
  uint64_t degraded_reads = 0;       // Reads that could not use the preferred splits/copy.
  uint64_t decodes = 0;              // Reads that ran an erasure decode.
  uint64_t corruptions_detected = 0; // Splits/copies whose checksum did not match.
  uint64_t corruptions_repaired = 0; // ... and were rewritten correctly.
  uint64_t data_loss = 0;            // Reads failed with DataLoss.
  uint64_t server_failures = 0;      // Servers declared failed.
  // Remote stores' failure handling (0 elsewhere): servers that became suspect, suspects that
  // answered again (healthy), data connections re-established, and splits a write could not
  // store on a live server that were rewritten once it was reachable again.
  uint64_t server_suspicions = 0;
  uint64_t server_recoveries = 0;
  // Failure verdicts on silence held back because failing the server would have left more
  // servers failed than the layout survives (it stayed suspect instead); once per suspicion.
  uint64_t verdicts_held = 0;
  uint64_t reconnects = 0;
  uint64_t stale_repairs = 0;
  // Slab ALLOC calls the client stopped waiting for because their server turned suspect or
  // failed while the call was out; the member was asked of another server (a late answer's slab
  // is given back).
  uint64_t allocs_abandoned = 0;
  // Logical slabs whose remote slabs were given back (trimmed empty); their FREE calls are
  // made off the I/O threads, so the servers may still hold them for a moment.
  uint64_t slabs_released = 0;
  uint64_t regenerations_done = 0;   // Lost splits/copies rebuilt onto replacements.
  uint64_t regenerations_pending = 0;
  uint64_t bytes_sent = 0;           // Payload bytes written to the backing (remote or disk).
  uint64_t bytes_received = 0;
  // Group erasure-coded layout (0 elsewhere):
  uint64_t hedged_reads = 0;      // Reads that asked the rest of the stripe after hedge_us.
  uint64_t compaction_moves = 0;  // Live pages re-striped by compaction.
  uint64_t stripes_written = 0;
  uint64_t padding_slots = 0;     // Data slots of stripes sealed before they were full.
  uint64_t parity_updates = 0;    // Stripes whose free slots were filled with an in-place parity update.
  uint64_t slots_reclaimed = 0;   // Garbage slots taken out of their stripe's parity for reuse.
  uint64_t stored_pages = 0;      // Pages stored in sealed stripes now.
  uint64_t remote_bytes = 0;      // Remote memory held now (k+r slabs per stripe slab).
  // Run-to-completion reads (remote group and split layouts; 0 elsewhere): pages a blocking
  // ReadPage(s) or a ThreadReader read on the caller's own thread, and those it handed to a
  // store thread after all (the page was being written or moved, its server failed or was slow,
  // a CRC mismatched, ...).
  uint64_t direct_reads = 0;
  uint64_t direct_fallbacks = 0;
  // Of the fallbacks, those handed over because a server had not answered within the hedge time
  // (or was known not to answer): hedged on the I/O thread, which reads the stripe degraded.
  uint64_t direct_hedged = 0;
  uint64_t direct_spin_hits = 0;  // Direct reads whose reply arrived while the caller spun.
  uint64_t direct_sleeps = 0;     // ... and those that had to sleep for it.
  LatencyHistogram read_latency;     // Per page, from Submit to done, in ns.
  LatencyHistogram write_latency;
};

// A run-to-completion reader: reads pages on the one thread that owns it, over that thread's own
// connections to the store's servers, with many reads in flight (post many, poll completions),
// so an event loop (the NBD export's connection readers) reads without handing each read to a
// store thread and back. Made by PageStore::NewThreadReader.
//
// Submit() takes read ops only (InvalidArgument for a write; the batch is checked like
// PageStore::Submit and accepted or rejected whole). It queues the reads; the next Poll() or
// Wait() posts everything queued since the last one in one batch (so requests parsed back to
// back cost one post), then reaps. Each accepted op completes exactly once,
// with the same result PageStore::Submit would give: either on the owning thread, from inside a
// later Poll() or Wait() (the page was read directly, or reads as zeros), or from a store
// thread, when the reader handed it to the store's asynchronous path because it could not read
// it directly (the page is being written or moved, its server failed or did not answer within
// the store's hedge time, a CRC mismatched, no free reply buffer). done() is never called from
// inside Submit(). The op and its buffer belong to the caller until done() is called.
//
// Threads: every method, the destructor included, on the thread that created the reader. The
// store must outlive it. The destructor first finishes every accepted op (Wait() until
// inflight() is 0: at most the store's hedge time, after which reads are handed over).
class ThreadReader {
 public:
  virtual ~ThreadReader() = default;
  virtual Status Submit(std::span<PageOp* const> ops) = 0;
  // Completes what is ready (replies that arrived, zero pages, reads past their hedge time
  // handed over); never blocks. Returns the number of ops completed here or handed over.
  virtual size_t Poll() = 0;
  // Like Poll(), but when nothing is ready it sleeps (no spinning) until something is, the
  // deadline passes, or the options' wake_fd becomes readable.
  virtual size_t Wait(Deadline deadline) = 0;
  // Ops accepted and neither completed nor handed over yet.
  virtual size_t inflight() const = 0;
};

struct ThreadReaderOptions {
  // Wait() also returns soon after this fd becomes readable (e.g. the socket the owner reads
  // its requests from); -1: none. The owner keeps it open while the reader lives.
  int wake_fd = -1;
  // Direct read requests in flight at most (one reply buffer each: a page, or a split for the
  // split layout, whose page reads take k + delta of them); ops beyond them are handed over.
  // 1..4096.
  uint32_t max_inflight = 512;
};

class PageStore {
 public:
  virtual ~PageStore() = default;

  // A short description, e.g. "ec(8,2) delta=1 ack=all", "replication(3)", "local-ssd".
  virtual std::string name() const = 0;
  virtual uint64_t capacity_pages() const = 0;
  // Bytes stored (remote or local) per byte of page data: 1.25 for RS(8,2), 3 for 3 copies.
  virtual double memory_overhead() const = 0;

  // See the file comment. InvalidArgument for a null op, buffer or callback, or an unknown
  // kind; Unavailable when the store is shut down or cannot accept work at all.
  virtual Status Submit(std::span<PageOp* const> ops) = 0;

  // Releases the storage of pages [first, first + count); they read as zeros afterwards.
  virtual Status Trim(PageId first, uint64_t count) = 0;
  // Returns once every write acknowledged before the call is stored with the full resilience
  // the store promises (e.g. all k+r splits written, the disk backup written).
  virtual Status Flush() = 0;

  virtual PageStoreStats Stats() const = 0;

  // Where page `page` lives: indices into the store's server list of the servers holding it,
  // in the store's split order (for tests and tools). Remote stores override this; the default
  // is InvalidArgument ("not a remote store").
  virtual Result<std::vector<size_t>> ServersOfPage(PageId page) const;

  // The checks every Submit() makes before accepting a batch: InvalidArgument naming the first
  // op that is null or has no buffer, no callback or an unknown kind. Page ranges are checked
  // per op by the store (OutOfRange through op->status).
  static Status ValidateBatch(std::span<PageOp* const> ops);

  // Blocking single-page conveniences (Submit + wait). Thread-safe. The reads are virtual: a
  // store may serve a blocking read on the caller's own thread instead of handing it to a store
  // thread and back (the remote group layout does: run-to-completion reads, see
  // client/remote_store.h); the result is the same as Submit + wait.
  virtual Status ReadPage(PageId page, uint8_t* out);
  Status WritePage(PageId page, const uint8_t* in);
  // Blocking batch: submits `count` ops of one kind over consecutive buffers and waits for all;
  // returns the first error (every op is still attempted).
  virtual Status ReadPages(const PageId* pages, size_t count, uint8_t* out);
  Status WritePages(const PageId* pages, size_t count, const uint8_t* in);

  // A run-to-completion reader for the calling thread (see ThreadReader). Unsupported when the
  // store has no such path (the default; the remote erasure-coded layouts with direct_reads
  // have one): use Submit() then.
  virtual Result<std::unique_ptr<ThreadReader>> NewThreadReader(const ThreadReaderOptions& options);
};

// Waits for a batch of PageOps on the thread that submitted them: Arm() points each op's
// done/user at this waiter, Wait() sleeps on an atomic count (futex, no lock) until every armed
// op completed and returns the first op's error. One waiter per batch; it must outlive the ops'
// callbacks, so call Wait() before it goes out of scope once any armed op was accepted.
class OpWaiter {
 public:
  void Arm(PageOp* ops, size_t count) {
    remaining_.store(count, std::memory_order_relaxed);
    for (size_t i = 0; i < count; ++i) {
      ops[i].done = &OpWaiter::Done;
      ops[i].user = this;
    }
  }
  Status Wait(const PageOp* ops, size_t count) {
    for (size_t left = remaining_.load(std::memory_order_acquire); left != 0;
         left = remaining_.load(std::memory_order_acquire)) {
      remaining_.wait(left, std::memory_order_acquire);
    }
    for (size_t i = 0; i < count; ++i) {
      if (!ops[i].status.ok()) return ops[i].status;
    }
    return Status::Ok();
  }

 private:
  static void Done(PageOp* op) {
    auto* w = static_cast<OpWaiter*>(op->user);
    if (w->remaining_.fetch_sub(1, std::memory_order_acq_rel) == 1) w->remaining_.notify_all();
  }
  std::atomic<size_t> remaining_{0};
};

}  // namespace tessera::client
