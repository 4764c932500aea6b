// The workload kinds the runner knows: one line each.
#include "apps/experiment/workload.h"
#include "common/logging.h"

namespace tessera::experiment {

extern const WorkloadType kProgramWorkload, kSwapWorkload, kPagestoreWorkload, kKvWorkload,
    kParamsvcWorkload;
namespace {
const WorkloadType* const kRegistry[] = {&kProgramWorkload, &kSwapWorkload, &kPagestoreWorkload,
                                         &kKvWorkload, &kParamsvcWorkload};
}  // namespace

const WorkloadType& TypeOf(WorkloadKind kind) {
  for (const WorkloadType* t : kRegistry) {
    if (t->kind == kind) return *t;
  }
  TCHECK(false) << "no workload type for kind " << WorkloadKindName(kind);
  return *kRegistry[0];
}

}  // namespace tessera::experiment
