// Cluster membership in etcd: memory servers register themselves under a lease, clients read
// and watch the registrations.
//
// Layout in etcd: one key per running memserver process,
//   /tessera/<cluster_name>/servers/<server_id>  ->  ServerRecord as JSON
// attached to the server's lease. server_id is random per process start, so a restarted server
// is a new member (its old slabs are gone with the old process). A graceful shutdown deletes
// the key (and revokes the lease); a killed server's key vanishes when its lease expires
// (--etcd_ttl, default 5 s).
//
// Who owns what, threads:
// - Registration: owned by the memserver's main; one keep-alive thread of its own. Stop() (or
//   the destructor) from the owner thread.
// - MembershipView: owned by a client; one watch thread (EtcdWatch) that updates the member
//   map and calls listeners. Members() from any thread. Listeners are called on the watch
//   thread, one change at a time, and must not call Subscribe/Unsubscribe.
// - StoreFollower: connects a view to a remote PageStore (client/remote_store.h): joins are
//   AddRemoteServer'd, leaves RemoveRemoteServer'd. Destroy it before the store.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "client/page_store.h"
#include "client/remote_store.h"
#include "common/status.h"
#include "membership/etcd_client.h"

namespace tessera::membership {

// What a memserver publishes about itself.
struct ServerRecord {
  std::string server_id;   // Random per process start (16 hex digits).
  std::string endpoint;    // "host:port" clients connect to.
  std::string rack;        // Failure domain ("" = none).
  uint64_t capacity = 0;   // Bytes it lends (--capacity).
  uint64_t slab_size = 0;  // Bytes.
  std::string host;        // gethostname().
  int64_t pid = 0;
  int64_t start_time_ms = 0;  // Unix time of the start, ms.
  std::string version;        // Tessera version.

  std::string ToJson() const;
  // InvalidArgument for a malformed record (not JSON, no endpoint, ...).
  static Result<ServerRecord> FromJson(std::string_view text);
};

// Cluster names: 1..64 of [A-Za-z0-9._-].
Status ValidateClusterName(std::string_view name);
// "/tessera/<name>/servers/"
std::string ServersPrefix(std::string_view cluster_name);
// A fresh random server id.
std::string NewServerId();

// Reads the current registrations once (for `tessera status`, and to start a client).
Result<std::vector<ServerRecord>> ReadServers(const EtcdOptions& options,
                                              std::string_view cluster_name);
// The same as RemoteServers (endpoint + rack), in server_id order; Unavailable when none is
// registered (a client needs at least one).
Result<std::vector<client::RemoteServer>> ToRemoteServers(const std::vector<ServerRecord>& records);

class Registration {
 public:
  // Grants a lease of ttl_s seconds (2..3600), puts the record under it and starts the
  // keep-alive thread (a refresh every ttl/3). When the lease is lost anyway (etcd was away
  // longer than the TTL), the thread grants a new one and registers again. Fails (nothing is
  // registered) when etcd cannot be reached now.
  static Result<std::unique_ptr<Registration>> Start(const EtcdOptions& options,
                                                     std::string cluster_name,
                                                     ServerRecord record, int64_t ttl_s);
  ~Registration();  // Stop().
  Registration(const Registration&) = delete;
  Registration& operator=(const Registration&) = delete;

  // Graceful leave: stops the keep-alive thread, deletes the key and revokes the lease
  // (bounded by the etcd timeouts). Idempotent.
  Status Stop();

  const std::string& key() const { return key_; }
  int64_t lease() const { return lease_.load(); }
  uint64_t reregistrations() const { return reregistrations_.load(); }

 private:
  Registration() = default;
  void KeepAliveLoop();
  Status Register();  // New lease + put.

  std::unique_ptr<EtcdClient> client_;
  std::string key_;
  std::string value_;
  int64_t ttl_s_ = 5;
  std::atomic<int64_t> lease_{0};
  std::atomic<uint64_t> reregistrations_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;  // Guarded by mu_.
  bool stopped_ = false;  // Owner thread only.
  std::thread thread_;
};

// A change of membership, as listeners see it.
struct MembershipChange {
  enum class Kind : uint8_t { kJoined, kLeft };
  Kind kind = Kind::kJoined;
  ServerRecord server;
  std::string why;  // kLeft: "deregistered or its lease expired" etc.
};

class MembershipView {
 public:
  using Listener = std::function<void(const MembershipChange&)>;

  // Starts watching and waits (bounded by first_snapshot_ms) for the first list, so Members()
  // is current when it returns. Unavailable when etcd cannot be reached in that time.
  static Result<std::unique_ptr<MembershipView>> Start(const EtcdOptions& options,
                                                       std::string cluster_name,
                                                       uint32_t first_snapshot_ms = 5000);
  ~MembershipView();

  std::vector<ServerRecord> Members() const;
  // Adds a listener; returns its id. It is then told of every later change.
  uint64_t Subscribe(Listener listener);
  void Unsubscribe(uint64_t id);  // After it returns the listener is not called again.
  // Watch (re)starts: 1 after the first list, +1 per reconnect to etcd.
  uint64_t snapshots() const;
  // Waits (bounded) until pred(Members()) holds; for tests and tools.
  bool WaitFor(const std::function<bool(const std::vector<ServerRecord>&)>& pred, int timeout_ms);

 private:
  MembershipView() = default;
  void ApplySnapshot(const RangeResult& r);
  void ApplyEvents(const std::vector<WatchEvent>& events);
  void Notify(const MembershipChange& c);  // Under mu_.

  std::string prefix_;
  mutable std::mutex mu_;  // Guards members_, listeners_; held while listeners run.
  std::condition_variable cv_;
  std::map<std::string, ServerRecord> members_;  // By key.
  std::map<uint64_t, Listener> listeners_;
  uint64_t next_listener_ = 1;
  bool have_snapshot_ = false;
  std::unique_ptr<EtcdWatch> watch_;  // Last: stopped first on destruction.
};

// Makes a remote PageStore follow a MembershipView: every member the store does not know yet
// is added (AddRemoteServer), and a member that leaves is removed (RemoveRemoteServer: a failure
// signal, its splits are regenerated). Failures to add are logged and retried on the next
// change. Destroy before the store and the view.
class StoreFollower {
 public:
  static Result<std::unique_ptr<StoreFollower>> Start(MembershipView* view,
                                                      client::RemotePageStore* store);
  ~StoreFollower();
  uint64_t joins() const { return joins_.load(); }
  uint64_t leaves() const { return leaves_.load(); }

 private:
  StoreFollower() = default;
  void OnChange(const MembershipChange& c);
  MembershipView* view_ = nullptr;
  client::RemotePageStore* store_ = nullptr;
  uint64_t listener_ = 0;
  std::atomic<uint64_t> joins_{0}, leaves_{0};
};

}  // namespace tessera::membership
