#include "apps/paramsvc/server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "apps/paramsvc/io.h"
#include "apps/paramsvc/packing.h"
#include "common/clock.h"
#include "common/logging.h"
#include "fabric/auth.h"
#include "fabric/credential.h"

namespace tessera::paramsvc {

std::vector<uint8_t> EncodePartitionState(const PartitionState& s) {
  const uint32_t n = static_cast<uint32_t>(s.param.size());
  std::vector<uint8_t> out(8 + 8 + 4 + 1 + 1 + 2 +
                           4ull * n * (1 + (s.mom.empty() ? 0 : 1) + (s.mom2.empty() ? 0 : 1)));
  Put64(out.data(), s.version);
  Put64(out.data() + 8, s.steps);
  Put32(out.data() + 16, n);
  out[20] = s.mom.empty() ? 0 : 1;
  out[21] = s.mom2.empty() ? 0 : 1;
  size_t off = 24;
  for (const auto* v : {&s.param, &s.mom, &s.mom2}) {
    if (v->empty()) continue;
    std::memcpy(out.data() + off, v->data(), 4ull * n);
    off += 4ull * n;
  }
  return out;
}

Result<PartitionState> DecodePartitionState(std::span<const uint8_t> b, uint32_t count) {
  if (b.size() < 24) return Corruption("partition state of ", b.size(), " bytes");
  PartitionState s;
  s.version = Get64(b.data());
  s.steps = Get64(b.data() + 8);
  const uint32_t n = Get32(b.data() + 16);
  if (n != count) return Corruption("partition state holds ", n, " elements, expected ", count);
  if (b[20] > 1 || b[21] > 1) return Corruption("partition state flags");
  const size_t want = 24 + 4ull * n * (1 + b[20] + b[21]);
  if (b.size() != want) return Corruption("partition state is ", b.size(), " bytes, expected ", want);
  size_t off = 24;
  auto take = [&](std::vector<float>* v) {
    v->resize(n);
    std::memcpy(v->data(), b.data() + off, 4ull * n);
    off += 4ull * n;
  };
  take(&s.param);
  if (b[20]) take(&s.mom);
  if (b[21]) take(&s.mom2);
  return s;
}

namespace {

using json = nlohmann::json;

uint64_t ThreadCpuNs() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

// One client connection. Replies are queued and written by the connection's own writer thread,
// so an aggregation core never blocks on a slow reader (a descheduled worker would otherwise
// stall every other job's partitions on that core).
struct Conn {
  // A queued reply: its header, a payload of its own and/or a shared one (a partition's pull
  // snapshot, sent to every worker that pulls that version without being copied again).
  struct Out {
    Header h;
    std::vector<uint8_t> own;
    std::shared_ptr<const std::vector<uint8_t>> shared;
  };
  UniqueFd fd;
  std::atomic<bool> dead{false};
  std::mutex qmu;
  std::condition_variable qcv;
  std::deque<Out> out;
  bool closing = false;
  std::thread writer;

  void Queue(Out o) {
    {
      std::lock_guard<std::mutex> l(qmu);
      if (dead.load() || closing) return;
      out.push_back(std::move(o));
    }
    qcv.notify_one();
  }
  void Send(uint8_t op, uint32_t job, uint64_t rid, std::span<const uint8_t> a = {}) {
    Queue({Header{op, 0, 0, job, rid}, std::vector<uint8_t>(a.begin(), a.end()), nullptr});
  }
  void SendShared(uint8_t op, uint32_t job, uint64_t rid,
                  std::shared_ptr<const std::vector<uint8_t>> body) {
    Queue({Header{op, 0, 0, job, rid}, {}, std::move(body)});
  }
  void SendError(uint8_t op, uint32_t job, uint64_t rid, const Status& s) {
    const std::string& m = s.message();
    Queue({Header{op, static_cast<uint16_t>(s.code()), 0, job, rid},
           std::vector<uint8_t>(m.begin(), m.end()), nullptr});
  }
  void WriterLoop() {
    while (true) {
      Out o;
      {
        std::unique_lock<std::mutex> l(qmu);
        qcv.wait(l, [&] { return closing || !out.empty(); });
        if (out.empty()) return;  // Closing and drained.
        o = std::move(out.front());
        out.pop_front();
      }
      if (dead.load()) continue;
      std::span<const uint8_t> b;
      if (o.shared) b = *o.shared;
      if (!WriteFrame(fd.get(), o.h, o.own, b).ok()) {
        dead = true;
        ::shutdown(fd.get(), SHUT_RDWR);
      }
    }
  }
  // Flushes what is queued (bounded by the socket's send timeout) and stops the writer.
  void Close() {
    {
      std::lock_guard<std::mutex> l(qmu);
      closing = true;
    }
    qcv.notify_all();
    if (writer.joinable()) writer.join();
  }
};

struct PullWaiter {
  std::shared_ptr<Conn> conn;
  uint64_t rid = 0;
  PullRequest req;
  uint64_t deadline_ns = 0;
};

struct Job;

struct Partition {
  Job* job = nullptr;
  uint32_t index = 0;
  PartitionInfo info;
  DType dtype = DType::kF32;

