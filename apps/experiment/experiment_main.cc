// `tessera experiment`: runs failure-injection experiments from scenario files.
//
//   tessera experiment run FILE.toml|NAME [--out DIR] [--quick]
//   tessera experiment list
//   tessera experiment show NAME
//   tessera experiment client SPEC.json   (the client process the runner starts, kills and
//                                          restarts for the fault target `client`)
//
// Exit codes: 0 every expectation holds, 1 one fails (or the experiment could not be carried
// out), 2 a bad scenario file or usage, 130 interrupted (cleanup done).
#include <gflags/gflags.h>
#include <signal.h>
#include <unistd.h>

#include <sys/stat.h>
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <string>

#include "apps/cli/cli.h"
#include "apps/experiment/builtin.h"
#include "apps/experiment/child_processes.h"
#include "apps/experiment/runner.h"
#include "apps/experiment/scenario.h"
#include "apps/experiment/tools.h"
#include "common/subprocess.h"

DEFINE_string(out, "", "Results directory (default: experiment-NAME-YYYYmmdd-HHMMSS)");
DEFINE_int32(lock_wait_s, 120,
             "Bound on waiting for --system_lock before a partition falls back to the "
             "memserver's drop-all fault");
DEFINE_bool(quick, false, "Run the scenario's [quick] size (what CI runs)");
DEFINE_bool(progress, true, "A live status line on stderr when it is a terminal");
DEFINE_string(system_lock, "",
              "Lock file to flock while a partition's firewall rules exist, shared with other "
              "tools that change the machine's firewall (empty: take no lock)");

namespace {

namespace ex = tessera::experiment;

const tessera::cli::CliSpec kSpec = {
    "tessera experiment",
    "run FILE.toml|NAME [--out DIR] [--quick] | list | show NAME | client SPEC.json",
    "Runs a failure-injection experiment: starts memservers, runs the workload, injects the\n"
    "scenario's faults on schedule, samples metrics every 100 ms and writes DIR/timeline.csv,\n"
    "DIR/timeline.png, DIR/summary.json and DIR/summary.md with a verdict. `list` shows the\n"
    "built-in scenarios (Hydra's resilience experiments), `show NAME` prints one as TOML.\n"
    "Exit 0 when every expectation holds, 1 when one fails, 2 for a bad scenario file.\n"
    "`client SPEC.json` is the client process a run starts for the fault target `client`.",
    __FILE__,
    1,
    2};

std::atomic<bool> g_cancel{false};

void OnSignal(int) { g_cancel.store(true); }

std::string FirstLine(const char* text, const char* key) {
  // The value of `key = "..."` in the text, for `list`.
  std::string t(text);
  size_t p = t.find(std::string("\n") + key);
  if (p == std::string::npos) return "";
  size_t q = t.find('"', p);
  size_t e = q == std::string::npos ? q : t.find('"', q + 1);
  return q == std::string::npos || e == std::string::npos ? "" : t.substr(q + 1, e - q - 1);
}

int Run(const std::string& what) {
  std::string text, origin;
  struct stat st;
  if (::stat(what.c_str(), &st) == 0) {
    text = ex::ReadWholeFile(what);
    origin = what;
    if (text.empty() && st.st_size > 0) {
      std::fprintf(stderr, "tessera experiment: cannot read %s\n", what.c_str());
      return 2;
    }
  } else if (const ex::BuiltinScenario* b = ex::FindBuiltin(what)) {
    text = b->text;
    origin = std::string("builtin:") + b->name;
  } else {
    std::fprintf(stderr,
                 "tessera experiment: %s: no such file and no built-in scenario of that name "
                 "(`tessera experiment list`)\n",
                 what.c_str());
    return 2;
  }
  auto sc = ex::ParseScenario(text, origin);
  if (!sc.ok()) {
    std::fprintf(stderr, "tessera experiment: %s\n", sc.status().message().c_str());
    return 2;
  }
  if (FLAGS_quick && !sc->quick.present) {
    std::fprintf(stderr, "tessera experiment: %s has no [quick] table; --quick runs it full size\n",
                 origin.c_str());
  }
  tessera::Status runnable = ex::CheckRunnable(*sc);
  if (!runnable.ok()) {
    std::fprintf(stderr, "tessera experiment: %s: %s\n", origin.c_str(),
                 runnable.message().c_str());
    return 2;
  }
  ex::RunOptions o;
  o.out_dir = FLAGS_out;
  if (o.out_dir.empty()) {
    char b[64];
    time_t now = ::time(nullptr);
    tm t{};
    ::localtime_r(&now, &t);
    std::strftime(b, sizeof(b), "%Y%m%d-%H%M%S", &t);
    o.out_dir = "experiment-" + sc->name + "-" + b;
  }
  o.bin_dir = tessera::SelfExeDir();
  o.data_dir = ex::DataDir(o.bin_dir);
  if (o.data_dir.empty()) {
    std::fprintf(stderr,
                 "tessera experiment: the data directory (share/tessera, with workloads/) is "
                 "missing beside %s: build or install Tessera again\n",
                 o.bin_dir.c_str());
    return 1;
  }
  o.system_lock = FLAGS_system_lock;
  o.lock_wait_ms = std::max(0, FLAGS_lock_wait_s) * 1000;
  o.quick = FLAGS_quick;
  o.progress = FLAGS_progress && ::isatty(2);
  o.cancel = &g_cancel;

  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaction(sig, &sa, nullptr);

  std::fprintf(stderr, "tessera experiment: %s (%s%s), results in %s\n", sc->name.c_str(),
               origin.c_str(), FLAGS_quick ? ", quick" : "", o.out_dir.c_str());
  auto out = ex::RunExperiment(*sc, o);
  if (!out.ok()) {
    std::fprintf(stderr, "tessera experiment: %s\n", out.status().ToString().c_str());
    return g_cancel.load() ? 130 : 1;
  }
  std::fputs(out->summary_md.c_str(), stdout);
  std::fprintf(stderr,
               "tessera experiment: %s: %s (%d of %d expectations hold); see %s/summary.md\n",
               sc->name.c_str(), out->passed ? "PASS" : "FAIL", out->expectations - out->failed,
               out->expectations, o.out_dir.c_str());
  return out->passed ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  tessera::cli::InitCli(kSpec, &argc, &argv);
  const std::string cmd = argv[1];
  if (cmd == "list") {
    if (argc != 2) tessera::cli::UsageError(kSpec, "list takes no argument");
    for (const ex::BuiltinScenario& b : ex::BuiltinScenarios()) {
      std::printf("%-28s %s\n", b.name, FirstLine(b.text, "description").c_str());
    }
    return 0;
  }
  if (cmd == "show") {
    if (argc != 3) tessera::cli::UsageError(kSpec, "show needs a scenario NAME");
    const ex::BuiltinScenario* b = ex::FindBuiltin(argv[2]);
    if (b == nullptr) {
      std::fprintf(stderr,
                   "tessera experiment: no built-in scenario '%s' (`tessera experiment "
                   "list`)\n",
                   argv[2]);
      return 2;
    }
    std::fputs(b->text, stdout);
    return 0;
  }
  if (cmd == "client") {
    if (argc != 3) tessera::cli::UsageError(kSpec, "client needs a SPEC.json");
    return ex::RunClientProcess(argv[2]);
  }
  if (cmd == "run") {
    if (argc != 3) tessera::cli::UsageError(kSpec, "run needs a scenario FILE.toml or NAME");
    return Run(argv[2]);
  }
  tessera::cli::UsageError(kSpec, "unknown command '" + cmd + "' (run, list, show, client)");
}
