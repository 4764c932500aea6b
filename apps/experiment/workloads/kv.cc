// kind = kv: a Kayak KV table loaded before t = 0 (event "loaded"), then `clients` closed-loop
// threads of GET, PUT and Invoke (a built-in chase) through one ::kayak::Client. Thread t owns
// the keys k with k % clients == t, so it knows the last acknowledged PUT of each: a GET must
// return exactly it, a chase must fold exactly it (a PUT that failed leaves either value
// acceptable until the next acknowledged one). A read that returns an older version of the key,
// or NotFound, is an acknowledged PUT lost (data_loss); bytes that are no version of the key
// are wrong_bytes; errors (a dead server without replication: Unavailable) are counted, never
// judged as values.
#include <algorithm>
#include <random>

#include "apps/experiment/workload.h"
#include "apps/kayak/client/client.h"
#include "common/clock.h"
#include "apps/kayak/wire/builtins.h"

namespace tessera::experiment {
namespace {

namespace kbi = kayak::builtins;

class KvWorkload : public Workload {
 public:
  explicit KvWorkload(const RunContext& ctx)
      : w_(ctx.workload().kv),
        seed_(ctx.scenario().seed),
        nthreads_(static_cast<size_t>(w_.clients)),
        vsize_(static_cast<size_t>(w_.value_size)),
        state_(nthreads_) {
    for (uint64_t k = 0; k < w_.keys; ++k) state_[k % nthreads_].emplace_back();
  }

  // Every thread writes its keys once (seq 1).
  Status Start(RunContext& ctx) override {
    ::kayak::ClientOptions ko;
    ko.servers = ctx.cluster().endpoints();
    ko.secret = ctx.cluster().secret();
    ko.client_id = seed_ * 2 + 1;
    ko.replicas = static_cast<uint32_t>(w_.replicas);
    TESSERA_ASSIGN_OR_RETURN(ko.controller.mode, ::kayak::ParseMode(w_.mode));
    TESSERA_ASSIGN_OR_RETURN(client_, ::kayak::Client::Connect(ko));
    std::vector<Status> load_st(nthreads_);
    RunThreads(nthreads_, [&](size_t t) {
      for (size_t j = 0; j < state_[t].size() && load_st[t].ok(); ++j) {
        const uint64_t key = KeyOf(t, j);
        auto r = client_->Put(kbi::KeyBytes(key), Value(key, 1));
        if (!r.ok()) load_st[t] = r.status().WithContext("loading key " + std::to_string(key));
        state_[t][j].acked = 1;
      }
    });
    for (const Status& st : load_st) TESSERA_RETURN_IF_ERROR(st.WithContext("loading the table"));
    ctx.Event("loaded");
    return Status::Ok();
  }

  Status Run(RunContext& ctx, RunResult* r) override {
    const double t0 = NowS();
    const double until = t0 + ctx.scenario().duration_s;
    RunThreads(nthreads_, [&](size_t t) { Client(ctx, t, until); });
    r->completion_s = NowS() - t0;
    return Status::Ok();
  }

  WorkloadSample Sample() override { return CountedSample(ops_.load(), lost_.load(), latency_); }

  // Every key read back once more.
  Status Verify(RunContext&, RunResult*) override {
    if (!w_.verify_at_end) return Status::Ok();
    for (size_t t = 0; t < nthreads_; ++t) {
      for (size_t j = 0; j < state_[t].size(); ++j) {
        if (!Get(state_[t][j], KeyOf(t, j), "final GET")) ++final_errors_;
      }
    }
    return Status::Ok();
  }

  Status Finish(RunContext&, RunResult* r) override {
    if (client_ != nullptr) counters_ = client_->counters();
    r->data_loss = lost_.load();
    r->wrong_bytes = wrong_bytes_.load();
    r->wrong_pages = wrong_values_.load();
    r->reads_checked = checked_.load();
    r->read_errors = get_errors_.load() + invoke_errors_.load() + final_errors_;
    r->write_errors = put_errors_.load();
    latency_.SetResult(r);
    return Status::Ok();
  }