  std::mutex mu;
  PartitionState st;
  float lr = 0.0f;              // The job's learning rate (SET_LR), used when a round closes
  std::vector<float> acc;       // Current round's gradient sum
  std::vector<float> late_acc;  // Bounded mode: sum of late pushes
  uint32_t round_pushes = 0;
  uint32_t late_pushes = 0;
  std::vector<uint8_t> pushed;  // Sync: worker pushed in this round
  std::vector<PullWaiter> waiters;
  JobCounters c;
  bool dirty = false;
  // Pull snapshots per dtype and the version each holds (reset when values change
  // without a version change: SetParams).
  std::shared_ptr<const std::vector<uint8_t>> snap[kNumDTypes];
  uint64_t snap_version[kNumDTypes] = {};

  std::atomic<int> core{0};
  std::atomic<int> target{-1};
  std::atomic<uint64_t> bytes{0};
  uint64_t last_bytes = 0;
  double rate = 0;  // bytes/s EWMA
};

struct BarrierWaiter {
  std::shared_ptr<Conn> conn;
  uint64_t rid = 0;
  uint64_t deadline_ns = 0;
};

struct Job {
  uint32_t id = 0;
  JobSpec spec;
  std::vector<std::unique_ptr<Partition>> parts;
  std::atomic<bool> released{false};
  std::mutex bmu;
  struct Barrier {
    std::vector<uint8_t> seen;
    uint32_t count = 0;
    std::vector<BarrierWaiter> waiters;
  };
  std::map<uint64_t, Barrier> barriers;
};

struct Task {
  enum Kind : uint8_t { kPush, kPull, kSet } kind = kPush;
  std::shared_ptr<Job> job;
  Partition* p = nullptr;
  std::shared_ptr<Conn> conn;
  uint64_t rid = 0;
  std::vector<uint8_t> frame;
  PushRequest push;
  PullRequest pull;
  SetParamsRequest set;
  uint64_t bytes = 0;
};

struct Core {
  std::mutex mu;
  std::condition_variable cv;
  // Shortest first, then arrival.
  std::multimap<std::pair<uint64_t, uint64_t>, std::unique_ptr<Task>> q;
  uint64_t seq = 0;
  std::thread th;
  std::atomic<uint64_t> busy_ns{0};
  clockid_t cpu_clock{};
  std::atomic<bool> has_clock{false};
};

}  // namespace

struct Server::Impl {
  ServerOptions opt;
  UniqueFd listen_fd;
  UniqueFd wake_fd;
  uint16_t port = 0;
  uint64_t server_id = 0;
  std::atomic<bool> stop{false};

  mutable std::mutex jobs_mu;
  std::map<uint32_t, std::shared_ptr<Job>> jobs;
  std::map<std::string, uint32_t> job_by_name;
  uint32_t next_job = 1;
  uint64_t rr = 0;  // Round-robin placement of a static server

  std::vector<std::unique_ptr<Core>> cores;
  std::atomic<int> active{0};
  std::atomic<int> max_cores{1};
  std::atomic<bool> elastic{true};
  int shrink_streak = 0;
  double ns_per_byte = 0;
  std::atomic<uint64_t> core_us{0};  // Active core-microseconds

  std::thread acceptor, timer, ckpt;
  std::mutex conns_mu;
  std::vector<std::pair<std::shared_ptr<Conn>, std::thread>> conns;

  std::mutex ckpt_mu;
  std::condition_variable ckpt_cv;
  bool ckpt_pending = false;

  // ---- helpers ----
  std::shared_ptr<Job> FindJob(uint32_t id) {
    std::lock_guard<std::mutex> l(jobs_mu);
    auto it = jobs.find(id);
    return it == jobs.end() ? nullptr : it->second;
  }

  void Enqueue(int core, std::unique_ptr<Task> t) {
    Core& c = *cores[core];
    {
      std::lock_guard<std::mutex> l(c.mu);
      const uint64_t key = t->bytes;
      c.q.emplace(std::make_pair(key, c.seq++), std::move(t));
    }
    c.cv.notify_one();
  }

