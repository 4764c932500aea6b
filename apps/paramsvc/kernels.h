// Summation and optimizer kernels of the Parameter Service, written with Highway (libhwy-dev)
// and dispatched at run time to the best SIMD target of the CPU (SSE4, AVX2, AVX-512, ...).
//
// Gradients arrive as fp32, fp16 (IEEE half) or bf16 and are always summed into an fp32
// accumulator; parameters and optimizer state are fp32. Pulls of fp16/bf16 tensors convert the
// fp32 parameters back (round to nearest even).
//
// Thread safety: pure functions over the caller's buffers; any thread may call them, on
// non-overlapping outputs.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tessera::paramsvc {

enum class DType : uint8_t { kF32 = 0, kF16 = 1, kBF16 = 2 };
inline constexpr int kNumDTypes = 3;
size_t DTypeSize(DType d);        // 4, 2, 2
const char* DTypeName(DType d);   // "fp32", "fp16", "bf16"

// acc[i] += x[i] for i < n; x is in `dtype` (fp16/bf16 as raw uint16 bit patterns).
void AddInto(float* acc, const void* x, DType dtype, size_t n);
// out[i] = x[i] (dtype -> fp32) and out[i] = (dtype) x[i] (fp32 -> dtype).
void ToF32(float* out, const void* x, DType dtype, size_t n);
void FromF32(void* out, const float* x, DType dtype, size_t n);

// SGD with momentum on the averaged gradient g = grad_sum * scale (+ weight_decay * p):
//   m = momentum * m + g;  p -= lr * m          (momentum 0: plain SGD, m untouched)
void SgdMomentumStep(float* param, float* mom, const float* grad_sum, size_t n, float scale,
                     float lr, float momentum, float weight_decay);
// Adam (Kingma & Ba) with bias correction for step t >= 1 on g = grad_sum * scale.
void AdamStep(float* param, float* m, float* v, const float* grad_sum, size_t n, float scale,
              float lr, float beta1, float beta2, float eps, uint64_t t);

// The name of the SIMD target the dispatcher picked, e.g. "AVX2".
const char* KernelTarget();

}  // namespace tessera::paramsvc
