// RemoteStore: option validation, start-up (slab size probe, placement, I/O threads), Submit,
// Flush, Stats, and the public factories.
#include "client/remote/engine.h"
#include "client/remote/sim_control.h"
#include "client/remote/layout.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "common/logging.h"
#include "fabric/auth.h"

namespace tessera::client::remote {

Status RemoteStore::Init() {
  const RemoteStoreOptions& o = opt_;
  if (o.servers.size() < static_cast<size_t>(lay_.width())) {
    return InvalidArgument("need at least " + std::to_string(lay_.width()) +
                           " servers for " + name_ + ", got " +
                           std::to_string(o.servers.size()));
  }
  if (o.io_threads < 1 || o.io_threads > 16) return InvalidArgument("io_threads must be 1..16");
  if (o.max_inflight_pages < 8 || o.max_inflight_pages > 16384) {
    return InvalidArgument("max_inflight_pages must be 8..16384");
  }
  if (o.max_outstanding_per_server != 0 &&
      (o.max_outstanding_per_server < 8 || o.max_outstanding_per_server > 65536)) {
    return InvalidArgument("max_outstanding_per_server must be 0 (automatic) or 8..65536");
  }
  if (o.capacity_pages == 0) return InvalidArgument("capacity_pages must be > 0");
  if (o.poll_us > 1000) return InvalidArgument("poll_us must be 0..1000");
  if (o.direct_spin_us > 1000) return InvalidArgument("direct_spin_us must be 0..1000");
  if (o.heartbeat_interval_ms == 0 || o.heartbeat_timeout_ms == 0 || o.op_timeout_ms == 0) {
    return InvalidArgument("heartbeat and op timeouts must be > 0");
  }
  if (!(o.suspect_phi >= 1.0 && o.suspect_phi <= 100.0)) {
    return InvalidArgument("suspect_phi must be 1..100");
  }
  if (o.probe_timeout_ms == 0 || o.probe_timeout_ms > 600000) {
    return InvalidArgument("probe_timeout_ms must be 1..600000");
  }
  if (o.fail_after_ms > 3600000 || o.regeneration_grace_ms > 3600000) {
    return InvalidArgument("fail_after_ms and regeneration_grace_ms must be at most 1 hour");
  }
  TESSERA_RETURN_IF_ERROR(layout_->MakeCodecs(*this));
  client_id_ = o.client_id;
  while (client_id_ == 0) {
    uint8_t b[8];
    TESSERA_RETURN_IF_ERROR(fabric::RandomBytes(b));
    std::memcpy(&client_id_, b, 8);
  }
  if (o.servers.size() > kMaxServers) {
    return InvalidArgument("at most " + std::to_string(kMaxServers) + " servers");
  }
  failed_.reset(new std::atomic<bool>[kMaxServers]);
  for (size_t i = 0; i < kMaxServers; ++i) failed_[i].store(false);
  health_.reset(new std::atomic<uint8_t>[kMaxServers]);
  last_alive_ns_.reset(new std::atomic<uint64_t>[kMaxServers]);
  failed_at_ns_.reset(new std::atomic<uint64_t>[kMaxServers]);
  server_ids_.reset(new std::atomic<uint64_t>[kMaxServers]);
  for (size_t i = 0; i < kMaxServers; ++i) {
    health_[i].store(static_cast<uint8_t>(HealthState::kHealthy));
    last_alive_ns_[i].store(0);
    failed_at_ns_[i].store(0);
    server_ids_[i].store(0);
  }
  servers_.reset(new RemoteServer[kMaxServers]);
  for (size_t i = 0; i < o.servers.size(); ++i) servers_[i] = o.servers[i];
  num_servers_.store(static_cast<uint32_t>(o.servers.size()), std::memory_order_release);

  // The slab size is needed for the slab table: ask the first server (a short-lived control
  // connection; no data path is needed for that).
  if (o.sim) {
    uint64_t takes = 0;
    auto info = o.sim->Hello(0, MonotonicNs(), uint64_t{o.connect_timeout_ms} * 1000000, &takes);
    if (!info.ok()) return Unavailable("cannot connect to server 0: " + info.status().ToString());
    slab_size_ = info->slab_size;
  } else {
    fabric::ConnectOptions co;
    co.secret = o.secret;
    co.client_id = client_id_;
    co.deadline = Deadline::AfterMs(o.connect_timeout_ms);
    auto c = fabric::ControlClient::Connect(o.servers[0].endpoint, co);
    if (!c.ok()) {
      return Unavailable("cannot connect to " + o.servers[0].endpoint.ToString() + ": " +
                         c.status().ToString());
    }
    slab_size_ = (*c)->info().slab_size;
  }
  if (slab_size_ < lay_.split) return InvalidArgument("server slab size is below one split");
  pages_per_slab_ = slab_size_ / lay_.split;
  num_slabs_ = layout_->NumSlabs(o, pages_per_slab_);
  // The client keeps tables for the whole address space (the slab table and, group, a page
  // location per page, at once; CRCs and per-page state as slabs fill). Refuse a capacity
  // whose tables could not fit in this machine's memory instead of dying in an allocation.
  {
    const long double need = layout_->TableBytes(o, num_slabs_);
    const long pages = sysconf(_SC_PHYS_PAGES), page_size = sysconf(_SC_PAGE_SIZE);
    const long double have = pages > 0 && page_size > 0
                                 ? static_cast<long double>(pages) * page_size
                                 : static_cast<long double>(uint64_t{1} << 40);
    if (need > have) {
      return ResourceExhausted("capacity_pages ", o.capacity_pages, " needs about ",
                               static_cast<uint64_t>(need / (1 << 20)),
                               " MiB of client-side page tables, more than this machine's ",
                               static_cast<uint64_t>(have / (1 << 20)), " MiB of memory");
    }
  }

  std::vector<placement::ServerInfo> infos;
  for (size_t i = 0; i < o.servers.size(); ++i) {
    placement::ServerInfo si;
    si.id = static_cast<placement::ServerId>(i);
    si.address = o.servers[i].endpoint.ToString();
    si.capacity_slabs = 1 << 20;
    si.free_slabs = si.capacity_slabs;
    si.rack = o.servers[i].rack;
    infos.push_back(si);
  }
  TESSERA_ASSIGN_OR_RETURN(snap_, placement::MembershipSnapshot::Create(1, std::move(infos)));
  placement::PolicySpec spec = o.placement;
  layout_->Placement(&spec);
  auto pol = placement::CreatePolicy(spec, snap_);
  if (!pol.ok() && layout_->PlacementFallback(&spec)) pol = placement::CreatePolicy(spec, snap_);
  if (!pol.ok()) return pol.status();
  policy_ = *pol;
  if (policy_->width() != lay_.width()) {
    return InvalidArgument("placement " + policy_->name() + " places " +
                           std::to_string(policy_->width()) + " servers per slab, layout needs " +
                           std::to_string(lay_.width()));
  }
  load_.assign(o.servers.size(), 0);

  for (int i = 0; i < o.io_threads; ++i) threads_.push_back(std::make_unique<IoThread>(this, i));
  for (auto& t : threads_) TESSERA_RETURN_IF_ERROR(t->Start());
  // Simulation: the simulation's heartbeats stand in for the monitor (sim_control.h).
  if (!o.sim) monitor_ = std::thread([this] { MonitorLoop(); });
  return Status::Ok();
}

uint64_t RemoteStore::SimTurn() {
  uint64_t next = UINT64_MAX;
  for (auto& t : threads_) next = std::min(next, t->SimTurn());
  return next;
}


Status RemoteStore::Submit(std::span<PageOp* const> ops) {
  TESSERA_RETURN_IF_ERROR(ValidateBatch(ops));
  if (threads_.empty()) return Unavailable("page store is shut down");
  const uint64_t T = threads_.size();
  for (PageOp* op : ops) {
    QueueItem item;
    item.op = op;
    threads_[op->page >= opt_.capacity_pages ? 0 : ThreadOf(op->page) % T]->Enqueue(item);
  }
  return Status::Ok();
}


Status RemoteStore::Flush() {
  // Wait (bounded by the op timeout plus slack) until no acknowledged write has splits left.
  const Deadline d = Deadline::AfterMs(opt_.op_timeout_ms * 3 + opt_.control_timeout_ms);
  if (threads_.empty()) return Unavailable("page store is shut down");
  // A barrier through every I/O thread's queue: the ops submitted before this call have been
  // started when it passes (group layout: and the stripe buffers are sealed), so the wait below
  // covers them too: every write submitted or acknowledged before Flush() is stored with all
  // k+r splits / stripe members when it returns.
  {
    QueueJob job;
    job.left = static_cast<int>(threads_.size());
    for (auto& t : threads_) {
      QueueItem item;
      item.kind = QueueItem::Kind::kFlush;
      item.trim = &job;
      t->Enqueue(item);
    }
    std::unique_lock<std::mutex> lock(job.mu);
    job.cv.wait(lock, [&] { return job.left == 0; });
    TESSERA_RETURN_IF_ERROR(job.status);
  }
  for (;;) {
    uint64_t left = 0;
    for (const auto& t : threads_) left += t->unsettled();
    if (left == 0) return Status::Ok();
    if (d.Expired()) {
      return Timeout("Flush: " + std::to_string(left) + " writes still being stored");
    }
    std::this_thread::yield();
  }
}

PageStoreStats RemoteStore::Stats() const {
  PageStoreStats s;
  s.reads = stats_.reads.load();
  s.writes = stats_.writes.load();
  s.read_errors = stats_.read_errors.load();
  s.write_errors = stats_.write_errors.load();
  s.trims = stats_.trims.load();
  s.degraded_reads = stats_.degraded_reads.load();
  s.decodes = stats_.decodes.load();
  s.corruptions_detected = stats_.corruptions_detected.load();
  s.corruptions_repaired = stats_.corruptions_repaired.load();
  s.data_loss = stats_.data_loss.load();
  s.server_failures = stats_.server_failures.load();
  s.server_suspicions = stats_.server_suspicions.load();
  s.server_recoveries = stats_.server_recoveries.load();
  s.verdicts_held = stats_.verdicts_held.load();
  s.reconnects = stats_.reconnects.load();
  s.stale_repairs = stats_.stale_repairs.load();
  s.allocs_abandoned = stats_.allocs_abandoned.load();
  s.slabs_released = stats_.slabs_freed.load();
  s.regenerations_done = stats_.regenerations_done.load();
  const int64_t pending = static_cast<int64_t>(stats_.regenerations_pending.load());
  s.regenerations_pending = pending < 0 ? 0 : static_cast<uint64_t>(pending);
  s.bytes_sent = stats_.bytes_sent.load();
  s.bytes_received = stats_.bytes_received.load();
  s.hedged_reads = stats_.hedged_reads.load();
  s.compaction_moves = stats_.compaction_moves.load();
  s.stripes_written = stats_.stripes_written.load();
  s.padding_slots = stats_.padding_slots.load();
  s.parity_updates = stats_.parity_updates.load();
  s.slots_reclaimed = stats_.slots_reclaimed.load();
  const int64_t stored = static_cast<int64_t>(stats_.stored_pages.load());
  s.stored_pages = stored < 0 ? 0 : static_cast<uint64_t>(stored);
  s.remote_bytes = stats_.remote_slabs.load() * slab_size_;
  s.direct_reads = stats_.direct_reads.load();
  s.direct_fallbacks = stats_.direct_fallbacks.load();
  s.direct_hedged = stats_.direct_hedged.load();
  s.direct_spin_hits = stats_.direct_spin_hits.load();
  s.direct_sleeps = stats_.direct_sleeps.load();
  for (const auto& t : threads_) t->CopyHistograms(&s.read_latency, &s.write_latency);
  return s;
}


Result<std::vector<size_t>> RemoteStore::ServersOfPage(PageId page) const {
  if (page >= opt_.capacity_pages) return OutOfRange("page beyond capacity");
  if (threads_.empty()) return Unavailable("page store is shut down");
  if (!layout_->LocateOnIoThread()) return threads_[ThreadOf(page)]->ServersOf(page);
  // Only the owning I/O thread may read the page table: ask it through its queue.
  LocateJob job;
  job.page = page;
  QueueItem item;
  item.kind = QueueItem::Kind::kLocate;
  item.locate = &job;
  threads_[ThreadOf(page)]->Enqueue(item);
  std::unique_lock<std::mutex> lock(job.mu);
  job.cv.wait(lock, [&] { return job.done; });
  return std::move(job.result);
}

size_t RemoteStore::ThreadOf(PageId page) const {
  return layout_->ThreadOf(page, pages_per_slab_, static_cast<uint64_t>(opt_.io_threads));
}

std::vector<RemoteServer> RemoteStore::Servers() const {
  std::vector<RemoteServer> out;
  const uint32_t n = num_servers();
  for (uint32_t i = 0; i < n; ++i) out.push_back(server(i));
  return out;
}

std::vector<bool> RemoteStore::ServersFailed() const {
  std::vector<bool> out;
  const uint32_t n = num_servers();
  for (uint32_t i = 0; i < n; ++i) out.push_back(failed_[i].load());
  return out;
}

RemoteStore::RemoteStore(const RemoteStoreOptions& o, LayoutParams lay, std::string name)
    : opt_(o), lay_(lay), layout_(NewStoreLayout(lay_)), name_(std::move(name)) {}

RemoteStore::~RemoteStore() { Shutdown(); }

Result<std::unique_ptr<fabric::Transport>> RemoteStore::NewTransport(
    const fabric::TransportOptions& to) const {
  if (opt_.transport_factory) return opt_.transport_factory(to);
  return fabric::Transport::Create(to);
}

void RemoteStore::Shutdown() {
  // No AddServer/RemoveServer runs while the threads go away (they hold add_mu_).
  std::lock_guard<std::mutex> add_lock(add_mu_);
  // Direct readers of other threads notice alive_ expired and destroy themselves; this
  // thread's goes now.
  alive_.reset();
  DropThreadReader();
  {
    std::lock_guard<std::mutex> lock(monitor_mu_);
    monitor_stop_.store(true);
  }
  monitor_cv_.notify_all();
  if (monitor_.joinable()) monitor_.join();
  for (auto& t : threads_) t->RequestStop();
  threads_.clear();
}

}  // namespace tessera::client::remote

