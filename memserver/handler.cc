#include "memserver/handler.h"

#include <sys/resource.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <random>
#include <sstream>

#include "common/clock.h"
#include "common/logging.h"
#include "common/prometheus.h"
#include "common/units.h"

namespace tessera::memserver {

using fabric::Op;
using fabric::PeerInfo;

static_assert(static_cast<uint16_t>(Op::kAllocSlab) == op_bits::kAllocSlab);
static_assert(static_cast<uint16_t>(Op::kFreeSlab) == op_bits::kFreeSlab);
static_assert(static_cast<uint16_t>(Op::kRead) == op_bits::kRead);
static_assert(static_cast<uint16_t>(Op::kWrite) == op_bits::kWrite);
static_assert(static_cast<uint16_t>(Op::kStats) == op_bits::kStats);
static_assert(static_cast<uint16_t>(Op::kHeartbeat) == op_bits::kHeartbeat);
static_assert(static_cast<uint16_t>(Op::kInvoke) == op_bits::kInvoke);
static_assert(static_cast<uint16_t>(Op::kFault) == op_bits::kFault);

namespace {

// Times one handler call into the service-time histogram and counts it.
class OpScope {
 public:
  OpScope(ServerMetrics* m, OpSlot op) : m_(m), op_(op), start_(MonotonicNs()) {}
  ~OpScope() {
    m_->RecordServiceNs(MonotonicNs() - start_);
    m_->CountOp(op_, ok_);
  }
  template <typename T>
  T Done(T r) {
    ok_ = r.ok();
    return r;
  }
  Status DoneStatus(Status s) {
    ok_ = s.ok();
    return s;
  }

