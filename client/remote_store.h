// The remote PageStore layouts: erasure-coded (the resilient store of DESIGN.md) and simple
// copies (single copy, n-way replication). One engine serves all of them: a page is cut into
// `width` splits stored on `width` different memory servers chosen by placement; a layout is
// (k data splits, r redundant splits, how redundancy is computed):
//   - erasure-coded RS(k,r): 4096/k-byte splits, r parity splits from coding/codec.h;
//   - replication(n): k = 1, r = n - 1, every split is a full copy of the page;
//   - single copy: replication(1).
//
// Address space: page p lives in logical slab p / pages_per_slab (pages_per_slab = remote slab
// size / split size). A logical slab is a group of k+r remote slabs, allocated (AllocSlab) on
// the servers placement picked the first time one of its pages is written; split j of page p
// is at offset (p % pages_per_slab) * split_size of remote slab j.
//
// Integrity and freshness (the CRC/version design): the client keeps, in its own memory, the
// CRC32C of every split of the latest write of each page (4 bytes per split: 40 bytes per page
// for RS(8,2), 4-12 for copies; ~1% of the page data). A split read back is accepted only if its
// CRC matches. So one check catches both corruption on a server (bit flips) and stale splits
// (a replacement slab not yet regenerated, a write that did not land on a server that came
// back), and no per-split version field has to live remotely. What survives what: the table
// lives as long as the client (remote memory here is the client's swap, not durable storage),
// it survives any server failure, and it is what regeneration rebuilds splits against. Pages
// never written read as zeros without network traffic.
//
// Threads: the store runs `io_threads` I/O threads; each owns one fabric::Transport with a
// connection to every server, and the logical slabs s with s % io_threads == its index, so
// page metadata is touched by one thread only. Submit() (any thread) hands ops to the owning
// thread through lock-free queues and wakes it with an eventfd. A monitor thread sends
// heartbeats. Completion callbacks run on the I/O threads.
//
// Failures: a split that cannot be read is an erasure (the read asks further splits); a server
// declared failed is disconnected (its in-flight ops complete as erasures / re-placed writes),
// each of its splits is moved at once to a replacement chosen by Placement::ChooseReplacement
// (a fresh placement when no split survives to anchor it), and the pages are rebuilt there in
// the background at regeneration_pages_per_sec; a not-yet-rebuilt split simply fails its CRC.
// An eviction notice moves just that slab's split the same way. A read with fewer than k good
// splits fails with DataLoss naming the page; a read racing a write restarts instead.
// Trim and release: Trim() marks pages never-written in the client's table (they read as zeros
// without a round trip; nothing is written remotely) and, when no page of a logical slab is left
// written, FREEs its k+r remote slabs; the next write there allocates a fresh set. Trims go
// through the I/O threads' op queues, so they are ordered after writes submitted before them;
// a slab is freed only once no op of it is in flight. Destroying the store FREEs every slab it
// holds (bounded to 2 s; what a server does not free, its --orphan_grace lease reclaims).
// Slab allocation: a server that fails or does not answer an ALLOC within the op timeout is
// reported (suspected) and the split is placed on placement's replacement (up to 3 times), so a
// write needing a new slab does not fail because one server died unnoticed. No control call
// runs on an I/O thread: each has a thread that makes its ALLOCs (a new slab's members, the
// replacement of a member whose server failed or evicted it) and one that makes its FREEs;
// the group layout allocates one slab ahead of need, so a stripe never waits for an ALLOC
// unless a whole slab filled up while one was out. A reconnect's connect and handshake are
// made on a short-lived thread first, and the I/O thread connects (bounded) only once the
// server answered them.
// Coalescing: an I/O thread hands the transport all the requests of one loop iteration in one
// Post(), and the TCP transport sends the splits bound for one server as one READV/WRITEV
// request (fabric/wire.h), so with many pages in flight a server gets one request per batch
// instead of one per split (every layout gets this alike).
// Direct reads (group and erasure-coded split layouts, RemoteStoreOptions::direct_reads; not
// copies): a thread that calls the
// blocking ReadPage/ReadPages (the pager's fault threads, blocking bench callers) reads a stored
// page itself: it looks the page up in a table the owning I/O thread publishes (per page: a
// seqlock over slab, row, member and CRC; per slab: a seqlock over each member's server and
// remote slab), posts the read on its own thread-local Transport (one per thread and store,
// connected lazily to the servers it reads from, slabs added as they first appear), polls for
// the reply for direct_spin_us, then sleeps in Wait(); it accepts the page when the CRC matches
// and neither seqlock moved since the lookup. Anything else (the page is buffered, being
// written, moved or trimmed meanwhile, its server failed or did not answer within hedge_us, a
// CRC mismatch, a connection that cannot be made) hands the read to the I/O thread as before,
// which handles degraded reads, hedging and repair; a read that timed out goes there degraded
// at once. Never-written pages read as zeros on the caller's thread too. The split layout does
// the same with k + delta split reads (data first) on the caller's transport, the page's k + r
// CRCs published per page (a table per logical slab: (2 + k + r) words per page, about as much
// again as the I/O thread's own CRC table), the first k good splits assembled or decoded
// there; a split whose CRC mismatches sends the page to the I/O thread (which repairs it).
// NewThreadReader (client/page_store.h ThreadReader) is the same path for a thread with an
// event loop of its own (the NBD export's connection readers): many direct reads in flight on
// that thread's Transport, completions polled by the owner, overdue reads (hedge_us) and
// everything above handed to the I/O threads as Submit()ted ops.
// Late requests: a finished read's extra (late) requests older than 500 us let their op
// context go (it takes one of 64 spare buffers per I/O thread; the requests keep the old one
// until their replies arrive), and a server left behind by 8 finished reads in a row while
// it answered nothing for 500 us is silent until its next reply: reads ask it only when they
// cannot get k splits (members) elsewhere, never for the delta extra (even when other servers
// are slow too), so a stopped server does not hold spare buffers and op contexts until the op
// timeout.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "client/page_store.h"
#include "common/status.h"
#include "fabric/transport.h"
#include "placement/placement.h"

