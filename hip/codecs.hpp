// Element and scale codecs of the quantised token formats (DESIGN: token formats), written with integer
// and IEEE float32 operations only, so host and device compute the same bits. include/rocep/formats.hpp
// states the rules; host/codecs.cpp restates them independently (table lookups) as the test oracle.
//
// Every float operation here is a single IEEE operation with round to nearest even: the build turns off
// floating-point contraction (CMakeLists.txt), so `a / b * c` is two roundings on every compiler.
#pragma once

#include <cstdint>

#include "float_ops.hpp"
#include "portable.hpp"

namespace rocep::device {

// Formats and encodings as the kernels see them (same values as rocep::TokenFormat / rocep::Fp8Encoding).
enum class Format : int32_t { kBf16 = 0, kFp8Block128 = 1, kMxfp4 = 2, kNvfp4 = 3, kMxfp8 = 4 };
enum class Fp8 : int32_t { kE4m3fn = 1, kE4m3fnuz = 2 };

inline constexpr uint32_t kFloatExponentMask = 0x7f800000u;  // |x| bits at or above this: inf or NaN
inline constexpr uint32_t kFloatNan = 0x7fc00000u;

// A minifloat with `E` exponent bits, `M` mantissa bits and exponent bias `B`, without infinities.
// Magnitude code of |x| rounded to nearest even, for finite |x| at most the format's largest value (the
// callers clamp first). Integer arithmetic only.
template <int E, int M, int B>
ROCEP_HOST_DEVICE inline uint32_t minifloat_magnitude(uint32_t abs_bits) {
  const int exponent = static_cast<int>(abs_bits >> 23) - 127;
  if (exponent >= 1 - B) {  // a normal number of the target
    const uint32_t rounded = abs_bits + ((1u << (22 - M)) - 1) + ((abs_bits >> (23 - M)) & 1u);
    return (rounded >> (23 - M)) - (static_cast<uint32_t>(127 - B) << M);
  }
  if ((abs_bits >> 23) == 0) {
    return 0;  // float32 zero or subnormal: far below the target's smallest step
  }
  // A subnormal of the target: |x| in units of its smallest step 2^(1-B-M), rounded to nearest even.
  const uint32_t mantissa = (abs_bits & 0x7fffffu) | 0x800000u;  // |x| = mantissa * 2^(exponent - 23)
  const int shift = 24 - exponent - B - M;                       // >= 1 here
  if (shift > 24) {
    return 0;  // below half a step
  }
  const uint32_t quotient = mantissa >> shift;
  const uint32_t remainder = mantissa & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  return quotient + ((remainder > half || (remainder == half && (quotient & 1u))) ? 1u : 0u);
}

// Largest finite value of each element type.
inline constexpr float kE4m3fnMax = 448.0f;
inline constexpr float kE4m3fnuzMax = 240.0f;
inline constexpr float kE2m1Max = 6.0f;

ROCEP_HOST_DEVICE inline float fp8_max(Fp8 encoding) {
  return encoding == Fp8::kE4m3fnuz ? kE4m3fnuzMax : kE4m3fnMax;
}

ROCEP_HOST_DEVICE inline float clamp_magnitude(float value, float limit) {
  return value > limit ? limit : (value < -limit ? -limit : value);
}

// Saturating encoders: |x| above the largest value gives the largest value; NaN gives the NaN code
// (e4m3fn 0x7f, e4m3fnuz 0x80); e2m1 has no NaN, callers never pass one (non-finite blocks are handled
// whole, see below). Negative zero keeps its sign where the format has one (e4m3fn, e2m1), and is +0 in
// e4m3fnuz, whose 0x80 is NaN.
ROCEP_HOST_DEVICE inline uint8_t encode_e4m3fn_software(float value) {
  const uint32_t bits = float_bits(value);
  const uint32_t abs_bits = bits & 0x7fffffffu;
  if (abs_bits > kFloatExponentMask) {
    return 0x7f;
  }
  const uint32_t magnitude =
      minifloat_magnitude<4, 3, 7>(float_bits(clamp_magnitude(bits_float(abs_bits), kE4m3fnMax)));
  return static_cast<uint8_t>(magnitude | ((bits >> 24) & 0x80u));
}

// Two values at once, `low` in bits 0-7 and `high` in bits 8-15. Ada, Hopper and later convert a pair in
// one instruction (cvt.rn.satfinite: nearest even, saturating, NaN to 0x7f: the rules above; the GPU codec
// test holds it to the reference); elsewhere the integer code above.
ROCEP_HOST_DEVICE inline uint32_t encode_e4m3fn_pair(float low, float high) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint16_t pair;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(high), "f"(low));
  return pair;