 private:
  ServerMetrics* m_;
  OpSlot op_;
  uint64_t start_;
  bool ok_ = true;
};

}  // namespace

MemServerHandler::MemServerHandler(SlabPool* pool, Options options)
    : pool_(pool), options_(options), start_ns_(MonotonicNs()) {}

void MemServerHandler::AttachServer(fabric::Server* server,
                                    fabric::MemoryRegistration registration) {
  registration_ = registration;
  server_.store(server, std::memory_order_release);
}

void MemServerHandler::AttachMonitor(ResourceMonitor* monitor) {
  monitor_.store(monitor, std::memory_order_release);
}

Status MemServerHandler::RegisterFunction(uint32_t function_id, std::string name, Function fn) {
  if (function_id >= kReservedFunctionIdBase) {
    return InvalidArgument("function ids from ", kReservedFunctionIdBase,
                           " up are reserved for the memserver");
  }
  if (!fn) return InvalidArgument("function ", function_id, " has no body");
  std::unique_lock lock(functions_mu_);
  auto [it, inserted] = functions_.emplace(function_id, Registered{std::move(name), std::move(fn)});
  if (!inserted) {
    return AlreadyExists("function id ", function_id, " is taken by '", it->second.name, "'");
  }
  return Status::Ok();
}

void MemServerHandler::OnConnect(const PeerInfo& peer) {
  metrics_.Connected();
  {
    std::lock_guard<std::mutex> lock(leases_mu_);
    Lease& l = leases_[peer.owner_id];
    ++l.connections;
    l.idle_since_ns = 0;
    std::lock_guard<std::mutex> ql(quota_mu_);
    owner_client_[peer.owner_id] = peer.client_id;
  }
  TLOG(DEBUG) << "client " << peer.client_id << " (owner " << peer.owner_id << ") connected from "
              << peer.address;
}

void MemServerHandler::OnDisconnect(const PeerInfo& peer) {
  metrics_.Disconnected();
  {
    std::lock_guard<std::mutex> lock(leases_mu_);
    auto it = leases_.find(peer.owner_id);
    if (it != leases_.end() && --it->second.connections <= 0) {
      if (options_.orphan_grace_ns == 0) {
        leases_.erase(it);  // No lease to run: forget the owner.
        if (pool_->SlabsOwnedBy(peer.owner_id) == 0) ForgetOwnerLocked(peer.owner_id);
      } else {
        it->second.connections = 0;
        it->second.idle_since_ns = MonotonicNs();
      }
    }
  }
  TLOG(DEBUG) << "client " << peer.client_id << " (" << peer.address << ") disconnected";
}

void MemServerHandler::ForgetOwnerLocked(OwnerId owner) {
  std::lock_guard<std::mutex> ql(quota_mu_);
  owner_client_.erase(owner);
}

uint64_t MemServerHandler::ReclaimOrphans(uint64_t now_ns) {
  const uint64_t grace = options_.orphan_grace_ns;
  if (grace == 0) return 0;
  uint64_t freed_total = 0;
  std::vector<SlabPool::SlabInfo> slabs;
  bool listed = false;
  // Under the lease lock: a reconnect either happens before (the owner is not idle) or after
  // the owner's slabs are gone (it then finds them missing, as after an eviction).
  std::lock_guard<std::mutex> lock(leases_mu_);
  for (auto it = leases_.begin(); it != leases_.end();) {
    const Lease& l = it->second;
    if (l.connections > 0 || l.idle_since_ns == 0 || now_ns - l.idle_since_ns < grace) {
      ++it;
      continue;
    }
    const OwnerId owner = it->first;
    const uint64_t idle_ns = now_ns - l.idle_since_ns;
    it = leases_.erase(it);
    ForgetOwnerLocked(owner);
    if (!listed) {
      slabs = pool_->AllocatedSlabs();
      listed = true;
    }
    uint64_t freed = 0;
    for (const auto& s : slabs) {
      if (s.owner != owner) continue;
      if (pool_->Free(owner, s.slab_id).ok()) ++freed;
    }
    if (freed > 0) {
      owners_reclaimed_.fetch_add(1, std::memory_order_relaxed);
      slabs_reclaimed_.fetch_add(freed, std::memory_order_relaxed);
      TLOG(INFO) << "owner " << owner << " has had no connection for " << idle_ns / 1000000
                 << " ms (--orphan_grace " << grace / 1000000 << " ms): freed its " << freed
                 << " slabs";
    }
    freed_total += freed;
  }
  return freed_total;
}

MemServerHandler::LeaseStats MemServerHandler::lease_stats() {
  LeaseStats out;
  out.owners_reclaimed = owners_reclaimed_.load(std::memory_order_relaxed);
  out.slabs_reclaimed = slabs_reclaimed_.load(std::memory_order_relaxed);
  std::vector<SlabPool::SlabInfo> slabs = pool_->AllocatedSlabs();
  std::vector<OwnerId> owners;
  owners.reserve(slabs.size());
  for (const auto& s : slabs) owners.push_back(s.owner);
  std::sort(owners.begin(), owners.end());
  out.slab_owners = static_cast<uint64_t>(std::unique(owners.begin(), owners.end()) - owners.begin());
  std::lock_guard<std::mutex> lock(leases_mu_);
  for (const auto& [owner, l] : leases_) {
    if (l.connections > 0) continue;
    for (const auto& s : slabs) {
      if (s.owner == owner) {
        ++out.orphaned_owners;
        break;
      }
    }
  }
  return out;
}

Result<std::span<uint8_t>> MemServerHandler::ResolveData(const PeerInfo& peer, OpSlot slot,
                                                         uint64_t slab_id, uint64_t offset,
                                                         uint32_t length) {
  OpScope scope(&metrics_, slot);
  auto r = scope.Done(peer.admin ? pool_->ResolveAnyOwner(slab_id, offset, length)
                                 : pool_->Resolve(peer.owner_id, slab_id, offset, length));
  if (r.ok() && slot == OpSlot::kRead) metrics_.AddBytesRead(length);
  if (r.ok() && slot == OpSlot::kWrite) metrics_.AddBytesWritten(length);
  return r;
}

Result<std::span<uint8_t>> MemServerHandler::ResolveRead(const PeerInfo& peer,
                                                         const fabric::ReadRequest& req) {
  return ResolveData(peer, OpSlot::kRead, req.slab_id, req.offset, req.length);
}

Result<std::span<uint8_t>> MemServerHandler::ResolveWrite(const PeerInfo& peer,
                                                          const fabric::WriteRequest& req) {
  return ResolveData(peer, OpSlot::kWrite, req.slab_id, req.offset, req.length);
}

Result<fabric::AllocSlabResponse> MemServerHandler::AllocSlab(const PeerInfo& peer,
                                                              const fabric::AllocSlabRequest& req) {
  OpScope scope(&metrics_, OpSlot::kAlloc);
  auto run = [&]() -> Result<fabric::AllocSlabResponse> {
    if (req.size_hint > pool_->slab_bytes()) {
      return InvalidArgument("this server lends slabs of ", FormatSize(pool_->slab_bytes()),
                             "; a size hint of ", req.size_hint, " bytes cannot be met");
    }
    if (faults_.RefuseAlloc(MonotonicNs())) {
      return ResourceExhausted("slab allocation refused (injected fault)");
    }
    uint64_t id = 0;
    if (options_.max_slabs_per_client == 0) {
      TESSERA_ASSIGN_OR_RETURN(id, pool_->Alloc(peer.owner_id));
    } else {
      // Count and allocate under one lock, so concurrent ALLOCs cannot overshoot the quota.
      std::lock_guard<std::mutex> ql(quota_mu_);
      uint64_t held = 0;
      for (const auto& s : pool_->AllocatedSlabs()) {
        auto oc = owner_client_.find(s.owner);
        if (s.owner == peer.owner_id ||
            (oc != owner_client_.end() && oc->second == peer.client_id)) {
          ++held;
        }
      }
      if (held >= options_.max_slabs_per_client) {
        quota_refusals_.fetch_add(1, std::memory_order_relaxed);
        return ResourceExhausted("client ", peer.client_id, " holds ", held,
                                 " slabs on this server, its quota "
                                 "(--max_slabs_per_client ",
                                 options_.max_slabs_per_client,
                                 "); free slabs or ask the operator to raise it");
      }
      TESSERA_ASSIGN_OR_RETURN(id, pool_->Alloc(peer.owner_id));
    }
    TESSERA_ASSIGN_OR_RETURN(uint64_t offset, pool_->OffsetOf(id));
    fabric::AllocSlabResponse resp;
    resp.slab_id = id;
    resp.size = pool_->slab_bytes();
    resp.remote_addr = registration_.base_addr + offset;
    resp.rkey = registration_.rkey;
    return resp;
  };
  return scope.Done(run());
}

Status MemServerHandler::FreeSlab(const PeerInfo& peer, const fabric::FreeSlabRequest& req) {
  OpScope scope(&metrics_, OpSlot::kFree);
  if (peer.admin) {
    // An admin may free any client's slab; say so in the log when it is not its own.
    auto owner = pool_->OwnerOf(req.slab_id);
    if (owner.ok() && *owner != peer.owner_id) {
      TLOG(WARNING) << "admin client " << peer.client_id << " (" << peer.address
                    << ") frees slab " << req.slab_id << " of client " << *owner;
      return scope.DoneStatus(pool_->ForceFree(req.slab_id));
    }
  }
  return scope.DoneStatus(pool_->Free(peer.owner_id, req.slab_id));
}

Result<std::string> MemServerHandler::Stats(const PeerInfo& peer) {
  (void)peer;
  OpScope scope(&metrics_, OpSlot::kStats);
  return StatsText();
}

Result<fabric::HeartbeatResponse> MemServerHandler::Heartbeat(const PeerInfo& peer) {
  (void)peer;
  OpScope scope(&metrics_, OpSlot::kHeartbeat);
  SlabPool::Counts c = pool_->counts();
  fabric::HeartbeatResponse h;
  h.server_time_ns = MonotonicNs();
  uint64_t lendable = c.limit_slabs > c.allocated_slabs ? c.limit_slabs - c.allocated_slabs : 0;
  h.free_bytes = lendable * pool_->slab_bytes();
  h.total_bytes = pool_->capacity_bytes();
  h.slabs_used = static_cast<uint32_t>(c.allocated_slabs);
  h.slabs_free = static_cast<uint32_t>(lendable);
  h.load_permille = metrics_.load_permille();
  fabric::Server* server = server_.load(std::memory_order_acquire);
  h.connections = server ? server->connection_count() : 0;
  return h;
}

Result<std::vector<uint8_t>> MemServerHandler::Invoke(const PeerInfo& peer, uint32_t function_id,
                                                      std::span<const uint8_t> args) {
  OpScope scope(&metrics_, OpSlot::kInvoke);
  if (function_id == kFaultFunctionId) {
    if (Status st = RequireAdmin(peer, "fault injection"); !st.ok()) {
      return scope.Done(Result<std::vector<uint8_t>>(st));
    }
    if (!options_.fault_injection) {
      return scope.Done(Result<std::vector<uint8_t>>(
          Unsupported("fault injection is off on this server (start it with --fault_injection)")));
    }
    auto spec = DecodeFaultSpec(
        std::string_view(reinterpret_cast<const char*>(args.data()), args.size()));
    if (!spec.ok()) return scope.Done(Result<std::vector<uint8_t>>(spec.status()));
    auto text = ApplyFault(peer, *spec);
    if (!text.ok()) return scope.Done(Result<std::vector<uint8_t>>(text.status()));
    return std::vector<uint8_t>(text->begin(), text->end());
  }
  Function fn;
  {
    std::shared_lock lock(functions_mu_);
    auto it = functions_.find(function_id);
    if (it == functions_.end()) {
      return scope.Done(Result<std::vector<uint8_t>>(
          NotFound("no offload function ", function_id, " on this server")));
    }
    fn = it->second.fn;
  }
  auto r = fn(peer, args);
  if (r.ok() && r->size() > fabric::kMaxDataLength) {
    return scope.Done(Result<std::vector<uint8_t>>(
        Internal("function ", function_id, " returned ", r->size(), " bytes (max ",
                 fabric::kMaxDataLength, ")")));
  }
  return scope.Done(std::move(r));
}

Result<FaultSpec> MemServerHandler::FromWire(const fabric::FaultRequest& req) {
  FaultSpec s;
  switch (req.action) {
    case fabric::FaultAction::kClear: s.kind = FaultKind::kClear; break;
    case fabric::FaultAction::kDelay: s.kind = FaultKind::kDelay; break;
    case fabric::FaultAction::kHang: s.kind = FaultKind::kHang; break;
    case fabric::FaultAction::kDropConnection: s.kind = FaultKind::kDrop; break;
    case fabric::FaultAction::kCrash: s.kind = FaultKind::kCrash; break;
    case fabric::FaultAction::kEvictSlabs: s.kind = FaultKind::kEvict; break;
    default:
      return InvalidArgument("unknown fault action ", static_cast<uint32_t>(req.action));
  }
  if (req.delay_us > UINT64_MAX / 1000 || req.duration_ms > UINT64_MAX / 1000000) {
    return InvalidArgument("fault delay/duration overflows");
  }
  s.op_mask = req.op_mask;
  s.delay_ns = req.delay_us * 1000;
  s.duration_ns = req.duration_ms * 1000000;
  s.count = req.count;
  TESSERA_RETURN_IF_ERROR(ValidateFaultSpec(s));
  return s;
}

Status MemServerHandler::Fault(const PeerInfo& peer, const fabric::FaultRequest& req) {
  OpScope scope(&metrics_, OpSlot::kFault);
  if (Status st = RequireAdmin(peer, "fault injection"); !st.ok()) return scope.DoneStatus(st);
  if (!options_.fault_injection) {
    return scope.DoneStatus(
        Unsupported("fault injection is off on this server (start it with --fault_injection)"));
  }
  auto spec = FromWire(req);
  if (!spec.ok()) return scope.DoneStatus(spec.status());
  auto r = scope.Done(ApplyFault(peer, *spec));
  return r.ok() ? Status::Ok() : r.status();
}

Status MemServerHandler::RequireAdmin(const PeerInfo& peer, std::string_view what) {
  if (peer.admin) return Status::Ok();
  TLOG(WARNING) << "client " << peer.client_id << " (" << peer.address << ") asked for " << what
                << " with a client credential; refused";
  return PermissionDenied(what, " needs an admin credential (the cluster secret, or a token "
                          "from `tessera token issue --admin`); client ", peer.client_id,
                          " authenticated with a client credential");
}

Result<std::string> MemServerHandler::ApplyFault(const PeerInfo& peer, const FaultSpec& spec) {
  TESSERA_RETURN_IF_ERROR(RequireAdmin(peer, "fault injection"));
  TESSERA_RETURN_IF_ERROR(ValidateFaultSpec(spec));
  TLOG(WARNING) << "fault injection by client " << peer.client_id << " (" << peer.address
                << "): " << FaultKindName(spec.kind);
  switch (spec.kind) {
    case FaultKind::kCrash: {
      TLOG(ERROR) << "crashing on request (injected fault)";
      rlimit no_core{0, 0};
      ::setrlimit(RLIMIT_CORE, &no_core);  // An injected crash should not litter cores.
      std::abort();
    }
    case FaultKind::kBitFlip:
      return FlipBits(spec);
    case FaultKind::kEvict: {
      ResourceMonitor* m = monitor_.load(std::memory_order_acquire);
      if (m == nullptr) return Unsupported("no resource monitor on this server");
      uint64_t n = m->EvictNow(spec.count);
      return "evicting " + std::to_string(n) + " slab(s); owners notified";
    }
    default:
      TESSERA_RETURN_IF_ERROR(faults_.Apply(spec, MonotonicNs()));
      return "faults now: " + faults_.Describe(MonotonicNs());
  }
}

Result<std::string> MemServerHandler::FlipBits(const FaultSpec& spec) {
  static std::mutex rng_mu;
  static std::mt19937_64 rng(std::random_device{}());
  std::lock_guard<std::mutex> lock(rng_mu);
  std::vector<uint64_t> candidates;
  if (spec.slab_id != 0) {
    TESSERA_RETURN_IF_ERROR(pool_->RawSlab(spec.slab_id).status());
    candidates.push_back(spec.slab_id);
  } else {
    for (const auto& s : pool_->AllocatedSlabs()) candidates.push_back(s.slab_id);
    if (candidates.empty()) return NotFound("no allocated slab to flip bits in");
  }
  std::ostringstream out;
  out << "flipped " << spec.count << " bit(s):";
  const uint64_t bits = pool_->slab_bytes() * 8;
  for (uint64_t i = 0; i < spec.count; ++i) {
    uint64_t slab = candidates[rng() % candidates.size()];
    auto mem = pool_->RawSlab(slab);
    if (!mem.ok()) continue;  // Freed meanwhile.
    uint64_t bit = rng() % bits;
    std::atomic_ref<uint8_t> byte((*mem)[bit / 8]);
    byte.fetch_xor(static_cast<uint8_t>(1u << (bit % 8)), std::memory_order_relaxed);
    if (i < 64) out << " slab=" << slab << ",byte=" << bit / 8 << ",bit=" << bit % 8;
  }
  if (spec.count > 64) out << " ...";
  TLOG(WARNING) << out.str();
  return out.str();
}

fabric::OpPolicy MemServerHandler::BeforeOp(const PeerInfo& peer, Op op) {
  if (IsServiceOwner(peer.client_id) || IsServiceOwner(peer.owner_id)) {
    // The services' slabs belong to these ids: no client may act as one.
    TLOG(WARNING) << "client " << peer.address << " claims an owner id reserved for services; "
                  << "dropped";
    return fabric::OpPolicy::Drop();
  }
  if (op == Op::kRead || op == Op::kWrite) metrics_.CountDataRequest();
  FaultState::Decision d = faults_.Decide(static_cast<uint16_t>(op), MonotonicNs());
  if (d.drop) {
    metrics_.CountFaulted();
    return fabric::OpPolicy::Drop();
  }
  if (d.hang) {
    metrics_.CountFaulted();
    return fabric::OpPolicy::Hang();
  }
  if (d.delay_ns > 0) {
    metrics_.CountFaulted();
    return fabric::OpPolicy::Delay(d.delay_ns);
  }
  return fabric::OpPolicy::Proceed();
}

void MemServerHandler::SlabEvicting(OwnerId owner, uint64_t slab_id, uint64_t deadline_ms) {
  fabric::Server* server = server_.load(std::memory_order_acquire);
  TLOG(INFO) << "evicting slab " << slab_id << " of client " << owner << " in " << deadline_ms
             << " ms";
  if (server == nullptr) return;
  fabric::Notice n;
  n.kind = fabric::NoticeKind::kSlabEvicting;
  n.slab_id = slab_id;
  n.deadline_ms = deadline_ms;
  Status s = server->Notify(owner, n);
  if (!s.ok()) TLOG(WARNING) << "eviction notice for slab " << slab_id << ": " << s;
}

void MemServerHandler::SlabEvicted(OwnerId owner, uint64_t slab_id) {
  TLOG(INFO) << "evicted slab " << slab_id << " of client " << owner;
}

std::string MemServerHandler::StatsText() {
  SlabPool::Counts c = pool_->counts();
  ResourceMonitor* m = monitor_.load(std::memory_order_acquire);
  ResourceMonitor::Stats ms = m ? m->stats() : ResourceMonitor::Stats{};
  fabric::Server* server = server_.load(std::memory_order_acquire);
  const uint64_t now = MonotonicNs();
  std::ostringstream o;
  o << "server_id " << (server ? server->server_id() : 0) << "\n";
  o << "uptime_s " << (now - start_ns_) / 1000000000ull << "\n";
  o << "slab_size " << pool_->slab_bytes() << "\n";
  o << "capacity_bytes " << pool_->capacity_bytes() << "\n";
  o << "slabs_max " << c.max_slabs << "\n";
  o << "slabs_limit " << c.limit_slabs << "\n";
  o << "slabs_allocated " << c.allocated_slabs << "\n";
  o << "slabs_evicting " << c.evicting_slabs << "\n";
  o << "bytes_allocated " << c.allocated_slabs * pool_->slab_bytes() << "\n";
  o << "huge_pages " << (pool_->huge_pages() ? 1 : 0) << "\n";
  o << "host_available_bytes " << ms.smoothed_available_bytes << "\n";
  o << "headroom_bytes " << options_.headroom_bytes << "\n";
  o << "evictions " << ms.evictions << "\n";
  o << "eviction_notices " << ms.notices_sent << "\n";
  o << "evictions_released_early " << ms.released_early << "\n";
  o << "connections " << (server ? server->connection_count() : 0) << "\n";
  o << "reply_backpressure_pauses " << (server ? server->reply_backpressure_pauses() : 0) << "\n";
  const LeaseStats ls = lease_stats();
  o << "orphan_grace_ms " << options_.orphan_grace_ns / 1000000 << "\n";
  o << "orphaned_owners " << ls.orphaned_owners << "\n";
  o << "slab_owners " << ls.slab_owners << "\n";
  o << "orphan_owners_reclaimed " << ls.owners_reclaimed << "\n";
  o << "orphan_slabs_reclaimed " << ls.slabs_reclaimed << "\n";
  o << "max_slabs_per_client " << options_.max_slabs_per_client << "\n";
  o << "quota_refusals " << quota_refusals_.load(std::memory_order_relaxed) << "\n";
  o << "ops_total " << metrics_.total_ops() << "\n";
  for (int i = 0; i < ServerMetrics::kOps; ++i) {
    o << "ops_" << OpSlotName(static_cast<OpSlot>(i)) << " " << metrics_.ops(static_cast<OpSlot>(i))
      << "\n";
  }
  o << "data_requests " << metrics_.data_requests() << "\n";
  o << "errors_total " << metrics_.total_errors() << "\n";
  char rate[32];
  std::snprintf(rate, sizeof(rate), "%.1f", metrics_.ops_per_sec());
  o << "ops_per_sec " << rate << "\n";
  o << "bytes_read " << metrics_.bytes_read() << "\n";
  o << "bytes_written " << metrics_.bytes_written() << "\n";
  o << "service_p50_ns " << metrics_.service().Percentile(0.5) << "\n";
  o << "service_p99_ns " << metrics_.service().Percentile(0.99) << "\n";
  o << "load_permille " << metrics_.load_permille() << "\n";
  o << "faulted_ops " << metrics_.faulted_ops() << "\n";
  for (Service* service : services_) o << service->StatsText();
  o << "faults " << faults_.Describe(now) << "\n";
  return o.str();
}

std::string MemServerHandler::PrometheusText() {
  SlabPool::Counts c = pool_->counts();
  ResourceMonitor* m = monitor_.load(std::memory_order_acquire);
  ResourceMonitor::Stats ms = m ? m->stats() : ResourceMonitor::Stats{};
  fabric::Server* server = server_.load(std::memory_order_acquire);
  PrometheusWriter w;
  auto by_op = [&](const char* name, const char* help, auto value_of) {
    w.Header(name, "counter", help);
    for (int i = 0; i < ServerMetrics::kOps; ++i) {
      const auto op = static_cast<OpSlot>(i);
      w.Sample(name, static_cast<double>(value_of(op)),
               "op=\"" + std::string(OpSlotName(op)) + "\"");
    }
  };
  by_op("tessera_memserver_ops_total", "Requests handled, by op.",
        [&](OpSlot op) { return metrics_.ops(op); });
  by_op("tessera_memserver_errors_total", "Requests answered with an error, by op.",
        [&](OpSlot op) { return metrics_.errors(op); });
  w.Counter("tessera_memserver_bytes_read_total", "Bytes served to READ requests.",
            metrics_.bytes_read());
  w.Counter("tessera_memserver_bytes_written_total", "Bytes accepted from WRITE requests.",
            metrics_.bytes_written());
  w.Header("tessera_memserver_slabs", "gauge",
           "Slabs by state; limit is what may be allocated now.");
  w.Sample("tessera_memserver_slabs", static_cast<double>(c.allocated_slabs),
           "state=\"allocated\"");
  w.Sample("tessera_memserver_slabs", static_cast<double>(c.evicting_slabs),
           "state=\"evicting\"");
  w.Sample("tessera_memserver_slabs", static_cast<double>(c.limit_slabs), "state=\"limit\"");
  w.Sample("tessera_memserver_slabs", static_cast<double>(c.max_slabs), "state=\"max\"");
  w.Ratio("tessera_memserver_slab_usage_ratio",
          "Allocated slabs / the slabs that may be allocated now (0..1).", c.allocated_slabs,
          c.limit_slabs);
  const LeaseStats ls = lease_stats();
  w.Gauge("tessera_memserver_orphaned_owners",
          "Clients holding slabs with no open connection (their lease is running out).",
          static_cast<double>(ls.orphaned_owners));
  w.Counter("tessera_memserver_orphan_owners_reclaimed_total",
            "Clients whose slabs were freed after --orphan_grace without a connection.",
            ls.owners_reclaimed);
  w.Counter("tessera_memserver_orphan_slabs_reclaimed_total",
            "Slabs freed by expired client leases.", ls.slabs_reclaimed);
  w.Gauge("tessera_memserver_slab_size_bytes", "Size of one slab.",
          static_cast<double>(pool_->slab_bytes()));
  w.Gauge("tessera_memserver_capacity_bytes", "Configured capacity.",
          static_cast<double>(pool_->capacity_bytes()));
  w.Gauge("tessera_memserver_host_available_bytes", "Smoothed MemAvailable of the host.",
          static_cast<double>(ms.smoothed_available_bytes));
  w.Counter("tessera_memserver_evictions_total",
            "Slabs freed by the resource monitor at their deadline.", ms.evictions);
  w.Counter("tessera_memserver_eviction_notices_total", "Eviction notices sent to slab owners.",
            ms.notices_sent);
  w.Gauge("tessera_memserver_connections", "Open client connections.",
          static_cast<double>(server ? server->connection_count() : 0));
  w.Gauge("tessera_memserver_load_ratio", "CPU load of the daemon, share (0..1) of the machine.",
          static_cast<double>(metrics_.load_permille()) / 1000.0);
  w.Counter("tessera_memserver_faulted_ops_total",
            "Requests delayed, hung or dropped by injected faults.", metrics_.faulted_ops());
  const AtomicLatencyHistogram& h = metrics_.service();
  w.LatencyHistogramSeconds("tessera_memserver_service_seconds",
                            "Time the handler spent per request.",
                            [&h](int b) { return h.bucket_count(b); }, h.sum());
  return options_.build_info_metrics + w.str();
}

}  // namespace tessera::memserver
