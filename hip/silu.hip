// Fused SiLU + quantisation: out = encode(silu(gate) * up) for the rows [0, min(row_offsets[num_groups],
// capacity_rows)), the row count read on the device. One kernel per output format:
//
//   rocep_silu_bf16    bf16 rows
//   rocep_silu_fp8     fp8 block-128 (e4m3fn or e4m3fnuz) + float32 scales, transposed [n/128][capacity_rows]
//   rocep_silu_mxfp8   e4m3fn + e8m0 scales [rows][n/32]
//   rocep_silu_mxfp4   e2m1 + e8m0 scales [rows][n/32]
//   rocep_silu_nvfp4   e2m1 + e4m3fn scales in 128x4 tiles, global scale of the row's group
//
// Work: an item is 8 (bf16) or 16 (quantised formats) consecutive output columns of one row; items are
// numbered row-major and a persistent grid strides over them, so the lanes of a wave hold consecutive
// items and a scale block (128, 32 or 16 columns = 8, 2 or 1 items of 16) sits in aligned lanes of one
// wave: its amax is a few xor-shuffles, no shared memory. Sixteen columns halve the per-column share of
// what is done once per item (addresses, the block's amax and scale). Each thread issues the
// loads of kItemsInFlight items (16-byte loads of gate and up) before computing any, and in the plain e2m1
// kernels prefetches its next items into L2 as well. The float math is
// hip/silu_math.hpp, the encoding hip/quantize.hpp (as dispatch), the scale placement
// hip/scale_layout.hpp: the CPU reference (host/silu.cpp) uses the same three, so results match bit for bit.
#include "bf16.hpp"
#include "ep_kernels.hpp"
#include "quantize.hpp"
#include "scale_layout.hpp"
#include "silu_kernels.hpp"
#include "silu_math.hpp"
#include "vector_copy.hpp"

using namespace rocep::device;

namespace {

// Output columns per item: bf16 rows are only a multiple of 8 long, the quantised formats' of 32 or more.
template <Format kFormat>
constexpr int kItemElements = kFormat == Format::kBf16 ? 8 : 16;
// Items whose loads a thread issues before it computes: 2 x 16 bytes of gate and of up per 8 columns, 64
// bytes per thread in flight.
template <Format kFormat>
constexpr int kItemsInFlight = 16 / kItemElements<kFormat>;

// Whether a thread prefetches its next items into L2 (see silu_rows).
template <Format kFormat, bool kInterleaved>
constexpr bool kPrefetchNext = !kInterleaved && (kFormat == Format::kMxfp4 || kFormat == Format::kNvfp4);

// The raw loads of one item of kElements: plain, gate[0..kElements) then up[0..kElements); interleaved,
// g0 u0 g1 u1 ...: kElements / 4 vectors either way.
template <int kElements>
struct GateUp {
  Vector16 vectors[kElements / 4];
};

// The items of one thread, in order: thread t of the grid takes items t, t + grid_threads, ... of the
// row-major [rows][n / kElements] numbering; rows only grow, so the nvfp4 group lookup can walk forward.
// Besides the item's row and chunk (for its scale and group) it keeps the item's place in gate_up and in
// the output, which move by fixed steps: grid_threads items are grid_threads * kElements output elements,
// and in gate_up (2n per row) the same plus n more in the plain layout when the chunk wraps into the next
// row. So no address is worked out again from the row.
template <int kElements, bool kInterleaved>
struct ItemCursor {
  uint32_t row;
  uint32_t chunk;  // columns [kElements * chunk, kElements * chunk + kElements)
  uint32_t chunks_per_row;
  uint32_t step_rows;
  uint32_t step_chunks;
  std::size_t input;  // gate_up element of the item's first load: gate (plain) or its first (g, u) pair
  std::size_t input_step;
  std::size_t output;  // output element of the item's first column
  std::size_t output_step;

