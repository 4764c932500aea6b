#include "apps/experiment/runner.h"

#include <sys/stat.h>
#include <sys/wait.h>

#include <algorithm>
#include <ctime>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "apps/experiment/results.h"
#include "apps/experiment/scenario_run.h"
#include "apps/experiment/tools.h"
#include "apps/experiment/workload.h"
#include "client/page_store.h"
#include "common/clock.h"
#include "common/subprocess.h"
#include "common/units.h"

namespace tessera::experiment {
namespace {

using json = nlohmann::json;

uint64_t SizeOf(const std::string& s) { return ParseSize(s).value_or(0); }

// Predicted fraction of pages lost, from `tessera sim placement` on the same layout.
void Predict(const Scenario& s, const ClusterSpec& c, const RunOptions& o, RunResult* r,
             const std::set<size_t>& failed) {
  const uint64_t split = client::kPageSize / static_cast<uint64_t>(c.k);
  const uint64_t per_slab = std::max<uint64_t>(1, SizeOf(c.slab_size) / split);
  const uint64_t slabs = (s.workload.pagestore.pages + per_slab - 1) / per_slab;
  const uint64_t spm = std::max<uint64_t>(
      1, (slabs + static_cast<uint64_t>(c.memservers) / 2) / static_cast<uint64_t>(c.memservers));
  std::vector<std::string> argv = {o.bin_dir + "/tessera-sim-placement",
                                   "--machines=" + std::to_string(c.memservers),
                                   "--k=" + std::to_string(c.k),
                                   "--r=" + std::to_string(c.r),
                                   "--l=" + std::to_string(c.l),
                                   "--policies=" + c.placement,
                                   "--slabs_per_machine=" + std::to_string(spm),
                                   "--trials=2000",
                                   "--seed=" + std::to_string(s.seed),
                                   "--churn=false",
                                   "--mode=mc",
                                   "--json"};
  // One whole rack failed: the simulator's rack model; else machines.
  bool one_rack = false;
  if (c.racks > 0 && !failed.empty()) {
    std::set<int> racks;
    for (size_t i : failed) {
      racks.insert(
          static_cast<int>(i * static_cast<size_t>(c.racks) / static_cast<size_t>(c.memservers)));
    }
    const size_t rack_size = static_cast<size_t>(c.memservers / c.racks);
    one_rack = racks.size() == 1 && failed.size() == rack_size && c.memservers % c.racks == 0;
  }
  if (c.racks > 0) argv.push_back("--racks=" + std::to_string(c.racks));
  if (one_rack) {
    argv.push_back("--failure_mode=racks");
    argv.push_back("--failure_fraction=" + Fmt(1.0 / c.racks + 1e-6, 6));
  } else {
    argv.push_back("--failure_fraction=" +
                   Fmt(static_cast<double>(failed.size()) / c.memservers + 1e-6, 6));
  }
  std::string cmd;
  for (const std::string& a : argv) cmd += (cmd.empty() ? "" : " ") + a;
  r->prediction_cmd = cmd;
  auto res = RunTool(argv, 120000);
  if (!res.ok() || res->exit_code != 0) {
    r->prediction_cmd += " (failed: " + (res.ok() ? res->output : res.status().ToString()) + ")";
    return;
  }
  std::istringstream in(res->output);
  std::string line;
  while (std::getline(in, line)) {
    auto j = json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.is_object() && j.contains("lost_frac")) {
      r->predicted_fraction = j["lost_frac"].get<double>();
    }
  }
}

}  // namespace

Status CheckRunnable(const Scenario& s) { return TypeOf(s.workload.kind).check(s); }

