// Qualifiers and constants shared by device code and by plain C++ (the CPU reference is built without a GPU
// compiler, so nothing here may need the GPU runtime).
#pragma once

#include <cstdint>

// Set in builds with a GPU platform (the build defines ROCEP_PLATFORM_AMD or ROCEP_PLATFORM_NVIDIA).
#if defined(ROCEP_PLATFORM_AMD) || defined(ROCEP_PLATFORM_NVIDIA)
#define ROCEP_GPU_BUILD 1
#endif

#if defined(__HIPCC__) || defined(__CUDACC__)
#define ROCEP_HOST_DEVICE __host__ __device__
#define ROCEP_DEVICE __device__
#else
#define ROCEP_HOST_DEVICE
#define ROCEP_DEVICE
#endif

namespace rocep::device {

// Threads per wave (AMD) / warp (NVIDIA). CDNA runs waves of 64 and the compiler says so per target;
// never assume 32 in device code. Host code asks the device (hipDeviceProp_t::warpSize) instead.
#if defined(__AMDGCN_WAVEFRONT_SIZE)
inline constexpr int kWaveSize = __AMDGCN_WAVEFRONT_SIZE;
#elif defined(__CUDACC__)
inline constexpr int kWaveSize = 32;
#else
inline constexpr int kWaveSize = 64;
#endif

// The bits of a float32 and back.
ROCEP_HOST_DEVICE inline uint32_t float_bits(float value) {
  uint32_t bits;
  __builtin_memcpy(&bits, &value, sizeof bits);
  return bits;
}
ROCEP_HOST_DEVICE inline float bits_float(uint32_t bits) {
  float value;
  __builtin_memcpy(&value, &bits, sizeof value);
  return value;
}

}  // namespace rocep::device
