// A trace-driven model of the pager's local memory, for testing and comparing victim policies
// without userfaultfd: it runs the pager's own VictimChooser, InactiveRing and InactiveSizer over
// a sequence of page accesses, with what the pager can observe of them, and counts faults.
//
// What the model sees is what the pager sees. A read of a mapped page is invisible. A write to a
// clean (write-protected) page, or to a dirty page the policy armed a write trap on, is a
// write-protect fault and sets kRef in the page word, as HandleWp does. Any access to a page on
// the inactive list is a minor fault: the page comes back and is activated. Any access to a page
// not local is a major fault (a store read, or a zero fill on first touch). When the local pages
// (mapped + staged) exceed the cap, the model evicts exactly as many as it must: with the
// inactive list it first deactivates the policy's victims into the list (keeping it at its
// target length) and then drops pages from the list's old end; without, it drops the policy's
// victims directly. A dropped dirty page counts a write-back.
//
// BeladyMinFaults is the offline optimum on the same trace and cap (evict the page whose next
// use is farthest), counting every miss including first touches, as the model does.
//
// Plain functions over values; thread-compatible.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "client/page_store.h"
#include "kernel_shim/pager/inactive_list.h"
#include "kernel_shim/pager/pager.h"

namespace tessera::kernel_shim::internal {

struct TraceAccess {
  client::PageId page;
  bool write;
};

struct PolicySimOptions {
  VictimPolicy policy = VictimPolicy::kSmart;
  bool write_traps = true;
  bool inactive_list = true;
  InactiveSizerOptions sizer;
  size_t cap_pages = 0;  // > 0.
};

struct PolicySimResult {
  uint64_t accesses = 0;
  uint64_t major_faults = 0;    // Store reads and first-touch fills.
  uint64_t minor_refaults = 0;  // Pages moved back from the inactive list.
  uint64_t wp_faults = 0;       // Write-protect faults (first writes and write traps).
  uint64_t writebacks = 0;      // Dirty pages written back when dropped.
  double final_inactive_fraction = 0;
};

PolicySimResult SimulatePolicy(const std::vector<TraceAccess>& trace, const PolicySimOptions& o);

uint64_t BeladyMinFaults(const std::vector<TraceAccess>& trace, size_t cap_pages);

}  // namespace tessera::kernel_shim::internal
