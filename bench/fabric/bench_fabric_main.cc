// `tessera bench fabric`: one-sided READ/WRITE over the Tessera fabric against real memserver
// processes, side by side with memcached GET/SET (Debian's memcached, started by the bench) from
// an equally lean pipelined client, at queue depths 1..64, against 1 and 10 servers.
//
// Every measured point keeps `qd` operations outstanding from one client thread (spinning on
// completions, the way the page store will use the transport), spread round-robin over the
// servers, with uniformly random 4 KB-aligned (or 512 B-aligned) targets in a per-server
// working set of --keys items. Latency is post -> completion per op; throughput is completions
// per second over the measured window. Points of both systems are interleaved inside each
// repetition; the table shows medians over --reps of each point's p50, p99 and ops/s.
#include <gflags/gflags.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "apps/cli/cli.h"
#include "bench/fabric/memcached_client.h"
#include "bench/support/bench_hosts.h"
#include "common/clock.h"
#include "common/histogram.h"
#include "common/logging.h"
#include "common/report.h"
#include "common/subprocess.h"
#include "fabric/auth.h"
#include "fabric/control_client.h"
#include "fabric/transport.h"

DEFINE_bool(json, false, "Print JSON lines instead of tables");
DEFINE_int32(reps, 3, "Repetitions of every point (medians are reported)");
DEFINE_bool(coalesce, false,
            "Let the Tessera transport pack the ops of one batch bound for one server into one "
            "READV/WRITEV request (the page store does). Off by default, so every op is its own "
            "request, like the memcached client's pipelined GET/SET");
DEFINE_bool(quick, false,
            "Fast smoke run: 4 KB only, QD 1 and 8, 1 and 2 servers, short windows, 1 rep");
DEFINE_string(servers, "1,10", "Comma-separated server counts");
DEFINE_string(sizes, "512,4096", "Comma-separated op sizes in bytes");
DEFINE_string(qds, "1,2,4,8,16,32,64", "Comma-separated queue depths");
DEFINE_int32(duration_ms, 250, "Measured window per point");
DEFINE_int32(warmup_ms, 50, "Unmeasured warm-up before each window");
DEFINE_int32(keys, 4096, "Items per server (the working set is keys x size per server)");
DEFINE_string(transport, "auto", "Tessera transport: auto, tcp or rdma");
DEFINE_string(memcached, "/usr/bin/memcached", "memcached binary (Debian package 'memcached')");
DEFINE_string(hosts, "loopback", tessera::bench::kHostsFlagHelp);
DEFINE_string(pin, "none", tessera::bench::kPinFlagHelp);
DEFINE_string(memserver, "", "tessera-memserver binary (default: beside this program)");
DEFINE_string(systems, "tessera,memcached",
              "Systems to measure (targets need both; one alone is for profiling)");

namespace {

using tessera::Deadline;
using tessera::LatencyHistogram;
using tessera::MonotonicNs;
using tessera::Report;
using tessera::Result;
using tessera::Status;
using tessera::Subprocess;
namespace fabric = tessera::fabric;

const tessera::cli::CliSpec kSpec = {
    "tessera bench fabric",
    "[--quick] [--json] [--reps N] [--servers 1,10] [--sizes 512,4096] [--qds 1,..,64] "
    "[--hosts netns|loopback] [--pin client:0,servers:1]",
    "One-sided READ/WRITE latency (QD1 p50/p99) and throughput (QD 1..64) over the Tessera\n"
    "fabric against real `tessera memserver` processes, next to memcached GET/SET from an equally\n"
    "lean pipelined client, against 1 and 10 servers. Starts and stops every server itself on\n"
    "loopback ephemeral ports (--hosts netns: memserver i and memcached i in network namespace\n"
    "i). Prints PASS/MISS for: QD1 4 KB read p50 <= memcached GET p50, and QD32 4 KB\n"
    "throughput >= 2x memcached.",
    __FILE__, 0, 0};

[[noreturn]] void Die(const std::string& what, const Status& st) {
  std::fprintf(stderr, "tessera bench fabric: %s: %s\n", what.c_str(), st.ToString().c_str());
  std::exit(1);
}

std::vector<int> ParseList(const char* flag, const std::string& text, int lo, int hi) {
  std::vector<int> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    long v = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v < lo || v > hi) {
      tessera::cli::UsageError(kSpec, std::string("--") + flag + ": '" + item +
                                          "' is not a number in " + std::to_string(lo) + ".." +
                                          std::to_string(hi));
    }
    out.push_back(static_cast<int>(v));
  }
  if (out.empty()) tessera::cli::UsageError(kSpec, std::string("--") + flag + " is empty");
  return out;
}

