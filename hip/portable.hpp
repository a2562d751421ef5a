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

// Threads per wave (AMD) / warp (NVIDIA); never assume 32 in device code. Host code asks the device
// (hipDeviceProp_t::warpSize) instead. rocep's AMD targets are the wave64 CDNA GPUs (MI100 gfx908, MI200
// gfx90a, MI300 gfx940-942, MI350 gfx950), all of which run waves of 64; a device compile of rocep's GPU
// sources (ROCEP_GPU_SOURCE, set by the build) for any other AMD target (RDNA's wave32 among them) stops
// here, since nothing else was ever built or reasoned about. (hipcc also compiles plain host files, such as
// the CPU tests and the benchmark's driver, for a default target whose device side is never used.)
#if defined(ROCEP_GPU_SOURCE) && defined(__HIP_DEVICE_COMPILE__) &&                               \
    !(defined(__gfx908__) || defined(__gfx90a__) || defined(__gfx940__) || defined(__gfx941__) || \
      defined(__gfx942__) || defined(__gfx950__))
#error \
    "rocep's AMD device code supports the wave64 CDNA targets gfx908, gfx90a, gfx940, gfx941, gfx942, gfx950"
#endif
#if defined(__CUDACC__)
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
