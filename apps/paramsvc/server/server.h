// The Parameter Service: model aggregation for many training jobs, packed onto few cores.
//
// What it is. A Server owns the jobs registered with it. A job's tensors are cut into
// partitions (at most JobSpec::partition_bytes of fp32 each); a partition holds the fp32
// parameters, the optimizer state, the gradient sum of the current round and its counters. Each
// partition is owned by one aggregation core (a thread); every push, pull and initial-value
// write of a partition runs on its core, so a partition's state is only ever changed by one
// thread at a time (and under the partition's mutex, which the rebalancer and the checkpointer
// also take). Cores drain their queue shortest-first (smallest message first, then arrival:
// MLFabric's ordering within a scheduling round).
//
// Consistency (per partition; versions count applied updates):
//   sync        a push must carry the partition's current version; one push per worker per
//               round; the round's sum is applied (averaged over the workers) when all workers
//               have pushed. An iteration completes when all workers have pushed.
//   async       every push is applied as it arrives (gradient scaled by 1/workers).
//   bounded(s)  a push computed on version v is applied only if the current version V is at
//               most v+s (staleness V-v <= s); it joins the current round, which is applied when
//               it holds `workers` pushes, from any workers (a fast worker does not wait for a
//               straggler). A push with staleness > s is dropped (late policy drop) or summed
//               with the other late pushes, whose average is applied with the next round as one
//               extra push (late policy aggregate). Every push's staleness, every drop and
//               every late aggregation is counted (JobCounters) and exposed by STATUS.
//   A push with a version above the current one (e.g. after a restore from an older
//   checkpoint) is refused with OutOfRange naming the current version; clients resynchronise.
//
// Packing (elastic): every rebalance interval the service measures each partition's bytes/s
// (pushes + pulls) and the service's cost per byte (core busy time / bytes), turns them into a
// core fraction per partition, and bin-packs them (packing.h) onto the fewest cores under
// target_utilisation (at most max_cores). Cores without partitions sleep: that is the CPU the
// service gives back. A partition changes core at an iteration boundary (no partial round in
// its accumulator): at once if it is at one, else when its current round closes; requests that
// reach the old core afterwards are forwarded, so nothing is lost or counted twice. With
// elastic = false all max_cores stay active and partitions are spread round-robin (a static
// parameter server).
//
// Moves between servers (server_move.cc; the operator's side is `tessera paramsvc move`,
// `drain` and `rebalance`). A job is the unit a server hands to another: all its partitions
// move together, at an iteration boundary, as a two-phase commit the source coordinates.
//   1. MOVE_JOB (operator, to the source S): S dials the destination D (IMPORT_BEGIN: D makes
//      a staged copy, which answers every request for the job with Unavailable), then freezes
//      the job: a push that would open a new round on a partition is parked, not applied; a
//      push that joins an open round is applied, so open rounds close. When every partition
//      is at a boundary (no round open, no late push pending), S takes the handoff snapshot
//      under all the partitions' locks (parameters, optimizer state, versions, counters, lr);
//      from then on every state-changing request is parked. No boundary within
//      boundary_timeout_ms: the move aborts.
//   2. Prepare: S sends the snapshot (IMPORT_PART per partition, IMPORT_PREPARE). D persists
//      the staged copy to its checkpoints (the supervisor acknowledges once the store holds
//      every partition) and answers whether it is durable. Any failure: the move aborts.
//   3. Commit point: S records "job moved to D by move M" with its supervisor and waits for
//      the acknowledgement. From that record on the job is D's, whatever dies: S drops its
//      copy, keeps a tombstone (job id and name -> D), answers every parked and later request
//      of the job with kStatusMoved "D" (none of them was applied on S), and sends
//      IMPORT_COMMIT; D activates its copy. S retries IMPORT_COMMIT until D answers.
//   Abort (before the commit point): S sends IMPORT_ABORT, unfreezes the job and handles its
//   parked requests as if they had just arrived: the job stays on S, nothing was applied on D.
//   The rule under a crash: the job is D's if and only if S's supervisor holds the commit
//   record. A restarted S restores the tombstone instead of the job; a restarted D restores
//   a staged copy (persisted in step 2) as staged and asks S (MOVE_STATUS): committed ->
//   activate, unknown -> drop, pending -> ask again. Either way exactly one server applies
//   the job's updates, and its state is the handoff snapshot plus what it applied since: no
//   update is applied twice or lost (a crash loses at most the iterations since the last
//   checkpoint, as always, and clients resynchronise). Without checkpoints (no --store) the
//   records live only in the aggregation servers; a move to a destination without
//   checkpoints from a source with them is refused unless allow_volatile.
//   Clients follow kStatusMoved replies (client.h): they join the job at D by name and send the
//   moved requests again there.
//
// Priority: core threads run SCHED_BATCH at `nice` (page traffic of a memserver on the same
// host keeps priority).
//
// Checkpoints: when a CheckpointSink is given, a checkpoint thread copies every partition whose
// version moved (parameters, optimizer state, version) and hands it to the sink, latest version
// only (an update applied while one is being written is written next). A job's spec goes to the
// sink when it registers and a drop when it is released.
//
// Threads: Start() and the destructor from one thread; StatusJson() and Restore*() from any
// thread (Restore* before StartAccepting). Internally: event_loops event-loop threads (epoll;
// they accept, read every connection's requests and write the replies a socket did not take
// at once), max_cores core threads, a rebalancer/timer thread, a checkpoint thread, a move
// thread (commit retries, staged copies asking their source); admin requests (moves, imports,
// drain) run on a thread per connection that sends them, so an outgoing move never holds a
// loop.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "apps/paramsvc/wire/wire.h"
#include "common/fd.h"
#include "common/status.h"

