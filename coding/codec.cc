#include "coding/codec.h"

#include <isa-l/crc.h>
#include <isa-l/erasure_code.h>

#include <array>
#include <bit>
#include <climits>
#include <cstring>

#include "common/logging.h"

namespace tessera::coding {
namespace {

// kBinom[n][j] = C(n, j) for n <= kMaxSplits, j <= kMaxParitySplits + 1.
constexpr auto MakeBinomials() {
  std::array<std::array<uint64_t, kMaxParitySplits + 2>, kMaxSplits + 1> b{};
  for (int n = 0; n <= kMaxSplits; ++n) {
    b[n][0] = 1;
    for (int j = 1; j <= kMaxParitySplits + 1; ++j) {
      b[n][j] = n == 0 ? 0 : b[n - 1][j - 1] + b[n - 1][j];
    }
  }
  return b;
}
constexpr auto kBinom = MakeBinomials();

uint64_t Binom(int n, int j) { return kBinom[n][j]; }

// Rank of the ascending combination c[0] < ... < c[m-1] among all m-subsets of {0..n-1} in
// colexicographic order (the combinatorial number system): sum of C(c[i], i + 1).
uint64_t ComboRank(const int* c, int m) {
  uint64_t rank = 0;
  for (int i = 0; i < m; ++i) rank += Binom(c[i], i + 1);
  return rank;
}

// Writes the set bits of mask (ascending) to out, minus `base`; returns how many.
int BitsOf(uint64_t mask, int base, int* out) {
  int n = 0;
  while (mask) {
    out[n++] = std::countr_zero(mask) - base;
    mask &= mask - 1;
  }
  return n;
}

// The first m-subset of {0..n-1} ({0..m-1}); false if there is none.
bool FirstCombo(int* c, int m, int n) {
  for (int i = 0; i < m; ++i) c[i] = i;
  return m <= n;
}

// Advances c (ascending m-subset of {0..n-1}) to the next in lexicographic order; false at
// the end.
bool NextCombo(int* c, int m, int n) {
  int i = m - 1;
  while (i >= 0 && c[i] == n - m + i) --i;
  if (i < 0) return false;
  ++c[i];
  for (int j = i + 1; j < m; ++j) c[j] = c[j - 1] + 1;
  return true;
}

bool ValidK(int k) { return k >= 1 && k <= kMaxDataSplits && (kPageSize % k) == 0; }

}  // namespace

uint32_t Crc32c(const void* data, size_t len) {
  auto* p = static_cast<unsigned char*>(const_cast<void*>(data));
  uint32_t crc = 0xFFFFFFFFu;
  while (len > 0) {
    int chunk = len > static_cast<size_t>(INT_MAX) ? INT_MAX : static_cast<int>(len);
    crc = crc32_iscsi(p, chunk, crc);
    p += chunk;
    len -= static_cast<size_t>(chunk);
  }
  return crc ^ 0xFFFFFFFFu;
}

Result<Codec> Codec::Create(int k, int r, const CodecOptions& options) {
  if (!ValidK(k)) {
    return InvalidArgument("RS(k, r): k must divide ", kPageSize, " and be at most ",
                           kMaxDataSplits, " (1, 2, 4, 8, 16 or 32), got k=", k);
  }
  if (r < 0 || r > kMaxParitySplits) {
    return InvalidArgument("RS(k, r): r must be in [0, ", kMaxParitySplits, "], got r=", r);
  }
  Codec c;
  c.k_ = k;
  c.r_ = r;
  c.split_size_ = kPageSize / static_cast<size_t>(k);
  c.all_mask_ = (uint64_t{1} << (k + r)) - 1;
  c.matrix_.resize(static_cast<size_t>(k + r) * k);
  gf_gen_cauchy1_matrix(c.matrix_.data(), k + r, k);
  if (r > 0) {
    c.encode_tables_.resize(32u * k * r);
    ec_init_tables(k, r, &c.matrix_[static_cast<size_t>(k) * k], c.encode_tables_.data());
  }

  // Eager decode tables, level by level, within the memory bound.
  const int max_level = r < k ? r : k;
  size_t total = 0;
  for (int m = 1; m <= max_level; ++m) {
    const size_t per = 32u * static_cast<size_t>(k) * m;
    const uint64_t patterns = Binom(k, m) * Binom(r, m);
    const size_t bytes = patterns * per;
    if (total + bytes > options.max_eager_table_bytes) break;
    std::vector<uint8_t> level(bytes);
    // Enumerate every m-subset of data splits and of parity rows.
    std::array<uint8_t, kMaxParitySplits * kMaxDataSplits> dm;
    int missing[kMaxParitySplits];
    for (bool more_m = FirstCombo(missing, m, k); more_m; more_m = NextCombo(missing, m, k)) {
      int prow[kMaxParitySplits];
      for (bool more_p = FirstCombo(prow, m, r); more_p; more_p = NextCombo(prow, m, r)) {
        uint64_t index = ComboRank(missing, m) * Binom(r, m) + ComboRank(prow, m);
        TCHECK(index < patterns) << "pattern rank out of range";
        c.BuildDecodeMatrix(missing, prow, m, dm.data());
        ec_init_tables(k, m, dm.data(), &level[index * per]);
      }
    }
    c.decode_tables_.push_back(std::move(level));
    total += bytes;
    c.eager_levels_ = m;
  }
  c.decode_tables_bytes_ = total;
  return c;
}

// Rows of the inverse of the surviving generator rows that yield the missing data splits.
// With the data splits not in M ("rest") and the parity rows P surviving, each parity row p
// reads  parity_p = A[p][rest] . d_rest + A[p][M] . d_M, so with B = A[P][M] (m x m, always
// invertible for a Cauchy matrix)  d_M = B^-1 . A[P][rest] . d_rest + B^-1 . parity_P.
// This equals the M rows of the inverted k x k surviving matrix (block elimination), at the
// cost of an m x m inversion. Output columns follow the source order Rebuild() uses: the rest
// data splits ascending, then the parity rows of P ascending.
void Codec::BuildDecodeMatrix(const int* missing, const int* parity_rows, int m,
                              uint8_t* out) const {
  const int k = k_;
  uint8_t b[kMaxParitySplits * kMaxParitySplits];
  uint8_t binv[kMaxParitySplits * kMaxParitySplits];
  auto a = [&](int prow, int col) { return matrix_[static_cast<size_t>(k + prow) * k + col]; };
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < m; ++j) b[i * m + j] = a(parity_rows[i], missing[j]);
  }
  TCHECK(gf_invert_matrix(b, binv, m) == 0)
      << "Cauchy submatrix not invertible (k=" << k_ << ", r=" << r_ << ", m=" << m << ")";
  int rest[kMaxDataSplits];
  int nrest = 0;
  for (int j = 0, mi = 0; j < k; ++j) {
    if (mi < m && missing[mi] == j) {
      ++mi;
    } else {
      rest[nrest++] = j;
    }
  }
  for (int row = 0; row < m; ++row) {
    for (int c = 0; c < nrest; ++c) {
      uint8_t acc = 0;
      for (int i = 0; i < m; ++i) acc ^= gf_mul(binv[row * m + i], a(parity_rows[i], rest[c]));
      out[row * k + c] = acc;
    }
    for (int i = 0; i < m; ++i) out[row * k + nrest + i] = binv[row * m + i];
  }
}

