// `tessera demo cluster`: the main job on a local embedded cluster, until `tessera run` exists.
// Starts k+r+spares real memservers on loopback, writes pages through the erasure-coded page
// store, verifies them, SIGKILLs r of the servers that hold splits, verifies every page again
// (late binding + decode), overwrites a share of pages while degraded, waits for background
// regeneration, verifies once more, and prints the figures. Exits 1 on any wrong byte or error.
#include <gflags/gflags.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "apps/cli/cli.h"
#include "apps/cli/store_flags.h"
#include "client/local_cluster.h"
#include "client/page_store.h"
#include "client/remote_store.h"
#include "common/clock.h"
#include "common/report.h"
#include "common/subprocess.h"

DEFINE_int32(kill, -1, "Servers to SIGKILL half-way (-1: r)");
DEFINE_int32(pages, 20000, "Pages written and verified (4 KB each)");
DEFINE_uint64(seed, 1, "Seed of the page contents");
DEFINE_int32(regeneration_timeout_s, 60, "Bound on waiting for regeneration to finish");
DEFINE_bool(json, false, "Print the figures as one JSON object instead of a table");

namespace tessera {
namespace {

using client::kPageSize;
using client::PageId;

const cli::CliSpec kSpec = {
    "tessera demo cluster",
    "[--k 4] [--r 2] [--layout split|group] [--spares N] [--kill N] [--pages 20000] [--seed 1] "
    "[--json]",
    "Starts k+r+spares real memservers on loopback, stores pages erasure-coded across them,\n"
    "SIGKILLs r servers that hold splits, and shows that every page still reads back byte for\n"
    "byte, before and after background regeneration. Exits 1 on any wrong byte or error.",
    __FILE__,
    0,
    0,
    cli::StoreFlagNames(cli::kCodeFlags | cli::kEmbeddedFlags)};

constexpr size_t kBatch = 256;

uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The content of `page` at `version`: reproducible, so nothing is kept per page but its version.
void Fill(uint8_t* out, PageId page, uint32_t version) {
  uint64_t s = Mix(FLAGS_seed ^ Mix(page * 4 + version));
  for (size_t i = 0; i < kPageSize; i += 8) {
    s = Mix(s);
    std::memcpy(out + i, &s, 8);
  }
}

struct Pass {
  uint64_t ns = 0;
  uint64_t errors = 0;
  uint64_t mismatches = 0;
  std::string first_error;
};

// Writes (or reads and verifies) `pages` in batches; versions[p] is the expected version.
Pass Run(client::PageStore& store, bool write, const std::vector<PageId>& pages,
         const std::vector<uint32_t>& versions) {
  Pass pass;
  std::vector<uint8_t> buf(kBatch * kPageSize), want(kPageSize);
  const uint64_t t0 = MonotonicNs();
  for (size_t off = 0; off < pages.size(); off += kBatch) {
    const size_t n = std::min(kBatch, pages.size() - off);
    if (write) {
      for (size_t i = 0; i < n; ++i) Fill(&buf[i * kPageSize], pages[off + i], versions[pages[off + i]]);
    }
    // Per-page status: a batch is attempted whole, so count errors page by page.
    std::vector<client::PageOp> ops(n);
    std::vector<client::PageOp*> ptrs(n);
    struct Waiter {
      std::atomic<size_t> left;
    } waiter{n};
    for (size_t i = 0; i < n; ++i) {
      ops[i].kind = write ? client::PageOp::Kind::kWrite : client::PageOp::Kind::kRead;
      ops[i].page = pages[off + i];
      ops[i].buf = &buf[i * kPageSize];
      ops[i].user = &waiter;
      ops[i].done = [](client::PageOp* op) {
        auto* w = static_cast<Waiter*>(op->user);
        if (w->left.fetch_sub(1) == 1) w->left.notify_all();
      };
      ptrs[i] = &ops[i];
    }
    Status st = store.Submit(ptrs);
    if (!st.ok()) {
      pass.errors += n;
      if (pass.first_error.empty()) pass.first_error = st.ToString();
      continue;
    }
    for (size_t left = waiter.left.load(); left != 0; left = waiter.left.load()) {
      waiter.left.wait(left);
    }
    for (size_t i = 0; i < n; ++i) {
      if (!ops[i].status.ok()) {
        pass.errors++;
        if (pass.first_error.empty()) pass.first_error = ops[i].status.ToString();
        continue;
      }
      if (!write) {
        Fill(want.data(), ops[i].page, versions[ops[i].page]);
        if (std::memcmp(want.data(), ops[i].buf, kPageSize) != 0) pass.mismatches++;
      }
    }
  }
  pass.ns = MonotonicNs() - t0;
  return pass;
}

int Main(int argc, char** argv) {
  cli::InitCli(kSpec, &argc, &argv);
  const cli::StoreFlags sf = cli::ReadStoreFlags(kSpec);
  const int kill = FLAGS_kill < 0 ? sf.r : FLAGS_kill;
  if (kill > sf.r) {
    cli::UsageError(kSpec, "--kill must be at most r: more lost servers lose data by design");
  }
  if (FLAGS_pages < 1 || FLAGS_pages > (1 << 20)) cli::UsageError(kSpec, "--pages must be in [1, 1048576]");
  const size_t servers = sf.EmbeddedServers();
  const uint64_t pages = static_cast<uint64_t>(FLAGS_pages);

  client::LocalClusterOptions lo;
  lo.bin_dir = SelfExeDir();
  lo.servers = servers;
  // Each server holds about pages * 4 KB * (k+r)/k / (k+r) of splits, plus slab rounding.
  const uint64_t per_server_mb = pages * kPageSize / static_cast<uint64_t>(sf.k) / (1 << 20);
  lo.capacity = std::to_string(std::max<uint64_t>(64, 4 * per_server_mb + 16)) + "M";
  lo.slab_size = "1M";
  std::fprintf(stderr, "tessera demo cluster: starting %zu memservers on loopback...\n", servers);
  auto cluster = client::LocalCluster::Start(lo);
  if (!cluster.ok()) {
    std::fprintf(stderr, "tessera demo cluster: %s\n", cluster.status().ToString().c_str());
    return 1;
  }
  client::ErasureCodedStoreOptions eo;
  for (const auto& ep : (*cluster)->endpoints()) eo.remote.servers.push_back({ep, ""});
  eo.remote.secret = (*cluster)->secret();
  eo.remote.capacity_pages = pages;
  sf.ApplyTo(&eo);
  auto store_or = client::CreateErasureCodedStore(eo);
  if (!store_or.ok()) {
    std::fprintf(stderr, "tessera demo cluster: %s\n", store_or.status().ToString().c_str());
    return 1;
  }
  client::PageStore& store = **store_or;

  std::vector<PageId> all(pages);
  for (uint64_t p = 0; p < pages; ++p) all[p] = p;
  std::vector<uint32_t> versions(pages, 1);

  std::fprintf(stderr, "writing %llu pages (%s)...\n", static_cast<unsigned long long>(pages),
               store.name().c_str());
  Pass write1 = Run(store, true, all, versions);
  Pass read1 = Run(store, false, all, versions);

  // Kill r servers that hold splits of page 0 (so the loss certainly matters).
  auto holders = client::ServersOfPage(store, 0);
  if (!holders.ok()) {
    std::fprintf(stderr, "tessera demo cluster: %s\n", holders.status().ToString().c_str());
    return 1;
  }
  std::string killed;
  for (int i = 0; i < kill; ++i) {
    size_t victim = (*holders)[static_cast<size_t>(i)];
    Status st = (*cluster)->Kill(victim);
    if (!st.ok()) {
      std::fprintf(stderr, "tessera demo cluster: kill: %s\n", st.ToString().c_str());
      return 1;
    }
    killed += (killed.empty() ? "" : ",") + (*cluster)->endpoints()[victim].ToString();
  }
  std::fprintf(stderr, "SIGKILLed %d memservers (%s); reading every page again...\n", kill,
               killed.c_str());
  Pass read2 = Run(store, false, all, versions);

  // Overwrite every tenth page while degraded, then verify everything.
  std::vector<PageId> tenth;
  for (uint64_t p = 0; p < pages; p += 10) {
    tenth.push_back(p);
    versions[p] = 2;
  }
  Pass write2 = Run(store, true, tenth, versions);
  Pass read3 = Run(store, false, all, versions);

  // Background regeneration onto the spares; bounded wait.
  Deadline regen_deadline = Deadline::AfterMs(static_cast<uint64_t>(FLAGS_regeneration_timeout_s) * 1000);
  bool regen_done = false;
  while (!regen_deadline.Expired()) {
    client::PageStoreStats s = store.Stats();
    if (s.server_failures >= static_cast<uint64_t>(kill) && s.regenerations_pending == 0) {
      regen_done = true;
      break;
    }
    ::usleep(20000);  // Progress polling for the user, not synchronisation of a test.
  }
  Pass read4 = Run(store, false, all, versions);
  client::PageStoreStats stats = store.Stats();

  const uint64_t bytes = pages * kPageSize;
  auto mbps = [&](const Pass& p, uint64_t n) {
    return p.ns ? static_cast<double>(n * kPageSize) / (static_cast<double>(p.ns) / 1e9) / 1e6 : 0.0;
  };
  const uint64_t mismatches = read1.mismatches + read2.mismatches + read3.mismatches + read4.mismatches;
  const uint64_t errors = write1.errors + read1.errors + read2.errors + write2.errors +
                          read3.errors + read4.errors;
  Report report(FLAGS_json);
  Report::Row row;
  row.Set("suite", "demo-cluster")
      .Set("store", store.name())
      .Set("memservers", static_cast<uint64_t>(servers))
      .Set("killed", static_cast<uint64_t>(kill))
      .Set("pages", pages)
      .Set("bytes", bytes)
      .Set("write_MBps", mbps(write1, pages))
      .Set("read_healthy_MBps", mbps(read1, pages))
      .Set("read_degraded_MBps", mbps(read2, pages))
      .Set("pages_overwritten_degraded", static_cast<uint64_t>(tenth.size()))
      .Set("read_after_regen_MBps", mbps(read4, pages))
      .Set("read_p50_us", stats.read_latency.p50() / 1e3)
      .Set("read_p99_us", stats.read_latency.p99() / 1e3)
      .Set("degraded_reads", stats.degraded_reads)
      .Set("decodes", stats.decodes)
      .Set("server_failures", stats.server_failures)
      .Set("regenerations_done", stats.regenerations_done)
      .Set("regeneration_finished", regen_done ? "yes" : "no (timeout)")
      .Set("errors", errors)
      .Set("mismatches", mismatches);
  if (FLAGS_json) {
    report.Add(std::move(row));
  } else {
    report.Title("tessera demo cluster: " + std::to_string(servers) + " memservers, " +
                 std::to_string(kill) + " SIGKILLed half-way");
    for (const auto& [name, v] : row.fields()) {
      report.Add(Report::Row().Set("figure", name).Set("value", Report::Format(v)));
    }
  }
  report.Flush();
  const std::string first_error = !write1.first_error.empty() ? write1.first_error
                                  : !read1.first_error.empty() ? read1.first_error
                                  : !read2.first_error.empty() ? read2.first_error
                                  : !write2.first_error.empty() ? write2.first_error
                                  : !read3.first_error.empty() ? read3.first_error
                                                               : read4.first_error;
  if (mismatches > 0 || errors > 0 || !regen_done) {
    std::fprintf(stderr, "tessera demo cluster: FAILED: %llu wrong pages, %llu errors%s%s%s\n",
                 static_cast<unsigned long long>(mismatches),
                 static_cast<unsigned long long>(errors), first_error.empty() ? "" : " (first: ",
                 first_error.c_str(), first_error.empty() ? "" : ")");
    if (!regen_done) std::fprintf(stderr, "tessera demo cluster: regeneration did not finish\n");
    return 1;
  }
  std::fprintf(stderr, "every page read back byte for byte, with %d of %zu memservers killed\n",
               kill, servers);
  return 0;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) { return tessera::Main(argc, argv); }
