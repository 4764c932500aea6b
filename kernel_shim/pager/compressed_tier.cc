#include "kernel_shim/pager/compressed_tier.h"

#include <lz4.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "common/clock.h"
#include "common/logging.h"

namespace tessera::kernel_shim {

using client::kPageSize;
using client::PageId;
using client::PageOp;

// One write-back: the page's bytes (decompressed) and the op carrying them to the store.
struct CompressedTier::Writeback {
  CompressedTier* tier = nullptr;
  PageOp op;
  uint64_t gen = 0;
  alignas(64) uint8_t buf[kPageSize];
};

Result<std::unique_ptr<CompressedTier>> CompressedTier::Create(const CompressedTierOptions& o) {
  if (o.store == nullptr) return InvalidArgument("compressed tier: no store behind it");
  if (o.capacity_bytes == 0 && !(o.budget_share > 0 && o.budget_share <= 0.75)) {
    return InvalidArgument("compressed tier: budget_share must be in (0, 0.75]");
  }
  if (o.max_compressed_bytes < 256 || o.max_compressed_bytes > kPageSize) {
    return InvalidArgument("compressed tier: max_compressed_bytes must be in 256..4096");
  }
  if (o.writeback_inflight < 1 || o.writeback_inflight > 1024) {
    return InvalidArgument("compressed tier: writeback_inflight must be in 1..1024");
  }
  if (o.writeback_retry_ms < 1 || o.writeback_retry_ms > 10000) {
    return InvalidArgument("compressed tier: writeback_retry_ms must be in 1..10000");
  }
  if (o.writeback_delay_ms > 60000) {
    return InvalidArgument("compressed tier: writeback_delay_ms must be in 0..60000");
  }
  if (o.adapt_window_hits > 65536) {
    return InvalidArgument("compressed tier: adapt_window_hits must be in 0..65536");
  }
  std::unique_ptr<CompressedTier> t(new CompressedTier(o));
  t->thread_ = std::thread([p = t.get()] { p->Loop(); });
  return t;
}

CompressedTier::CompressedTier(const CompressedTierOptions& o) : o_(o), store_(o.store) {
  for (size_t i = 0; i < o_.writeback_inflight; ++i) {
    wb_pool_.push_back(std::make_unique<Writeback>());
    wb_pool_.back()->tier = this;
    free_wb_.push_back(wb_pool_.back().get());
  }
}

CompressedTier::~CompressedTier() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::string CompressedTier::name() const { return "lz4 tier + " + store_->name(); }

void CompressedTier::SetBudgetBytes(uint64_t budget_bytes) {
  std::lock_guard<std::mutex> l(mu_);
  budget_bytes_ = budget_bytes;
}

uint64_t CompressedTier::CapacityLocked() const {
  uint64_t full;
  if (o_.capacity_bytes == 0) {
    full = static_cast<uint64_t>(o_.budget_share * static_cast<double>(budget_bytes_));
  } else {
    // A fixed size never takes more than three quarters of a budget the owner gave.
    full =
        budget_bytes_ > 0 ? std::min(o_.capacity_bytes, budget_bytes_ / 4 * 3) : o_.capacity_bytes;
  }
  return static_cast<uint64_t>(scale_ * static_cast<double>(full));
}

void CompressedTier::Decode(const Entry& e, uint8_t* out) const {
  if (e.raw) {
    std::memcpy(out, e.data.get(), kPageSize);
    return;
  }
  const int n = LZ4_decompress_safe(reinterpret_cast<const char*>(e.data.get()),
                                    reinterpret_cast<char*>(out), static_cast<int>(e.len),
                                    static_cast<int>(kPageSize));
  // The tier compressed these bytes itself: anything else is memory corruption.
  TCHECK(n == static_cast<int>(kPageSize)) << "compressed tier: a page failed to decompress";
}

void CompressedTier::EraseLocked(std::unordered_map<PageId, Entry>::iterator it) {
  Entry& e = it->second;
  charged_.fetch_sub(e.len + kEntryOverheadBytes, std::memory_order_relaxed);
  compressed_ -= e.len;
  if (e.written_back) lru_.erase(e.lru);
  else dirty_--;
  entries_.erase(it);
}

void CompressedTier::HitLocked(std::unordered_map<PageId, Entry>::iterator it, uint8_t* out) {
  Decode(it->second, out);
  counts_.hits++;
  const bool near =
      evictions_ - it->second.evicted_at <= charged_.load(std::memory_order_relaxed) / kPageSize;
  if (near) counts_.hits_near++;
  // The reader holds the page now: a written-back copy here would only double-count it (it is
  // admitted again, clean, if it is evicted unchanged); one not yet written back stays until
  // its write-back is done.
  if (it->second.written_back) {
    EraseLocked(it);
  } else {
    it->second.read = true;
  }
  if (near) window_near_++;
  if (o_.adapt_window_hits == 0 || ++window_hits_ < o_.adapt_window_hits) return;
  constexpr double kMinScale = 1.0 / 16, kShrink = 0.8, kGrow = 1.25;
  // The near share, averaged over about the last 8 windows (a program's short phase of near
  // hits, e.g. while its footprint grows, does not shrink a tier it then fills and uses).
  near_share_ += (static_cast<double>(window_near_) / window_hits_ - near_share_) / 8;
  if (near_share_ > 0.25) {
    scale_ = std::max(kMinScale, scale_ * kShrink);
    counts_.shrinks++;
    (void)MakeRoomLocked(0);  // Down to the new capacity, as far as written-back pages go.
  } else {
    scale_ = std::min(1.0, scale_ * kGrow);
    counts_.grows++;
  }
  window_hits_ = window_near_ = 0;
}

void CompressedTier::AdmitClean(PageId page, const uint8_t* bytes) {
  static thread_local char scratch[LZ4_COMPRESSBOUND(kPageSize)];
  if (page >= store_->capacity_pages()) return;
  const int len = LZ4_compress_default(reinterpret_cast<const char*>(bytes), scratch,
                                       static_cast<int>(kPageSize), sizeof scratch);
  std::lock_guard<std::mutex> l(mu_);
  ++evictions_;
  if (auto it = entries_.find(page); it != entries_.end()) {
    it->second.evicted_at = evictions_;  // The tier has these bytes already (or newer).
    return;
  }
  if (len <= 0 || static_cast<size_t>(len) > o_.max_compressed_bytes) return;
  if (!MakeRoomLocked(static_cast<uint64_t>(len) + kEntryOverheadBytes)) {
    counts_.bypassed_full++;
    return;
  }
  Entry e;
  e.data.reset(new uint8_t[len]);
  std::memcpy(e.data.get(), scratch, static_cast<size_t>(len));
  e.len = static_cast<uint32_t>(len);
  e.written_back = true;
  e.gen = next_gen_++;
  e.evicted_at = evictions_;
  e.lru = lru_.insert(lru_.end(), page);  // Written back: may be dropped.
  entries_.emplace(page, std::move(e));
  charged_.fetch_add(static_cast<uint64_t>(len) + kEntryOverheadBytes, std::memory_order_relaxed);
  compressed_ += static_cast<uint64_t>(len);
  counts_.admitted_clean++;
}

bool CompressedTier::MakeRoomLocked(uint64_t need) {
  const uint64_t cap = CapacityLocked();
  while (!lru_.empty() && charged_.load() + need > cap) {
    EraseLocked(entries_.find(lru_.front()));
    counts_.dropped++;
  }
  return charged_.load() + need <= cap;
}

Status CompressedTier::Submit(std::span<PageOp* const> ops) {
  TESSERA_RETURN_IF_ERROR(ValidateBatch(ops));
  static thread_local char scratch[LZ4_COMPRESSBOUND(kPageSize)];
  std::vector<PageOp*> forward, local;
  bool queued = false;  // A write-back to start.
  for (PageOp* op : ops) {
    if (op->page >= store_->capacity_pages()) {  // The store reports OutOfRange.
      forward.push_back(op);
      continue;
    }
    if (op->kind == PageOp::Kind::kRead) {
      std::lock_guard<std::mutex> l(mu_);
      auto it = entries_.find(op->page);
      if (it == entries_.end()) {
        counts_.misses++;
        forward.push_back(op);
        continue;
      }
      HitLocked(it, op->buf);
      op->status = Status::Ok();
      local.push_back(op);
      continue;
    }
    const int len = LZ4_compress_default(reinterpret_cast<const char*>(op->buf), scratch,
                                         static_cast<int>(kPageSize), sizeof scratch);
    const bool fits = len > 0 && static_cast<size_t>(len) <= o_.max_compressed_bytes;
    std::lock_guard<std::mutex> l(mu_);
    ++evictions_;
    auto it = entries_.find(op->page);
    if (it != entries_.end()) EraseLocked(it);  // Replaced (or superseded by the store's copy).
    const bool in_flight = inflight_.count(op->page) != 0;
    if (!fits && !in_flight) {
      counts_.incompressible++;
      forward.push_back(op);
      continue;
    }
    const uint32_t stored_len = fits ? static_cast<uint32_t>(len) : kPageSize;
    if (!MakeRoomLocked(stored_len + kEntryOverheadBytes) && !in_flight) {
      counts_.bypassed_full++;
      forward.push_back(op);
      continue;
    }
    Entry e;
    e.data.reset(new uint8_t[stored_len]);
    std::memcpy(e.data.get(), fits ? reinterpret_cast<const uint8_t*>(scratch) : op->buf,
                stored_len);
    e.len = stored_len;
    e.raw = !fits;
    e.gen = next_gen_++;
    e.evicted_at = evictions_;
    dirty_queue_.push_back(
        {op->page, e.gen, MonotonicNs() + uint64_t{o_.writeback_delay_ms} * 1000000});
    entries_.emplace(op->page, std::move(e));
    charged_.fetch_add(stored_len + kEntryOverheadBytes, std::memory_order_relaxed);
    compressed_ += stored_len;
    dirty_++;
    queued = true;
    if (fits) counts_.stored++;
    else counts_.kept_raw++;
    op->status = Status::Ok();
    local.push_back(op);
  }
  if (!forward.empty()) {
    Status st = store_->Submit(forward);
    if (!st.ok()) {
      // Accepted by the tier already (some ops may have been served): fail these ops one by one.
      for (PageOp* op : forward) {
        op->status = st;
        local.push_back(op);
      }
    }
  }
  if (!local.empty()) {
    std::lock_guard<std::mutex> l(mu_);
    complete_.insert(complete_.end(), local.begin(), local.end());
  }
  if (!local.empty() || queued) cv_.notify_one();
  return Status::Ok();
}

Status CompressedTier::ReadPage(PageId page, uint8_t* out) {
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = entries_.find(page);
    if (it != entries_.end()) {
      HitLocked(it, out);
      return Status::Ok();
    }
    counts_.misses++;
  }
  return store_->ReadPage(page, out);
}

