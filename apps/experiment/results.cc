#include "apps/experiment/results.h"

#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "apps/cli/version.h"
#include "apps/experiment/tools.h"
#include "apps/experiment/workload.h"

namespace tessera::experiment {
namespace {

using json = nlohmann::json;

constexpr double kInf = std::numeric_limits<double>::infinity();

std::string GnuplotQuote(std::string s) {
  for (char& c : s) {
    if (c == '"' || c == '\\') c = '\'';
  }
  return "\"" + s + "\"";
}

// The scenario's workload in summary.json: a program's command, else the load's size (the keys
// of a pagestore workload, which kv and paramsvc workloads report too).
json WorkloadJson(const Scenario& s, const std::string& data_dir) {
  const WorkloadSpec& w = s.workload;
  json j = {{"kind", WorkloadKindName(w.kind)}};
  if (RunsAProgram(w.kind)) {
    j["command"] = ExpandCommand(w.run.command, data_dir);
    j["local_memory"] = w.run.local_memory;
  } else {
    j["pages"] = w.pagestore.pages;
    j["qd"] = w.pagestore.qd;
    j["read_ratio"] = w.pagestore.read_ratio;
    j["ops"] = w.kind == WorkloadKind::kKv ? w.kv.ops : w.pagestore.ops;
  }
  return j;
}

json Machine() {
  json m;
  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
  m["hostname"] = host;
  utsname u{};
  if (::uname(&u) == 0) m["kernel"] = std::string(u.sysname) + " " + u.release + " " + u.machine;
  m["cpus"] = ::sysconf(_SC_NPROCESSORS_ONLN);
  std::istringstream mi(ReadWholeFile("/proc/meminfo"));
  std::string k;
  uint64_t v;
  std::string unit;
  while (mi >> k >> v >> unit) {
    if (k == "MemTotal:") m["mem_total_mb"] = v / 1024;
  }
  std::istringstream ci(ReadWholeFile("/proc/cpuinfo"));
  std::string line;
  while (std::getline(ci, line)) {
    if (line.rfind("model name", 0) == 0) {
      m["cpu_model"] = line.substr(line.find(':') + 2);
      break;
    }
  }
  return m;
}

json ResultJson(const RunResult& r) {
  json j;
  j["name"] = r.name;
  j["healthy_baseline"] = r.healthy;
  j["cluster"] = {{"memservers", r.cluster.memservers},
                  {"racks", r.cluster.racks},
                  {"layout", r.cluster.layout.empty() ? "tool default" : r.cluster.layout},
                  {"k", r.cluster.k},
                  {"r", r.cluster.r},
                  {"delta", r.cluster.delta},
                  {"l", r.cluster.l},
                  {"placement", r.cluster.placement},
                  {"hosts", r.hosts}};
  j["completion_s"] = r.completion_s;
  j["read_p50_us_before_faults"] = r.p50_before_us;
  j["read_p99_us_before_faults"] = r.p99_before_us;
  j["read_p50_us_during_faults"] = r.p50_during_us;
  j["read_p99_us_during_faults"] = r.p99_during_us;
  j["worst_100ms_p99_us_during_faults"] = r.worst_p99_during_us;
  j["lowest_300ms_ops_per_s_during_faults"] = r.min_ops_during;
  j["median_ops_per_s_before_faults"] = r.median_ops_before;
  j["data_loss"] = r.data_loss;
  j["wrong_bytes"] = r.wrong_bytes;
  j["wrong_pages"] = r.wrong_pages;
  j["reads_checked"] = r.reads_checked;
  j["read_errors"] = r.read_errors;
  j["write_errors"] = r.write_errors;
  j["corruptions_detected"] = r.corruptions_detected;
  j["corruptions_repaired"] = r.corruptions_repaired;
  j["server_failures"] = r.server_failures;
  if (r.false_failures >= 0) j["false_failures"] = r.false_failures;
  j["regenerations_done"] = r.regenerations_done;
  j["degraded_reads"] = r.degraded_reads;
  j["regenerated_after_s"] = r.regenerated_after_s;
  if (r.predicted_fraction >= 0 || !r.prediction_cmd.empty()) {
    j["predicted_lost_fraction"] = r.predicted_fraction;
    j["prediction_command"] = r.prediction_cmd;
  }
  if (!r.partition_mode.empty()) j["partition_mode"] = r.partition_mode;
  j["exit_code"] = r.exit_code;
  if (!r.error.empty()) j["error"] = r.error;
  json faults = json::array();
  for (const FaultRecord& f : r.faults) {
    faults.push_back(
        {{"t_s", f.t}, {"what", f.what}, {"servers", f.servers}, {"ok", f.ok}, {"note", f.note}});
  }
  j["faults"] = faults;
  j["samples"] = r.samples.size();
  j.update(r.report.json);
  return j;
}

}  // namespace

std::string Fmt(double v, int prec) {
  if (std::isinf(v)) return "inf";
  char b[64];
  std::snprintf(b, sizeof(b), "%.*f", prec, v);
  return b;
}

void SetPhaseLatencies(const LatencyHistogram& before, const LatencyHistogram& during,
                       RunResult* r) {
  r->p50_before_us = static_cast<double>(before.p50()) / 1e3;
  r->p99_before_us = static_cast<double>(before.p99()) / 1e3;
  r->p50_during_us = static_cast<double>(during.p50()) / 1e3;
  r->p99_during_us = static_cast<double>(during.p99()) / 1e3;
}

std::string ErasureCodedClusterLine(const RunResult& r) {
  const ClusterSpec& c = r.cluster;
  return "- cluster: " + std::to_string(c.memservers) + " memservers" +
         (c.racks ? " in " + std::to_string(c.racks) + " racks" : "") + ", RS(" +
         std::to_string(c.k) + "," + std::to_string(c.r) + ") delta " + std::to_string(c.delta) +
         ", " + c.placement + " placement, " +
         (c.layout.empty() ? std::string("the tool's default layout") : c.layout + " layout") +
         (r.hosts == "netns" ? ", each memserver a host in a network namespace of its own" : "") +
         "\n";
}

void SummarizeSamples(double load_end_t, RunResult* r) {
  std::vector<double> before;
  const auto& xs = r->samples;
  // Only the samples taken while the load ran count (before or during the faults): a fault
  // window may outlast the load (a timed fault cut short by the end of the run), and the
  // samples after it show the final verify passes or no ops at all, not the load.
  auto during = [&](size_t i) { return xs[i].during && xs[i].t <= load_end_t; };
  for (size_t i = 0; i < xs.size(); ++i) {
    if (during(i)) {
      r->worst_p99_during_us = std::max(r->worst_p99_during_us, xs[i].p99_us);
    } else if (i > 0 && xs[i].t <= load_end_t &&
               (r->faults.empty() || xs[i].t < r->faults.front().t)) {
      before.push_back(xs[i].ops_per_s);
    }
    // Throughput over 300 ms windows (three samples) inside the fault windows, so that a
    // scheduling hiccup of the shared machine is not mistaken for a stall.
    if (i >= 3 && during(i) && during(i - 1) && during(i - 2)) {
      // Samples i-2..i cover (t[i-3], t[i]]: 300 ms.
      double ops = 0;
      for (size_t j = i - 2; j <= i; ++j) ops += xs[j].ops_per_s * (xs[j].t - xs[j - 1].t);
      const double span = xs[i].t - xs[i - 3].t;
      const double avg = span > 0 ? ops / span : 0;
      if (r->min_ops_during < 0 || avg < r->min_ops_during) r->min_ops_during = avg;
    }
  }
  if (!before.empty()) {
    std::nth_element(before.begin(), before.begin() + static_cast<long>(before.size() / 2),
                     before.end());
    r->median_ops_before = before[before.size() / 2];
  }
}

Status WriteTimeline(const RunResult& r, const std::string& dir) {
  std::string csv =
      "t_s,ops_per_s,p50_us,p99_us,degraded_reads,regenerations_pending,data_loss,"
      "server_failures,memserver_cpu_pct,memserver_rss_mb,fault_active\n";
  for (const Sample& s : r.samples) {
    char line[256];
    std::snprintf(
        line, sizeof(line), "%.2f,%.0f,%.1f,%.1f,%llu,%llu,%llu,%llu,%.1f,%.1f,%d\n", s.t,
        s.ops_per_s, s.p50_us, s.p99_us, static_cast<unsigned long long>(s.degraded_reads),
        static_cast<unsigned long long>(s.regenerations_pending),
        static_cast<unsigned long long>(s.data_loss),
        static_cast<unsigned long long>(s.server_failures), s.cpu_pct, s.rss_mb, s.during ? 1 : 0);
    csv += line;
  }
  return WriteWholeFile(dir + "/timeline.csv", csv);
}

// timeline.png: throughput, latency and recovery counters over time, faults marked.
Status WritePlot(const RunResult& r, const std::string& dir, const std::string& title) {
  if (r.samples.size() < 2) return Status::Ok();
  std::string g;
  g += "set terminal pngcairo size 900,720 font 'sans,9'\n";
  g += "set output " + GnuplotQuote(dir + "/timeline.png") + "\n";
  g += "set datafile separator ','\nset multiplot layout 3,1 title " +
       GnuplotQuote(title + " [" + r.name + "]") + "\n";
  g += "set grid\nset key top right\nset lmargin 10\n";
  double tmax = r.samples.back().t;
  g += "set xrange [0:" + Fmt(tmax, 2) + "]\n";
  int n = 0;
  for (const FaultRecord& f : r.faults) {
    g += "set arrow " + std::to_string(++n) + " from " + Fmt(f.t, 2) + ", graph 0 to " +
         Fmt(f.t, 2) + ", graph 1 nohead lc rgb 'red' dt 2\n";
    if (n <= 12) {
      g += "set label " + std::to_string(n) + " " + GnuplotQuote(f.what) + " at " + Fmt(f.t, 2) +
           ", graph 0.95 rotate by 90 right front tc rgb 'red' font 'sans,7'\n";
    }
  }
  const std::string csv = GnuplotQuote(dir + "/timeline.csv");
  const WorkloadReport& w = r.report;
  g += "set ylabel " + GnuplotQuote(w.rate_axis) + "\n";
  g += "plot " + csv + " every ::1 using 1:2 with lines lw 1.5 lc rgb '#1f77b4' title " +
       GnuplotQuote(w.rate_title) + "\n";
  g += "unset label\n";
  g += "set ylabel 'latency (us)'\nset logscale y\n";
  g += "plot " + csv + " every ::1 using 1:($3>0?$3:1/0) with lines lc rgb '#2ca02c' title " +
       GnuplotQuote(w.p50_title) + ", " + csv +
       " every ::1 using 1:($4>0?$4:1/0) with lines lc rgb '#d62728' title " +
       GnuplotQuote(w.p99_title) + "\n";
  // Log scale for the counters, unless all are zero (gnuplot refuses an empty log plot).
  bool any = false;
  for (const Sample& x : r.samples) {
    any = any || x.degraded_reads + x.regenerations_pending + x.data_loss + x.server_failures > 0;
  }
  g += "set xlabel 'time (s)'\n";
  g += any ? "set ylabel 'count (log)'\n"
           : "unset logscale y\nset yrange [0:1]\nset ylabel 'count'\n";
  g += "plot " + csv + " every ::1 using 1:($5>0?$5:1/0) with lines title 'degraded reads', " +
       csv + " every ::1 using 1:($6>0?$6:1/0) with lines title 'regenerations pending', " + csv +
       " every ::1 using 1:($7>0?$7:1/0) with lines lw 2 title " + GnuplotQuote(w.loss_title) +
       ", " + csv + " every ::1 using 1:($8>0?$8:1/0) with steps lw 2 title 'server failures'" +
       (any ? "" : ", 0 with lines lc rgb '#cccccc' title 'all zero'") + "\n";
  g += "unset multiplot\n";
  const std::string script = dir + "/timeline.gnuplot";
  TESSERA_RETURN_IF_ERROR(WriteWholeFile(script, g));
  auto res = RunTool({"gnuplot", script}, 30000);
  if (!res.ok()) return res.status();
  if (res->exit_code != 0) return Internal("gnuplot: ", res->output);
  return Status::Ok();
}

void Judge(const ExpectSpec& e, const RunResult& r, const RunResult* healthy,
           const std::string& local_output, const std::vector<RunResult>& all,
           std::vector<Check>* out) {
  auto add = [&](const std::string& name, const std::string& expected, const std::string& measured,
                 bool pass) {
    out->push_back({r.name, name, expected, measured, pass});
  };
  if (!r.error.empty()) add("run completed", "no error", r.error, false);
  if (e.data_loss) {
    add("data_loss", "= " + std::to_string(*e.data_loss),
        std::to_string(r.data_loss) + r.report.loss_unit,
        static_cast<int64_t>(r.data_loss) == *e.data_loss);
  }
  if (e.wrong_bytes) {
    add("wrong_bytes", "= " + std::to_string(*e.wrong_bytes),
        std::to_string(r.wrong_bytes) + " (" + std::to_string(r.reads_checked) +
            r.report.checked_unit + ")",
        static_cast<int64_t>(r.wrong_bytes) == *e.wrong_bytes);
  }
  if (e.identical_output) {
    const bool same = !local_output.empty() && r.output == local_output;
    add("identical_output", *e.identical_output ? "true" : "false",
        same ? "identical to the local run" : "differs from the local run",
        same == *e.identical_output);
  }
  if (e.max_p99_us_during_faults) {
    add("max_p99_us_during_faults", "<= " + Fmt(*e.max_p99_us_during_faults),
        Fmt(r.p99_during_us) + " us", r.p99_during_us <= *e.max_p99_us_during_faults);
  }
  if (e.max_p99_ratio_during_faults) {
    const double ratio = r.p99_before_us > 0 ? r.p99_during_us / r.p99_before_us : kInf;
    add("max_p99_ratio_during_faults", "<= " + Fmt(*e.max_p99_ratio_during_faults, 2),
        Fmt(ratio, 2) + " (" + Fmt(r.p99_during_us) + " / " + Fmt(r.p99_before_us) + " us)",
        ratio <= *e.max_p99_ratio_during_faults);
  }
  if (e.min_throughput_ratio_during_faults) {
    const double ratio = r.median_ops_before > 0 && r.min_ops_during >= 0
                             ? r.min_ops_during / r.median_ops_before
                             : 0;
    add("min_throughput_ratio_during_faults", ">= " + Fmt(*e.min_throughput_ratio_during_faults, 2),
        Fmt(ratio, 2) + " (lowest 300 ms " + Fmt(std::max(0.0, r.min_ops_during), 0) +
            " ops/s vs median 100 ms " + Fmt(r.median_ops_before, 0) + " before)",
        ratio >= *e.min_throughput_ratio_during_faults);
  }
  if (e.regenerated_within_s) {
    add("regenerated_within_s", "<= " + Fmt(*e.regenerated_within_s),
        r.regenerated_after_s < 0 ? "not regenerated" : Fmt(r.regenerated_after_s, 2) + " s",
        r.regenerated_after_s >= 0 && r.regenerated_after_s <= *e.regenerated_within_s);
  }
  if (e.max_slowdown_vs_healthy) {
    const double ratio =
        healthy && healthy->completion_s > 0 ? r.completion_s / healthy->completion_s : kInf;
    add("max_slowdown_vs_healthy", "<= " + Fmt(*e.max_slowdown_vs_healthy, 2),
        Fmt(ratio, 2) + " (" + Fmt(r.completion_s, 2) + " s vs healthy " +
            Fmt(healthy ? healthy->completion_s : 0, 2) + " s)",
        ratio <= *e.max_slowdown_vs_healthy);
  }
  if (e.corruptions_repaired_all) {
    const bool ok = r.corruptions_detected > 0 &&
                    r.corruptions_repaired >= r.corruptions_detected && r.pages.scrub_clean;
    add("corruptions_repaired_all", *e.corruptions_repaired_all ? "true" : "false",
        std::to_string(r.corruptions_detected) + " detected, " +
            std::to_string(r.corruptions_repaired) + " repaired, last scrub pass " +
            (r.pages.scrub_clean ? "clean" : "found new ones"),
        ok == *e.corruptions_repaired_all);
  }
  if (e.data_loss_exactly_affected) {
    const bool ok =
        r.pages.have_affected && r.pages.lost_not_affected == 0 && r.pages.affected_not_lost == 0;
    add("data_loss_exactly_affected", *e.data_loss_exactly_affected ? "true" : "false",
        r.pages.have_affected
            ? std::to_string(r.pages.affected_pages) + " pages on > r failed servers; " +
                  std::to_string(r.pages.affected_not_lost) + " of them read back, " +
                  std::to_string(r.pages.lost_not_affected) + " others lost"
            : "no server failed (nothing to compare)",
        ok == *e.data_loss_exactly_affected);
  }
  if (e.slabs_back_to_baseline) {
    const bool same = r.pages.slabs_baseline >= 0 && r.pages.slabs_end == r.pages.slabs_baseline;
    add("slabs_back_to_baseline", *e.slabs_back_to_baseline ? "true" : "false",
        r.pages.slabs_end < 0 ? "no end census (" + r.pages.slabs_note + ")"
                              : std::to_string(r.pages.slabs_end) + " slabs at the end vs " +
                                    std::to_string(r.pages.slabs_baseline) + " after the fill (" +
                                    r.pages.slabs_note + ")",
        same == *e.slabs_back_to_baseline);
  }
  if (e.false_failures) {
    add("false_failures", "= " + std::to_string(*e.false_failures),
        r.false_failures < 0 ? "not counted"
                             : std::to_string(r.false_failures) + " of the servers no fault failed",
        r.false_failures == *e.false_failures);
  }
  if (e.max_loss_error_vs_prediction) {
    const double err =
        r.predicted_fraction >= 0 ? std::fabs(r.pages.lost_fraction - r.predicted_fraction) : kInf;
    add("max_loss_error_vs_prediction", "<= " + Fmt(*e.max_loss_error_vs_prediction, 3),
        "lost " + Fmt(r.pages.lost_fraction, 3) + " of pages, predicted " +
            (r.predicted_fraction >= 0 ? Fmt(r.predicted_fraction, 3) : "n/a"),
        err <= *e.max_loss_error_vs_prediction);
  }
  for (const RunResult& o : all) {
    if (!e.p99_below_variant.empty() && o.name == e.p99_below_variant) {
      add("p99_below_variant", "read p99 during faults < " + o.name + "'s",
          Fmt(r.p99_during_us) + " us vs " + Fmt(o.p99_during_us) + " us",
          r.p99_during_us < o.p99_during_us);
    }
    if (!e.throughput_above_variant.empty() && o.name == e.throughput_above_variant) {
      add("throughput_above_variant", "lowest 300 ms throughput during faults > " + o.name + "'s",
          Fmt(std::max(0.0, r.min_ops_during), 0) + " vs " +
              Fmt(std::max(0.0, o.min_ops_during), 0) + " ops/s",
          r.min_ops_during > o.min_ops_during);
    }
    if (!e.fewer_lost_than_variant.empty() && o.name == e.fewer_lost_than_variant) {
      add("fewer_lost_than_variant", "pages lost < " + o.name + "'s",
          std::to_string(r.data_loss) + " vs " + std::to_string(o.data_loss),
          r.data_loss < o.data_loss);
    }
  }
}

Result<std::string> WriteSummary(const ExperimentSummary& x) {
  const Scenario& s = *x.scenario;
  const RunOptions& o = *x.options;
  size_t failed = 0;
  for (const Check& c : *x.checks) failed += !c.pass;
  // summary.json
  json j;
  j["scenario"] = s.name;
  j["description"] = s.description;
  j["origin"] = s.origin;
  j["seed"] = s.seed;
  j["quick"] = o.quick;
  j["duration_s"] = s.duration_s;
  j["workload"] = WorkloadJson(s, o.data_dir);
  j["git_revision"] = version::Commit();
  j["version"] = version::Version();
  j["machine"] = Machine();
  j["started_utc"] = x.started_utc;
  j["wall_s"] = x.wall_s;
  if (x.have_local) j["local_run_s"] = x.local_s;
  if (x.healthy != nullptr) j["healthy"] = ResultJson(*x.healthy);
  json runs = json::array();
  for (const RunResult& r : *x.runs) runs.push_back(ResultJson(r));
  j["runs"] = runs;
  json exp = json::array();
  for (const Check& c : *x.checks) {
    exp.push_back({{"run", c.run},
                   {"expectation", c.name},
                   {"expected", c.expected},
                   {"measured", c.measured},
                   {"pass", c.pass}});
  }
  j["expectations"] = exp;
  j["verdict"] = x.passed ? "PASS" : "FAIL";
  j["scenario_toml"] = s.source;
  TESSERA_RETURN_IF_ERROR(WriteWholeFile(o.out_dir + "/summary.json", j.dump(2) + "\n"));

  // summary.md
  std::string md = "# Experiment `" + s.name + "`: " + (x.passed ? "PASS" : "FAIL") + "\n\n";
  if (!s.description.empty()) md += s.description + "\n\n";
  md += "- scenario: `" + s.origin + "`" + (o.quick ? " (--quick)" : "") + ", seed " +
        std::to_string(s.seed) + "\n";
  md += "- git revision: `" + j["git_revision"].get<std::string>() + "`\n";
  md += "- machine: " + j["machine"].value("hostname", std::string()) + ", " +
        std::to_string(j["machine"].value("cpus", 0)) + " CPUs, " +
        std::to_string(j["machine"].value("mem_total_mb", 0)) + " MB, " +
        j["machine"].value("kernel", std::string()) + "\n";
  md += "- started " + x.started_utc + ", wall time " + Fmt(x.wall_s, 1) + " s\n";
  if (x.have_local) md += "- local run (no tessera): " + Fmt(x.local_s, 2) + " s\n";
  md +=
      "\n## Expectations\n\n| run | expectation | expected | measured | result "
      "|\n|---|---|---|---|---|\n";
  for (const Check& c : *x.checks) {
    md += "| " + c.run + " | " + c.name + " | " + c.expected + " | " + c.measured + " | " +
          (c.pass ? "PASS" : "**FAIL**") + " |\n";
  }
  if (x.checks->empty()) md += "| - | (no expectations given) | - | - | **FAIL** |\n";
  md += "\n## Runs\n\n";
  auto describe = [&](const RunResult& r, const std::string& dir) {
    md += "### " + r.name + "\n\n";
    md += r.report.md;
    md += "- data loss " + std::to_string(r.data_loss) + ", wrong bytes " +
          std::to_string(r.wrong_bytes) + ", server failures " + std::to_string(r.server_failures) +
          ", regenerations " + std::to_string(r.regenerations_done) + ", degraded reads " +
          std::to_string(r.degraded_reads) + ", corruptions detected/repaired " +
          std::to_string(r.corruptions_detected) + "/" + std::to_string(r.corruptions_repaired) +
          "\n";
    if (!r.partition_mode.empty()) md += "- partition: " + r.partition_mode + "\n";
    if (!r.prediction_cmd.empty()) md += "- prediction: `" + r.prediction_cmd + "`\n";
    if (!r.error.empty()) md += "- error: " + r.error + "\n";
    for (const FaultRecord& f : r.faults) {
      md += "- t=" + Fmt(f.t, 2) + " s: " + f.what;
      if (!f.servers.empty()) {
        md += " (servers";
        for (size_t i : f.servers) md += " " + std::to_string(i);
        md += ")";
      }
      if (!f.note.empty()) md += ": " + f.note;
      md += "\n";
    }
    md += "\n![timeline](" + dir + "timeline.png)\n\n";
  };
  if (x.healthy != nullptr) describe(*x.healthy, "healthy/");
  for (const RunResult& r : *x.runs) describe(r, s.variants.empty() ? "" : r.name + "/");
  md += "Verdict: **" + std::string(x.passed ? "PASS" : "FAIL") + "** (" +
        std::to_string(x.checks->size() - failed) + " of " + std::to_string(x.checks->size()) +
        " expectations hold)\n";
  TESSERA_RETURN_IF_ERROR(WriteWholeFile(o.out_dir + "/summary.md", md));
  return md;
}

}  // namespace tessera::experiment
