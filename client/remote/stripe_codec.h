// StripeCodec: systematic RS(k, r) over k whole pages (the group layout's stripes), with ISA-L.
//
// coding::Codec cuts ONE page into k splits; a stripe instead has k data pages of its own and r
// parity pages computed across them byte by byte, so any k of the k + r members rebuild any
// member. Member indices: 0..k-1 data, k..k+r-1 parity (Cauchy generator, gf_gen_cauchy1_matrix).
//
// Threads: immutable after Create(); const methods may be called concurrently. Rebuild() does
// not allocate (its decode coefficients and tables live on the stack); Create() does.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/status.h"

namespace tessera::client::remote {

class StripeCodec {
 public:
  static Result<StripeCodec> Create(int k, int r);

  int k() const { return k_; }
  int r() const { return r_; }

  // parity[j] (len bytes each) from data[0..k-1] (len bytes each).
  void Encode(const uint8_t* const* data, uint8_t* const* parity, size_t len) const;
  // Rebuilds member `target` (data or parity) into `out` from k members of `good` (a mask of
  // members; members[i] must be readable for each bit used). DataLoss when fewer than k.
  Status Rebuild(const uint8_t* const* members, uint64_t good, int target, uint8_t* out,
                 size_t len) const;
  // In-place parity update (ISA-L ec_encode_data_update): when data member `i` changes by
  // `delta` (old XOR new, len bytes), parity[j] ^= coefficient(j, i) * delta for every j.
  void UpdateParity(int i, const uint8_t* delta, uint8_t* const* parity, size_t len) const;

 private:
  StripeCodec() = default;
  int k_ = 0;
  int r_ = 0;
  std::vector<uint8_t> matrix_;         // (k + r) x k generator: identity, then Cauchy rows.
  std::vector<uint8_t> encode_tables_;  // 32 * k * r.
};

}  // namespace tessera::client::remote
