// The load generator of `tessera bench pagestore`: keeps `qd` 4 KB page ops in flight against
// one PageStore through Submit(), resubmitting each completion's slot with a new random page,
// and verifies every page it reads (each written page carries its id and a version, and the
// rest of its bytes are derived from those two, so a wrong or torn page is caught).
//
// Threads: a Driver is used by one bench thread; the store's completion callbacks hand
// finished ops back through a lock-free queue and wake the bench thread through a futex word.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "client/page_store.h"
#include "common/histogram.h"
#include "common/status.h"

namespace tessera::bench {

struct PointResult {
  LatencyHistogram latency;  // Submit -> completion seen by the bench, per op, ns.
  uint64_t ops = 0;          // Successful ops in the measured window.
  uint64_t errors = 0;       // Ops that completed with an error (e.g. DataLoss on single copy).
  uint64_t wrong_bytes = 0;  // Reads that returned a page failing verification.
  std::string first_error;
  double seconds = 0;
  double ops_per_s() const { return seconds > 0 ? ops / seconds : 0; }
};

// Fills page `page` of version `version` into out (kPageSize bytes).
void FillPage(uint64_t page, uint64_t version, uint8_t* out);
// True if `in` is a page written by FillPage for `page` (any version), or all zeros.
bool VerifyPage(uint64_t page, const uint8_t* in);

class Driver {
 public:
  Driver(client::PageStore* store, uint64_t pages, uint64_t seed);
  ~Driver();
  Driver(const Driver&) = delete;
  Driver& operator=(const Driver&) = delete;

  // Writes every page of the working set once (QD 64).
  Status Populate();
  // Runs `kind` ops at queue depth qd: `warmup_ops` unmeasured, then measured until both
  // min_ops ops completed and min_ns passed (or max_ns passed). Per-op errors are counted in
  // `out`; returns an error only when the store refuses a Submit (after draining the ops in
  // flight). Relies on the store completing every accepted op, which stores bound by timeouts.
  Status Run(client::PageOp::Kind kind, int qd, uint64_t warmup_ops, uint64_t min_ops,
             uint64_t min_ns, uint64_t max_ns, PointResult* out);

  struct Slot;

 private:
  client::PageStore* store_;
  uint64_t pages_;
  std::mt19937_64 rng_;
  uint64_t version_ = 0;
  struct Shared;
  std::unique_ptr<Shared> shared_;
};

}  // namespace tessera::bench
