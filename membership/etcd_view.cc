// Registration, MembershipView and StoreFollower (see etcd_view.h).
#include "membership/etcd_view.h"

#include <chrono>
#include <cstring>
#include <random>

#include <nlohmann/json.hpp>

#include "common/logging.h"
#include "fabric/transport.h"

namespace tessera::membership {

using json = nlohmann::json;

std::string ServerRecord::ToJson() const {
  json j = {{"server_id", server_id}, {"endpoint", endpoint},   {"rack", rack},
            {"capacity", capacity},   {"slab_size", slab_size}, {"host", host},
            {"pid", pid},             {"start_time_ms", start_time_ms}, {"version", version}};
  return j.dump();
}

Result<ServerRecord> ServerRecord::FromJson(std::string_view text) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return InvalidArgument("server record is not a JSON object: ", std::string(text.substr(0, 100)));
  }
  ServerRecord r;
  try {
    r.server_id = j.value("server_id", std::string());
    r.endpoint = j.value("endpoint", std::string());
    r.rack = j.value("rack", std::string());
    r.capacity = j.value("capacity", uint64_t{0});
    r.slab_size = j.value("slab_size", uint64_t{0});
    r.host = j.value("host", std::string());
    r.pid = j.value("pid", int64_t{0});
    r.start_time_ms = j.value("start_time_ms", int64_t{0});
    r.version = j.value("version", std::string());
  } catch (const std::exception& e) {
    return InvalidArgument("server record: ", e.what());
  }
  if (r.endpoint.empty()) return InvalidArgument("server record without an endpoint");
  if (auto ep = fabric::ParseEndpoint(r.endpoint); !ep.ok()) {
    return InvalidArgument("server record: bad endpoint '", r.endpoint, "': ", ep.status().message());
  }
  return r;
}

Status ValidateClusterName(std::string_view name) {
  if (name.empty() || name.size() > 64) {
    return InvalidArgument("cluster name must be 1..64 characters (--cluster_name)");
  }
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) {
      return InvalidArgument("cluster name '", std::string(name),
                             "': only letters, digits, '.', '_' and '-' are allowed");
    }
  }
  return Status::Ok();
}

std::string ServersPrefix(std::string_view cluster_name) {
  return "/tessera/" + std::string(cluster_name) + "/servers/";
}

