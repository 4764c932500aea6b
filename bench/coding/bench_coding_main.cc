// `tessera bench coding`: erasure-coding cost per 4 KB page, Tessera's Codec side by side with
// the peers in one run: a bare ISA-L loop (the floor for our wrapper), Jerasure's cauchy_good
// bitmatrix schedules (the classic library a user might pick instead), and plain 2- and 3-way
// replication (the memcpy a replicated system pays instead of coding).
//
// Every op streams a working set of --pages pages (default 64 MiB of data, larger than the
// last-level cache) so results are not cache-flattered. Reconstruction is in place, as the
// client does it: surviving data splits already sit in the page, parity splits beside it, and
// the lost data splits are rebuilt into their places. Before the timed repetitions each op
// runs once untimed over all pages with the lost splits scribbled over, and the pages are
// checked against their CRCs afterwards, so every decoder measured is one that works.
//
// Jerasure is optional at configure (TESSERA_JERASURE): a build without it leaves its rows and
// its two checks out, and says so on stderr.
#include <gflags/gflags.h>
#include <isa-l/erasure_code.h>
#if TESSERA_WITH_JERASURE
#include <jerasure.h>
#include <jerasure/cauchy.h>
#endif
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "apps/cli/cli.h"
#include "coding/codec.h"
#include "common/clock.h"
#include "common/histogram.h"
#include "common/mmap.h"
#include "common/report.h"

DEFINE_bool(json, false, "Print one JSON object per line instead of tables");
DEFINE_int32(reps, 7, "Timed repetitions per op; the median is reported");
DEFINE_int32(pages, 16384, "Working set in 4 KB pages (16384 = 64 MiB of data)");
DEFINE_bool(quick, false, "A small fast run for tests: 256 pages, 2 reps (overrides both)");

namespace tessera {
namespace {

using coding::Codec;
using coding::kPageSize;

const cli::CliSpec kSpec = {
    "tessera bench coding", "[--json] [--reps N] [--pages N] [--quick]",
    "Erasure-coding cost per 4 KB page: Tessera RS(k,r) (ISA-L + CRC32C) vs a bare ISA-L loop,\n"
    "Jerasure cauchy_good, and 2-/3-way replication, for RS(8,2), RS(4,2), RS(8,3). Prints the\n"
    "median ns/page and GB/s over --reps repetitions, p50/p99 over 64-page batches, and the\n"
    "target ratios checked in the same run.",
    __FILE__};

constexpr size_t kBatch = 64;

struct Measurement {
  double ns_per_page = 0;  // Median over reps of (rep time / pages).
  uint64_t p50 = 0;        // Per-page ns over 64-page batches, all reps.
  uint64_t p99 = 0;
};

// One timed operation over every page of the working set.
struct Op {
  std::string scheme;
  std::string op;
  int lost = 0;  // Data splits lost (reconstruct ops).
  std::function<void(size_t)> fn;
};

// Runs every op over all pages, `reps` times, interleaved (rep 1 of each op, then rep 2, ...)
// so that load changes on a shared machine hit all the peers alike.
std::vector<Measurement> MeasureInterleaved(size_t pages, int reps, const std::vector<Op>& ops) {
  std::vector<LatencyHistogram> hist(ops.size());
  std::vector<std::vector<double>> per_rep(ops.size());
  for (int rep = 0; rep < reps; ++rep) {
    for (size_t o = 0; o < ops.size(); ++o) {
      uint64_t total = 0;
      for (size_t b = 0; b < pages; b += kBatch) {
        const size_t e = std::min(pages, b + kBatch);
        const uint64_t t0 = MonotonicNs();
        for (size_t i = b; i < e; ++i) ops[o].fn(i);
        const uint64_t dt = MonotonicNs() - t0;
        total += dt;
        hist[o].Record(dt / (e - b));
      }
      per_rep[o].push_back(static_cast<double>(total) / static_cast<double>(pages));
    }
  }
  std::vector<Measurement> out;
  for (size_t o = 0; o < ops.size(); ++o) {
    out.push_back({Median(per_rep[o]), hist[o].p50(), hist[o].p99()});
  }
  return out;
}

[[noreturn]] void Die(const std::string& msg) {
  std::fprintf(stderr, "tessera bench coding: %s\n", msg.c_str());
  std::exit(1);
}

MappedRegion Map(size_t bytes) {
  MappedRegion::Options o;
  o.populate = true;
  auto r = MappedRegion::Anonymous(bytes, o);
  if (!r.ok()) Die("cannot map " + std::to_string(bytes) + " bytes: " + r.status().ToString());
  return std::move(r).value();
}

class Bench {
 public:
  Bench(size_t pages, int reps, Report* report) : pages_(pages), reps_(reps), report_(report) {
    data_ = Map(pages * kPageSize);
    std::mt19937_64 rng(12345);
    auto* words = reinterpret_cast<uint64_t*>(data_.data());
    for (size_t i = 0; i < pages * kPageSize / 8; ++i) words[i] = rng();
  }

