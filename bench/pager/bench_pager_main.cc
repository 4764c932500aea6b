// tessera bench pager: the userfaultfd pager against the raw PageStore and against Linux swap.
//
// (a) Fault service latency: a region of pages written through the pager and evicted to an
//     RS(8,2) store on 10 local memservers, then touched once each in random order at QD1; the
//     faulting thread's time and the pager's own histogram vs PageStore::ReadPage at QD1 on the
//     same store and pages, in the same run; and the bare fabric's QD1 4 KB read (one
//     Transport, one memserver, polling, as `tessera bench fabric` measures it), the peer of
//     issue 11's target: fault service p50 <= 1.3x the bare fabric read p50.
// (b) Completion time of the standalone workload (tessera-bench-pager-workload: seq, random,
//     zipf) at 100/75/50% local memory: in-process over a Pager region, under `tessera run`
//     (when built), and under Linux swap (a swapfile in /var/tmp and a cgroup-v1 memory limit of
//     the same size, set up and removed by the bench); plus FIFO vs smart victim faults on zipf
//     and the prefetch hit rate on seq.
// (c) 50% local memory with one memserver SIGKILLed half-way, vs the healthy run.
// Every section runs once per erasure-coded layout of --layouts (split and group by default,
// over one cluster; the workload runs of the layouts are interleaved so they see the same
// machine), and every row names its layout. The plain and Linux-swap runs do not depend on the
// layout: they are measured once and compared with each layout (the pager-vs-swap rows).
#include <gflags/gflags.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <random>
#include <sstream>
#include <thread>

#include "apps/cli/cli.h"
#include "bench/pager/workload.h"
#include "client/local_cluster.h"
#include "client/remote_store.h"
#include "bench/support/swap_cgroup.h"
#include "common/clock.h"
#include "common/histogram.h"
#include "common/report.h"
#include "common/subprocess.h"
#include "fabric/control_client.h"
#include "fabric/transport.h"
#include "kernel_shim/pager/pager.h"

DEFINE_bool(quick, false, "Small sizes and one run (CI smoke test, ~30 s)");
DEFINE_bool(json, false, "JSON lines instead of tables");
DEFINE_int32(mib, 16, "Workload footprint in MiB");
DEFINE_int32(passes, 2, "Workload passes");
DEFINE_int32(runs, 3, "Runs per configuration (medians are reported)");
DEFINE_int32(fault_samples, 3000, "Faults (and raw reads) sampled per latency run");
DEFINE_bool(swap, true, "Compare with Linux swap (swapfile + cgroup-v1 memory limit)");
DEFINE_bool(run, true, "Also run the workloads under `tessera run` (when it is built)");
DEFINE_string(sections, "latency,workloads,policy,failure",
              "Comma-separated parts to run: latency, workloads, policy, failure");
DEFINE_int32(evict_batch, 64, "Pager: pages per eviction batch");
DEFINE_bool(inactive_list, false,
            "Pager: victims wait on an inactive list (moved to a local staging area) where a "
            "read brings them back without a store read; the policy section then also runs zipf "
            "with the list on and off");
DEFINE_double(low_watermark, 0.95, "Pager: eviction stops at this fraction of the cap");
DEFINE_string(swap_dir, "/var/tmp", "Directory of the temporary swapfile (local disk)");
DEFINE_bool(fault_thread_reads, true,
            "Pager: the fault thread reads a remote page itself (blocking ReadPage) instead of "
            "submitting it and mapping it from the store's completion callback");
DEFINE_string(layouts, "split,group",
              "Erasure-coded layouts measured side by side, comma-separated: split, group");
DEFINE_string(layout, "", "One erasure-coded layout only (same as --layouts L)");
DEFINE_bool(direct_reads, true,
            "Blocking reads (a fault thread's, the raw reads) run to completion on "
            "the caller's thread (RemoteStoreOptions::direct_reads); false: through the store's "
            "I/O thread");
DEFINE_int32(fault_spin_us, 0,
             "PagerOptions::fault_spin_us (0..1000): how long a fault thread polls the "
             "userfaultfd after a fault before it sleeps (default: tessera run's)");
DEFINE_int32(direct_spin_us, 100,
             "RemoteStoreOptions::direct_spin_us (0..1000): the most a direct read polls for its "
             "reply (twice the recent reply time, within this bound) before it sleeps");
DEFINE_int32(zero_fault_around, 16,
             "Pager: never-written neighbours mapped with a zero-fill fault (0..64)");

