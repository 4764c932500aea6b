// The requests of the Parameter Service server's connections (server_loop.cc reads them and
// runs the handshake): the control requests (register, join, barrier, release, set, status)
// are answered here; pushes and pulls go to the partitions' cores.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "apps/paramsvc/server/server_impl.h"
#include "common/clock.h"
#include "common/logging.h"
#include "fabric/auth.h"
#include "fabric/credential.h"

namespace tessera::paramsvc {

Result<std::pair<std::shared_ptr<Server::Impl::Job>, Server::Impl::Partition*>>
Server::Impl::Resolve(uint32_t job_id, uint32_t part) {
  std::shared_ptr<Job> job = FindJob(job_id);
  if (!job) return NotFound("unknown job ", job_id);
  if (part >= job->parts.size()) {
    return OutOfRange("job ", job_id, " ('", job->spec.name, "') has ", job->parts.size(),
                      " partitions, not ", part, "+1");
  }
  return std::make_pair(job, job->parts[part].get());
}

void Server::Impl::Handle(const std::shared_ptr<Conn>& conn, const Header& h,
                          std::vector<uint8_t> payload) {
  const uint8_t op = h.op;
  auto fail = [&](const Status& s) { conn->SendError(op, h.job, h.request_id, s); };
  // A job this server does not have: moved away (kStatusMoved) or unknown (NotFound).
  auto lost = [&](const Status& s) {
    if (s.code() == StatusCode::kNotFound && AnswerMoved(conn, h)) return;
    fail(s);
  };
  // A staged copy (a move arriving): kStatusArriving, which clients retry.
  auto arriving = [&](const Job& job) {
    const std::string m = "job '" + job.spec.name + "' is arriving from " + job.peer +
                          " (move " + std::to_string(job.move_id) + "); retry";
    conn->Queue({Header{op, kStatusArriving, 0, h.job, h.request_id},
                 std::vector<uint8_t>(m.begin(), m.end()), nullptr});
  };
  auto need_admin = [&]() {
    if (conn->admin.load()) return true;
    fail(PermissionDenied(OpName(op), " needs an admin credential (the cluster secret or "
                                      "`tessera token issue --admin`)"));
    return false;
  };
  switch (static_cast<Op>(op)) {
    case Op::kError:
      return fail(ProtocolError("ERROR is a reply, not a request"));
    case Op::kHello:
    case Op::kAuth:
      return fail(ProtocolError(OpName(op), " after authentication"));
    case Op::kRegister: {
      auto spec = JobSpec::Decode(payload);
      if (!spec.ok()) return fail(spec.status());
      std::string moved_to;
      std::shared_ptr<Job> staged;
      auto layout = Register(std::move(*spec), &moved_to, &staged);
      if (!moved_to.empty()) return conn->SendMoved(op, 0, h.request_id, moved_to);
      if (staged) return arriving(*staged);
      if (!layout.ok()) return fail(layout.status());
      const auto bytes = layout->Encode();
      conn->Send(op, layout->job, h.request_id, bytes);
      return;
    }
    case Op::kPush: {
      auto r = PushRequest::Decode(payload);
      if (!r.ok()) return fail(r.status());
      auto jp = Resolve(h.job, r->partition);
      if (!jp.ok()) return lost(jp.status());
      auto& [job, p] = *jp;
      if (job->place.load() == Job::kStaged) return arriving(*job);
      if (r->worker >= job->spec.workers) {
        return fail(InvalidArgument("worker ", r->worker, " but job '", job->spec.name, "' has ",
                                    job->spec.workers, " workers"));
      }
      if (r->dtype != p->dtype) {
        return fail(InvalidArgument("push of ", DTypeName(r->dtype), " to tensor '",
                                    job->spec.tensors[p->info.tensor].name, "' (",
                                    DTypeName(p->dtype), ")"));
      }
      if (r->count != p->info.count) {
        return fail(InvalidArgument("push of ", r->count, " elements to partition ", r->partition,
                                    " of ", p->info.count, " elements"));
      }
      auto t = std::make_unique<Task>();
      t->kind = Task::kPush;
      t->job = job;
      t->p = p;
      t->conn = conn;
      t->rid = h.request_id;
      t->bytes = r->data.size();
      t->push = *r;
      t->frame = std::move(payload);  // The span stays valid: the buffer moved, not copied.
      Enqueue(p->core.load(), std::move(t));
      return;
    }
    case Op::kPull: {
      auto r = PullRequest::Decode(payload);
      if (!r.ok()) return fail(r.status());
      auto jp = Resolve(h.job, r->partition);
      if (!jp.ok()) return lost(jp.status());
      auto& [job, p] = *jp;
      if (job->place.load() == Job::kStaged) return arriving(*job);
      if (r->dtype != p->dtype && r->dtype != DType::kF32) {
        return fail(InvalidArgument("pull of tensor '", job->spec.tensors[p->info.tensor].name,
                                    "' (", DTypeName(p->dtype), ") as ", DTypeName(r->dtype),
                                    " (its dtype or fp32)"));
      }
      auto t = std::make_unique<Task>();
      t->kind = Task::kPull;
      t->job = job;
      t->p = p;
      t->conn = conn;
      t->rid = h.request_id;
      t->bytes = 4ull * p->info.count;
      t->pull = *r;
      Enqueue(p->core.load(), std::move(t));
      return;
    }
    case Op::kSetParams: {
      auto r = SetParamsRequest::Decode(payload);
      if (!r.ok()) return fail(r.status());
      auto jp = Resolve(h.job, r->partition);
      if (!jp.ok()) return lost(jp.status());
      auto& [job, p] = *jp;
      if (job->place.load() == Job::kStaged) return arriving(*job);
      if ((r->dtype != p->dtype && r->dtype != DType::kF32) || r->count != p->info.count) {
        return fail(InvalidArgument("initial values for partition ", r->partition, ": ", r->count,
                                    " ", DTypeName(r->dtype), " elements, expected ", p->info.count,
                                    " ", DTypeName(p->dtype), " or fp32"));
      }
      auto t = std::make_unique<Task>();
      t->kind = Task::kSet;
      t->job = job;
      t->p = p;
      t->conn = conn;
      t->rid = h.request_id;
      t->bytes = r->data.size();
      t->set = *r;
      t->frame = std::move(payload);
      Enqueue(p->core.load(), std::move(t));
      return;
    }
    case Op::kBarrier: {
      auto r = BarrierRequest::Decode(payload);
      if (!r.ok()) return fail(r.status());
      std::shared_ptr<Job> job = FindJob(h.job);
      if (!job) return lost(NotFound("unknown job ", h.job));
      if (job->place.load() == Job::kStaged) return arriving(*job);
      if (r->worker >= job->spec.workers) {
        return fail(InvalidArgument("worker ", r->worker, " but job '", job->spec.name, "' has ",
                                    job->spec.workers, " workers"));
      }
      std::vector<BarrierWaiter> release;
      {
        std::lock_guard<std::mutex> l(job->bmu);
        // Under bmu: a move that commits answers the waiters it finds under bmu after setting
        // kMoved, so a waiter added here after that would never be answered.
        if (job->place.load() == Job::kMoved) {
          return conn->SendMoved(op, h.job, h.request_id, job->peer);
        }
        auto& b = job->barriers[r->iteration];
        if (b.seen.empty()) b.seen.assign(job->spec.workers, 0);
        if (b.seen[r->worker]) {
          return fail(
              InvalidArgument("worker ", r->worker, " is already in barrier ", r->iteration));
        }
        b.seen[r->worker] = 1;
        b.waiters.push_back({conn, h.request_id, MonotonicNs() + r->timeout_ms * 1000000ull});
        if (++b.count == job->spec.workers) {
          release = std::move(b.waiters);
          job->barriers.erase(r->iteration);
        }
      }
      for (auto& w : release) w.conn->Send(op, h.job, w.rid);
      return;
    }
    case Op::kStatus: {
      const std::string s = StatusJson();
      conn->Send(op, 0, h.request_id, {reinterpret_cast<const uint8_t*>(s.data()), s.size()});
      return;
    }
    case Op::kRelease: {
      std::shared_ptr<Job> job = FindJob(h.job);
      if (!job) return lost(NotFound("unknown job ", h.job));
      if (job->place.load() == Job::kStaged) return arriving(*job);
      {
        // A job that is moving departs from where the move leaves it.
        std::lock_guard<std::mutex> pl(job->pmu);
        if (ParkOrAnswer(*job, conn, h, &payload, /*handoff_only=*/false)) return;
        std::lock_guard<std::mutex> l(jobs_mu);
        auto it = jobs.find(h.job);
        if (it == jobs.end() || it->second != job) return fail(NotFound("unknown job ", h.job));
        job_by_name.erase(job->spec.name);
        jobs.erase(it);
        job->released = true;
      }
      for (auto& p : job->parts) {
        std::lock_guard<std::mutex> l(p->mu);
        for (auto& w : p->waiters) {
          w.conn->SendError(static_cast<uint8_t>(Op::kPull), job->id, w.rid,
                            NotFound("job ", job->id, " was released"));
        }
        p->waiters.clear();
      }
      if (opt.checkpoint) opt.checkpoint->DropJob(job->id);
      TLOG(INFO) << "paramsvc: job " << job->id << " ('" << job->spec.name << "') released";
      conn->Send(op, h.job, h.request_id);
      return;
    }
    case Op::kMigrate: {
      auto r = MigrateRequest::Decode(payload);
      if (!r.ok()) return fail(r.status());
      if (r->core >= cores.size()) {
        return fail(OutOfRange("core ", r->core, " (the service has ", cores.size(), ")"));
      }
      auto jp = Resolve(h.job, r->partition);
      if (!jp.ok()) return lost(jp.status());
      Migrate(*jp->second, static_cast<int>(r->core));
      conn->Send(op, h.job, h.request_id);
      return;
    }
    case Op::kSetLr: {
      auto r = SetLrRequest::Decode(payload);
      if (!r.ok()) return fail(r.status());
      std::shared_ptr<Job> job = FindJob(h.job);
      if (!job) return lost(NotFound("unknown job ", h.job));
      if (job->place.load() == Job::kStaged) return arriving(*job);
      {
        // Under pmu: either every partition has the lr before a handoff snapshot, or the
        // request is parked (and sent again to where the job goes).
        std::lock_guard<std::mutex> pl(job->pmu);
        if (ParkOrAnswer(*job, conn, h, &payload, /*handoff_only=*/true)) return;
        for (auto& p : job->parts) {
          std::lock_guard<std::mutex> l(p->mu);
          p->lr = r->lr;
        }
      }
      conn->Send(op, h.job, h.request_id);
      return;
    }
    case Op::kCores: {
      auto r = CoresRequest::Decode(payload);
      if (!r.ok()) return fail(r.status());
      if (r->max_cores > cores.size()) {
        return fail(OutOfRange("max_cores ", r->max_cores, " above the ", cores.size(),
                               " cores this service was started with"));
      }
      max_cores = static_cast<int>(r->max_cores);
      elastic = r->elastic != 0;
      conn->Send(op, 0, h.request_id);
      return;
    }
    case Op::kGetState: {
      if (payload.size() != 4) return fail(ProtocolError("GET_STATE is ", payload.size(), " bytes, expected 4"));
      auto jp = Resolve(h.job, DecodeFixed32(payload.data()));
      if (!jp.ok()) return lost(jp.status());
      auto& [job, p] = *jp;
      if (job->place.load() == Job::kStaged) return arriving(*job);
      std::vector<uint8_t> out;
      {
        std::lock_guard<std::mutex> l(p->mu);
        if (job->place.load() == Job::kMoved) return conn->SendMoved(op, h.job, h.request_id, job->peer);
        out = EncodePartitionState(p->st);
      }
      conn->Send(op, h.job, h.request_id, out);
      return;
    }
    case Op::kPutState: {
      if (payload.size() < 4) return fail(ProtocolError("PUT_STATE is ", payload.size(), " bytes"));
      auto jp = Resolve(h.job, DecodeFixed32(payload.data()));
      if (!jp.ok()) return lost(jp.status());
      auto& [job, p] = *jp;
      if (job->place.load() == Job::kStaged) return arriving(*job);
      auto st = DecodePartitionState({payload.data() + 4, payload.size() - 4}, p->info.count);
      if (!st.ok()) return fail(InvalidArgument("PUT_STATE of partition ", p->index, ": ", st.status().message()));
      const OptimizerSpec& o = job->spec.optimizer;
      const bool mom_ok = o.kind == OptimizerKind::kAdam ||
                          (o.kind == OptimizerKind::kSgd && o.momentum > 0);
      if ((!st->mom.empty() && !mom_ok) || (!st->mom2.empty() && o.kind != OptimizerKind::kAdam)) {
        return fail(InvalidArgument("PUT_STATE: job '", job->spec.name,
                                    "' keeps no such optimizer state (its optimizer is ",
                                    o.kind == OptimizerKind::kAdam ? "adam"
                                    : o.kind == OptimizerKind::kSgd ? "sgd" : "average",
                                    ", momentum ", o.momentum, ")"));
      }
      {
        std::lock_guard<std::mutex> pl(job->pmu);
        if (ParkOrAnswer(*job, conn, h, &payload, /*handoff_only=*/false)) return;
        std::lock_guard<std::mutex> l(p->mu);
        if (p->round_pushes != 0 || p->late_pushes != 0) {
          return fail(Unavailable("PUT_STATE: partition ", p->index, " of job '", job->spec.name,
                                  "' has a round open (", p->round_pushes,
                                  " pushes); restore at an iteration boundary"));
        }
        p->st = std::move(*st);
        for (auto& sn : p->snap) sn.reset();
        p->dirty = true;
        ServeWaiters(*p);
      }
      NotifyCheckpoint();
      conn->Send(op, h.job, h.request_id);
      return;
    }
    case Op::kMoveJob: {
      if (!need_admin()) return;
      auto r = MoveJobRequest::Decode(payload);
      if (!r.ok()) return fail(r.status());
      auto rep = MoveOut(*r);
      if (!rep.ok()) return fail(rep.status());
      conn->Send(op, 0, h.request_id, {reinterpret_cast<const uint8_t*>(rep->data()), rep->size()});
      return;
    }
    case Op::kImportBegin: {
      if (!need_admin()) return;
      auto rep = ImportBeginOp(payload);
      if (!rep.ok()) return fail(rep.status());
      conn->Send(op, 0, h.request_id, *rep);
      return;
    }
    case Op::kImportPart: {
      if (!need_admin()) return;
      Status s = ImportPartOp(h.job, payload);
      if (!s.ok()) return fail(s);
      conn->Send(op, h.job, h.request_id);
      return;
    }
    case Op::kImportPrepare: {
      if (!need_admin()) return;
      auto durable = ImportPrepareOp(h.job, payload);
      if (!durable.ok()) return fail(durable.status());
      const uint8_t d = *durable ? 1 : 0;
      conn->Send(op, h.job, h.request_id, {&d, 1});
      return;
    }
    case Op::kImportCommit:
    case Op::kImportAbort:
    case Op::kMoveStatus: {
      if (!need_admin()) return;
      auto ref = MoveRef::Decode(payload);
      if (!ref.ok()) return fail(ref.status());
      if (static_cast<Op>(op) == Op::kImportCommit) {
        Status s = ImportCommitOp(*ref);
        if (!s.ok()) return fail(s);
        conn->Send(op, 0, h.request_id);
      } else if (static_cast<Op>(op) == Op::kImportAbort) {
        ImportAbortOp(*ref);
        conn->Send(op, 0, h.request_id);
      } else {
        const uint8_t st = static_cast<uint8_t>(MoveStatusOp(*ref));
        conn->Send(op, 0, h.request_id, {&st, 1});
      }
      return;
    }
    case Op::kDrain: {
      if (!need_admin()) return;
      auto r = DrainRequest::Decode(payload);
      if (!r.ok()) return fail(r.status());
      {
        std::lock_guard<std::mutex> l(jobs_mu);
        draining = r->on;
        drain_to = r->on ? r->redirect : std::string();
      }
      if (opt.checkpoint) opt.checkpoint->SaveDrain(r->on, r->on ? r->redirect : std::string());
      TLOG(WARNING) << "paramsvc: " << (r->on ? "draining" : "no longer draining")
                    << (r->on && !r->redirect.empty() ? ": new jobs go to " + r->redirect : "");
      conn->Send(op, 0, h.request_id);
      return;
    }
  }
  fail(ProtocolError("unknown op ", int{op}));
}

Result<JobLayout> Server::Impl::Register(JobSpec spec, std::string* moved_to,
                                         std::shared_ptr<Job>* staged) {
  std::lock_guard<std::mutex> l(jobs_mu);
  auto it = job_by_name.find(spec.name);
  if (it != job_by_name.end()) {
    const auto& job = jobs.at(it->second);
    if (job->place.load() == Job::kStaged) {
      *staged = job;
      return Unavailable("job '", spec.name, "' is arriving");
    }
    if (!job->spec.SameModel(spec)) {
      return AlreadyExists("job '", spec.name,
                           "' exists with a different model, worker count, mode or optimizer");
    }
    JobLayout lay;
    lay.job = job->id;
    for (const auto& p : job->parts) lay.partitions.push_back(p->info);
    return lay;
  }
  // A job that moved away, or a new job while draining: its clients go elsewhere.
  if (auto mv = moved_by_name.find(spec.name); mv != moved_by_name.end()) {
    *moved_to = moved.at(mv->second).to;
    return NotFound("job '", spec.name, "' moved to ", *moved_to);
  }
  if (draining) {
    if (!drain_to.empty()) {
      *moved_to = drain_to;
      return NotFound("this server is draining: new jobs go to ", drain_to);
    }
    return Unavailable("this server is draining: it takes no new job ('", spec.name, "')");
  }
  const uint32_t id = next_job++;
  auto job = MakeJob(id, std::move(spec), {});
  if (!job.ok()) return job.status();
  JobLayout lay;
  lay.job = id;
  for (const auto& p : (*job)->parts) lay.partitions.push_back(p->info);
  jobs[id] = *job;
  job_by_name[(*job)->spec.name] = id;
  if (opt.checkpoint) opt.checkpoint->SaveJob(id, (*job)->spec);
  TLOG(INFO) << "paramsvc: job " << id << " ('" << (*job)->spec.name
             << "') registered: " << (*job)->spec.workers << " workers, "
             << ModeName((*job)->spec.mode) << ", " << lay.partitions.size() << " partitions";
  return lay;
}

// jobs_mu held.
Result<std::shared_ptr<Server::Impl::Job>> Server::Impl::MakeJob(
    uint32_t id, JobSpec spec, std::vector<PartitionState> states) {
  auto job = std::make_shared<Job>();
  job->id = id;
  job->spec = std::move(spec);
  const auto infos = PartitionModel(job->spec);
  if (!states.empty() && states.size() != infos.size()) {
    return InvalidArgument("restore of job ", id, ": ", states.size(), " partition states for ",
                           infos.size(), " partitions");
  }
  // Place new partitions: a static server round-robins over all its cores; an elastic one
  // starts them on the active core with the fewest partitions (the rebalancer repacks).
  std::vector<int> count(cores.size(), 0);
  for (const auto& [_, j] : jobs) {
    for (const auto& p : j->parts) count[p->core.load()]++;
  }
  const int act = std::max(1, active.load());
  for (uint32_t i = 0; i < infos.size(); ++i) {
    auto p = std::make_unique<Partition>();
    p->job = job.get();
    p->index = i;
    p->info = infos[i];
    p->dtype = job->spec.tensors[infos[i].tensor].dtype;
    p->lr = job->spec.optimizer.lr;
    if (!states.empty()) {
      if (states[i].param.size() != infos[i].count) {
        return InvalidArgument("restore of job ", id, ": partition ", i, " has ",
                               states[i].param.size(), " elements, expected ", infos[i].count);
      }
      p->st = std::move(states[i]);
    } else {
      p->st.param.assign(infos[i].count, 0.0f);
    }
    p->acc.assign(infos[i].count, 0.0f);
    p->pushed.assign(job->spec.workers, 0);
    int core;
    if (!elastic.load()) {
      core = static_cast<int>(rr++ % static_cast<uint64_t>(max_cores.load()));
    } else {
      core = static_cast<int>(std::min_element(count.begin(), count.begin() + act) - count.begin());
    }
    count[core]++;
    p->core = core;
    job->parts.push_back(std::move(p));
  }
  return job;
}

}  // namespace tessera::paramsvc