namespace tessera::paramsvc {

// A partition's durable state (what checkpoints carry, what moves and GET_STATE/PUT_STATE
// send).
struct PartitionState {
  uint64_t version = 0;
  uint64_t steps = 0;             // Optimizer steps taken (Adam's t)
  std::vector<float> param;
  std::vector<float> mom;         // SGD momentum / Adam m (empty when unused)
  std::vector<float> mom2;        // Adam v (empty when unused)
};
std::vector<uint8_t> EncodePartitionState(const PartitionState& s);
Result<PartitionState> DecodePartitionState(std::span<const uint8_t> b, uint32_t count);

// Per-job counters (all exact; see the file comment).
struct JobCounters {
  uint64_t pushes = 0;          // Pushes accepted (valid)
  uint64_t applied = 0;         // Pushes whose gradient is in an applied update
  uint64_t pending = 0;         // Pushes in a round not yet applied
  uint64_t dropped = 0;         // Bounded: staleness > s, dropped
  uint64_t late_aggregated = 0; // Bounded: staleness > s, aggregated (applied or pending)
  uint64_t rejected = 0;        // Pushes refused (bad version, duplicate in a sync round, ...)
  uint64_t updates = 0;         // Optimizer steps over all partitions
  uint64_t staleness_max = 0;
  uint64_t staleness_sum = 0;
  std::vector<uint64_t> staleness_hist;  // [0..s] then one bucket for > s (bounded); else [0..64]
  uint64_t migrations = 0;      // Moves between cores
  uint64_t parked = 0;          // Requests held during a move to another server
};
// A partition's counters as they travel with a move (pending is 0 at a boundary).
std::vector<uint8_t> EncodeCounters(const JobCounters& c);
Status DecodeCounters(std::span<const uint8_t> b, JobCounters* c);

// What a server keeps of a job that moved away (a tombstone): requests for it are answered
// kStatusMoved `to`.
struct MovedRecord {
  uint32_t job = 0;        // Its id on this server
  std::string name;
  std::string to;          // "HOST:PORT"
  uint64_t move_id = 0;
};

// Where checkpoints go. Called from the server's checkpoint thread (Save*) and from connection
// threads (the others); implementations must be thread-safe and may block briefly.
class CheckpointSink {
 public:
  virtual ~CheckpointSink() = default;
  virtual void SaveJob(uint32_t job, const JobSpec& spec) = 0;
  virtual void DropJob(uint32_t job) = 0;
  virtual void SavePartition(uint32_t job, uint32_t partition, const PartitionState& state) = 0;
  // A staged copy arriving by move `move_id` from `source` (SaveJob's record, marked staged in
  // the same message, so a restart never sees it unmarked); ActivateJob clears the mark.
  virtual void SaveStagedJob(uint32_t job, const JobSpec& spec, uint64_t move_id,
                             const std::string& source) = 0;
  virtual void ActivateJob(uint32_t job) = 0;
  // The commit record of a move away: the job's checkpoint is dropped, the tombstone kept.
  virtual void SaveMoved(const MovedRecord& r) = 0;
  virtual void SaveDrain(bool on, const std::string& redirect) = 0;
  // Returns once the sink holds every earlier message and the store every earlier write:
  // true when every partition of `job` (0: none) is durable at the state last saved.
  // Unavailable when the sink is gone.
  virtual Result<bool> Sync(uint32_t job) = 0;
};

struct ServerOptions {
  std::string secret;        // Shared secret (fabric/auth.h). Required.
  uint64_t server_id = 0;    // 0: random.
  int max_cores = 2;         // Cores the memserver lends (1..256).
  bool elastic = true;       // Pack onto the fewest cores (else all max_cores, round-robin).
  double target_utilisation = 0.6;  // Per core, (0, 1].
  uint32_t rebalance_ms = 200;      // Packing interval (10..60000).
  int nice = 0;              // Nice of the core threads (0..19); SCHED_BATCH when > 0.
  CheckpointSink* checkpoint = nullptr;  // Not owned; outlives the server. Null: none.
  uint32_t max_connections = 4096;
  // Event loops serving the connections (server_loop.cc); 0: one per core of the machine, at
  // most 8.
  int event_loops = 0;
  // false: connections wait in the listen backlog until StartAccepting() (a replacement
  // aggregation server restores its jobs first, so a reconnecting client finds them).
  bool accept_on_start = true;
  // This server's "HOST:PORT" as other servers reach it (a destination asks a move's source
  // with it). Empty: the listening address, unless that is 0.0.0.0 (then moves away are
  // refused until one is given).
  std::string advertise;
  // Testing (fault injection): when set, each phase of a move (source: frozen, prepared,
  // committed; destination: staged) prints "move M of job 'J': PHASE" on stdout, then holds
  // there while this file's first line is that phase's name (a test kills the process in
  // that phase, or empties the file to let the move go on).
  std::string move_hold_file;
  // A staged copy that hears nothing from its source this long asks it (MOVE_STATUS).
  uint32_t staged_check_ms = 2000;
};

class Server {
 public:
  // Binds host:port (port 0: ephemeral) for Start(); host is an IPv4 or IPv6 address ("::1",
  // "[::1]", "::" for every address).
  static Result<UniqueFd> Listen(const std::string& host, uint16_t port);
  // Serves on `listen_fd` (taken over) until destroyed.
  static Result<std::unique_ptr<Server>> Start(const ServerOptions& options, UniqueFd listen_fd);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  uint16_t port() const;
  void StartAccepting();
  // A restored job (from a checkpoint): same id, spec and state. AlreadyExists if taken.
  // staged_move != 0: a staged copy of move `staged_move` from `source`, which it asks.
  Status RestoreJob(uint32_t job, const JobSpec& spec, std::vector<PartitionState> states,
                    uint64_t staged_move = 0, const std::string& source = {});
  // A restored tombstone (a committed move away); its IMPORT_COMMIT is sent again.
  Status RestoreMoved(const MovedRecord& r);
  void RestoreDrain(bool on, const std::string& redirect);
  // Jobs, partitions (core, version, load), cores (active, busy), counters: a JSON object.
  std::string StatusJson() const;
  Result<JobCounters> Counters(uint32_t job) const;
  // Cores currently holding partitions, and the core-seconds they were held so far.
  int active_cores() const;
  double core_seconds() const;
  // CPU seconds the core threads actually ran.
  double core_cpu_seconds() const;

  struct Impl;

 private:
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera::paramsvc
