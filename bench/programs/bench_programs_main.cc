// tessera bench programs: real, unmodified programs locally, under `tessera run` and under Linux
// swap at the same local-memory limit, in one run.
//
// Programs (bench/programs/programs.cc): the README demo's python3 workload, GNU sort with a
// large in-memory buffer, redis-server under redis-benchmark, SQLite building an index on an
// in-memory table, a python3 dict of string keys with random lookups, zstd with a large window
// and match tables, and node building a Map. Each runs locally (its peak RSS is measured), under
// `tessera run --local-memory P%` (the uffd pager) on a shared embedded cluster of k+2r
// memservers, and, when this machine allows it (root, cgroup-v1), under kernel swap in a
// cgroup-v1 memory limit of P% of the local peak RSS, one swap device at a time
// (bench/support/kernel_swap.h): a swapfile on local disk, zram (compressed, in RAM), nbdkit's
// memory plugin reached through nbdfuse and a loop device (remote RAM without resilience, the
// way it is done without Tessera on a kernel with no nbd module), and `tessera swap` on the
// same cluster. Every run's output must equal the local run's (a digest the program prints, or
// the file it writes). A kernel-swap run the kernel OOM-kills is reported as "oom-killed",
// never as a time; it is then run once more with the cgroup's OOM killer disabled
// (memory.oom_control), bounded by --oom_rerun_timeout_s, to say whether it completes at all.
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
#include "bench/support/kernel_swap.h"
#include "client/local_cluster.h"
#include "client/remote_store.h"
#include "common/clock.h"
#include "common/report.h"
#include "common/subprocess.h"
#include "common/units.h"
#include "fabric/connect.h"
#include "kernel_shim/swap/memory_cgroup.h"
#include "bench/programs/programs.h"

DEFINE_bool(quick, false,
            "Small inputs, one run, 50% only, workload and sort only (CI smoke test, ~1 min)");
DEFINE_bool(json, false, "JSON lines instead of tables");
DEFINE_int32(runs, 3, "Runs per configuration (medians are reported)");
DEFINE_string(programs, "workload,sort,redis,sqlite,hashtable,node",
              "Comma-separated: workload, sort, redis, sqlite, hashtable, node, compress (not by "
              "default: at 50% local memory its random walks over its match tables fault on "
              "about every other access, far past --timeout_s)");
DEFINE_string(local_memory, "75%,50%", "Comma-separated local-memory shares to run at");
DEFINE_string(layouts, "split,group",
              "Comma-separated erasure-coded layouts for `tessera run --layout` (--quick: the "
              "store's default only)");
DEFINE_string(compressed_tier, "off,auto",
              "Comma-separated `tessera run --compressed-tier` settings to run each layout with "
              "(off, auto or a size)");
DEFINE_int32(k, 4, "`tessera run` --k");
DEFINE_int32(r, 2, "`tessera run` --r");
DEFINE_bool(swap, true, "Compare with kernel swap in a cgroup-v1 memory limit (--kernel_peers)");
DEFINE_string(kernel_peers, "swapfile,zram,nbd,tessera_swap",
              "Comma-separated kernel-swap peers: swapfile, zram, nbd (nbdkit memory over "
              "nbdfuse + loop), tessera_swap");
DEFINE_string(swap_dir, "/var/tmp", "Directory of the temporary swapfile (local disk)");
DEFINE_bool(oom_rerun, true,
            "Run an OOM-killed kernel-swap peer once more with the cgroup's OOM killer disabled");
DEFINE_int32(oom_rerun_timeout_s, 300, "Bound on each OOM-killer-disabled rerun");
DEFINE_int32(timeout_s, 900, "Bound on each run (a run past it is killed and reported failed)");
DEFINE_string(scripts_dir, "",
              "Directory holding workload.py, kv_loader.py, hashtable.py and map_workload.js "
              "(default: share/tessera/workloads beside the executables, as built or installed)");