const uint8_t* Codec::EagerTables(const int* missing, const int* parity_rows, int m) const {
  const size_t per = 32u * static_cast<size_t>(k_) * m;
  uint64_t index = ComboRank(missing, m) * Binom(r_, m) + ComboRank(parity_rows, m);
  return &decode_tables_[m - 1][index * per];
}

void Codec::Encode(const uint8_t* page, uint8_t* const* parity) const {
  const uint8_t* data[kMaxDataSplits];
  for (int i = 0; i < k_; ++i) data[i] = page + static_cast<size_t>(i) * split_size_;
  EncodeSplits(data, parity);
}

void Codec::EncodeSplits(const uint8_t* const* data, uint8_t* const* parity) const {
  if (r_ == 0) return;
  unsigned char* src[kMaxDataSplits];
  unsigned char* dst[kMaxParitySplits];
  for (int i = 0; i < k_; ++i) src[i] = const_cast<unsigned char*>(data[i]);
  for (int j = 0; j < r_; ++j) dst[j] = parity[j];
  // ISA-L only reads the tables and the sources.
  ec_encode_data(static_cast<int>(split_size_), k_, r_,
                 const_cast<unsigned char*>(encode_tables_.data()), src, dst);
}

void Codec::EncodeWithCrcs(const uint8_t* page, uint8_t* const* parity, uint32_t* crcs) const {
  Encode(page, parity);
  for (int i = 0; i < k_; ++i) crcs[i] = SplitCrc(page + static_cast<size_t>(i) * split_size_);
  for (int j = 0; j < r_; ++j) crcs[k_ + j] = SplitCrc(parity[j]);
}

uint64_t Codec::VerifySplits(const uint8_t* const* splits, const uint32_t* crcs,
                             uint64_t present_mask) const {
  uint64_t good = 0;
  uint64_t m = present_mask & all_mask_;
  while (m) {
    int i = std::countr_zero(m);
    m &= m - 1;
    if (SplitCrc(splits[i]) == crcs[i]) good |= uint64_t{1} << i;
  }
  return good;
}

