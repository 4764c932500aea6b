#include "apps/paramsvc/kernels.h"

#include <cmath>
#include <cstring>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "apps/paramsvc/kernels.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "hwy/targets.h"

HWY_BEFORE_NAMESPACE();
namespace tessera::paramsvc {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

void AddF32(float* HWY_RESTRICT acc, const float* HWY_RESTRICT x, size_t n) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  size_t i = 0;
  for (; i + 2 * N <= n; i += 2 * N) {
    const auto a0 = hn::Add(hn::LoadU(d, acc + i), hn::LoadU(d, x + i));
    const auto a1 = hn::Add(hn::LoadU(d, acc + i + N), hn::LoadU(d, x + i + N));
    hn::StoreU(a0, d, acc + i);
    hn::StoreU(a1, d, acc + i + N);
  }
  for (; i < n; ++i) acc[i] += x[i];
}

void AddF16(float* HWY_RESTRICT acc, const uint16_t* HWY_RESTRICT x, size_t n) {
  const hn::ScalableTag<float> d;
  const hn::Rebind<hwy::float16_t, decltype(d)> dh;
  const size_t N = hn::Lanes(d);
  const auto* xh = reinterpret_cast<const hwy::float16_t*>(x);
  size_t i = 0;
  for (; i + N <= n; i += N) {
    hn::StoreU(hn::Add(hn::LoadU(d, acc + i), hn::PromoteTo(d, hn::LoadU(dh, xh + i))), d,
               acc + i);
  }
  if (i < n) {
    // Tail through a padded buffer so the conversion is the same as the vector path.
    HWY_ALIGN hwy::float16_t tmp[hn::MaxLanes(dh)];
    std::memset(tmp, 0, sizeof(tmp));
    std::memcpy(tmp, xh + i, (n - i) * 2);
    HWY_ALIGN float f[hn::MaxLanes(d)];
    hn::Store(hn::PromoteTo(d, hn::Load(dh, tmp)), d, f);
    for (size_t j = 0; i + j < n; ++j) acc[i + j] += f[j];
  }
}

void AddBF16(float* HWY_RESTRICT acc, const uint16_t* HWY_RESTRICT x, size_t n) {
  const hn::ScalableTag<float> d;
  const hn::RebindToUnsigned<decltype(d)> du;
  const hn::Rebind<uint16_t, decltype(d)> du16;
  const size_t N = hn::Lanes(d);
  size_t i = 0;
  for (; i + N <= n; i += N) {
    const auto bits = hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(du16, x + i)));
    hn::StoreU(hn::Add(hn::LoadU(d, acc + i), hn::BitCast(d, bits)), d, acc + i);
  }
  for (; i < n; ++i) {
    const uint32_t bits = static_cast<uint32_t>(x[i]) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    acc[i] += f;
  }
}

void SgdMomentum(float* HWY_RESTRICT p, float* HWY_RESTRICT m, const float* HWY_RESTRICT g,
                 size_t n, float scale, float lr, float momentum, float wd) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  const auto vs = hn::Set(d, scale), vlr = hn::Set(d, lr), vm = hn::Set(d, momentum),
             vwd = hn::Set(d, wd);
  size_t i = 0;
  if (momentum == 0.0f) {
    for (; i + N <= n; i += N) {
      const auto pv = hn::LoadU(d, p + i);
      const auto gv = hn::MulAdd(vwd, pv, hn::Mul(hn::LoadU(d, g + i), vs));
      hn::StoreU(hn::NegMulAdd(vlr, gv, pv), d, p + i);
    }
    for (; i < n; ++i) p[i] -= lr * (g[i] * scale + wd * p[i]);
    return;
  }
  for (; i + N <= n; i += N) {
    const auto pv = hn::LoadU(d, p + i);
    const auto gv = hn::MulAdd(vwd, pv, hn::Mul(hn::LoadU(d, g + i), vs));
    const auto mv = hn::MulAdd(vm, hn::LoadU(d, m + i), gv);
    hn::StoreU(mv, d, m + i);
    hn::StoreU(hn::NegMulAdd(vlr, mv, pv), d, p + i);
  }
  for (; i < n; ++i) {
    const float gi = g[i] * scale + wd * p[i];
    m[i] = momentum * m[i] + gi;
    p[i] -= lr * m[i];
  }
}

