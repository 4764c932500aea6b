#include "apps/kayak/client/client.h"

#include <algorithm>
#include <cstring>
#include <future>
#include <random>

#include "common/clock.h"
#include "common/logging.h"
#include "apps/kayak/wire/builtins.h"
#include "apps/kayak/wire/key_hash.h"
#include "apps/kayak/wire/wire.h"

namespace kayak {

namespace fab = tessera::fabric;
namespace bi = tessera::kayak::builtins;
namespace kw = tessera::kayak::wire;
using tessera::Result;
using tessera::Status;
using tessera::StatusCode;

namespace {

constexpr uint64_t kShardSeed = 0x6b61796b5348ull;

using kw::Payload;

Status CheckKey(std::span<const uint8_t> key) {
  if (key.empty() || key.size() > kw::kMaxKeyLength) {
    return tessera::InvalidArgument("key length ", key.size(), " outside 1..", kw::kMaxKeyLength);
  }
  return Status::Ok();
}

template <typename T>
Result<T> Wait(std::function<void(std::function<void(Result<T>)>)> start) {
  auto p = std::make_shared<std::promise<Result<T>>>();
  auto f = p->get_future();
  start([p](Result<T> r) { p->set_value(std::move(r)); });
  return f.get();
}

}  // namespace

Result<std::vector<uint8_t>> BuiltinRoutingKey(uint32_t function, std::span<const uint8_t> args) {
  if (function == bi::kMultiGetAggregate) {
    TESSERA_ASSIGN_OR_RETURN(bi::AggregateArgs a, bi::AggregateArgs::Decode(args));
    return bi::KeyBytes(a.keys[0]);
  }
  if (!bi::IsBuiltin(function)) {
    return tessera::InvalidArgument("function ", function,
                                    " is not built in: name its routing key (InvokeOn)");
  }
  TESSERA_ASSIGN_OR_RETURN(bi::ChaseArgs a, bi::ChaseArgs::Decode(function, args));
  return bi::KeyBytes(a.start);
}

Client::Client(ClientOptions options) : options_(std::move(options)) {}
Client::~Client() {
  // Every reader stops before any connection goes away: a reader's open SendBatch may hold
  // another connection of this client.
  for (auto& c : conns_) c->Close();
  for (auto& c : conns_) c->JoinReader();
}

Result<std::unique_ptr<Client>> Client::Connect(ClientOptions options) {
  if (options.servers.empty()) return tessera::InvalidArgument("no memservers given");
  if (options.table == 0) return tessera::InvalidArgument("table id must be non-zero");
  if (options.replicas == 0 || options.replicas > options.servers.size()) {
    return tessera::InvalidArgument("replicas must be in 1..", options.servers.size(), " (servers)");
  }
  if (options.secret.empty()) return tessera::InvalidArgument("empty secret");
  if (options.request_timeout_ms <= 0) {
    return tessera::InvalidArgument("request_timeout_ms must be positive, got ", options.request_timeout_ms);
  }
  if (options.client_id == 0) {
    std::random_device rd;
    options.client_id = (uint64_t{rd()} << 32 | rd()) | 1;
  }
  std::unique_ptr<Client> c(new Client(std::move(options)));
  for (const auto& ep : c->options_.servers) {
    auto conn = Connection::Open(ep, c->options_.secret, c->options_.client_id,
                                 tessera::Deadline::AfterMs(c->options_.connect_timeout_ms),
                                 c->options_.request_timeout_ms);
    if (!conn.ok()) {
      if (!c->options_.tolerate_unreachable) {
        return Status(conn.status().code(),
                      "memserver " + ep.ToString() + ": " + conn.status().message());
      }
      TLOG(WARNING) << "kayak: memserver " << ep.ToString() << " unreachable ("
                    << conn.status().ToString() << "); counted as failed";
      c->conns_.push_back(Connection::Dead(ep, conn.status()));
      continue;
    }
    c->conns_.push_back(std::move(*conn));
  }
  size_t up = 0;
  for (auto& conn : c->conns_) up += conn->up();
  if (up == 0) return tessera::Unavailable("no memserver of the cluster is reachable");
  if (c->options_.measure_rtt) TESSERA_RETURN_IF_ERROR(c->MeasureRtt());
  ControllerOptions co = c->options_.controller;
  if (co.slo_ns == 0) {
    const uint64_t rtt = c->rtt_ns_ > 0 ? c->rtt_ns_ : 100'000;
    co.slo_ns = static_cast<uint64_t>(co.slo_rtt_multiple * static_cast<double>(rtt));
  }
  c->options_.controller = co;
  c->controller_ = std::make_unique<Controller>(co, tessera::MonotonicNs());
  return c;
}

Status Client::MeasureRtt() {
  // GETs of a key nobody writes (NotFound replies), one at a time; the median.
  static const uint8_t kProbe[] = "kayak-rtt-probe";
  std::vector<uint64_t> samples;
  for (size_t i = 0; i < 64; ++i) {
    size_t server = i % conns_.size();
    for (size_t j = 0; j < conns_.size() && !conns_[server]->up(); ++j) {
      server = (server + 1) % conns_.size();
    }
    const uint64_t t0 = tessera::MonotonicNs();
    auto r = Wait<Reply>([&](std::function<void(Result<Reply>)> cb) {
      SendTo(server, kw::kKvGet,
             Payload(kw::KvKeyRequest{options_.table, sizeof(kProbe) - 1},
                     std::span<const uint8_t>(kProbe, sizeof(kProbe) - 1)),
             std::move(cb));
    });
    if (!r.ok() && r.status().code() != StatusCode::kNotFound) return r.status();
    samples.push_back(tessera::MonotonicNs() - t0);
  }
  std::sort(samples.begin(), samples.end());
  rtt_ns_ = samples[samples.size() / 2];
  return Status::Ok();
}

size_t Client::PrimaryOf(Key key) const {
  return kw::KvKeyHash(key, kShardSeed) % conns_.size();
}

std::vector<size_t> Client::ReplicasOf(Key key) const {
  std::vector<size_t> out;
  const size_t p = PrimaryOf(key);
  for (uint32_t i = 0; i < options_.replicas; ++i) out.push_back((p + i) % conns_.size());
  return out;
}

std::vector<uint64_t> Client::KeysOn(size_t server, size_t n, uint64_t from) const {
  std::vector<uint64_t> out;
  for (uint64_t k = from; out.size() < n; ++k) {
    if (PrimaryOf(bi::KeyBytes(k)) == server) out.push_back(k);
  }
  return out;
}

void Client::DropServer(size_t i) { conns_.at(i)->Close(); }

void Client::SendTo(size_t server, fab::Op op, std::vector<uint8_t> payload, ReplyCallback cb) {
  conns_[server]->Send(op, payload, std::move(cb));
}

void Client::SendToReplica(Key key, fab::Op op, std::vector<uint8_t> payload, ReplyCallback cb,
                           uint32_t skip) {
  if (options_.replicas == 1) {
    // No replica to fail over to: straight to the one server (the hot path of every GET and
    // RPC; no copies of the key or the payload kept for a retry).
    conns_[PrimaryOf(key)]->Send(op, payload, std::move(cb));
    return;
  }
  std::vector<size_t> replicas = ReplicasOf(key);
  for (uint32_t i = skip; i < replicas.size(); ++i) {
    Connection* c = conns_[replicas[i]].get();
    if (!c->up() && i + 1 < replicas.size()) continue;
    std::vector<uint8_t> k(key.begin(), key.end());
    const bool more = i + 1 < replicas.size();
    auto again = more ? payload : std::vector<uint8_t>();
    c->Send(op, payload,
            [this, k = std::move(k), op, again = std::move(again), cb = std::move(cb), i,
             more](Result<Reply> r) mutable {
              if (!r.ok() && r.status().code() == StatusCode::kUnavailable && more) {
                return SendToReplica(k, op, std::move(again), std::move(cb), i + 1);
              }
              cb(std::move(r));
            });
    return;
  }
  cb(tessera::Unavailable("no replica of the key is up"));
}

void Client::GetVersioned(Key key, std::function<void(Result<Value>)> cb) {
  if (Status s = CheckKey(key); !s.ok()) return cb(s);
  SendToReplica(key, kw::kKvGet,
                Payload(kw::KvKeyRequest{options_.table, static_cast<uint16_t>(key.size())}, key),
                [cb = std::move(cb)](Result<Reply> r) {
                  if (!r.ok()) return cb(r.status());
                  std::span<const uint8_t> p = r->payload;
                  auto h = kw::KvValueHeader::Decode(p.first(kw::KvValueHeader::kWireSize));
                  if (!h.ok()) return cb(h.status());
                  // The value is the payload after its header: reuse the reply's buffer.
                  std::vector<uint8_t> bytes = std::move(r->payload);
                  bytes.erase(bytes.begin(), bytes.begin() + kw::KvValueHeader::kWireSize);
                  cb(Value{h->version, std::move(bytes)});
                });
}

void Client::Get(Key key, std::function<void(Result<Value>)> cb) { GetVersioned(key, std::move(cb)); }

namespace {
// Collects the replies of one write sent to several replicas.
struct Fanout {
  std::mutex mu;
  size_t remaining = 0;
  size_t ok = 0;
  uint64_t version = 0;
  size_t version_rank = ~size_t{0};
  Status hard_error;     // A replica refused (not just down).
  Status unavailable;    // A replica was down.
};
}  // namespace

void Client::Put(Key key, std::span<const uint8_t> value, std::function<void(Result<uint64_t>)> cb) {
  if (Status s = CheckKey(key); !s.ok()) return cb(s);
  if (value.size() > kw::kMaxValueLength) {
    return cb(tessera::InvalidArgument("value of ", value.size(), " bytes exceeds ",
                                       kw::kMaxValueLength));
  }
  kw::KvPutRequest req;
  req.table = options_.table;
  req.key_len = static_cast<uint16_t>(key.size());
  req.value_len = static_cast<uint32_t>(value.size());
  std::vector<uint8_t> payload = Payload(req, key, value);
  std::vector<size_t> replicas = ReplicasOf(key);
  auto f = std::make_shared<Fanout>();
  auto shared_cb = std::make_shared<std::function<void(Result<uint64_t>)>>(std::move(cb));
  f->remaining = replicas.size();
  for (size_t rank = 0; rank < replicas.size(); ++rank) {
    conns_[replicas[rank]]->Send(kw::kKvPut, payload, [f, shared_cb, rank](Result<Reply> r) {
      Result<uint64_t> out = uint64_t{0};
      {
        std::lock_guard<std::mutex> lock(f->mu);
        if (r.ok()) {
          auto w = kw::KvWriteResponse::Decode(r->payload);
          if (!w.ok()) {
            f->hard_error = w.status();
          } else {
            ++f->ok;
            if (rank < f->version_rank) {
              f->version = w->version;
              f->version_rank = rank;
            }
          }
        } else if (r.status().code() == StatusCode::kUnavailable) {
          f->unavailable = r.status();
        } else {
          f->hard_error = r.status();
        }
        if (--f->remaining > 0) return;
        if (!f->hard_error.ok()) {
          out = f->hard_error;
        } else if (f->ok == 0) {
          out = f->unavailable;
        } else {
          out = f->version;
        }
      }
      (*shared_cb)(std::move(out));
    });
  }
}

void Client::Delete(Key key, std::function<void(Status)> cb) {
  if (Status s = CheckKey(key); !s.ok()) return cb(s);
  std::vector<uint8_t> payload =
      Payload(kw::KvDeleteRequest{options_.table, static_cast<uint16_t>(key.size())}, key);
  std::vector<size_t> replicas = ReplicasOf(key);
  auto f = std::make_shared<Fanout>();
  auto shared_cb = std::make_shared<std::function<void(Status)>>(std::move(cb));
  f->remaining = replicas.size();
  for (size_t rank = 0; rank < replicas.size(); ++rank) {
    conns_[replicas[rank]]->Send(kw::kKvDelete, payload, [f, shared_cb](Result<Reply> r) {
      Status out;
      {
        std::lock_guard<std::mutex> lock(f->mu);
        if (r.ok()) {
          ++f->ok;
        } else if (r.status().code() == StatusCode::kUnavailable) {
          f->unavailable = r.status();
        } else if (f->hard_error.ok()) {
          f->hard_error = r.status();  // NotFound, ...
        }
        if (--f->remaining > 0) return;
        if (f->ok == 0) out = !f->hard_error.ok() ? f->hard_error : f->unavailable;
      }
      (*shared_cb)(out);
    });
  }
}

void Client::MultiGet(std::vector<std::vector<uint8_t>> keys,
                      std::function<void(Result<std::vector<Value>>)> cb) {
  if (keys.empty()) return cb(std::vector<Value>());
  for (const auto& k : keys) {
    if (Status s = CheckKey(k); !s.ok()) return cb(s);
  }
  // One MULTIGET per (server, up to 32 keys), to the first replica that is up.
  struct Gather {
    std::mutex mu;
    std::vector<Value> values;
    size_t remaining = 0;
    Status error;
    std::function<void(Result<std::vector<Value>>)> cb;
  };
  auto g = std::make_shared<Gather>();
  g->values.resize(keys.size());
  g->cb = std::move(cb);
  std::vector<std::vector<size_t>> by_server(conns_.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    size_t target = PrimaryOf(keys[i]);
    for (size_t r : ReplicasOf(keys[i])) {
      if (conns_[r]->up()) {
        target = r;
        break;
      }
    }
    by_server[target].push_back(i);
  }
  std::vector<std::pair<size_t, std::vector<size_t>>> batches;
  for (size_t s = 0; s < by_server.size(); ++s) {
    for (size_t off = 0; off < by_server[s].size(); off += kw::kMaxMultiGetKeys) {
      size_t end = std::min(by_server[s].size(), off + kw::kMaxMultiGetKeys);
      batches.emplace_back(s, std::vector<size_t>(by_server[s].begin() + off, by_server[s].begin() + end));
    }
  }
  g->remaining = batches.size();
  for (auto& [server, idx] : batches) {
    std::vector<uint8_t> data;
    for (size_t i : idx) kw::AppendKvKey(data, keys[i]);
    auto payload = Payload(kw::KvMultiGetRequest{options_.table, static_cast<uint16_t>(idx.size())}, data);
    SendTo(server, kw::kKvMultiGet, std::move(payload), [g, idx](Result<Reply> r) {
      std::function<void(Result<std::vector<Value>>)> done;
      Result<std::vector<Value>> out = std::vector<Value>();
      {
        std::lock_guard<std::mutex> lock(g->mu);
        if (!r.ok()) {
          g->error = r.status();
        } else {
          auto vals = kw::ParseKvMultiGetResponse(r->payload, idx.size());
          if (!vals.ok()) {
            g->error = vals.status();
          } else {
            for (size_t j = 0; j < idx.size(); ++j) {
              g->values[idx[j]] = Value{(*vals)[j].version,
                                        std::vector<uint8_t>((*vals)[j].value.begin(),
                                                             (*vals)[j].value.end())};
            }
          }
        }
        if (--g->remaining > 0) return;
        if (!g->error.ok()) {
          out = g->error;
        } else {
          out = std::move(g->values);
        }
        done = std::move(g->cb);
      }
      done(std::move(out));
    });
  }
}

void Client::CommitKv(std::vector<std::pair<std::vector<uint8_t>, uint64_t>> reads,
                      std::vector<std::pair<std::vector<uint8_t>, std::vector<uint8_t>>> writes,
                      std::function<void(Result<bool>)> cb) {
  std::vector<uint8_t> items;
  for (auto& [k, v] : reads) kw::AppendKvCommitRead(items, k, v);
  for (auto& [k, v] : writes) kw::AppendKvCommitWrite(items, k, v, false);
  auto payload = Payload(kw::KvCommitRequest{options_.table, static_cast<uint16_t>(reads.size()),
                                              static_cast<uint16_t>(writes.size())},
                         items);
  std::vector<uint8_t> home = writes.front().first;
  SendToReplica(home, kw::kKvCommit, std::move(payload),
                [this, writes = std::move(writes), cb = std::move(cb)](Result<Reply> r) mutable {
                  if (!r.ok()) return cb(r.status());
                  auto w = kw::KvWriteResponse::Decode(r->payload);
                  if (!w.ok()) return cb(w.status());
                  if (w->outcome == kw::KvOutcome::kConflict) return cb(false);
                  if (options_.replicas == 1) return cb(true);
                  // Replication: the committed values to every other replica that is up.
                  struct Pending {
                    std::mutex mu;
                    size_t remaining = 0;
                    Status error;
                  };
                  auto p = std::make_shared<Pending>();
                  auto shared_cb = std::make_shared<std::function<void(Result<bool>)>>(std::move(cb));
                  std::vector<std::pair<size_t, std::vector<uint8_t>>> sends;
                  for (auto& [k, v] : writes) {
                    std::vector<size_t> reps = ReplicasOf(k);
                    bool first_up_skipped = false;
                    for (size_t rep : reps) {
                      if (!conns_[rep]->up()) continue;
                      if (!first_up_skipped) {  // The one that committed.
                        first_up_skipped = true;
                        continue;
                      }
                      kw::KvPutRequest req;
                      req.table = options_.table;
                      req.key_len = static_cast<uint16_t>(k.size());
                      req.value_len = static_cast<uint32_t>(v.size());
                      sends.emplace_back(rep, Payload(req, k, v));
                    }
                  }
                  if (sends.empty()) return (*shared_cb)(true);
                  p->remaining = sends.size();
                  for (auto& [rep, payload] : sends) {
                    SendTo(rep, kw::kKvPut, std::move(payload), [p, shared_cb](Result<Reply> r) {
                      {
                        std::lock_guard<std::mutex> lock(p->mu);
                        if (!r.ok() && r.status().code() != StatusCode::kUnavailable) p->error = r.status();
                        if (--p->remaining > 0) return;
                      }
                      if (!p->error.ok()) return (*shared_cb)(p->error);
                      (*shared_cb)(true);
                    });
                  }
                });
}

namespace {

// The KV way of a chase-family function: GETs hop by hop, then the computation on the client;
// for chase_increment a KV_COMMIT with every version read, rerun on conflict.
struct ChaseKv : std::enable_shared_from_this<ChaseKv> {
  Client* client;
  uint32_t function;
  bi::ChaseArgs args;
  std::function<void(Result<InvokeResult>)> done;
  uint32_t attempts = 0;
  uint32_t hop = 0;
  uint64_t key = 0, last = 0, digest = bi::kDigestSeed;
  std::vector<uint8_t> last_value;
  std::vector<std::pair<std::vector<uint8_t>, uint64_t>> reads;

