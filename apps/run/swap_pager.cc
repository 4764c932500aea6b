#include "apps/run/swap_pager.h"

#include "apps/run/exit_status.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "common/clock.h"
#include "common/file.h"
#include "common/subprocess.h"
#include "common/units.h"
#include "kernel_shim/swap/memory_cgroup.h"

namespace tessera::run {
namespace {

pid_t g_child = -1;
volatile sig_atomic_t g_term = 0;

void Forward(int sig) {
  if (sig == SIGTERM || sig == SIGHUP) g_term = 1;
  if (g_child > 0) ::kill(g_child, sig);
}

uint64_t Num(const KeyValues& kv, const char* key) {
  auto it = kv.find(key);
  return it == kv.end() ? 0 : std::strtoull(it->second.c_str(), nullptr, 10);
}

double Real(const KeyValues& kv, const char* key) {
  auto it = kv.find(key);
  return it == kv.end() ? 0 : std::strtod(it->second.c_str(), nullptr);
}

// SwapPagerOptions::live_stats_file's lines, from the daemon's stats file `ds` and the cgroup.
std::string LiveStats(uint64_t elapsed_ns, const kernel_shim::MemoryCgroupStats& cs,
                      const KeyValues& ds, uint64_t limit, bool final) {
  std::string o;
  auto put = [&](const char* key, uint64_t v) {
    o += key;
    o += ' ';
    o += std::to_string(v);
    o += '\n';
  };
  put("elapsed_ns", elapsed_ns);
  put("faults", cs.pgmajfault);
  put("remote_reads", Num(ds, "pages_read"));
  put("remote_writes", Num(ds, "pages_written"));
  put("store_read_p50_ns", static_cast<uint64_t>(Real(ds, "read_p50_us") * 1e3));
  put("store_read_p99_ns", static_cast<uint64_t>(Real(ds, "read_p99_us") * 1e3));
  put("store_degraded_reads", Num(ds, "degraded_reads"));
  put("store_data_loss", Num(ds, "lost_pages"));
  put("store_server_failures", Num(ds, "server_failures"));
  put("store_regenerations_done", Num(ds, "regenerations_done"));
  put("limit_bytes", limit);
  put("final", final ? 1 : 0);
  return o;
}

// Runs `tessera swap` with `args`; its output on failure.
Result<std::string> Swap(const std::string& bin, const std::vector<std::string>& args) {
  std::vector<std::string> argv = {bin + "/tessera-swap"};
  argv.insert(argv.end(), args.begin(), args.end());
  // Its stderr goes to ours (the errors are the user's to read); stdout is captured.
  auto p = Subprocess::Start(argv, Subprocess::Options{true, false, {}});
  if (!p.ok()) return p.status();
  std::string out;
  for (;;) {
    auto line = p->ReadLine(Deadline::AfterMs(600000));
    if (!line.ok()) break;
    out += *line + "\n";
  }
  auto ws = p->Wait(Deadline::AfterMs(600000));
  if (!ws.ok()) return ws.status();
  if (!WIFEXITED(*ws) || WEXITSTATUS(*ws) != 0) {
    return Unavailable("`tessera swap ", args[0], "` failed", out.empty() ? "" : ": " + out);
  }
  return out;
}

}  // namespace

int RunWithSwapPager(const SwapPagerOptions& o) {
  if (Status st = kernel_shim::MemoryCgroup::CheckSupported(); !st.ok()) {
    std::fprintf(stderr, "tessera run: --pager swap %s; --pager uffd needs none of it\n",
                 st.message().c_str());
    return 1;
  }
  const std::string name = "run-" + std::to_string(::getpid());
  auto cg_or = kernel_shim::MemoryCgroup::Create("tessera-" + name);
  if (!cg_or.ok()) {
    std::fprintf(stderr, "tessera run: %s\n", cg_or.status().ToString().c_str());
    return 1;
  }
  std::unique_ptr<kernel_shim::MemoryCgroup> cg = std::move(*cg_or);
  std::vector<std::string> on = {
      "on", "--name", name, "--size", std::to_string(o.swap_bytes), "--priority", "32767"};
  on.insert(on.end(), o.swap_flags.begin(), o.swap_flags.end());
  auto up = Swap(o.bin_dir, on);
  if (!up.ok()) {
    std::fprintf(stderr, "tessera run: --pager swap: %s\n", up.status().ToString().c_str());
    return 1;
  }
  struct SwapOff {
    std::string bin, name;
    bool on = true;
    void Off() {
      if (!on) return;
      on = false;
      auto r = Swap(bin, {"off", "--name", name});
      if (!r.ok()) std::fprintf(stderr, "tessera run: %s\n", r.status().ToString().c_str());
    }
    ~SwapOff() { Off(); }
  } swap_off{o.bin_dir, name};
  if (o.fixed_bytes) {
    if (Status st = cg->SetLimit(o.fixed_bytes); !st.ok()) {
      std::fprintf(stderr, "tessera run: %s\n", st.ToString().c_str());
      return 1;
    }
  }

  std::vector<char*> cargv;
  std::vector<std::string> args = o.argv;
  for (auto& a : args) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  const std::string procs = cg->path() + "/cgroup.procs";
  const uint64_t t0 = MonotonicNs();
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    std::fprintf(stderr, "tessera run: fork: %s\n", std::strerror(errno));
    return 1;
  }
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) _exit(1);
    if (!kernel_shim::MemoryCgroup::EnterFromChild(procs.c_str())) {
      const char msg[] = "tessera run: cannot enter the memory cgroup\n";
      (void)!::write(2, msg, sizeof(msg) - 1);
      _exit(1);
    }
    ::execv(cargv[0], cargv.data());
    const int err = errno;
    const char msg[] = "tessera run: exec failed\n";
    (void)!::write(2, msg, sizeof(msg) - 1);
    _exit(err == ENOENT ? 127 : 126);
  }
  g_child = pid;
  struct sigaction sa {};
  sa.sa_handler = Forward;
  sa.sa_flags = SA_RESTART;
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2}) sigaction(sig, &sa, nullptr);

  // The limit follows P% of the peak footprint (resident + swap) seen so far.
  uint64_t limit = o.fixed_bytes;
  uint64_t term_at = 0;
  int wstatus = 0;
  const std::string daemon_stats = "/run/tessera-swap/" + name + "/stats";
  uint64_t live_at = 0;
  for (;;) {
    const pid_t w = ::waitpid(pid, &wstatus, WNOHANG);
    if (w == pid) break;
    if (!o.live_stats_file.empty() && MonotonicNs() >= live_at) {
      live_at = MonotonicNs() + 500'000'000;
      (void)WriteFileAtomically(o.live_stats_file,
                                LiveStats(MonotonicNs() - t0, cg->Stats(),
                                          ReadKeyValues(daemon_stats), limit, false));
    }
    if (o.fraction > 0) {
      const kernel_shim::MemoryCgroupStats s = cg->Stats();
      const uint64_t peak = std::max(s.memsw_max_usage, s.max_usage);
      const uint64_t want =
          std::max<uint64_t>(static_cast<uint64_t>(o.fraction * peak), 16ull << 20) & ~4095ull;
      // The peak only grows, and the limit with it, in steps of 1 MiB or more.
      if (limit == 0 || want >= limit + (1ull << 20)) {
        if (cg->SetLimit(want).ok()) limit = want;
      }
    }
    const uint64_t now = MonotonicNs();
    if (g_term && term_at == 0) term_at = now;
    if (term_at && (now - term_at) / 1e9 > o.term_grace_s) ::kill(pid, SIGKILL);
    ::usleep(20000);  // Polling the exit and the cgroup's peak; not synchronisation.
  }
  const double secs = (MonotonicNs() - t0) / 1e9;
  const kernel_shim::MemoryCgroupStats cs = cg->Stats();
  (void)cg->Remove();  // Every process the program started goes with it.
  const auto ds = ReadKeyValues(daemon_stats);
  swap_off.Off();
  if (!o.live_stats_file.empty()) {
    (void)WriteFileAtomically(o.live_stats_file,
                              LiveStats(static_cast<uint64_t>(secs * 1e9), cs, ds, limit, true));
  }

  std::string how;
  int code = DescribeExit(wstatus, &how);
  if (WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGKILL && cs.oom_kills > 0) {
    how += ", OOM-killed in its memory cgroup";
  }
  if (WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGBUS && Num(ds, "lost_pages") > 0) {
    how += ", a lost swap page";
  }
  const uint64_t failures = Num(ds, "server_failures");
  const uint64_t lost = Num(ds, "lost_pages");
  if (o.summary) {
    std::fprintf(stderr,
                 "tessera run: %s after %.2f s; swap pager: %s over %s; local memory %s (limit at "
                 "exit %s)\n"
                 "  footprint: peak resident %s, peak resident + swap %s\n"
                 "  major faults (swap-ins) %llu, OOM kills %llu\n"
                 "  remote reads %llu, remote writes %llu (swap device pages, whole device)\n"
                 "  memserver failures survived %llu, data loss %llu pages%s%s\n",
                 how.c_str(), secs, ds.count("store") ? ds.at("store").c_str() : "?",
                 ds.count("servers") ? ds.at("servers").c_str() : "?", o.local_memory_text.c_str(),
                 limit ? FormatSize(limit).c_str() : "none", FormatSize(cs.max_usage).c_str(),
                 FormatSize(cs.memsw_max_usage).c_str(),
                 static_cast<unsigned long long>(cs.pgmajfault),
                 static_cast<unsigned long long>(cs.oom_kills),
                 static_cast<unsigned long long>(Num(ds, "pages_read")),
                 static_cast<unsigned long long>(Num(ds, "pages_written")),
                 static_cast<unsigned long long>(failures), static_cast<unsigned long long>(lost),
                 lost ? " (pages " : "", lost ? (ds.at("lost_page_ids") + ")").c_str() : "");
  }
  if (!o.stats_json.empty()) {
    nlohmann::ordered_json out;
    out["exit_code"] = code;
    out["status"] = how;
    out["elapsed_s"] = secs;
    out["pager"] = "swap";
    out["local_memory"] = o.local_memory_text;
    out["limit_bytes"] = limit;
    out["peak_resident_bytes"] = cs.max_usage;
    out["peak_footprint_bytes"] = cs.memsw_max_usage;
    out["faults"] = cs.pgmajfault;
    out["oom_kills"] = cs.oom_kills;
    out["remote_reads"] = Num(ds, "pages_read");
    out["remote_writes"] = Num(ds, "pages_written");
    out["failures_survived"] = failures;
    out["store_data_loss"] = lost;
    // The uffd pager's names for the store's figures, so that tools read both pagers alike.
    out["store_server_failures"] = failures;
    out["store_degraded_reads"] = Num(ds, "degraded_reads");
    out["store_regenerations_done"] = Num(ds, "regenerations_done");
    std::ofstream f(o.stats_json);
    f << out.dump() << "\n";
    if (!f) {
      std::fprintf(stderr, "tessera run: cannot write --stats-json %s\n", o.stats_json.c_str());
      if (code == 0) code = 1;
    }
  }
  return code;
}

}  // namespace tessera::run