namespace tessera::client {

namespace remote {
class SimControl;  // client/remote/sim_control.h
}  // namespace remote

// When a write is acknowledged (its PageOp completes with OK).
enum class AckPolicy : uint8_t {
  // Default. After all k+r splits are stored. An acknowledged page survives the loss of any r
  // servers from that moment on. Writes cost the slowest of k+r server round trips.
  kAll,
  // After the first k splits are stored (any k). The page is readable at once (any k rebuild
  // it), but until the remaining r land, typically microseconds later, it survives fewer than r
  // failures; a split that cannot land (its server failed) is re-placed and written again in
  // the background. Flush() waits until every acknowledged write has all k+r splits stored.
  kFirstK,
};
const char* AckPolicyName(AckPolicy policy);  // "all", "first-k"
Result<AckPolicy> ParseAckPolicy(std::string_view name);

// How an erasure-coded store lays pages out on the servers (see the file comment).
enum class EcLayout : uint8_t {
  // Hydra's EC-Split: every page is cut into k splits on k+r servers; a read asks k (+delta)
  // servers. Cheap on RDMA, dear over TCP (k+1 messages per read, k+r per write).
  kSplit,
  // Carbink's EC-Batch: whole pages on one server each, k pages of k servers of one CodingSets
  // group form a stripe with r parity pages beside them. A read asks one server (k when
  // degraded); writes fill new stripes (log-structured) and compaction reclaims garbage.
  kGroup,
};
std::string_view EcLayoutName(EcLayout layout);  // "split", "group"
Result<EcLayout> ParseEcLayout(std::string_view name);

// How the group layout reclaims the garbage slots rewrites leave in sealed stripes.
enum class GroupCompaction : uint8_t {
  // Re-stripe: read the live pages of the stripes with the most garbage and write them again in
  // new stripes (one read per live page, (k+r)/k page writes per page moved); the emptied row
  // is reused whole.
  kRestripe,
  // In-place parity update: read the garbage slots and the r parity pages of the stripe with
  // the most garbage, take the garbage out of the parity in client memory (ISA-L
  // ec_encode_data_update), and fill those slots with new writes, updating the parity in place
  // (g + r reads and g + r writes for g slots; no page moves, no new row).
  kInPlace,
};
std::string_view GroupCompactionName(GroupCompaction c);  // "restripe", "in-place"
Result<GroupCompaction> ParseGroupCompaction(std::string_view name);

// Settings of the group layout (EcLayout::kGroup).
struct GroupOptions {
  // A write waits at most this long in the stripe buffer for k-1 other writes to share its
  // stripe (0..10000 us). A stripe sealed before it is full has padding slots (zeros that are
  // neither sent nor read); the I/O thread keeps the newest such stripe's parity and fills its
  // padding with later writes by updating the parity in place (ISA-L ec_encode_data_update:
  // n + r writes, no new garbage). Flush() seals at once.
  uint32_t fill_us = 50;
  // A read whose one server has not answered after this long also asks the rest of the stripe
  // and finishes with whichever completes first (0 = only when the server is classified slow or
  // fails). 1..1000000 us.
  uint32_t hedge_us = 2000;
  // Garbage bound: compaction keeps the data slots of used stripes at most this factor times the
  // live pages (plus two stripes of slack), so the memory overhead stays within
  // (k+r)/k x this factor (plus two slabs per I/O thread: the one being filled, and the spare
  // each I/O thread allocates ahead of need so that a stripe never waits for an ALLOC). 1.05..4.
  double max_garbage_factor = 1.2;
  // How garbage is reclaimed when the bound above is exceeded (draining a slab to give it back
  // always re-stripes). The default is the one `tessera bench pagestore --scenarios
  // overwrite` measures better on write throughput and memory (README, "Compaction:
  // re-striping vs in-place parity updates"); in-place sends fewer bytes and has a lower
  // QD1 write p99.
  GroupCompaction compaction = GroupCompaction::kRestripe;
};

// One memory server of the cluster. A store's server list grows when servers join
// (AddRemoteServer); failed servers keep their index.
struct RemoteServer {
  fabric::Endpoint endpoint;
  std::string rack;  // Failure domain ("" = unknown; either all servers have one or none).
};

// Settings shared by every remote layout. Defaults are what `tessera` uses.
struct RemoteStoreOptions {
  std::vector<RemoteServer> servers;  // Required; at least k+r (or copies) of them.
  std::string secret;                 // Shared secret of the cluster (fabric/auth.h).
  uint64_t client_id = 0;             // 0: a random non-zero id is drawn.
  fabric::TransportKind transport = fabric::TransportKind::kAuto;
  // Makes every Transport the store uses (its I/O threads', the heartbeat monitor's, the slab
  // size probe's). Empty: fabric::Transport::Create. Tests pass a factory that wraps the real
  // transport to inject faults (client/testing/fault_injecting_transport.h). Called from the
  // store's threads; must be thread-safe.
  std::function<Result<std::unique_ptr<fabric::Transport>>(const fabric::TransportOptions&)>
      transport_factory;

