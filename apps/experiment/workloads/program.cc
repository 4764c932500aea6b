// kind = run: an unmodified program under `tessera run`, paged to the scenario's memservers.
// Its stdout lines are the events at_event faults match; the pager's live statistics file
// gives the samples (page faults per second, the fault latency it publishes, the store's
// counters); its output is compared with a local run's by the runner (identical_output).
// kind = swap (workloads/swap.cc) is the same program under `tessera run --pager swap`: the
// faults are then the kernel's swap-ins, and the latency is the swap device's store reads (the
// kernel does not time its swap-ins).
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "apps/experiment/tools.h"
#include "apps/experiment/workload.h"
#include "apps/experiment/workloads/program.h"
#include "common/clock.h"
#include "common/subprocess.h"
#include "common/units.h"

namespace tessera::experiment {
namespace {

using json = nlohmann::json;

class ProgramWorkload : public Workload {
 public:
  ProgramWorkload(const RunContext& ctx, Pager pager)
      : pager_(pager),
        w_(ctx.workload().run),
        live_(ctx.dir() + "/live_stats"),
        stats_(ctx.dir() + "/run_stats.json"),
        stderr_(ctx.dir() + "/stderr.txt") {}

  Status Start(RunContext&) override { return Status::Ok(); }

  Status Run(RunContext& ctx, RunResult* r) override {
    const ClusterSpec& c = ctx.cluster_spec();
    const RunOptions& o = ctx.options();
    std::vector<std::string> cmd = ExpandCommand(w_.command, o.data_dir);
    std::vector<std::string> argv = {"/bin/sh",
                                     "-c",
                                     "exec \"$0\" \"$@\" 2>\"$TESSERA_EXPERIMENT_STDERR\"",
                                     o.bin_dir + "/tessera-run",
                                     "--cluster=" + ctx.cluster_file(),
                                     "--auth_token_file=" + ctx.cluster().token_path(),
                                     "--k=" + std::to_string(c.k),
                                     "--r=" + std::to_string(c.r),
                                     "--local_memory=" + w_.local_memory,
                                     "--layout=" + c.layout,
                                     "--stats_json=" + stats_,
                                     "--live_stats_file=" + live_,
                                     "--progress=false",
                                     pager_ == Pager::kSwap ? "--pager=swap" : "--pager=uffd",
                                     "--"};
    if (pager_ == Pager::kSwap) {
      // `tessera swap on` refuses a device the cluster cannot hold: size it to half of what the
      // servers left after r failures hold at RS(k, r), at most tessera run's 8G region.
      const uint64_t capacity = ParseSize(c.capacity).value();  // The scenario parser checked it.
      const uint64_t survivors = static_cast<uint64_t>(std::max(c.memservers - c.r, 1));
      const uint64_t size = std::min<uint64_t>(
          survivors * capacity / static_cast<uint64_t>(c.k + c.r) * static_cast<uint64_t>(c.k) / 2,
          8ull << 30);
      argv.insert(argv.end() - 1, "--swap_size=" + std::to_string(size & ~((1ull << 20) - 1)));
    }
    argv.insert(argv.end(), cmd.begin(), cmd.end());
    Subprocess::Options so;
    so.capture_stdout = true;
    so.extra_env = {"TESSERA_EXPERIMENT_STDERR=" + stderr_};
    const double t0 = NowS();
    TESSERA_ASSIGN_OR_RETURN(Subprocess proc, Subprocess::Start(argv, so));
    Deadline deadline(MonotonicNs() + static_cast<uint64_t>(ctx.scenario().duration_s * 1e9));
    while (true) {
      auto line = proc.ReadLine(Deadline::AfterMs(100));
      if (line.ok()) {
        r->output += *line + "\n";
        ctx.Event(*line);
        continue;
      }
      if (line.status().code() != StatusCode::kTimeout) break;  // EOF
      if (ctx.cancelled() || deadline.Expired()) {
        timed_out_ = deadline.Expired();
        proc.Signal(SIGTERM).IgnoreError();
        break;
      }
    }
    auto ws = proc.Wait(Deadline::AfterMs(10000));
    if (!ws.ok()) {
      proc.Signal(SIGKILL).IgnoreError();
      ws = proc.Wait(Deadline::AfterMs(5000));
    }
    r->completion_s = NowS() - t0;
    if (ws.ok()) r->exit_code = WIFEXITED(*ws) ? WEXITSTATUS(*ws) : 128 + WTERMSIG(*ws);
    return Status::Ok();
  }