std::string NewServerId() {
  std::random_device rd;
  uint64_t v = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

Result<std::vector<ServerRecord>> ReadServers(const EtcdOptions& options,
                                              std::string_view cluster_name) {
  TESSERA_RETURN_IF_ERROR(ValidateClusterName(cluster_name));
  TESSERA_ASSIGN_OR_RETURN(auto client, EtcdClient::Create(options));
  TESSERA_ASSIGN_OR_RETURN(RangeResult r, client->GetPrefix(ServersPrefix(cluster_name)));
  std::vector<ServerRecord> out;
  for (const auto& kv : r.kvs) {
    auto rec = ServerRecord::FromJson(kv.value);
    if (!rec.ok()) {
      TLOG(WARNING) << "etcd: ignoring " << kv.key << ": " << rec.status();
      continue;
    }
    out.push_back(std::move(*rec));
  }
  return out;
}

Result<std::vector<client::RemoteServer>> ToRemoteServers(const std::vector<ServerRecord>& records) {
  std::vector<client::RemoteServer> out;
  for (const auto& r : records) {
    TESSERA_ASSIGN_OR_RETURN(fabric::Endpoint ep, fabric::ParseEndpoint(r.endpoint));
    out.push_back(client::RemoteServer{ep, r.rack});
  }
  if (out.empty()) return Unavailable("no memory server is registered in etcd");
  return out;
}

// ---- Registration ----

Result<std::unique_ptr<Registration>> Registration::Start(const EtcdOptions& options,
                                                          std::string cluster_name,
                                                          ServerRecord record, int64_t ttl_s) {
  TESSERA_RETURN_IF_ERROR(ValidateClusterName(cluster_name));
  if (ttl_s < 2 || ttl_s > 3600) return InvalidArgument("etcd lease TTL must be 2..3600 s");
  if (record.server_id.empty()) record.server_id = NewServerId();
  std::unique_ptr<Registration> r(new Registration());
  TESSERA_ASSIGN_OR_RETURN(r->client_, EtcdClient::Create(options));
  r->key_ = ServersPrefix(cluster_name) + record.server_id;
  r->value_ = record.ToJson();
  r->ttl_s_ = ttl_s;
  if (Status st = r->Register(); !st.ok()) {
    r->stopped_ = true;  // Nothing registered: nothing to undo.
    return st;
  }
  Registration* self = r.get();
  r->thread_ = std::thread([self] { self->KeepAliveLoop(); });
  return r;
}

Status Registration::Register() {
  TESSERA_ASSIGN_OR_RETURN(int64_t lease, client_->GrantLease(ttl_s_));
  Status st = client_->Put(key_, value_, lease);
  if (!st.ok()) {
    (void)client_->RevokeLease(lease);
    return st;
  }
  lease_.store(lease);
  return Status::Ok();
}

void Registration::KeepAliveLoop() {
  const auto period = std::chrono::milliseconds(std::max<int64_t>(300, ttl_s_ * 1000 / 3));
  uint64_t failures = 0;
  std::unique_lock<std::mutex> lock(mu_);
  while (!cv_.wait_for(lock, period, [this] { return stop_; })) {
    lock.unlock();
    auto ttl = client_->KeepAlive(lease_.load());
    Status st = ttl.ok() ? Status::Ok() : ttl.status();
    if (st.code() == StatusCode::kNotFound) {
      // The lease expired (etcd was unreachable for longer than the TTL): register again.
      TLOG(WARNING) << "etcd: lease of " << key_ << " expired; registering again";
      st = Register();
      if (st.ok()) reregistrations_.fetch_add(1);
    }
    if (!st.ok()) {
      ++failures;
      if ((failures & (failures - 1)) == 0) {
        TLOG(WARNING) << "etcd: keeping " << key_ << " registered: " << st << " (" << failures
                      << " failures; retrying)";
      }
    } else if (failures > 0) {
      TLOG(INFO) << "etcd: " << key_ << " registered again after " << failures << " failures";
      failures = 0;
    }
    lock.lock();
  }
}

Status Registration::Stop() {
  if (stopped_) return Status::Ok();
  stopped_ = true;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  auto d = client_->Delete(key_);
  Status revoke = client_->RevokeLease(lease_.load());
  if (!d.ok()) return d.status();
  if (!revoke.ok() && revoke.code() != StatusCode::kNotFound) return revoke;
  return Status::Ok();
}

Registration::~Registration() {
  Status st = Stop();
  if (!st.ok()) TLOG(WARNING) << "etcd: deregistering " << key_ << ": " << st;
}

// ---- MembershipView ----

Result<std::unique_ptr<MembershipView>> MembershipView::Start(const EtcdOptions& options,
                                                              std::string cluster_name,
                                                              uint32_t first_snapshot_ms) {
  TESSERA_RETURN_IF_ERROR(ValidateClusterName(cluster_name));
  std::unique_ptr<MembershipView> v(new MembershipView());
  v->prefix_ = ServersPrefix(cluster_name);
  MembershipView* self = v.get();
  auto last_error = std::make_shared<std::pair<std::mutex, Status>>();
  EtcdWatch::Callbacks cb;
  cb.on_snapshot = [self](const RangeResult& r) { self->ApplySnapshot(r); };
  cb.on_events = [self](const std::vector<WatchEvent>& e) { self->ApplyEvents(e); };
  cb.on_error = [last_error](const Status& st) {
    std::lock_guard<std::mutex> l(last_error->first);
    last_error->second = st;
  };
  TESSERA_ASSIGN_OR_RETURN(v->watch_, EtcdWatch::Start(options, v->prefix_, std::move(cb)));
  std::unique_lock<std::mutex> lock(v->mu_);
  if (!v->cv_.wait_for(lock, std::chrono::milliseconds(first_snapshot_ms),
                       [&] { return v->have_snapshot_; })) {
    lock.unlock();
    v->watch_.reset();
    std::lock_guard<std::mutex> l(last_error->first);
    return Unavailable("cannot read the membership from etcd within ", first_snapshot_ms,
                       " ms: ", last_error->second.ok() ? "no answer" : last_error->second.ToString());
  }
  return v;
}

MembershipView::~MembershipView() { watch_.reset(); }

std::vector<ServerRecord> MembershipView::Members() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<ServerRecord> out;
  for (const auto& [k, r] : members_) out.push_back(r);
  return out;
}

uint64_t MembershipView::snapshots() const { return watch_ ? watch_->snapshots() : 0; }

uint64_t MembershipView::Subscribe(Listener listener) {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t id = next_listener_++;
  listeners_[id] = std::move(listener);
  return id;
}

void MembershipView::Unsubscribe(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  listeners_.erase(id);
}

bool MembershipView::WaitFor(const std::function<bool(const std::vector<ServerRecord>&)>& pred,
                             int timeout_ms) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] {
    std::vector<ServerRecord> now;
    for (const auto& [k, r] : members_) now.push_back(r);
    return pred(now);
  });
}

