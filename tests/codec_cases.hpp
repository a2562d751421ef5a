// What the CPU and GPU codec tests share: the element types, the inputs that probe their conversions, the
// rows that probe the block rules, and quantize_block_with_device_codecs, the hip/codecs.hpp helpers
// composed as a kernel composes them. The tests hold both against the reference (host/codecs.hpp).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <iomanip>
#include <iterator>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "format_cases.hpp"
#include "hip/bf16.hpp"
#include "hip/codecs.hpp"
#include "hip/portable.hpp"
#include "hip/scale_layout.hpp"
#include "host/codecs.hpp"
#include "rocep/formats.hpp"

namespace rocep::testing {

// The element types with an encoder.
enum class Element { kE4m3fn, kE4m3fnuz, kE2m1 };
inline constexpr Element kElements[] = {Element::kE4m3fn, Element::kE4m3fnuz, Element::kE2m1};

inline const char* to_string(Element element) {
  switch (element) {
    case Element::kE4m3fn:
      return "e4m3fn";
    case Element::kE4m3fnuz:
      return "e4m3fnuz";
    case Element::kE2m1:
      return "e2m1";
  }
  return "unknown";
}

// e2m1 has no NaN: neither encoder defines its conversion of one, so comparisons skip NaN inputs there.
inline bool encodes_nan(Element element) {
  return element != Element::kE2m1;
}

ROCEP_HOST_DEVICE inline uint8_t device_encode(Element element, float value) {
  switch (element) {
    case Element::kE4m3fn:
      return device::encode_e4m3fn(value);
    case Element::kE4m3fnuz:
      return device::encode_e4m3fnuz(value);
    case Element::kE2m1:
      return device::encode_e2m1(value);
  }
  return 0;
}

inline uint8_t reference_encode(Element element, float value) {
  switch (element) {
    case Element::kE4m3fn:
      return reference::encode_fp8(value, Fp8Encoding::kE4m3fn);
    case Element::kE4m3fnuz:
      return reference::encode_fp8(value, Fp8Encoding::kE4m3fnuz);
    case Element::kE2m1:
      return reference::encode_e2m1(value);
  }
  return 0;
}

inline float reference_decode(Element element, uint8_t code) {
  switch (element) {
    case Element::kE4m3fn:
      return reference::decode_fp8(code, Fp8Encoding::kE4m3fn);
    case Element::kE4m3fnuz:
      return reference::decode_fp8(code, Fp8Encoding::kE4m3fnuz);
    case Element::kE2m1:
      return reference::decode_e2m1(code);
  }
  return 0.0f;
}

inline int element_codes(Element element) {
  return element == Element::kE2m1 ? 16 : 256;
}

// Every finite non-negative value of `element`, ascending (the reference decoders walk the codes in
// ascending order of magnitude).
inline std::vector<float> element_values(Element element) {
  std::vector<float> values;
  for (int code = 0; code < element_codes(element) / 2; ++code) {
    const float value = reference_decode(element, static_cast<uint8_t>(code));
    if (!std::isnan(value)) {
      values.push_back(value);
    }
  }
  return values;
}

// Inputs where a conversion to `element` can go wrong, both signs: every midpoint between neighbours (a
// tie) and the float32 values either side of it, the largest value, just above it, its would-be midpoint
// with the next step, huge values and infinity, the smallest step and its half, float32 subnormals, zeros
// and NaN.
inline std::vector<float> boundary_inputs(Element element) {
  const std::vector<float> values = element_values(element);
  const float infinity = std::numeric_limits<float>::infinity();
  std::vector<float> positive;
  for (std::size_t i = 0; i + 1 < values.size(); ++i) {
    const float midpoint = (values[i] + values[i + 1]) / 2;  // exact: one bit more than the element type
    positive.insert(positive.end(),
                    {midpoint, std::nextafter(midpoint, 0.0f), std::nextafter(midpoint, infinity)});
  }
  const float largest = values.back();
  const float last_step = largest - values[values.size() - 2];
  const float smallest = values[1];
  positive.insert(positive.end(),
                  {largest, std::nextafter(largest, infinity), largest + last_step / 2, largest + last_step,
                   2 * largest, 1e30f, std::numeric_limits<float>::max(), infinity, smallest, smallest / 2,
                   std::nextafter(smallest / 2, 0.0f), std::nextafter(smallest / 2, infinity),
                   std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::min(), 0.0f,
                   std::numeric_limits<float>::quiet_NaN()});
  std::vector<float> inputs = positive;
  for (float value : positive) {
    inputs.push_back(-value);
  }
  return inputs;
}

// Every bf16 bit pattern, as float32.
inline std::vector<float> bf16_inputs() {
  std::vector<float> inputs(1u << 16);
  for (uint32_t bits = 0; bits < inputs.size(); ++bits) {
    inputs[bits] = bf16_to_float(static_cast<uint16_t>(bits));
  }
  return inputs;
}

// `count` uniformly random float32 bit patterns (NaNs and infinities included).
inline std::vector<float> random_float_inputs(uint64_t seed, std::size_t count) {
  std::mt19937_64 random(seed);
  std::vector<float> inputs(count);
  for (float& value : inputs) {
    value = device::bits_float(static_cast<uint32_t>(random()));
  }
  return inputs;
}

inline device::Format device_format(TokenFormat format) {
  return static_cast<device::Format>(format);
}
inline device::Fp8 device_fp8(Fp8Encoding encoding) {
  return static_cast<device::Fp8>(encoding);
}

// The element type of a quantised format.
inline Element format_element(TokenFormat format, Fp8Encoding encoding) {
  if (format == TokenFormat::kFp8Block128) {
    return encoding == Fp8Encoding::kE4m3fnuz ? Element::kE4m3fnuz : Element::kE4m3fn;
  }
  return format == TokenFormat::kMxfp8 ? Element::kE4m3fn : Element::kE2m1;
}

inline float element_max(Element element) {
  return element_values(element).back();
}

// Every code through every decoder, and mx_inverse_scale over the codes a finite block can get.
struct DecodedCodes {
  float e4m3fn[256];
  float e4m3fnuz[256];
  float e8m0[256];
  float e2m1[16];
  float mx_inverse_scale[255];
};

// The entries of `code` (0..255) by the hip/codecs.hpp decoders.
ROCEP_HOST_DEVICE inline void device_decode(int code, DecodedCodes& decoded) {
  const auto byte = static_cast<uint8_t>(code);
  decoded.e4m3fn[code] = device::decode_e4m3fn(byte);
  decoded.e4m3fnuz[code] = device::decode_e4m3fnuz(byte);
  decoded.e8m0[code] = device::decode_e8m0(byte);
  if (code < 16) {
    decoded.e2m1[code] = device::decode_e2m1(byte);
  }
  if (code < 255) {
    decoded.mx_inverse_scale[code] = device::mx_inverse_scale(byte);
  }
}

// Every entry by the reference; the inverse scale is 1 / 2^(code - 127), exact in double and float32.
inline DecodedCodes reference_decoded_codes() {
  DecodedCodes decoded{};
  for (int code = 0; code < 256; ++code) {
    const auto byte = static_cast<uint8_t>(code);
    decoded.e4m3fn[code] = reference::decode_fp8(byte, Fp8Encoding::kE4m3fn);
    decoded.e4m3fnuz[code] = reference::decode_fp8(byte, Fp8Encoding::kE4m3fnuz);
    decoded.e8m0[code] = reference::decode_e8m0(byte);
    if (code < 16) {
      decoded.e2m1[code] = reference::decode_e2m1(byte);
    }
    if (code < 255) {
      decoded.mx_inverse_scale[code] = static_cast<float>(1.0 / reference::decode_e8m0(byte));
    }
  }
  return decoded;
}

// One block of a row, quantised with the hip/codecs.hpp helpers as a kernel uses them: amax as the integer
// max of the magnitude bits, the block's scale, then every element (code 0 in a NaN block). `payload` and
// `scales` are the row's, laid out as reference::quantize_row lays them out.
ROCEP_HOST_DEVICE inline void quantize_block_with_device_codecs(device::Format format, device::Fp8 encoding,
                                                                const float* row, int block,
                                                                float global_scale, uint8_t* payload,
                                                                uint8_t* scales) {
  using namespace rocep::device;
  const int elements = block_elements(format);
  const int first = block * elements;
  if (format == Format::kBf16) {
    const uint16_t bits = float_to_bf16(row[first]);
    __builtin_memcpy(payload + 2 * first, &bits, sizeof bits);
    return;
  }
  uint32_t amax_bits = 0;
  for (int i = 0; i < elements; ++i) {
    const uint32_t magnitude_bits = float_bits(row[first + i]) & 0x7fffffffu;
    amax_bits = magnitude_bits > amax_bits ? magnitude_bits : amax_bits;
  }
  bool nan_block = !block_is_finite(amax_bits);
  float multiplier = 0.0f;  // elements encode x * multiplier
  if (format == Format::kFp8Block128) {
    const float fp8_scale = fp8_block_scale(amax_bits, encoding);
    __builtin_memcpy(scales + sizeof(float) * block, &fp8_scale, sizeof fp8_scale);
    multiplier = nan_block ? 0.0f : fp8_element_factor(amax_bits, encoding);
  } else if (format == Format::kNvfp4) {
    const uint8_t code = nvfp4_scale_code(amax_bits, global_scale);
    scales[block] = code;
    nan_block = code == 0x7f;  // also every block of an unusable global scale
    multiplier = nan_block ? 0.0f : nvfp4_element_factor(code, global_scale);
  } else {
    const uint8_t code = mx_scale_code(amax_bits, format == Format::kMxfp4 ? kE2m1Max : kE4m3fnMax);
    scales[block] = code;
    multiplier = nan_block ? 0.0f : mx_inverse_scale(code);
  }
  for (int i = 0; i < elements; ++i) {
    const float x = row[first + i];
    uint8_t code = 0;
    if (!nan_block) {
      switch (format) {
        case Format::kFp8Block128:
          code = encode_fp8(x * multiplier, encoding);
          break;
        case Format::kMxfp8:
          code = encode_e4m3fn(x * multiplier);
          break;
        default:
          code = encode_e2m1(x * multiplier);
      }
    }
    if (format == Format::kFp8Block128 || format == Format::kMxfp8) {
      payload[first + i] = code;
    } else if (i % 2 == 0) {  // fp4: element 2j in the low nibble of byte j; a block fills whole bytes
      payload[(first + i) / 2] = code;
    } else {
      payload[(first + i) / 2] = static_cast<uint8_t>(payload[(first + i) / 2] | (code << 4));
    }
  }
}

// One block that probes the block rules.
struct EdgeBlock {
  const char* name;
  std::vector<float> values;
};

// Blocks of `format`'s size at the edges of its scale rules; each row of them also holds ordinary blocks
// between the non-finite ones, which must stay finite.
inline std::vector<EdgeBlock> edge_blocks(TokenFormat format, Fp8Encoding encoding) {
  const int n = format_block_elements(format);
  const Element element = format_element(format, encoding);
  const float top = element_max(element);
  const float infinity = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float bf16_max = bf16_to_float(0x7f7f);
  // value(i) for i in [0, n): the block.
  auto block = [n](const char* name, auto value) {
    EdgeBlock edge{name, std::vector<float>(n)};
    for (int i = 0; i < n; ++i) {
      edge.values[i] = value(i);
    }
    return edge;
  };
  auto alternating = [](int i, float magnitude) { return i % 2 == 0 ? magnitude : -magnitude; };
  auto ramp = [n](int i) { return static_cast<float>(i + 1) / static_cast<float>(n); };  // (0, 1]
  // Every midpoint of the element type at scale 1, with the largest value setting amax.
  std::vector<float> ties;
  const std::vector<float> values = element_values(element);
  for (std::size_t i = 0; i + 1 < values.size(); ++i) {
    ties.push_back((values[i] + values[i + 1]) / 2);
  }
  return {
      block("zeros", [](int) { return 0.0f; }),
      block("negative zeros", [](int) { return -0.0f; }),
      block("signed zeros", [&](int i) { return alternating(i, 0.0f); }),
      block("amax below 1e-4", [&](int i) { return alternating(i, 5e-5f * ramp(i)); }),
      block("negligible (nvfp4 sf rounds to 0)", [&](int i) { return alternating(i, 1e-6f * ramp(i)); }),
      block("float32 subnormals",
            [&](int i) {
              return alternating(i, std::numeric_limits<float>::denorm_min() * static_cast<float>(3 * i + 1));
            }),
      block("largest bf16", [&](int i) { return alternating(i, bf16_max * ramp(i)); }),
      block("largest float32",
            [&](int i) { return alternating(i, std::numeric_limits<float>::max() * ramp(i)); }),
      block("ties at scale 1",
            [&](int i) {
              return i == 0 ? top : alternating(i, ties[static_cast<std::size_t>(i) % ties.size()]);
            }),
      block("amax a power of two times the element max",
            [&](int i) { return alternating(i, 8 * top * ramp(i)); }),
      block("amax just above a power of two times the element max",
            [&](int i) { return i == n - 1 ? std::nextafter(8 * top, infinity) : 8 * top * ramp(i); }),
      block("ordinary", [&](int i) { return alternating(i, std::sin(static_cast<float>(i)) * 3.0f); }),
      block("one NaN", [&](int i) { return i == 3 ? nan : alternating(i, ramp(i)); }),
      block("ordinary", [&](int i) { return alternating(i, std::cos(static_cast<float>(i)) * 5.0f); }),
      block("+infinity", [&](int i) { return i == n - 1 ? infinity : ramp(i); }),
      block("ordinary", [&](int i) { return alternating(i, ramp(i) * 100.0f); }),
      block("-infinity", [&](int i) { return i == 0 ? -infinity : ramp(i); }),
      block("ordinary", [&](int i) { return std::tan(static_cast<float>(i)); }),
  };
}

// The edge blocks of a format, one after the other.
inline std::vector<float> edge_row(TokenFormat format, Fp8Encoding encoding) {
  std::vector<float> row;
  for (const EdgeBlock& edge : edge_blocks(format, encoding)) {
    row.insert(row.end(), edge.values.begin(), edge.values.end());
  }
  return row;
}

// nvfp4 blocks whose (amax / 6) * global_scale is exactly an e4m3fn tie, rounding to the even code `sf`;
// the other order, amax * global_scale / 6, lands one float32 step off the tie and rounds the other way.
struct Nvfp4ScaleTie {
  float amax;
  float global_scale;
  uint8_t sf;
};
inline constexpr Nvfp4ScaleTie kNvfp4ScaleTies[] = {
    {0x1.22ee38p+1f, 0x1.670378p+1f, 0x38},  // 1.0625: between 0x38 and 0x39
    {0x1.9262f4p+0f, 0x1.221beep+2f, 0x3a},  // 1.1875: between 0x39 and 0x3a
    {0x1.45e0e8p+1f, 0x1.c47cd2p-8f, 0x02},  // 3 * 2^-10: between the subnormals 0x01 and 0x02
};

// nvfp4 global scales: usable ones (1, one that saturates every sf, one that rounds every sf to 0) and
// every kind the rule turns into NaN blocks.
inline std::vector<float> nvfp4_global_scales() {
  return {1.0f,
          448.0f,
          std::numeric_limits<float>::max(),
          1e-30f,
          std::numeric_limits<float>::denorm_min(),
          0.0f,
          -0.0f,
          -2.0f,
          std::numeric_limits<float>::quiet_NaN(),
          std::numeric_limits<float>::infinity(),
          -std::numeric_limits<float>::infinity()};
}

// `rows` rows of `columns` random values: each block a random sign and a normal magnitude times a random
// power of two in [2^min_exponent, 2^max_exponent], so block amaxes cover the scale rules' range.
inline std::vector<float> random_rows(uint64_t seed, int rows, int columns, int block, int min_exponent,
                                      int max_exponent) {
  std::mt19937_64 random(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(min_exponent, max_exponent);
  std::vector<float> values(static_cast<std::size_t>(rows) * columns);
  for (std::size_t first = 0; first < values.size(); first += block) {
    const float block_scale = std::ldexp(1.0f, exponent(random));
    for (int i = 0; i < block; ++i) {
      values[first + i] = normal(random) * block_scale;
    }
  }
  return values;
}

// The global scale a caller would pick: 448 * 6 / amax of the tensor.
inline float typical_global_scale(const std::vector<float>& values) {
  float amax = 0.0f;
  for (float value : values) {
    amax = std::fmax(amax, std::fabs(value));
  }
  return 448.0f * 6.0f / amax;
}

// Rows of a format to quantise with one global scale.
struct RowCase {
  std::string name;
  std::vector<float> values;  // whole rows
  int columns;
  float global_scale;
};

// Every row case of a format: random rows whose block amaxes run from float32 subnormals to near the
// float32 maximum; rows whose block amaxes are every finite non-negative bf16 (each power-of-two boundary
// of the MX rule, the float32 subnormal quotients, every rounding of the fp8 and nvfp4 scales); the edge
// blocks, under every kind of nvfp4 global scale; the nvfp4 scale ties.
inline std::vector<RowCase> row_cases(const FormatCase& format_case, uint64_t seed) {
  const TokenFormat format = format_case.format;
  const bool nvfp4 = format == TokenFormat::kNvfp4;
  const int block = format_block_elements(format);
  std::vector<RowCase> cases;

  const std::vector<float> random = random_rows(seed, 16, 1024, block, -150, 124);
  cases.push_back({"random rows", random, 1024, typical_global_scale(random)});
  if (nvfp4) {
    cases.push_back({"random rows", random, 1024, 1.0f});
  }

  std::vector<float> sweep;
  for (uint32_t bits = 0; bits < 0x7f80; ++bits) {
    const float amax = bf16_to_float(static_cast<uint16_t>(bits));
    for (int i = 0; i < block; ++i) {
      sweep.push_back(i == 0 ? amax : -amax * static_cast<float>(i) / static_cast<float>(block));
    }
  }
  const int sweep_columns = 64 * block;
  sweep.resize(sweep.size() / sweep_columns * sweep_columns);
  cases.push_back({"bf16 amaxes", sweep, sweep_columns, 1.0f});
  if (nvfp4) {
    cases.push_back({"bf16 amaxes", sweep, sweep_columns, 0.2688f});
  }

  const std::vector<float> edges = edge_row(format, format_case.encoding);
  for (float global_scale : nvfp4 ? nvfp4_global_scales() : std::vector<float>{1.0f}) {
    cases.push_back({"edge blocks", edges, static_cast<int>(edges.size()), global_scale});
  }

  if (nvfp4) {
    for (const Nvfp4ScaleTie& tie : kNvfp4ScaleTies) {
      std::vector<float> tie_block(16, 0.0f);
      tie_block[5] = tie.amax;
      tie_block[6] = -tie.amax / 3;
      cases.push_back({"scale tie", tie_block, 16, tie.global_scale});
    }
  }
  return cases;
}

// ---- comparisons, reporting the first few differences ----------------------------------------------------

inline std::string hex(uint32_t value, int digits) {
  std::ostringstream text;
  text << "0x" << std::hex << std::setw(digits) << std::setfill('0') << value;
  return text.str();
}

inline std::string describe(float value) {
  std::ostringstream text;
  text << std::setprecision(9) << value << " (" << hex(device::float_bits(value), 8) << ")";
  return text.str();
}

// codes[i] against the reference conversion of inputs[i] to `element` (NaN skipped where undefined).
inline ::testing::AssertionResult same_codes_as_reference(Element element, const std::vector<float>& inputs,
                                                          const std::vector<uint8_t>& codes) {
  std::size_t compared = 0;
  std::size_t mismatches = 0;
  std::ostringstream examples;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if (std::isnan(inputs[i]) && !encodes_nan(element)) {
      continue;
    }
    ++compared;
    const uint8_t expected = reference_encode(element, inputs[i]);
    if (codes[i] != expected && ++mismatches <= 8) {
      examples << "\n  " << to_string(element) << "(" << describe(inputs[i]) << "): " << hex(codes[i], 2)
               << ", reference " << hex(expected, 2);
    }
  }
  if (mismatches == 0) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure()
         << mismatches << " of " << compared << " codes differ" << examples.str();
}

// Bit for bit, any NaN equal to any NaN.
inline ::testing::AssertionResult same_floats(const char* what, const std::vector<float>& actual,
                                              const std::vector<float>& expected) {
  std::size_t mismatches = 0;
  std::ostringstream examples;
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const bool same = (std::isnan(actual[i]) && std::isnan(expected[i])) ||
                      device::float_bits(actual[i]) == device::float_bits(expected[i]);
    if (!same && ++mismatches <= 8) {
      examples << "\n  " << what << "[" << i << "] = " << describe(actual[i]) << ", reference "
               << describe(expected[i]);
    }
  }
  if (mismatches == 0) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure()
         << what << ": " << mismatches << " of " << expected.size() << " differ" << examples.str();
}