// A private temporary directory (token file), removed on exit.
class ScratchDir {
 public:
  ScratchDir() {
    char tmpl[] = "/tmp/tessera-bench-fabric-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) Die("mkdtemp", tessera::ErrnoError("mkdtemp"));
    path_ = tmpl;
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// An unused loopback TCP port (bound then released; memcached cannot report the port it picked).
Result<uint16_t> FreePort() {
  tessera::UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    return tessera::ErrnoError("bind port 0");
  }
  socklen_t len = sizeof(a);
  ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&a), &len);
  return static_cast<uint16_t>(ntohs(a.sin_port));
}

struct PointStats {
  LatencyHistogram hist;
  uint64_t ops = 0;
  uint64_t errors = 0;
  std::string first_error;
  double seconds = 0;
};

// Keeps `qd` ops outstanding through `driver` for warmup + measure; see the file comment.
// Driver: Queue(slot, server, key), Submit() -> Status, Reap(std::vector<Done>*) -> Status.
struct Done {
  uint32_t slot;
  bool ok;
};

template <typename Driver>
Status RunPoint(Driver& d, int qd, int servers, int keys, uint64_t warmup_ns, uint64_t measure_ns,
                uint64_t seed, PointStats* out) {
  std::mt19937_64 rng(seed);
  std::vector<uint64_t> start(qd);
  std::vector<Done> done;
  done.reserve(qd * 2);
  uint64_t next_server = 0;
  auto issue = [&](uint32_t slot, uint64_t now) {
    d.Queue(slot, static_cast<int>(next_server++ % servers), static_cast<uint32_t>(rng() % keys));
    start[slot] = now;
  };
  uint64_t now = MonotonicNs();
  for (int i = 0; i < qd; ++i) issue(i, now);
  TESSERA_RETURN_IF_ERROR(d.Submit());
  const uint64_t t_begin = now + warmup_ns;
  // The window closes at t_end, or (on a box so loaded that nothing completed inside it) with
  // the first op measured after it.
  uint64_t t_end = t_begin + measure_ns;
  const uint64_t give_up = t_end + 10'000'000'000ull;
  int outstanding = qd;
  while (outstanding > 0) {
    done.clear();
    TESSERA_RETURN_IF_ERROR(d.Reap(&done));
    if (done.empty()) {
      if (MonotonicNs() > give_up) {
        return tessera::Timeout(outstanding, " ops outstanding 10 s after the window closed");
      }
      continue;
    }
    now = MonotonicNs();
    bool queued = false;
    for (const Done& x : done) {
      if (now > t_end && out->ops == 0 && now >= t_begin) t_end = now;
      if (now >= t_begin && now <= t_end) {
        out->hist.Record(now - start[x.slot]);
        out->ops++;
        if (!x.ok) out->errors++;
      }
      if (now < t_end) {
        issue(x.slot, now);
        queued = true;
      } else {
        outstanding--;
      }
    }
    if (queued) TESSERA_RETURN_IF_ERROR(d.Submit());
  }
  out->seconds = static_cast<double>(t_end - t_begin) / 1e9;
  return Status::Ok();
}

// ---- Tessera ----

