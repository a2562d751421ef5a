// The reference codecs (host/codecs.cpp) against the device codecs (hip/codecs.hpp) compiled for the host,
// bit for bit: element conversions over every bf16, random float32 patterns and every rounding boundary;
// whole rows against the device scale helpers composed as a kernel composes them. Hand-written tables pin
// the reference itself to include/rocep/formats.hpp, and property tests check the error and scale bounds
// the rules promise. No MPI: every rank runs the same checks on its own.
#include "host/codecs.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "codec_cases.hpp"
#include "hip/bf16.hpp"
#include "hip/codecs.hpp"
#include "mpi_support.hpp"
#include "rocep/formats.hpp"

namespace {

using rocep::Fp8Encoding;
using rocep::TokenFormat;
using rocep::testing::Element;
using rocep::testing::FormatCase;
using rocep::testing::QuantizedRows;
using rocep::testing::RowCase;

namespace reference = rocep::reference;
namespace device = rocep::device;

constexpr float kInfinity = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

std::vector<uint8_t> device_codes(Element element, const std::vector<float>& inputs) {
  std::vector<uint8_t> codes(inputs.size());
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    codes[i] = rocep::testing::device_encode(element, inputs[i]);
  }
  return codes;
}

// ---- element conversions: device against reference ---------------------------------------------------

TEST(ElementCodecTest, EncodersMatchReferenceOnEveryBf16) {
  const std::vector<float> inputs = rocep::testing::bf16_inputs();
  for (Element element : rocep::testing::kElements) {
    EXPECT_TRUE(rocep::testing::same_codes_as_reference(element, inputs, device_codes(element, inputs)));
  }
}

TEST(ElementCodecTest, EncodersMatchReferenceOnRandomFloat32Patterns) {
  const uint64_t seed = rocep::testing::fresh_seed();
  SCOPED_TRACE(rocep::testing::seed_trace(seed));
  const std::vector<float> inputs = rocep::testing::random_float_inputs(seed, 300000);
  for (Element element : rocep::testing::kElements) {
    EXPECT_TRUE(rocep::testing::same_codes_as_reference(element, inputs, device_codes(element, inputs)));
  }
}

TEST(ElementCodecTest, EncodersMatchReferenceOnRoundingBoundaries) {
  for (Element element : rocep::testing::kElements) {
    const std::vector<float> inputs = rocep::testing::boundary_inputs(element);
    EXPECT_TRUE(rocep::testing::same_codes_as_reference(element, inputs, device_codes(element, inputs)));
  }
}

TEST(ElementCodecTest, DecodersMatchReferenceOnEveryCode) {
  rocep::testing::DecodedCodes decoded{};
  for (int code = 0; code < 256; ++code) {
    rocep::testing::device_decode(code, decoded);
  }
  EXPECT_TRUE(rocep::testing::same_decoded(decoded, rocep::testing::reference_decoded_codes()));
}

// Every finite code decodes to a value that encodes back to that code (the reference's table is the
// format's, in both directions).
TEST(ElementCodecTest, ReferenceRoundTripsEveryFiniteCode) {
  for (Element element : rocep::testing::kElements) {
    SCOPED_TRACE(rocep::testing::to_string(element));
    for (int code = 0; code < rocep::testing::element_codes(element); ++code) {
      const float value = rocep::testing::reference_decode(element, static_cast<uint8_t>(code));
      if (!std::isnan(value)) {
        EXPECT_EQ(rocep::testing::reference_encode(element, value), code) << "value " << value;
      }
    }
  }
}

// ---- the reference pinned by hand ----------------------------------------------------------------------

struct KnownCode {
  float value;
  uint8_t code;
};

void expect_known_codes(Element element, std::initializer_list<KnownCode> table) {
  SCOPED_TRACE(rocep::testing::to_string(element));
  for (const KnownCode& known : table) {
    EXPECT_EQ(rocep::testing::reference_encode(element, known.value), known.code)
        << "encode(" << rocep::testing::describe(known.value) << ")";
  }
}

TEST(ReferenceCodecTest, KnownE4m3fnCodes) {
  expect_known_codes(Element::kE4m3fn,
                     {
                         {0.0f, 0x00},           {-0.0f, 0x80},     {1.0f, 0x38},
                         {-1.0f, 0xb8},          {0.015625f, 0x08},  // 2^-6, the smallest normal
                         {0.001953125f, 0x01},                       // 2^-9, the smallest subnormal
                         {0.0009765625f, 0x00},   // 2^-10, a tie between 0 and 2^-9: even is 0
                         {-0.0009765625f, 0x80},  // ... and keeps its sign
                         {0.0009765626f, 0x01},   // just above the tie
                         {0.0029296875f, 0x02},   // 3 * 2^-10, a tie between codes 1 and 2
                         {1.0625f, 0x38},         // a tie between 1 (0x38) and 1.125 (0x39)
                         {1.1875f, 0x3a},         // a tie between 1.125 (0x39) and 1.25 (0x3a)
                         {240.0f, 0x77},         {432.0f, 0x7e},  // a tie between 416 (0x7d) and 448 (0x7e)
                         {448.0f, 0x7e},                          // the largest value
                         {-448.0f, 0xfe},        {464.0f, 0x7e},  // saturates
                         {480.0f, 0x7e},         {1e9f, 0x7e},      {kInfinity, 0x7e},
                         {-kInfinity, 0xfe},     {kNaN, 0x7f},      {-kNaN, 0x7f},
                     });
}

