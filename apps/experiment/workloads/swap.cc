// kind = swap: an unmodified program under `tessera run --pager swap`: the program and every
// process it starts run in a memory cgroup limited to local_memory, and a private `tessera swap`
// kernel swap device on the scenario's memservers takes what the limit pushes out. The faults
// then hit the kernel's swap path, which fails a swap-in with an I/O error (SIGBUS) where the
// userfaultfd pager's fill would fail. Needs what `tessera run --pager swap` needs (root,
// cgroup-v1 memory, /dev/fuse, loop devices); without it the run fails with its message.
#include "apps/experiment/workloads/program.h"

namespace tessera::experiment {

extern const WorkloadType kSwapWorkload = {
    WorkloadKind::kSwap, "",
    [](const RunContext& ctx) { return MakeProgramWorkload(ctx, Pager::kSwap); },
    [](const Scenario&) { return Status::Ok(); }};

}  // namespace tessera::experiment
