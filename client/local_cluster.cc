#include "client/local_cluster.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <mutex>
#include <sstream>
#include <thread>

#include "common/fd.h"
#include "common/logging.h"
#include "common/subprocess.h"
#include "fabric/auth.h"
#include "fabric/credential.h"

namespace tessera::client {

// Runs every fork/kill/wait on one long-lived thread (the children's PR_SET_PDEATHSIG parent).
struct LocalCluster::Impl {
  std::vector<Subprocess> procs;  // Touched only on `worker`.
  std::string dir;
  std::string tessera;  // Path of the `tessera` executable.
  std::vector<std::string> argv;  // A server's command line (with --port=0).
  Subprocess::Options start_options;
  int start_timeout_ms = 10000;
  std::unique_ptr<NetHosts> net;  // kNetns: server i on host i, the client host last.

  // Server i's command line (--port=0 for a new port) and how it is started.
  std::vector<std::string> ServerArgv(size_t i) const {
    std::vector<std::string> a = argv;
    if (net) a.push_back("--listen=" + net->host(i).address);
    return a;
  }
  Subprocess::Options ServerStartOptions(size_t i) const {
    Subprocess::Options o = start_options;
    if (net) o.netns_path = net->host(i).netns_path;
    return o;
  }

  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::function<void()>> tasks;
  bool quit = false;
  std::thread worker;

  Impl() {
    worker = std::thread([this] {
      for (;;) {
        std::function<void()> task;
        {
          std::unique_lock<std::mutex> lock(mu);
          cv.wait(lock, [this] { return quit || !tasks.empty(); });
          if (tasks.empty()) return;
          task = std::move(tasks.front());
          tasks.pop_front();
        }
        task();
      }
    });
  }

