// 16-byte vector loads and stores: the widest single access on both CDNA (global_load_dwordx4) and Hopper
// (LDG.128), so a token row moves in the fewest memory transactions.
#pragma once

#include <cstddef>
#include <cstdint>

#include "platform.hpp"

namespace rocep::device {

inline constexpr std::size_t kVectorBytes = 16;
using Vector16 = uint4;

// Copies one 16-byte vector. Both pointers must be 16-byte aligned.
__device__ inline void copy16(void* destination, const void* source) {
  *static_cast<Vector16*>(destination) = *static_cast<const Vector16*>(source);
}

// Copies `bytes` (a multiple of 16) from `source` to each of `count` destinations with the threads
// [thread, ..., num_threads) of a block. Each thread loads kStaged vectors into registers before it stores
// any, so many loads are in flight at once (one load then one store per step leaves the copy waiting on
// memory latency: measured 3x slower on H200), and the source is read once however many copies are made.
inline constexpr int kStaged = 4;

__device__ inline void copy_bytes16_to_many(uint8_t* const* destinations, int count, const void* source,
                                            std::size_t bytes, int thread, int num_threads) {
  const auto* src = static_cast<const Vector16*>(source);
  const std::size_t vectors = bytes / kVectorBytes;
  for (std::size_t first = thread; first < vectors;
       first += static_cast<std::size_t>(kStaged) * num_threads) {
    Vector16 staged[kStaged];
#pragma unroll
    for (int i = 0; i < kStaged; ++i) {
      const std::size_t index = first + static_cast<std::size_t>(i) * num_threads;
      if (index < vectors) {
        staged[i] = src[index];
      }
    }
    for (int d = 0; d < count; ++d) {
      auto* dst = reinterpret_cast<Vector16*>(destinations[d]);
#pragma unroll
      for (int i = 0; i < kStaged; ++i) {
        const std::size_t index = first + static_cast<std::size_t>(i) * num_threads;
        if (index < vectors) {
          dst[index] = staged[i];
        }
      }
    }
  }
}

// One destination.
__device__ inline void copy_bytes16(void* destination, const void* source, std::size_t bytes, int thread,
                                    int num_threads) {
  auto* target = static_cast<uint8_t*>(destination);
  copy_bytes16_to_many(&target, 1, source, bytes, thread, num_threads);
}

}  // namespace rocep::device
