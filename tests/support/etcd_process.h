// EtcdProcess: a real etcd server (Debian's /usr/bin/etcd) for tests, on loopback, on two free
// ports (client and peer), with its data in a temporary directory it owns. Stop() / Kill() and
// Restart() keep the ports and the data directory, so a test can take etcd away mid-run and
// bring the same cluster back.
//
// Threads: one test thread uses an EtcdProcess. The destructor kills etcd and removes the
// directory.
#pragma once

#include <memory>
#include <string>

#include "common/status.h"
#include "common/subprocess.h"
#include "tests/support/test_util.h"

namespace tessera::testing {

class EtcdProcess {
 public:
  // "" when /usr/bin/etcd exists; else the reason tests should GTEST_SKIP() with.
  static std::string SkipReason();
  // Starts etcd and waits (bounded, 15 s) until it answers a range request.
  static Result<std::unique_ptr<EtcdProcess>> Start();
  ~EtcdProcess();

  // "127.0.0.1:PORT", the client endpoint for --etcd.
  const std::string& endpoint() const { return endpoint_; }
  pid_t pid() const { return proc_.pid(); }
  // SIGKILL etcd (and reap it).
  Status Kill();
  // Starts it again on the same ports and data directory; waits until it answers.
  Status Restart();

 private:
  EtcdProcess() = default;
  Status Launch();

  TempDir dir_;
  int client_port_ = 0;
  int peer_port_ = 0;
  std::string endpoint_;
  Subprocess proc_;
};

}  // namespace tessera::testing
