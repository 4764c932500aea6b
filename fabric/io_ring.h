// Internal to fabric/: IoRing, the one io_uring set-up shared by the server engine's I/O threads
// and the TCP client transport.
//
// What kind of ring the kernel supports is probed once per process (ProbeIoRing()): the fast
// mode is a single-issuer ring with deferred task work, created disabled so that the thread
// that will use it enables it and so becomes its single issuer (the kernel then never
// interrupts that thread with completion work; it runs the work when the thread enters the
// kernel). Kernels without those flags (before 6.1) get the single fallback: a plain ring,
// enabled at once, whose completions are posted as they happen.
//
// Ownership: an IoRing owns its io_uring (io_uring_queue_exit in the destructor); it is neither
// copyable nor movable (liburing's SQ/CQ pointers refer into its mappings, callers hold it by
// value or by unique_ptr). Threads: Init() may run on any thread; EnableOnThisThread() must run
// on the thread that then submits, and every other call must come from that thread.
#pragma once

#include <liburing.h>

#include <cstdint>
#include <string_view>

#include "common/status.h"

namespace tessera::fabric {

enum class IoRingMode : uint8_t {
  kSingleIssuerDeferred,  // IORING_SETUP_SINGLE_ISSUER | DEFER_TASKRUN | R_DISABLED.
  kPlain,                 // No setup flags (the fallback).
};
std::string_view IoRingModeName(IoRingMode mode);  // "single-issuer-deferred", "plain"

// The mode this kernel supports, probed by creating (and destroying) a tiny ring the first time
// it is called; the answer is cached. Thread-safe. An error only when no io_uring can be created
// at all (e.g. io_uring disabled by sysctl), with the reason.
Result<IoRingMode> ProbeIoRing();

class IoRing {
 public:
  IoRing() = default;
  ~IoRing();
  IoRing(const IoRing&) = delete;
  IoRing& operator=(const IoRing&) = delete;

  // Creates the ring with `entries` SQ entries in the probed mode.
  Status Init(uint32_t entries);
  // Makes the calling thread the ring's submitter (fast mode: enables the ring; plain mode:
  // nothing to do). Idempotent.
  Status EnableOnThisThread();

  bool ready() const { return ready_; }
  bool enabled() const { return enabled_; }
  // True when completions are only produced when the owner enters the kernel (fast mode): a
  // poller must then call io_uring_get_events() (Reap) to see new completions.
  bool defer_taskrun() const { return mode_ == IoRingMode::kSingleIssuerDeferred; }
  IoRingMode mode() const { return mode_; }
  io_uring* get() { return &ring_; }

  // A free SQE, submitting queued ones first when the SQ is full. Never null.
  io_uring_sqe* Sqe();
  // Submits queued SQEs (io_uring_submit); returns its result.
  int Submit() { return io_uring_submit(&ring_); }
  // Submits and waits up to `timeout_ns` for at least one completion.
  void SubmitAndWait(uint64_t timeout_ns);
  // Runs deferred completion work without waiting (fast mode), so peek sees new CQEs.
  void GetEvents() { io_uring_get_events(&ring_); }

 private:
  io_uring ring_{};
  IoRingMode mode_ = IoRingMode::kPlain;
  bool ready_ = false;
  bool enabled_ = false;
};

}  // namespace tessera::fabric
