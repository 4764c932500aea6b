// The runner's own child processes besides the memservers: an etcd server for the cluster's
// membership ([cluster] membership = "etcd", fault target `etcd`) and the client process of a
// pagestore workload with client_pages (fault target `client`, `tessera experiment client`).
//
// Children are forked by a private long-lived thread (ForkThread): a Subprocess gets SIGKILL
// when the thread that forked it exits (PR_SET_PDEATHSIG), and the faults that restart these
// children run on the fault scheduler thread, which ends before the run's final checks.
//
// Threads: every method may be called from any thread, one call at a time per object.
#pragma once

#include <sys/types.h>

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "common/status.h"
#include "common/subprocess.h"

namespace tessera::experiment {

// Runs calls on one long-lived thread of its own, the caller waiting for each.
class ForkThread {
 public:
  ForkThread();
  ~ForkThread();
  Status Run(const std::function<Status()>& fn);

 private:
  void Loop();
  std::mutex mu_;
  std::condition_variable cv_;
  const std::function<Status()>* job_ = nullptr;  // Guarded by mu_.
  Status result_;
  bool done_ = false, stop_ = false;
  std::thread thread_;
};

// A single-member etcd (the `etcd` program, Debian's etcd-server) on two free loopback ports,
// its data in a private temporary directory (removed by the destructor) and its log in
// `log_path`. Kill() and Restart() keep the ports and the data, so the same cluster comes back
// with its keys and leases.
class EtcdServer {
 public:
  // Starts it and waits (bounded, 15 s) until it answers a range request.
  static Result<std::unique_ptr<EtcdServer>> Start(const std::string& log_path);
  ~EtcdServer();

  const std::string& endpoint() const { return endpoint_; }  // "127.0.0.1:PORT"
  Status Kill();     // SIGKILL (resumed first if stopped) and reap.
  Status Stop();     // SIGSTOP.
  Status Cont();     // SIGCONT.
  Status Restart();  // Kill() if running, then start on the same ports and data; waits.

 private:
  EtcdServer() = default;
  Status Launch();
  ForkThread forker_;
  std::string dir_, log_path_, endpoint_;
  int client_port_ = 0, peer_port_ = 0;
  Subprocess proc_;
};

// What the final client process reported when it was asked to finish.
struct ClientOutcome {
  uint64_t pages = 0, checked = 0, lost = 0, wrong_bytes = 0, read_errors = 0;
};

// The client process of a pagestore workload: `tessera-experiment client SPEC`, one process at
// a time; KillAndRestart() replaces it by a fresh process (a new owner on every memserver).
class ClientProcess {
 public:
  // Writes SPEC (JSON: servers, token file, code, layout, placement, pages, seed) to
  // `spec_path` and starts the first process; returns once it has written its pages.
  static Result<std::unique_ptr<ClientProcess>> Start(const std::string& bin_dir,
                                                      const std::string& spec_json,
                                                      const std::string& spec_path);
  ~ClientProcess();
  // SIGKILL the running process, reap it and start a fresh one, without waiting for it to
  // write its pages: the fault scheduler calls this, and its next fault is due on time
  // however slowly the fresh process loads (on a loaded machine that took over 3 s, past the
  // next kill's time). A kill may then find the process still writing its pages, as a real
  // crash may; the final one finishes them before it checks them (Finish).
  Status KillAndRestart();
  // Once the running process has written its pages (bounded, 30 s), SIGTERM it: it reads every
  // page back, checks it, closes its store (freeing its slabs) and reports (bounded, 60 s).
  Result<ClientOutcome> Finish();
  int kills() const { return kills_; }
  pid_t pid() const { return proc_.pid(); }

 private:
  ClientProcess() = default;
  // Starts a process; with wait_loaded, returns once it has written its pages (bounded, 30 s).
  Status Launch(bool wait_loaded);
  ForkThread forker_;
  std::string bin_dir_, spec_path_;
  Subprocess proc_;
  bool loaded_ = false;  // proc_ said "client loaded".
  int kills_ = 0;
};

// The client process's own main (`tessera experiment client SPEC`): writes its pages, prints
// "client loaded N pages", then rewrites and checks random pages until SIGTERM, then reads
// every page back, prints "client result pages=.. checked=.. lost=.. wrong_bytes=..
// read_errors=..", closes its store and returns 0 (1 on a setup error).
int RunClientProcess(const std::string& spec_path);

}  // namespace tessera::experiment