TEST(ReferenceCodecTest, KnownE4m3fnuzCodes) {
  expect_known_codes(Element::kE4m3fnuz,
                     {
                         {0.0f, 0x00},
                         {-0.0f, 0x00},  // no -0: 0x80 is NaN
                         {-1e-30f, 0x00},
                         {1.0f, 0x40},
                         {-1.0f, 0xc0},
                         {0.0078125f, 0x08},      // 2^-7, the smallest normal
                         {0.0009765625f, 0x01},   // 2^-10, the smallest subnormal
                         {0.00048828125f, 0x00},  // 2^-11, a tie: even is 0
                         {-0.00048828125f, 0x00},
                         {0.00146484375f, 0x02},  // 3 * 2^-11, a tie between codes 1 and 2
                         {232.0f, 0x7e},          // a tie between 224 (0x7e) and 240 (0x7f)
                         {240.0f, 0x7f},          // the largest value
                         {-240.0f, 0xff},
                         {250.0f, 0x7f},
                         {448.0f, 0x7f},
                         {kInfinity, 0x7f},
                         {-kInfinity, 0xff},
                         {kNaN, 0x80},
                     });
}

TEST(ReferenceCodecTest, KnownE2m1Codes) {
  expect_known_codes(
      Element::kE2m1,
      {
          {0.0f, 0x0},   {-0.0f, 0x8},      {0.25f, 0x0},  // a tie between 0 and 0.5: even is 0
          {-0.25f, 0x8}, {0.2500001f, 0x1}, {0.5f, 0x1},
          {0.75f, 0x2},                                   // a tie between 0.5 (0x1) and 1 (0x2)
          {1.0f, 0x2},   {1.25f, 0x2},                    // a tie between 1 (0x2) and 1.5 (0x3)
          {1.5f, 0x3},   {1.75f, 0x4},                    // a tie between 1.5 (0x3) and 2 (0x4)
          {2.5f, 0x4},                                    // a tie between 2 (0x4) and 3 (0x5)
          {3.0f, 0x5},   {3.5f, 0x6},                     // a tie between 3 (0x5) and 4 (0x6)
          {5.0f, 0x6},                                    // a tie between 4 (0x6) and 6 (0x7)
          {-5.0f, 0xe},  {5.5f, 0x7},       {6.0f, 0x7},  // the largest value
          {-6.0f, 0xf},  {7.0f, 0x7},                     // saturates
          {100.0f, 0x7}, {kInfinity, 0x7},  {-kInfinity, 0xf},
      });
}

// The e8m0 code of a block whose amax is `amax`, by the reference.
uint8_t reference_mx_scale_code(TokenFormat format, float amax) {
  std::vector<float> block(32, 0.0f);
  block[7] = -amax;
  std::vector<uint8_t> payload(32);
  uint8_t code = 0;
  reference::quantize_row(format, Fp8Encoding::kE4m3fn, block.data(), 32, 1.0f, payload.data(), &code);
  return code;
}

TEST(ReferenceCodecTest, KnownMxScaleCodes) {
  struct KnownScale {
    float amax;
    uint8_t mxfp4_code;  // 127 + ceil(log2(float32(amax / 6)))
    uint8_t mxfp8_code;  // 127 + ceil(log2(float32(amax / 448)))
  };
  const float largest_bf16 = rocep::bf16_to_float(0x7f7f);
  const KnownScale table[] = {
      {0.0f, 0, 0},
      {6.0f, 127, 121},                              // 6 / 448 = 2^-6.2
      {448.0f, 134, 127},                            // 448 / 6 = 2^6.2
      {12.0f, 128, 122},                             // 12 / 6 = 2^1 exactly
      {std::nextafter(12.0f, kInfinity), 129, 122},  // one float32 step above
      {3.0f, 126, 120},                              // 3 / 6 = 2^-1 exactly
      {std::ldexp(6.0f, -126), 1, 0},                // 2^-126 for mxfp4; 6/448 * 2^-126 = 2^-132.2 for mxfp8
      {std::ldexp(6.0f, -127), 0, 0},
      {largest_bf16, 253, 247},                       // 2^125.4, 2^119.2
      {std::numeric_limits<float>::max(), 253, 247},  // 2^125.4, 2^119.2
      {std::numeric_limits<float>::denorm_min(), 0, 0},
  };
  for (const KnownScale& known : table) {
    EXPECT_EQ(reference_mx_scale_code(TokenFormat::kMxfp4, known.amax), known.mxfp4_code)
        << "mxfp4 amax " << rocep::testing::describe(known.amax);
    EXPECT_EQ(reference_mx_scale_code(TokenFormat::kMxfp8, known.amax), known.mxfp8_code)
        << "mxfp8 amax " << rocep::testing::describe(known.amax);
  }
}

