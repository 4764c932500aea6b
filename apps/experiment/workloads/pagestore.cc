// kind = pagestore: the in-process load generator on an erasure-coded store of the scenario's
// memservers. It writes every page, then issues random reads and writes at a fixed queue depth,
// checking every byte it reads against the content of the page's last acknowledged write; the
// final passes read every page once more. It is the only kind that knows which pages live on
// which servers: `page:P` targets, `restart` (the store joins the fresh server), the loss
// prediction and the slab census are its own. With [cluster] membership = "etcd" its store
// follows the memservers' registrations in the runner's etcd (membership::StoreFollower), as a
// client started with --etcd does.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <thread>

#include "apps/experiment/slab_census.h"
#include "apps/experiment/workload.h"
#include "common/clock.h"
#include "common/units.h"
#include "membership/etcd_view.h"

namespace tessera::experiment {
namespace {

using client::kPageSize;
using client::PageId;
using client::PageOp;
using client::PageStore;

constexpr double kInf = std::numeric_limits<double>::infinity();

// The driver: a single thread submits and completes the page ops; the sampler reads its
// counters.
class PageLoad {
 public:
  PageLoad(const PagestoreOptions& w, uint64_t seed, const RunContext* ctx)
      : w_(w),
        seed_(seed),
        ctx_(ctx),
        version_(w.pages, 0),
        unknown_(w.pages, 0),
        lost_(w.pages, 0),
        inflight_(w.pages, 0) {}

  Status Open(const client::ErasureCodedStoreOptions& o) {
    TESSERA_ASSIGN_OR_RETURN(store_, client::CreateErasureCodedStore(o));
    return Status::Ok();
  }
  client::RemotePageStore* store() { return store_.get(); }

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
    load_start_ = NowS();
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
    load_s_ = NowS() - load_start_;
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
    latency_.TakeInterval(&s);
    client::PageStoreStats st = store_->Stats();
    s.degraded_reads = st.degraded_reads;
    s.regenerations_pending = st.regenerations_pending;
    s.data_loss = lost_pages_.load(std::memory_order_relaxed);
    s.server_failures = st.server_failures;
    s.regenerations_done = st.regenerations_done;
    return s;
  }

  // Read latencies by phase, of Load()'s reads only (not of the verify passes after it, which
  // may run while a fault's window is still open).
  const PhaseLatency& latency() const { return latency_; }
  uint64_t wrong_bytes() const { return wrong_bytes_; }
  uint64_t wrong_pages() const { return wrong_pages_; }
  uint64_t lost_pages() const { return lost_pages_.load(); }
  uint64_t read_errors() const { return read_errors_; }
  uint64_t write_errors() const { return write_errors_; }
  uint64_t reads_checked() const { return reads_checked_; }
  double load_s() const { return load_s_; }

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
    if (in_load_) {
      latency_.Record(lat, s.start_phase, ctx_->phase());
    } else {
      latency_.RecordInterval(lat);
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

  // Keeps up to qd ops in flight from `next` until it returns false (or `until` / a cancel),
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
      if (ctx_->cancelled() || NowS() >= until) more = false;
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
        s.start_phase = ctx_->phase();
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

  PagestoreOptions w_;
  uint64_t seed_;
  const RunContext* ctx_;
  std::unique_ptr<client::RemotePageStore> store_;
  std::vector<uint32_t> version_;
  std::vector<uint8_t> unknown_, lost_, inflight_;
  std::vector<uint8_t>* pass_lost_ = nullptr;
  std::mutex done_mu_;
  std::condition_variable done_cv_;
  std::vector<size_t> done_;
  PhaseLatency latency_;
  std::atomic<uint64_t> completed_{0};
  std::atomic<uint64_t> lost_pages_{0};
  uint64_t wrong_bytes_ = 0, wrong_pages_ = 0, read_errors_ = 0, write_errors_ = 0;
  uint64_t reads_checked_ = 0;
  double load_start_ = 0, load_s_ = 0;
  bool in_load_ = false;  // Load() is driving the ops (Complete() runs on its thread).
};

class PagestoreWorkload : public Workload {
 public:
  explicit PagestoreWorkload(const RunContext& ctx) : w_(ctx.workload().pagestore) {}

