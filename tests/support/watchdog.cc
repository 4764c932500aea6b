// The test watchdog, linked into every test executable (tests/CMakeLists.txt): when a test has
// run for TESSERA_TEST_WATCHDOG_S seconds (ctest sets it a little below the case's TIMEOUT), it
// prints which test hangs and the stack of every thread of the process, then aborts. A hang is
// a failure with the evidence of where it waits, rather than a bare "Timeout" from ctest that
// kills the process with everything that would say why.
//
// The stacks come from gdb attached to the process (`thread apply all bt`), when gdb is
// installed; otherwise from /proc (each thread's state, wait channel and system call). Without
// the variable (a test run by hand) there is no watchdog.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <dirent.h>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>

namespace {

std::string ReadSmall(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  while (!s.empty() && (s.back() == '\n' || s.back() == '\0')) s.pop_back();
  return s;
}

// Runs gdb on this process; false when it could not be run.
bool GdbStacks(pid_t self) {
  if (access("/usr/bin/gdb", X_OK) != 0) return false;
  const pid_t child = fork();
  if (child < 0) return false;
  if (child == 0) {
    dup2(STDERR_FILENO, STDOUT_FILENO);
    const std::string pid = std::to_string(self);
    execl("/usr/bin/gdb", "gdb", "-nx", "-batch", "-p", pid.c_str(), "-ex",
          "thread apply all bt", static_cast<char*>(nullptr));
    _exit(127);
  }
  // Bounded: gdb gets 60 s.
  for (int i = 0; i < 600; ++i) {
    int status = 0;
    const pid_t r = waitpid(child, &status, WNOHANG);
    if (r == child) return WIFEXITED(status) && WEXITSTATUS(status) != 127;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  std::fprintf(stderr, "watchdog: gdb did not finish within 60 s\n");
  return true;
}

void ProcStacks() {
  DIR* d = opendir("/proc/self/task");
  if (d == nullptr) return;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    const std::string t = std::string("/proc/self/task/") + e->d_name;
    std::fprintf(stderr, "thread %s (%s): state %s, wchan %s, syscall %s\n", e->d_name,
                 ReadSmall(t + "/comm").c_str(), ReadSmall(t + "/stat").c_str(),
                 ReadSmall(t + "/wchan").c_str(), ReadSmall(t + "/syscall").c_str());
  }
  closedir(d);
}

// What the listener and the watchdog's thread share. Never freed: gtest deletes its listeners
// at exit, and destroying a condition variable a thread waits on would block the exit.
struct State {
  int seconds = 0;
  std::mutex mu;
  std::condition_variable cv;
  std::string name;
  std::chrono::steady_clock::time_point deadline;
  bool armed = false;
};

void Run(State* st) {
  std::unique_lock<std::mutex> lock(st->mu);
  for (;;) {
    if (!st->armed) {
      st->cv.wait(lock);
      continue;
    }
    if (st->cv.wait_until(lock, st->deadline) != std::cv_status::timeout) continue;
    if (!st->armed || std::chrono::steady_clock::now() < st->deadline) continue;
    const std::string name = st->name;
    std::fprintf(stderr,
                 "\nwatchdog: %s has run for %d s (TESSERA_TEST_WATCHDOG_S); the stacks of its "
                 "threads follow, then it aborts\n",
                 name.c_str(), st->seconds);
    std::fflush(stderr);
    lock.unlock();
    if (!GdbStacks(getpid())) {
      std::fprintf(stderr, "watchdog: no gdb here; what /proc says of each thread:\n");
      ProcStacks();
    }
    std::fprintf(stderr, "watchdog: aborting %s\n", name.c_str());
    std::fflush(stderr);
    std::abort();
  }
}

class Watchdog : public ::testing::EmptyTestEventListener {
 public:
  explicit Watchdog(State* st) : st_(st) {}
  void OnTestStart(const ::testing::TestInfo& info) override {
    std::lock_guard<std::mutex> lock(st_->mu);
    st_->name = std::string(info.test_suite_name()) + "." + info.name();
    st_->deadline = std::chrono::steady_clock::now() + std::chrono::seconds(st_->seconds);
    st_->armed = true;
    st_->cv.notify_all();
  }
  void OnTestEnd(const ::testing::TestInfo&) override {
    std::lock_guard<std::mutex> lock(st_->mu);
    st_->armed = false;
    st_->cv.notify_all();
  }

 private:
  State* const st_;
};

// Registered before main() runs the tests.
const bool kRegistered = [] {
  const char* env = std::getenv("TESSERA_TEST_WATCHDOG_S");
  const int seconds = env != nullptr ? std::atoi(env) : 0;
  if (seconds > 0) {
    auto* st = new State;
    st->seconds = seconds;
    // Lets the gdb this process starts attach to it where ptrace is limited to descendants.
    prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
    std::thread(Run, st).detach();
    ::testing::UnitTest::GetInstance()->listeners().Append(new Watchdog(st));
  }
  return true;
}();

}  // namespace
