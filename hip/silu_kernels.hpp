// Parameters and launcher of the fused SiLU + quantisation kernels (hip/silu.hip). Host code checks the
// arguments, fills SiluParams and calls launch_silu; the kernels read the row count on the device.
#pragma once

#include <cstddef>
#include <cstdint>

#include "codecs.hpp"
#include "platform.hpp"

namespace rocep::device {

struct SiluParams {
  const uint16_t* gate_up;      // bf16 [capacity_rows][2 * n]
  uint8_t* out;                 // [capacity_rows][payload bytes of n elements]
  uint8_t* out_scales;          // the format's scale layout for capacity_rows rows (unused for bf16)
  const uint32_t* row_offsets;  // [num_groups + 1]; rows = min(row_offsets[num_groups], capacity_rows)
  const float* global_scales;   // [num_groups] (nvfp4)
  std::size_t capacity_rows;    // below 2^31 (checked by the host), so row indices fit 32 bits
  int32_t num_groups;
  int32_t n;  // output columns, a multiple of the format's block (8 for bf16)
  Format format;
  Fp8 fp8;  // the resolved encoding of fp8 block-128
  bool interleaved;
  float clamp_limit;  // > 0: SwiGLU clamp
};

// Loads every SiLU kernel and lowers *resident_blocks to the fewest blocks of kBlockThreads that any of
// them keeps resident on one multiprocessor. Returns the runtime's status.
hipError_t load_silu_kernels(int* resident_blocks);
// Launches the kernel of params.format on at most `max_blocks` blocks of kBlockThreads (fewer when
// capacity_rows leaves some without work); the blocks loop over the rows, so any count works.
void launch_silu(const SiluParams& params, int max_blocks, hipStream_t stream);

}  // namespace rocep::device
