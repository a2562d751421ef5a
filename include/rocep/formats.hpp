// Token formats: how a row of values is encoded for dispatch and by the fused SiLU kernels, and where the
// scales go. The CPU reference codec (host/codecs.cpp) defines every bit; the kernels match it exactly.
//
// Element types
//   e4m3fn    fp8, bias 7, largest 448, NaN 0x7f/0xff, no infinity, -0 is 0x80 (NVIDIA, gfx950, OCP)
//   e4m3fnuz  fp8, bias 8, largest 240, NaN 0x80 (so no -0), no infinity (gfx942 / MI300X)
//   e2m1      fp4, bias 1, values 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives; two per byte, element 2i
//             in the low nibble of byte i
//   e8m0      scale 2^(code - 127), code 0xff is NaN
// Conversions to an element type round to nearest, ties to even, and saturate: a magnitude above the
// largest value becomes the largest value. A value that rounds to zero keeps its sign where the type has
// -0 (e4m3fn, e2m1); in e4m3fnuz it is +0.
//
// Blocks and scales (amax = largest |x| of the block; all arithmetic in IEEE float32, one rounding per
// operation, in the order written)
//   fp8 block-128  scale = max(amax, 1e-4) / fp8_max (448 or 240); element = fp8(x * factor), factor =
//                  fp8_max / max(amax, 1e-4)
//   mxfp8, mxfp4   e8m0 code = 127 + ceil(log2(amax / emax)), emax = 448 (e4m3fn) or 6 (e2m1), the quotient
//                  rounded to float32 first, clamped to [0, 254] (amax = 0 gives code 0); element =
//                  elem(x / 2^(code - 127)). Unlike OCP's floor rule this does not clip a block's largest
//                  element (beyond the float32 rounding of the quotient).
//   nvfp4          sf = e4m3fn((amax / 6) * global_scale); element = e2m1(x * factor), factor =
//                  global_scale / sf, or 0 when sf = 0 (elements are then zeros of their input's sign).
//                  Dequantised: e2m1 * sf / global_scale. The global scale is one float32 per tensor (per
//                  expert in the SiLU kernels), chosen by the caller, typically 448 * 6 / amax of the tensor.
//   Non-finite input: a block holding a NaN or an infinity gets a NaN scale (float32 NaN, e8m0 0xff,
//   e4m3fn 0x7f) and every element code 0, so it dequantises to NaN. The same holds for every nvfp4 block
//   when global_scale is not finite and positive.
//
// Scale layouts, for R rows of C columns (R = EpGroup::max_recv_rows() for dispatch, the row capacity for
// the SiLU kernels; C = hidden, or N for SiLU)
//   fp8 block-128  float32 [C/128][R], column-major per row as DeepGEMM-style grouped GEMMs read it: the
//                  scale of row r, block j is at j * R + r
//   mxfp8, mxfp4   uint8 e8m0 [R][C/32], row-major
//   nvfp4          uint8 e4m3fn in the 128x4 swizzled tiles of cuBLAS / CUTLASS block-scaled GEMMs:
//                  [ceil(R/128)][C/64][32][4][4]; the scale of row r, block j is at
//                  ((r/128) * (C/64) + j/4) * 512 + (r%32) * 16 + ((r%128)/32) * 4 + j%4. Padding rows
//                  hold scale 0; rows past the last row are not written. With expert_alignment a multiple
//                  of 128 every expert starts on a fresh tile, as per-expert GEMMs need.
// Tokens that reach dispatch already quantised carry their scales row-major per token: [T][hidden/128]
// float32 (fp8), [T][hidden/32] e8m0 (MX), [T][hidden/16] e4m3fn (nvfp4).
#pragma once

#include <cstddef>
#include <cstdint>

namespace rocep {

enum class TokenFormat : int32_t {
  kBf16 = 0,         // hidden x 2 bytes, no scales
  kFp8Block128 = 1,  // hidden x 1 byte e4m3fn or e4m3fnuz + one float32 scale per 128 elements
  kMxfp4 = 2,        // hidden / 2 bytes e2m1 + one e8m0 scale per 32 elements
  kNvfp4 = 3,        // hidden / 2 bytes e2m1 + one e4m3fn scale per 16 elements + a float32 global scale
  kMxfp8 = 4,        // hidden x 1 byte e4m3fn + one e8m0 scale per 32 elements
};

// Which fp8 encoding kFp8Block128 uses.
enum class Fp8Encoding : int32_t {
  kAuto = 0,      // the GPU's own: e4m3fnuz on gfx940-942 (MI300X/MI325X), e4m3fn elsewhere and on the CPU
  kE4m3fn = 1,    // NVIDIA, gfx950 (MI355X), OCP
  kE4m3fnuz = 2,  // gfx940-942
};

const char* to_string(TokenFormat format);
const char* to_string(Fp8Encoding encoding);

// Number of consecutive elements that share one scale (1 for formats without scales).
int format_block_elements(TokenFormat format);
// What a row's length must be a multiple of: whole 16-byte vectors of payload and whole scale blocks (for
// nvfp4 whole 4-block columns of its scale tiles): 8 (bf16), 128 (fp8 block-128), 32 (MX), 64 (nvfp4).
int format_column_multiple(TokenFormat format);
// Bytes of the payload of one token of `hidden` elements, scales excluded. Throws ConfigError for an unknown
// format, a negative `hidden`, or an odd one in fp4.
std::size_t format_payload_bytes(TokenFormat format, int hidden);
// Bytes of the per-token scales of one token of `hidden` elements (0 for bf16). Throws ConfigError for an
// unknown format or a `hidden` that is negative or not whole blocks (format_block_elements).
std::size_t format_scale_bytes(TokenFormat format, int hidden);
// Bytes of one token's row of EpGroup::dispatch_input_buffer(): the payload, then (scaled formats) its scales
// row-major, padded to a multiple of 16 bytes: 2 x hidden for bf16. Throws as the two above do.
std::size_t format_input_row_bytes(TokenFormat format, int hidden);
// Bytes of the scale tensor in the layout above for `rows` rows of `columns` elements (0 for bf16). Throws
// ConfigError as format_scale_bytes does for `columns` (for nvfp4, unless a multiple of 64: whole tile
// columns), and for `rows` whose bytes overflow size_t.
std::size_t format_scale_tensor_bytes(TokenFormat format, std::size_t rows, int columns);

}  // namespace rocep
