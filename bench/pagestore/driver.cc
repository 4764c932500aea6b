#include "bench/pagestore/driver.h"

#include <atomic>
#include <boost/lockfree/queue.hpp>
#include <cstdlib>
#include <cstring>

#include "common/clock.h"

namespace tessera::bench {

using client::kPageSize;
using client::PageOp;

namespace {
constexpr int kMaxQd = 1024;

uint64_t Mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}
}  // namespace

void FillPage(uint64_t page, uint64_t version, uint8_t* out) {
  uint64_t words[kPageSize / 8];
  words[0] = page;
  words[1] = version;
  uint64_t seed = Mix(page * 0x9e3779b97f4a7c15ull ^ Mix(version + 1));
  for (size_t i = 2; i < kPageSize / 8; ++i) words[i] = seed + i * 0x9e3779b97f4a7c15ull;
  std::memcpy(out, words, kPageSize);
}

bool VerifyPage(uint64_t page, const uint8_t* in) {
  uint64_t words[kPageSize / 8];
  std::memcpy(words, in, kPageSize);
  bool zero = true;
  for (uint64_t w : words) zero = zero && w == 0;
  if (zero) return true;
  if (words[0] != page) return false;
  uint64_t seed = Mix(page * 0x9e3779b97f4a7c15ull ^ Mix(words[1] + 1));
  for (size_t i = 2; i < kPageSize / 8; ++i) {
    if (words[i] != seed + i * 0x9e3779b97f4a7c15ull) return false;
  }
  return true;
}

struct Driver::Slot {
  PageOp op;
  uint64_t start_ns = 0;
  Driver::Shared* shared = nullptr;
  alignas(kPageSize) uint8_t buf[kPageSize];
};

struct Driver::Shared {
  boost::lockfree::queue<Slot*, boost::lockfree::capacity<kMaxQd>> done;
  std::atomic<uint32_t> ready{0};
  std::unique_ptr<Slot[]> slots{new Slot[kMaxQd]};

  static void OnDone(PageOp* op) {
    Slot* s = static_cast<Slot*>(op->user);
    Shared* sh = s->shared;
    while (!sh->done.bounded_push(s)) {
    }
    sh->ready.fetch_add(1, std::memory_order_release);
    sh->ready.notify_one();
  }
};

Driver::Driver(client::PageStore* store, uint64_t pages, uint64_t seed)
    : store_(store), pages_(pages), rng_(seed), shared_(std::make_unique<Shared>()) {
  for (int i = 0; i < kMaxQd; ++i) shared_->slots[i].shared = shared_.get();
}

Driver::~Driver() = default;

Status Driver::Populate() {
  constexpr int kDepth = 64;
  std::vector<PageOp*> batch;
  uint64_t next = 0, completed = 0;
  uint64_t failed = 0;
  Status first;
  auto issue = [&](Slot* s) {
    s->op = PageOp();
    s->op.kind = PageOp::Kind::kWrite;
    s->op.page = next;
    s->op.buf = s->buf;
    s->op.done = Shared::OnDone;
    s->op.user = s;
    FillPage(next, ++version_, s->buf);
    ++next;
    batch.push_back(&s->op);
  };
  for (int i = 0; i < kDepth && next < pages_; ++i) issue(&shared_->slots[i]);
  uint64_t inflight = batch.size();
  TESSERA_RETURN_IF_ERROR(store_->Submit(batch));
  while (completed < pages_) {
    uint32_t seen = shared_->ready.load(std::memory_order_acquire);
    batch.clear();
    Slot* s = nullptr;
    while (shared_->done.pop(s)) {
      ++completed;
      --inflight;
      if (!s->op.status.ok()) {
        if (failed++ == 0) first = s->op.status;
      }
      if (next < pages_) issue(s);
    }
    if (!batch.empty()) {
      Status st = store_->Submit(batch);
      if (!st.ok()) {
        // Wait for what is in flight (the slots belong to the store until then).
        while (inflight > 0) {
          uint32_t now_seen = shared_->ready.load(std::memory_order_acquire);
          while (shared_->done.pop(s)) --inflight;
          if (inflight > 0) shared_->ready.wait(now_seen, std::memory_order_acquire);
        }
        return st;
      }
      inflight += batch.size();
      continue;
    }
    if (completed < pages_) {
      // Bounded by the store's own op timeouts; a store never leaves an accepted op pending.
      shared_->ready.wait(seen, std::memory_order_acquire);
    }
  }
  if (failed > 0) {
    return first.WithContext(std::to_string(failed) + " of " + std::to_string(pages_) +
                             " working-set writes failed; first");
  }
  return Status::Ok();
}

