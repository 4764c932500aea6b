// The kinds that run an unmodified program, `run` (workloads/program.cc) and `swap`
// (workloads/swap.cc): the same workload under `tessera run`, with one pager or the other.
#pragma once

#include <memory>

#include "apps/experiment/workload.h"

namespace tessera::experiment {

enum class Pager { kUffd, kSwap };

// PROGRAM (the scenario's command) under `tessera run --pager uffd|swap`, paged to the run's
// memservers at the scenario's local_memory.
std::unique_ptr<Workload> MakeProgramWorkload(const RunContext& ctx, Pager pager);

}  // namespace tessera::experiment