Status CompressedTier::ReadPages(const PageId* pages, size_t count, uint8_t* out) {
  static thread_local std::vector<PageId> miss;
  static thread_local std::vector<size_t> where;
  static thread_local std::vector<uint8_t> buf;
  miss.clear();
  where.clear();
  {
    std::lock_guard<std::mutex> l(mu_);
    for (size_t i = 0; i < count; ++i) {
      auto it = entries_.find(pages[i]);
      if (it != entries_.end()) {
        HitLocked(it, out + i * kPageSize);
        continue;
      }
      counts_.misses++;
      miss.push_back(pages[i]);
      where.push_back(i);
    }
  }
  if (miss.empty()) return Status::Ok();
  buf.resize(miss.size() * kPageSize);
  Status st = store_->ReadPages(miss.data(), miss.size(), buf.data());
  for (size_t j = 0; j < miss.size(); ++j) {
    std::memcpy(out + where[j] * kPageSize, buf.data() + j * kPageSize, kPageSize);
  }
  return st;
}

Status CompressedTier::Trim(PageId first, uint64_t count) {
  {
    std::lock_guard<std::mutex> l(mu_);
    const uint64_t end = count > ~first ? ~uint64_t{0} : first + count;
    if (count <= entries_.size()) {
      for (PageId p = first; p < end; ++p) {
        auto it = entries_.find(p);
        if (it != entries_.end()) EraseLocked(it);
      }
    } else {
      for (auto it = entries_.begin(); it != entries_.end();) {
        auto next = std::next(it);
        if (it->first >= first && it->first < end) EraseLocked(it);
        it = next;
      }
    }
    // A write-back in flight would store the page again after this trim: trim it once more
    // when it completes.
    for (auto& [p, trim_after] : inflight_) {
      if (p >= first && p < end) trim_after = true;
    }
  }
  return store_->Trim(first, count);
}

