// tessera bench programs: real, unmodified programs locally, under `tessera run` and under Linux
// swap at the same local-memory limit, in one run.
//
// Programs: the README demo's python3 workload (tests/run/workload.py: an in-memory external
// sort of dicts, lists and strings), GNU sort with a large in-memory buffer on a generated
// file, and redis-server loaded by tests/run/kv_loader.py and then driven by redis-benchmark.
// Each runs locally (its peak RSS is measured), under `tessera run --local-memory P%` on a shared
// embedded cluster of k+2r memservers, and, when this machine allows it (root, cgroup-v1), in a
// cgroup-v1 memory limit of P% of the local peak RSS with a temporary swapfile. Every run's
// output must equal the local run's (workload digest; sorted file; redis DEBUG DIGEST and the
// loader's read-back digest). A swap run the kernel OOM-kills is reported as failed, not timed.
#include <arpa/inet.h>
#include <gflags/gflags.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "apps/cli/cli.h"
#include "client/local_cluster.h"
#include "client/remote_store.h"
#include "bench/support/swap_cgroup.h"
#include "common/clock.h"
#include "common/report.h"
#include "common/subprocess.h"

DEFINE_bool(quick, false,
            "Small inputs, one run, 50% only, workload and sort only (CI smoke test, ~1 min)");
DEFINE_bool(json, false, "JSON lines instead of tables");
DEFINE_int32(runs, 3, "Runs per configuration (medians are reported)");
DEFINE_string(programs, "workload,sort,redis", "Comma-separated: workload, sort, redis");
DEFINE_string(local_memory, "75%,50%", "Comma-separated local-memory shares to run at");
DEFINE_string(layouts, "split,group",
              "Comma-separated erasure-coded layouts for `tessera run --layout` (--quick: the "
              "store's default only)");
DEFINE_int32(k, 4, "`tessera run` --k");
DEFINE_int32(r, 2, "`tessera run` --r");
DEFINE_bool(swap, true, "Compare with Linux swap (swapfile + cgroup-v1 memory limit)");
DEFINE_string(swap_dir, "/var/tmp", "Directory of the temporary swapfile (local disk)");
DEFINE_int32(timeout_s, 900, "Bound on each run (a run past it is killed and reported failed)");
DEFINE_string(scripts_dir, TESSERA_BENCH_PROGRAMS_SCRIPTS,
              "Directory holding workload.py and kv_loader.py");
DEFINE_int32(workload_records, 400000, "workload.py RECORDS (400000: ~150 MB in CPython)");
DEFINE_int32(sort_lines, 400000, "Lines of the generated sort input (400000: ~23 MB)");
DEFINE_int32(redis_keys, 200000, "Keys kv_loader.py stores in redis (values of 200 bytes)");
DEFINE_int32(redis_requests, 100000, "redis-benchmark -n");

namespace tessera {
namespace {

const cli::CliSpec kSpec{
    "tessera bench programs",
    "[--quick] [--json] [--runs R] [--programs workload,sort,redis] [--local_memory 75%,50%] "
    "[--layouts split] [--noswap]",
    "Completion time of real unmodified programs (the demo's python3 workload, GNU sort, redis "
    "under redis-benchmark) locally, under `tessera run` at each --local_memory share and per "
    "layout, and under Linux swap with a cgroup-v1 memory limit of the same share of the local "
    "peak RSS; every run's output must equal the local run's.",
    __FILE__, 0, 0};

const char kPython[] = "/usr/bin/python3";

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string x; std::getline(ss, x, ',');) {
    if (!x.empty()) out.push_back(x);
  }
  return out;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}


// ---------------------------------------------------------------------------------------------
// Linux swap: a swapfile and a cgroup-v1 memory cgroup, removed on every exit path.

bench::SwapCgroup g_swap;  // The Linux-swap peer (bench/support/swap_cgroup.h).

// ---------------------------------------------------------------------------------------------
// Running one program.

// How a program is started: plainly, under `tessera run`, or inside the swap cgroup.
struct Mode {
  enum Kind { kLocal, kTessera, kSwap } kind = kLocal;
  double fraction = 1.0;      // kTessera: --local-memory.
  std::string layout;         // kTessera.
  uint64_t limit_bytes = 0;   // kSwap: memory.limit_in_bytes.
};

