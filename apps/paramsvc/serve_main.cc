// `tessera paramsvc serve`: the Parameter Service on a memserver host.
//
// Two processes (apps/paramsvc/server/checkpoint.h says why): this supervisor binds the port, owns the
// erasure-coded checkpoint store on the memservers (--store), and runs the aggregation server
// as a child (the same program with --role=aggregator), restarting it from the latest
// checkpoint when it dies. The aggregation server is a companion process rather than part of
// the memserver so that model aggregation's faults (a crash, an OOM kill) and CPU stay apart
// from page traffic: its core threads run SCHED_BATCH at --nice, so the memserver's page
// traffic keeps priority on the cores it lends (--cores).
#include <gflags/gflags.h>
#include <malloc.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <optional>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>

#include "apps/cli/cli.h"
#include "apps/paramsvc/server/checkpoint.h"
#include "apps/paramsvc/server/server.h"
#include "apps/cli/membership_cli.h"
#include "apps/cli/store_flags.h"
#include "apps/cli/store_metrics.h"
#include "client/remote_store.h"
#include "common/logging.h"
#include "common/subprocess.h"
#include "fabric/auth.h"
#include "memserver/http_metrics.h"

DEFINE_string(listen, "127.0.0.1", "IPv4 or IPv6 address to listen on (e.g. ::1, or :: for all)");
DEFINE_int32(port, 7800, "TCP port; 0 picks an ephemeral port (printed on stdout)");
DEFINE_int32(cores, 1, "Cores the memserver lends to aggregation (1..256)");
DEFINE_bool(elastic, true, "Pack partitions onto the fewest cores (false: a static server "
                           "keeping all --cores active)");
DEFINE_double(target_util, 0.6, "Target utilisation of a core when packing (0..1]");
DEFINE_int32(rebalance_ms, 200, "Packing interval in ms (10..60000)");
DEFINE_int32(nice, 10, "Nice of the aggregation core threads (0..19; > 0 also SCHED_BATCH)");
DEFINE_string(auth_token_file, "", "Cluster secret file (same as the memservers'); empty: the "
                                   "development secret, loopback only");
DEFINE_string(store, "", "Memservers for checkpoints (host:port,... or a cluster file); empty: "
                         "no checkpoints (a restarted aggregation server starts empty)");
DEFINE_string(etcd, "",
              "etcd endpoints (HOST:PORT,...): checkpoint to the memservers registered in "
              "--cluster_name, following joins and leaves (instead of --store)");
DEFINE_string(cluster_name, "", "Cluster registered in etcd (with --etcd)");
DEFINE_int32(store_mb, 1024, "Checkpoint store capacity in MiB");
DEFINE_bool(restart, true, "Restart the aggregation server when it dies");
DEFINE_string(advertise, "",
              "HOST:PORT other servers and clients reach this service at (moves between "
              "servers; `tessera paramsvc move`); empty: --listen and the port, unless "
              "--listen is 0.0.0.0");
DEFINE_string(move_hold_file, "",
              "Testing (fault injection): print each phase of a move between servers on "
              "stdout, and hold it while this file's first line names that phase");
DEFINE_string(role, "supervisor", "Internal: supervisor or aggregator");
DEFINE_int32(listen_fd, -1, "Internal (aggregator): inherited listening socket");
DEFINE_int32(link_fd, -1, "Internal (aggregator): checkpoint link to the supervisor");