class TesseraDriver {
 public:
  TesseraDriver(fabric::Transport* t, const std::vector<fabric::ConnectionId>& conns,
                const std::vector<uint64_t>& slabs, uint8_t* buffers)
      : t_(t), conns_(conns), slabs_(slabs), buffers_(buffers) {
    batch_.reserve(128);
  }
  void Configure(fabric::OpKind op, uint32_t size) {
    op_ = op;
    size_ = size;
  }
  void Queue(uint32_t slot, int server, uint32_t key) {
    batch_.push_back(fabric::WorkRequest{conns_[server], op_, slabs_[server], uint64_t{key} * size_,
                                         size_, buffers_ + uint64_t{slot} * size_, slot});
  }
  Status Submit() {
    Status st = t_->Post(batch_);
    batch_.clear();
    return st;
  }
  Status Reap(std::vector<Done>* out) {
    size_t n = t_->Poll(completions_);
    for (size_t i = 0; i < n; ++i) {
      const fabric::Completion& c = completions_[i];
      if (c.kind != fabric::CompletionKind::kData) {
        if (c.notice.kind == fabric::NoticeKind::kShuttingDown) {
          return tessera::Unavailable("a memserver announced it is shutting down");
        }
        continue;
      }
      if (!c.status.ok() && first_error_.ok()) first_error_ = c.status;
      out->push_back(Done{static_cast<uint32_t>(c.cookie), c.status.ok()});
    }
    return Status::Ok();
  }
  const Status& first_error() const { return first_error_; }

 private:
  fabric::Transport* t_;
  std::vector<fabric::ConnectionId> conns_;
  std::vector<uint64_t> slabs_;
  uint8_t* buffers_;
  fabric::OpKind op_ = fabric::OpKind::kRead;
  uint32_t size_ = 4096;
  std::vector<fabric::WorkRequest> batch_;
  fabric::Completion completions_[128];
  Status first_error_;
};

// ---- memcached ----

class MemcachedDriver {
 public:
  MemcachedDriver(tessera::bench::MemcachedClient* c, uint8_t* buffers, uint8_t* sink)
      : c_(c), buffers_(buffers), sink_(sink) {
    replies_.reserve(256);
  }
  void Configure(tessera::bench::MemcachedClient::Op op, uint32_t size) {
    op_ = op;
    size_ = size;
    c_->set_sink(sink_, size);
  }
  void Queue(uint32_t slot, int server, uint32_t key) {
    c_->Queue(server, op_, size_, key, buffers_ + uint64_t{slot} * size_, slot);
  }
  Status Submit() { return c_->Flush(); }
  Status Reap(std::vector<Done>* out) {
    replies_.clear();
    TESSERA_RETURN_IF_ERROR(c_->Poll(&replies_));
    for (const auto& r : replies_) out->push_back(Done{r.opaque, r.ok});
    return Status::Ok();
  }

 private:
  tessera::bench::MemcachedClient* c_;
  uint8_t* buffers_;
  uint8_t* sink_;
  tessera::bench::MemcachedClient::Op op_ = tessera::bench::MemcachedClient::Op::kGet;
  uint32_t size_ = 4096;
  std::vector<tessera::bench::MemcachedClient::Reply> replies_;
};

struct Key {
  std::string system;
  std::string op;
  int size;
  int qd;
  int servers;
  bool operator<(const Key& o) const {
    return std::tie(servers, size, op, system, qd) < std::tie(o.servers, o.size, o.op, o.system, o.qd);
  }
};
struct Samples {
  std::vector<double> p50_us, p99_us, ops_per_s;
};

}  // namespace