struct Env {
  std::string bin;
  std::string tmp;
  client::LocalCluster* cluster = nullptr;
  bool run_has_layout = false;
  int seq = 0;
};

std::string Pct(double f) { return std::to_string(static_cast<int>(f * 100 + 0.5)) + "%"; }

std::vector<std::string> Wrap(Env* env, const Mode& m, const std::vector<std::string>& argv) {
  std::vector<std::string> out;
  if (m.kind == Mode::kTessera) {
    out = {env->bin + "/tessera-run", "--cluster", env->cluster->cluster_file_path(),
           "--auth_token_file", env->cluster->token_path(), "--local_memory", Pct(m.fraction),
           "--k", std::to_string(FLAGS_k), "--r", std::to_string(FLAGS_r), "--summary=false",
           "--progress=false", "--stats_json",
           env->tmp + "/stats-" + std::to_string(++env->seq) + ".json"};
    if (env->run_has_layout) out.insert(out.end(), {"--layout", m.layout});
    out.push_back("--");
  } else if (m.kind == Mode::kSwap) {
    return g_swap.Wrap(argv);
  }
  out.insert(out.end(), argv.begin(), argv.end());
  return out;
}

struct Outcome {
  bool ok = false;
  double secs = 0;
  std::string identity;   // What must equal the local run's.
  uint64_t peak_rss = 0;  // Bytes (VmHWM of the program's process).
  bool oom = false;       // Killed by SIGKILL under the swap cgroup (the OOM killer).
  std::string error;
};

// The program's peak RSS so far (VmHWM), 0 if it is gone.
uint64_t PeakRss(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmHWM:", 0) == 0) return std::strtoull(line.c_str() + 6, nullptr, 10) << 10;
  }
  return 0;
}

// Waits for `p` (bounded), sampling its peak RSS; fills ok/oom/error from its exit.
void WaitProgram(Subprocess* p, const Mode& m, Outcome* o) {
  const Deadline deadline = Deadline::AfterMs(static_cast<uint64_t>(FLAGS_timeout_s) * 1000);
  while (!p->Poll()) {
    o->peak_rss = std::max(o->peak_rss, PeakRss(p->pid()));
    if (deadline.Expired()) {
      (void)p->Signal(SIGKILL);
      (void)p->Wait(Deadline::AfterMs(30000));
      o->error = "did not finish within --timeout_s " + std::to_string(FLAGS_timeout_s);
      return;
    }
    usleep(20000);  // Sampling VmHWM and polling the exit; not synchronisation.
  }
  const int ws = *p->exit_status();
  if (WIFSIGNALED(ws)) {
    o->oom = m.kind == Mode::kSwap && WTERMSIG(ws) == SIGKILL;
    o->error = std::string("killed by signal ") + std::to_string(WTERMSIG(ws)) +
               (o->oom ? " (the OOM killer: the limit is too small for swap to complete)" : "");
    return;
  }
  if (WEXITSTATUS(ws) != 0) {
    o->error = "exit status " + std::to_string(WEXITSTATUS(ws));
    return;
  }
  o->ok = true;
}

// The demo's python3 workload; identity: its digest line.
Outcome RunWorkload(Env* env, const Mode& m) {
  Outcome o;
  auto argv = Wrap(env, m, {kPython, FLAGS_scripts_dir + "/workload.py",
                            std::to_string(FLAGS_workload_records), "16", "1"});
  const uint64_t t0 = MonotonicNs();
  auto p = Subprocess::Start(argv, Subprocess::Options{true, true, {}});
  if (!p.ok()) {
    o.error = p.status().ToString();
    return o;
  }
  // Its few output lines wait in the pipe while the exit is polled (and its RSS sampled).
  WaitProgram(&*p, m, &o);
  o.secs = (MonotonicNs() - t0) / 1e9;
  std::string digest;
  for (;;) {
    auto line = p->ReadLine(Deadline::AfterMs(10000));
    if (!line.ok()) break;
    if (line->rfind("tessera-workload: records", 0) == 0) digest = *line;
  }
  if (o.ok && digest.empty()) {
    o.ok = false;
    o.error = "no digest line";
  }
  o.identity = digest;
  return o;
}

