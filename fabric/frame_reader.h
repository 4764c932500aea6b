// FrameReader, the receive window of one framed TCP byte stream: the server engine, the TCP
// client transport and the clients of services (their own connections) read frames with it.
//
// Bytes arrive at the tail (RecvSpace() then Commit(n) after a recv); whole frames are taken
// from the head (Next() then Consume()). The window grows to fit a frame larger than itself
// (bounded by the header's validated payload limit) and compacts consumed bytes before a recv
// needs the room. The span Next() returns is valid until the next RecvSpace() or Next() call.
// Owns its memory; move-only; not thread-safe (one connection, one thread).
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <vector>

#include "common/logging.h"
#include "common/status.h"
#include "fabric/wire.h"

namespace tessera::fabric {

class FrameReader {
 public:
  struct Frame {
    FrameHeader header;
    std::span<const uint8_t> payload;
  };

  explicit FrameReader(size_t initial_capacity = 0) : buf_(initial_capacity) {}

  // Where the next recv may write (never empty once the reader has a capacity).
  std::span<uint8_t> RecvSpace() {
    if (start_ > 0 && (start_ == end_ || end_ == buf_.size())) Compact();
    TCHECK(end_ < buf_.size()) << "receive buffer full without a complete frame";
    return std::span<uint8_t>(buf_.data() + end_, buf_.size() - end_);
  }
  void Commit(size_t n) { end_ += n; }

  // The next whole frame at the head, its header validated for `direction`; nullopt when more
  // bytes are needed (the window then has room for the whole frame); an error for a malformed
  // header. Call Consume() once the frame is handled.
  Result<std::optional<Frame>> Next(Direction direction) {
    const size_t avail = end_ - start_;
    if (avail < kHeaderSize) return std::optional<Frame>();
    std::span<const uint8_t> bytes(buf_.data() + start_, avail);
    TESSERA_ASSIGN_OR_RETURN(FrameHeader h, DecodeHeader(bytes.first(kHeaderSize), direction));
    const size_t need = kHeaderSize + h.payload_len;
    if (avail < need) {
      if (start_ + need > buf_.size()) {
        Compact();
        if (need > buf_.size()) buf_.resize(need);
      }
      return std::optional<Frame>();
    }
    return std::optional<Frame>(Frame{h, bytes.subspan(kHeaderSize, h.payload_len)});
  }
  // Drops the frame Next() returned.
  void Consume(const Frame& frame) {
    start_ += kHeaderSize + frame.payload.size();
    if (start_ == end_) start_ = end_ = 0;
  }

  // The header of the next frame once its kHeaderSize bytes are here (validated for
  // `direction`), before its payload arrives: lets a caller refuse a frame by its header
  // (op, claimed length) before the window grows for it. nullopt: not all header bytes yet.
  Result<std::optional<FrameHeader>> PeekHeader(Direction direction) const {
    if (end_ - start_ < kHeaderSize) return std::optional<FrameHeader>();
    TESSERA_ASSIGN_OR_RETURN(
        FrameHeader h,
        DecodeHeader(std::span<const uint8_t>(buf_.data() + start_, kHeaderSize), direction));
    return std::optional<FrameHeader>(h);
  }
  // Grows the window to at least `bytes` (never shrinks it).
  void Reserve(size_t bytes) {
    if (buf_.size() < bytes) buf_.resize(bytes);
  }

  // Bytes received and not yet consumed (a peer closing now closes mid-frame).
  size_t buffered() const { return end_ - start_; }
  // The bytes of the frame Next() returned, header included (for parsers that take whole frames).
  std::span<const uint8_t> FrameBytes(const Frame& frame) const {
    return std::span<const uint8_t>(buf_.data() + start_, kHeaderSize + frame.payload.size());
  }

 private:
  void Compact() {
    std::memmove(buf_.data(), buf_.data() + start_, end_ - start_);
    end_ -= start_;
    start_ = 0;
  }

  std::vector<uint8_t> buf_;
  size_t start_ = 0;
  size_t end_ = 0;
};

}  // namespace tessera::fabric
