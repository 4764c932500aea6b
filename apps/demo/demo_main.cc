// `tessera demo`: the main job end to end on one machine, until the pager exists.
//
// Encodes --pages random 4 KB pages with RS(k, r) and a CRC32C per split, spreads the k + r
// splits of every page over k + r in-memory "servers", then damages them: every page loses
// r splits in a varying pattern; a share of pages (--corrupt_share) instead loses r - 1 and
// has one more split corrupted (a flipped byte, caught by its CRC and treated as an
// erasure); a smaller share (--beyond_share) loses r and has one corrupted, which no code can
// repair and which must be reported as an error, never returned as data. Then every page is
// rebuilt from its surviving splits and compared byte for byte with the original.
// Exits 1 on any mismatch, on a repairable page that was not rebuilt, or on an unrepairable
// page that came back without an error.
#include <gflags/gflags.h>

#include <bit>
#include <cstdio>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "apps/cli/cli.h"
#include "coding/codec.h"
#include "common/clock.h"
#include "common/histogram.h"
#include "common/mmap.h"
#include "common/report.h"

DEFINE_int32(k, 8, "Data splits per page (1, 2, 4, 8, 16 or 32)");
DEFINE_int32(r, 2, "Parity splits per page (0..4)");
DEFINE_int32(pages, 10000, "Pages to encode, damage and rebuild");
DEFINE_uint64(seed, 1, "Seed of the page contents and of the damage");
DEFINE_double(corrupt_share, 0.1, "Share of pages with r - 1 lost splits and 1 corrupted");
DEFINE_double(beyond_share, 0.01,
              "Share of pages with r lost and 1 corrupted: unrepairable, must be an error");
DEFINE_bool(json, false, "Print the figures as one JSON object instead of a table");