  // The median ns/page of (scheme, code, op), for the target checks.
  double Get(const std::string& scheme, const std::string& code, const std::string& op) const {
    auto it = results_.find(scheme + "|" + code + "|" + op);
    if (it == results_.end()) Die("internal: no result for " + scheme + " " + code + " " + op);
    return it->second;
  }

  void RunCode(int k, int r) {
    auto codec_or = Codec::Create(k, r);
    if (!codec_or.ok()) Die(codec_or.status().ToString());
    const Codec& codec = *codec_or;
    const size_t ss = codec.split_size();
    const std::string code = "RS(" + std::to_string(k) + "," + std::to_string(r) + ")";
    MappedRegion parity = Map(pages_ * r * ss);
#if TESSERA_WITH_JERASURE
    MappedRegion jparity = Map(pages_ * r * ss);
#endif
    std::vector<uint32_t> crcs(pages_ * (k + r));
    auto page = [&](size_t i) { return data_.data() + i * kPageSize; };
    auto par = [&](size_t i, int j) { return parity.data() + (i * r + j) * ss; };
#if TESSERA_WITH_JERASURE
    auto jpar = [&](size_t i, int j) { return jparity.data() + (i * r + j) * ss; };
#endif
    // The lost data splits of page i: `lost` consecutive ones starting at i % k.
    auto lost_mask = [&](size_t i, int lost) {
      uint64_t m = 0;
      for (int e = 0; e < lost; ++e) m |= uint64_t{1} << ((i + e) % k);
      return m;
    };
    auto scribble = [&](size_t i, int lost) {
      uint64_t m = lost_mask(i, lost);
      for (int j = 0; j < k; ++j) {
        if (m >> j & 1) std::memset(page(i) + j * ss, 0xEE, ss);
      }
    };
    auto verify_all = [&](const char* scheme, const char* op) {
      for (size_t i = 0; i < pages_; ++i) {
        for (int j = 0; j < k; ++j) {
          if (codec.SplitCrc(page(i) + j * ss) != crcs[i * (k + r) + j]) {
            Die(std::string(scheme) + " " + code + " " + op + " produced wrong data in page " +
                std::to_string(i) + " split " + std::to_string(j));
          }
        }
      }
    };
    // Untimed: scribble the lost splits, run the op once over all pages, verify. The op is
    // then timed with the others.
    std::vector<Op> ops;
    auto run = [&](const char* scheme, const char* op, int lost, std::function<void(size_t)> fn) {
      for (size_t i = 0; i < pages_; ++i) {
        if (lost > 0) scribble(i, lost);
        fn(i);
      }
      if (lost > 0) verify_all(scheme, op);
      ops.push_back({scheme, op, lost, std::move(fn)});
    };

    // --- Tessera Codec.
    for (size_t i = 0; i < pages_; ++i) {
      uint8_t* p[coding::kMaxParitySplits];
      for (int j = 0; j < r; ++j) p[j] = par(i, j);
      codec.EncodeWithCrcs(page(i), p, &crcs[i * (k + r)]);
    }
    run("tessera", "encode", 0, [&](size_t i) {
      uint8_t* p[coding::kMaxParitySplits];
      for (int j = 0; j < r; ++j) p[j] = par(i, j);
      codec.Encode(page(i), p);
    });
    run("tessera", "encode+crc", 0, [&](size_t i) {
      uint8_t* p[coding::kMaxParitySplits];
      for (int j = 0; j < r; ++j) p[j] = par(i, j);
      codec.EncodeWithCrcs(page(i), p, &crcs[i * (k + r)]);
    });
    auto tessera_rec = [&](int lost, bool check_crc) {
      return [&, lost, check_crc](size_t i) {
        const uint8_t* s[coding::kMaxSplits];
        for (int j = 0; j < k; ++j) s[j] = page(i) + j * ss;
        for (int j = 0; j < r; ++j) s[k + j] = par(i, j);
        const uint64_t present = codec.all_mask() & ~lost_mask(i, lost);
        auto res = check_crc ? codec.Reconstruct(s, &crcs[i * (k + r)], present, page(i))
                             : codec.ReconstructTrusted(s, present, page(i));
        if (!res.ok()) Die("tessera reconstruct failed: " + res.status().ToString());
      };
    };
    run("tessera", "reconstruct_1", 1, tessera_rec(1, false));
    run("tessera", "reconstruct_r", r, tessera_rec(r, false));
    run("tessera", "reconstruct_r+crc", r, tessera_rec(r, true));

    // --- Bare ISA-L: the same Cauchy matrix, tables built here, ec_encode_data in a loop.
    std::vector<uint8_t> a((k + r) * k);
    gf_gen_cauchy1_matrix(a.data(), k + r, k);
    std::vector<uint8_t> enc_tbl(32 * k * r);
    ec_init_tables(k, r, &a[k * k], enc_tbl.data());
    run("isal", "encode", 0, [&](size_t i) {
      unsigned char* src[coding::kMaxDataSplits];
      unsigned char* dst[coding::kMaxParitySplits];
      for (int j = 0; j < k; ++j) src[j] = page(i) + j * ss;
      for (int j = 0; j < r; ++j) dst[j] = par(i, j);
      ec_encode_data(static_cast<int>(ss), k, r, enc_tbl.data(), src, dst);
    });
    // Decode tables for the k rotating patterns of each loss count, the ISA-L example way:
    // invert the k surviving rows, keep the rows of the lost splits.
    auto isal_tables = [&](int lost) {
      std::vector<std::vector<uint8_t>> tbl(k);
      for (int start = 0; start < k; ++start) {
        uint64_t m = lost_mask(start, lost);
        std::vector<uint8_t> b(k * k), inv(k * k), dm(k * lost);
        int row = 0;
        for (int s = 0; s < k + r && row < k; ++s) {
          if (s < k && (m >> s & 1)) continue;
          std::memcpy(&b[row * k], &a[s * k], k);
          ++row;
        }
        if (gf_invert_matrix(b.data(), inv.data(), k) != 0) Die("ISA-L matrix not invertible");
        int out = 0;
        for (int j = 0; j < k; ++j) {
          if (m >> j & 1) std::memcpy(&dm[(out++) * k], &inv[j * k], k);
        }
        tbl[start].resize(32 * k * lost);
        ec_init_tables(k, lost, dm.data(), tbl[start].data());
      }
      return tbl;
    };
    auto isal_rec = [&](int lost, const std::vector<std::vector<uint8_t>>* tbl) {
      return [&, lost, tbl](size_t i) {
        const uint64_t m = lost_mask(i, lost);
        unsigned char* src[coding::kMaxDataSplits];
        unsigned char* dst[coding::kMaxParitySplits];
        int n = 0, d = 0;
        for (int j = 0; j < k; ++j) {
          if (m >> j & 1) {
            dst[d++] = page(i) + j * ss;
          } else {
            src[n++] = page(i) + j * ss;
          }
        }
        for (int j = 0; n < k; ++j) src[n++] = par(i, j);
        ec_encode_data(static_cast<int>(ss), k, lost,
                       const_cast<unsigned char*>((*tbl)[i % k].data()), src, dst);
      };
    };
    const auto tbl1 = isal_tables(1);
    const auto tblr = isal_tables(r);
    run("isal", "reconstruct_1", 1, isal_rec(1, &tbl1));
    run("isal", "reconstruct_r", r, isal_rec(r, &tblr));

    // --- Jerasure cauchy_good, w = 8, smart bitmatrix schedules.
    const size_t jerasure_first = ops.size();
#if TESSERA_WITH_JERASURE
    const int w = 8;
    const int packetsize = static_cast<int>(ss) / w;  // size % (w * packetsize) == 0.
    int* jm = cauchy_good_general_coding_matrix(k, r, w);
    if (jm == nullptr) Die("Jerasure: cauchy_good_general_coding_matrix failed");
    int* bitmatrix = jerasure_matrix_to_bitmatrix(k, r, w, jm);
    int** schedule = jerasure_smart_bitmatrix_to_schedule(k, r, w, bitmatrix);
    auto jptrs = [&](size_t i, char** d, char** c) {
      for (int j = 0; j < k; ++j) d[j] = reinterpret_cast<char*>(page(i) + j * ss);
      for (int j = 0; j < r; ++j) c[j] = reinterpret_cast<char*>(jpar(i, j));
    };
    run("jerasure", "encode", 0, [&](size_t i) {
      char* d[coding::kMaxDataSplits];
      char* c[coding::kMaxParitySplits];
      jptrs(i, d, c);
      jerasure_schedule_encode(k, r, w, schedule, d, c, static_cast<int>(ss), packetsize);
    });
    auto jerasure_rec = [&](int lost) {
      return [&, lost](size_t i) {
        char* d[coding::kMaxDataSplits];
        char* c[coding::kMaxParitySplits];
        jptrs(i, d, c);
        int erasures[coding::kMaxParitySplits + 1];
        for (int e = 0; e < lost; ++e) erasures[e] = static_cast<int>((i + e) % k);
        erasures[lost] = -1;
        if (jerasure_schedule_decode_lazy(k, r, w, bitmatrix, erasures, d, c, static_cast<int>(ss),
                                          packetsize, 1) != 0) {
          Die("Jerasure decode failed");
        }
      };
    };
    run("jerasure", "reconstruct_1", 1, jerasure_rec(1));
    run("jerasure", "reconstruct_r", r, jerasure_rec(r));
#endif

    // Tessera encode+crc rewrote the CRCs Jerasure's decode is verified against; they are
    // the same values, as every op leaves the data unchanged.
    // Two timing groups: the ISA-L based ops interleaved with each other, then Jerasure's.
    // Jerasure's decode_lazy allocates and frees heavily per call; measured here, it slows
    // whatever runs in the next ~10 ms by up to 2x, which would bias an interleaving that
    // put it between the others. Its own figures are not affected by the split.
    std::vector<Op> fast(ops.begin(), ops.begin() + jerasure_first);
    std::vector<Op> slow(ops.begin() + jerasure_first, ops.end());
    std::vector<Measurement> m = MeasureInterleaved(pages_, reps_, fast);
    std::vector<Measurement> mj = MeasureInterleaved(pages_, reps_, slow);
    m.insert(m.end(), mj.begin(), mj.end());
    verify_all("all", "timed ops");
    for (size_t o = 0; o < ops.size(); ++o) Add(ops[o].scheme, code, ops[o].op, ops[o].lost, m[o]);
#if TESSERA_WITH_JERASURE
    jerasure_free_schedule(schedule);
    std::free(bitmatrix);
    std::free(jm);
#endif
  }