// formats.hpp rounds amax / emax to float32 before the log2. Between 2^-127 and 2^-126 that quotient is a
// float32 subnormal, coarse enough that an amax one step above emax * 2^-127 rounds onto 2^-127: code 0,
// and the block's largest element lands one float32 step above emax (it saturates to emax).
TEST(ReferenceCodecTest, MxScaleCodeZeroCanSaturateByOneStep) {
  const float amax = std::nextafter(std::ldexp(6.0f, -127), kInfinity);
  ASSERT_EQ(amax / 6.0f, std::ldexp(1.0f, -127));
  EXPECT_EQ(reference_mx_scale_code(TokenFormat::kMxfp4, amax), 0);
  EXPECT_EQ(device::mx_scale_code(device::float_bits(amax), device::kE2m1Max), 0);
  EXPECT_GT(amax * std::ldexp(1.0f, 127), 6.0f);
}

// The device computes the fp8 block-128 scale max(amax, 1e-4) / fp8_max without a division (a reciprocal
// and one correction); formats.hpp's rule is one IEEE division. Every 61st finite float32 amax, both
// encodings.
TEST(BlockCodecTest, Fp8ScaleIsTheIeeeQuotient) {
  for (const auto encoding : {device::Fp8::kE4m3fn, device::Fp8::kE4m3fnuz}) {
    const float fp8_max = device::fp8_max(encoding);
    uint64_t mismatches = 0;
    for (uint32_t amax_bits = 0; amax_bits < device::kFloatExponentMask; amax_bits += 61) {
      const float amax = device::bits_float(amax_bits);
      const float expected = std::max(amax, 1e-4f) / fp8_max;
      const float scale = device::fp8_block_scale(amax_bits, encoding);
      if (device::float_bits(scale) != device::float_bits(expected) && mismatches++ < 4) {
        ADD_FAILURE() << "fp8 max " << fp8_max << ", amax " << rocep::testing::describe(amax) << ": scale "
                      << rocep::testing::describe(scale) << ", expected "
                      << rocep::testing::describe(expected);
      }
    }
    EXPECT_EQ(mismatches, 0u) << "fp8 max " << fp8_max;
  }
}

// The per-token combine receive decodes fp8 codes through float16 and folds 2^(15 - bias) into the block
// scale (hip/codecs.hpp, e4m3_pair_as_f16_bits). Every code of both encodings, in either half of a pair and
// beside every other code: the NaN codes are found in every byte of a word and nowhere else, and every
// other code decodes to decode_fp8's bits, alone and times the block scales of 521 amax bit patterns spread
// over the finite ones.
TEST(ElementCodecTest, E4m3ThroughFloat16MatchesDecode) {
  for (const auto encoding : {device::Fp8::kE4m3fn, device::Fp8::kE4m3fnuz}) {
    const float factor = device::e4m3_f16_factor(encoding);
    std::vector<float> scales;
    for (uint32_t amax_bits = 0; amax_bits < device::kFloatExponentMask; amax_bits += 4086703) {
      scales.push_back(device::fp8_block_scale(amax_bits, encoding));
    }
    for (uint32_t code = 0; code < 256; ++code) {
      const float decoded = device::decode_fp8(static_cast<uint8_t>(code), encoding);
      const bool nan = std::isnan(decoded);
      for (int byte = 0; byte < 4; ++byte) {
        const uint32_t one_code = 0x38383838u & ~(0xffu << (8 * byte));  // 0x38: 1 or 0.5, no NaN
        EXPECT_EQ(device::e4m3_word_has_nan(one_code | code << (8 * byte), encoding), nan)
            << "code " << code << " in byte " << byte;
      }
      if (nan) {
        continue;
      }
      for (uint32_t other = 0; other < 256; ++other) {
        if (std::isnan(device::decode_fp8(static_cast<uint8_t>(other), encoding))) {
          continue;
        }
        const uint32_t halves = device::e4m3_pair_as_f16_bits(code | other << 8);
        const float low = device::f16_as_float(halves & 0xffffu);
        const float high = device::f16_as_float(halves >> 16);
        ASSERT_EQ(device::float_bits(low * factor), device::float_bits(decoded)) << "code " << code;
        ASSERT_EQ(device::float_bits(high * factor),
                  device::float_bits(device::decode_fp8(static_cast<uint8_t>(other), encoding)))
            << "code " << other;
      }
      const float half_value = device::f16_as_float(device::e4m3_pair_as_f16_bits(code) & 0xffffu);
      for (const float scale : scales) {
        ASSERT_EQ(device::float_bits(half_value * (scale * factor)), device::float_bits(decoded * scale))
            << "code " << code << ", scale " << rocep::testing::describe(scale);
      }
    }
  }
}