namespace tessera {
namespace {

using coding::Codec;
using coding::kPageSize;

const cli::CliSpec kSpec = {
    "tessera demo",
    "[--k 8] [--r 2] [--pages 10000] [--seed 1] [--corrupt_share 0.1] [--beyond_share 0.01] "
    "[--json]",
    "Encodes random pages with RS(k,r) + CRC32C per split over k+r in-memory servers, loses r\n"
    "splits of every page in varying patterns, corrupts one more split in a share of pages,\n"
    "rebuilds every page and verifies it byte for byte. Exits 1 on any mismatch.",
    __FILE__};

MappedRegion MapOrDie(size_t bytes) {
  auto m = MappedRegion::Anonymous(bytes);
  if (!m.ok()) {
    std::fprintf(stderr, "tessera demo: %s\n", m.status().ToString().c_str());
    std::exit(1);
  }
  return std::move(m).value();
}

enum class Damage { kLoseR, kCorruptOne, kBeyond };

int Main(int argc, char** argv) {
  cli::InitCli(kSpec, &argc, &argv);
  auto codec_or = Codec::Create(FLAGS_k, FLAGS_r);
  if (!codec_or.ok()) cli::UsageError(kSpec, codec_or.status().message());
  if (FLAGS_pages < 1 || FLAGS_pages > (1 << 20)) {
    cli::UsageError(kSpec, "--pages must be in [1, 1048576]");
  }
  for (auto [name, v] : {std::pair{"--corrupt_share", FLAGS_corrupt_share},
                         std::pair{"--beyond_share", FLAGS_beyond_share}}) {
    if (!(v >= 0.0 && v <= 1.0)) cli::UsageError(kSpec, std::string(name) + " must be in [0, 1]");
  }
  if (FLAGS_corrupt_share + FLAGS_beyond_share > 1.0) {
    cli::UsageError(kSpec, "--corrupt_share + --beyond_share must be at most 1");
  }
  const Codec& codec = *codec_or;
  const int k = codec.k();
  const int r = codec.r();
  const int n = k + r;
  const size_t ss = codec.split_size();
  const size_t pages = static_cast<size_t>(FLAGS_pages);

  // Originals, and the k + r servers: server s holds split s of every page.
  MappedRegion original = MapOrDie(pages * kPageSize);
  std::vector<MappedRegion> servers;
  for (int s = 0; s < n; ++s) servers.push_back(MapOrDie(pages * ss));
  std::vector<uint32_t> crcs(pages * n);  // Stored beside the splits.
  auto split = [&](int s, size_t p) { return servers[s].data() + p * ss; };
  std::mt19937_64 rng(FLAGS_seed);
  {
    auto* w = reinterpret_cast<uint64_t*>(original.data());
    for (size_t i = 0; i < pages * kPageSize / 8; ++i) w[i] = rng();
  }

  // Encode (timed per page: parity + k + r CRCs), then post the splits to the servers.
  LatencyHistogram encode_ns;
  for (size_t p = 0; p < pages; ++p) {
    const uint8_t* page = original.data() + p * kPageSize;
    uint8_t* parity[coding::kMaxParitySplits];
    for (int j = 0; j < r; ++j) parity[j] = split(k + j, p);
    const uint64_t t0 = MonotonicNs();
    codec.EncodeWithCrcs(page, parity, &crcs[p * n]);
    encode_ns.Record(MonotonicNs() - t0);
    for (int i = 0; i < k; ++i) std::memcpy(split(i, p), page + i * ss, ss);
  }

  // Damage.
  std::vector<uint64_t> present(pages);
  std::vector<Damage> damage(pages);
  std::set<uint64_t> patterns;
  uint64_t splits_lost = 0, corruptions = 0;
  std::uniform_real_distribution<double> uni(0.0, 1.0);
  for (size_t p = 0; p < pages; ++p) {
    const double u = uni(rng);
    Damage d = u < FLAGS_beyond_share                         ? Damage::kBeyond
               : u < FLAGS_beyond_share + FLAGS_corrupt_share ? Damage::kCorruptOne
                                                              : Damage::kLoseR;
    if (d == Damage::kCorruptOne && r == 0) d = Damage::kBeyond;  // Nothing to repair with.
    const int lose = d == Damage::kCorruptOne ? r - 1 : r;
    uint64_t lost = 0;
    while (std::popcount(lost) < lose) lost |= uint64_t{1} << (rng() % n);
    patterns.insert(lost);
    splits_lost += static_cast<uint64_t>(lose);
    if (d != Damage::kLoseR) {
      int victim;
      do {
        victim = static_cast<int>(rng() % n);
      } while (lost >> victim & 1);
      split(victim, p)[rng() % ss] ^= static_cast<uint8_t>(1 + rng() % 255);
      ++corruptions;
    }
    present[p] = codec.all_mask() & ~lost;
    damage[p] = d;
  }

  // Rebuild every page from what the servers still hold, and verify it.
  LatencyHistogram rebuild_ns;
  std::vector<uint8_t> out(kPageSize);
  uint64_t rebuilt = 0, decoded = 0, detected = 0, mismatches = 0, not_rebuilt = 0,
           unrepairable_reported = 0, silent = 0;
  for (size_t p = 0; p < pages; ++p) {
    const uint8_t* ptrs[coding::kMaxSplits];
    for (int s = 0; s < n; ++s) ptrs[s] = split(s, p);
    std::memset(out.data(), 0, kPageSize);
    const uint64_t t0 = MonotonicNs();
    auto res = codec.Reconstruct(ptrs, &crcs[p * n], present[p], out.data());
    rebuild_ns.Record(MonotonicNs() - t0);
    const bool same = std::memcmp(out.data(), original.data() + p * kPageSize, kPageSize) == 0;
    if (res.ok()) {
      detected += static_cast<uint64_t>(std::popcount(res->corrupt_mask));
      if (res->decoded_mask != 0) ++decoded;
      if (!same) {
        ++mismatches;
      } else {
        ++rebuilt;
      }
      if (damage[p] == Damage::kBeyond) ++silent;  // r + 1 bad splits cannot come back OK.
    } else if (damage[p] == Damage::kBeyond && res.status().code() == StatusCode::kCorruption) {
      ++detected;
      ++unrepairable_reported;
    } else {
      ++not_rebuilt;
      if (not_rebuilt <= 5) {
        std::fprintf(stderr, "tessera demo: page %zu not rebuilt: %s\n", p,
                     res.status().ToString().c_str());
      }
    }
  }

  const std::string code = "RS(" + std::to_string(k) + "," + std::to_string(r) + ")";
  std::vector<std::pair<std::string, Report::Value>> figures = {
      {"code", code},
      {"pages", static_cast<uint64_t>(pages)},
      {"bytes", static_cast<uint64_t>(pages * kPageSize)},
      {"splits_lost", static_cast<uint64_t>(splits_lost)},
      {"loss_patterns", static_cast<uint64_t>(patterns.size())},
      {"corruptions_injected", static_cast<uint64_t>(corruptions)},
      {"corruptions_detected", static_cast<uint64_t>(detected)},
      {"pages_rebuilt", static_cast<uint64_t>(rebuilt)},
      {"pages_decoded", static_cast<uint64_t>(decoded)},
      {"unrepairable_reported", static_cast<uint64_t>(unrepairable_reported)},
      {"unrepairable_returned_ok", static_cast<uint64_t>(silent)},
      {"repairable_not_rebuilt", static_cast<uint64_t>(not_rebuilt)},
      {"mismatches", static_cast<uint64_t>(mismatches)},
      {"encode_p50_ns", static_cast<uint64_t>(encode_ns.p50())},
      {"encode_p99_ns", static_cast<uint64_t>(encode_ns.p99())},
      {"rebuild_p50_ns", static_cast<uint64_t>(rebuild_ns.p50())},
      {"rebuild_p99_ns", static_cast<uint64_t>(rebuild_ns.p99())},
  };
  {
    Report report(FLAGS_json);
    if (FLAGS_json) {
      Report::Row row;
      row.Set("suite", "demo");
      for (auto& [name, v] : figures) {
        std::visit([&row, &name](const auto& x) { row.Set(name, x); }, v);
      }
      report.Add(std::move(row));
    } else {
      report.Title("tessera demo: " + code + ", " + std::to_string(pages) +
                   " pages; encode = parity + CRC32C of k+r splits, rebuild = CRC check + "
                   "decode, per page");
      for (auto& [name, v] : figures) {
        report.Add(Report::Row().Set("figure", name).Set("value", Report::Format(v)));
      }
    }
  }
  const bool ok = mismatches == 0 && not_rebuilt == 0 && silent == 0 && detected == corruptions;
  if (!ok) {
    std::fprintf(stderr,
                 "tessera demo: FAILED: %llu mismatches, %llu repairable pages not rebuilt, "
                 "%llu unrepairable pages returned OK, %llu of %llu corruptions detected\n",
                 static_cast<unsigned long long>(mismatches),
                 static_cast<unsigned long long>(not_rebuilt),
                 static_cast<unsigned long long>(silent), static_cast<unsigned long long>(detected),
                 static_cast<unsigned long long>(corruptions));
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) { return tessera::Main(argc, argv); }
