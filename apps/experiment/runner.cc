#include "apps/experiment/runner.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <ctime>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "apps/cli/version.h"
#include "apps/experiment/partition.h"
#include "apps/experiment/slab_census.h"
#include "apps/experiment/tools.h"
#include "apps/kayak/client.h"
#include "apps/paramsvc/client.h"
#include "client/local_cluster.h"
#include "client/page_store.h"
#include "client/remote_store.h"
#include "common/clock.h"
#include "common/histogram.h"
#include "common/subprocess.h"
#include "common/units.h"
#include "memserver/offload_builtins.h"

namespace tessera::experiment {
namespace {

using client::kPageSize;
using client::PageId;
using client::PageOp;
using client::PageStore;
using json = nlohmann::json;
namespace kbi = memserver::builtins;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr int kSampleMs = 100;

double Now() { return static_cast<double>(MonotonicNs()) * 1e-9; }

uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t SizeOf(const std::string& s) { return ParseSize(s).value_or(0); }

std::string Fmt(double v, int prec = 1) {
  if (std::isinf(v)) return "inf";
  char b[64];
  std::snprintf(b, sizeof(b), "%.*f", prec, v);
  return b;
}

// ---- what the sampler sees of a workload ----

struct WorkloadSample {
  uint64_t ops = 0;  // Completed since the start (cumulative).
  double rate = -1;  // ops/s when the workload knows it better than ops deltas (run), else -1.
  double p50_us = 0, p99_us = 0;  // Of this interval (pagestore) or as published (run).
  uint64_t degraded_reads = 0;
  uint64_t regenerations_pending = 0;
  uint64_t data_loss = 0;
  uint64_t server_failures = 0;
  uint64_t regenerations_done = 0;
};

// A sample of a workload that counts its own ops and losses and records each op's latency in
// `interval` (under `mu`), which the sample takes and clears.
WorkloadSample CountedSample(uint64_t ops, uint64_t data_loss, std::mutex& mu,
                          LatencyHistogram& interval) {
  WorkloadSample x;
  x.ops = ops;
  std::lock_guard<std::mutex> g(mu);
  x.p50_us = static_cast<double>(interval.p50()) / 1e3;
  x.p99_us = static_cast<double>(interval.p99()) / 1e3;
  interval.Clear();
  x.data_loss = data_loss;
  return x;
}

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

// ---- the pagestore load generator ----

// Writes every page, then issues random reads/writes at a fixed queue depth, checking every
// byte it reads against the content its last acknowledged write had; a final pass reads every
// page once more. Single driver thread; the sampler reads its counters.
class PageLoad {
 public:
  PageLoad(const WorkloadSpec& w, uint64_t seed, const std::atomic<int>* phase,
           const std::atomic<bool>* stop)
      : w_(w),
        seed_(seed),
        phase_(phase),
        stop_(stop),
        version_(w.pages, 0),
        unknown_(w.pages, 0),
        lost_(w.pages, 0),
        inflight_(w.pages, 0) {}

  Status Open(const client::ErasureCodedStoreOptions& o) {
    TESSERA_ASSIGN_OR_RETURN(store_, client::CreateErasureCodedStore(o));
    return Status::Ok();
  }
  PageStore* store() { return store_.get(); }

  // Writes version 1 of every page.
  Status Fill() {
    uint64_t next = 0;
    return Drive(
        [&](PageId* p, PageOp::Kind* k) {
          if (next >= w_.pages) return false;
          *p = next++;
          *k = PageOp::Kind::kWrite;
          return true;
        },
        kInf);
  }
  // Random ops until `until` (monotonic seconds) or w.ops ops or a stop.
  Status Load(double until) {
    std::mt19937_64 rng(seed_ ^ 0x5eedull);
    std::uniform_int_distribution<uint64_t> page(0, w_.pages - 1);
    std::uniform_real_distribution<double> u(0, 1);
    uint64_t issued = 0;
    load_start_ = Now();
    in_load_ = true;
    Status st = Drive(
        [&](PageId* p, PageOp::Kind* k) {
          if (w_.ops > 0 && issued >= w_.ops) return false;
          for (int tries = 0; tries < 16; ++tries) {
            *p = page(rng);
            if (!inflight_[*p]) break;
          }
          if (inflight_[*p]) return false;
          *k = u(rng) < w_.read_ratio ? PageOp::Kind::kRead : PageOp::Kind::kWrite;
          ++issued;
          return true;
        },
        until);
    in_load_ = false;
    load_s_ = Now() - load_start_;
    return st;
  }
  // Reads every page once; returns the pages that reported DataLoss in this pass.
  Status Verify(std::vector<uint8_t>* lost_in_pass) {
    lost_in_pass->assign(w_.pages, 0);
    pass_lost_ = lost_in_pass;
    uint64_t next = 0;
    Status st = Drive(
        [&](PageId* p, PageOp::Kind* k) {
          if (next >= w_.pages) return false;
          *p = next++;
          *k = PageOp::Kind::kRead;
          return true;
        },
        kInf);
    pass_lost_ = nullptr;
    return st;
  }

  // The servers of every page now (indices into the cluster), for loss prediction.
  std::vector<std::vector<size_t>> SnapshotPlacement() const {
    std::vector<std::vector<size_t>> out(w_.pages);
    for (PageId p = 0; p < w_.pages; ++p) {
      auto r = client::ServersOfPage(*store_, p);
      if (r.ok()) out[p] = *r;
    }
    return out;
  }

  WorkloadSample Sample() {
    WorkloadSample s;
    s.ops = completed_.load(std::memory_order_relaxed);
    {
      std::lock_guard<std::mutex> l(hist_mu_);
      s.p50_us = static_cast<double>(interval_.p50()) / 1e3;
      s.p99_us = static_cast<double>(interval_.p99()) / 1e3;
      interval_.Clear();
    }
    client::PageStoreStats st = store_->Stats();
    s.degraded_reads = st.degraded_reads;
    s.regenerations_pending = st.regenerations_pending;
    s.data_loss = lost_pages_.load(std::memory_order_relaxed);
    s.server_failures = st.server_failures;
    s.regenerations_done = st.regenerations_done;
    return s;
  }

  // Read latency histograms by phase: 0 before any fault, 1 during, 2 after; of Load()'s reads
  // only (not of the verify passes after it, which may run while a fault's window is still open).
  LatencyHistogram PhaseHistogram(int phase) {
    std::lock_guard<std::mutex> l(hist_mu_);
    return phase_hist_[phase];
  }
  uint64_t wrong_bytes() const { return wrong_bytes_; }
  uint64_t wrong_pages() const { return wrong_pages_; }
  uint64_t lost_pages() const { return lost_pages_.load(); }
  uint64_t read_errors() const { return read_errors_; }
  uint64_t write_errors() const { return write_errors_; }
  uint64_t reads_checked() const { return reads_checked_; }
  double load_s() const { return load_s_; }
  const std::vector<uint8_t>& lost() const { return lost_; }

 private:
  struct Slot {
    PageOp op;
    std::vector<uint8_t> buf = std::vector<uint8_t>(kPageSize);
    uint64_t start_ns = 0;
    int start_phase = 0;
    uint32_t version = 0;
    PageLoad* owner = nullptr;
    size_t index = 0;
  };

  static void OnDone(PageOp* op) {
    auto* slot = static_cast<Slot*>(op->user);
    PageLoad* self = slot->owner;
    std::lock_guard<std::mutex> l(self->done_mu_);
    self->done_.push_back(slot->index);
    self->done_cv_.notify_one();
  }

  void Fill(uint8_t* out, PageId page, uint32_t version) const {
    uint64_t s = Mix(seed_ ^ Mix(page * 0x100000001ull + version));
    for (size_t i = 0; i < kPageSize; i += 8) {
      s = Mix(s);
      std::memcpy(out + i, &s, 8);
    }
  }

  void Complete(Slot& s) {
    const uint64_t lat = MonotonicNs() - s.start_ns;
    const PageId p = s.op.page;
    inflight_[p] = 0;
    completed_.fetch_add(1, std::memory_order_relaxed);
    if (s.op.kind == PageOp::Kind::kWrite) {
      version_[p] = s.version;
      if (!s.op.status.ok()) {
        unknown_[p] = 1;  // It may or may not have landed.
        ++write_errors_;
      } else {
        unknown_[p] = 0;
      }
      return;
    }
    {
      std::lock_guard<std::mutex> l(hist_mu_);
      interval_.Record(lat);
      if (in_load_) {
        // A read that started or ended while a fault was active counts as during the faults.
        const int end_phase = std::clamp(phase_->load(), 0, 2);
        const int phase = (s.start_phase == 1 || end_phase == 1) ? 1 : end_phase;
        phase_hist_[phase].Record(lat);
      }
    }
    if (s.op.status.code() == StatusCode::kDataLoss) {
      if (!lost_[p]) {
        lost_[p] = 1;
        lost_pages_.fetch_add(1, std::memory_order_relaxed);
      }
      if (pass_lost_ != nullptr) (*pass_lost_)[p] = 1;
      return;
    }
    if (!s.op.status.ok()) {
      ++read_errors_;
      return;
    }
    if (unknown_[p]) return;
    ++reads_checked_;
    uint8_t want[kPageSize];
    Fill(want, p, version_[p]);
    uint64_t wrong = 0;
    for (size_t i = 0; i < kPageSize; ++i) wrong += want[i] != s.buf[i];
    if (wrong > 0) {
      wrong_bytes_ += wrong;
      ++wrong_pages_;
    }
  }

  // Keeps up to qd ops in flight from `next` until it returns false (or `until` / a stop),
  // then waits for every op in flight.
  Status Drive(const std::function<bool(PageId*, PageOp::Kind*)>& next, double until) {
    const size_t qd = static_cast<size_t>(w_.qd);
    std::vector<std::unique_ptr<Slot>> slots(qd);
    std::vector<size_t> free_slots;
    for (size_t i = 0; i < qd; ++i) {
      slots[i] = std::make_unique<Slot>();
      slots[i]->owner = this;
      slots[i]->index = i;
      slots[i]->op.user = slots[i].get();
      slots[i]->op.done = &PageLoad::OnDone;
      slots[i]->op.buf = slots[i]->buf.data();
      free_slots.push_back(i);
    }
    bool more = true;
    std::vector<PageOp*> batch;
    std::vector<size_t> done;
    while (true) {
      if (stop_->load() || Now() >= until) more = false;
      batch.clear();
      while (more && !free_slots.empty()) {
        PageId p;
        PageOp::Kind k;
        if (!next(&p, &k)) {
          // The generator has no page free right now (all picks in flight) or is finished.
          if (free_slots.size() == qd) more = false;
          break;
        }
        Slot& s = *slots[free_slots.back()];
        free_slots.pop_back();
        s.op.kind = k;
        s.op.page = p;
        s.op.status = Status::Ok();
        inflight_[p] = 1;
        if (k == PageOp::Kind::kWrite) {
          s.version = version_[p] + 1;
          Fill(s.buf.data(), p, s.version);
        }
        s.start_ns = MonotonicNs();
        s.start_phase = phase_->load();
        batch.push_back(&s.op);
      }
      if (!batch.empty()) {
        Status st = store_->Submit(batch);
        if (!st.ok()) return st.WithContext("submitting page ops");
      }
      if (!more && free_slots.size() == qd) break;
      {
        std::unique_lock<std::mutex> l(done_mu_);
        done_cv_.wait_for(l, std::chrono::milliseconds(5), [&] { return !done_.empty(); });
        done.swap(done_);
      }
      for (size_t i : done) {
        Complete(*slots[i]);
        free_slots.push_back(i);
      }
      done.clear();
    }
    return Status::Ok();
  }