Result<Outcome> RunExperiment(const Scenario& scenario_in, const RunOptions& o) {
  const Scenario s = o.quick ? ApplyQuick(scenario_in) : scenario_in;
  ::mkdir(o.out_dir.c_str(), 0755);
  struct stat st;
  if (::stat(o.out_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return InvalidArgument("--out ", o.out_dir, ": not a directory");
  }
  std::atomic<bool> never{false};
  RunOptions opt = o;
  if (opt.cancel == nullptr) opt.cancel = &never;

  // The runs: one per variant (or one), plus a healthy baseline when a slowdown is judged.
  struct Plan {
    std::string name;
    ClusterSpec cluster;
    const ExpectSpec* expect;
    std::string dir;
  };
  std::vector<Plan> plans;
  if (s.variants.empty()) {
    plans.push_back({"run", s.cluster, &s.expect, o.out_dir});
  } else {
    for (const VariantSpec& v : s.variants) {
      plans.push_back({v.name, VariantCluster(s, &v), v.has_expect ? &v.expect : &s.expect,
                       o.out_dir + "/" + v.name});
    }
  }
  bool need_healthy = s.expect.max_slowdown_vs_healthy.has_value();
  bool need_local = s.expect.identical_output.value_or(false);
  for (const VariantSpec& v : s.variants) {
    need_healthy = need_healthy || v.expect.max_slowdown_vs_healthy.has_value();
    need_local = need_local || v.expect.identical_output.value_or(false);
  }

  const std::string started = [] {
    char b[64];
    time_t now = ::time(nullptr);
    tm t{};
    ::gmtime_r(&now, &t);
    std::strftime(b, sizeof(b), "%Y-%m-%dT%H:%M:%SZ", &t);
    return std::string(b);
  }();
  const double start = NowS();

  std::string local_output;
  double local_s = 0;
  if (need_local) {
    if (o.progress) std::fprintf(stderr, "[local] running the program without tessera...\n");
    std::vector<std::string> cmd = ExpandCommand(s.workload.run.command, o.data_dir);
    Subprocess::Options so;
    so.capture_stdout = true;
    so.quiet_stderr = true;
    const double t = NowS();
    auto p = Subprocess::Start(cmd, so);
    if (!p.ok()) return p.status().WithContext("starting the local run");
    while (true) {
      auto line = p->ReadLine(Deadline::AfterMs(200));
      if (line.ok()) {
        local_output += *line + "\n";
      } else if (line.status().code() != StatusCode::kTimeout) {
        break;
      } else if (opt.cancel->load() || NowS() - t > s.duration_s) {
        return Cancelled("the local run did not finish within duration_s");
      }
    }
    auto ws = p->Wait(Deadline::AfterMs(10000));
    local_s = NowS() - t;
    if (!ws.ok() || !WIFEXITED(*ws) || WEXITSTATUS(*ws) != 0) {
      return Internal("the program failed when run locally without tessera (",
                      s.workload.run.command[0], ")");
    }
  }

  std::vector<RunResult> results;
  std::unique_ptr<RunResult> healthy;
  if (need_healthy) {
    const Plan& p0 = plans.front();
    healthy = std::make_unique<RunResult>(
        RunScenarioOnce(s, p0.cluster, *p0.expect, opt, "healthy", o.out_dir + "/healthy", true));
    if (o.progress) std::fprintf(stderr, "\n");
    if (opt.cancel->load()) return Cancelled("cancelled");
    WriteTimeline(*healthy, o.out_dir + "/healthy").IgnoreError();
    WritePlot(*healthy, o.out_dir + "/healthy", s.name).IgnoreError();
  }
  for (const Plan& p : plans) {
    RunResult r = RunScenarioOnce(s, p.cluster, *p.expect, opt, p.name, p.dir, false);
    if (o.progress) std::fprintf(stderr, "\n");
    if (opt.cancel->load()) return Cancelled("cancelled");
    if (p.expect->max_loss_error_vs_prediction) {
      std::set<size_t> failed;
      for (const FaultRecord& f : r.faults) {
        if (f.what.rfind("kill", 0) == 0 || f.what.rfind("partition", 0) == 0) {
          failed.insert(f.servers.begin(), f.servers.end());
        }
      }
      Predict(s, p.cluster, o, &r, failed);
    }
    Status ws = WriteTimeline(r, p.dir);
    if (!ws.ok()) return ws;
    Status ps = WritePlot(r, p.dir, s.name);
    if (!ps.ok()) r.error += (r.error.empty() ? "" : "; ") + ("plot: " + ps.ToString());
    results.push_back(std::move(r));
  }

  std::vector<Check> checks;
  for (size_t i = 0; i < plans.size(); ++i) {
    Judge(*plans[i].expect, results[i], healthy.get(), local_output, results, &checks);
  }
  Outcome out;
  out.expectations = static_cast<int>(checks.size());
  for (const Check& c : checks) out.failed += !c.pass;
  out.passed = out.failed == 0 && !checks.empty();

  ExperimentSummary x;
  x.scenario = &s;
  x.options = &o;
  x.started_utc = started;
  x.wall_s = NowS() - start;
  x.have_local = need_local;
  x.local_s = local_s;
  x.healthy = healthy.get();
  x.runs = &results;
  x.checks = &checks;
  x.passed = out.passed;
  TESSERA_ASSIGN_OR_RETURN(out.summary_md, WriteSummary(x));
  return out;
}

}  // namespace tessera::experiment