  void Report(const RunResult& r, WorkloadReport* out) const override {
    out->md = "- cluster: " + std::to_string(r.cluster.memservers) +
              " memservers; one KV table of " + std::to_string(w_.keys) + " keys x " +
              std::to_string(w_.value_size) + " B, " + std::to_string(w_.replicas) +
              "-way replicated, " + std::to_string(w_.clients) + " closed-loop clients\n";
    out->md += "- completion " + Fmt(r.completion_s, 2) + " s; " + std::to_string(ops_.load()) +
               " ops (" + w_.mode + " mode, " + std::to_string(w_.replicas) +
               "-way); op p50/p99 before faults " + Fmt(r.p50_before_us) + "/" +
               Fmt(r.p99_before_us) + " us, during faults " + Fmt(r.p50_during_us) + "/" +
               Fmt(r.p99_during_us) + " us; ops/s median before " + Fmt(r.median_ops_before, 0) +
               ", lowest 300 ms during " + Fmt(std::max(0.0, r.min_ops_during), 0) + "\n";
    out->md += "- acknowledged PUTs lost " + std::to_string(r.data_loss) + ", wrong values " +
               std::to_string(r.wrong_pages) + " of " + std::to_string(r.reads_checked) +
               " checked; errors: GET/chase " + std::to_string(r.read_errors) + ", PUT " +
               std::to_string(r.write_errors) + "; invokes rpc/kv/pushed back " +
               std::to_string(counters_.rpc) + "/" + std::to_string(counters_.kv) + "/" +
               std::to_string(counters_.pushed_back) + "\n";
    if (!first_error_.empty()) out->md += "- first error: " + first_error_ + "\n";
    if (ops_.load() > 0) {
      out->json["kv"] = {{"ops", ops_.load()},
                         {"acknowledged_puts_lost", r.data_loss},
                         {"wrong_values", r.wrong_pages},
                         {"values_checked", r.reads_checked},
                         {"get_errors", get_errors_.load()},
                         {"put_errors", r.write_errors},
                         {"invoke_errors", invoke_errors_.load()},
                         {"final_read_errors", final_errors_},
                         {"invokes_rpc", counters_.rpc},
                         {"invokes_kv", counters_.kv},
                         {"invokes_pushed_back", counters_.pushed_back},
                         {"first_error", first_error_}};
    }
    out->loss_unit = " acknowledged PUTs lost";
  }

 private:
  struct KeyState {
    uint64_t acked = 0, pending = 0;  // seq of the last acknowledged / of a failed PUT
    bool lost = false;
  };

  // state_[t][j]: key id t + 1 + j * clients.
  uint64_t KeyOf(size_t t, size_t j) const { return t + 1 + j * nthreads_; }

  // The value of `key` written by its `seq`th PUT: the first 8 bytes name the key itself (a
  // chain of one key, so a chase stays on the key's server in every mode), bytes 8..15 the
  // sequence number, the rest derived from (seed, key, seq).
  std::vector<uint8_t> Value(uint64_t key, uint64_t seq) const {
    std::vector<uint8_t> v(vsize_);
    kbi::StoreLe64(v.data(), key);
    kbi::StoreLe64(v.data() + 8, seq);
    for (size_t i = 16; i < vsize_; i += 8) {
      const uint64_t x = Mix(seed_ ^ (key << 24) ^ (seq * 0x9e3779b97f4a7c15ull) ^ i);
      for (size_t j = 0; j < 8 && i + j < vsize_; ++j)
        v[i + j] = static_cast<uint8_t>(x >> (8 * j));
    }
    return v;
  }

  void NoteError(const char* what, uint64_t key, const Status& st) {
    std::lock_guard<std::mutex> l(err_mu_);
    if (first_error_.empty()) {
      first_error_ = std::string(what) + " key " + std::to_string(key) + ": " + st.ToString();
    }
  }

  void Lost(KeyState& ks) {
    if (!ks.lost) lost_.fetch_add(1);
    ks.lost = true;
  }

  // Checks a value read for `key`; returns false when it was wrong.
  bool Check(KeyState& ks, uint64_t key, const std::vector<uint8_t>& got) {
    checked_.fetch_add(1);
    const std::vector<uint8_t> want = Value(key, ks.acked);
    if (got == want) return true;
    if (ks.pending != 0 && got == Value(key, ks.pending)) return true;
    const uint64_t seq = got.size() >= 16 ? kbi::LoadLe64(got.data() + 8) : 0;
    if (seq < ks.acked && got == Value(key, seq)) {
      Lost(ks);  // An older version: an acknowledged PUT was lost.
      return false;
    }
    uint64_t bad = got.size() > want.size() ? got.size() - want.size() : want.size() - got.size();
    for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) bad += got[i] != want[i];
    wrong_bytes_.fetch_add(bad);
    wrong_values_.fetch_add(1);
    return false;
  }

  // Reads `key` and checks the value (NotFound: its acknowledged PUTs are lost); false on an
  // error, which is noted as `what`.
  bool Get(KeyState& ks, uint64_t key, const char* what) {
    auto r = client_->Get(kbi::KeyBytes(key));
    if (r.ok()) {
      Check(ks, key, r->bytes);
    } else if (r.status().code() == StatusCode::kNotFound) {
      Lost(ks);
    } else {
      NoteError(what, key, r.status());
      return false;
    }
    return true;
  }

