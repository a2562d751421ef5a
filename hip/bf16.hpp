// bf16 <-> float32 conversion, shared bit for bit by the kernels and the CPU reference.
#pragma once

#include <cstdint>

#include "portable.hpp"

namespace rocep {

ROCEP_HOST_DEVICE inline float bf16_to_float(uint16_t bits) {
  return device::bits_float(static_cast<uint32_t>(bits) << 16);
}

// Round to nearest, ties to even. NaN stays NaN (quieted, sign kept); overflow rounds to infinity as IEEE
// rounding does. Both results are computed and one selected, with no branch: on AMD the branch of a
// divergent `if` costs exec-mask instructions per element (CDNA has no bf16 conversion before gfx950), and
// the combine receive on a small budget is bound by its instructions.
ROCEP_HOST_DEVICE inline uint16_t float_to_bf16(float value) {
  const uint32_t word = device::float_bits(value);
  const uint32_t rounded = word + 0x7fffu + ((word >> 16) & 1u);
  return static_cast<uint16_t>((value != value ? word | 0x00400000u : rounded) >> 16);
}

// The NaN that SiLU outputs store: float32 0x7fffffff, whose bf16 is 0x7fff, CUDA's canonical bf16 NaN and
// what NVIDIA's conversion instruction stores for every NaN. NaN bits from arithmetic differ between x86
// (sign set), NVIDIA and AMD; a canonical one keeps bf16 outputs identical everywhere. The quantised formats
// need no such step: a NaN anywhere makes its whole block NaN, whatever its bits.
inline constexpr uint32_t kCanonicalNanBits = 0x7fffffffu;

// `value`, or the canonical NaN for any NaN.
ROCEP_HOST_DEVICE inline float canonical_nan(float value) {
  return value != value ? device::bits_float(kCanonicalNanBits) : value;
}

// bf16 of canonical_nan(low) in bits 0-15 and of canonical_nan(high) in bits 16-31. NVIDIA sm_80 and later
// convert the pair in one instruction (round to nearest even, every NaN to 0x7fff: the same bits; the
// GPU tests hold it to the CPU reference); elsewhere float_to_bf16.
ROCEP_HOST_DEVICE inline uint32_t float_pair_to_bf16_canonical(float low, float high) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint32_t pair;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(pair) : "f"(high), "f"(low));
  return pair;
#else
  return float_to_bf16(canonical_nan(low)) |
         (static_cast<uint32_t>(float_to_bf16(canonical_nan(high))) << 16);
#endif
}

}  // namespace rocep