  __device__ ItemCursor(uint32_t thread, uint32_t grid_threads, uint32_t chunks)
      : row(thread / chunks),
        chunk(thread % chunks),
        chunks_per_row(chunks),
        step_rows(grid_threads / chunks),
        step_chunks(grid_threads % chunks),
        input(input_offset(row, chunk, chunks)),
        input_step(input_offset(step_rows, step_chunks, chunks)),
        output(static_cast<std::size_t>(thread) * kElements),
        output_step(static_cast<std::size_t>(grid_threads) * kElements) {}
  // Where the item's loads start, or the first item's for an item past the last row (rows > 0 where it
  // is asked): such an item stores nothing, and its lanes hold whole scale blocks of their own, so its
  // values reach no active block's amax.
  __device__ std::size_t input_in_bounds(uint32_t rows) const { return row < rows ? input : 0; }
  __device__ void advance() {
    chunk += step_chunks;
    row += step_rows;
    input += input_step;
    output += output_step;
    if (chunk >= chunks_per_row) {
      chunk -= chunks_per_row;
      ++row;
      input += kInterleaved ? 0 : static_cast<std::size_t>(chunks_per_row) * kElements;  // n
    }
  }
  // Rows of 2n elements; chunks of kElements gate values (plain) or kElements (g, u) pairs (interleaved).
  __device__ static std::size_t input_offset(uint32_t row, uint32_t chunk, uint32_t chunks) {
    return (static_cast<std::size_t>(row) * chunks * 2 + chunk * (kInterleaved ? 2u : 1u)) * kElements;
  }
};

// The group (expert) of a row, for rows visited in increasing order: the first g with
// row < row_offsets[g + 1], never past the last group, so a malformed row_offsets is read in bounds only.
// Walking forward costs one compare per item and at most num_groups loads per thread over the whole call.
struct GroupCursor {
  const uint32_t* row_offsets;
  int32_t last_group;
  int32_t group;
  uint32_t group_end;  // row_offsets[group + 1]

