#include "client/disk_backed_store.h"

#include <atomic>
#include <boost/lockfree/stack.hpp>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "common/clock.h"
#include "common/logging.h"

namespace tessera::client {
namespace {

constexpr size_t kStripes = 64;

enum class Stage : uint8_t { kPrimaryRead, kPrimaryWrite, kBackupRead, kBackupWrite };

// One op of this store in flight: the inner op it posts, the caller's op, and for writes a
// staging copy of the page that lives until the backup write completes.
struct Ctx {
  PageOp inner;
  PageOp* outer = nullptr;
  DiskBackedStore::Impl* impl = nullptr;
  uint64_t version = 0;
  uint64_t start_ns = 0;
  Status primary_status;
  Stage stage = Stage::kPrimaryRead;
  // A write the primary could not store: acknowledged once it is on disk instead.
  bool write_through = false;
  alignas(kPageSize) uint8_t data[kPageSize];
};

// Backup state of a page with a backup write in flight.
// At most one backup write of a page is in flight; the others wait here in order. Coalescing
// keeps at most one already-acknowledged write waiting (the newest); write-through writes (not
// yet acknowledged) each keep their place, since each must complete on its own.
struct PendingBackup {
  uint64_t inflight_version = 0;
  std::vector<Ctx*> queue;
};

struct Stripe {
  std::mutex mu;
  std::unordered_map<PageId, PendingBackup> pending;
};

bool PrimaryLost(const Status& st) {
  return st.code() == StatusCode::kUnavailable || st.code() == StatusCode::kDataLoss ||
         st.code() == StatusCode::kTimeout;
}

void OnInnerDone(PageOp* op);

}  // namespace

struct DiskBackedStore::Impl {
  std::unique_ptr<PageStore> primary;
  std::unique_ptr<PageStore> backup;
  uint64_t capacity = 0;
  std::unique_ptr<std::atomic<uint64_t>[]> acked_version;
  std::unique_ptr<std::atomic<uint64_t>[]> disk_version;
  std::unique_ptr<std::atomic<uint64_t>[]> primary_version;  // Last write the primary stored.
  std::atomic<uint64_t> next_version{0};
  Stripe stripes[kStripes];

  boost::lockfree::stack<Ctx*> pool{256};
  std::atomic<uint64_t> live{0};                // Ctxs out of the pool.
  std::atomic<uint64_t> backups_outstanding{0}; // Scheduled backup writes not yet completed.
  std::atomic<uint64_t> fallbacks{0};
  std::atomic<uint64_t> stale{0};
  std::atomic<uint64_t> written_through{0};

  mutable std::mutex stats_mu;
  uint64_t reads = 0, writes = 0, read_errors = 0, write_errors = 0, trims = 0, data_loss = 0;
  uint64_t backup_errors = 0;
  std::string last_backup_error;
  LatencyHistogram read_latency, write_latency;

  ~Impl() {
    Ctx* c = nullptr;
    while (pool.pop(c)) delete c;
  }

  Stripe& StripeOf(PageId p) { return stripes[p % kStripes]; }

  Ctx* Get() {
    Ctx* c = nullptr;
    if (!pool.pop(c)) c = new Ctx();
    c->impl = this;
    live.fetch_add(1, std::memory_order_relaxed);
    return c;
  }
  void Put(Ctx* c) {
    c->outer = nullptr;
    TCHECK(pool.push(c)) << "disk-backed store: out of memory for the op pool";
    if (live.fetch_sub(1, std::memory_order_acq_rel) == 1) live.notify_all();
  }

  void BackupDone() {
    if (backups_outstanding.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      backups_outstanding.notify_all();
    }
  }

