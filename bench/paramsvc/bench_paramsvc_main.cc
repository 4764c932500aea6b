// `tessera bench paramsvc`: the Parameter Service against the peers a user would pick instead.
//
// Four sections, one run (each starts its own servers: real `tessera paramsvc serve`
// processes on loopback):
//   summation     GB/s of one core summing gradients into fp32 (fp32, fp16, bf16 inputs; Highway
//                 kernels) against a plain memcpy of the same input bytes.
//   packing       8+ synthetic jobs (seeded trace: arrivals, departures, model sizes, bursty
//                 compute) on one packed, elastic service vs one static parameter server per
//                 job (1 core each: the same total cores). CPU: core-seconds the service holds
//                 (active cores x time) and the CPU its processes really used; each job's p50
//                 iteration time.
//   vs_allreduce  the PyTorch example (python/examples/paramsvc_train.py) with 2, 4, 8 workers:
//                 time per iteration on the service (its optimizer, and DDP with the service's
//                 comm hook) vs torch.distributed gloo allreduce.
//   staleness     4 workers training least squares, one slowed 3x: sync vs bounded(s).
// --json prints one object per line with the keys of the contract (null where one does not
// apply); a table otherwise. A gnuplot PNG per section goes to --out_dir.
#include <gflags/gflags.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>

#include "apps/cli/cli.h"
#include "apps/paramsvc/client/client.h"
#include "apps/paramsvc/kernels.h"
#include "bench/support/bench_hosts.h"
#include "common/clock.h"
#include "common/report.h"
#include "common/subprocess.h"
#include "fabric/auth.h"

DEFINE_bool(json, false, "JSON lines instead of tables");
DEFINE_bool(quick, false, "A short run (what the test runs)");
DEFINE_string(sections, "summation,packing,vs_allreduce,staleness", "Sections to run");
DEFINE_string(out_dir, "", "Where the PNGs and their data go (default: bench-results/paramsvc "
                           "beside build/bin)");
DEFINE_int32(runs, 3, "Runs per summation measurement (medians)");
DEFINE_string(python, "/usr/bin/python3", "Python with torch (Debian python3-torch)");
DEFINE_string(hosts, "loopback", tessera::bench::kHostsFlagHelp);
DEFINE_string(pin, "none", tessera::bench::kPinFlagHelp);
DEFINE_int32(jobs, 8, "Packing: synthetic jobs (>= 8 for the AutoPS comparison)");
DEFINE_int32(cores, 8, "Packing: cores of the packed service (= jobs' static cores)");

namespace {

using namespace tessera;
using namespace tessera::paramsvc;
using json = nlohmann::json;

const cli::CliSpec kSpec = {
    "tessera bench paramsvc", "[--json] [--quick] [--sections a,b] [--out_dir DIR]",
    "Measures the Parameter Service: summation kernels vs memcpy, packed elastic service vs a\n"
    "static parameter server per job, iteration time vs torch.distributed gloo allreduce, and a\n"
    "3x straggler under sync vs bounded(s). Starts its own servers (--hosts netns: in a network\n"
    "namespace of their own; --pin: this process and its workers on the client CPUs, the\n"
    "servers on the server CPUs).",
    __FILE__, 0, 0};

std::string g_secret;
std::string g_token;
std::string g_out;
std::vector<json> g_rows;
tessera::bench::BenchHosts g_hosts;
std::unique_ptr<tessera::client::NetHosts> g_net;  // --hosts netns: the server host.
std::string g_host = "127.0.0.1";  // Where the services listen.

json Row(const std::string& section, const std::string& system) {
  json j;
  j["suite"] = "paramsvc";
  j["section"] = section;
  j["system"] = system;
  for (const auto& [k, v] : tessera::bench::HostsFields(
           g_net ? tessera::client::HostsMode::kNetns : tessera::client::HostsMode::kLoopback,
           g_hosts.pin)) {
    j[k] = v;
  }
  for (const char* k : {"jobs", "workers", "model_mb", "iter_ms_p50", "iter_ms_p99", "cpu_core_s",
                        "cores_avg", "gbps", "final_loss", "staleness_max"}) {
    j[k] = nullptr;
  }
  return j;
}

void Emit(const json& j) {
  g_rows.push_back(j);
  if (FLAGS_json) std::printf("%s\n", j.dump().c_str());
  std::fflush(stdout);
}

double Pct(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
}

void Note(const std::string& s) {
  if (!FLAGS_json) std::printf("%s\n", s.c_str());
  else std::fprintf(stderr, "%s\n", s.c_str());
}

void Plot(const std::string& name, const std::string& data, const std::string& script) {
  const std::string dat = g_out + "/" + name + ".dat";
  const std::string gp = g_out + "/" + name + ".gp";
  std::ofstream(dat) << data;
  std::ofstream(gp) << "set terminal pngcairo size 900,500\nset output '" << g_out << "/" << name
                    << ".png'\nset datafile separator '\\t'\n" << script;
  auto r = Subprocess::Start({"gnuplot", gp});
  if (!r.ok()) {
    Note("  (no plot: gnuplot not runnable: " + r.status().message() + ")");
    return;
  }
  auto st = r->Wait(Deadline::AfterMs(30000));
  if (!st.ok() || !WIFEXITED(*st) || WEXITSTATUS(*st) != 0) {
    Note("  (gnuplot failed for " + name + ")");
    return;
  }
  Note("  plot: " + g_out + "/" + name + ".png");
}

// ---- a real service process ----
struct Service {
  Subprocess proc;
  uint16_t port = 0;
  pid_t aggregator = 0;
  uint64_t started_ns = 0;

