// The SiLU float math (hip/silu_math.hpp) against double precision, and the CPU reference
// silu_and_quantize_reference against its contract: clamp, layouts, the rows it may touch, argument
// checks, and quantised outputs that dequantise close to silu(g) * u. Cheap; no MPI.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "hip/bf16.hpp"
#include "hip/silu_math.hpp"
#include "host/codecs.hpp"
#include "rocep/errors.hpp"
#include "rocep/silu.hpp"
#include "silu_cases.hpp"

namespace {

using rocep::canonical_nan;
using rocep::Fp8Encoding;
using rocep::SiluArgs;
using rocep::TokenFormat;
using rocep::device::bits_float;
using rocep::device::exp_in_range;
using rocep::device::float_bits;
using rocep::device::kSiluExpLimit;
using rocep::device::silu;
using rocep::device::silu_product;
using rocep::testing::kFormatCases;
using rocep::testing::random_silu_case;
using rocep::testing::run_reference;
using rocep::testing::SiluCase;
using rocep::testing::SiluOutputs;

constexpr float kInfinity = std::numeric_limits<float>::infinity();
constexpr float kFloatMax = std::numeric_limits<float>::max();

// |value - exact| in units of the float32 ulp at `exact` (a normal float32 magnitude).
double ulp_error(float value, double exact) {
  int exponent = 0;
  std::frexp(exact, &exponent);
  return std::fabs(static_cast<double>(value) - exact) / std::ldexp(1.0, exponent - 24);
}

TEST(SiluMathTest, ExpIsWithinThreeUlpOfDoubleOverADenseSweep) {
  // Every 257th float32 bit pattern in silu's range of exp inputs (an exhaustive run over exp_in_range's
  // whole range finds at most 2.23 ulp).
  double worst = 0.0;
  uint32_t worst_bits = 0;
  for (uint64_t bits = 0; bits <= 0xffffffffull; bits += 257) {
    const float x = bits_float(static_cast<uint32_t>(bits));
    if (!(std::fabs(x) <= kSiluExpLimit)) {
      continue;
    }
    const double error = ulp_error(exp_in_range(x), std::exp(static_cast<double>(x)));
    if (error > worst) {
      worst = error;
      worst_bits = static_cast<uint32_t>(bits);
    }
  }
  EXPECT_LE(worst, 3.0) << "at x = " << bits_float(worst_bits);
  std::printf("exp_in_range: largest error over the sweep %.3f ulp (at x = %a)\n", worst,
              bits_float(worst_bits));
}

TEST(SiluMathTest, ExpAtTheEndsOfSilusRange) {
  for (const float x : {-kSiluExpLimit, kSiluExpLimit}) {
    EXPECT_LE(ulp_error(exp_in_range(x), std::exp(static_cast<double>(x))), 3.0) << "x = " << x;
  }
  EXPECT_GE(exp_in_range(-kSiluExpLimit), std::numeric_limits<float>::min());
  EXPECT_LT(1.0f + exp_in_range(kSiluExpLimit), std::ldexp(1.0f, 126));
  EXPECT_EQ(exp_in_range(0.0f), 1.0f);
  EXPECT_EQ(exp_in_range(-0.0f), 1.0f);
}

// silu(g) against double precision: NaN for NaN and +inf, silu(-87) below -87, within 4 ulp wherever the
// exact value is a normal float32 (exp within 3 ulp, then 1 + e and the division round once each; every
// float32 input gives at most 3.54 ulp), and
// within the subnormal range where it is not.
::testing::AssertionResult silu_is_close(float g) {
  const float result = silu(g);
  if (std::isnan(g) || g == kInfinity) {
    return std::isnan(result)
               ? ::testing::AssertionSuccess()
               : ::testing::AssertionFailure() << "silu(" << g << ") = " << result << ", not NaN";
  }
  if (g < -kSiluExpLimit) {
    return float_bits(result) == float_bits(silu(-kSiluExpLimit))
               ? ::testing::AssertionSuccess()
               : ::testing::AssertionFailure() << "silu(" << g << ") = " << result << ", not silu(-87)";
  }
  const double exact = static_cast<double>(g) / (1.0 + std::exp(-static_cast<double>(g)));
  const bool close = std::fabs(exact) < std::numeric_limits<float>::min()
                         ? std::fabs(result) <= std::numeric_limits<float>::min()
                         : ulp_error(result, exact) <= 4.0;
  return close ? ::testing::AssertionSuccess()
               : ::testing::AssertionFailure() << "silu(" << g << ") = " << result << ", exact " << exact;
}

TEST(SiluMathTest, SiluKnownValues) {
  EXPECT_EQ(float_bits(silu(0.0f)), 0u);
  EXPECT_EQ(float_bits(silu(-0.0f)), 0x80000000u);
  EXPECT_TRUE(std::isnan(silu(kInfinity)));
  // Large positive g: exp(-g) < 2^-24 vanishes against 1, so silu(g) = g and the product is g * u.
  for (const float g : {17.0f, 20.0f, 88.0f, 100.0f, 1e10f, kFloatMax}) {
    EXPECT_EQ(silu(g), g) << "g = " << g;
    EXPECT_EQ(silu_product(g, 0.75f), g * 0.75f) << "g = " << g;
  }
  // Below -87 silu(g) is silu(-87), a negative float32 of 1.43e-36.
  const float floor = silu(-kSiluExpLimit);
  EXPECT_LT(floor, -1.4e-36f);
  EXPECT_GT(floor, -1.5e-36f);
  for (const float g : {std::nextafter(-kSiluExpLimit, -kInfinity), -88.0f, -89.0f, -100.0f, -1e10f,
                        -kFloatMax, -kInfinity}) {
    EXPECT_EQ(silu(g), floor) << "g = " << g;
  }
  for (const float g : {1.0f, -1.0f, -kSiluExpLimit, 1e-30f, -1e-30f, 1e-45f, -1e-45f}) {
    EXPECT_TRUE(silu_is_close(g));
  }
}

TEST(SiluMathTest, SiluIsCloseToDoubleOverADenseSweep) {
  // Every 251st float32 bit pattern, both signs.
  for (uint64_t bits = 0; bits <= 0xffffffffull; bits += 251) {
    ASSERT_TRUE(silu_is_close(bits_float(static_cast<uint32_t>(bits))));
  }
}

TEST(SiluMathTest, SiluOfEveryBf16IsCloseToDouble) {
  for (uint32_t bits = 0; bits < 0x10000u; ++bits) {
    EXPECT_TRUE(silu_is_close(rocep::bf16_to_float(static_cast<uint16_t>(bits))));
  }
}

TEST(SiluMathTest, ClampKeepsNan) {
  EXPECT_TRUE(std::isnan(rocep::device::clamp_gate(std::numeric_limits<float>::quiet_NaN(), 7.0f)));
  EXPECT_TRUE(std::isnan(rocep::device::clamp_up(std::numeric_limits<float>::quiet_NaN(), 7.0f)));
  EXPECT_EQ(rocep::device::clamp_gate(-kInfinity, 7.0f), -kInfinity);
  EXPECT_EQ(rocep::device::clamp_up(-kInfinity, 7.0f), -7.0f);
}

// One bf16 row of 8 columns through the reference.
std::vector<uint16_t> reference_bf16_row(const std::vector<float>& gate, const std::vector<float>& up,
                                         float clamp_limit) {
  std::vector<uint16_t> gate_up;
  for (const auto* half : {&gate, &up}) {
    for (const float value : *half) {
      gate_up.push_back(rocep::float_to_bf16(value));
    }
  }
  const uint32_t row_offsets[] = {0, 1};
  std::vector<uint16_t> out(8);
  SiluArgs args;
  args.gate_up = gate_up.data();
  args.out = out.data();
  args.row_offsets = row_offsets;
  args.num_groups = 1;
  args.n = 8;
  args.capacity_rows = 1;
  args.clamp_limit = clamp_limit;
  rocep::silu_and_quantize_reference(args);
  return out;
}

TEST(SiluReferenceTest, Bf16StoresEveryNanAsTheCanonicalNan) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float nan_with_payload = bits_float(0xffc12345u);  // sign set, payload: bf16 0xffc1
  // NaN inputs, and NaN from arithmetic: silu(+inf), 0 * inf.
  const std::vector<float> gate = {nan, nan_with_payload, 1.0f, kInfinity, 0.0f, 2.0f, 0.0f, 1.0f};
  const std::vector<float> up = {1.0f, 1.0f, nan_with_payload, 1.0f, kInfinity, nan, 1.0f, 1.0f};
  const std::vector<uint16_t> out = reference_bf16_row(gate, up, 0.0f);
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(out[i], 0x7fff) << "column " << i;
  }
  EXPECT_EQ(out[6], 0x0000);
  EXPECT_EQ(out[7], rocep::float_to_bf16(silu(1.0f)));
}

