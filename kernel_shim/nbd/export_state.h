// ExportStateFile: what makes a restarted `tessera nbd` refuse instead of serving zeros.
//
// The export's page map (which remote slab holds each page, and the CRC every read is checked
// against: client/remote_store.h) lives only in the exporting process. When that process ends,
// by SIGKILL or by a clean stop, the blocks it stored cannot be found again, even though their
// splits may still sit on the memservers until their lease expires. A new process over the
// same memservers would read every block as never written, i.e. as zeros. This file is how the
// next run knows: it records, durably, that a run of the export acknowledged (or was about to
// acknowledge) a change of data, and a later run refuses to serve while it says so.
//
// The file (one per export set; --state_file):
//   # tessera nbd export state; delete this file only to start over with an empty device
//   tessera-nbd-state v1
//   written 0|1
//   pid N
//   since UNIX_SECONDS
// Open() creates the file if it is absent (and fsyncs its directory) and takes an exclusive
// flock on it (another live export on the same file is refused), then: empty (just created)
// or `written 0` (the previous run never changed data): rewrites it for this run; `written
// 1`: DataLoss with a message saying what was lost and how to start over; anything else (not
// a state file, or one torn by a crash mid-update): Corruption, and the file is left as it is.
// Updates are written in place (pwrite, ftruncate, fdatasync): a torn update reads as
// Corruption, which refuses too, so every failure refuses rather than serves zeros.
// RecordWritten() makes it say `written 1` durably; the export calls it before the first
// data-changing request reaches the store, so no acknowledged write can be forgotten.
//
// Threads: RecordWritten is thread-safe (the first successful call does the I/O, under a mutex;
// later ones return at once; a failed one is tried again by the next call). Ownership: holds the
// file's fd (and the lock) until destroyed.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include "common/fd.h"
#include "common/status.h"

namespace tessera::nbd {

class ExportStateFile {
 public:
  static Result<std::unique_ptr<ExportStateFile>> Open(const std::string& path);
  ~ExportStateFile() = default;
  ExportStateFile(const ExportStateFile&) = delete;
  ExportStateFile& operator=(const ExportStateFile&) = delete;

  // Durably records that this run changes data (idempotent). IoError when the file cannot be
  // written or synced; the caller must then fail the change instead of acknowledging it.
  Status RecordWritten();
  bool written() const { return written_.load(std::memory_order_acquire); }
  const std::string& path() const { return path_; }

 private:
  ExportStateFile(std::string path, UniqueFd lock_fd)
      : path_(std::move(path)), lock_fd_(std::move(lock_fd)) {}
  // Rewrites the file's contents in place and syncs them.
  Status Store(bool written);

  const std::string path_;
  UniqueFd lock_fd_;  // The state file, open and flock()ed for the life of this object.
  std::mutex mu_;
  std::atomic<bool> written_{false};  // Set (under mu_) once `written 1` is on disk.
};

}  // namespace tessera::nbd
