// `tessera swap`: a kernel swap device on the resilient page store, on a stock kernel with no
// module of its own.
//
//   tessera swap on --size 8G [--cluster FILE | --etcd E --cluster_name N] [--k 4 --r 2]
//                   [--layout split|group] [--priority N] [--name NAME]
//   tessera swap off [--name NAME]
//   tessera swap status [--name NAME]
//
// `on` starts a daemon (`tessera swap serve`, this same program) that locks itself in memory
// (mlockall), leaves any limited memory cgroup, connects to the memservers (or starts an
// embedded cluster of k+2r on loopback) and serves the store as one FUSE file with direct I/O
// (kernel_shim/swap). `on` then attaches a loop device to that file, runs mkswap and swapon.
// `off` undoes it in reverse order: swapoff, loop detach, daemon stop (it unmounts), state
// removal; it also cleans up after a daemon that died. Each device keeps its state in
// /run/tessera-swap/NAME (mount point, loop device, daemon pid, daemon log, live stats).
#include <fcntl.h>
#include <gflags/gflags.h>
#include <linux/loop.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/swap.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "apps/cli/cli.h"
#include "apps/cli/membership_cli.h"
#include "apps/cli/store_flags.h"
#include "apps/cli/store_metrics.h"
#include "client/local_cluster.h"
#include "client/page_store.h"
#include "client/remote_store.h"
#include "common/clock.h"
#include "common/file.h"
#include "common/prometheus.h"
#include "common/subprocess.h"
#include "common/units.h"
#include "fabric/control_client.h"
#include "fabric/credential.h"
#include "kernel_shim/swap/loop_device.h"
#include "kernel_shim/swap/swap_file_server.h"
#include "memserver/http_metrics.h"

DEFINE_string(size, "", "on: size of the swap device, e.g. 8G (required)");
DEFINE_string(name, "tessera", "Name of the swap device (several may be on at once)");
DEFINE_int32(priority, -1, "swapon priority 0..32767 (-1: the kernel's default, below others)");
DEFINE_int32(threads, 4, "FUSE worker threads of the daemon");
DEFINE_bool(direct_io_loop, true,
            "Ask the loop device for direct I/O on the FUSE file (the file is served with "
            "FOPEN_DIRECT_IO either way, so no page cache is used)");
DEFINE_int32(start_timeout_s, 120, "on: bound on the daemon becoming ready");
DEFINE_string(state_dir, "/run/tessera-swap", "Where each device keeps its state");