// GNU sort -S 1G on the generated input; identity: the sorted file's bytes.
Outcome RunSort(Env* env, const Mode& m, const std::string& input) {
  Outcome o;
  const std::string out = env->tmp + "/sorted-" + std::to_string(++env->seq);
  auto argv = Wrap(env, m, {"/usr/bin/sort", "-S", "1G", input, "-o", out});
  Subprocess::Options so{true, true, {"LC_ALL=C"}};
  const uint64_t t0 = MonotonicNs();
  auto p = Subprocess::Start(argv, so);
  if (!p.ok()) {
    o.error = p.status().ToString();
    return o;
  }
  WaitProgram(&*p, m, &o);
  o.secs = (MonotonicNs() - t0) / 1e9;
  o.identity = ReadAll(out);
  ::unlink(out.c_str());
  if (o.ok && o.identity.empty()) {
    o.ok = false;
    o.error = "no output";
  }
  return o;
}

// An ephemeral loopback port that was free a moment ago (redis fails loudly if it was taken).
int FreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a = {};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// redis-server loaded by kv_loader.py, then redis-benchmark; the time is load + benchmark.
// Identity: the loader's read-back digest and redis DEBUG DIGEST.
Outcome RunRedis(Env* env, const Mode& m) {
  Outcome o;
  const int port = FreePort();
  auto argv = Wrap(env, m, {"/usr/bin/redis-server", "--port", std::to_string(port), "--bind",
                            "127.0.0.1", "--save", "", "--appendonly", "no",
                            "--enable-debug-command", "local"});
  auto server = Subprocess::Start(argv, Subprocess::Options{true, true, {}});
  if (!server.ok()) {
    o.error = server.status().ToString();
    return o;
  }
  const Deadline ready_by = Deadline::AfterMs(120000);
  for (;;) {
    auto line = server->ReadLine(ready_by);
    if (!line.ok()) {
      o.error = "redis-server never became ready: " + line.status().ToString();
      return o;
    }
    if (line->find("Ready to accept connections") != std::string::npos) break;
  }
  const uint64_t t0 = MonotonicNs();
  auto run = [&](const std::vector<std::string>& a, std::string* out) -> bool {
    auto p = Subprocess::Start(a, Subprocess::Options{true, true, {}});
    if (!p.ok()) return false;
    std::string all;
    for (;;) {
      auto line = p->ReadLine(Deadline::AfterMs(static_cast<uint64_t>(FLAGS_timeout_s) * 1000));
      if (!line.ok()) break;
      all += *line + "\n";
      o.peak_rss = std::max(o.peak_rss, PeakRss(server->pid()));
    }
    auto ws = p->Wait(Deadline::AfterMs(60000));
    if (out) *out = all;
    return ws.ok() && WIFEXITED(*ws) && WEXITSTATUS(*ws) == 0;
  };
  std::string loaded, bench, digest;
  bool good = run({kPython, FLAGS_scripts_dir + "/kv_loader.py", "redis", std::to_string(port),
                   std::to_string(FLAGS_redis_keys), "200"},
                  &loaded) &&
              run({"/usr/bin/redis-benchmark", "-p", std::to_string(port), "-q", "-n",
                   std::to_string(FLAGS_redis_requests), "-d", "200", "-t",
                   "set,get,lpush,lrange_100"},
                  &bench);
  o.secs = (MonotonicNs() - t0) / 1e9;
  o.peak_rss = std::max(o.peak_rss, PeakRss(server->pid()));
  good = good && run({"/usr/bin/redis-cli", "-p", std::to_string(port), "DEBUG", "DIGEST"},
                     &digest);
  (void)run({"/usr/bin/redis-cli", "-p", std::to_string(port), "SHUTDOWN", "NOSAVE"}, nullptr);
  WaitProgram(&*server, m, &o);
  if (!good && o.error.empty()) o.error = "loader, redis-benchmark or DEBUG DIGEST failed";
  o.ok = o.ok && good;
  size_t v = loaded.find("kv-loader: verified");
  o.identity = (v == std::string::npos ? std::string() : loaded.substr(v)) + digest;
  return o;
}

