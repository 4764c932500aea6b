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
// Threads: one Client per worker thread; not thread-safe per object.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "apps/paramsvc/wire.h"
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
  // Admin: STATUS json; move a partition to a core at its next boundary.
  Result<std::string> StatusJson();
  Status Migrate(uint32_t partition, uint32_t core);
  // Sends a raw request and returns the reply payload or its error (tests, tools).
  Result<std::vector<uint8_t>> Call(Op op, uint32_t job, std::span<const uint8_t> payload);

  uint64_t version(uint32_t partition) const { return versions_[partition]; }
  uint64_t min_version() const;
  const ClientCounters& counters() const { return counters_; }

 private:
  explicit Client(ClientOptions o) : opt_(std::move(o)) {}
  Status Dial();
  Status Reconnect(const Status& why);
  Status Send(Op op, uint32_t job, uint64_t rid, std::span<const uint8_t> a,
              std::span<const uint8_t> b = {});
  // Reads replies until one with `rid` arrives (replies come in order per request kind only).
  Status Await(uint64_t rid, Header* h, std::vector<uint8_t>* payload);
  Status PushAll(std::span<const void* const> grads, std::vector<uint8_t>* refused);
  Status PullAll(std::span<void* const> params, const std::vector<uint64_t>& min_versions);
  Status Resync(std::span<void* const> params);
  Status CallSetLr(float lr);

  ClientOptions opt_;
  UniqueFd fd_;
  uint64_t next_rid_ = 1;
  JobSpec spec_;
  uint32_t rank_ = 0;
  bool joined_ = false;
  float lr_ = -1.0f;  // The last SetLr (< 0: none)
  JobLayout layout_;
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
