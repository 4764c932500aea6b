#include "client/remote/stripe_codec.h"

#include <isa-l/erasure_code.h>

#include <array>
#include <bit>
#include <cstring>
#include <string>

#include "coding/codec.h"

namespace tessera::client::remote {

Result<StripeCodec> StripeCodec::Create(int k, int r) {
  if (k < 1 || k > coding::kMaxDataSplits) return InvalidArgument("stripe k must be 1..32");
  if (r < 1 || r > coding::kMaxParitySplits) return InvalidArgument("stripe r must be 1..4");
  StripeCodec c;
  c.k_ = k;
  c.r_ = r;
  c.matrix_.assign(static_cast<size_t>(k + r) * k, 0);
  gf_gen_cauchy1_matrix(c.matrix_.data(), k + r, k);
  c.encode_tables_.assign(static_cast<size_t>(32) * k * r, 0);
  ec_init_tables(k, r, c.matrix_.data() + static_cast<size_t>(k) * k, c.encode_tables_.data());
  return c;
}

void StripeCodec::Encode(const uint8_t* const* data, uint8_t* const* parity, size_t len) const {
  ec_encode_data(static_cast<int>(len), k_, r_, const_cast<uint8_t*>(encode_tables_.data()),
                 const_cast<uint8_t**>(data), const_cast<uint8_t**>(parity));
}

Status StripeCodec::Rebuild(const uint8_t* const* members, uint64_t good, int target, uint8_t* out,
                            size_t len) const {
  if (target < 0 || target >= k_ + r_) return InvalidArgument("bad stripe member");
  if (target < k_ && (good >> target) & 1) {
    std::memcpy(out, members[target], len);
    return Status::Ok();
  }
  // The first k good members (data first: identity rows need no arithmetic).
  std::array<int, coding::kMaxDataSplits> rows{};
  int n = 0;
  for (int i = 0; i < k_ + r_ && n < k_; ++i) {
    if ((good >> i) & 1) rows[n++] = i;
  }
  if (n < k_) {
    return DataLoss("only " + std::to_string(std::popcount(good)) + " of " +
                    std::to_string(k_ + r_) + " stripe members are good (" + std::to_string(k_) +
                    " needed)");
  }
  constexpr int K = coding::kMaxDataSplits;
  std::array<uint8_t, K * K> b{};
  std::array<uint8_t, K * K> inv{};
  for (int i = 0; i < k_; ++i) {
    std::memcpy(&b[static_cast<size_t>(i) * k_], &matrix_[static_cast<size_t>(rows[i]) * k_], k_);
  }
  if (gf_invert_matrix(b.data(), inv.data(), k_) != 0) {
    return Internal("stripe decode matrix is singular");
  }
  // Coefficients over the chosen members: data member t is row t of the inverse; a parity
  // member is its generator row times the inverse.
  std::array<uint8_t, K> coef{};
  if (target < k_) {
    std::memcpy(coef.data(), &inv[static_cast<size_t>(target) * k_], k_);
  } else {
    const uint8_t* g = &matrix_[static_cast<size_t>(target) * k_];
    for (int j = 0; j < k_; ++j) {
      uint8_t s = 0;
      for (int i = 0; i < k_; ++i) s ^= gf_mul(g[i], inv[static_cast<size_t>(i) * k_ + j]);
      coef[j] = s;
    }
  }
  std::array<uint8_t, 32 * K> tables{};
  ec_init_tables(k_, 1, coef.data(), tables.data());
  std::array<uint8_t*, K> src{};
  for (int i = 0; i < k_; ++i) src[i] = const_cast<uint8_t*>(members[rows[i]]);
  uint8_t* dst[1] = {out};
  ec_encode_data(static_cast<int>(len), k_, 1, tables.data(), src.data(), dst);
  return Status::Ok();
}

void StripeCodec::UpdateParity(int i, const uint8_t* delta, uint8_t* const* parity,
                               size_t len) const {
  ec_encode_data_update(static_cast<int>(len), k_, r_, i,
                        const_cast<uint8_t*>(encode_tables_.data()), const_cast<uint8_t*>(delta),
                        const_cast<uint8_t**>(parity));
}

}  // namespace tessera::client::remote