Status Codec::CheckArgs(const uint8_t* const* splits, uint64_t present_mask,
                        const uint8_t* page_out) const {
  if (page_out == nullptr) return InvalidArgument("Reconstruct: page_out is null");
  if (present_mask & ~all_mask_) {
    return InvalidArgument("Reconstruct: present_mask 0x", std::hex, present_mask,
                           " has bits beyond the ", std::dec, k_ + r_, " splits of RS(", k_, ",",
                           r_, ")");
  }
  if (present_mask != 0 && splits == nullptr) {
    return InvalidArgument("Reconstruct: splits is null");
  }
  const uintptr_t out_lo = reinterpret_cast<uintptr_t>(page_out);
  const uintptr_t out_hi = out_lo + kPageSize;
  uint64_t m = present_mask;
  while (m) {
    int i = std::countr_zero(m);
    m &= m - 1;
    if (splits[i] == nullptr) {
      return InvalidArgument("Reconstruct: split ", i, " is marked present but null");
    }
    if (i < k_ && splits[i] == page_out + static_cast<size_t>(i) * split_size_) continue;
    const uintptr_t lo = reinterpret_cast<uintptr_t>(splits[i]);
    if (lo < out_hi && out_lo < lo + split_size_) {
      return InvalidArgument("Reconstruct: split ", i,
                             " overlaps page_out without being at its own place");
    }
  }
  return Status::Ok();
}

Result<ReconstructInfo> Codec::Reconstruct(const uint8_t* const* splits, const uint32_t* crcs,
                                           uint64_t present_mask, uint8_t* page_out) const {
  TESSERA_RETURN_IF_ERROR(CheckArgs(splits, present_mask, page_out));
  if (present_mask != 0 && crcs == nullptr) {
    return InvalidArgument("Reconstruct: crcs is null");
  }
  ReconstructInfo info;
  info.good_mask = VerifySplits(splits, crcs, present_mask);
  info.corrupt_mask = present_mask & ~info.good_mask;
  return Rebuild(splits, info.good_mask, page_out, info);
}

Result<ReconstructInfo> Codec::ReconstructTrusted(const uint8_t* const* splits,
                                                  uint64_t present_mask, uint8_t* page_out) const {
  TESSERA_RETURN_IF_ERROR(CheckArgs(splits, present_mask, page_out));
  ReconstructInfo info;
  info.good_mask = present_mask;
  return Rebuild(splits, present_mask, page_out, info);
}

Result<ReconstructInfo> Codec::Rebuild(const uint8_t* const* splits, uint64_t good_mask,
                                       uint8_t* page_out, ReconstructInfo info) const {
  const uint64_t data_mask = (uint64_t{1} << k_) - 1;
  const uint64_t missing_mask = data_mask & ~good_mask;
  const int m = std::popcount(missing_mask);
  const uint64_t parity_good = good_mask & ~data_mask;
  if (m > std::popcount(parity_good)) {
    const int good = std::popcount(good_mask);
    if (info.corrupt_mask != 0) {
      return Corruption("RS(", k_, ",", r_, "): only ", good, " of ", k_ + r_,
                        " splits are good, need ", k_, "; ", std::popcount(info.corrupt_mask),
                        " failed their CRC (mask 0x", std::hex, info.corrupt_mask, ")");
    }
    return DataLoss("RS(", k_, ",", r_, "): only ", good, " of ", k_ + r_,
                    " splits are present, need ", k_);
  }
  if (m > 0) {
    int missing[kMaxParitySplits];
    int prow[kMaxParitySplits];
    BitsOf(missing_mask, 0, missing);
    // The lowest m good parity rows.
    uint64_t pused = 0;
    uint64_t pm = parity_good;
    for (int i = 0; i < m; ++i) {
      pused |= pm & (~pm + 1);
      pm &= pm - 1;
    }
    BitsOf(pused, k_, prow);
    unsigned char* src[kMaxDataSplits];
    unsigned char* dst[kMaxParitySplits];
    int n = 0;
    for (int j = 0; j < k_; ++j) {
      if (!(missing_mask >> j & 1)) src[n++] = const_cast<unsigned char*>(splits[j]);
    }
    for (int i = 0; i < m; ++i) src[n++] = const_cast<unsigned char*>(splits[k_ + prow[i]]);
    for (int i = 0; i < m; ++i) dst[i] = page_out + static_cast<size_t>(missing[i]) * split_size_;
    if (m <= eager_levels_) {
      ec_encode_data(static_cast<int>(split_size_), k_, m,
                     const_cast<unsigned char*>(EagerTables(missing, prow, m)), src, dst);
    } else {
      // Beyond the eager bound: derive this pattern's tables on the stack.
      alignas(64) uint8_t dm[kMaxParitySplits * kMaxDataSplits];
      alignas(64) uint8_t tables[32 * kMaxParitySplits * kMaxDataSplits];
      BuildDecodeMatrix(missing, prow, m, dm);
      ec_init_tables(k_, m, dm, tables);
      ec_encode_data(static_cast<int>(split_size_), k_, m, tables, src, dst);
    }
    info.decoded_mask = missing_mask;
    info.parity_used_mask = pused;
  }
  // Present data splits not already in place.
  uint64_t present_data = data_mask & good_mask;
  while (present_data) {
    int j = std::countr_zero(present_data);
    present_data &= present_data - 1;
    uint8_t* dst = page_out + static_cast<size_t>(j) * split_size_;
    if (splits[j] != dst) std::memcpy(dst, splits[j], split_size_);
  }
  return info;
}

}  // namespace tessera::coding
