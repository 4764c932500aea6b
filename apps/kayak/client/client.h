// kayak::Client: KV tables and offload functions on Tessera memservers, with Kayak's choice of
// shipping data (KV) or shipping compute (RPC) per request under a p99 latency SLO.
//
// Data: one table (ClientOptions::table) sharded over the memservers by key hash
// (apps/kayak/wire/key_hash.h KvKeyHash with a client seed). Resilience per table: `replicas` = 1 is none; n
// is n-way replication: a key lives on its primary (hash mod servers) and the next n-1 servers.
// PUT and DELETE go to every replica and are acknowledged when every replica that is still up
// has applied them (at least one must); GET and functions go to the first replica that is up.
// With replication a read-write function always runs the KV way (commit on the primary, then
// the written values to the backups), so replicas never diverge. A server that fails is
// skipped from then on; without replication its keys fail with a clear Unavailable error.
//
// Invoke(function, args): the built-in functions (apps/kayak/wire/builtins.h) run either as
// RPC (KV_INVOKE on the server owning the function's first key) or the KV way (the same steps
// over GETs on the client, and for the read-write one a KV_COMMIT with the versions read,
// retried on conflict), chosen by the Controller (apps/kayak/client/controller.h) per mode; the caller
// gets one result either way. In pushback mode (and in every mode when the server refuses) a
// pushed-back RPC is run the KV way. An RPC sees only the shard of the server it runs on, so a
// chain must be co-located on one server (the bench builds its chains that way). Operators'
// functions (ids >= 256) always run as RPC; route them with InvokeOn(routing_key, ...).
//
// Every Invoke's latency feeds the controller: p99 of the last R interval against the SLO sets
// window() — the number of Invokes a caller should keep in flight (the bench does) — and
// throughput sets X. The default SLO is slo_rtt_multiple x the median round trip of a GET,
// measured by Connect().
//
// Async forms take a callback called exactly once, on a connection's reader thread (or the
// caller's thread for immediate errors); callbacks must not block on further replies. The
// blocking forms wait for that callback and must not be called from a callback.
// Ownership: owns its connections. Threads: every method may be called from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "apps/kayak/client/connection.h"
#include "apps/kayak/client/controller.h"
#include "common/status.h"
#include "fabric/transport.h"

namespace kayak {

struct ClientOptions {
  std::vector<tessera::fabric::Endpoint> servers;  // The cluster, in cluster-file order.
  std::string secret;
  uint64_t client_id = 0;  // 0: random.
  uint32_t table = 1;      // Non-zero.
  uint32_t replicas = 1;   // 1: no replication; n: n-way (<= servers).
  ControllerOptions controller;
  // KV-way runs of a read-write function before giving up. A run fails only when another
  // commit on a key it read succeeded meanwhile (optimistic concurrency: someone always makes
  // progress), so this bounds starvation, not correctness: a KV-way run racing RPC runs, which
  // apply on the server in one short step, can lose many times in a row on a loaded machine
  // (64 was seen to run out on 2 busy cores with 3 other writers on the same key).
  uint32_t max_attempts = 1024;
  int connect_timeout_ms = 5000;
  // A request (each GET, PUT, ... and each RPC; a KV-way function is several) with no reply
  // after this fails with Timeout naming the server: a stopped or hung server does not hang
  // a caller forever. A late reply is dropped.
  int request_timeout_ms = 10000;
  bool measure_rtt = true;     // Connect() measures the round trip (sets the default SLO).
  // Connect() succeeds while some servers are unreachable (they count as failed: with
  // replication their keys are served by the other replicas); false: every server must answer.
  bool tolerate_unreachable = false;
};

struct Value {
  uint64_t version = 0;  // 0: absent (MultiGet only; Get answers NotFound).
  std::vector<uint8_t> bytes;
};

struct InvokeResult {
  std::vector<uint8_t> result;
  bool rpc = false;          // Ran on the server.
  bool pushed_back = false;  // Was sent as RPC, pushed back, then run the KV way.
  uint32_t attempts = 1;     // Runs (optimistic retries + 1).
  uint64_t latency_ns = 0;
};

class Client {
 public:
  static tessera::Result<std::unique_ptr<Client>> Connect(ClientOptions options);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  using Key = std::span<const uint8_t>;
  void Get(Key key, std::function<void(tessera::Result<Value>)> cb);
  void MultiGet(std::vector<std::vector<uint8_t>> keys,
                std::function<void(tessera::Result<std::vector<Value>>)> cb);
  void Put(Key key, std::span<const uint8_t> value,
           std::function<void(tessera::Result<uint64_t>)> cb);
  void Delete(Key key, std::function<void(tessera::Status)> cb);
  void Invoke(uint32_t function, std::span<const uint8_t> args,
              std::function<void(tessera::Result<InvokeResult>)> cb);
  void InvokeOn(Key routing_key, uint32_t function, std::span<const uint8_t> args,
                std::function<void(tessera::Result<InvokeResult>)> cb);

