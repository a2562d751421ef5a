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

// Copies `bytes` (a multiple of 16) with the threads [first_thread, first_thread + num_threads) of a block,
// each thread moving every num_threads-th vector, so consecutive threads touch consecutive vectors.
__device__ inline void copy_bytes16(void* destination, const void* source, std::size_t bytes, int thread,
                                    int num_threads) {
  auto* dst = static_cast<Vector16*>(destination);
  const auto* src = static_cast<const Vector16*>(source);
  for (std::size_t i = thread; i < bytes / kVectorBytes; i += num_threads) {
    dst[i] = src[i];
  }
}

}  // namespace rocep::device