  ~Impl() {
    Run([this] {
      for (auto& p : procs) {
        if (p.running()) {
          (void)p.Signal(SIGCONT);
          (void)p.Signal(SIGKILL);
          (void)p.Wait(Deadline::AfterMs(5000));
        }
      }
      procs.clear();
    });
    net.reset();  // After its processes are gone.
    {
      std::lock_guard<std::mutex> lock(mu);
      quit = true;
    }
    cv.notify_all();
    worker.join();
    if (!dir.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  }

  // Runs `fn` on the worker thread and waits for it.
  template <typename Fn>
  auto Run(Fn fn) -> decltype(fn()) {
    std::packaged_task<decltype(fn())()> task(std::move(fn));
    auto result = task.get_future();
    {
      std::lock_guard<std::mutex> lock(mu);
      tasks.emplace_back([&task] { task(); });
    }
    cv.notify_all();
    return result.get();
  }
};

LocalCluster::LocalCluster(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
LocalCluster::~LocalCluster() = default;

Result<std::unique_ptr<LocalCluster>> LocalCluster::Start(const LocalClusterOptions& options) {
  if (options.bin_dir.empty()) return InvalidArgument("LocalCluster: bin_dir is required");
  if (options.servers < 1 || options.servers > 64) {
    return InvalidArgument("LocalCluster: servers must be 1..64, got " +
                           std::to_string(options.servers));
  }
  const std::string tessera = options.bin_dir + "/tessera";
  if (access(tessera.c_str(), X_OK) != 0) {
    return NotFound("LocalCluster: no executable " + tessera);
  }
  auto impl = std::make_unique<Impl>();
  char tmpl[] = "/tmp/tessera-cluster-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return IoError("LocalCluster: mkdtemp failed");
  impl->dir = tmpl;
  impl->tessera = tessera;

  uint8_t raw[24];
  TESSERA_RETURN_IF_ERROR(fabric::RandomBytes(raw));
  std::string secret;
  static const char kHex[] = "0123456789abcdef";
  for (uint8_t b : raw) {
    secret.push_back(kHex[b >> 4]);
    secret.push_back(kHex[b & 15]);
  }
  const std::string token = impl->dir + "/token";
  {
    std::ofstream out(token);
    out << secret << "\n";
    if (!out) return IoError("LocalCluster: cannot write " + token);
  }

  std::vector<std::string> argv = {tessera,           "memserver",
                                   "--port=0",        "--capacity=" + options.capacity,
                                   "--slab_size=" + options.slab_size, "--headroom=0",
                                   "--auth_token_file=" + token,
                                   "--reuse_port"};  // Restart() binds the port first.
  if (options.quiet) argv.push_back("--log_level=warning");
  if (options.fault_injection) argv.push_back("--fault_injection");
  argv.insert(argv.end(), options.extra_flags.begin(), options.extra_flags.end());

  Impl* im = impl.get();
  im->argv = argv;
  im->start_options.capture_stdout = true;
  im->start_options.quiet_stderr = options.quiet;
  im->start_options.own_process_group = options.own_process_group;
  im->start_options.cpus = options.pin.servers;
  im->start_timeout_ms = options.start_timeout_ms;
  std::string hosts_note;
  if (options.hosts == HostsMode::kNetns) {
    auto net = NetHosts::Create(options.servers + 1);
    if (net.ok()) {
      im->net = std::move(*net);
    } else {
      hosts_note = net.status().message();
      TLOG(WARNING) << "LocalCluster: " << hosts_note << "; running every server on loopback";
    }
  }
  auto ports = im->Run([&]() -> Result<std::vector<uint16_t>> {
    std::vector<uint16_t> out;
    for (size_t i = 0; i < options.servers; ++i) {
      TESSERA_ASSIGN_OR_RETURN(Subprocess p,
                               Subprocess::Start(im->ServerArgv(i), im->ServerStartOptions(i)));
      im->procs.push_back(std::move(p));
      auto line = im->procs.back().WaitForLine(
          "listening on ", Deadline::AfterMs(static_cast<uint64_t>(options.start_timeout_ms)));
      if (!line.ok()) {
        return Unavailable("LocalCluster: memserver " + std::to_string(i) +
                           " did not print 'listening on' within " +
                           std::to_string(options.start_timeout_ms) + " ms: " +
                           line.status().ToString());
      }
      auto colon = line->rfind(':');
      int port = colon == std::string::npos ? 0 : std::atoi(line->c_str() + colon + 1);
      if (port <= 0 || port > 65535) {
        return Internal("LocalCluster: cannot parse port from '" + *line + "'");
      }
      out.push_back(static_cast<uint16_t>(port));
    }
    return out;
  });
  if (!ports.ok()) return ports.status();

  auto cluster = std::unique_ptr<LocalCluster>(new LocalCluster(std::move(impl)));
  cluster->secret_ = secret;
  cluster->token_path_ = token;
  cluster->cluster_file_path_ = cluster->impl_->dir + "/cluster";
  cluster->hosts_ = im->net ? HostsMode::kNetns : HostsMode::kLoopback;
  cluster->hosts_note_ = hosts_note;
  cluster->pin_ = options.pin;
  std::ofstream cf(cluster->cluster_file_path_);
  cf << "# tessera LocalCluster (hosts: " << HostsModeName(cluster->hosts_) << ")\n";
  for (size_t i = 0; i < ports->size(); ++i) {
    const std::string host = im->net ? im->net->host(i).address : "127.0.0.1";
    cluster->endpoints_.push_back(fabric::Endpoint{host, (*ports)[i]});
    cf << host << ":" << (*ports)[i] << "\n";
  }
  cf.close();
  if (!cf) return IoError("LocalCluster: cannot write " + cluster->cluster_file_path_);
  return cluster;
}

pid_t LocalCluster::pid(size_t i) const {
  if (i >= size()) return -1;
  return impl_->Run([this, i] { return impl_->procs[i].pid(); });
}

static Status CheckIndex(size_t i, size_t n) {
  if (i >= n) {
    return OutOfRange("LocalCluster: no server " + std::to_string(i) + " (have " +
                      std::to_string(n) + ")");
  }
  return Status::Ok();
}

Status LocalCluster::Kill(size_t i) {
  TESSERA_RETURN_IF_ERROR(CheckIndex(i, size()));
  return impl_->Run([this, i]() -> Status {
    Subprocess& p = impl_->procs[i];
    if (!p.running()) return Status::Ok();
    TESSERA_RETURN_IF_ERROR(p.Signal(SIGKILL));
    auto st = p.Wait(Deadline::AfterMs(5000));
    return st.ok() ? Status::Ok() : st.status();
  });
}

namespace {

// A socket bound (SO_REUSEADDR, SO_REUSEPORT) to 127.0.0.1:port that does not listen. The
// servers listen with --reuse_port, so both binds succeed while either holds the port, and the
// kernel gives no outgoing connection a port that a socket is bound to.
Result<UniqueFd> ReservePort(uint16_t port) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) return ErrnoError("LocalCluster: socket");
  int one = 1;
  if (::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
      ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) != 0) {
    return ErrnoError("LocalCluster: setsockopt");
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
    return ErrnoError("LocalCluster: cannot hold port ", port, " for the restart");
  }
  return fd;
}

// True while a TCP socket in the calling thread's network namespace listens on `port` (any
// address).
bool SomeoneListensOnHere(uint16_t port) {
  char want[8];
  std::snprintf(want, sizeof want, ":%04X", port);
  for (const char* table : {"/proc/thread-self/net/tcp", "/proc/thread-self/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // The header.
    while (std::getline(in, line)) {
      // "  sl  local_address rem_address   st ...": the local port ends the 2nd field, and
      // state 0A is LISTEN.
      std::istringstream fields(line);
      std::string sl, local, remote, state;
      fields >> sl >> local >> remote >> state;
      if (state == "0A" && local.size() >= 5 && local.compare(local.size() - 5, 5, want) == 0) {
        return true;
      }
    }
  }
  return false;
}

// SomeoneListensOnHere in the namespace at `netns_path` ('' = the caller's), looked at from a
// short-lived thread that enters it. An error if the namespace cannot be entered.
Result<bool> SomeoneListensOn(uint16_t port, const std::string& netns_path) {
  if (netns_path.empty()) return SomeoneListensOnHere(port);
  Result<bool> out = false;
  std::thread([&] {
    UniqueFd ns(::open(netns_path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!ns || ::setns(ns.get(), CLONE_NEWNET) != 0) {
      out = ErrnoError("LocalCluster: cannot enter ", netns_path);
      return;
    }
    out = SomeoneListensOnHere(port);
  }).join();
  return out;
}

}  // namespace

Status LocalCluster::Restart(size_t i) {
  TESSERA_RETURN_IF_ERROR(CheckIndex(i, size()));
  const uint16_t port = endpoints_[i].port;
  // Hold the port from before the old process dies until the new one listens. Without this,
  // an outgoing connection of any process on the host may be given the port as its local port
  // in between, and the new server's bind fails with EADDRINUSE. A bound socket that does not
  // listen takes no connections, so clients see the server die exactly as without it.
  // A server's own namespace has no other process to take the port.
  UniqueFd hold;
  if (!impl_->net) {
    TESSERA_ASSIGN_OR_RETURN(hold, ReservePort(port));
  }
  return impl_->Run([this, i, port]() -> Status {
    Subprocess& old = impl_->procs[i];
    if (old.running()) {
      (void)old.Signal(SIGCONT);  // A stopped server dies on SIGKILL too, but reap it promptly.
      TESSERA_RETURN_IF_ERROR(old.Signal(SIGKILL));
      auto w = old.Wait(Deadline::AfterMs(5000));
      if (!w.ok()) return w.status();
    }
    // The old listening socket can outlive its process: io_uring drops the files its requests
    // hold (the multishot accept) in deferred work after the exit. A new server binding the
    // port meanwhile would join the old socket's SO_REUSEPORT group, and connections the old
    // socket still took would be reset when it closes. Wait (bounded) until nothing listens.
    const Deadline gone = Deadline::AfterMs(5000);
    const std::string netns = impl_->net ? impl_->net->host(i).netns_path : "";
    for (;;) {
      TESSERA_ASSIGN_OR_RETURN(bool listening, SomeoneListensOn(port, netns));
      if (!listening) break;
      if (gone.Expired()) {
        return Timeout("LocalCluster: port ", port, " still has a listener 5 s after memserver ",
                       i, " exited");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::vector<std::string> argv = impl_->ServerArgv(i);
    for (std::string& a : argv) {
      if (a == "--port=0") a = "--port=" + std::to_string(port);
    }
    TESSERA_ASSIGN_OR_RETURN(Subprocess p, Subprocess::Start(argv, impl_->ServerStartOptions(i)));
    auto line = p.WaitForLine("listening on ",
                              Deadline::AfterMs(static_cast<uint64_t>(impl_->start_timeout_ms)));
    if (!line.ok()) {
      return Unavailable("LocalCluster: restarted memserver ", i, " did not print 'listening on' ",
                         "within ", impl_->start_timeout_ms, " ms: ", line.status().ToString());
    }
    impl_->procs[i] = std::move(p);
    return Status::Ok();
  });
}

namespace {

// True once every thread of `pid` is in the stopped state ('T' in /proc/PID/task/TID/stat).
bool AllThreadsStopped(pid_t pid) {
  std::error_code ec;
  const std::filesystem::path tasks = "/proc/" + std::to_string(pid) + "/task";
  bool any = false;
  for (const auto& t : std::filesystem::directory_iterator(tasks, ec)) {
    std::ifstream in(t.path() / "stat");
    std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t close = stat.rfind(')');  // The state follows "(comm) ".
    if (close == std::string::npos || close + 2 >= stat.size()) return false;
    const char state = stat[close + 2];
    if (state != 'T' && state != 't') return false;
    any = true;
  }
  return any && !ec;
}

}  // namespace

Status LocalCluster::Stop(size_t i) {
  TESSERA_RETURN_IF_ERROR(CheckIndex(i, size()));
  return impl_->Run([this, i]() -> Status {
    Subprocess& p = impl_->procs[i];
    TESSERA_RETURN_IF_ERROR(p.Signal(SIGSTOP));
    // kill() only queues the stop: wait (bounded) until every thread has stopped, so the
    // server answers nothing sent after Stop() returns.
    const Deadline d = Deadline::AfterMs(5000);
    while (!AllThreadsStopped(p.pid())) {
      if (d.Expired()) return Timeout("memserver ", i, " did not stop within 5 s of SIGSTOP");
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return Status::Ok();
  });
}

Status LocalCluster::Cont(size_t i) {
  TESSERA_RETURN_IF_ERROR(CheckIndex(i, size()));
  return impl_->Run([this, i] { return impl_->procs[i].Signal(SIGCONT); });
}

bool LocalCluster::Running(size_t i) {
  if (i >= size()) return false;
  return impl_->Run([this, i] { return !impl_->procs[i].Poll(); });
}

Status LocalCluster::Fault(size_t i, const std::vector<std::string>& args) {
  TESSERA_RETURN_IF_ERROR(CheckIndex(i, size()));
  std::vector<std::string> argv = {impl_->tessera, "fault", endpoints_[i].ToString()};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.push_back("--auth_token_file=" + token_path_);
  return impl_->Run([&]() -> Status {
    Subprocess::Options so;
    so.capture_stdout = true;
    TESSERA_ASSIGN_OR_RETURN(Subprocess p, Subprocess::Start(argv, so));
    std::string output;
    const Deadline deadline = Deadline::AfterMs(15000);
    for (;;) {
      auto line = p.ReadLine(deadline);
      if (!line.ok()) break;  // End of output (or the deadline; Wait below bounds it too).
      output += *line + "\n";
    }
    auto ws = p.Wait(deadline);
    if (!ws.ok()) return Timeout("tessera fault did not finish: " + ws.status().ToString());
    if (!WIFEXITED(*ws) || WEXITSTATUS(*ws) != 0) {
      std::string what;
      for (const auto& a : args) what += (what.empty() ? "" : " ") + a;
      return Internal("tessera fault " + endpoints_[i].ToString() + " " + what +
                      " failed (wait status " + std::to_string(*ws) + "): " + output);
    }
    return Status::Ok();
  });
}

const NetHosts* LocalCluster::net_hosts() const { return impl_->net.get(); }

Status LocalCluster::Partition(size_t i) {
  TESSERA_RETURN_IF_ERROR(CheckIndex(i, size()));
  if (!impl_->net) return Unsupported("LocalCluster: Partition needs hosts = netns (servers on loopback)");
  return impl_->net->SetLinkUp(i, false);
}

Status LocalCluster::Heal(size_t i) {
  TESSERA_RETURN_IF_ERROR(CheckIndex(i, size()));
  if (!impl_->net) return Unsupported("LocalCluster: Heal needs hosts = netns (servers on loopback)");
  return impl_->net->SetLinkUp(i, true);
}

Result<Subprocess> LocalCluster::StartOnServerHost(size_t i, const std::vector<std::string>& argv,
                                                   Subprocess::Options options) const {
  TESSERA_RETURN_IF_ERROR(CheckIndex(i, size()));
  if (impl_->net) options.netns_path = impl_->net->host(i).netns_path;
  options.cpus = pin_.servers;
  return Subprocess::Start(argv, options);
}

Result<Subprocess> LocalCluster::StartOnClientHost(const std::vector<std::string>& argv,
                                                   Subprocess::Options options) const {
  if (impl_->net) options.netns_path = impl_->net->host(impl_->net->size() - 1).netns_path;
  options.cpus = pin_.client;
  return Subprocess::Start(argv, options);
}

Result<std::string> LocalCluster::IssueCredentialFile(const std::string& name, bool admin) const {
  TESSERA_ASSIGN_OR_RETURN(
      fabric::Credential cred,
      fabric::IssueCredential(secret_, name, admin ? fabric::Role::kAdmin : fabric::Role::kClient));
  std::string path =
      std::filesystem::path(token_path_).parent_path().string() + "/" + name + ".credential";
  std::ofstream out(path, std::ios::trunc);
  out << fabric::FormatCredential(cred);
  out.close();
  if (!out) return IoError("writing credential file ", path, " failed");
  std::filesystem::permissions(path, std::filesystem::perms::owner_read |
                                         std::filesystem::perms::owner_write);
  return path;
}

}  // namespace tessera::client
