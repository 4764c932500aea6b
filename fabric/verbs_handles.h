// Internal to fabric/: RAII for the ibv/rdma_cm handles of the verbs listener and transport
// (unique_ptr with deleters, in the manner of tensorpipe's common/ibv.h), and VerbsResources,
// the one place that fixes their teardown order:
//
//   queue pairs (with their rdma_cm ids), CQ, completion channel, MRs, PD, listening id,
//   event channel, device list
//
// (a QP must go before the CQ it posts to, a CQ before its channel, MRs before their PD, every
// id before its event channel). The order is the member order of VerbsResources, so it holds
// for every way out: destructor, failed Init, exception-free early returns.
//
// The deleters call libibverbs/librdmacm through VerbsApi, a table of function pointers that a
// test may replace (SetVerbsApiForTesting) to check the order without an RDMA device.
//
// Threads: handles are plain owners; a VerbsResources is owned by one object and destroyed once.
#pragma once

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <memory>
#include <vector>

namespace tessera::fabric {

struct VerbsApi {
  int (*destroy_qp_and_id)(rdma_cm_id* id);  // rdma_destroy_qp (when id->qp) + rdma_destroy_id.
  int (*destroy_id)(rdma_cm_id* id);
  int (*destroy_cq)(ibv_cq* cq);
  int (*destroy_comp_channel)(ibv_comp_channel* channel);
  int (*dereg_mr)(ibv_mr* mr);
  int (*dealloc_pd)(ibv_pd* pd);
  void (*destroy_event_channel)(rdma_event_channel* channel);
  void (*free_devices)(ibv_context** list);
};
// The table in use (libibverbs/librdmacm unless a test replaced it).
const VerbsApi& GetVerbsApi();
// Replaces the table (nullptr: back to the real libraries). Tests only; not thread-safe.
void SetVerbsApiForTesting(const VerbsApi* api);

struct QpIdDeleter {  // An rdma_cm id that may own a QP: the QP first, then the id.
  void operator()(rdma_cm_id* id) const { GetVerbsApi().destroy_qp_and_id(id); }
};
struct CmIdDeleter {  // An rdma_cm id without a QP (a listener).
  void operator()(rdma_cm_id* id) const { GetVerbsApi().destroy_id(id); }
};
struct CqDeleter {
  void operator()(ibv_cq* cq) const { GetVerbsApi().destroy_cq(cq); }
};
struct CompChannelDeleter {
  void operator()(ibv_comp_channel* c) const { GetVerbsApi().destroy_comp_channel(c); }
};
struct MrDeleter {
  void operator()(ibv_mr* mr) const { GetVerbsApi().dereg_mr(mr); }
};
struct PdDeleter {
  void operator()(ibv_pd* pd) const { GetVerbsApi().dealloc_pd(pd); }
};
struct EventChannelDeleter {
  void operator()(rdma_event_channel* c) const { GetVerbsApi().destroy_event_channel(c); }
};
struct DeviceListDeleter {
  void operator()(ibv_context** list) const { GetVerbsApi().free_devices(list); }
};

using QpIdPtr = std::unique_ptr<rdma_cm_id, QpIdDeleter>;
using CmIdPtr = std::unique_ptr<rdma_cm_id, CmIdDeleter>;
using CqPtr = std::unique_ptr<ibv_cq, CqDeleter>;
using CompChannelPtr = std::unique_ptr<ibv_comp_channel, CompChannelDeleter>;
using MrPtr = std::unique_ptr<ibv_mr, MrDeleter>;
using PdPtr = std::unique_ptr<ibv_pd, PdDeleter>;
using EventChannelPtr = std::unique_ptr<rdma_event_channel, EventChannelDeleter>;
using DeviceListPtr = std::unique_ptr<ibv_context*, DeviceListDeleter>;

// The handles of one listener or one transport. Members are destroyed bottom-up, so the
// declaration order below IS the teardown order, reversed. Owners that keep queue pairs
// elsewhere (the transport's per-connection state) must destroy them before this.
struct VerbsResources {
  VerbsResources() = default;
  ~VerbsResources() { Reset(); }
  VerbsResources(const VerbsResources&) = delete;
  VerbsResources& operator=(const VerbsResources&) = delete;

  // Tears everything down now, in the documented order (idempotent).
  void Reset() {
    qps.clear();
    cq.reset();
    comp_channel.reset();
    mrs.clear();
    pd.reset();
    listen_id.reset();
    event_channel.reset();
    devices.reset();
  }

  DeviceListPtr devices;          // From rdma_get_devices; the contexts live as long as it.
  ibv_context* context = nullptr;  // devices[0]; not owned.
  EventChannelPtr event_channel;
  CmIdPtr listen_id;
  PdPtr pd;
  std::vector<MrPtr> mrs;
  CompChannelPtr comp_channel;
  CqPtr cq;
  std::vector<QpIdPtr> qps;  // Accepted / connected queue pairs.
};

}  // namespace tessera::fabric