inline ::testing::AssertionResult same_decoded(const DecodedCodes& actual, const DecodedCodes& expected) {
  auto values = [](const auto& array) { return std::vector<float>(std::begin(array), std::end(array)); };
  const ::testing::AssertionResult results[] = {
      same_floats("decode_e4m3fn", values(actual.e4m3fn), values(expected.e4m3fn)),
      same_floats("decode_e4m3fnuz", values(actual.e4m3fnuz), values(expected.e4m3fnuz)),
      same_floats("decode_e8m0", values(actual.e8m0), values(expected.e8m0)),
      same_floats("decode_e2m1", values(actual.e2m1), values(expected.e2m1)),
      same_floats("mx_inverse_scale", values(actual.mx_inverse_scale), values(expected.mx_inverse_scale)),
  };
  std::string failures;
  for (const ::testing::AssertionResult& result : results) {
    if (!result) {
      failures += std::string("\n") + result.message();
    }
  }
  if (failures.empty()) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << failures;
}

// Quantised rows, row after row, in reference::quantize_row's layout.
struct QuantizedRows {
  std::vector<uint8_t> payload;
  std::vector<uint8_t> scales;
};

inline QuantizedRows reference_quantize(TokenFormat format, Fp8Encoding encoding,
                                        const std::vector<float>& values, int columns, float global_scale) {
  const std::size_t rows = values.size() / columns;
  const std::size_t payload_bytes = format_payload_bytes(format, columns);
  const std::size_t scale_bytes = format_scale_bytes(format, columns);
  QuantizedRows quantized{std::vector<uint8_t>(rows * payload_bytes),
                          std::vector<uint8_t>(rows * scale_bytes)};
  for (std::size_t row = 0; row < rows; ++row) {
    reference::quantize_row(format, encoding, values.data() + row * columns, columns, global_scale,
                            quantized.payload.data() + row * payload_bytes,
                            quantized.scales.data() + row * scale_bytes);
  }
  return quantized;
}

