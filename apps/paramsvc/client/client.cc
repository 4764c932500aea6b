#include "apps/paramsvc/client/client.h"

#include <sys/socket.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <thread>

#include "apps/paramsvc/io.h"
#include "common/clock.h"
#include "fabric/auth.h"
#include "fabric/transport.h"

namespace tessera::paramsvc {
namespace {

Status ReplyError(const Header& h, const std::vector<uint8_t>& payload) {
  std::string msg(payload.begin(), payload.end());
  const int code = h.status;
  // A move this call does not follow: like a lost connection, a reconnect joins it again.
  if (code == kStatusMoved) return Unavailable("the job moved to ", msg);
  if (code == kStatusArriving) return Unavailable(msg);
  if (code <= 0 || code > static_cast<int>(StatusCode::kIoError)) {
    return ProtocolError("reply with unknown status ", code, ": ", msg);
  }
  return Status(static_cast<StatusCode>(code), msg);
}

bool Broken(const Status& s) {
  return s.code() == StatusCode::kUnavailable || s.code() == StatusCode::kIoError;
}

}  // namespace

Result<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  if (options.secret.empty()) return InvalidArgument("a shared secret is required");
  if (options.port == 0) return InvalidArgument("no service port");
  std::unique_ptr<Client> c(new Client(options));
  if (c->opt_.client_id == 0) {
    uint8_t r[8];
    Status s = fabric::RandomBytes(r);
    if (!s.ok()) return s;
    c->opt_.client_id = DecodeFixed64(r) | 1;
  }
  Status s = c->Dial();
  if (!s.ok()) return s;
  return c;
}

Client::~Client() = default;

Status Client::Dial() {
  stash_.clear();
  auto fd = ConnectTcp(opt_.host, opt_.port, opt_.connect_timeout_ms);
  if (!fd.ok()) return fd.status();
  fd_ = std::move(*fd);
  SetSocketTimeouts(fd_.get(), opt_.op_timeout_ms + 5000, opt_.op_timeout_ms + 5000);
  fabric::HandshakeTranscript tr;
  Status s = fabric::RandomBytes(tr.client_nonce);
  if (!s.ok()) return s;
  tr.client_id = opt_.client_id;
  uint8_t hello[40];
  std::memcpy(hello, tr.client_nonce.data(), 32);
  EncodeFixed64(hello + 32, tr.client_id);
  auto rep = Call(Op::kHello, 0, hello);
  if (!rep.ok()) return rep.status().WithContext("paramsvc handshake");
  if (rep->size() != 40) return ProtocolError("HELLO reply of ", rep->size(), " bytes");
  std::memcpy(tr.server_nonce.data(), rep->data(), 32);
  tr.server_id = DecodeFixed64(rep->data() + 32);
  const fabric::Mac cm = fabric::ClientMac(opt_.secret, tr);
  rep = Call(Op::kAuth, 0, cm);
  if (!rep.ok()) return rep.status().WithContext("paramsvc handshake");
  fabric::Mac sm;
  if (rep->size() != sm.size()) return ProtocolError("AUTH reply of ", rep->size(), " bytes");
  std::memcpy(sm.data(), rep->data(), sm.size());
  if (!fabric::MacEqual(sm, fabric::ServerMac(opt_.secret, tr))) {
    return PermissionDenied("the service did not prove it knows the shared secret");
  }
  return Status::Ok();
}

Status Client::Send(Op op, uint32_t job, uint64_t rid, std::span<const uint8_t> a,
                    std::span<const uint8_t> b) {
  if (!fd_) return Unavailable("not connected");
  Header h{static_cast<uint8_t>(op), 0, 0, job, rid};
  Status s = WriteFrame(fd_.get(), h, a, b);
  if (!s.ok()) fd_.Reset();
  return s;
}

Status Client::Await(uint64_t rid, Header* h, std::vector<uint8_t>* payload) {
  auto it = stash_.find(rid);
  if (it != stash_.end()) {
    *h = it->second.first;
    *payload = std::move(it->second.second);
    stash_.erase(it);
    return Status::Ok();
  }
  while (true) {
    if (!fd_) return Unavailable("not connected");
    Status s = ReadFrame(fd_.get(), h, payload);
    if (!s.ok()) {
      fd_.Reset();
      if (s.code() == StatusCode::kTimeout) return Unavailable("no reply from the service: ", s.message());
      return s;
    }
    if (h->request_id == rid) return Status::Ok();
    if (h->request_id == 0 && h->status != 0) {  // The server closed us with a reason.
      fd_.Reset();
      return ReplyError(*h, *payload);
    }
    stash_[h->request_id] = {*h, std::move(*payload)};
  }
}

