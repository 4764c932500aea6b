// Checks shared by the wire codecs of fabric/ (wire.cc, wire_payloads.cc, wire_kv.cc).
// Internal to fabric/: other folders use fabric/wire.h.
//
// Threads: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/status.h"
#include "fabric/wire.h"

namespace tessera::fabric::wire_internal {

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

}  // namespace tessera::fabric::wire_internal
