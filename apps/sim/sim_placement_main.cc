// `tessera sim placement`: compares placement policies under simultaneous, correlated
// failures. For each policy it places N*S slabs (tracking load as it goes), then reports the
// probability that a failure of f*N machines (or whole racks) loses data, by Monte Carlo with
// a 95% confidence interval and analytically (hypergeometric), the expected fraction of data
// lost, the load imbalance, and the slabs that must move when a server leaves or joins.
#include <gflags/gflags.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "apps/cli/cli.h"
#include "common/clock.h"
#include "common/report.h"
#include "common/subprocess.h"
#include "placement/placement.h"
#include "placement/simulator.h"

DEFINE_uint64(machines, 1000, "Memory servers N");
DEFINE_uint64(slabs_per_machine, 32, "Slabs per machine S (N*S slabs are placed)");
DEFINE_int32(k, 8, "Data splits per slab");
DEFINE_int32(r, 2, "Parity splits per slab");
DEFINE_int32(l, 2, "CodingSets load-balancing slack (group size k+r+l)");
DEFINE_int32(replication, 3, "Copies for replication policies named without ':R'");
DEFINE_int32(choices, 2, "Servers sampled per split by 'power' named without ':D'");
DEFINE_int32(scatter_width, 4, "CopySets scatter width");
DEFINE_double(failure_fraction, 0.01, "Fraction f of machines (or racks) failing together");
DEFINE_string(failure_mode, "machines", "What fails together: 'machines' or 'racks'");
DEFINE_uint64(racks, 0, "Racks (contiguous blocks of servers); 0 = no rack labels");
DEFINE_uint64(trials, 10000, "Monte Carlo failure trials per policy");
DEFINE_uint64(seed, 1, "Seed for placement and failures");
DEFINE_string(policies, "codingsets,random,power:2,random_rep:2,random_rep:3,copysets:3",
              "Comma-separated: codingsets, random, power[:D], random_rep[:R], copysets[:R]");
DEFINE_string(mode, "both", "Loss estimate: 'mc' (Monte Carlo), 'analytic' or 'both'");
DEFINE_bool(churn, true, "Measure slabs moved when one server leaves and one joins");
DEFINE_bool(json, false, "Print JSON lines instead of a table");
DEFINE_bool(csv, false, "Print CSV instead of a table");
DEFINE_string(plot, "", "Write a PNG of loss probability versus f for all policies here");
DEFINE_string(plot_fractions, "0.002,0.005,0.01,0.02,0.05,0.1", "Values of f for --plot");
DEFINE_uint64(plot_trials, 2000, "Monte Carlo trials per point of --plot");

namespace {

using tessera::Report;
namespace pl = tessera::placement;

const tessera::cli::CliSpec kSpec = {
    "tessera sim placement",
    "[--machines N] [--slabs_per_machine S] [--k K --r R --l L] [--failure_fraction F] "
    "[--policies LIST] [--json|--csv] [--plot FILE.png]",
    "Simulates placement policies under simultaneous, correlated failures of f*N machines "
    "(or whole racks) and reports, per policy, the probability of losing data (Monte Carlo "
    "with a 95% CI, and analytic), the expected fraction of data lost, load imbalance and "
    "slabs moved on a membership change.",
    __FILE__};

std::string Num(double v) { return Report::Format(Report::Value(v)); }

std::string CiText(const pl::MonteCarloResult& mc) {
  if (mc.loss_events == 0) return "<" + Num(mc.loss_ci.hi) + " (95% CI)";
  return "[" + Num(mc.loss_ci.lo) + ", " + Num(mc.loss_ci.hi) + "]";
}

std::vector<double> ParseFractions(const std::string& text) {
  std::vector<double> out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string::npos) comma = text.size();
    std::string word = text.substr(start, comma - start);
    char* end = nullptr;
    double v = std::strtod(word.c_str(), &end);
    if (word.empty() || *end != '\0' || !(v > 0 && v <= 1)) {
      tessera::cli::UsageError(kSpec, "bad --plot_fractions entry '" + word +
                                          "' (need numbers in (0, 1])");
    }
    out.push_back(v);
    start = comma + 1;
  }
  return out;
}