  Status Start(RunContext& ctx) override {
    const ClusterSpec& c = ctx.cluster_spec();
    const Scenario& s = ctx.scenario();
    client::ErasureCodedStoreOptions eo;
    eo.remote.servers = ctx.servers();
    eo.remote.secret = ctx.cluster().secret();
    eo.remote.capacity_pages = w_.pages;
    eo.remote.op_timeout_ms = static_cast<uint32_t>(c.op_timeout_ms);
    eo.remote.max_inflight_pages = static_cast<uint32_t>(c.max_inflight_pages);
    eo.remote.heartbeat_timeout_ms = static_cast<uint32_t>(c.heartbeat_timeout_ms);
    eo.remote.placement.kind = c.placement == "random" ? placement::PolicyKind::kRandom
                                                       : placement::PolicyKind::kCodingSets;
    eo.remote.placement.l = c.l;
    eo.remote.placement.seed = s.seed;
    eo.remote.client_id = s.seed * 2 + 1;
    eo.k = c.k;
    eo.r = c.r;
    eo.delta = c.delta;
    TESSERA_ASSIGN_OR_RETURN(eo.layout, client::ParseEcLayout(c.layout));
    load_ = std::make_unique<PageLoad>(w_, s.seed, &ctx);
    if (!ctx.etcd_endpoint().empty()) {
      // Every memserver registered first; the store starts with the cluster's order (so that
      // server:N, page:P and the census name the same servers) and follows etcd from then on.
      membership::EtcdOptions mo;
      mo.endpoints = {ctx.etcd_endpoint()};
      TESSERA_ASSIGN_OR_RETURN(view_,
                               membership::MembershipView::Start(mo, RunContext::kEtcdClusterName));
      const size_t want = ctx.servers().size();
      if (!view_->WaitFor([&](const auto& m) { return m.size() == want; }, 15000)) {
        return Timeout("only ", view_->Members().size(), " of ", want,
                       " memservers registered in etcd within 15 s");
      }
    }
    TESSERA_RETURN_IF_ERROR(load_->Open(eo));
    if (view_ != nullptr) {
      TESSERA_ASSIGN_OR_RETURN(follower_, membership::StoreFollower::Start(view_.get(), load_->store()));
    }
    TESSERA_RETURN_IF_ERROR(load_->Fill().WithContext("writing the pages"));
    census_ = ctx.expect().slabs_back_to_baseline.has_value();
    if (census_ && !ctx.cancelled()) {
      TESSERA_ASSIGN_OR_RETURN(SlabCensus census, TakeSlabCensus(ctx.cluster()));
      pages_.slabs_baseline = static_cast<int64_t>(census.allocated);
      pages_.slabs_note = "after the fill: " + census.per_server;
    }
    ctx.Event("loaded");
    return Status::Ok();
  }

  Status Run(RunContext& ctx, RunResult* r) override {
    Status st = load_->Load(NowS() + ctx.scenario().duration_s);
    r->completion_s = load_->load_s();
    return st;
  }

  WorkloadSample Sample() override { return load_->Sample(); }

  // The final passes: every page read back; the pages lost compared with those that had more
  // than r of their servers fail; the slab census once regeneration is done.
  Status Verify(RunContext& ctx, RunResult*) override {
    Status st;
    if (w_.verify_at_end) {
      std::vector<uint8_t> pass_lost;
      uint64_t detected_before = 0;
      for (int pass = 0; pass < w_.verify_passes && st.ok(); ++pass) {
        detected_before = load_->store()->Stats().corruptions_detected;
        st = load_->Verify(&pass_lost);
        // Repairs of what this pass found are written in the background: wait for them when
        // they are judged.
        Deadline d = Deadline::AfterMs(ctx.expect().corruptions_repaired_all ? 5000 : 0);
        while (!d.Expired()) {
          auto x = load_->store()->Stats();
          if (x.corruptions_repaired >= x.corruptions_detected) break;
          std::this_thread::sleep_for(std::chrono::milliseconds(10));  // bounded wait
        }
      }
      pages_.scrub_clean = load_->store()->Stats().corruptions_detected == detected_before;
      if (!snapshot_.empty()) {
        const std::set<size_t>& failed = ctx.failed_servers();
        uint64_t lost = 0;
        for (PageId p = 0; p < w_.pages; ++p) {
          size_t hit = 0;
          for (size_t sv : snapshot_[p]) hit += failed.count(sv);
          const bool affected = hit > static_cast<size_t>(ctx.cluster_spec().r);
          pages_.affected_pages += affected;
          pages_.lost_not_affected += pass_lost[p] && !affected;
          pages_.affected_not_lost += affected && !pass_lost[p];
          lost += pass_lost[p];
        }
        pages_.have_affected = true;
        pages_.lost_fraction = static_cast<double>(lost) / static_cast<double>(w_.pages);
      }
    }
    if (st.ok() && census_ && !ctx.cancelled()) st = SlabCensusAtEnd(ctx);
    return st;
  }