void WriteSortInput(const std::string& path, int lines) {
  FILE* f = std::fopen(path.c_str(), "w");
  uint64_t x = 88172645463325252ull;
  for (int i = 0; i < lines; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::fprintf(f, "%016llx %d the quick brown fox %llu\n", static_cast<unsigned long long>(x),
                 i, static_cast<unsigned long long>(x % 100000));
  }
  std::fclose(f);
}

// Whether `tessera run` accepts --layout (the group layout may not be built into this tree).
bool RunHasLayout(const std::string& bin) {
  auto p = Subprocess::Start({bin + "/tessera-run", "--help"}, Subprocess::Options{true, true, {}});
  if (!p.ok()) return false;
  bool found = false;
  for (;;) {
    auto line = p->ReadLine(Deadline::AfterMs(10000));
    if (!line.ok()) break;
    if (line->find("-layout") != std::string::npos) found = true;
  }
  (void)p->Wait(Deadline::AfterMs(10000));
  return found;
}

int Main(int argc, char** argv) {
  cli::InitCli(kSpec, &argc, &argv);
  if (FLAGS_quick) {
    FLAGS_runs = 1;
    FLAGS_workload_records = std::min(FLAGS_workload_records, 60000);
    FLAGS_sort_lines = std::min(FLAGS_sort_lines, 150000);
    FLAGS_redis_keys = std::min(FLAGS_redis_keys, 20000);
    FLAGS_redis_requests = std::min(FLAGS_redis_requests, 10000);
    if (gflags::GetCommandLineFlagInfoOrDie("local_memory").is_default) FLAGS_local_memory = "50%";
    if (gflags::GetCommandLineFlagInfoOrDie("programs").is_default) FLAGS_programs = "workload,sort";
    if (gflags::GetCommandLineFlagInfoOrDie("layouts").is_default) {
      FLAGS_layouts = std::string(client::EcLayoutName(client::ErasureCodedStoreOptions{}.layout));
    }
  }
  if (FLAGS_runs < 1 || FLAGS_runs > 20) cli::UsageError(kSpec, "--runs must be in [1, 20]");
  if (FLAGS_timeout_s < 10) cli::UsageError(kSpec, "--timeout_s must be at least 10");
  if (FLAGS_workload_records < 1000 || FLAGS_sort_lines < 1000 || FLAGS_redis_keys < 100 ||
      FLAGS_redis_requests < 100) {
    cli::UsageError(kSpec, "--workload_records, --sort_lines >= 1000; --redis_keys, "
                           "--redis_requests >= 100");
  }
  std::vector<std::string> programs = Split(FLAGS_programs);
  for (const auto& p : programs) {
    if (p != "workload" && p != "sort" && p != "redis") {
      cli::UsageError(kSpec, "--programs: unknown program '" + p + "'");
    }
  }
  std::vector<double> fractions;
  for (const auto& s : Split(FLAGS_local_memory)) {
    char* end = nullptr;
    double v = std::strtod(s.c_str(), &end);
    if (end == s.c_str() || std::string(end) != "%" || !(v > 0 && v < 100)) {
      cli::UsageError(kSpec, "--local_memory: '" + s + "' is not a share in (0%, 100%)");
    }
    fractions.push_back(v / 100);
  }
  std::vector<std::string> layouts = Split(FLAGS_layouts);
  for (const auto& l : layouts) {
    if (l != "split" && l != "group") cli::UsageError(kSpec, "--layouts: unknown layout '" + l + "'");
  }
  if (programs.empty() || fractions.empty() || layouts.empty()) {
    cli::UsageError(kSpec, "--programs, --local_memory and --layouts must not be empty");
  }
  for (const char* f : {"/workload.py", "/kv_loader.py"}) {
    if (::access((FLAGS_scripts_dir + f).c_str(), R_OK) != 0) {
      std::fprintf(stderr, "tessera bench programs: %s%s is missing (--scripts_dir)\n",
                   FLAGS_scripts_dir.c_str(), f);
      return 1;
    }
  }
  for (const char* tool : {kPython, "/usr/bin/sort", "/usr/bin/redis-server",
                           "/usr/bin/redis-benchmark", "/usr/bin/redis-cli"}) {
    const bool needed = std::string(tool) == kPython ||
                        (std::string(tool) == "/usr/bin/sort" &&
                         std::count(programs.begin(), programs.end(), "sort")) ||
                        (std::string(tool).find("redis") != std::string::npos &&
                         std::count(programs.begin(), programs.end(), "redis"));
    if (needed && ::access(tool, X_OK) != 0) {
      std::fprintf(stderr, "tessera bench programs: %s is not installed (scripts/setup.sh)\n",
                   tool);
      return 1;
    }
  }

  Env env;
  env.bin = SelfExeDir();
  if (::access((env.bin + "/tessera-run").c_str(), X_OK) != 0) {
    std::fprintf(stderr, "tessera bench programs: %s/tessera-run is not built\n", env.bin.c_str());
    return 1;
  }
  env.run_has_layout = RunHasLayout(env.bin);
  if (!env.run_has_layout) {
    for (const auto& l : layouts) {
      if (l != "split") {
        std::fprintf(stderr,
                     "tessera bench programs: this `tessera run` has no --layout flag: only the "
                     "split layout can be measured\n");
        return 2;
      }
    }
  }
  char tmpl[] = "/tmp/tessera-bench-programs-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) {
    std::perror("mkdtemp");
    return 1;
  }
  env.tmp = tmpl;
  struct RmTmp {
    std::string dir;
    ~RmTmp() {
      std::string cmd = "rm -rf '" + dir + "'";
      (void)!std::system(cmd.c_str());
    }
  } rm_tmp{env.tmp};

  std::fprintf(stderr, "tessera bench programs: starting %d memservers...\n",
               FLAGS_k + 2 * FLAGS_r);
  client::LocalClusterOptions lo;
  lo.bin_dir = env.bin;
  lo.servers = static_cast<size_t>(FLAGS_k + 2 * FLAGS_r);
  lo.capacity = "4G";  // Virtual until used; slabs of finished runs are freed by their lease.
  lo.slab_size = "1M";
  lo.extra_flags = {"--orphan_grace=2s"};
  auto cluster = client::LocalCluster::Start(lo);
  if (!cluster.ok()) {
    std::fprintf(stderr, "tessera bench programs: %s\n", cluster.status().ToString().c_str());
    return 1;
  }
  env.cluster = cluster->get();

  const std::string sort_input = env.tmp + "/sort-input";
  if (std::count(programs.begin(), programs.end(), "sort")) {
    WriteSortInput(sort_input, FLAGS_sort_lines);
  }
  auto run_one = [&](const std::string& prog, const Mode& m) {
    if (prog == "workload") return RunWorkload(&env, m);
    if (prog == "sort") return RunSort(&env, m, sort_input);
    return RunRedis(&env, m);
  };

  // Local runs first: their peak RSS sizes the swap cgroup limits and the swapfile.
  struct Series {
    std::vector<double> secs;
    bool identical = true;
    int failures = 0, ooms = 0;
    std::string error;
    uint64_t peak_rss = 0;
  };
  std::map<std::string, Series> local;
  std::map<std::string, std::string> want;
  for (const auto& prog : programs) {
    std::fprintf(stderr, "%s: local", prog.c_str());
    Series& s = local[prog];
    for (int i = 0; i < FLAGS_runs; ++i) {
      Outcome o = run_one(prog, Mode{});
      if (!o.ok) {
        std::fprintf(stderr, "\ntessera bench programs: the local %s run failed: %s\n",
                     prog.c_str(), o.error.c_str());
        return 1;
      }
      if (want.count(prog) && want[prog] != o.identity) {
        std::fprintf(stderr, "\ntessera bench programs: two local %s runs disagree\n",
                     prog.c_str());
        return 1;
      }
      want[prog] = o.identity;
      s.secs.push_back(o.secs);
      s.peak_rss = std::max(s.peak_rss, o.peak_rss);
      std::fprintf(stderr, " %.2fs", o.secs);
    }
    std::fprintf(stderr, " (peak RSS %.0f MB)\n", s.peak_rss / 1e6);
  }

  bool have_swap = false;
  std::string swap_why;
  if (FLAGS_swap) {
    uint64_t biggest = 0;
    for (auto& [p, s] : local) biggest = std::max(biggest, s.peak_rss);
    Status st = g_swap.Setup(FLAGS_swap_dir, "tessera-bench-programs", 2 * biggest + (256ull << 20));
    if (st.ok()) {
      have_swap = true;
    } else {
      swap_why = st.ToString();
      std::fprintf(stderr, "tessera bench programs: Linux swap column skipped: %s\n",
                   swap_why.c_str());
      g_swap.Teardown();
    }
  } else {
    swap_why = "--noswap";
  }

  std::map<std::string, Series> paged, swapped;  // key: prog/pct[/layout]
  for (const auto& prog : programs) {
    for (double f : fractions) {
      for (const auto& layout : layouts) {
        const std::string key = prog + "/" + Pct(f) + "/" + layout;
        std::fprintf(stderr, "%s: tessera run %s %s", prog.c_str(), Pct(f).c_str(),
                     layout.c_str());
        Series& s = paged[key];
        for (int i = 0; i < FLAGS_runs; ++i) {
          Mode m;
          m.kind = Mode::kTessera;
          m.fraction = f;
          m.layout = layout;
          Outcome o = run_one(prog, m);
          if (!o.ok) {
            s.failures++;
            s.error = o.error;
            std::fprintf(stderr, " failed (%s)", o.error.c_str());
            continue;
          }
          if (o.identity != want[prog]) s.identical = false;
          s.secs.push_back(o.secs);
          std::fprintf(stderr, " %.2fs", o.secs);
        }
        std::fprintf(stderr, "\n");
      }
      if (!have_swap) continue;
      const std::string key = prog + "/" + Pct(f);
      Series& s = swapped[key];
      Mode m;
      m.kind = Mode::kSwap;
      m.limit_bytes = static_cast<uint64_t>(f * static_cast<double>(local[prog].peak_rss));
      std::fprintf(stderr, "%s: swap at %s (limit %.0f MB)", prog.c_str(), Pct(f).c_str(),
                   m.limit_bytes / 1e6);
      if (Status lim = g_swap.SetLimit(m.limit_bytes); !lim.ok()) {
        s.failures = FLAGS_runs;
        s.error = lim.ToString();
        std::fprintf(stderr, " %s\n", s.error.c_str());
        continue;
      }
      for (int i = 0; i < FLAGS_runs; ++i) {
        Outcome o = run_one(prog, m);
        if (!o.ok) {
          s.failures++;
          s.ooms += o.oom ? 1 : 0;
          s.error = o.error;
          std::fprintf(stderr, " failed (%s)", o.error.c_str());
          if (o.oom) break;  // The limit will not change: the next runs die the same way.
          continue;
        }
        if (o.identity != want[prog]) s.identical = false;
        s.secs.push_back(o.secs);
        std::fprintf(stderr, " %.2fs", o.secs);
      }
      std::fprintf(stderr, "\n");
    }
  }
  g_swap.Teardown();

  Report report(FLAGS_json);
  report.Title("tessera bench programs: completion time (s), median of " +
               std::to_string(FLAGS_runs) + " runs; RS(" + std::to_string(FLAGS_k) + "," +
               std::to_string(FLAGS_r) + ") on " + std::to_string(FLAGS_k + 2 * FLAGS_r) +
               " local memservers; swap = cgroup-v1 limit of the share of the local peak RSS" +
               (have_swap ? "" : " (not run: " + swap_why + ")"));
  struct Verdict {
    std::string target, measured;
    bool pass;
  };
  std::vector<Verdict> verdicts;
  bool all_identical = true;
  for (const auto& prog : programs) {
    const double local_s = Median(local[prog].secs);
    for (double f : fractions) {
      for (const auto& layout : layouts) {
        const Series& s = paged[prog + "/" + Pct(f) + "/" + layout];
        auto sw = swapped.find(prog + "/" + Pct(f));
        // A swap cell with an OOM-killed run reports no time (null), never the survivors'.
        const bool swap_ok = sw != swapped.end() && !sw->second.secs.empty() &&
                             sw->second.identical && sw->second.ooms == 0;
        const bool ok = !s.secs.empty();
        const double tessera_s = ok ? Median(s.secs) : 0.0;
        const bool identical = ok && s.identical && s.failures == 0 &&
                               (sw == swapped.end() || sw->second.identical);
        all_identical = all_identical && identical;
        Report::Row row;
        nlohmann::json j;
        j["suite"] = "programs";
        j["program"] = prog;
        j["local_memory"] = Pct(f);
        j["layout"] = layout;
        j["local_s"] = local_s;
        j["tessera_s"] = ok ? nlohmann::json(tessera_s) : nlohmann::json(nullptr);
        j["swap_s"] = swap_ok ? nlohmann::json(Median(sw->second.secs)) : nlohmann::json(nullptr);
        j["ratio"] = ok ? nlohmann::json(tessera_s / local_s) : nlohmann::json(nullptr);
        j["identical"] = identical;
        j["runs"] = FLAGS_runs;
        row.Set("suite", "programs").Set("program", prog).Set("local_memory", Pct(f))
            .Set("layout", layout).Set("local_s", local_s);
        if (ok) row.Set("tessera_s", tessera_s); else row.Set("tessera_s", "error");
        if (swap_ok) row.Set("swap_s", Median(sw->second.secs)); else row.Set("swap_s", "-");
        if (ok) row.Set("ratio", tessera_s / local_s); else row.Set("ratio", "-");
        row.Set("identical", identical ? "yes" : "NO");
        if (swap_ok && ok) {
          row.Set("tessera_over_swap", tessera_s / Median(sw->second.secs));
          j["tessera_over_swap"] = tessera_s / Median(sw->second.secs);
        }
        std::string note;
        if (s.failures) note += "tessera: " + std::to_string(s.failures) + " failed (" + s.error + ") ";
        if (!have_swap) {
          note += "swap: not run";
        } else if (sw != swapped.end() && sw->second.ooms) {
          note += "swap: OOM-killed";
        } else if (sw != swapped.end() && sw->second.failures) {
          note += "swap: failed (" + sw->second.error + ")";
        }
        row.Set("note", note.empty() ? "-" : note);
        j["note"] = note;
        if (FLAGS_json) {
          std::printf("%s\n", j.dump().c_str());
        } else {
          report.Add(std::move(row));
        }
        if (f == 0.5 && ok) {
          const double bound = prog == "workload" ? 2.0 : 3.0;
          char fig[200];
          std::snprintf(fig, sizeof fig, "%.2f s vs %.2f s local (x%.2f)", tessera_s, local_s,
                        tessera_s / local_s);
          verdicts.push_back({prog + " (" + layout + ") at 50% local <= " +
                                  (bound == 2.0 ? std::string("2x") : std::string("3x")) +
                                  " its local time",
                              fig, tessera_s / local_s <= bound});
        }
      }
    }
  }
  report.Flush();
  report.Title("targets");
  verdicts.push_back({"every run's output identical to the local run's",
                      all_identical ? "all identical" : "a run differed or failed",
                      all_identical});
  for (const auto& v : verdicts) {
    if (FLAGS_json) {
      nlohmann::json j = {{"suite", "programs-targets"}, {"target", v.target},
                          {"measured", v.measured}, {"verdict", v.pass ? "PASS" : "MISS"}};
      std::printf("%s\n", j.dump().c_str());
    } else {
      report.Add(Report::Row().Set("suite", "programs-targets").Set("target", v.target)
                     .Set("measured", v.measured).Set("verdict", v.pass ? "PASS" : "MISS"));
    }
  }
  report.Flush();
  return all_identical ? 0 : 1;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) { return tessera::Main(argc, argv); }