  void Finish(Ctx* c, Status st) { Finish(c->outer, c->start_ns, std::move(st)); }
  void Finish(PageOp* outer, uint64_t start_ns, Status st) {
    bool read = outer->kind == PageOp::Kind::kRead;
    uint64_t lat = MonotonicNs() - start_ns;
    {
      std::lock_guard<std::mutex> lock(stats_mu);
      if (read) {
        reads++;
        if (st.ok()) read_latency.Record(lat); else read_errors++;
        if (st.code() == StatusCode::kDataLoss) data_loss++;
      } else {
        writes++;
        if (st.ok()) write_latency.Record(lat); else write_errors++;
      }
    }
    outer->status = std::move(st);
    outer->done(outer);
  }

  void SubmitInner(Ctx* c, PageStore* store) {
    c->inner.status = Status::Ok();
    PageOp* p = &c->inner;
    Status st = store->Submit(std::span<PageOp* const>(&p, 1));
    if (!st.ok()) {
      c->inner.status = st;
      OnInnerDone(&c->inner);
    }
  }

  // Under the page's stripe lock: queue c's backup write behind the page's in-flight one, or
  // make it the in-flight one (returned in *to_submit). Older acknowledged writes still waiting
  // are superseded by c (returned in superseded[], at most 2 entries incl. possibly c itself).
  void ScheduleLocked(Stripe& s, Ctx* c, Ctx** to_submit, Ctx** superseded, int* n_superseded) {
    auto [it, inserted] = s.pending.try_emplace(c->inner.page);
    PendingBackup& pb = it->second;
    if (inserted) {
      pb.inflight_version = c->version;
      *to_submit = c;
      backups_outstanding.fetch_add(1, std::memory_order_acq_rel);
      return;
    }
    if (!c->write_through) {
      for (Ctx* q : pb.queue) {
        if (!q->write_through && q->version > c->version) {
          superseded[(*n_superseded)++] = c;  // An even newer acknowledged write is queued.
          return;
        }
      }
    }
    for (auto q = pb.queue.begin(); q != pb.queue.end();) {
      if (!(*q)->write_through && (*q)->version < c->version) {
        superseded[(*n_superseded)++] = *q;  // Its bytes are no longer the newest.
        q = pb.queue.erase(q);
        BackupDone();
      } else {
        ++q;
      }
    }
    pb.queue.push_back(c);
    backups_outstanding.fetch_add(1, std::memory_order_acq_rel);
  }

  void SubmitBackup(Ctx* c) {
    c->stage = Stage::kBackupWrite;
    SubmitInner(c, backup.get());
  }

  // The primary answered a write. Stored: record it and schedule the backup write before the
  // caller learns of the ack (so a Flush() issued after the ack waits for it). Lost (the
  // primary's server is gone): write the page through to disk and acknowledge it from there.
  void OnPrimaryWrite(Ctx* c) {
    Status st = std::move(c->inner.status);
    const PageId p = c->inner.page;
    if (p >= capacity || (!st.ok() && !PrimaryLost(st))) {
      Finish(c, std::move(st));
      Put(c);
      return;
    }
    // Once c is published below, another thread may post and recycle it: keep what Finish needs.
    PageOp* const outer = c->outer;
    const uint64_t start_ns = c->start_ns;
    const bool stored = st.ok();
    c->write_through = !stored;
    if (!stored) c->primary_status = std::move(st);
    Ctx* to_submit = nullptr;
    Ctx* superseded[2];
    int n_superseded = 0;
    {
      Stripe& s = StripeOf(p);
      std::lock_guard<std::mutex> lock(s.mu);
      if (stored) {
        if (c->version > primary_version[p].load(std::memory_order_relaxed)) {
          primary_version[p].store(c->version, std::memory_order_release);
        }
        if (c->version > acked_version[p].load(std::memory_order_relaxed)) {
          acked_version[p].store(c->version, std::memory_order_release);
        }
      }
      ScheduleLocked(s, c, &to_submit, superseded, &n_superseded);
    }
    if (stored) Finish(outer, start_ns, Status::Ok());
    for (int i = 0; i < n_superseded; ++i) Put(superseded[i]);
    if (to_submit != nullptr) SubmitBackup(to_submit);
  }