  static Result<Service> Start(const std::vector<std::string>& flags) {
    std::vector<std::string> argv = {SelfExeDir() + "/tessera-paramsvc-serve", "--port=0",
                                     "--listen=" + g_host, "--log_level=error",
                                     "--auth_token_file=" + g_token};
    argv.insert(argv.end(), flags.begin(), flags.end());
    Subprocess::Options o;
    o.capture_stdout = true;
    o.quiet_stderr = true;
    if (g_net) o.netns_path = g_net->host(0).netns_path;
    o.cpus = g_hosts.pin.servers;
    auto p = Subprocess::Start(argv, o);
    if (!p.ok()) return p.status();
    Service s;
    s.started_ns = MonotonicNs();
    s.proc = std::move(*p);
    auto line = s.proc.WaitForLine("listening on ", Deadline::AfterMs(20000));
    if (!line.ok()) return line.status();
    s.port = static_cast<uint16_t>(std::stoi(line->substr(line->rfind(':') + 1)));
    line = s.proc.WaitForLine("aggregator pid ", Deadline::AfterMs(20000));
    if (!line.ok()) return line.status();
    s.aggregator = static_cast<pid_t>(std::stol(line->substr(15)));
    line = s.proc.WaitForLine("aggregator ready", Deadline::AfterMs(20000));
    if (!line.ok()) return line.status();
    return s;
  }
  // CPU seconds the aggregation server process used (all its threads).
  double CpuSeconds() const {
    std::ifstream f("/proc/" + std::to_string(aggregator) + "/stat");
    std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    const size_t rp = s.rfind(')');
    if (rp == std::string::npos) return 0;
    std::istringstream in(s.substr(rp + 2));
    std::string tok;
    double ut = 0, st = 0;
    for (int i = 3; i <= 15 && in >> tok; ++i) {
      if (i == 14) ut = std::stod(tok);
      if (i == 15) st = std::stod(tok);
    }
    return (ut + st) / static_cast<double>(sysconf(_SC_CLK_TCK));
  }
  Result<json> Status() const {
    ClientOptions o;
    o.host = g_host;
    o.port = port;
    o.secret = g_secret;
    auto c = Client::Connect(o);
    if (!c.ok()) return c.status();
    auto t = (*c)->StatusJson();
    if (!t.ok()) return t.status();
    return json::parse(*t);
  }
};

std::unique_ptr<Client> Connect(uint16_t port) {
  ClientOptions o;
  o.host = g_host;
  o.port = port;
  o.secret = g_secret;
  o.op_timeout_ms = 60000;
  auto c = Client::Connect(o);
  if (!c.ok()) {
    std::fprintf(stderr, "bench paramsvc: connect: %s\n", c.status().ToString().c_str());
    std::exit(1);
  }
  return std::move(*c);
}

void Check(const Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "bench paramsvc: %s: %s\n", what, s.ToString().c_str());
    std::exit(1);
  }
}

