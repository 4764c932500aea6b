// LocalSsdStore: the "no remote memory" baseline PageStore. Pages live in one local file (an SSD
// in production, whatever disk the machine has otherwise), read and written 4 KB at a time
// through io_uring with many ops in flight.
//
// The file at Options::path is created (or truncated) and preallocated with fallocate to
// capacity_pages * 4 KB, so page p lives at byte offset p * 4096. It is opened with O_DIRECT so
// the page cache neither hides the device latency nor doubles the memory used; a file system
// that refuses O_DIRECT (tmpfs on older kernels, some overlays) gets buffered I/O instead, with a
// logged warning and "buffered" in name(). With O_DIRECT the kernel needs 4 KB-aligned buffers:
// callers may pass any alignment, and unaligned buffers go through a per-slot aligned bounce
// buffer (one memcpy).
//
// Threads: one I/O thread owns the ring. Submit() (any thread, also from a done() callback)
// checks the batch, pushes the op pointers into a lock-free queue and wakes the I/O thread
// through an eventfd; it never blocks on the disk. The I/O thread takes up to queue_depth ops in
// flight, submits them to the kernel in batches, resubmits the rest of a short read or write,
// and calls each op's done() from the I/O thread. Trim() (fallocate PUNCH_HOLE) and Flush()
// (fdatasync) run on the calling thread. Stats() may be called from any thread.
//
// Ownership: the store owns the file descriptor, the ring, the bounce buffers and the I/O
// thread. The file stays on disk after the store is destroyed (the caller chose the path and
// removes it). Destruction must not race with other calls on the store; every op accepted
// before it is carried out and completed before the destructor returns.
//
// Stats: per-op latency from Submit() to the op's completion (the queue wait included).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "client/page_store.h"
#include "common/status.h"

namespace tessera::client {

struct LocalSsdOptions {
  std::string path;             // The backing file; created, or truncated if it exists.
  uint64_t capacity_pages = 0;  // > 0; the file is capacity_pages * 4 KB.
  uint32_t queue_depth = 128;   // Ops in flight on the device at once (ring size), 1..4096.
  bool direct_io = true;        // O_DIRECT, with a buffered fallback when the FS refuses it.
  bool preallocate = true;      // fallocate the whole file up front (else a sparse file).
};

class LocalSsdStore final : public PageStore {
 public:
  // Opens/creates the file, sets up the ring and starts the I/O thread. InvalidArgument for bad
  // options; IoError (naming the call and path) when the file or ring cannot be set up.
  static Result<std::unique_ptr<LocalSsdStore>> Create(const LocalSsdOptions& options);

  ~LocalSsdStore() override;
  LocalSsdStore(const LocalSsdStore&) = delete;
  LocalSsdStore& operator=(const LocalSsdStore&) = delete;

  // "local-ssd(direct)" or "local-ssd(buffered: O_DIRECT refused by the file system)".
  std::string name() const override;
  uint64_t capacity_pages() const override;
  double memory_overhead() const override { return 1.0; }
  Status Submit(std::span<PageOp* const> ops) override;
  Status Trim(PageId first, uint64_t count) override;
  Status Flush() override;
  PageStoreStats Stats() const override;

  bool direct_io() const;
  const std::string& path() const;

  struct Impl;  // Public only so the .cc's helpers can name it.

 private:
  explicit LocalSsdStore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera::client
