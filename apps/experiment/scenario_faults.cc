// ScenarioRun's faults (scenario_run_internal.h): which servers a fault names, firing it on
// schedule or on the workload's events, and undoing a timed one.
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "apps/experiment/scenario_run_internal.h"
#include "apps/experiment/tools.h"
#include "common/clock.h"

namespace tessera::experiment {

std::vector<size_t> ScenarioRun::Resolve(const FaultSpec& f, size_t index) {
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

Status ScenarioRun::Apply(FaultAction a, size_t i, const FaultSpec& f, std::string* note) {
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

Status ScenarioRun::Undo(FaultAction a, size_t i) {
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

void ScenarioRun::FireProcessFault(const FaultSpec& f, double t, FaultRecord* rec) {
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

Status ScenarioRun::UndoEtcd(FaultAction a) {
  if (etcd_ == nullptr) return Status::Ok();
  return a == FaultAction::kKill ? etcd_->Restart() : etcd_->Cont();
}

bool ScenarioRun::IsPermanentFailure(FaultAction a, const FaultSpec& f) const {
  return a == FaultAction::kKill || a == FaultAction::kRestart ||
         (a == FaultAction::kPartition && f.duration_s <= 0);
}

void ScenarioRun::FireFault(size_t index, double t) {
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

}  // namespace tessera::experiment