TEST(SiluReferenceTest, ClampLimitsGateFromAboveAndUpBothWays) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> gate = {10.0f, -10.0f, 3.0f, nan, kInfinity, -kInfinity, 7.0f, 6.5f};
  const std::vector<float> up = {10.0f, -10.0f, 3.0f, 1.0f, 20.0f, 1.0f, -20.0f, nan};
  // limit 7: g = min(g, 7), u = clamp(u, -7, 7)
  const std::vector<float> clamped_gate = {7.0f, -10.0f, 3.0f, nan, 7.0f, -kInfinity, 7.0f, 6.5f};
  const std::vector<float> clamped_up = {7.0f, -7.0f, 3.0f, 1.0f, 7.0f, 1.0f, -7.0f, nan};
  const std::vector<uint16_t> clamped = reference_bf16_row(gate, up, 7.0f);
  const std::vector<uint16_t> unclamped = reference_bf16_row(gate, up, 0.0f);
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(clamped[i], rocep::float_to_bf16(canonical_nan(silu_product(clamped_gate[i], clamped_up[i]))))
        << "column " << i;
    EXPECT_EQ(unclamped[i], rocep::float_to_bf16(canonical_nan(silu_product(gate[i], up[i]))))
        << "column " << i;
  }
  EXPECT_NE(clamped[0], unclamped[0]);
}