  __device__ GroupCursor(const uint32_t* offsets, int32_t num_groups)
      : row_offsets(offsets), last_group(num_groups - 1), group(0), group_end(offsets[1]) {}
  __device__ int32_t group_of(uint32_t row) {
    while (group < last_group && row >= group_end) {
      ++group;
      group_end = row_offsets[group + 1];
    }
    return group;
  }
};

// The item whose first load is gate_up[input]: plain, the gate's kElements values there and the up's n
// further on; interleaved, 2 * kElements values there.
template <int kElements, bool kInterleaved>
__device__ inline GateUp<kElements> load_gate_up(const uint16_t* gate_up, std::size_t input, int n) {
  GateUp<kElements> loaded;
  const auto* first = reinterpret_cast<const Vector16*>(gate_up + input);
  const auto* up = reinterpret_cast<const Vector16*>(gate_up + input + n);
#pragma unroll
  for (int v = 0; v < kElements / 4; ++v) {
    loaded.vectors[v] = kInterleaved || v < kElements / 8 ? first[v] : up[v - kElements / 8];
  }
  return loaded;
}

// 32-bit word w (0..3) of a vector. The loads are taken apart with word selects and shifts, not through a
// uint16_t pointer into the vector: hipcc kept such arrays in scratch memory (80-96 bytes per lane).
__device__ inline uint32_t vector_word(const Vector16& vector, int w) {
  return w == 0 ? vector.x : (w == 1 ? vector.y : (w == 2 ? vector.z : vector.w));
}

// bf16 element i (0..7) of a vector, as float32 (element 2w in the low half of word w).
__device__ inline float bf16_element(const Vector16& vector, int i) {
  const uint32_t word = vector_word(vector, i / 2);
  return bits_float(i % 2 == 0 ? word << 16 : word & 0xffff0000u);
}

template <int kElements, bool kInterleaved, bool kClamp>
__device__ inline void silu_values(const GateUp<kElements>& loaded, float clamp_limit,
                                   float (&values)[kElements]) {
#pragma unroll
  for (int step = 0; step < kElements; ++step) {
    // An order in which the first steps use every loaded vector: interleaved 0, s, 2s, 3s, 1, s + 1, ...
    // (s = kElements / 4), plain 0, h, 1, h + 1, ... (h = kElements / 2). In the interleaved layout the
    // compiler then issues all the item's loads before the math (in element order it issued half of them
    // after the first elements' math: performance-notes.md, perf-kern-17); in the plain one it still issues
    // the up loads after the gate's silu (see the prefetch in silu_rows).
    const int i =
        kInterleaved ? (step % 4) * (kElements / 4) + step / 4 : (step % 2) * (kElements / 2) + step / 2;
    // Plain: g_i is element i % 8 of vector i / 8, u_i of vector kElements / 8 + i / 8. Interleaved:
    // (g_i, u_i) is word i % 4 of vector i / 4.
    float g = kInterleaved ? bf16_element(loaded.vectors[i / 4], 2 * (i % 4))
                           : bf16_element(loaded.vectors[i / 8], i % 8);
    float u = kInterleaved ? bf16_element(loaded.vectors[i / 4], 2 * (i % 4) + 1)
                           : bf16_element(loaded.vectors[kElements / 8 + i / 8], i % 8);
    if (kClamp) {
      g = clamp_gate(g, clamp_limit);
      u = clamp_up(u, clamp_limit);
    }
    values[i] = silu_product(g, u);
  }
}

// Encodes one item of `values`, whose first column is output element `first_element` (row-major), and
// stores it (and its block's scale, from the block's first lane) when `active`; every lane of the wave
// calls it.
template <Format kFormat, Fp8 kFp8>
__device__ inline void store_item(const SiluParams& params, const float (&values)[kItemElements<kFormat>],
                                  bool active, uint32_t row, uint32_t chunk, std::size_t first_element,
                                  float global_scale) {
  constexpr int kElements = kItemElements<kFormat>;
  constexpr bool kFourBit = elements_payload_bytes(kFormat, 2) == 1;
  uint8_t* payload =
      params.out + (kFourBit ? first_element / 2 : first_element * elements_payload_bytes(kFormat, 1));
  if constexpr (kFormat == Format::kBf16) {
    uint32_t words[kElements / 2];
#pragma unroll
    for (int w = 0; w < kElements / 2; ++w) {
      words[w] = rocep::float_pair_to_bf16_canonical(values[2 * w], values[2 * w + 1]);
    }
    if (active) {
      *reinterpret_cast<Vector16*>(payload) = Vector16{words[0], words[1], words[2], words[3]};
    }
  } else {
    constexpr int kLanes = block_elements(kFormat) / kElements;
    const QuantizedElements<kElements> quantized =
        quantize_elements<kFormat, kElements>(values, kFp8, global_scale);
    if (!active) {
      return;
    }
    const uint32_t* codes = quantized.codes;
    if constexpr (elements_payload_bytes(kFormat, kElements) == 8) {
      *reinterpret_cast<uint2*>(payload) = uint2{codes[0], codes[1]};
    } else {
      *reinterpret_cast<Vector16*>(payload) = Vector16{codes[0], codes[1], codes[2], codes[3]};
    }
    if (chunk % kLanes == 0) {
      uint8_t* scale_slot = params.out_scales + scale_offset(kFormat, row, static_cast<int>(chunk / kLanes),
                                                             params.capacity_rows, params.n);
      if constexpr (kFormat == Format::kFp8Block128) {
        *reinterpret_cast<uint32_t*>(scale_slot) = quantized.scale;
      } else {
        *scale_slot = static_cast<uint8_t>(quantized.scale);
      }
    }
  }
}

template <Format kFormat, Fp8 kFp8, bool kInterleaved, bool kClamp>
__device__ void silu_rows(const SiluParams& params) {
  constexpr int kElements = kItemElements<kFormat>;
  constexpr int kInFlight = kItemsInFlight<kFormat>;
  const std::size_t row_count = params.row_offsets[params.num_groups];
  const auto rows =
      static_cast<uint32_t>(row_count < params.capacity_rows ? row_count : params.capacity_rows);
  const uint32_t chunks_per_row = static_cast<uint32_t>(params.n) / kElements;
  const uint32_t grid_threads = gridDim.x * blockDim.x;
  // The same trip count in every thread, so every lane of a wave reaches every shuffle.
  const uint64_t items = static_cast<uint64_t>(rows) * chunks_per_row;
  const uint64_t items_per_iteration = static_cast<uint64_t>(grid_threads) * kInFlight;
  const uint64_t iterations = (items + items_per_iteration - 1) / items_per_iteration;
  ItemCursor<kElements, kInterleaved> cursor(blockIdx.x * blockDim.x + threadIdx.x, grid_threads,
                                             chunks_per_row);
  GroupCursor groups(params.row_offsets, params.num_groups);

  for (uint64_t iteration = 0; iteration < iterations; ++iteration) {
    GateUp<kElements> loaded[kInFlight];
    uint32_t row[kInFlight];
    uint32_t chunk[kInFlight];
    std::size_t output[kInFlight];
#pragma unroll
    for (int k = 0; k < kInFlight; ++k) {
      row[k] = cursor.row;
      chunk[k] = cursor.chunk;
      output[k] = cursor.output;
      loaded[k] =
          load_gate_up<kElements, kInterleaved>(params.gate_up, cursor.input_in_bounds(rows), params.n);
      cursor.advance();
    }
    // Plain e2m1 formats: the next iteration's items into L2 while this one computes. The compiler issues
    // an item's up loads only once the gate's silu is done, so without it the thread waits on HBM twice
    // per item; these kernels are bound by instruction issue, and the wait shows. The other formats'
    // kernels spend the prefetch's issue slots and traffic for nothing or less than nothing, and the
    // interleaved layout loads its item at once anyway (performance-notes.md, perf-kern-18).
    if constexpr (kPrefetchNext<kFormat, kInterleaved>) {
      static_assert(kInFlight == 1, "the cursor's item is the next iteration's only item");
      const std::size_t next = cursor.input_in_bounds(rows);
      prefetch_to_l2(params.gate_up + next);
      prefetch_to_l2(params.gate_up + next + params.n);
    }
#pragma unroll
    for (int k = 0; k < kInFlight; ++k) {
      const bool active = row[k] < rows;
      float values[kElements];
      silu_values<kElements, kInterleaved, kClamp>(loaded[k], params.clamp_limit, values);
      float global_scale = 0.0f;
      if constexpr (kFormat == Format::kNvfp4) {
        if (active) {
          global_scale = params.global_scales[groups.group_of(row[k])];
        }
      }
      store_item<kFormat, kFp8>(params, values, active, row[k], chunk[k], output[k], global_scale);
    }
  }
}

// The four layout / clamp variants of one format, picked once per launch.
template <Format kFormat, Fp8 kFp8>
__device__ void silu_variants(const SiluParams& params) {
  const bool clamp = params.clamp_limit > 0.0f;
  if (params.interleaved) {
    clamp ? silu_rows<kFormat, kFp8, true, true>(params) : silu_rows<kFormat, kFp8, true, false>(params);
  } else {
    clamp ? silu_rows<kFormat, kFp8, false, true>(params) : silu_rows<kFormat, kFp8, false, false>(params);
  }
}

}  // namespace