namespace tessera {
namespace {

using bench_pager::Pattern;
using client::kPageSize;

const cli::CliSpec kSpec{
    "tessera bench pager",
    "[--quick] [--json] [--mib N] [--passes P] [--runs R] [--noswap] [--norun] "
    "[--layouts split,group]",
    "Fault service latency of the userfaultfd pager vs raw PageStore reads (RS(8,2), 10 local "
    "memservers), workload completion times at 100/75/50% local memory in-process, under `tessera "
    "run` and under Linux swap with a cgroup-v1 memory limit of the same size, FIFO vs smart "
    "victims on Zipf, prefetch hit rate, and 50% with a memserver SIGKILLed half-way; each for "
    "the split and the group erasure-coded layout, side by side.",
    __FILE__, 0, 0};

// ---------------------------------------------------------------------------------------------
// Linux swap environment: a swapfile and a memory cgroup, removed on every exit path.

bench::SwapCgroup g_swap;  // The Linux-swap peer (bench/support/swap_cgroup.h).

// ---------------------------------------------------------------------------------------------

struct Outcome {
  bool ok = false;
  double ms = 0;
  uint64_t checksum = 0;
  std::string error;
};

// Runs argv, expecting the workload's result line on stdout.
Outcome RunWorkloadProcess(const std::vector<std::string>& argv, int timeout_s = 120) {
  Outcome out;
  auto proc = Subprocess::Start(argv, Subprocess::Options{true, true, {}});
  if (!proc.ok()) {
    out.error = proc.status().ToString();
    return out;
  }
  auto line = proc->WaitForLine("workload=", Deadline::AfterMs(timeout_s * 1000ull));
  auto ws = proc->Wait(Deadline::AfterMs(30000));
  if (!line.ok()) {
    out.error = "no result line: " + line.status().ToString();
    if (ws.ok() && WIFSIGNALED(*ws)) {
      out.error += " (killed by signal " + std::to_string(WTERMSIG(*ws)) +
                   (WTERMSIG(*ws) == SIGKILL ? ", e.g. the OOM killer)" : ")");
    }
    return out;
  }
  if (!ws.ok() || !WIFEXITED(*ws) || WEXITSTATUS(*ws) != 0) {
    out.error = "exit status " + std::to_string(ws.ok() ? *ws : -1);
    return out;
  }
  const char* c = std::strstr(line->c_str(), "checksum=0x");
  const char* e = std::strstr(line->c_str(), "elapsed_ms=");
  if (!c || !e) {
    out.error = "malformed result line: " + *line;
    return out;
  }
  out.checksum = std::strtoull(c + 11, nullptr, 16);
  out.ms = std::strtod(e + 11, nullptr);
  out.ok = true;
  return out;
}

struct Env {
  std::unique_ptr<client::LocalCluster> cluster;
  std::unique_ptr<client::PageStore> store;
  uint64_t capacity_pages = 0;
};

Result<std::unique_ptr<client::PageStore>> OpenStore(client::LocalCluster& cluster,
                                                     uint64_t capacity_pages,
                                                     const std::string& layout) {
  client::ErasureCodedStoreOptions eo;
  for (const auto& ep : cluster.endpoints()) eo.remote.servers.push_back({ep, ""});
  eo.remote.secret = cluster.secret();
  eo.remote.capacity_pages = capacity_pages;
  eo.k = 8;
  eo.r = 2;
  eo.layout = *client::ParseEcLayout(layout);  // Validated in Main.
  eo.remote.direct_reads = FLAGS_direct_reads;
  eo.remote.direct_spin_us = static_cast<uint32_t>(FLAGS_direct_spin_us);
  TESSERA_ASSIGN_OR_RETURN(auto store, client::CreateErasureCodedStore(eo));
  return std::unique_ptr<client::PageStore>(std::move(store));
}

// The bare fabric's QD1 4 KB read, the peer of the fault-latency target: one Transport, one
// connection to server 0, one slab, a READ posted and polled until it completes (as `tessera
// bench fabric` measures it). Adds `samples` latencies to `h`.
Status BareFabricReads(client::LocalCluster& cluster, int samples, LatencyHistogram* h) {
  fabric::TransportOptions to;
  to.kind = fabric::TransportKind::kTcp;
  TESSERA_ASSIGN_OR_RETURN(auto t, fabric::Transport::Create(to));
  fabric::ConnectOptions co;
  co.secret = cluster.secret();
  co.client_id = 0x70616765ull;  // "page"
  co.deadline = Deadline::AfterMs(10000);
  const fabric::Endpoint ep = cluster.endpoints()[0];
  TESSERA_ASSIGN_OR_RETURN(fabric::ConnectionId c, t->Connect(ep, co));
  TESSERA_ASSIGN_OR_RETURN(auto control, fabric::ControlClient::Connect(ep, co));
  TESSERA_ASSIGN_OR_RETURN(fabric::AllocSlabResponse slab,
                           control->AllocSlab({}, Deadline::AfterMs(10000)));
  TESSERA_RETURN_IF_ERROR(t->AddSlab(c, slab));
  std::vector<uint8_t> buf(kPageSize, 7);
  TESSERA_RETURN_IF_ERROR(t->RegisterMemory(buf.data(), buf.size()));
  const uint64_t pages = std::min<uint64_t>(slab.size / kPageSize, 256);
  fabric::Completion comp[4];
  auto one = [&](fabric::OpKind kind, uint64_t page) -> Status {
    fabric::WorkRequest wr{c, kind, slab.slab_id, page * kPageSize, kPageSize, buf.data(), page};
    TESSERA_RETURN_IF_ERROR(t->Post({&wr, 1}));
    const Deadline d = Deadline::AfterMs(10000);
    while (!d.Expired()) {
      if (t->Poll(comp) > 0) return comp[0].status;
    }
    return Timeout("bare fabric read: no reply");
  };
  for (uint64_t p = 0; p < pages; ++p) TESSERA_RETURN_IF_ERROR(one(fabric::OpKind::kWrite, p));
  for (int i = 0; i < samples; ++i) {
    const uint64_t t0 = MonotonicNs();
    TESSERA_RETURN_IF_ERROR(one(fabric::OpKind::kRead, static_cast<uint64_t>(i) % pages));
    h->Record(MonotonicNs() - t0);
  }
  (void)control->FreeSlab(slab.slab_id, Deadline::AfterMs(1000));
  return Status::Ok();
}

// In-process: the workload over a Pager region. kill_at_half SIGKILLs server 0 half-way.
struct InProcess {
  Outcome outcome;
  kernel_shim::PagerStats stats;
};

InProcess RunInProcess(client::PageStore* store, Pattern pattern, size_t bytes, double fraction,
                       kernel_shim::VictimPolicy policy, bool prefetch,
                       client::LocalCluster* kill_cluster = nullptr, bool write_traps = true,
                       int inactive_list = -1) {
  InProcess r;
  kernel_shim::PagerOptions o;
  o.store = store;
  o.region_bytes = bytes;
  o.local_fraction = fraction >= 1.0 ? 0 : fraction;
  o.min_local_bytes = 1 << 20;
  o.evict_batch = static_cast<size_t>(FLAGS_evict_batch);
  o.low_watermark = FLAGS_low_watermark;
  o.victim = policy;
  o.prefetch = prefetch;
  o.write_traps = write_traps ? kernel_shim::WriteTraps::kOn : kernel_shim::WriteTraps::kOff;
  o.inactive_list = inactive_list < 0 ? FLAGS_inactive_list : inactive_list != 0;
  o.fault_thread_reads = FLAGS_fault_thread_reads;
  o.zero_fault_around_pages = static_cast<size_t>(FLAGS_zero_fault_around);
  auto pager = kernel_shim::Pager::Create(o);
  if (!pager.ok()) {
    r.outcome.error = pager.status().ToString();
    return r;
  }
  std::atomic<uint64_t> progress{0};
  std::atomic<bool> finished{false};
  std::thread killer;
  const uint64_t pages = bytes / kPageSize;
  const uint64_t total = pages + static_cast<uint64_t>(FLAGS_passes) * pages;
  if (kill_cluster) {
    killer = std::thread([&] {
      while (!finished.load() && progress.load() < total / 2) {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
      if (!finished.load()) (void)kill_cluster->Kill(0);
    });
  }
  uint64_t t0 = MonotonicNs();
  r.outcome.checksum = bench_pager::RunWorkload((*pager)->base(), bytes, pattern, FLAGS_passes,
                                                42, &progress);
  r.outcome.ms = static_cast<double>(MonotonicNs() - t0) / 1e6;
  finished = true;
  if (killer.joinable()) killer.join();
  r.stats = (*pager)->Stats();
  // The next run reuses the store's pages: release them.
  (void)(*pager)->Discard((*pager)->base(), bytes);
  r.outcome.ok = r.stats.fill_errors == 0;
  if (!r.outcome.ok) r.outcome.error = "fill errors";
  return r;
}

std::string Pct(double f) { return std::to_string(static_cast<int>(f * 100 + 0.5)) + "%"; }

int Main(int argc, char** argv) {
  cli::InitCli(kSpec, &argc, &argv);
  if (FLAGS_quick) {
    FLAGS_mib = std::min(FLAGS_mib, 4);
    FLAGS_runs = 1;
    FLAGS_fault_samples = std::min(FLAGS_fault_samples, 300);
    FLAGS_passes = 1;
  }
  if (FLAGS_mib < 1 || FLAGS_mib > 4096) cli::UsageError(kSpec, "--mib must be in [1, 4096]");
  if (FLAGS_runs < 1 || FLAGS_runs > 50) cli::UsageError(kSpec, "--runs must be in [1, 50]");
  if (FLAGS_passes < 1 || FLAGS_passes > 100) cli::UsageError(kSpec, "--passes must be in [1, 100]");
  if (FLAGS_fault_samples < 10 || FLAGS_fault_samples > 1000000) {
    cli::UsageError(kSpec, "--fault_samples must be in [10, 1000000]");
  }
  if (FLAGS_evict_batch < 1 || FLAGS_evict_batch > 4096) {
    cli::UsageError(kSpec, "--evict_batch must be in [1, 4096]");
  }
  if (!(FLAGS_low_watermark > 0 && FLAGS_low_watermark <= 1)) {
    cli::UsageError(kSpec, "--low_watermark must be in (0, 1]");
  }
  std::vector<std::string> layouts;
  {
    const std::string list = FLAGS_layout.empty() ? FLAGS_layouts : FLAGS_layout;
    const char* flag = FLAGS_layout.empty() ? "--layouts" : "--layout";
    std::stringstream ss(list);
    for (std::string item; std::getline(ss, item, ',');) {
      auto l = client::ParseEcLayout(item);
      if (!l.ok()) cli::UsageError(kSpec, std::string(flag) + ": " + l.status().message());
      std::string name(client::EcLayoutName(*l));
      if (std::find(layouts.begin(), layouts.end(), name) != layouts.end()) {
        cli::UsageError(kSpec, std::string(flag) + ": '" + name + "' is listed twice");
      }
      layouts.push_back(name);
    }
    if (layouts.empty()) cli::UsageError(kSpec, std::string(flag) + " is empty");
    if (!FLAGS_layout.empty() && layouts.size() > 1) {
      cli::UsageError(kSpec, "--layout takes one layout; use --layouts for several");
    }
  }
  if (FLAGS_fault_spin_us < 0 || FLAGS_fault_spin_us > 1000) {
    cli::UsageError(kSpec, "--fault_spin_us must be in [0, 1000]");
  }
  if (FLAGS_direct_spin_us < 0 || FLAGS_direct_spin_us > 1000) {
    cli::UsageError(kSpec, "--direct_spin_us must be in [0, 1000]");
  }
  if (FLAGS_zero_fault_around < 0 || FLAGS_zero_fault_around > 64) {
    cli::UsageError(kSpec, "--zero_fault_around must be in [0, 64]");
  }
  {
    std::stringstream ss(FLAGS_sections);
    for (std::string s; std::getline(ss, s, ',');) {
      if (s != "latency" && s != "workloads" && s != "policy" && s != "failure") {
        cli::UsageError(kSpec, "--sections: unknown section '" + s + "'");
      }
    }
  }
  const std::string bin = SelfExeDir();
  const size_t bytes = static_cast<size_t>(FLAGS_mib) << 20;
  const uint64_t lat_pages = static_cast<uint64_t>(FLAGS_fault_samples) + 512;
  const uint64_t capacity_pages = std::max<uint64_t>(bytes / kPageSize, lat_pages) + 1024;

  std::fprintf(stderr, "tessera bench pager: starting 10 memservers (RS(8,2), layouts %s)...\n",
               FLAGS_layout.empty() ? FLAGS_layouts.c_str() : FLAGS_layout.c_str());
  client::LocalClusterOptions lo;
  lo.bin_dir = bin;
  lo.servers = 10;
  // Generous: every `tessera run` of the bench leaves its slabs behind until the servers stop
  // (its heap addresses spread over an 8 GiB region), and a full server fails write-backs.
  lo.capacity = std::to_string(std::max<uint64_t>(
                    1024, capacity_pages * kPageSize / 8 / (1 << 20) * 3 * layouts.size() + 16)) +
                "M";
  lo.slab_size = "1M";
  auto cluster_or = client::LocalCluster::Start(lo);
  if (!cluster_or.ok()) {
    std::fprintf(stderr, "tessera bench pager: %s\n", cluster_or.status().ToString().c_str());
    return 1;
  }
  auto cluster = std::move(cluster_or).value();
  // One store per layout, on the same servers.
  std::map<std::string, std::unique_ptr<client::PageStore>> stores;
  for (const std::string& layout : layouts) {
    auto store_or = OpenStore(*cluster, capacity_pages, layout);
    if (!store_or.ok()) {
      std::fprintf(stderr, "tessera bench pager: %s layout: %s\n", layout.c_str(),
                   store_or.status().ToString().c_str());
      return 1;
    }
    stores[layout] = std::move(store_or).value();
  }

  Report report(FLAGS_json);
  struct Verdict {
    std::string layout, target, figures;
    bool pass;
  };
  std::vector<Verdict> verdicts;

  auto want_section = [](const char* s) {
    return ("," + FLAGS_sections + ",").find("," + std::string(s) + ",") != std::string::npos;
  };
  // ---- (a) fault service latency vs raw reads -------------------------------------------------
  for (const std::string& layout : layouts) {
  if (!want_section("latency")) break;
  client::PageStore* store = stores[layout].get();
  std::fprintf(stderr, "(a) fault service latency, %s layout: %d faults x %d runs...\n",
               layout.c_str(), FLAGS_fault_samples, FLAGS_runs);
  std::vector<double> raw50, raw99, flt50, flt99, pg50, pg99, fab50, fab99;
  const client::PageStoreStats direct_before = store->Stats();
  {
    kernel_shim::PagerOptions o;
    o.store = store;
    o.region_bytes = lat_pages * kPageSize;
    o.local_limit_bytes = 64 * kPageSize;
    o.prefetch = false;  // Every sampled access is a demand fault served by one store read.
    // FIFO: every sampled page (written first) is certainly evicted, i.e. in the store, before
    // sampling (the smart policy may keep an early page it saw written).
    o.victim = kernel_shim::VictimPolicy::kFifo;
    o.fault_thread_reads = FLAGS_fault_thread_reads;
    o.zero_fault_around_pages = static_cast<size_t>(FLAGS_zero_fault_around);
    o.fault_spin_us = static_cast<uint32_t>(FLAGS_fault_spin_us);
    auto pager_or = kernel_shim::Pager::Create(o);
    if (!pager_or.ok()) {
      std::fprintf(stderr, "tessera bench pager: %s\n", pager_or.status().ToString().c_str());
      return 1;
    }
    auto& pager = *pager_or;
    uint8_t* b = pager->base();
    for (uint64_t p = 0; p < lat_pages; ++p) std::memset(b + p * kPageSize, static_cast<int>(p), kPageSize);
    Deadline settle = Deadline::AfterMs(30000);
    while (pager->Stats().resident_pages > 64 && !settle.Expired()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    // Sampled pages: the first fault_samples pages, evicted long ago.
    std::vector<uint64_t> order(static_cast<size_t>(FLAGS_fault_samples));
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::mt19937_64 rng(1);
    std::vector<uint8_t> buf(kPageSize);
    uint64_t bad = 0;
    for (int run = 0; run < FLAGS_runs; ++run) {
      std::shuffle(order.begin(), order.end(), rng);
      LatencyHistogram raw, flt;
      for (uint64_t p : order) {
        uint64_t t0 = MonotonicNs();
        Status st = store->ReadPage(p, buf.data());
        raw.Record(MonotonicNs() - t0);
        if (!st.ok() || buf[17] != static_cast<uint8_t>(p)) {
          bad++;
          std::fprintf(stderr, "raw read of page %" PRIu64 ": %s, byte %d\n", p,
                       st.ToString().c_str(), buf[17]);
        }
      }
      LatencyHistogram fab;
      if (Status st = BareFabricReads(*cluster, FLAGS_fault_samples, &fab); !st.ok()) {
        std::fprintf(stderr, "tessera bench pager: bare fabric reads: %s\n", st.ToString().c_str());
        return 1;
      }
      fab50.push_back(fab.p50() / 1e3);
      fab99.push_back(fab.p99() / 1e3);
      std::shuffle(order.begin(), order.end(), rng);
      kernel_shim::PagerStats before = pager->Stats();
      for (uint64_t p : order) {
        uint64_t t0 = MonotonicNs();
        uint8_t v = *reinterpret_cast<volatile uint8_t*>(b + p * kPageSize + 17);
        flt.Record(MonotonicNs() - t0);
        if (v != static_cast<uint8_t>(p)) {
          bad++;
          std::fprintf(stderr, "paged read of page %" PRIu64 ": byte %d\n", p, v);
        }
      }
      kernel_shim::PagerStats after = pager->Stats();  // Cumulative over the runs so far.
      (void)before;
      raw50.push_back(raw.p50() / 1e3);
      raw99.push_back(raw.p99() / 1e3);
      flt50.push_back(flt.p50() / 1e3);
      flt99.push_back(flt.p99() / 1e3);
      pg50.push_back(after.remote_fault_latency.p50() / 1e3);
      pg99.push_back(after.remote_fault_latency.p99() / 1e3);
      // Let eviction bring the sampled pages back to the store before the next run.
      Deadline d = Deadline::AfterMs(30000);
      while (pager->Stats().resident_pages > 64 && !d.Expired()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
    kernel_shim::PagerStats s = pager->Stats();
    report.Title("(a) fault service latency, RS(8,2) " + layout +
                 " layout on 10 local memservers, QD1, medians of " + std::to_string(FLAGS_runs) +
                 " runs x " + std::to_string(FLAGS_fault_samples) + " samples");
    auto row = [&](const char* what, double p50, double p99) {
      report.Add(Report::Row()
                     .Set("suite", "pager-latency").Set("layout", layout)
                     .Set("path", what)
                     .Set("p50_us", p50)
                     .Set("p99_us", p99)
                     .Set("p50_minus_raw_us", p50 - Median(raw50))
                     .Set("p50_ratio_to_raw", Median(raw50) > 0 ? p50 / Median(raw50) : 0.0));
    };
    row("raw PageStore::ReadPage", Median(raw50), Median(raw99));
    row("fault, faulting thread", Median(flt50), Median(flt99));
    row("fault, pager histogram (uffd read -> mapped)", Median(pg50), Median(pg99));
    row("bare fabric read (one Transport, QD1, polling)", Median(fab50), Median(fab99));
    report.Flush();
    const client::PageStoreStats ds = store->Stats();
    const uint64_t direct = ds.direct_reads - direct_before.direct_reads;
    const uint64_t fallbacks = ds.direct_fallbacks - direct_before.direct_fallbacks;
    const uint64_t spun = ds.direct_spin_hits - direct_before.direct_spin_hits;
    const uint64_t slept = ds.direct_sleeps - direct_before.direct_sleeps;
    std::fprintf(stderr,
                 "%s layout: direct reads %" PRIu64 ", fallbacks to the I/O thread %" PRIu64
                 ", replies while polling (direct_spin_us=%d) %" PRIu64 ", after sleeping %" PRIu64
                 "\n",
                 layout.c_str(), direct, fallbacks, FLAGS_direct_spin_us, spun, slept);
    if (bad) std::fprintf(stderr, "tessera bench pager: %" PRIu64 " wrong bytes in (a)!\n", bad);
    double delta = Median(flt50) - Median(raw50);
    char fig[160];
    std::snprintf(fig, sizeof fig, "fault p50 %.1f us vs raw read p50 %.1f us (+%.1f us)",
                  Median(flt50), Median(raw50), delta);
    verdicts.push_back({layout, "fault service p50 within 10 us of raw read", fig,
                        delta <= 10.0 && !bad});
    const double ratio = Median(fab50) > 0 ? Median(flt50) / Median(fab50) : 0;
    std::snprintf(fig, sizeof fig, "fault p50 %.1f us vs bare fabric read p50 %.1f us (x%.2f)",
                  Median(flt50), Median(fab50), ratio);
    verdicts.push_back({layout, "fault service p50 <= 1.3x bare fabric read p50 (issue 11)", fig,
                        ratio <= 1.3 && !bad});
    (void)s;
  }
  }

  // ---- (b) workloads ---------------------------------------------------------------------------
  const std::vector<Pattern> patterns = {Pattern::kSeq, Pattern::kRandom, Pattern::kZipf};
  const std::vector<double> fractions =
      FLAGS_quick ? std::vector<double>{1.0, 0.5} : std::vector<double>{1.0, 0.75, 0.5};
  const std::string workload = bin + "/tessera-bench-pager-workload";
  const std::string run_bin = bin + "/tessera-run";
  bool have_run = FLAGS_run && ::access(run_bin.c_str(), X_OK) == 0;
  if (FLAGS_run && !have_run) {
    std::fprintf(stderr, "tessera bench pager: %s is not built: skipping the `tessera run` column\n",
                 run_bin.c_str());
  }
  auto workload_argv = [&](Pattern p) {
    return std::vector<std::string>{workload, "--pattern", bench_pager::PatternName(p), "--mib",
                                    std::to_string(FLAGS_mib), "--passes",
                                    std::to_string(FLAGS_passes)};
  };
  bool have_swap = false;
  if (want_section("workloads")) {
  if (FLAGS_swap) {
    Status st = g_swap.Setup(FLAGS_swap_dir, "tessera-bench", 2 * bytes + (64 << 20));
    if (st.ok()) {
      have_swap = true;
    } else {
      std::fprintf(stderr, "tessera bench pager: Linux swap column skipped: %s\n",
                   st.ToString().c_str());
      g_swap.Teardown();
    }
  }
  // Memory the workload process charges beyond its heap (stack, private binary pages, malloc
  // metadata, the zipf table), allowed on top of every cgroup limit: the pager limits only the
  // paged heap. Measured max RSS of a 1 MiB run is ~3.6 MB, most of it shared libc pages that
  // are charged to whoever touched them first, so 1.5 MiB.
  const uint64_t kProcessAllowance = 3 << 19;

  // One configuration: the runs that finished (a failed run, e.g. the kernel's OOM killer
  // under swap, is counted and reported, and the median is taken over the others).
  struct Cell {
    std::vector<double> ms;
    uint64_t checksum = 0;
    bool ok = false;
    int failures = 0;
    bool mixed = false;
    std::string error;
    double Med() const { return Median(ms); }
  };
  // key: mode[@layout]/pattern/pct; local and swap runs do not depend on the layout.
  std::map<std::string, Cell> cells;
  auto key = [](const std::string& mode, Pattern p, double f, const std::string& layout = "") {
    return mode + (layout.empty() ? "" : "@" + layout) + "/" + bench_pager::PatternName(p) + "/" +
           Pct(f);
  };
  auto note = [&](const std::string& k, const Outcome& o) {
    Cell& c = cells[k];
    if (!o.ok) {
      c.failures++;
      c.error = o.error;
      std::fprintf(stderr, "\n%s: run failed: %s\n", k.c_str(), o.error.c_str());
      return;
    }
    if (c.ok && c.checksum != o.checksum) c.mixed = true;  // Runs disagree: a mismatch.
    c.ok = true;
    c.ms.push_back(o.ms);
    c.checksum = o.checksum;
  };
  std::map<std::string, kernel_shim::PagerStats> inproc_stats;

  for (Pattern pat : patterns) {
    std::fprintf(stderr, "(b) %s: local", bench_pager::PatternName(pat));
    for (int run = 0; run < FLAGS_runs; ++run) note(key("local", pat, 1.0), RunWorkloadProcess(workload_argv(pat)));
    for (double f : fractions) {
      std::fprintf(stderr, ", %s", Pct(f).c_str());
      for (int run = 0; run < FLAGS_runs; ++run) {
        // The layouts take turns within each run, so they see the same machine.
        for (const std::string& layout : layouts) {
          InProcess ip = RunInProcess(stores[layout].get(), pat, bytes, f,
                                      kernel_shim::VictimPolicy::kSmart, true);
          note(key("pager", pat, f, layout), ip.outcome);
          inproc_stats[key("pager", pat, f, layout)] = ip.stats;
          if (have_run) {
            std::vector<std::string> argv = {run_bin, "--cluster", cluster->cluster_file_path(),
                                             "--auth_token_file", cluster->token_path(),
                                             "--local_memory", Pct(f), "--k", "8", "--r", "2",
                                             "--summary=false", "--layout", layout,
                                             "--progress=false", "--"};
            auto w = workload_argv(pat);
            argv.insert(argv.end(), w.begin(), w.end());
            note(key("run", pat, f, layout), RunWorkloadProcess(argv));
          }
        }
        if (have_swap) {
          uint64_t limit = static_cast<uint64_t>(f * static_cast<double>(bytes)) + kProcessAllowance;
          if (Status lim = g_swap.SetLimit(limit); !lim.ok()) {
            note(key("swap", pat, f), Outcome{false, 0, 0, lim.ToString()});
          } else {
            note(key("swap", pat, f), RunWorkloadProcess(g_swap.Wrap(workload_argv(pat))));
          }
        }
      }
    }
    std::fprintf(stderr, "\n");
  }

  report.Title("(b) workload completion time, " + std::to_string(FLAGS_mib) + " MiB, " +
               std::to_string(FLAGS_passes) + " passes, median of " + std::to_string(FLAGS_runs) +
               " runs (ms); pager = in-process Pager over RS(8,2), run = `tessera run`, swap = "
               "Linux swap in a cgroup-v1 memory limit of the same size");
  std::map<std::string, bool> checksums_agree;  // Per layout.
  auto find_cell = [&](const char* mode, Pattern pat, double f,
                       const std::string& layout) -> const Cell* {
    const bool per_layout = std::string(mode) == "pager" || std::string(mode) == "run";
    auto it = cells.find(key(mode, pat, f, per_layout ? layout : ""));
    return it == cells.end() ? nullptr : &it->second;
  };
  for (const std::string& layout : layouts) {
    checksums_agree[layout] = true;
    for (Pattern pat : patterns) {
      const Cell& local = cells[key("local", pat, 1.0)];
      for (double f : fractions) {
        Report::Row row;
        row.Set("suite", "pager-workload").Set("layout", layout).Set("pattern", bench_pager::PatternName(pat)).Set("local_memory", Pct(f));
        row.Set("plain_ms", local.ok ? local.Med() : -1.0);
        int failed_runs = 0;
        for (const char* mode : {"pager", "run", "swap"}) {
          const Cell* c = find_cell(mode, pat, f, layout);
          if (c == nullptr) {
            row.Set(std::string(mode) + "_ms", "n/a");
            continue;
          }
          failed_runs += c->failures;
          if (!c->ok) {
            row.Set(std::string(mode) + "_ms", "error");
            continue;
          }
          row.Set(std::string(mode) + "_ms", c->Med());
          if (c->mixed || (local.ok && c->checksum != local.checksum)) {
            checksums_agree[layout] = false;
          }
        }
        row.Set("failed_runs", failed_runs);
        const auto& ps = inproc_stats[key("pager", pat, f, layout)];
        row.Set("pager_faults", ps.faults - ps.zero_fills)
            .Set("pager_writebacks", ps.remote_writes)
            .Set("prefetch_hits", ps.prefetch_hits)
            .Set("pager_fault_p50_us", ps.fault_latency.p50() / 1e3)
            .Set("pager_fault_p99_us", ps.fault_latency.p99() / 1e3);
        const Cell* swap = find_cell("swap", pat, f, layout);
        for (const char* mode : {"pager", "run"}) {
          const Cell* c = find_cell(mode, pat, f, layout);
          if (swap != nullptr && swap->ok && c != nullptr && c->ok) {
            row.Set(std::string(mode) + "_over_swap", c->Med() / swap->Med());
          }
        }
        report.Add(std::move(row));
      }
    }
  }
  report.Flush();
  // The verdicts use `tessera run` when built, except in --quick mode, whose footprint is below
  // tessera run's 4 MiB floor of the fractional cap (nothing would be paged out).
  const bool judge_run = have_run && !FLAGS_quick;
  const char* judged = judge_run ? "run" : "pager";

  // The layouts side by side against Linux swap: per pattern and local memory below 100%, the
  // judged mode's median under each layout, the swap run's, and their ratios.
  report.Title(std::string("(b) layouts side by side vs Linux swap (") +
               (judge_run ? "`tessera run`" : "in-process pager") + ", medians, ms)");
  for (Pattern pat : patterns) {
    for (double f : fractions) {
      if (f >= 1.0) continue;
      const Cell* swap = find_cell("swap", pat, f, "");
      const Cell* split = find_cell(judged, pat, f, "split");
      for (const std::string& layout : layouts) {
        const Cell* c = find_cell(judged, pat, f, layout);
        if (c == nullptr || !c->ok) continue;
        Report::Row row;
        row.Set("suite", "pager-vs-swap")
            .Set("layout", layout)
            .Set("pattern", bench_pager::PatternName(pat))
            .Set("local_memory", Pct(f))
            .Set("mode", judged)
            .Set("tessera_ms", c->Med());
        if (swap != nullptr && swap->ok) {
          row.Set("swap_ms", swap->Med()).Set("ratio_to_swap", c->Med() / swap->Med());
        } else {
          row.Set("swap_ms", std::numeric_limits<double>::quiet_NaN());  // null in JSON.
        }
        if (layout != "split" && split != nullptr && split->ok) {
          row.Set("ratio_to_split", c->Med() / split->Med());
        }
        report.Add(std::move(row));
      }
    }
  }
  report.Flush();

  for (const std::string& layout : layouts) {
    verdicts.push_back({layout, "checksums identical in every mode",
                        checksums_agree[layout] ? "all equal" : "MISMATCH", checksums_agree[layout]});
    {
      // First touches: seq at 100% local memory (nothing is evicted; every page is zero-filled
      // once) against the plain process.
      const Cell* local = find_cell("local", Pattern::kSeq, 1.0, layout);
      const Cell* best = find_cell(judged, Pattern::kSeq, 1.0, layout);
      if (local != nullptr && best != nullptr && local->ok && best->ok) {
        double ratio = best->Med() / local->Med();
        char fig[160];
        std::snprintf(fig, sizeof fig, "%s %.1f ms vs plain %.1f ms (x%.2f)",
                      judge_run ? "tessera run" : "in-process pager", best->Med(), local->Med(),
                      ratio);
        verdicts.push_back({layout, "seq at 100% local <= 1.5x plain", fig, ratio <= 1.5});
      }
    }
    if (have_swap) {
      for (Pattern pat : patterns) {
        const Cell* swap = find_cell("swap", pat, 0.5, layout);
        const Cell* best = find_cell(judged, pat, 0.5, layout);
        if (swap == nullptr || best == nullptr || !swap->ok || !best->ok) continue;
        double ratio = best->Med() / swap->Med();
        double bound = pat == Pattern::kSeq ? 1.0 : 2.0;
        char fig[160];
        std::snprintf(fig, sizeof fig, "%s %.0f ms vs swap %.0f ms (x%.2f)",
                      judge_run ? "tessera run" : "in-process pager", best->Med(), swap->Med(),
                      ratio);
        verdicts.push_back({layout,
                            std::string(bench_pager::PatternName(pat)) + " at 50% " +
                                (pat == Pattern::kSeq ? "no slower than swap" : "within 2x of swap"),
                            fig, ratio <= bound});
      }
    }
  }
  g_swap.Teardown();
  }

  // ---- FIFO vs smart on zipf; prefetch on seq ---------------------------------------------------
  for (const std::string& layout : layouts) {
  if (!want_section("policy")) break;
  client::PageStore* store = stores[layout].get();
  std::fprintf(stderr, "victim policies on zipf at 50%%, prefetch on seq at 50%%, %s layout...\n",
               layout.c_str());
    std::vector<double> fifo_f, smart_f, fifo_ms, smart_ms, smart_traps, smart_armed, smart_ioctls;
    std::vector<double> notrap_f, notrap_ms, inact_f, inact_ms, inact_minor, noinact_f, noinact_ms;
    for (int run = 0; FLAGS_inactive_list && run < FLAGS_runs; ++run) {
      InProcess in = RunInProcess(store, Pattern::kZipf, bytes, 0.5,
                                  kernel_shim::VictimPolicy::kSmart, false, nullptr, true,
                                  /*inactive_list=*/1);
      InProcess ni = RunInProcess(store, Pattern::kZipf, bytes, 0.5,
                                  kernel_shim::VictimPolicy::kSmart, false, nullptr, true,
                                  /*inactive_list=*/0);
      inact_f.push_back(static_cast<double>(in.stats.remote_reads));
      inact_ms.push_back(in.outcome.ms);
      inact_minor.push_back(static_cast<double>(in.stats.minor_refaults));
      noinact_f.push_back(static_cast<double>(ni.stats.remote_reads));
      noinact_ms.push_back(ni.outcome.ms);
      InProcess fi = RunInProcess(store, Pattern::kZipf, bytes, 0.5, kernel_shim::VictimPolicy::kFifo, false);
      InProcess sm = RunInProcess(store, Pattern::kZipf, bytes, 0.5, kernel_shim::VictimPolicy::kSmart, false);
      InProcess nt = RunInProcess(store, Pattern::kZipf, bytes, 0.5,
                                  kernel_shim::VictimPolicy::kSmart, false, nullptr,
                                  /*write_traps=*/false);
      notrap_f.push_back(static_cast<double>(nt.stats.faults - nt.stats.zero_fills));
      notrap_ms.push_back(nt.outcome.ms);
      smart_armed.push_back(static_cast<double>(sm.stats.traps_armed));
      smart_ioctls.push_back(static_cast<double>(sm.stats.trap_ioctls));
      fifo_f.push_back(static_cast<double>(fi.stats.faults - fi.stats.zero_fills));
      smart_f.push_back(static_cast<double>(sm.stats.faults - sm.stats.zero_fills));
      fifo_ms.push_back(fi.outcome.ms);
      smart_ms.push_back(sm.outcome.ms);
      smart_traps.push_back(static_cast<double>(sm.stats.trap_faults));
    }
    std::vector<double> on_ms, off_ms, hit_rate, issued, hits;
    for (int run = 0; run < FLAGS_runs; ++run) {
      InProcess on = RunInProcess(store, Pattern::kSeq, bytes, 0.5, kernel_shim::VictimPolicy::kSmart, true);
      InProcess off = RunInProcess(store, Pattern::kSeq, bytes, 0.5, kernel_shim::VictimPolicy::kSmart, false);
      on_ms.push_back(on.outcome.ms);
      off_ms.push_back(off.outcome.ms);
      issued.push_back(static_cast<double>(on.stats.prefetch_issued));
      hits.push_back(static_cast<double>(on.stats.prefetch_hits));
      uint64_t remote_faults = on.stats.faults - on.stats.zero_fills;
      hit_rate.push_back(remote_faults ? static_cast<double>(on.stats.prefetch_hits) / remote_faults : 0.0);
    }
    report.Title("victim policy on zipf(0.99) and prefetch on seq, 50% local memory, in-process, " +
                 layout + " layout, medians");
    report.Add(Report::Row().Set("suite", "pager-policy").Set("layout", layout).Set("case", "zipf, FIFO victims")
                   .Set("remote_faults", Median(fifo_f)).Set("ms", Median(fifo_ms)));
    report.Add(Report::Row().Set("suite", "pager-policy").Set("layout", layout).Set("case", "zipf, smart victims (2Q+ghost)")
                   .Set("remote_faults", Median(smart_f)).Set("ms", Median(smart_ms))
                   .Set("trap_faults", Median(smart_traps))
                   .Set("traps_armed", Median(smart_armed))
                   .Set("trap_ioctls", Median(smart_ioctls))
                   .Set("faults_vs_fifo", Median(fifo_f) > 0 ? Median(smart_f) / Median(fifo_f) : 0.0));
    report.Add(Report::Row().Set("suite", "pager-policy").Set("layout", layout)
                   .Set("case", "zipf, smart victims without write traps")
                   .Set("remote_faults", Median(notrap_f)).Set("ms", Median(notrap_ms))
                   .Set("trap_faults", 0.0).Set("traps_armed", 0.0).Set("trap_ioctls", 0.0)
                   .Set("faults_vs_fifo", Median(fifo_f) > 0 ? Median(notrap_f) / Median(fifo_f) : 0.0));
    if (FLAGS_inactive_list) report.Add(Report::Row()
                   .Set("suite", "pager-policy")
                   .Set("layout", layout)
                   .Set("case", "zipf, smart victims, inactive list on")
                   .Set("remote_reads", Median(inact_f))
                   .Set("ms", Median(inact_ms))
                   .Set("minor_refaults", Median(inact_minor)));
    if (FLAGS_inactive_list) report.Add(Report::Row()
                   .Set("suite", "pager-policy")
                   .Set("layout", layout)
                   .Set("case", "zipf, smart victims, inactive list off")
                   .Set("remote_reads", Median(noinact_f))
                   .Set("ms", Median(noinact_ms))
                   .Set("minor_refaults", 0.0));
    report.Add(Report::Row().Set("suite", "pager-policy").Set("layout", layout).Set("case", "seq, no prefetch").Set("ms", Median(off_ms)));
    report.Add(Report::Row().Set("suite", "pager-policy").Set("layout", layout).Set("case", "seq, prefetch")
                   .Set("ms", Median(on_ms)).Set("prefetch_issued", Median(issued))
                   .Set("prefetch_hits", Median(hits))
                   .Set("hits_per_issued", Median(issued) > 0 ? Median(hits) / Median(issued) : 0.0)
                   .Set("remote_faults_served_by_prefetch", Median(hit_rate)));
    report.Flush();
    char fig[160];
    std::snprintf(fig, sizeof fig, "smart %.0f vs FIFO %.0f remote faults (x%.2f)", Median(smart_f),
                  Median(fifo_f), Median(fifo_f) > 0 ? Median(smart_f) / Median(fifo_f) : 0.0);
    verdicts.push_back({layout, "zipf fault rate below FIFO's", fig, Median(smart_f) < Median(fifo_f)});
  }

  // ---- (c) a memserver SIGKILLed half-way ------------------------------------------------------
  for (const std::string& layout : layouts) {
  if (!want_section("failure")) break;
  std::fprintf(stderr, "(c) 50%% local memory, one memserver SIGKILLed half-way, %s layout...\n",
               layout.c_str());
    std::vector<double> healthy, killed;
    uint64_t wb_errors = 0;
    int peak_over = 0;
    bool ok = true;
    Outcome plain = RunWorkloadProcess(workload_argv(Pattern::kZipf));
    uint64_t want = plain.checksum;
    for (int run = 0; run < FLAGS_runs; ++run) {
      // A fresh cluster and store per run, so every killed run starts healthy.
      auto c2 = client::LocalCluster::Start(lo);
      if (!c2.ok()) {
        std::fprintf(stderr, "tessera bench pager: %s\n", c2.status().ToString().c_str());
        return 1;
      }
      auto s2 = OpenStore(**c2, capacity_pages, layout);
      if (!s2.ok()) {
        std::fprintf(stderr, "tessera bench pager: %s\n", s2.status().ToString().c_str());
        return 1;
      }
      // Warm-up (first use of a fresh cluster allocates its slabs), then healthy, then killed.
      (void)RunInProcess(s2->get(), Pattern::kZipf, bytes, 0.5, kernel_shim::VictimPolicy::kSmart, true);
      InProcess h = RunInProcess(s2->get(), Pattern::kZipf, bytes, 0.5, kernel_shim::VictimPolicy::kSmart, true);
      InProcess k = RunInProcess(s2->get(), Pattern::kZipf, bytes, 0.5, kernel_shim::VictimPolicy::kSmart, true, c2->get());
      ok = ok && h.outcome.ok && k.outcome.ok && h.outcome.checksum == want && k.outcome.checksum == want;
      healthy.push_back(h.outcome.ms);
      killed.push_back(k.outcome.ms);
      wb_errors += k.stats.writeback_errors;
      peak_over += k.stats.peak_resident_pages > k.stats.limit_pages + k.stats.limit_pages / 4 ? 1 : 0;
    }
    double cost = Median(healthy) > 0 ? Median(killed) / Median(healthy) - 1.0 : 0.0;
    report.Title("(c) zipf at 50% local memory, in-process pager over RS(8,2) " + layout +
                 " layout, 1 of 10 memservers SIGKILLed half-way");
    report.Add(Report::Row().Set("suite", "pager-failure").Set("layout", layout).Set("healthy_ms", Median(healthy))
                   .Set("killed_ms", Median(killed)).Set("cost", cost)
                   .Set("checksums", ok ? "equal" : "MISMATCH/ERROR")
                   .Set("writeback_errors", wb_errors)
                   .Set("runs_over_cap", peak_over));
    report.Flush();
    char fig[160];
    std::snprintf(fig, sizeof fig, "%.0f ms healthy vs %.0f ms killed (%+.1f%%)", Median(healthy),
                  Median(killed), cost * 100);
    verdicts.push_back({layout, "killed memserver costs < 10% completion time", fig,
                        ok && cost < 0.10});
  }

  report.Title("targets (issue 6)");
  for (const Verdict& v : verdicts) {
    report.Add(Report::Row().Set("suite", "pager-targets").Set("layout", v.layout).Set("target", v.target).Set("measured", v.figures)
                   .Set("verdict", v.pass ? "PASS" : "MISS"));
  }
  report.Flush();
  return 0;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) { return tessera::Main(argc, argv); }