  void RunReplication(int copies) {
    const std::string code = std::to_string(copies) + "-way";
    MappedRegion replicas = Map(pages_ * copies * kPageSize);
    auto page = [&](size_t i) { return data_.data() + i * kPageSize; };
    auto rep = [&](size_t i, int c) { return replicas.data() + (i * copies + c) * kPageSize; };
    auto write = [&](size_t i) {
      for (int c = 0; c < copies; ++c) std::memcpy(rep(i, c), page(i), kPageSize);
    };
    for (size_t i = 0; i < pages_; ++i) write(i);
    // A read with the primary lost: copy a surviving replica back into the page.
    auto read = [&](size_t i) { std::memcpy(page(i), rep(i, 1 + i % (copies - 1)), kPageSize); };
    for (size_t i = 0; i < pages_; ++i) {
      std::memset(page(i), 0xEE, kPageSize);
      read(i);
      if (std::memcmp(page(i), rep(i, 0), kPageSize) != 0) Die("replication read mismatch");
    }
    std::vector<Op> ops = {{"replication", "encode", 0, write},
                           {"replication", "reconstruct_1", 1, read}};
    std::vector<Measurement> m = MeasureInterleaved(pages_, reps_, ops);
    for (size_t o = 0; o < ops.size(); ++o) Add(ops[o].scheme, code, ops[o].op, ops[o].lost, m[o]);
  }