namespace {

using namespace tessera;
using namespace tessera::paramsvc;

const cli::CliSpec kSpec = {
    "tessera paramsvc serve",
    "[--port 7800] [--cores N] [--store MEMSERVERS | --etcd ENDPOINTS --cluster_name NAME] "
    "[--auth_token_file F]",
    "Runs the Parameter Service: model aggregation for many training jobs (push/pull, sync,\n"
    "async and bounded-staleness modes), packed onto the fewest of --cores, checkpointed every\n"
    "iteration into the erasure-coded page store on --store. Prints `listening on HOST:PORT`\n"
    "and `aggregator pid N` (again after each restart). SIGTERM or SIGINT stops it. The\n"
    "checkpoint store takes the store flags of every subcommand (--k, --r, --layout,\n"
    "--io-threads); --metrics-port serves its client metrics on the --listen address.\n"
    "Jobs move between services with `tessera paramsvc move`, `drain` and `rebalance`;\n"
    "give --advertise when --listen is 0.0.0.0.",
    __FILE__,
    0,
    0,
    cli::StoreFlagNames(cli::kCodeFlags | cli::kIoFlags | cli::kMetricsFlags),
    {{"ec_k", "k"}, {"ec_r", "r"}}};

std::atomic<pid_t> g_child{0};
std::atomic<bool> g_stop{false};

void OnSignal(int) {
  g_stop = true;
  const pid_t c = g_child.load();
  if (c > 0) ::kill(c, SIGTERM);
}

int RunAggregator(const std::string& secret) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  // Pushes and pull snapshots are MB-sized buffers allocated and freed every iteration: keep
  // them in the heap instead of mmap/munmap (and page-faulting) each one.
  ::mallopt(M_MMAP_THRESHOLD, 256 << 20);
  ::mallopt(M_TRIM_THRESHOLD, 1 << 30);
  if (::getppid() == 1) return 1;
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  CheckpointLink link{UniqueFd(FLAGS_link_fd)};
  ServerOptions o;
  o.secret = secret;
  o.max_cores = FLAGS_cores;
  o.elastic = FLAGS_elastic;
  o.target_utilisation = FLAGS_target_util;
  o.rebalance_ms = static_cast<uint32_t>(FLAGS_rebalance_ms);
  o.nice = FLAGS_nice;
  o.checkpoint = FLAGS_store.empty() ? nullptr : &link;  // The supervisor keeps them in --store.
  o.accept_on_start = false;
  o.advertise = FLAGS_advertise;
  o.move_hold_file = FLAGS_move_hold_file;
  auto server = Server::Start(o, UniqueFd(FLAGS_listen_fd));
  if (!server.ok()) {
    std::fprintf(stderr, "tessera paramsvc serve: %s\n", server.status().ToString().c_str());
    return 1;
  }
  auto restored = link.Restore(server->get());
  if (!restored.ok()) {
    std::fprintf(stderr, "tessera paramsvc serve: restore failed: %s\n",
                 restored.status().ToString().c_str());
    return 1;
  }
  (*server)->StartAccepting();
  std::printf("aggregator ready: pid %d, %d jobs restored\n", static_cast<int>(::getpid()), *restored);
  std::fflush(stdout);
  int sig = 0;
  sigwait(&set, &sig);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> original(argv, argv + argc);
  cli::InitCli(kSpec, &argc, &argv);
  const cli::StoreFlags sf = cli::ReadStoreFlags(kSpec);
  if (FLAGS_cores < 1 || FLAGS_cores > 256) cli::UsageError(kSpec, "--cores must be in 1..256");
  if (!(FLAGS_target_util > 0 && FLAGS_target_util <= 1)) {
    cli::UsageError(kSpec, "--target_util must be in (0, 1]");
  }
  if (FLAGS_rebalance_ms < 10 || FLAGS_rebalance_ms > 60000) {
    cli::UsageError(kSpec, "--rebalance_ms must be in 10..60000");
  }
  if (FLAGS_nice < 0 || FLAGS_nice > 19) cli::UsageError(kSpec, "--nice must be in 0..19");
  if (FLAGS_port < 0 || FLAGS_port > 65535) cli::UsageError(kSpec, "--port must be in 0..65535");
  if (FLAGS_store_mb < 1) cli::UsageError(kSpec, "--store_mb must be positive");
  if (!FLAGS_advertise.empty()) {
    if (Status e = CheckEndpointText(FLAGS_advertise, "--advertise"); !e.ok()) {
      cli::UsageError(kSpec, e.message());
    }
  }
  auto secret = fabric::LoadAuthSecret(FLAGS_auth_token_file, "tessera paramsvc serve");
  if (!secret.ok()) {
    std::fprintf(stderr, "tessera paramsvc serve: %s\n", secret.status().ToString().c_str());
    return 1;
  }
  if (FLAGS_role == "aggregator") {
    if (FLAGS_listen_fd < 0 || FLAGS_link_fd < 0) {
      cli::UsageError(kSpec, "--role=aggregator is internal (needs --listen_fd and --link_fd)");
    }
    return RunAggregator(*secret);
  }
  if (FLAGS_role != "supervisor") cli::UsageError(kSpec, "--role must be supervisor or aggregator");

