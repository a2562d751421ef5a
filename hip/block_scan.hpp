// Exclusive prefix sum over the threads of one block, through shared memory: no wave intrinsics, so the
// same code is right for waves of 64 (CDNA) and warps of 32 (NVIDIA).
#pragma once

#include <cstdint>

#include "platform.hpp"

namespace rocep::device {

inline constexpr int kScanBlockThreads = 256;

// Every thread of a block of kScanBlockThreads threads calls it. Returns the sum of `value` over the
// threads before this one and stores the block's total in *total. Starts and ends with a barrier, so
// it may be called again in a loop.
__device__ inline uint32_t block_exclusive_scan(uint32_t value, uint32_t* total) {
  __shared__ uint32_t partial[kScanBlockThreads];
  const int thread = threadIdx.x;
  __syncthreads();
  partial[thread] = value;
  // Hillis-Steele inclusive scan: log2(block) steps.
  for (int distance = 1; distance < kScanBlockThreads; distance *= 2) {
    __syncthreads();
    const uint32_t earlier = thread >= distance ? partial[thread - distance] : 0;
    __syncthreads();
    partial[thread] += earlier;
  }
  __syncthreads();
  *total = partial[kScanBlockThreads - 1];
  const uint32_t inclusive = partial[thread];
  __syncthreads();
  return inclusive - value;
}

}  // namespace rocep::device
