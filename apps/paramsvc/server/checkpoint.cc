#include "apps/paramsvc/server/checkpoint.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/logging.h"
#include "fabric/auth.h"

namespace tessera::paramsvc {
namespace {

// The link's messages: u32 length (type + body) | u8 type | body.
//   kJob       u32 job | u32 spec length | spec | u64 staged move (0: none) | str source
//   kDrop      u32 job
//   kPart      u32 job | u32 partition | EncodePartitionState
//   kActivate  u32 job (a staged copy became the job)
//   kMoved     u32 job | u64 move | str name | str to (a tombstone; the job's pages go)
//   kDrain     u8 on | str redirect
//   kSync      u32 job -> kSyncAck u8 durable
//   kRestoreRequest -> kRestoreJob* (u32 job | u32 spec length | spec | u32 partitions |
//                      (u32 length | state)* | u64 staged move | str source),
//                      kRestoreMoved* (as kMoved), kRestoreDrain (as kDrain), kRestoreEnd
// (str: u16 length | bytes.)
enum MsgType : uint8_t {
  kJob = 1,
  kDrop = 2,
  kPart = 3,
  kRestoreRequest = 4,
  kRestoreJob = 5,
  kRestoreEnd = 6,
  kActivate = 7,
  kMoved = 8,
  kDrain = 9,
  kSync = 10,
  kSyncAck = 11,
  kRestoreMoved = 12,
  kRestoreDrain = 13,
};
constexpr uint32_t kMaxMsg = 512u << 20;

Status WriteAllFd(int fd, const uint8_t* p, size_t n) {
  while (n > 0) {
    ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("checkpoint link send");
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return Status::Ok();
}

Status ReadAllFd(int fd, uint8_t* p, size_t n) {
  while (n > 0) {
    ssize_t r = ::recv(fd, p, n, 0);
    if (r == 0) return Unavailable("checkpoint link closed");
    if (r < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("checkpoint link recv");
    }
    p += r;
    n -= static_cast<size_t>(r);
  }
  return Status::Ok();
}

Status SendOn(int fd, uint8_t type, std::span<const uint8_t> a, std::span<const uint8_t> b) {
  uint8_t h[5];
  EncodeFixed32(h, static_cast<uint32_t>(1 + a.size() + b.size()));
  h[4] = type;
  Status s = WriteAllFd(fd, h, 5);
  if (s.ok() && !a.empty()) s = WriteAllFd(fd, a.data(), a.size());
  if (s.ok() && !b.empty()) s = WriteAllFd(fd, b.data(), b.size());
  return s;
}

Status RecvOn(int fd, uint8_t* type, std::vector<uint8_t>* body) {
  uint8_t h[5];
  Status s = ReadAllFd(fd, h, 5);
  if (!s.ok()) return s;
  const uint32_t len = DecodeFixed32(h);
  if (len < 1 || len > kMaxMsg) return ProtocolError("checkpoint link message of ", len, " bytes");
  *type = h[4];
  body->resize(len - 1);
  return body->empty() ? Status::Ok() : ReadAllFd(fd, body->data(), body->size());
}

void PutStr(std::vector<uint8_t>* out, const std::string& v) {
  uint8_t n[2];
  EncodeFixed16(n, static_cast<uint16_t>(v.size()));
  out->insert(out->end(), n, n + 2);
  out->insert(out->end(), v.begin(), v.end());
}

bool GetStr(std::span<const uint8_t> b, size_t* off, std::string* v) {
  if (b.size() < *off + 2) return false;
  const uint16_t n = DecodeFixed16(b.data() + *off);
  if (b.size() < *off + 2 + n) return false;
  v->assign(reinterpret_cast<const char*>(b.data() + *off + 2), n);
  *off += 2 + n;
  return true;
}

std::vector<uint8_t> EncodeMoved(const MovedRecord& r) {
  std::vector<uint8_t> out(12);
  EncodeFixed32(out.data(), r.job);
  EncodeFixed64(out.data() + 4, r.move_id);
  PutStr(&out, r.name);
  PutStr(&out, r.to);
  return out;
}

bool DecodeMoved(std::span<const uint8_t> b, MovedRecord* r) {
  if (b.size() < 12) return false;
  r->job = DecodeFixed32(b.data());
  r->move_id = DecodeFixed64(b.data() + 4);
  size_t off = 12;
  return GetStr(b, &off, &r->name) && GetStr(b, &off, &r->to) && off == b.size();
}

std::vector<uint8_t> EncodeDrain(bool on, const std::string& redirect) {
  std::vector<uint8_t> out{static_cast<uint8_t>(on ? 1 : 0)};
  PutStr(&out, redirect);
  return out;
}

bool DecodeDrain(std::span<const uint8_t> b, bool* on, std::string* redirect) {
  if (b.empty() || b[0] > 1) return false;
  *on = b[0] == 1;
  size_t off = 1;
  return GetStr(b, &off, redirect) && off == b.size();
}

}  // namespace

// ---------------------------------------------------------------- CheckpointLink

void CheckpointLink::SendMsg(uint8_t type, std::span<const uint8_t> a, std::span<const uint8_t> b) {
  std::lock_guard<std::mutex> l(mu_);
  if (!SendOn(fd_.get(), type, a, b).ok()) send_errors_++;
}

void CheckpointLink::SaveJob(uint32_t job, const JobSpec& spec) {
  SaveStagedJob(job, spec, 0, {});
}

void CheckpointLink::SaveStagedJob(uint32_t job, const JobSpec& spec, uint64_t move_id,
                                   const std::string& source) {
  const auto sp = spec.Encode();
  std::vector<uint8_t> msg(8);
  EncodeFixed32(msg.data(), job);
  EncodeFixed32(msg.data() + 4, static_cast<uint32_t>(sp.size()));
  msg.insert(msg.end(), sp.begin(), sp.end());
  uint8_t mv[8];
  EncodeFixed64(mv, move_id);
  msg.insert(msg.end(), mv, mv + 8);
  PutStr(&msg, source);
  SendMsg(kJob, msg);
}

void CheckpointLink::ActivateJob(uint32_t job) {
  uint8_t id[4];
  EncodeFixed32(id, job);
  SendMsg(kActivate, id);
}

void CheckpointLink::SaveMoved(const MovedRecord& r) { SendMsg(kMoved, EncodeMoved(r)); }

void CheckpointLink::SaveDrain(bool on, const std::string& redirect) {
  SendMsg(kDrain, EncodeDrain(on, redirect));
}

Result<bool> CheckpointLink::Sync(uint32_t job) {
  std::lock_guard<std::mutex> l(mu_);
  uint8_t id[4];
  EncodeFixed32(id, job);
  Status s = SendOn(fd_.get(), kSync, id, {});
  if (!s.ok()) return s;
  uint8_t type = 0;
  std::vector<uint8_t> b;
  s = RecvOn(fd_.get(), &type, &b);
  if (!s.ok()) return s;
  if (type != kSyncAck || b.size() != 1) return ProtocolError("unexpected checkpoint link reply");
  return b[0] == 1;
}

void CheckpointLink::DropJob(uint32_t job) {
  uint8_t id[4];
  EncodeFixed32(id, job);
  SendMsg(kDrop, id);
}

void CheckpointLink::SavePartition(uint32_t job, uint32_t partition, const PartitionState& state) {
  uint8_t ids[8];
  EncodeFixed32(ids, job);
  EncodeFixed32(ids + 4, partition);
  SendMsg(kPart, ids, EncodePartitionState(state));
}

Result<int> CheckpointLink::Restore(Server* server) {
  std::lock_guard<std::mutex> l(mu_);
  Status s = SendOn(fd_.get(), kRestoreRequest, {}, {});
  if (!s.ok()) return s;
  int jobs = 0;
  while (true) {
    uint8_t type = 0;
    std::vector<uint8_t> b;
    s = RecvOn(fd_.get(), &type, &b);
    if (!s.ok()) return s;
    if (type == kRestoreEnd) return jobs;
    if (type == kRestoreMoved) {
      MovedRecord r;
      if (!DecodeMoved(b, &r)) return ProtocolError("bad restore message (moved)");
      s = server->RestoreMoved(r);
      if (!s.ok()) return s;
      TLOG(INFO) << "paramsvc: job " << r.job << " ('" << r.name << "') moved to " << r.to;
      continue;
    }
    if (type == kRestoreDrain) {
      bool on = false;
      std::string to;
      if (!DecodeDrain(b, &on, &to)) return ProtocolError("bad restore message (drain)");
      server->RestoreDrain(on, to);
      continue;
    }
    if (type != kRestoreJob || b.size() < 12) return ProtocolError("unexpected restore message");
    const uint32_t job = DecodeFixed32(b.data());
    const uint32_t spec_len = DecodeFixed32(b.data() + 4);
    if (b.size() < 8 + spec_len + 4) return ProtocolError("short restore message");
    auto spec = JobSpec::Decode({b.data() + 8, spec_len});
    if (!spec.ok()) return spec.status();
    size_t off = 8 + spec_len;
    const uint32_t nparts = DecodeFixed32(b.data() + off);
    off += 4;
    const auto infos = PartitionModel(*spec);
    if (nparts != infos.size()) return Corruption("restore of job ", job, ": partition count");
    std::vector<PartitionState> states;
    for (uint32_t i = 0; i < nparts; ++i) {
      if (b.size() < off + 4) return ProtocolError("short restore message");
      const uint32_t len = DecodeFixed32(b.data() + off);
      off += 4;
      if (b.size() < off + len) return ProtocolError("short restore message");
      if (len == 0) {
        PartitionState z;
        z.param.assign(infos[i].count, 0.0f);
        states.push_back(std::move(z));
      } else {
        auto st = DecodePartitionState({b.data() + off, len}, infos[i].count);
        if (!st.ok()) return st.status();
        states.push_back(std::move(*st));
      }
      off += len;
    }
    if (b.size() < off + 8) return ProtocolError("short restore message");
    const uint64_t staged_move = DecodeFixed64(b.data() + off);
    off += 8;
    std::string source;
    if (!GetStr(b, &off, &source) || off != b.size()) return ProtocolError("bad restore message");
    uint64_t vmin = UINT64_MAX, vmax = 0;
    for (const auto& st : states) {
      vmin = std::min(vmin, st.version);
      vmax = std::max(vmax, st.version);
    }
    s = server->RestoreJob(job, *spec, std::move(states), staged_move, source);
    if (!s.ok()) return s;
    TLOG(INFO) << "paramsvc: restored job " << job << " ('" << spec->name << "') from its checkpoint at versions "
               << vmin << ".." << vmax << (staged_move ? " (a staged copy of a move; asking its source)" : "");
    ++jobs;
  }
}

// ---------------------------------------------------------------- CheckpointKeeper

CheckpointKeeper::CheckpointKeeper(std::unique_ptr<client::PageStore> store)
    : store_(std::move(store)) {
  if (store_) writer_ = std::thread([this] { WriterLoop(); });
}

CheckpointKeeper::~CheckpointKeeper() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (writer_.joinable()) writer_.join();
}

Status CheckpointKeeper::Allocate(PartEntry* e, uint64_t bytes) {
  const uint64_t pages = (bytes + client::kPageSize - 1) / client::kPageSize;
  if (next_page_ + 2 * pages > store_->capacity_pages()) {
    return ResourceExhausted("checkpoint store full (", store_->capacity_pages(), " pages)");
  }
  for (Slot& s : e->slots) {
    s.first_page = next_page_;
    s.pages = pages;
    next_page_ += pages;
  }
  stats_.pages_used = next_page_;
  return Status::Ok();
}

void CheckpointKeeper::Serve(int fd) {
  while (true) {
    uint8_t type = 0;
    std::vector<uint8_t> b;
    Status s = RecvOn(fd, &type, &b);
    if (!s.ok()) return;
    switch (type) {
      case kRestoreRequest:
        s = SendRestore(fd);
        if (!s.ok()) {
          TLOG(ERROR) << "paramsvc supervisor: restore failed: " << s;
          return;
        }
        break;
      case kJob: {
        if (b.size() < 8) return;
        const uint32_t spec_len = DecodeFixed32(b.data() + 4);
        if (b.size() < 8ull + spec_len + 8) return;
        auto spec = JobSpec::Decode({b.data() + 8, spec_len});
        if (!spec.ok()) return;
        size_t off = 8 + spec_len;
        const uint64_t staged = DecodeFixed64(b.data() + off);
        off += 8;
        std::string source;
        if (!GetStr(b, &off, &source) || off != b.size()) return;
        std::lock_guard<std::mutex> l(mu_);
        JobEntry& j = jobs_[DecodeFixed32(b.data())];
        TrimJob(j);
        j.spec = *spec;
        const size_t n = PartitionModel(*spec).size();
        j.parts.assign(n, PartEntry{});
        j.received.assign(n, 0);
        j.has.assign(n, 0);
        j.staged_move = staged;
        j.staged_from = source;
        break;
      }
      case kDrop: {
        if (b.size() != 4) return;
        std::lock_guard<std::mutex> l(mu_);
        auto it = jobs_.find(DecodeFixed32(b.data()));
        if (it == jobs_.end()) break;
        TrimJob(it->second);
        jobs_.erase(it);
        break;
      }
      case kActivate: {
        if (b.size() != 4) return;
        std::lock_guard<std::mutex> l(mu_);
        auto it = jobs_.find(DecodeFixed32(b.data()));
        if (it == jobs_.end()) break;
        it->second.staged_move = 0;
        it->second.staged_from.clear();
        break;
      }
      case kMoved: {  // A job moved away (or an old id of a job back here, sent again)
        MovedRecord r;
        if (!DecodeMoved(b, &r)) return;
        std::lock_guard<std::mutex> l(mu_);
        auto it = jobs_.find(r.job);
        if (it != jobs_.end()) {
          TrimJob(it->second);
          jobs_.erase(it);
        }
        moved_[r.job] = r;
        break;
      }
      case kDrain: {
        std::lock_guard<std::mutex> l(mu_);
        if (!DecodeDrain(b, &drain_, &drain_to_)) return;
        break;
      }
      case kSync: {
        if (b.size() != 4) return;
        Drain();
        uint8_t durable = 0;
        {
          std::lock_guard<std::mutex> l(mu_);
          durable = DecodeFixed32(b.data()) == 0 || Durable(DecodeFixed32(b.data())) ? 1 : 0;
        }
        if (!SendOn(fd, kSyncAck, {&durable, 1}, {}).ok()) return;
        break;
      }
      case kPart: {
        if (b.size() < 8 + 24) return;
        const uint32_t job = DecodeFixed32(b.data());
        const uint32_t part = DecodeFixed32(b.data() + 4);
        std::lock_guard<std::mutex> l(mu_);
        stats_.saves_received++;
        auto it = jobs_.find(job);
        if (it == jobs_.end() || part >= it->second.parts.size()) break;
        it->second.received[part] = DecodeFixed64(b.data() + 8);
        it->second.has[part] = 1;
        if (!store_) break;
        PartEntry& e = it->second.parts[part];
        if (e.pending) stats_.saves_superseded++;
        e.pending = true;
        e.pending_version = DecodeFixed64(b.data() + 8);
        e.pending_bytes.assign(b.begin() + 8, b.end());
        cv_.notify_all();
        break;
      }
      default:
        TLOG(ERROR) << "paramsvc supervisor: unknown checkpoint message " << int{type};
        return;
    }
  }
}

void CheckpointKeeper::WriterLoop() {
  std::vector<uint8_t> buf;
  while (true) {
    uint32_t job = 0, part = 0;
    uint64_t version = 0;
    std::vector<uint8_t> bytes;
    Slot slot;
    int slot_index = 0;
    {
      std::unique_lock<std::mutex> l(mu_);
      bool found = false;
      cv_.wait(l, [&] {
        if (stop_) return true;
        for (auto& [jid, j] : jobs_) {
          for (uint32_t i = 0; i < j.parts.size(); ++i) {
            if (j.parts[i].pending) {
              job = jid;
              part = i;
              found = true;
              return true;
            }
          }
        }
        return false;
      });
      if (stop_ && !found) return;
      PartEntry& e = jobs_[job].parts[part];
      e.pending = false;
      bytes.swap(e.pending_bytes);
      version = e.pending_version;
      if (e.slots[0].pages == 0) {
        const uint64_t count = PartitionModel(jobs_[job].spec)[part].count;
        Status s = Allocate(&e, 24 + 12 * count);
        if (!s.ok()) {
          stats_.write_errors++;
          TLOG(ERROR) << "paramsvc supervisor: " << s;
          continue;
        }
      }
      slot_index = e.current == 0 ? 1 : 0;
      slot = e.slots[slot_index];
      if (bytes.size() > slot.pages * client::kPageSize) {
        stats_.write_errors++;
        continue;
      }
      writing_++;
    }
    buf.assign(slot.pages * client::kPageSize, 0);
    std::memcpy(buf.data(), bytes.data(), bytes.size());
    std::vector<client::PageId> ids(slot.pages);
    for (uint64_t i = 0; i < slot.pages; ++i) ids[i] = slot.first_page + i;
    Status s = store_->WritePages(ids.data(), ids.size(), buf.data());
    const auto digest = fabric::Sha256::Hash(bytes);
    std::lock_guard<std::mutex> l(mu_);
    writing_--;
    auto it = jobs_.find(job);
    if (!s.ok()) {
      stats_.write_errors++;
      TLOG(ERROR) << "paramsvc supervisor: checkpoint write failed: " << s;
    } else if (it != jobs_.end()) {
      PartEntry& e = it->second.parts[part];
      e.current = slot_index;
      e.version = version;
      e.length = bytes.size();
      e.digest = digest;
      stats_.saves_written++;
    }
    cv_.notify_all();
  }
}

void CheckpointKeeper::TrimJob(JobEntry& j) {
  if (!store_) return;
  for (auto& p : j.parts) {
    for (auto& sl : p.slots) {
      if (sl.pages) store_->Trim(sl.first_page, sl.pages).IgnoreError();
    }
  }
}

bool CheckpointKeeper::Durable(uint32_t job) {
  if (!store_) return false;
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return false;
  const JobEntry& j = it->second;
  for (size_t i = 0; i < j.parts.size(); ++i) {
    const PartEntry& e = j.parts[i];
    if (!j.has[i] || e.pending || e.current < 0 || e.version != j.received[i]) return false;
  }
  return true;
}

Status CheckpointKeeper::SendRestore(int fd) {
  std::unique_lock<std::mutex> l(mu_);
  if (store_) {
    for (auto& [jid, j] : jobs_) {
      std::vector<uint8_t> msg(8);
      EncodeFixed32(msg.data(), jid);
      const auto spec = j.spec.Encode();
      EncodeFixed32(msg.data() + 4, static_cast<uint32_t>(spec.size()));
      msg.insert(msg.end(), spec.begin(), spec.end());
      uint8_t n[4];
      EncodeFixed32(n, static_cast<uint32_t>(j.parts.size()));
      msg.insert(msg.end(), n, n + 4);
      uint64_t vmin = UINT64_MAX, vmax = 0;
      for (auto& e : j.parts) {
        std::vector<uint8_t> data;
        if (e.current >= 0) {
          const Slot& sl = e.slots[e.current];
          data.resize(sl.pages * client::kPageSize);
          std::vector<client::PageId> ids(sl.pages);
          for (uint64_t i = 0; i < sl.pages; ++i) ids[i] = sl.first_page + i;
          Status s = store_->ReadPages(ids.data(), ids.size(), data.data());
          if (!s.ok()) return s.WithContext("reading a checkpoint back");
          data.resize(e.length);
          if (fabric::Sha256::Hash(data) != e.digest) {
            return Corruption("checkpoint of job ", jid, " does not match its digest");
          }
          vmin = std::min(vmin, e.version);
          vmax = std::max(vmax, e.version);
        }
        EncodeFixed32(n, static_cast<uint32_t>(data.size()));
        msg.insert(msg.end(), n, n + 4);
        msg.insert(msg.end(), data.begin(), data.end());
      }
      uint8_t mv[8];
      EncodeFixed64(mv, j.staged_move);
      msg.insert(msg.end(), mv, mv + 8);
      PutStr(&msg, j.staged_from);
      Status s = SendOn(fd, kRestoreJob, msg, {});
      if (!s.ok()) return s;
      TLOG(WARNING) << "paramsvc supervisor: restored job " << jid << " ('" << j.spec.name
                    << "') from the erasure-coded store at versions " << vmin << ".." << vmax
                    << (j.staged_move ? " (a staged copy of a move arriving)" : "");
    }
  }
  for (const auto& [_, r] : moved_) {
    Status s = SendOn(fd, kRestoreMoved, EncodeMoved(r), {});
    if (!s.ok()) return s;
  }
  if (drain_) {
    Status s = SendOn(fd, kRestoreDrain, EncodeDrain(drain_, drain_to_), {});
    if (!s.ok()) return s;
  }
  return SendOn(fd, kRestoreEnd, {}, {});
}

void CheckpointKeeper::Drain() {
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait(l, [&] {
    if (writing_ > 0) return false;
    for (auto& [_, j] : jobs_) {
      for (auto& e : j.parts) {
        if (e.pending) return false;
      }
    }
    return true;
  });
}

KeeperStats CheckpointKeeper::stats() {
  std::lock_guard<std::mutex> l(mu_);
  return stats_;
}

std::vector<uint64_t> CheckpointKeeper::DurableVersions(uint32_t job) {
  std::lock_guard<std::mutex> l(mu_);
  std::vector<uint64_t> v;
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return v;
  for (auto& e : it->second.parts) v.push_back(e.current >= 0 ? e.version : 0);
  return v;
}

}  // namespace tessera::paramsvc