Status Driver::Run(PageOp::Kind kind, int qd, uint64_t warmup_ops, uint64_t min_ops,
                   uint64_t min_ns, uint64_t max_ns, PointResult* out) {
  if (qd < 1 || qd > kMaxQd) return InvalidArgument("queue depth ", qd, " not in 1..", kMaxQd);
  *out = PointResult();
  std::vector<PageOp*> batch;
  batch.reserve(qd);
  uint64_t completed = 0;
  uint64_t measure_start = 0;
  bool measuring = warmup_ops == 0;
  bool stopping = false;
  int inflight = 0;
  auto issue = [&](Slot* s) {
    uint64_t page = rng_() % pages_;
    s->op = PageOp();
    s->op.kind = kind;
    s->op.page = page;
    s->op.buf = s->buf;
    s->op.done = Shared::OnDone;
    s->op.user = s;
    if (kind == PageOp::Kind::kWrite) FillPage(page, ++version_, s->buf);
    s->start_ns = MonotonicNs();
    batch.push_back(&s->op);
  };
  for (int i = 0; i < qd; ++i) issue(&shared_->slots[i]);
  if (measuring) measure_start = MonotonicNs();
  TESSERA_RETURN_IF_ERROR(store_->Submit(batch));
  inflight = qd;
  Status refused;
  while (inflight > 0) {
    uint32_t seen = shared_->ready.load(std::memory_order_acquire);
    batch.clear();
    Slot* s = nullptr;
    bool any = false;
    while (shared_->done.pop(s)) {
      any = true;
      --inflight;
      uint64_t now = MonotonicNs();
      if (measuring && !stopping) {
        if (s->op.status.ok()) {
          bool good = kind == PageOp::Kind::kWrite || VerifyPage(s->op.page, s->buf);
          if (good) {
            out->ops++;
            out->latency.Record(now - s->start_ns);
          } else {
            out->wrong_bytes++;
          }
        } else {
          if (out->errors++ == 0) out->first_error = s->op.status.ToString();
        }
      }
      ++completed;
      if (!measuring && completed >= warmup_ops) {
        measuring = true;
        measure_start = now;
      }
      if (measuring && !stopping) {
        uint64_t elapsed = now - measure_start;
        if ((out->ops + out->errors >= min_ops && elapsed >= min_ns) || elapsed >= max_ns) {
          stopping = true;
          out->seconds = static_cast<double>(elapsed) / 1e9;
        }
      }
      if (!stopping) issue(s);
    }
    if (!batch.empty()) {
      Status st = store_->Submit(batch);
      if (st.ok()) {
        inflight += static_cast<int>(batch.size());
      } else if (refused.ok()) {
        // Drain what is in flight (the slots belong to the store until then), then report.
        refused = st;
        stopping = true;
      }
    }
    if (any) continue;
    // Futex wait on the completion counter (a completion bumps it and wakes us). Every store
    // bounds its ops with its own timeouts, so this wait ends.
    shared_->ready.wait(seen, std::memory_order_acquire);
  }
  if (out->seconds == 0 && measuring) {
    out->seconds = static_cast<double>(MonotonicNs() - measure_start) / 1e9;
  }
  return refused;
}

}  // namespace tessera::bench