// ---------------------------------------------------------------- 1. summation
void Summation() {
  const size_t bytes = FLAGS_quick ? (16u << 20) : (64u << 20);  // Input bytes per pass
  Note("== summation: one core, " + std::to_string(bytes >> 20) + " MiB of gradient per pass, median of " +
       std::to_string(FLAGS_runs) + " (kernel target " + KernelTarget() + ")");
  std::vector<uint8_t> src(bytes), dst(bytes);
  std::mt19937 rng(1);
  for (size_t i = 0; i < bytes; i += 4) {
    const float f = static_cast<float>(rng() % 1000) / 1000.0f;
    uint16_t h;
    FromF32(&h, &f, DType::kF16, 1);
    std::memcpy(&src[i], i % 8 == 0 ? static_cast<const void*>(&f) : static_cast<const void*>(&h), 2);
  }
  std::vector<float> acc(bytes / 2, 0.0f);  // Enough fp32 for the 16-bit inputs
  auto time_it = [&](auto fn) {
    std::vector<double> gbps;
    fn();  // Warm (page faults)
    for (int r = 0; r < FLAGS_runs; ++r) {
      const int reps = 4;
      const uint64_t t0 = MonotonicNs();
      for (int k = 0; k < reps; ++k) fn();
      const double s = static_cast<double>(MonotonicNs() - t0) / 1e9;
      gbps.push_back(static_cast<double>(bytes) * reps / s / 1e9);
    }
    return Median(gbps);
  };
  const double memcpy_gbps = time_it([&] { std::memcpy(dst.data(), src.data(), bytes); });
  std::string dat = "system\tgbps\n";
  json m = Row("summation", "memcpy");
  m["gbps"] = memcpy_gbps;
  Emit(m);
  dat += "memcpy\t" + std::to_string(memcpy_gbps) + "\n";
  if (!FLAGS_json) std::printf("  %-16s %8.2f GB/s\n", "memcpy", memcpy_gbps);
  for (DType d : {DType::kF32, DType::kF16, DType::kBF16}) {
    const size_t n = bytes / DTypeSize(d);
    const double g = time_it([&] { AddInto(acc.data(), src.data(), d, n); });
    json j = Row("summation", std::string("tessera-") + DTypeName(d));
    j["gbps"] = g;
    j["vs_memcpy"] = g / memcpy_gbps;
    j["target"] = ">= 0.5x memcpy";
    j["met"] = g / memcpy_gbps >= 0.5;
    Emit(j);
    dat += std::string("sum-") + DTypeName(d) + "\t" + std::to_string(g) + "\n";
    if (!FLAGS_json) {
      std::printf("  %-16s %8.2f GB/s of %s input (%.2fx memcpy; target >= 0.5x: %s)\n",
                  (std::string("sum ") + DTypeName(d)).c_str(), g, DTypeName(d), g / memcpy_gbps,
                  g / memcpy_gbps >= 0.5 ? "met" : "missed");
    }
  }
  Plot("summation", dat,
       "set title 'Gradient summation into fp32, one core (GB/s of input)'\nset style fill solid\n"
       "set boxwidth 0.6\nset ylabel 'GB/s'\nset yrange [0:*]\nplot '" + g_out +
           "/summation.dat' every ::1 using 0:2:xtic(1) with boxes notitle\n");
}

// ---------------------------------------------------------------- 2. packing
struct TraceJob {
  int id;
  double arrive_s, leave_s;
  uint64_t model_bytes;
  double compute_ms;      // Per iteration, in a busy phase
  double pause_ms;        // Pause between bursts (no pushes)
  uint64_t burst_iters;   // Busy iterations, then as many idle ones
};

// The trace: seeded (mt19937(42)), so every run and both systems see the same jobs. Arrivals
// every `gap` seconds, lifetimes in [life, 1.6 life], models of 1, 2, 4 or 8 MiB, compute
// 15..60 ms of compute per iteration, in bursts of 3..10 iterations separated by pauses as
// long as a burst (bursty load on the service).
std::vector<TraceJob> MakeTrace(int jobs, double gap, double life) {
  std::mt19937 rng(42);
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<TraceJob> t;
  for (int i = 0; i < jobs; ++i) {
    TraceJob j;
    j.id = i;
    j.arrive_s = i * gap;
    j.leave_s = j.arrive_s + life * (1.0 + 0.6 * u(rng));
    j.model_bytes = (1ull << 20) << (rng() % 4);
    j.compute_ms = 15 + 45 * u(rng);
    j.burst_iters = 3 + rng() % 8;
    j.pause_ms = j.burst_iters * j.compute_ms;
    t.push_back(j);
  }
  return t;
}

JobSpec SyntheticSpec(const TraceJob& j, const std::string& prefix, uint32_t workers) {
  JobSpec s;
  s.name = prefix + "-job" + std::to_string(j.id);
  s.workers = workers;
  s.optimizer.lr = 0.001f;
  s.optimizer.momentum = 0.9f;
  s.partition_bytes = 1u << 20;
  s.tensors = {{"w", DType::kF32, {j.model_bytes / 4}}};
  return s;
}

struct JobResult {
  std::vector<double> iter_ms;
};

// Runs one job's workers against `port` from its arrival to its departure.
void RunJob(const TraceJob& j, uint16_t port, uint32_t workers, const std::string& prefix,
            uint64_t t0, JobResult* out, std::mutex* mu) {
  std::vector<std::thread> th;
  std::vector<std::vector<double>> times(workers);
  // Sync rounds need every worker: the first worker past the departure time fixes the last
  // iteration (one more than its count: its partner may already have pushed that round).
  std::atomic<uint64_t> last{UINT64_MAX};
  for (uint32_t w = 0; w < workers; ++w) {
    th.emplace_back([&, w] {
      auto c = Connect(port);
      const JobSpec spec = SyntheticSpec(j, prefix, workers);
      Check(c->Join(spec, w), "join");
      Check(c->Barrier(0), "barrier");
      std::vector<float> g(j.model_bytes / 4, 1e-3f), p(j.model_bytes / 4);
      const void* gp[1] = {g.data()};
      void* pp[1] = {p.data()};
      const uint64_t end = t0 + static_cast<uint64_t>(j.leave_s * 1e9);
      uint64_t it = 0;
      while (it < last.load()) {
        // Bursty: after every burst_iters iterations the job pauses (evaluation, data loading:
        // no pushes) for as long as the burst took; the pause is not part of an iteration.
        if (it > 0 && it % j.burst_iters == 0) {
          std::this_thread::sleep_for(std::chrono::microseconds(
              static_cast<int64_t>(j.pause_ms * 1000)));
        }
        const uint64_t a = MonotonicNs();
        std::this_thread::sleep_for(std::chrono::microseconds(static_cast<int64_t>(j.compute_ms * 1000)));
        Check(c->PushPull(gp, pp), "push_pull");
        times[w].push_back(static_cast<double>(MonotonicNs() - a) / 1e6);
        ++it;
        if (MonotonicNs() >= end) {
          uint64_t expect = UINT64_MAX;
          last.compare_exchange_strong(expect, it + 1);
        }
      }
    });
  }
  for (auto& t : th) t.join();
  std::lock_guard<std::mutex> l(*mu);
  for (auto& v : times) out->iter_ms.insert(out->iter_ms.end(), v.begin(), v.end());
}

