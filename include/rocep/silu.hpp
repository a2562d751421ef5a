// The fused SiLU + quantisation step between the two expert GEMMs: gate_up [rows, 2N] (bf16, in the
// dispatched layout) -> silu(gate) * up in float32 -> bf16, fp8 block-128, mxfp8, mxfp4 or nvfp4 with its
// scales (include/rocep/formats.hpp: codecs and scale layouts).
#pragma once

#include <cstddef>
#include <cstdint>

#include "formats.hpp"

namespace rocep {

struct SiluArgs {
  // [capacity_rows, 2 * n] bf16. Plain: gate = columns [0, n), up = [n, 2n). Interleaved: g0, u0, g1, u1, ...
  const void* gate_up = nullptr;
  // [capacity_rows, n] in `format` (format_payload_bytes(format, n) bytes per row).
  void* out = nullptr;
  // The scale tensor of capacity_rows rows and n columns in the layout of `format`
  // (format_scale_tensor_bytes); unused for bf16.
  void* out_scales = nullptr;
  // [num_groups + 1] uint32, e.g. DispatchOutputs::row_offsets: group g holds rows
  // [row_offsets[g], row_offsets[g + 1]); the kernel reads the row count row_offsets[num_groups] on the
  // device and touches no row at or past it.
  const uint32_t* row_offsets = nullptr;
  // [num_groups] float32 global scale of each group (nvfp4 only).
  const float* global_scales = nullptr;
  int num_groups = 0;
  int n = 0;                      // output columns: a multiple of 8 (bf16), 128 (fp8), 32 (MX), 64 (nvfp4)
  std::size_t capacity_rows = 0;  // rows allocated in gate_up, out and out_scales
  TokenFormat format = TokenFormat::kBf16;
  Fp8Encoding fp8_encoding = Fp8Encoding::kAuto;  // kFp8Block128 only
  bool interleaved = false;
  // SwiGLU limit: when > 0, g = min(g, clamp_limit) and u = clamp(u, -clamp_limit, clamp_limit) before
  // silu(g) * u. silu(g) = g / (1 + exp(-g)), with exp evaluated as hip/silu_math.hpp defines it so every
  // backend computes the same bits.
  float clamp_limit = 0.0f;
};

// On the GPU, stream-ordered on `stream` (hipStream_t / cudaStream_t; nullptr = default stream); every
// pointer is device memory. Graph-safe; allocates nothing. A row count above capacity_rows is clamped to
// capacity_rows (no row past the allocation is touched). kAuto picks the current GPU's fp8 encoding.
// Errors: InvalidInputError for a null pointer, num_groups < 1, n not a positive multiple of the format's
// requirement, or an unknown format or encoding; ConfigError in a build without GPU
// kernels.
void silu_and_quantize(const SiluArgs& args, void* stream = nullptr);

// The CPU reference: the same contract on host memory, the definition the GPU kernels match bit for bit.
// kAuto means e4m3fn here.
void silu_and_quantize_reference(const SiluArgs& args);

}  // namespace rocep
