// Subprocess: a child process started with fork+exec, owned by this object.
//
// Used to run real memservers, memcached and programs under test from benchmarks,
// integration tests and the embedded local cluster. The child's stdout can be captured as a
// pipe and read line by line with a deadline (e.g. to learn the port a memserver bound).
// The destructor kills (SIGKILL) and reaps a child that is still running, so a failing test
// never leaks processes, and the child gets SIGKILL if the thread that started it dies
// (PR_SET_PDEATHSIG), so start children from a long-lived thread. Not thread-safe per object.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/clock.h"
#include "common/fd.h"
#include "common/status.h"

namespace tessera {

class Subprocess {
 public:
  struct Options {
    bool capture_stdout = false;  // Else inherited.
    bool quiet_stderr = false;    // Send the child's stderr to /dev/null.
    std::vector<std::string> extra_env;  // "NAME=value" entries added to the environment.
    // Start the child in a process group of its own, so signals sent to the caller's group
    // (^C on a terminal, `timeout`, `kill -- -PGID`) do not reach it; its owner stops it.
    bool own_process_group = false;
    // With capture_stdout: the child's stderr goes to the same pipe (for tools whose error
    // message the caller reports, e.g. `ip`).
    bool stderr_to_stdout = false;
    // A network namespace (e.g. /run/netns/NAME) the child enters before exec; '' = the
    // caller's. The start fails if it cannot be opened; the child exits 127 if setns fails.
    std::string netns_path;
    // CPUs the child may run on (sched_setaffinity before exec); empty = inherited. Each must
    // be in 0..CPU_SETSIZE-1.
    std::vector<int> cpus;
  };

  Subprocess() = default;
  ~Subprocess();
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;
  Subprocess(Subprocess&& o) noexcept;
  Subprocess& operator=(Subprocess&& o) noexcept;

  // argv[0] is the program path (searched in PATH when it has no slash).
  static Result<Subprocess> Start(const std::vector<std::string>& argv, Options options);
  static Result<Subprocess> Start(const std::vector<std::string>& argv) {
    return Start(argv, Options{});
  }

  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0 && !exit_status_.has_value(); }

  // Reads one line (without '\n') from the captured stdout; Timeout when the deadline
  // passes, Unavailable at end of file.
  Result<std::string> ReadLine(Deadline deadline);
  // Reads lines until one starts with `prefix`; returns that line.
  Result<std::string> WaitForLine(const std::string& prefix, Deadline deadline);

  Status Signal(int sig);
  // Waits for the child to exit; returns its wait status (see WIFEXITED etc.).
  Result<int> Wait(Deadline deadline);
  // SIGTERM, wait up to `grace_ms`, then SIGKILL; returns the wait status.
  Result<int> Stop(int grace_ms = 2000);
  // Non-blocking check; true if it has exited (status then in exit_status()).
  bool Poll();
  std::optional<int> exit_status() const { return exit_status_; }

 private:
  pid_t pid_ = -1;
  UniqueFd stdout_;
  std::string buffer_;
  std::optional<int> exit_status_;
};

// The directory holding the running executable (from /proc/self/exe), e.g. build/bin.
std::string SelfExeDir();

// The real path of `share/tessera/<rel>` beside the executables in bin_dir: build/share/tessera
// from build/bin in a build tree, PREFIX/share/tessera from PREFIX/libexec/tessera once
// installed. "" when it is in neither place.
std::string DataPath(std::string_view rel, const std::string& bin_dir = SelfExeDir());

}  // namespace tessera