void Packing() {
  const int jobs = std::max(FLAGS_jobs, 1);
  const double gap = FLAGS_quick ? 0.15 : 0.5;
  const double life = FLAGS_quick ? 1.2 : 4.0;
  const uint32_t workers = 2;
  auto trace = MakeTrace(jobs, gap, life);
  double span = 0;
  for (auto& j : trace) span = std::max(span, j.leave_s);
  Note("== packing: " + std::to_string(jobs) + " jobs x " + std::to_string(workers) +
       " workers, seeded trace (arrivals every " + std::to_string(gap).substr(0, 4) +
       " s, lifetimes " + std::to_string(life).substr(0, 3) + "-" +
       std::to_string(1.6 * life).substr(0, 4) + " s, 1-8 MiB models, bursty compute)");
  struct Outcome {
    std::vector<JobResult> per_job;
    double core_s = 0, cpu_s = 0, wall_s = 0;
  };
  auto run = [&](bool packed) {
    Outcome o;
    o.per_job.resize(jobs);
    std::mutex mu;
    const std::string prefix = packed ? "packed" : "static";
    if (packed) {
      auto svc = Service::Start({"--cores=" + std::to_string(FLAGS_cores), "--elastic=true",
                                 "--nice=0", "--rebalance_ms=100", "--target_util=0.6"});
      Check(svc.status(), "start the packed service");
      const uint64_t t0 = MonotonicNs();
      std::vector<std::thread> th;
      for (int i = 0; i < jobs; ++i) {
        th.emplace_back([&, i] {
          std::this_thread::sleep_until(std::chrono::steady_clock::now() +
                                        std::chrono::nanoseconds(static_cast<int64_t>(trace[i].arrive_s * 1e9) -
                                                                 static_cast<int64_t>(MonotonicNs() - t0)));
          RunJob(trace[i], svc->port, workers, prefix, t0, &o.per_job[i], &mu);
          auto c = Connect(svc->port);
          Check(c->Join(SyntheticSpec(trace[i], prefix, workers), 0), "join");
          Check(c->Release(), "release");  // The job departs.
        });
      }
      for (auto& t : th) t.join();
      o.wall_s = static_cast<double>(MonotonicNs() - t0) / 1e9;
      auto st = svc->Status();
      Check(st.status(), "status");
      o.core_s = (*st)["core_seconds"].get<double>();
      o.cpu_s = svc->CpuSeconds();
    } else {
      // One static server per job, started at its arrival and stopped at its departure, with
      // one core always held.
      const uint64_t t0 = MonotonicNs();
      std::vector<std::thread> th;
      std::atomic<uint64_t> held_us{0};
      std::mutex cpu_mu;
      for (int i = 0; i < jobs; ++i) {
        th.emplace_back([&, i] {
          std::this_thread::sleep_until(std::chrono::steady_clock::now() +
                                        std::chrono::nanoseconds(static_cast<int64_t>(trace[i].arrive_s * 1e9) -
                                                                 static_cast<int64_t>(MonotonicNs() - t0)));
          auto svc = Service::Start({"--cores=1", "--elastic=false", "--nice=0"});
          Check(svc.status(), "start a static server");
          RunJob(trace[i], svc->port, workers, prefix, t0, &o.per_job[i], &mu);
          const double cpu = svc->CpuSeconds();
          held_us += (MonotonicNs() - svc->started_ns) / 1000;
          std::lock_guard<std::mutex> l(cpu_mu);
          o.cpu_s += cpu;
        });
      }
      for (auto& t : th) t.join();
      o.wall_s = static_cast<double>(MonotonicNs() - t0) / 1e9;
      o.core_s = static_cast<double>(held_us.load()) / 1e6;
    }
    return o;
  };
  Outcome stat = run(false);
  Outcome pack = run(true);
  double model_mb = 0;
  for (auto& j : trace) model_mb += static_cast<double>(j.model_bytes) / (1 << 20);
  std::vector<double> ratios;
  std::string dat = "job\tstatic_p50\tpacked_p50\n";
  bool all_p50 = true;
  for (int i = 0; i < jobs; ++i) {
    const double ps = Pct(stat.per_job[i].iter_ms, 0.5), pp = Pct(pack.per_job[i].iter_ms, 0.5);
    ratios.push_back(pp / ps);
    all_p50 &= pp <= 1.05 * ps;
    dat += "job" + std::to_string(i) + "\t" + std::to_string(ps) + "\t" + std::to_string(pp) + "\n";
    for (int k = 0; k < 2; ++k) {
      const auto& r = k == 0 ? stat.per_job[i] : pack.per_job[i];
      json j = Row("packing", k == 0 ? "static-ps-per-job" : "tessera-packed");
      j["job"] = i;
      j["jobs"] = 1;
      j["workers"] = workers;
      j["model_mb"] = static_cast<double>(trace[i].model_bytes) / (1 << 20);
      j["iter_ms_p50"] = Pct(r.iter_ms, 0.5);
      j["iter_ms_p99"] = Pct(r.iter_ms, 0.99);
      if (k == 1) j["p50_vs_static"] = pp / ps;
      Emit(j);
    }
  }
  for (int k = 0; k < 2; ++k) {
    const Outcome& o = k == 0 ? stat : pack;
    std::vector<double> all;
    for (auto& r : o.per_job) all.insert(all.end(), r.iter_ms.begin(), r.iter_ms.end());
    json j = Row("packing", k == 0 ? "static-ps-per-job" : "tessera-packed");
    j["jobs"] = jobs;
    j["workers"] = workers;
    j["model_mb"] = model_mb;
    j["iter_ms_p50"] = Pct(all, 0.5);
    j["iter_ms_p99"] = Pct(all, 0.99);
    j["cpu_core_s"] = o.core_s;
    j["cores_avg"] = o.core_s / o.wall_s;
    j["cpu_busy_s"] = o.cpu_s;
    if (k == 1) {
      j["core_s_vs_static"] = pack.core_s / stat.core_s;
      j["target"] = "core-seconds <= 0.4x static, every job's p50 <= 1.05x";
      j["met"] = pack.core_s <= 0.4 * stat.core_s && all_p50;
      j["worst_job_p50_ratio"] = *std::max_element(ratios.begin(), ratios.end());
    }
    Emit(j);
  }
  if (!FLAGS_json) {
    std::printf("  %-20s core-s held %7.2f (avg %.2f cores), CPU used %6.2f s\n", "static-ps-per-job",
                stat.core_s, stat.core_s / stat.wall_s, stat.cpu_s);
    std::printf("  %-20s core-s held %7.2f (avg %.2f cores), CPU used %6.2f s\n", "tessera-packed",
                pack.core_s, pack.core_s / pack.wall_s, pack.cpu_s);
    std::printf("  packed/static core-seconds %.2fx (target <= 0.4x: %s); per-job p50 ratios:",
                pack.core_s / stat.core_s, pack.core_s <= 0.4 * stat.core_s ? "met" : "missed");
    for (double r : ratios) std::printf(" %.2f", r);
    std::printf(" (target every <= 1.05: %s)\n", all_p50 ? "met" : "missed");
  }
  Plot("packing", dat,
       "set title 'Per-job p50 iteration time: static PS per job vs packed elastic service'\n"
       "set style data histograms\nset style fill solid\nset ylabel 'ms'\nset yrange [0:*]\n"
       "plot '" + g_out + "/packing.dat' every ::1 using 2:xtic(1) title 'static PS per job', '' every ::1 using 3 title 'Tessera packed'\n");
}