  WorkloadSpec w_;
  uint64_t seed_;
  const std::atomic<int>* phase_;
  const std::atomic<bool>* stop_;
  std::unique_ptr<PageStore> store_;
  std::vector<uint32_t> version_;
  std::vector<uint8_t> unknown_, lost_, inflight_;
  std::vector<uint8_t>* pass_lost_ = nullptr;
  std::mutex done_mu_;
  std::condition_variable done_cv_;
  std::vector<size_t> done_;
  std::mutex hist_mu_;
  LatencyHistogram interval_;
  LatencyHistogram phase_hist_[3];
  std::atomic<uint64_t> completed_{0};
  std::atomic<uint64_t> lost_pages_{0};
  uint64_t wrong_bytes_ = 0, wrong_pages_ = 0, read_errors_ = 0, write_errors_ = 0;
  uint64_t reads_checked_ = 0;
  double load_start_ = 0, load_s_ = 0;
  bool in_load_ = false;  // Load() is driving the ops (Complete() runs on its thread).
};

// ---- one run of a scenario (a variant, or the healthy baseline) ----

struct RunResult {
  std::string name;
  bool healthy = false;  // The no-fault baseline.
  ClusterSpec cluster;
  std::vector<Sample> samples;
  std::vector<FaultRecord> faults;
  std::string partition_mode;  // "" when no partition fault ran.
  double completion_s = 0;
  double p99_before_us = 0, p99_during_us = 0, p50_before_us = 0, p50_during_us = 0;
  // From the 100 ms samples: the worst p99 and lowest throughput while faults were active, and
  // the median throughput before the first fault.
  double worst_p99_during_us = 0, min_ops_during = -1, median_ops_before = 0;
  uint64_t data_loss = 0;  // Pages (pagestore) or the store's count (run).
  uint64_t wrong_bytes = 0, wrong_pages = 0, read_errors = 0, write_errors = 0;
  uint64_t reads_checked = 0;
  uint64_t corruptions_detected = 0, corruptions_repaired = 0;
  bool scrub_clean = true;          // The last verify pass found no new corruption.
  double regenerated_after_s = -1;  // -1: not measured / never.
  uint64_t server_failures = 0, regenerations_done = 0, degraded_reads = 0;
  // Loss prediction.
  uint64_t affected_pages = 0, lost_not_affected = 0, affected_not_lost = 0;
  bool have_affected = false;
  double lost_fraction = 0;
  double predicted_fraction = -1;
  std::string prediction_cmd;
  // slabs_back_to_baseline: slab census after the fill and at the end (-1: not taken).
  int64_t slabs_baseline = -1, slabs_end = -1;
  std::string slabs_note;
  // kind = paramsvc.
  uint64_t rollbacks = 0, reconnects = 0, iterations = 0;
  // kind = kv.
  uint64_t kv_ops = 0, kv_final_errors = 0, kv_invoke_errors = 0;
  uint64_t kv_rpc = 0, kv_kv = 0, kv_pushed_back = 0;  // Invokes by how they ran.
  std::string kv_first_error;                          // The first failed op, for the report.
  // kind = run.
  int exit_code = 0;
  std::string output;
  std::string error;  // A run-time error that ended this run.
};

class ScenarioRun {
 public:
  ScenarioRun(const Scenario& s, const ClusterSpec& c, const RunOptions& o, std::string name,
              std::string dir, bool healthy)
      : s_(s), c_(c), o_(o), dir_(std::move(dir)), partition_(o.system_lock) {
    res_.name = std::move(name);
    res_.healthy = healthy;
    res_.cluster = c;
    if (s.workload.kind == "pagestore" && c_.layout.empty())
      c_.layout = res_.cluster.layout = "split";
  }

  RunResult Run() {
    Status st = RunInner();
    if (!st.ok()) res_.error = st.ToString();
    res_.regenerated_after_s = regen_after_.load();
    std::vector<double> before;
    const auto& xs = res_.samples;
    // Only the samples taken while the load ran count (before or during the faults): a fault
    // window may outlast the load (a timed fault cut short by the end of the run), and the
    // samples after it show the final verify passes or no ops at all, not the load.
    auto during = [&](size_t i) { return xs[i].during && xs[i].t <= load_end_t_; };
    for (size_t i = 0; i < xs.size(); ++i) {
      if (during(i)) {
        res_.worst_p99_during_us = std::max(res_.worst_p99_during_us, xs[i].p99_us);
      } else if (i > 0 && xs[i].t <= load_end_t_ &&
                 (res_.faults.empty() || xs[i].t < res_.faults.front().t)) {
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
        if (res_.min_ops_during < 0 || avg < res_.min_ops_during) res_.min_ops_during = avg;
      }
    }
    if (!before.empty()) {
      std::nth_element(before.begin(), before.begin() + before.size() / 2, before.end());
      res_.median_ops_before = before[before.size() / 2];
    }
    partition_.HealAll();
    return std::move(res_);
  }

 private:
  int RackOf(size_t i) const {
    return c_.racks > 0 ? static_cast<int>(i * static_cast<size_t>(c_.racks) /
                                           static_cast<size_t>(c_.memservers))
                        : -1;
  }

  Status StartCluster() {
    client::LocalClusterOptions lo;
    lo.bin_dir = o_.bin_dir;
    lo.servers = static_cast<size_t>(c_.memservers);
    lo.capacity = c_.capacity;
    lo.slab_size = c_.slab_size;
    lo.fault_injection = true;
    lo.extra_flags = {"--orphan_grace=0"};
    TESSERA_ASSIGN_OR_RETURN(cluster_, client::LocalCluster::Start(lo));
    for (size_t i = 0; i < cluster_->size(); ++i) {
      client::RemoteServer rs;
      rs.endpoint = cluster_->endpoints()[i];
      if (c_.racks > 0) rs.rack = "r" + std::to_string(RackOf(i));
      servers_.push_back(rs);
    }
    // A cluster file with the rack labels, for `tessera run --cluster`.
    std::string text;
    for (const auto& rs : servers_) {
      text += rs.endpoint.ToString() + (rs.rack.empty() ? "" : " rack=" + rs.rack) + "\n";
    }
    cluster_file_ = dir_ + "/cluster";
    return WriteWholeFile(cluster_file_, text);
  }

  // ---- faults ----

  std::vector<size_t> Resolve(const FaultSpec& f, size_t index) {
    std::vector<size_t> out;
    const size_t n = static_cast<size_t>(c_.memservers);
    switch (f.target.kind) {
      case TargetKind::kServer:
        out.push_back(f.target.n);
        break;
      case TargetKind::kRack:
        for (size_t i = 0; i < n; ++i) {
          if (RackOf(i) == static_cast<int>(f.target.n)) out.push_back(i);
        }
        break;
      case TargetKind::kRandom: {
        std::vector<size_t> all(n);
        for (size_t i = 0; i < n; ++i) all[i] = i;
        std::mt19937_64 rng(s_.seed * 1000003ull + index);
        std::shuffle(all.begin(), all.end(), rng);
        out.assign(all.begin(), all.begin() + static_cast<long>(f.target.n));
        std::sort(out.begin(), out.end());
        break;
      }
      case TargetKind::kAggregator:
        break;  // Not a memserver: FireFault acts on its pid.
      case TargetKind::kPage:
        if (load_ != nullptr) {
          auto r = client::ServersOfPage(*load_->store(), f.target.n);
          if (r.ok()) {
            out = *r;
            if (f.count > 0 && out.size() > static_cast<size_t>(f.count)) {
              out.resize(static_cast<size_t>(f.count));
            }
          }
        }
        break;
    }
    return out;
  }

  Status Apply(FaultAction a, size_t i, const FaultSpec& f, std::string* note) {
    switch (a) {
      case FaultAction::kKill:
        return cluster_->Kill(i);
      case FaultAction::kStop:
        return cluster_->Stop(i);
      case FaultAction::kResume:
        return cluster_->Cont(i);
      case FaultAction::kDelay:
        return cluster_->Fault(i, {"delay", f.delay});
      case FaultAction::kDrop:
        return cluster_->Fault(i, {"drop", "--ops=alloc,free,read,write,stats,heartbeat,invoke"});
      case FaultAction::kBitflip:
        return cluster_->Fault(i, {"bitflip", std::to_string(f.bits)});
      case FaultAction::kEvict:
        return cluster_->Fault(i, {"evict", std::to_string(f.slabs)});
      case FaultAction::kPartition: {
        Status avail = partition_ready_;
        if (avail.ok()) {
          Status st = partition_.Cut(cluster_->endpoints()[i].port);
          if (st.ok()) {
            res_.partition_mode = PartitionMode();
            partitioned_real_.insert(i);
            return st;
          }
          avail = st;
        }
        res_.partition_mode =
            "memserver drop-all fault (nftables not usable: " + avail.message() + ")";
        *note = "fallback to the memserver's drop-all fault: " + avail.message();
        partitioned_fallback_.insert(i);
        return cluster_->Fault(i, {"drop", "--ops=alloc,free,read,write,stats,heartbeat,invoke"});
      }
      case FaultAction::kRestart: {
        TESSERA_RETURN_IF_ERROR(cluster_->Restart(i));
        // The fresh process is a new member at the old endpoint; the store joins it.
        if (load_ == nullptr) return Status::Ok();
        return client::AddRemoteServer(*load_->store(), servers_[i]);
      }
      case FaultAction::kHeal:
        if (partitioned_real_.erase(i) > 0) return partition_.Heal(cluster_->endpoints()[i].port);
        if (partitioned_fallback_.erase(i) > 0) return cluster_->Fault(i, {"clear"});
        *note = "server " + std::to_string(i) + " was not partitioned";
        return Status::Ok();
    }
    return Status::Ok();
  }

  // Undo of a timed fault (duration_s).
  Status Undo(FaultAction a, size_t i) {
    switch (a) {
      case FaultAction::kStop:
        return cluster_->Cont(i);
      case FaultAction::kDelay:
      case FaultAction::kDrop:
        return cluster_->Fault(i, {"clear"});
      case FaultAction::kPartition: {
        std::string note;
        FaultSpec dummy;
        return Apply(FaultAction::kHeal, i, dummy, &note);
      }
      default:
        return Status::Ok();
    }
  }

