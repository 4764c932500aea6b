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
// Priority: core threads run SCHED_BATCH at `nice` (page traffic of a memserver on the same
// host keeps priority).
//
// Checkpoints: when a CheckpointSink is given, a checkpoint thread copies every partition whose
// version moved (parameters, optimizer state, version) and hands it to the sink, latest version
// only (an update applied while one is being written is written next). A job's spec goes to the
// sink when it registers and a drop when it is released.
//
// Threads: Start() and the destructor from one thread; StatusJson() and RestoreJob() from any
// thread (RestoreJob before clients use that job). Internally: an acceptor, one thread per
// connection, max_cores core threads, a rebalancer/timer thread, a checkpoint thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "apps/paramsvc/wire.h"
#include "common/fd.h"
#include "common/status.h"

namespace tessera::paramsvc {

// A partition's durable state (what checkpoints carry).
struct PartitionState {
  uint64_t version = 0;
  uint64_t steps = 0;             // Optimizer steps taken (Adam's t)
  std::vector<float> param;
  std::vector<float> mom;         // SGD momentum / Adam m (empty when unused)
  std::vector<float> mom2;        // Adam v (empty when unused)
};
std::vector<uint8_t> EncodePartitionState(const PartitionState& s);
Result<PartitionState> DecodePartitionState(std::span<const uint8_t> b, uint32_t count);

// Where checkpoints go. Called from the server's checkpoint thread (Save*) and from connection
// threads (SaveJob/DropJob); implementations must be thread-safe and may block briefly.
class CheckpointSink {
 public:
  virtual ~CheckpointSink() = default;
  virtual void SaveJob(uint32_t job, const JobSpec& spec) = 0;
  virtual void DropJob(uint32_t job) = 0;
  virtual void SavePartition(uint32_t job, uint32_t partition, const PartitionState& state) = 0;
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
  // false: connections wait in the listen backlog until StartAccepting() (a replacement
  // aggregation server restores its jobs first, so a reconnecting client finds them).
  bool accept_on_start = true;
};

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
  uint64_t migrations = 0;
};

class Server {
 public:
  // Binds host:port (port 0: ephemeral) for Start().
  static Result<UniqueFd> Listen(const std::string& host, uint16_t port);
  // Serves on `listen_fd` (taken over) until destroyed.
  static Result<std::unique_ptr<Server>> Start(const ServerOptions& options, UniqueFd listen_fd);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  uint16_t port() const;
  void StartAccepting();
  // A restored job (from a checkpoint): same id, spec and state. AlreadyExists if taken.
  Status RestoreJob(uint32_t job, const JobSpec& spec, std::vector<PartitionState> states);
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