int main(int argc, char** argv) {
  tessera::cli::InitCli(kSpec, &argc, &argv);
  signal(SIGPIPE, SIG_IGN);
  if (FLAGS_quick) {
    FLAGS_servers = "1,2";
    FLAGS_sizes = "4096";
    FLAGS_qds = "1,8";
    FLAGS_duration_ms = 30;
    FLAGS_warmup_ms = 10;
    FLAGS_reps = 1;
    FLAGS_keys = 256;
  }
  if (FLAGS_reps < 1 || FLAGS_reps > 100) tessera::cli::UsageError(kSpec, "--reps must be in 1..100");
  if (FLAGS_duration_ms < 1 || FLAGS_duration_ms > 60000) {
    tessera::cli::UsageError(kSpec, "--duration_ms must be in 1..60000");
  }
  if (FLAGS_warmup_ms < 0 || FLAGS_warmup_ms > 60000) {
    tessera::cli::UsageError(kSpec, "--warmup_ms must be in 0..60000");
  }
  if (FLAGS_keys < 1 || FLAGS_keys > 65536) tessera::cli::UsageError(kSpec, "--keys must be in 1..65536");
  std::vector<int> server_counts = ParseList("servers", FLAGS_servers, 1, 32);
  std::vector<int> sizes = ParseList("sizes", FLAGS_sizes, 1, 1 << 20);
  std::vector<int> qds = ParseList("qds", FLAGS_qds, 1, 1024);
  bool run_tessera = false, run_memcached = false;
  {
    std::stringstream ss(FLAGS_systems);
    std::string item;
    while (std::getline(ss, item, ',')) {
      if (item == "tessera") {
        run_tessera = true;
      } else if (item == "memcached") {
        run_memcached = true;
      } else {
        tessera::cli::UsageError(kSpec, "--systems: unknown system '" + item + "'");
      }
    }
    if (!run_tessera && !run_memcached) tessera::cli::UsageError(kSpec, "--systems is empty");
  }
  auto bench_hosts = tessera::bench::ParseBenchHosts(FLAGS_hosts, FLAGS_pin);
  if (!bench_hosts.ok()) tessera::cli::UsageError(kSpec, bench_hosts.status().message());
  // Before any thread starts: the client's threads inherit the client CPUs.
  if (Status st = tessera::bench::PinBenchClient(*bench_hosts); !st.ok()) Die("--pin", st);
  auto kind = fabric::ParseTransportKind(FLAGS_transport);
  if (!kind.ok()) tessera::cli::UsageError(kSpec, "--transport: " + kind.status().message());
  int max_servers = *std::max_element(server_counts.begin(), server_counts.end());
  int max_size = *std::max_element(sizes.begin(), sizes.end());
  int max_qd = *std::max_element(qds.begin(), qds.end());
  uint64_t working_set = uint64_t(FLAGS_keys) * max_size;
  uint64_t slab_bytes = ((working_set + (4 << 20) - 1) / (4 << 20)) * (4 << 20);

  std::string memserver = FLAGS_memserver.empty() ? tessera::SelfExeDir() + "/tessera-memserver"
                                                  : FLAGS_memserver;
  if (::access(memserver.c_str(), X_OK) != 0) {
    Die("memserver", tessera::NotFound("'", memserver, "' is not executable (build the "
                                       "tessera-memserver target, or pass --memserver)"));
  }
  if (::access(FLAGS_memcached.c_str(), X_OK) != 0) {
    Die("memcached", tessera::NotFound("'", FLAGS_memcached, "' is not executable: install the "
                                       "Debian package 'memcached' (scripts/setup.sh does)"));
  }

  // A fresh secret shared with our memservers.
  ScratchDir scratch;
  std::string token_path = scratch.path() + "/token";
  std::string secret;
  {
    uint8_t raw[24];
    if (Status st = fabric::RandomBytes(raw); !st.ok()) Die("secret", st);
    static const char* kHex = "0123456789abcdef";
    for (uint8_t b : raw) {
      secret += kHex[b >> 4];
      secret += kHex[b & 15];
    }
    std::ofstream(token_path) << secret << "\n";
  }

  // ---- start the servers: memserver i and memcached i on host i ----
  const std::unique_ptr<tessera::client::NetHosts> net = tessera::bench::MakeBenchNetHosts(
      *bench_hosts, static_cast<size_t>(max_servers), "tessera bench fabric");
  const auto hosts_fields = tessera::bench::HostsFields(
      net ? tessera::client::HostsMode::kNetns : tessera::client::HostsMode::kLoopback,
      bench_hosts->pin);
  auto host_of = [&](int i) { return net ? net->host(i).address : std::string("127.0.0.1"); };
  std::vector<Subprocess> memservers;
  std::vector<fabric::Endpoint> endpoints;
  Subprocess::Options popt;
  popt.capture_stdout = true;
  popt.quiet_stderr = true;
  popt.cpus = bench_hosts->pin.servers;
  for (int i = 0; i < max_servers; ++i) {
    if (net) popt.netns_path = net->host(i).netns_path;
    auto p = Subprocess::Start({memserver, "--listen", host_of(i), "--port", "0", "--capacity",
                                std::to_string(slab_bytes * 2), "--slab_size",
                                std::to_string(slab_bytes), "--auth_token_file", token_path,
                                "--transport", FLAGS_transport},
                               popt);
    if (!p.ok()) Die("starting memserver", p.status());
    auto line = p->WaitForLine("listening on ", Deadline::AfterMs(10000));
    if (!line.ok()) Die("memserver did not report its port", line.status());
    auto ep = fabric::ParseEndpoint(line->substr(std::strlen("listening on ")));
    if (!ep.ok()) Die("memserver printed a bad endpoint", ep.status());
    endpoints.push_back(*ep);
    memservers.push_back(std::move(*p));
  }
  std::vector<Subprocess> memcacheds;
  std::vector<std::pair<std::string, uint16_t>> mc_endpoints;
  Subprocess::Options mopt;
  mopt.quiet_stderr = true;
  mopt.cpus = bench_hosts->pin.servers;
  for (int i = 0; i < max_servers; ++i) {
    // A host of its own has its port space to itself.
    auto port = net ? Result<uint16_t>(11211) : FreePort();
    if (!port.ok()) Die("picking a port for memcached", port.status());
    if (net) mopt.netns_path = net->host(i).netns_path;
    std::vector<std::string> argv = {FLAGS_memcached, "-l", host_of(i), "-p",
                                     std::to_string(*port), "-U", "0", "-t", "1", "-m",
                                     std::to_string(std::max<uint64_t>(64, 4 * working_set >> 20)),
                                     "-c", "1024"};
    if (::geteuid() == 0) {
      argv.push_back("-u");
      argv.push_back("root");
    }
    auto p = Subprocess::Start(argv, mopt);
    if (!p.ok()) Die("starting memcached", p.status());
    memcacheds.push_back(std::move(*p));
    mc_endpoints.emplace_back(host_of(i), *port);
  }

  // ---- clients ----
  fabric::TransportOptions topt;
  topt.coalesce = FLAGS_coalesce;
  topt.kind = *kind;
  topt.max_inflight = static_cast<uint32_t>(std::max(256, max_qd * 2));
  auto transport = fabric::Transport::Create(topt);
  if (!transport.ok()) Die("creating the transport", transport.status());
  fabric::Transport& t = **transport;
  std::string tessera_name = std::string("tessera-") + std::string(fabric::TransportKindName(t.kind()));
  std::vector<uint8_t> buffers(uint64_t(max_qd) * max_size + 4096);
  std::vector<uint8_t> sink(max_size);
  for (size_t i = 0; i < buffers.size(); ++i) buffers[i] = static_cast<uint8_t>(i * 131 + 7);
  if (Status st = t.RegisterMemory(buffers.data(), buffers.size()); !st.ok()) Die("RegisterMemory", st);
  std::vector<fabric::ConnectionId> conns;
  std::vector<uint64_t> slabs;
  std::vector<std::unique_ptr<fabric::ControlClient>> controls;  // Slab allocation.
  for (const auto& ep : endpoints) {
    fabric::ConnectOptions co;
    co.secret = secret;
    co.client_id = 0x62656e6368ull;  // "bench"
    co.deadline = Deadline::AfterMs(10000);
    auto c = t.Connect(ep, co);
    if (!c.ok()) Die("connecting to " + ep.ToString(), c.status());
    auto control = fabric::ControlClient::Connect(ep, co);
    if (!control.ok()) Die("connecting to " + ep.ToString(), control.status());
    auto slab = (*control)->AllocSlab(fabric::AllocSlabRequest{slab_bytes}, Deadline::AfterMs(10000));
    if (!slab.ok()) Die("allocating a slab on " + ep.ToString(), slab.status());
    if (Status st = t.AddSlab(*c, *slab); !st.ok()) Die("AddSlab", st);
    controls.push_back(std::move(*control));
    if (slab->size < working_set) {
      Die("slab", tessera::Internal("slab of ", slab->size, " bytes < working set ", working_set));
    }
    conns.push_back(*c);
    slabs.push_back(slab->slab_id);
  }
  tessera::bench::MemcachedClient mc;
  if (Status st = mc.Connect(mc_endpoints, Deadline::AfterMs(10000)); !st.ok()) Die("memcached", st);

  TesseraDriver td(&t, conns, slabs, buffers.data());
  MemcachedDriver md(&mc, buffers.data(), sink.data());

  // ---- preload: every item on every server, both systems (pages touched, items present) ----
  for (int size : sizes) {
    for (int s = 0; s < max_servers; ++s) {
      for (int k0 = 0; k0 < FLAGS_keys; k0 += 64) {
        int n = std::min(64, FLAGS_keys - k0);
        td.Configure(fabric::OpKind::kWrite, size);
        md.Configure(tessera::bench::MemcachedClient::Op::kSet, size);
        std::vector<fabric::WorkRequest> wr;
        for (int k = 0; k < n; ++k) {
          wr.push_back({conns[s], fabric::OpKind::kWrite, slabs[s], uint64_t(k0 + k) * size,
                        static_cast<uint32_t>(size), buffers.data(), uint64_t(k)});
          mc.Queue(s, tessera::bench::MemcachedClient::Op::kSet, size, k0 + k, buffers.data(), k);
        }
        if (Status st = t.Post(wr); !st.ok()) Die("preload post", st);
        if (Status st = mc.Flush(); !st.ok()) Die("preload memcached", st);
        std::vector<Done> got;
        Deadline dl = Deadline::AfterMs(10000);
        while (static_cast<int>(got.size()) < n && !dl.Expired()) {
          if (Status st = td.Reap(&got); !st.ok()) Die("preload", st);
        }
        std::vector<Done> mgot;
        while (static_cast<int>(mgot.size()) < n && !dl.Expired()) {
          if (Status st = md.Reap(&mgot); !st.ok()) Die("preload memcached", st);
        }
        if (static_cast<int>(got.size()) < n || static_cast<int>(mgot.size()) < n) {
          Die("preload", tessera::Timeout("preload did not finish within 10 s"));
        }
        for (const Done& x : got) {
          if (!x.ok) Die("preload write", td.first_error());
        }
        for (const Done& x : mgot) {
          if (!x.ok) Die("preload", tessera::Internal("memcached SET failed"));
        }
      }
    }
  }

  // ---- measure ----
  std::map<Key, Samples> samples;
  uint64_t warmup_ns = uint64_t(FLAGS_warmup_ms) * 1000000;
  uint64_t measure_ns = uint64_t(FLAGS_duration_ms) * 1000000;
  uint64_t seed = 1;
  for (int rep = 0; rep < FLAGS_reps; ++rep) {
    for (int servers : server_counts) {
      for (int size : sizes) {
        for (int o = 0; o < 2; ++o) {
          bool read = (o == 0);
          for (int qd : qds) {
            // Alternate which system goes first, so drift does not favour one.
            for (int which = 0; which < 2; ++which) {
              bool tessera_turn = ((which + rep) % 2) == 0;
              if ((tessera_turn && !run_tessera) || (!tessera_turn && !run_memcached)) continue;
              PointStats ps;
              Status st;
              Key key{"", "", size, qd, servers};
              if (tessera_turn) {
                td.Configure(read ? fabric::OpKind::kRead : fabric::OpKind::kWrite, size);
                st = RunPoint(td, qd, servers, FLAGS_keys, warmup_ns, measure_ns, seed++, &ps);
                key.system = tessera_name;
                key.op = read ? "read" : "write";
                if (ps.errors > 0) Die("tessera " + key.op, td.first_error());
              } else {
                md.Configure(read ? tessera::bench::MemcachedClient::Op::kGet
                                  : tessera::bench::MemcachedClient::Op::kSet,
                             size);
                st = RunPoint(md, qd, servers, FLAGS_keys, warmup_ns, measure_ns, seed++, &ps);
                key.system = "memcached";
                key.op = read ? "get" : "set";
                if (ps.errors > 0) {
                  Die("memcached " + key.op, tessera::Internal(ps.errors, " failed replies"));
                }
              }
              if (!st.ok()) Die(key.system + " " + key.op, st);
              if (ps.ops == 0) Die(key.system, tessera::Internal("no op completed in the window"));
              Samples& s = samples[key];
              s.p50_us.push_back(ps.hist.p50() / 1000.0);
              s.p99_us.push_back(ps.hist.p99() / 1000.0);
              s.ops_per_s.push_back(ps.ops / ps.seconds);
            }
          }
        }
      }
    }
  }

  // ---- report ----
  Report rep(FLAGS_json);
  rep.Title("tessera bench fabric: " + tessera_name + " one-sided ops vs memcached, " +
            std::to_string(FLAGS_reps) + " reps (medians), 1 client thread, " +
            std::to_string(FLAGS_duration_ms) + " ms windows");
  auto median = [&](const Key& k, int what) -> double {
    auto it = samples.find(k);
    if (it == samples.end()) return -1;
    const Samples& s = it->second;
    return tessera::Median(what == 0 ? s.p50_us : what == 1 ? s.p99_us : s.ops_per_s);
  };
  for (const auto& [k, s] : samples) {
    double ops = tessera::Median(s.ops_per_s);
    rep.Add(Report::Row()
                .Set("suite", "fabric")
                .Set("system", k.system)
                .Set("op", k.op)
                .Set("size", k.size)
                .Set("qd", k.qd)
                .Set("servers", k.servers)
                .Set("p50_us", tessera::Median(s.p50_us))
                .Set("p99_us", tessera::Median(s.p99_us))
                .Set("ops_per_s", ops)
                .Set("MB_per_s", ops * k.size / 1e6)
                .Set("reps", static_cast<int>(s.ops_per_s.size()))
                .Set("hosts", hosts_fields[0].second)
                .Set("pin", hosts_fields[1].second));
  }
  rep.Flush();

  Report targets(FLAGS_json);
  targets.Title("targets (tessera vs memcached, same run)");
  bool any_target = false;
  for (int servers : server_counts) {
    if (std::find(sizes.begin(), sizes.end(), 4096) == sizes.end()) break;
    if (std::find(qds.begin(), qds.end(), 1) != qds.end()) {
      double ours = median({tessera_name, "read", 4096, 1, servers}, 0);
      double theirs = median({"memcached", "get", 4096, 1, servers}, 0);
      if (ours >= 0 && theirs >= 0) targets.Add(Report::Row()
                      .Set("suite", "fabric-target")
                      .Set("hosts", hosts_fields[0].second)
                      .Set("pin", hosts_fields[1].second)
                      .Set("target", "QD1 4KB read p50 <= memcached GET p50")
                      .Set("servers", servers)
                      .Set("tessera", ours)
                      .Set("memcached", theirs)
                      .Set("unit", "us")
                      .Set("ratio", theirs > 0 ? ours / theirs : 0.0)
                      .Set("result", ours <= theirs ? "PASS" : "MISS"));
      any_target = true;
    }
    if (std::find(qds.begin(), qds.end(), 32) != qds.end()) {
      for (int o = 0; o < 2; ++o) {
        double ours = median({tessera_name, o == 0 ? "read" : "write", 4096, 32, servers}, 2);
        double theirs = median({"memcached", o == 0 ? "get" : "set", 4096, 32, servers}, 2);
        if (ours < 0 || theirs < 0) continue;
        targets.Add(Report::Row()
                        .Set("suite", "fabric-target")
                      .Set("hosts", hosts_fields[0].second)
                      .Set("pin", hosts_fields[1].second)
                        .Set("target", o == 0 ? "QD32 4KB read ops/s >= 2x memcached GET"
                                              : "QD32 4KB write ops/s >= 2x memcached SET")
                        .Set("servers", servers)
                        .Set("tessera", ours)
                        .Set("memcached", theirs)
                        .Set("unit", "ops/s")
                        .Set("ratio", theirs > 0 ? ours / theirs : 0.0)
                        .Set("result", ours >= 2 * theirs ? "PASS" : "MISS"));
        any_target = true;
      }
    }
  }
  if (!any_target && !FLAGS_json) {
    std::printf("(targets need --sizes with 4096 and --qds with 1 and/or 32)\n");
  }
  targets.Flush();

  // ---- stop ----
  transport->reset();
  for (auto& p : memservers) (void)p.Stop(2000);
  for (auto& p : memcacheds) (void)p.Stop(2000);
  return 0;
}
