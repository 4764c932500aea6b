// EtcdClient and EtcdWatch: a small etcd v3 client for cluster membership (which memory servers
// exist), speaking to etcd's JSON gateway.
//
// Why the JSON gateway (and not gRPC): etcd 3.4 (Debian's etcd-server) serves its v3 API as
// JSON over HTTP at /v3/... (grpc-gateway: the same RPCs, keys and values base64-encoded, int64
// fields as decimal strings, streaming RPCs as newline-delimited JSON objects). Using it needs
// no generated protobuf/gRPC code and no gRPC runtime, only libcurl (the HTTP client, Debian
// libcurl4-openssl-dev) and nlohmann-json, which Tessera already uses. Membership is a control
// path (a few requests per second at most), so the gateway's cost over gRPC does not matter.
// Calls used: /v3/kv/put, /v3/kv/range, /v3/kv/deleterange, /v3/lease/grant,
// /v3/lease/keepalive, /v3/lease/revoke, /v3/watch (a stream).
//
// Endpoints and failover: EtcdOptions lists one or more endpoints ("host:port" or
// "http://host:port"); a request goes to the endpoint that answered last and, when it cannot be
// reached (connect error, timeout), to the next ones in turn. Every request is bounded by
// connect_timeout_ms and request_timeout_ms; when no endpoint answers the call fails with
// Unavailable naming every endpoint and why. An error etcd itself returns (e.g. an expired
// lease) is not retried elsewhere.
//
// Threads: EtcdClient is thread-safe (every call uses its own libcurl handle; the "last good
// endpoint" is an atomic). EtcdWatch runs one thread of its own that calls the callback; it is
// stopped (and joined) by its destructor, which must not run on that thread.
//
// This library links libcurl; the LD_PRELOAD shim (kernel_shim) must not link it (libcurl
// and OpenSSL initialise global state inside arbitrary programs): `tessera run` resolves and
// watches membership and hands the shim server lists instead (see apps/run).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/status.h"

namespace tessera::membership {

struct EtcdOptions {
  // etcd client URLs: "host:port" or "http://host:port" (https is passed to libcurl as is).
  std::vector<std::string> endpoints;
  uint32_t connect_timeout_ms = 1000;  // Per endpoint attempt.
  uint32_t request_timeout_ms = 3000;  // Per endpoint attempt, unary calls.
};

// "a:2379,b:2379" -> {"http://a:2379", "http://b:2379"}. InvalidArgument when empty or when an
// entry has no port.
Result<std::vector<std::string>> ParseEtcdEndpoints(std::string_view list);

struct KeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  int64_t lease = 0;  // 0: none.
};

struct RangeResult {
  std::vector<KeyValue> kvs;
  int64_t revision = 0;  // The store revision the result was read at.
};

struct WatchEvent {
  enum class Type : uint8_t { kPut, kDelete };
  Type type = Type::kPut;
  KeyValue kv;  // For kDelete only key and mod_revision are set.
};

// The command line of a single-member etcd (the `etcd` program, Debian's etcd-server) on
// loopback, for tests, benches and `tessera experiment`: clients at 127.0.0.1:client_port,
// peers at 127.0.0.1:peer_port, its data in data_dir and its log in log_path.
std::vector<std::string> SingleEtcdArgs(const std::string& name, const std::string& data_dir,
                                        int client_port, int peer_port,
                                        const std::string& log_path);
// Waits (bounded by timeout_ms, polling every 30 ms) until the etcd at `endpoint` answers a
// range request. `exited` is asked on every poll: true (the process died) ends the wait with
// Unavailable. Timeout when it never answered.
Status WaitForEtcd(const std::string& endpoint, int timeout_ms,
                   const std::function<bool()>& exited);

// The smallest key greater than every key starting with `prefix` (etcd's range_end for a
// prefix). "" -> "\0" (every key).
std::string PrefixEnd(std::string_view prefix);

class EtcdClient {
 public:
  // InvalidArgument for an empty endpoint list. Does not contact etcd.
  static Result<std::unique_ptr<EtcdClient>> Create(const EtcdOptions& options);
  ~EtcdClient();
  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  // `lease` 0: the key is not attached to a lease.
  Status Put(std::string_view key, std::string_view value, int64_t lease = 0);
  // The key itself (kvs empty when it does not exist).
  Result<RangeResult> Get(std::string_view key);
  // Every key starting with `prefix`, in key order.
  Result<RangeResult> GetPrefix(std::string_view prefix);
  // Number of keys deleted (0 or 1).
  Result<int64_t> Delete(std::string_view key);
  // A new lease of `ttl_s` seconds (1..): its id.
  Result<int64_t> GrantLease(int64_t ttl_s);
  // Refreshes the lease; returns its TTL in seconds. NotFound when it expired (or never
  // existed): keys attached to it are gone.
  Result<int64_t> KeepAlive(int64_t lease);
  // Revokes the lease, deleting its keys. NotFound when it already expired.
  Status RevokeLease(int64_t lease);

  const EtcdOptions& options() const { return options_; }
  // The endpoint the next request tries first.
  std::string current_endpoint() const;

 private:
  explicit EtcdClient(EtcdOptions options);
  struct Reply;
  // POSTs `body` to `path` on the endpoints in turn; the parsed JSON reply as text.
  Result<std::string> Call(const std::string& path, const std::string& body);

  const EtcdOptions options_;
  std::atomic<size_t> current_{0};
};

// A prefix watch on a thread of its own, as "list, then watch from the listed revision": on
// start and after every reconnect it reads the whole prefix and hands it to on_snapshot (the
// complete current state: apply it by replacing what you had), then streams changes to
// on_events. When the stream breaks (etcd down or restarted, the revision compacted) it retries
// every retry_ms, trying the endpoints in turn, until it is stopped; no change is lost because
// the next snapshot replaces the state. on_error (optional) is told of every failed attempt.
class EtcdWatch {
 public:
  struct Callbacks {
    std::function<void(const RangeResult&)> on_snapshot;            // Required.
    std::function<void(const std::vector<WatchEvent>&)> on_events;  // Required.
    std::function<void(const Status&)> on_error;                    // Optional.
  };
  static Result<std::unique_ptr<EtcdWatch>> Start(const EtcdOptions& options,
                                                  std::string prefix, Callbacks callbacks,
                                                  uint32_t retry_ms = 200);
  ~EtcdWatch();  // Stops the stream and joins the thread (bounded by ~connect_timeout_ms).
  EtcdWatch(const EtcdWatch&) = delete;
  EtcdWatch& operator=(const EtcdWatch&) = delete;

  // Times the snapshot was (re)read: 1 after the first successful list, +1 per reconnect.
  uint64_t snapshots() const { return snapshots_.load(); }

 private:
  EtcdWatch() = default;
  void Run();
  // One list + stream; returns why it ended.
  Status Once();

  EtcdOptions options_;
  std::string prefix_;
  Callbacks cb_;
  uint32_t retry_ms_ = 200;
  std::unique_ptr<EtcdClient> client_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> snapshots_{0};
  void* multi_ = nullptr;  // CURLM*, for curl_multi_wakeup() from the destructor.
  std::thread thread_;
};

}  // namespace tessera::membership
