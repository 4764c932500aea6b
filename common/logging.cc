#include "common/logging.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>

namespace tessera {
namespace {
std::atomic<int> g_min_level{static_cast<int>(LogLevel::kInfo)};

const char* LevelChar(LogLevel l) {
  switch (l) {
    case LogLevel::kDebug: return "D";
    case LogLevel::kInfo: return "I";
    case LogLevel::kWarning: return "W";
    case LogLevel::kError: return "E";
    case LogLevel::kFatal: return "F";
  }
  return "?";
}

// The local UTC offset when first needed (daylight-saving changes during a run are ignored).
long UtcOffsetSeconds() {
  static const long offset = [] {
    time_t now = time(nullptr);
    tm tmv;
    localtime_r(&now, &tmv);
    return tmv.tm_gmtoff;
  }();
  return offset;
}

const char* Basename(const char* path) {
  const char* slash = std::strrchr(path, '/');
  return slash ? slash + 1 : path;
}
}  // namespace

void SetMinLogLevel(LogLevel level) { g_min_level.store(static_cast<int>(level)); }
LogLevel MinLogLevel() { return static_cast<LogLevel>(g_min_level.load(std::memory_order_relaxed)); }

bool ParseLogLevel(std::string_view name, LogLevel* out) {
  if (name == "debug") *out = LogLevel::kDebug;
  else if (name == "info") *out = LogLevel::kInfo;
  else if (name == "warning") *out = LogLevel::kWarning;
  else if (name == "error") *out = LogLevel::kError;
  else return false;
  return true;
}

namespace internal {
LogMessage::LogMessage(LogLevel level, const char* file, int line) : level_(level) {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  // Local time of day from a UTC offset read once: localtime_r() takes glibc's tzset lock on
  // every call, and a logging pager/store thread must never wait on a lock that a paged program
  // thread may hold while it faults (the LD_PRELOAD shim runs this code inside programs).
  const long day_s = static_cast<long>((ts.tv_sec + UtcOffsetSeconds()) % 86400 + 86400) % 86400;
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%s%02ld:%02ld:%02ld.%06ld %5ld ", LevelChar(level),
                day_s / 3600, day_s / 60 % 60, day_s % 60, ts.tv_nsec / 1000,
                static_cast<long>(syscall(SYS_gettid)));
  os_ << buf << Basename(file) << ':' << line << "] ";
}

LogMessage::~LogMessage() {
  os_ << '\n';
  std::string s = os_.str();
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = ::write(STDERR_FILENO, s.data() + off, s.size() - off);
    if (n <= 0) break;
    off += static_cast<size_t>(n);
  }
  if (level_ == LogLevel::kFatal) std::abort();
}
}  // namespace internal
}  // namespace tessera
