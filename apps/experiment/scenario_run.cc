#include "apps/experiment/scenario_run.h"
#include "apps/experiment/scenario_run_internal.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include "apps/experiment/child_processes.h"
#include "apps/experiment/partition.h"
#include "apps/experiment/tools.h"
#include "apps/experiment/workload.h"
#include "client/local_cluster.h"
#include "client/remote_store.h"
#include "common/clock.h"

namespace tessera::experiment {

RunResult ScenarioRun::Run() {
  Status st = RunInner();
  if (!st.ok()) res_.error = st.ToString();
  res_.regenerated_after_s = regen_after_.load();
  SummarizeSamples(load_end_t_, &res_);
  workload_->Report(res_, &res_.report);
  if (client_ != nullptr) ReportClient();
  partition_.HealAll();
  return std::move(res_);
}

int ScenarioRun::RackOf(size_t i) const {
  return c_.racks > 0 ? static_cast<int>(i * static_cast<size_t>(c_.racks) /
                                         static_cast<size_t>(c_.memservers))
                      : -1;
}

Status ScenarioRun::StartCluster() {
  client::LocalClusterOptions lo;
  lo.bin_dir = o_.bin_dir;
  lo.servers = static_cast<size_t>(c_.memservers);
  lo.capacity = c_.capacity;
  lo.slab_size = c_.slab_size;
  lo.fault_injection = true;
  lo.extra_flags = {"--orphan_grace=" + c_.orphan_grace};
  if (c_.membership == "etcd") {
    // The runner's own etcd, first: every memserver registers in it under a lease.
    TESSERA_ASSIGN_OR_RETURN(etcd_, EtcdServer::Start(dir_ + "/etcd.log"));
    lo.extra_flags.push_back("--etcd=" + etcd_->endpoint());
    lo.extra_flags.push_back(std::string("--cluster_name=") + RunContext::kEtcdClusterName);
    lo.extra_flags.push_back("--etcd_ttl=" + std::to_string(c_.etcd_ttl_s) + "s");
    ctx_.SetEtcd(etcd_->endpoint());
  }
  lo.hosts = c_.hosts == "netns" ? client::HostsMode::kNetns : client::HostsMode::kLoopback;
  TESSERA_ASSIGN_OR_RETURN(cluster_, client::LocalCluster::Start(lo));
  res_.hosts = client::HostsModeName(cluster_->hosts());
  if (c_.hosts == "netns" && cluster_->hosts() != client::HostsMode::kNetns) {
    res_.hosts += " (netns asked for: " + cluster_->hosts_note() + ")";
  }
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
  const std::string file = dir_ + "/cluster";
  TESSERA_RETURN_IF_ERROR(WriteWholeFile(file, text));
  ctx_.SetCluster(cluster_.get(), servers_, file);
  return Status::Ok();
}

Status ScenarioRun::StartClient() {
  const PagestoreOptions& w = s_.workload.pagestore;
  nlohmann::json spec = {{"token_file", cluster_->token_path()},
                         {"pages", w.client_pages},
                         {"seed", s_.seed * 7 + 3},
                         {"k", c_.k},
                         {"r", c_.r},
                         {"delta", c_.delta},
                         {"l", c_.l},
                         {"layout", c_.layout},
                         {"placement", c_.placement},
                         {"op_timeout_ms", c_.op_timeout_ms},
                         {"heartbeat_timeout_ms", c_.heartbeat_timeout_ms}};
  nlohmann::json eps = nlohmann::json::array();
  for (const auto& e : cluster_->endpoints()) eps.push_back(e.ToString());
  spec["servers"] = eps;
  TESSERA_ASSIGN_OR_RETURN(
      client_, ClientProcess::Start(o_.bin_dir, spec.dump(2) + "\n", dir_ + "/client.json"));
  return Status::Ok();
}

void ScenarioRun::ReportClient() {
  nlohmann::json c = {{"pages", s_.workload.pagestore.client_pages}, {"kills", client_->kills()}};
  std::string md = "- client process: " + std::to_string(client_->kills()) +
                   " SIGKILLs, each "
                   "followed by a fresh process";
  if (client_outcome_) {
    c["final_pages_checked"] = client_outcome_->checked;
    c["final_lost"] = client_outcome_->lost;
    c["final_wrong_bytes"] = client_outcome_->wrong_bytes;
    c["final_read_errors"] = client_outcome_->read_errors;
    md += "; the final one read back " + std::to_string(client_outcome_->checked) + " of " +
          std::to_string(client_outcome_->pages) +
          " pages: " + std::to_string(client_outcome_->lost) + " lost, " +
          std::to_string(client_outcome_->wrong_bytes) + " wrong bytes";
  }
  if (last_client_kill_at_ >= 0 && res_.pages.orphans_cleared_at >= 0) {
    const double s = res_.pages.orphans_cleared_at - last_client_kill_at_;
    c["orphans_reclaimed_s_after_last_kill"] = s;
    md += "; every killed client's slabs reclaimed " + Fmt(s, 2) + " s after the last kill";
  }
  res_.report.json["client_process"] = c;
  res_.report.md += md + "\n";
}

void ScenarioRun::UpdatePhase(double t) {
  bool any_active = false;
  for (Active& a : active_) {
    if (a.undo && t >= a.until) {
      Status etcd_undo;
      if (a.etcd) {
        etcd_undo = UndoEtcd(a.action);
      } else if (a.servers.empty() && aggregator_stopped_ > 0) {
        ::kill(aggregator_stopped_, SIGCONT);
        aggregator_stopped_ = 0;
      }
      for (size_t i : a.servers) Undo(a.action, i).IgnoreError();
      a.undo = false;
      std::lock_guard<std::mutex> l(mu_);
      FaultRecord rec;
      rec.t = t;
      rec.what = std::string("end of ") + FaultActionName(a.action) + (a.etcd ? " etcd" : "");
      rec.servers = a.servers;
      if (!etcd_undo.ok()) {
        rec.ok = false;
        rec.note = etcd_undo.ToString();
      }
      res_.faults.push_back(rec);
    }
    if (t < a.until) any_active = true;
  }
  if (!active_.empty()) ctx_.set_phase(any_active ? 1 : 2);
}

bool ScenarioRun::Recovered() {
  client::PageStore* store = workload_->store();
  if (store == nullptr) return true;
  const client::PageStoreStats st = store->Stats();
  return st.server_failures >= permanent_failures_ && st.regenerations_pending == 0;
}

void ScenarioRun::Scheduler() {
  std::vector<bool> fired(s_.faults.size(), false);
  while (!sched_stop_.load()) {
    const double t = NowS() - t0_;
    for (size_t i = 0; i < s_.faults.size(); ++i) {
      if (fired[i]) continue;
      const FaultSpec& f = s_.faults[i];
      bool due = false;
      if (f.at_s) {
        due = t >= *f.at_s;
      } else {
        due = ctx_.HasEvent(f.at_event);
      }
      if (due && f.after_recovery && !Recovered()) continue;  // Checked again next tick.
      if (due) {
        fired[i] = true;
        FireFault(i, t);
      }
    }
    UpdatePhase(t);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // scheduling tick
  }
  for (size_t i = 0; i < s_.faults.size(); ++i) {
    if (fired[i]) continue;
    std::lock_guard<std::mutex> l(mu_);
    res_.error +=
        std::string(res_.error.empty() ? "" : "; ") + "the [[fault]] of line " +
        std::to_string(s_.faults[i].line) + " never fired" +
        (s_.faults[i].after_recovery ? ": the store had not recovered from the failures before it"
                                     : "");
  }
  // Timed faults still in place are undone before the cluster goes away.
  for (Active& a : active_) {
    if (a.undo) {
      if (a.etcd) UndoEtcd(a.action).IgnoreError();
      for (size_t i : a.servers) Undo(a.action, i).IgnoreError();
      a.undo = false;
    }
  }
  if (aggregator_stopped_ > 0) ::kill(aggregator_stopped_, SIGCONT);
  aggregator_stopped_ = 0;
}

void ScenarioRun::TakeSample() {
  Sample s;
  const double now = NowS();
  s.t = now - t0_;
  WorkloadSample w = workload_->Sample();
  const double dt = now - last_sample_t_;
  s.ops_per_s = w.rate >= 0 ? w.rate : dt > 0 ? static_cast<double>(w.ops - last_ops_) / dt : 0;
  last_ops_ = w.ops;
  s.p50_us = w.p50_us;
  s.p99_us = w.p99_us;
  s.degraded_reads = w.degraded_reads;
  s.regenerations_pending = w.regenerations_pending;
  s.data_loss = w.data_loss;
  s.server_failures = w.server_failures;
  const int phase = ctx_.phase();
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

void ScenarioRun::Sampler() {
  last_sample_t_ = NowS();
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
    TakeSample();
  }
}

Status ScenarioRun::RunInner() {
  ::mkdir(dir_.c_str(), 0755);
  // Partitions: nftables and the machine-wide lock are settled before the clock starts, so
  // waiting for another tool's lock does not shift the fault schedule.
  bool partitions = false;
  for (const FaultSpec& f : s_.faults) partitions |= f.action == FaultAction::kPartition;
  TESSERA_RETURN_IF_ERROR(StartCluster());
  if (partitions && !res_.healthy) {
    const bool hosts = cluster_->hosts() == client::HostsMode::kNetns;
    if (!hosts) partition_ready_ = partition_.Prepare(o_.lock_wait_ms);
    const std::string mode =
        hosts ? kHostLinkDown
        : partition_ready_.ok()
            ? PartitionMode()
            : "memserver drop-all fault (nftables not usable: " + partition_ready_.message() + ")";
    WriteWholeFile(dir_ + "/partition.txt", mode + "\n").IgnoreError();
    if (o_.progress) std::fprintf(stderr, "[%s] partition: %s\n", res_.name.c_str(), mode.c_str());
  }
  Status st = workload_->Start(ctx_);
  if (st.ok() && s_.workload.kind == WorkloadKind::kPagestore &&
      s_.workload.pagestore.client_pages > 0) {
    st = StartClient();
  }
  if (st.ok() && ctx_.cancelled()) st = Cancelled("cancelled");
  if (!st.ok()) {
    workload_->Finish(ctx_, &res_).IgnoreError();
    return st;
  }
  t0_ = NowS();
  std::thread sampler([&] { Sampler(); });
  std::thread sched;
  if (!res_.healthy) sched = std::thread([&] { Scheduler(); });
  st = workload_->Run(ctx_, &res_);
  load_end_t_ = NowS() - t0_;
  // Wait for regeneration when it is judged (bounded by the expectation plus detection).
  const ExpectSpec& e = ctx_.expect();
  if (st.ok() && e.regenerated_within_s && !res_.healthy) {
    const double bound = *e.regenerated_within_s + 3.0;
    while (!ctx_.cancelled() && regen_after_.load() < 0 &&
           (last_failure_t_.load() < 0 || NowS() - t0_ < last_failure_t_.load() + bound) &&
           NowS() - t0_ < s_.duration_s + bound) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the sampler judges it
    }
  }
  sched_stop_.store(true);
  if (sched.joinable()) sched.join();
  if (st.ok() && !ctx_.cancelled() && client_ != nullptr) {
    // The final client process checks its pages and frees its slabs before the census.
    auto o = client_->Finish();
    if (o.ok()) client_outcome_ = *o;
    st = o.status();
  }
  if (st.ok() && !ctx_.cancelled()) st = workload_->Verify(ctx_, &res_);
  sampler_stop_.store(true);
  sampler.join();
  TakeSample();
  Status fin = workload_->Finish(ctx_, &res_);
  if (client_outcome_) {  // Its pages count with the workload's.
    res_.data_loss += client_outcome_->lost;
    res_.wrong_bytes += client_outcome_->wrong_bytes;
    res_.read_errors += client_outcome_->read_errors;
    res_.reads_checked += client_outcome_->checked;
  }
  return st.ok() ? fin : st;
}

std::string ScenarioRun::PartitionMode() const {
  return "nftables (table " + partition_.table() +
         (o_.system_lock.empty() ? std::string(", no lock)") : ", holding " + o_.system_lock + ")");
}

RunResult RunScenarioOnce(const Scenario& s, const ClusterSpec& cluster, const ExpectSpec& expect,
                          const RunOptions& options, const std::string& name,
                          const std::string& dir, bool healthy) {
  return ScenarioRun(s, cluster, expect, options, name, dir, healthy).Run();
}

}  // namespace tessera::experiment
