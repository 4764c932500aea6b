// `tessera bench failover`: how the erasure-coded remote store's failure handling holds up
// under load and under faults, measured on an embedded cluster of real memservers on loopback.
//
// For every scenario and layout (split, group) a fresh cluster and store are made, --pages
// pages written, and a reader thread does blocking ReadPage of random written pages, checking
// every byte, while a watcher polls which servers the store declares failed. After
// --healthy_s of undisturbed reads one disturbance is applied (see bench/failover/failover_run.h):
// kill, stop, reset, oversubscribe, etcd-outage. One row per run:
//   detect_ms         fault -> the faulted server declared failed (null when it never was)
//   false_failures    servers declared failed that were not faulted
//   read_p50_us/p99   reads started during the fault window
//   healthy_p99_us    reads started before the fault
//   regen_pages_per_s splits rebuilt per second after a kill (null elsewhere)
//   data_loss         reads that returned DataLoss or wrong bytes (window + a final full check)
// After the table, the targets of the failure-handling work, each met or missed with why.
#include <gflags/gflags.h>

#include <algorithm>
#include <cstdio>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "apps/cli/cli.h"
#include "tests/support/etcd_process.h"
#include "bench/failover/failover_run.h"
#include "common/report.h"
#include "common/subprocess.h"

DEFINE_bool(json, false, "Print JSON lines instead of tables");
DEFINE_bool(quick, false,
            "Short smoke run: 1024 pages, 1 s healthy, stop 3 s, reset window 2 s, kill window "
            "1..5 s, oversubscription 5 s, etcd TTL 2 s (the targets are still judged but the "
            "durations are not the targets' own)");
DEFINE_string(scenarios, "kill,stop,reset,oversubscribe,etcd-outage",
              "Scenarios: kill, stop, reset, oversubscribe, etcd-outage");
DEFINE_string(layouts, "split,group", "Erasure-coded layouts: split, group");
DEFINE_int32(servers, 8, "Memory servers started on loopback (>= k + r)");
DEFINE_int32(k, 4, "Data splits of RS(k,r)");
DEFINE_int32(r, 2, "Parity splits of RS(k,r)");
DEFINE_int64(pages, 4096, "Pages written (and read at random) per run");
DEFINE_double(healthy_s, 3, "Undisturbed reads before the fault");
DEFINE_double(kill_window_s, 10, "kill: longest wait for the failed verdict and regeneration");
DEFINE_double(kill_min_window_s, 2, "kill: shortest window of reads after the kill");
DEFINE_double(stop_s, 10, "stop: how long the server stays SIGSTOPped");
DEFINE_int32(reset_ms, 100, "reset: how long every data request's connection is closed");
DEFINE_double(reset_window_s, 3, "reset: reads measured from the reset on");
DEFINE_double(oversubscribe_s, 60, "oversubscribe: how long the busy loops run");
DEFINE_int32(busy_loops, 8, "oversubscribe: busy-loop processes (8 on 2 cores = 4x)");
DEFINE_int32(etcd_ttl_s, 3, "etcd-outage: memservers' lease TTL; etcd is stopped for 3x this");
DEFINE_uint32(seed, 1, "Seed of the page contents and the read sequence");