void PrintCsv(const std::vector<Report::Row>& rows) {
  std::vector<std::string> cols;
  for (const auto& r : rows)
    for (const auto& [k, v] : r.fields())
      if (std::find(cols.begin(), cols.end(), k) == cols.end()) cols.push_back(k);
  auto quote = [](const std::string& s) {
    if (s.find_first_of(",\"\n") == std::string::npos) return s;
    std::string q = "\"";
    for (char c : s) q += (c == '"') ? std::string("\"\"") : std::string(1, c);
    return q + "\"";
  };
  for (size_t c = 0; c < cols.size(); ++c) std::printf("%s%s", c ? "," : "", cols[c].c_str());
  std::printf("\n");
  for (const auto& r : rows) {
    for (size_t c = 0; c < cols.size(); ++c) {
      std::string cell;
      for (const auto& [k, v] : r.fields()) {
        if (k != cols[c]) continue;
        if (const auto* d = std::get_if<double>(&v)) {
          char buf[64];
          std::snprintf(buf, sizeof(buf), "%.6g", *d);
          cell = buf;
        } else {
          cell = quote(Report::Format(v));
        }
      }
      std::printf("%s%s", c ? "," : "", cell.c_str());
    }
    std::printf("\n");
  }
  std::fflush(stdout);
}

[[noreturn]] void Fail(const tessera::Status& st) {
  std::fprintf(stderr, "tessera sim placement: %s\n", st.ToString().c_str());
  std::exit(1);
}

struct PolicyRun {
  pl::PlacementPtr policy;
  pl::PlacedSlabs placed;
};

// Writes the sweep data and a gnuplot script next to the PNG and runs gnuplot.
tessera::Status Plot(const std::string& png, const std::vector<PolicyRun>& runs,
                     const std::vector<double>& fractions, const pl::MembershipSnapshot& snap,
                     pl::FailureMode mode, std::vector<Report::Row>* sweep_rows) {
  std::string data_path = png + ".dat";
  std::string script_path = png + ".gp";
  std::ofstream data(data_path);
  if (!data) return tessera::ErrnoError("open ", data_path);
  for (size_t p = 0; p < runs.size(); ++p) {
    data << "# " << runs[p].policy->name() << "\n";
    for (double f : fractions) {
      pl::FailureModel model{mode, f};
      TESSERA_ASSIGN_OR_RETURN(auto mc, pl::RunMonteCarlo(runs[p].placed, snap, model,
                                                          FLAGS_plot_trials, FLAGS_seed + 7));
      pl::AnalyticResult an = pl::ComputeAnalytic(runs[p].placed, snap, model);
      double analytic = an.available ? static_cast<double>(an.loss_prob) : NAN;
      // A log axis cannot show 0: a Monte Carlo point with no losses is left out (NaN);
      // the table below the plot gives its CI bound.
      std::string shown = mc.loss_events > 0 ? std::to_string(mc.loss_prob) : "NaN";
      data << f << " " << shown << " " << mc.loss_ci.lo << " " << mc.loss_ci.hi << " "
           << (std::isnan(analytic) || analytic <= 0 ? std::string("NaN")
                                                      : std::to_string(analytic))
           << " " << (mc.loss_events > 0 ? 1 : 0) << "\n";
      Report::Row row;
      row.Set("sweep", "loss_vs_f").Set("policy", runs[p].policy->name()).Set("f", f);
      if (mc.loss_events > 0) {
        row.Set("mc_loss_prob", mc.loss_prob);
      } else {
        row.Set("mc_loss_prob", "<" + Num(mc.loss_ci.hi) + " (95% CI)");
      }
      row.Set("analytic_loss_prob", analytic);
      sweep_rows->push_back(std::move(row));
    }
    data << "\n\n";
  }
  data.close();
  std::ofstream gp(script_path);
  if (!gp) return tessera::ErrnoError("open ", script_path);
  gp << "set terminal png size 1000,650\n"
     << "set output '" << png << "'\n"
     << "set title \"P(data loss) vs fraction of "
     << (mode == pl::FailureMode::kRacks ? "racks" : "machines") << " failed (N="
     << snap.alive().size() << ", " << FLAGS_slabs_per_machine << " slabs/machine)\\n"
     << "lines: analytic; points: Monte Carlo with 95% CI (runs with no loss omitted)\"\n"
     << "set xlabel 'failure fraction f'\nset ylabel 'probability of data loss'\n"
     << "set logscale xy\nset yrange [1e-7:1.5]\nset key outside right\nset grid\n"
     << "plot ";
  for (size_t p = 0; p < runs.size(); ++p) {
    if (p) gp << ", \\\n     ";
    gp << "'" << data_path << "' index " << p << " using 1:5 with lines lw 2 lc " << p + 1
       << " title '" << runs[p].policy->name() << "', '" << data_path << "' index " << p
       << " using 1:2:3:4 with yerrorbars pt 7 lc " << p + 1 << " notitle";
  }
  gp << "\n";
  gp.close();
  TESSERA_ASSIGN_OR_RETURN(auto proc, tessera::Subprocess::Start({"gnuplot", script_path}));
  TESSERA_ASSIGN_OR_RETURN(int status, proc.Wait(tessera::Deadline::AfterMs(60000)));
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return tessera::Unavailable("gnuplot failed on ", script_path,
                                " (is gnuplot installed? Debian package gnuplot-nox)");
  }
  if (::access(png.c_str(), F_OK) != 0) return tessera::ErrnoError("gnuplot wrote no ", png);
  return tessera::Status::Ok();
}