  void Start() {
    ++attempts;
    hop = 0;
    key = args.start;
    last = key;
    digest = bi::kDigestSeed;
    reads.clear();
    Step();
  }
  void Step() {
    if (hop == args.hops) return Finish();
    auto self = shared_from_this();
    uint8_t key_bytes[8];  // GetVersioned copies the key into its request.
    bi::StoreLe64(key_bytes, key);
    client->GetVersioned(key_bytes, [self](Result<Value> r) {
      if (!r.ok()) {
        if (r.status().code() == StatusCode::kNotFound) {
          return self->done(tessera::NotFound(bi::Name(self->function), ": chain broken at hop ",
                                              self->hop, ": key ", self->key, " is absent"));
        }
        return self->done(r.status());
      }
      // Only a read-write function commits with the versions it read.
      if (bi::IsReadWrite(self->function)) self->reads.emplace_back(bi::KeyBytes(self->key), r->version);
      self->digest = bi::Fold(self->digest, r->bytes);
      self->last = self->key;
      if (self->hop + 1 < self->args.hops) {
        auto next = bi::NextKey(self->key, r->bytes);
        if (!next.ok()) return self->done(next.status());
        self->key = *next;
      }
      self->last_value = std::move(r->bytes);
      ++self->hop;
      self->Step();
    });
  }
  void Finish() {
    InvokeResult out;
    out.attempts = attempts;
    if (function == bi::kChaseIncrement) {
      uint64_t counter = 0;
      auto updated = bi::Incremented(last, last_value, &counter);
      if (!updated.ok()) return done(updated.status());
      auto self = shared_from_this();
      std::vector<std::pair<std::vector<uint8_t>, std::vector<uint8_t>>> writes;
      writes.emplace_back(bi::KeyBytes(last), std::move(*updated));
      client->CommitKv(reads, std::move(writes), [self, counter](Result<bool> r) {
        if (!r.ok()) return self->done(r.status());
        if (!*r) {
          self->client->n_conflicts_.fetch_add(1, std::memory_order_relaxed);
          if (self->attempts >= self->client->options().max_attempts) {
            return self->done(tessera::Unavailable(bi::Name(self->function), ": gave up after ",
                                                   self->attempts, " conflicting attempts"));
          }
          return self->Start();
        }
        InvokeResult out;
        out.attempts = self->attempts;
        out.result = bi::ChaseResult{self->last, counter}.Encode();
        self->done(std::move(out));
      });
      return;
    }
    if (function == bi::kChaseCompute) digest = bi::Compute(digest, args.compute_iters);
    out.result = bi::ChaseResult{last, digest}.Encode();
    done(std::move(out));
  }
};

}  // namespace

void Client::RunKvWay(uint32_t function, std::vector<uint8_t> args,
                      std::function<void(Result<InvokeResult>)> cb) {
  n_kv_.fetch_add(1, std::memory_order_relaxed);
  if (function == bi::kMultiGetAggregate) {
    auto a = bi::AggregateArgs::Decode(args);
    if (!a.ok()) return cb(a.status());
    std::vector<std::vector<uint8_t>> keys;
    for (uint64_t k : a->keys) keys.push_back(bi::KeyBytes(k));
    MultiGet(std::move(keys), [cb = std::move(cb)](Result<std::vector<Value>> r) {
      if (!r.ok()) return cb(r.status());
      bi::ChaseResult res{0, bi::kDigestSeed};
      for (const Value& v : *r) {
        if (v.version == 0) continue;
        ++res.last_key;
        res.value = bi::Fold(res.value, v.bytes);
      }
      InvokeResult out;
      out.result = res.Encode();
      cb(std::move(out));
    });
    return;
  }
  auto a = bi::ChaseArgs::Decode(function, args);
  if (!a.ok()) return cb(a.status());
  auto op = std::make_shared<ChaseKv>();
  op->client = this;
  op->function = function;
  op->args = *a;
  op->done = std::move(cb);
  op->Start();
}

void Client::Finish(uint64_t start_ns, Result<InvokeResult> r,
                    const std::function<void(Result<InvokeResult>)>& cb) {
  const uint64_t now = tessera::MonotonicNs();
  if (r.ok()) {
    r->latency_ns = now - start_ns;
    std::lock_guard<std::mutex> lock(ctl_mu_);
    controller_->OnComplete(now - start_ns, now);
  }
  cb(std::move(r));
}

void Client::Invoke(uint32_t function, std::span<const uint8_t> args,
                    std::function<void(Result<InvokeResult>)> cb) {
  auto key = BuiltinRoutingKey(function, args);
  if (!key.ok()) return cb(key.status());
  InvokeOn(*key, function, args, std::move(cb));
}

void Client::InvokeOn(Key routing_key, uint32_t function, std::span<const uint8_t> args,
                      std::function<void(Result<InvokeResult>)> cb) {
  if (Status s = CheckKey(routing_key); !s.ok()) return cb(s);
  if (function == 0) return cb(tessera::InvalidArgument("function id must be non-zero"));
  if (args.size() + kw::KvInvokeRequest::kWireSize > fab::kMaxDataLength) {
    return cb(tessera::InvalidArgument("arguments of ", args.size(), " bytes are too large"));
  }
  const uint64_t start = tessera::MonotonicNs();
  const Mode mode = options_.controller.mode;
  bool rpc;
  if (!bi::IsBuiltin(function)) {
    rpc = true;  // Only the server has an operator's function.
  } else if (bi::IsReadWrite(function) && options_.replicas > 1) {
    rpc = false;  // Replicas are kept equal by committing the KV way.
  } else if (mode == Mode::kKv) {
    rpc = false;
  } else if (mode == Mode::kRpc || mode == Mode::kPushback) {
    rpc = true;
  } else {
    std::lock_guard<std::mutex> lock(ctl_mu_);
    rpc = controller_->NextIsRpc();
  }
  auto shared_cb = std::make_shared<std::function<void(Result<InvokeResult>)>>(std::move(cb));
  if (!rpc) {
    return RunKvWay(function, std::vector<uint8_t>(args.begin(), args.end()),
                    [this, start, shared_cb](Result<InvokeResult> r) { Finish(start, std::move(r), *shared_cb); });
  }
  n_rpc_.fetch_add(1, std::memory_order_relaxed);
  kw::KvInvokeRequest req;
  req.table = options_.table;
  req.function_id = function;
  const bool may_push_back = mode == Mode::kPushback && bi::IsBuiltin(function);
  req.flags = may_push_back ? 0 : kw::KvInvokeRequest::kNoPushback;
  std::vector<uint8_t> arg_copy(args.begin(), args.end());
  SendToReplica(
      routing_key, kw::kKvInvoke, Payload(req, args),
      [this, start, shared_cb, function, arg_copy = std::move(arg_copy)](Result<Reply> r) mutable {
        if (!r.ok()) {
          if (r.status().code() == StatusCode::kNotFound && bi::IsBuiltin(function) &&
              function != bi::kMultiGetAggregate) {
            return Finish(start,
                          Status(StatusCode::kNotFound,
                                 r.status().message() +
                                     " (an RPC sees only the shard of the server it runs on: "
                                     "the keys of a chain must live on one server)"),
                          *shared_cb);
          }
          return Finish(start, r.status(), *shared_cb);
        }
        std::span<const uint8_t> p = r->payload;
        auto resp = kw::KvInvokeResponse::Decode(p.first(kw::KvInvokeResponse::kWireSize));
        if (!resp.ok()) return Finish(start, resp.status(), *shared_cb);
        if (resp->outcome == kw::KvOutcome::kPushedBack) {
          n_pushed_back_.fetch_add(1, std::memory_order_relaxed);
          return RunKvWay(function, std::move(arg_copy),
                          [this, start, shared_cb](Result<InvokeResult> kv) {
                            if (kv.ok()) kv->pushed_back = true;
                            Finish(start, std::move(kv), *shared_cb);
                          });
        }
        InvokeResult out;
        out.rpc = true;
        out.attempts = resp->attempts;
        auto data = p.subspan(kw::KvInvokeResponse::kWireSize);
        out.result.assign(data.begin(), data.end());
        Finish(start, std::move(out), *shared_cb);
      });
}

// ---- blocking forms ----

Result<Value> Client::Get(Key key) {
  return Wait<Value>([&](std::function<void(Result<Value>)> cb) { Get(key, std::move(cb)); });
}
Result<std::vector<Value>> Client::MultiGet(std::vector<std::vector<uint8_t>> keys) {
  return Wait<std::vector<Value>>([&](std::function<void(Result<std::vector<Value>>)> cb) {
    MultiGet(std::move(keys), std::move(cb));
  });
}
Result<uint64_t> Client::Put(Key key, std::span<const uint8_t> value) {
  return Wait<uint64_t>([&](std::function<void(Result<uint64_t>)> cb) { Put(key, value, std::move(cb)); });
}
Status Client::Delete(Key key) {
  auto r = Wait<bool>([&](std::function<void(Result<bool>)> cb) {
    Delete(key, [cb](Status s) {
      if (!s.ok()) return cb(s);
      cb(true);
    });
  });
  return r.status();
}
Result<InvokeResult> Client::Invoke(uint32_t function, std::span<const uint8_t> args) {
  return Wait<InvokeResult>(
      [&](std::function<void(Result<InvokeResult>)> cb) { Invoke(function, args, std::move(cb)); });
}
Result<InvokeResult> Client::InvokeOn(Key routing_key, uint32_t function,
                                      std::span<const uint8_t> args) {
  return Wait<InvokeResult>([&](std::function<void(Result<InvokeResult>)> cb) {
    InvokeOn(routing_key, function, args, std::move(cb));
  });
}

uint32_t Client::window() {
  std::lock_guard<std::mutex> lock(ctl_mu_);
  controller_->Tick(tessera::MonotonicNs());
  return controller_->window();
}
double Client::x() {
  std::lock_guard<std::mutex> lock(ctl_mu_);
  return controller_->x();
}
uint64_t Client::last_p99_ns() {
  std::lock_guard<std::mutex> lock(ctl_mu_);
  return controller_->last_p99_ns();
}
uint64_t Client::slo_ns() {
  std::lock_guard<std::mutex> lock(ctl_mu_);
  return controller_->slo_ns();
}
Client::SendStats Client::send_stats() const {
  SendStats s;
  for (const auto& c : conns_) {
    s.frames += c->frames_sent();
    s.send_calls += c->send_calls();
  }
  return s;
}
Client::Counters Client::counters() const {
  return {n_rpc_.load(), n_kv_.load(), n_pushed_back_.load(), n_conflicts_.load()};
}

}  // namespace kayak
