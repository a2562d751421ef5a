// Float32 operations that give the same bits on the host and on every GPU, cheaper on the GPU than the
// compiler's general versions: a fused multiply-add, a division over a restricted range without the IEEE
// division's guard, and a max that keeps NaN. No result depends on a hardware approximation: the one
// approximate reciprocal (divide_in_range on NVIDIA) only starts a sequence whose result is the correctly
// rounded quotient whatever its low bits.
#pragma once

#include <math.h>  // fmaf: libm on the host, the fma instruction in device code (nvcc and hipcc)

#include "portable.hpp"

namespace rocep::device {

// a * b + c with one rounding, on the host and on every GPU.
ROCEP_HOST_DEVICE inline float fused_multiply_add(float a, float b, float c) {
  return fmaf(a, b, c);
}

// n / d rounded to nearest even (the IEEE quotient) for finite n, NaN for an infinite or NaN n; for d in
// [1, 2^126) with n and n / d normal (or zero), or d a power of two. On NVIDIA without the IEEE division's
// guard for the cases outside that range (a check, a branch to a slow path and the registers it clobbers,
// about 7 instructions per element): an approximate reciprocal, one Newton step, the quotient and one
// correction by fused multiply-adds (the sequence nvcc emits for IEEE division when the guard passes),
// with the remainder's sign arranged so that -0 / d stays -0. An infinite n makes the correction inf - inf,
// a NaN; elsewhere adding n * 0 (a zero of n's sign, or NaN) gives the same.
ROCEP_HOST_DEVICE inline float divide_in_range(float n, float d) {
#if defined(__CUDA_ARCH__)
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(d));
  r = fused_multiply_add(fused_multiply_add(-d, r, 1.0f), r, r);
  const float q = n * r;
  return fused_multiply_add(-fused_multiply_add(d, q, -n), r, q);
#else
  return n / d + n * 0.0f;
#endif
}

// max(a, b), NaN when either is NaN: one instruction on NVIDIA sm_80 and later (where absolute values
// passed in fold into its operands).
ROCEP_HOST_DEVICE inline float max_keeping_nan(float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  float result;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(result) : "f"(a), "f"(b));
  return result;
#else
  return a != a ? a : (b != b ? b : (a < b ? b : a));
#endif
}

}  // namespace rocep::device