  void OnBackupWrite(Ctx* c) {
    const PageId p = c->inner.page;
    Status st = std::move(c->inner.status);
    Ctx* next = nullptr;
    {
      Stripe& s = StripeOf(p);
      std::lock_guard<std::mutex> lock(s.mu);
      // The bytes of exactly this version are now in the file (or, on error, unknown bytes: the
      // old version number stays, which is below the acknowledged one, so no fallback).
      if (st.ok()) {
        disk_version[p].store(c->version, std::memory_order_release);
        if (c->write_through && c->version > acked_version[p].load(std::memory_order_relaxed)) {
          acked_version[p].store(c->version, std::memory_order_release);
        }
      }
      auto it = s.pending.find(p);
      TCHECK(it != s.pending.end()) << "backup completion for page " << p << " without state";
      if (!it->second.queue.empty()) {
        next = it->second.queue.front();
        it->second.queue.erase(it->second.queue.begin());
        it->second.inflight_version = next->version;
      } else {
        s.pending.erase(it);
      }
    }
    if (c->write_through) {
      if (st.ok()) {
        written_through.fetch_add(1, std::memory_order_relaxed);
        Finish(c, Status::Ok());
      } else {
        Finish(c, c->primary_status.WithContext("page " + std::to_string(p) +
                                                ": the primary could not store the write and "
                                                "the disk write failed too (" +
                                                st.ToString() + ")"));
      }
    } else if (!st.ok()) {
      std::lock_guard<std::mutex> lock(stats_mu);
      backup_errors++;
      last_backup_error = st.WithContext("backup write of page " + std::to_string(p)).ToString();
    }
    Put(c);
    if (next != nullptr) SubmitBackup(next);
    BackupDone();
  }

  void OnPrimaryRead(Ctx* c) {
    Status st = std::move(c->inner.status);
    const PageId p = c->inner.page;
    if (p >= capacity || (!st.ok() && !PrimaryLost(st))) {
      Finish(c, std::move(st));
      Put(c);
      return;
    }
    uint64_t acked, disk, prim;
    {
      Stripe& s = StripeOf(p);
      std::lock_guard<std::mutex> lock(s.mu);
      acked = acked_version[p].load(std::memory_order_acquire);
      disk = disk_version[p].load(std::memory_order_acquire);
      prim = primary_version[p].load(std::memory_order_acquire);
    }
    if (st.ok() && prim >= acked) {
      Finish(c, std::move(st));
      Put(c);
      return;
    }
    if (st.ok()) {
      // The last acknowledged write went to disk only: the primary's bytes are older.
      st = Unavailable("page ", p, ": the primary holds an older version than the last "
                       "acknowledged write (written through to disk)");
    }
    // Use the disk copy if it holds the last acknowledged write.
    if (disk < acked) {
      stale.fetch_add(1, std::memory_order_relaxed);
      Finish(c, Status(st.code(), st.message() + "; the disk backup of page " +
                                      std::to_string(p) +
                                      " is behind the last acknowledged write, not used"));
      Put(c);
      return;
    }
    c->primary_status = std::move(st);
    c->stage = Stage::kBackupRead;
    SubmitInner(c, backup.get());
  }

