// Logging and invariant checks.
//
//   TLOG(INFO) << "listening on " << addr;
//   TCHECK(n <= kMax) << "n=" << n;      // aborts with the message when false
//
// Messages go to stderr, one line each, prefixed with time, level, thread id and file:line.
// A line is formatted into a local buffer and written with one write(2), so lines from
// different threads do not interleave. Thread-safe. Logging is for the control path; the
// fast path should not log per operation.
#pragma once

#include <sstream>
#include <string_view>

namespace tessera {

enum class LogLevel : int { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3, kFatal = 4 };

// Messages below this level are dropped. Default kInfo. Set once from main().
void SetMinLogLevel(LogLevel level);
LogLevel MinLogLevel();
// Parses "debug|info|warning|error"; returns false on an unknown name.
bool ParseLogLevel(std::string_view name, LogLevel* out);

namespace internal {
class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line);
  ~LogMessage();  // Emits the line; aborts for kFatal.
  LogMessage(const LogMessage&) = delete;
  LogMessage& operator=(const LogMessage&) = delete;
  std::ostream& stream() { return os_; }

 private:
  LogLevel level_;
  std::ostringstream os_;
};
// Swallows the stream in the disabled branch of TLOG.
struct LogVoidify {
  void operator&(std::ostream&) {}
};
}  // namespace internal
}  // namespace tessera

#define TESSERA_LOG_LEVEL_DEBUG ::tessera::LogLevel::kDebug
#define TESSERA_LOG_LEVEL_INFO ::tessera::LogLevel::kInfo
#define TESSERA_LOG_LEVEL_WARNING ::tessera::LogLevel::kWarning
#define TESSERA_LOG_LEVEL_ERROR ::tessera::LogLevel::kError
#define TESSERA_LOG_LEVEL_FATAL ::tessera::LogLevel::kFatal

#define TLOG(level)                                                                  \
  (TESSERA_LOG_LEVEL_##level < ::tessera::MinLogLevel())                             \
      ? (void)0                                                                      \
      : ::tessera::internal::LogVoidify() &                                          \
            ::tessera::internal::LogMessage(TESSERA_LOG_LEVEL_##level, __FILE__, __LINE__) \
                .stream()

// Aborts with a message when `cond` is false (a broken invariant, never bad input).
#define TCHECK(cond)                                                                      \
  (cond) ? (void)0                                                                        \
         : ::tessera::internal::LogVoidify() &                                            \
               ::tessera::internal::LogMessage(::tessera::LogLevel::kFatal, __FILE__, __LINE__) \
                       .stream()                                                          \
                   << "Check failed: " #cond " "

#define TCHECK_OK(expr)                                                   \
  do {                                                                    \
    ::tessera::Status _tessera_chk = (expr);                              \
    TCHECK(_tessera_chk.ok()) << _tessera_chk.ToString();                 \
  } while (0)