Result<std::vector<uint8_t>> Client::Call(Op op, uint32_t job, std::span<const uint8_t> payload) {
  const uint64_t rid = next_rid_++;
  Status s = Send(op, job, rid, payload);
  if (!s.ok()) return s;
  Header h;
  std::vector<uint8_t> rep;
  s = Await(rid, &h, &rep);
  if (!s.ok()) return s;
  if (h.status != 0) return ReplyError(h, rep);
  return rep;
}

Status Client::Join(const JobSpec& spec, uint32_t rank) {
  Status v = spec.Validate();
  if (!v.ok()) return v;
  if (rank >= spec.workers) return InvalidArgument("rank ", rank, " of ", spec.workers, " workers");
  const auto enc = spec.Encode();
  std::vector<uint8_t> rep;
  bool moved = following_;
  const Deadline arriving = Deadline::AfterMs(static_cast<uint64_t>(opt_.op_timeout_ms));
  for (int hop = 0;; ++hop) {
    const uint64_t rid = next_rid_++;
    Status s = Send(Op::kRegister, 0, rid, enc);
    if (!s.ok()) return s;
    Header h;
    s = Await(rid, &h, &rep);
    if (!s.ok()) return s;
    if (h.status == kStatusArriving && !arriving.Expired()) {  // Its move commits shortly.
      --hop;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));  // Retry pacing, not sync.
      continue;
    }
    if (h.status == kStatusMoved) {  // The job (or, while draining, a new job) is elsewhere.
      if (hop >= kMaxHops) return Unavailable("job '", spec.name, "' moved more than ", kMaxHops, " times in a row");
      s = Redial(std::string(rep.begin(), rep.end()));
      if (!s.ok()) return s;
      moved = true;
      continue;
    }
    if (h.status != 0) return ReplyError(h, rep);
    break;
  }
  // Another server than the one that gave the layout (the job moved, maybe on an earlier
  // attempt): its own job id is expected.
  if (joined_ && (opt_.host != layout_host_ || opt_.port != layout_port_)) moved = true;
  auto lay = JobLayout::Decode(rep);
  if (!lay.ok()) return lay.status();
  const auto want = PartitionModel(spec);
  if (lay->partitions.size() != want.size()) {
    return ProtocolError("the service cut the model into ", lay->partitions.size(),
                         " partitions, expected ", want.size());
  }
  for (size_t i = 0; i < want.size(); ++i) {
    if (lay->partitions[i].tensor != want[i].tensor || lay->partitions[i].offset != want[i].offset ||
        lay->partitions[i].count != want[i].count) {
      return ProtocolError("partition ", i, " of the service's layout differs from the spec's");
    }
  }
  if (joined_ && lay->job != layout_.job && !moved) {
    // A restarted service gave the job a new id: its state did not survive.
    layout_ = *lay;
    return DataLoss("the service no longer has job '", spec.name, "' (restarted without its checkpoint)");
  }
  spec_ = spec;
  rank_ = rank;
  layout_ = *lay;
  layout_host_ = opt_.host;
  layout_port_ = opt_.port;
  if (!joined_) {
    versions_.assign(layout_.partitions.size(), 0);
    pushed_version_.assign(layout_.partitions.size(), UINT64_MAX);
  }
  joined_ = true;
  return Status::Ok();
}

Status Client::Redial(const std::string& to) {
  if (Status e = CheckEndpointText(to, "a moved reply's server"); !e.ok()) {
    return ProtocolError(e.message());
  }
  auto ep = fabric::ParseEndpoint(to);
  if (!ep.ok()) return ProtocolError("a moved reply's server: ", ep.status().message());
  opt_.host = ep->host;
  opt_.port = ep->port;
  fd_.Reset();
  counters_.redirects++;
  return Dial();
}

