// The CPU reference codecs of the quantised formats: the definition of every bit the kernels produce
// (include/rocep/formats.hpp states the rules). Written independently of hip/codecs.hpp: element
// conversions pick the nearest value from the format's table of codes, so the two implementations test
// each other.
#pragma once

#include <cstdint>

#include "rocep/formats.hpp"

namespace rocep::reference {

// The fp8 encoding the CPU reference uses for `requested`: kAuto means e4m3fn (the OCP encoding) here.
inline Fp8Encoding reference_fp8_encoding(Fp8Encoding requested) {
  return requested == Fp8Encoding::kAuto ? Fp8Encoding::kE4m3fn : requested;
}

// Element conversions (round to nearest even, saturating; NaN as formats.hpp says). `encoding` is
// kE4m3fn or kE4m3fnuz: std::invalid_argument for kAuto (callers resolve it) or an unknown value.
// encode_e2m1 throws std::invalid_argument for NaN: e2m1 has no NaN code.
uint8_t encode_fp8(float value, Fp8Encoding encoding);
float decode_fp8(uint8_t code, Fp8Encoding encoding);
uint8_t encode_e2m1(float value);  // code in the low nibble
float decode_e2m1(uint8_t code);   // low nibble
float decode_e8m0(uint8_t code);

// One row of `columns` float32 values (a whole number of the format's blocks) into `payload`
// (format_payload_bytes) and `scales` (format_scale_bytes: the row's scales in block order, float32 for fp8
// block-128, one byte each otherwise). `global_scale` is used by nvfp4 only; `encoding` by fp8 block-128
// only (mxfp8 is always e4m3fn). kBf16 rounds each value to bf16 and writes no scales. In an nvfp4 block
// whose scale sf is 0, every element is a zero of the sign of its input.
// std::invalid_argument for an unknown format, columns that are not a whole number of blocks, or (fp8
// block-128) an encoding that is not kE4m3fn or kE4m3fnuz.
void quantize_row(TokenFormat format, Fp8Encoding encoding, const float* values, int columns,
                  float global_scale, uint8_t* payload, uint8_t* scales);
// `rows` rows of `columns` bf16 values (their bits, row-major) quantised as quantize_row quantises each:
// row r's payload at payloads + r * format_payload_bytes(format, columns), its scales at scales + r *
// format_scale_bytes(format, columns). The tokens of a dispatch that quantises them, as a caller that
// quantises before dispatch would pass them (DispatchInputs::token_scales).
void quantize_bf16_rows(TokenFormat format, Fp8Encoding encoding, const uint16_t* bits, int rows, int columns,
                        float global_scale, uint8_t* payloads, uint8_t* scales);
// Those rows as rows of EpGroup::dispatch_input_buffer(): row r's payload, then its scales, at destination
// + r * format_input_row_bytes(format, columns); each row's padding past its scales is left as it was.
void write_input_rows(TokenFormat format, int columns, const uint8_t* payloads, const uint8_t* scales,
                      int rows, uint8_t* destination);
// The inverse, up to rounding: values[i] = element * scale (nvfp4: element * sf / global_scale).
void dequantize_row(TokenFormat format, Fp8Encoding encoding, const uint8_t* payload, const uint8_t* scales,
                    int columns, float global_scale, float* values);

}  // namespace rocep::reference
