// The float32 math of the fused SiLU kernels, defined bit for bit. Every step is one IEEE float32
// operation rounded to nearest even, or an explicit fused multiply-add (one rounding), or integer work on
// the bits: the build turns floating-point contraction off, so the CPU reference (host/silu.cpp) and the
// kernels (hip/silu.hip) on every GPU compute the same bits. No hardware approximation (exp2, rcp) is
// used: those differ between vendors.
#pragma once

#include <math.h>  // fmaf: libm on the host, the fma instruction in device code (nvcc and hipcc)

#include "codecs.hpp"
#include "portable.hpp"

namespace rocep::device {

// a * b + c with one rounding, on the host and on every GPU.
ROCEP_HOST_DEVICE inline float fused_multiply_add(float a, float b, float c) {
  return fmaf(a, b, c);
}

// exp_float thresholds. Above kExpOverflowInput the result is +inf (exp(0x1.62e430p6) is past
// FLT_MAX + half an ulp). Below kExpUnderflowInput the true result is under 2^-126 and exp_float returns
// +0: results in the subnormal range are flushed, which saves a second scaling step per element, and SiLU
// only adds exp to 1, where anything below 2^-24 vanishes anyway.
inline constexpr float kExpOverflowInput = 0x1.62e42ep6f;  // 88.7228317: the largest x with exp(x) finite
inline constexpr float kExpUnderflowInput =
    -0x1.5d589ep6f;  // -87.3365402: the smallest x with exp(x) >= 2^-126

// exp(x) for x in [kExpUnderflowInput, kExpOverflowInput], where the result is a normal float32; other
// inputs give unspecified bits (exp_float and silu select them away).
//   n = x / ln2 rounded to an integer (ties to even), r = x - n * ln2 in [-ln2/2, ln2/2] (Cody-Waite: ln2 as
//   a 9-bit high part, so n * high is exact and x - n * high has no rounding error, plus a low part),
//   exp(r) = 1 + r + r^2 * Q(r) with Q a degree-4 minimax fit of (exp(r) - 1 - r) / r^2 on [-0.3466, 0.3466]
//   (fit error 6.2e-8, below 2^-27 of exp(r) after the r^2 factor), evaluated by Horner with fma, and
//   2^n * exp(r) by adding n to the exponent field.
ROCEP_HOST_DEVICE inline float exp_in_range(float x) {
  constexpr float kLog2e = 0x1.715476p0f;
  // Adding 1.5 * 2^23 rounds to an integer (float32 steps are 1 there) and leaves it in the low mantissa
  // bits; |n| < 2^22 holds over the range.
  constexpr float kRoundingShift = 0x1.8p23f;
  constexpr float kLn2High = 0x1.63p-1f;       // 0.693359375
  constexpr float kLn2Low = -0x1.bd0106p-13f;  // ln 2 - kLn2High, rounded
  constexpr float kQ0 = 0x1.0p-1f;
  constexpr float kQ1 = 0x1.5554dcp-3f;
  constexpr float kQ2 = 0x1.5554b8p-5f;
  constexpr float kQ3 = 0x1.120b70p-7f;
  constexpr float kQ4 = 0x1.6d7548p-10f;

  const float shifted = fused_multiply_add(x, kLog2e, kRoundingShift);  // 1.5 * 2^23 + n
  const float n = shifted - kRoundingShift;
  float r = fused_multiply_add(n, -kLn2High, x);
  r = fused_multiply_add(n, -kLn2Low, r);
  float p = fused_multiply_add(kQ4, r, kQ3);
  p = fused_multiply_add(p, r, kQ2);
  p = fused_multiply_add(p, r, kQ1);
  p = fused_multiply_add(p, r, kQ0);
  p = fused_multiply_add(p, r, 1.0f);
  p = fused_multiply_add(p, r, 1.0f);  // exp(r), in [0.70, 1.42]: exponent field 126 or 127
  // n sits in the low bits of `shifted`, so (bits << 23) is n << 23 modulo 2^32: adding it to p's bits
  // multiplies p by 2^n exactly; over the range the exponent field stays inside [1, 254].
  return bits_float(float_bits(p) + (float_bits(shifted) << 23));
}

// exp(x) in float32, within 2 ulp of the exact value wherever the result is a normal float32 (measured
// over every float32 input against double exp: at most 0.97 ulp; tests/cpu/silu_reference_test.cpp keeps
// a dense sweep of it); +0 below kExpUnderflowInput, +inf above kExpOverflowInput. NaN gives a NaN
// (payload unspecified), +inf gives +inf, -inf gives +0.
ROCEP_HOST_DEVICE inline float exp_float(float x) {
  if (x < kExpUnderflowInput) {
    return 0.0f;
  }
  return x <= kExpOverflowInput ? exp_in_range(x) : x + bits_float(kFloatExponentMask);  // +inf, NaN for NaN
}

// silu(g) = g / (1 + exp_float(-g)), one IEEE division. silu(g) = g exactly for g > 16.7
// (exp(-g) < 2^-24). For g < -88.7 exp(-g) overflows and silu(g) is -0 (the exact value is still a float32
// down to -92.6), and silu(-inf) is NaN (-inf / inf): float32 SiLU as this formula is written everywhere.
// Computed with the thresholds folded in, which saves two instructions per element and gives the same
// bits for every float32 g (checked over all 2^32): below kExpUnderflowInput exp_float is 0, and
// exp(-87) = 1.6e-38 leaves 1 + e = 1 just the same, so -g is raised to -87 instead of selecting 0; a NaN g
// gives NaN either way.
ROCEP_HOST_DEVICE inline float silu(float g) {
  constexpr float kNegligibleExpInput = -87.0f;  // inside exp_in_range's range, exp < 2^-24
  const float x = -g;
  const float e = exp_in_range(x > kNegligibleExpInput ? x : kNegligibleExpInput);
  const float denominator = x <= kExpOverflowInput ? 1.0f + e : bits_float(kFloatExponentMask);
  return g / denominator;
}

// SwiGLU limit, applied to gate and up before silu(g) * u when clamp_limit > 0: g = min(g, limit),
// u = clamp(u, -limit, limit). A NaN stays NaN (compare-and-select, not fmin).
ROCEP_HOST_DEVICE inline float clamp_gate(float g, float clamp_limit) {
  return g > clamp_limit ? clamp_limit : g;
}
ROCEP_HOST_DEVICE inline float clamp_up(float u, float clamp_limit) {
  return clamp_magnitude(u, clamp_limit);
}

// silu(g) * u, the value every output format encodes.
ROCEP_HOST_DEVICE inline float silu_product(float g, float u) {
  return silu(g) * u;
}

// The canonical 0x7fc00000 for any NaN, other values unchanged. The bf16 output stores this: NaN bits
// from arithmetic differ between x86 (sign set), NVIDIA (0x7fffffff) and AMD, and bf16 keeps them. The
// quantised formats need no such step: a NaN anywhere makes its whole block NaN, whatever its bits.
ROCEP_HOST_DEVICE inline float canonical_nan(float value) {
  return value != value ? bits_float(kFloatNan) : value;
}

}  // namespace rocep::device
