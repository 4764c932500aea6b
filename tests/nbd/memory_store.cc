#include "tests/nbd/memory_store.h"

#include <algorithm>
#include <chrono>
#include <cstring>

namespace tessera::nbd::testing {

using client::kPageSize;
using client::PageId;
using client::PageOp;

MemoryStore::MemoryStore(uint64_t capacity_pages, uint64_t seed)
    : capacity_(capacity_pages), rng_(seed) {
  thread_ = std::thread([this] { Run(); });
}

MemoryStore::~MemoryStore() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
    hold_ = false;
    cv_.notify_all();
  }
  thread_.join();
}

Status MemoryStore::Submit(std::span<PageOp* const> ops) {
  TESSERA_RETURN_IF_ERROR(ValidateBatch(ops));
  std::lock_guard<std::mutex> lk(mu_);
  for (PageOp* op : ops) queue_.push_back(op);
  cv_.notify_all();
  return Status::Ok();
}

void MemoryStore::CompleteOne(PageOp* op) {
  Status st;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (fail_unavailable_ > 0) {
      fail_unavailable_--;
      st = Unavailable("page ", op->page, ": injected server loss");
    } else if (op->page >= capacity_) {
      out_of_range_++;
      st = OutOfRange("page ", op->page, " beyond ", capacity_);
    } else if (op->kind == PageOp::Kind::kRead) {
      reads_++;
      if (fail_reads_.count(op->page)) {
        st = DataLoss("page ", op->page, ": injected");
      } else {
        auto it = pages_.find(op->page);
        if (it == pages_.end()) {
          std::memset(op->buf, 0, kPageSize);
        } else {
          std::memcpy(op->buf, it->second.data(), kPageSize);
        }
      }
    } else {
      writes_++;
      pages_[op->page].assign(op->buf, op->buf + kPageSize);
    }
  }
  op->status = st;
  op->done(op);
}

void MemoryStore::Run() {
  std::vector<PageOp*> batch;
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || (!hold_ && !queue_.empty()); });
      if (queue_.empty() && stop_) return;
      batch.assign(queue_.begin(), queue_.end());
      queue_.clear();
      std::shuffle(batch.begin(), batch.end(), rng_);
    }
    for (PageOp* op : batch) CompleteOne(op);
  }
}

Status MemoryStore::Trim(PageId first, uint64_t count) {
  std::lock_guard<std::mutex> lk(mu_);
  if (first > capacity_ || count > capacity_ - first) {
    out_of_range_++;
    return OutOfRange("trim beyond capacity");
  }
  for (uint64_t p = first; p < first + count; ++p) pages_.erase(p);
  trimmed_ += count;
  trims_++;
  return Status::Ok();
}

Status MemoryStore::Flush() {
  std::lock_guard<std::mutex> lk(mu_);
  flushes_++;
  return Status::Ok();
}

client::PageStoreStats MemoryStore::Stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  client::PageStoreStats s;
  s.reads = reads_;
  s.writes = writes_;
  s.trims = trimmed_;
  return s;
}

void MemoryStore::Hold() {
  std::lock_guard<std::mutex> lk(mu_);
  hold_ = true;
}

bool MemoryStore::WaitHeld(size_t n, int timeout_ms) {
  std::unique_lock<std::mutex> lk(mu_);
  return cv_.wait_for(lk, std::chrono::milliseconds(timeout_ms), [&] { return queue_.size() >= n; });
}

void MemoryStore::Release(bool reverse) {
  std::vector<PageOp*> batch;
  {
    std::lock_guard<std::mutex> lk(mu_);
    hold_ = false;
    batch.assign(queue_.begin(), queue_.end());
    queue_.clear();
  }
  if (reverse) std::reverse(batch.begin(), batch.end());
  for (PageOp* op : batch) CompleteOne(op);
  std::lock_guard<std::mutex> lk(mu_);
  cv_.notify_all();
}

void MemoryStore::FailNextOpsUnavailable(uint64_t n) {
  std::lock_guard<std::mutex> lk(mu_);
  fail_unavailable_ = n;
}

void MemoryStore::FailReads(PageId page) {
  std::lock_guard<std::mutex> lk(mu_);
  fail_reads_.insert(page);
}

std::vector<uint8_t> MemoryStore::Page(PageId page) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = pages_.find(page);
  if (it == pages_.end()) return std::vector<uint8_t>(kPageSize, 0);
  return it->second;
}

void MemoryStore::Put(PageId page, const std::vector<uint8_t>& bytes) {
  std::lock_guard<std::mutex> lk(mu_);
  pages_[page] = bytes;
}

uint64_t MemoryStore::trimmed_pages() const {
  std::lock_guard<std::mutex> lk(mu_);
  return trimmed_;
}
uint64_t MemoryStore::flushes() const {
  std::lock_guard<std::mutex> lk(mu_);
  return flushes_;
}
uint64_t MemoryStore::out_of_range_ops() const {
  std::lock_guard<std::mutex> lk(mu_);
  return out_of_range_;
}
uint64_t MemoryStore::writes() const {
  std::lock_guard<std::mutex> lk(mu_);
  return writes_;
}

}  // namespace tessera::nbd::testing
