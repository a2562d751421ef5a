// bf16 <-> float32 conversion, shared bit for bit by the kernels and the CPU reference.
#pragma once

#include <cstdint>

#include "portable.hpp"

namespace rocep {

ROCEP_HOST_DEVICE inline float bf16_to_float(uint16_t bits) {
  return device::bits_float(static_cast<uint32_t>(bits) << 16);
}

// Round to nearest, ties to even. NaN stays NaN (quieted, sign kept); overflow rounds to infinity as IEEE
// rounding does.
ROCEP_HOST_DEVICE inline uint16_t float_to_bf16(float value) {
  const uint32_t word = device::float_bits(value);
  if ((word & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>((word >> 16) | 0x0040u);
  }
  const uint32_t rounding_bias = 0x7fffu + ((word >> 16) & 1u);
  return static_cast<uint16_t>((word + rounding_bias) >> 16);
}

}  // namespace rocep
