// kind = paramsvc: `tessera paramsvc serve` with its checkpoints erasure-coded on the
// scenario's memservers, and `workers` training workers doing PushPull rounds of deterministic
// gradients until the model reaches its version. The aggregation process is the target
// `aggregator`; worker 0 publishes the events "quarter-way" and "half-way" of the model
// versions. At the end every worker's last parameters must equal the service's (sync mode).
#include <signal.h>

#include <algorithm>
#include <thread>

#include "apps/experiment/workload.h"
#include "apps/paramsvc/client/client.h"
#include "common/clock.h"
#include "common/subprocess.h"

namespace tessera::experiment {
namespace {

class ParamsvcWorkload : public Workload {
 public:
  explicit ParamsvcWorkload(const RunContext& ctx)
      : w_(ctx.workload().paramsvc),
        finals_(static_cast<size_t>(w_.workers)),
        errors_(static_cast<size_t>(w_.workers)),
        counters_(static_cast<size_t>(w_.workers)) {}

  ~ParamsvcWorkload() override { StopService(); }

  Status Start(RunContext& ctx) override {
    const ClusterSpec& c = ctx.cluster_spec();
    std::vector<std::string> argv = {ctx.options().bin_dir + "/tessera-paramsvc-serve",
                                     "--port=0",
                                     "--log_level=error",
                                     "--auth_token_file=" + ctx.cluster().token_path(),
                                     "--store=" + ctx.cluster_file(),
                                     "--ec_k=" + std::to_string(c.k),
                                     "--ec_r=" + std::to_string(c.r),
                                     "--store_mb=256"};
    Subprocess::Options so;
    so.capture_stdout = true;
    so.quiet_stderr = true;
    TESSERA_ASSIGN_OR_RETURN(Subprocess svc, Subprocess::Start(argv, so));
    svc_ = std::make_unique<Subprocess>(std::move(svc));
    auto line = svc_->WaitForLine("listening on ", Deadline::AfterMs(20000));
    if (!line.ok()) return line.status().WithContext("starting tessera paramsvc serve");
    port_ = static_cast<uint16_t>(std::stoi(line->substr(line->rfind(':') + 1)));
    line = svc_->WaitForLine("aggregator ready", Deadline::AfterMs(20000));
    if (!line.ok()) return line.status().WithContext("waiting for the aggregation server");
    const size_t p = line->find("pid ");
    if (p != std::string::npos) aggregator_pid_.store(std::atoi(line->c_str() + p + 4));
    // The supervisor prints `aggregator pid N` again after each restart.
    reader_ = std::thread([this, &ctx] {
      while (!reader_stop_.load()) {
        auto l = svc_->ReadLine(Deadline::AfterMs(100));
        if (!l.ok()) {
          if (l.status().code() != StatusCode::kTimeout) break;
          continue;
        }
        if (l->rfind("aggregator pid ", 0) == 0) aggregator_pid_.store(std::atoi(l->c_str() + 15));
        ctx.Event(*l);
      }
    });
    secret_ = ctx.cluster().secret();
    spec_.name = "experiment-" + ctx.scenario().name;
    spec_.workers = static_cast<uint32_t>(w_.workers);
    spec_.mode = w_.mode == ParamsvcMode::kAsync ? paramsvc::Mode::kAsync : paramsvc::Mode::kSync;
    spec_.optimizer.lr = 0.01f;
    spec_.tensors = {{"w", paramsvc::DType::kF32, {w_.elements}}};
    return Status::Ok();
  }

  Status Run(RunContext& ctx, RunResult* r) override {
    const double t0 = NowS();
    const Deadline deadline(MonotonicNs() + static_cast<uint64_t>(ctx.scenario().duration_s * 1e9));
    RunThreads(static_cast<size_t>(w_.workers),
               [&](size_t wk) { Worker(ctx, static_cast<int>(wk), deadline); });
    r->completion_s = NowS() - t0;
    return Status::Ok();
  }