extern "C" __global__ void __launch_bounds__(kBlockThreads) rocep_silu_bf16(SiluParams params) {
  silu_variants<Format::kBf16, Fp8::kE4m3fn>(params);
}

extern "C" __global__ void __launch_bounds__(kBlockThreads) rocep_silu_fp8(SiluParams params) {
  if (params.fp8 == Fp8::kE4m3fnuz) {
    silu_variants<Format::kFp8Block128, Fp8::kE4m3fnuz>(params);
  } else {
    silu_variants<Format::kFp8Block128, Fp8::kE4m3fn>(params);
  }
}

extern "C" __global__ void __launch_bounds__(kBlockThreads) rocep_silu_mxfp8(SiluParams params) {
  silu_variants<Format::kMxfp8, Fp8::kE4m3fn>(params);
}

extern "C" __global__ void __launch_bounds__(kBlockThreads) rocep_silu_mxfp4(SiluParams params) {
  silu_variants<Format::kMxfp4, Fp8::kE4m3fn>(params);
}

extern "C" __global__ void __launch_bounds__(kBlockThreads) rocep_silu_nvfp4(SiluParams params) {
  silu_variants<Format::kNvfp4, Fp8::kE4m3fn>(params);
}

namespace rocep::device {

hipError_t load_silu_kernels(int* resident_blocks) {
  return load_kernels(
      {reinterpret_cast<const void*>(&rocep_silu_bf16), reinterpret_cast<const void*>(&rocep_silu_fp8),
       reinterpret_cast<const void*>(&rocep_silu_mxfp8), reinterpret_cast<const void*>(&rocep_silu_mxfp4),
       reinterpret_cast<const void*>(&rocep_silu_nvfp4)},
      resident_blocks);
}

// Blocks for `params`: enough for every item of capacity_rows once, at most `max_blocks`.
template <Format kFormat>
int silu_blocks(const SiluParams& params, int max_blocks) {
  const uint64_t items = static_cast<uint64_t>(params.capacity_rows) * (params.n / kItemElements<kFormat>);
  const uint64_t items_per_block = static_cast<uint64_t>(kBlockThreads) * kItemsInFlight<kFormat>;
  return static_cast<int>(
      std::max<uint64_t>(1, std::min<uint64_t>(max_blocks, (items + items_per_block - 1) / items_per_block)));
}

void launch_silu(const SiluParams& params, int max_blocks, hipStream_t stream) {
  switch (params.format) {
    case Format::kBf16:
      rocep_silu_bf16<<<silu_blocks<Format::kBf16>(params, max_blocks), kBlockThreads, 0, stream>>>(params);
      break;
    case Format::kFp8Block128:
      rocep_silu_fp8<<<silu_blocks<Format::kFp8Block128>(params, max_blocks), kBlockThreads, 0, stream>>>(
          params);
      break;
    case Format::kMxfp8:
      rocep_silu_mxfp8<<<silu_blocks<Format::kMxfp8>(params, max_blocks), kBlockThreads, 0, stream>>>(params);
      break;
    case Format::kMxfp4:
      rocep_silu_mxfp4<<<silu_blocks<Format::kMxfp4>(params, max_blocks), kBlockThreads, 0, stream>>>(params);
      break;
    case Format::kNvfp4:
      rocep_silu_nvfp4<<<silu_blocks<Format::kNvfp4>(params, max_blocks), kBlockThreads, 0, stream>>>(params);
      break;
  }
}

}  // namespace rocep::device