namespace tessera::client {

using remote::LayoutParams;
using remote::RemoteStore;

Result<std::unique_ptr<RemotePageStore>> CreateErasureCodedStore(
    const ErasureCodedStoreOptions& options) {
  if (options.delta < 0 || options.delta > options.r) {
    return InvalidArgument("delta must be 0..r (" + std::to_string(options.r) + ")");
  }
  LayoutParams lay;
  lay.k = options.k;
  lay.r = options.r;
  lay.copies = false;
  lay.group = options.layout == EcLayout::kGroup;
  if (options.layout != EcLayout::kSplit && options.layout != EcLayout::kGroup) {
    return InvalidArgument("unknown erasure-coded layout");
  }
  if (lay.group) {
    if (options.k < 1 || options.k > coding::kMaxDataSplits) {
      return InvalidArgument("k must be 1..32");
    }
  } else if (options.k < 1 || options.k > coding::kMaxDataSplits || kPageSize % options.k != 0) {
    return InvalidArgument("k must divide 4096 and be at most 32");
  }
  if (options.r < 1 || options.r > coding::kMaxParitySplits) {
    return InvalidArgument("r must be 1..4");
  }
  const GroupOptions& g = options.group;
  if (lay.group) {
    if (g.fill_us > 10000) return InvalidArgument("group fill_us must be 0..10000");
    if (g.hedge_us > 1000000) return InvalidArgument("group hedge_us must be 0..1000000");
    if (!(g.max_garbage_factor >= 1.05 && g.max_garbage_factor <= 4.0)) {
      return InvalidArgument("group max_garbage_factor must be 1.05..4");
    }
    if (g.compaction != GroupCompaction::kRestripe && g.compaction != GroupCompaction::kInPlace) {
      return InvalidArgument("unknown group compaction strategy");
    }
  }
  lay.split = lay.group ? kPageSize : kPageSize / static_cast<size_t>(options.k);
  lay.delta = options.delta;
  lay.ack = options.ack;
  lay.g = g;
  std::string name = std::string(lay.group ? "ec-group(" : "ec(") + std::to_string(options.k) +
                     "," + std::to_string(options.r) +
                     ") delta=" + std::to_string(options.delta) +
                     " ack=" + AckPolicyName(options.ack);
  auto store = std::make_unique<RemoteStore>(options.remote, lay, name);
  TESSERA_RETURN_IF_ERROR(store->Init());
  return std::unique_ptr<RemotePageStore>(std::move(store));
}

Result<std::unique_ptr<RemotePageStore>> CreateReplicatedStore(
    const ReplicatedStoreOptions& options) {
  if (options.copies < 1 || options.copies > 5) return InvalidArgument("copies must be 1..5");
  if (options.read_fanout < 1 || options.read_fanout > options.copies) {
    return InvalidArgument("read_fanout must be 1..copies");
  }
  LayoutParams lay;
  lay.k = 1;
  lay.r = options.copies - 1;
  lay.copies = true;
  lay.split = kPageSize;
  lay.delta = options.read_fanout - 1;
  lay.ack = options.ack;
  std::string name = options.copies == 1
                         ? std::string("single-copy")
                         : "replication(" + std::to_string(options.copies) + ") ack=" +
                               AckPolicyName(options.ack);
  auto store = std::make_unique<RemoteStore>(options.remote, lay, name);
  TESSERA_RETURN_IF_ERROR(store->Init());
  return std::unique_ptr<RemotePageStore>(std::move(store));
}


Result<std::vector<size_t>> ServersOfPage(const PageStore& store, PageId page) {
  return store.ServersOfPage(page);
}

Status AddRemoteServer(RemotePageStore& store, const RemoteServer& server) {
  return store.AddServer(server);
}

Status RemoveRemoteServer(RemotePageStore& store, const fabric::Endpoint& endpoint,
                          const std::string& why) {
  return store.RemoveServer(endpoint, why);
}

Result<std::vector<RemoteServer>> RemoteServersOf(const RemotePageStore& store) {
  return store.Servers();
}

Result<std::vector<bool>> RemoteServersFailed(const RemotePageStore& store) {
  return store.ServersFailed();
}

}  // namespace tessera::client
