// The programs `tessera bench programs` runs, and how one run of a program is started (plainly,
// under `tessera run`, or inside a memory cgroup for kernel swap), waited for and checked.
//
// Each program is one entry of All(): the tools and scripts it needs, the input it writes once,
// and a run that returns its time and its identity (what must equal the local run's: a digest
// line it prints, or the bytes of the file it writes).
#pragma once

#include <csignal>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "client/local_cluster.h"
#include "common/status.h"

namespace tessera::bench::programs {

// Input sizes (flags of the bench).
struct Sizes {
  int workload_records = 400000;
  int sort_lines = 400000;
  int redis_keys = 200000;
  int redis_requests = 100000;
  int sqlite_rows = 1200000;
  int hashtable_keys = 1200000;
  int compress_mb = 96;
  int node_entries = 1000000;
};

struct Env {
  std::string bin;          // The directory of tessera-run and the memserver.
  std::string tmp;          // Inputs and outputs (removed by the bench).
  std::string scripts_dir;  // workload.py, kv_loader.py, hashtable.py, map_workload.js.
  client::LocalCluster* cluster = nullptr;
  bool run_has_layout = false;
  int k = 4, r = 2;
  int timeout_s = 900;  // Bound on each run.
  Sizes sizes;
  const volatile std::sig_atomic_t* stop = nullptr;  // Set: kill the running program.
  int seq = 0;
};

// How a program is started: plainly, under `tessera run`, or inside a memory cgroup (kernel swap).
struct Mode {
  enum Kind { kLocal, kTessera, kSwap } kind = kLocal;
  double fraction = 1.0;     // kTessera: --local-memory.
  std::string layout;        // kTessera.
  std::string tier = "off";  // kTessera: --compressed_tier.
  std::string cgroup;        // kSwap: the memory cgroup's directory.
  int timeout_s = 0;         // 0: Env::timeout_s.
};

struct Outcome {
  bool ok = false;
  double secs = 0;
  std::string identity;   // What must equal the local run's.
  uint64_t peak_rss = 0;  // Bytes (VmHWM of the program's process).
  bool oom = false;       // Killed by SIGKILL under the swap cgroup (the OOM killer).
  bool timeout = false;   // Killed after the time bound.
  std::string error;
  nlohmann::json stats;  // kTessera: the run's --stats_json (null if it wrote none).
};

struct Program {
  std::string_view name;
  std::string_view what;                  // One line for --help and the docs.
  std::vector<std::string_view> tools;    // Executables it needs.
  std::vector<std::string_view> scripts;  // Files it needs under Env::scripts_dir.
  // The target "at 50% local memory within this many times its local time"; 0: none (the
  // targets against swap on zram apply to every program).
  double local_bound = 0;
  Status (*prepare)(Env*) = nullptr;  // Writes its input once, before the first run.
  Outcome (*run)(Env*, const Mode&) = nullptr;
};

// Every program, in the order the bench runs them.
const std::vector<Program>& All();
// nullptr if there is none of that name.
const Program* Find(std::string_view name);
// "workload, sort, ...": the names, for messages.
std::string Names();

// "50%".
std::string Pct(double f);
// The --stats_json of the `tessera run` the last run under `m` wrote, if any (removed).
nlohmann::json TakeRunStats(Env* env, const Mode& m);

}  // namespace tessera::bench::programs