// float_to_bf16 (hip/bf16.hpp), which the kernels' bf16 stores and the CPU reference share, against round
// to nearest even written out on the bits: the word's high half, plus one where the dropped low half is more
// than half a step, or exactly half with an odd high half (a carry into the exponent rounds up to the next
// binade or to infinity); a NaN keeps its high half with the quiet bit set. Every high half (every sign,
// exponent and kept mantissa, NaNs and infinities among them), each with the low halves at and beside the
// rounding boundaries and random ones drawn fresh.
TEST(ElementCodecTest, Bf16RoundsToNearestEvenOnEveryHighHalf) {
  const uint64_t seed = rocep::testing::fresh_seed();
  SCOPED_TRACE(rocep::testing::seed_trace(seed));
  std::mt19937_64 random(seed);
  const auto expected = [](uint32_t word) {
    const uint32_t high = word >> 16;
    const uint32_t low = word & 0xffffu;
    if ((word & 0x7fffffffu) > 0x7f800000u) {
      return static_cast<uint16_t>(high | 0x40u);
    }
    return static_cast<uint16_t>(high + ((low > 0x8000u || (low == 0x8000u && (high & 1u) != 0)) ? 1u : 0u));
  };
  for (uint32_t high = 0; high <= 0xffffu; ++high) {
    for (const uint32_t low :
         {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu, static_cast<uint32_t>(random() & 0xffffu)}) {
      const uint32_t word = high << 16 | low;
      ASSERT_EQ(rocep::float_to_bf16(device::bits_float(word)), expected(word))
          << "float32 bits 0x" << std::hex << word;
    }
  }
}

struct KnownValue {
  uint8_t code;
  float value;
};

void expect_known_values(const char* what, float (*decode)(uint8_t),
                         std::initializer_list<KnownValue> table) {
  std::vector<float> actual, expected;
  for (const KnownValue& known : table) {
    actual.push_back(decode(known.code));
    expected.push_back(known.value);
  }
  EXPECT_TRUE(rocep::testing::same_floats(what, actual, expected));
}

TEST(ReferenceCodecTest, KnownDecodedValues) {
  expect_known_values("e4m3fn",
                      [](uint8_t code) { return reference::decode_fp8(code, Fp8Encoding::kE4m3fn); },
                      {{0x00, 0.0f},
                       {0x80, -0.0f},
                       {0x01, 0.001953125f},
                       {0x08, 0.015625f},
                       {0x38, 1.0f},
                       {0x7e, 448.0f},
                       {0xfe, -448.0f},
                       {0x7f, kNaN},
                       {0xff, kNaN}});
  expect_known_values("e4m3fnuz",
                      [](uint8_t code) { return reference::decode_fp8(code, Fp8Encoding::kE4m3fnuz); },
                      {{0x00, 0.0f},
                       {0x80, kNaN},
                       {0x01, 0.0009765625f},
                       {0x08, 0.0078125f},
                       {0x40, 1.0f},
                       {0x7f, 240.0f},
                       {0xff, -240.0f}});
  expect_known_values(
      "e2m1", reference::decode_e2m1,
      {{0x0, 0.0f}, {0x1, 0.5f}, {0x2, 1.0f}, {0x5, 3.0f}, {0x7, 6.0f}, {0x8, -0.0f}, {0xf, -6.0f}});
  expect_known_values("e8m0", reference::decode_e8m0,
                      {{127, 1.0f},
                       {128, 2.0f},
                       {126, 0.5f},
                       {0, std::ldexp(1.0f, -127)},
                       {254, std::ldexp(1.0f, 127)},
                       {255, kNaN}});
}

