// 16-byte vector loads and stores: the widest single access on both CDNA (global_load_dwordx4) and Hopper
// (LDG.128), so a token row moves in the fewest memory transactions.
#pragma once

#include <cstddef>
#include <cstdint>

#include "platform.hpp"

namespace rocep::device {

inline constexpr std::size_t kVectorBytes = 16;
using Vector16 = uint4;

// Asks for the memory at `address` to be brought into L2 without waiting for it or holding a register:
// a later load of it then waits for L2, not for HBM. NVIDIA only (prefetch.global.L2); on AMD it does
// nothing (CDNA 3 has no prefetch instruction).
__device__ inline void prefetch_to_l2(const void* address) {
#if defined(__CUDA_ARCH__)
  asm volatile("prefetch.global.L2 [%0];" ::"l"(address));
#else
  (void)address;
#endif
}

// Each thread loads kStaged vectors into registers before it stores any, so many loads are in flight at once
// (one load then one store per step leaves a copy waiting on memory latency: performance-notes.md,
// perf-kern-23).
inline constexpr int kStaged = 4;

// kStaged vectors of one thread, `num_threads` apart, starting at vector `first`: the unit every copy below
// loads into registers before it stores any of them.
struct StagedVectors {
  Vector16 vector[kStaged];

  __device__ void load(const void* source, std::size_t first, std::size_t vectors, int num_threads) {
    const auto* src = static_cast<const Vector16*>(source);
#pragma unroll
    for (int i = 0; i < kStaged; ++i) {
      const std::size_t index = first + static_cast<std::size_t>(i) * num_threads;
      if (index < vectors) {
        vector[i] = src[index];
      }
    }
  }
  __device__ void store(void* destination, std::size_t first, std::size_t vectors, int num_threads) const {
    auto* dst = static_cast<Vector16*>(destination);
#pragma unroll
    for (int i = 0; i < kStaged; ++i) {
      const std::size_t index = first + static_cast<std::size_t>(i) * num_threads;
      if (index < vectors) {
        dst[index] = vector[i];
      }
    }
  }
};

// Copies `bytes` (a multiple of 16) from `source` to each of `count` destinations with the threads
// [thread, ..., num_threads) of a block, the source read once however many copies are made. `head` is the
// thread's first StagedVectors of the source (at vector `thread`), loaded by the caller ahead of time so
// that its latency overlaps whatever the caller did meanwhile.
__device__ inline void copy_bytes16_to_many(uint8_t* const* destinations, int count, const void* source,
                                            std::size_t bytes, int thread, int num_threads,
                                            const StagedVectors& head) {
  const std::size_t vectors = bytes / kVectorBytes;
  const std::size_t step = static_cast<std::size_t>(kStaged) * num_threads;
  for (int d = 0; d < count; ++d) {
    head.store(destinations[d], thread, vectors, num_threads);
  }
  for (std::size_t first = thread + step; first < vectors; first += step) {
    StagedVectors staged;
    staged.load(source, first, vectors, num_threads);
    for (int d = 0; d < count; ++d) {
      staged.store(destinations[d], first, vectors, num_threads);
    }
  }
}

// One destination, nothing loaded ahead. Written out rather than through StagedVectors: that form cost the
// combine kernels a resident block per multiprocessor (performance-notes.md, perf-kern-24).
__device__ inline void copy_bytes16(void* destination, const void* source, std::size_t bytes, int thread,
                                    int num_threads) {
  const auto* src = static_cast<const Vector16*>(source);
  auto* dst = static_cast<Vector16*>(destination);
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
#pragma unroll
    for (int i = 0; i < kStaged; ++i) {
      const std::size_t index = first + static_cast<std::size_t>(i) * num_threads;
      if (index < vectors) {
        dst[index] = staged[i];
      }
    }
  }
}

