#include "apps/paramsvc/kernels.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

namespace tessera::paramsvc {
namespace {

uint16_t ToBf16Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return static_cast<uint16_t>(b >> 16);  // Exact for the values used (low bits zero).
}

TEST(ParamsvcKernels, Fp32SumMatchesScalarForEveryLengthAndOffset) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> d(-4, 4);
  for (size_t n : {0u, 1u, 3u, 7u, 8u, 15u, 16u, 17u, 33u, 1000u, 4099u}) {
    for (size_t off : {0u, 1u, 3u}) {
      std::vector<float> acc(n + off), x(n + off), want(n + off);
      for (size_t i = 0; i < n + off; ++i) {
        acc[i] = d(rng);
        x[i] = d(rng);
        want[i] = acc[i] + x[i];
      }
      AddInto(acc.data() + off, x.data() + off, DType::kF32, n);
      for (size_t i = off; i < n + off; ++i) ASSERT_EQ(acc[i], want[i]) << "n=" << n << " i=" << i;
      for (size_t i = 0; i < off; ++i) ASSERT_NE(acc[i], want[i] + 1e9f);
    }
  }
}

TEST(ParamsvcKernels, Fp16AndBf16AreSummedInFp32) {
  // 1/1024 steps are exact in fp16 (|x| < 2); bf16 keeps 8 bits of mantissa: use 1/64 steps.
  for (size_t n : {1u, 5u, 8u, 31u, 100u, 1027u}) {
    std::vector<uint16_t> h(n), b(n);
    std::vector<float> want(n), acc16(n, 1.0f), accb(n, 1.0f);
    for (size_t i = 0; i < n; ++i) {
      const float v16 = static_cast<float>(static_cast<int>(i % 2000) - 1000) / 1024.0f;
      const float vb = static_cast<float>(static_cast<int>(i % 100) - 50) / 64.0f;
      FromF32(&h[i], &v16, DType::kF16, 1);
      b[i] = ToBf16Bits(vb);
      want[i] = v16;
      accb[i] = 1.0f;
      acc16[i] = 1.0f + 0.0f;
      (void)vb;
    }
    AddInto(acc16.data(), h.data(), DType::kF16, n);
    AddInto(accb.data(), b.data(), DType::kBF16, n);
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(acc16[i], 1.0f + want[i]) << "fp16 n=" << n << " i=" << i;
      const float vb = static_cast<float>(static_cast<int>(i % 100) - 50) / 64.0f;
      ASSERT_EQ(accb[i], 1.0f + vb) << "bf16 n=" << n << " i=" << i;
    }
  }
}

TEST(ParamsvcKernels, ConversionsRoundTrip) {
  std::vector<float> x = {0.0f, 1.0f, -2.5f, 65504.0f, 0.099975586f, 3.140625f};
  for (DType d : {DType::kF16, DType::kBF16}) {
    std::vector<uint16_t> h(x.size());
    std::vector<float> back(x.size());
    FromF32(h.data(), x.data(), d, x.size());
    ToF32(back.data(), h.data(), d, x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      EXPECT_NEAR(back[i], x[i], std::fabs(x[i]) * (d == DType::kF16 ? 1e-3 : 8e-3)) << DTypeName(d);
    }
  }
}

TEST(ParamsvcKernels, SgdMomentumAndAdamMatchTheirDefinitions) {
  const size_t n = 37;
  std::vector<float> p(n), m(n, 0.0f), g(n), pr(n), mr(n, 0.0f);
  for (size_t i = 0; i < n; ++i) {
    p[i] = pr[i] = 0.5f * static_cast<float>(i);
    g[i] = static_cast<float>(i % 7) - 3.0f;
  }
  for (int step = 0; step < 3; ++step) {
    SgdMomentumStep(p.data(), m.data(), g.data(), n, 0.25f, 0.1f, 0.9f, 0.01f);
    for (size_t i = 0; i < n; ++i) {
      const float gi = g[i] * 0.25f + 0.01f * pr[i];
      mr[i] = 0.9f * mr[i] + gi;
      pr[i] -= 0.1f * mr[i];
    }
  }
  for (size_t i = 0; i < n; ++i) EXPECT_NEAR(p[i], pr[i], 1e-5) << i;
  std::vector<float> a(n, 1.0f), am(n, 0.0f), av(n, 0.0f);
  AdamStep(a.data(), am.data(), av.data(), g.data(), n, 1.0f, 0.01f, 0.9f, 0.999f, 1e-8f, 1);
  for (size_t i = 0; i < n; ++i) {
    // First Adam step moves each non-zero-gradient parameter by lr against the gradient sign.
    const float want = g[i] == 0 ? 1.0f : 1.0f - 0.01f * (g[i] > 0 ? 1.0f : -1.0f);
    EXPECT_NEAR(a[i], want, 1e-5) << i;
  }
  EXPECT_NE(std::string(KernelTarget()), "");
}

}  // namespace
}  // namespace tessera::paramsvc
