// `tessera cluster up`: memservers on separate "hosts" of this machine (a network namespace
// each, on a bridge, pinned to their own cores) for people to run clients against; prints the
// cluster file and stays up until SIGINT or SIGTERM, then removes everything it made.
#include <gflags/gflags.h>
#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <string>

#include "apps/cli/cli.h"
#include "client/hosts.h"
#include "client/local_cluster.h"
#include "common/subprocess.h"

DEFINE_int32(hosts, 3, "Memservers, each on a host (network namespace) of its own (1..64)");
DEFINE_bool(loopback, false, "Run every memserver on 127.0.0.1 instead (no namespaces)");
DEFINE_string(pin, "auto",
              "CPUs: 'auto' (client host on the first allowed CPU, memservers on the rest, when "
              "there are 2 or more), 'none', or e.g. client:0,servers:1");
DEFINE_string(capacity, "256M", "Memory each memserver lends");
DEFINE_string(slab_size, "1M", "Slab size of each memserver");
DEFINE_bool(fault_injection, false, "Let `tessera fault` inject faults into the memservers");

namespace {

const tessera::cli::CliSpec kSpec = {
    "tessera cluster up",
    "[--hosts N] [--pin client:0,servers:1] [--loopback] [--capacity SIZE]",
    "Starts N memservers, each in a network namespace of its own with an address in\n"
    "198.18.0.0/15 on a veth pair to a bridge, pinned to the server CPUs, plus an empty\n"
    "namespace for clients on the client CPUs. Prints the cluster file, the token file and the\n"
    "namespaces, then stays up until SIGINT or SIGTERM and removes every process, namespace,\n"
    "link and temporary file it made. Where namespaces cannot be made (not root, no veth) it\n"
    "says why and runs the memservers on loopback.",
    __FILE__, 0, 0};

}  // namespace

int main(int argc, char** argv) {
  tessera::cli::InitCli(kSpec, &argc, &argv);
  if (FLAGS_hosts < 1 || FLAGS_hosts > 64) tessera::cli::UsageError(kSpec, "--hosts must be 1..64");
  auto pin = tessera::client::ParsePin(FLAGS_pin);
  if (!pin.ok()) tessera::cli::UsageError(kSpec, pin.status().message());

  // Every thread made from here on inherits the blocked signals; sigwait below takes them.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  tessera::client::LocalClusterOptions o;
  o.bin_dir = tessera::SelfExeDir();
  o.servers = static_cast<size_t>(FLAGS_hosts);
  o.capacity = FLAGS_capacity;
  o.slab_size = FLAGS_slab_size;
  o.fault_injection = FLAGS_fault_injection;
  o.hosts = FLAGS_loopback ? tessera::client::HostsMode::kLoopback
                           : tessera::client::HostsMode::kNetns;
  o.pin = *pin;
  auto cluster = tessera::client::LocalCluster::Start(o);
  if (!cluster.ok()) {
    std::fprintf(stderr, "tessera cluster up: %s\n", cluster.status().ToString().c_str());
    return 1;
  }
  const auto& c = **cluster;
  if (!c.hosts_note().empty()) {
    std::fprintf(stderr, "tessera cluster up: warning: %s; the memservers run on loopback\n",
                 c.hosts_note().c_str());
  }
  std::printf("hosts: %s\npin: %s\n", tessera::client::HostsModeName(c.hosts()),
              tessera::client::FormatPin(c.pin()).c_str());
  const tessera::client::NetHosts* net = c.net_hosts();
  for (size_t i = 0; i < c.size(); ++i) {
    std::printf("server %zu: %s", i, c.endpoints()[i].ToString().c_str());
    if (net) std::printf(" (netns %s)", net->host(i).netns.c_str());
    std::printf("\n");
  }
  if (net) {
    const auto& client = net->host(net->size() - 1);
    std::printf("client host: netns %s, address %s (ip netns exec %s COMMAND)\n",
                client.netns.c_str(), client.address.c_str(), client.netns.c_str());
  }
  std::printf("token file: %s\ncluster file: %s\n", c.token_path().c_str(),
              c.cluster_file_path().c_str());
  std::printf("up; SIGINT or SIGTERM stops it\n");
  std::fflush(stdout);

  int sig = 0;
  while (sigwait(&stop, &sig) != 0) {
  }
  cluster->reset();
  std::printf("stopped (%s): every memserver, namespace and link removed\n",
              sig == SIGINT ? "SIGINT" : "SIGTERM");
  return 0;
}
