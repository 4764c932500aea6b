// The Parameter Service client: one training worker's connection to the service (ps-lite's
// push/pull API in spirit: Push, Pull, PushPull, plus a barrier per iteration).
//
// A worker Join()s a job (registering it when it is new; every worker passes the same spec),
// rank 0 sets the initial parameters, all workers meet at a barrier, then each iteration calls
// PushPull(gradients, parameters): the gradients of every tensor are pushed (one message per
// partition, pipelined), and the updated parameters are pulled back into the caller's buffers
// (sync: waits for the round every worker pushed to; async/bounded: the latest version).
//
// Tensors are passed as one pointer per tensor of the spec, in spec order, each holding
// elements() values of the tensor's dtype (fp16/bf16 as raw 16-bit values).
//
// Failures: when the connection breaks (e.g. the aggregation server was killed and its
// supervisor started a replacement), the client reconnects for up to reconnect_ms, joins the
// job again and resynchronises: its buffers get the service's current parameters (restored
// from the latest checkpoint), that iteration's gradient is discarded, and rollbacks() counts
// it. A push the service refuses because the model version moved back (OutOfRange) is handled
// the same way. DataLoss when the service came back without the job's state.
//
// Moves: when the job moved to another server (server.h "Moves between servers"), the old
// server answers kStatusMoved "HOST:PORT" to every request of the job it did not apply. The
// client then connects there (following up to 8 moves in a row), joins the job again by name
// (a staged copy answers Unavailable until its move commits; the client retries for
// max(reconnect_ms, op_timeout_ms)), sends its learning rate again, and sends exactly the
// requests that were answered kStatusMoved: pushes the old server applied are not sent twice,
// pushes it did not apply are not lost, and nothing is rolled back. redirects() counts moves
// followed; host()/port() say where the client is now.
//
// Threads: one Client per worker thread; not thread-safe per object.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "apps/paramsvc/server/server.h"
#include "apps/paramsvc/wire/wire.h"
#include "common/fd.h"
#include "common/status.h"

namespace tessera::paramsvc {

struct ClientOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  std::string secret;          // Shared secret (fabric/auth.h). Required.
  uint64_t client_id = 0;      // 0: random.
  int connect_timeout_ms = 5000;
  int op_timeout_ms = 60000;   // Bound on every wait for a reply (pulls, barriers).
  int reconnect_ms = 0;        // Keep trying to reconnect this long after a failure (0: never).
};

struct ClientCounters {
  uint64_t pushes = 0;
  uint64_t applied = 0;      // Pushes whose reply said applied/pending
  uint64_t dropped = 0;      // Bounded mode: dropped as too stale
  uint64_t late = 0;         // Bounded mode: aggregated as late
  uint64_t max_staleness = 0;
  uint64_t rollbacks = 0;    // Iterations discarded by a resynchronisation
  uint64_t reconnects = 0;
  uint64_t redirects = 0;    // Moves of the job to another server followed
};

class Client {
 public:
  static Result<std::unique_ptr<Client>> Connect(const ClientOptions& options);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Registers `spec` (or joins the job of that name with the same spec) as worker `rank`.
  Status Join(const JobSpec& spec, uint32_t rank);
  uint32_t job() const { return layout_.job; }
  const JobLayout& layout() const { return layout_; }
  const JobSpec& spec() const { return spec_; }

  // Initial parameter values (before the first update; AlreadyExists after).
  Status SetParams(std::span<const void* const> params);
  // Pushes gradients computed on the versions last pulled.
  Status Push(std::span<const void* const> grads);
  // Pulls the parameters; wait: sync semantics (the version after this worker's last push).
  Status Pull(std::span<void* const> params, bool wait);
  Status PushPull(std::span<const void* const> grads, std::span<void* const> params);
  Status Barrier(uint64_t iteration);

  // The job's learning rate from its next round on (every worker of a job may send the same
  // schedule); sent again after a reconnect, since a restored job starts from its spec's lr.
  Status SetLr(float lr);

  // Releases the job (it departs; its state is freed on the service).
  Status Release();

  // The job's state on the service, one PartitionState per partition of layout() (parameters
  // in fp32, optimizer state, versions, steps), e.g. for a PyTorch state_dict; and back, at an
  // iteration boundary (no round open): the service's parameters, optimizer state, versions
  // and steps become these (every worker should pull afterwards).
  Status GetState(std::vector<PartitionState>* out);
  Status PutState(const std::vector<PartitionState>& states);

