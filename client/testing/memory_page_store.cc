#include "client/testing/memory_page_store.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "common/clock.h"

namespace tessera::client::testing {

namespace {
Status Validate(const MemoryPageStoreOptions& o) {
  if (o.capacity_pages == 0) return InvalidArgument("memory store: capacity_pages must be > 0");
  if (o.latency_us < 0) return InvalidArgument("memory store: latency_us must be >= 0");
  return Status::Ok();
}
}  // namespace

Result<std::unique_ptr<MemoryPageStore>> MemoryPageStore::Create(MemoryPageStoreOptions options) {
  TESSERA_RETURN_IF_ERROR(Validate(options));
  return std::make_unique<MemoryPageStore>(std::move(options));
}

MemoryPageStore::MemoryPageStore(MemoryPageStoreOptions options)
    : opt_(std::move(options)), latency_us_(opt_.latency_us), rng_(opt_.shuffle_seed) {
  if (Status st = Validate(opt_); !st.ok()) {
    // A mistake in the test that builds the double, not an input to recover from.
    std::fprintf(stderr, "MemoryPageStore: %s\n", st.ToString().c_str());
    std::abort();
  }
  thread_ = std::thread([this] { Run(); });
}

MemoryPageStore::MemoryPageStore(uint64_t capacity_pages, int64_t latency_us)
    : MemoryPageStore(
          MemoryPageStoreOptions{.capacity_pages = capacity_pages, .latency_us = latency_us}) {}

MemoryPageStore::~MemoryPageStore() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  Release(ReleaseOrder::kSubmission);  // Completes anything still held; notifies the thread.
  thread_.join();
}

Status MemoryPageStore::Submit(std::span<PageOp* const> ops) {
  TESSERA_RETURN_IF_ERROR(ValidateBatch(ops));
  const uint64_t now = MonotonicNs();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return Unavailable(opt_.name, ": store is shutting down");
    if (!submit_error_.ok()) return submit_error_;
    for (PageOp* op : ops) queue_.push_back(Queued{op, now});
  }
  cv_.notify_all();
  return Status::Ok();
}

void MemoryPageStore::Run() {
  std::vector<Queued> batch;
  for (;;) {
    int64_t latency_us = 0;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] {
        return !released_.empty() || (!hold_all_ && !queue_.empty()) ||
               (stop_ && queue_.empty() && held_.empty());
      });
      if (!released_.empty()) {
        batch.assign(released_.begin(), released_.end());  // In the order Release() chose.
        released_.clear();
      } else if (!hold_all_ && !queue_.empty()) {
        batch.assign(queue_.begin(), queue_.end());
        queue_.clear();
        if (opt_.shuffle_seed != 0) std::shuffle(batch.begin(), batch.end(), rng_);
      } else {
        return;  // Stopping, nothing left.
      }
      latency_us = latency_us_;
    }
    if (latency_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(latency_us));
    for (const Queued& q : batch) {
      PageOp* op = q.op;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (hold_writes_ && op->kind == PageOp::Kind::kWrite) {
          held_.push_back(q);
          cv_.notify_all();  // WaitHeld.
          continue;
        }
        op->status = Apply(op);
        const bool read = op->kind == PageOp::Kind::kRead;
        (read ? reads_ : writes_)++;
        if (!op->status.ok()) {
          (read ? read_errors_ : write_errors_)++;
          if (op->status.code() == StatusCode::kDataLoss) data_loss_++;
        }
        (read ? read_latency_ : write_latency_).Record(MonotonicNs() - q.submit_ns);
      }
      op->done(op);  // Without the lock: the callback may call back into the store.
    }
    batch.clear();
  }
}

Status MemoryPageStore::Apply(PageOp* op) {
  const PageId p = op->page;
  if (fail_next_ops_ > 0) {
    fail_next_ops_--;
    return next_ops_error_.WithContext(opt_.name + ": page " + std::to_string(p));
  }
  if (p >= opt_.capacity_pages) {
    out_of_range_++;
    return OutOfRange(opt_.name, ": page ", p, " is beyond the store's ", opt_.capacity_pages,
                      " pages");
  }
  if (op->kind == PageOp::Kind::kWrite) {
    if (!write_error_.ok()) return write_error_;
    pages_[p].assign(op->buf, op->buf + kPageSize);
    lost_.erase(p);
    writes_per_page_[p]++;
    writes_stored_++;
    return Status::Ok();
  }
  if (!read_error_.ok()) return read_error_;
  if (fail_reads_.count(p) != 0 || lost_.count(p) != 0) {
    return DataLoss(opt_.name, ": page ", p, " is lost (injected)");
  }
  auto it = pages_.find(p);
  if (it == pages_.end()) {
    std::memset(op->buf, 0, kPageSize);
  } else {
    std::memcpy(op->buf, it->second.data(), kPageSize);
  }
  bytes_received_ += kPageSize;
  return Status::Ok();
}

Status MemoryPageStore::Trim(PageId first, uint64_t count) {
  std::lock_guard<std::mutex> lock(mu_);
  if (first > opt_.capacity_pages || count > opt_.capacity_pages - first) {
    out_of_range_++;
    return OutOfRange(opt_.name, ": trim of ", count, " pages from ", first,
                      " goes beyond the store's ", opt_.capacity_pages, " pages");
  }
  for (PageId p = first; p < first + count; ++p) pages_.erase(p);
  trimmed_ += count;
  trim_calls_++;
  return Status::Ok();
}

