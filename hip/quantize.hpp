// Quantising a row of float32 values in a block of threads, each thread holding 8 or 16 consecutive
// elements: the lanes that hold one scale block agree on its amax through shuffles, then each encodes its
// own elements. The kernels that produce quantised rows (dispatch from bf16 tokens, 8 per thread; the fused
// SiLU, 16) share this, and host/codecs.cpp defines the same bits.
#pragma once

#include <cstdint>

#include "codecs.hpp"
#include "scale_layout.hpp"
#include "wave_shuffle.hpp"

namespace rocep::device {

// Elements per thread where dispatch quantises a token row.
inline constexpr int kElementsPerThread = 8;

// What one thread produces from its kCount elements: the codes (kCount bytes of fp8 in words
// [0, kCount / 4), or kCount / 2 bytes of e2m1 in words [0, kCount / 8), element 2i in the low nibble of
// byte i) and its block's scale (float32 bits for fp8 block-128, the code byte otherwise), which the
// block's first lane stores.
template <int kCount>
struct QuantizedElements {
  uint32_t codes[kCount / 4];
  uint32_t scale;
};

// Payload bytes of `count` elements.
ROCEP_HOST_DEVICE constexpr int elements_payload_bytes(Format format, int count) {
  return format == Format::kBf16 ? 2 * count
                                 : (format == Format::kMxfp4 || format == Format::kNvfp4 ? count / 2 : count);
}

// The e2m1 codes of a thread's elements into codes[0, kCount / 8), eight to a word: `sum` maps an element's
// magnitude |x| to the e2m1_magnitude_sum bits of its scaled magnitude.
template <int kCount, typename Sum>
__device__ inline void e2m1_words(const float (&values)[kCount], uint32_t (&codes)[kCount / 4], Sum sum) {
#pragma unroll
  for (int w = 0; w < kCount / 8; ++w) {
    uint32_t sums[8];
    uint32_t signs[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      sums[j] = float_bits(sum(__builtin_fabsf(values[8 * w + j])));
      signs[j] = float_bits(values[8 * w + j]);
    }
    codes[w] = e2m1_word(sums, signs);
  }
}

// Every lane of the wave calls it, lanes without data with zeros; lanes [b * L, (b + 1) * L) hold one
// scale block, L = block_elements(format) / kCount (a power of two up to 16, so a block never straddles
// two waves; 1 when the block is the thread's own).
template <Format format, int kCount>
__device__ inline QuantizedElements<kCount> quantize_elements(const float (&values)[kCount], Fp8 encoding,
                                                              float global_scale) {
  static_assert(format != Format::kBf16, "bf16 has no scales to compute");
  // The largest magnitude, NaN if any value is NaN: its bits are then at or above kFloatExponentMask, as
  // for an infinity, and for finite values the float order is the order of the magnitude bits.
  float largest = __builtin_fabsf(values[0]);
#pragma unroll
  for (int i = 1; i < kCount; ++i) {
    largest = max_keeping_nan(largest, __builtin_fabsf(values[i]));
  }
  uint32_t amax = float_bits(largest);
  static_assert(block_elements(format) % kCount == 0, "a thread's elements lie in one scale block");
  const int lanes = block_elements(format) / kCount;
  for (int mask = 1; mask < lanes; mask <<= 1) {
    const uint32_t other = shuffle_xor(amax, mask);
    amax = other > amax ? other : amax;
  }

  QuantizedElements<kCount> out{};
  if constexpr (format == Format::kFp8Block128 || format == Format::kMxfp8) {
    float multiplier = 1.0f;  // fp8 block-128: fp8_max / max(amax, 1e-4); mxfp8: 2^(127 - code), exact
    const bool finite = block_is_finite(amax);
    if constexpr (format == Format::kFp8Block128) {
      out.scale = float_bits(fp8_block_scale(amax, encoding));
      multiplier = fp8_element_factor(amax, encoding);
    } else {
      const uint8_t code = mx_scale_code(amax, kE4m3fnMax);
      multiplier = mx_inverse_scale(code);
      out.scale = code;
      encoding = Fp8::kE4m3fn;
    }
    if (finite) {
      float scaled[kCount];
#pragma unroll
      for (int i = 0; i < kCount; ++i) {
        scaled[i] = values[i] * multiplier;
      }
      if (encoding == Fp8::kE4m3fn) {
#pragma unroll
        for (int i = 0; i < kCount; i += 2) {
          out.codes[i / 4] |= encode_e4m3fn_pair(scaled[i], scaled[i + 1]) << (8 * (i % 4));
        }
      } else {
#pragma unroll
        for (int i = 0; i < kCount; ++i) {
          out.codes[i / 4] |= static_cast<uint32_t>(encode_e4m3fnuz(scaled[i])) << (8 * (i % 4));
        }
      }
    }
    return out;
  }
  // e2m1 formats
  float multiplier = 0.0f;
  bool encode = false;
  if constexpr (format == Format::kMxfp4) {
    const uint8_t code = mx_scale_code(amax, kE2m1Max);
    out.scale = code;
    encode = code != 0xff;
    multiplier = encode ? mx_inverse_scale(code) : 0.0f;
  } else {
    const uint8_t code = nvfp4_scale_code(amax, global_scale);
    out.scale = code;
    // 0x7f only for a NaN block: finite scales saturate at 0x7e. sf = 0 gives factor 0: each element is
    // a zero of its input's sign.
    encode = code != 0x7f;
    multiplier = encode ? nvfp4_element_factor(code, global_scale) : 0.0f;
  }
  // |x * multiplier| = |x| * multiplier, and x's sign is the product's: the multiplier is +0 or more.
  if (encode) {
    if constexpr (format == Format::kMxfp4) {
      if (out.scale != 0) {  // the multiplier 2^(127 - code) is below 2^127: twice it is finite
        const float twice = 2.0f * multiplier;
        const float half = 0.5f * multiplier;
        e2m1_words(values, out.codes, [=](float magnitude) {
          return e2m1_scaled_sum_below_7(magnitude, multiplier, twice, half);
        });
      } else {
        e2m1_words(values, out.codes,
                   [=](float magnitude) { return e2m1_magnitude_sum_below_7(magnitude * multiplier); });
      }
    } else {
      e2m1_words(values, out.codes,
                 [=](float magnitude) { return e2m1_magnitude_sum(magnitude * multiplier); });
    }
  }
  return out;
}

}  // namespace rocep::device