  // Admin: STATUS json; move a partition to a core at its next boundary.
  Result<std::string> StatusJson();
  Status Migrate(uint32_t partition, uint32_t core);
  // Admin (an admin credential): move job `name` from this server to `to` (MOVE_JOB; the
  // JSON report of the move, or why it aborted, the job then staying here); drain (new jobs
  // go to `redirect`, or are refused when it is empty) or stop draining.
  Result<std::string> MoveJob(const std::string& name, const std::string& to,
                              uint32_t boundary_timeout_ms, bool allow_volatile);
  Status Drain(bool on, const std::string& redirect);
  // Sends a raw request and returns the reply payload or its error (tests, tools).
  Result<std::vector<uint8_t>> Call(Op op, uint32_t job, std::span<const uint8_t> payload);

  uint64_t version(uint32_t partition) const { return versions_[partition]; }
  uint64_t min_version() const;
  const ClientCounters& counters() const { return counters_; }
  // False once a transport error closed the connection (a reply error leaves it open).
  bool connected() const { return static_cast<bool>(fd_); }
  const std::string& host() const { return opt_.host; }
  uint16_t port() const { return opt_.port; }

 private:
  // A partition's outcome in a batch of pushes or pulls.
  enum Outcome : uint8_t { kDone = 0, kRefused = 1, kMovedAway = 2 };
  static constexpr int kMaxHops = 8;

  explicit Client(ClientOptions o) : opt_(std::move(o)) {}
  Status Dial();
  Status Reconnect(const Status& why);
  // Connects to `to` instead (a kStatusMoved reply), without joining.
  Status Redial(const std::string& to);
  // Follows the job to `to`: connects, joins it again (retrying while it is still arriving),
  // sends the learning rate again.
  Status Follow(const std::string& to);
  Status Send(Op op, uint32_t job, uint64_t rid, std::span<const uint8_t> a,
              std::span<const uint8_t> b = {});
  // Reads replies until one with `rid` arrives (replies come in order per request kind only).
  Status Await(uint64_t rid, Header* h, std::vector<uint8_t>* payload);
  // A request of the job that follows moves (sent again where the job went).
  Result<std::vector<uint8_t>> JobCall(Op op, std::span<const uint8_t> payload);
  // Batches over the partitions whose `only` entry is set (all when null); `out` gets each
  // partition's Outcome, `moved_to` the server of a kMovedAway.
  Status PushAll(std::span<const void* const> grads, const std::vector<uint8_t>* only,
                 std::vector<uint8_t>* out, std::string* moved_to);
  Status PullAll(std::span<void* const> params, const std::vector<uint64_t>& min_versions,
                 const std::vector<uint8_t>* only, std::string* moved_to,
                 std::vector<uint8_t>* out);
  // The same, following the job wherever it moved until every partition was answered.
  Status PushFollowing(std::span<const void* const> grads, std::vector<uint8_t>* out);
  Status PullFollowing(std::span<void* const> params, const std::vector<uint64_t>& min_versions);
  Status Resync(std::span<void* const> params);
  Status CallSetLr(float lr);

  ClientOptions opt_;
  UniqueFd fd_;
  uint64_t next_rid_ = 1;
  JobSpec spec_;
  uint32_t rank_ = 0;
  bool joined_ = false;
  bool following_ = false;  // Join may give the job another id (it moved)
  float lr_ = -1.0f;  // The last SetLr (< 0: none)
  JobLayout layout_;
  std::string layout_host_;  // The server layout_ came from
  uint16_t layout_port_ = 0;
  std::vector<uint64_t> versions_;
  std::vector<uint64_t> pushed_version_;  // Version of this worker's last push (UINT64_MAX: none)
  ClientCounters counters_;
  // Replies that arrived while waiting for another request id.
  std::map<uint64_t, std::pair<Header, std::vector<uint8_t>>> stash_;
  std::vector<uint8_t> pull_buf_;
};

// JobSpec from JSON: {"name":..., "workers":N, "mode":"sync|async|bounded(s)",
// "late":"drop|aggregate", "optimizer":"sgd|adam", "lr":..., "momentum":..., "weight_decay":...,
// "partition_bytes":..., "tensors":[{"name":..., "dtype":"fp32|fp16|bf16", "shape":[...]}]}.
Result<JobSpec> JobSpecFromJson(std::string_view text);

}  // namespace tessera::paramsvc