Status Client::Follow(const std::string& to) {
  Status s = Redial(to);
  const Deadline d = Deadline::AfterMs(static_cast<uint64_t>(std::max(opt_.reconnect_ms, opt_.op_timeout_ms)));
  while (true) {
    if (s.ok() && joined_) {
      following_ = true;
      s = Join(spec_, rank_);
      following_ = false;
      if (s.ok() && lr_ >= 0) s = CallSetLr(lr_);
    }
    if (s.ok()) return s;
    // Unavailable: the destination is not up yet, or its copy of the job not committed yet.
    if (!Broken(s) || d.Expired()) return s.WithContext("following job '" + spec_.name + "' to " + to);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // Retry pacing, not sync.
    s = Dial();
  }
}

Result<std::vector<uint8_t>> Client::JobCall(Op op, std::span<const uint8_t> payload) {
  for (int hop = 0;; ++hop) {
    const uint64_t rid = next_rid_++;
    Status s = Send(op, layout_.job, rid, payload);
    if (!s.ok()) return s;
    Header h;
    std::vector<uint8_t> rep;
    s = Await(rid, &h, &rep);
    if (!s.ok()) return s;
    if (h.status == kStatusMoved && joined_ && hop < kMaxHops) {
      s = Follow(std::string(rep.begin(), rep.end()));
      if (!s.ok()) return s;
      continue;  // Not applied where it went: send it again where the job is now.
    }
    if (h.status != 0) return ReplyError(h, rep);
    return rep;
  }
}

uint64_t Client::min_version() const {
  uint64_t m = UINT64_MAX;
  for (uint64_t v : versions_) m = std::min(m, v);
  return versions_.empty() ? 0 : m;
}