  // The same no-open-default rule as the memservers (fabric/auth.h).
  if (Status st = fabric::CheckSecretForListen(*secret, FLAGS_listen); !st.ok()) {
    std::fprintf(stderr, "tessera paramsvc serve: %s\n", st.ToString().c_str());
    return 1;
  }
  auto lfd = Server::Listen(FLAGS_listen, static_cast<uint16_t>(FLAGS_port));
  if (!lfd.ok()) {
    std::fprintf(stderr, "tessera paramsvc serve: %s\n", lfd.status().ToString().c_str());
    return 1;
  }
  std::unique_ptr<client::RemotePageStore> store;
  if (!FLAGS_store.empty() && !FLAGS_etcd.empty()) {
    cli::UsageError(kSpec, "give --store MEMSERVERS or --etcd ENDPOINTS --cluster_name NAME, not both");
  }
  std::optional<cli::ClusterSource> etcd_source;
  if (!FLAGS_etcd.empty() || !FLAGS_cluster_name.empty()) {
    auto src = cli::ResolveCluster("", FLAGS_etcd, FLAGS_cluster_name);
    if (!src.ok() && src.status().code() == StatusCode::kInvalidArgument) {
      cli::UsageError(kSpec, src.status().message());
    }
    if (!src.ok()) {
      std::fprintf(stderr, "tessera paramsvc serve: --etcd: %s\n", src.status().ToString().c_str());
      return 1;
    }
    etcd_source = std::move(*src);
  }
  if (!FLAGS_store.empty() || etcd_source) {
    auto servers = etcd_source ? Result<std::vector<client::RemoteServer>>(etcd_source->servers)
                   : FLAGS_store.find(':') != std::string::npos && FLAGS_store.find('/') == std::string::npos
                       ? client::ParseServerList(FLAGS_store)
                       : client::LoadServers(FLAGS_store);
    if (!servers.ok()) {
      std::fprintf(stderr, "tessera paramsvc serve: --store: %s\n", servers.status().ToString().c_str());
      return 1;
    }
    client::ErasureCodedStoreOptions eo;
    eo.remote.servers = *servers;
    eo.remote.secret = *secret;
    eo.remote.capacity_pages = static_cast<uint64_t>(FLAGS_store_mb) * 256;
    sf.ApplyTo(&eo);
    auto s = client::CreateErasureCodedStore(eo);
    if (!s.ok()) {
      std::fprintf(stderr, "tessera paramsvc serve: checkpoint store: %s\n",
                   s.status().ToString().c_str());
      return 1;
    }
    store = std::move(*s);
  } else {
    TLOG(WARNING) << "tessera paramsvc serve: no --store: no checkpoints; a restarted "
                     "aggregation server starts without the jobs";
  }
  const bool have_store = store != nullptr;
  client::RemotePageStore* const store_ptr = store.get();
  CheckpointKeeper keeper(std::move(store));
  // --etcd: the checkpoint store follows the registered servers (destroyed before the store).
  std::unique_ptr<membership::StoreFollower> follower;
  if (etcd_source && store_ptr != nullptr) {
    auto f = membership::StoreFollower::Start(etcd_source->view.get(), store_ptr);
    if (!f.ok()) {
      std::fprintf(stderr, "tessera paramsvc serve: %s\n", f.status().ToString().c_str());
      return 1;
    }
    follower = std::move(*f);
  }
  sockaddr_storage a{};
  socklen_t alen = sizeof(a);
  ::getsockname(lfd->get(), reinterpret_cast<sockaddr*>(&a), &alen);
  const bool v6 = a.ss_family == AF_INET6;
  const unsigned port = ntohs(v6 ? reinterpret_cast<const sockaddr_in6*>(&a)->sin6_port
                                 : reinterpret_cast<const sockaddr_in*>(&a)->sin_port);
  const bool bracket = v6 && FLAGS_listen.front() != '[';
  std::printf("listening on %s%s%s:%u\n", bracket ? "[" : "", FLAGS_listen.c_str(),
              bracket ? "]" : "", port);
  std::printf("checkpoints %s\n", have_store ? "on" : "off");
  // The supervisor's metrics: its build and its checkpoint store (destroyed before it).
  std::unique_ptr<memserver::MetricsHttpServer> metrics;
  if (sf.metrics_port >= 0) {
    auto m = cli::ServeClientMetrics(FLAGS_listen, sf.metrics_port, "paramsvc", store_ptr);
    if (!m.ok()) {
      std::fprintf(stderr, "tessera paramsvc serve: metrics: %s\n", m.status().ToString().c_str());
      return 1;
    }
    metrics = std::move(*m);
  }
  std::fflush(stdout);

