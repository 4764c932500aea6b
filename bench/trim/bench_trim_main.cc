// `tessera bench trim`: what a trim of written pages costs.
//
// Starts --servers memservers on loopback (LocalCluster) and an EC(k,r) store of --size bytes.
// Each run writes every page (QD 256 batches), then trims the whole range in --chunk pieces
// with PageStore::Trim ("trim": pages become never-written, logical slabs left empty give their
// k+r remote slabs back), then writes every page again and overwrites the range with zero pages
// in the same pieces ("zero-write": what RemoteStore::Trim did before; the peer). Reported per
// method: the median over --runs of the total time, p50/p99 of the per-piece times (all runs
// pooled), and the slabs the servers still hold afterwards (STATS slabs_allocated, summed).
#include <gflags/gflags.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "apps/cli/cli.h"
#include "client/local_cluster.h"
#include "client/remote_store.h"
#include "common/clock.h"
#include "common/histogram.h"
#include "common/logging.h"
#include "common/report.h"
#include "common/subprocess.h"
#include "common/units.h"
#include "fabric/control_client.h"

DEFINE_string(size, "2G", "Store size (bytes of pages written and trimmed), e.g. 512M, 2G");
DEFINE_string(chunk, "64M", "Size of one Trim call (an NBD client trims in pieces too)");
DEFINE_int32(runs, 3, "Runs (medians are reported)");
DEFINE_int32(k, 8, "EC data splits");
DEFINE_int32(r, 2, "EC parity splits");
DEFINE_int32(servers, 10, "Memservers to start (>= k + r)");
DEFINE_string(slab_size, "16M", "Memserver slab size");
DEFINE_bool(json, false, "JSON lines instead of a table");

namespace {

using namespace tessera;
using tessera::cli::CliSpec;
using tessera::cli::UsageError;

const CliSpec kSpec = {
    "tessera bench trim",
    "[--size 2G] [--chunk 64M] [--runs 3] [--k 8 --r 2 --servers 10]",
    "Times PageStore::Trim of a range of written pages (pages forgotten, empty slabs freed on\n"
    "the memservers) against overwriting the range with zero pages, on loopback memservers.",
    __FILE__, 0, 0};

uint64_t ParseBytes(const char* flag, const std::string& v) {
  auto bytes = tessera::ParseSize(v);
  if (!bytes.ok()) UsageError(kSpec, std::string("--") + flag + ": " + bytes.status().message());
  if (*bytes == 0) UsageError(kSpec, std::string("--") + flag + " must be positive");
  return *bytes;
}

uint64_t SlabsAllocated(const client::LocalCluster& c) {
  uint64_t sum = 0;
  for (const auto& e : c.endpoints()) {
    fabric::ConnectOptions co;
    co.secret = c.secret();
    co.client_id = 0x0b5e77e7;
    auto conn = fabric::ControlClient::Connect(e, co);
    if (!conn.ok()) continue;
    auto text = (*conn)->Stats(Deadline::AfterMs(5000));
    if (!text.ok()) continue;
    const size_t pos = text->find("slabs_allocated ");
    if (pos != std::string::npos) sum += std::stoull(text->substr(pos + 16));
  }
  return sum;
}

Status WriteRange(client::PageStore* s, uint64_t first, uint64_t count, bool zeros,
                  uint32_t stamp) {
  constexpr size_t kBatch = 256;
  std::vector<uint8_t> buf(kBatch * client::kPageSize, 0);
  std::vector<client::PageId> ids(kBatch);
  for (uint64_t p = first; p < first + count; p += kBatch) {
    const size_t n = std::min<uint64_t>(kBatch, first + count - p);
    for (size_t i = 0; i < n; ++i) {
      ids[i] = p + i;
      if (!zeros) {
        uint64_t v = (p + i) * 0x9E3779B97F4A7C15ull + stamp;
        for (size_t off = 0; off < client::kPageSize; off += 512) {
          std::memcpy(&buf[i * client::kPageSize + off], &v, 8);
          v = v * 6364136223846793005ull + 1442695040888963407ull;
        }
      }
    }
    TESSERA_RETURN_IF_ERROR(s->WritePages(ids.data(), n, buf.data()));
  }
  return Status::Ok();
}

}  // namespace