Status Client::Reconnect(const Status& why) {
  if (opt_.reconnect_ms <= 0 || !Broken(why)) return why;
  const Deadline d = Deadline::AfterMs(static_cast<uint64_t>(opt_.reconnect_ms));
  Status last = why;
  while (!d.Expired()) {
    last = Dial();
    if (last.ok()) {
      counters_.reconnects++;
      if (!joined_) return Status::Ok();
      last = Join(spec_, rank_);
      if (last.ok() && lr_ >= 0) last = CallSetLr(lr_);
      if (last.ok() || !Broken(last)) return last;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // Retry pacing, not sync.
  }
  return Unavailable("the service did not come back within ", opt_.reconnect_ms, " ms: ",
                     last.message());
}

Status Client::SetParams(std::span<const void* const> params) {
  if (!joined_) return InvalidArgument("Join first");
  if (params.size() != spec_.tensors.size()) {
    return InvalidArgument(params.size(), " tensors given, the job has ", spec_.tensors.size());
  }
  std::vector<uint8_t> todo(layout_.partitions.size(), 1);
  Status first;
  for (int hop = 0;; ++hop) {
    std::vector<std::pair<uint32_t, uint64_t>> rids;
    for (uint32_t i = 0; i < layout_.partitions.size(); ++i) {
      if (!todo[i]) continue;
      const auto& pi = layout_.partitions[i];
      const DType dt = spec_.tensors[pi.tensor].dtype;
      SetParamsRequest r{i, dt, pi.count, {}};
      uint8_t fixed[SetParamsRequest::kFixed];
      r.EncodeFixed(fixed);
      const auto* base = static_cast<const uint8_t*>(params[pi.tensor]) + pi.offset * DTypeSize(dt);
      const uint64_t rid = next_rid_++;
      Status s = Send(Op::kSetParams, layout_.job, rid, fixed, {base, pi.count * DTypeSize(dt)});
      if (!s.ok()) return s;
      rids.emplace_back(i, rid);
    }
    std::string moved_to;
    for (auto [i, rid] : rids) {
      Header h;
      std::vector<uint8_t> p;
      Status s = Await(rid, &h, &p);
      if (!s.ok()) return s;
      todo[i] = 0;
      if (h.status == kStatusMoved) {
        todo[i] = 1;
        moved_to.assign(p.begin(), p.end());
      } else if (h.status != 0 && first.ok()) {
        first = ReplyError(h, p);
      }
    }
    if (moved_to.empty()) return first;
    if (hop >= kMaxHops) return Unavailable("job '", spec_.name, "' moved more than ", kMaxHops, " times in a row");
    Status s = Follow(moved_to);
    if (!s.ok()) return s;
  }
}

Status Client::PushAll(std::span<const void* const> grads, const std::vector<uint8_t>* only,
                       std::vector<uint8_t>* out, std::string* moved_to) {
  if (!joined_) return InvalidArgument("Join first");
  if (grads.size() != spec_.tensors.size()) {
    return InvalidArgument(grads.size(), " tensors given, the job has ", spec_.tensors.size());
  }
  const size_t n = layout_.partitions.size();
  out->resize(n, kDone);
  std::vector<uint64_t> rids(n, 0);
  for (uint32_t i = 0; i < n; ++i) {
    if (only && !(*only)[i]) continue;
    (*out)[i] = kDone;
    const auto& pi = layout_.partitions[i];
    const DType dt = spec_.tensors[pi.tensor].dtype;
    PushRequest r;
    r.worker = rank_;
    r.partition = i;
    r.version = versions_[i];
    r.dtype = dt;
    r.count = pi.count;
    uint8_t fixed[PushRequest::kFixed];
    r.EncodeFixed(fixed);
    const auto* base = static_cast<const uint8_t*>(grads[pi.tensor]) + pi.offset * DTypeSize(dt);
    rids[i] = next_rid_++;
    Status s = Send(Op::kPush, layout_.job, rids[i], fixed, {base, pi.count * DTypeSize(dt)});
    if (!s.ok()) return s;
  }
  Status first;
  for (uint32_t i = 0; i < n; ++i) {
    if (rids[i] == 0) continue;
    Header h;
    std::vector<uint8_t> p;
    Status s = Await(rids[i], &h, &p);
    if (!s.ok()) return s;
    if (h.status == kStatusMoved) {  // Not applied there: sent again where the job went.
      (*out)[i] = kMovedAway;
      moved_to->assign(p.begin(), p.end());
      continue;
    }
    counters_.pushes++;
    if (h.status != 0) {
      Status e = ReplyError(h, p);
      if (e.code() == StatusCode::kOutOfRange) {
        (*out)[i] = kRefused;  // The model moved under us (restore): resynchronise.
        continue;
      }
      if (first.ok()) first = e;
      continue;
    }
    auto rep = PushReply::Decode(p);
    if (!rep.ok()) return rep.status();
    pushed_version_[i] = versions_[i];
    counters_.max_staleness = std::max<uint64_t>(counters_.max_staleness, rep->staleness);
    switch (rep->outcome) {
      case PushOutcome::kDropped: counters_.dropped++; break;
      case PushOutcome::kLateQueued: counters_.late++; break;
      default: counters_.applied++; break;
    }
  }
  return first;
}

Status Client::PullAll(std::span<void* const> params, const std::vector<uint64_t>& min_versions,
                       const std::vector<uint8_t>* only, std::string* moved_to,
                       std::vector<uint8_t>* out) {
  if (params.size() != spec_.tensors.size()) {
    return InvalidArgument(params.size(), " tensors given, the job has ", spec_.tensors.size());
  }
  const size_t n = layout_.partitions.size();
  if (out) out->assign(n, kDone);
  std::vector<uint64_t> rids(n, 0);
  for (uint32_t i = 0; i < n; ++i) {
    if (only && !(*only)[i]) continue;
    const auto& pi = layout_.partitions[i];
    PullRequest r;
    r.partition = i;
    r.dtype = spec_.tensors[pi.tensor].dtype;
    r.min_version = min_versions[i];
    r.timeout_ms = static_cast<uint32_t>(opt_.op_timeout_ms);
    uint8_t b[PullRequest::kWireSize];
    r.EncodeTo(b);
    rids[i] = next_rid_++;
    Status s = Send(Op::kPull, layout_.job, rids[i], b);
    if (!s.ok()) return s;
  }
  Status first;
  std::vector<uint8_t>& p = pull_buf_;  // Reused: no allocation per MB-sized reply
  for (uint32_t i = 0; i < n; ++i) {
    if (rids[i] == 0) continue;
    Header h;
    Status s = Await(rids[i], &h, &p);
    if (!s.ok()) return s;
    if (h.status == kStatusMoved && moved_to && out) {
      (*out)[i] = kMovedAway;
      moved_to->assign(p.begin(), p.end());
      continue;
    }
    if (h.status != 0) {
      if (first.ok()) first = ReplyError(h, p);
      continue;
    }
    auto rep = PullReply::Decode(p);
    if (!rep.ok()) return rep.status();
    const auto& pi = layout_.partitions[i];
    const DType dt = spec_.tensors[pi.tensor].dtype;
    if (rep->count != pi.count || rep->dtype != dt) {
      return ProtocolError("PULL reply for partition ", i, " does not match the layout");
    }
    std::memcpy(static_cast<uint8_t*>(params[pi.tensor]) + pi.offset * DTypeSize(dt),
                rep->data.data(), rep->data.size());
    versions_[i] = rep->version;
  }
  return first;
}

Status Client::PushFollowing(std::span<const void* const> grads, std::vector<uint8_t>* out) {
  std::string to;
  out->clear();
  Status s = PushAll(grads, nullptr, out, &to);
  for (int hop = 0; s.ok() && !to.empty(); ++hop) {
    if (hop >= kMaxHops) return Unavailable("job '", spec_.name, "' moved more than ", kMaxHops, " times in a row");
    s = Follow(to);
    if (!s.ok()) return s;
    std::vector<uint8_t> again(out->size());
    for (size_t i = 0; i < out->size(); ++i) again[i] = (*out)[i] == kMovedAway;
    to.clear();
    s = PushAll(grads, &again, out, &to);
  }
  return s;
}

Status Client::PullFollowing(std::span<void* const> params, const std::vector<uint64_t>& min_versions) {
  std::string to;
  std::vector<uint8_t> out;
  Status s = PullAll(params, min_versions, nullptr, &to, &out);
  for (int hop = 0; s.ok() && !to.empty(); ++hop) {
    if (hop >= kMaxHops) return Unavailable("job '", spec_.name, "' moved more than ", kMaxHops, " times in a row");
    s = Follow(to);
    if (!s.ok()) return s;
    std::vector<uint8_t> again(out.size());
    for (size_t i = 0; i < out.size(); ++i) again[i] = out[i] == kMovedAway;
    to.clear();
    s = PullAll(params, min_versions, &again, &to, &out);
  }
  return s;
}

Status Client::Resync(std::span<void* const> params) {
  counters_.rollbacks++;
  std::vector<uint64_t> zero(layout_.partitions.size(), 0);
  std::vector<uint64_t> before = versions_;
  Status s = PullFollowing(params, zero);
  if (!s.ok()) return s;
  bool all_zero = true, had = false;
  for (size_t i = 0; i < versions_.size(); ++i) {
    all_zero &= versions_[i] == 0;
    had |= before[i] > 1;
  }
  std::fill(pushed_version_.begin(), pushed_version_.end(), UINT64_MAX);
  if (all_zero && had) {
    return DataLoss("job '", spec_.name, "' came back at version 0 (its checkpoint was lost)");
  }
  return Status::Ok();
}

Status Client::Push(std::span<const void* const> grads) {
  std::vector<uint8_t> out;
  Status s = PushFollowing(grads, &out);
  if (Broken(s)) return Reconnect(s);
  return s;
}

Status Client::Pull(std::span<void* const> params, bool wait) {
  std::vector<uint64_t> mins(layout_.partitions.size(), 0);
  if (wait && spec_.mode == Mode::kSync) {
    for (size_t i = 0; i < mins.size(); ++i) {
      if (pushed_version_[i] != UINT64_MAX) mins[i] = pushed_version_[i] + 1;
    }
  }
  Status s = PullFollowing(params, mins);
  if (Broken(s)) {
    Status r = Reconnect(s);
    if (!r.ok()) return r;
    return Resync(params);
  }
  return s;
}

Status Client::PushPull(std::span<const void* const> grads, std::span<void* const> params) {
  std::vector<uint8_t> out;
  Status s = PushFollowing(grads, &out);
  if (Broken(s)) {
    Status r = Reconnect(s);
    if (!r.ok()) return r;
    return Resync(params);
  }
  if (!s.ok()) return s;
  const bool any_refused = std::any_of(out.begin(), out.end(), [](uint8_t x) { return x == kRefused; });
  std::vector<uint64_t> mins(layout_.partitions.size(), 0);
  for (size_t i = 0; i < mins.size(); ++i) {
    if (spec_.mode == Mode::kSync && out[i] != kRefused) mins[i] = versions_[i] + 1;
  }
  if (any_refused) counters_.rollbacks++;
  s = PullFollowing(params, mins);
  if (Broken(s)) {
    Status r = Reconnect(s);
    if (!r.ok()) return r;
    return Resync(params);
  }
  return s;
}

Status Client::Barrier(uint64_t iteration) {
  BarrierRequest r{rank_, static_cast<uint32_t>(opt_.op_timeout_ms), iteration};
  uint8_t b[BarrierRequest::kWireSize];
  r.EncodeTo(b);
  auto rep = JobCall(Op::kBarrier, b);
  if (!rep.ok() && Broken(rep.status())) {
    Status s = Reconnect(rep.status());
    if (!s.ok()) return s;
    rep = JobCall(Op::kBarrier, b);
  }
  return rep.ok() ? Status::Ok() : rep.status();
}

Status Client::CallSetLr(float lr) {
  SetLrRequest r{lr};
  uint8_t b[SetLrRequest::kWireSize];
  r.EncodeTo(b);
  auto rep = Call(Op::kSetLr, layout_.job, b);
  return rep.ok() ? Status::Ok() : rep.status();
}

Status Client::SetLr(float lr) {
  if (!joined_) return InvalidArgument("Join first");
  SetLrRequest r{lr};
  uint8_t b[SetLrRequest::kWireSize];
  r.EncodeTo(b);
  Status s = JobCall(Op::kSetLr, b).status();
  if (Broken(s)) {
    Status rc = Reconnect(s);  // Sends lr_ again when it was set before.
    if (!rc.ok()) return rc;
    s = JobCall(Op::kSetLr, b).status();
  }
  if (s.ok()) lr_ = lr;
  return s;
}

Status Client::Release() {
  auto rep = JobCall(Op::kRelease, {});
  return rep.ok() ? Status::Ok() : rep.status();
}

Status Client::GetState(std::vector<PartitionState>* out) {
  if (!joined_) return InvalidArgument("Join first");
  out->clear();
  for (uint32_t i = 0; i < layout_.partitions.size(); ++i) {
    uint8_t b[4];
    EncodeFixed32(b, i);
    auto rep = JobCall(Op::kGetState, b);
    if (!rep.ok() && Broken(rep.status())) {
      Status s = Reconnect(rep.status());
      if (!s.ok()) return s;
      rep = JobCall(Op::kGetState, b);
    }
    if (!rep.ok()) return rep.status();
    auto st = DecodePartitionState(*rep, layout_.partitions[i].count);
    if (!st.ok()) return st.status();
    out->push_back(std::move(*st));
  }
  return Status::Ok();
}

Status Client::PutState(const std::vector<PartitionState>& states) {
  if (!joined_) return InvalidArgument("Join first");
  if (states.size() != layout_.partitions.size()) {
    return InvalidArgument(states.size(), " partition states for ", layout_.partitions.size(),
                           " partitions");
  }
  for (uint32_t i = 0; i < states.size(); ++i) {
    const uint32_t n = layout_.partitions[i].count;
    const PartitionState& st = states[i];
    if (st.param.size() != n || (!st.mom.empty() && st.mom.size() != n) ||
        (!st.mom2.empty() && st.mom2.size() != n)) {
      return InvalidArgument("partition ", i, ": its state has ", st.param.size(),
                             " elements, the partition ", n);
    }
    std::vector<uint8_t> b(4);
    EncodeFixed32(b.data(), i);
    const auto enc = EncodePartitionState(st);
    b.insert(b.end(), enc.begin(), enc.end());
    auto rep = JobCall(Op::kPutState, b);
    if (!rep.ok() && Broken(rep.status())) {
      Status s = Reconnect(rep.status());
      if (!s.ok()) return s;
      rep = JobCall(Op::kPutState, b);
    }
    if (!rep.ok()) return rep.status();
  }
  return Status::Ok();
}

Result<std::string> Client::StatusJson() {
  auto rep = Call(Op::kStatus, 0, {});
  if (!rep.ok()) return rep.status();
  return std::string(rep->begin(), rep->end());
}

Status Client::Migrate(uint32_t partition, uint32_t core) {
  MigrateRequest r{partition, core};
  uint8_t b[MigrateRequest::kWireSize];
  r.EncodeTo(b);
  auto rep = Call(Op::kMigrate, layout_.job, b);
  return rep.ok() ? Status::Ok() : rep.status();
}

Result<std::string> Client::MoveJob(const std::string& name, const std::string& to,
                                    uint32_t boundary_timeout_ms, bool allow_volatile) {
  MoveJobRequest r{name, to, boundary_timeout_ms, allow_volatile};
  auto rep = Call(Op::kMoveJob, 0, r.Encode());
  if (!rep.ok()) return rep.status();
  return std::string(rep->begin(), rep->end());
}

Status Client::Drain(bool on, const std::string& redirect) {
  DrainRequest r{on, redirect};
  auto rep = Call(Op::kDrain, 0, r.Encode());
  return rep.ok() ? Status::Ok() : rep.status();
}

Result<JobSpec> JobSpecFromJson(std::string_view text) {
  using json = nlohmann::json;
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return InvalidArgument("job spec is not a JSON object");
  JobSpec s;
  auto str = [&](const char* k, std::string* out) -> Status {
    if (!j.contains(k)) return Status::Ok();
    if (!j[k].is_string()) return InvalidArgument("job spec: '", k, "' must be a string");
    *out = j[k].get<std::string>();
    return Status::Ok();
  };
  auto num = [&](const json& o, const char* k, double* out) -> Status {
    if (!o.contains(k)) return Status::Ok();
    if (!o[k].is_number()) return InvalidArgument("job spec: '", k, "' must be a number");
    *out = o[k].get<double>();
    return Status::Ok();
  };
  Status st = str("name", &s.name);
  if (!st.ok()) return st;
  double workers = 1, lr = s.optimizer.lr, mom = 0, wd = 0, pb = s.partition_bytes;
  for (auto [k, p] : {std::pair{"workers", &workers}, {"lr", &lr}, {"momentum", &mom},
                      {"weight_decay", &wd}, {"partition_bytes", &pb}}) {
    st = num(j, k, p);
    if (!st.ok()) return st;
  }
  if (workers < 1 || workers > kMaxWorkers || pb < 0 || pb > kMaxPartitionBytes) {
    return InvalidArgument("job spec: workers or partition_bytes out of range");
  }
  s.workers = static_cast<uint32_t>(workers);
  s.optimizer.lr = static_cast<float>(lr);
  s.optimizer.momentum = static_cast<float>(mom);
  s.optimizer.weight_decay = static_cast<float>(wd);
  s.partition_bytes = static_cast<uint32_t>(pb);
  std::string mode = "sync", late = "drop", opt = "sgd";
  if (!(st = str("mode", &mode)).ok() || !(st = str("late", &late)).ok() ||
      !(st = str("optimizer", &opt)).ok()) {
    return st;
  }
  auto m = ParseMode(mode);
  if (!m.ok()) return m.status();
  s.mode = m->first;
  s.staleness = m->second;
  if (late == "drop") s.late = LatePolicy::kDrop;
  else if (late == "aggregate") s.late = LatePolicy::kAggregate;
  else return InvalidArgument("job spec: late must be drop or aggregate, not '", late, "'");
  if (opt == "sgd") s.optimizer.kind = OptimizerKind::kSgd;
  else if (opt == "adam") s.optimizer.kind = OptimizerKind::kAdam;
  else if (opt == "average") s.optimizer.kind = OptimizerKind::kAverage;
  else return InvalidArgument("job spec: optimizer must be sgd, adam or average, not '", opt, "'");
  if (!j.contains("tensors") || !j["tensors"].is_array()) {
    return InvalidArgument("job spec: 'tensors' must be an array");
  }
  for (const json& t : j["tensors"]) {
    if (!t.is_object() || !t.contains("name") || !t["name"].is_string() || !t.contains("shape") ||
        !t["shape"].is_array()) {
      return InvalidArgument("job spec: each tensor needs a string 'name' and an array 'shape'");
    }
    TensorSpec ts;
    ts.name = t["name"].get<std::string>();
    const std::string dt = t.value("dtype", std::string("fp32"));
    if (dt == "fp32") ts.dtype = DType::kF32;
    else if (dt == "fp16") ts.dtype = DType::kF16;
    else if (dt == "bf16") ts.dtype = DType::kBF16;
    else return InvalidArgument("job spec: tensor '", ts.name, "' has dtype '", dt, "' (fp32, fp16, bf16)");
    for (const json& d : t["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 1) {
        return InvalidArgument("job spec: tensor '", ts.name, "' has a bad dim");
      }
      ts.shape.push_back(d.get<uint64_t>());
    }
    s.tensors.push_back(std::move(ts));
  }
  st = s.Validate();
  if (!st.ok()) return st;
  return s;
}

}  // namespace tessera::paramsvc