TEST(ReferenceCodecTest, RejectsUnresolvedEncodingsAndRowsOfPartialBlocks) {
  std::vector<float> values(256, 1.0f);
  std::vector<uint8_t> payload(512), scales(64);
  EXPECT_THROW(reference::encode_fp8(1.0f, Fp8Encoding::kAuto), std::invalid_argument);
  EXPECT_THROW(reference::decode_fp8(0x38, Fp8Encoding::kAuto), std::invalid_argument);
  EXPECT_THROW(reference::encode_e2m1(kNaN), std::invalid_argument);
  EXPECT_THROW(reference::quantize_row(TokenFormat::kFp8Block128, Fp8Encoding::kAuto, values.data(), 128,
                                       1.0f, payload.data(), scales.data()),
               std::invalid_argument);
  EXPECT_THROW(reference::quantize_row(TokenFormat::kFp8Block128, Fp8Encoding::kAuto, values.data(), 0, 1.0f,
                                       payload.data(), scales.data()),
               std::invalid_argument);
  EXPECT_THROW(reference::quantize_row(TokenFormat::kMxfp4, Fp8Encoding::kE4m3fn, values.data(), 48, 1.0f,
                                       payload.data(), scales.data()),
               std::invalid_argument);
  EXPECT_THROW(reference::quantize_row(static_cast<TokenFormat>(9), Fp8Encoding::kE4m3fn, values.data(), 32,
                                       1.0f, payload.data(), scales.data()),
               std::invalid_argument);
  EXPECT_THROW(reference::dequantize_row(TokenFormat::kNvfp4, Fp8Encoding::kE4m3fn, payload.data(),
                                         scales.data(), 8, 1.0f, values.data()),
               std::invalid_argument);
  // The encoding matters to fp8 block-128 only: the other formats accept an unresolved one.
  EXPECT_NO_THROW(reference::quantize_row(TokenFormat::kMxfp4, Fp8Encoding::kAuto, values.data(), 64, 1.0f,
                                          payload.data(), scales.data()));
}

// ---- rows: reference against the device helpers ----------------------------------------------------------

QuantizedRows quantize_with_device_helpers(const FormatCase& format_case, const RowCase& row_case) {
  const int columns = row_case.columns;
  const std::size_t rows = row_case.values.size() / columns;
  const std::size_t payload_bytes = rocep::format_payload_bytes(format_case.format, columns);
  const std::size_t scale_bytes = rocep::format_scale_bytes(format_case.format, columns);
  const int blocks = columns / rocep::format_block_elements(format_case.format);
  QuantizedRows quantized{std::vector<uint8_t>(rows * payload_bytes),
                          std::vector<uint8_t>(rows * scale_bytes)};
  for (std::size_t row = 0; row < rows; ++row) {
    for (int block = 0; block < blocks; ++block) {
      rocep::testing::quantize_block_with_device_codecs(
          rocep::testing::device_format(format_case.format), rocep::testing::device_fp8(format_case.encoding),
          row_case.values.data() + row * columns, block, row_case.global_scale,
          quantized.payload.data() + row * payload_bytes, quantized.scales.data() + row * scale_bytes);
    }
  }
  return quantized;
}

TEST(BlockCodecTest, QuantizeRowMatchesDeviceHelpers) {
  const uint64_t seed = rocep::testing::fresh_seed();
  SCOPED_TRACE(rocep::testing::seed_trace(seed));
  for (const FormatCase& format_case : rocep::testing::kFormatCases) {
    for (const RowCase& row_case : rocep::testing::row_cases(format_case, seed)) {
      EXPECT_TRUE(rocep::testing::same_as_reference(format_case, row_case,
                                                    quantize_with_device_helpers(format_case, row_case)));
    }
  }
}

// ---- rows: the reference pinned to the rules ----------------------------------------------------------

// Where the two roundings of (amax / 6) * global_scale decide an e4m3fn tie.
TEST(ReferenceCodecTest, Nvfp4ScaleRoundsAmaxOverSixFirst) {
  for (const rocep::testing::Nvfp4ScaleTie& tie : rocep::testing::kNvfp4ScaleTies) {
    std::vector<float> block(16, 0.0f);
    block[0] = tie.amax;
    const QuantizedRows quantized = rocep::testing::reference_quantize(
        TokenFormat::kNvfp4, Fp8Encoding::kE4m3fn, block, 16, tie.global_scale);
    EXPECT_EQ(quantized.scales[0], tie.sf) << "amax " << rocep::testing::describe(tie.amax)
                                           << ", global scale " << rocep::testing::describe(tie.global_scale);
  }
}

