#include "apps/experiment/scenario_run.h"

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
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr int kSampleMs = 100;

class ScenarioRun {
 public:
  ScenarioRun(const Scenario& s, const ClusterSpec& c, const ExpectSpec& e, const RunOptions& o,
              const std::string& name, const std::string& dir, bool healthy)
      : s_(s), c_(c), o_(o), dir_(dir), partition_(o.system_lock), ctx_(s, c_, e, o, dir, healthy) {
    const WorkloadType& type = TypeOf(s.workload.kind);
    if (c_.layout.empty()) c_.layout = type.default_layout;
    res_.name = name;
    res_.healthy = healthy;
    res_.cluster = c_;
    workload_ = type.make(ctx_);
  }

  RunResult Run() {
    Status st = RunInner();
    if (!st.ok()) res_.error = st.ToString();
    res_.regenerated_after_s = regen_after_.load();
    SummarizeSamples(load_end_t_, &res_);
    workload_->Report(res_, &res_.report);
    if (client_ != nullptr) ReportClient();
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
      case TargetKind::kEtcd:
      case TargetKind::kClient:
        break;  // Not a memserver: FireFault acts on the process.
      case TargetKind::kPage:
        if (workload_->store() != nullptr) {
          auto r = client::ServersOfPage(*workload_->store(), f.target.n);
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
        if (cluster_->hosts() == client::HostsMode::kNetns) {
          res_.partition_mode = kHostLinkDown;
          partitioned_hosts_.insert(i);
          return cluster_->Partition(i);
        }
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
        if (workload_->store() == nullptr) return Status::Ok();
        return client::AddRemoteServer(*workload_->store(), servers_[i]);
      }
      case FaultAction::kHeal:
        if (partitioned_hosts_.erase(i) > 0) return cluster_->Heal(i);
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
    bool etcd = false;  // On the runner's etcd, not on servers.
  };