  // Only for the deterministic simulation of the engine (client/remote/sim_control.h): the
  // store starts no thread, and its control calls go to this simulated control plane. Null in
  // every real use.
  std::shared_ptr<remote::SimControl> sim;

  uint64_t capacity_pages = 1 << 18;  // Size of the page address space (default 1 GiB).
  int io_threads = 1;                 // I/O threads (1..16); 1 suits a 2-core machine.
  uint32_t max_inflight_pages = 256;  // Pages in flight per I/O thread (8..16384).
  // Requests one I/O thread may have outstanding at one server (0: its op contexts,
  // max_inflight_pages + 16; else 8..65536). An op has at most one request at a server, so
  // only requests left at a server that does not answer (late requests of finished reads) take
  // it past the default; a lower cap bounds the share of a thread's op contexts one stopped or
  // hung server can hold. Past the cap the server is left out as a suspect one is: reads ask
  // the other members (it only when k cannot be had without it), and writes to it wait until
  // it is below the cap again. A server at its cap that has also given this thread no reply
  // for a quarter of op_timeout_ms (at most 1 s) is not answering, not busy: its data
  // connection is aborted, which returns every request slot and buffer it held (reads ask
  // elsewhere, writes wait for the connection), the server is suspected, and the connection is
  // re-established once it answers again. A busy server that keeps answering is never aborted.
  uint32_t max_outstanding_per_server = 0;
  // After its last bit of work an I/O thread keeps polling (completions, new ops) for this long
  // before it sleeps (0..1000). Sleeping means the next op or reply has to wake it, which costs
  // tens of microseconds on a virtual machine; polling costs CPU the servers on a shared box
  // would otherwise get.
  uint32_t poll_us = 0;
  // Run-to-completion reads (group and erasure-coded split layouts): a blocking ReadPage/ReadPages
  // reads a stored page on the calling thread, over that thread's own Transport, straight from
  // the servers holding it (see "Direct reads" in the file comment). False: every read goes
  // through the I/O threads.
  bool direct_reads = true;
  // Servers whose replies are much slower than the others' (latency EWMA > 2x the median and
  // > median + 100 us), or silent (late for 8 reads in a row while others answered), are asked
  // last by reads (ErasureCodedStoreOptions::delta). False: only suspect and capped servers are
  // left out (a test whose faults must reach a given server on a loaded machine).
  bool avoid_slow_servers = true;
  // A direct read polls for its reply for twice the reader's recent reply time, but at most this
  // long (0..1000 us; 0: never polls), before it sleeps in the transport's Wait(); if the recent
  // replies took longer than this, it sleeps at once. Polling saves a wake-up (tens of
  // microseconds on a virtual machine whose idle CPUs halt) when the reply is quick, and costs
  // CPU the servers on a shared box would otherwise get.
  uint32_t direct_spin_us = 100;

