// The CPU reference of the quantised token formats, restating include/rocep/formats.hpp without
// hip/codecs.hpp. An element conversion decodes every code of the type by the textbook formula and picks
// the nearest value; the decision is made in double, where each of those values, each float32 input and
// each midpoint between two neighbours is exact, so no rounding can tip it. The block rules are single
// float32 operations in the order formats.hpp writes them.
#include "codecs.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "hip/bf16.hpp"

namespace rocep::reference {

namespace {

// Where a type puts its NaN, which decides whether it has a -0.
enum class NanCode {
  kNone,          // e2m1: no NaN, a -0
  kAllOnes,       // e4m3fn: S.1111.111 is NaN, a -0
  kNegativeZero,  // e4m3fnuz: 1.0000.000 is NaN, so no -0
};

// One minifloat element type: its codes, their values, and the conversion of a float to the nearest code.
class ElementType {
 public:
  ElementType(const char* name, int exponent_bits, int mantissa_bits, int bias, NanCode nan)
      : name_(name), nan_(nan), sign_bit_(1u << (exponent_bits + mantissa_bits)) {
    const unsigned codes = sign_bit_ << 1;
    for (unsigned code = 0; code < codes; ++code) {
      const unsigned exponent = (code >> mantissa_bits) & ((1u << exponent_bits) - 1);
      const unsigned mantissa = code & ((1u << mantissa_bits) - 1);
      // Textbook: subnormal 0.m * 2^(1 - bias), normal 1.m * 2^(exponent - bias).
      const double magnitude = exponent == 0 ? std::ldexp(mantissa, 1 - bias - mantissa_bits)
                                             : std::ldexp((1u << mantissa_bits) + mantissa,
                                                          static_cast<int>(exponent) - bias - mantissa_bits);
      const bool negative = (code & sign_bit_) != 0;
      const bool is_nan = (nan_ == NanCode::kAllOnes && (code & (sign_bit_ - 1)) == sign_bit_ - 1) ||
                          (nan_ == NanCode::kNegativeZero && code == sign_bit_);
      values_.push_back(is_nan ? std::numeric_limits<double>::quiet_NaN()
                               : (negative ? -magnitude : magnitude));
      if (!is_nan && !negative) {
        nonnegative_.push_back({magnitude, static_cast<uint8_t>(code)});
      }
    }
    std::sort(nonnegative_.begin(), nonnegative_.end(),
              [](const Code& a, const Code& b) { return a.value < b.value; });
  }

  float decode(uint8_t code) const { return static_cast<float>(values_[code]); }

  // Nearest value, ties to the code with an even mantissa, magnitudes above the largest value saturate;
  // NaN gives the NaN code; a negative value whose nearest magnitude is 0 is -0 where the type has one.
  uint8_t encode(float value) const {
    if (std::isnan(value)) {
      if (nan_ == NanCode::kNone) {
        throw std::invalid_argument(std::string("encode: ") + name_ +
                                    " has no NaN; a block holding a NaN is encoded whole as a NaN block");
      }
      return static_cast<uint8_t>(nan_ == NanCode::kAllOnes ? sign_bit_ - 1 : sign_bit_);
    }
    const double magnitude = std::fabs(static_cast<double>(value));
    uint8_t code = nonnegative_.back().code;  // the largest value: the saturated result
    if (magnitude < nonnegative_.back().value) {
      // upper is the first value above |x|, lower the one before (the table starts at 0 <= |x|).
      const auto upper = std::upper_bound(nonnegative_.begin(), nonnegative_.end(), magnitude,
                                          [](double x, const Code& entry) { return x < entry.value; });
      const auto lower = upper - 1;
      const double midpoint = (lower->value + upper->value) / 2;
      if (magnitude != midpoint) {
        code = magnitude < midpoint ? lower->code : upper->code;
      } else {  // a tie: the last bit of a code is the last bit of its mantissa
        code = (lower->code & 1u) == 0 ? lower->code : upper->code;
      }
    }
    const bool has_negative_zero = nan_ != NanCode::kNegativeZero;
    if (std::signbit(value) && (code != 0 || has_negative_zero)) {
      code = static_cast<uint8_t>(code | sign_bit_);
    }
    return code;
  }