// ---------------------------------------------------------------- 3. vs_allreduce
void VsAllreduce() {
  const double model_mb = FLAGS_quick ? 0.5 : 2.0;
  const int iters = FLAGS_quick ? 10 : 40;
  Note("== vs_allreduce: MLP of ~" + std::to_string(model_mb).substr(0, 3) + " MB, " +
       std::to_string(iters) + " steps per worker, PyTorch example, service with 2 cores");
  // The example as installed (PREFIX/share/tessera from PREFIX/libexec/tessera) or laid out
  // in the build tree (build/share/tessera); the package from pip, or the build tree's copy.
  const std::string script = DataPath("examples/paramsvc_train.py");
  if (script.empty()) {
    std::fprintf(stderr, "tessera bench paramsvc: examples/paramsvc_train.py is missing from "
                         "share/tessera beside %s\n", SelfExeDir().c_str());
    std::exit(1);
  }
  // One run of the example against a fresh service: its JSON rows by backend ("paramsvc",
  // "gloo"); exits when it did not print `want` rows.
  auto run_example = [&](int w, const std::string& backend, const std::string& mode, size_t want) {
    // The service on the server host (the example's workers run here, on the client CPUs).
    auto svc = Service::Start({"--cores=2"});
    Check(svc.status(), "start the service");
    std::vector<std::string> argv = {"/usr/bin/env", "PYTHONPATH=" + SelfExeDir() + "/../python",
                                     FLAGS_python, script, "--backend=" + backend,
                                     "--mode=" + mode, "--workers=" + std::to_string(w),
                                     "--model_mb=" + std::to_string(model_mb), "--epochs=100",
                                     "--max_iters=" + std::to_string(iters), "--batch=32",
                                     "--bin_dir=" + SelfExeDir(), "--tolerance=1",
                                     "--host=" + g_host, "--port=" + std::to_string(svc->port),
                                     "--secret=" + g_secret};
    Subprocess::Options o;
    o.capture_stdout = true;
    o.quiet_stderr = true;
    auto p = Subprocess::Start(argv, o);
    Check(p.status(), "start the PyTorch example");
    std::map<std::string, json> rows;
    while (true) {
      auto line = p->ReadLine(Deadline::AfterMs(600000));
      if (!line.ok()) break;
      auto j = json::parse(*line, nullptr, false);
      if (!j.is_discarded() && j.contains("backend")) rows[j["backend"].get<std::string>()] = j;
    }
    (void)p->Wait(Deadline::AfterMs(30000));
    if (rows.size() != want) {
      std::fprintf(stderr, "bench paramsvc: the PyTorch example (--mode=%s) failed with %d workers "
                           "(is torch installed for %s? Debian python3-torch)\n", mode.c_str(), w,
                   FLAGS_python.c_str());
      std::exit(1);
    }
    return rows;
  };
  std::string dat = "workers\tparamsvc\tgloo\thook\n";
  std::vector<int> counts = FLAGS_quick ? std::vector<int>{2} : std::vector<int>{2, 4, 8};
  for (int w : counts) {
    std::map<std::string, json> rows = run_example(w, "both", "optimizer", 2);
    rows["hook"] = run_example(w, "paramsvc", "hook", 1)["paramsvc"];
    dat += std::to_string(w) + "\t" + std::to_string(rows["paramsvc"]["iter_ms_p50"].get<double>()) +
           "\t" + std::to_string(rows["gloo"]["iter_ms_p50"].get<double>()) + "\t" +
           std::to_string(rows["hook"]["iter_ms_p50"].get<double>()) + "\n";
    for (const char* b : {"paramsvc", "hook", "gloo"}) {
      const json& r = rows[b];
      const std::string name = b;
      json j = Row("vs_allreduce", name == "paramsvc" ? "tessera-paramsvc"
                                   : name == "hook"   ? "tessera-paramsvc-hook"
                                                      : "gloo-allreduce");
      j["jobs"] = 1;
      j["workers"] = w;
      j["model_mb"] = r["model_mb"];
      j["iter_ms_p50"] = r["iter_ms_p50"];
      j["iter_ms_p99"] = r["iter_ms_p99"];
      j["final_loss"] = r["final_loss"];
      j["accuracy"] = r["accuracy"];
      if (name != "gloo") {
        const double ratio = r["iter_ms_p50"].get<double>() / rows["gloo"]["iter_ms_p50"].get<double>();
        j["p50_vs_gloo"] = ratio;
        if (w >= 4) {
          j["target"] = "iteration time <= gloo at 4 and 8 workers";
          j["met"] = ratio <= 1.0;
        }
      }
      Emit(j);
      if (!FLAGS_json) {
        std::printf("  %d workers %-17s p50 %7.2f ms  p99 %7.2f ms  accuracy %.3f\n", w,
                    j["system"].get<std::string>().c_str(), r["iter_ms_p50"].get<double>(),
                    r["iter_ms_p99"].get<double>(), r["accuracy"].get<double>());
      }
    }
  }
  Plot("vs_allreduce", dat,
       "set title 'Time per training step: Tessera Parameter Service vs gloo allreduce'\n"
       "set xlabel 'workers'\nset ylabel 'p50 ms per step'\nset yrange [0:*]\nset key left\n"
       "plot '" + g_out + "/vs_allreduce.dat' every ::1 using 1:2 with linespoints title 'Tessera paramsvc', "
       "'' every ::1 using 1:3 with linespoints title 'gloo allreduce', "
       "'' every ::1 using 1:4 with linespoints title 'Tessera paramsvc, DDP comm hook'\n");
}

