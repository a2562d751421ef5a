// The float32 math of the fused SiLU kernels, defined bit for bit. Every step is one IEEE float32
// operation rounded to nearest even, or an explicit fused multiply-add (one rounding), or integer work on
// the bits: the build turns floating-point contraction off, so the CPU reference (host/silu.cpp) and the
// kernels (hip/silu.hip) on every GPU compute the same bits. No result depends on a hardware approximation
// (exp2, rcp): those differ between vendors (hip/float_ops.hpp's division only starts from one).
#pragma once

#include "codecs.hpp"
#include "float_ops.hpp"
#include "portable.hpp"

namespace rocep::device {

// exp's inputs in silu are clamped to [-kSiluExpLimit, kSiluExpLimit]: exp(-87) = 1.6e-38 is still a
// normal float32 and vanishes against 1, exp(87) = 6.1e37 is below 2^126.
inline constexpr float kSiluExpLimit = 87.0f;

// exp(x) for x in [-87.33, 88.72], where the result is a normal float32, within 3 ulp of the exact value
// (measured over every float32 of that range against double exp: at most 2.23 ulp;
// tests/cpu/silu_reference_test.cpp keeps a dense sweep of it). Other inputs give unspecified bits. That is
// 2^-22 of the value, far below what the output formats keep (bf16 rounds at 2^-9): a degree-5 polynomial
// rather than degree 6 (0.97 ulp) saves one instruction per element in kernels bound by instruction issue.
//   n = x / ln2 rounded to an integer (ties to even), r = x - n * ln2 in [-ln2/2, ln2/2] (Cody-Waite: ln2 as
//   a 9-bit high part, so n * high is exact and x - n * high has no rounding error, plus a low part),
//   exp(r) = 1 + r + r^2 * Q(r) with Q a degree-3 polynomial fit of (exp(r) - 1 - r) / r^2 on
//   [-0.3466, 0.3466], evaluated by Horner with fma, and
//   2^n * exp(r) by adding n to the exponent field.
ROCEP_HOST_DEVICE inline float exp_in_range(float x) {
  constexpr float kLog2e = 0x1.715476p0f;
  // Adding 1.5 * 2^23 rounds to an integer (float32 steps are 1 there) and leaves it in the low mantissa
  // bits; |n| < 2^22 holds over the range.
  constexpr float kRoundingShift = 0x1.8p23f;
  constexpr float kLn2High = 0x1.63p-1f;       // 0.693359375
  constexpr float kLn2Low = -0x1.bd0106p-13f;  // ln 2 - kLn2High, rounded
  constexpr float kQ0 = 0x1.fffe16p-2f;
  constexpr float kQ1 = 0x1.5557c6p-3f;
  constexpr float kQ2 = 0x1.5723fp-5f;
  constexpr float kQ3 = 0x1.1066c4p-7f;

  const float shifted = fused_multiply_add(x, kLog2e, kRoundingShift);  // 1.5 * 2^23 + n
  const float n = shifted - kRoundingShift;
  float r = fused_multiply_add(n, -kLn2High, x);
  r = fused_multiply_add(n, -kLn2Low, r);
  float p = fused_multiply_add(kQ3, r, kQ2);
  p = fused_multiply_add(p, r, kQ1);
  p = fused_multiply_add(p, r, kQ0);
  p = fused_multiply_add(p, r, 1.0f);
  p = fused_multiply_add(p, r, 1.0f);  // exp(r), in [0.70, 1.42]: exponent field 126 or 127
  // n sits in the low bits of `shifted`, so (bits << 23) is n << 23 modulo 2^32: adding it to p's bits
  // multiplies p by 2^n exactly; over the range the exponent field stays inside [1, 254].
  return bits_float(float_bits(p) + (float_bits(shifted) << 23));
}

// silu(g) = g / (1 + exp(-g)) with exp = exp_in_range, rounded once per operation, for g >= -87; below
// -87 (-inf included) it is silu(-87) = -1.43e-36 (the exact value lies between that and -0). So exp's
// input is in [-87, 87], inside exp_in_range's range: for g > 87 it is raised to -87, where exp(-g) <
// 2^-125 vanishes against 1 just as exp(-87) does. Then 1 + exp is in [1, 6.1e37], below 2^126, and the
// numerator is subnormal only where |g| < 2^-125 makes exp(-g) exactly 1: divide_in_range holds.
// silu(g) = g exactly for 16.7 < g < inf (exp(-g) < 2^-24); silu(+inf) and silu(NaN) are NaN.
ROCEP_HOST_DEVICE inline float silu(float g) {
  const float numerator = max_keeping_nan(g, -kSiluExpLimit);
  const float x = -numerator;
  return divide_in_range(numerator, 1.0f + exp_in_range(x > -kSiluExpLimit ? x : -kSiluExpLimit));
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

}  // namespace rocep::device