  struct Active {
    FaultAction action;
    std::vector<size_t> servers;
    double until;  // Seconds since t0; inf = to the end.
    bool undo;     // Undo at `until`.
  };

  bool IsPermanentFailure(FaultAction a, const FaultSpec& f) const {
    return a == FaultAction::kKill || a == FaultAction::kRestart ||
           (a == FaultAction::kPartition && f.duration_s <= 0);
  }

  void FireFault(size_t index, double t) {
    const FaultSpec& f = s_.faults[index];
    FaultRecord rec;
    rec.t = t;
    rec.servers = Resolve(f, index);
    rec.what = std::string(FaultActionName(f.action)) + " " + f.target.text;
    if (f.action == FaultAction::kDelay) rec.what += " " + f.delay;
    if (f.action == FaultAction::kBitflip) rec.what += " bits=" + std::to_string(f.bits);
    if (f.duration_s > 0) rec.what += " for " + Fmt(f.duration_s, 2) + " s";
    if (f.target.kind == TargetKind::kAggregator) {
      const pid_t pid = aggregator_pid_.load();
      const int sig = f.action == FaultAction::kKill   ? SIGKILL
                      : f.action == FaultAction::kStop ? SIGSTOP
                                                       : SIGCONT;
      rec.note = "aggregator pid " + std::to_string(pid);
      if (pid <= 0 || ::kill(pid, sig) != 0) {
        rec.ok = false;
        rec.note += ": " + std::string(pid <= 0 ? "not started" : std::strerror(errno));
      }
      if (f.action == FaultAction::kStop && f.duration_s > 0) {
        active_.push_back({FaultAction::kStop, {}, t + f.duration_s, true});
        aggregator_stopped_ = pid;
      } else {
        active_.push_back({f.action, {}, f.action == FaultAction::kKill ? kInf : t, false});
      }
      std::lock_guard<std::mutex> l(mu_);
      res_.faults.push_back(rec);
      last_fault_text_ = rec.what;
      return;
    }
    if (rec.servers.empty()) {
      rec.ok = false;
      rec.note = "target resolved to no server";
    }
    if (IsPermanentFailure(f.action, f) && load_ != nullptr && !have_snapshot_) {
      placement_snapshot_ = load_->SnapshotPlacement();
      have_snapshot_ = true;
    }
    // Several servers are killed or stopped at once: signal them all before reaping any, so no
    // regeneration can run between the first and the last (r + 1 failures must be r + 1).
    if (rec.servers.size() > 1 &&
        (f.action == FaultAction::kKill || f.action == FaultAction::kStop)) {
      for (size_t i : rec.servers) {
        if (cluster_->Running(i)) {
          ::kill(cluster_->pid(i), f.action == FaultAction::kKill ? SIGKILL : SIGSTOP);
        }
      }
    }
    for (size_t i : rec.servers) {
      std::string note;
      Status st = Apply(f.action, i, f, &note);
      if (!note.empty()) rec.note += (rec.note.empty() ? "" : "; ") + note;
      if (!st.ok()) {
        rec.ok = false;
        rec.note +=
            (rec.note.empty() ? "" : "; ") + ("server " + std::to_string(i) + ": " + st.ToString());
      }
      if (IsPermanentFailure(f.action, f)) failed_servers_.insert(i);
    }
    if (IsPermanentFailure(f.action, f)) last_failure_t_ = t;
    double until = kInf;
    bool undo = false;
    if (f.duration_s > 0) {
      until = t + f.duration_s;
      undo = true;
    } else if (f.action == FaultAction::kBitflip || f.action == FaultAction::kEvict) {
      until = t + 2.0;
    } else if (f.action == FaultAction::kResume || f.action == FaultAction::kHeal) {
      // Ends the stop / partition windows on these servers.
      for (Active& a : active_) {
        bool match = (f.action == FaultAction::kResume && a.action == FaultAction::kStop) ||
                     (f.action == FaultAction::kHeal && a.action == FaultAction::kPartition);
        if (!match) continue;
        for (size_t sv : rec.servers) {
          if (std::find(a.servers.begin(), a.servers.end(), sv) != a.servers.end()) {
            a.until = std::min(a.until, t);
          }
        }
      }
      until = t;
    }
    active_.push_back({f.action, rec.servers, until, undo});
    {
      std::lock_guard<std::mutex> l(mu_);
      res_.faults.push_back(rec);
      last_fault_text_ = rec.what;
    }
  }

  void UpdatePhase(double t) {
    bool any_active = false;
    for (Active& a : active_) {
      if (a.undo && t >= a.until) {
        if (a.servers.empty() && aggregator_stopped_ > 0) {
          ::kill(aggregator_stopped_, SIGCONT);
          aggregator_stopped_ = 0;
        }
        for (size_t i : a.servers) Undo(a.action, i).IgnoreError();
        a.undo = false;
        std::lock_guard<std::mutex> l(mu_);
        FaultRecord rec;
        rec.t = t;
        rec.what = std::string("end of ") + FaultActionName(a.action);
        rec.servers = a.servers;
        res_.faults.push_back(rec);
      }
      if (t < a.until) any_active = true;
    }
    if (!active_.empty()) phase_.store(any_active ? 1 : 2);
  }

  // The fault scheduler: at_s faults by time, at_event faults on the workload's events.
  void Scheduler() {
    std::vector<bool> fired(s_.faults.size(), false);
    while (!sched_stop_.load()) {
      const double t = Now() - t0_;
      for (size_t i = 0; i < s_.faults.size(); ++i) {
        if (fired[i]) continue;
        const FaultSpec& f = s_.faults[i];
        bool due = false;
        if (f.at_s) {
          due = t >= *f.at_s;
        } else {
          std::lock_guard<std::mutex> l(mu_);
          for (const std::string& e : events_) due = due || e.find(f.at_event) != std::string::npos;
        }
        if (due) {
          fired[i] = true;
          FireFault(i, t);
        }
      }
      UpdatePhase(t);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));  // scheduling tick
    }
    // Timed faults still in place are undone before the cluster goes away.
    for (Active& a : active_) {
      if (a.undo) {
        for (size_t i : a.servers) Undo(a.action, i).IgnoreError();
        a.undo = false;
      }
    }
    if (aggregator_stopped_ > 0) ::kill(aggregator_stopped_, SIGCONT);
    aggregator_stopped_ = 0;
  }

  // ---- sampling ----

  void TakeSample(const std::function<WorkloadSample()>& probe) {
    Sample s;
    const double now = Now();
    s.t = now - t0_;
    WorkloadSample w = probe();
    const double dt = now - last_sample_t_;
    s.ops_per_s = w.rate >= 0 ? w.rate : dt > 0 ? static_cast<double>(w.ops - last_ops_) / dt : 0;
    last_ops_ = w.ops;
    s.p50_us = w.p50_us;
    s.p99_us = w.p99_us;
    s.degraded_reads = w.degraded_reads;
    s.regenerations_pending = w.regenerations_pending;
    s.data_loss = w.data_loss;
    s.server_failures = w.server_failures;
    const int phase = phase_.load();
    s.during = phase == 1 || last_phase_ == 1;
    last_phase_ = phase;
    uint64_t ticks = 0, rss = 0;
    for (size_t i = 0; i < cluster_->size(); ++i) {
      uint64_t t = 0, r = 0;
      if (cluster_->Running(i) && ProcUsage(cluster_->pid(i), &t, &r)) {
        ticks += t;
        rss += r;
      }
    }
    const double hz = static_cast<double>(::sysconf(_SC_CLK_TCK));
    // Ticks of killed servers drop out of the sum: never report a negative share.
    s.cpu_pct = dt > 0 && ticks >= last_ticks_
                    ? 100.0 * static_cast<double>(ticks - last_ticks_) / hz / dt
                    : 0;
    last_ticks_ = ticks;
    s.rss_mb = static_cast<double>(rss) / (1 << 20);
    last_sample_t_ = now;
    // Regeneration: the first moment after the last failure at which the failure has been
    // noticed and nothing is pending.
    const double failed_at = last_failure_t_.load();
    // Rebuilt: the failure was noticed, splits were rebuilt since, and none is left pending.
    if (failed_at >= 0 && regen_after_.load() < 0 && s.t > failed_at &&
        w.server_failures >= failures_before_.load() + 1 &&
        w.regenerations_done > regens_before_.load() && w.regenerations_pending == 0) {
      regen_after_.store(s.t - failed_at);
    }
    if (last_failure_t_ < 0) {
      failures_before_ = w.server_failures;
      regens_before_ = w.regenerations_done;
    }
    {
      std::lock_guard<std::mutex> l(mu_);
      res_.samples.push_back(s);
    }
    if (o_.progress) {
      std::string f;
      {
        std::lock_guard<std::mutex> l(mu_);
        f = last_fault_text_;
      }
      std::fprintf(stderr,
                   "\r\033[K[%s] t=%5.1fs  %8.0f ops/s  p50 %7.1f us  p99 %8.1f us  degraded %llu"
                   "  regen pending %llu  lost %llu  cpu %3.0f%%%s%s",
                   res_.name.c_str(), s.t, s.ops_per_s, s.p50_us, s.p99_us,
                   static_cast<unsigned long long>(s.degraded_reads),
                   static_cast<unsigned long long>(s.regenerations_pending),
                   static_cast<unsigned long long>(s.data_loss), s.cpu_pct,
                   f.empty() ? "" : "  last fault: ", f.c_str());
    }
  }

  void Sampler(const std::function<WorkloadSample()>& probe) {
    last_sample_t_ = Now();
    uint64_t next = MonotonicNs() + kSampleMs * 1000000ull;
    while (!sampler_stop_.load()) {
      uint64_t now = MonotonicNs();
      if (now < next) {
        std::this_thread::sleep_for(
            std::chrono::nanoseconds(std::min<uint64_t>(next - now, 5000000)));
        continue;
      }
      // Late (a starved thread on a busy machine): no burst of catch-up samples.
      next = std::max(next + kSampleMs * 1000000ull, now + kSampleMs * 1000000ull / 2);
      TakeSample(probe);
    }
  }

  // ---- workloads ----

