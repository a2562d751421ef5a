// Bounded spin-waits on words written by other GPUs. Every wait in rocep goes through here, so none can
// hang: past its deadline it returns false and the caller records a timeout.
#pragma once

#include <cstdint>

#include "atomics.hpp"
#include "device_clock.hpp"

namespace rocep::device {

// Spins until *word >= target (acquire, system scope) or `timeout_ticks` of the wall clock pass. Signal
// words carry sequence numbers that only grow, so ">=" also accepts a peer that is already further on.
// Returns true if the value arrived; every later read of this thread then sees what the writer stored
// before its release.
template <typename T>
__device__ inline bool wait_until_at_least(const T* word, T target, uint64_t timeout_ticks) {
  const uint64_t start = wall_clock_ticks();
  while (load_acquire<Scope::kSystem>(word) < target) {
    if (wall_clock_ticks() - start > timeout_ticks) {
      return false;
    }
  }
  return true;
}

}  // namespace rocep::device