  Status Finish(RunContext& ctx, RunResult* r) override {
    if (load_ == nullptr) return Status::Ok();
    if (follower_ != nullptr) {
      etcd_leaves_ = static_cast<int64_t>(follower_->leaves());
      etcd_joins_ = static_cast<int64_t>(follower_->joins());
    }
    follower_.reset();  // Before the store and the view.
    view_.reset();
    if (load_->store() != nullptr) {
      r->false_failures = FalseFailures(ctx);
      auto x = load_->store()->Stats();
      r->corruptions_detected = x.corruptions_detected;
      r->corruptions_repaired = x.corruptions_repaired;
      r->server_failures = x.server_failures;
      r->regenerations_done = x.regenerations_done;
      r->degraded_reads = x.degraded_reads;
    }
    r->data_loss = load_->lost_pages();
    r->wrong_bytes = load_->wrong_bytes();
    r->wrong_pages = load_->wrong_pages();
    r->read_errors = load_->read_errors();
    r->write_errors = load_->write_errors();
    r->reads_checked = load_->reads_checked();
    r->pages = pages_;
    load_->latency().SetResult(r);
    load_.reset();  // Frees the slabs before the cluster goes.
    return Status::Ok();
  }

  void Report(const RunResult& r, WorkloadReport* out) const override {
    out->md = ErasureCodedClusterLine(r);
    out->md += "- completion " + Fmt(r.completion_s, 2) + " s; read p50/p99 before faults " +
               Fmt(r.p50_before_us) + "/" + Fmt(r.p99_before_us) + " us, during faults " +
               Fmt(r.p50_during_us) + "/" + Fmt(r.p99_during_us) + " us; worst 100 ms p99 during " +
               Fmt(r.worst_p99_during_us) + " us; reads/s median before " +
               Fmt(r.median_ops_before, 0) + ", lowest 300 ms during " +
               Fmt(std::max(0.0, r.min_ops_during), 0) + "\n";
    if (r.pages.have_affected) {
      out->json["pages_affected"] = r.pages.affected_pages;
      out->json["lost_fraction"] = r.pages.lost_fraction;
    }
    if (r.pages.slabs_baseline >= 0) {
      out->json["slabs_after_fill"] = r.pages.slabs_baseline;
      out->json["slabs_at_end"] = r.pages.slabs_end;
      out->json["orphan_slabs_reclaimed"] = r.pages.orphan_slabs_reclaimed;
    }
    if (etcd_leaves_ >= 0) {
      out->json["etcd_leaves_followed"] = etcd_leaves_;
      out->json["etcd_joins_followed"] = etcd_joins_;
      out->md += "- etcd membership: the store followed " + std::to_string(etcd_joins_) +
                 " joins (the first registrations included) and " + std::to_string(etcd_leaves_) +
                 " leaves (registrations deleted or leases expired); " +
                 std::to_string(r.false_failures) + " servers declared failed that no fault failed\n";
    }
  }

  client::RemotePageStore* store() override { return load_ ? load_->store() : nullptr; }

  void BeforeFirstFailure() override {
    if (load_ != nullptr) snapshot_ = load_->SnapshotPlacement();
  }

