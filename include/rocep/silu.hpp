// The fused SiLU + quantisation step between the two expert GEMMs: gate_up [rows, 2N] (bf16, in the
// dispatched layout) -> silu(gate) * up in float32 -> bf16, fp8 block-128, mxfp8, mxfp4 or nvfp4 with its
// scales (include/rocep/formats.hpp: codecs and scale layouts).
//
// The value: silu(g) * u = g / (1 + exp(-g)) * u, every operation one IEEE float32 rounding (to nearest
// even), exp being the exp_in_range of hip/silu_math.hpp (a Cody-Waite reduction and a degree-5
// polynomial in fused multiply-adds, within 3 ulp of exp; silu within 4 ulp), so the CPU reference and every
// GPU compute the same bits. silu(g) = g for 16.7 < g < inf; for g < -87 (-inf included) silu(g) = silu(-87)
// = -1.43e-36 (the exact value is smaller still); silu(+inf) and silu(NaN) are NaN. bf16 stores every NaN as
// 0x7fff (CUDA's canonical bf16 NaN); in the quantised formats a NaN or infinity makes its whole block NaN
// (formats.hpp).
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
  // (format_scale_tensor_bytes): fp8 block-128 float32 [n/128][capacity_rows]; mxfp8 / mxfp4 e8m0
  // [capacity_rows][n/32]; nvfp4 e4m3fn in 128x4 tiles [ceil(capacity_rows/128)][n/64][512]. Unused for
  // bf16 (may be null).
  void* out_scales = nullptr;
  // [num_groups + 1] uint32, e.g. DispatchOutputs::row_offsets: group g holds rows
  // [row_offsets[g], row_offsets[g + 1]); the kernel reads the row count row_offsets[num_groups] on the
  // device and touches no row at or past it (payload or scales; nvfp4 tile padding is never written).
  const uint32_t* row_offsets = nullptr;
  // [num_groups] float32 global scale of each group (nvfp4 only, may be null otherwise): a row uses the
  // scale of the first group g with row < row_offsets[g + 1].
  const float* global_scales = nullptr;
  int num_groups = 0;             // >= 1
  int n = 0;                      // output columns: a multiple of 8 (bf16), 128 (fp8), 32 (MX), 64 (nvfp4)
  std::size_t capacity_rows = 0;  // rows allocated in gate_up, out and out_scales; at most 2^31 - 1
  TokenFormat format = TokenFormat::kBf16;
  Fp8Encoding fp8_encoding = Fp8Encoding::kAuto;  // kFp8Block128 only (mxfp8 is always e4m3fn)
  bool interleaved = false;
  // SwiGLU limit: when > 0, g = min(g, clamp_limit) and u = clamp(u, -clamp_limit, clamp_limit) before
  // silu(g) * u (a NaN stays NaN). 0 = no clamp; negative or NaN is rejected.
  float clamp_limit = 0.0f;
};

// On the GPU, stream-ordered on `stream` (hipStream_t / cudaStream_t; nullptr = default stream), on the
// calling thread's current device; every pointer is device memory. Not collective. Graph-safe (the row
// count is read on the device, so a captured call follows row_offsets at replay); allocates nothing. The
// first call on a device loads the kernels and queries the device (host work, once per device). A row
// count above capacity_rows is clamped to capacity_rows (no row past the allocation is touched). kAuto
// picks the current GPU's fp8 encoding (resolve_fp8_encoding).
// Errors: InvalidInputError, naming the field and its value, for a null pointer the format needs,
// num_groups < 1, n not a positive multiple of the format's requirement, capacity_rows >= 2^31, a negative
// or NaN clamp_limit, an unknown format or encoding, or a pointer not aligned for its vectors (gate_up 16
// bytes, out the bytes of 8 columns, out_scales one scale's; host memory included); GpuRuntimeError if the
// launch fails; ConfigError in a build without GPU kernels.
void silu_and_quantize(const SiluArgs& args, void* stream = nullptr);

// The CPU reference: the same contract on host memory, the definition the GPU kernels match bit for bit.
// kAuto means e4m3fn here. Errors: InvalidInputError as above.
void silu_and_quantize_reference(const SiluArgs& args);

}  // namespace rocep
