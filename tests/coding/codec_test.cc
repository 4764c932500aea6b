// Unit tests of coding::Codec: parameters, CRC32C, parity against a plain GF(2^8) reference,
// every erasure pattern up to r (and r + 1 failing), corruption, caller buffer alignment,
// argument validation and concurrent decoding on one Codec.
#include "coding/codec.h"

#include <gtest/gtest.h>
#include <isa-l/erasure_code.h>

#include <atomic>
#include <bit>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

namespace tessera::coding {
namespace {

std::vector<uint8_t> RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

// One encoded page, its splits held in separate buffers as k + r servers would hold them.
struct Stored {
  std::vector<uint8_t> page;                 // The original page.
  std::vector<std::vector<uint8_t>> splits;  // k + r split copies.
  std::vector<uint32_t> crcs;

  std::vector<const uint8_t*> Pointers() const {
    std::vector<const uint8_t*> p;
    for (const auto& s : splits) p.push_back(s.data());
    return p;
  }
};

Stored EncodePage(const Codec& c, uint64_t seed) {
  Stored s;
  s.page = RandomBytes(kPageSize, seed);
  s.splits.assign(c.num_splits(), std::vector<uint8_t>(c.split_size()));
  std::vector<uint8_t*> parity;
  for (int j = 0; j < c.r(); ++j) parity.push_back(s.splits[c.k() + j].data());
  s.crcs.resize(c.num_splits());
  c.EncodeWithCrcs(s.page.data(), parity.data(), s.crcs.data());
  for (int i = 0; i < c.k(); ++i) {
    std::memcpy(s.splits[i].data(), s.page.data() + i * c.split_size(), c.split_size());
  }
  return s;
}

Codec MakeCodec(int k, int r, size_t eager_bytes = CodecOptions{}.max_eager_table_bytes) {
  CodecOptions o;
  o.max_eager_table_bytes = eager_bytes;
  auto c = Codec::Create(k, r, o);
  EXPECT_TRUE(c.ok()) << c.status();
  return std::move(c).value();
}

std::string MaskStr(uint64_t m) {
  char b[32];
  std::snprintf(b, sizeof(b), "0x%llx", static_cast<unsigned long long>(m));
  return b;
}

TEST(Crc32cTest, KnownValues) {
  EXPECT_EQ(Crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(Crc32c("", 0), 0u);
  std::vector<uint8_t> zeros(32, 0);
  EXPECT_EQ(Crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);  // RFC 3720 B.4 test vector.
}

TEST(CodecCreateTest, RejectsBadParameters) {
  for (int k : {0, -1, 3, 5, 6, 7, 12, 24, 33, 64, 4096}) {
    auto c = Codec::Create(k, 2);
    ASSERT_FALSE(c.ok()) << "k=" << k;
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(c.status().message().find("k must divide 4096"), std::string::npos) << c.status();
  }
  for (int r : {-1, 5, 8, 100}) {
    auto c = Codec::Create(8, r);
    ASSERT_FALSE(c.ok()) << "r=" << r;
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(c.status().message().find("r must be in [0, 4]"), std::string::npos) << c.status();
  }
}

TEST(CodecCreateTest, AcceptsEverySupportedCode) {
  for (int k : {1, 2, 4, 8, 16, 32}) {
    for (int r = 0; r <= kMaxParitySplits; ++r) {
      auto c = Codec::Create(k, r);
      ASSERT_TRUE(c.ok()) << "k=" << k << " r=" << r << ": " << c.status();
      EXPECT_EQ(c->split_size() * k, kPageSize);
      EXPECT_EQ(c->num_splits(), k + r);
      EXPECT_LE(c->decode_table_bytes(), CodecOptions{}.max_eager_table_bytes);
      const int levels = r < k ? r : k;
      if (k <= 16) {
        EXPECT_EQ(c->eager_levels(), levels) << "k=" << k << " r=" << r;
      }
    }
  }
  // The documented exceptions: RS(32,3) and RS(32,4) build levels 1 and 2 eagerly only.
  EXPECT_EQ(MakeCodec(32, 3).eager_levels(), 2);
  EXPECT_EQ(MakeCodec(32, 4).eager_levels(), 2);
  EXPECT_EQ(MakeCodec(32, 2).eager_levels(), 2);
}

// Parity equals sum_j A[k + p][j] * d_j over GF(2^8) with A from gf_gen_cauchy1_matrix,
// computed byte by byte with gf_mul: an independent statement of the code.
TEST(CodecEncodeTest, ParityMatchesGfReference) {
  for (auto [k, r] :
       std::vector<std::pair<int, int>>{{8, 2}, {4, 2}, {8, 3}, {16, 4}, {2, 1}, {32, 4}, {1, 3}}) {
    Codec c = MakeCodec(k, r);
    std::vector<uint8_t> a((k + r) * k);
    gf_gen_cauchy1_matrix(a.data(), k + r, k);
    Stored s = EncodePage(c, 1000 + k * 10 + r);
    for (int p = 0; p < r; ++p) {
      for (size_t b = 0; b < c.split_size(); ++b) {
        uint8_t acc = 0;
        for (int j = 0; j < k; ++j) acc ^= gf_mul(a[(k + p) * k + j], s.splits[j][b]);
        ASSERT_EQ(s.splits[k + p][b], acc)
            << "RS(" << k << "," << r << ") parity " << p << " byte " << b;
      }
    }
  }
}

TEST(CodecEncodeTest, EncodeSplitsMatchesEncode) {
  Codec c = MakeCodec(8, 3);
  Stored s = EncodePage(c, 7);
  std::vector<std::vector<uint8_t>> parity(3, std::vector<uint8_t>(c.split_size()));
  std::vector<uint8_t*> pp = {parity[0].data(), parity[1].data(), parity[2].data()};
  auto ptrs = s.Pointers();
  c.EncodeSplits(ptrs.data(), pp.data());
  for (int j = 0; j < 3; ++j) EXPECT_EQ(parity[j], s.splits[8 + j]) << j;
}

// (k, r, eager): eager = false forces every level through the on-stack table path.
class EveryPatternTest : public ::testing::TestWithParam<std::tuple<int, int, bool>> {};

TEST_P(EveryPatternTest, ReconstructsFromAnyKAndFailsBeyondR) {
  const auto [k, r, eager] = GetParam();
  Codec c = MakeCodec(k, r, eager ? CodecOptions{}.max_eager_table_bytes : 0);
  ASSERT_EQ(c.eager_levels(), eager ? (r < k ? r : k) : 0);
  const int n = k + r;
  std::vector<Stored> pages;
  for (int i = 0; i < 3; ++i) pages.push_back(EncodePage(c, 100 * k + 10 * r + i));
  std::vector<uint8_t> out(kPageSize);
  int tested = 0;
  int failures_expected = 0;
  for (uint64_t lost = 0; lost < (uint64_t{1} << n); ++lost) {
    const int nlost = std::popcount(lost);
    if (nlost > r + 1) continue;
    const Stored& s = pages[tested % pages.size()];
    const uint64_t present = c.all_mask() & ~lost;
    auto ptrs = s.Pointers();
    for (int i = 0; i < n; ++i) {
      if (lost >> i & 1) ptrs[i] = nullptr;  // A lost split is never read.
    }
    // 1) Splits in separate buffers.
    std::memset(out.data(), 0xA5, out.size());
    auto res = c.Reconstruct(ptrs.data(), s.crcs.data(), present, out.data());
    if (nlost > r) {
      ASSERT_FALSE(res.ok()) << "lost " << MaskStr(lost);
      EXPECT_EQ(res.status().code(), StatusCode::kDataLoss) << res.status();
      ++failures_expected;
      continue;
    }
    ASSERT_TRUE(res.ok()) << "lost " << MaskStr(lost) << ": " << res.status();
    ASSERT_EQ(out, s.page) << "lost " << MaskStr(lost);
    const uint64_t data_mask = (uint64_t{1} << k) - 1;
    EXPECT_EQ(res->decoded_mask, lost & data_mask) << MaskStr(lost);
    EXPECT_EQ(std::popcount(res->parity_used_mask), std::popcount(lost & data_mask));
    EXPECT_EQ(res->parity_used_mask & lost, 0u);
    EXPECT_EQ(res->corrupt_mask, 0u);
    // 2) Data splits already in place in the output page; lost places hold garbage.
    std::memcpy(out.data(), s.page.data(), kPageSize);
    for (int i = 0; i < k; ++i) {
      if (lost >> i & 1) {
        std::memset(out.data() + i * c.split_size(), 0x5A, c.split_size());
      } else {
        ptrs[i] = out.data() + i * c.split_size();
      }
    }
    auto res2 = c.ReconstructTrusted(ptrs.data(), present, out.data());
    ASSERT_TRUE(res2.ok()) << "in place, lost " << MaskStr(lost) << ": " << res2.status();
    ASSERT_EQ(out, s.page) << "in place, lost " << MaskStr(lost);
    ++tested;
  }
  // Sanity on the enumeration itself: sum over e <= r of C(n, e) patterns were decoded.
  uint64_t expect = 0;
  uint64_t binom = 1;
  for (int e = 0; e <= r; ++e) {
    expect += binom;
    binom = binom * (n - e) / (e + 1);
  }
  EXPECT_EQ(static_cast<uint64_t>(tested), expect);
  EXPECT_EQ(static_cast<uint64_t>(failures_expected), binom);
}

INSTANTIATE_TEST_SUITE_P(
    Codes, EveryPatternTest,
    ::testing::Values(std::make_tuple(8, 2, true), std::make_tuple(8, 2, false),
                      std::make_tuple(4, 2, true), std::make_tuple(4, 2, false),
                      std::make_tuple(8, 3, true), std::make_tuple(8, 3, false),
                      std::make_tuple(16, 4, true), std::make_tuple(16, 4, false),
                      std::make_tuple(2, 1, true), std::make_tuple(2, 1, false)),
    [](const auto& info) {
      return "RS" + std::to_string(std::get<0>(info.param)) + "_" +
             std::to_string(std::get<1>(info.param)) +
             (std::get<2>(info.param) ? "_eager" : "_stack");
    });

// RS(32,4) keeps levels 3 and 4 off the eager tables: sample those patterns.
TEST(CodecLargeTest, Rs32x4StackLevelsDecodeCorrectly) {
  Codec c = MakeCodec(32, 4);
  ASSERT_EQ(c.eager_levels(), 2);
  std::mt19937_64 rng(42);
  std::vector<uint8_t> out(kPageSize);
  for (int iter = 0; iter < 300; ++iter) {
    Stored s = EncodePage(c, 5000 + iter);
    // Lose 1..4 data splits, and fill up to 4 losses with parity.
    const int mdata = 1 + iter % 4;
    uint64_t lost = 0;
    while (std::popcount(lost) < mdata) lost |= uint64_t{1} << (rng() % 32);
    while (std::popcount(lost) < 4 && iter % 3 == 0) lost |= uint64_t{1} << (32 + rng() % 4);
    auto ptrs = s.Pointers();
    auto res = c.Reconstruct(ptrs.data(), s.crcs.data(), c.all_mask() & ~lost, out.data());
    ASSERT_TRUE(res.ok()) << MaskStr(lost) << ": " << res.status();
    ASSERT_EQ(out, s.page) << MaskStr(lost);
    EXPECT_EQ(res->decoded_mask, lost & 0xFFFFFFFFull);
  }
}

class CorruptionTest : public ::testing::TestWithParam<std::pair<int, int>> {};

TEST_P(CorruptionTest, OneCorruptSplitIsDetectedAndTreatedAsErasure) {
  const auto [k, r] = GetParam();
  Codec c = MakeCodec(k, r);
  const int n = k + r;
  std::vector<uint8_t> out(kPageSize);
  std::mt19937_64 rng(k * 31 + r);
  for (int bad = 0; bad < n; ++bad) {
    Stored s = EncodePage(c, 9000 + bad);
    const size_t byte = rng() % c.split_size();
    s.splits[bad][byte] ^= static_cast<uint8_t>(1 + rng() % 255);
    auto ptrs = s.Pointers();
    // All splits present, one of them corrupt.
    auto res = c.Reconstruct(ptrs.data(), s.crcs.data(), c.all_mask(), out.data());
    if (r == 0) {
      ASSERT_FALSE(res.ok());
      EXPECT_EQ(res.status().code(), StatusCode::kCorruption) << res.status();
      continue;
    }
    ASSERT_TRUE(res.ok()) << "corrupt split " << bad << ": " << res.status();
    EXPECT_EQ(out, s.page) << "corrupt split " << bad;
    EXPECT_EQ(res->corrupt_mask, uint64_t{1} << bad);
    EXPECT_EQ(res->decoded_mask, bad < k ? uint64_t{1} << bad : 0);
    // The corrupt split plus r - 1 lost ones: still exactly k good splits.
    uint64_t lost = 0;
    while (std::popcount(lost) < r - 1) {
      int i = static_cast<int>(rng() % n);
      if (i != bad) lost |= uint64_t{1} << i;
    }
    res = c.Reconstruct(ptrs.data(), s.crcs.data(), c.all_mask() & ~lost, out.data());
    ASSERT_TRUE(res.ok()) << "corrupt " << bad << " lost " << MaskStr(lost) << res.status();
    EXPECT_EQ(out, s.page);
    // The corrupt split plus r lost ones: must fail loudly, never return data.
    while (std::popcount(lost) < r) {
      int i = static_cast<int>(rng() % n);
      if (i != bad) lost |= uint64_t{1} << i;
    }
    res = c.Reconstruct(ptrs.data(), s.crcs.data(), c.all_mask() & ~lost, out.data());
    ASSERT_FALSE(res.ok()) << "corrupt " << bad << " lost " << MaskStr(lost);
    EXPECT_EQ(res.status().code(), StatusCode::kCorruption) << res.status();
  }
}

TEST_P(CorruptionTest, CorruptStoredCrcIsAlsoAnErasure) {
  const auto [k, r] = GetParam();
  Codec c = MakeCodec(k, r);
  Stored s = EncodePage(c, 77);
  s.crcs[0] ^= 1;
  auto ptrs = s.Pointers();
  std::vector<uint8_t> out(kPageSize);
  auto res = c.Reconstruct(ptrs.data(), s.crcs.data(), c.all_mask(), out.data());
  if (r == 0) {  // Nothing to repair with: a loud Corruption error, not the bad split.
    ASSERT_FALSE(res.ok());
    EXPECT_EQ(res.status().code(), StatusCode::kCorruption) << res.status();
    return;
  }
  ASSERT_TRUE(res.ok()) << res.status();
  EXPECT_EQ(out, s.page);
  EXPECT_EQ(res->corrupt_mask, 1u);
  EXPECT_EQ(c.VerifySplits(ptrs.data(), s.crcs.data(), c.all_mask()), c.all_mask() & ~1ull);
}

INSTANTIATE_TEST_SUITE_P(Codes, CorruptionTest,
                         ::testing::Values(std::make_pair(8, 2), std::make_pair(4, 2),
                                           std::make_pair(8, 3), std::make_pair(16, 4),
                                           std::make_pair(2, 1), std::make_pair(8, 0)),
                         [](const auto& info) {
                           return "RS" + std::to_string(info.param.first) + "_" +
                                  std::to_string(info.param.second);
                         });

TEST(CodecTest, AllDataPresentDecodesNothing) {
  Codec c = MakeCodec(8, 2);
  Stored s = EncodePage(c, 3);
  auto ptrs = s.Pointers();
  std::vector<uint8_t> out(kPageSize);
  // Both parity splits lost: a plain copy of the data splits.
  auto res = c.Reconstruct(ptrs.data(), s.crcs.data(), 0xFF, out.data());
  ASSERT_TRUE(res.ok()) << res.status();
  EXPECT_EQ(out, s.page);
  EXPECT_EQ(res->decoded_mask, 0u);
  EXPECT_EQ(res->parity_used_mask, 0u);
}

TEST(CodecTest, NoParityCode) {
  Codec c = MakeCodec(4, 0);
  Stored s = EncodePage(c, 4);
  auto ptrs = s.Pointers();
  std::vector<uint8_t> out(kPageSize);
  auto res = c.Reconstruct(ptrs.data(), s.crcs.data(), 0xF, out.data());
  ASSERT_TRUE(res.ok()) << res.status();
  EXPECT_EQ(out, s.page);
  res = c.Reconstruct(ptrs.data(), s.crcs.data(), 0x7, out.data());
  ASSERT_FALSE(res.ok());
  EXPECT_EQ(res.status().code(), StatusCode::kDataLoss) << res.status();
}

TEST(CodecTest, RejectsBadReconstructArguments) {
  Codec c = MakeCodec(8, 2);
  Stored s = EncodePage(c, 5);
  auto ptrs = s.Pointers();
  std::vector<uint8_t> out(kPageSize);
  auto expect_invalid = [&](Result<ReconstructInfo> res, const char* what) {
    ASSERT_FALSE(res.ok()) << what;
    EXPECT_EQ(res.status().code(), StatusCode::kInvalidArgument) << what << ": " << res.status();
  };
  expect_invalid(c.Reconstruct(ptrs.data(), s.crcs.data(), 0x7FF, out.data()), "mask beyond");
  expect_invalid(c.Reconstruct(ptrs.data(), s.crcs.data(), 0x3FF, nullptr), "null out");
  expect_invalid(c.Reconstruct(ptrs.data(), nullptr, 0x3FF, out.data()), "null crcs");
  expect_invalid(c.Reconstruct(nullptr, s.crcs.data(), 0x3FF, out.data()), "null splits");
  auto with_null = ptrs;
  with_null[3] = nullptr;
  expect_invalid(c.Reconstruct(with_null.data(), s.crcs.data(), 0x3FF, out.data()), "null split");
  // A split buffer inside page_out but not at its own place.
  std::memcpy(out.data() + 2 * c.split_size(), s.splits[1].data(), c.split_size());
  auto misplaced = ptrs;
  misplaced[1] = out.data() + 2 * c.split_size();
  expect_invalid(c.Reconstruct(misplaced.data(), s.crcs.data(), 0x3FF, out.data()),
                 "misplaced split");
  auto parity_inside = ptrs;
  parity_inside[9] = out.data() + 100;
  expect_invalid(c.ReconstructTrusted(parity_inside.data(), 0x3FF, out.data()),
                 "parity inside page_out");
}

// ISA-L needs no alignment; neither does the Codec. Offsets 1..7 on every caller buffer.
TEST(CodecTest, UnalignedCallerBuffers) {
  for (auto [k, r] : std::vector<std::pair<int, int>>{{8, 2}, {4, 2}, {16, 4}, {32, 4}}) {
    Codec c = MakeCodec(k, r);
    const size_t ss = c.split_size();
    Stored ref = EncodePage(c, 11);
    for (size_t off = 1; off < 8; ++off) {
      std::vector<uint8_t> arena((kPageSize + 64) * 2 + (ss + 64) * (k + r));
      uint8_t* page = arena.data() + off;
      uint8_t* out = page + kPageSize + 64 + off;
      uint8_t* split_area = out + kPageSize + 64;
      std::memcpy(page, ref.page.data(), kPageSize);
      std::vector<uint8_t*> splits;
      for (int i = 0; i < k + r; ++i) splits.push_back(split_area + i * (ss + 64) + (off * i) % 8);
      std::vector<uint32_t> crcs(k + r);
      c.EncodeWithCrcs(page, splits.data() + k, crcs.data());
      for (int i = 0; i < k; ++i) std::memcpy(splits[i], page + i * ss, ss);
      ASSERT_EQ(crcs, ref.crcs) << "RS(" << k << "," << r << ") offset " << off;
      for (int j = 0; j < r; ++j) {
        ASSERT_EQ(0, std::memcmp(splits[k + j], ref.splits[k + j].data(), ss)) << off;
      }
      // Lose r splits, spread over data and parity.
      uint64_t lost = 0;
      for (int e = 0; e < r; ++e) lost |= uint64_t{1} << ((off + e * 3) % (k + r));
      std::vector<const uint8_t*> cptrs(splits.begin(), splits.end());
      auto res = c.Reconstruct(cptrs.data(), crcs.data(), c.all_mask() & ~lost, out);
      ASSERT_TRUE(res.ok()) << res.status();
      ASSERT_EQ(0, std::memcmp(out, ref.page.data(), kPageSize))
          << "RS(" << k << "," << r << ") offset " << off;
    }
  }
}

// Several threads decode random patterns (eager and on-stack levels) on one shared Codec.
TEST(CodecTest, ConcurrentReconstructOnOneCodec) {
  for (auto [k, r] : std::vector<std::pair<int, int>>{{16, 4}, {32, 4}}) {
    const Codec c = MakeCodec(k, r);
    std::vector<Stored> pages;
    for (int i = 0; i < 8; ++i) pages.push_back(EncodePage(c, 300 + i));
    std::atomic<int> failures{0};
    std::atomic<int> done{0};
    constexpr int kThreads = 4;
    constexpr int kIters = 400;
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        std::mt19937_64 rng(t + 1);
        std::vector<uint8_t> out(kPageSize);
        for (int it = 0; it < kIters; ++it) {
          const Stored& s = pages[rng() % pages.size()];
          uint64_t lost = 0;
          const int e = static_cast<int>(rng() % (r + 1));
          while (std::popcount(lost) < e) lost |= uint64_t{1} << (rng() % (k + r));
          auto ptrs = s.Pointers();
          auto res = c.Reconstruct(ptrs.data(), s.crcs.data(), c.all_mask() & ~lost, out.data());
          if (!res.ok() || out != s.page) failures.fetch_add(1);
          done.fetch_add(1);
        }
      });
    }
    for (auto& th : threads) th.join();
    EXPECT_EQ(done.load(), kThreads * kIters);
    EXPECT_EQ(failures.load(), 0) << "RS(" << k << "," << r << ")";
  }
}

}  // namespace
}  // namespace tessera::coding