namespace {

using tessera::Report;
using tessera::bench::FailoverConfig;
using tessera::bench::FailoverResult;

const tessera::cli::CliSpec kSpec = {
    "tessera bench failover",
    "[--quick] [--json] [--scenarios kill,stop,reset,oversubscribe,etcd-outage] "
    "[--layouts split,group] [--servers N] [--pages N]",
    "Failure handling of the erasure-coded store under faults and load, on real memservers on\n"
    "loopback: time to declare a SIGKILLed server failed and regeneration speed, read latency\n"
    "while a server is SIGSTOPped or its connections are reset, false failure verdicts under 4x\n"
    "CPU oversubscription and through an etcd outage, and data loss (every read is checked).\n"
    "Prints each target met or missed.",
    __FILE__,
    0,
    0};

std::vector<std::string> SplitList(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

struct Run {
  std::string scenario;
  std::string layout;
  FailoverResult r;
};

std::string Fmt(double v, int digits = 1) {
  char b[64];
  std::snprintf(b, sizeof(b), "%.*f", digits, v);
  return b;
}

struct Target {
  std::string name;
  std::string result;  // MET, MISSED, NOT RUN
  std::string why;
};

// Judges the targets on the runs made. Every target names its evidence.
std::vector<Target> Judge(const std::vector<Run>& runs, const std::vector<std::string>& layouts) {
  std::vector<Target> out;
  auto find = [&](const std::string& s, const std::string& l) -> const Run* {
    for (const Run& r : runs) {
      if (r.scenario == s && r.layout == l) return &r;
    }
    return nullptr;
  };
  auto zero_false = [&](const std::string& scenario, const std::string& name,
                        const std::string& needed) {
    Target t{name, "NOT RUN", "scenario " + scenario + " not run"};
    bool any = false, all = true;
    std::string why;
    for (const std::string& l : layouts) {
      const Run* r = find(scenario, l);
      if (!r) continue;
      any = true;
      all = all && r->r.false_failures == 0;
      why += (why.empty() ? "" : "; ") + l + ": " + std::to_string(r->r.false_failures) +
             " false failures in " + Fmt(r->r.fault_window_s) + " s";
    }
    if (any) {
      t.result = all ? "MET" : "MISSED";
      t.why = why + needed;
    }
    out.push_back(t);
  };
  const std::string oversub_note =
      FLAGS_oversubscribe_s < 60 ? " (held " + Fmt(FLAGS_oversubscribe_s) + " s, not 60 s)" : "";
  zero_false("oversubscribe", "0 false failures under 4x CPU oversubscription for 60 s",
             oversub_note);
  zero_false("etcd-outage", "0 false failures through an etcd outage (3x the lease TTL)", "");

  for (const std::string& l : layouts) {
    Target t{"SIGSTOPped server: read p99 during the stop <= 2x healthy p99 (" + l + ")", "NOT RUN",
             "scenario stop not run"};
    if (const Run* r = find("stop", l)) {
      const double ratio = r->r.healthy_p99_us > 0 ? r->r.read_p99_us / r->r.healthy_p99_us : 0;
      t.result = r->r.healthy_p99_us > 0 && ratio <= 2.0 ? "MET" : "MISSED";
      t.why = "p99 " + Fmt(r->r.read_p99_us) + " us vs healthy " + Fmt(r->r.healthy_p99_us) +
              " us (" + Fmt(ratio, 2) + "x) over " + std::to_string(r->r.fault_reads) +
              " reads in a " + Fmt(r->r.fault_window_s) + " s stop";
    }
    out.push_back(t);
  }
  for (const std::string& l : layouts) {
    Target t{"SIGKILLed server declared failed within 3 s and regeneration starts (" + l + ")",
             "NOT RUN", "scenario kill not run"};
    if (const Run* r = find("kill", l)) {
      const bool detected = r->r.detect_ms && *r->r.detect_ms <= 3000;
      const bool regen = r->r.regen_start_ms.has_value();
      t.result = detected && regen ? "MET" : "MISSED";
      t.why = r->r.detect_ms ? "declared failed after " + Fmt(*r->r.detect_ms) + " ms"
                             : "never declared failed in " + Fmt(r->r.fault_window_s) + " s";
      t.why += regen ? ", regeneration started " + Fmt(*r->r.regen_start_ms) +
                           " ms after the verdict (" + std::to_string(r->r.regenerated) +
                           " splits rebuilt)"
                     : ", no regeneration seen";
    }
    out.push_back(t);
  }
  std::string loss_why;
  uint64_t lost = 0;
  for (const Run& r : runs) {
    lost += r.r.data_loss;
    if (r.r.data_loss) loss_why += " " + r.scenario + "/" + r.layout;
  }
  out.push_back(Target{"no data loss in any run", lost == 0 ? "MET" : "MISSED",
                       std::to_string(lost) + " reads lost (DataLoss or wrong bytes)" +
                           (loss_why.empty() ? "" : " in" + loss_why) + " over " +
                           std::to_string(runs.size()) + " runs"});
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetCommandLineOptionWithMode("log_level", "error", gflags::SET_FLAGS_DEFAULT);
  tessera::cli::InitCli(kSpec, &argc, &argv);
  if (FLAGS_quick) {
    auto quick = [](const char* flag, const char* value) {
      if (gflags::GetCommandLineFlagInfoOrDie(flag).is_default) {
        gflags::SetCommandLineOption(flag, value);
      }
    };
    quick("pages", "1024");
    quick("healthy_s", "1");
    quick("kill_window_s", "5");
    quick("kill_min_window_s", "1");
    quick("stop_s", "3");
    quick("reset_window_s", "2");
    quick("oversubscribe_s", "5");
    quick("etcd_ttl_s", "2");
  }
  const std::vector<std::string> scenarios = SplitList(FLAGS_scenarios);
  const std::vector<std::string> layouts = SplitList(FLAGS_layouts);
  static const std::vector<std::string> kScenarios = {"kill", "stop", "reset", "oversubscribe",
                                                      "etcd-outage"};
  if (scenarios.empty()) tessera::cli::UsageError(kSpec, "--scenarios is empty");
  if (layouts.empty()) tessera::cli::UsageError(kSpec, "--layouts is empty");
  for (const std::string& s : scenarios) {
    if (std::find(kScenarios.begin(), kScenarios.end(), s) == kScenarios.end()) {
      tessera::cli::UsageError(kSpec, "--scenarios: unknown scenario '" + s + "'");
    }
  }
  std::vector<tessera::client::EcLayout> ec_layouts;
  for (const std::string& l : layouts) {
    auto parsed = tessera::client::ParseEcLayout(l);
    if (!parsed.ok()) tessera::cli::UsageError(kSpec, "--layouts: " + parsed.status().message());
    ec_layouts.push_back(*parsed);
  }
  if (FLAGS_k < 1 || FLAGS_r < 1 || FLAGS_servers < FLAGS_k + FLAGS_r || FLAGS_servers > 64) {
    tessera::cli::UsageError(kSpec, "need 1 <= k, 1 <= r and k + r <= --servers <= 64");
  }
  if (FLAGS_pages < 64 || FLAGS_pages > (int64_t{1} << 22)) {
    tessera::cli::UsageError(kSpec, "--pages must be in 64..4194304");
  }
  if (FLAGS_healthy_s <= 0 || FLAGS_kill_window_s <= 0 || FLAGS_stop_s <= 0 ||
      FLAGS_reset_window_s <= 0 || FLAGS_oversubscribe_s <= 0 || FLAGS_reset_ms < 1 ||
      FLAGS_reset_ms > 60000) {
    tessera::cli::UsageError(kSpec, "durations must be positive (--reset_ms 1..60000)");
  }
  if (FLAGS_busy_loops < 1 || FLAGS_busy_loops > 256) {
    tessera::cli::UsageError(kSpec, "--busy_loops must be 1..256");
  }
  if (FLAGS_etcd_ttl_s < 2 || FLAGS_etcd_ttl_s > 60) {
    tessera::cli::UsageError(kSpec, "--etcd_ttl_s must be 2..60 (the memserver's lease bounds)");
  }
  const bool want_etcd =
      std::find(scenarios.begin(), scenarios.end(), "etcd-outage") != scenarios.end();
  if (want_etcd && !tessera::testing::EtcdProcess::SkipReason().empty()) {
    std::fprintf(stderr, "tessera bench failover: etcd-outage needs etcd: %s\n",
                 tessera::testing::EtcdProcess::SkipReason().c_str());
    return 1;
  }

  Report rep(FLAGS_json);
  rep.Title("Failover: RS(" + std::to_string(FLAGS_k) + "," + std::to_string(FLAGS_r) + ") over " +
            std::to_string(FLAGS_servers) + " memservers, " + std::to_string(FLAGS_pages) +
            " pages, one blocking reader" + (FLAGS_quick ? " (--quick)" : ""));
  std::vector<Run> runs;
  int failed_runs = 0;
  for (const std::string& scenario : scenarios) {
    for (size_t li = 0; li < layouts.size(); ++li) {
      FailoverConfig c;
      c.scenario = scenario;
      c.layout = ec_layouts[li];
      c.bin_dir = tessera::SelfExeDir();
      c.servers = FLAGS_servers;
      c.k = FLAGS_k;
      c.r = FLAGS_r;
      c.pages = static_cast<uint64_t>(FLAGS_pages);
      c.healthy_s = FLAGS_healthy_s;
      c.kill_window_s = FLAGS_kill_window_s;
      c.kill_min_window_s = std::min(FLAGS_kill_min_window_s, FLAGS_kill_window_s);
      c.stop_s = FLAGS_stop_s;
      c.reset_ms = FLAGS_reset_ms;
      c.reset_window_s = FLAGS_reset_window_s;
      c.oversubscribe_s = FLAGS_oversubscribe_s;
      c.busy_loops = FLAGS_busy_loops;
      c.etcd_ttl_s = FLAGS_etcd_ttl_s;
      c.seed = FLAGS_seed;
      auto res = tessera::bench::RunFailover(c);
      if (!res.ok()) {
        std::fprintf(stderr, "tessera bench failover: %s/%s: %s\n", scenario.c_str(),
                     layouts[li].c_str(), res.status().ToString().c_str());
        failed_runs++;
        continue;
      }
      const FailoverResult& r = *res;
      runs.push_back(Run{scenario, layouts[li], r});
      // Report has no null: a missing value is NaN in JSON (printed as null), "-" in the table.
      auto opt = [](Report::Row& row, const char* key, const std::optional<double>& v) {
        if (v) {
          row.Set(key, *v);
        } else if (FLAGS_json) {
          row.Set(key, std::numeric_limits<double>::quiet_NaN());
        } else {
          row.Set(key, "-");
        }
      };
      Report::Row row;
      row.Set("suite", "failover").Set("scenario", scenario).Set("layout", layouts[li]);
      opt(row, "detect_ms", r.detect_ms);
      row.Set("false_failures", r.false_failures)
          .Set("read_p50_us", r.read_p50_us)
          .Set("read_p99_us", r.read_p99_us)
          .Set("healthy_p99_us", r.healthy_p99_us);
      opt(row, "regen_pages_per_s", r.regen_pages_per_s);
      row.Set("data_loss", r.data_loss)
          .Set("read_max_us", r.read_max_us)
          .Set("read_errors", r.read_errors)
          .Set("fault_reads", r.fault_reads)
          .Set("healthy_reads", r.healthy_reads)
          .Set("window_s", r.fault_window_s);
      opt(row, "regen_start_ms", r.regen_start_ms);
      row.Set("regenerated", r.regenerated)
          .Set("faulted_failed", static_cast<int>(r.faulted_declared_failed))
          .Set("etcd_leaves", r.membership_leaves);
      rep.Add(std::move(row));
    }
  }
  rep.Flush();

  Report targets(FLAGS_json);
  targets.Title("Targets");
  for (const auto& t : Judge(runs, layouts)) {
    targets.Add(Report::Row()
                    .Set("suite", "failover-targets")
                    .Set("target", t.name)
                    .Set("result", t.result)
                    .Set("measured", t.why));
  }
  targets.Flush();
  return failed_runs == 0 ? 0 : 1;
}
