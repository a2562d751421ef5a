// Which GPUs this process sees and how fast their wall clocks tick.
#pragma once

#include <cstdint>

namespace rocep {

// Visible GPUs; 0 when there is no device or no driver (callers decide to skip, not fail).
int device_count();
void set_device(int device);
int current_device();
// Ticks per second of device::wall_clock_ticks() on `device`.
uint64_t wall_clock_rate_hz(int device);

}  // namespace rocep
