// Results of an experiment: what one run measured (RunResult), the verdict's checks, and the
// files written from them: OUT/timeline.csv, OUT/timeline.png (gnuplot), OUT/summary.json and
// OUT/summary.md. The JSON keys, the CSV columns and the expectation names are read by tests,
// docs and scripts: they do not change.
//
// Threads: plain values and free functions; any thread.
#pragma once

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "apps/experiment/runner.h"
#include "apps/experiment/scenario.h"
#include "common/histogram.h"
#include "common/status.h"

namespace tessera::experiment {

// One 100 ms sample of a run.
struct Sample {
  double t = 0;
  double ops_per_s = 0;
  double p50_us = 0, p99_us = 0;
  uint64_t degraded_reads = 0, regenerations_pending = 0, data_loss = 0, server_failures = 0;
  double cpu_pct = 0, rss_mb = 0;
  bool during = false;  // A fault was active at some point of this interval.
};

struct FaultRecord {
  double t = 0;
  std::string what;  // "kill server:2 -> servers 2"
  std::vector<size_t> servers;
  std::string note;  // errors, fallbacks
  bool ok = true;
};

// The part of a run's results that depends on its workload kind, filled by the workload
// (Workload::Report) once the run's figures are known.
struct WorkloadReport {
  nlohmann::json json = nlohmann::json::object();  // Keys added to the run's JSON object.
  std::string md;  // summary.md lines of the run: its cluster and what the workload did.
  // Words of the plot and the verdict.
  std::string rate_axis = "page ops/s";
  std::string rate_title = "ops/s";
  std::string p50_title = "read p50";
  std::string p99_title = "read p99";
  std::string loss_title = "data loss (pages)";
  std::string loss_unit = " pages";             // after data_loss's count
  std::string checked_unit = " reads checked";  // after reads_checked's count
};

// Only the pagestore fills these: its checks of lost pages against the failed servers, and
// the slab census.
struct PageLossResult {
  uint64_t affected_pages = 0, lost_not_affected = 0, affected_not_lost = 0;
  bool have_affected = false;
  double lost_fraction = 0;
  bool scrub_clean = true;  // The last verify pass found no new corruption.
  // slabs_back_to_baseline: slab census after the fill and at the end (-1: not taken).
  int64_t slabs_baseline = -1, slabs_end = -1;
  std::string slabs_note;
  // With an orphan grace: when (NowS()) the end census first saw no orphaned owner (the slabs
  // of every killed client reclaimed); -1: not waited for.
  double orphans_cleared_at = -1;
  uint64_t orphan_slabs_reclaimed = 0;  // Sum of the servers' STATS at the end.
};

// One run of a scenario (a variant, or the healthy baseline).
struct RunResult {
  std::string name;
  bool healthy = false;  // The no-fault baseline.
  ClusterSpec cluster;
  std::vector<Sample> samples;
  std::vector<FaultRecord> faults;
  std::string partition_mode;  // "" when no partition fault ran.
  std::string hosts;           // loopback | netns (what the cluster really ran on, and why)
  double completion_s = 0;
  double p99_before_us = 0, p99_during_us = 0, p50_before_us = 0, p50_during_us = 0;
  // From the 100 ms samples: the worst p99 and lowest throughput while faults were active, and
  // the median throughput before the first fault.
  double worst_p99_during_us = 0, min_ops_during = -1, median_ops_before = 0;
  uint64_t data_loss = 0;  // Pages, acknowledged PUTs, or the store's count (run).
  uint64_t wrong_bytes = 0, wrong_pages = 0, read_errors = 0, write_errors = 0;
  uint64_t reads_checked = 0;
  uint64_t corruptions_detected = 0, corruptions_repaired = 0;
  double regenerated_after_s = -1;  // -1: not measured / never.
  uint64_t server_failures = 0, regenerations_done = 0, degraded_reads = 0;
  // Servers the store declared failed that no fault failed for good (a stopped server, a
  // healthy one failed on an etcd lease expiry); -1: not counted.
  int64_t false_failures = -1;
  PageLossResult pages;
  // Loss prediction (`tessera sim placement`).
  double predicted_fraction = -1;
  std::string prediction_cmd;
  int exit_code = 0;   // The program's (kind = run); 0 for the others.
  std::string output;  // The program's stdout (kind = run).
  std::string error;   // A run-time error that ended this run.
  WorkloadReport report;
};

// The run's read latencies before and during the faults, from phase histograms.
void SetPhaseLatencies(const LatencyHistogram& before, const LatencyHistogram& during,
                       RunResult* r);

// Fills the figures of the 100 ms samples: worst p99 and lowest 300 ms throughput during the
// faults, median throughput before the first fault, counting only samples up to `load_end_t`
// (seconds since t = 0: when the load ended).
void SummarizeSamples(double load_end_t, RunResult* r);

// "- cluster: 8 memservers in 2 racks, RS(4,2) delta 1, ...": the summary.md line of a run on
// an erasure-coded store.
std::string ErasureCodedClusterLine(const RunResult& r);

// "1.5", "inf".
std::string Fmt(double v, int prec = 1);

Status WriteTimeline(const RunResult& r, const std::string& dir);
// timeline.png: throughput, latency and recovery counters over time, faults marked.
Status WritePlot(const RunResult& r, const std::string& dir, const std::string& title);

// One expectation judged.
struct Check {
  std::string run;   // variant name ("" = the scenario)
  std::string name;  // expectation key
  std::string expected;
  std::string measured;
  bool pass = false;
};

// Judges the expectations `e` on run `r`; `all` holds every variant's run (for the comparisons
// between variants), `healthy` the baseline when there is one.
void Judge(const ExpectSpec& e, const RunResult& r, const RunResult* healthy,
           const std::string& local_output, const std::vector<RunResult>& all,
           std::vector<Check>* out);

// What RunExperiment writes at the end besides the runs.
struct ExperimentSummary {
  const Scenario* scenario = nullptr;
  const RunOptions* options = nullptr;
  std::string started_utc;
  double wall_s = 0;
  bool have_local = false;  // A local run (no tessera) was timed.
  double local_s = 0;
  const RunResult* healthy = nullptr;
  const std::vector<RunResult>* runs = nullptr;
  const std::vector<Check>* checks = nullptr;
  bool passed = false;
};

// Writes OUT/summary.json and OUT/summary.md; returns the markdown.
Result<std::string> WriteSummary(const ExperimentSummary& x);

}  // namespace tessera::experiment
