// SwapFileServer: the page store as one file in a FUSE file system, for a kernel swap device on
// a stock kernel with no module of its own: losetup turns the file into a block device, mkswap
// and swapon make it swap (apps/swap, `tessera swap on`).
//
// The mount holds one regular file (SwapFileOptions::file_name) of size_bytes. Every open is
// served with direct I/O (FOPEN_DIRECT_IO): the kernel sends each read and write of the file
// straight to this daemon, bypassing the page cache, so the loop device above it never fills
// the page cache of the very machine that is short of memory. Byte offset B is byte B % 4096 of
// page B / 4096 of the store. Reads and writes of whole pages (all the swap and loop paths
// issue) take no lock: a write is submitted from the worker's own op array (no allocation in
// the server), a read is a blocking ReadPages that a remote store runs to completion on the
// worker's thread. A read or write that covers part of a page (mkswap's header, blkid probes)
// reads, patches and writes the page under one mutex.
//
// A read of a page the store cannot rebuild (DataLoss: more than r of its servers lost) is
// answered with EIO; the kernel turns that into an I/O error of the swap-in, and the process
// that touched the page gets SIGBUS. The page is recorded (LostPages) and logged with its page
// number and file offset. A failed write is answered with EIO too (the kernel then keeps the
// page in memory and marks the swap slot bad).
//
// Threads: Mount() and Run() on one thread (Run blocks in libfuse's multi-threaded loop with
// `threads` workers, each with one scratch buffer allocated when it serves its first request).
// Exit() is async-signal-safe and may be called from any thread or a signal handler. Stats()
// and LostPages() from any thread (relaxed atomics). The store must outlive the server and is
// used from every worker thread concurrently (PageStore is thread-safe).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "client/page_store.h"
#include "common/status.h"

namespace tessera::kernel_shim {

struct SwapFileOptions {
  std::string mountpoint;           // An existing empty directory. Required.
  std::string file_name = "swap";   // The one file in the mount.
  uint64_t size_bytes = 0;          // A multiple of 4096, at most the store's capacity. Required.
  int threads = 4;                  // libfuse worker threads, 1..64.
  uint32_t max_io_bytes = 1 << 20;  // Largest read/write the kernel may send (max_write), 4K..1M.
  std::string fsname = "tessera-swap";  // Shown in /proc/mounts.
};

struct SwapFileStats {
  uint64_t read_requests = 0;
  uint64_t write_requests = 0;
  uint64_t pages_read = 0;
  uint64_t pages_written = 0;
  uint64_t partial_page_ops = 0;  // Reads/writes that covered part of a page.
  uint64_t read_errors = 0;       // Requests answered with EIO.
  uint64_t write_errors = 0;
  uint64_t lost_pages = 0;  // Distinct reads that failed with DataLoss (page count).
  uint64_t flushes = 0;
};

class SwapFileServer {
 public:
  // InvalidArgument for a bad size, thread count or I/O size; the store is not touched.
  static Result<std::unique_ptr<SwapFileServer>> Create(client::PageStore* store,
                                                        const SwapFileOptions& options);
  ~SwapFileServer();
  SwapFileServer(const SwapFileServer&) = delete;
  SwapFileServer& operator=(const SwapFileServer&) = delete;

  // Creates the FUSE session and mounts it (needs /dev/fuse and the right to mount: root).
  // Unavailable with a clear message when /dev/fuse is missing, the mount point is already a
  // mount, or mounting fails.
  Status Mount();
  // Serves requests until Exit() or the file system is unmounted, then unmounts. Returns the
  // libfuse loop's error, if any.
  Status Run();
  // Asks Run() to return: ends the session and lazily unmounts (async-signal-safe). With the
  // file still open (a loop device attached), the workers keep serving it until it is closed.
  void Exit();

  // The path of the file inside the mount: MOUNTPOINT/FILE_NAME.
  std::string file_path() const { return options_.mountpoint + "/" + options_.file_name; }
  const SwapFileOptions& options() const { return options_; }
  SwapFileStats Stats() const;
  // The page numbers of the most recent lost pages (at most kLostPagesKept, oldest first).
  static constexpr size_t kLostPagesKept = 64;
  std::vector<client::PageId> LostPages() const;

  struct Impl;  // The libfuse callbacks reach the server through it.

 private:
  SwapFileServer() = default;
  SwapFileOptions options_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera::kernel_shim