// The threads that copy one row of `vectors` 16-byte vectors in copy_rows and copy_row_part: whole waves,
// as many as take kInFlight vectors each, at most the block.
template <int kInFlight>
__device__ inline int row_copy_threads(uint32_t vectors) {
  const int wanted = static_cast<int>((vectors + kInFlight - 1) / kInFlight);
  return min((wanted + kWaveSize - 1) / kWaveSize * kWaveSize, static_cast<int>(blockDim.x));
}

// Vectors [first, end) of a row whose vectors below `split` go to `head` and the others to `tail` from
// `split` on (a message's payload and scales, stored into two rows), `step` apart per thread from the
// thread's `lane`, each thread loading its kInFlight vectors of both parts before it stores any: where the
// row fits the threads' loads, one round trip of the memory (or the link) copies both parts.
template <int kInFlight>
__device__ inline void copy_split_row(const Vector16* source, Vector16* head, Vector16* tail, uint32_t split,
                                      uint32_t first, uint32_t end, uint32_t lane, uint32_t step) {
  // Vector `index` past the split lies `beyond` bytes further from head + index than it would in head.
  const auto beyond =
      static_cast<uintptr_t>(reinterpret_cast<uintptr_t>(tail) - reinterpret_cast<uintptr_t>(head + split));
  for (uint32_t at = first + lane; at < end; at += kInFlight * step) {
    Vector16 staged[kInFlight];
#pragma unroll
    for (int i = 0; i < kInFlight; ++i) {
      if (at + i * step < end) {
        staged[i] = source[at + i * step];
      }
    }
#pragma unroll
    for (int i = 0; i < kInFlight; ++i) {
      const uint32_t index = at + i * step;
      if (index < end) {
        *reinterpret_cast<Vector16*>(reinterpret_cast<uintptr_t>(head + index) +
                                     (index < split ? 0 : beyond)) = staged[i];
      }
    }
  }
}

// Vectors [first, end) of a row, `step` apart per thread from the thread's `lane`, each thread loading
// kInFlight vectors before it stores any of them.
template <int kInFlight>
__device__ inline void copy_row_part(const Vector16* source, Vector16* destination, uint32_t first,
                                     uint32_t end, uint32_t lane, uint32_t step) {
  copy_split_row<kInFlight>(source, destination, destination, end, first, end, lane, step);
}

// Copies `count` rows of `vectors` 16-byte vectors each, from[i] to to[i] (shared memory), with every
// thread of the block. Each row is copied by a group of threads (whole waves: as many as take kInFlight
// vectors each, at most the block), each thread loading its kInFlight vectors before it stores any of them,
// so that a block keeps about kInFlight x 16 bytes per thread in flight however short the rows (what a grid
// of few blocks needs to keep a link or HBM busy); with fewer rows than groups, each row is cut into as
// many parts as keep the groups busy. A thread's vectors are a fixed stride apart: no division, and no
// lookup of its row, per vector.
template <int kInFlight>
__device__ void copy_rows(const uint8_t* const* from, uint8_t* const* to, int count, uint32_t vectors) {
  const int row_threads = row_copy_threads<kInFlight>(vectors);
  const int groups = static_cast<int>(blockDim.x) / row_threads;
  const int group = static_cast<int>(threadIdx.x) / row_threads;
  if (count <= 0 || group >= groups) {
    return;  // nothing to copy, or the threads past the last whole group
  }
  int parts = 1;
  while (parts * 2 * count <= groups) {
    parts *= 2;
  }
  const auto lane = static_cast<uint32_t>(threadIdx.x) % static_cast<uint32_t>(row_threads);
  const auto step = static_cast<uint32_t>(row_threads);
  for (int unit = group; unit < count * parts; unit += groups) {
    const int row = unit / parts;
    const auto part = static_cast<uint32_t>(unit - row * parts);
    copy_row_part<kInFlight>(reinterpret_cast<const Vector16*>(from[row]),
                             reinterpret_cast<Vector16*>(to[row]),
                             part * vectors / static_cast<uint32_t>(parts),
                             (part + 1) * vectors / static_cast<uint32_t>(parts), lane, step);
  }
}

}  // namespace rocep::device
