// Codec: systematic Reed-Solomon RS(k, r) over one 4 KB page, with a CRC32C per split.
//
// A page is cut into k data splits of 4096 / k bytes each (the split i is the page bytes
// [i * split_size, (i + 1) * split_size)); r parity splits of the same size are computed from
// them with ISA-L over GF(2^8), using a Cauchy generator matrix (gf_gen_cauchy1_matrix), so
// any k of the k + r splits determine the page. Split indices run 0..k-1 for data and
// k..k+r-1 for parity; a "present mask" is a uint64_t whose bit i says split i is at hand.
//
// Integrity: every split has a CRC32C (ISA-L crc32_iscsi, the standard Castagnoli CRC) that
// the writer stores beside the split. Reconstruct() checks the CRC of every split it is
// given, treats a mismatching split as an erasure, and rebuilds from the rest. It never
// returns wrong data silently: if fewer than k good splits remain it fails with DataLoss (only
// erasures) or Corruption (a CRC mismatch contributed to the loss).
//
// Decode tables. A pattern is (set M of missing data splits, set P of parity rows used),
// |M| == |P| == m, 1 <= m <= min(k, r). Its table expands the m x k decode matrix (rows of the
// inverse of the surviving generator rows that give the missing data splits). Tables are
// built at construction for every pattern of each "eager" level m, in order m = 1, 2, ...,
// while the running total stays within CodecOptions::max_eager_table_bytes (16 MiB default).
// That covers every pattern of every supported code except the largest: for RS(32,3) level 3
// would add 14.5 MiB to 3 MiB, for RS(32,4) levels 3 and 4 would add 58 MiB and 140 MiB (RS(16,4)
// is fully eager in 7.6 MiB, built in about 8 ms). For levels beyond the bound, Reconstruct()
// derives the m x k decode matrix on the stack (an m x m inversion) and expands its table into
// a stack buffer (at most 4 KB): still no heap allocation and no lock, but a few microseconds
// slower per page (see eager_levels()). When all data splits are present nothing is decoded, and
// when some are missing only those are decoded.
//
// Ownership: a Codec owns its matrices and tables; callers own every page, split and CRC
// buffer and pass raw pointers, which must stay valid for the duration of one call. Buffers may
// have any alignment.
//
// Threads: after Create() a Codec is immutable; every const method may be called concurrently
// from any number of threads on one Codec. Encode*/Verify*/Reconstruct* never allocate and
// never lock (error Statuses carry a heap message; that is the failure path only).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/status.h"

namespace tessera::coding {

inline constexpr size_t kPageSize = 4096;
inline constexpr int kMaxDataSplits = 32;
inline constexpr int kMaxParitySplits = 4;
inline constexpr int kMaxSplits = kMaxDataSplits + kMaxParitySplits;

// The CRC32C (Castagnoli, as in iSCSI) of `len` bytes: crc32c("123456789") == 0xE3069283.
uint32_t Crc32c(const void* data, size_t len);

struct CodecOptions {
  // Upper bound on the memory of decode tables built at construction (see the file comment).
  size_t max_eager_table_bytes = size_t{16} << 20;
};

// What Reconstruct() found and did, as split masks.
struct ReconstructInfo {
  uint64_t good_mask = 0;         // Present splits whose CRC matched (all present ones if trusted).
  uint64_t corrupt_mask = 0;      // Present splits whose CRC did not match (treated as erasures).
  uint64_t decoded_mask = 0;      // Data splits rebuilt by decoding (0: no decode was needed).
  uint64_t parity_used_mask = 0;  // Parity splits the decode read.
};

class Codec {
 public:
  // Validates (k, r) and builds the encode and decode tables. k must divide 4096 and be at
  // most 32 (1, 2, 4, 8, 16, 32); r must be in [0, 4] (0: no parity, nothing can be lost).
  static Result<Codec> Create(int k, int r, const CodecOptions& options = {});

