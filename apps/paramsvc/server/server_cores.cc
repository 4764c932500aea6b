// The aggregation cores of the Parameter Service server: each runs its partitions' tasks
// (pushes, pulls, initial values) to completion, applies the optimizer when a round closes,
// and hands a partition to another core at an iteration boundary.
#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>

#include "apps/paramsvc/server/server_impl.h"
#include "common/clock.h"

namespace tessera::paramsvc {
namespace {

uint64_t ThreadCpuNs() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

}  // namespace

std::shared_ptr<Server::Impl::Job> Server::Impl::FindJob(uint32_t id) {
  std::lock_guard<std::mutex> l(jobs_mu);
  auto it = jobs.find(id);
  return it == jobs.end() ? nullptr : it->second;
}

void Server::Impl::Enqueue(int core, std::unique_ptr<Task> t) {
  Core& c = *cores[core];
  {
    std::lock_guard<std::mutex> l(c.mu);
    const uint64_t key = t->bytes;
    c.q.emplace(std::make_pair(key, c.seq++), std::move(t));
  }
  c.cv.notify_one();
}

void Server::Impl::NotifyCheckpoint() {
  if (opt.checkpoint == nullptr) return;
  {
    std::lock_guard<std::mutex> l(ckpt_mu);
    ckpt_pending = true;
  }
  ckpt_cv.notify_one();
}

void Server::Impl::RecordStaleness(Partition& p, uint64_t s, uint32_t bound_buckets) {
  p.c.staleness_max = std::max(p.c.staleness_max, s);
  p.c.staleness_sum += s;
  const uint64_t b = std::min<uint64_t>(s, bound_buckets - 1);
  if (p.c.staleness_hist.size() < bound_buckets) p.c.staleness_hist.resize(bound_buckets, 0);
  p.c.staleness_hist[b]++;
}

// Applies acc * scale with the job's optimizer; version + 1. p.mu held.
void Server::Impl::ApplyUpdate(Partition& p, float scale) {
  const OptimizerSpec& o = p.job->spec.optimizer;
  const size_t n = p.info.count;
  p.st.steps++;
  if (o.kind == OptimizerKind::kSgd) {
    if (o.momentum > 0 && p.st.mom.size() != n) p.st.mom.assign(n, 0.0f);
    SgdMomentumStep(p.st.param.data(), o.momentum > 0 ? p.st.mom.data() : nullptr, p.acc.data(), n,
                    scale, p.lr, o.momentum, o.weight_decay);
  } else if (o.kind == OptimizerKind::kAverage) {
    for (size_t i = 0; i < n; ++i) p.st.param[i] = p.acc[i] * scale;
  } else {
    if (p.st.mom.size() != n) p.st.mom.assign(n, 0.0f);
    if (p.st.mom2.size() != n) p.st.mom2.assign(n, 0.0f);
    AdamStep(p.st.param.data(), p.st.mom.data(), p.st.mom2.data(), p.acc.data(), n, scale, p.lr,
             o.beta1, o.beta2, o.eps, p.st.steps);
  }
  std::fill(p.acc.begin(), p.acc.end(), 0.0f);
  p.st.version++;
  p.c.updates++;
  p.dirty = true;
  // An iteration boundary: a pending migration happens now.
  const int t = p.target.exchange(-1);
  if (t >= 0 && t != p.core.load()) {
    p.core = t;
    p.c.migrations++;
  }
  ServeWaiters(p);
  NotifyCheckpoint();
  if (p.job->place.load() == Job::kFreezing) p.job->move_cv.notify_all();  // A boundary, maybe
}

// Pull replies of one version share one snapshot of the parameters (in the requested
// dtype), built on the first pull of that version.
void Server::Impl::SendPull(Partition& p, const std::shared_ptr<Conn>& conn, uint64_t rid,
                            DType dtype) {
  const int k = static_cast<int>(dtype);
  if (!p.snap[k] || p.snap_version[k] != p.st.version) {
    const size_t data = DTypeSize(dtype) * p.info.count;
    auto body = std::make_shared<std::vector<uint8_t>>(PullReply::kFixed + data);
    uint8_t* fixed = body->data();
    EncodeFixed64(fixed, p.st.version);
    EncodeFixed32(fixed + 8, p.info.count);
    fixed[12] = static_cast<uint8_t>(dtype);
    FromF32(fixed + PullReply::kFixed, p.st.param.data(), dtype, p.info.count);
    p.snap[k] = std::move(body);
    p.snap_version[k] = p.st.version;
  }
  p.bytes += p.snap[k]->size();
  conn->SendShared(static_cast<uint8_t>(Op::kPull), p.job->id, rid, p.snap[k]);
}

void Server::Impl::ServeWaiters(Partition& p) {
  auto it = p.waiters.begin();
  while (it != p.waiters.end()) {
    if (p.st.version >= it->req.min_version) {
      SendPull(p, it->conn, it->rid, it->req.dtype);
      it = p.waiters.erase(it);
    } else {
      ++it;
    }
  }
}

void Server::Impl::ProcessPush(Task& t) {
  Partition& p = *t.p;
  const JobSpec& spec = t.job->spec;
  const PushRequest& r = t.push;
  const uint8_t op = static_cast<uint8_t>(Op::kPush);
  PushReply rep;
  std::lock_guard<std::mutex> l(p.mu);
  if (const uint8_t pl = t.job->place.load(); pl != Job::kActive) {
    // Moving to another server: a push that would open a round waits for the move's outcome
    // (so the partition stays at its boundary); one that joins an open round is applied here,
    // so the round can close.
    const bool boundary = p.round_pushes == 0 && p.late_pushes == 0;
    if (pl != Job::kFreezing || boundary) {
      Header h{op, 0, static_cast<uint32_t>(t.frame.size()), t.job->id, t.rid};
      if (ParkOrAnswer(*t.job, t.conn, h, &t.frame, /*handoff_only=*/false)) {
        p.c.parked++;
        return;
      }
    }
  }
  p.bytes += r.data.size();
  const uint64_t V = p.st.version;
  if (r.version > V) {
    p.c.rejected++;
    t.conn->SendError(op, t.job->id, t.rid,
                      OutOfRange("push for version ", r.version, " of partition ", p.index,
                                 " but the partition is at version ", V, " (resynchronise)"));
    return;
  }
  const uint64_t stale = V - r.version;
  rep.staleness = static_cast<uint32_t>(std::min<uint64_t>(stale, UINT32_MAX));
  switch (spec.mode) {
    case Mode::kSync: {
      if (stale != 0) {
        p.c.rejected++;
        t.conn->SendError(op, t.job->id, t.rid,
                          OutOfRange("sync push for version ", r.version, " of partition ", p.index,
                                     " but the partition is at version ", V));
        return;
      }
      if (p.pushed[r.worker]) {
        p.c.rejected++;
        t.conn->SendError(op, t.job->id, t.rid,
                          InvalidArgument("worker ", r.worker, " already pushed version ", V,
                                          " of partition ", p.index));
        return;
      }
      p.pushed[r.worker] = 1;
      AddInto(p.acc.data(), r.data.data(), r.dtype, r.count);
      p.c.pushes++;
      p.c.pending++;
      RecordStaleness(p, 0, 65);
      if (++p.round_pushes == spec.workers) {
        p.c.pending -= p.round_pushes;
        p.c.applied += p.round_pushes;
        p.round_pushes = 0;
        std::fill(p.pushed.begin(), p.pushed.end(), 0);
        ApplyUpdate(p, 1.0f / static_cast<float>(spec.workers));
        rep.outcome = PushOutcome::kApplied;
      }
      break;
    }
    case Mode::kAsync: {
      AddInto(p.acc.data(), r.data.data(), r.dtype, r.count);
      p.c.pushes++;
      p.c.applied++;
      RecordStaleness(p, stale, 65);
      ApplyUpdate(p, 1.0f / static_cast<float>(spec.workers));
      rep.outcome = PushOutcome::kApplied;
      break;
    }
    case Mode::kBounded: {
      p.c.pushes++;
      RecordStaleness(p, stale, spec.staleness + 2);
      if (stale <= spec.staleness) {
        AddInto(p.acc.data(), r.data.data(), r.dtype, r.count);
        p.c.pending++;
        ++p.round_pushes;
      } else if (spec.late == LatePolicy::kDrop) {
        p.c.dropped++;
        rep.outcome = PushOutcome::kDropped;
      } else {
        if (p.late_acc.size() != p.info.count) p.late_acc.assign(p.info.count, 0.0f);
        AddInto(p.late_acc.data(), r.data.data(), r.dtype, r.count);
        p.c.pending++;
        p.c.late_aggregated++;
        ++p.late_pushes;
        rep.outcome = PushOutcome::kLateQueued;
      }
      if (p.round_pushes >= spec.workers) {
        uint32_t weight = p.round_pushes;
        if (p.late_pushes > 0) {
          // The late pushes count as one push: their average joins the round.
          const float inv = 1.0f / static_cast<float>(p.late_pushes);
          for (uint32_t i = 0; i < p.info.count; ++i) p.acc[i] += p.late_acc[i] * inv;
          std::fill(p.late_acc.begin(), p.late_acc.end(), 0.0f);
          weight += 1;
        }
        const uint32_t members = p.round_pushes + p.late_pushes;
        p.c.pending -= members;
        p.c.applied += members;
        p.round_pushes = 0;
        p.late_pushes = 0;
        ApplyUpdate(p, 1.0f / static_cast<float>(weight));
        if (rep.outcome == PushOutcome::kPending) rep.outcome = PushOutcome::kApplied;
      }
      break;
    }
  }
  rep.version = p.st.version;
  uint8_t out[PushReply::kWireSize];
  rep.EncodeTo(out);
  t.conn->Send(op, t.job->id, t.rid, out);
}

void Server::Impl::ProcessPull(Task& t) {
  Partition& p = *t.p;
  std::lock_guard<std::mutex> l(p.mu);
  // Under p.mu: a committing move answers the waiters it finds under p.mu after kMoved.
  if (t.job->place.load() == Job::kMoved) {
    t.conn->SendMoved(static_cast<uint8_t>(Op::kPull), t.job->id, t.rid, t.job->peer);
    return;
  }
  if (p.st.version >= t.pull.min_version) {
    SendPull(p, t.conn, t.rid, t.pull.dtype);
    return;
  }
  p.waiters.push_back({t.conn, t.rid, t.pull, MonotonicNs() + t.pull.timeout_ms * 1000000ull});
}

void Server::Impl::ProcessSet(Task& t) {
  Partition& p = *t.p;
  std::lock_guard<std::mutex> l(p.mu);
  const uint8_t op = static_cast<uint8_t>(Op::kSetParams);
  if (t.job->place.load() != Job::kActive) {
    Header h{op, 0, static_cast<uint32_t>(t.frame.size()), t.job->id, t.rid};
    if (ParkOrAnswer(*t.job, t.conn, h, &t.frame, /*handoff_only=*/false)) {
      p.c.parked++;
      return;
    }
  }
  if (p.st.version != 0 || p.round_pushes != 0 || p.late_pushes != 0) {
    t.conn->SendError(op, t.job->id, t.rid,
                      AlreadyExists("partition ", p.index, " is at version ", p.st.version,
                                    " (initial values are only taken before the first push)"));
    return;
  }
  ToF32(p.st.param.data(), t.set.data.data(), t.set.dtype, t.set.count);
  for (auto& sn : p.snap) sn.reset();
  p.dirty = true;
  NotifyCheckpoint();
  t.conn->Send(op, t.job->id, t.rid);
}

void Server::Impl::CoreLoop(int me) {
  Core& c = *cores[me];
  pthread_getcpuclockid(pthread_self(), &c.cpu_clock);
  c.has_clock = true;
  if (opt.nice > 0) {
    sched_param sp{};
    pthread_setschedparam(pthread_self(), SCHED_BATCH, &sp);
    setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), opt.nice);
  }
  while (true) {
    std::unique_ptr<Task> t;
    {
      std::unique_lock<std::mutex> l(c.mu);
      c.cv.wait(l, [&] { return stop.load() || !c.q.empty(); });
      if (stop.load()) return;
      auto it = c.q.begin();
      t = std::move(it->second);
      c.q.erase(it);
    }
    const int owner = t->p->core.load();
    if (owner != me) {  // Migrated since it was queued: forward.
      Enqueue(owner, std::move(t));
      continue;
    }
    // Busy time is this thread's CPU time, not wall time: on a shared host a preempted core
    // would otherwise look loaded and the packer would grab cores it does not need.
    const uint64_t t0 = ThreadCpuNs();
    const uint8_t op = static_cast<uint8_t>(t->kind == Task::kPush   ? Op::kPush
                                            : t->kind == Task::kPull ? Op::kPull
                                                                     : Op::kSetParams);
    if (t->job->released.load()) {
      t->conn->SendError(op, t->job->id, t->rid, NotFound("job ", t->job->id, " was released"));
    } else if (t->job->place.load() == Job::kMoved) {
      t->conn->SendMoved(op, t->job->id, t->rid, t->job->peer);
    } else if (t->kind == Task::kPush) {
      ProcessPush(*t);
    } else if (t->kind == Task::kPull) {
      ProcessPull(*t);
    } else {
      ProcessSet(*t);
    }
    c.busy_ns += ThreadCpuNs() - t0;
  }
}

// Moves p to `core` now when it is at an iteration boundary, else when its round closes.
void Server::Impl::Migrate(Partition& p, int core) {
  std::lock_guard<std::mutex> l(p.mu);
  if (p.core.load() == core) {
    p.target = -1;
    return;
  }
  if (p.round_pushes == 0 && p.late_pushes == 0) {
    p.core = core;
    p.target = -1;
    p.c.migrations++;
  } else {
    p.target = core;
  }
}

}  // namespace tessera::paramsvc
