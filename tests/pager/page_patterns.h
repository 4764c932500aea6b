// What the pager's unit tests share: a bounded wait for the pager's threads, a child process
// for what may stall, and page contents that name their page and a round (so a page holding
// another page's bytes, or an older round's, fails the check).
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <thread>

#include "common/clock.h"

namespace tessera::kernel_shim::testing {

inline constexpr size_t kTestPage = 4096;

// Bounded wait for a condition the pager's threads bring about.
inline bool WaitFor(const std::function<bool()>& cond, int ms = 10000) {
  Deadline d = Deadline::AfterMs(ms);
  while (!cond()) {
    if (d.Expired()) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

// Runs `body` in a forked child (a pager created there is the child's own) and returns its
// result (the child's exit code, 0..255), or -1 if it did not end within `ms` (it is killed):
// a pager that stalls fails the test instead of hanging it.
inline int RunInChild(const std::function<int()>& body, int ms) {
  const pid_t pid = ::fork();
  if (pid < 0) return -2;
  if (pid == 0) ::_exit(body());
  int status = 0;
  if (!WaitFor([&] { return ::waitpid(pid, &status, WNOHANG) == pid; }, ms)) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    return -1;
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

inline uint8_t Pattern(size_t page, size_t off, uint32_t round) {
  return static_cast<uint8_t>((page * 131 + off * 7 + round * 29 + (off >> 9)) & 0xff);
}
inline void FillPage(uint8_t* p, size_t page, uint32_t round) {
  for (size_t off = 0; off < kTestPage; ++off) p[off] = Pattern(page, off, round);
}
inline bool CheckPage(const uint8_t* p, size_t page, uint32_t round) {
  for (size_t off = 0; off < kTestPage; ++off) {
    if (p[off] != Pattern(page, off, round)) return false;
  }
  return true;
}

}  // namespace tessera::kernel_shim::testing
