// One bf16 row quantised into a message by a whole block: the dispatch's in-kernel quantisation of a token,
// and the per-token combine's fp8 partials.
#pragma once

#include <cstddef>
#include <cstdint>

#include "bf16.hpp"
#include "ep_params.hpp"
#include "quantize.hpp"
#include "scale_layout.hpp"
#include "vector_copy.hpp"

namespace rocep::device {

// Stores the scale of scale block `block` of a row into the row's scales, row-major at `scales`: a float32
// (fp8 block-128) or one byte (the other scaled formats).
template <Format format>
__device__ inline void store_block_scale(uint8_t* scales, uint32_t block, uint32_t scale) {
  uint8_t* at = scales + static_cast<std::size_t>(block) * scale_bytes(format);
  if constexpr (format == Format::kFp8Block128) {
    *reinterpret_cast<uint32_t*>(at) = scale;
  } else {
    *at = static_cast<uint8_t>(scale);
  }
}

// Quantises one bf16 token row into the dispatch format and stores it into `message`: the payload, then
// the scales row-major. `first` is the thread's first vector of the row, loaded by the caller ahead of time.
// Every thread of the block runs the same iterations (quantize_elements shuffles across lanes); lanes past
// the row quantise zeros and store nothing. One vector per step with the next one in flight, not unrolled:
// four staged vectors took the send kernels' registers up by half (performance-notes.md, perf-kern-25).
template <Format format>
__device__ inline void quantize_to_message(uint8_t* message, const uint8_t* row, const Shape& shape,
                                           float global_scale, Vector16 first) {
  const auto* vectors = reinterpret_cast<const Vector16*>(row);
  const uint32_t num_vectors = static_cast<uint32_t>(shape.hidden) / kElementsPerThread;
  constexpr int lanes = block_elements(format) / kElementsPerThread;
  constexpr int code_bytes = elements_payload_bytes(format, kElementsPerThread);
  uint8_t* const scales = message + shape.payload_bytes;
  Vector16 next = first;
#pragma unroll 1
  for (uint32_t base = 0; base < num_vectors; base += blockDim.x) {
    const uint32_t v = base + threadIdx.x;
    const Vector16 current = next;
    if (v + blockDim.x < num_vectors) {
      next = vectors[v + blockDim.x];
    }
    float values[kElementsPerThread] = {};
    if (v < num_vectors) {
      const uint32_t words[4] = {current.x, current.y, current.z, current.w};
#pragma unroll
      for (int e = 0; e < kElementsPerThread; ++e) {
        values[e] = rocep::bf16_to_float(static_cast<uint16_t>(words[e / 2] >> (16 * (e % 2))));
      }
    }
    const QuantizedElements<kElementsPerThread> q =
        quantize_elements<format, kElementsPerThread>(values, shape.fp8_encoding, global_scale);
    if (v >= num_vectors) {
      continue;
    }
    if constexpr (code_bytes == 8) {
      *reinterpret_cast<uint2*>(message + static_cast<std::size_t>(v) * code_bytes) =
          uint2{q.codes[0], q.codes[1]};
    } else {
      *reinterpret_cast<uint32_t*>(message + static_cast<std::size_t>(v) * code_bytes) = q.codes[0];
    }
    if (v % lanes != 0) {
      continue;
    }
    store_block_scale<format>(scales, v / lanes, q.scale);
  }
}

// Elements of a slice, what quantize_rows_to_messages gives a thread at a time: two vectors, so that a
// block's amax takes one shuffle fewer, and the block's scale is worked out once per 16 elements, not 8.
inline constexpr int kSliceElements = 2 * kElementsPerThread;

// Quantises bf16 rows from[i] into messages to[i] (i < count; each message the payload, then its scales
// row-major) by a block of kThreads threads. The rows are cut into slices of kSliceElements, numbered row
// after row, and the block takes kSlicesInFlight of them at a time: every thread loads its slices' vectors
// before it quantises any, so that their latencies overlap, and asks the next ones' lines into L2. No
// loaded vector is held across those steps: on sm_90 a use of one waits for every load in flight, the
// newest included. Every thread runs the same steps (quantize_elements shuffles across lanes); a wave past
// the last slice skips its step, and lanes past it quantise zeros and store nothing. fp8 block-128: the
// four scales of each 32 lanes' slices (four whole blocks of one row, where they are) go out as one
// 16-byte store, so that a message crossing the link takes a few full writes for its scales rather than a
// 4-byte write per block.
template <Format format, int kThreads, int kSlicesInFlight>
__device__ inline void quantize_rows_to_messages(const uint8_t* const* from, uint8_t* const* to, int count,
                                                 const Shape& shape, float global_scale) {
  constexpr int kSlices = kSlicesInFlight / kThreads;  // a thread's at once
  static_assert(kSlices >= 1 && kSlicesInFlight % kThreads == 0, "whole slices per thread");
  constexpr int lanes = block_elements(format) / kSliceElements;  // the lanes of one scale block
  static_assert(lanes >= 1 && lanes <= 32 && kWaveSize % 32 == 0, "a block's lanes lie in 32 of one wave");
  constexpr int code_bytes = elements_payload_bytes(format, kSliceElements);
  static_assert(code_bytes == 16 || code_bytes == 8, "a slice's codes are a vector or half of one");
  const auto slices = static_cast<uint32_t>(shape.hidden / kSliceElements);  // per row
  const uint32_t total = static_cast<uint32_t>(count) * slices;
  // This thread's slice of a step, as (row, slice of the row), moves kThreads slices on from one to the next.
  const uint32_t step_rows = kThreads / slices;
  const uint32_t step_slices = kThreads - step_rows * slices;
  const auto advance = [&](uint32_t* row, uint32_t* at) {
    *row += step_rows;
    *at += step_slices;
    if (*at >= slices) {
      *at -= slices;
      ++*row;
    }
  };
  const auto lane = static_cast<uint32_t>(threadIdx.x % 32);
  uint32_t row = threadIdx.x / slices;
  uint32_t at = threadIdx.x - row * slices;
#pragma unroll 1
  for (uint32_t first = threadIdx.x; first - threadIdx.x < total; first += kSlicesInFlight) {
    Vector16 loaded[kSlices][2];
    uint32_t next_row = row;
    uint32_t next_at = at;
#pragma unroll
    for (int i = 0; i < kSlices; ++i) {
      if (first + i * kThreads < total) {
        const auto* vectors = reinterpret_cast<const Vector16*>(from[next_row]) + 2 * next_at;
        loaded[i][0] = vectors[0];
        loaded[i][1] = vectors[1];
      }
      advance(&next_row, &next_at);
    }
    uint32_t ahead_row = next_row;
    uint32_t ahead_at = next_at;
#pragma unroll
    for (int i = 0; i < kSlices; ++i) {  // the next step's lines, one prefetch per 128 bytes
      if (first + kSlicesInFlight + i * kThreads < total && ahead_at % 4 == 0) {
        prefetch_to_l2(reinterpret_cast<const Vector16*>(from[ahead_row]) + 2 * ahead_at);
      }
      advance(&ahead_row, &ahead_at);
    }
#pragma unroll
    for (int i = 0; i < kSlices; ++i) {
      const uint32_t slice = first + i * kThreads;
      if (slice - threadIdx.x % kWaveSize < total) {  // the same in the whole wave
        float values[kSliceElements] = {};
        const bool present = slice < total;
        if (present) {
          const uint32_t words[8] = {loaded[i][0].x, loaded[i][0].y, loaded[i][0].z, loaded[i][0].w,
                                     loaded[i][1].x, loaded[i][1].y, loaded[i][1].z, loaded[i][1].w};
#pragma unroll
          for (int e = 0; e < kSliceElements; ++e) {
            values[e] = rocep::bf16_to_float(static_cast<uint16_t>(words[e / 2] >> (16 * (e % 2))));
          }
        }
        const QuantizedElements<kSliceElements> q =
            quantize_elements<format, kSliceElements>(values, shape.fp8_encoding, global_scale);
        uint8_t* message = present ? to[row] : nullptr;
        if (present) {
          if constexpr (code_bytes == 16) {
            reinterpret_cast<Vector16*>(message)[at] =
                Vector16{q.codes[0], q.codes[1], q.codes[2], q.codes[3]};
          } else {
            reinterpret_cast<uint2*>(message)[at] = uint2{q.codes[0], q.codes[1]};
          }
        }
        uint8_t* scales = present ? message + shape.payload_bytes : nullptr;
        bool own_scale = present && at % lanes == 0;
        if constexpr (format == Format::kFp8Block128) {
          // Lanes 8, 16 and 24 of these 32 hold the next three blocks' scales; the 32 slices are four whole
          // blocks of one row where the first is a multiple of 32 of its row, the row has 32 more, and
          // every slice is present (the same in all 32 lanes).
          const uint32_t second = shuffle_xor(q.scale, 8);
          const uint32_t third = shuffle_xor(q.scale, 16);
          const uint32_t fourth = shuffle_xor(q.scale, 24);
          const uint32_t first_at = at - lane;
          const bool whole = at >= lane && first_at % 32 == 0 && first_at + 32 <= slices &&
                             slice - lane + 32 <= total &&
                             reinterpret_cast<uintptr_t>(scales) % kVectorBytes == 0;
          if (whole) {
            own_scale = false;
            if (lane == 0) {
              reinterpret_cast<Vector16*>(scales)[at / 32] = Vector16{q.scale, second, third, fourth};
            }
          }
        }
        if (own_scale) {
          store_block_scale<format>(scales, at / lanes, q.scale);
        }
      }
      advance(&row, &at);
    }
  }
}

}  // namespace rocep::device