  Status RunPagestore() {
    client::ErasureCodedStoreOptions eo;
    eo.remote.servers = servers_;
    eo.remote.secret = cluster_->secret();
    eo.remote.capacity_pages = s_.workload.pages;
    eo.remote.op_timeout_ms = static_cast<uint32_t>(c_.op_timeout_ms);
    eo.remote.max_inflight_pages = static_cast<uint32_t>(c_.max_inflight_pages);
    eo.remote.heartbeat_timeout_ms = static_cast<uint32_t>(c_.heartbeat_timeout_ms);
    eo.remote.placement.kind = c_.placement == "random" ? placement::PolicyKind::kRandom
                                                        : placement::PolicyKind::kCodingSets;
    eo.remote.placement.l = c_.l;
    eo.remote.placement.seed = s_.seed;
    eo.remote.client_id = s_.seed * 2 + 1;
    eo.k = c_.k;
    eo.r = c_.r;
    eo.delta = c_.delta;
    TESSERA_ASSIGN_OR_RETURN(eo.layout,
                             client::ParseEcLayout(c_.layout.empty() ? "split" : c_.layout));
    load_ = std::make_unique<PageLoad>(s_.workload, s_.seed, &phase_, o_.cancel);
    TESSERA_RETURN_IF_ERROR(load_->Open(eo));
    TESSERA_RETURN_IF_ERROR(load_->Fill().WithContext("writing the pages"));
    if (o_.cancel->load()) return Cancelled("cancelled");
    const bool census = expect_->slabs_back_to_baseline.has_value();
    if (census) {
      TESSERA_ASSIGN_OR_RETURN(SlabCensus c, TakeSlabCensus(*cluster_));
      res_.slabs_baseline = static_cast<int64_t>(c.allocated);
      res_.slabs_note = "after the fill: " + c.per_server;
    }
    t0_ = Now();
    {
      std::lock_guard<std::mutex> l(mu_);
      events_.push_back("loaded");
    }
    std::thread sampler([&] { Sampler([&] { return load_->Sample(); }); });
    std::thread sched;
    if (!res_.healthy) sched = std::thread([&] { Scheduler(); });
    Status st = load_->Load(t0_ + s_.duration_s);
    load_end_t_ = Now() - t0_;
    res_.completion_s = load_->load_s();
    // Wait for regeneration when it is judged (bounded by the expectation plus detection).
    const ExpectSpec& e = *expect_;
    if (st.ok() && e.regenerated_within_s && !res_.healthy) {
      const double bound = *e.regenerated_within_s + 3.0;
      while (!o_.cancel->load() && regen_after_.load() < 0 &&
             (last_failure_t_.load() < 0 || Now() - t0_ < last_failure_t_.load() + bound) &&
             Now() - t0_ < s_.duration_s + bound) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the sampler judges it
      }
    }
    sched_stop_.store(true);
    if (sched.joinable()) sched.join();
    // Final passes: every page read back.
    if (st.ok() && s_.workload.verify_at_end && !o_.cancel->load()) {
      std::vector<uint8_t> pass_lost;
      uint64_t detected_before = 0;
      for (int pass = 0; pass < s_.workload.verify_passes && st.ok(); ++pass) {
        detected_before = load_->store()->Stats().corruptions_detected;
        st = load_->Verify(&pass_lost);
        // Repairs of what this pass found are written in the background: wait for them when
        // they are judged.
        Deadline d = Deadline::AfterMs(expect_->corruptions_repaired_all ? 5000 : 0);
        while (!d.Expired()) {
          auto x = load_->store()->Stats();
          if (x.corruptions_repaired >= x.corruptions_detected) break;
          std::this_thread::sleep_for(std::chrono::milliseconds(10));  // bounded wait
        }
      }
      res_.scrub_clean = load_->store()->Stats().corruptions_detected == detected_before;
      if (have_snapshot_) {
        uint64_t lost = 0;
        for (PageId p = 0; p < s_.workload.pages; ++p) {
          size_t hit = 0;
          for (size_t sv : placement_snapshot_[p]) hit += failed_servers_.count(sv);
          const bool affected = hit > static_cast<size_t>(c_.r);
          res_.affected_pages += affected;
          res_.lost_not_affected += pass_lost[p] && !affected;
          res_.affected_not_lost += affected && !pass_lost[p];
          lost += pass_lost[p];
        }
        res_.have_affected = true;
        res_.lost_fraction = static_cast<double>(lost) / static_cast<double>(s_.workload.pages);
      }
    }
    if (st.ok() && census && !o_.cancel->load()) st = SlabCensusAtEnd();
    sampler_stop_.store(true);
    sampler.join();
    TakeSample([&] { return load_->Sample(); });
    auto x = load_->store()->Stats();
    res_.data_loss = load_->lost_pages();
    res_.wrong_bytes = load_->wrong_bytes();
    res_.wrong_pages = load_->wrong_pages();
    res_.read_errors = load_->read_errors();
    res_.write_errors = load_->write_errors();
    res_.reads_checked = load_->reads_checked();
    res_.corruptions_detected = x.corruptions_detected;
    res_.corruptions_repaired = x.corruptions_repaired;
    res_.server_failures = x.server_failures;
    res_.regenerations_done = x.regenerations_done;
    res_.degraded_reads = x.degraded_reads;
    LatencyHistogram before = load_->PhaseHistogram(0), during = load_->PhaseHistogram(1);
    res_.p50_before_us = before.p50() / 1e3;
    res_.p99_before_us = before.p99() / 1e3;
    res_.p50_during_us = during.p50() / 1e3;
    res_.p99_during_us = during.p99() / 1e3;
    load_.reset();  // Frees the slabs before the cluster goes.
    return st;
  }

  // The end census, once regeneration is done (bounded): resumed servers must answer again, so
  // a server still stopped is resumed first by the scheduler's undo (the faults have all ended).
  Status SlabCensusAtEnd() {
    const Deadline d = Deadline::AfterMs(60000);
    while (load_->store()->Stats().regenerations_pending > 0) {
      if (d.Expired()) {
        return Timeout("regeneration still pending 60 s after the load (slab census)");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));  // Poll interval.
    }
    TESSERA_ASSIGN_OR_RETURN(SlabCensus c, TakeSlabCensus(*cluster_));
    res_.slabs_end = static_cast<int64_t>(c.allocated);
    res_.slabs_note += "; at the end: " + c.per_server;
    return Status::Ok();
  }

  Status RunProgram() {
    std::vector<std::string> cmd = ExpandCommand(s_.workload.command, o_.data_dir);
    const std::string live = dir_ + "/live_stats", stats = dir_ + "/run_stats.json";
    const std::string err = dir_ + "/stderr.txt";
    std::vector<std::string> argv = {"/bin/sh",
                                     "-c",
                                     "exec \"$0\" \"$@\" 2>\"$TESSERA_EXPERIMENT_STDERR\"",
                                     o_.bin_dir + "/tessera-run",
                                     "--cluster=" + cluster_file_,
                                     "--auth_token_file=" + cluster_->token_path(),
                                     "--k=" + std::to_string(c_.k),
                                     "--r=" + std::to_string(c_.r),
                                     "--local_memory=" + s_.workload.local_memory,
                                     "--layout=" + c_.layout,
                                     "--stats_json=" + stats,
                                     "--live_stats_file=" + live,
                                     "--progress=false",
                                     "--"};
    argv.insert(argv.end(), cmd.begin(), cmd.end());
    Subprocess::Options so;
    so.capture_stdout = true;
    so.extra_env = {"TESSERA_EXPERIMENT_STDERR=" + err};
    t0_ = Now();
    TESSERA_ASSIGN_OR_RETURN(Subprocess proc, Subprocess::Start(argv, so));
    // The shim rewrites the live file about twice a second with its own clock (elapsed_ns):
    // the rate is taken between two of its snapshots and held until the next one.
    uint64_t prev_elapsed = 0, prev_ops = 0;
    double rate = 0;
    auto probe = [&]() {
      WorkloadSample w;
      std::istringstream in(ReadWholeFile(live));
      std::string k;
      uint64_t v;
      std::map<std::string, uint64_t> m;
      while (in >> k >> v) m[k] = v;
      w.ops = m["faults"] + m["wp_faults"];
      const uint64_t elapsed = m["elapsed_ns"];
      if (elapsed > prev_elapsed) {
        rate = static_cast<double>(w.ops - std::min(w.ops, prev_ops)) * 1e9 /
               static_cast<double>(elapsed - prev_elapsed);
        prev_elapsed = elapsed;
        prev_ops = w.ops;
      }
      w.rate = rate;
      w.p50_us = m["fault_p50_ns"] / 1e3;
      w.p99_us = m["fault_p99_ns"] / 1e3;
      w.degraded_reads = m["store_degraded_reads"];
      w.data_loss = m["store_data_loss"];
      w.server_failures = m["store_server_failures"];
      return w;
    };
    std::thread sampler([&] { Sampler(probe); });
    std::thread sched;
    if (!res_.healthy) sched = std::thread([&] { Scheduler(); });
    Deadline deadline(MonotonicNs() + static_cast<uint64_t>(s_.duration_s * 1e9));
    bool timed_out = false;
    while (true) {
      auto line = proc.ReadLine(Deadline::AfterMs(100));
      if (line.ok()) {
        res_.output += *line + "\n";
        std::lock_guard<std::mutex> l(mu_);
        events_.push_back(*line);
        continue;
      }
      if (line.status().code() != StatusCode::kTimeout) break;  // EOF
      if (o_.cancel->load() || deadline.Expired()) {
        timed_out = deadline.Expired();
        proc.Signal(SIGTERM).IgnoreError();
        break;
      }
    }
    auto ws = proc.Wait(Deadline::AfterMs(10000));
    if (!ws.ok()) {
      proc.Signal(SIGKILL).IgnoreError();
      ws = proc.Wait(Deadline::AfterMs(5000));
    }
    res_.completion_s = Now() - t0_;
    sched_stop_.store(true);
    if (sched.joinable()) sched.join();
    sampler_stop_.store(true);
    sampler.join();
    TakeSample(probe);
    WriteWholeFile(dir_ + "/stdout.txt", res_.output).IgnoreError();
    if (ws.ok()) {
      res_.exit_code = WIFEXITED(*ws) ? WEXITSTATUS(*ws) : 128 + WTERMSIG(*ws);
    }
    auto j = json::parse(ReadWholeFile(stats), nullptr, false);
    if (!j.is_discarded() && j.is_object()) {
      res_.data_loss = j.value("store_data_loss", uint64_t{0});
      res_.server_failures = j.value("store_server_failures", uint64_t{0});
      res_.regenerations_done = j.value("store_regenerations_done", uint64_t{0});
      res_.degraded_reads = j.value("store_degraded_reads", uint64_t{0});
      if (j.contains("elapsed_s")) res_.completion_s = j["elapsed_s"].get<double>();
    }
    // p99 before / during faults: the shim publishes a cumulative fault-latency p99; take its
    // largest value in each window.
    for (const Sample& s : res_.samples) {
      const bool during = !res_.faults.empty() && s.t >= res_.faults.front().t;
      double& p = during ? res_.p99_during_us : res_.p99_before_us;
      p = std::max(p, s.p99_us);
    }
    if (timed_out) return Timeout("the program ran past duration_s (", s_.duration_s, " s)");
    if (o_.cancel->load()) return Cancelled("cancelled");
    if (res_.exit_code != 0) {
      std::string tail = ReadWholeFile(err);
      if (tail.size() > 600) tail = "..." + tail.substr(tail.size() - 600);
      res_.error =
          "the program exited with " + std::to_string(res_.exit_code) + "; stderr: " + tail;
    }
    return Status::Ok();
  }

  // The gradient worker w pushes at iteration `it`: deterministic, so a rerun pushes the same.
  static void Gradient(std::vector<float>* g, int w, uint64_t it) {
    const float scale = 1e-3f * static_cast<float>(w + 1) * static_cast<float>(it % 5 + 1);
    for (size_t i = 0; i < g->size(); ++i) (*g)[i] = scale * static_cast<float>(i % 7 + 1);
  }

  // `tessera paramsvc serve` with its checkpoints erasure-coded on the scenario's memservers,
  // and `workers` training workers doing PushPull rounds; every worker's final parameters must
  // equal the service's.
  Status RunParamsvc() {
    const WorkloadSpec& w = s_.workload;
    std::vector<std::string> argv = {o_.bin_dir + "/tessera-paramsvc-serve",
                                     "--port=0",
                                     "--log_level=error",
                                     "--auth_token_file=" + cluster_->token_path(),
                                     "--store=" + cluster_file_,
                                     "--ec_k=" + std::to_string(c_.k),
                                     "--ec_r=" + std::to_string(c_.r),
                                     "--store_mb=256"};
    Subprocess::Options so;
    so.capture_stdout = true;
    so.quiet_stderr = true;
    TESSERA_ASSIGN_OR_RETURN(Subprocess svc, Subprocess::Start(argv, so));
    auto line = svc.WaitForLine("listening on ", Deadline::AfterMs(20000));
    if (!line.ok()) return line.status().WithContext("starting tessera paramsvc serve");
    const uint16_t port = static_cast<uint16_t>(std::stoi(line->substr(line->rfind(':') + 1)));
    line = svc.WaitForLine("aggregator ready", Deadline::AfterMs(20000));
    if (!line.ok()) return line.status().WithContext("waiting for the aggregation server");
    {
      const size_t p = line->find("pid ");
      if (p != std::string::npos) aggregator_pid_.store(std::atoi(line->c_str() + p + 4));
    }
    // The supervisor prints `aggregator pid N` again after each restart.
    std::atomic<bool> reader_stop{false};
    std::thread reader([&] {
      while (!reader_stop.load()) {
        auto l = svc.ReadLine(Deadline::AfterMs(100));
        if (!l.ok()) {
          if (l.status().code() != StatusCode::kTimeout) break;
          continue;
        }
        if (l->rfind("aggregator pid ", 0) == 0) aggregator_pid_.store(std::atoi(l->c_str() + 15));
        std::lock_guard<std::mutex> g(mu_);
        events_.push_back(*l);
      }
    });

    paramsvc::JobSpec spec;
    spec.name = "experiment-" + s_.name;
    spec.workers = static_cast<uint32_t>(w.workers);
    spec.mode = w.mode == "async" ? paramsvc::Mode::kAsync : paramsvc::Mode::kSync;
    spec.optimizer.lr = 0.01f;
    spec.tensors = {{"w", paramsvc::DType::kF32, {w.elements}}};
    std::atomic<uint64_t> iterations{0}, data_loss{0};
    std::mutex hist_mu;
    LatencyHistogram interval, phase_hist[3];
    std::vector<std::vector<float>> finals(static_cast<size_t>(w.workers));
    std::vector<std::string> errors(static_cast<size_t>(w.workers));
    std::vector<paramsvc::ClientCounters> counters(static_cast<size_t>(w.workers));
    auto connect = [&]() {
      paramsvc::ClientOptions co;
      co.port = port;
      co.secret = cluster_->secret();
      co.op_timeout_ms = 60000;
      co.reconnect_ms = 30000;
      return paramsvc::Client::Connect(co);
    };
    auto probe = [&] { return CountedSample(iterations.load(), data_loss.load(), hist_mu, interval); };
    t0_ = Now();
    std::thread sampler([&] { Sampler(probe); });
    std::thread sched;
    if (!res_.healthy) sched = std::thread([&] { Scheduler(); });
    const Deadline deadline(MonotonicNs() + static_cast<uint64_t>(s_.duration_s * 1e9));
    std::vector<std::thread> workers;
    for (int wk = 0; wk < w.workers; ++wk) {
      workers.emplace_back([&, wk] {
        auto c = connect();
        Status st = c.ok() ? (*c)->Join(spec, static_cast<uint32_t>(wk)) : c.status();
        if (st.ok()) st = (*c)->Barrier(0);
        std::vector<float> p(w.elements, 0.0f), g(w.elements);
        const void* gp[1] = {g.data()};
        void* pp[1] = {p.data()};
        if (st.ok()) st = (*c)->Pull(pp, false);
        // A training loop runs until the model reached its version, not for a count of its own
        // rounds: a round the service discarded on a restart (a rollback) is not counted.
        for (uint64_t it = 0; st.ok() && (*c)->min_version() < w.iterations; ++it) {
          if (o_.cancel->load() || deadline.Expired()) {
            st = Timeout("model version ", (*c)->min_version(), " of ", w.iterations,
                         " at duration_s");
            break;
          }
          Gradient(&g, wk, it);
          const int start_phase = phase_.load();
          const uint64_t a = MonotonicNs();
          st = (*c)->PushPull(gp, pp);
          const uint64_t lat = MonotonicNs() - a;
          if (st.code() == StatusCode::kDataLoss) data_loss.fetch_add(1);
          if (!st.ok()) break;
          iterations.fetch_add(1);
          // Progress events for at_event faults, from worker 0's view of the model.
          if (wk == 0) {
            const uint64_t v = (*c)->min_version();
            std::lock_guard<std::mutex> l(mu_);
            if (v * 4 >= w.iterations && !quarter_seen_) {
              quarter_seen_ = true;
              events_.push_back("quarter-way");
            }
            if (v * 2 >= w.iterations && !half_seen_) {
              half_seen_ = true;
              events_.push_back("half-way");
            }
          }
          std::lock_guard<std::mutex> l(hist_mu);
          interval.Record(lat);
          const int end_phase = std::clamp(phase_.load(), 0, 2);
          phase_hist[(start_phase == 1 || end_phase == 1) ? 1 : end_phase].Record(lat);
        }
        if (!st.ok())
          errors[static_cast<size_t>(wk)] = "worker " + std::to_string(wk) + ": " + st.ToString();
        if (c.ok()) counters[static_cast<size_t>(wk)] = (*c)->counters();
        finals[static_cast<size_t>(wk)] = std::move(p);
      });
    }
    for (std::thread& t : workers) t.join();
    res_.completion_s = Now() - t0_;
    sched_stop_.store(true);
    if (sched.joinable()) sched.join();
    // The service's parameters now; every worker's last pull must have returned exactly them
    // (sync) — async workers may legitimately hold an older version, so only sync is judged.
    std::vector<float> service(w.elements, 0.0f);
    Status final_st;
    {
      auto c = connect();
      final_st = c.ok() ? (*c)->Join(spec, 0) : c.status();
      void* pp[1] = {service.data()};
      if (final_st.ok()) final_st = (*c)->Pull(pp, false);
      if (final_st.code() == StatusCode::kDataLoss) data_loss.fetch_add(1);
      if (final_st.ok()) (*c)->Release().IgnoreError();
    }
    sampler_stop_.store(true);
    sampler.join();
    TakeSample(probe);
    reader_stop.store(true);
    reader.join();
    svc.Signal(SIGTERM).IgnoreError();
    if (!svc.Wait(Deadline::AfterMs(10000)).ok()) svc.Signal(SIGKILL).IgnoreError();

    res_.iterations = iterations.load();
    res_.data_loss = data_loss.load();
    for (const auto& k : counters) {
      res_.rollbacks += k.rollbacks;
      res_.reconnects += k.reconnects;
    }
    if (final_st.ok() && w.mode == "sync") {
      for (const auto& f : finals) {
        if (f.size() != service.size()) continue;
        ++res_.reads_checked;
        const auto* a = reinterpret_cast<const uint8_t*>(f.data());
        const auto* b = reinterpret_cast<const uint8_t*>(service.data());
        uint64_t wrong = 0;
        for (size_t i = 0; i < f.size() * sizeof(float); ++i) wrong += a[i] != b[i];
        res_.wrong_bytes += wrong;
        res_.wrong_pages += wrong > 0;
      }
    }
    res_.p50_before_us = phase_hist[0].p50() / 1e3;
    res_.p99_before_us = phase_hist[0].p99() / 1e3;
    res_.p50_during_us = phase_hist[1].p50() / 1e3;
    res_.p99_during_us = phase_hist[1].p99() / 1e3;
    std::string err;
    for (const std::string& e : errors) {
      if (!e.empty()) err += (err.empty() ? "" : "; ") + e;
    }
    if (!final_st.ok()) err += (err.empty() ? "" : "; ") + ("final pull: " + final_st.ToString());
    if (!err.empty()) return Internal(err);
    return Status::Ok();
  }

  // ---- kind = kv ----

  // The value of `key` written by its `seq`th PUT: the first 8 bytes name the key itself (a
  // chain of one key, so a chase stays on the key's server in every mode), bytes 8..15 the
  // sequence number, the rest derived from (seed, key, seq).
  static std::vector<uint8_t> KvValue(uint64_t seed, uint64_t key, uint64_t seq, size_t size) {
    std::vector<uint8_t> v(size);
    kbi::StoreLe64(v.data(), key);
    kbi::StoreLe64(v.data() + 8, seq);
    for (size_t i = 16; i < size; i += 8) {
      const uint64_t x = Mix(seed ^ (key << 24) ^ (seq * 0x9e3779b97f4a7c15ull) ^ i);
      for (size_t j = 0; j < 8 && i + j < size; ++j) v[i + j] = static_cast<uint8_t>(x >> (8 * j));
    }
    return v;
  }

  // A KV table loaded before t = 0, then `clients` closed-loop threads of GET/PUT/Invoke through
  // one kayak::Client. Thread t owns the keys k with k % clients == t, so it knows the last
  // acknowledged PUT of each: a GET must return exactly it, a chase must fold exactly it (a PUT
  // that failed leaves either value acceptable until the next acknowledged one). A read that
  // returns an older version of the key, or NotFound, is an acknowledged PUT lost (data_loss);
  // bytes that are no version of the key are wrong_bytes; errors (a dead server without
  // replication: Unavailable) are counted, never judged as values.
  Status RunKv() {
    const WorkloadSpec& w = s_.workload;
    kayak::ClientOptions ko;
    ko.servers = cluster_->endpoints();
    ko.secret = cluster_->secret();
    ko.client_id = s_.seed * 2 + 1;
    ko.replicas = static_cast<uint32_t>(w.replicas);
    TESSERA_ASSIGN_OR_RETURN(ko.controller.mode, kayak::ParseMode(w.mode));
    TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<kayak::Client> client,
                             kayak::Client::Connect(ko));
    const size_t nthreads = static_cast<size_t>(w.clients);
    const size_t vsize = static_cast<size_t>(w.value_size);
    struct KeyState {
      uint64_t acked = 0, pending = 0;  // seq of the last acknowledged / of a failed PUT
      bool lost = false;
    };
    // keys[t][j]: key id t + 1 + j * nthreads.
    std::vector<std::vector<KeyState>> state(nthreads);
    for (uint64_t k = 0; k < w.keys; ++k) state[k % nthreads].emplace_back();
    auto key_of = [&](size_t t, size_t j) { return t + 1 + j * nthreads; };
    std::atomic<uint64_t> ops{0}, issued{0}, lost{0}, wrong_bytes{0}, wrong_values{0};
    std::atomic<uint64_t> get_errors{0}, put_errors{0}, invoke_errors{0}, checked{0};
    std::mutex hist_mu, err_mu;
    LatencyHistogram interval, phase_hist[3];
    std::string first_error;
    auto note_error = [&](const char* what, uint64_t key, const Status& st) {
      std::lock_guard<std::mutex> l(err_mu);
      if (first_error.empty())
        first_error = std::string(what) + " key " + std::to_string(key) + ": " + st.ToString();
    };
    // Checks a value read for key (thread t, slot j); returns false when it was wrong.
    auto check = [&](KeyState& ks, uint64_t key, const std::vector<uint8_t>& got) {
      checked.fetch_add(1);
      const std::vector<uint8_t> want = KvValue(s_.seed, key, ks.acked, vsize);
      if (got == want) return true;
      if (ks.pending != 0 && got == KvValue(s_.seed, key, ks.pending, vsize)) return true;
      const uint64_t seq = got.size() >= 16 ? kbi::LoadLe64(got.data() + 8) : 0;
      if (seq < ks.acked && got == KvValue(s_.seed, key, seq, vsize)) {
        if (!ks.lost) lost.fetch_add(1);  // An older version: an acknowledged PUT was lost.
        ks.lost = true;
        return false;
      }
      uint64_t bad = got.size() > want.size() ? got.size() - want.size() : want.size() - got.size();
      for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) bad += got[i] != want[i];
      wrong_bytes.fetch_add(bad);
      wrong_values.fetch_add(1);
      return false;
    };
    // Load: every thread writes its keys once (seq 1).
    {
      std::vector<std::thread> loaders;
      std::vector<Status> load_st(nthreads);
      for (size_t t = 0; t < nthreads; ++t) {
        loaders.emplace_back([&, t] {
          for (size_t j = 0; j < state[t].size() && load_st[t].ok(); ++j) {
            const uint64_t key = key_of(t, j);
            auto r = client->Put(kbi::KeyBytes(key), KvValue(s_.seed, key, 1, vsize));
            if (!r.ok()) load_st[t] = r.status().WithContext("loading key " + std::to_string(key));
            state[t][j].acked = 1;
          }
        });
      }
      for (std::thread& th : loaders) th.join();
      for (const Status& st : load_st) TESSERA_RETURN_IF_ERROR(st.WithContext("loading the table"));
    }
    if (o_.cancel->load()) return Cancelled("cancelled");
    auto probe = [&] { return CountedSample(ops.load(), lost.load(), hist_mu, interval); };
    t0_ = Now();
    {
      std::lock_guard<std::mutex> l(mu_);
      events_.push_back("loaded");
    }
    std::thread sampler([&] { Sampler(probe); });
    std::thread sched;
    if (!res_.healthy) sched = std::thread([&] { Scheduler(); });
    const double until = t0_ + s_.duration_s;
    std::vector<std::thread> threads;
    for (size_t t = 0; t < nthreads; ++t) {
      threads.emplace_back([&, t] {
        std::mt19937_64 rng(Mix(s_.seed ^ (0x6b76ull << 32) ^ t));
        std::uniform_real_distribution<double> u(0.0, 1.0);
        std::vector<KeyState>& mine = state[t];
        if (mine.empty()) return;
        while (!o_.cancel->load() && Now() < until) {
          if (w.ops > 0 && issued.fetch_add(1) >= w.ops) break;
          const size_t j = static_cast<size_t>(rng() % mine.size());
          const uint64_t key = key_of(t, j);
          KeyState& ks = mine[j];
          const double dice = u(rng);
          const int start_phase = phase_.load();
          const uint64_t a = MonotonicNs();
          if (dice < w.put_ratio) {
            const uint64_t seq = std::max(ks.acked, ks.pending) + 1;
            auto r = client->Put(kbi::KeyBytes(key), KvValue(s_.seed, key, seq, vsize));
            if (r.ok()) {
              ks.acked = seq;
              ks.pending = 0;
              ks.lost = false;
            } else {
              ks.pending = seq;
              put_errors.fetch_add(1);
              note_error("PUT", key, r.status());
            }
          } else if (dice < w.put_ratio + w.invoke_ratio) {
            const uint32_t hops = static_cast<uint32_t>(w.hops);
            auto r = client->Invoke(kbi::kChase, kbi::ChaseArgs{key, hops, 0}.Encode());
            if (!r.ok()) {
              invoke_errors.fetch_add(1);
              note_error("chase", key, r.status());
            } else {
              checked.fetch_add(1);
              auto fold = [&](uint64_t seq) {
                const std::vector<uint8_t> v = KvValue(s_.seed, key, seq, vsize);
                uint64_t d = kbi::kDigestSeed;
                for (uint32_t h = 0; h < hops; ++h) d = kbi::Fold(d, v);
                return d;
              };
              auto res = kbi::ChaseResult::Decode(r->result);
              if (!res.ok() || res->last_key != key ||
                  (res->value != fold(ks.acked) &&
                   (ks.pending == 0 || res->value != fold(ks.pending)))) {
                wrong_values.fetch_add(1);
                wrong_bytes.fetch_add(8);  // The 8-byte digest of the chase's result.
              }
            }
          } else {
            auto r = client->Get(kbi::KeyBytes(key));
            if (r.ok()) {
              check(ks, key, r->bytes);
            } else if (r.status().code() == StatusCode::kNotFound) {
              if (!ks.lost) lost.fetch_add(1);
              ks.lost = true;
            } else {
              get_errors.fetch_add(1);
              note_error("GET", key, r.status());
            }
          }
          const uint64_t lat = MonotonicNs() - a;
          ops.fetch_add(1);
          std::lock_guard<std::mutex> l(hist_mu);
          interval.Record(lat);
          const int end_phase = std::clamp(phase_.load(), 0, 2);
          phase_hist[(start_phase == 1 || end_phase == 1) ? 1 : end_phase].Record(lat);
        }
      });
    }
    for (std::thread& th : threads) th.join();
    res_.completion_s = Now() - t0_;
    sched_stop_.store(true);
    if (sched.joinable()) sched.join();
    // Every key read back once more.
    uint64_t final_errors = 0;
    if (w.verify_at_end && !o_.cancel->load()) {
      for (size_t t = 0; t < nthreads; ++t) {
        for (size_t j = 0; j < state[t].size(); ++j) {
          const uint64_t key = key_of(t, j);
          KeyState& ks = state[t][j];
          auto r = client->Get(kbi::KeyBytes(key));
          if (r.ok()) {
            check(ks, key, r->bytes);
          } else if (r.status().code() == StatusCode::kNotFound) {
            if (!ks.lost) lost.fetch_add(1);
            ks.lost = true;
          } else {
            ++final_errors;
            note_error("final GET", key, r.status());
          }
        }
      }
    }
    sampler_stop_.store(true);
    sampler.join();
    TakeSample(probe);
    const kayak::Client::Counters kc = client->counters();
    res_.data_loss = lost.load();
    res_.wrong_bytes = wrong_bytes.load();
    res_.wrong_pages = wrong_values.load();
    res_.reads_checked = checked.load();
    res_.read_errors = get_errors.load() + invoke_errors.load() + final_errors;
    res_.write_errors = put_errors.load();
    res_.kv_ops = ops.load();
    res_.kv_final_errors = final_errors;
    res_.kv_invoke_errors = invoke_errors.load();
    res_.kv_rpc = kc.rpc;
    res_.kv_kv = kc.kv;
    res_.kv_pushed_back = kc.pushed_back;
    res_.kv_first_error = first_error;
    res_.p50_before_us = phase_hist[0].p50() / 1e3;
    res_.p99_before_us = phase_hist[0].p99() / 1e3;
    res_.p50_during_us = phase_hist[1].p50() / 1e3;
    res_.p99_during_us = phase_hist[1].p99() / 1e3;
    return Status::Ok();
  }

  Status RunInner() {
    ::mkdir(dir_.c_str(), 0755);
    // Partitions: nftables and the machine-wide lock are settled before the clock starts, so
    // waiting for another tool's lock does not shift the fault schedule.
    bool partitions = false;
    for (const FaultSpec& f : s_.faults) partitions |= f.action == FaultAction::kPartition;
    if (partitions && !res_.healthy) {
      partition_ready_ = partition_.Prepare(o_.lock_wait_ms);
      const std::string mode =
          partition_ready_.ok()
              ? PartitionMode()
              : "memserver drop-all fault (nftables not usable: " + partition_ready_.message() +
                    ")";
      WriteWholeFile(dir_ + "/partition.txt", mode + "\n").IgnoreError();
      if (o_.progress)
        std::fprintf(stderr, "[%s] partition: %s\n", res_.name.c_str(), mode.c_str());
    }
    TESSERA_RETURN_IF_ERROR(StartCluster());
    if (s_.workload.kind == "pagestore") return RunPagestore();
    if (s_.workload.kind == "paramsvc") return RunParamsvc();
    if (s_.workload.kind == "kv") return RunKv();
    return RunProgram();
  }

 private:
  std::string PartitionMode() const {
    return "nftables (table " + partition_.table() +
           (o_.system_lock.empty() ? std::string(", no lock)") : ", holding " + o_.system_lock + ")");
  }

 public:
  static std::vector<std::string> ExpandCommand(const std::vector<std::string>& cmd,
                                                const std::string& data_dir) {
    std::vector<std::string> out;
    for (std::string a : cmd) {
      const std::string key = "${data_dir}";
      for (size_t pos; (pos = a.find(key)) != std::string::npos;)
        a.replace(pos, key.size(), data_dir);
      out.push_back(a);
    }
    return out;
  }
  const ExpectSpec* expect_ = nullptr;

 private:
  const Scenario& s_;
  ClusterSpec c_;
  const RunOptions& o_;
  std::string dir_;
  Partition partition_;
  Status partition_ready_ = Unsupported("partition not prepared");
  std::unique_ptr<client::LocalCluster> cluster_;
  std::vector<client::RemoteServer> servers_;
  std::string cluster_file_;
  std::unique_ptr<PageLoad> load_;
  RunResult res_;
  std::mutex mu_;
  std::vector<std::string> events_;
  std::string last_fault_text_;
  std::vector<Active> active_;
  std::set<size_t> failed_servers_, partitioned_real_, partitioned_fallback_;
  std::vector<std::vector<size_t>> placement_snapshot_;
  bool have_snapshot_ = false;
  // Pagestore: when Load() returned (seconds since t0_); samples after it are not the load's.
  double load_end_t_ = kInf;
  std::atomic<int> phase_{0};
  std::atomic<bool> sched_stop_{false}, sampler_stop_{false};
  std::atomic<pid_t> aggregator_pid_{0};
  bool quarter_seen_ = false, half_seen_ = false;  // paramsvc progress events (under mu_)
  pid_t aggregator_stopped_ = 0;
  double t0_ = 0;
  double last_sample_t_ = 0;
  uint64_t last_ops_ = 0, last_ticks_ = 0;
  int last_phase_ = 0;
  std::atomic<double> last_failure_t_{-1};
  std::atomic<uint64_t> failures_before_{0}, regens_before_{0};
  std::atomic<double> regen_after_{-1};
};