// The edge row of a format quantised by the reference, with its blocks found by name.
struct QuantizedEdgeRow {
  QuantizedEdgeRow(TokenFormat row_format, Fp8Encoding row_encoding, float global_scale)
      : format(row_format), blocks(rocep::testing::edge_blocks(row_format, row_encoding)) {
    const std::vector<float> row = rocep::testing::edge_row(row_format, row_encoding);
    quantized = rocep::testing::reference_quantize(row_format, row_encoding, row,
                                                   static_cast<int>(row.size()), global_scale);
  }
  int index(const std::string& name) const {
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      if (name == blocks[i].name) {
        return static_cast<int>(i);
      }
    }
    ADD_FAILURE() << "no edge block named " << name;
    return 0;
  }
  uint8_t scale_code(const std::string& name) const { return quantized.scales[index(name)]; }
  float fp8_scale(const std::string& name) const {
    float scale = 0.0f;
    std::memcpy(&scale, quantized.scales.data() + sizeof(float) * index(name), sizeof scale);
    return scale;
  }
  // The NaN scale of formats.hpp: float32 NaN, e8m0 0xff, e4m3fn 0x7f.
  bool nan_scale(int block) const {
    switch (format) {
      case TokenFormat::kFp8Block128: {
        float scale = 0.0f;
        std::memcpy(&scale, quantized.scales.data() + sizeof(float) * block, sizeof scale);
        return std::isnan(scale);
      }
      case TokenFormat::kNvfp4:
        return quantized.scales[block] == 0x7f;
      default:
        return quantized.scales[block] == 0xff;
    }
  }
  // Element codes of a block.
  std::vector<uint8_t> codes(const std::string& name) const {
    const int block_size = rocep::format_block_elements(format);
    std::vector<uint8_t> block_codes;
    for (int i = index(name) * block_size; i < (index(name) + 1) * block_size; ++i) {
      block_codes.push_back(format == TokenFormat::kMxfp4 || format == TokenFormat::kNvfp4
                                ? static_cast<uint8_t>((quantized.payload[i / 2] >> (4 * (i % 2))) & 0xf)
                                : quantized.payload[i]);
    }
    return block_codes;
  }

  TokenFormat format;
  std::vector<rocep::testing::EdgeBlock> blocks;
  QuantizedRows quantized;
};

std::vector<uint8_t> repeated(uint8_t first, uint8_t second, int count) {
  std::vector<uint8_t> codes;
  for (int i = 0; i < count; ++i) {
    codes.push_back(i % 2 == 0 ? first : second);
  }
  return codes;
}

// Exactly the blocks that hold a NaN or an infinity get a NaN scale: their neighbours stay finite.
TEST(BlockCodecTest, NanScalesOnExactlyTheNonFiniteBlocks) {
  for (const FormatCase& format_case : rocep::testing::kFormatCases) {
    if (format_case.format == TokenFormat::kBf16) {
      continue;
    }
    SCOPED_TRACE(rocep::testing::to_string(format_case));
    const QuantizedEdgeRow row(format_case.format, format_case.encoding, 1.0f);
    for (std::size_t block = 0; block < row.blocks.size(); ++block) {
      const std::vector<float>& values = row.blocks[block].values;
      const bool finite = std::all_of(values.begin(), values.end(), [](float x) { return std::isfinite(x); });
      EXPECT_EQ(row.nan_scale(static_cast<int>(block)), !finite) << row.blocks[block].name;
    }
  }
}

TEST(BlockCodecTest, Fp8Block128EdgeBlocks) {
  for (Fp8Encoding encoding : {Fp8Encoding::kE4m3fn, Fp8Encoding::kE4m3fnuz}) {
    SCOPED_TRACE(rocep::to_string(encoding));
    const bool fnuz = encoding == Fp8Encoding::kE4m3fnuz;
    const float fp8_max = fnuz ? 240.0f : 448.0f;
    const QuantizedEdgeRow row(TokenFormat::kFp8Block128, encoding, 1.0f);
    EXPECT_EQ(row.fp8_scale("zeros"), 1e-4f / fp8_max);
    EXPECT_EQ(row.fp8_scale("amax below 1e-4"), 1e-4f / fp8_max);
    EXPECT_EQ(row.fp8_scale("ties at scale 1"), 1.0f);
    EXPECT_EQ(row.codes("negative zeros"), repeated(fnuz ? 0x00 : 0x80, fnuz ? 0x00 : 0x80, 128));
    EXPECT_EQ(row.codes("signed zeros"), repeated(0x00, fnuz ? 0x00 : 0x80, 128));
    for (const char* name : {"one NaN", "+infinity", "-infinity"}) {
      EXPECT_EQ(row.codes(name), std::vector<uint8_t>(128, 0)) << name;
    }
  }
}

TEST(BlockCodecTest, MxEdgeBlocks) {
  for (TokenFormat format : {TokenFormat::kMxfp8, TokenFormat::kMxfp4}) {
    SCOPED_TRACE(rocep::to_string(format));
    const bool fp4 = format == TokenFormat::kMxfp4;
    const QuantizedEdgeRow row(format, Fp8Encoding::kE4m3fn, 1.0f);
    EXPECT_EQ(row.scale_code("zeros"), 0);
    EXPECT_EQ(row.scale_code("float32 subnormals"), 0);
    EXPECT_EQ(row.scale_code("ties at scale 1"), 127);
    // amax = 8 * element max: log2(8) = 3 exactly; one float32 step above it needs 2^4.
    EXPECT_EQ(row.scale_code("amax a power of two times the element max"), 130);
    EXPECT_EQ(row.scale_code("amax just above a power of two times the element max"), 131);
    // 0x7f7f: 3.3895e38 / 6 = 2^125.4, / 448 = 2^119.2.
    EXPECT_EQ(row.scale_code("largest bf16"), fp4 ? 253 : 247);
    const uint8_t negative_zero = fp4 ? 0x8 : 0x80;
    EXPECT_EQ(row.codes("negative zeros"), repeated(negative_zero, negative_zero, 32));
    for (const char* name : {"one NaN", "+infinity", "-infinity"}) {
      EXPECT_EQ(row.codes(name), std::vector<uint8_t>(32, 0)) << name;
    }
  }
}

