#include "device.hpp"

#include <cstring>

#include "gpu_check.hpp"

namespace rocep {

int device_count() {
  int count = 0;
  if (hipGetDeviceCount(&count) != hipSuccess) {
    (void)hipGetLastError();
    return 0;
  }
  return count;
}

void set_device(int device) {
  ROCEP_GPU_CHECK(hipSetDevice(device));
}

int current_device() {
  int device = 0;
  ROCEP_GPU_CHECK(hipGetDevice(&device));
  return device;
}

void DeviceScope::enter(int device) {
  int current = -1;
  if (hipGetDevice(&current) == hipSuccess && current != device && hipSetDevice(device) == hipSuccess) {
    given_back_ = current;
  }
}

DeviceScope::~DeviceScope() {
  if (given_back_ >= 0) {
    (void)hipSetDevice(given_back_);
  }
}

uint64_t wall_clock_rate_hz(int device) {
#if defined(ROCEP_PLATFORM_NVIDIA)
  (void)device;
  return 1'000'000'000;  // %globaltimer counts nanoseconds
#elif HIP_VERSION_MAJOR >= 6
  int kilohertz = 0;
  ROCEP_GPU_CHECK(hipDeviceGetAttribute(&kilohertz, hipDeviceAttributeWallClockRate, device));
  return static_cast<uint64_t>(kilohertz) * 1000;
#else
  // ROCm 5 cannot report it; s_memrealtime runs at a constant 100 MHz on CDNA2 and CDNA3.
  (void)device;
  return 100'000'000;
#endif
}

Fp8Encoding resolve_fp8_encoding(Fp8Encoding requested, int device) {
  if (requested != Fp8Encoding::kAuto) {
    return requested;
  }
#if defined(ROCEP_PLATFORM_AMD)
  hipDeviceProp_t properties;
  ROCEP_GPU_CHECK(hipGetDeviceProperties(&properties, device));
  for (const char* fnuz_target : {"gfx940", "gfx941", "gfx942"}) {
    if (std::strncmp(properties.gcnArchName, fnuz_target, std::strlen(fnuz_target)) == 0) {
      return Fp8Encoding::kE4m3fnuz;
    }
  }
#else
  (void)device;
#endif
  return Fp8Encoding::kE4m3fn;
}

}  // namespace rocep
