// The Parameter Service server's internals, shared by its files by concern: server.cc (the
// public Server, status), server_cores.cc (the aggregation cores: pushes, pulls, optimizer
// steps, migration), server_conn.cc (connections and their requests), server_timers.cc (pull
// deadlines, elastic packing, checkpoints). Internal to apps/paramsvc/server/server*.cc.
//
// Threads: as in server.h; each struct says what guards it.
#pragma once

#include <sys/socket.h>
#include <time.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "apps/paramsvc/io.h"
#include "apps/paramsvc/server/packing.h"
#include "apps/paramsvc/server/server.h"
#include "common/fd.h"
#include "fabric/auth.h"

namespace tessera::paramsvc {
namespace server_internal {

// One client connection, owned by one event loop (server_loop.cc), which reads its requests.
// A reply is written at once by the thread that makes it, without blocking (MSG_DONTWAIT); what
// the socket does not take stays queued and the loop writes it when the socket drains, so an
// aggregation core never blocks on a slow reader (a descheduled worker would otherwise stall
// every other job's partitions on that core).
struct Conn {
  // A queued reply: its header, a payload of its own and/or a shared one (a partition's pull
  // snapshot, sent to every worker that pulls that version without being copied again).
  struct Out {
    Header h;
    std::vector<uint8_t> own;
    std::shared_ptr<const std::vector<uint8_t>> shared;
    size_t sent = 0;  // Bytes of the encoded frame already written.
  };
  UniqueFd fd;
  int epfd = -1;  // The owning loop's epoll instance.
  std::atomic<bool> dead{false};
  std::atomic<bool> admin{false};  // Authenticated with an admin credential (moves, drain)

  // Guards the write side: out, closing, out_armed, and writes to fd.
  std::mutex qmu;
  std::deque<Out> out;
  bool closing = false;    // No more replies: shut down once `out` is written.
  bool out_armed = false;  // The loop watches for the socket to drain (EPOLLOUT).

  // The read side and the handshake: the owning loop's thread only.
  uint8_t hdr[kHeaderSize] = {};
  size_t hdr_have = 0;
  bool in_payload = false;
  Header h;
  std::vector<uint8_t> payload;
  size_t payload_have = 0;
  bool authed = false, hello = false;
  fabric::HandshakeTranscript tr;

  // Admin requests (moves, imports, drain) may wait on other servers or the checkpoint store:
  // they run in order on a thread of their own per connection, never on the loop.
  std::mutex amu;
  std::deque<std::pair<Header, std::vector<uint8_t>>> admin_q;
  bool admin_running = false;

  void Queue(Out o);  // server_loop.cc
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
  // The request's job lives on `to` now (wire.h kStatusMoved); the request was not applied.
  void SendMoved(uint8_t op, uint32_t job, uint64_t rid, const std::string& to) {
    Queue({Header{op, kStatusMoved, 0, job, rid}, std::vector<uint8_t>(to.begin(), to.end()),
           nullptr});
  }
  // No more replies after what is queued; the connection is shut down once that is written.
  void CloseAfterFlush();  // server_loop.cc
  // Writes queued replies until the socket would block (then watches for it to drain) or the
  // queue is empty. Under qmu. False when the connection failed (it is then dead).
  bool FlushLocked();  // server_loop.cc

 private:
  void WatchOut(bool on);
};

// One event loop: an epoll instance and its thread. It accepts connections (every loop watches
// the listening socket, EPOLLEXCLUSIVE: the kernel wakes one), reads their requests and writes
// the replies their sockets did not take at once.
struct EventLoop {
  UniqueFd ep;
  UniqueFd ev;  // Wakes the loop (stop).
  std::thread th;
  std::map<Conn*, std::shared_ptr<Conn>> conns;  // The loop's thread only.
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

// A request held while its job moves to another server (server.h "Moves between servers"):
// answered kStatusMoved when the move commits, handled as if it had just arrived when it
// aborts.
struct Parked {
  std::shared_ptr<Conn> conn;
  Header h;
  std::vector<uint8_t> payload;
};

struct Job {
  uint32_t id = 0;
  JobSpec spec;
  std::vector<std::unique_ptr<Partition>> parts;
  std::atomic<bool> released{false};