  Codec(Codec&&) = default;
  Codec& operator=(Codec&&) = default;
  Codec(const Codec&) = delete;
  Codec& operator=(const Codec&) = delete;

  int k() const { return k_; }
  int r() const { return r_; }
  int num_splits() const { return k_ + r_; }
  size_t split_size() const { return split_size_; }
  // Mask with one bit per split, k + r bits.
  uint64_t all_mask() const { return all_mask_; }
  // Levels m (missing data splits) whose decode tables are prebuilt: 1..eager_levels().
  // Levels above use tables derived on the stack per call.
  int eager_levels() const { return eager_levels_; }
  // Bytes of prebuilt decode tables.
  size_t decode_table_bytes() const { return decode_tables_bytes_; }

  // Computes the r parity splits of a page: page is kPageSize bytes (data split i at
  // page + i * split_size()); parity[j] receives split_size() bytes. No-op when r == 0.
  void Encode(const uint8_t* page, uint8_t* const* parity) const;
  // Same, with the k data splits in separate buffers data[0..k-1].
  void EncodeSplits(const uint8_t* const* data, uint8_t* const* parity) const;
  // Encode(), then the CRC of every split into crcs[0..k+r-1].
  void EncodeWithCrcs(const uint8_t* page, uint8_t* const* parity, uint32_t* crcs) const;

  // The CRC of one split (split_size() bytes).
  uint32_t SplitCrc(const uint8_t* split) const { return Crc32c(split, split_size_); }
  // Mask of the splits in present_mask whose CRC matches crcs[i]. splits[i] must be non-null
  // for each bit in present_mask; present_mask must have no bits above k + r (else those
  // bits are ignored here; Reconstruct() rejects them).
  uint64_t VerifySplits(const uint8_t* const* splits, const uint32_t* crcs,
                        uint64_t present_mask) const;

  // Rebuilds the page into page_out (kPageSize bytes) from the splits in present_mask after
  // checking each one's CRC against crcs[i]. splits has k + r entries; splits[i] is read only
  // if bit i is set. A data split may already sit at its place in page_out
  // (splits[i] == page_out + i * split_size(): one-sided reads straight into the page); it is
  // then not copied. Any other split buffer must not overlap page_out (InvalidArgument).
  // Errors: InvalidArgument (bad mask or pointers), DataLoss, Corruption (see file comment).
  Result<ReconstructInfo> Reconstruct(const uint8_t* const* splits, const uint32_t* crcs,
                                      uint64_t present_mask, uint8_t* page_out) const;
  // Same without CRC checks: for splits the caller has verified (e.g. with VerifySplits()).
  Result<ReconstructInfo> ReconstructTrusted(const uint8_t* const* splits, uint64_t present_mask,
                                             uint8_t* page_out) const;

 private:
  Codec() = default;
  void BuildDecodeMatrix(const int* missing, const int* parity_rows, int m,
                         uint8_t* out /* m x k */) const;
  const uint8_t* EagerTables(const int* missing, const int* parity_rows, int m) const;
  Status CheckArgs(const uint8_t* const* splits, uint64_t present_mask,
                   const uint8_t* page_out) const;
  Result<ReconstructInfo> Rebuild(const uint8_t* const* splits, uint64_t good_mask,
                                  uint8_t* page_out, ReconstructInfo info) const;

  int k_ = 0;
  int r_ = 0;
  size_t split_size_ = 0;
  uint64_t all_mask_ = 0;
  int eager_levels_ = 0;
  // (k + r) x k generator matrix: identity on top, Cauchy rows below.
  std::vector<uint8_t> matrix_;
  // ISA-L expanded tables for the r parity rows: 32 * k * r bytes.
  std::vector<uint8_t> encode_tables_;
  // decode_tables_[m - 1]: tables of every pattern of level m, in pattern-rank order, each
  // 32 * k * m bytes, for m = 1..eager_levels_.
  std::vector<std::vector<uint8_t>> decode_tables_;
  size_t decode_tables_bytes_ = 0;
};

}  // namespace tessera::coding
