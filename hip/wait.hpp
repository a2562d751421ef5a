// Bounded spin-waits on flags written by other GPUs. Every wait in rocep goes through here, so none can
// hang: past its deadline it returns false and the caller records a timeout.
#pragma once

#include <cstdint>

#include "atomics.hpp"
#include "device_clock.hpp"

namespace rocep::device {

// Spins until *flag == expected (acquire, system scope) or `timeout_ticks` of the wall clock pass.
// Returns true if the value arrived; every later read of this thread then sees what the writer stored
// before its release.
template <typename T>
__device__ inline bool wait_for_value(const T* flag, T expected, uint64_t timeout_ticks) {
  const uint64_t start = wall_clock_ticks();
  while (load_acquire<Scope::kSystem>(flag) != expected) {
    if (wall_clock_ticks() - start > timeout_ticks) {
      return false;
    }
  }
  return true;
}

}  // namespace rocep::device