// `actual` against reference_quantize of a row case, naming the row and block of each difference.
inline ::testing::AssertionResult same_as_reference(const FormatCase& format_case, const RowCase& row_case,
                                                    const QuantizedRows& actual) {
  const TokenFormat format = format_case.format;
  const std::vector<float>& values = row_case.values;
  const int columns = row_case.columns;
  const QuantizedRows expected =
      reference_quantize(format, format_case.encoding, values, columns, row_case.global_scale);
  const int block = format_block_elements(format);
  const std::size_t payload_bytes = format_payload_bytes(format, columns);
  const std::size_t scale_bytes = format_scale_bytes(format, columns);
  const std::size_t blocks = columns / block;
  std::size_t mismatches = 0;
  std::ostringstream examples;
  auto report = [&](const char* part, std::size_t row, std::size_t block_index, std::size_t byte, uint8_t got,
                    uint8_t want) {
    if (++mismatches > 8) {
      return;
    }
    float amax = 0.0f;
    for (int i = 0; i < block; ++i) {
      amax = std::fmax(amax, std::fabs(values[row * columns + block_index * block + i]));
    }
    examples << "\n  row " << row << " block " << block_index << " (amax " << describe(amax) << ") " << part
             << " byte " << byte << ": " << hex(got, 2) << ", reference " << hex(want, 2);
  };
  for (std::size_t i = 0; i < expected.payload.size(); ++i) {
    if (actual.payload[i] != expected.payload[i]) {
      const std::size_t byte = i % payload_bytes;
      report("payload", i / payload_bytes, byte * columns / payload_bytes / block, byte, actual.payload[i],
             expected.payload[i]);
    }
  }
  for (std::size_t i = 0; i < expected.scales.size(); ++i) {
    if (actual.scales[i] != expected.scales[i]) {
      const std::size_t byte = i % scale_bytes;
      report("scale", i / scale_bytes, byte * blocks / scale_bytes, byte, actual.scales[i],
             expected.scales[i]);
    }
  }
  if (mismatches == 0) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure()
         << to_string(format_case) << ", " << row_case.name << ", global scale "
         << describe(row_case.global_scale) << ": " << mismatches << " bytes differ" << examples.str();
}

}  // namespace rocep::testing