  // The client process (a pagestore workload with client_pages): started once the workload
  // has written its pages and taken its slab census, so the census counts none of its slabs.
  Status StartClient() {
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

  void ReportClient() {
    nlohmann::json c = {{"pages", s_.workload.pagestore.client_pages}, {"kills", client_->kills()}};
    std::string md = "- client process: " + std::to_string(client_->kills()) + " SIGKILLs, each "
                     "followed by a fresh process";
    if (client_outcome_) {
      c["final_pages_checked"] = client_outcome_->checked;
      c["final_lost"] = client_outcome_->lost;
      c["final_wrong_bytes"] = client_outcome_->wrong_bytes;
      c["final_read_errors"] = client_outcome_->read_errors;
      md += "; the final one read back " + std::to_string(client_outcome_->checked) + " of " +
            std::to_string(client_outcome_->pages) + " pages: " +
            std::to_string(client_outcome_->lost) + " lost, " +
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

  // A fault on the runner's etcd or on the client process.
  void FireProcessFault(const FaultSpec& f, double t, FaultRecord* rec) {
    Status st;
    Active a{f.action, {}, t, false};
    if (f.target.kind == TargetKind::kClient) {
      last_client_kill_at_ = NowS();
      st = client_ != nullptr ? client_->KillAndRestart()
                              : Unavailable("no client process is running");
      if (client_ != nullptr) {
        rec->note = "client process SIGKILLed and started again (" +
                    std::to_string(client_->kills()) + " kills so far)";
      }
    } else {
      a.etcd = true;
      switch (f.action) {
        case FaultAction::kKill:
          st = etcd_->Kill();
          a.until = f.duration_s > 0 ? t + f.duration_s : kInf;
          break;
        case FaultAction::kStop:
          st = etcd_->Stop();
          a.until = f.duration_s > 0 ? t + f.duration_s : kInf;
          break;
        default:  // resume: ends the stop windows of etcd.
          st = etcd_->Cont();
          for (Active& x : active_) {
            if (x.etcd && x.action == FaultAction::kStop) {
              x.until = std::min(x.until, t);
              x.undo = false;
            }
          }
          break;
      }
      a.undo = f.duration_s > 0;
      if (f.action == FaultAction::kKill && f.duration_s > 0) {
        rec->note = "restarted on the same data and port after " + Fmt(f.duration_s, 2) + " s";
      }
    }
    if (!st.ok()) {
      rec->ok = false;
      rec->note += (rec->note.empty() ? "" : "; ") + st.ToString();
    }
    active_.push_back(a);
    std::lock_guard<std::mutex> l(mu_);
    res_.faults.push_back(*rec);
    last_fault_text_ = rec->what;
  }

  // Undo of a timed fault on etcd: a killed etcd is started again on its data, a stopped one
  // resumed.
  Status UndoEtcd(FaultAction a) {
    if (etcd_ == nullptr) return Status::Ok();
    return a == FaultAction::kKill ? etcd_->Restart() : etcd_->Cont();
  }

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
    if (f.target.kind == TargetKind::kEtcd || f.target.kind == TargetKind::kClient) {
      FireProcessFault(f, t, &rec);
      return;
    }
    if (f.target.kind == TargetKind::kAggregator) {
      const pid_t pid = workload_->companion_pid();
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
    if (IsPermanentFailure(f.action, f) && !failed_before_) {
      workload_->BeforeFirstFailure();
      failed_before_ = true;
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
      if (IsPermanentFailure(f.action, f)) {
        ctx_.failed_servers().insert(i);
        ++permanent_failures_;
      }
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

  // after_recovery: every permanent failure fired so far is declared failed by the store, and
  // nothing is left to regenerate.
  bool Recovered() {
    client::PageStore* store = workload_->store();
    if (store == nullptr) return true;
    const client::PageStoreStats st = store->Stats();
    return st.server_failures >= permanent_failures_ && st.regenerations_pending == 0;
  }

  // The fault scheduler: at_s faults by time, at_event faults on the workload's events.
  void Scheduler() {
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
      res_.error += std::string(res_.error.empty() ? "" : "; ") + "the [[fault]] of line " +
                    std::to_string(s_.faults[i].line) + " never fired" +
                    (s_.faults[i].after_recovery
                         ? ": the store had not recovered from the failures before it"
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

  // ---- sampling ----

  void TakeSample() {
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

  void Sampler() {
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

  Status RunInner() {
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
              : "memserver drop-all fault (nftables not usable: " + partition_ready_.message() +
                    ")";
      WriteWholeFile(dir_ + "/partition.txt", mode + "\n").IgnoreError();
      if (o_.progress)
        std::fprintf(stderr, "[%s] partition: %s\n", res_.name.c_str(), mode.c_str());
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

  std::string PartitionMode() const {
    return "nftables (table " + partition_.table() +
           (o_.system_lock.empty() ? std::string(", no lock)")
                                   : ", holding " + o_.system_lock + ")");
  }

 private:
  const Scenario& s_;
  ClusterSpec c_;
  const RunOptions& o_;
  std::string dir_;
  Partition partition_;
  Status partition_ready_ = Unsupported("partition not prepared");
  std::unique_ptr<EtcdServer> etcd_;  // Outlives the memservers registered in it.
  std::unique_ptr<client::LocalCluster> cluster_;
  std::unique_ptr<ClientProcess> client_;  // Killed before the memservers go.
  std::optional<ClientOutcome> client_outcome_;
  double last_client_kill_at_ = -1;  // NowS() of the last SIGKILL of the client process.
  std::vector<client::RemoteServer> servers_;
  RunContext ctx_;
  // Destroyed before the context and the cluster: it frees its slabs, stops its service.
  std::unique_ptr<Workload> workload_;
  RunResult res_;
  std::mutex mu_;  // res_.samples, res_.faults, last_fault_text_
  std::string last_fault_text_;
  std::vector<Active> active_;
  std::set<size_t> partitioned_real_, partitioned_fallback_, partitioned_hosts_;
  static constexpr const char* kHostLinkDown =
      "network namespaces: the partitioned host's veth is down";
  bool failed_before_ = false;  // A server failed for good already.
  uint64_t permanent_failures_ = 0;  // Servers failed for good by the faults fired so far.
  // When the workload's Run() returned (seconds since t0_); samples after it are not the load's.
  double load_end_t_ = kInf;
  std::atomic<bool> sched_stop_{false}, sampler_stop_{false};
  pid_t aggregator_stopped_ = 0;
  double t0_ = 0;
  double last_sample_t_ = 0;
  uint64_t last_ops_ = 0, last_ticks_ = 0;
  int last_phase_ = 0;
  std::atomic<double> last_failure_t_{-1};
  std::atomic<uint64_t> failures_before_{0}, regens_before_{0};
  std::atomic<double> regen_after_{-1};
};

}  // namespace

RunResult RunScenarioOnce(const Scenario& s, const ClusterSpec& cluster, const ExpectSpec& expect,
                          const RunOptions& options, const std::string& name,
                          const std::string& dir, bool healthy) {
  return ScenarioRun(s, cluster, expect, options, name, dir, healthy).Run();
}

}  // namespace tessera::experiment
