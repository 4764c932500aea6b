// `tessera bench pagestore`: the PageStore layouts side by side in one run, over real memserver
// processes on loopback — EC(8,2) in both layouts (split "ec", group "ec-group"), each with
// late binding (delta 1) and without it (-d0), 2- and 3-way replication, single copy, single copy with an asynchronous local-disk backup
// (Infiniswap), and the local SSD through io_uring (no remote memory).
//
// Each store gets a working set of --pages 4 KB pages, written first (every page, QD 64; the
// payload bytes the store sends for it give the measured memory overhead). Then, per scenario
// and repetition, the stores take turns (interleaved) through the points: uniformly random
// reads, then random writes, at each queue depth (QD = pages in flight from the bench through
// Submit). Every page read is verified (page id + version stamp and derived bytes), so a store
// returning wrong bytes fails the run. Latency is Submit -> completion as the bench sees it.
// The table shows medians over --reps of each point's p50, p99, p999 and ops/s.
//
// Scenarios: normal; straggler (one server delays every read/write reply by --straggler_us
// through the memserver's fault injection); failed (one server SIGKILLed; stores detect it and
// EC regenerates in the background while measured). The local SSD is measured in the normal
// scenario only. Targets from the issue are checked on the medians and printed PASS/MISS.
//
// Scenario overwrite (asked for by name): a write-heavy run per store -- --overwrite_passes x
// the working set in uniformly random overwrites at QD 32, then QD 1 -- with what the writes
// cost the backing: payload bytes sent per byte written, compaction moves (re-striped pages),
// garbage slots reclaimed with in-place parity updates, stripes written, and the remote memory
// held afterwards against the group layout's bound ((k+r)/k x 1.2); every page is read back and
// checked after it. Compare the group layout's two compactions with
// --stores ec-group-restripe,ec-group-inplace.
#include <gflags/gflags.h>
#include <mntent.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <sstream>
#include <tuple>
#include <string>
#include <vector>

#include "apps/cli/cli.h"
#include "bench/pagestore/bench_cluster.h"
#include "bench/pagestore/driver.h"
#include "client/disk_backed_store.h"
#include "client/local_ssd_store.h"
#include "client/remote_store.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/report.h"
#include "common/subprocess.h"

DEFINE_bool(json, false, "Print JSON lines instead of tables");
DEFINE_bool(quick, false,
            "Small smoke run for tests: 512 pages, QD 1 and 32, short windows, 1 rep (the timing "
            "targets are still computed but mean little)");
DEFINE_int32(reps, 3, "Repetitions of every point (medians are reported)");
DEFINE_int64(pages, 8192, "Working set per store in 4 KB pages");
DEFINE_string(qds, "1,2,4,8,16,32,64", "Queue depths measured in the normal scenario");
DEFINE_string(disturbed_qds, "1,32", "Queue depths measured with a straggler / a failed server");
DEFINE_int32(duration_ms, 200, "Minimum measured window per point");
DEFINE_int32(lat_ops, 2000, "Minimum ops measured per QD1 point (for p99/p999)");
DEFINE_int32(servers, 10, "Memory servers started on loopback (>= 10 for EC(8,2))");
DEFINE_string(stores, "ec,ec-d0,ec-group,ec-group-d0,rep2,rep3,single,single+disk,ssd",
              "Stores to measure: ec, ec-d0, ec-group, ec-group-d0, ec-group-restripe, "
              "ec-group-inplace, rep2, rep3, single, single+disk, ssd");
DEFINE_string(scenarios, "normal,straggler,failed",
              "Scenarios: normal, straggler, failed, overwrite (write-heavy, compaction costs)");
DEFINE_int32(overwrite_passes, 4,
             "Scenario overwrite: random page writes per page of the working set at QD 32");
DEFINE_int32(straggler_us, 200, "Reply delay of the straggler server, microseconds");
DEFINE_string(ssd_dir, "/var/tmp", "Directory for the local-SSD files (a temp dir inside it)");
DEFINE_int32(poll_us, 0,
             "RemoteStoreOptions::poll_us for every remote store (0..1000): how long an I/O "
             "thread keeps polling before it sleeps");