bool OnPath(const std::string& program) {
  const char* path = std::getenv("PATH");
  if (!path) return false;
  std::string p = path;
  size_t start = 0;
  while (start <= p.size()) {
    size_t colon = p.find(':', start);
    if (colon == std::string::npos) colon = p.size();
    std::string file = p.substr(start, colon - start) + "/" + program;
    if (::access(file.c_str(), X_OK) == 0) return true;
    start = colon + 1;
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  tessera::cli::InitCli(kSpec, &argc, &argv);
  using tessera::cli::UsageError;
  if (FLAGS_json && FLAGS_csv) UsageError(kSpec, "--json and --csv are exclusive");
  if (FLAGS_machines < 1 || FLAGS_machines > 1000000) UsageError(kSpec, "--machines must be in [1, 1000000]");
  if (FLAGS_slabs_per_machine < 1 || FLAGS_machines * FLAGS_slabs_per_machine > 100000000) {
    UsageError(kSpec, "--slabs_per_machine must be >= 1 and N*S at most 1e8");
  }
  if (FLAGS_k < 1 || FLAGS_r < 0 || FLAGS_l < 0 || FLAGS_k + FLAGS_r > 32) {
    UsageError(kSpec, "need --k >= 1, --r >= 0, --l >= 0 and k+r <= 32");
  }
  if (FLAGS_r >= 255 || FLAGS_replication < 2 || FLAGS_replication > 16) {
    UsageError(kSpec, "--replication must be in [2, 16]");
  }
  if (FLAGS_choices < 1 || FLAGS_choices > 64) UsageError(kSpec, "--choices must be in [1, 64]");
  if (FLAGS_scatter_width < 1) UsageError(kSpec, "--scatter_width must be >= 1");
  if (!(FLAGS_failure_fraction >= 0 && FLAGS_failure_fraction <= 1)) {
    UsageError(kSpec, "--failure_fraction must be in [0, 1]");
  }
  pl::FailureMode mode;
  if (FLAGS_failure_mode == "machines") {
    mode = pl::FailureMode::kMachines;
  } else if (FLAGS_failure_mode == "racks") {
    mode = pl::FailureMode::kRacks;
    if (FLAGS_racks == 0) UsageError(kSpec, "--failure_mode=racks needs --racks > 0");
  } else {
    UsageError(kSpec, "--failure_mode must be 'machines' or 'racks'");
  }
  if (FLAGS_racks > FLAGS_machines) UsageError(kSpec, "--racks cannot exceed --machines");
  if (FLAGS_trials < 1 || FLAGS_trials > 100000000) UsageError(kSpec, "--trials must be in [1, 1e8]");
  if (FLAGS_plot_trials < 1) UsageError(kSpec, "--plot_trials must be >= 1");
  if (FLAGS_mode != "both" && FLAGS_mode != "mc" && FLAGS_mode != "analytic") {
    UsageError(kSpec, "--mode must be 'mc', 'analytic' or 'both'");
  }
  const bool want_mc = FLAGS_mode != "analytic";
  const bool want_analytic = FLAGS_mode != "mc";
  std::vector<double> fractions;
  if (!FLAGS_plot.empty()) {
    fractions = ParseFractions(FLAGS_plot_fractions);
    if (FLAGS_plot.find_first_of("'\"\n") != std::string::npos) {
      UsageError(kSpec, "--plot path must not contain quotes or newlines");
    }
    if (!OnPath("gnuplot")) {
      std::fprintf(stderr,
                   "tessera sim placement: --plot needs gnuplot, which is not installed "
                   "(Debian package gnuplot-nox)\n");
      return 1;
    }
  }
  pl::PolicySpec defaults;
  defaults.k = FLAGS_k;
  defaults.r = FLAGS_r;
  defaults.l = FLAGS_l;
  defaults.replicas = FLAGS_replication;
  defaults.choices = FLAGS_choices;
  defaults.scatter_width = FLAGS_scatter_width;
  defaults.seed = FLAGS_seed;
  auto specs = pl::ParsePolicyList(FLAGS_policies, defaults);
  if (!specs.ok()) UsageError(kSpec, specs.status().message());

  auto snap_or = pl::MakeUniformCluster(FLAGS_machines, UINT32_MAX, FLAGS_racks);
  if (!snap_or.ok()) Fail(snap_or.status());
  pl::SnapshotPtr snap = *snap_or;
  pl::FailureModel model{mode, FLAGS_failure_fraction};
  auto failed = pl::FailedUnits(*snap, model);
  if (!failed.ok()) UsageError(kSpec, failed.status().message());
  const uint64_t num_slabs = FLAGS_machines * FLAGS_slabs_per_machine;

  // The membership changes for the churn figures: one server leaves; one joins.
  pl::SnapshotPtr after_leave;
  pl::SnapshotPtr after_join;
  if (FLAGS_churn) {
    pl::ServerId leaving = static_cast<pl::ServerId>(
        pl::HashMix(FLAGS_seed, 0x1ea7e) % FLAGS_machines);
    auto l = snap->WithServerRemoved(leaving);
    if (!l.ok()) Fail(l.status());
    after_leave = *l;
    pl::ServerInfo joiner;
    joiner.id = static_cast<pl::ServerId>(FLAGS_machines);
    joiner.address = "sim://" + std::to_string(FLAGS_machines);
    joiner.capacity_slabs = joiner.free_slabs = UINT32_MAX;
    if (FLAGS_racks > 0) joiner.rack = "rack-" + std::to_string(FLAGS_machines % FLAGS_racks);
    auto j = snap->WithServerAdded(joiner);
    if (!j.ok()) Fail(j.status());
    after_join = *j;
  }

  uint64_t start_ns = tessera::MonotonicNs();
  std::vector<Report::Row> rows;
  std::vector<PolicyRun> runs;
  std::vector<std::string> notes;
  for (const auto& spec : *specs) {
    auto policy = pl::CreatePolicy(spec, snap);
    if (!policy.ok()) Fail(policy.status());
    auto placed = pl::PlaceAll(**policy, *snap, num_slabs);
    if (!placed.ok()) Fail(placed.status().WithContext((*policy)->name()));
    Report::Row row;
    row.Set("policy", (*policy)->name()).Set("overhead", (*policy)->overhead());
    row.Set("failed", static_cast<uint64_t>(*failed));
    if (want_mc) {
      auto mc = pl::RunMonteCarlo(*placed, *snap, model, FLAGS_trials, FLAGS_seed);
      if (!mc.ok()) Fail(mc.status());
      if (FLAGS_json || FLAGS_csv) {
        row.Set("loss_prob", mc->loss_prob)
            .Set("loss_ci_lo", mc->loss_ci.lo)
            .Set("loss_ci_hi", mc->loss_ci.hi)
            .Set("loss_events", mc->loss_events)
            .Set("trials", mc->trials);
      } else {
        row.Set("loss_prob", mc->loss_events > 0 ? Num(mc->loss_prob) : std::string("0"))
            .Set("loss_95ci", CiText(*mc));
      }
      row.Set("lost_frac", mc->mean_lost_fraction);
    }
    if (want_analytic) {
      pl::AnalyticResult an = pl::ComputeAnalytic(*placed, *snap, model);
      if (an.available) {
        row.Set("analytic_loss", static_cast<double>(an.loss_prob))
            .Set("analytic_lost_frac", static_cast<double>(an.lost_fraction));
      } else {
        row.Set("analytic_loss", "n/a");
      }
      row.Set("method", an.method);
    }
    pl::LoadStats ls = pl::ComputeLoadStats(*snap, placed->load);
    row.Set("max/mean", ls.max_over_mean).Set("max/min", ls.max_over_min);
    if (FLAGS_churn) {
      auto leave = pl::SimulateChurn(**policy, *snap, *placed, after_leave);
      if (!leave.ok()) Fail(leave.status().WithContext((*policy)->name() + " leave"));
      auto join = pl::SimulateChurn(**policy, *snap, *placed, after_join);
      if (!join.ok()) Fail(join.status().WithContext((*policy)->name() + " join"));
      row.Set("moved_leave", leave->slabs_moved)
          .Set("splits_leave", leave->splits_moved)
          .Set("moved_join", join->slabs_moved);
    }
    std::string note = (*policy)->layout_note();
    if (!note.empty()) {
      if (FLAGS_json || FLAGS_csv) row.Set("note", note);
      notes.push_back((*policy)->name() + ": " + note);
    }
    rows.push_back(std::move(row));
    runs.push_back({*policy, std::move(*placed)});
  }
  double elapsed_s = static_cast<double>(tessera::MonotonicNs() - start_ns) / 1e9;

  std::vector<Report::Row> sweep_rows;
  if (!FLAGS_plot.empty()) {
    tessera::Status st = Plot(FLAGS_plot, runs, fractions, *snap, mode, &sweep_rows);
    if (!st.ok()) Fail(st);
  }

  if (FLAGS_csv) {
    PrintCsv(rows);
    if (!sweep_rows.empty()) {
      std::printf("\n");
      PrintCsv(sweep_rows);
    }
  } else {
    Report rep(FLAGS_json);
    char title[512];
    std::snprintf(title, sizeof(title),
                  "placement: N=%llu S=%llu slabs=%llu k=%d r=%d l=%d, %zu %s of %llu fail "
                  "together (f=%g), %llu trials, seed %llu, %.2f s",
                  static_cast<unsigned long long>(FLAGS_machines),
                  static_cast<unsigned long long>(FLAGS_slabs_per_machine),
                  static_cast<unsigned long long>(num_slabs), FLAGS_k, FLAGS_r, FLAGS_l,
                  *failed, mode == pl::FailureMode::kRacks ? "racks" : "machines",
                  static_cast<unsigned long long>(mode == pl::FailureMode::kRacks
                                                      ? FLAGS_racks
                                                      : FLAGS_machines),
                  FLAGS_failure_fraction, static_cast<unsigned long long>(FLAGS_trials),
                  static_cast<unsigned long long>(FLAGS_seed), elapsed_s);
    rep.Title(title);
    for (auto& r : rows) rep.Add(std::move(r));
    rep.Flush();
    if (!FLAGS_json) {
      for (const auto& n : notes) std::printf("note: %s\n", n.c_str());
    }
    if (!sweep_rows.empty()) {
      rep.Title("loss probability versus f (plot " + FLAGS_plot + ")");
      for (auto& r : sweep_rows) rep.Add(std::move(r));
      rep.Flush();
    }
  }
  if (!FLAGS_plot.empty() && !FLAGS_json && !FLAGS_csv) {
    std::printf("wrote %s\n", FLAGS_plot.c_str());
  }
  return 0;
}