  // Failure handling (client/remote/health.h): every server is healthy, suspect or failed.
  // Suspect: it has been silent long enough that its phi-accrual level (silence over the mean
  // interval of its recent heartbeat replies) reached suspect_phi, and at least
  // heartbeat_timeout_ms; or there was trouble with it (a request without a reply within
  // op_timeout_ms, a data connection that could not be re-established, its etcd lease expired).
  // Reads ask a suspect server last and never wait on it; it is healthy again as soon as it
  // answers anything. Failed (the verdict; its splits are re-placed, and rebuilt after
  // regeneration_grace_ms): suspect without a break for fail_after_ms, and then a confirming
  // probe (a fresh connection, authentication and one heartbeat within probe_timeout_ms) failed.
  // A server that announces its shutdown is failed at once. A lost data connection is
  // reconnected (same credential, same slabs) before anything is suspected. Heartbeats go to
  // every server at once every heartbeat_interval_ms, from the monitor thread; the time the
  // client itself was not running is excused (it never counts as a server's silence).
  uint32_t heartbeat_interval_ms = 100;
  uint32_t heartbeat_timeout_ms = 1000;
  double suspect_phi = 8.0;
  uint32_t fail_after_ms = 1000;
  uint32_t probe_timeout_ms = 1000;
  uint32_t regeneration_grace_ms = 2000;
  uint32_t op_timeout_ms = 2000;
  uint32_t connect_timeout_ms = 5000;
  uint32_t control_timeout_ms = 5000;  // AllocSlab / FreeSlab.

  // Background regeneration of lost splits onto replacement servers: at most this many pages
  // rebuilt per second per I/O thread (0 = unlimited).
  uint64_t regeneration_pages_per_sec = 20000;