void ConvertFromF32(void* out, const float* HWY_RESTRICT x, uint8_t dtype, size_t n) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  size_t i = 0;
  if (dtype == static_cast<uint8_t>(DType::kF16)) {
    const hn::Rebind<hwy::float16_t, decltype(d)> dh;
    auto* o = reinterpret_cast<hwy::float16_t*>(out);
    for (; i + N <= n; i += N) hn::StoreU(hn::DemoteTo(dh, hn::LoadU(d, x + i)), dh, o + i);
    if (i < n) {
      HWY_ALIGN float f[hn::MaxLanes(d)] = {};
      std::memcpy(f, x + i, (n - i) * 4);
      HWY_ALIGN hwy::float16_t h[hn::MaxLanes(dh)];
      hn::Store(hn::DemoteTo(dh, hn::Load(d, f)), dh, h);
      std::memcpy(o + i, h, (n - i) * 2);
    }
  } else {  // bf16, round to nearest even (NaN stays NaN)
    auto* o = static_cast<uint16_t*>(out);
    for (; i < n; ++i) {
      uint32_t bits;
      std::memcpy(&bits, &x[i], 4);
      if ((bits & 0x7fffffffu) > 0x7f800000u) {
        o[i] = static_cast<uint16_t>((bits >> 16) | 0x40);
      } else {
        bits += 0x7fffu + ((bits >> 16) & 1u);
        o[i] = static_cast<uint16_t>(bits >> 16);
      }
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace tessera::paramsvc
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tessera::paramsvc {

HWY_EXPORT(AddF32);
HWY_EXPORT(AddF16);
HWY_EXPORT(AddBF16);
HWY_EXPORT(SgdMomentum);
HWY_EXPORT(ConvertFromF32);

size_t DTypeSize(DType d) { return d == DType::kF32 ? 4 : 2; }
const char* DTypeName(DType d) {
  switch (d) {
    case DType::kF32: return "fp32";
    case DType::kF16: return "fp16";
    case DType::kBF16: return "bf16";
  }
  return "?";
}

void AddInto(float* acc, const void* x, DType dtype, size_t n) {
  switch (dtype) {
    case DType::kF32:
      HWY_DYNAMIC_DISPATCH(AddF32)(acc, static_cast<const float*>(x), n);
      return;
    case DType::kF16:
      HWY_DYNAMIC_DISPATCH(AddF16)(acc, static_cast<const uint16_t*>(x), n);
      return;
    case DType::kBF16:
      HWY_DYNAMIC_DISPATCH(AddBF16)(acc, static_cast<const uint16_t*>(x), n);
      return;
  }
}

void ToF32(float* out, const void* x, DType dtype, size_t n) {
  if (dtype == DType::kF32) {
    std::memcpy(out, x, n * 4);
    return;
  }
  std::memset(out, 0, n * 4);
  AddInto(out, x, dtype, n);
}

void FromF32(void* out, const float* x, DType dtype, size_t n) {
  if (dtype == DType::kF32) {
    std::memcpy(out, x, n * 4);
    return;
  }
  HWY_DYNAMIC_DISPATCH(ConvertFromF32)(out, x, static_cast<uint8_t>(dtype), n);
}

void SgdMomentumStep(float* param, float* mom, const float* grad_sum, size_t n, float scale,
                     float lr, float momentum, float weight_decay) {
  HWY_DYNAMIC_DISPATCH(SgdMomentum)(param, mom, grad_sum, n, scale, lr, momentum, weight_decay);
}

void AdamStep(float* param, float* m, float* v, const float* grad_sum, size_t n, float scale,
              float lr, float beta1, float beta2, float eps, uint64_t t) {
  const float c1 = 1.0f - std::pow(beta1, static_cast<float>(t));
  const float c2 = 1.0f - std::pow(beta2, static_cast<float>(t));
  const float step = lr * std::sqrt(c2) / c1;
  for (size_t i = 0; i < n; ++i) {
    const float g = grad_sum[i] * scale;
    m[i] = beta1 * m[i] + (1 - beta1) * g;
    v[i] = beta2 * v[i] + (1 - beta2) * g * g;
    param[i] -= step * m[i] / (std::sqrt(v[i]) + eps);
  }
}

const char* KernelTarget() {
  int64_t targets = hwy::SupportedTargets() & HWY_TARGETS;
  targets &= -targets;  // The best compiled target the CPU supports (lowest bit).
  return hwy::TargetName(targets);
}

}  // namespace tessera::paramsvc
#endif  // HWY_ONCE