namespace {

using tessera::Median;
using tessera::Report;
using tessera::Result;
using tessera::Status;
using tessera::bench::BenchCluster;
using tessera::bench::Driver;
using tessera::bench::PointResult;
using tessera::client::kPageSize;
using tessera::client::PageOp;
using tessera::client::PageStore;

const tessera::cli::CliSpec kSpec = {
    "tessera bench pagestore",
    "[--quick] [--json] [--reps N] [--pages N] [--qds 1,..,64] [--stores LIST] "
    "[--scenarios normal,straggler,failed,overwrite] [--overwrite_passes N] [--ssd_dir DIR] "
    "[--poll_us N]",
    "4 KB page latency (p50/p99/p999 at QD1) and throughput (QD 1..64) of the PageStore\n"
    "layouts in one run over 10 real memservers on loopback: EC(8,2) split (ec) and group\n"
    "(ec-group) layouts, each with late binding (delta 1) and without (-d0), 2- and 3-way\n"
    "replication, single copy, single copy + asynchronous\n"
    "disk backup, and the local SSD through io_uring; memory overhead measured from the bytes\n"
    "each store sends. Then again with one straggler server (+200 us) and with one SIGKILLed\n"
    "server. Prints PASS/MISS for the issue's targets.",
    __FILE__, 0, 0};

// The bench's private directory under --ssd_dir; removed on every exit path.
std::string g_scratch_dir;

void RemoveScratch() {
  if (g_scratch_dir.empty()) return;
  std::error_code ec;
  std::filesystem::remove_all(g_scratch_dir, ec);
  g_scratch_dir.clear();
}

[[noreturn]] void Die(const std::string& what, const Status& st) {
  std::fprintf(stderr, "tessera bench pagestore: %s: %s\n", what.c_str(), st.ToString().c_str());
  RemoveScratch();
  std::exit(1);
}

std::vector<std::string> SplitList(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

std::vector<int> ParseQds(const char* flag, const std::string& text) {
  std::vector<int> out;
  for (const std::string& item : SplitList(text)) {
    char* end = nullptr;
    long v = std::strtol(item.c_str(), &end, 10);
    if (*end != '\0' || v < 1 || v > 1024) {
      tessera::cli::UsageError(kSpec, std::string("--") + flag + ": '" + item +
                                          "' is not a queue depth in 1..1024");
    }
    out.push_back(static_cast<int>(v));
  }
  if (out.empty()) tessera::cli::UsageError(kSpec, std::string("--") + flag + " is empty");
  return out;
}

// The mount holding `dir`: "fstype on device".
std::string DescribeFileSystem(const std::string& dir) {
  FILE* f = ::setmntent("/proc/mounts", "r");
  if (f == nullptr) return "unknown file system";
  std::string best_dir, desc = "unknown file system";
  std::error_code ec;
  std::string canon = std::filesystem::weakly_canonical(dir, ec).string();
  if (ec) canon = dir;
  while (mntent* m = ::getmntent(f)) {
    std::string mdir = m->mnt_dir;
    bool prefix = canon == mdir || mdir == "/" ||
                  (canon.rfind(mdir, 0) == 0 && canon.size() > mdir.size() &&
                   canon[mdir.size()] == '/');
    if (prefix && mdir.size() >= best_dir.size()) {
      best_dir = mdir;
      desc = std::string(m->mnt_type) + " on " + m->mnt_fsname;
    }
  }
  ::endmntent(f);
  return desc;
}

struct StoreUnderTest {
  std::string label;
  std::string kind;
  std::unique_ptr<PageStore> store;
  std::unique_ptr<Driver> driver;
  double overhead_declared = 0;
  double overhead_measured = 0;
  bool remote = true;
  // "split" / "group" (erasure-coded layouts), "copies" (single copy, replication), "local".
  std::string layout;
  double remote_overhead = 0;  // Group: remote memory held / page data, after the populate.
};

struct PointKey {
  std::string store, scenario, op;
  int qd;
  bool operator<(const PointKey& o) const {
    return std::tie(store, scenario, op, qd) < std::tie(o.store, o.scenario, o.op, o.qd);
  }
};

struct PointSummary {
  std::vector<double> p50, p99, p999, ops;
  uint64_t errors = 0;
  uint64_t wrong = 0;
  std::string first_error;
};

double Us(uint64_t ns) { return static_cast<double>(ns) / 1000.0; }

constexpr uint64_t kBenchSlabBytes = 1ull << 20;  // The memservers' slab size.

}  // namespace

int main(int argc, char** argv) {
  // Per-connection INFO lines of the stores are noise here; failures still show as warnings.
  gflags::SetCommandLineOptionWithMode("log_level", "warning", gflags::SET_FLAGS_DEFAULT);
  tessera::cli::InitCli(kSpec, &argc, &argv);
  if (FLAGS_quick) {
    FLAGS_pages = 512;
    FLAGS_qds = "1,32";
    FLAGS_disturbed_qds = "1,32";
    FLAGS_duration_ms = 20;
    FLAGS_lat_ops = 100;
    FLAGS_reps = 1;
  }
  if (FLAGS_reps < 1 || FLAGS_reps > 100) tessera::cli::UsageError(kSpec, "--reps must be 1..100");
  if (FLAGS_pages < 64 || FLAGS_pages > (int64_t{1} << 24)) {
    tessera::cli::UsageError(kSpec, "--pages must be in 64..16777216");
  }
  if (FLAGS_servers < 1 || FLAGS_servers > 64) {
    tessera::cli::UsageError(kSpec, "--servers must be in 1..64");
  }
  if (FLAGS_poll_us < 0 || FLAGS_poll_us > 1000) {
    tessera::cli::UsageError(kSpec, "--poll_us must be 0..1000");
  }
  if (FLAGS_overwrite_passes < 1 || FLAGS_overwrite_passes > 100) {
    tessera::cli::UsageError(kSpec, "--overwrite_passes must be 1..100");
  }
  if (FLAGS_duration_ms < 1 || FLAGS_lat_ops < 1 || FLAGS_straggler_us < 0) {
    tessera::cli::UsageError(kSpec, "--duration_ms and --lat_ops must be positive");
  }
  const std::vector<int> qds = ParseQds("qds", FLAGS_qds);
  const std::vector<int> disturbed_qds = ParseQds("disturbed_qds", FLAGS_disturbed_qds);
  const std::vector<std::string> kinds = SplitList(FLAGS_stores);
  const std::vector<std::string> scenarios = SplitList(FLAGS_scenarios);
  static const std::vector<std::string> kKnownStores = {
      "ec",   "ec-d0", "ec-group", "ec-group-d0", "ec-group-restripe", "ec-group-inplace",
      "rep2", "rep3",  "single",   "single+disk", "ssd"};
  for (size_t i = 0; i < kinds.size(); ++i) {
    const std::string& k = kinds[i];
    if (std::find(kKnownStores.begin(), kKnownStores.end(), k) == kKnownStores.end()) {
      tessera::cli::UsageError(kSpec, "--stores: unknown store '" + k + "'");
    }
    if (std::find(kinds.begin(), kinds.begin() + i, k) != kinds.begin() + i) {
      tessera::cli::UsageError(kSpec, "--stores: '" + k + "' is listed twice");
    }
  }
  for (const auto& s : scenarios) {
    if (s != "normal" && s != "straggler" && s != "failed" && s != "overwrite") {
      tessera::cli::UsageError(kSpec, "--scenarios: unknown scenario '" + s + "'");
    }
  }
  if (kinds.empty() || scenarios.empty()) {
    tessera::cli::UsageError(kSpec, "--stores and --scenarios must not be empty");
  }
  const uint64_t pages = static_cast<uint64_t>(FLAGS_pages);
  const uint64_t min_ns = uint64_t(FLAGS_duration_ms) * 1000000ull;
  const uint64_t max_ns = std::max<uint64_t>(min_ns * 20, 5000000000ull);

  // A private directory for the SSD files, removed at exit.
  std::string ssd_tmpl = FLAGS_ssd_dir + "/tessera-bench-pagestore-XXXXXX";
  if (::mkdtemp(ssd_tmpl.data()) == nullptr) {
    Die("creating a directory in --ssd_dir", tessera::ErrnoError("mkdtemp ", ssd_tmpl));
  }
  const std::string ssd_dir = ssd_tmpl;
  g_scratch_dir = ssd_dir;

  bool need_cluster = false;
  for (const auto& k : kinds) need_cluster = need_cluster || k != "ssd";
  std::unique_ptr<BenchCluster> cluster;
  if (need_cluster) {
    // Room for every store's working set: the worst case is 3 copies of each store's pages on
    // the servers, spread evenly, plus slack for regeneration onto replacements.
    uint64_t total = pages * kPageSize * 16;
    uint64_t slab = kBenchSlabBytes;
    uint64_t per_server = std::max<uint64_t>(64ull << 20, total / FLAGS_servers * 2);
    per_server = (per_server + slab - 1) / slab * slab;
    auto c = BenchCluster::Start(FLAGS_servers, tessera::SelfExeDir(), per_server, slab,
                                 static_cast<uint32_t>(FLAGS_poll_us));
    if (!c.ok()) Die("starting the memservers", c.status());
    cluster = std::move(c).value();
  }

  std::vector<StoreUnderTest> stores;
  for (const auto& kind : kinds) {
    StoreUnderTest s;
    s.kind = kind;
    if (kind == "ssd" || kind == "single+disk") {
      tessera::client::LocalSsdOptions o;
      o.path = ssd_dir + "/" + (kind == "ssd" ? "ssd" : "backup") + ".pages";
      o.capacity_pages = pages;
      auto ssd = tessera::client::LocalSsdStore::Create(o);
      if (!ssd.ok()) Die("creating the local SSD store", ssd.status());
      if (kind == "ssd") {
        s.store = std::move(ssd).value();
        s.remote = false;
      } else {
        auto primary = cluster->MakeStore("single", pages);
        if (!primary.ok()) Die("creating the single-copy store", primary.status());
        auto db = tessera::client::DiskBackedStore::Create(std::move(primary).value(),
                                                           std::move(ssd).value());
        if (!db.ok()) Die("creating the disk-backed store", db.status());
        s.store = std::move(db).value();
      }
    } else {
      auto st = cluster->MakeStore(kind, pages);
      if (!st.ok()) Die("creating store " + kind, st.status());
      s.store = std::move(st).value();
    }
    s.label = kind;
    s.layout = kind.rfind("ec-group", 0) == 0 ? "group"
               : kind.rfind("ec", 0) == 0     ? "split"
               : kind == "ssd"                ? "local"
                                              : "copies";
    s.overhead_declared = s.store->memory_overhead();
    s.driver = std::make_unique<Driver>(s.store.get(), pages, 0x7e55e7a + stores.size());
    uint64_t before = s.store->Stats().bytes_sent;
    Status pop = s.driver->Populate();
    if (!pop.ok()) Die("writing the working set of " + kind, pop);
    if (Status f = s.store->Flush(); !f.ok()) Die("flushing " + kind, f);
    uint64_t sent = s.store->Stats().bytes_sent - before;
    s.overhead_measured = static_cast<double>(sent) / static_cast<double>(pages * kPageSize);
    s.remote_overhead = static_cast<double>(s.store->Stats().remote_bytes) /
                        static_cast<double>(pages * kPageSize);
    stores.push_back(std::move(s));
  }

  Report report(FLAGS_json);
  std::string ssd_note;
  for (const auto& s : stores) {
    if (s.kind == "ssd" || s.kind == "single+disk") {
      ssd_note = "local SSD file in " + FLAGS_ssd_dir + " (" + DescribeFileSystem(FLAGS_ssd_dir) +
                 "), " + s.store->name();
    }
  }
  if (!FLAGS_json) {
    std::printf("tessera bench pagestore: %llu pages (%.1f MiB) per store, %d memservers on "
                "loopback, %d rep(s)\n",
                static_cast<unsigned long long>(pages), pages * kPageSize / 1048576.0,
                cluster ? cluster->servers() : 0, FLAGS_reps);
    if (!ssd_note.empty()) {
      std::printf("note: %s%s\n", ssd_note.c_str(),
                  ssd_note.find("/dev/vd") != std::string::npos
                      ? " -- a virtual disk: its latency is the hypervisor's, not an SSD's"
                      : "");
    }
  }

  // Memory overhead table.
  report.Title("memory overhead (bytes stored per byte of page data)");
  for (const auto& s : stores) {
    report.Add(Report::Row()
                   .Set("suite", "pagestore")
                   .Set("table", "overhead")
                   .Set("store", s.label)
                   .Set("name", s.store->name())
                   .Set("layout", s.layout)
                   .Set("overhead", s.overhead_declared)
                   .Set("measured", s.overhead_measured)
                   .Set("held", s.layout == "group" ? s.remote_overhead : s.overhead_measured));
  }
  report.Flush();

  // The disturbed server: one holding data of every store, i.e. the server of page 0 of the
  // single copy (or first copy of replication; every server holds EC(8,2) splits with 10).
  int straggler = 0;
  for (const char* pick : {"rep3", "rep2", "single"}) {
    for (const auto& s : stores) {
      if (s.kind != pick) continue;
      auto servers = tessera::client::ServersOfPage(*s.store, 0);
      if (servers.ok() && !servers->empty()) straggler = static_cast<int>((*servers)[0]);
    }
  }
  if (!FLAGS_json && cluster) {
    std::printf("disturbed server (straggler, then SIGKILLed): %s\n",
                cluster->endpoint(straggler).c_str());
  }
  std::map<PointKey, PointSummary> results;
  bool wrong_bytes = false;
  for (const std::string& scenario : scenarios) {
    if (scenario == "overwrite") {
      report.Title("scenario: overwrite (" + std::to_string(FLAGS_overwrite_passes) +
                   " random overwrites per page at QD 32, then QD 1; bytes per byte written, "
                   "compaction, remote memory held after; latency in us)");
      for (auto& s : stores) {
        const tessera::client::PageStoreStats before = s.store->Stats();
        PointResult r32, r1, check;
        const uint64_t n32 = pages * static_cast<uint64_t>(FLAGS_overwrite_passes);
        Status st = s.driver->Run(PageOp::Kind::kWrite, 32, 256, n32, min_ns, max_ns * 4, &r32);
        if (st.ok()) {
          st = s.driver->Run(PageOp::Kind::kWrite, 1, 16, uint64_t(FLAGS_lat_ops), min_ns, max_ns,
                             &r1);
        }
        if (st.ok()) st = s.store->Flush();
        if (!st.ok()) Die(s.label + " overwrite", st);
        const tessera::client::PageStoreStats after = s.store->Stats();
        // Every page read back and checked (compaction must never lose or mix pages).
        st = s.driver->Run(PageOp::Kind::kRead, 32, 0, pages, 0, max_ns, &check);
        if (!st.ok()) Die(s.label + " overwrite read-back", st);
        if (check.wrong_bytes > 0) wrong_bytes = true;
        // Every write the store took (warm-up and the ops in flight at the end included).
        const uint64_t written = after.writes - before.writes;
        const double per_byte =
            written ? static_cast<double>(after.bytes_sent - before.bytes_sent) /
                          static_cast<double>(written * kPageSize)
                    : 0.0;
        const double held = s.layout == "group"
                                ? static_cast<double>(after.remote_bytes) /
                                      static_cast<double>(pages * kPageSize)
                                : s.overhead_measured;
        // The group layout's bound, (k+r)/k x 1.2, plus slab granularity: two logical slabs
        // (k+r remote slabs each: one partly used, one being drained).
        const double bound = s.layout == "group" ? s.overhead_declared * 1.2 : s.overhead_declared;
        const double slack = s.layout == "group"
                                 ? 2.0 * 10.0 * static_cast<double>(kBenchSlabBytes) /
                                       static_cast<double>(pages * kPageSize)
                                 : 0.0;
        report.Add(Report::Row()
                       .Set("suite", "pagestore")
                       .Set("table", "overwrite")
                       .Set("store", s.label)
                       .Set("layout", s.layout)
                       .Set("scenario", "overwrite")
                       .Set("ops_per_s_qd32", r32.ops_per_s())
                       .Set("p50_us_qd32", Us(r32.latency.p50()))
                       .Set("p99_us_qd32", Us(r32.latency.p99()))
                       .Set("p50_us_qd1", Us(r1.latency.p50()))
                       .Set("p99_us_qd1", Us(r1.latency.p99()))
                       .Set("writes", written)
                       .Set("bytes_per_byte_written", per_byte)
                       .Set("compaction_moves", after.compaction_moves - before.compaction_moves)
                       .Set("slots_reclaimed", after.slots_reclaimed - before.slots_reclaimed)
                       .Set("parity_updates", after.parity_updates - before.parity_updates)
                       .Set("stripes", after.stripes_written - before.stripes_written)
                       .Set("held", held)
                       .Set("bound", bound)
                       .Set("bound_with_slab_slack", bound + slack)
                       .Set("within_bound", held <= bound + slack + 1e-9 ? "yes" : "no")
                       .Set("errors", r32.errors + r1.errors + check.errors)
                       .Set("wrong_bytes", check.wrong_bytes));
      }
      report.Flush();
      continue;
    }
    if (scenario != "normal" && cluster == nullptr) continue;
    if (scenario == "straggler") {
      if (Status st = cluster->SlowDown(straggler, FLAGS_straggler_us); !st.ok()) {
        Die("injecting the straggler delay", st);
      }
    } else if (scenario == "failed") {
      if (Status st = cluster->Kill(straggler); !st.ok()) Die("killing a server", st);
    }
    const std::vector<int>& point_qds = scenario == "normal" ? qds : disturbed_qds;
    for (int rep = 0; rep < FLAGS_reps; ++rep) {
      for (const char* op : {"read", "write"}) {
        PageOp::Kind kind = std::string(op) == "read" ? PageOp::Kind::kRead : PageOp::Kind::kWrite;
        for (int qd : point_qds) {
          for (auto& s : stores) {  // Interleaved: every store sees the same conditions.
            if (!s.remote && scenario != "normal") continue;
            PointResult r;
            uint64_t min_ops = qd == 1 ? uint64_t(FLAGS_lat_ops) : uint64_t(qd) * 50;
            uint64_t warm = std::min<uint64_t>(uint64_t(qd) * 8, 256);
            Status st = s.driver->Run(kind, qd, warm, min_ops, min_ns, max_ns, &r);
            if (!st.ok()) Die(s.label + " " + op + " at QD " + std::to_string(qd), st);
            PointSummary& sum = results[{s.label, scenario, op, qd}];
            sum.p50.push_back(Us(r.latency.p50()));
            sum.p99.push_back(Us(r.latency.p99()));
            sum.p999.push_back(Us(r.latency.p999()));
            sum.ops.push_back(r.ops_per_s());
            sum.errors += r.errors;
            sum.wrong += r.wrong_bytes;
            if (sum.first_error.empty()) sum.first_error = r.first_error;
            if (r.wrong_bytes > 0) wrong_bytes = true;
          }
        }
      }
    }
    if (scenario == "straggler") {
      if (Status st = cluster->ClearFaults(straggler); !st.ok()) Die("clearing the delay", st);
    }
    report.Title("scenario: " + scenario + " (medians over " + std::to_string(FLAGS_reps) +
                 " reps; latency in us)");
    for (const auto& s : stores) {
      for (const char* op : {"read", "write"}) {
        for (int qd : point_qds) {
          auto it = results.find({s.label, scenario, op, qd});
          if (it == results.end()) continue;
          const PointSummary& sum = it->second;
          Report::Row row;
          row.Set("suite", "pagestore")
              .Set("store", s.label)
              .Set("layout", s.layout)
              .Set("scenario", scenario)
              .Set("op", op)
              .Set("qd", qd)
              .Set("p50_us", Median(sum.p50))
              .Set("p99_us", Median(sum.p99))
              .Set("p999_us", Median(sum.p999))
              .Set("ops_per_s", Median(sum.ops))
              .Set("overhead", s.overhead_declared)
              .Set("errors", sum.errors)
              .Set("wrong_bytes", sum.wrong);
          if (!sum.first_error.empty()) row.Set("first_error", sum.first_error);
          report.Add(std::move(row));
        }
      }
    }
    report.Flush();
  }

  // Store stats after the run (degraded reads, decodes, failures, regenerations).
  report.Title("store counters after the run");
  for (const auto& s : stores) {
    tessera::client::PageStoreStats st = s.store->Stats();
    report.Add(Report::Row()
                   .Set("suite", "pagestore")
                   .Set("table", "counters")
                   .Set("store", s.label)
                   .Set("layout", s.layout)
                   .Set("reads", st.reads)
                   .Set("writes", st.writes)
                   .Set("degraded_reads", st.degraded_reads)
                   .Set("decodes", st.decodes)
                   .Set("data_loss", st.data_loss)
                   .Set("server_failures", st.server_failures)
                   .Set("regenerations", st.regenerations_done)
                   .Set("hedged_reads", st.hedged_reads)
                   .Set("compaction_moves", st.compaction_moves)
                   .Set("stripes", st.stripes_written)
                   .Set("padding_slots", st.padding_slots)
                   .Set("parity_updates", st.parity_updates)
                   .Set("slots_reclaimed", st.slots_reclaimed));
  }
  report.Flush();

  // Targets, on the medians of this run.
  auto get = [&](const std::string& store, const std::string& scenario, const std::string& op,
                 int qd, const char* what) -> std::optional<double> {
    auto it = results.find({store, scenario, op, qd});
    if (it == results.end()) return std::nullopt;
    const PointSummary& s = it->second;
    const std::vector<double>& v = std::string(what) == "p50"   ? s.p50
                                   : std::string(what) == "p99" ? s.p99
                                                                : s.ops;
    return Median(v);
  };
  report.Title("targets (from the issue; computed from this run)");
  auto target = [&](const std::string& name, std::optional<double> ours,
                    std::optional<double> theirs, double factor, bool at_most) {
    if (!ours || !theirs) return;
    double limit = *theirs * factor;
    bool pass = at_most ? *ours <= limit : *ours >= limit;
    report.Add(Report::Row()
                   .Set("suite", "pagestore")
                   .Set("table", "targets")
                   .Set("target", name)
                   .Set("value", *ours)
                   .Set("limit", limit)
                   .Set("result", pass ? "PASS" : "MISS"));
  };
  target("ec read p50 QD1 <= 1.5x single copy", get("ec", "normal", "read", 1, "p50"),
         get("single", "normal", "read", 1, "p50"), 1.5, true);
  target("ec read ops/s QD32 >= 0.7x single copy", get("ec", "normal", "read", 32, "ops"),
         get("single", "normal", "read", 32, "ops"), 0.7, false);
  target("ec write p50 QD1 <= 1.2x rep2", get("ec", "normal", "write", 1, "p50"),
         get("rep2", "normal", "write", 1, "p50"), 1.2, true);
  target("ec straggler read p99 QD1 <= 1.3x ec normal", get("ec", "straggler", "read", 1, "p99"),
         get("ec", "normal", "read", 1, "p99"), 1.3, true);
  target("ec straggler read p99 QD1 < ec-d0 (delta 0)", get("ec", "straggler", "read", 1, "p99"),
         get("ec-d0", "straggler", "read", 1, "p99"), 1.0, true);
  target("ec-group read p50 QD1 <= 1.15x single copy", get("ec-group", "normal", "read", 1, "p50"),
         get("single", "normal", "read", 1, "p50"), 1.15, true);
  target("ec-group read ops/s QD32 >= 0.9x single copy",
         get("ec-group", "normal", "read", 32, "ops"), get("single", "normal", "read", 32, "ops"),
         0.9, false);
  target("ec-group read p50 QD1 < ec (split)", get("ec-group", "normal", "read", 1, "p50"),
         get("ec", "normal", "read", 1, "p50"), 1.0, true);
  target("ec-group straggler read p99 QD1 <= 1.3x ec-group normal",
         get("ec-group", "straggler", "read", 1, "p99"),
         get("ec-group", "normal", "read", 1, "p99"), 1.3, true);
  for (const auto& s : stores) {
    if (s.kind == "ec") {
      target("ec memory overhead (measured) <= 1.25", s.overhead_measured, 1.25, 1.0 + 1e-9, true);
    }
  }
  if (!FLAGS_json) {
    std::printf("(a target is listed only when every store it compares was measured)\n");
  }
  report.Flush();

  // Stores before the cluster (they hold connections to it).
  stores.clear();
  cluster.reset();
  RemoveScratch();
  if (wrong_bytes) {
    std::fprintf(stderr, "tessera bench pagestore: a store returned WRONG BYTES (see wrong_bytes)\n");
    return 1;
  }
  return 0;
}