  // Moves between servers (server_move.cc). Lock order: pmu, then a partition's mu, then
  // parked_mu (a leaf). `place` changes under pmu (and parked_mu for kActive and kMoved, and
  // every partition's mu for kHandoff); anyone may read it.
  enum Place : uint8_t {
    kActive = 0,    // Served here
    kFreezing = 1,  // Moving out: pushes that would open a round are parked
    kHandoff = 2,   // Moving out, snapshot taken: every state-changing request is parked
    kMoved = 3,     // Moved out (committed): requests get kStatusMoved `peer`
    kStaged = 4,    // Moving in: a copy that answers Unavailable until IMPORT_COMMIT
  };
  std::atomic<uint8_t> place{kActive};
  std::mutex pmu;
  std::condition_variable move_cv;  // A round closed while freezing
  uint64_t move_id = 0;             // The move under way (out) or that staged this copy (in)
  std::string peer;                 // Out: the destination; staged: the source
  bool prepared = false;            // Staged: complete and persisted (IMPORT_PREPARE)
  std::atomic<uint64_t> staged_touch_ns{0};  // Staged: the last word from the source
  std::atomic<uint64_t> moves{0};   // Moves between servers this job made
  std::mutex parked_mu;
  std::vector<Parked> parked;
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

}  // namespace server_internal

struct Server::Impl {
  using Conn = server_internal::Conn;
  using PullWaiter = server_internal::PullWaiter;
  using Job = server_internal::Job;
  using Partition = server_internal::Partition;
  using BarrierWaiter = server_internal::BarrierWaiter;
  using Task = server_internal::Task;
  using Core = server_internal::Core;

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

  std::thread timer, ckpt;
  std::vector<std::unique_ptr<server_internal::EventLoop>> loops;
  std::atomic<uint32_t> nconns{0};
  std::atomic<bool> accepting{false};
  // Threads running connections' admin requests (Conn::admin_q); each sets its flag when done.
  std::mutex admin_mu;
  std::vector<std::pair<std::shared_ptr<std::atomic<bool>>, std::thread>> admin_threads;

  std::mutex ckpt_mu;
  std::condition_variable ckpt_cv;
  bool ckpt_pending = false;

  // Moves between servers (server_move.cc); jobs_mu guards these maps and flags.
  std::string advertise;                            // This server's HOST:PORT ("" unknown)
  std::map<uint32_t, MovedRecord> moved;            // Tombstones by job id
  std::map<std::string, uint32_t> moved_by_name;
  std::map<uint32_t, bool> unacked;                 // Tombstones D has not acknowledged
  std::map<uint64_t, std::string> outgoing;         // Moves under way: id -> job name
  bool draining = false;
  std::string drain_to;
  std::thread mover;
  std::mutex mover_mu;
  std::condition_variable mover_cv;

  // ---- aggregation cores (server_cores.cc) ----
  std::shared_ptr<Job> FindJob(uint32_t id);
  void Enqueue(int core, std::unique_ptr<Task> t);
  void NotifyCheckpoint();
  static void RecordStaleness(Partition& p, uint64_t s, uint32_t bound_buckets);
  // Applies acc * scale with the job's optimizer; version + 1. p.mu held.
  void ApplyUpdate(Partition& p, float scale);
  // Pull replies of one version share one snapshot of the parameters (in the requested
  // dtype), built on the first pull of that version.
  void SendPull(Partition& p, const std::shared_ptr<Conn>& conn, uint64_t rid, DType dtype);
  void ServeWaiters(Partition& p);
  void ProcessPush(Task& t);
  void ProcessPull(Task& t);
  void ProcessSet(Task& t);
  void CoreLoop(int me);
  // Moves p to `core` now when it is at an iteration boundary, else when its round closes.
  void Migrate(Partition& p, int core);