 private:
  // The end census, once regeneration is done (bounded): the faults have all been undone, so
  // a server that was stopped answers again.
  Status SlabCensusAtEnd(RunContext& ctx) {
    const Deadline d = Deadline::AfterMs(60000);
    while (load_->store()->Stats().regenerations_pending > 0) {
      if (d.Expired()) {
        return Timeout("regeneration still pending 60 s after the load (slab census)");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));  // Poll interval.
    }
    TESSERA_ASSIGN_OR_RETURN(SlabCensus census, TakeSlabCensus(ctx.cluster()));
    // With an orphan grace, the slabs of killed clients are reclaimed by the memservers once
    // it runs out (checked every --monitor_interval, 200 ms): wait for that, bounded. A client
    // process that exited just before (the final one, whose FREEs are bounded at shutdown)
    // holds its slabs without being an orphan until each memserver has handled the close of
    // its connections, so the count back at the baseline is waited for too; a slab leaked by
    // a client still connected stays, and the census reports it after the bound.
    const std::string& grace = ctx.cluster_spec().orphan_grace;
    if (grace != "0") {
      const uint64_t grace_ms = ParseDurationNs(grace).value_or(0) / 1000000;
      const Deadline od = Deadline::AfterMs(grace_ms + 10000);
      while ((census.orphaned_owners > 0 ||
              static_cast<int64_t>(census.allocated) != pages_.slabs_baseline) &&
             !od.Expired() && !ctx.cancelled()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));  // Poll interval.
        TESSERA_ASSIGN_OR_RETURN(census, TakeSlabCensus(ctx.cluster()));
      }
      if (census.orphaned_owners == 0) pages_.orphans_cleared_at = NowS();
      if (census.orphaned_owners > 0) {
        pages_.slabs_note += "; " + std::to_string(census.orphaned_owners) +
                             " orphaned owners still hold slabs " + std::to_string(grace_ms + 10000) +
                             " ms on";
      }
    }
    pages_.orphan_slabs_reclaimed = census.orphan_slabs_reclaimed;
    pages_.slabs_end = static_cast<int64_t>(census.allocated);
    pages_.slabs_note += "; at the end: " + census.per_server;
    if (static_cast<int64_t>(census.allocated) != pages_.slabs_baseline) {
      pages_.slabs_note += "; owners holding slabs at the end: " + census.owners_per_server;
    }
    return Status::Ok();
  }

  // Servers of the store marked failed whose endpoint is a cluster server no fault failed for
  // good (kill, restart, a partition without end).
  int64_t FalseFailures(RunContext& ctx) const {
    auto servers = client::RemoteServersOf(*load_->store());
    auto failed = client::RemoteServersFailed(*load_->store());
    if (!servers.ok() || !failed.ok()) return -1;
    const auto& eps = ctx.cluster().endpoints();
    int64_t n = 0;
    for (size_t j = 0; j < servers->size() && j < failed->size(); ++j) {
      if (!(*failed)[j]) continue;
      for (size_t i = 0; i < eps.size(); ++i) {
        if (eps[i].ToString() == (*servers)[j].endpoint.ToString() &&
            ctx.failed_servers().count(i) == 0) {
          ++n;
        }
      }
    }
    return n;
  }

  PagestoreOptions w_;
  std::unique_ptr<PageLoad> load_;
  // Declared after load_: destroyed before the store (the follower first, then the view).
  std::unique_ptr<membership::MembershipView> view_;
  std::unique_ptr<membership::StoreFollower> follower_;
  int64_t etcd_leaves_ = -1, etcd_joins_ = -1;
  bool census_ = false;
  PageLossResult pages_;
  std::vector<std::vector<size_t>> snapshot_;  // Servers of every page before a failure.
};

Status CheckPagestore(const Scenario& s) {
  auto check = [&](const ExpectSpec& e) -> Status {
    if (e.max_slowdown_vs_healthy && s.workload.pagestore.ops == 0) {
      return InvalidArgument(s.origin,
                             ": max_slowdown_vs_healthy with a pagestore workload needs "
                             "[workload] ops (a fixed amount of work to time)");
    }
    return Status::Ok();
  };
  TESSERA_RETURN_IF_ERROR(check(s.expect));
  for (const VariantSpec& v : s.variants) TESSERA_RETURN_IF_ERROR(check(v.expect));
  return Status::Ok();
}

}  // namespace

extern const WorkloadType kPagestoreWorkload = {WorkloadKind::kPagestore, "split",
                                                &MakeWorkload<PagestoreWorkload>, &CheckPagestore};

}  // namespace tessera::experiment