#else
  return encode_e4m3fn_software(low) | (static_cast<uint32_t>(encode_e4m3fn_software(high)) << 8);
#endif
}

ROCEP_HOST_DEVICE inline uint8_t encode_e4m3fn(float value) {
  return static_cast<uint8_t>(encode_e4m3fn_pair(value, 0.0f));
}

ROCEP_HOST_DEVICE inline uint8_t encode_e4m3fnuz(float value) {
  const uint32_t bits = float_bits(value);
  const uint32_t abs_bits = bits & 0x7fffffffu;
  if (abs_bits > kFloatExponentMask) {
    return 0x80;
  }
  const uint32_t magnitude =
      minifloat_magnitude<4, 3, 8>(float_bits(clamp_magnitude(bits_float(abs_bits), kE4m3fnuzMax)));
  return static_cast<uint8_t>(magnitude == 0 ? 0u : magnitude | ((bits >> 24) & 0x80u));
}

ROCEP_HOST_DEVICE inline uint8_t encode_fp8(float value, Fp8 encoding) {
  return encoding == Fp8::kE4m3fnuz ? encode_e4m3fnuz(value) : encode_e4m3fn(value);
}

inline constexpr float kE2m1Integers = 0x1p23f;  // float32 steps are 1 in [2^23, 2^24)

// e2m1 magnitude code (0..7) of a magnitude 0 <= m < 7, rounded to nearest even, as the low bits of the
// float32 returned (2^23 + code: its other mantissa bits are 0). e2m1's step is 0.5 below 2, 1 in [2, 4)
// and 2 from 4, so the code is rint(2m), rint(m) + 2 or rint(m / 2) + 4 there (rint: to the nearest
// integer, ties to even; adding the even 2 or 4 keeps ties even), and the three lines meet at m = 2 and
// m = 4 with the middle one least between: the code is the least of the three. Each is taken as 2^23 + k,
// where float32 steps are 1, by one fused multiply-add or add (one rounding), so the code is two float
// mins of exact sums, no integer work. Below 7 the third is at most 2^23 + 7, so no saturation is needed:
// mxfp4's elements are at most 6 after their e8m0 scale (mx_scale_code).
ROCEP_HOST_DEVICE inline float e2m1_magnitude_sum_below_7(float magnitude) {
  const float half_steps = fused_multiply_add(magnitude, 2.0f, kE2m1Integers);
  const float unit_steps = magnitude + (kE2m1Integers + 2.0f);
  const float double_steps = fused_multiply_add(magnitude, 0.5f, kE2m1Integers + 4.0f);
  return __builtin_fminf(__builtin_fminf(half_steps, unit_steps), double_steps);
}

// The same sum for m = |x| * f, from |x| (`magnitude`) and a power of two f (`factor`) with 2f finite:
// |x| * f is then exact unless it falls below 2^-126, where the sum is 2^23 (code 0) either way, so each
// candidate's fused multiply-add can take |x| with 2f, f or f / 2 (`twice`, `half`; f / 2 may be
// subnormal, which is exact too) and round once as before: one multiply per element less. Not the body of
// e2m1_magnitude_sum_below_7 (f = 1): its fused multiply-add by 1 in place of the add changed the SiLU
// kernels' code and slowed nvfp4's interleaved kernel (performance-notes.md, perf-kern-19).
ROCEP_HOST_DEVICE inline float e2m1_scaled_sum_below_7(float magnitude, float factor, float twice,
                                                       float half) {
  const float half_steps = fused_multiply_add(magnitude, twice, kE2m1Integers);
  const float unit_steps = fused_multiply_add(magnitude, factor, kE2m1Integers + 2.0f);
  const float double_steps = fused_multiply_add(magnitude, half, kE2m1Integers + 4.0f);
  return __builtin_fminf(__builtin_fminf(half_steps, unit_steps), double_steps);
}