Status CompressedTier::Flush() {
  constexpr auto kFlushTimeout = std::chrono::seconds(120);
  std::unique_lock<std::mutex> l(mu_);
  const uint64_t bound = next_gen_;  // Entries written before this call have older gens.
  auto pending = [&] {
    for (const auto& [p, gen, due] : dirty_queue_) {
      auto it = entries_.find(p);
      if (it != entries_.end() && it->second.gen == gen && gen < bound &&
          !it->second.written_back) {
        return true;
      }
    }
    for (const auto& wb : wb_pool_) {
      if (wb->gen != 0 && wb->gen < bound) return true;
    }
    return false;
  };
  ++flushing_;
  cv_.notify_one();
  const bool done = flush_cv_.wait_for(l, kFlushTimeout, [&] { return !pending(); });
  --flushing_;
  if (!done) {
    return Unavailable("compressed tier: pages not written back to the store after 120 s (" +
                       std::to_string(counts_.writeback_errors) + " write-backs refused so far)");
  }
  l.unlock();
  return store_->Flush();
}

void CompressedTier::WritebackDone(PageOp* op) {
  auto* wb = reinterpret_cast<Writeback*>(op->user);
  CompressedTier* t = wb->tier;
  {
    std::lock_guard<std::mutex> l(t->mu_);
    t->wb_done_.push_back(wb);
  }
  t->cv_.notify_one();
}

