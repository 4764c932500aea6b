// Status and Result<T>: Tessera's errors are values.
//
// A Status is either OK or an error code with a human-readable message. An OK Status holds no
// heap memory, so returning one on the fast path costs a couple of words. Result<T> holds
// either a T or a non-OK Status. Nothing in Tessera throws across a library boundary; a
// function that can fail returns one of these, and callers must look at it ([[nodiscard]]).
//
// Thread safety: values; distinct objects may be used from distinct threads freely.
#pragma once

#include <cstdlib>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>

namespace tessera {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument,   // The caller passed something malformed.
  kNotFound,          // The named thing does not exist.
  kAlreadyExists,
  kOutOfRange,        // An offset or id outside the valid range.
  kResourceExhausted, // Out of memory, slabs, queue slots, ...
  kUnavailable,       // A peer is down or unreachable; retrying elsewhere may help.
  kTimeout,           // A bounded wait ran out.
  kPermissionDenied,  // Authentication or ownership check failed.
  kDataLoss,          // More splits lost than the code can repair; the data is gone.
  kCorruption,        // A checksum did not match.
  kProtocolError,     // A peer sent a malformed frame.
  kUnsupported,       // Not possible on this machine/build (e.g. no RDMA device).
  kCancelled,
  kInternal,          // A bug; should not happen.
  kIoError,           // A system call failed.
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // "Code: message", or "OK".
  std::string ToString() const;

  // Returns a copy with `context` prepended to the message ("context: message").
  Status WithContext(std::string_view context) const;

  // Explicitly discards a Status whose failure the caller decided does not matter.
  void IgnoreError() const {}

  bool operator==(const Status& o) const { return code_ == o.code_ && message_ == o.message_; }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

std::ostream& operator<<(std::ostream& os, const Status& s);

// Constructors for the common codes, e.g. InvalidArgument("k must divide 4096, got ", k).
namespace internal {
template <typename... Args>
std::string StrCat(const Args&... args);
}  // namespace internal

#define TESSERA_DEFINE_STATUS_CTOR(Name)                             \
  template <typename... Args>                                        \
  Status Name(const Args&... args) {                                 \
    return Status(StatusCode::k##Name, internal::StrCat(args...));   \
  }
TESSERA_DEFINE_STATUS_CTOR(InvalidArgument)
TESSERA_DEFINE_STATUS_CTOR(NotFound)
TESSERA_DEFINE_STATUS_CTOR(AlreadyExists)
TESSERA_DEFINE_STATUS_CTOR(OutOfRange)
TESSERA_DEFINE_STATUS_CTOR(ResourceExhausted)
TESSERA_DEFINE_STATUS_CTOR(Unavailable)
TESSERA_DEFINE_STATUS_CTOR(Timeout)
TESSERA_DEFINE_STATUS_CTOR(PermissionDenied)
TESSERA_DEFINE_STATUS_CTOR(DataLoss)
TESSERA_DEFINE_STATUS_CTOR(Corruption)
TESSERA_DEFINE_STATUS_CTOR(ProtocolError)
TESSERA_DEFINE_STATUS_CTOR(Unsupported)
TESSERA_DEFINE_STATUS_CTOR(Cancelled)
TESSERA_DEFINE_STATUS_CTOR(Internal)
TESSERA_DEFINE_STATUS_CTOR(IoError)
#undef TESSERA_DEFINE_STATUS_CTOR

// An IoError naming the failed call and errno's text: ErrnoError("open ", path).
template <typename... Args>
Status ErrnoError(const Args&... args);

// Result<T>: a T or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {  // NOLINT: implicit by design
    if (status_.ok()) {
      status_ = Internal("Result constructed from an OK Status without a value");
    }
  }

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }

  T& value() & { CheckOk(); return *value_; }
  const T& value() const& { CheckOk(); return *value_; }
  T&& value() && { CheckOk(); return std::move(*value_); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  T value_or(T fallback) const& { return ok() ? *value_ : std::move(fallback); }

 private:
  void CheckOk() const;
  std::optional<T> value_;
  Status status_;
};

}  // namespace tessera

// Returns early from the enclosing function when `expr` yields a non-OK Status.
#define TESSERA_RETURN_IF_ERROR(expr)                   \
  do {                                                  \
    ::tessera::Status _tessera_st = (expr);             \
    if (!_tessera_st.ok()) return _tessera_st;          \
  } while (0)

#define TESSERA_CONCAT_INNER(a, b) a##b
#define TESSERA_CONCAT(a, b) TESSERA_CONCAT_INNER(a, b)

// TESSERA_ASSIGN_OR_RETURN(auto fd, OpenFile(path)); returns the Status on failure.
#define TESSERA_ASSIGN_OR_RETURN(lhs, expr) \
  TESSERA_ASSIGN_OR_RETURN_IMPL(TESSERA_CONCAT(_tessera_res_, __LINE__), lhs, expr)
#define TESSERA_ASSIGN_OR_RETURN_IMPL(res, lhs, expr) \
  auto res = (expr);                                  \
  if (!res.ok()) return res.status();                 \
  lhs = std::move(res).value()

// ---- implementation details ----
#include <cerrno>
#include <cstring>
#include <sstream>

namespace tessera {
namespace internal {
template <typename... Args>
std::string StrCat(const Args&... args) {
  if constexpr (sizeof...(Args) == 0) {
    return std::string();
  } else {
    std::ostringstream os;
    (os << ... << args);
    return os.str();
  }
}
[[noreturn]] void DieBadResultAccess(const Status& s);
}  // namespace internal

template <typename... Args>
Status ErrnoError(const Args&... args) {
  int err = errno;
  return Status(StatusCode::kIoError,
                internal::StrCat(args..., ": ", std::strerror(err), " (errno ", err, ")"));
}

template <typename T>
void Result<T>::CheckOk() const {
  if (!value_.has_value()) internal::DieBadResultAccess(status_);
}

}  // namespace tessera
