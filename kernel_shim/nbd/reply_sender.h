// Internal to the NBD export: ReplySender, the reply/outbox policy of one connection (the part
// of nbdkit's server/protocol.c that writes replies, plus the outbox this server adds so store
// threads never block on a slow client).
//
// Replies are written by whichever thread finishes a request: a store thread for a READ or a
// plain WRITE that completed without error (no thread hop on the fast path), else the
// connection's completion thread. A sender tries a non-blocking sendmsg of its whole reply;
// what does not fit goes to the outbox, which only the completion thread drains (Drain(), with
// blocking sends and without holding the lock), while `flushing` keeps every other sender
// appending to the outbox. So replies never interleave and a slow client never blocks a store
// thread. A failed send shuts the socket down (which also stops the connection's reader) and
// drops every later reply.
//
// Threads: SendOrQueue from any thread; Drain from the completion thread only. Does not own
// the fd.
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>

namespace tessera::nbd {

class ReplySender {
 public:
  // `wake_reader` is called whenever outbox room frees up or the connection fails (the reader
  // may be waiting for either); it must not call back into the sender.
  ReplySender(int fd, std::function<void()> wake_reader)
      : fd_(fd), wake_reader_(std::move(wake_reader)) {}

  enum class Outcome : uint8_t {
    kDone,        // Sent, queued behind a drain already under way, or dropped (failed).
    kDrainNeeded  // Queued and this call started a drain: the completion thread must Drain().
  };
  // Sends `iov` (one or more whole replies, kept together) or queues what does not fit now.
  Outcome SendOrQueue(struct iovec* iov, size_t count);
  // Writes the outbox out (blocking sends) until it is empty or the connection failed.
  void Drain();
  // Bytes waiting in the outbox (the reader's back-pressure also bounds this).
  uint64_t queued_bytes() const { return outbox_bytes_.load(std::memory_order_relaxed); }

 private:
  // With mu_ held: the client is gone; later replies are dropped.
  void FailLocked();

  const int fd_;
  const std::function<void()> wake_reader_;
  std::mutex mu_;
  std::deque<std::string> outbox_;  // Guarded by mu_; non-empty implies flushing_.
  bool flushing_ = false;           // Guarded by mu_.
  bool failed_ = false;             // Guarded by mu_.
  std::atomic<uint64_t> outbox_bytes_{0};
};

}  // namespace tessera::nbd
