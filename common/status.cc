#include "common/status.h"

#include <cstdio>

namespace tessera {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kInvalidArgument: return "InvalidArgument";
    case StatusCode::kNotFound: return "NotFound";
    case StatusCode::kAlreadyExists: return "AlreadyExists";
    case StatusCode::kOutOfRange: return "OutOfRange";
    case StatusCode::kResourceExhausted: return "ResourceExhausted";
    case StatusCode::kUnavailable: return "Unavailable";
    case StatusCode::kTimeout: return "Timeout";
    case StatusCode::kPermissionDenied: return "PermissionDenied";
    case StatusCode::kDataLoss: return "DataLoss";
    case StatusCode::kCorruption: return "Corruption";
    case StatusCode::kProtocolError: return "ProtocolError";
    case StatusCode::kUnsupported: return "Unsupported";
    case StatusCode::kCancelled: return "Cancelled";
    case StatusCode::kInternal: return "Internal";
    case StatusCode::kIoError: return "IoError";
  }
  return "Unknown";
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string out(StatusCodeName(code_));
  out += ": ";
  out += message_;
  return out;
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return *this;
  std::string msg(context);
  msg += ": ";
  msg += message_;
  return Status(code_, std::move(msg));
}

std::ostream& operator<<(std::ostream& os, const Status& s) { return os << s.ToString(); }

namespace internal {
void DieBadResultAccess(const Status& s) {
  std::fprintf(stderr, "FATAL: value() called on a failed Result: %s\n", s.ToString().c_str());
  std::abort();
}
}  // namespace internal

}  // namespace tessera
