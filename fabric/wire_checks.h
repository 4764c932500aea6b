// Checks shared by the wire codecs: fabric's own frames (wire.cc, wire_payloads.cc) and the
// payloads of the services' ops, which their services define in their own folders (so every
// codec words a short payload or non-zero padding the same way).
//
// Threads: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "common/status.h"
#include "fabric/wire.h"

namespace tessera::fabric::wire_checks {

inline Status Short(const char* what, size_t want, size_t got) {
  return ProtocolError(what, " payload must be ", want, " bytes, got ", got);
}

inline bool AllZero(const uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (p[i] != 0) return false;
  }
  return true;
}

inline Status CheckPad(const char* what, const uint8_t* p, size_t n) {
  if (!AllZero(p, n)) return ProtocolError(what, ": padding bytes must be zero");
  return Status::Ok();
}

inline Status CheckDataLength(const char* what, uint32_t length) {
  if (length == 0 || length > kMaxDataLength) {
    return ProtocolError(what, ": length ", length, " outside 1..", kMaxDataLength);
  }
  return Status::Ok();
}

// Decodes T's fixed part at the start of `payload` into frame->body and views the bytes after
// it as frame->data; `what` names the op in the error of a payload shorter than the fixed part.
// For any parsed-frame type with `body` (a variant holding T) and `data` members.
template <typename T, typename Frame>
Status DecodeFixedPart(const std::string& what, std::span<const uint8_t> payload, Frame* frame) {
  if (payload.size() < T::kWireSize) return Short(what.c_str(), T::kWireSize, payload.size());
  TESSERA_ASSIGN_OR_RETURN(T body, T::Decode(payload.first(T::kWireSize)));
  frame->body = body;
  frame->data = payload.subspan(T::kWireSize);
  return Status::Ok();
}

}  // namespace tessera::fabric::wire_checks