namespace tessera {
namespace {

const cli::CliSpec kSpec = {
    "tessera swap",
    "on --size SIZE [--cluster FILE | --etcd E --cluster_name N] [--k 4 --r 2] "
    "[--layout split|group] [--priority N] [--name NAME] [--metrics_port P] | off [--name NAME] "
    "| status [--name NAME]",
    "A kernel swap device on the erasure-coded page store: a locked-in-memory daemon serves\n"
    "the store as one FUSE file with direct I/O, a loop device over it is mkswap'd and\n"
    "swapon'd. Every page of every process can then be swapped to remote memory and survives\n"
    "the loss of r memservers. `off` undoes everything (also after a crash of the daemon);\n"
    "`status` shows the device, used pages, the store's health and failures survived. Needs\n"
    "root, /dev/fuse and loop devices. With --metrics-port the daemon serves the store's\n"
    "client metrics (Prometheus) on 127.0.0.1.",
    __FILE__,
    1,
    1,
    cli::StoreFlagNames(cli::kCodeFlags | cli::kEmbeddedFlags | cli::kIoFlags |
                        cli::kMetricsFlags | cli::kClusterFlags)};

// Set by Main from the shared store flags (store_flags.h) before any command runs.
cli::StoreFlags g_store;
cli::ClusterFlags g_cluster;

std::string Dir() { return FLAGS_state_dir + "/" + FLAGS_name; }
std::string MountDir() { return Dir() + "/mnt"; }
std::string StatePath() { return Dir() + "/state"; }
std::string StatsPath() { return Dir() + "/stats"; }
std::string LogPath() { return Dir() + "/daemon.log"; }


std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Whether `pid` runs: exists and is not a zombie (a crashed daemon is reparented and may stay a
// zombie until its new parent reaps it).
bool Alive(pid_t pid) {
  if (pid <= 0 || (::kill(pid, 0) != 0 && errno != EPERM)) return false;
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  std::getline(in, stat);
  const size_t paren = stat.rfind(')');
  return paren == std::string::npos || paren + 2 >= stat.size() || stat[paren + 2] != 'Z';
}

bool IsMountPoint(const std::string& path) {
  std::ifstream in("/proc/self/mountinfo");
  for (std::string line; std::getline(in, line);) {
    std::istringstream f(line);
    std::string id, parent, dev, root, mnt;
    f >> id >> parent >> dev >> root >> mnt;
    if (mnt == path) return true;
  }
  return false;
}

// The /proc/swaps line of `device` (used KiB in *used_kib), false when it is not swap.
bool SwapUsed(const std::string& device, uint64_t* size_kib, uint64_t* used_kib) {
  std::ifstream in("/proc/swaps");
  std::string line;
  std::getline(in, line);  // Header.
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string name, type;
    uint64_t size = 0, used = 0;
    f >> name >> type >> size >> used;
    if (name == device) {
      if (size_kib) *size_kib = size;
      if (used_kib) *used_kib = used;
      return true;
    }
  }
  return false;
}

std::string Tail(const std::string& text, size_t lines) {
  size_t pos = text.size();
  for (size_t n = 0; n <= lines && pos > 0; ++n) {
    pos = text.rfind('\n', pos - 1);
    if (pos == std::string::npos) return text;
  }
  return text.substr(pos + 1);
}

int Fail(const std::string& what) {
  std::fprintf(stderr, "tessera swap: %s\n", what.c_str());
  return 1;
}

// ---------------------------------------------------------------------------------------------
// The daemon: `tessera swap serve` (started by `on`, never by hand).

std::atomic<kernel_shim::SwapFileServer*> g_server{nullptr};
void OnStopSignal(int) {
  if (auto* s = g_server.load()) s->Exit();
}

// Moves this process to the root memory cgroup (v1), outside any limit: the daemon must never
// need the memory it is reclaiming.
void LeaveMemoryCgroup() {
  const char* procs = "/sys/fs/cgroup/memory/cgroup.procs";
  if (::access(procs, W_OK) != 0) return;
  std::ofstream f(procs);
  f << ::getpid();
}

// With --cluster/--etcd: the lendable memory of the servers must hold the device's pages
// (k+r splits of k pages' data each); an embedded cluster must fit in this machine's RAM.
Status CheckCapacity(const std::vector<client::RemoteServer>& servers, const std::string& key,
                     uint64_t client_id, uint64_t size) {
  const double needed = static_cast<double>(size) * (g_store.k + g_store.r) / g_store.k;
  uint64_t lendable = 0;
  size_t answered = 0;
  for (const auto& s : servers) {
    fabric::ConnectOptions co;
    co.secret = key;
    co.client_id = client_id != 0
                       ? client_id
                       : (std::random_device{}() | (uint64_t{std::random_device{}()} << 32) | 1);
    co.deadline = Deadline::AfterMs(5000);
    auto conn = fabric::ControlClient::Connect(s.endpoint, co);
    if (!conn.ok()) continue;
    auto hb = (*conn)->Heartbeat(Deadline::AfterMs(5000));
    (*conn)->Close(Deadline::AfterMs(2000)).IgnoreError();
    if (!hb.ok()) continue;
    lendable += hb->free_bytes;
    ++answered;
  }
  if (answered < static_cast<size_t>(g_store.k + g_store.r)) {
    return Unavailable("only ", answered, " of ", servers.size(),
                       " memservers answered; RS(k,r) needs k+r = ", g_store.k + g_store.r);
  }
  if (needed > static_cast<double>(lendable)) {
    return InvalidArgument("--size ", FormatSize(size), " needs ",
                           FormatSize(static_cast<uint64_t>(needed)), " of remote memory at RS(",
                           g_store.k, ",", g_store.r, "), but the cluster's ", answered,
                           " memservers lend ", FormatSize(lendable), " in all");
  }
  return Status::Ok();
}

uint64_t MemTotal() {
  std::ifstream in("/proc/meminfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("MemTotal:", 0) == 0) return std::strtoull(line.c_str() + 9, nullptr, 10) << 10;
  }
  return 0;
}

// The swap file's own metrics, beside the page store's (apps/cli/store_metrics.h).
std::string SwapMetrics(const kernel_shim::SwapFileStats& f) {
  PrometheusWriter w;
  w.Header("tessera_swap_requests_total", "counter", "FUSE read and write requests served.");
  w.Sample("tessera_swap_requests_total", static_cast<double>(f.read_requests), "op=\"read\"");
  w.Sample("tessera_swap_requests_total", static_cast<double>(f.write_requests), "op=\"write\"");
  w.Header("tessera_swap_request_errors_total", "counter", "Requests answered with EIO.");
  w.Sample("tessera_swap_request_errors_total", static_cast<double>(f.read_errors),
           "op=\"read\"");
  w.Sample("tessera_swap_request_errors_total", static_cast<double>(f.write_errors),
           "op=\"write\"");
  w.Header("tessera_swap_pages_total", "counter", "Pages swapped in (read) and out (write).");
  w.Sample("tessera_swap_pages_total", static_cast<double>(f.pages_read), "op=\"read\"");
  w.Sample("tessera_swap_pages_total", static_cast<double>(f.pages_written), "op=\"write\"");
  w.Counter("tessera_swap_partial_page_ops_total", "Requests that covered part of a page.",
            f.partial_page_ops);
  w.Counter("tessera_swap_lost_pages_total",
            "Pages whose read failed with DataLoss (their processes get SIGBUS).", f.lost_pages);
  return w.str();
}

int Serve(uint64_t size) {
  LeaveMemoryCgroup();
  // Everything mapped now and later stays resident: a swap-in never waits on the daemon's own
  // pages being swapped in.
  if (::mlockall(MCL_CURRENT | MCL_FUTURE) != 0) {
    return Fail(std::string("mlockall: ") + std::strerror(errno) +
                " (the daemon must be locked in memory)");
  }
  std::unique_ptr<client::LocalCluster> cluster;
  client::ErasureCodedStoreOptions eo;
  auto source = cli::ResolveCluster(g_cluster.cluster, g_cluster.etcd, g_cluster.cluster_name);
  if (!source.ok() && source.status().code() != StatusCode::kNotFound) {
    return Fail(source.status().ToString());
  }
  std::string where;
  if (!source.ok()) {
    const double needed = static_cast<double>(size) * (g_store.k + g_store.r) / g_store.k;
    if (needed > static_cast<double>(MemTotal())) {
      return Fail("--size " + FormatSize(size) + " needs " +
                  FormatSize(static_cast<uint64_t>(needed)) +
                  " on the embedded cluster, which lives in this machine's RAM (" +
                  FormatSize(MemTotal()) + "); give --cluster or a smaller --size");
    }
    client::LocalClusterOptions lo;
    lo.bin_dir = SelfExeDir();
    lo.servers = g_store.EmbeddedServers();
    const uint64_t per_server_mb = size / static_cast<uint64_t>(g_store.k) / (1 << 20);
    lo.capacity = std::to_string(per_server_mb * 2 + 16) + "M";
    lo.slab_size = "1M";
    auto c = client::LocalCluster::Start(lo);
    if (!c.ok()) return Fail("starting the embedded cluster: " + c.status().ToString());
    cluster = std::move(*c);
    for (const auto& ep : cluster->endpoints()) eo.remote.servers.push_back({ep, ""});
    eo.remote.secret = cluster->secret();
    where = std::to_string(cluster->size()) + " embedded memservers (cluster file " +
            cluster->cluster_file_path() + ")";
  } else {
    auto cred = fabric::LoadCredential(g_cluster.auth_token_file, "tessera swap");
    if (!cred.ok()) return Fail(cred.status().ToString());
    eo.remote.servers = source->servers;
    eo.remote.secret = cred->key;
    eo.remote.client_id = cred->client_id;
    Status cap = CheckCapacity(source->servers, cred->key, cred->client_id, size);
    if (!cap.ok()) return Fail(cap.ToString());
    where = std::to_string(source->servers.size()) + " memservers of " +
            (g_cluster.cluster.empty() ? "etcd cluster " + g_cluster.cluster_name
                                       : g_cluster.cluster);
  }
  eo.remote.capacity_pages = size / client::kPageSize;
  g_store.ApplyTo(&eo);
  auto store_or = client::CreateErasureCodedStore(eo);
  if (!store_or.ok()) return Fail(store_or.status().ToString());
  std::unique_ptr<client::RemotePageStore> store = std::move(*store_or);
  std::unique_ptr<membership::StoreFollower> follower;
  if (source.ok() && source->from_etcd()) {
    auto f = membership::StoreFollower::Start(source->view.get(), store.get());
    if (!f.ok()) return Fail(f.status().ToString());
    follower = std::move(*f);
  }

  kernel_shim::SwapFileOptions so;
  so.mountpoint = MountDir();
  so.size_bytes = size;
  so.threads = FLAGS_threads;
  so.fsname = "tessera-swap-" + FLAGS_name;
  auto server_or = kernel_shim::SwapFileServer::Create(store.get(), so);
  if (!server_or.ok()) return Fail(server_or.status().ToString());
  kernel_shim::SwapFileServer& server = **server_or;
  // --metrics-port: the store's client metrics and the swap file's, the memory server's
  // endpoint code (stopped before what it reads). `on` passes the line on.
  std::unique_ptr<memserver::MetricsHttpServer> metrics;
  if (g_store.metrics_port >= 0) {
    kernel_shim::SwapFileServer* f = &server;
    auto m = cli::ServeClientMetrics("127.0.0.1", g_store.metrics_port, "swap", store.get(),
                                     [f] { return SwapMetrics(f->Stats()); });
    if (!m.ok()) return Fail("metrics: " + m.status().ToString());
    metrics = std::move(*m);
  }
  if (Status st = server.Mount(); !st.ok()) return Fail(st.ToString());
  g_server = &server;
  struct sigaction sa {};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaction(sig, &sa, nullptr);

  // Live stats for `tessera swap status`, twice a second, from a thread that takes no signals.
  std::atomic<bool> stop{false};
  auto write_stats = [&](bool final) {
    const client::PageStoreStats ps = store->Stats();
    const kernel_shim::SwapFileStats fs = server.Stats();
    std::string lost;
    for (client::PageId p : server.LostPages())
      lost += (lost.empty() ? "" : ",") + std::to_string(p);
    std::ostringstream o;
    // The embedded cluster's private directory (token, cluster file): `off` removes it when
    // the daemon died without doing so.
    const std::string cluster_dir =
        cluster ? cluster->cluster_file_path().substr(0, cluster->cluster_file_path().rfind('/'))
                : std::string("-");
    o << "pid " << ::getpid() << "\nembedded_cluster_dir " << cluster_dir << "\nstore "
      << store->name() << "\nservers " << where << "\nfinal " << (final ? 1 : 0)
      << "\nread_requests " << fs.read_requests << "\nwrite_requests " << fs.write_requests
      << "\npages_read " << fs.pages_read << "\npages_written " << fs.pages_written
      << "\npartial_page_ops " << fs.partial_page_ops << "\nread_errors " << fs.read_errors
      << "\nwrite_errors " << fs.write_errors << "\nlost_pages " << fs.lost_pages
      << "\nlost_page_ids " << (lost.empty() ? "-" : lost) << "\nstore_reads " << ps.reads
      << "\nstore_writes " << ps.writes << "\ndegraded_reads " << ps.degraded_reads << "\ndecodes "
      << ps.decodes << "\nserver_failures " << ps.server_failures << "\nregenerations_done "
      << ps.regenerations_done << "\nregenerations_pending " << ps.regenerations_pending
      << "\ndata_loss " << ps.data_loss << "\nread_p50_us " << ps.read_latency.p50() / 1e3
      << "\nread_p99_us " << ps.read_latency.p99() / 1e3 << "\nwrite_p50_us "
      << ps.write_latency.p50() / 1e3 << "\nremote_bytes " << ps.remote_bytes << "\n";
    (void)WriteFileAtomically(StatsPath(), o.str());
  };
  std::thread stats_thread([&] {
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, nullptr);
    while (!stop.load()) {
      write_stats(false);
      for (int i = 0; i < 10 && !stop.load(); ++i) ::usleep(50000);  // Stats period; not a sync.
    }
  });
  write_stats(false);
  std::printf("ready %s\n", server.file_path().c_str());
  std::fflush(stdout);
  std::fprintf(stderr, "tessera swap: serving %s (%s) from %s over %s\n",
               server.file_path().c_str(), FormatSize(size).c_str(), store->name().c_str(),
               where.c_str());
  Status st = server.Run();
  g_server = nullptr;
  stop = true;
  stats_thread.join();
  metrics.reset();
  Status fl = store->Flush();
  write_stats(true);
  std::fprintf(stderr, "tessera swap: stopped (%s); flush: %s\n", st.ToString().c_str(),
               fl.ToString().c_str());
  server_or->reset();
  follower.reset();
  store.reset();
  cluster.reset();
  return st.ok() ? 0 : 1;
}

// ---------------------------------------------------------------------------------------------
// on / off / status.

// Stops the daemon (SIGTERM; SIGKILL after 30 s), unmounts what it left, removes the state.
void StopDaemonAndClean(pid_t pid, std::vector<std::string>* notes) {
  if (Alive(pid)) {
    ::kill(pid, SIGTERM);
    const Deadline d = Deadline::AfterMs(30000);
    while (Alive(pid) && !d.Expired()) ::usleep(20000);  // Bounded wait for its exit.
    if (Alive(pid)) {
      ::kill(pid, SIGKILL);
      notes->push_back("the daemon did not stop within 30 s of SIGTERM: killed");
    }
  }
  if (IsMountPoint(MountDir())) {
    if (::umount2(MountDir().c_str(), MNT_DETACH) != 0) {
      notes->push_back("umount " + MountDir() + ": " + std::strerror(errno));
    }
  }
  for (const std::string& p : {StatePath(), StatsPath(), StatsPath() + ".tmp", LogPath()}) {
    ::unlink(p.c_str());
  }
  ::rmdir(MountDir().c_str());
  ::rmdir(Dir().c_str());
}

int On(const std::string& self) {
  if (FLAGS_size.empty()) cli::UsageError(kSpec, "on: --size is required");
  auto size = ParseSize(FLAGS_size);
  if (!size.ok() || *size < (16ull << 20) || *size % client::kPageSize != 0 ||
      *size > (1ull << 42)) {
    cli::UsageError(kSpec,
                    "on: --size must be a multiple of 4K in [16M, 4T], got '" + FLAGS_size + "'");
  }
  if (FLAGS_priority < -1 || FLAGS_priority > 32767)
    cli::UsageError(kSpec, "--priority must be in -1..32767");
  if (::geteuid() != 0) {
    return Fail("on needs root: it mounts FUSE, attaches a loop device and runs swapon");
  }
  if (::access("/dev/fuse", R_OK | W_OK) != 0)
    return Fail("/dev/fuse is missing: this kernel has no FUSE");
  if (::access("/dev/loop-control", R_OK | W_OK) != 0) {
    return Fail("/dev/loop-control is missing: this kernel has no loop devices");
  }
  const KeyValues old = ReadKeyValues(StatePath());
  const pid_t old_pid = old.count("pid") ? static_cast<pid_t>(std::atol(old.at("pid").c_str())) : 0;
  if (Alive(old_pid)) {
    return Fail("swap device '" + FLAGS_name + "' is already on (" +
                (old.count("device") ? old.at("device") : std::string("starting")) +
                "); `tessera swap off --name " + FLAGS_name + "` first, or pick another --name");
  }
  if (IsMountPoint(MountDir())) {
    return Fail("the FUSE mount point " + MountDir() +
                " is already in use (something is mounted "
                "there); unmount it, or pick another --name");
  }
  if (!old.empty()) {
    return Fail("swap device '" + FLAGS_name + "' did not shut down cleanly (its daemon is gone, " +
                Dir() + " remains); run `tessera swap off --name " + FLAGS_name + "` to clean up");
  }
  ::mkdir(FLAGS_state_dir.c_str(), 0700);
  if (::mkdir(Dir().c_str(), 0700) != 0 && errno != EEXIST) {
    return Fail("mkdir " + Dir() + ": " + std::strerror(errno));
  }
  if (::mkdir(MountDir().c_str(), 0700) != 0 && errno != EEXIST) {
    return Fail("mkdir " + MountDir() + ": " + std::strerror(errno));
  }

  // The daemon: this program in `serve` mode, its own session, stderr to the log.
  std::vector<std::string> argv = {self, "serve"};
  for (const char* flag : {"size", "name", "cluster", "auth_token_file", "etcd", "cluster_name",
                           "k", "r", "layout", "spares", "threads", "io_threads", "metrics_port",
                           "state_dir", "log_level"}) {
    gflags::CommandLineFlagInfo info;
    if (gflags::GetCommandLineFlagInfo(flag, &info) && !info.is_default) {
      argv.push_back("--" + std::string(flag) + "=" + info.current_value);
    }
  }
  std::vector<std::string> notes;
  int log_fd = ::open(LogPath().c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (log_fd < 0) return Fail("open " + LogPath() + ": " + std::strerror(errno));
  int out_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0) return Fail(std::string("pipe: ") + std::strerror(errno));
  std::vector<char*> cargv;
  for (auto& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) return Fail(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    ::setsid();
    ::dup2(out_pipe[1], 1);
    ::dup2(log_fd, 2);
    int devnull = ::open("/dev/null", O_RDONLY);
    if (devnull >= 0) ::dup2(devnull, 0);
    ::execv(self.c_str(), cargv.data());
    _exit(127);
  }
  ::close(out_pipe[1]);
  ::close(log_fd);
  auto rollback = [&](const std::string& why) {
    StopDaemonAndClean(pid, &notes);
    ::waitpid(pid, nullptr, 0);
    std::string msg = why;
    for (const auto& n : notes) msg += "\n  " + n;
    return Fail(msg);
  };
  // The daemon's `ready` line (after its `metrics on` line with --metrics-port), bounded.
  std::string line, metrics_line;
  {
    UniqueFd rd(out_pipe[0]);
    const Deadline d = Deadline::AfterMs(static_cast<uint64_t>(FLAGS_start_timeout_s) * 1000);
    char c;
    for (;;) {
      pollfd pfd{rd.get(), POLLIN, 0};
      const int remaining = std::min(d.RemainingMs(), 1000);
      if (d.Expired()) break;
      if (::poll(&pfd, 1, remaining) <= 0) continue;
      if (::read(rd.get(), &c, 1) != 1) break;
      if (c != '\n') {
        line += c;
        continue;
      }
      if (line.rfind("metrics on ", 0) != 0) break;
      metrics_line = std::move(line);
      line.clear();
    }
  }
  if (line.rfind("ready ", 0) != 0) {
    std::string log = Tail(ReadText(LogPath()), 8);
    int ws = 0;
    const bool exited = ::waitpid(pid, &ws, WNOHANG) == pid;
    return rollback(std::string("the swap daemon ") +
                    (exited ? "exited" : "did not become ready within --start_timeout_s") +
                    (log.empty() ? std::string() : ":\n" + log));
  }
  const std::string file = line.substr(6);
  auto loop = kernel_shim::AttachLoop(file, FLAGS_direct_io_loop);
  if (!loop.ok())
    return rollback("attaching a loop device to " + file + ": " + loop.status().ToString());
  const std::string* dev = &loop->path;
  const bool direct = loop->direct_io;
  {
    std::ostringstream st;
    st << "pid " << pid << "\ndevice " << *dev << "\nfile " << file << "\nsize " << *size << "\nk "
       << g_store.k << "\nr " << g_store.r << "\npriority " << FLAGS_priority << "\nloop_direct_io "
       << (direct ? 1 : 0) << "\n";
    if (Status w = WriteFileAtomically(StatePath(), st.str()); !w.ok()) {
      kernel_shim::DetachLoop(*dev).IgnoreError();
      return rollback(w.ToString());
    }
  }
  if (Status mk = kernel_shim::MakeSwap(*dev, "tessera-" + FLAGS_name); !mk.ok()) {
    kernel_shim::DetachLoop(*dev).IgnoreError();
    return rollback(mk.ToString());
  }
  int flags = 0;
  if (FLAGS_priority >= 0) flags = SWAP_FLAG_PREFER | (FLAGS_priority & SWAP_FLAG_PRIO_MASK);
  if (::swapon(dev->c_str(), flags) != 0) {
    const std::string err = std::strerror(errno);
    kernel_shim::DetachLoop(*dev).IgnoreError();
    return rollback("swapon " + *dev + ": " + err);
  }
  std::printf("tessera swap: %s on: %s (%s) over %s, loop direct I/O %s, priority %s\n",
              FLAGS_name.c_str(), dev->c_str(), FormatSize(*size).c_str(), file.c_str(),
              direct ? "on" : "off (the FUSE file is direct I/O)",
              FLAGS_priority < 0 ? "default" : std::to_string(FLAGS_priority).c_str());
  if (!metrics_line.empty()) std::printf("%s\n", metrics_line.c_str());
  const KeyValues stats = ReadKeyValues(StatsPath());
  if (stats.count("store")) {
    std::printf("  store %s on %s\n", stats.at("store").c_str(), stats.at("servers").c_str());
  }
  return 0;
}

int Off() {
  if (::geteuid() != 0) return Fail("off needs root (swapoff, loop detach, umount)");
  const KeyValues st = ReadKeyValues(StatePath());
  if (st.empty() && ::access(Dir().c_str(), F_OK) != 0) {
    return Fail("no swap device '" + FLAGS_name + "' is on");
  }
  const pid_t pid = st.count("pid") ? static_cast<pid_t>(std::atol(st.at("pid").c_str())) : 0;
  const bool daemon_alive = Alive(pid);
  std::vector<std::string> notes;
  if (!daemon_alive) {
    notes.push_back(
        "the daemon had exited before `off`: the store and its page map died with it, so pages "
        "that were swapped out are lost; swapoff marks them poisoned in their processes (each "
        "gets SIGBUS if it touches one)");
  }
  int rc = 0;
  if (st.count("device")) {
    const std::string dev = st.at("device");
    if (SwapUsed(dev, nullptr, nullptr)) {
      // Reads every swapped-out page back into memory (can take a while for a full device).
      if (::swapoff(dev.c_str()) != 0) {
        const int err = errno;
        notes.push_back("swapoff " + dev + ": " + std::strerror(err) +
                        (err == ENOMEM
                             ? " (swapoff brings every swapped-out page back into memory, and "
                               "the memory cgroups or the machine cannot hold them: raise those "
                               "cgroups' limits or stop their processes, then run off again)"
                             : ""));
        rc = 1;
      }
    }
    if (rc == 0) {
      if (Status d = kernel_shim::DetachLoop(dev); !d.ok()) {
        notes.push_back(d.ToString());
        rc = 1;
      }
    }
  }
  if (rc != 0) {
    for (const auto& n : notes) std::fprintf(stderr, "tessera swap: %s\n", n.c_str());
    return Fail(
        daemon_alive
            ? "off stopped before detaching: the daemon keeps serving the pages still in swap"
            : "off stopped before detaching: the device stays on until swapoff can finish");
  }
  const KeyValues last = ReadKeyValues(StatsPath());
  StopDaemonAndClean(pid, &notes);
  if (!daemon_alive && last.count("embedded_cluster_dir")) {
    // A crashed daemon left its embedded cluster's directory (its memservers died with it).
    const std::string dir = last.at("embedded_cluster_dir");
    if (dir.rfind("/tmp/tessera-cluster-", 0) == 0 && dir.find("..") == std::string::npos) {
      for (const char* f : {"/cluster", "/token"}) ::unlink((dir + f).c_str());
      if (::rmdir(dir.c_str()) != 0 && errno != ENOENT) {
        notes.push_back("rmdir " + dir + ": " + std::strerror(errno));
      }
    }
  }
  for (const auto& n : notes) std::fprintf(stderr, "tessera swap: %s\n", n.c_str());
  std::printf("tessera swap: %s off", FLAGS_name.c_str());
  if (last.count("pages_written")) {
    std::printf(" (%s pages written, %s read, %s memserver failures survived, %s pages lost)",
                last.at("pages_written").c_str(), last.at("pages_read").c_str(),
                last.at("server_failures").c_str(), last.at("lost_pages").c_str());
  }
  std::printf("\n");
  return 0;
}

int ShowStatus() {
  const KeyValues st = ReadKeyValues(StatePath());
  if (st.empty()) return Fail("no swap device '" + FLAGS_name + "' is on");
  const pid_t pid = static_cast<pid_t>(std::atol(st.count("pid") ? st.at("pid").c_str() : "0"));
  const KeyValues s = ReadKeyValues(StatsPath());
  uint64_t size_kib = 0, used_kib = 0;
  const bool on = st.count("device") && SwapUsed(st.at("device"), &size_kib, &used_kib);
  auto get = [&](const char* k) { return s.count(k) ? s.at(k) : std::string("-"); };
  std::printf("swap device %s: %s, %s\n", FLAGS_name.c_str(),
              st.count("device") ? st.at("device").c_str() : "-",
              on ? "swap on" : "NOT in /proc/swaps");
  std::printf("  size %s, used %llu pages (%s), priority %s, loop direct I/O %s\n",
              FormatSize(std::strtoull(st.at("size").c_str(), nullptr, 10)).c_str(),
              static_cast<unsigned long long>(used_kib / 4), FormatSize(used_kib << 10).c_str(),
              st.count("priority") ? st.at("priority").c_str() : "-",
              st.count("loop_direct_io") && st.at("loop_direct_io") == "1" ? "on" : "off");
  std::printf("  daemon pid %d: %s; file %s\n", static_cast<int>(pid),
              Alive(pid) ? "running" : "GONE (run `tessera swap off` to clean up)",
              st.count("file") ? st.at("file").c_str() : "-");
  std::printf("  store %s on %s\n", get("store").c_str(), get("servers").c_str());
  std::printf("  pages written %s, read %s (requests %s/%s, errors %s/%s)\n",
              get("pages_written").c_str(), get("pages_read").c_str(),
              get("write_requests").c_str(), get("read_requests").c_str(),
              get("write_errors").c_str(), get("read_errors").c_str());
  std::printf(
      "  health: memserver failures survived %s, degraded reads %s, regenerations %s done "
      "/ %s pending, remote memory %s\n",
      get("server_failures").c_str(), get("degraded_reads").c_str(),
      get("regenerations_done").c_str(), get("regenerations_pending").c_str(),
      s.count("remote_bytes")
          ? FormatSize(std::strtoull(s.at("remote_bytes").c_str(), nullptr, 10)).c_str()
          : "-");
  std::printf(
      "  data loss: %s pages lost%s%s\n", get("lost_pages").c_str(),
      get("lost_pages") != "0" && get("lost_pages") != "-" ? ", last pages: " : "",
      get("lost_pages") != "0" && get("lost_pages") != "-" ? get("lost_page_ids").c_str() : "");
  std::printf("  store latency: read p50 %s us, p99 %s us; write p50 %s us\n",
              get("read_p50_us").c_str(), get("read_p99_us").c_str(), get("write_p50_us").c_str());
  return Alive(pid) && on ? 0 : 1;
}

int Main(int argc, char** argv) {
  cli::InitCli(kSpec, &argc, &argv);
  const std::string cmd = argv[1];
  if (FLAGS_name.empty() || FLAGS_name.size() > 48 ||
      FLAGS_name.find_first_not_of(
          "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") !=
          std::string::npos) {
    cli::UsageError(kSpec, "--name must be 1..48 letters, digits, '-' or '_'");
  }
  g_store = cli::ReadStoreFlags(kSpec);
  g_cluster = cli::ReadClusterFlags(kSpec);
  if (FLAGS_threads < 1 || FLAGS_threads > 64) cli::UsageError(kSpec, "--threads must be in 1..64");
  if (cmd == "on") return On(SelfExeDir() + "/tessera-swap");
  if (cmd == "off") return Off();
  if (cmd == "status") return ShowStatus();
  if (cmd == "serve") {
    auto size = ParseSize(FLAGS_size);
    if (!size.ok() || *size == 0 || *size % client::kPageSize != 0) {
      cli::UsageError(kSpec, "serve: bad --size");
    }
    return Serve(*size);
  }
  cli::UsageError(kSpec, "unknown command '" + cmd + "' (on, off, status)");
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) { return tessera::Main(argc, argv); }