// The same for any magnitude m >= 0, saturated at 6 (code 7): this gives the reference's boundary rule
// (host/codecs.cpp) for every float32 but NaN (compared over all of them once; the codec tests keep every
// bf16, random float32 and every boundary).
ROCEP_HOST_DEVICE inline float e2m1_magnitude_sum(float magnitude) {
  return __builtin_fminf(e2m1_magnitude_sum_below_7(magnitude), kE2m1Integers + 7.0f);
}

// Eight 4-bit codes in one word, element j in bits [4j, 4j + 4), from the elements' e2m1_magnitude_sum bits
// (2^23 + code) and their float32 bits (the sign in bit 31). Every sum has exponent field 150, so the sum
// of sums[j] << 4j is the codes in their nibbles (each below 8: no carries) plus a constant, that of j = 0
// and 1 (0x4b000000 << 4j is 0 modulo 2^32 for j > 1), taken off first. The signs: each element's top
// four bits shifted in below the others' (one funnel shift each), of which bit 3 of each nibble is kept.
ROCEP_HOST_DEVICE inline uint32_t e2m1_word(const uint32_t (&sums)[8], const uint32_t (&signs)[8]) {
  constexpr uint32_t kExponents = 0x4b000000u + (0x4b000000u << 4);
  uint32_t magnitudes = 0u - kExponents;
  uint32_t top_bits = 0;
  for (int j = 0; j < 8; ++j) {
    magnitudes += sums[j] << (4 * j);
    top_bits = (top_bits << 4) | (signs[7 - j] >> 28);
  }
  return magnitudes | (top_bits & 0x88888888u);
}

// 4-bit code (sign in bit 3) in the low nibble; saturates at 6.
ROCEP_HOST_DEVICE inline uint8_t encode_e2m1(float value) {
  const uint32_t magnitude = float_bits(e2m1_magnitude_sum(__builtin_fabsf(value))) & 0x7u;
  return static_cast<uint8_t>(magnitude | ((float_bits(value) >> 28) & 0x8u));
}

// Decoders: exact, since every code is a float32 value.
template <int M, int B>
ROCEP_HOST_DEVICE inline float minifloat_value(uint32_t magnitude) {
  const uint32_t exponent = magnitude >> M;
  const uint32_t mantissa = magnitude & ((1u << M) - 1u);
  if (exponent == 0) {  // subnormal: mantissa * 2^(1-B-M), built from its exponent bits
    return static_cast<float>(mantissa) * bits_float(static_cast<uint32_t>(127 + 1 - B - M) << 23);
  }
  return bits_float(((exponent + 127 - B) << 23) | (mantissa << (23 - M)));
}

ROCEP_HOST_DEVICE inline float decode_e4m3fn(uint8_t code) {
  if ((code & 0x7f) == 0x7f) {
    return bits_float(kFloatNan);
  }
  const float magnitude = minifloat_value<3, 7>(code & 0x7fu);
  return (code & 0x80) ? -magnitude : magnitude;
}

ROCEP_HOST_DEVICE inline float decode_e4m3fnuz(uint8_t code) {
  if (code == 0x80) {
    return bits_float(kFloatNan);
  }
  const float magnitude = minifloat_value<3, 8>(code & 0x7fu);
  return (code & 0x80) ? -magnitude : magnitude;
}

ROCEP_HOST_DEVICE inline float decode_fp8(uint8_t code, Fp8 encoding) {
  return encoding == Fp8::kE4m3fnuz ? decode_e4m3fnuz(code) : decode_e4m3fn(code);
}

// ---- e4m3 codes through float16, four at a time ----------------------------------------------------------
// An e4m3 code's sign, exponent and mantissa bits moved to float16's sign, low four exponent and top three
// mantissa bits make a float16 of value decode(code) * 2^(bias - 15) (bias 7 for e4m3fn, 8 for e4m3fnuz),
// a float16 subnormal where the code is a subnormal, never a float16 infinity or NaN: both encodings decode
// with integer moves, one exact float16 -> float32 conversion and one multiply by 2^(15 - bias), which is
// free where the value is then multiplied by a block scale (scale * 2^(15 - bias) is exact for the normal
// scales of fp8_block_scale and NaN stays NaN). Not for the encodings' NaN codes (e4m3fn 0x7f and 0xff,
// e4m3fnuz 0x80), which e4m3_word_has_nan finds.

