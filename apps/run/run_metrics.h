// Prometheus text of `tessera run --metrics-port`: the paged program's pager, its compressed
// tier and its page store, named tessera_run_*, made from the live stats the shim writes twice
// a second (kernel_shim/preload/run_stats.h). Fault latency is a histogram, ratios are 0..1.
//
// Threads: a pure function; any thread.
#pragma once

#include <string>

#include "kernel_shim/preload/run_stats.h"

namespace tessera::run {

std::string RunMetrics(const kernel_shim::RunStats& stats);

}  // namespace tessera::run
