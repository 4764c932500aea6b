// Moves of jobs between Parameter Service servers (server.h "Moves between servers"): the
// source's side (MOVE_JOB: freeze, handoff snapshot, prepare, commit point, tombstone), the
// destination's (IMPORT_*: a staged copy that becomes the job only on commit) and the move
// thread that finishes what a crash interrupted (IMPORT_COMMIT sent again; a staged copy asks
// its source what it decided).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "apps/paramsvc/client/client.h"
#include "apps/paramsvc/server/server_impl.h"
#include "common/clock.h"
#include "common/logging.h"
#include "fabric/auth.h"
#include "fabric/transport.h"

namespace tessera::paramsvc {
namespace {

// A connection to another server of the cluster, with this server's cluster secret (an admin
// credential: IMPORT_* and MOVE_STATUS need one).
Result<std::unique_ptr<Client>> Dial(const std::string& endpoint, const std::string& secret,
                                     int connect_ms, int op_ms) {
  auto ep = fabric::ParseEndpoint(endpoint);
  if (!ep.ok()) return ep.status();
  ClientOptions o;
  o.host = ep->host;
  o.port = ep->port;
  o.secret = secret;
  o.connect_timeout_ms = connect_ms;
  o.op_timeout_ms = op_ms;
  return Client::Connect(o);
}

}  // namespace

using namespace server_internal;  // NOLINT(build/namespaces): this file builds them

bool Server::Impl::AnswerMoved(const std::shared_ptr<Conn>& conn, const Header& h) {
  std::string to;
  {
    std::lock_guard<std::mutex> l(jobs_mu);
    auto it = moved.find(h.job);
    if (it == moved.end()) return false;
    to = it->second.to;
  }
  conn->SendMoved(h.op, h.job, h.request_id, to);
  return true;
}

bool Server::Impl::ParkOrAnswer(Job& job, const std::shared_ptr<Conn>& conn, const Header& h,
                                std::vector<uint8_t>* payload, bool handoff_only) {
  std::lock_guard<std::mutex> l(job.parked_mu);
  const uint8_t pl = job.place.load();
  if (pl == Job::kMoved) {
    conn->SendMoved(h.op, h.job, h.request_id, job.peer);
    return true;
  }
  if (pl == Job::kHandoff || (pl == Job::kFreezing && !handoff_only)) {
    job.parked.push_back({conn, h, std::move(*payload)});
    return true;
  }
  return false;
}

void Server::Impl::PhaseHold(uint64_t move_id, const std::string& job, const char* phase) {
  if (opt.move_hold_file.empty()) return;
  std::printf("move %llu of job '%s': %s\n", static_cast<unsigned long long>(move_id),
              job.c_str(), phase);
  std::fflush(stdout);
  // Fault injection (ServerOptions::move_hold_file): held while the file names this phase.
  while (!stop.load()) {
    std::ifstream f(opt.move_hold_file);
    std::string line;
    if (!std::getline(f, line) || line != phase) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // Polling the file.
  }
}

void Server::Impl::Unfreeze(Job& job) {
  std::vector<Parked> parked;
  {
    std::lock_guard<std::mutex> pl(job.pmu);
    std::lock_guard<std::mutex> l(job.parked_mu);
    if (job.place.load() == Job::kMoved) return;
    job.place = Job::kActive;
    job.move_id = 0;
    job.peer.clear();
    parked.swap(job.parked);
  }
  // As if they had just arrived, in the order they came. A request whose client hung up
  // meanwhile is not applied: that client gave it up (it resynchronises when it reconnects).
  for (auto& x : parked) {
    if (x.conn->dead.load()) continue;
    Handle(x.conn, x.h, std::move(x.payload));
  }
}

void Server::Impl::CommitOut(const std::shared_ptr<Job>& job, const MovedRecord& rec) {
  std::vector<Parked> parked;
  {
    std::lock_guard<std::mutex> pl(job->pmu);
    {
      std::lock_guard<std::mutex> l(jobs_mu);
      jobs.erase(job->id);
      job_by_name.erase(rec.name);
      moved[job->id] = rec;
      moved_by_name[rec.name] = job->id;
      unacked[job->id] = true;
    }
    std::lock_guard<std::mutex> l(job->parked_mu);
    job->place = Job::kMoved;
    parked.swap(job->parked);
  }
  // None of these was applied here: the client sends each again to the destination.
  for (auto& x : parked) x.conn->SendMoved(x.h.op, x.h.job, x.h.request_id, rec.to);
  for (auto& p : job->parts) {
    std::lock_guard<std::mutex> l(p->mu);
    for (auto& w : p->waiters) {
      w.conn->SendMoved(static_cast<uint8_t>(Op::kPull), job->id, w.rid, rec.to);
    }
    p->waiters.clear();
  }
  std::lock_guard<std::mutex> l(job->bmu);
  for (auto& [_, b] : job->barriers) {
    for (auto& w : b.waiters) {
      w.conn->SendMoved(static_cast<uint8_t>(Op::kBarrier), job->id, w.rid, rec.to);
    }
  }
  job->barriers.clear();
}

Result<std::string> Server::Impl::MoveOut(const MoveJobRequest& req) {
  if (advertise.empty()) {
    return InvalidArgument("this server does not know the address other servers reach it at "
                           "(it listens on 0.0.0.0): start it with --advertise HOST:PORT to "
                           "move jobs away");
  }
  if (req.to == advertise) return InvalidArgument("job '", req.job, "' is already on ", advertise);
  std::shared_ptr<Job> job;
  uint64_t move_id = 0;
  {
    std::lock_guard<std::mutex> l(jobs_mu);
    auto it = job_by_name.find(req.job);
    if (it == job_by_name.end()) {
      if (auto mv = moved_by_name.find(req.job); mv != moved_by_name.end()) {
        return NotFound("job '", req.job, "' is not on ", advertise, ": it moved to ",
                        moved.at(mv->second).to);
      }
      return NotFound("no job '", req.job, "' on ", advertise);
    }
    job = jobs.at(it->second);
    if (job->place.load() == Job::kStaged) {
      return Unavailable("job '", req.job, "' is still arriving here from ", job->peer);
    }
    while (move_id == 0 || outgoing.count(move_id)) {
      uint8_t r[8];
      if (!fabric::RandomBytes(r).ok()) return Internal("no randomness");
      move_id = DecodeFixed64(r) >> 1;  // Printable as a signed 64-bit number too.
    }
    outgoing[move_id] = req.job;
  }
  struct Forget {
    Impl* m;
    uint64_t id;
    ~Forget() {
      std::lock_guard<std::mutex> l(m->jobs_mu);
      m->outgoing.erase(id);
    }
  } forget{this, move_id};
  const std::string& name = req.job;
  auto say = [&](const Status& s) {
    TLOG(WARNING) << "paramsvc: move " << move_id << " of job '" << name << "' to " << req.to
                  << " aborted, the job stays here: " << s;
    return s;
  };

  // The destination first: a refusal or an unreachable destination leaves the job untouched.
  auto dest = Dial(req.to, opt.secret, 5000, 60000);
  if (!dest.ok()) return say(dest.status().WithContext("destination " + req.to));
  Client& d = **dest;
  auto begun = d.Call(Op::kImportBegin, 0, ImportBegin{move_id, advertise, job->spec}.Encode());
  if (!begun.ok()) return say(begun.status().WithContext("destination " + req.to));
  if (begun->size() != 4) return say(ProtocolError("IMPORT_BEGIN reply of ", begun->size(), " bytes"));
  const uint32_t dest_job = DecodeFixed32(begun->data());
  auto abort = [&](Status why) -> Status {
    Unfreeze(*job);
    // Best effort: a staged copy the destination does not hear about asks (MOVE_STATUS) and
    // hears "unknown", since this move is no longer under way here.
    (void)d.Call(Op::kImportAbort, 0, MoveRef{move_id, name}.Encode());
    return say(why);
  };

  // Freeze, then wait for an iteration boundary of every partition.
  {
    Status busy;
    {
      std::lock_guard<std::mutex> pl(job->pmu);
      if (job->place.load() != Job::kActive) {
        busy = AlreadyExists("job '", name, "' is moving already (move ", job->move_id, " to ",
                             job->peer, ")");
      } else {
        job->move_id = move_id;
        job->peer = req.to;
        job->place = Job::kFreezing;
      }
    }
    if (!busy.ok()) {
      (void)d.Call(Op::kImportAbort, 0, MoveRef{move_id, name}.Encode());
      return busy;
    }
  }
  const uint64_t t_freeze = MonotonicNs();
  const Deadline deadline = Deadline::AfterMs(req.boundary_timeout_ms);
  std::vector<PartitionState> states(job->parts.size());
  std::vector<JobCounters> counters(job->parts.size());
  float lr = 0;
  std::string open;
  {
    std::unique_lock<std::mutex> pl(job->pmu);
    while (true) {
      std::vector<std::unique_lock<std::mutex>> locks;
      locks.reserve(job->parts.size());
      for (auto& p : job->parts) locks.emplace_back(p->mu);
      open.clear();
      for (auto& p : job->parts) {
        if (p->round_pushes != 0 || p->late_pushes != 0) {
          open = "partition " + std::to_string(p->index) + " has a round open with " +
                 std::to_string(p->round_pushes + p->late_pushes) + " of " +
                 std::to_string(job->spec.workers) + " pushes at version " +
                 std::to_string(p->st.version);
          break;
        }
      }
      if (open.empty()) {
        // The handoff snapshot: every partition at a boundary, under all their locks.
        job->place = Job::kHandoff;
        for (size_t i = 0; i < job->parts.size(); ++i) {
          states[i] = job->parts[i]->st;
          counters[i] = job->parts[i]->c;
        }
        lr = job->parts[0]->lr;
        break;
      }
      locks.clear();
      if (deadline.Expired() || stop.load()) break;
      job->move_cv.wait_for(pl, std::chrono::milliseconds(5));
    }
  }
  if (!open.empty()) {
    return abort(Timeout("job '", name, "' did not reach an iteration boundary within ",
                         req.boundary_timeout_ms, " ms (", open,
                         "; are all its workers running?)"));
  }
  const uint64_t t_handoff = MonotonicNs();
  PhaseHold(move_id, name, "frozen");

  // Prepare: the snapshot to the destination, which persists it before answering.
  uint64_t bytes = 0, vmin = UINT64_MAX, vmax = 0;
  for (uint32_t i = 0; i < states.size(); ++i) {
    const auto st = EncodePartitionState(states[i]);
    const auto ct = EncodeCounters(counters[i]);
    std::vector<uint8_t> msg = ImportPart::EncodeFixed(move_id, i, static_cast<uint32_t>(st.size()));
    msg.insert(msg.end(), st.begin(), st.end());
    msg.insert(msg.end(), ct.begin(), ct.end());
    bytes += st.size();
    vmin = std::min(vmin, states[i].version);
    vmax = std::max(vmax, states[i].version);
    auto r = d.Call(Op::kImportPart, dest_job, msg);
    if (!r.ok()) return abort(r.status().WithContext("sending partition " + std::to_string(i) + " to " + req.to));
  }
  uint8_t prep[ImportPrepare::kWireSize];
  ImportPrepare{move_id, lr, job->moves.load() + 1}.EncodeTo(prep);
  auto prepared = d.Call(Op::kImportPrepare, dest_job, prep);
  if (!prepared.ok()) return abort(prepared.status().WithContext("destination " + req.to + " did not prepare"));
  if (prepared->size() != 1) return abort(ProtocolError("IMPORT_PREPARE reply of ", prepared->size(), " bytes"));
  const bool durable = (*prepared)[0] == 1;
  if (!durable && opt.checkpoint != nullptr && !req.allow_volatile) {
    return abort(InvalidArgument("destination ", req.to, " does not checkpoint (no --store, or "
                                 "its store failed to write the job): the job would lose its "
                                 "crash safety there; allow it with --allow-no-checkpoints"));
  }
  PhaseHold(move_id, name, "prepared");

  // The commit point: the record with this server's supervisor.
  const MovedRecord rec{job->id, name, req.to, move_id};
  if (opt.checkpoint) {
    opt.checkpoint->SaveMoved(rec);
    auto synced = opt.checkpoint->Sync(0);
    if (!synced.ok()) return abort(synced.status().WithContext("recording the commit"));
  }
  job->moves++;
  CommitOut(job, rec);
  const uint64_t t_commit = MonotonicNs();
  TLOG(INFO) << "paramsvc: job '" << name << "' moved to " << req.to << " (move " << move_id
             << ", versions " << vmin << ".." << vmax << ")";
  PhaseHold(move_id, name, "committed");
  auto committed = d.Call(Op::kImportCommit, 0, MoveRef{move_id, name}.Encode());
  if (committed.ok()) {
    std::lock_guard<std::mutex> l(jobs_mu);
    unacked.erase(job->id);
  } else {
    TLOG(WARNING) << "paramsvc: job '" << name << "' moved to " << req.to
                  << ", which did not acknowledge it yet (sent again until it does): "
                  << committed.status();
    mover_cv.notify_all();
  }
  uint64_t parked = 0;
  for (const auto& c : counters) parked += c.parked;
  nlohmann::json j = {{"job", name},
                      {"from", advertise},
                      {"to", req.to},
                      {"move_id", move_id},
                      {"source_job", job->id},
                      {"dest_job", dest_job},
                      {"partitions", states.size()},
                      {"state_bytes", bytes},
                      {"version_min", vmin},
                      {"version_max", vmax},
                      {"boundary_ms", static_cast<double>(t_handoff - t_freeze) / 1e6},
                      {"frozen_ms", static_cast<double>(t_commit - t_freeze) / 1e6},
                      {"durable", durable},
                      {"acknowledged", committed.ok()}};
  return j.dump();
}

Result<std::vector<uint8_t>> Server::Impl::ImportBeginOp(const std::vector<uint8_t>& payload) {
  auto m = ImportBegin::Decode(payload);
  if (!m.ok()) return m.status();
  std::lock_guard<std::mutex> l(jobs_mu);
  if (draining) return Unavailable("this server is draining: it takes no job");
  if (auto it = job_by_name.find(m->spec.name); it != job_by_name.end()) {
    const auto& j = jobs.at(it->second);
    if (j->place.load() == Job::kStaged && j->move_id == m->move_id) {  // Sent again
      std::vector<uint8_t> out(4);
      EncodeFixed32(out.data(), j->id);
      return out;
    }
    return AlreadyExists("this server already has a job '", m->spec.name, "'",
                         j->place.load() == Job::kStaged ? " (arriving by another move)" : "");
  }
  const uint32_t id = next_job++;
  auto job = MakeJob(id, m->spec, {});
  if (!job.ok()) return job.status();
  (*job)->place = Job::kStaged;
  (*job)->move_id = m->move_id;
  (*job)->peer = m->source;
  (*job)->staged_touch_ns = MonotonicNs();
  jobs[id] = *job;
  job_by_name[m->spec.name] = id;
  TLOG(INFO) << "paramsvc: job '" << m->spec.name << "' arriving from " << m->source << " (move "
             << m->move_id << ") as job " << id;
  std::vector<uint8_t> out(4);
  EncodeFixed32(out.data(), id);
  return out;
}

Status Server::Impl::ImportPartOp(uint32_t job_id, const std::vector<uint8_t>& payload) {
  auto m = ImportPart::Decode(payload);
  if (!m.ok()) return m.status();
  std::shared_ptr<Job> job = FindJob(job_id);
  if (!job || job->place.load() != Job::kStaged || job->move_id != m->move_id || job->prepared) {
    return NotFound("no staged copy of move ", m->move_id, " as job ", job_id);
  }
  if (m->partition >= job->parts.size()) {
    return OutOfRange("IMPORT_PART: partition ", m->partition, " of ", job->parts.size());
  }
  Partition& p = *job->parts[m->partition];
  auto st = DecodePartitionState(m->state, p.info.count);
  if (!st.ok()) return st.status();
  JobCounters c;
  if (Status s = DecodeCounters(m->counters, &c); !s.ok()) return s;
  c.pending = 0;
  {
    std::lock_guard<std::mutex> l(p.mu);
    p.st = std::move(*st);
    p.c = std::move(c);
    for (auto& sn : p.snap) sn.reset();
    p.dirty = false;
  }
  job->staged_touch_ns = MonotonicNs();
  return Status::Ok();
}

Result<bool> Server::Impl::ImportPrepareOp(uint32_t job_id, const std::vector<uint8_t>& payload) {
  auto m = ImportPrepare::Decode(payload);
  if (!m.ok()) return m.status();
  std::shared_ptr<Job> job = FindJob(job_id);
  if (!job || job->place.load() != Job::kStaged || job->move_id != m->move_id) {
    return NotFound("no staged copy of move ", m->move_id, " as job ", job_id);
  }
  for (auto& p : job->parts) {
    std::lock_guard<std::mutex> l(p->mu);
    p->lr = m->lr;
  }
  job->moves = m->moves;
  bool durable = false;
  if (opt.checkpoint) {
    // Marked staged in the same record: a restart restores it staged, never as the job.
    opt.checkpoint->SaveStagedJob(job->id, job->spec, job->move_id, job->peer);
    for (auto& p : job->parts) {
      PartitionState copy;
      {
        std::lock_guard<std::mutex> l(p->mu);
        copy = p->st;
        p->dirty = false;
      }
      opt.checkpoint->SavePartition(job->id, p->index, copy);
    }
    auto synced = opt.checkpoint->Sync(job->id);
    if (!synced.ok()) return synced.status().WithContext("persisting the staged copy");
    durable = *synced;
  }
  job->prepared = true;
  job->staged_touch_ns = MonotonicNs();
  PhaseHold(job->move_id, job->spec.name, "staged");
  return durable;
}

void Server::Impl::ActivateStaged(const std::shared_ptr<Job>& job) {
  if (opt.checkpoint) opt.checkpoint->ActivateJob(job->id);
  // The job was here before, under other ids: a client may still name one of them (it did
  // not hear of the moves in between). Those ids now lead here, where it joins the job again
  // by name.
  moved_by_name.erase(job->spec.name);
  for (auto& [id, r] : moved) {
    if (r.name != job->spec.name || r.to == advertise) continue;
    r.to = advertise;
    unacked.erase(id);
    if (opt.checkpoint) opt.checkpoint->SaveMoved(r);
  }
  job->place = Job::kActive;
  TLOG(INFO) << "paramsvc: job '" << job->spec.name << "' (job " << job->id
             << ") arrived from " << job->peer << " (move " << job->move_id << ")";
}

void Server::Impl::DropStaged(const std::shared_ptr<Job>& job) {
  jobs.erase(job->id);
  job_by_name.erase(job->spec.name);
  job->released = true;
  if (job->prepared && opt.checkpoint) opt.checkpoint->DropJob(job->id);
  TLOG(INFO) << "paramsvc: the staged copy of job '" << job->spec.name << "' (move "
             << job->move_id << " from " << job->peer << ") dropped: the move did not commit";
}

Status Server::Impl::ImportCommitOp(const MoveRef& ref) {
  std::lock_guard<std::mutex> l(jobs_mu);
  auto it = job_by_name.find(ref.job);
  if (it == job_by_name.end()) return NotFound("no job '", ref.job, "' here (move ", ref.move_id, ")");
  const auto job = jobs.at(it->second);
  if (job->place.load() != Job::kStaged) return Status::Ok();  // Activated before
  if (job->move_id != ref.move_id) {
    return NotFound("job '", ref.job, "' is arriving by move ", job->move_id, ", not ", ref.move_id);
  }
  if (!job->prepared) return Unavailable("job '", ref.job, "' is not prepared yet");
  ActivateStaged(job);
  return Status::Ok();
}

void Server::Impl::ImportAbortOp(const MoveRef& ref) {
  std::lock_guard<std::mutex> l(jobs_mu);
  auto it = job_by_name.find(ref.job);
  if (it == job_by_name.end()) return;
  const auto job = jobs.at(it->second);
  if (job->place.load() == Job::kStaged && job->move_id == ref.move_id) DropStaged(job);
}

MoveState Server::Impl::MoveStatusOp(const MoveRef& ref) {
  std::lock_guard<std::mutex> l(jobs_mu);
  if (auto mv = moved_by_name.find(ref.job); mv != moved_by_name.end()) {
    if (moved.at(mv->second).move_id == ref.move_id) return MoveState::kCommitted;
  }
  if (outgoing.count(ref.move_id)) return MoveState::kPending;
  return MoveState::kUnknown;
}

void Server::Impl::MoverLoop() {
  uint64_t last_warning = 0;
  while (true) {
    {
      std::unique_lock<std::mutex> l(mover_mu);
      mover_cv.wait_for(l, std::chrono::milliseconds(250), [&] { return stop.load(); });
      if (stop.load()) return;
    }
    const uint64_t now = MonotonicNs();
    const bool warn = now - last_warning > 10'000'000'000ull;
    // Commits the destination has not acknowledged (a lost reply, a destination that was
    // down, or this server restarted after its commit point).
    std::vector<MovedRecord> todo;
    {
      std::lock_guard<std::mutex> l(jobs_mu);
      for (const auto& [id, _] : unacked) todo.push_back(moved.at(id));
    }
    for (const auto& r : todo) {
      if (stop.load()) return;
      auto d = Dial(r.to, opt.secret, 1000, 5000);
      Status s = d.ok() ? (*d)->Call(Op::kImportCommit, 0, MoveRef{r.move_id, r.name}.Encode()).status()
                        : d.status();
      if (s.ok() || s.code() == StatusCode::kNotFound) {
        if (!s.ok()) {
          TLOG(ERROR) << "paramsvc: " << r.to << " does not know job '" << r.name
                      << "' of move " << r.move_id << ": " << s;
        }
        std::lock_guard<std::mutex> l(jobs_mu);
        auto it = moved.find(r.job);
        if (it != moved.end() && it->second.move_id == r.move_id) unacked.erase(r.job);
      } else if (warn) {
        last_warning = now;
        TLOG(WARNING) << "paramsvc: job '" << r.name << "' moved to " << r.to
                      << ", not acknowledged yet: " << s;
      }
    }
    // Staged copies that have not heard from their source: ask it what it decided.
    for (auto& job : AllJobs()) {
      if (stop.load()) return;
      if (job->place.load() != Job::kStaged) continue;
      if (MonotonicNs() - job->staged_touch_ns.load() < opt.staged_check_ms * 1000000ull) continue;
      auto d = Dial(job->peer, opt.secret, 1000, 5000);
      Result<std::vector<uint8_t>> rep =
          d.ok() ? (*d)->Call(Op::kMoveStatus, 0, MoveRef{job->move_id, job->spec.name}.Encode())
                 : Result<std::vector<uint8_t>>(d.status());
      job->staged_touch_ns = MonotonicNs();
      if (!rep.ok() || rep->size() != 1) {
        if (warn) {
          last_warning = now;
          TLOG(WARNING) << "paramsvc: job '" << job->spec.name << "' is arriving from "
                        << job->peer << ", which does not answer: "
                        << (rep.ok() ? "a bad reply" : rep.status().ToString());
        }
        continue;
      }
      const auto state = static_cast<MoveState>((*rep)[0]);
      std::lock_guard<std::mutex> l(jobs_mu);
      auto it = jobs.find(job->id);
      if (it == jobs.end() || it->second != job || job->place.load() != Job::kStaged) continue;
      if (state == MoveState::kCommitted && job->prepared) {
        ActivateStaged(job);
      } else if (state == MoveState::kUnknown) {
        DropStaged(job);
      }
    }
  }
}

}  // namespace tessera::paramsvc
