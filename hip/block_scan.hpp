// Exclusive prefix sum over the threads of one block: a shuffle scan inside each wave, then the wave totals
// through shared memory. Written for any wave size (64 on CDNA, 32 on NVIDIA).
#pragma once

#include <cstdint>

#include "platform.hpp"
#include "wave_shuffle.hpp"

namespace rocep::device {

// Every thread of a block of kThreads threads (a multiple of the wave size) calls it. Returns the sum of
// `value` over the threads before this one and stores the block's total in *total. It holds block barriers
// and may be called again in a loop.
template <int kThreads>
__device__ inline uint32_t block_exclusive_scan(uint32_t value, uint32_t* total) {
  constexpr int kWaves = kThreads / kWaveSize;
  __shared__ uint32_t wave_totals[kWaves];
  const int lane = threadIdx.x % kWaveSize;
  const int wave = threadIdx.x / kWaveSize;
  uint32_t inclusive = value;
  for (int distance = 1; distance < kWaveSize; distance *= 2) {
    const uint32_t earlier = shuffle_up(inclusive, distance);
    inclusive += lane >= distance ? earlier : 0u;
  }
  __syncthreads();  // an earlier call may still read wave_totals
  if (lane == kWaveSize - 1) {
    wave_totals[wave] = inclusive;
  }
  __syncthreads();
  uint32_t before = 0;
  uint32_t sum = 0;
  for (int w = 0; w < kWaves; ++w) {
    before += w < wave ? wave_totals[w] : 0u;
    sum += wave_totals[w];
  }
  *total = sum;
  return before + inclusive - value;
}

}  // namespace rocep::device