// ---- results ----

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

std::string GnuplotQuote(std::string s) {
  for (char& c : s) {
    if (c == '"' || c == '\\') c = '\'';
  }
  return "\"" + s + "\"";
}

// timeline.png: throughput, latency and recovery counters over time, faults marked.
Status WritePlot(const RunResult& r, const std::string& dir, const std::string& title,
                 const std::string& workload_kind) {
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
  const bool run = workload_kind == "run";
  const bool ps = workload_kind == "paramsvc";
  g += "set ylabel " +
       GnuplotQuote(run  ? "page faults/s"
                    : ps ? "iterations/s"
                         : "page ops/s") +
       "\n";
  g += "plot " + csv + " every ::1 using 1:2 with lines lw 1.5 lc rgb '#1f77b4' title " +
       GnuplotQuote(run  ? "faults/s"
                    : ps ? "PushPull rounds/s"
                         : "ops/s") +
       "\n";
  g += "unset label\n";
  g += "set ylabel 'latency (us)'\nset logscale y\n";
  g += "plot " + csv + " every ::1 using 1:($3>0?$3:1/0) with lines lc rgb '#2ca02c' title " +
       GnuplotQuote(run  ? "fault p50 (cumulative)"
                    : ps ? "PushPull p50"
                         : "read p50") +
       ", " + csv + " every ::1 using 1:($4>0?$4:1/0) with lines lc rgb '#d62728' title " +
       GnuplotQuote(run  ? "fault p99 (cumulative)"
                    : ps ? "PushPull p99"
                         : "read p99") +
       "\n";
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
       " every ::1 using 1:($7>0?$7:1/0) with lines lw 2 title " +
       GnuplotQuote(run ? "data loss (reads)" : "data loss (pages)") + ", " + csv +
       " every ::1 using 1:($8>0?$8:1/0) with steps lw 2 title 'server failures'" +
       (any ? "" : ", 0 with lines lc rgb '#cccccc' title 'all zero'") + "\n";
  g += "unset multiplot\n";
  const std::string script = dir + "/timeline.gnuplot";
  TESSERA_RETURN_IF_ERROR(WriteWholeFile(script, g));
  auto res = RunTool({"gnuplot", script}, 30000);
  if (!res.ok()) return res.status();
  if (res->exit_code != 0) return Internal("gnuplot: ", res->output);
  return Status::Ok();
}

