// LocalCluster: N real `tessera memserver` processes, started on ephemeral ports, owned by one
// object: all on loopback, or each in a network namespace of its own (hosts = kNetns). Used by the client's integration tests, by `tessera bench pagestore`,
// and by the embedded local cluster of `tessera run` / `tessera nbd`.
//
// Start() writes a fresh random shared secret into a token file in a private temporary
// directory (removed by the destructor), then starts each server with
//   tessera memserver --port=0 --capacity=C --slab_size=S --headroom=0 --auth_token_file=F
//                     [--fault_injection] [extra flags]
// and reads its `listening on HOST:PORT` line with a deadline. A cluster file listing every
// server (one `HOST:PORT` per line) is written beside the token, so `tessera status
// CLUSTER` and other tools can be pointed at it.
//
// Hosts (client/hosts.h). With hosts = kNetns, server i runs in namespace i of a NetHosts with
// --listen=its address, and one more namespace is the client host (StartOnClientHost). The
// caller's own namespace reaches every server through the bridge. When namespaces cannot be
// made here, Start logs a warning saying why and runs on loopback; hosts() tells which was
// used and hosts_note() why. With a PinPlan, every memserver runs on pin.servers and client
// processes started here on pin.client (sched_setaffinity), in either mode.
//
// Children are forked by a private long-lived thread owned by the LocalCluster, so they are not
// killed early by PR_SET_PDEATHSIG when the thread that called Start() exits. The destructor
// stops every server (SIGCONT first for stopped ones, then SIGKILL) and reaps it.
//
// Threads: all methods may be called from any thread, concurrently (an internal mutex guards
// the control path; none of this is a fast path).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "client/hosts.h"
#include "common/status.h"
#include "common/subprocess.h"
#include "fabric/transport.h"

namespace tessera::client {

struct LocalClusterOptions {
  // Directory holding the `tessera` executable (e.g. build/bin; SelfExeDir() for programs that
  // live there). Required.
  std::string bin_dir;
  size_t servers = 3;            // 1..64.
  std::string capacity = "64M";  // --capacity of each server.
  std::string slab_size = "1M";  // --slab_size of each server.
  bool fault_injection = false;  // Pass --fault_injection (needed for Fault()).
  std::vector<std::string> extra_flags;  // Appended to every server's command line.
  int start_timeout_ms = 10000;  // Bound on each server printing its `listening on` line.
  bool quiet = true;             // Servers' stderr to /dev/null and --log_level=warning.
  // Each server in a process group of its own: signals meant for the owner's group (^C on a
  // terminal, `timeout`) do not stop the servers before the owner has stopped what uses them
  // (`tessera run` forwards the signal to its program, waits for it, then stops the cluster).
  bool own_process_group = true;
  HostsMode hosts = HostsMode::kLoopback;  // kNetns: a namespace per server (falls back).
  PinPlan pin;  // CPUs of the memservers and of StartOnClientHost's processes; empty: any.
};

class LocalCluster {
 public:
  static Result<std::unique_ptr<LocalCluster>> Start(const LocalClusterOptions& options);
  ~LocalCluster();
  LocalCluster(const LocalCluster&) = delete;
  LocalCluster& operator=(const LocalCluster&) = delete;

  size_t size() const { return endpoints_.size(); }
  const std::vector<fabric::Endpoint>& endpoints() const { return endpoints_; }
  const std::string& secret() const { return secret_; }
  const std::string& token_path() const { return token_path_; }
  const std::string& cluster_file_path() const { return cluster_file_path_; }
  // Where the servers run: kNetns, or kLoopback (asked for, or fallen back to).
  HostsMode hosts() const { return hosts_; }
  // Why netns was asked for and loopback is used ('' otherwise).
  const std::string& hosts_note() const { return hosts_note_; }
  const PinPlan& pin() const { return pin_; }
  // The namespace hosts (nullptr on loopback): server i is host i, the client host is last.
  const NetHosts* net_hosts() const;

  pid_t pid(size_t i) const;
  // SIGKILL server i (and reap it). OK if it already exited.
  Status Kill(size_t i);
  // SIGSTOP / SIGCONT server i (a straggler that never answers, and its recovery). Stop
  // returns once every thread of the server has stopped (bounded: Timeout after 5 s).
  Status Stop(size_t i);
  Status Cont(size_t i);
  // SIGKILL server i and start a fresh memserver process (empty, new slabs) on the same port
  // with the same flags: a crashed server brought back by its supervisor. Returns once it
  // prints its `listening on` line (bounded by start_timeout_ms). Clients see a new server at
  // the old endpoint; a remote store has to be told (AddRemoteServer).
  Status Restart(size_t i);
  // True while server i's process has not exited.
  bool Running(size_t i);
  // Runs `tessera fault 127.0.0.1:PORT ARGS... --auth_token_file=TOKEN`, e.g.
  // Fault(2, {"bitflip", "5"}); the error carries the tool's output when it fails.
  Status Fault(size_t i, const std::vector<std::string>& args);
  // Cuts server i's host off the network (its veth on the bridge goes down: nothing reaches
  // it and it reaches nothing, the process keeps running), and joins it again. netns only:
  // Unsupported on loopback.
  Status Partition(size_t i);
  Status Heal(size_t i);
  // Starts a process on server i's host (its namespace and pin.servers), e.g. a peer system
  // measured beside the memservers, or on the client host (its own namespace and pin.client).
  // On loopback both run in the caller's namespace, pinned as above. The child gets SIGKILL
  // when the calling thread exits (Subprocess), so call it from a long-lived thread.
  Result<Subprocess> StartOnServerHost(size_t i, const std::vector<std::string>& argv,
                                       Subprocess::Options options) const;
  Result<Subprocess> StartOnClientHost(const std::vector<std::string>& argv,
                                       Subprocess::Options options) const;
  // Writes a per-client credential for `name` (fabric/credential.h; `tessera token issue`),
  // derived from this cluster's secret, next to the token file, and returns its path. Clients
  // that use it can act only as that client (admin: as an admin).
  Result<std::string> IssueCredentialFile(const std::string& name, bool admin = false) const;

 private:
  struct Impl;
  explicit LocalCluster(std::unique_ptr<Impl> impl);

  std::unique_ptr<Impl> impl_;
  std::vector<fabric::Endpoint> endpoints_;
  std::string secret_;
  std::string token_path_;
  std::string cluster_file_path_;
  HostsMode hosts_ = HostsMode::kLoopback;
  std::string hosts_note_;
  PinPlan pin_;
};

}  // namespace tessera::client