TEST(SiluReferenceTest, InterleavedEqualsPlainAfterPermutingTheInput) {
  std::mt19937_64 random(11);
  for (const auto format : kFormatCases) {
    SiluCase plain = random_silu_case(random, format, false, 0.0f);
    SiluCase interleaved = plain;
    interleaved.shape.interleaved = true;
    const auto n = static_cast<std::size_t>(plain.shape.n);
    for (std::size_t row = 0; row < plain.shape.capacity_rows; ++row) {
      for (std::size_t column = 0; column < n; ++column) {
        interleaved.gate_up[row * 2 * n + 2 * column] = plain.gate_up[row * 2 * n + column];
        interleaved.gate_up[row * 2 * n + 2 * column + 1] = plain.gate_up[row * 2 * n + n + column];
      }
    }
    const SiluOutputs expected = run_reference(plain);
    const SiluOutputs actual = run_reference(interleaved);
    EXPECT_EQ(actual.out, expected.out) << plain.describe();
    EXPECT_EQ(actual.scales, expected.scales) << plain.describe();
  }
}

TEST(SiluReferenceTest, RowsPastTheRowCountAreNeverTouched) {
  std::mt19937_64 random(12);
  for (const auto format : kFormatCases) {
    for (int repeat = 0; repeat < 4; ++repeat) {
      const SiluCase test = random_silu_case(random, format, repeat % 2 == 1, repeat < 2 ? 0.0f : 7.0f);
      EXPECT_EQ(rocep::testing::unwritten_bytes_problem(test, run_reference(test)), "") << test.describe();
    }
  }
}

TEST(SiluReferenceTest, ZeroRowsLeaveEverythingPoisoned) {
  std::mt19937_64 random(13);
  for (const auto format : kFormatCases) {
    SiluCase test = random_silu_case(random, format, false, 0.0f);
    std::fill(test.row_offsets.begin(), test.row_offsets.end(), 0u);
    const SiluOutputs outputs = run_reference(test);
    const SiluOutputs poisoned(test);
    EXPECT_EQ(outputs.out, poisoned.out) << test.describe();
    EXPECT_EQ(outputs.scales, poisoned.scales) << test.describe();
  }
}

