// The real VerbsApi table (see fabric/verbs_handles.h).
#include "fabric/verbs_handles.h"

namespace tessera::fabric {
namespace {

int DestroyQpAndId(rdma_cm_id* id) {
  if (id->qp != nullptr) rdma_destroy_qp(id);
  return rdma_destroy_id(id);
}

const VerbsApi kRealApi = {
    DestroyQpAndId,
    rdma_destroy_id,
    ibv_destroy_cq,
    ibv_destroy_comp_channel,
    ibv_dereg_mr,
    ibv_dealloc_pd,
    rdma_destroy_event_channel,
    rdma_free_devices,
};

const VerbsApi* g_api = &kRealApi;

}  // namespace

const VerbsApi& GetVerbsApi() { return *g_api; }

void SetVerbsApiForTesting(const VerbsApi* api) { g_api = api ? api : &kRealApi; }

}  // namespace tessera::fabric