// ---------------------------------------------------------------- 4. staleness
struct LsqData {
  int d = 512, n_per = 2048, workers = 4;
  std::vector<float> wstar;
  std::vector<std::vector<float>> x, y;  // Per worker shard
  std::vector<float> xt, yt;             // Held-out
};

LsqData MakeLsq() {
  LsqData D;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0, 1);
  const float sc = 1.0f / std::sqrt(static_cast<float>(D.d));
  D.wstar.resize(D.d);
  for (auto& v : D.wstar) v = nd(rng) * sc;  // y ~ N(0, 1)
  auto draw = [&](int n, std::vector<float>* x, std::vector<float>* y) {
    x->resize(static_cast<size_t>(n) * D.d);
    y->resize(n);
    for (int i = 0; i < n; ++i) {
      float dot = 0;
      for (int k = 0; k < D.d; ++k) {
        const float v = nd(rng);  // Unscaled features: the averaged batch Hessian is ~I
        (*x)[static_cast<size_t>(i) * D.d + k] = v;
        dot += v * D.wstar[k];
      }
      (*y)[i] = dot + 0.1f * nd(rng);
    }
  };
  D.x.resize(D.workers);
  D.y.resize(D.workers);
  for (int w = 0; w < D.workers; ++w) draw(D.n_per, &D.x[w], &D.y[w]);
  draw(2048, &D.xt, &D.yt);
  return D;
}