TEST(SiluReferenceTest, RowCountAboveCapacityIsClamped) {
  std::mt19937_64 random(14);
  for (const auto format : kFormatCases) {
    SiluCase test = random_silu_case(random, format, false, 0.0f);
    while (test.row_offsets.back() < 2) {
      test = random_silu_case(random, format, false, 0.0f);
    }
    test.shape.capacity_rows = test.row_offsets.back() / 2;
    test.gate_up.resize(test.shape.capacity_rows * 2 * test.shape.n);
    // The same call with the offsets cut at the capacity must give the same bytes.
    SiluCase cut = test;
    for (uint32_t& offset : cut.row_offsets) {
      offset = std::min<uint32_t>(offset, static_cast<uint32_t>(cut.shape.capacity_rows));
    }
    const SiluOutputs outputs = run_reference(test);
    EXPECT_EQ(rocep::testing::unwritten_bytes_problem(test, outputs), "") << test.describe();
    const SiluOutputs expected = run_reference(cut);
    EXPECT_EQ(outputs.out, expected.out) << test.describe();
    EXPECT_EQ(outputs.scales, expected.scales) << test.describe();
  }
}

TEST(SiluReferenceTest, AutoEncodingIsE4m3fn) {
  std::mt19937_64 random(15);
  SiluCase test = random_silu_case(random, {TokenFormat::kFp8Block128, Fp8Encoding::kE4m3fn}, false, 0.0f);
  const SiluOutputs expected = run_reference(test);
  test.shape.fp8_encoding = Fp8Encoding::kAuto;
  const SiluOutputs actual = run_reference(test);
  EXPECT_EQ(actual.out, expected.out);
  EXPECT_EQ(actual.scales, expected.scales);
}

// The scales of `row` in block order, read with the layouts of include/rocep/formats.hpp written out here
// (not through hip/scale_layout.hpp, which the reference uses to place them).
std::vector<uint8_t> row_scales(const SiluCase& test, const SiluOutputs& outputs, std::size_t row) {
  const int n = test.shape.n;
  const std::size_t capacity = test.shape.capacity_rows;
  std::vector<uint8_t> scales;
  switch (test.shape.format) {
    case TokenFormat::kFp8Block128:
      for (int block = 0; block < n / 128; ++block) {
        const uint8_t* scale = outputs.scales.data() + (block * capacity + row) * sizeof(float);
        scales.insert(scales.end(), scale, scale + sizeof(float));
      }
      break;
    case TokenFormat::kMxfp8:
    case TokenFormat::kMxfp4:
      for (int block = 0; block < n / 32; ++block) {
        scales.push_back(outputs.scales[row * (n / 32) + block]);
      }
      break;
    case TokenFormat::kNvfp4:
      for (int block = 0; block < n / 16; ++block) {
        scales.push_back(outputs.scales[((row / 128) * (n / 64) + block / 4) * 512 + (row % 32) * 16 +
                                        ((row % 128) / 32) * 4 + block % 4]);
      }
      break;
    case TokenFormat::kBf16:
      break;
  }
  return scales;
}

// silu(g) * u of one row, as the definition computes it.
std::vector<float> expected_values(const SiluCase& test, std::size_t row) {
  const auto n = static_cast<std::size_t>(test.shape.n);
  const uint16_t* gate_up = test.gate_up.data() + row * 2 * n;
  std::vector<float> values(n);
  for (std::size_t column = 0; column < n; ++column) {
    values[column] =
        silu_product(rocep::bf16_to_float(gate_up[column]), rocep::bf16_to_float(gate_up[n + column]));
  }
  return values;
}