 private:
  void Add(const std::string& scheme, const std::string& code, const std::string& op, int lost,
           const Measurement& m) {
    results_[scheme + "|" + code + "|" + op] = m.ns_per_page;
    report_->Add(Report::Row()
                     .Set("suite", "coding")
                     .Set("scheme", scheme)
                     .Set("code", code)
                     .Set("op", op)
                     .Set("lost", lost)
                     .Set("ns_per_page", m.ns_per_page)
                     .Set("gbps", static_cast<double>(kPageSize) / m.ns_per_page)
                     .Set("p50_ns", m.p50)
                     .Set("p99_ns", m.p99)
                     .Set("pages", static_cast<uint64_t>(pages_))
                     .Set("reps", reps_));
  }

  size_t pages_;
  int reps_;
  Report* report_;
  MappedRegion data_;
  std::map<std::string, double> results_;
};

// The last-level cache size from sysfs (sysconf's figure is wrong on some VMs); 0 if unknown.
long L3Bytes() {
  FILE* f = std::fopen("/sys/devices/system/cpu/cpu0/cache/index3/size", "r");
  if (f == nullptr) return 0;
  long kb = 0;
  char unit = 0;
  int n = std::fscanf(f, "%ld%c", &kb, &unit);
  std::fclose(f);
  if (n < 1) return 0;
  return unit == 'M' ? kb << 20 : kb << 10;
}

int Main(int argc, char** argv) {
  cli::InitCli(kSpec, &argc, &argv);
  int reps = FLAGS_reps;
  int pages = FLAGS_pages;
  if (FLAGS_quick) {
    reps = 2;
    pages = 256;
  }
  if (reps < 1 || reps > 1000) cli::UsageError(kSpec, "--reps must be in [1, 1000]");
  if (pages < 64 || pages > (1 << 18)) {
    cli::UsageError(kSpec, "--pages must be in [64, 262144] (256 KiB .. 1 GiB of data)");
  }
#if !TESSERA_WITH_JERASURE
  std::fprintf(stderr,
               "tessera bench coding: this build has no Jerasure peer (configured without "
               "libjerasure-dev and libgf-complete-dev): its rows and checks are left out\n");
#endif
  Report report(FLAGS_json);
  if (!FLAGS_json) {
    long l3 = L3Bytes();
    std::string cache = l3 > 0 ? std::to_string(l3 >> 20) + " MiB L3" : "L3 size unknown";
    std::printf(
        "working set: %d pages = %.1f MiB of data (+ parity/replicas), %s; %s\n"
        "reconstruct_N: N data splits lost (rotating), rebuilt in place; times are median of %d "
        "reps, p50/p99 over 64-page batches\n",
        pages, pages * 4096.0 / (1 << 20), cache.c_str(),
        (l3 > 0 && static_cast<long>(pages) * 4096 > l3) ? "not cache-resident"
                                                         : "may be cache-resident",
        reps);
  }
  Bench bench(static_cast<size_t>(pages), reps, &report);
  const std::pair<int, int> codes[] = {{8, 2}, {4, 2}, {8, 3}};
  for (auto [k, r] : codes) {
    report.Title("RS(" + std::to_string(k) + "," + std::to_string(r) + ")");
    bench.RunCode(k, r);
  }
  report.Title("replication");
  bench.RunReplication(2);
  bench.RunReplication(3);
  report.Flush();

  // Targets, checked in this run (ratios of medians, RS(8,2)).
  report.Title("targets (RS(8,2))");
  const std::string c82 = "RS(8,2)";
  struct Check {
    const char* name;
    double ratio;
    double target;
    bool at_most;
  };
  const std::vector<Check> checks = {
      {"tessera encode / isal encode",
       bench.Get("tessera", c82, "encode") / bench.Get("isal", c82, "encode"), 1.2, true},
      {"tessera reconstruct_2 / tessera encode",
       bench.Get("tessera", c82, "reconstruct_r") / bench.Get("tessera", c82, "encode"), 2.0, true},
#if TESSERA_WITH_JERASURE
      {"jerasure encode / tessera encode",
       bench.Get("jerasure", c82, "encode") / bench.Get("tessera", c82, "encode"), 2.0, false},
      {"jerasure reconstruct_2 / tessera reconstruct_2",
       bench.Get("jerasure", c82, "reconstruct_r") / bench.Get("tessera", c82, "reconstruct_r"),
       2.0, false},
#endif
  };
  for (const auto& c : checks) {
    bool pass = c.at_most ? c.ratio <= c.target : c.ratio >= c.target;
    report.Add(Report::Row()
                   .Set("suite", "coding")
                   .Set("check", c.name)
                   .Set("ratio", c.ratio)
                   .Set("target", std::string(c.at_most ? "<= " : ">= ") + Report::Format(c.target))
                   .Set("result", pass ? "PASS" : "MISS"));
  }
  report.Flush();
  return 0;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) { return tessera::Main(argc, argv); }