TEST(BlockCodecTest, Nvfp4EdgeBlocks) {
  const QuantizedEdgeRow row(TokenFormat::kNvfp4, Fp8Encoding::kE4m3fn, 1.0f);
  EXPECT_EQ(row.scale_code("zeros"), 0x00);
  // (1e-6 / 6) * 1 rounds to e4m3fn 0: every element is a zero that keeps its sign.
  EXPECT_EQ(row.scale_code("negligible (nvfp4 sf rounds to 0)"), 0x00);
  EXPECT_EQ(row.codes("negligible (nvfp4 sf rounds to 0)"), repeated(0x0, 0x8, 16));
  EXPECT_EQ(row.codes("negative zeros"), repeated(0x8, 0x8, 16));
  EXPECT_EQ(row.scale_code("ties at scale 1"), 0x38);  // (6 / 6) * 1 = 1.0
  EXPECT_EQ(row.scale_code("largest bf16"), 0x7e);     // saturates at 448
  for (const char* name : {"one NaN", "+infinity", "-infinity"}) {
    EXPECT_EQ(row.codes(name), std::vector<uint8_t>(16, 0)) << name;
  }

  for (float global_scale : {0.0f, -0.0f, -2.0f, kNaN, kInfinity, -kInfinity}) {
    SCOPED_TRACE("global scale " + rocep::testing::describe(global_scale));
    const QuantizedEdgeRow unusable(TokenFormat::kNvfp4, Fp8Encoding::kE4m3fn, global_scale);
    EXPECT_EQ(unusable.quantized.scales, std::vector<uint8_t>(unusable.blocks.size(), 0x7f));
    EXPECT_EQ(unusable.quantized.payload, std::vector<uint8_t>(unusable.quantized.payload.size(), 0));
  }
}

// ---- properties of the reference on random rows --------------------------------------------------------

// Half the distance between the neighbours of `element` around `magnitude` (at most the largest value).
double half_step(const std::vector<float>& values, double magnitude) {
  const auto upper = std::upper_bound(values.begin(), values.end(), magnitude);
  if (upper == values.end()) {
    return (values.back() - values[values.size() - 2]) / 2.0;
  }
  return (*upper - *(upper - 1)) / 2.0;
}

// The scale a block's elements are multiplied by on dequantisation, from the row's scales.
double block_scale(TokenFormat format, const uint8_t* scales, int block, float global_scale) {
  switch (format) {
    case TokenFormat::kFp8Block128: {
      float scale = 0.0f;
      std::memcpy(&scale, scales + sizeof(float) * block, sizeof scale);
      return scale;
    }
    case TokenFormat::kNvfp4:
      return static_cast<double>(reference::decode_fp8(scales[block], Fp8Encoding::kE4m3fn)) / global_scale;
    default:
      return reference::decode_e8m0(scales[block]);
  }
}

