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

// Quantises one bf16 token row into the dispatch format and stores its payload into `message` and its
// scales, row-major, at `scales` (the message's own, message + payload_bytes, or a copy the caller stores
// there later). `first` is the thread's first vector of the row, loaded by the caller ahead of time.
// Every thread of the block runs the same iterations (quantize_elements shuffles across lanes); lanes past
// the row quantise zeros and store nothing. One vector per step with the next one in flight, not unrolled:
// four staged vectors took the send kernels from 64 to 96 registers on sm_90.
template <Format format>
__device__ inline void quantize_to_message(uint8_t* message, const uint8_t* row, const Shape& shape,
                                           float global_scale, Vector16 first, uint8_t* scales) {
  const auto* vectors = reinterpret_cast<const Vector16*>(row);
  const uint32_t num_vectors = static_cast<uint32_t>(shape.hidden) / kElementsPerThread;
  constexpr int lanes = block_elements(format) / kElementsPerThread;
  constexpr int code_bytes = elements_payload_bytes(format, kElementsPerThread);
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
    uint8_t* scale = scales + static_cast<std::size_t>(v / lanes) * scale_bytes(format);
    if constexpr (format == Format::kFp8Block128) {
      *reinterpret_cast<uint32_t*>(scale) = q.scale;
    } else {
      *scale = static_cast<uint8_t>(q.scale);
    }
  }
}

// The most bytes of a row's fp8 block-128 scales that quantize_rows_to_messages gathers in shared memory
// (hidden up to 16384); a longer row's scales are stored lane by lane.
inline constexpr uint32_t kGatheredScaleBytes = 512;

// Quantises bf16 rows from[i] into messages to[i] (i < count; quantize_to_message) by the whole block,
// kRowsAtOnce rows at a time: the first vectors of a batch's rows are loaded together, so that their
// latencies overlap, and the next batch's rows are asked into L2 before this batch is quantised. No loaded
// vector is held across batches: on sm_90 a use of one waits for every load in flight, the newest included.
// kGatherScales (fp8 block-128): the scales, a word from each lane that holds a block's first elements,
// are gathered in shared memory and stored as whole 16-byte vectors once the batch is quantised (where the
// row's fit kGatheredScaleBytes and its messages' scales are vector-aligned), so that a message that
// crosses the link takes a few full writes for its scales rather than a 4-byte write per block; the
// block's two barriers per batch cost more than that where the quantisation bounds the send.
template <Format format, int kRowsAtOnce, bool kGatherScales = false>
__device__ inline void quantize_rows_to_messages(const uint8_t* const* from, uint8_t* const* to, int count,
                                                 const Shape& shape, float global_scale) {
  static_assert(!kGatherScales || format == Format::kFp8Block128, "gathered scales are whole words");
  const uint32_t vectors = static_cast<uint32_t>(shape.hidden) / kElementsPerThread;
  const bool has_vector = threadIdx.x < vectors;
  __shared__ Vector16
      gathered[kGatherScales ? kRowsAtOnce : 1][kGatherScales ? kGatheredScaleBytes / kVectorBytes : 1];
  const uint32_t row_scale_bytes =
      static_cast<uint32_t>(shape.hidden / block_elements(format) * scale_bytes(format));
  const bool gather =
      kGatherScales && row_scale_bytes <= kGatheredScaleBytes && shape.payload_bytes % kVectorBytes == 0;
#pragma unroll 1
  for (int base = 0; base < count; base += kRowsAtOnce) {
    Vector16 first[kRowsAtOnce];
#pragma unroll
    for (int j = 0; j < kRowsAtOnce; ++j) {
      first[j] = base + j < count && has_vector
                     ? reinterpret_cast<const Vector16*>(from[base + j])[threadIdx.x]
                     : Vector16{};
    }
    for (int j = kRowsAtOnce; j < 2 * kRowsAtOnce && base + j < count; ++j) {
      for (uint32_t v = threadIdx.x; v < vectors; v += blockDim.x) {
        prefetch_to_l2(reinterpret_cast<const Vector16*>(from[base + j]) + v);
      }
    }
    if (gather) {
      __syncthreads();  // the batch before stored its gathered scales
    }
#pragma unroll
    for (int j = 0; j < kRowsAtOnce; ++j) {
      if (base + j < count) {
        quantize_to_message<format>(
            to[base + j], from[base + j], shape, global_scale, first[j],
            gather ? reinterpret_cast<uint8_t*>(gathered[j]) : to[base + j] + shape.payload_bytes);
      }
    }
    if (!gather) {
      continue;
    }
    __syncthreads();  // the batch's scales are gathered
    const int rows = min(kRowsAtOnce, count - base);
    const uint32_t row_vectors = (row_scale_bytes + kVectorBytes - 1) / kVectorBytes;
    for (uint32_t i = threadIdx.x; i < static_cast<uint32_t>(rows) * row_vectors; i += blockDim.x) {
      const uint32_t j = i / row_vectors;
      const uint32_t vector = i - j * row_vectors;
      const uint32_t at = vector * kVectorBytes;
      const Vector16 value = gathered[j][vector];
      uint8_t* scales = to[base + j] + shape.payload_bytes + at;
      if (at + kVectorBytes <= row_scale_bytes) {
        *reinterpret_cast<Vector16*>(scales) = value;
        continue;
      }
      const uint32_t words[4] = {value.x, value.y, value.z, value.w};
#pragma unroll
      for (uint32_t w = 0; w < 4; ++w) {  // fp8 block-128 scales are whole words
        if (at + 4 * w < row_scale_bytes) {
          reinterpret_cast<uint32_t*>(scales)[w] = words[w];
        }
      }
    }
  }
}

}  // namespace rocep::device