void MembershipView::Notify(const MembershipChange& c) {
  for (auto& [id, l] : listeners_) l(c);
}

void MembershipView::ApplySnapshot(const RangeResult& r) {
  std::map<std::string, ServerRecord> next;
  for (const auto& kv : r.kvs) {
    auto rec = ServerRecord::FromJson(kv.value);
    if (!rec.ok()) {
      TLOG(WARNING) << "etcd: ignoring " << kv.key << ": " << rec.status();
      continue;
    }
    next[kv.key] = std::move(*rec);
  }
  std::lock_guard<std::mutex> lock(mu_);
  // What changed while the watch was away (or since the start) as leaves, then joins.
  for (const auto& [k, old] : members_) {
    auto it = next.find(k);
    if (it == next.end() || it->second.endpoint != old.endpoint) {
      Notify({MembershipChange::Kind::kLeft, old, "its etcd registration is gone"});
    }
  }
  for (const auto& [k, rec] : next) {
    auto it = members_.find(k);
    if (it == members_.end() || it->second.endpoint != rec.endpoint) {
      Notify({MembershipChange::Kind::kJoined, rec, ""});
    }
  }
  members_ = std::move(next);
  have_snapshot_ = true;
  cv_.notify_all();
}

void MembershipView::ApplyEvents(const std::vector<WatchEvent>& events) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& e : events) {
    auto it = members_.find(e.kv.key);
    if (e.type == WatchEvent::Type::kDelete) {
      if (it == members_.end()) continue;
      ServerRecord old = it->second;
      members_.erase(it);
      Notify({MembershipChange::Kind::kLeft, old,
              "its etcd registration was deleted (shut down, or its lease expired)"});
      continue;
    }
    auto rec = ServerRecord::FromJson(e.kv.value);
    if (!rec.ok()) {
      TLOG(WARNING) << "etcd: ignoring " << e.kv.key << ": " << rec.status();
      continue;
    }
    if (it != members_.end()) {
      if (it->second.endpoint == rec->endpoint) {
        it->second = *rec;  // Same member, new details.
        continue;
      }
      ServerRecord old = it->second;
      members_.erase(it);
      Notify({MembershipChange::Kind::kLeft, old, "its etcd registration changed endpoint"});
    }
    members_[e.kv.key] = *rec;
    Notify({MembershipChange::Kind::kJoined, *rec, ""});
  }
  cv_.notify_all();
}

// ---- StoreFollower ----

Result<std::unique_ptr<StoreFollower>> StoreFollower::Start(MembershipView* view,
                                                            client::RemotePageStore* store) {
  if (view == nullptr || store == nullptr) return InvalidArgument("StoreFollower: null argument");
  std::unique_ptr<StoreFollower> f(new StoreFollower());
  f->view_ = view;
  f->store_ = store;
  StoreFollower* self = f.get();
  f->listener_ = view->Subscribe([self](const MembershipChange& c) { self->OnChange(c); });
  // Catch up with changes between the store's start and the subscription: members the store
  // does not have are added; live store servers no member names are removed.
  const auto members = view->Members();
  for (const auto& m : members) f->OnChange({MembershipChange::Kind::kJoined, m, ""});
  auto servers = client::RemoteServersOf(*store);
  auto failed = client::RemoteServersFailed(*store);
  if (servers.ok() && failed.ok()) {
    for (size_t i = 0; i < servers->size() && i < failed->size(); ++i) {
      if ((*failed)[i]) continue;
      const std::string ep = (*servers)[i].endpoint.ToString();
      bool named = false;
      for (const auto& m : members) named |= m.endpoint == ep;
      if (!named) {
        ServerRecord gone;
        gone.endpoint = ep;
        f->OnChange({MembershipChange::Kind::kLeft, gone, "not registered in etcd"});
      }
    }
  }
  return f;
}

StoreFollower::~StoreFollower() {
  if (view_ != nullptr) view_->Unsubscribe(listener_);
}

void StoreFollower::OnChange(const MembershipChange& c) {
  auto ep = fabric::ParseEndpoint(c.server.endpoint);
  if (!ep.ok()) return;
  if (c.kind == MembershipChange::Kind::kJoined) {
    Status st = client::AddRemoteServer(*store_, client::RemoteServer{*ep, c.server.rack});
    if (st.ok()) {
      joins_.fetch_add(1);
    } else {
      TLOG(WARNING) << store_->name() << ": cannot use new server " << c.server.endpoint << ": "
                    << st;
    }
    return;
  }
  Status st = client::RemoveRemoteServer(*store_, *ep, "etcd: " + c.why);
  if (st.ok()) leaves_.fetch_add(1);
}

}  // namespace tessera::membership