  WorkloadSample Sample() override {
    return CountedSample(iterations_.load(), data_loss_.load(), latency_);
  }

  // The service's parameters now: every worker's last pull must have returned exactly them
  // (sync); async workers may legitimately hold an older version, so only sync is judged.
  Status Verify(RunContext&, RunResult* r) override {
    std::vector<float> service(w_.elements, 0.0f);
    auto c = Connect();
    final_st_ = c.ok() ? (*c)->Join(spec_, 0) : c.status();
    void* pp[1] = {service.data()};
    if (final_st_.ok()) final_st_ = (*c)->Pull(pp, false);
    if (final_st_.code() == StatusCode::kDataLoss) data_loss_.fetch_add(1);
    if (final_st_.ok()) (*c)->Release().IgnoreError();
    if (!final_st_.ok() || w_.mode != ParamsvcMode::kSync) return Status::Ok();
    for (const auto& f : finals_) {
      if (f.size() != service.size()) continue;
      ++r->reads_checked;
      const auto* a = reinterpret_cast<const uint8_t*>(f.data());
      const auto* b = reinterpret_cast<const uint8_t*>(service.data());
      uint64_t wrong = 0;
      for (size_t i = 0; i < f.size() * sizeof(float); ++i) wrong += a[i] != b[i];
      r->wrong_bytes += wrong;
      r->wrong_pages += wrong > 0;
    }
    return Status::Ok();
  }

  Status Finish(RunContext&, RunResult* r) override {
    StopService();
    iterations_done_ = iterations_.load();
    r->data_loss = data_loss_.load();
    for (const auto& k : counters_) {
      rollbacks_ += k.rollbacks;
      reconnects_ += k.reconnects;
    }
    latency_.SetResult(r);
    std::string err;
    for (const std::string& e : errors_) {
      if (!e.empty()) err += (err.empty() ? "" : "; ") + e;
    }
    if (!final_st_.ok()) err += (err.empty() ? "" : "; ") + ("final pull: " + final_st_.ToString());
    if (!err.empty()) return Internal(err);
    return Status::Ok();
  }

  void Report(const RunResult& r, WorkloadReport* out) const override {
    out->md = ErasureCodedClusterLine(r);
    out->md += "- completion " + Fmt(r.completion_s, 2) + " s; " +
               std::to_string(iterations_done_) + " PushPull rounds, p50/p99 before faults " +
               Fmt(r.p50_before_us) + "/" + Fmt(r.p99_before_us) + " us, during " +
               Fmt(r.p50_during_us) + "/" + Fmt(r.p99_during_us) + " us; rounds/s median before " +
               Fmt(r.median_ops_before, 0) + ", lowest 300 ms during " +
               Fmt(std::max(0.0, r.min_ops_during), 0) + "; worker rollbacks " +
               std::to_string(rollbacks_) + ", reconnects " + std::to_string(reconnects_) + "\n";
    if (iterations_done_ > 0) {
      out->json["iterations"] = iterations_done_;
      out->json["rollbacks"] = rollbacks_;
      out->json["reconnects"] = reconnects_;
    }
    out->rate_axis = "iterations/s";
    out->rate_title = "PushPull rounds/s";
    out->p50_title = "PushPull p50";
    out->p99_title = "PushPull p99";
    out->loss_unit = " reads";
    out->checked_unit = " workers' final parameters checked";
  }

  pid_t companion_pid() const override { return aggregator_pid_.load(); }

 private:
  Result<std::unique_ptr<paramsvc::Client>> Connect() const {
    paramsvc::ClientOptions co;
    co.port = port_;
    co.secret = secret_;
    co.op_timeout_ms = 60000;
    co.reconnect_ms = 30000;
    return paramsvc::Client::Connect(co);
  }