// The float16 bits of codes 0 and 1 (bits 0-7 and 8-15 of `codes`) in the low and high halves.
ROCEP_HOST_DEVICE inline uint32_t e4m3_pair_as_f16_bits(uint32_t codes) {
  // Each code in the high byte of its half.
  const uint32_t spread = (codes & 0xffu) << 8 | (codes & 0xff00u) << 16;
  return (spread & 0x80008000u) | ((spread >> 1) & 0x3f803f80u);
}

ROCEP_HOST_DEVICE inline float e4m3_f16_factor(Fp8 encoding) {
  return encoding == Fp8::kE4m3fnuz ? 0x1p7f : 0x1p8f;  // 2^(15 - bias)
}

// Whether any of the four codes of `codes` is the encoding's NaN.
ROCEP_HOST_DEVICE inline bool e4m3_word_has_nan(uint32_t codes, Fp8 encoding) {
  if (encoding == Fp8::kE4m3fnuz) {
    const uint32_t zero_where_nan = codes ^ 0x80808080u;  // a zero byte where the code is 0x80
    return ((zero_where_nan - 0x01010101u) & ~zero_where_nan & 0x80808080u) != 0;
  }
  return (((codes & 0x7f7f7f7fu) + 0x01010101u) & 0x80808080u) != 0;  // a carry into bit 7: low bits 0x7f
}

// A float16 of e4m3_pair_as_f16_bits (finite, exponent field below 16) as float32, exactly.
ROCEP_HOST_DEVICE inline float f16_as_float(uint32_t half_bits) {
#if defined(__CUDA_ARCH__)
  float value;
  asm("cvt.f32.f16 %0, %1;" : "=f"(value) : "h"(static_cast<uint16_t>(half_bits)));
  return value;
#elif defined(__HIP_DEVICE_COMPILE__)
  return static_cast<float>(__builtin_bit_cast(_Float16, static_cast<uint16_t>(half_bits)));
#else
  const float magnitude = minifloat_value<10, 15>(half_bits & 0x7fffu);
  return (half_bits & 0x8000u) != 0 ? -magnitude : magnitude;
#endif
}

ROCEP_HOST_DEVICE inline float decode_e2m1(uint8_t code) {
  const float magnitude = minifloat_value<1, 1>(code & 0x7u);
  return (code & 0x8) ? -magnitude : magnitude;
}

// e8m0: 2^(code - 127); 0xff is NaN.
ROCEP_HOST_DEVICE inline float decode_e8m0(uint8_t code) {
  if (code == 0xff) {
    return bits_float(kFloatNan);
  }
  if (code == 0) {
    return bits_float(0x00400000u);  // 2^-127, a float32 subnormal
  }
  return bits_float(static_cast<uint32_t>(code) << 23);
}

// ---- block scales ---------------------------------------------------------------------------------------
// `amax_bits` is the largest |x| bit pattern of the block (integer max of bits & 0x7fffffff), so a NaN or
// infinity anywhere in the block shows as amax_bits >= kFloatExponentMask. Such a block is stored as a NaN
// scale with every element code 0: it dequantises to NaN, whatever the consumer multiplies it by.

ROCEP_HOST_DEVICE inline bool block_is_finite(uint32_t amax_bits) {
  return amax_bits < kFloatExponentMask;
}

// max(amax, 1e-4), the fp8 block-128 amax that scale and element factor divide by: an all-zero block still
// gets a usable scale.
ROCEP_HOST_DEVICE inline float fp8_floored_amax(uint32_t amax_bits) {
  const float amax = bits_float(amax_bits);
  return amax > 1e-4f ? amax : 1e-4f;
}

// fp8 block-128: scale = max(amax, 1e-4) / fp8_max; elements encode x * (fp8_max / max(amax, 1e-4)), one
// division per block instead of one per element. The scale divides by a constant, so it takes no
// division: with y = 1 / fp8_max rounded to float32, q = m * y is within an ulp of m / fp8_max and one
// correction by the exact remainder m - q * fp8_max (a fused multiply-add) gives the IEEE quotient
// (Markstein's step, which needs y correctly rounded). Equal to m / fp8_max for every float32 m in
// [1e-4, FLT_MAX] and both maxima (compared over all of them once; the codec tests keep every 61st float32).
ROCEP_HOST_DEVICE inline float fp8_block_scale(uint32_t amax_bits, Fp8 encoding) {
  if (!block_is_finite(amax_bits)) {
    return bits_float(kFloatNan);
  }
  const float m = fp8_floored_amax(amax_bits);
  const float divisor = fp8_max(encoding);
  const float reciprocal = encoding == Fp8::kE4m3fnuz ? 0x1.111112p-8f : 0x1.24924ap-9f;  // 1/240, 1/448
  const float q = m * reciprocal;
  return fused_multiply_add(fused_multiply_add(-q, divisor, m), reciprocal, q);
}

