// A constant-rate device clock for bounding spin-waits in wall time (the shader clock changes with the
// GPU's frequency, so it cannot bound a wait in seconds). The host converts seconds to ticks with
// wall_clock_rate_hz() (host/device.hpp).
#pragma once

#include <cstdint>

#include "platform.hpp"

namespace rocep::device {

__device__ inline uint64_t wall_clock_ticks() {
#if defined(ROCEP_PLATFORM_AMD)
#if defined(__HIP_DEVICE_COMPILE__)
  return __builtin_amdgcn_s_memrealtime();
#else
  return 0;  // the host pass of a HIP compile parses device code but never runs it
#endif
#else
  uint64_t nanoseconds;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(nanoseconds));
  return nanoseconds;
#endif
}

}  // namespace rocep::device
