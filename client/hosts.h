// Hosts on one machine: network namespaces joined by veth pairs to a bridge, and pinned CPUs.
//
// A "host" is a network namespace with its own address on a veth pair whose other end is a
// port of a bridge in the caller's namespace. The bridge carries the gateway address, so a
// process in the caller's namespace (a test, a bench's client) reaches every host through the
// bridge, and hosts reach each other. Addresses come from the benchmarking range
// 198.18.0.0/15 (RFC 2544) only: each NetHosts claims one /24 of it (512 of them), the bridge
// is .1 and host i is .(i+2).
//
// Names. A NetHosts that claimed subnet K owns the namespaces `tessera-K-I` (/run/netns), the
// bridge `tsbK` and the host-side veth ends `tsvKhI` (the namespace end is `eth0`). The claim is
// the file /run/tessera-hosts/net-K, holding the owner's pid and its start time.
//
// Teardown. The destructor deletes the links, the namespaces and the claim. A harness that
// dies without it (SIGKILL, a crash) leaves them behind; every Create() first sweeps, under a
// lock, the claims whose owner process is gone and everything named after them, and
// SweepLeftovers() does only that. Pinning uses sched_setaffinity (no cgroup is made), so
// there is nothing else to remove.
//
// Threads: a NetHosts may be used from any thread; SetLinkUp() on one host is not ordered with
// a concurrent call for the same host. Nothing here is a fast path.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace tessera::client {

// Where a LocalCluster's processes run: all on 127.0.0.1 in the caller's namespace, or each
// memserver in a network namespace of its own (NetHosts).
enum class HostsMode { kLoopback, kNetns };
const char* HostsModeName(HostsMode mode);  // "loopback", "netns"
Result<HostsMode> ParseHostsMode(std::string_view text);

// Which CPUs the client and the memservers run on; an empty list is not pinned.
struct PinPlan {
  std::vector<int> client;
  std::vector<int> servers;
  bool empty() const { return client.empty() && servers.empty(); }
};

// The CPUs this process may run on (its affinity mask), ascending.
std::vector<int> AllowedCpus();

// Parses a --pin value: "none" or "" (nothing pinned); "auto" (AutoPin); or comma-separated
// `ROLE:CPUS` entries with ROLE `client` or `servers` and CPUS CPU numbers and ranges `A-B`
// joined by '+', e.g. "client:0,servers:1" or "client:0+2,servers:1-3". Every CPU must be in `allowed`
// (AllowedCpus() by default); a role named twice, an unknown role or a malformed list is an
// InvalidArgument naming the problem.
Result<PinPlan> ParsePin(std::string_view text);
Result<PinPlan> ParsePin(std::string_view text, const std::vector<int>& allowed);
// "client:0,servers:1" (ranges where contiguous, as ParsePin reads them), or "none".
std::string FormatPin(const PinPlan& plan);
// The client on the first allowed CPU and the memservers on the rest; nothing pinned when
// fewer than 2 CPUs are allowed.
PinPlan AutoPin(const std::vector<int>& allowed);
// Pins the calling thread (and the threads it creates afterwards) to `cpus`; empty: no-op.
Status PinCallingThread(const std::vector<int>& cpus);

struct NetHost {
  std::string netns;       // Namespace name, e.g. tessera-3-0.
  std::string netns_path;  // /run/netns/<netns>, for setns (Subprocess::Options::netns_path).
  std::string address;     // Its address, e.g. 198.18.3.2.
  std::string link;        // The veth end on the bridge, in the caller's namespace.
};

class NetHosts {
 public:
  // Sweeps leftovers, claims a free /24 and makes `count` hosts (1..200). Fails with a message
  // that says why when namespaces cannot be made here (not root, no `ip` tool, no veth or
  // bridge support), after removing whatever it had made.
  static Result<std::unique_ptr<NetHosts>> Create(size_t count);
  // Removes the namespaces, links and claims of owners that are gone; returns the number of
  // claims removed.
  static Result<size_t> SweepLeftovers();

  ~NetHosts();
  NetHosts(const NetHosts&) = delete;
  NetHosts& operator=(const NetHosts&) = delete;

  size_t size() const { return hosts_.size(); }
  const NetHost& host(size_t i) const { return hosts_.at(i); }
  int subnet_index() const { return subnet_; }
  const std::string& bridge() const { return bridge_; }
  const std::string& gateway() const { return gateway_; }  // The bridge's address.

  // Sets host i's veth end on the bridge down (the host is cut off from every other host and
  // from the caller: a partition) or up again.
  Status SetLinkUp(size_t i, bool up);

 private:
  NetHosts() = default;
  void Destroy();

  int subnet_ = -1;
  std::string bridge_;
  std::string gateway_;
  std::vector<NetHost> hosts_;
};

}  // namespace tessera::client