  // A chase of `hops` hops from `key` folds its value `hops` times.
  uint64_t ChaseDigest(uint64_t key, uint64_t seq, uint32_t hops) const {
    const std::vector<uint8_t> v = Value(key, seq);
    uint64_t d = kbi::kDigestSeed;
    for (uint32_t h = 0; h < hops; ++h) d = kbi::Fold(d, v);
    return d;
  }

  // One closed-loop client thread over its own keys.
  void Client(RunContext& ctx, size_t t, double until) {
    std::mt19937_64 rng(Mix(seed_ ^ (0x6b76ull << 32) ^ t));
    std::uniform_real_distribution<double> u(0.0, 1.0);
    std::vector<KeyState>& mine = state_[t];
    if (mine.empty()) return;
    while (!ctx.cancelled() && NowS() < until) {
      if (w_.ops > 0 && issued_.fetch_add(1) >= w_.ops) break;
      const size_t j = static_cast<size_t>(rng() % mine.size());
      const uint64_t key = KeyOf(t, j);
      KeyState& ks = mine[j];
      const double dice = u(rng);
      const int start_phase = ctx.phase();
      const uint64_t a = MonotonicNs();
      if (dice < w_.put_ratio) {
        const uint64_t seq = std::max(ks.acked, ks.pending) + 1;
        auto r = client_->Put(kbi::KeyBytes(key), Value(key, seq));
        if (r.ok()) {
          ks.acked = seq;
          ks.pending = 0;
          ks.lost = false;
        } else {
          ks.pending = seq;
          put_errors_.fetch_add(1);
          NoteError("PUT", key, r.status());
        }
      } else if (dice < w_.put_ratio + w_.invoke_ratio) {
        const uint32_t hops = static_cast<uint32_t>(w_.hops);
        auto r = client_->Invoke(kbi::kChase, kbi::ChaseArgs{key, hops, 0}.Encode());
        if (!r.ok()) {
          invoke_errors_.fetch_add(1);
          NoteError("chase", key, r.status());
        } else {
          checked_.fetch_add(1);
          auto res = kbi::ChaseResult::Decode(r->result);
          if (!res.ok() || res->last_key != key ||
              (res->value != ChaseDigest(key, ks.acked, hops) &&
               (ks.pending == 0 || res->value != ChaseDigest(key, ks.pending, hops)))) {
            wrong_values_.fetch_add(1);
            wrong_bytes_.fetch_add(8);  // The 8-byte digest of the chase's result.
          }
        }
      } else {
        if (!Get(ks, key, "GET")) get_errors_.fetch_add(1);
      }
      ops_.fetch_add(1);
      latency_.Record(MonotonicNs() - a, start_phase, ctx.phase());
    }
  }

  KvOptions w_;
  uint64_t seed_;
  size_t nthreads_, vsize_;
  std::vector<std::vector<KeyState>> state_;  // state_[t]: thread t's keys
  std::unique_ptr<::kayak::Client> client_;
  std::atomic<uint64_t> ops_{0}, issued_{0}, lost_{0}, wrong_bytes_{0}, wrong_values_{0};
  std::atomic<uint64_t> get_errors_{0}, put_errors_{0}, invoke_errors_{0}, checked_{0};
  uint64_t final_errors_ = 0;
  PhaseLatency latency_;
  std::mutex err_mu_;
  std::string first_error_;  // The first failed op, for the report.
  ::kayak::Client::Counters counters_;
};

// ::kayak::Client has no per-op timeout: an op to a server stopped or partitioned for good would
// block the load forever, so such faults need a duration or a later resume/heal.
Status CheckKv(const Scenario& s) {
  TESSERA_RETURN_IF_ERROR(NoLayout(s));
  for (const FaultSpec& f : s.faults) {
    if ((f.action != FaultAction::kStop && f.action != FaultAction::kPartition) ||
        f.duration_s > 0) {
      continue;
    }
    const FaultAction undo =
        f.action == FaultAction::kStop ? FaultAction::kResume : FaultAction::kHeal;
    bool undone = false;
    for (const FaultSpec& g : s.faults) undone |= g.action == undo;
    if (!undone) {
      return Unsupported(s.origin, ":", f.line, ": with kind = \"kv\" a ",
                         FaultActionName(f.action), " needs duration_s or a later ",
                         FaultActionName(undo),
                         " (::kayak::Client has no per-operation timeout: requests to that "
                         "server would wait for ever)");
    }
  }
  return Status::Ok();
}

}  // namespace

extern const WorkloadType kKvWorkload = {WorkloadKind::kKv, "", &MakeWorkload<KvWorkload>,
                                         &CheckKv};

}  // namespace tessera::experiment