double LsqLoss(const LsqData& D, const std::vector<float>& w) {
  double s = 0;
  const int n = static_cast<int>(D.yt.size());
  for (int i = 0; i < n; ++i) {
    float dot = 0;
    for (int k = 0; k < D.d; ++k) dot += D.xt[static_cast<size_t>(i) * D.d + k] * w[k];
    s += (dot - D.yt[i]) * (dot - D.yt[i]);
  }
  return s / n / 2;
}

void Staleness() {
  const LsqData D = MakeLsq();
  const int iters = FLAGS_quick ? 60 : 200;
  const double compute_ms = 8.0;
  Note("== staleness: least squares (d=" + std::to_string(D.d) + "), 4 workers, " +
       std::to_string(iters) + " iterations per worker, compute 8 ms per iteration, worker 3 slowed 3x");
  auto svc = Service::Start({"--cores=2", "--nice=0"});
  Check(svc.status(), "start the service");
  struct Case {
    std::string name;
    Mode mode;
    uint32_t s;
    bool straggler;
  };
  std::vector<Case> cases = {{"sync-healthy", Mode::kSync, 0, false},
                             {"sync", Mode::kSync, 0, true},
                             {"bounded(1)", Mode::kBounded, 1, true},
                             {"bounded(2)", Mode::kBounded, 2, true},
                             {"bounded(4)", Mode::kBounded, 4, true}};
  double healthy_rate = 0, sync_loss = 0;
  std::string dat = "mode\trate_vs_healthy\tloss_vs_sync\n";
  int run_id = 0;
  for (const Case& cs : cases) {
    JobSpec spec;
    spec.name = "lsq-" + std::to_string(run_id++);
    spec.workers = 4;
    spec.mode = cs.mode;
    spec.staleness = cs.s;
    spec.optimizer.lr = 0.15f;
    spec.optimizer.momentum = 0.0f;
    spec.tensors = {{"w", DType::kF32, {static_cast<uint64_t>(D.d)}}};
    std::atomic<bool> done{false};
    std::vector<std::vector<double>> times(4);
    std::vector<double> rate(4, 0);
    std::vector<float> final_w(D.d);
    std::vector<std::thread> th;
    for (int w = 0; w < 4; ++w) {
      th.emplace_back([&, w] {
        auto c = Connect(svc->port);
        Check(c->Join(spec, w), "join");
        Check(c->Barrier(0), "barrier");
        std::vector<float> p(D.d, 0.0f), g(D.d);
        const void* gp[1] = {g.data()};
        void* pp[1] = {p.data()};
        Check(c->Pull(pp, false), "pull");
        std::mt19937 rng(100 + w);
        const double cms = (cs.straggler && w == 3) ? 3 * compute_ms : compute_ms;
        const uint64_t t0 = MonotonicNs();
        int it = 0;
        // Sync: everyone runs `iters`. Bounded: the job ends when the healthy workers are done.
        while (it < iters && !(cs.mode != Mode::kSync && done.load())) {
          const uint64_t a = MonotonicNs();
          std::fill(g.begin(), g.end(), 0.0f);
          for (int b = 0; b < 32; ++b) {
            const int i = static_cast<int>(rng() % D.n_per);
            const float* x = &D.x[w][static_cast<size_t>(i) * D.d];
            float dot = 0;
            for (int k = 0; k < D.d; ++k) dot += x[k] * p[k];
            const float r = (dot - D.y[w][i]) / 32;
            for (int k = 0; k < D.d; ++k) g[k] += r * x[k];
          }
          std::this_thread::sleep_for(std::chrono::microseconds(static_cast<int64_t>(cms * 1000)));
          Check(c->PushPull(gp, pp), "push_pull");
          times[w].push_back(static_cast<double>(MonotonicNs() - a) / 1e6);
          ++it;
        }
        rate[w] = it / (static_cast<double>(MonotonicNs() - t0) / 1e9);
        if (w == 0) {
          done = true;
          final_w = p;
        }
      });
    }
    for (auto& t : th) t.join();
    auto c = Connect(svc->port);
    Check(c->Join(spec, 0), "join");
    std::vector<float> p(D.d);
    void* pp[1] = {p.data()};
    Check(c->Pull(pp, false), "pull");
    const double loss = LsqLoss(D, p);
    auto st = svc->Status();
    Check(st.status(), "status");
    json jj;
    for (auto& j : (*st)["jobs"]) {
      if (j["name"] == spec.name) jj = j;
    }
    Check(c->Release(), "release");
    std::vector<double> all;
    for (auto& v : times) all.insert(all.end(), v.begin(), v.end());
    std::vector<double> r3(rate.begin(), rate.end());
    const double med_rate = Pct(r3, 0.5);  // The median worker's iterations per second
    if (cs.name == "sync-healthy") healthy_rate = med_rate;
    if (cs.name == "sync") sync_loss = loss;
    json j = Row("staleness", cs.name);
    j["jobs"] = 1;
    j["workers"] = 4;
    j["model_mb"] = D.d * 4.0 / (1 << 20);
    j["iter_ms_p50"] = Pct(all, 0.5);
    j["iter_ms_p99"] = Pct(all, 0.99);
    j["final_loss"] = loss;
    j["staleness_max"] = jj.value("staleness_max", 0);
    j["iter_rate"] = med_rate;
    j["rate_vs_healthy"] = med_rate / healthy_rate;
    j["updates"] = jj.value("updates", 0);
    j["pushes"] = jj.value("pushes", 0);
    j["dropped"] = jj.value("dropped", 0);
    if (cs.mode == Mode::kBounded) {
      j["loss_vs_sync"] = loss / sync_loss;
      j["target"] = "rate >= 0.9x healthy, loss within 2% of sync";
      j["met"] = med_rate >= 0.9 * healthy_rate && std::abs(loss / sync_loss - 1) <= 0.02;
    }
    Emit(j);
    dat += cs.name + "\t" + std::to_string(med_rate / healthy_rate) + "\t" +
           std::to_string(sync_loss > 0 ? loss / sync_loss : 1.0) + "\n";
    if (!FLAGS_json) {
      std::printf("  %-13s %6.1f it/s (%.2fx healthy)  loss %.5f  p50 %6.2f ms p99 %6.2f ms  "
                  "updates %llu  dropped %llu  staleness max %llu\n",
                  cs.name.c_str(), med_rate, med_rate / healthy_rate, loss, Pct(all, 0.5),
                  Pct(all, 0.99), static_cast<unsigned long long>(jj.value("updates", 0ULL)),
                  static_cast<unsigned long long>(jj.value("dropped", 0ULL)),
                  static_cast<unsigned long long>(jj.value("staleness_max", 0ULL)));
    }
  }
  Plot("staleness", dat,
       "set title 'One worker slowed 3x: iteration rate and loss vs sync'\nset style data histograms\n"
       "set style fill solid\nset yrange [0:*]\n"
       "plot '" + g_out + "/staleness.dat' every ::1 using 2:xtic(1) title 'iteration rate / healthy', "
       "'' every ::1 using 3 title 'final loss / sync'\n");
}

}  // namespace

