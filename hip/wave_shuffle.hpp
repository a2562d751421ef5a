// Lane exchanges inside one wave, for any wave size (64 on CDNA, 32 on NVIDIA). Every lane of the wave
// must make the call.
#pragma once

#include <cstdint>

#include "platform.hpp"

namespace rocep::device {

// The value `distance` lanes below this one (this lane's own value where there is none).
__device__ inline uint32_t shuffle_up(uint32_t value, int distance) {
#if defined(ROCEP_PLATFORM_AMD)
  return __shfl_up(value, distance, kWaveSize);
#else
  return __shfl_up_sync(0xffffffffu, value, distance);
#endif
}

// The value of lane (this lane ^ mask).
__device__ inline uint32_t shuffle_xor(uint32_t value, int mask) {
#if defined(ROCEP_PLATFORM_AMD)
  return __shfl_xor(value, mask, kWaveSize);
#else
  return __shfl_xor_sync(0xffffffffu, value, mask);
#endif
}

}  // namespace rocep::device
