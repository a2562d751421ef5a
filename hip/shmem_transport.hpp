// The SHMEM transport's primitives for peers on other nodes (docs/scale-out.md), the calls a PeerTransport
// over the engine is built from: a block of bytes put to a peer with a signal on the same connection, and a
// bounded wait for a signal word. Compiled only into builds with an engine (ROCEP_SHMEM).
#pragma once

#include <cstddef>
#include <cstdint>

#include "platform.hpp"

namespace rocep::device {

// Puts [source, source + bytes) (symmetric memory of this PE) to `destination` (symmetric) on PE `pe`, then
// adds `value` to `signal` (symmetric, a 64-bit word) on `pe`, ordered after the bytes; returns once issued,
// the bytes then in flight. One block of kBlockThreads, on `stream`. Returns the launch's status.
hipError_t launch_shmem_put_signal(void* destination, const void* source, std::size_t bytes, uint64_t* signal,
                                   uint64_t value, int pe, hipStream_t stream);

// Waits on the device until this PE's `signal` reaches `expected` or `timeout_ticks` of the device wall
// clock (hip/device_clock.hpp) pass; stores 1 into *timed_out (device memory) on a timeout, else 0.
hipError_t launch_shmem_wait_signal(uint64_t* signal, uint64_t expected, uint64_t timeout_ticks,
                                    int* timed_out, hipStream_t stream);

}  // namespace rocep::device