  struct sigaction sa{};
  sa.sa_handler = OnSignal;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  const std::string self = SelfExeDir() + "/tessera-paramsvc-serve";
  int restarts = 0;
  while (!g_stop.load()) {
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
      std::perror("socketpair");
      return 1;
    }
    std::vector<std::string> args;
    args.push_back(self);
    for (size_t i = 1; i < original.size(); ++i) {
      if (original[i].starts_with("--role") || original[i].starts_with("--listen_fd") ||
          original[i].starts_with("--link_fd")) {
        continue;
      }
      args.push_back(original[i]);
    }
    args.push_back("--role=aggregator");
    args.push_back("--listen_fd=3");
    args.push_back("--link_fd=4");
    std::vector<char*> cargv;
    for (auto& s : args) cargv.push_back(s.data());
    cargv.push_back(nullptr);
    const pid_t pid = ::fork();
    if (pid < 0) {
      std::perror("fork");
      return 1;
    }
    if (pid == 0) {
      // Child: listening socket on fd 3, link on fd 4 (dup2 clears close-on-exec).
      const int l = ::dup(lfd->get());
      const int k = ::dup(sv[1]);
      ::dup2(l, 3);
      ::dup2(k, 4);
      ::execv(self.c_str(), cargv.data());
      std::perror("exec tessera-paramsvc-serve");
      ::_exit(127);
    }
    ::close(sv[1]);
    g_child = pid;
    std::printf("aggregator pid %d\n", static_cast<int>(pid));
    std::fflush(stdout);
    keeper.Serve(sv[0]);  // Until the aggregation server hangs up (exit or death).
    ::close(sv[0]);
    int st = 0;
    while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    g_child = 0;
    if (g_stop.load()) break;
    ++restarts;
    const KeeperStats ks = keeper.stats();
    TLOG(WARNING) << "paramsvc supervisor: the aggregation server (pid " << pid << ") "
                  << (WIFSIGNALED(st) ? "was killed by signal " : "exited with status ")
                  << (WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st)) << "; checkpoints written "
                  << ks.saves_written << "; restart " << restarts;
    if (!FLAGS_restart) return 1;
    keeper.Drain();  // The latest received states are durable before the replacement reads them.
  }
  keeper.Drain();
  return 0;
}