  void OnBackupRead(Ctx* c) {
    Status st = std::move(c->inner.status);
    if (st.ok()) {
      fallbacks.fetch_add(1, std::memory_order_relaxed);
      Finish(c, Status::Ok());
    } else {
      Finish(c, c->primary_status.WithContext(
                    "page " + std::to_string(c->inner.page) +
                    ": primary failed and the disk backup read failed too (" + st.ToString() +
                    ")"));
    }
    Put(c);
  }
};

namespace {
void OnInnerDone(PageOp* op) {
  Ctx* c = static_cast<Ctx*>(op->user);
  switch (c->stage) {
    case Stage::kPrimaryWrite: c->impl->OnPrimaryWrite(c); break;
    case Stage::kBackupWrite: c->impl->OnBackupWrite(c); break;
    case Stage::kPrimaryRead: c->impl->OnPrimaryRead(c); break;
    case Stage::kBackupRead: c->impl->OnBackupRead(c); break;
  }
}
}  // namespace

DiskBackedStore::DiskBackedStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Result<std::unique_ptr<DiskBackedStore>> DiskBackedStore::Create(
    std::unique_ptr<PageStore> primary, std::unique_ptr<PageStore> backup) {
  if (primary == nullptr || backup == nullptr) {
    return InvalidArgument("disk-backed store needs a primary and a backup store");
  }
  if (backup->capacity_pages() < primary->capacity_pages()) {
    return InvalidArgument("disk backup holds ", backup->capacity_pages(),
                           " pages, fewer than the primary's ", primary->capacity_pages());
  }
  auto impl = std::make_unique<Impl>();
  impl->capacity = primary->capacity_pages();
  impl->acked_version = std::make_unique<std::atomic<uint64_t>[]>(impl->capacity);
  impl->disk_version = std::make_unique<std::atomic<uint64_t>[]>(impl->capacity);
  impl->primary_version = std::make_unique<std::atomic<uint64_t>[]>(impl->capacity);
  for (uint64_t i = 0; i < impl->capacity; ++i) {
    impl->acked_version[i].store(0, std::memory_order_relaxed);
    impl->disk_version[i].store(0, std::memory_order_relaxed);
    impl->primary_version[i].store(0, std::memory_order_relaxed);
  }
  impl->primary = std::move(primary);
  impl->backup = std::move(backup);
  return std::unique_ptr<DiskBackedStore>(new DiskBackedStore(std::move(impl)));
}

DiskBackedStore::~DiskBackedStore() {
  // Every accepted op and backup write completes (the inner stores complete every op they
  // accepted); then the inner stores are destroyed, primary first since its callbacks post to
  // the backup, which joins their threads before any Ctx is freed.
  for (uint64_t n = impl_->live.load(std::memory_order_acquire); n != 0;
       n = impl_->live.load(std::memory_order_acquire)) {
    impl_->live.wait(n, std::memory_order_acquire);
  }
  impl_->primary.reset();
  impl_->backup.reset();
}

std::string DiskBackedStore::name() const {
  return "disk-backed(" + impl_->primary->name() + " + " + impl_->backup->name() + ")";
}

uint64_t DiskBackedStore::capacity_pages() const { return impl_->capacity; }

double DiskBackedStore::memory_overhead() const {
  return impl_->primary->memory_overhead() + impl_->backup->memory_overhead();
}

Status DiskBackedStore::Submit(std::span<PageOp* const> ops) {
  TESSERA_RETURN_IF_ERROR(ValidateBatch(ops));
  if (ops.empty()) return Status::Ok();
  // The primary accepts or rejects the whole batch, and so does this store.
  constexpr size_t kStackBatch = 64;
  PageOp* stack_inner[kStackBatch];
  std::vector<PageOp*> heap_inner;
  PageOp** inner = stack_inner;
  if (ops.size() > kStackBatch) {
    heap_inner.resize(ops.size());
    inner = heap_inner.data();
  }
  const uint64_t now = MonotonicNs();
  for (size_t i = 0; i < ops.size(); ++i) {
    PageOp* op = ops[i];
    Ctx* c = impl_->Get();
    c->outer = op;
    c->start_ns = now;
    c->inner = PageOp();
    c->inner.kind = op->kind;
    c->inner.page = op->page;
    c->inner.done = OnInnerDone;
    c->inner.user = c;
    if (op->kind == PageOp::Kind::kWrite) {
      std::memcpy(c->data, op->buf, kPageSize);
      c->inner.buf = c->data;
      c->version = impl_->next_version.fetch_add(1, std::memory_order_relaxed) + 1;
      c->stage = Stage::kPrimaryWrite;
    } else {
      c->inner.buf = op->buf;
      c->stage = Stage::kPrimaryRead;
    }
    inner[i] = &c->inner;
  }
  Status st = impl_->primary->Submit(std::span<PageOp* const>(inner, ops.size()));
  if (!st.ok()) {
    for (size_t i = 0; i < ops.size(); ++i) impl_->Put(static_cast<Ctx*>(inner[i]->user));
    return st;
  }
  return Status::Ok();
}

Status DiskBackedStore::Trim(PageId first, uint64_t count) {
  if (first >= impl_->capacity || count > impl_->capacity - first) {
    return OutOfRange("trim of pages [", first, ", ", first, "+", count,
                      ") is outside the store of ", impl_->capacity, " pages");
  }
  // No backup write may land after the hole is punched.
  for (uint64_t n = impl_->backups_outstanding.load(std::memory_order_acquire); n != 0;
       n = impl_->backups_outstanding.load(std::memory_order_acquire)) {
    impl_->backups_outstanding.wait(n, std::memory_order_acquire);
  }
  TESSERA_RETURN_IF_ERROR(impl_->primary->Trim(first, count));
  TESSERA_RETURN_IF_ERROR(impl_->backup->Trim(first, count));
  // Both copies now read as zeros: the disk copy is as new as the "write" of zeros.
  uint64_t v = impl_->next_version.fetch_add(1, std::memory_order_relaxed) + 1;
  for (uint64_t p = first; p < first + count; ++p) {
    impl_->acked_version[p].store(v, std::memory_order_release);
    impl_->disk_version[p].store(v, std::memory_order_release);
    impl_->primary_version[p].store(v, std::memory_order_release);
  }
  std::lock_guard<std::mutex> lock(impl_->stats_mu);
  impl_->trims += count;
  return Status::Ok();
}

Status DiskBackedStore::Flush() {
  for (uint64_t n = impl_->backups_outstanding.load(std::memory_order_acquire); n != 0;
       n = impl_->backups_outstanding.load(std::memory_order_acquire)) {
    impl_->backups_outstanding.wait(n, std::memory_order_acquire);
  }
  TESSERA_RETURN_IF_ERROR(impl_->primary->Flush());
  TESSERA_RETURN_IF_ERROR(impl_->backup->Flush());
  std::lock_guard<std::mutex> lock(impl_->stats_mu);
  if (impl_->backup_errors > 0) {
    Status st = IoError(impl_->backup_errors, " backup write(s) failed since the last flush; last: ",
                        impl_->last_backup_error);
    impl_->backup_errors = 0;
    return st;
  }
  return Status::Ok();
}

PageStoreStats DiskBackedStore::Stats() const {
  PageStoreStats s = impl_->primary->Stats();
  PageStoreStats b = impl_->backup->Stats();
  s.bytes_sent += b.bytes_sent;
  s.bytes_received += b.bytes_received;
  s.degraded_reads += impl_->fallbacks.load(std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(impl_->stats_mu);
  s.reads = impl_->reads;
  s.writes = impl_->writes;
  s.read_errors = impl_->read_errors;
  s.write_errors = impl_->write_errors;
  s.trims = impl_->trims;
  s.data_loss = impl_->data_loss;  // Reads this store failed, not the primary's (disk served some).
  s.read_latency = impl_->read_latency;
  s.write_latency = impl_->write_latency;
  return s;
}

uint64_t DiskBackedStore::backup_pending() const {
  return impl_->backups_outstanding.load(std::memory_order_acquire);
}
uint64_t DiskBackedStore::fallback_reads() const {
  return impl_->fallbacks.load(std::memory_order_relaxed);
}
uint64_t DiskBackedStore::written_through() const {
  return impl_->written_through.load(std::memory_order_relaxed);
}
uint64_t DiskBackedStore::stale_refusals() const {
  return impl_->stale.load(std::memory_order_relaxed);
}

}  // namespace tessera::client