// |dequantize(quantize(x)) - x| is at most half a step of the element type at the block's scale, or the
// distance to the largest value where the element saturates (the scale's own rounding can put the block's
// largest element a little past the element max), plus the float32 roundings of the element factor, of x *
// factor and of e * scale.
TEST(BlockCodecTest, DequantisedRowsAreWithinHalfAStep) {
  const uint64_t seed = rocep::testing::fresh_seed();
  SCOPED_TRACE(rocep::testing::seed_trace(seed));
  constexpr int kRows = 16;
  constexpr int kColumns = 512;
  for (const FormatCase& format_case : rocep::testing::kFormatCases) {
    if (format_case.format == TokenFormat::kBf16) {
      continue;
    }
    SCOPED_TRACE(rocep::testing::to_string(format_case));
    const int block = rocep::format_block_elements(format_case.format);
    // nvfp4's one global scale per tensor serves blocks within e4m3fn's range of it.
    const int spread = format_case.format == TokenFormat::kNvfp4 ? 4 : 30;
    const std::vector<float> values =
        rocep::testing::random_rows(seed, kRows, kColumns, block, -spread, spread);
    const float global_scale = rocep::testing::typical_global_scale(values);
    const QuantizedRows quantized = rocep::testing::reference_quantize(
        format_case.format, format_case.encoding, values, kColumns, global_scale);
    const std::vector<float> element_values = rocep::testing::element_values(
        rocep::testing::format_element(format_case.format, format_case.encoding));
    const std::size_t payload_bytes = rocep::format_payload_bytes(format_case.format, kColumns);
    const std::size_t scale_bytes = rocep::format_scale_bytes(format_case.format, kColumns);
    std::vector<float> dequantized(kColumns);
    int failures = 0;
    for (int row = 0; row < kRows; ++row) {
      reference::dequantize_row(
          format_case.format, format_case.encoding, quantized.payload.data() + row * payload_bytes,
          quantized.scales.data() + row * scale_bytes, kColumns, global_scale, dequantized.data());
      for (int i = 0; i < kColumns; ++i) {
        const double x = values[static_cast<std::size_t>(row) * kColumns + i];
        const double scale = block_scale(format_case.format, quantized.scales.data() + row * scale_bytes,
                                         i / block, global_scale);
        if (scale == 0.0) {  // nvfp4 sf = 0: zeros
          EXPECT_EQ(dequantized[i], 0.0f);
          continue;
        }
        const double element = std::fabs(x) / scale;
        const double saturation = std::max(0.0, element - element_values.back());
        const double bound = (std::max(saturation, half_step(element_values, element)) +
                              std::ldexp(element + element_values.back(), -22)) *
                             scale;
        const double error = std::fabs(dequantized[i] - x);
        if (!(error <= bound) && ++failures <= 5) {
          ADD_FAILURE() << "row " << row << " column " << i << ": x = " << x << ", dequantised "
                        << dequantized[i] << ", error " << error << " above " << bound << " (scale " << scale
                        << ")";
        }
      }
    }
  }
}

// The scales obey their rules as inequalities, not as the formula the code computes.
TEST(BlockCodecTest, ScalesObeyTheirRules) {
  const uint64_t seed = rocep::testing::fresh_seed();
  SCOPED_TRACE(rocep::testing::seed_trace(seed));
  constexpr int kRows = 32;
  constexpr int kColumns = 512;
  for (const FormatCase& format_case : rocep::testing::kFormatCases) {
    if (format_case.format == TokenFormat::kBf16) {
      continue;
    }
    SCOPED_TRACE(rocep::testing::to_string(format_case));
    const TokenFormat format = format_case.format;
    const int block = rocep::format_block_elements(format);
    const std::vector<float> values = rocep::testing::random_rows(seed, kRows, kColumns, block, -140, 120);
    const float global_scale = rocep::testing::typical_global_scale(values);
    const QuantizedRows quantized =
        rocep::testing::reference_quantize(format, format_case.encoding, values, kColumns, global_scale);
    const std::vector<float> e4m3fn_values = rocep::testing::element_values(Element::kE4m3fn);
    const int blocks = kRows * kColumns / block;
    for (int b = 0; b < blocks; ++b) {
      double amax = 0.0;
      for (int i = 0; i < block; ++i) {
        amax =
            std::max(amax, std::fabs(static_cast<double>(values[static_cast<std::size_t>(b) * block + i])));
      }
      SCOPED_TRACE("block " + std::to_string(b) + ", amax " +
                   rocep::testing::describe(static_cast<float>(amax)));
      if (format == TokenFormat::kFp8Block128) {
        const double fp8_max = format_case.encoding == Fp8Encoding::kE4m3fnuz ? 240.0 : 448.0;
        const double scale = block_scale(format, quantized.scales.data(), b, global_scale);
        const double ratio = std::max(amax, static_cast<double>(1e-4f)) / scale;
        EXPECT_LE(std::fabs(ratio - fp8_max), std::ldexp(fp8_max, -22));
      } else if (format == TokenFormat::kNvfp4) {
        const double wanted = amax / 6.0 * global_scale;
        const double sf = reference::decode_fp8(quantized.scales[b], Fp8Encoding::kE4m3fn);
        if (wanted >= 448.0) {
          EXPECT_EQ(sf, 448.0);
        } else {
          EXPECT_LE(std::fabs(sf - wanted), half_step(e4m3fn_values, wanted) + std::ldexp(wanted, -22));
        }
      } else {
        const int code = quantized.scales[b];
        const double element_max = format == TokenFormat::kMxfp4 ? 6.0 : 448.0;
        const double element = std::ldexp(amax, 127 - code);  // amax / 2^(code - 127), exact
        if (code > 0) {
          EXPECT_LE(element, element_max) << "code " << code;
          EXPECT_GT(element, element_max / 2) << "code " << code;
        } else {  // at most one float32 step above the max (MxScaleCodeZeroCanSaturateByOneStep)
          EXPECT_LE(element, element_max * (1 + std::ldexp(1.0, -20)));
        }
      }
    }
  }
}

}  // namespace