  // The gradient worker w pushes at iteration `it`: deterministic, so a rerun pushes the same.
  static void Gradient(std::vector<float>* g, int w, uint64_t it) {
    const float scale = 1e-3f * static_cast<float>(w + 1) * static_cast<float>(it % 5 + 1);
    for (size_t i = 0; i < g->size(); ++i) (*g)[i] = scale * static_cast<float>(i % 7 + 1);
  }

  void Worker(RunContext& ctx, int wk, const Deadline& deadline) {
    auto c = Connect();
    Status st = c.ok() ? (*c)->Join(spec_, static_cast<uint32_t>(wk)) : c.status();
    if (st.ok()) st = (*c)->Barrier(0);
    std::vector<float> p(w_.elements, 0.0f), g(w_.elements);
    const void* gp[1] = {g.data()};
    void* pp[1] = {p.data()};
    if (st.ok()) st = (*c)->Pull(pp, false);
    // A training loop runs until the model reached its version, not for a count of its own
    // rounds: a round the service discarded on a restart (a rollback) is not counted.
    for (uint64_t it = 0; st.ok() && (*c)->min_version() < w_.iterations; ++it) {
      if (ctx.cancelled() || deadline.Expired()) {
        st =
            Timeout("model version ", (*c)->min_version(), " of ", w_.iterations, " at duration_s");
        break;
      }
      Gradient(&g, wk, it);
      const int start_phase = ctx.phase();
      const uint64_t a = MonotonicNs();
      st = (*c)->PushPull(gp, pp);
      const uint64_t lat = MonotonicNs() - a;
      if (st.code() == StatusCode::kDataLoss) data_loss_.fetch_add(1);
      if (!st.ok()) break;
      iterations_.fetch_add(1);
      // Progress events for at_event faults, from worker 0's view of the model.
      if (wk == 0) {
        const uint64_t v = (*c)->min_version();
        if (v * 4 >= w_.iterations && !quarter_seen_) {
          quarter_seen_ = true;
          ctx.Event("quarter-way");
        }
        if (v * 2 >= w_.iterations && !half_seen_) {
          half_seen_ = true;
          ctx.Event("half-way");
        }
      }
      latency_.Record(lat, start_phase, ctx.phase());
    }
    const size_t i = static_cast<size_t>(wk);
    if (!st.ok()) errors_[i] = "worker " + std::to_string(wk) + ": " + st.ToString();
    if (c.ok()) counters_[i] = (*c)->counters();
    finals_[i] = std::move(p);
  }

  void StopService() {
    if (reader_.joinable()) {
      reader_stop_.store(true);
      reader_.join();
    }
    if (svc_ != nullptr) {
      svc_->Signal(SIGTERM).IgnoreError();
      if (!svc_->Wait(Deadline::AfterMs(10000)).ok()) svc_->Signal(SIGKILL).IgnoreError();
      svc_.reset();
    }
  }

  ParamsvcOptions w_;
  std::unique_ptr<Subprocess> svc_;
  std::thread reader_;
  std::atomic<bool> reader_stop_{false};
  std::atomic<pid_t> aggregator_pid_{0};
  uint16_t port_ = 0;
  std::string secret_;
  paramsvc::JobSpec spec_;
  std::atomic<uint64_t> iterations_{0}, data_loss_{0};
  PhaseLatency latency_;
  bool quarter_seen_ = false, half_seen_ = false;  // worker 0's thread only
  std::vector<std::vector<float>> finals_;         // each worker's last parameters
  std::vector<std::string> errors_;
  std::vector<paramsvc::ClientCounters> counters_;
  Status final_st_;
  uint64_t iterations_done_ = 0, rollbacks_ = 0, reconnects_ = 0;
};

}  // namespace

extern const WorkloadType kParamsvcWorkload = {WorkloadKind::kParamsvc, "",
                                               &MakeWorkload<ParamsvcWorkload>, &NoLayout};

}  // namespace tessera::experiment