  // Blocking forms.
  tessera::Result<Value> Get(Key key);
  tessera::Result<std::vector<Value>> MultiGet(std::vector<std::vector<uint8_t>> keys);
  tessera::Result<uint64_t> Put(Key key, std::span<const uint8_t> value);
  tessera::Status Delete(Key key);
  tessera::Result<InvokeResult> Invoke(uint32_t function, std::span<const uint8_t> args);
  tessera::Result<InvokeResult> InvokeOn(Key routing_key, uint32_t function,
                                         std::span<const uint8_t> args);

  // Controller state.
  uint32_t window();
  double x();
  uint64_t slo_ns();
  uint64_t last_p99_ns();  // The p99 of the controller's last R interval (see Controller).
  uint64_t rtt_ns() const { return rtt_ns_; }
  Mode mode() const { return options_.controller.mode; }
  size_t servers() const { return conns_.size(); }
  // Index of the server that is primary for `key`.
  size_t PrimaryOf(Key key) const;
  // `n` integer keys (8-byte LE, as the built-in functions use) whose primary is `server`,
  // scanning upward from `from`: chains built from them can run as RPC on that server.
  std::vector<uint64_t> KeysOn(size_t server, size_t n, uint64_t from) const;
  // Closes the connection to server i (tests; as if it failed).
  void DropServer(size_t i);

  struct Counters {
    uint64_t rpc = 0, kv = 0, pushed_back = 0, conflicts = 0;
  };
  Counters counters() const;
  // Request frames written and send() calls that wrote them, over all connections.
  struct SendStats {
    uint64_t frames = 0, send_calls = 0;
  };
  SendStats send_stats() const;

  // Internal plumbing, public for the request state machines in client.cc.
  struct Target;
  void SendTo(size_t server, tessera::fabric::Op op, std::vector<uint8_t> payload,
              ReplyCallback cb);
  // Sends to the first replica of `key` that is up, failing over on Unavailable.
  void SendToReplica(Key key, tessera::fabric::Op op, std::vector<uint8_t> payload,
                     ReplyCallback cb, uint32_t skip = 0);
  std::vector<size_t> ReplicasOf(Key key) const;
  void GetVersioned(Key key, std::function<void(tessera::Result<Value>)> cb);
  void CommitKv(std::vector<std::pair<std::vector<uint8_t>, uint64_t>> reads,
                std::vector<std::pair<std::vector<uint8_t>, std::vector<uint8_t>>> writes,
                std::function<void(tessera::Result<bool>)> cb);
  void RunKvWay(uint32_t function, std::vector<uint8_t> args,
                std::function<void(tessera::Result<InvokeResult>)> cb);
  void Finish(uint64_t start_ns, tessera::Result<InvokeResult> r,
              const std::function<void(tessera::Result<InvokeResult>)>& cb);
  const ClientOptions& options() const { return options_; }
  std::atomic<uint64_t> n_rpc_{0}, n_kv_{0}, n_pushed_back_{0}, n_conflicts_{0};

 private:
  explicit Client(ClientOptions options);
  tessera::Status MeasureRtt();

  ClientOptions options_;
  std::vector<std::unique_ptr<Connection>> conns_;
  std::mutex ctl_mu_;
  std::unique_ptr<Controller> controller_;  // Under ctl_mu_.
  uint64_t rtt_ns_ = 0;
};

// The routing key of a built-in function's arguments (its first key), or InvalidArgument.
tessera::Result<std::vector<uint8_t>> BuiltinRoutingKey(uint32_t function,
                                                       std::span<const uint8_t> args);

}  // namespace kayak