Status MemoryPageStore::Flush() {
  std::lock_guard<std::mutex> lock(mu_);
  flushes_++;
  return flush_error_;
}

PageStoreStats MemoryPageStore::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  PageStoreStats s;
  s.reads = reads_;
  s.writes = writes_;
  s.read_errors = read_errors_;
  s.write_errors = write_errors_;
  s.data_loss = data_loss_;
  s.trims = trimmed_;
  s.bytes_sent = writes_stored_ * kPageSize;
  s.bytes_received = bytes_received_;
  s.stored_pages = pages_.size();
  s.read_latency = read_latency_;
  s.write_latency = write_latency_;
  return s;
}

void MemoryPageStore::FailReads(PageId page) {
  std::lock_guard<std::mutex> lock(mu_);
  fail_reads_.insert(page);
}

void MemoryPageStore::HealReads(PageId page) {
  std::lock_guard<std::mutex> lock(mu_);
  fail_reads_.erase(page);
  lost_.erase(page);
}

void MemoryPageStore::LosePage(PageId page) {
  std::lock_guard<std::mutex> lock(mu_);
  lost_.insert(page);
}

void MemoryPageStore::FailReadsWith(Status st) {
  std::lock_guard<std::mutex> lock(mu_);
  read_error_ = std::move(st);
}

void MemoryPageStore::FailWritesWith(Status st) {
  std::lock_guard<std::mutex> lock(mu_);
  write_error_ = std::move(st);
}

void MemoryPageStore::FailNextOps(uint64_t n, Status st) {
  std::lock_guard<std::mutex> lock(mu_);
  fail_next_ops_ = st.ok() ? 0 : n;
  next_ops_error_ = std::move(st);
}

void MemoryPageStore::RejectSubmits(Status st) {
  std::lock_guard<std::mutex> lock(mu_);
  submit_error_ = std::move(st);
}

void MemoryPageStore::FailFlushWith(Status st) {
  std::lock_guard<std::mutex> lock(mu_);
  flush_error_ = std::move(st);
}

void MemoryPageStore::SetLatencyUs(int64_t latency_us) {
  std::lock_guard<std::mutex> lock(mu_);
  latency_us_ = latency_us;
}

void MemoryPageStore::Hold(HoldKind kind) {
  std::lock_guard<std::mutex> lock(mu_);
  if (kind == HoldKind::kAll) {
    hold_all_ = true;
  } else {
    hold_writes_ = true;
  }
}

void MemoryPageStore::Release(ReleaseOrder order) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::deque<Queued> ops;
    // Writes held by kWrites were taken before anything still queued under kAll.
    ops.swap(held_);
    if (hold_all_) {
      ops.insert(ops.end(), queue_.begin(), queue_.end());
      queue_.clear();
    }
    hold_all_ = false;
    hold_writes_ = false;
    if (order == ReleaseOrder::kReverse) std::reverse(ops.begin(), ops.end());
    released_.insert(released_.end(), ops.begin(), ops.end());
  }
  cv_.notify_all();
}

size_t MemoryPageStore::HeldLocked() const {
  return held_.size() + (hold_all_ ? queue_.size() : 0);
}

size_t MemoryPageStore::held() const {
  std::lock_guard<std::mutex> lock(mu_);
  return HeldLocked();
}

bool MemoryPageStore::WaitHeld(size_t n, std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return HeldLocked() >= n; });
}

std::vector<uint8_t> MemoryPageStore::Page(PageId page) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = pages_.find(page);
  if (it == pages_.end()) return std::vector<uint8_t>(kPageSize, 0);
  return it->second;
}

void MemoryPageStore::Put(PageId page, std::span<const uint8_t> bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<uint8_t>& v = pages_[page];
  v.assign(kPageSize, 0);
  std::memcpy(v.data(), bytes.data(), std::min(bytes.size(), kPageSize));
}

bool MemoryPageStore::Holds(PageId page) const {
  std::lock_guard<std::mutex> lock(mu_);
  return pages_.count(page) != 0;
}

uint64_t MemoryPageStore::writes_of(PageId page) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = writes_per_page_.find(page);
  return it == writes_per_page_.end() ? 0 : it->second;
}

uint64_t MemoryPageStore::writes_stored() const {
  std::lock_guard<std::mutex> lock(mu_);
  return writes_stored_;
}

uint64_t MemoryPageStore::reads_completed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reads_;
}

uint64_t MemoryPageStore::trimmed_pages() const {
  std::lock_guard<std::mutex> lock(mu_);
  return trimmed_;
}

uint64_t MemoryPageStore::trim_calls() const {
  std::lock_guard<std::mutex> lock(mu_);
  return trim_calls_;
}

uint64_t MemoryPageStore::flushes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return flushes_;
}

uint64_t MemoryPageStore::out_of_range_ops() const {
  std::lock_guard<std::mutex> lock(mu_);
  return out_of_range_;
}

}  // namespace tessera::client::testing
