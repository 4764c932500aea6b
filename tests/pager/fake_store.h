// FakeStore: an in-memory, asynchronous client::PageStore test double for the pager tests.
// Ops are completed from the store's own thread (like the real stores), optionally after a
// delay; reads and writes are counted per page; chosen pages can be made to fail reads with
// DataLoss. Trim() forgets pages.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <set>
#include <thread>
#include <unordered_map>
#include <vector>

#include "client/page_store.h"

namespace tessera::testing {

class FakeStore final : public client::PageStore {
 public:
  explicit FakeStore(uint64_t capacity_pages, int delay_us = 0)
      : capacity_(capacity_pages), delay_us_(delay_us), worker_([this] { Run(); }) {}
  ~FakeStore() override {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }

  std::string name() const override { return "fake"; }
  uint64_t capacity_pages() const override { return capacity_; }
  double memory_overhead() const override { return 1.0; }

  Status Submit(std::span<client::PageOp* const> ops) override {
    TESSERA_RETURN_IF_ERROR(ValidateBatch(ops));
    {
      std::lock_guard<std::mutex> l(mu_);
      if (stop_) return Unavailable("fake store stopped");
      for (auto* op : ops) queue_.push_back(op);
    }
    cv_.notify_one();
    return Status::Ok();
  }
  Status Trim(client::PageId first, uint64_t count) override {
    std::lock_guard<std::mutex> l(data_mu_);
    for (uint64_t i = 0; i < count; ++i) data_.erase(first + i);
    trims_ += count;
    return Status::Ok();
  }
  Status Flush() override { return Status::Ok(); }
  client::PageStoreStats Stats() const override {
    client::PageStoreStats s;
    s.reads = reads_.load();
    s.writes = writes_.load();
    return s;
  }

  void FailReads(client::PageId p) {
    std::lock_guard<std::mutex> l(data_mu_);
    failing_.insert(p);
  }
  // While set, every write fails with Unavailable (and stores nothing).
  void FailWrites(bool fail) { fail_writes_.store(fail); }
  uint64_t reads() const { return reads_.load(); }
  uint64_t writes() const { return writes_.load(); }
  uint64_t writes_of(client::PageId p) {
    std::lock_guard<std::mutex> l(data_mu_);
    auto it = page_writes_.find(p);
    return it == page_writes_.end() ? 0 : it->second;
  }
  bool Has(client::PageId p) {
    std::lock_guard<std::mutex> l(data_mu_);
    return data_.count(p) != 0;
  }
  uint64_t trims() {
    std::lock_guard<std::mutex> l(data_mu_);
    return trims_;
  }

 private:
  void Run() {
    std::unique_lock<std::mutex> l(mu_);
    for (;;) {
      cv_.wait(l, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty() && stop_) return;
      std::deque<client::PageOp*> batch;
      batch.swap(queue_);
      l.unlock();
      if (delay_us_ > 0) std::this_thread::sleep_for(std::chrono::microseconds(delay_us_));
      for (auto* op : batch) {
        Execute(op);
        op->done(op);
      }
      l.lock();
    }
  }
  void Execute(client::PageOp* op) {
    if (op->page >= capacity_) {
      op->status = OutOfRange("page ", op->page);
      return;
    }
    std::lock_guard<std::mutex> l(data_mu_);
    if (op->kind == client::PageOp::Kind::kRead) {
      reads_++;
      if (failing_.count(op->page)) {
        op->status = DataLoss("page ", op->page, " lost (injected)");
        return;
      }
      auto it = data_.find(op->page);
      if (it == data_.end()) std::memset(op->buf, 0, client::kPageSize);
      else std::memcpy(op->buf, it->second.data(), client::kPageSize);
    } else {
      if (fail_writes_.load()) {
        op->status = Unavailable("writes failing (injected)");
        return;
      }
      writes_++;
      page_writes_[op->page]++;
      auto& v = data_[op->page];
      v.assign(op->buf, op->buf + client::kPageSize);
    }
    op->status = Status::Ok();
  }

  const uint64_t capacity_;
  const int delay_us_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<client::PageOp*> queue_;
  bool stop_ = false;
  std::mutex data_mu_;
  std::unordered_map<client::PageId, std::vector<uint8_t>> data_;
  std::unordered_map<client::PageId, uint64_t> page_writes_;
  std::set<client::PageId> failing_;
  uint64_t trims_ = 0;
  std::atomic<uint64_t> reads_{0}, writes_{0};
  std::atomic<bool> fail_writes_{false};
  std::thread worker_;  // Last: starts after the members above exist.
};

}  // namespace tessera::testing