int main(int argc, char** argv) {
  tessera::cli::InitCli(kSpec, &argc, &argv);
  const uint64_t size = ParseBytes("size", FLAGS_size);
  const uint64_t chunk = ParseBytes("chunk", FLAGS_chunk);
  if (size % client::kPageSize != 0 || chunk % client::kPageSize != 0) {
    UsageError(kSpec, "--size and --chunk must be multiples of 4K");
  }
  if (FLAGS_runs < 1) UsageError(kSpec, "--runs must be >= 1");
  if (FLAGS_servers < FLAGS_k + FLAGS_r) UsageError(kSpec, "--servers must be >= k + r");
  const uint64_t pages = size / client::kPageSize;
  const uint64_t chunk_pages = chunk / client::kPageSize;

  client::LocalClusterOptions lo;
  lo.bin_dir = SelfExeDir();
  lo.servers = static_cast<size_t>(FLAGS_servers);
  lo.slab_size = FLAGS_slab_size;
  // Each server holds about size * (k+r) / k / servers; leave room for placement imbalance.
  const uint64_t slab = ParseBytes("slab_size", FLAGS_slab_size);
  uint64_t per = size / static_cast<uint64_t>(FLAGS_k) * static_cast<uint64_t>(FLAGS_k + FLAGS_r) /
                 static_cast<uint64_t>(FLAGS_servers) * 2;
  per = (per / slab + 4) * slab;
  lo.capacity = std::to_string(per / (1 << 20)) + "M";
  lo.extra_flags = {"--headroom=0"};
  auto cluster = client::LocalCluster::Start(lo);
  if (!cluster.ok()) {
    std::fprintf(stderr, "tessera bench trim: %s\n", cluster.status().ToString().c_str());
    return 1;
  }
  client::ErasureCodedStoreOptions o;
  for (const auto& e : (*cluster)->endpoints()) o.remote.servers.push_back({e, ""});
  o.remote.secret = (*cluster)->secret();
  o.remote.transport = fabric::TransportKind::kTcp;
  o.remote.capacity_pages = pages;
  o.remote.max_inflight_pages = 512;
  o.k = FLAGS_k;
  o.r = FLAGS_r;
  auto store = client::CreateErasureCodedStore(o);
  if (!store.ok()) {
    std::fprintf(stderr, "tessera-bench-trim: %s\n", store.status().ToString().c_str());
    return 1;
  }
  client::PageStore* s = store->get();

  struct Method {
    const char* name;
    std::vector<double> totals_ms;
    LatencyHistogram pieces;
    std::vector<double> slabs_after;
    std::vector<double> slabs_before;
  } methods[2] = {{"trim"}, {"zero-write"}};

  for (int run = 0; run < FLAGS_runs; ++run) {
    for (int m = 0; m < 2; ++m) {
      if (Status st = WriteRange(s, 0, pages, false, static_cast<uint32_t>(run * 2 + m + 1));
          !st.ok()) {
        std::fprintf(stderr, "tessera-bench-trim: writing the pages: %s\n", st.ToString().c_str());
        return 1;
      }
      if (Status st = s->Flush(); !st.ok()) {
        std::fprintf(stderr, "tessera-bench-trim: flush: %s\n", st.ToString().c_str());
        return 1;
      }
      methods[m].slabs_before.push_back(static_cast<double>(SlabsAllocated(**cluster)));
      const uint64_t t0 = MonotonicNs();
      for (uint64_t p = 0; p < pages; p += chunk_pages) {
        const uint64_t n = std::min(chunk_pages, pages - p);
        const uint64_t c0 = MonotonicNs();
        Status st = m == 0 ? s->Trim(p, n) : WriteRange(s, p, n, true, 0);
        if (!st.ok()) {
          std::fprintf(stderr, "tessera-bench-trim: %s: %s\n", methods[m].name,
                       st.ToString().c_str());
          return 1;
        }
        methods[m].pieces.Record(MonotonicNs() - c0);
      }
      if (Status st = s->Flush(); !st.ok()) {
        std::fprintf(stderr, "tessera-bench-trim: flush: %s\n", st.ToString().c_str());
        return 1;
      }
      methods[m].totals_ms.push_back(static_cast<double>(MonotonicNs() - t0) / 1e6);
      methods[m].slabs_after.push_back(static_cast<double>(SlabsAllocated(**cluster)));
      // Every page must read zeros afterwards (sampled: first and last page of every chunk).
      uint8_t buf[client::kPageSize];
      for (uint64_t p = 0; p < pages; p += chunk_pages) {
        for (uint64_t q : {p, std::min(p + chunk_pages, pages) - 1}) {
          Status st = s->ReadPage(q, buf);
          if (!st.ok() ||
              !std::all_of(buf, buf + client::kPageSize, [](uint8_t b) { return b == 0; })) {
            std::fprintf(stderr, "tessera-bench-trim: %s: page %llu does not read zeros (%s)\n",
                         methods[m].name, static_cast<unsigned long long>(q),
                         st.ToString().c_str());
            return 1;
          }
        }
      }
    }
  }
  Report rep(FLAGS_json);
  rep.Title("Trim of " + FLAGS_size + " of written pages, " + s->name() + ", " +
            std::to_string(FLAGS_servers) + " memservers, pieces of " + FLAGS_chunk +
            ", medians of " + std::to_string(FLAGS_runs) + " runs");
  const double trim_ms = Median(methods[0].totals_ms);
  for (auto& m : methods) {
    const double total = Median(m.totals_ms);
    rep.Add(Report::Row()
                .Set("method", m.name)
                .Set("total_ms", total)
                .Set("piece_p50_ms", static_cast<double>(m.pieces.Percentile(0.5)) / 1e6)
                .Set("piece_p99_ms", static_cast<double>(m.pieces.Percentile(0.99)) / 1e6)
                .Set("GiB_per_s", static_cast<double>(size) / (1ull << 30) / (total / 1e3))
                .Set("slabs_before", Median(m.slabs_before))
                .Set("slabs_after", Median(m.slabs_after))
                .Set("x_trim_time", total / trim_ms));
  }
  rep.Flush();
  return 0;
}