bool CompressedTier::UrgentLocked() const {
  return flushing_ > 0 || stopping_ || charged_.load() > CapacityLocked() / 4 * 3;
}

void CompressedTier::StartWritebacksLocked(uint64_t now, std::vector<PageOp*>* submit) {
  const bool urgent = UrgentLocked();
  while (!dirty_queue_.empty() && !free_wb_.empty()) {
    auto [p, gen, due] = dirty_queue_.front();
    if (!urgent && now < due) break;  // Later ones are due later still.
    dirty_queue_.pop_front();
    auto it = entries_.find(p);
    if (it == entries_.end() || it->second.gen != gen || it->second.written_back) continue;
    // One write of a page in flight at a time: the completion re-queues the newer bytes.
    if (inflight_.count(p) != 0) continue;
    Writeback* wb = free_wb_.back();
    free_wb_.pop_back();
    Decode(it->second, wb->buf);
    wb->gen = gen;
    wb->op = PageOp{};
    wb->op.kind = PageOp::Kind::kWrite;
    wb->op.page = p;
    wb->op.buf = wb->buf;
    wb->op.done = &CompressedTier::WritebackDone;
    wb->op.user = wb;
    inflight_.emplace(p, false);
    submit->push_back(&wb->op);
  }
}

void CompressedTier::Loop() {
  std::vector<PageOp*> complete, submit;
  std::vector<Writeback*> done;
  std::vector<PageId> trims;
  std::unique_lock<std::mutex> l(mu_);
  for (;;) {
    if (stopping_ && inflight_.empty() && complete_.empty() && wb_done_.empty()) return;
    complete.swap(complete_);
    done.swap(wb_done_);
    const uint64_t now = MonotonicNs();
    for (Writeback* wb : done) {
      const PageId p = wb->op.page;
      auto fl = inflight_.find(p);
      if (fl->second) trims.push_back(p);
      inflight_.erase(fl);
      auto it = entries_.find(p);
      const bool current = it != entries_.end() && it->second.gen == wb->gen;
      if (wb->op.status.ok()) {
        counts_.writebacks++;
        if (current) {
          it->second.written_back = true;
          dirty_--;
          it->second.lru = lru_.insert(lru_.end(), p);
          // Kept only until the store had it: a raw page, or one a reader holds now.
          if (it->second.raw || it->second.read) {
            EraseLocked(it);
            it = entries_.end();
          }
        }
      } else {
        uint64_t n = ++counts_.writeback_errors;
        if ((n & (n - 1)) == 0) {
          TLOG(WARNING) << "compressed tier: writing page " << p << " back failed ("
                        << wb->op.status.ToString() << "); retrying (" << n
                        << " failed write-backs so far)";
        }
        retry_after_ns_ = now + uint64_t{o_.writeback_retry_ms} * 1000000;
        if (current) dirty_queue_.push_front({p, wb->gen, now});
      }
      // Newer bytes written while this write-back was in flight: their turn now.
      if (it != entries_.end() && !current && !it->second.written_back) {
        dirty_queue_.push_front({p, it->second.gen, now});
      }
      wb->gen = 0;
      free_wb_.push_back(wb);
    }
    if (!done.empty()) flush_cv_.notify_all();
    done.clear();
    if (!stopping_ && now >= retry_after_ns_) StartWritebacksLocked(now, &submit);
    if (complete.empty() && submit.empty() && trims.empty()) {
      if (stopping_ && inflight_.empty() && complete_.empty() && wb_done_.empty()) return;
      // Stopping with write-backs in flight: wait for their completions (a predicate true at
      // once would spin here holding mu_, which the completions need). So nothing is due while
      // stopping: no write-back starts then (above), although every queued one is urgent.
      auto due = [&] {
        const uint64_t t = MonotonicNs();
        return !stopping_ && !dirty_queue_.empty() && !free_wb_.empty() && t >= retry_after_ns_ &&
               (UrgentLocked() || t >= dirty_queue_.front().due_ns);
      };
      auto ready = [&] {
        return (stopping_ && inflight_.empty()) || !complete_.empty() || !wb_done_.empty() ||
               due();
      };
      if (!dirty_queue_.empty()) {
        // Until the oldest write-back is due (or a refused one may be retried); sooner if
        // woken (a flush, new work, a completion).
        const uint64_t at = std::max(retry_after_ns_, dirty_queue_.front().due_ns);
        cv_.wait_for(l, std::chrono::nanoseconds(at > now ? at - now : 0), ready);
      } else {
        cv_.wait(l, ready);
      }
      continue;
    }
    l.unlock();
    for (PageId p : trims) {
      Status st = store_->Trim(p, 1);
      if (!st.ok()) TLOG(WARNING) << "compressed tier: trimming page " << p << ": " << st;
    }
    trims.clear();
    if (!submit.empty()) {
      Status st = store_->Submit(submit);
      if (!st.ok()) {  // No callback will come: complete them here as failures.
        for (PageOp* op : submit) {
          op->status = st;
          WritebackDone(op);
        }
      }
      submit.clear();
    }
    for (PageOp* op : complete) op->done(op);
    complete.clear();
    l.lock();
  }
}

CompressedTierStats CompressedTier::TierStats() const {
  std::lock_guard<std::mutex> l(mu_);
  CompressedTierStats s = counts_;
  s.entries = entries_.size();
  s.dirty_entries = dirty_;
  s.compressed_bytes = compressed_;
  s.charged_bytes = charged_.load();
  s.capacity_bytes = CapacityLocked();
  s.capacity_scale = scale_;
  return s;
}

}  // namespace tessera::kernel_shim