  // The shim rewrites the live file about twice a second with its own clock (elapsed_ns): the
  // rate is taken between two of its snapshots and held until the next one.
  WorkloadSample Sample() override {
    WorkloadSample w;
    std::istringstream in(ReadWholeFile(live_));
    std::string k;
    uint64_t v;
    std::map<std::string, uint64_t> m;
    while (in >> k >> v) m[k] = v;
    w.ops = m["faults"] + m["wp_faults"];
    const uint64_t elapsed = m["elapsed_ns"];
    if (elapsed > prev_elapsed_) {
      rate_ = static_cast<double>(w.ops - std::min(w.ops, prev_ops_)) * 1e9 /
              static_cast<double>(elapsed - prev_elapsed_);
      prev_elapsed_ = elapsed;
      prev_ops_ = w.ops;
    }
    w.rate = rate_;
    const bool swap = pager_ == Pager::kSwap;
    w.p50_us = m[swap ? "store_read_p50_ns" : "fault_p50_ns"] / 1e3;
    w.p99_us = m[swap ? "store_read_p99_ns" : "fault_p99_ns"] / 1e3;
    w.degraded_reads = m["store_degraded_reads"];
    w.data_loss = m["store_data_loss"];
    w.server_failures = m["store_server_failures"];
    return w;
  }

  Status Verify(RunContext&, RunResult*) override { return Status::Ok(); }

  Status Finish(RunContext& ctx, RunResult* r) override {
    WriteWholeFile(ctx.dir() + "/stdout.txt", r->output).IgnoreError();
    auto j = json::parse(ReadWholeFile(stats_), nullptr, false);
    if (!j.is_discarded() && j.is_object()) {
      r->data_loss = j.value("store_data_loss", uint64_t{0});
      r->server_failures = j.value("store_server_failures", uint64_t{0});
      r->regenerations_done = j.value("store_regenerations_done", uint64_t{0});
      r->degraded_reads = j.value("store_degraded_reads", uint64_t{0});
      if (j.contains("elapsed_s")) r->completion_s = j["elapsed_s"].get<double>();
    }
    // p99 before / during faults: the shim publishes a cumulative fault-latency p99; take its
    // largest value in each window.
    for (const experiment::Sample& s : r->samples) {
      const bool during = !r->faults.empty() && s.t >= r->faults.front().t;
      double& p = during ? r->p99_during_us : r->p99_before_us;
      p = std::max(p, s.p99_us);
    }
    if (timed_out_) {
      return Timeout("the program ran past duration_s (", ctx.scenario().duration_s, " s)");
    }
    if (ctx.cancelled()) return Cancelled("cancelled");
    if (r->exit_code != 0) {
      std::string tail = ReadWholeFile(stderr_);
      if (tail.size() > 600) tail = "..." + tail.substr(tail.size() - 600);
      r->error = "the program exited with " + std::to_string(r->exit_code) + "; stderr: " + tail;
    }
    return Status::Ok();
  }

  void Report(const RunResult& r, WorkloadReport* out) const override {
    const bool swap = pager_ == Pager::kSwap;
    const std::string faults = swap ? "swap-ins" : "page faults";
    const std::string latency = swap ? "swap device's store read" : "fault";
    out->md = ErasureCodedClusterLine(r);
    out->md += "- pager " + std::string(swap ? "swap (a private `tessera swap` device)" : "uffd") +
               "; completion " + Fmt(r.completion_s, 2) + " s; " + faults +
               "/s median before faults " + Fmt(r.median_ops_before, 0) + ", lowest 300 ms during " +
               Fmt(std::max(0.0, r.min_ops_during), 0) + "; " + latency +
               " latency p99 (cumulative) " + Fmt(r.p99_before_us) + " us before faults, " +
               Fmt(r.p99_during_us) + " us after\n";
    out->rate_axis = faults + "/s";
    out->rate_title = swap ? "swap-ins/s" : "faults/s";
    out->p50_title = swap ? "store read p50 (cumulative)" : "fault p50 (cumulative)";
    out->p99_title = swap ? "store read p99 (cumulative)" : "fault p99 (cumulative)";
    out->loss_title = "data loss (reads)";
    out->loss_unit = " reads";
  }

 private:
  const Pager pager_;
  ProgramOptions w_;
  std::string live_, stats_, stderr_;
  bool timed_out_ = false;
  uint64_t prev_elapsed_ = 0, prev_ops_ = 0;
  double rate_ = 0;
};

}  // namespace

std::unique_ptr<Workload> MakeProgramWorkload(const RunContext& ctx, Pager pager) {
  return std::make_unique<ProgramWorkload>(ctx, pager);
}

extern const WorkloadType kProgramWorkload = {
    WorkloadKind::kRun, "",
    [](const RunContext& ctx) { return MakeProgramWorkload(ctx, Pager::kUffd); },
    [](const Scenario&) { return Status::Ok(); }};

}  // namespace tessera::experiment
