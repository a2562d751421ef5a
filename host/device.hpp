// Which GPUs this process sees and how fast their wall clocks tick.
#pragma once

#include <cstdint>

#include "rocep/formats.hpp"

namespace rocep {

// Visible GPUs; 0 when there is no device or no driver (callers decide to skip, not fail).
int device_count();
void set_device(int device);
int current_device();
// From enter(device) until it is destroyed, `device` is the calling thread's current device; destroyed, it
// makes current again the device that was current at enter. Runtime errors are ignored: it serves
// destructors. Without enter it does nothing.
class DeviceScope {
 public:
  DeviceScope() = default;
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;
  void enter(int device);

 private:
  int given_back_ = -1;  // the device to make current again; -1: none
};

// Ticks per second of device::wall_clock_ticks() on `device`.
uint64_t wall_clock_rate_hz(int device);
// `requested` unless it is kAuto; then the fp8 encoding `device` computes in: e4m3fnuz on gfx940/941/942
// (MI300 series), e4m3fn on every other GPU.
Fp8Encoding resolve_fp8_encoding(Fp8Encoding requested, int device);

}  // namespace rocep
