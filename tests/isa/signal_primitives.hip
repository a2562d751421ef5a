// The cross-GPU signalling primitives of hip/atomics.hpp and hip/wait.hpp, each in the message-passing
// pattern rocep uses it in (payload, then signal; signal, then payload), one kernel each, so that
// tests/isa/check_isa.py can read what they compile to on the AMD targets; that file states the expected
// sequences and what each guarantees. Compiled to assembly only, never run.
#include <cstdint>

#include "hip/wait.hpp"

using namespace rocep::device;

// Sender: payload stores, then the flag's release store.
extern "C" __global__ void isa_store_release_system(uint64_t* payload, uint64_t* flag, uint64_t value) {
  payload[threadIdx.x] = value;
  store_release<Scope::kSystem>(flag, value);
}

// Receiver: the flag's acquire load, then payload loads.
extern "C" __global__ void isa_load_acquire_system(const uint64_t* flag, const uint64_t* payload,
                                                   uint64_t* out) {
  const uint64_t seen = load_acquire<Scope::kSystem>(flag);
  out[threadIdx.x] = payload[threadIdx.x] + seen;
}

// Sender as signal_grid_done does it: payload stores, one system fence, then relaxed arrival adds.
extern "C" __global__ void isa_fence_then_arrival_add(uint64_t* payload, uint64_t* arrivals, uint64_t value) {
  payload[threadIdx.x] = value;
  fence_acq_rel_system();
  add_relaxed_system(arrivals, uint64_t{1});
}

// The arrival add alone: a system-scope atomic that returns nothing.
extern "C" __global__ void isa_add_relaxed_system(uint64_t* arrivals, uint64_t value) {
  add_relaxed_system(arrivals, value);
}

// Receiver's bounded wait on an arrival word, then payload loads.
extern "C" __global__ void isa_wait_until_at_least(const uint64_t* arrivals, uint64_t target,
                                                   uint64_t timeout_ticks, const uint64_t* payload,
                                                   uint64_t* out) {
  if (wait_until_at_least(arrivals, target, timeout_ticks)) {
    out[threadIdx.x] = payload[threadIdx.x];
  }
}