// The multiplier of the elements of a finite fp8 block-128 block, fp8_max / m with m = max(amax, 1e-4),
// computed as (fp8_max / 2^e) / (m / 2^e) for 2^e the power of two of m: both scalings are exact (the
// numerator's exponent field stays in [7, 149] for m in [1e-4, FLT_MAX]), so the quotient is the same,
// and the divisor lies in [1, 2), inside divide_in_range's range.
ROCEP_HOST_DEVICE inline float fp8_element_factor(uint32_t amax_bits, Fp8 encoding) {
  const uint32_t floored = float_bits(fp8_floored_amax(amax_bits));
  const uint32_t unbias = (floored & kFloatExponentMask) - (127u << 23);  // e << 23, as a 32-bit difference
  return divide_in_range(bits_float(float_bits(fp8_max(encoding)) - unbias), bits_float(floored - unbias));
}

// MX (e8m0): the smallest power of two X with amax / X <= element max, i.e. code = 127 +
// ceil(log2(amax / element_max)), the quotient rounded to float32 first; clamped to [0, 254] (amax = 0
// gives 0). Elements encode x / X. Computed without the division: where the quotient is a normal float32,
// it rounds to at most 2^j exactly when amax <= element_max * 2^j (the next float32 after element_max *
// 2^j lies more than half an ulp of 2^j away), so the code is amax's exponent field less element_max's
// unbiased exponent, plus one where amax's mantissa is above element_max's. Below that the quotient
// rounds to at most 2^-127 (code 0) up to element_max * 2^-127 plus one float32 step, and to code 1 above.
// Equal to the rule for every amax bit pattern (compared over all of them once, for 448 and 6); for those
// element maxima the code never passes 253, so no upper clamp is needed.
ROCEP_HOST_DEVICE inline uint8_t mx_scale_code(uint32_t amax_bits, float element_max) {
  if (!block_is_finite(amax_bits)) {
    return 0xff;
  }
  const uint32_t max_bits = float_bits(element_max);
  if (amax_bits <= max_bits - (127u << 23) + 1) {
    return 0;
  }
  const uint32_t above = (amax_bits & 0x7fffffu) > (max_bits & 0x7fffffu) ? 1u : 0u;
  return static_cast<uint8_t>((amax_bits >> 23) - ((max_bits >> 23) - 127) + above);
}

// 1 / X for an e8m0 code of a finite block: exact (a power of two, a normal float32 for every code the
// rule above produces from a bf16 or float32 amax).
ROCEP_HOST_DEVICE inline float mx_inverse_scale(uint8_t code) {
  const int exponent = 254 - static_cast<int>(code);  // biased exponent of 2^(127 - code)
  return exponent >= 1 ? bits_float(static_cast<uint32_t>(exponent) << 23) : bits_float(0x00400000u);
}

// nvfp4: e4m3fn block scale sf = e4m3fn((amax / 6) * global_scale) (saturating); elements encode
// x * (global_scale / sf), all 0 when sf is 0. A global scale that is not finite and positive makes every
// block NaN.
ROCEP_HOST_DEVICE inline uint8_t nvfp4_scale_code(uint32_t amax_bits, float global_scale) {
  const bool usable_global = global_scale > 0.0f && float_bits(global_scale) < kFloatExponentMask;
  if (!block_is_finite(amax_bits) || !usable_global) {
    return 0x7f;
  }
  return encode_e4m3fn(bits_float(amax_bits) / kE2m1Max * global_scale);
}

// Multiplier of the elements of an nvfp4 block with scale code `code` (finite block): 0 when sf = 0.
ROCEP_HOST_DEVICE inline float nvfp4_element_factor(uint8_t code, float global_scale) {
  return code == 0 ? 0.0f : global_scale / decode_e4m3fn(code);
}

}  // namespace rocep::device