 private:
  struct Code {
    double value;
    uint8_t code;
  };
  const char* name_;
  NanCode nan_;
  unsigned sign_bit_;
  std::vector<double> values_;     // by code, NaN for NaN codes
  std::vector<Code> nonnegative_;  // every non-negative value, ascending
};

const ElementType& e4m3fn() {
  static const ElementType type("e4m3fn", 4, 3, 7, NanCode::kAllOnes);
  return type;
}
const ElementType& e4m3fnuz() {
  static const ElementType type("e4m3fnuz", 4, 3, 8, NanCode::kNegativeZero);
  return type;
}
const ElementType& e2m1() {
  static const ElementType type("e2m1", 2, 1, 1, NanCode::kNone);
  return type;
}

const ElementType& fp8_type(Fp8Encoding encoding) {
  switch (encoding) {
    case Fp8Encoding::kE4m3fn:
      return e4m3fn();
    case Fp8Encoding::kE4m3fnuz:
      return e4m3fnuz();
    case Fp8Encoding::kAuto:
      break;
  }
  throw std::invalid_argument("fp8 encoding " + std::to_string(static_cast<int>(encoding)) +
                              " is not e4m3fn (1) or e4m3fnuz (2); kAuto must be resolved by the caller");
}

constexpr float kE4m3fnMax = 448.0f;
constexpr float kE4m3fnuzMax = 240.0f;
constexpr float kE2m1Max = 6.0f;
constexpr float kFp8ScaleFloor = 1e-4f;  // max(amax, 1e-4): an all-zero block still gets a usable scale
constexpr uint8_t kE8m0Nan = 0xff;
constexpr uint8_t kE4m3fnNan = 0x7f;

// Elements per block of `format`, after checking the arguments every row call shares: a known format,
// columns that fill whole blocks, and for fp8 block-128 a resolved encoding.
int checked_block_elements(const char* call, TokenFormat format, Fp8Encoding encoding, int columns) {
  switch (format) {
    case TokenFormat::kFp8Block128:
      fp8_type(encoding);
      [[fallthrough]];
    case TokenFormat::kBf16:
    case TokenFormat::kMxfp4:
    case TokenFormat::kNvfp4:
    case TokenFormat::kMxfp8: {
      const int block = format_block_elements(format);
      if (columns < 0 || columns % block != 0) {
        throw std::invalid_argument(std::string(call) + ": columns = " + std::to_string(columns) +
                                    " is not a whole number of " + to_string(format) + " blocks of " +
                                    std::to_string(block));
      }
      return block;
    }
  }
  throw std::invalid_argument(std::string(call) + ": format " + std::to_string(static_cast<int>(format)) +
                              " is not a token format");
}

// Largest |x| of a block, and whether every x is finite.
struct BlockMagnitude {
  float amax = 0.0f;
  bool finite = true;
};

BlockMagnitude block_magnitude(const float* values, int count) {
  BlockMagnitude block;
  for (int i = 0; i < count; ++i) {
    block.finite = block.finite && std::isfinite(values[i]);
    block.amax = std::max(block.amax, std::fabs(values[i]));
  }
  return block;
}

// 127 + ceil(log2(amax / element_max)), the quotient rounded to float32, clamped to [0, 254]; a quotient
// of 0 (amax = 0, or an underflow) has log2 = -inf and clamps to 0.
uint8_t mx_scale_code(float amax, float element_max) {
  const float quotient = amax / element_max;
  if (quotient == 0.0f) {
    return 0;
  }
  int exponent = 0;
  const float fraction = std::frexp(quotient, &exponent);  // quotient = fraction * 2^exponent, [0.5, 1)
  // log2(quotient) lies in [exponent - 1, exponent) and is exponent - 1 only at a power of two.
  const int ceil_log2 = fraction == 0.5f ? exponent - 1 : exponent;
  return static_cast<uint8_t>(std::clamp(127 + ceil_log2, 0, 254));
}

// Elements in the payload: one byte each, or (fp4) element 2i in the low nibble of byte i.
bool four_bit_elements(TokenFormat format) {
  return format == TokenFormat::kMxfp4 || format == TokenFormat::kNvfp4;
}

void store_element(TokenFormat format, uint8_t* payload, int index, uint8_t code) {
  if (!four_bit_elements(format)) {
    payload[index] = code;
  } else if (index % 2 == 0) {
    payload[index / 2] = static_cast<uint8_t>((payload[index / 2] & 0xf0u) | code);
  } else {
    payload[index / 2] = static_cast<uint8_t>((payload[index / 2] & 0x0fu) | (code << 4));
  }
}

uint8_t load_element(TokenFormat format, const uint8_t* payload, int index) {
  if (!four_bit_elements(format)) {
    return payload[index];
  }
  return static_cast<uint8_t>((payload[index / 2] >> (index % 2 == 0 ? 0 : 4)) & 0x0fu);
}

}  // namespace

uint8_t encode_fp8(float value, Fp8Encoding encoding) {
  return fp8_type(encoding).encode(value);
}

float decode_fp8(uint8_t code, Fp8Encoding encoding) {
  return fp8_type(encoding).decode(code);
}

uint8_t encode_e2m1(float value) {
  return e2m1().encode(value);
}

float decode_e2m1(uint8_t code) {
  return e2m1().decode(code & 0x0fu);
}

float decode_e8m0(uint8_t code) {
  if (code == kE8m0Nan) {
    return std::numeric_limits<float>::quiet_NaN();
  }
  return static_cast<float>(std::ldexp(1.0, code - 127));
}

void quantize_row(TokenFormat format, Fp8Encoding encoding, const float* values, int columns,
                  float global_scale, uint8_t* payload, uint8_t* scales) {
  const int block_size = checked_block_elements("quantize_row", format, encoding, columns);
  if (format == TokenFormat::kBf16) {
    for (int i = 0; i < columns; ++i) {
      const uint16_t bits = float_to_bf16(values[i]);
      std::memcpy(payload + 2 * static_cast<std::size_t>(i), &bits, sizeof bits);
    }
    return;
  }
  const bool usable_global_scale = std::isfinite(global_scale) && global_scale > 0.0f;
  for (int block = 0; block < columns / block_size; ++block) {
    const int first = block * block_size;
    const float* x = values + first;
    const BlockMagnitude magnitude = block_magnitude(x, block_size);
    // A NaN block: NaN scale, every element code 0.
    const bool nan_block = !magnitude.finite || (format == TokenFormat::kNvfp4 && !usable_global_scale);
    switch (format) {
      case TokenFormat::kFp8Block128: {
        const float fp8_max = encoding == Fp8Encoding::kE4m3fnuz ? kE4m3fnuzMax : kE4m3fnMax;
        const float floored_amax = std::max(magnitude.amax, kFp8ScaleFloor);
        const float scale = nan_block ? std::numeric_limits<float>::quiet_NaN() : floored_amax / fp8_max;
        std::memcpy(scales + sizeof(float) * block, &scale, sizeof scale);
        const float factor = fp8_max / floored_amax;
        for (int i = 0; i < block_size; ++i) {
          store_element(format, payload, first + i, nan_block ? 0 : fp8_type(encoding).encode(x[i] * factor));
        }
        break;
      }
      case TokenFormat::kMxfp8:
      case TokenFormat::kMxfp4: {
        const bool fp4 = format == TokenFormat::kMxfp4;
        const ElementType& type = fp4 ? e2m1() : e4m3fn();
        const uint8_t code =
            nan_block ? kE8m0Nan : mx_scale_code(magnitude.amax, fp4 ? kE2m1Max : kE4m3fnMax);
        scales[block] = code;
        const float scale = decode_e8m0(code);
        for (int i = 0; i < block_size; ++i) {
          store_element(format, payload, first + i, nan_block ? 0 : type.encode(x[i] / scale));
        }
        break;
      }
      case TokenFormat::kNvfp4: {
        const uint8_t sf = nan_block ? kE4m3fnNan : e4m3fn().encode(magnitude.amax / kE2m1Max * global_scale);
        scales[block] = sf;
        // sf = 0 leaves x * (global_scale / sf) without a value: every element is a zero, and like every
        // zero element of e2m1 it keeps the sign of x.
        const float factor = sf == 0 ? 0.0f : global_scale / e4m3fn().decode(sf);
        for (int i = 0; i < block_size; ++i) {
          const float element = sf == 0 ? std::copysign(0.0f, x[i]) : x[i] * factor;
          store_element(format, payload, first + i, nan_block ? 0 : e2m1().encode(element));
        }
        break;
      }
      case TokenFormat::kBf16:
        break;
    }
  }
}

void quantize_bf16_rows(TokenFormat format, Fp8Encoding encoding, const uint16_t* bits, int rows, int columns,
                        float global_scale, uint8_t* payloads, uint8_t* scales) {
  const std::size_t payload_bytes = format_payload_bytes(format, columns);
  const std::size_t scale_bytes = format_scale_bytes(format, columns);
  std::vector<float> values(static_cast<std::size_t>(columns));
  for (int row = 0; row < rows; ++row) {
    const uint16_t* row_bits = bits + static_cast<std::size_t>(row) * columns;
    std::transform(row_bits, row_bits + columns, values.begin(), bf16_to_float);
    quantize_row(format, encoding, values.data(), columns, global_scale, payloads + row * payload_bytes,
                 scales + row * scale_bytes);
  }
}

void write_input_rows(TokenFormat format, int columns, const uint8_t* payloads, const uint8_t* scales,
                      int rows, uint8_t* destination) {
  const std::size_t payload_bytes = format_payload_bytes(format, columns);
  const std::size_t scale_bytes = format_scale_bytes(format, columns);
  const std::size_t row_bytes = format_input_row_bytes(format, columns);
  for (std::size_t row = 0; row < static_cast<std::size_t>(rows); ++row) {
    std::memcpy(destination + row * row_bytes, payloads + row * payload_bytes, payload_bytes);
    std::memcpy(destination + row * row_bytes + payload_bytes, scales + row * scale_bytes, scale_bytes);
  }
}

void dequantize_row(TokenFormat format, Fp8Encoding encoding, const uint8_t* payload, const uint8_t* scales,
                    int columns, float global_scale, float* values) {
  const int block_size = checked_block_elements("dequantize_row", format, encoding, columns);
  if (format == TokenFormat::kBf16) {
    for (int i = 0; i < columns; ++i) {
      uint16_t bits = 0;
      std::memcpy(&bits, payload + 2 * static_cast<std::size_t>(i), sizeof bits);
      values[i] = bf16_to_float(bits);
    }
    return;
  }
  for (int i = 0; i < columns; ++i) {
    const int block = i / block_size;
    const uint8_t code = load_element(format, payload, i);
    switch (format) {
      case TokenFormat::kFp8Block128: {
        float scale = 0.0f;
        std::memcpy(&scale, scales + sizeof(float) * block, sizeof scale);
        values[i] = decode_fp8(code, encoding) * scale;
        break;
      }
      case TokenFormat::kMxfp8:
        values[i] = e4m3fn().decode(code) * decode_e8m0(scales[block]);
        break;
      case TokenFormat::kMxfp4:
        values[i] = e2m1().decode(code) * decode_e8m0(scales[block]);
        break;
      case TokenFormat::kNvfp4:
        values[i] = e2m1().decode(code) * e4m3fn().decode(scales[block]) / global_scale;
        break;
      case TokenFormat::kBf16:
        break;
    }
  }
}

}  // namespace rocep::reference
