// Internal to fabric/: FramedConnection, one TCP byte stream of frames driven by an IoRing. The
// server engine's connections and the TCP transport's connections are both one of these plus
// their own bookkeeping.
//
// Receive side: one recv at a time into a FrameReader window (ArmRecv, then OnRecvDone with the
// CQE's result; whole frames are then taken from `in`). Send side: frames are appended to
// `pending`; Flush() hands them to the kernel as one send when none is in flight (frames
// appended meanwhile collect in `pending` and leave together next). `ops_in_kernel` counts the
// recv/send SQEs whose buffers the kernel may still touch: the connection (and its buffers) may
// be freed only once it is 0.
//
// Ownership: owns its fd and buffers. Threads: the one thread that owns the ring.
#pragma once

#include <sys/socket.h>

#include <cstdint>

#include "common/fd.h"
#include "fabric/byte_buffer.h"
#include "fabric/frame_reader.h"
#include "fabric/io_ring.h"

namespace tessera::fabric {

class FramedConnection {
 public:
  static constexpr size_t kInitialRecvBuffer = 256 * 1024;

  FramedConnection() = default;
  explicit FramedConnection(UniqueFd fd, size_t initial_recv_buffer = kInitialRecvBuffer)
      : in(initial_recv_buffer), fd_(std::move(fd)) {}
  FramedConnection(const FramedConnection&) = delete;
  FramedConnection& operator=(const FramedConnection&) = delete;
  // Moves only while nothing is in the kernel (the kernel holds pointers into the buffers).
  FramedConnection(FramedConnection&&) = default;
  FramedConnection& operator=(FramedConnection&&) = default;

  int fd() const { return fd_.get(); }
  // Grows both send buffers to `bytes` up front (no reallocation on the first bursts).
  void ReserveSendBuffers(size_t bytes) {
    pending.reserve(bytes);
    sending_.reserve(bytes);
  }
  // shutdown(SHUT_RDWR): ends the recv/send in flight (they complete with 0 or an error).
  void Shutdown();

  // Arms a recv into the input window tagged `user_data`; no-op when one is armed.
  void ArmRecv(IoRing& ring, uint64_t user_data);
  // The recv CQE arrived: bookkeeping only (the caller interprets `res`, then Commits).
  void OnRecvDone() {
    recv_armed_ = false;
    ops_in_kernel_--;
  }

  enum class FlushResult : uint8_t {
    kSending,  // A send is in flight (just armed or earlier).
    kIdle,     // Everything appended so far has been sent.
  };
  // Arms a send of the unsent bytes tagged `user_data` unless one is in flight.
  FlushResult Flush(IoRing& ring, uint64_t user_data);
  // The send CQE arrived: accounts for `res` bytes sent (negative results are left to the
  // caller, which decides between retrying with Flush and closing).
  void OnSendDone(int res) {
    send_armed_ = false;
    ops_in_kernel_--;
    if (res > 0) send_off_ += static_cast<size_t>(res);
  }

  // Bytes appended and not yet taken by the kernel (pending plus the unsent part of the send in
  // flight).
  size_t queued_bytes() const { return pending.size() + (sending_.size() - send_off_); }
  bool recv_armed() const { return recv_armed_; }
  bool send_armed() const { return send_armed_; }
  int ops_in_kernel() const { return ops_in_kernel_; }
  // Closes the fd and frees the buffers; only when ops_in_kernel() == 0.
  void Release();

  FrameReader in;      // Received bytes; whole frames are taken from its head.
  ByteBuffer pending;  // Frames appended and not yet handed to the kernel.

 private:
  UniqueFd fd_;
  ByteBuffer sending_;  // The bytes of the send in flight (from send_off_ on).
  size_t send_off_ = 0;
  bool recv_armed_ = false;
  bool send_armed_ = false;
  int ops_in_kernel_ = 0;
};

inline void FramedConnection::Shutdown() {
  if (fd_) ::shutdown(fd_.get(), SHUT_RDWR);
}

inline void FramedConnection::ArmRecv(IoRing& ring, uint64_t user_data) {
  if (recv_armed_) return;
  std::span<uint8_t> space = in.RecvSpace();
  io_uring_sqe* sqe = ring.Sqe();
  io_uring_prep_recv(sqe, fd_.get(), space.data(), space.size(), 0);
  io_uring_sqe_set_data64(sqe, user_data);
  recv_armed_ = true;
  ops_in_kernel_++;
}

inline FramedConnection::FlushResult FramedConnection::Flush(IoRing& ring, uint64_t user_data) {
  if (send_armed_) return FlushResult::kSending;
  if (send_off_ == sending_.size()) {
    sending_.clear();
    send_off_ = 0;
    if (pending.empty()) return FlushResult::kIdle;
    swap(sending_, pending);
  }
  io_uring_sqe* sqe = ring.Sqe();
  io_uring_prep_send(sqe, fd_.get(), sending_.data() + send_off_, sending_.size() - send_off_,
                     MSG_NOSIGNAL);
  io_uring_sqe_set_data64(sqe, user_data);
  send_armed_ = true;
  ops_in_kernel_++;
  return FlushResult::kSending;
}

inline void FramedConnection::Release() {
  fd_.Reset();
  in = FrameReader();  // Frees the receive window.
  pending.Release();
  sending_.Release();
}

}  // namespace tessera::fabric