TEST(SiluReferenceTest, QuantisedOutputsDequantiseCloseToTheFloatResult) {
  // Largest |dequantised - exact| as a fraction of the block's amax: half the top step of the element type
  // relative to the block's range (e4m3 1/16, e2m1 with an e8m0 scale up to 2x too coarse 1/3, nvfp4 with
  // its e4m3 block scale 1/4), bf16 2^-8 of the value itself. Plus what the smallest scale cannot resolve:
  // fp8 block-128 elements below 2^-10 of the 1e-4 / fp8_max floor scale round to 0, so do MX elements
  // below a quarter of the smallest e8m0 scale 2^-127, and nvfp4 blocks whose amax / 6 * global_scale is
  // below half the smallest e4m3 step (a block far below its group's amax).
  std::mt19937_64 random(16);
  for (const auto format : kFormatCases) {
    SiluCase test = random_silu_case(random, format, false, 0.0f);
    const int n = test.shape.n;
    const int block_size = rocep::format_block_elements(format.format);
    const float tolerance = format.format == TokenFormat::kMxfp4   ? 1.0f / 3
                            : format.format == TokenFormat::kNvfp4 ? 0.25f
                            : format.format == TokenFormat::kBf16  ? 1.0f / 256
                                                                   : 1.0f / 16;
    // nvfp4: each group's global scale as a caller picks it, 448 * 6 / the group's amax.
    for (int group = 0; group < test.shape.num_groups; ++group) {
      float amax = 0.0f;
      for (uint32_t row = test.row_offsets[group]; row < test.row_offsets[group + 1]; ++row) {
        for (const float value : expected_values(test, row)) {
          amax = std::isfinite(value) ? std::max(amax, std::fabs(value)) : amax;
        }
      }
      test.global_scales[group] = amax > 0.0f ? 448.0f * 6.0f / amax : 1.0f;
    }
    const SiluOutputs outputs = run_reference(test);
    const std::size_t row_bytes = rocep::format_payload_bytes(format.format, n);
    std::vector<float> dequantised(n);
    for (std::size_t row = 0; row < test.rows(); ++row) {
      int group = 0;
      while (row >= test.row_offsets[group + 1]) {
        ++group;
      }
      const std::vector<uint8_t> scales = row_scales(test, outputs, row);
      rocep::reference::dequantize_row(format.format, format.encoding, outputs.out.data() + row * row_bytes,
                                       scales.data(), n, test.global_scales[group], dequantised.data());
      const std::vector<float> values = expected_values(test, row);
      for (int first = 0; first < n; first += block_size) {
        float amax = 0.0f;
        bool finite = true;
        for (int i = first; i < first + block_size; ++i) {
          finite = finite && std::isfinite(values[i]);
          amax = std::max(amax, std::fabs(values[i]));
        }
        for (int i = first; i < first + block_size; ++i) {
          const std::string where = test.describe() + ", row " + std::to_string(row) + ", column " +
                                    std::to_string(i) + ": value " + std::to_string(values[i]) +
                                    ", dequantised " + std::to_string(dequantised[i]);
          if (!finite) {
            EXPECT_TRUE(format.format == TokenFormat::kBf16 ? !std::isfinite(dequantised[i])
                                                            : std::isnan(dequantised[i]))
                << where;
          } else if (format.format == TokenFormat::kBf16) {
            EXPECT_LE(std::fabs(dequantised[i] - values[i]), tolerance * std::fabs(values[i])) << where;
          } else {
            const float floor = format.format == TokenFormat::kFp8Block128 ? 1e-9f
                                : format.format == TokenFormat::kNvfp4
                                    ? 6.0f * 0x1p-8f / test.global_scales[group]
                                    : 0x1p-128f;  // MX: 2^-127 / 2
            EXPECT_LE(std::fabs(dequantised[i] - values[i]), tolerance * amax + floor) << where;
          }
        }
      }
    }
  }
}

TEST(SiluReferenceTest, InvalidArgumentsThrowInvalidInputErrorNamingTheField) {
  std::mt19937_64 random(17);
  const SiluCase test = random_silu_case(random, {TokenFormat::kNvfp4, Fp8Encoding::kE4m3fn}, false, 0.0f);
  SiluOutputs outputs(test);
  const SiluArgs valid =
      rocep::testing::silu_args(test, test.gate_up.data(), outputs.out.data(), outputs.scales.data(),
                                test.row_offsets.data(), test.global_scales.data());
  EXPECT_NO_THROW(rocep::silu_and_quantize_reference(valid));
  for (const rocep::testing::InvalidSiluArgument& invalid : rocep::testing::kInvalidSiluArguments) {
    SiluArgs args = valid;
    invalid.spoil(args);
    try {
      rocep::silu_and_quantize_reference(args);
      ADD_FAILURE() << "no exception for a bad " << invalid.field;
    } catch (const rocep::InvalidInputError& error) {
      EXPECT_NE(std::string(error.what()).find(std::string("SiluArgs.") + invalid.field), std::string::npos)
          << error.what();
    }
  }
}

#if defined(ROCEP_TEST_NO_GPU_PLATFORM)
TEST(SiluReferenceTest, GpuCallThrowsConfigErrorWithoutAGpuPlatform) {
  EXPECT_THROW(rocep::silu_and_quantize(SiluArgs{}), rocep::ConfigError);
}
#endif

}  // namespace
