// MemoryStore: an in-memory PageStore test double for the NBD server's tests.
//
// Ops are completed by one store thread, never inside Submit. By default the thread takes every
// op queued so far and completes them in a shuffled order (seeded), so completions are out of
// order. Hold() keeps ops queued until Release(reverse) completes them (reversed or in order),
// which lets a test force a completion order. Data is copied at completion time. Pages named by
// FailReads() fail with DataLoss. It records every page an op or Trim touched beyond the
// capacity (there must be none: the store answers them OutOfRange) and counts trims/flushes.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <unordered_map>
#include <vector>

#include "client/page_store.h"

namespace tessera::nbd::testing {

class MemoryStore : public client::PageStore {
 public:
  explicit MemoryStore(uint64_t capacity_pages, uint64_t seed = 1);
  ~MemoryStore() override;

  std::string name() const override { return "memory"; }
  uint64_t capacity_pages() const override { return capacity_; }
  double memory_overhead() const override { return 1.0; }
  Status Submit(std::span<client::PageOp* const> ops) override;
  Status Trim(client::PageId first, uint64_t count) override;
  Status Flush() override;
  client::PageStoreStats Stats() const override;

  void Hold();
  // Waits (bounded) until at least n ops are held; false on timeout.
  bool WaitHeld(size_t n, int timeout_ms = 10000);
  void Release(bool reverse);
  void FailReads(client::PageId page);
  // The next n ops (any kind) fail with Unavailable, as when a server dies under them.
  void FailNextOpsUnavailable(uint64_t n);

  // Direct access to the stored bytes of a page (zeros if never written).
  std::vector<uint8_t> Page(client::PageId page);
  void Put(client::PageId page, const std::vector<uint8_t>& bytes);

  uint64_t trimmed_pages() const;
  uint64_t flushes() const;
  uint64_t out_of_range_ops() const;
  uint64_t writes() const;

 private:
  void Run();
  void CompleteOne(client::PageOp* op);

  const uint64_t capacity_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<client::PageOp*> queue_;
  bool hold_ = false;
  bool stop_ = false;
  std::mt19937_64 rng_;
  std::unordered_map<client::PageId, std::vector<uint8_t>> pages_;
  std::set<client::PageId> fail_reads_;
  uint64_t fail_unavailable_ = 0;
  uint64_t trimmed_ = 0, flushes_ = 0, out_of_range_ = 0, reads_ = 0, writes_ = 0, trims_ = 0;
  std::thread thread_;
};

}  // namespace tessera::nbd::testing