  // ---- event loops (server_loop.cc) ----
  Status StartLoops(int n);
  // Every loop watches the listening socket from now on.
  Status StartAcceptingLoops();
  void StopLoops();  // After `stop` is set: wakes and joins the loops, joins admin threads.
  void LoopRun(server_internal::EventLoop* loop);
  void AcceptSome(server_internal::EventLoop* loop);
  // Reads what the socket holds; false when the connection is to be closed.
  bool ReadSome(const std::shared_ptr<Conn>& conn);
  // One whole request: the handshake, then Handle (admin requests: RunAdmin). False: close.
  bool OnFrame(const std::shared_ptr<Conn>& conn, const Header& h, std::vector<uint8_t> payload);
  void RunAdmin(const std::shared_ptr<Conn>& conn, const Header& h, std::vector<uint8_t> payload);

  // ---- connections (server_conn.cc) ----
  Result<std::pair<std::shared_ptr<Job>, Partition*>> Resolve(uint32_t job_id, uint32_t part);
  void Handle(const std::shared_ptr<Conn>& conn, const Header& h, std::vector<uint8_t> payload);
  // `moved_to` set: the job moved away (or the server drains): answer kStatusMoved;
  // `staged` set: the job is arriving here: answer kStatusArriving.
  Result<JobLayout> Register(JobSpec spec, std::string* moved_to, std::shared_ptr<Job>* staged);
  // jobs_mu held.
  Result<std::shared_ptr<Job>> MakeJob(uint32_t id, JobSpec spec,
                                       std::vector<PartitionState> states);

  // ---- moves between servers (server_move.cc) ----
  // Answers a request for a job id this server does not have: kStatusMoved when a tombstone
  // names it. False when there is none (the caller sends its NotFound).
  bool AnswerMoved(const std::shared_ptr<Conn>& conn, const Header& h);
  // Parks a request of `job` when a move is under way (kFreezing too unless handoff_only),
  // answers kStatusMoved when the job moved out; false: handle it now. Takes parked_mu only
  // (callers may hold a partition's mu, or pmu).
  bool ParkOrAnswer(Job& job, const std::shared_ptr<Conn>& conn, const Header& h,
                    std::vector<uint8_t>* payload, bool handoff_only);
  Result<std::string> MoveOut(const MoveJobRequest& req);
  void Unfreeze(Job& job);
  // The commit point passed: the tombstone replaces the job; parked requests, pull and barrier
  // waiters get kStatusMoved.
  void CommitOut(const std::shared_ptr<Job>& job, const MovedRecord& rec);
  Result<std::vector<uint8_t>> ImportBeginOp(const std::vector<uint8_t>& payload);
  Status ImportPartOp(uint32_t job, const std::vector<uint8_t>& payload);
  Result<bool> ImportPrepareOp(uint32_t job, const std::vector<uint8_t>& payload);
  Status ImportCommitOp(const MoveRef& ref);
  void ImportAbortOp(const MoveRef& ref);
  MoveState MoveStatusOp(const MoveRef& ref);
  // The staged copy `job` becomes the job (jobs_mu held).
  void ActivateStaged(const std::shared_ptr<Job>& job);
  // The staged copy is dropped (jobs_mu held).
  void DropStaged(const std::shared_ptr<Job>& job);
  void MoverLoop();
  void PhaseHold(uint64_t move_id, const std::string& job, const char* phase);

  // ---- timers, packing, checkpoints (server_timers.cc) ----
  void TimerLoop();
  std::vector<std::shared_ptr<Job>> AllJobs();
  void ExpireWaiters(uint64_t now);
  void Rebalance(uint64_t dt_ns, std::vector<uint64_t>* last_busy);
  static int CountActive(const std::vector<Partition*>& parts);
  void CheckpointLoop();

  // ---- status (server.cc) ----
  std::string StatusJson();
  static JobCounters Sum(Job& job);
};

}  // namespace tessera::paramsvc