  void NotifyCheckpoint() {
    if (opt.checkpoint == nullptr) return;
    {
      std::lock_guard<std::mutex> l(ckpt_mu);
      ckpt_pending = true;
    }
    ckpt_cv.notify_one();
  }

  static void RecordStaleness(Partition& p, uint64_t s, uint32_t bound_buckets) {
    p.c.staleness_max = std::max(p.c.staleness_max, s);
    p.c.staleness_sum += s;
    const uint64_t b = std::min<uint64_t>(s, bound_buckets - 1);
    if (p.c.staleness_hist.size() < bound_buckets) p.c.staleness_hist.resize(bound_buckets, 0);
    p.c.staleness_hist[b]++;
  }

  // Applies acc * scale with the job's optimizer; version + 1. p.mu held.
  void ApplyUpdate(Partition& p, float scale) {
    const OptimizerSpec& o = p.job->spec.optimizer;
    const size_t n = p.info.count;
    p.st.steps++;
    if (o.kind == OptimizerKind::kSgd) {
      if (o.momentum > 0 && p.st.mom.size() != n) p.st.mom.assign(n, 0.0f);
      SgdMomentumStep(p.st.param.data(), o.momentum > 0 ? p.st.mom.data() : nullptr, p.acc.data(),
                      n, scale, p.lr, o.momentum, o.weight_decay);
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
  }

  // Pull replies of one version share one snapshot of the parameters (in the requested
  // dtype), built on the first pull of that version.
  void SendPull(Partition& p, const std::shared_ptr<Conn>& conn, uint64_t rid, DType dtype) {
    const int k = static_cast<int>(dtype);
    if (!p.snap[k] || p.snap_version[k] != p.st.version) {
      const size_t data = DTypeSize(dtype) * p.info.count;
      auto body = std::make_shared<std::vector<uint8_t>>(PullReply::kFixed + data);
      uint8_t* fixed = body->data();
      Put64(fixed, p.st.version);
      Put32(fixed + 8, p.info.count);
      fixed[12] = static_cast<uint8_t>(dtype);
      FromF32(fixed + PullReply::kFixed, p.st.param.data(), dtype, p.info.count);
      p.snap[k] = std::move(body);
      p.snap_version[k] = p.st.version;
    }
    p.bytes += p.snap[k]->size();
    conn->SendShared(static_cast<uint8_t>(Op::kPull), p.job->id, rid, p.snap[k]);
  }

  void ServeWaiters(Partition& p) {
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

  void ProcessPush(Task& t) {
    Partition& p = *t.p;
    const JobSpec& spec = t.job->spec;
    const PushRequest& r = t.push;
    const uint8_t op = static_cast<uint8_t>(Op::kPush);
    PushReply rep;
    std::lock_guard<std::mutex> l(p.mu);
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
                            OutOfRange("sync push for version ", r.version, " of partition ",
                                       p.index, " but the partition is at version ", V));
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

  void ProcessPull(Task& t) {
    Partition& p = *t.p;
    std::lock_guard<std::mutex> l(p.mu);
    if (p.st.version >= t.pull.min_version) {
      SendPull(p, t.conn, t.rid, t.pull.dtype);
      return;
    }
    p.waiters.push_back(
        {t.conn, t.rid, t.pull, MonotonicNs() + t.pull.timeout_ms * 1000000ull});
  }

  void ProcessSet(Task& t) {
    Partition& p = *t.p;
    std::lock_guard<std::mutex> l(p.mu);
    const uint8_t op = static_cast<uint8_t>(Op::kSetParams);
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

  void CoreLoop(int me) {
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
      if (t->job->released.load()) {
        t->conn->SendError(static_cast<uint8_t>(t->kind == Task::kPush   ? Op::kPush
                                                : t->kind == Task::kPull ? Op::kPull
                                                                          : Op::kSetParams),
                           t->job->id, t->rid, NotFound("job ", t->job->id, " was released"));
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

  // ---- connections ----
  void ConnLoop(std::shared_ptr<Conn> conn) {
    Header h;
    std::vector<uint8_t> payload;
    bool authed = false;
    fabric::HandshakeTranscript tr;
    bool hello = false;
    while (!stop.load() && !conn->dead.load()) {
      Status s = ReadFrame(conn->fd.get(), &h, &payload);
      if (!s.ok()) {
        if (s.code() == StatusCode::kProtocolError) {
          TLOG(WARNING) << "paramsvc: closing a connection: " << s.message();
          conn->SendError(0, 0, 0, s);
        }
        break;
      }
      if (h.status != 0) {
        conn->SendError(h.op, h.job, h.request_id, ProtocolError("a request carries a status"));
        continue;
      }
      const Op op = static_cast<Op>(h.op);
      if (!authed) {
        if (op == Op::kHello && payload.size() == 40) {
          std::memcpy(tr.client_nonce.data(), payload.data(), 32);
          tr.client_id = Get64(payload.data() + 32);
          tr.server_id = server_id;
          if (!fabric::RandomBytes(tr.server_nonce).ok()) break;
          uint8_t out[40];
          std::memcpy(out, tr.server_nonce.data(), 32);
          Put64(out + 32, server_id);
          conn->Send(h.op, 0, h.request_id, out);
          hello = true;
          continue;
        }
        if (op == Op::kAuth && hello && payload.size() == 32) {
          fabric::Mac mac;
          std::memcpy(mac.data(), payload.data(), 32);
          // Any credential issued from the cluster secret (fabric/credential.h): a client
          // token, an admin token or the secret itself.
          std::optional<fabric::VerifiedClient> who = fabric::VerifyClientMac(opt.secret, tr, mac);
          if (!who) {
            conn->SendError(h.op, 0, h.request_id,
                            PermissionDenied("authentication failed: the credential for client "
                                             "id ", tr.client_id, " was not issued from this "
                                             "service's cluster secret"));
            break;
          }
          authed = true;
          const fabric::Mac sm = fabric::ServerMac(who->key, tr);
          conn->Send(h.op, 0, h.request_id, sm);
          continue;
        }
        conn->SendError(h.op, h.job, h.request_id,
                        PermissionDenied(OpName(h.op), " before authentication (HELLO, AUTH first)"));
        break;
      }
      Handle(conn, h, std::move(payload));
      payload = {};
    }
    conn->Close();
    conn->dead = true;
    ::shutdown(conn->fd.get(), SHUT_RDWR);
  }

  Result<std::pair<std::shared_ptr<Job>, Partition*>> Resolve(uint32_t job_id, uint32_t part) {
    std::shared_ptr<Job> job = FindJob(job_id);
    if (!job) return NotFound("unknown job ", job_id);
    if (part >= job->parts.size()) {
      return OutOfRange("job ", job_id, " ('", job->spec.name, "') has ", job->parts.size(),
                        " partitions, not ", part, "+1");
    }
    return std::make_pair(job, job->parts[part].get());
  }

  void Handle(const std::shared_ptr<Conn>& conn, const Header& h, std::vector<uint8_t> payload) {
    const uint8_t op = h.op;
    auto fail = [&](const Status& s) { conn->SendError(op, h.job, h.request_id, s); };
    switch (static_cast<Op>(op)) {
      case Op::kError:
        return fail(ProtocolError("ERROR is a reply, not a request"));
      case Op::kHello:
      case Op::kAuth:
        return fail(ProtocolError(OpName(op), " after authentication"));
      case Op::kRegister: {
        auto spec = JobSpec::Decode(payload);
        if (!spec.ok()) return fail(spec.status());
        auto layout = Register(std::move(*spec));
        if (!layout.ok()) return fail(layout.status());
        const auto bytes = layout->Encode();
        conn->Send(op, layout->job, h.request_id, bytes);
        return;
      }
      case Op::kPush: {
        auto r = PushRequest::Decode(payload);
        if (!r.ok()) return fail(r.status());
        auto jp = Resolve(h.job, r->partition);
        if (!jp.ok()) return fail(jp.status());
        auto& [job, p] = *jp;
        if (r->worker >= job->spec.workers) {
          return fail(InvalidArgument("worker ", r->worker, " but job '", job->spec.name,
                                      "' has ", job->spec.workers, " workers"));
        }
        if (r->dtype != p->dtype) {
          return fail(InvalidArgument("push of ", DTypeName(r->dtype), " to tensor '",
                                      job->spec.tensors[p->info.tensor].name, "' (",
                                      DTypeName(p->dtype), ")"));
        }
        if (r->count != p->info.count) {
          return fail(InvalidArgument("push of ", r->count, " elements to partition ",
                                      r->partition, " of ", p->info.count, " elements"));
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
        if (!jp.ok()) return fail(jp.status());
        auto& [job, p] = *jp;
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
        if (!jp.ok()) return fail(jp.status());
        auto& [job, p] = *jp;
        if ((r->dtype != p->dtype && r->dtype != DType::kF32) || r->count != p->info.count) {
          return fail(InvalidArgument("initial values for partition ", r->partition, ": ", r->count,
                                      " ", DTypeName(r->dtype), " elements, expected ",
                                      p->info.count, " ", DTypeName(p->dtype), " or fp32"));
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
        if (!job) return fail(NotFound("unknown job ", h.job));
        if (r->worker >= job->spec.workers) {
          return fail(InvalidArgument("worker ", r->worker, " but job '", job->spec.name, "' has ",
                                      job->spec.workers, " workers"));
        }
        std::vector<BarrierWaiter> release;
        {
          std::lock_guard<std::mutex> l(job->bmu);
          auto& b = job->barriers[r->iteration];
          if (b.seen.empty()) b.seen.assign(job->spec.workers, 0);
          if (b.seen[r->worker]) {
            return fail(InvalidArgument("worker ", r->worker, " is already in barrier ",
                                        r->iteration));
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
        std::shared_ptr<Job> job;
        {
          std::lock_guard<std::mutex> l(jobs_mu);
          auto it = jobs.find(h.job);
          if (it == jobs.end()) return fail(NotFound("unknown job ", h.job));
          job = it->second;
          job_by_name.erase(job->spec.name);
          jobs.erase(it);
        }
        job->released = true;
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
        if (!jp.ok()) return fail(jp.status());
        Migrate(*jp->second, static_cast<int>(r->core));
        conn->Send(op, h.job, h.request_id);
        return;
      }
      case Op::kSetLr: {
        auto r = SetLrRequest::Decode(payload);
        if (!r.ok()) return fail(r.status());
        std::shared_ptr<Job> job = FindJob(h.job);
        if (!job) return fail(NotFound("unknown job ", h.job));
        for (auto& p : job->parts) {
          std::lock_guard<std::mutex> l(p->mu);
          p->lr = r->lr;
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
    }
    fail(ProtocolError("unknown op ", int{op}));
  }

  // Moves p to `core` now when it is at an iteration boundary, else when its round closes.
  void Migrate(Partition& p, int core) {
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

  Result<JobLayout> Register(JobSpec spec) {
    std::lock_guard<std::mutex> l(jobs_mu);
    auto it = job_by_name.find(spec.name);
    if (it != job_by_name.end()) {
      const auto& job = jobs.at(it->second);
      if (!job->spec.SameModel(spec)) {
        return AlreadyExists("job '", spec.name,
                             "' exists with a different model, worker count, mode or optimizer");
      }
      JobLayout lay;
      lay.job = job->id;
      for (const auto& p : job->parts) lay.partitions.push_back(p->info);
      return lay;
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
    TLOG(INFO) << "paramsvc: job " << id << " ('" << (*job)->spec.name << "') registered: "
               << (*job)->spec.workers << " workers, " << ModeName((*job)->spec.mode) << ", "
               << lay.partitions.size() << " partitions";
    return lay;
  }

  // jobs_mu held.
  Result<std::shared_ptr<Job>> MakeJob(uint32_t id, JobSpec spec, std::vector<PartitionState> states) {
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

  // ---- timers, packing ----
  void TimerLoop() {
    uint64_t last_pack = MonotonicNs();
    uint64_t last_tick = last_pack;
    std::vector<uint64_t> last_busy(cores.size(), 0);
    while (!stop.load()) {
      pollfd pfd{wake_fd.get(), POLLIN, 0};
      ::poll(&pfd, 1, 10);
      if (stop.load()) return;
      const uint64_t now = MonotonicNs();
      core_us += static_cast<uint64_t>(active.load()) * (now - last_tick) / 1000;
      last_tick = now;
      ExpireWaiters(now);
      if (now - last_pack >= opt.rebalance_ms * 1000000ull) {
        Rebalance(now - last_pack, &last_busy);
        last_pack = now;
      }
    }
  }

  std::vector<std::shared_ptr<Job>> AllJobs() {
    std::lock_guard<std::mutex> l(jobs_mu);
    std::vector<std::shared_ptr<Job>> v;
    for (auto& [_, j] : jobs) v.push_back(j);
    return v;
  }

  void ExpireWaiters(uint64_t now) {
    for (auto& job : AllJobs()) {
      for (auto& p : job->parts) {
        std::lock_guard<std::mutex> l(p->mu);
        for (auto it = p->waiters.begin(); it != p->waiters.end();) {
          if (now >= it->deadline_ns) {
            it->conn->SendError(static_cast<uint8_t>(Op::kPull), job->id, it->rid,
                                Timeout("partition ", p->index, " did not reach version ",
                                        it->req.min_version, " within ", it->req.timeout_ms,
                                        " ms (at ", p->st.version, ")"));
            it = p->waiters.erase(it);
          } else {
            ++it;
          }
        }
      }
      std::lock_guard<std::mutex> l(job->bmu);
      for (auto bit = job->barriers.begin(); bit != job->barriers.end();) {
        auto& ws = bit->second.waiters;
        for (auto it = ws.begin(); it != ws.end();) {
          if (now >= it->deadline_ns) {
            it->conn->SendError(static_cast<uint8_t>(Op::kBarrier), job->id, it->rid,
                                Timeout("barrier ", bit->first, ": ", bit->second.count, " of ",
                                        job->spec.workers, " workers arrived"));
            it = ws.erase(it);
          } else {
            ++it;
          }
        }
        ++bit;
      }
    }
  }

  void Rebalance(uint64_t dt_ns, std::vector<uint64_t>* last_busy) {
    auto all = AllJobs();
    std::vector<Partition*> parts;
    uint64_t bytes = 0;
    for (auto& j : all) {
      for (auto& p : j->parts) {
        const uint64_t b = p->bytes.load();
        const uint64_t d = b - p->last_bytes;
        p->last_bytes = b;
        const double r = static_cast<double>(d) * 1e9 / static_cast<double>(dt_ns);
        p->rate = p->rate == 0 ? r : 0.5 * p->rate + 0.5 * r;
        bytes += d;
        parts.push_back(p.get());
      }
    }
    uint64_t busy = 0;
    for (size_t i = 0; i < cores.size(); ++i) {
      const uint64_t b = cores[i]->busy_ns.load();
      busy += b - (*last_busy)[i];
      (*last_busy)[i] = b;
    }
    if (bytes > (1u << 16)) {
      const double npb = static_cast<double>(busy) / static_cast<double>(bytes);
      ns_per_byte = ns_per_byte == 0 ? npb : 0.7 * ns_per_byte + 0.3 * npb;
    }
    if (parts.empty()) {
      active = elastic.load() ? 0 : max_cores.load();
      return;
    }
    if (!elastic.load()) {
      active = max_cores.load();
      return;
    }
    std::vector<PackItem> items(parts.size());
    for (size_t i = 0; i < parts.size(); ++i) {
      const int t = parts[i]->target.load();
      items[i].load = parts[i]->rate * ns_per_byte / 1e9;
      items[i].current = t >= 0 ? t : parts[i]->core.load();
    }
    PackResult pr = PackPartitions(items, opt.target_utilisation, max_cores.load());
    // Shrink only after three intervals in a row asked for fewer cores (bursty jobs).
    int cur = 0;
    for (const auto& it : items) cur = std::max(cur, it.current + 1);
    if (pr.cores < cur) {
      if (++shrink_streak < 3) {
        active = CountActive(parts);
        return;
      }
    }
    shrink_streak = 0;
    for (size_t i = 0; i < parts.size(); ++i) {
      if (pr.core[i] != items[i].current) Migrate(*parts[i], pr.core[i]);
    }
    active = CountActive(parts);
  }

  static int CountActive(const std::vector<Partition*>& parts) {
    uint64_t mask[4] = {};
    int n = 0;
    for (Partition* p : parts) {
      for (int c : {p->core.load(), p->target.load()}) {
        if (c < 0) continue;
        if (!(mask[c / 64] & (1ull << (c % 64)))) {
          mask[c / 64] |= 1ull << (c % 64);
          ++n;
        }
      }
    }
    return n;
  }

  // ---- checkpoints ----
  void CheckpointLoop() {
    while (true) {
      {
        std::unique_lock<std::mutex> l(ckpt_mu);
        ckpt_cv.wait(l, [&] { return stop.load() || ckpt_pending; });
        if (stop.load()) return;
        ckpt_pending = false;
      }
      for (auto& job : AllJobs()) {
        for (auto& p : job->parts) {
          PartitionState copy;
          {
            std::lock_guard<std::mutex> l(p->mu);
            if (!p->dirty) continue;
            p->dirty = false;
            copy = p->st;
          }
          if (job->released.load()) break;
          opt.checkpoint->SavePartition(job->id, p->index, copy);
        }
      }
    }
  }

  void AcceptLoop() {
    while (!stop.load()) {
      pollfd pfd[2] = {{listen_fd.get(), POLLIN, 0}, {wake_fd.get(), POLLIN, 0}};
      if (::poll(pfd, 2, -1) < 0) continue;
      if (stop.load()) return;
      if (!(pfd[0].revents & POLLIN)) continue;
      int fd = ::accept4(listen_fd.get(), nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      SetSocketTimeouts(fd, 0, 30000);
      auto conn = std::make_shared<Conn>();
      conn->fd.Reset(fd);
      Conn* raw_conn = conn.get();
      conn->writer = std::thread([raw_conn] { raw_conn->WriterLoop(); });
      std::lock_guard<std::mutex> l(conns_mu);
      // Reap finished connection threads.
      for (auto it = conns.begin(); it != conns.end();) {
        if (it->first->dead.load() && it->second.joinable()) {
          it->second.join();
          it = conns.erase(it);
        } else {
          ++it;
        }
      }
      if (conns.size() >= opt.max_connections) {
        conn->SendError(0, 0, 0, ResourceExhausted("too many connections"));
        conn->Close();
        continue;
      }
      conns.emplace_back(conn, std::thread([this, conn] { ConnLoop(conn); }));
    }
  }

  std::string StatusJson() {
    json j;
    j["server_id"] = server_id;
    j["pid"] = static_cast<int64_t>(::getpid());
    j["kernel_target"] = KernelTarget();
    j["max_cores"] = max_cores.load();
    j["elastic"] = elastic.load();
    j["target_utilisation"] = opt.target_utilisation;
    j["active_cores"] = active.load();
    j["core_seconds"] = static_cast<double>(core_us.load()) / 1e6;
    j["ns_per_byte"] = ns_per_byte;
    j["checkpoints"] = opt.checkpoint != nullptr;
    json cs = json::array();
    for (size_t i = 0; i < cores.size(); ++i) {
      std::lock_guard<std::mutex> l(cores[i]->mu);
      cs.push_back({{"core", i},
                    {"busy_s", static_cast<double>(cores[i]->busy_ns.load()) / 1e9},
                    {"queued", cores[i]->q.size()}});
    }
    j["cores"] = cs;
    json js = json::array();
    for (auto& job : AllJobs()) {
      JobCounters c = Sum(*job);
      json pj = json::array();
      uint64_t min_v = UINT64_MAX, max_v = 0;
      for (auto& p : job->parts) {
        std::lock_guard<std::mutex> l(p->mu);
        min_v = std::min(min_v, p->st.version);
        max_v = std::max(max_v, p->st.version);
        pj.push_back({{"partition", p->index},
                      {"tensor", p->info.tensor},
                      {"elements", p->info.count},
                      {"core", p->core.load()},
                      {"version", p->st.version},
                      {"bytes_per_s", p->rate}});
      }
      js.push_back({{"job", job->id},
                    {"name", job->spec.name},
                    {"workers", job->spec.workers},
                    {"mode", ModeName(job->spec.mode)},
                    {"staleness_bound", job->spec.staleness},
                    {"version_min", min_v},
                    {"version_max", max_v},
                    {"pushes", c.pushes},
                    {"applied", c.applied},
                    {"pending", c.pending},
                    {"dropped", c.dropped},
                    {"late_aggregated", c.late_aggregated},
                    {"rejected", c.rejected},
                    {"updates", c.updates},
                    {"staleness_max", c.staleness_max},
                    {"staleness_sum", c.staleness_sum},
                    {"staleness_hist", c.staleness_hist},
                    {"migrations", c.migrations},
                    {"partitions", pj}});
    }
    j["jobs"] = js;
    return j.dump();
  }

  static JobCounters Sum(Job& job) {
    JobCounters s;
    for (auto& p : job.parts) {
      std::lock_guard<std::mutex> l(p->mu);
      const JobCounters& c = p->c;
      s.pushes += c.pushes;
      s.applied += c.applied;
      s.pending += c.pending;
      s.dropped += c.dropped;
      s.late_aggregated += c.late_aggregated;
      s.rejected += c.rejected;
      s.updates += c.updates;
      s.staleness_max = std::max(s.staleness_max, c.staleness_max);
      s.staleness_sum += c.staleness_sum;
      s.migrations += c.migrations;
      if (s.staleness_hist.size() < c.staleness_hist.size()) {
        s.staleness_hist.resize(c.staleness_hist.size(), 0);
      }
      for (size_t i = 0; i < c.staleness_hist.size(); ++i) s.staleness_hist[i] += c.staleness_hist[i];
    }
    return s;
  }
};

Result<UniqueFd> Server::Listen(const std::string& host, uint16_t port) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) return ErrnoError("socket");
  int one = 1;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  if (::inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1) {
    return InvalidArgument("bad IPv4 listen address '", host, "'");
  }
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    return ErrnoError("bind ", host, ":", port);
  }
  if (::listen(fd.get(), 512) != 0) return ErrnoError("listen");
  return fd;
}

Result<std::unique_ptr<Server>> Server::Start(const ServerOptions& options, UniqueFd listen_fd) {
  if (options.max_cores < 1 || options.max_cores > 256) {
    return InvalidArgument("max_cores ", options.max_cores, " not in 1..256");
  }
  if (!(options.target_utilisation > 0 && options.target_utilisation <= 1)) {
    return InvalidArgument("target_utilisation ", options.target_utilisation, " not in (0, 1]");
  }
  if (options.rebalance_ms < 10 || options.rebalance_ms > 60000) {
    return InvalidArgument("rebalance_ms ", options.rebalance_ms, " not in 10..60000");
  }
  if (options.nice < 0 || options.nice > 19) return InvalidArgument("nice ", options.nice, " not in 0..19");
  if (options.secret.empty()) return InvalidArgument("a shared secret is required");
  auto impl = std::make_unique<Impl>();
  impl->opt = options;
  impl->listen_fd = std::move(listen_fd);
  impl->wake_fd.Reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!impl->wake_fd) return ErrnoError("eventfd");
  sockaddr_in a{};
  socklen_t len = sizeof(a);
  if (::getsockname(impl->listen_fd.get(), reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    return ErrnoError("getsockname");
  }
  impl->port = ntohs(a.sin_port);
  impl->server_id = options.server_id;
  if (impl->server_id == 0) {
    uint8_t r[8];
    if (!fabric::RandomBytes(r).ok()) return Internal("no randomness");
    impl->server_id = Get64(r) | 1;
  }
  impl->max_cores = options.max_cores;
  impl->elastic = options.elastic;
  impl->active = options.elastic ? 0 : options.max_cores;
  Impl* raw = impl.get();
  for (int i = 0; i < options.max_cores; ++i) impl->cores.push_back(std::make_unique<Core>());
  for (int i = 0; i < options.max_cores; ++i) {
    impl->cores[i]->th = std::thread([raw, i] { raw->CoreLoop(i); });
  }
  impl->timer = std::thread([raw] { raw->TimerLoop(); });
  if (options.checkpoint) impl->ckpt = std::thread([raw] { raw->CheckpointLoop(); });
  if (options.accept_on_start) impl->acceptor = std::thread([raw] { raw->AcceptLoop(); });
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Server::~Server() {
  Impl& m = *impl_;
  m.stop = true;
  uint64_t one = 1;
  (void)!::write(m.wake_fd.get(), &one, sizeof(one));
  if (m.acceptor.joinable()) m.acceptor.join();
  if (m.timer.joinable()) m.timer.join();
  m.ckpt_cv.notify_all();
  if (m.ckpt.joinable()) m.ckpt.join();
  for (auto& c : m.cores) {
    { std::lock_guard<std::mutex> l(c->mu); }
    c->cv.notify_all();
  }
  for (auto& c : m.cores) {
    if (c->th.joinable()) c->th.join();
  }
  std::lock_guard<std::mutex> l(m.conns_mu);
  for (auto& [conn, th] : m.conns) ::shutdown(conn->fd.get(), SHUT_RDWR);
  for (auto& [conn, th] : m.conns) {
    if (th.joinable()) th.join();
    conn->Close();
  }
}

uint16_t Server::port() const { return impl_->port; }

void Server::StartAccepting() {
  Impl* raw = impl_.get();
  if (!raw->acceptor.joinable()) raw->acceptor = std::thread([raw] { raw->AcceptLoop(); });
}

Status Server::RestoreJob(uint32_t job, const JobSpec& spec, std::vector<PartitionState> states) {
  Status v = spec.Validate();
  if (!v.ok()) return v;
  std::lock_guard<std::mutex> l(impl_->jobs_mu);
  if (impl_->jobs.count(job) || impl_->job_by_name.count(spec.name)) {
    return AlreadyExists("job ", job, " ('", spec.name, "') exists");
  }
  auto j = impl_->MakeJob(job, spec, std::move(states));
  if (!j.ok()) return j.status();
  impl_->jobs[job] = *j;
  impl_->job_by_name[spec.name] = job;
  impl_->next_job = std::max(impl_->next_job, job + 1);
  return Status::Ok();
}

std::string Server::StatusJson() const { return impl_->StatusJson(); }

Result<JobCounters> Server::Counters(uint32_t job) const {
  auto j = impl_->FindJob(job);
  if (!j) return NotFound("unknown job ", job);
  return Impl::Sum(*j);
}

int Server::active_cores() const { return impl_->active.load(); }
double Server::core_seconds() const { return static_cast<double>(impl_->core_us.load()) / 1e6; }

double Server::core_cpu_seconds() const {
  double s = 0;
  for (auto& c : impl_->cores) {
    if (!c->has_clock.load()) continue;
    timespec ts;
    if (clock_gettime(c->cpu_clock, &ts) == 0) s += ts.tv_sec + ts.tv_nsec / 1e9;
  }
  return s;
}

}  // namespace tessera::paramsvc
