// EtcdServer: a private etcd (Debian's /usr/bin/etcd) for `tessera bench failover`'s etcd
// outage, on two free loopback ports, its data in a temporary directory it owns. Pause() and
// Resume() SIGSTOP / SIGCONT it (an outage in which every connection stays open and nothing
// answers, the way a hung or partitioned etcd looks to clients).
//
// Threads: one owner thread. The destructor resumes and kills etcd and removes the directory.
#pragma once

#include <memory>
#include <string>

#include "common/status.h"
#include "common/subprocess.h"

namespace tessera::bench {

class EtcdServer {
 public:
  // "" when /usr/bin/etcd exists; else why the etcd scenario cannot run.
  static std::string MissingReason();
  // Starts etcd and waits (bounded, 15 s) until it answers a request.
  static Result<std::unique_ptr<EtcdServer>> Start();
  ~EtcdServer();
  EtcdServer(const EtcdServer&) = delete;
  EtcdServer& operator=(const EtcdServer&) = delete;

  const std::string& endpoint() const { return endpoint_; }  // "127.0.0.1:PORT"
  Status Pause();
  Status Resume();

 private:
  EtcdServer() = default;
  Status Launch();

  std::string dir_;
  std::string endpoint_;
  int client_port_ = 0;
  int peer_port_ = 0;
  bool paused_ = false;
  Subprocess proc_;
};

}  // namespace tessera::bench