struct Check {
  std::string run;   // variant name ("" = the scenario)
  std::string name;  // expectation key
  std::string expected;
  std::string measured;
  bool pass = false;
};

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

// Predicted fraction of pages lost, from `tessera sim placement` on the same layout.
void Predict(const Scenario& s, const ClusterSpec& c, const RunOptions& o, RunResult* r,
             const std::set<size_t>& failed) {
  const uint64_t split = kPageSize / static_cast<uint64_t>(c.k);
  const uint64_t per_slab = std::max<uint64_t>(1, SizeOf(c.slab_size) / split);
  const uint64_t slabs = (s.workload.pages + per_slab - 1) / per_slab;
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

void Judge(const ExpectSpec& e, const RunResult& r, const RunResult* healthy,
           const std::string& local_output, const std::vector<RunResult>& all,
           const WorkloadSpec& w, std::vector<Check>* out) {
  auto add = [&](const std::string& name, const std::string& expected, const std::string& measured,
                 bool pass) {
    out->push_back({r.name, name, expected, measured, pass});
  };
  if (!r.error.empty()) add("run completed", "no error", r.error, false);
  if (e.data_loss) {
    add("data_loss", "= " + std::to_string(*e.data_loss),
        std::to_string(r.data_loss) + (w.kind == "pagestore" ? " pages"
                                       : w.kind == "kv"      ? " acknowledged PUTs lost"
                                                             : " reads"),
        static_cast<int64_t>(r.data_loss) == *e.data_loss);
  }
  if (e.wrong_bytes) {
    add("wrong_bytes", "= " + std::to_string(*e.wrong_bytes),
        std::to_string(r.wrong_bytes) + " (" + std::to_string(r.reads_checked) +
            (w.kind == "paramsvc" ? " workers' final parameters checked)" : " reads checked)"),
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
                    r.corruptions_repaired >= r.corruptions_detected && r.scrub_clean;
    add("corruptions_repaired_all", *e.corruptions_repaired_all ? "true" : "false",
        std::to_string(r.corruptions_detected) + " detected, " +
            std::to_string(r.corruptions_repaired) + " repaired, last scrub pass " +
            (r.scrub_clean ? "clean" : "found new ones"),
        ok == *e.corruptions_repaired_all);
  }
  if (e.data_loss_exactly_affected) {
    const bool ok = r.have_affected && r.lost_not_affected == 0 && r.affected_not_lost == 0;
    add("data_loss_exactly_affected", *e.data_loss_exactly_affected ? "true" : "false",
        r.have_affected ? std::to_string(r.affected_pages) + " pages on > r failed servers; " +
                              std::to_string(r.affected_not_lost) + " of them read back, " +
                              std::to_string(r.lost_not_affected) + " others lost"
                        : "no server failed (nothing to compare)",
        ok == *e.data_loss_exactly_affected);
  }
  if (e.slabs_back_to_baseline) {
    const bool same = r.slabs_baseline >= 0 && r.slabs_end == r.slabs_baseline;
    add("slabs_back_to_baseline", *e.slabs_back_to_baseline ? "true" : "false",
        r.slabs_end < 0 ? "no end census (" + r.slabs_note + ")"
                        : std::to_string(r.slabs_end) + " slabs at the end vs " +
                              std::to_string(r.slabs_baseline) + " after the fill (" +
                              r.slabs_note + ")",
        same == *e.slabs_back_to_baseline);
  }
  if (e.max_loss_error_vs_prediction) {
    const double err =
        r.predicted_fraction >= 0 ? std::fabs(r.lost_fraction - r.predicted_fraction) : kInf;
    add("max_loss_error_vs_prediction", "<= " + Fmt(*e.max_loss_error_vs_prediction, 3),
        "lost " + Fmt(r.lost_fraction, 3) + " of pages, predicted " +
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
                  {"placement", r.cluster.placement}};
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
  j["regenerations_done"] = r.regenerations_done;
  j["degraded_reads"] = r.degraded_reads;
  j["regenerated_after_s"] = r.regenerated_after_s;
  if (r.have_affected) {
    j["pages_affected"] = r.affected_pages;
    j["lost_fraction"] = r.lost_fraction;
  }
  if (r.predicted_fraction >= 0 || !r.prediction_cmd.empty()) {
    j["predicted_lost_fraction"] = r.predicted_fraction;
    j["prediction_command"] = r.prediction_cmd;
  }
  if (!r.partition_mode.empty()) j["partition_mode"] = r.partition_mode;
  if (r.slabs_baseline >= 0) {
    j["slabs_after_fill"] = r.slabs_baseline;
    j["slabs_at_end"] = r.slabs_end;
  }
  if (r.kv_ops > 0) {
    j["kv"] = {{"ops", r.kv_ops},
               {"acknowledged_puts_lost", r.data_loss},
               {"wrong_values", r.wrong_pages},
               {"values_checked", r.reads_checked},
               {"get_errors", r.read_errors - r.kv_invoke_errors - r.kv_final_errors},
               {"put_errors", r.write_errors},
               {"invoke_errors", r.kv_invoke_errors},
               {"final_read_errors", r.kv_final_errors},
               {"invokes_rpc", r.kv_rpc},
               {"invokes_kv", r.kv_kv},
               {"invokes_pushed_back", r.kv_pushed_back},
               {"first_error", r.kv_first_error}};
  }
  if (r.iterations > 0) {
    j["iterations"] = r.iterations;
    j["rollbacks"] = r.rollbacks;
    j["reconnects"] = r.reconnects;
  }
  j["exit_code"] = r.exit_code;
  if (!r.error.empty()) j["error"] = r.error;
  json faults = json::array();
  for (const FaultRecord& f : r.faults) {
    faults.push_back(
        {{"t_s", f.t}, {"what", f.what}, {"servers", f.servers}, {"ok", f.ok}, {"note", f.note}});
  }
  j["faults"] = faults;
  j["samples"] = r.samples.size();
  return j;
}

}  // namespace

Status CheckRunnable(const Scenario& s) {
  // The layout is a setting of the in-process page store and of `tessera run` (--layout); the
  // Parameter Service's checkpoint store and the KV tables (replicated) have none.
  auto layout_ok = [&](const std::string& l) -> Status {
    if (!l.empty() && (s.workload.kind == "paramsvc" || s.workload.kind == "kv")) {
      return Unsupported("layout applies to kind = \"pagestore\" and \"run\" only (kind = \"",
                         s.workload.kind, "\" uses its own store's default layout)");
    }
    return Status::Ok();
  };
  TESSERA_RETURN_IF_ERROR(layout_ok(s.cluster.layout));
  for (const VariantSpec& v : s.variants) {
    if (v.layout) TESSERA_RETURN_IF_ERROR(layout_ok(*v.layout));
  }
  // kayak::Client has no per-op timeout: an op to a server stopped or partitioned for good would
  // block the load forever, so such faults need a duration or a later resume/heal.
  if (s.workload.kind == "kv") {
    for (size_t i = 0; i < s.faults.size(); ++i) {
      const FaultSpec& f = s.faults[i];
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
                           " (kayak::Client has no per-operation timeout: requests to that "
                           "server would wait for ever)");
      }
    }
  }
  auto check_expect = [&](const ExpectSpec& e) -> Status {
    if (e.max_slowdown_vs_healthy && s.workload.kind == "pagestore" && s.workload.ops == 0) {
      return InvalidArgument(s.origin,
                             ": max_slowdown_vs_healthy with a pagestore workload needs "
                             "[workload] ops (a fixed amount of work to time)");
    }
    return Status::Ok();
  };
  TESSERA_RETURN_IF_ERROR(check_expect(s.expect));
  for (const VariantSpec& v : s.variants) TESSERA_RETURN_IF_ERROR(check_expect(v.expect));
  return Status::Ok();
}

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
  const double start = Now();

  std::string local_output;
  double local_s = 0;
  if (need_local) {
    if (o.progress) std::fprintf(stderr, "[local] running the program without tessera...\n");
    std::vector<std::string> cmd = ScenarioRun::ExpandCommand(s.workload.command, o.data_dir);
    Subprocess::Options so;
    so.capture_stdout = true;
    so.quiet_stderr = true;
    const double t = Now();
    auto p = Subprocess::Start(cmd, so);
    if (!p.ok()) return p.status().WithContext("starting the local run");
    while (true) {
      auto line = p->ReadLine(Deadline::AfterMs(200));
      if (line.ok()) {
        local_output += *line + "\n";
      } else if (line.status().code() != StatusCode::kTimeout) {
        break;
      } else if (opt.cancel->load() || Now() - t > s.duration_s) {
        return Cancelled("the local run did not finish within duration_s");
      }
    }
    auto ws = p->Wait(Deadline::AfterMs(10000));
    local_s = Now() - t;
    if (!ws.ok() || !WIFEXITED(*ws) || WEXITSTATUS(*ws) != 0) {
      return Internal("the program failed when run locally without tessera (",
                      s.workload.command[0], ")");
    }
  }

  std::vector<RunResult> results;
  std::unique_ptr<RunResult> healthy;
  if (need_healthy) {
    const Plan& p0 = plans.front();
    ScenarioRun run(s, p0.cluster, opt, "healthy", o.out_dir + "/healthy", true);
    run.expect_ = p0.expect;
    healthy = std::make_unique<RunResult>(run.Run());
    if (o.progress) std::fprintf(stderr, "\n");
    if (opt.cancel->load()) return Cancelled("cancelled");
    WriteTimeline(*healthy, o.out_dir + "/healthy").IgnoreError();
    WritePlot(*healthy, o.out_dir + "/healthy", s.name, s.workload.kind).IgnoreError();
  }
  for (const Plan& p : plans) {
    ScenarioRun run(s, p.cluster, opt, p.name, p.dir, false);
    run.expect_ = p.expect;
    RunResult r = run.Run();
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
    Status ps = WritePlot(r, p.dir, s.name, s.workload.kind);
    if (!ps.ok()) r.error += (r.error.empty() ? "" : "; ") + ("plot: " + ps.ToString());
    results.push_back(std::move(r));
  }

  std::vector<Check> checks;
  for (size_t i = 0; i < plans.size(); ++i) {
    Judge(*plans[i].expect, results[i], healthy.get(), local_output, results, s.workload, &checks);
  }
  Outcome out;
  out.expectations = static_cast<int>(checks.size());
  for (const Check& c : checks) out.failed += !c.pass;
  out.passed = out.failed == 0 && !checks.empty();

  // summary.json
  json j;
  j["scenario"] = s.name;
  j["description"] = s.description;
  j["origin"] = s.origin;
  j["seed"] = s.seed;
  j["quick"] = o.quick;
  j["duration_s"] = s.duration_s;
  j["workload"] = {{"kind", s.workload.kind}};
  if (s.workload.kind == "run") {
    j["workload"]["command"] = ScenarioRun::ExpandCommand(s.workload.command, o.data_dir);
    j["workload"]["local_memory"] = s.workload.local_memory;
  } else {
    j["workload"]["pages"] = s.workload.pages;
    j["workload"]["qd"] = s.workload.qd;
    j["workload"]["read_ratio"] = s.workload.read_ratio;
    j["workload"]["ops"] = s.workload.ops;
  }
  j["git_revision"] = version::Commit();
  j["version"] = version::Version();
  j["machine"] = Machine();
  j["started_utc"] = started;
  j["wall_s"] = Now() - start;
  if (need_local) j["local_run_s"] = local_s;
  if (healthy) j["healthy"] = ResultJson(*healthy);
  json runs = json::array();
  for (const RunResult& r : results) runs.push_back(ResultJson(r));
  j["runs"] = runs;
  json exp = json::array();
  for (const Check& c : checks) {
    exp.push_back({{"run", c.run},
                   {"expectation", c.name},
                   {"expected", c.expected},
                   {"measured", c.measured},
                   {"pass", c.pass}});
  }
  j["expectations"] = exp;
  j["verdict"] = out.passed ? "PASS" : "FAIL";
  j["scenario_toml"] = s.source;
  TESSERA_RETURN_IF_ERROR(WriteWholeFile(o.out_dir + "/summary.json", j.dump(2) + "\n"));

  // summary.md
  std::string md = "# Experiment `" + s.name + "`: " + (out.passed ? "PASS" : "FAIL") + "\n\n";
  if (!s.description.empty()) md += s.description + "\n\n";
  md += "- scenario: `" + s.origin + "`" + (o.quick ? " (--quick)" : "") + ", seed " +
        std::to_string(s.seed) + "\n";
  md += "- git revision: `" + j["git_revision"].get<std::string>() + "`\n";
  md += "- machine: " + j["machine"].value("hostname", std::string()) + ", " +
        std::to_string(j["machine"].value("cpus", 0)) + " CPUs, " +
        std::to_string(j["machine"].value("mem_total_mb", 0)) + " MB, " +
        j["machine"].value("kernel", std::string()) + "\n";
  md += "- started " + started + ", wall time " + Fmt(Now() - start, 1) + " s\n";
  if (need_local) md += "- local run (no tessera): " + Fmt(local_s, 2) + " s\n";
  md +=
      "\n## Expectations\n\n| run | expectation | expected | measured | result "
      "|\n|---|---|---|---|---|\n";
  for (const Check& c : checks) {
    md += "| " + c.run + " | " + c.name + " | " + c.expected + " | " + c.measured + " | " +
          (c.pass ? "PASS" : "**FAIL**") + " |\n";
  }
  if (checks.empty()) md += "| - | (no expectations given) | - | - | **FAIL** |\n";
  md += "\n## Runs\n\n";
  auto describe = [&](const RunResult& r, const std::string& dir) {
    md += "### " + r.name + "\n\n";
    if (s.workload.kind == "kv") {
      md += "- cluster: " + std::to_string(r.cluster.memservers) + " memservers; one KV table of " +
            std::to_string(s.workload.keys) + " keys x " + std::to_string(s.workload.value_size) +
            " B, " + std::to_string(s.workload.replicas) + "-way replicated, " +
            std::to_string(s.workload.clients) + " closed-loop clients\n";
    } else
    md += "- cluster: " + std::to_string(r.cluster.memservers) + " memservers" +
          (r.cluster.racks ? " in " + std::to_string(r.cluster.racks) + " racks" : "") + ", RS(" +
          std::to_string(r.cluster.k) + "," + std::to_string(r.cluster.r) + ") delta " +
          std::to_string(r.cluster.delta) + ", " + r.cluster.placement + " placement, " +
          (r.cluster.layout.empty()
               ? (s.workload.kind == "pagestore" ? std::string("split layout")
                                                 : std::string("the tool's default layout"))
               : r.cluster.layout + " layout") +
          "\n";
    if (s.workload.kind == "paramsvc") {
      md += "- completion " + Fmt(r.completion_s, 2) + " s; " + std::to_string(r.iterations) +
            " PushPull rounds, p50/p99 before faults " + Fmt(r.p50_before_us) + "/" +
            Fmt(r.p99_before_us) + " us, during " + Fmt(r.p50_during_us) + "/" +
            Fmt(r.p99_during_us) + " us; rounds/s median before " + Fmt(r.median_ops_before, 0) +
            ", lowest 300 ms during " + Fmt(std::max(0.0, r.min_ops_during), 0) +
            "; worker rollbacks " + std::to_string(r.rollbacks) + ", reconnects " +
            std::to_string(r.reconnects) + "\n";
    } else if (s.workload.kind == "run") {
      md += "- completion " + Fmt(r.completion_s, 2) + " s; page faults/s median before faults " +
            Fmt(r.median_ops_before, 0) + ", lowest 300 ms during " +
            Fmt(std::max(0.0, r.min_ops_during), 0) + "; fault latency p99 (cumulative) " +
            Fmt(r.p99_before_us) + " us before faults, " + Fmt(r.p99_during_us) + " us after\n";
    } else if (s.workload.kind == "kv") {
      md += "- completion " + Fmt(r.completion_s, 2) + " s; " + std::to_string(r.kv_ops) +
            " ops (" + s.workload.mode + " mode, " + std::to_string(s.workload.replicas) +
            "-way); op p50/p99 before faults " + Fmt(r.p50_before_us) + "/" +
            Fmt(r.p99_before_us) + " us, during faults " + Fmt(r.p50_during_us) + "/" +
            Fmt(r.p99_during_us) + " us; ops/s median before " + Fmt(r.median_ops_before, 0) +
            ", lowest 300 ms during " + Fmt(std::max(0.0, r.min_ops_during), 0) + "\n";
      md += "- acknowledged PUTs lost " + std::to_string(r.data_loss) + ", wrong values " +
            std::to_string(r.wrong_pages) + " of " + std::to_string(r.reads_checked) +
            " checked; errors: GET/chase " + std::to_string(r.read_errors) + ", PUT " +
            std::to_string(r.write_errors) + "; invokes rpc/kv/pushed back " +
            std::to_string(r.kv_rpc) + "/" + std::to_string(r.kv_kv) + "/" +
            std::to_string(r.kv_pushed_back) + "\n";
      if (!r.kv_first_error.empty()) md += "- first error: " + r.kv_first_error + "\n";
    } else {
      md += "- completion " + Fmt(r.completion_s, 2) + " s; read p50/p99 before faults " +
            Fmt(r.p50_before_us) + "/" + Fmt(r.p99_before_us) + " us, during faults " +
            Fmt(r.p50_during_us) + "/" + Fmt(r.p99_during_us) + " us; worst 100 ms p99 during " +
            Fmt(r.worst_p99_during_us) + " us; reads/s median before " +
            Fmt(r.median_ops_before, 0) + ", lowest 300 ms during " +
            Fmt(std::max(0.0, r.min_ops_during), 0) + "\n";
    }
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
  if (healthy) describe(*healthy, "healthy/");
  for (size_t i = 0; i < results.size(); ++i) {
    describe(results[i], s.variants.empty() ? "" : results[i].name + "/");
  }
  md += "Verdict: **" + std::string(out.passed ? "PASS" : "FAIL") + "** (" +
        std::to_string(out.expectations - out.failed) + " of " + std::to_string(out.expectations) +
        " expectations hold)\n";
  TESSERA_RETURN_IF_ERROR(WriteWholeFile(o.out_dir + "/summary.md", md));
  out.summary_md = md;
  return out;
}

}  // namespace tessera::experiment