int main(int argc, char** argv) {
  cli::InitCli(kSpec, &argc, &argv);
  if (FLAGS_runs < 1) cli::UsageError(kSpec, "--runs must be positive");
  if (FLAGS_jobs < 1 || FLAGS_jobs > 64) cli::UsageError(kSpec, "--jobs must be in 1..64");
  if (FLAGS_cores < 1 || FLAGS_cores > 256) cli::UsageError(kSpec, "--cores must be in 1..256");
  std::vector<std::string> sections;
  {
    std::stringstream ss(FLAGS_sections);
    std::string s;
    while (std::getline(ss, s, ',')) {
      if (s != "summation" && s != "packing" && s != "vs_allreduce" && s != "staleness") {
        cli::UsageError(kSpec, "unknown section '" + s + "' (summation, packing, vs_allreduce, staleness)");
      }
      sections.push_back(s);
    }
  }
  auto hosts = tessera::bench::ParseBenchHosts(FLAGS_hosts, FLAGS_pin);
  if (!hosts.ok()) cli::UsageError(kSpec, hosts.status().message());
  g_hosts = *hosts;
  // Before any thread starts: this process's threads and its workers inherit the client CPUs.
  Check(tessera::bench::PinBenchClient(g_hosts), "--pin");
  g_net = tessera::bench::MakeBenchNetHosts(g_hosts, 1, "tessera bench paramsvc");
  if (g_net) g_host = g_net->host(0).address;
  g_out = FLAGS_out_dir.empty() ? SelfExeDir() + "/../bench-results/paramsvc" : FLAGS_out_dir;
  std::error_code ec;
  std::filesystem::create_directories(g_out, ec);
  if (ec) {
    std::fprintf(stderr, "bench paramsvc: cannot create %s: %s\n", g_out.c_str(), ec.message().c_str());
    return 1;
  }
  uint8_t r[24];
  Check(fabric::RandomBytes(r), "random");
  for (uint8_t b : r) {
    char h[3];
    std::snprintf(h, sizeof(h), "%02x", b);
    g_secret += h;
  }
  g_token = g_out + "/.token";
  std::ofstream(g_token) << g_secret << "\n";
  ::chmod(g_token.c_str(), 0600);
  for (const auto& s : sections) {
    if (s == "summation") Summation();
    if (s == "packing") Packing();
    if (s == "vs_allreduce") VsAllreduce();
    if (s == "staleness") Staleness();
  }
  std::ofstream(g_out + "/results.jsonl") << [] {
    std::string all;
    for (auto& j : g_rows) all += j.dump() + "\n";
    return all;
  }();
  std::filesystem::remove(g_token, ec);
  return 0;
}