DEFINE_int32(workload_records, 400000, "workload.py RECORDS (400000: ~150 MB in CPython)");
DEFINE_int32(sort_lines, 400000, "Lines of the generated sort input (400000: ~23 MB)");
DEFINE_int32(redis_keys, 200000, "Keys kv_loader.py stores in redis (values of 200 bytes)");
DEFINE_int32(redis_requests, 100000, "redis-benchmark -n");
DEFINE_int32(sqlite_rows, 1200000, "Rows of the sqlite program's table (1200000: ~290 MB)");
DEFINE_int32(hashtable_keys, 1200000, "Keys of the hashtable program's dict (1200000: ~320 MB)");
DEFINE_int32(compress_mb, 96, "MiB of generated text the compress program compresses (~380 MB)");
DEFINE_int32(node_entries, 1000000, "Entries of the node program's Map (1000000: ~400 MB)");

namespace tessera {
namespace {

namespace bp = bench::programs;
using bp::Env;
using bp::Mode;
using bp::Outcome;
using bp::Pct;

const cli::CliSpec kSpec{
    "tessera bench programs",
    "[--quick] [--json] [--runs R] [--programs workload,sort,redis,sqlite,hashtable,compress,node] "
    "[--local_memory 75%,50%] "
    "[--layouts split] [--noswap] [--kernel_peers swapfile,zram,nbd,tessera_swap] [--nooom_rerun]",
    "Completion time of real unmodified programs (the demo's python3 workload, GNU sort, redis "
    "under redis-benchmark, SQLite building an index, a python3 hash table, zstd, node) locally, under `tessera run` at each --local_memory share and per "
    "layout, and under kernel swap (swapfile, zram, nbdkit memory via nbdfuse, tessera swap) "
    "with a cgroup-v1 memory limit of the same share of the local peak RSS; every run's output "
    "must equal the local run's.",
    __FILE__,
    0,
    0};

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string x; std::getline(ss, x, ',');) {
    if (!x.empty()) out.push_back(x);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// SIGINT/SIGTERM/SIGHUP: the running program is killed and the bench unwinds, so every swap
// device, cgroup and temporary file is removed by its owner on the way out.

volatile sig_atomic_t g_stop = 0;
void OnStopSignal(int) { g_stop = 1; }

// ---------------------------------------------------------------------------------------------
// Running one program.

// `tessera run` stats reported per row (medians over the runs): faults, faults served from the
// compressed tier, pages read from / written to the memservers, the local budget at exit
// (limit_pages, tier included) beside the peak resident set, and the fault latency p50/p99.
constexpr const char* kRunCounters[] = {"faults",      "tier_hits",   "store_reads",
                                        "store_writes", "limit_pages", "peak_resident_pages",
                                        "tier_charged_bytes", "elapsed_ns", "fault_p50_ns",
                                        "fault_p99_ns"};

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
      FLAGS_redis_requests < 100 || FLAGS_sqlite_rows < 1000 || FLAGS_hashtable_keys < 1000 ||
      FLAGS_compress_mb < 1 || FLAGS_node_entries < 1000) {
    cli::UsageError(kSpec, "--workload_records, --sort_lines, --sqlite_rows, --hashtable_keys, "
                           "--node_entries >= 1000; --redis_keys, --redis_requests >= 100; "
                           "--compress_mb >= 1");
  }
  std::vector<std::string> programs = Split(FLAGS_programs);
  for (const auto& p : programs) {
    if (bp::Find(p) == nullptr) {
      cli::UsageError(kSpec, "--programs: unknown program '" + p + "' (known: " +
                                 bp::Names() + ")");
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
  std::vector<std::string> tiers = Split(FLAGS_compressed_tier);
  for (const auto& t : tiers) {
    if (t != "off" && t != "auto" && !ParseSize(t).ok()) {
      cli::UsageError(kSpec, "--compressed_tier: '" + t + "' is not off, auto or a size");
    }
  }
  if (tiers.empty()) cli::UsageError(kSpec, "--compressed_tier must not be empty");
  std::vector<std::string> layouts = Split(FLAGS_layouts);
  for (const auto& l : layouts) {
    if (l != "split" && l != "group") cli::UsageError(kSpec, "--layouts: unknown layout '" + l + "'");
  }
  if (programs.empty() || fractions.empty() || layouts.empty()) {
    cli::UsageError(kSpec, "--programs, --local_memory and --layouts must not be empty");
  }
  // What the chosen programs need, checked before anything is set up.
  if (FLAGS_scripts_dir.empty()) FLAGS_scripts_dir = DataPath("workloads");
  if (FLAGS_scripts_dir.empty()) {
    std::fprintf(stderr, "tessera bench programs: no share/tessera/workloads beside %s (an "
                         "incomplete installation?); give --scripts_dir\n", SelfExeDir().c_str());
    return 1;
  }
  for (const auto& name : programs) {
    const bp::Program& p = *bp::Find(name);
    for (std::string_view f : p.scripts) {
      const std::string path = FLAGS_scripts_dir + "/" + std::string(f);
      if (::access(path.c_str(), R_OK) != 0) {
        std::fprintf(stderr, "tessera bench programs: %s is missing (--scripts_dir)\n",
                     path.c_str());
        return 1;
      }
    }
    for (std::string_view tool : p.tools) {
      if (::access(std::string(tool).c_str(), X_OK) != 0) {
        std::fprintf(stderr,
                     "tessera bench programs: %s (for %s) is not installed (scripts/setup.sh)\n",
                     std::string(tool).c_str(), name.c_str());
        return 1;
      }
    }
  }

  Env env;
  env.bin = SelfExeDir();
  env.scripts_dir = FLAGS_scripts_dir;
  env.k = FLAGS_k;
  env.r = FLAGS_r;
  env.timeout_s = FLAGS_timeout_s;
  env.stop = &g_stop;
  env.sizes = {FLAGS_workload_records, FLAGS_sort_lines, FLAGS_redis_keys, FLAGS_redis_requests,
               FLAGS_sqlite_rows,      FLAGS_hashtable_keys, FLAGS_compress_mb,
               FLAGS_node_entries};
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

  for (const auto& name : programs) {
    const bp::Program& p = *bp::Find(name);
    if (p.prepare == nullptr) continue;
    if (Status st = p.prepare(&env); !st.ok()) {
      std::fprintf(stderr, "tessera bench programs: %s's input: %s\n", name.c_str(),
                   st.ToString().c_str());
      return 1;
    }
  }
  auto run_one = [&](const std::string& prog, const Mode& m) {
    Outcome o = bp::Find(prog)->run(&env, m);
    o.stats = bp::TakeRunStats(&env, m);
    return o;
  };

  // Local runs first: their peak RSS sizes the swap cgroup limits and the swapfile.
  struct Series {
    std::vector<double> secs;
    bool identical = true;
    int failures = 0, ooms = 0;
    std::string error;
    uint64_t peak_rss = 0;
    std::map<std::string, std::vector<double>> counters;  // `tessera run` stats, per run.
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

  // Kernel-swap peers: checked up front (root, cgroup v1 with swap accounting).
  std::vector<bench::KernelSwapKind> peers;
  std::string swap_why;
  if (FLAGS_swap) {
    for (const auto& name : Split(FLAGS_kernel_peers)) {
      if (name == "swapfile")
        peers.push_back(bench::KernelSwapKind::kSwapfile);
      else if (name == "zram")
        peers.push_back(bench::KernelSwapKind::kZram);
      else if (name == "nbd")
        peers.push_back(bench::KernelSwapKind::kNbd);
      else if (name == "tessera_swap")
        peers.push_back(bench::KernelSwapKind::kTesseraSwap);
      else
        cli::UsageError(kSpec, "--kernel_peers: unknown peer '" + name + "'");
    }
    if (Status st = kernel_shim::MemoryCgroup::CheckSupported(); !st.ok()) {
      swap_why = st.message();
      std::fprintf(stderr, "tessera bench programs: kernel-swap peers skipped: %s\n",
                   swap_why.c_str());
      peers.clear();
    }
  } else {
    swap_why = "--noswap";
  }
  struct sigaction stop_sa {};
  stop_sa.sa_handler = OnStopSignal;
  sigemptyset(&stop_sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaction(sig, &stop_sa, nullptr);

  // One kernel-swap peer at one share: its runs and why it has no time.
  struct PeerResult {
    std::vector<double> secs;
    bool identical = true;
    std::string status = "not run";  // ok, oom-killed, timeout, unsupported, failed
    std::string why;
    uint64_t footprint = 0;  // zram: the cgroup's peak + the device's RAM (mm_stat mem_used_max)
    std::string oom_disabled_status;  // After "oom-killed": ok, timeout, failed
    double oom_disabled_secs = 0;
  };
  std::map<std::string, Series> paged;                              // key: prog/pct/layout
  std::map<std::string, std::map<std::string, PeerResult>> kernel;  // prog/pct -> peer
  for (const auto& prog : programs) {
    for (double f : fractions) {
      for (const auto& layout : layouts) for (const auto& tier : tiers) {
        if (g_stop) break;
        const std::string key = prog + "/" + Pct(f) + "/" + layout + "/" + tier;
        std::fprintf(stderr, "%s: tessera run %s %s tier %s", prog.c_str(), Pct(f).c_str(),
                     layout.c_str(), tier.c_str());
        Series& s = paged[key];
        for (int i = 0; i < FLAGS_runs && !g_stop; ++i) {
          Mode m;
          m.kind = Mode::kTessera;
          m.fraction = f;
          m.layout = layout;
          m.tier = tier;
          Outcome o = run_one(prog, m);
          for (const char* c : kRunCounters) {
            if (o.stats.is_object() && o.stats.contains(c)) {
              s.counters[c].push_back(o.stats[c].get<double>());
            }
          }
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
      const uint64_t limit =
          static_cast<uint64_t>(f * static_cast<double>(local[prog].peak_rss)) & ~4095ull;
      for (bench::KernelSwapKind kind : peers) {
        if (g_stop) break;
        const std::string peer = bench::KernelSwapKindName(kind);
        PeerResult& pr = kernel[prog + "/" + Pct(f)][peer];
        std::fprintf(stderr, "%s: %s at %s (limit %.0f MB)", prog.c_str(), peer.c_str(),
                     Pct(f).c_str(), limit / 1e6);
        bench::KernelSwapOptions ko;
        ko.kind = kind;
        ko.bytes = (2 * local[prog].peak_rss + (256ull << 20)) & ~4095ull;
        ko.swap_dir = FLAGS_swap_dir;
        ko.work_dir = env.tmp;
        ko.bin_dir = env.bin;
        ko.name = "bench-programs-" + std::to_string(::getpid());
        ko.tessera_flags = {"--cluster",
                            env.cluster->cluster_file_path(),
                            "--auth_token_file",
                            env.cluster->token_path(),
                            "--k",
                            std::to_string(FLAGS_k),
                            "--r",
                            std::to_string(FLAGS_r)};
        if (env.run_has_layout && !layouts.empty()) {
          ko.tessera_flags.insert(ko.tessera_flags.end(), {"--layout", layouts.front()});
        }
        auto dev = bench::KernelSwapDevice::Start(ko);
        if (!dev.ok()) {
          pr.status = dev.status().code() == StatusCode::kUnsupported ? "unsupported" : "failed";
          pr.why = dev.status().ToString();
          std::fprintf(stderr, " %s: %s\n", pr.status.c_str(), pr.why.c_str());
          continue;
        }
        auto cg = kernel_shim::MemoryCgroup::Create("tessera-bench-programs-" +
                                                    std::to_string(::getpid()) + "-" + peer);
        Status lim = cg.ok() ? (*cg)->SetLimit(limit) : cg.status();
        if (!lim.ok()) {
          pr.status = "failed";
          pr.why = lim.ToString();
          std::fprintf(stderr, " failed: %s\n", pr.why.c_str());
          continue;
        }
        Mode m;
        m.kind = Mode::kSwap;
        m.cgroup = (*cg)->path();
        bool oom = false;
        for (int i = 0; i < FLAGS_runs && !g_stop; ++i) {
          (void)(*cg)->ResetPeak();
          (*dev)->ResetZramPeak();
          const uint64_t ooms_before = (*cg)->Stats().oom_kills;
          Outcome o = run_one(prog, m);
          const kernel_shim::MemoryCgroupStats cs = (*cg)->Stats();
          pr.footprint = std::max(pr.footprint, cs.max_usage + (*dev)->ZramPeakBytes());
          if (!o.ok) {
            oom = cs.oom_kills > ooms_before;
            pr.status = oom ? "oom-killed" : o.timeout ? "timeout" : "failed";
            pr.why = o.error;
            std::fprintf(stderr, " %s", oom ? "OOM-killed" : ("failed (" + o.error + ")").c_str());
            if (oom || o.timeout) break;  // The next runs would end the same way.
            continue;
          }
          if (o.identity != want[prog]) pr.identical = false;
          pr.secs.push_back(o.secs);
          std::fprintf(stderr, " %.2fs", o.secs);
        }
        if (!pr.secs.empty() && pr.status == "not run") pr.status = "ok";
        if (pr.status == "ok" && !pr.identical) pr.status = "failed";
        if (oom && FLAGS_oom_rerun && !g_stop) {
          // Once more with the OOM killer off: the program waits for memory instead of dying.
          Status off = (*cg)->SetOomKillDisable(true);
          if (off.ok()) {
            m.timeout_s = FLAGS_oom_rerun_timeout_s;
            Outcome o = run_one(prog, m);
            pr.oom_disabled_status = o.ok        ? (o.identity == want[prog] ? "ok" : "differs")
                                     : o.timeout ? "timeout"
                                                 : "failed";
            pr.oom_disabled_secs = o.secs;
            std::fprintf(stderr, "; OOM killer off: %s after %.2fs", pr.oom_disabled_status.c_str(),
                         o.secs);
          } else {
            pr.oom_disabled_status = "unsupported";
          }
        }
        std::fprintf(stderr, "\n");
        Status rm = (*cg)->Remove();
        Status st = (*dev)->Stop();
        if (!rm.ok() || !st.ok()) {
          std::fprintf(stderr, "tessera bench programs: tearing down %s: %s %s\n", peer.c_str(),
                       rm.ToString().c_str(), st.ToString().c_str());
        }
      }
    }
  }
  if (g_stop) {
    std::fprintf(stderr, "tessera bench programs: interrupted; everything it set up is removed\n");
    return 130;
  }

  Report report(FLAGS_json);
  report.Title("tessera bench programs: completion time (s), median of " +
               std::to_string(FLAGS_runs) + " runs; RS(" + std::to_string(FLAGS_k) + "," +
               std::to_string(FLAGS_r) + ") on " + std::to_string(FLAGS_k + 2 * FLAGS_r) +
               " local memservers; kernel swap peers in a cgroup-v1 limit of the share of the "
               "local peak RSS" +
               (peers.empty() ? " (not run: " + swap_why + ")" : ""));
  struct Verdict {
    std::string target, measured;
    bool pass;
  };
  std::vector<Verdict> verdicts;
  bool all_identical = true;
  // JSON key of each peer's time (and its _status).
  const std::map<std::string, std::string> kKey = {{"swapfile", "swap"},
                                                   {"zram", "zram"},
                                                   {"nbd", "nbd_swap"},
                                                   {"tessera_swap", "tessera_swap"}};
  for (const auto& prog : programs) {
    const double local_s = Median(local[prog].secs);
    for (double f : fractions) {
      auto& kp = kernel[prog + "/" + Pct(f)];
      auto peer_secs = [&](const std::string& peer) -> std::optional<double> {
        auto it = kp.find(peer);
        if (it == kp.end() || it->second.status != "ok") return std::nullopt;
        return Median(it->second.secs);
      };
      for (const auto& [peer, r] : kp) {
        all_identical = all_identical && r.identical;
      }
      for (const auto& layout : layouts) for (const auto& tier : tiers) {
        const Series& s = paged[prog + "/" + Pct(f) + "/" + layout + "/" + tier];
        const bool ok = !s.secs.empty();
        const double tessera_s = ok ? Median(s.secs) : 0.0;
        const bool identical = ok && s.identical && s.failures == 0;
        all_identical = all_identical && identical;
        Report::Row row;
        nlohmann::json j;
        j["suite"] = "programs";
        j["program"] = prog;
        j["local_memory"] = Pct(f);
        j["layout"] = layout;
        j["compressed_tier"] = tier;
        j["local_s"] = local_s;
        j["local_peak_rss"] = local[prog].peak_rss;
        j["tessera_s"] = ok ? nlohmann::json(tessera_s) : nlohmann::json(nullptr);
        // `tessera run --pager uffd` is what tessera_s measures (uffd is the default pager).
        j["uffd_s"] = j["tessera_s"];
        j["uffd_status"] = ok ? "ok" : "failed";
        j["ratio"] = ok ? nlohmann::json(tessera_s / local_s) : nlohmann::json(nullptr);
        row.Set("suite", "programs").Set("program", prog).Set("local_memory", Pct(f))
            .Set("layout", layout).Set("tier", tier).Set("local_s", local_s);
        if (ok)
          row.Set("uffd_s", tessera_s);
        else
          row.Set("uffd_s", "error");
        std::string note;
        if (s.failures)
          note += "uffd: " + std::to_string(s.failures) + " failed (" + s.error + ") ";
        for (const auto& [peer, key] : kKey) {
          auto it = kp.find(peer);
          const std::string status = it != kp.end()  ? it->second.status
                                     : peers.empty() ? "unsupported"
                                                     : "not run";
          auto t = peer_secs(peer);
          j[key + "_s"] = t ? nlohmann::json(*t) : nlohmann::json(nullptr);
          j[key + "_status"] = status;
          const std::string col = key == "swap" ? "swapfile_s" : key + "_s";
          if (t)
            row.Set(col, *t);
          else
            row.Set(col, status);
          if (it != kp.end() && !it->second.oom_disabled_status.empty()) {
            j[key + "_oom_disabled_status"] = it->second.oom_disabled_status;
            j[key + "_oom_disabled_s"] = it->second.oom_disabled_status == "ok"
                                             ? nlohmann::json(it->second.oom_disabled_secs)
                                             : nlohmann::json(nullptr);
            note += peer + " with the OOM killer off: " + it->second.oom_disabled_status +
                    (it->second.oom_disabled_status == "ok"
                         ? " in " + std::to_string(it->second.oom_disabled_secs).substr(0, 6) + " s"
                         : "") +
                    "; ";
          }
          if (it != kp.end() && (status == "failed" || status == "unsupported")) {
            note += peer + ": " + it->second.why + "; ";
          }
          if (peer == "zram" && it != kp.end() && it->second.footprint) {
            j["zram_footprint_bytes"] = it->second.footprint;
            row.Set("zram_footprint_MB", it->second.footprint / 1e6);
          }
        }
        if (peers.empty()) note += "kernel swap: not run (" + swap_why + ")";
        auto ts = peer_secs("tessera_swap");
        if (ts) {
          j["tessera_swap_over_nbd"] =
              peer_secs("nbd") ? nlohmann::json(*ts / *peer_secs("nbd")) : nlohmann::json(nullptr);
          j["tessera_swap_over_zram"] = peer_secs("zram") ? nlohmann::json(*ts / *peer_secs("zram"))
                                                          : nlohmann::json(nullptr);
        }
        // What `tessera run` did (medians over the runs), and its bytes to the memservers per
        // second of run time.
        auto counter = [&](const char* c) -> std::optional<double> {
          auto it = s.counters.find(c);
          if (it == s.counters.end() || it->second.empty()) return std::nullopt;
          return Median(it->second);
        };
        for (const char* c : {"faults", "tier_hits", "store_reads", "store_writes"}) {
          auto v = counter(c);
          j[c] = v ? nlohmann::json(static_cast<uint64_t>(*v)) : nlohmann::json(nullptr);
          if (v) row.Set(c, static_cast<uint64_t>(*v));
        }
        if (auto w = counter("store_writes"), e = counter("elapsed_ns"); w && e && *e > 0) {
          j["sent_MB_per_s"] = *w * 4096 / 1e6 / (*e / 1e9);
        }
        if (auto l = counter("limit_pages")) j["tessera_budget_bytes"] = *l * 4096;
        for (const char* c : {"fault_p50_ns", "fault_p99_ns"}) {
          if (auto v = counter(c)) {
            const std::string us = std::string(c).substr(0, 9) + "_us";  // fault_p50_us
            j[us] = *v / 1e3;
            row.Set(us, *v / 1e3);
          }
        }
        if (auto t = counter("tier_charged_bytes")) j["tier_bytes_at_exit"] = *t;
        if (auto z = peer_secs("zram"); z && ok) {
          j["over_zram"] = tessera_s / *z;
          row.Set("over_zram", tessera_s / *z);
        }
        row.Set("identical", identical ? "yes" : "NO");
        j["identical"] = identical;
        j["runs"] = FLAGS_runs;
        row.Set("note", note.empty() ? "-" : note);
        j["note"] = note;
        if (FLAGS_json) {
          std::printf("%s\n", j.dump().c_str());
        } else {
          report.Add(std::move(row));
        }
        if (f == 0.5 && ok) {
          const std::string what = prog + " (" + layout + ", tier " + tier + ")";
          const double bound = bp::Find(prog)->local_bound;
          char fig[200];
          std::snprintf(fig, sizeof fig, "%.2f s vs %.2f s local (x%.2f)", tessera_s, local_s,
                        tessera_s / local_s);
          if (bound > 0) {
            verdicts.push_back({what + " at 50% local <= " +
                                    std::to_string(static_cast<int>(bound)) + "x its local time",
                                fig, tessera_s / local_s <= bound});
          }
          // Against swap on zram: within 1.5x where zram completes; within 10x of the local
          // time where the kernel OOM-kills it.
          auto zr = kp.find("zram");
          if (auto z = peer_secs("zram")) {
            std::snprintf(fig, sizeof fig, "%.2f s vs %.2f s on zram (x%.2f)", tessera_s, *z,
                          tessera_s / *z);
            verdicts.push_back({what + " within 1.5x of swap on zram", fig,
                                tessera_s <= 1.5 * *z});
          } else if (zr != kp.end() && zr->second.status == "oom-killed") {
            std::snprintf(fig, sizeof fig, "zram OOM-killed; %.2f s (x%.2f local)", tessera_s,
                          tessera_s / local_s);
            verdicts.push_back({what + " completes within 10x local where zram is OOM-killed",
                                fig, tessera_s <= 10 * local_s});
          }
        }
      }
      if (f == 0.5 && kp.count("tessera_swap")) {
        const PeerResult& t = kp["tessera_swap"];
        verdicts.push_back({"tessera swap completes " + prog + " at 50% with identical output",
                            t.status + (t.identical ? "" : " (output differs)"),
                            t.status == "ok" && t.identical});
        auto ts = peer_secs("tessera_swap");
        if (ts && peer_secs("nbd")) {
          char fig[160];
          std::snprintf(fig, sizeof fig, "%.2f s vs %.2f s (x%.2f)", *ts, *peer_secs("nbd"),
                        *ts / *peer_secs("nbd"));
          verdicts.push_back({"tessera swap <= 0.5x kernel swap over nbdfuse (" + prog + ")", fig,
                              *ts <= 0.5 * *peer_secs("nbd")});
        }
        if (ts && peer_secs("zram")) {
          char fig[160];
          std::snprintf(fig, sizeof fig, "%.2f s vs %.2f s (x%.2f)", *ts, *peer_secs("zram"),
                        *ts / *peer_secs("zram"));
          verdicts.push_back({"tessera swap within 2x of swap on zram (" + prog + ")", fig,
                              *ts <= 2.0 * *peer_secs("zram")});
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
