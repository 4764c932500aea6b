// DiskBackedStore: single copy in remote memory with an asynchronous local-disk backup — the
// Infiniswap design — behind the PageStore interface.
//
// Writes go to the primary store (e.g. the single-copy remote store); a write is acknowledged as
// soon as the primary acknowledged it, and is then written to the backup store (a LocalSsdStore:
// a local file through io_uring) in the background, so the disk copy lags. A write the primary
// cannot store (Unavailable, Timeout, DataLoss: its server is gone) is written through to disk
// and acknowledged once it is there; later reads of that page go to the disk copy, since the
// primary's bytes are older (a later write the primary stores makes it current again).
// Flush() waits until every write acknowledged before the call is on disk (and fdatasync'ed).
// Reads go to the
// primary; when the primary fails a read with Unavailable, Timeout or DataLoss (its server died
// or evicted the page), the read falls back to the disk copy, but only if that copy is as new as
// the last acknowledged write of the page. Otherwise the read fails with the primary's error and
// a note that the disk backup is behind: a stale disk copy is never returned.
//
// How "as new as" is known: every write gets a version from a global counter. Per page the
// store keeps acked_version (highest version acknowledged to the caller), primary_version
// (highest version the primary stored) and disk_version (version of the last backup write that
// completed). A read uses the primary's bytes only if primary_version >= acked_version. Backup writes of one page are serialised (at most
// one in flight; a newer acknowledged write replaces any queued older one), so disk_version is
// exactly the version whose bytes are in the file. Fallback requires disk_version >=
// acked_version. A backup write that fails leaves disk_version unchanged (and Flush() reports
// it), so that page has no fallback until a later write reaches the disk.
//
// Memory: 24 bytes per page for the three versions, plus one 4 KB staging copy per write in flight
// (from Submit until its backup write completes; pooled).
//
// Threads: every method may be called from any thread. Callbacks run on the primary's threads
// (direct reads and writes) or on the backup's I/O thread (fallback reads). Trim() first waits
// for pending backup writes. The store owns both inner stores; destruction must not race with
// other calls and waits until every accepted op and every backup write has completed.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "client/page_store.h"
#include "common/status.h"

namespace tessera::client {

class DiskBackedStore final : public PageStore {
 public:
  // primary: the store that serves reads and acknowledges writes. backup: the disk copy (a
  // LocalSsdStore in the Infiniswap design; any PageStore works) with at least the primary's
  // capacity; its previous content is assumed to be zeros (a fresh file).
  static Result<std::unique_ptr<DiskBackedStore>> Create(std::unique_ptr<PageStore> primary,
                                                         std::unique_ptr<PageStore> backup);
  ~DiskBackedStore() override;
  DiskBackedStore(const DiskBackedStore&) = delete;
  DiskBackedStore& operator=(const DiskBackedStore&) = delete;

  // "disk-backed(<primary> + <backup>)".
  std::string name() const override;
  uint64_t capacity_pages() const override;
  // The primary's overhead plus the disk copy's (single copy + disk: 2.0, of which 1.0 remote).
  double memory_overhead() const override;
  Status Submit(std::span<PageOp* const> ops) override;
  Status Trim(PageId first, uint64_t count) override;
  // Waits for the backup to catch up with every write acknowledged before the call, then
  // flushes both stores. IoError if a backup write failed since the last Flush().
  Status Flush() override;
  // The primary's counters (failures, regenerations, ...) with this store's own read/write
  // counts, latencies and data_loss (reads failed to the caller); degraded_reads adds the reads
  // served from the disk copy; bytes_sent/received include the backup's.
  PageStoreStats Stats() const override;

  // Backup writes accepted but not yet completed (the backup lag, in pages).
  uint64_t backup_pending() const;
  // Reads served from the disk copy / refused because the disk copy was behind.
  uint64_t fallback_reads() const;
  uint64_t stale_refusals() const;
  // Writes the primary could not store that were acknowledged from the disk copy.
  uint64_t written_through() const;

  struct Impl;  // Public only so the .cc's helpers can name it.

 private:
  explicit DiskBackedStore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera::client