  // Placement policy (CodingSets by default); k/r/replicas are overridden by the layout.
  placement::PolicySpec placement;
};

struct ErasureCodedStoreOptions {
  RemoteStoreOptions remote;
  int k = 8;  // Data splits (4096 must divide by k: 1, 2, 4, 8, 16, ...).
  int r = 2;  // Parity splits (1..4 with k + r <= 20). The page survives r lost splits.
  // Late binding: a read asks k + delta splits (data splits first) and finishes with the first
  // k good ones; 0 asks exactly k (a straggler then stalls the read until the op timeout).
  // Splits on a server whose replies are much slower than the others' (EWMA > 2x the median
  // and > median + 100 us) are asked last, for every layout (replication picks another copy).
  int delta = 1;
  AckPolicy ack = AckPolicy::kAll;
  // Split or group layout; see EcLayout. The default is the one `tessera bench pagestore`
  // measures faster on TCP (README, "Erasure-coded layouts").
  EcLayout layout = EcLayout::kGroup;
  GroupOptions group;  // Group layout only.
};

struct ReplicatedStoreOptions {
  RemoteStoreOptions remote;
  int copies = 2;  // 1 = single copy (no redundancy), 2..5 = n-way replication.
  // A read asks this many copies at once and takes the first good one (1 = primary only;
  // other copies are asked when it fails or times out).
  int read_fanout = 1;
  AckPolicy ack = AckPolicy::kAll;  // kFirstK acks after the first copy is stored.
};

// A remote PageStore (erasure-coded or replicated, made by the factories below): a PageStore
// whose server list can change while it runs. The membership calls are described with their
// free-function forms below (AddRemoteServer, ...), which a membership watcher uses. Any thread
// except the store's own (completion callbacks).
class RemotePageStore : public PageStore {
 public:
  virtual Status AddServer(const RemoteServer& server) = 0;
  virtual Status RemoveServer(const fabric::Endpoint& endpoint, const std::string& why) = 0;
  // The server list in index order, and which of them are marked failed.
  virtual std::vector<RemoteServer> Servers() const = 0;
  virtual std::vector<bool> ServersFailed() const = 0;
};

// Connects to every server (each I/O thread), checks they share one slab size, and starts the
// threads. Unavailable when a server cannot be reached; InvalidArgument for bad settings.
Result<std::unique_ptr<RemotePageStore>> CreateErasureCodedStore(
    const ErasureCodedStoreOptions& options);
Result<std::unique_ptr<RemotePageStore>> CreateReplicatedStore(
    const ReplicatedStoreOptions& options);

// Servers from "host:port,host:port" or a cluster file (fabric/cluster_file.h).
Result<std::vector<RemoteServer>> ParseServerList(std::string_view list);
Result<std::vector<RemoteServer>> LoadServers(const std::string& cluster_file);

// Indices (into the store's server list: the options' servers, then the ones added by
// AddRemoteServer in order) of the servers holding page `page`'s splits, split order (for tests
// and tools). NotFound before the page's slab exists; InvalidArgument when `store` is not a
// remote store. Any thread. (Same as store.ServersOfPage(page), which every PageStore has.)
Result<std::vector<size_t>> ServersOfPage(const PageStore& store, PageId page);

// Membership changes of a running remote store, for a membership watcher (membership/, etcd).
// Any thread except the store's own (completion callbacks); they block for at most a few
// connect timeouts.
//
// AddRemoteServer: a server that joined the cluster. It is checked (reachable, same slab size;
// rack labels: either every server has one or none does), every I/O thread and the heartbeat
// monitor connect to it, and only then placement may choose it for new slabs (existing slabs
// stay where they are). OK at once when a live server with that endpoint is a member already.
// Unavailable / Timeout when it cannot be reached (it is then not used). At most kMaxServers
// (1024) servers over a store's life: indices are never reused.
Status AddRemoteServer(RemotePageStore& store, const RemoteServer& server);
// RemoveRemoteServer: the server at `endpoint` left the cluster (its etcd registration was
// deleted or its lease expired): trouble, like a request without a reply. The server becomes
// suspect and is failed (its splits regenerated onto other servers) only when a confirming
// probe over a fresh connection fails too, so an etcd outage fails no live server. NotFound
// when no live member has that endpoint (e.g. it was found failed first).
Status RemoveRemoteServer(RemotePageStore& store, const fabric::Endpoint& endpoint,
                          const std::string& why);
// The store's current server list (index order, as ServersOfPage numbers them) and which of
// them are marked failed. Any thread.
Result<std::vector<RemoteServer>> RemoteServersOf(const RemotePageStore& store);
Result<std::vector<bool>> RemoteServersFailed(const RemotePageStore& store);

}  // namespace tessera::client
