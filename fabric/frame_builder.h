// Internal to fabric/: appending whole frames to a ByteBuffer (the send side of a framed
// connection). Used by the server engine for responses and notices, by the server handshake,
// and by new request types. Everything is inline and allocation-free once the buffer has grown.
// Thread safety: pure functions over the caller's buffer.
#pragma once

#include <cstring>
#include <span>
#include <string_view>

#include "common/status.h"
#include "fabric/byte_buffer.h"
#include "fabric/wire.h"

namespace tessera::fabric {

// Appends a header (response when `response`) and reserves its payload; returns the payload's
// first byte (uninitialised).
inline uint8_t* AppendFrameHeader(ByteBuffer& out, Op op, bool response, uint64_t request_id,
                                  StatusCode status, uint32_t payload_len) {
  uint8_t* p = out.Append(kHeaderSize + payload_len);
  EncodeHeader(FrameHeader{op, response, request_id, status, payload_len}, p);
  return p + kHeaderSize;
}

// A successful response with an empty payload.
inline void AppendOk(ByteBuffer& out, Op op, uint64_t request_id) {
  AppendFrameHeader(out, op, true, request_id, StatusCode::kOk, 0);
}

// A successful response whose payload is a fixed-size body.
template <typename Body>
void AppendBody(ByteBuffer& out, Op op, uint64_t request_id, const Body& body) {
  body.EncodeTo(AppendFrameHeader(out, op, true, request_id, StatusCode::kOk, Body::kWireSize));
}

// A successful response whose payload is `data`.
inline void AppendBytes(ByteBuffer& out, Op op, uint64_t request_id,
                        std::span<const uint8_t> data) {
  uint8_t* p = AppendFrameHeader(out, op, true, request_id, StatusCode::kOk,
                                 static_cast<uint32_t>(data.size()));
  if (!data.empty()) std::memcpy(p, data.data(), data.size());
}

// An error response carrying `st`'s code and message (truncated to kMaxErrorMessageLength). An
// OK status is sent as kInternal: an error response must never look like success.
inline void AppendError(ByteBuffer& out, Op op, uint64_t request_id, const Status& st) {
  std::string_view msg = st.message();
  if (msg.size() > kMaxErrorMessageLength) msg = msg.substr(0, kMaxErrorMessageLength);
  StatusCode code = st.ok() ? StatusCode::kInternal : st.code();
  uint8_t* p = AppendFrameHeader(out, op, true, request_id, code, static_cast<uint32_t>(msg.size()));
  if (!msg.empty()) std::memcpy(p, msg.data(), msg.size());
}

// The Status an error response carries (its code and message).
inline Status StatusFromErrorFrame(const ParsedFrame& f) {
  return Status(f.header.status,
                std::string(reinterpret_cast<const char*>(f.data.data()), f.data.size()));
}

}  // namespace tessera::fabric
