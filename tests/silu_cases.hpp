// What the CPU and GPU tests of the fused SiLU kernels share: random cases (groups with random row counts,
// empty ones included, a capacity above the row count, bf16 inputs with large-magnitude and non-finite
// rows), poisoned output buffers, and which scale bytes belong to which row.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "format_cases.hpp"
#include "hip/bf16.hpp"
#include "hip/scale_layout.hpp"
#include "rocep/formats.hpp"
#include "rocep/silu.hpp"

namespace rocep::testing {

inline constexpr uint8_t kSiluPoison = 0xFF;
// Poisoned bytes past the end of every output buffer: a store past the buffer shows there.
inline constexpr std::size_t kGuardBytes = 256;

// Host-side inputs of one call, and the SiluArgs fields that are not pointers.
struct SiluCase {
  SiluArgs shape;  // pointers unset
  std::vector<uint16_t> gate_up;
  std::vector<uint32_t> row_offsets;
  std::vector<float> global_scales;

  std::size_t rows() const { return std::min<std::size_t>(row_offsets.back(), shape.capacity_rows); }
  std::size_t out_bytes() const { return shape.capacity_rows * format_payload_bytes(shape.format, shape.n); }
  std::size_t scale_bytes() const {
    return std::max<std::size_t>(1, format_scale_tensor_bytes(shape.format, shape.capacity_rows, shape.n));
  }
  std::string describe() const {
    return std::string(to_string(shape.format)) + "/" + to_string(shape.fp8_encoding) +
           (shape.interleaved ? " interleaved" : " plain") +
           (shape.clamp_limit > 0 ? " clamp " + std::to_string(shape.clamp_limit) : " no clamp") + ", n " +
           std::to_string(shape.n) + ", groups " + std::to_string(shape.num_groups) + ", rows " +
           std::to_string(row_offsets.back()) + ", capacity " + std::to_string(shape.capacity_rows);
  }
};

// A bf16 input in [-8, 8]. With `unusual_rows`, a row is "large" (|x| up to 2^23, so silu saturates both
// ways and the clamp bites) with probability 1/8, and holds one inf or NaN with probability 1/32.
inline std::vector<uint16_t> random_gate_up(std::mt19937_64& random, std::size_t rows, int n,
                                            bool unusual_rows = true) {
  std::uniform_real_distribution<float> moderate(-8.0f, 8.0f);
  std::uniform_real_distribution<float> exponent(0.0f, 20.0f);
  const std::size_t row_elements = 2 * static_cast<std::size_t>(n);
  std::vector<uint16_t> values(rows * row_elements);
  for (std::size_t row = 0; row < rows; ++row) {
    const bool large = unusual_rows && random() % 8 == 0;
    uint16_t* first = values.data() + row * row_elements;
    for (std::size_t i = 0; i < row_elements; ++i) {
      const float value = moderate(random);
      first[i] = float_to_bf16(large ? std::ldexp(value, static_cast<int>(exponent(random))) : value);
    }
    if (unusual_rows && random() % 32 == 0) {
      constexpr uint16_t kSpecials[] = {0x7f80, 0xff80, 0x7fc0, 0xffc1};  // +inf, -inf, NaN, NaN with payload
      first[random() % row_elements] = kSpecials[random() % 4];
    }
  }
  return values;
}

// num_groups in [5, 12], each with 0 rows (probability 1/4) or up to 40; capacity above the row count.
// Global scales: positive, except that with probability 1/4 one group gets an unusable one (0, -1, inf,
// NaN: every nvfp4 block of its rows is NaN).
inline SiluCase random_silu_case(std::mt19937_64& random, FormatCase format, bool interleaved,
                                 float clamp_limit) {
  SiluCase test;
  SiluArgs& shape = test.shape;
  shape.format = format.format;
  shape.fp8_encoding = format.encoding;
  shape.interleaved = interleaved;
  shape.clamp_limit = clamp_limit;
  constexpr int kColumns[] = {128, 256, 384, 640};  // multiples of every format's block
  shape.n = kColumns[random() % 4];
  shape.num_groups = 5 + static_cast<int>(random() % 8);
  test.row_offsets.push_back(0);
  std::uniform_real_distribution<float> scale(0.5f, 4096.0f);
  for (int group = 0; group < shape.num_groups; ++group) {
    const uint32_t rows = random() % 4 == 0 ? 0 : static_cast<uint32_t>(random() % 41);
    test.row_offsets.push_back(test.row_offsets.back() + rows);
    test.global_scales.push_back(scale(random));
  }
  if (random() % 4 == 0) {
    constexpr float kUnusable[] = {0.0f, -1.0f, std::numeric_limits<float>::infinity(),
                                   std::numeric_limits<float>::quiet_NaN()};
    test.global_scales[random() % shape.num_groups] = kUnusable[random() % 4];
  }
  shape.capacity_rows = test.row_offsets.back() + 1 + random() % 70;
  test.gate_up = random_gate_up(random, shape.capacity_rows, shape.n);
  return test;
}

// For every byte of the scale tensor of `test`, the row its scale belongs to, or -1 for the padding of the
// nvfp4 tiles (which no call writes).
inline std::vector<int64_t> scale_byte_rows(const SiluCase& test) {
  std::vector<int64_t> owners(test.scale_bytes(), -1);
  const auto format = static_cast<device::Format>(test.shape.format);
  const int blocks = test.shape.n / format_block_elements(test.shape.format);
  const int bytes = device::scale_bytes(format);
  for (std::size_t row = 0; row < test.shape.capacity_rows && bytes > 0; ++row) {
    for (int block = 0; block < blocks; ++block) {
      const std::size_t offset =
          device::scale_offset(format, row, block, test.shape.capacity_rows, test.shape.n);
      std::fill_n(owners.begin() + static_cast<std::ptrdiff_t>(offset), bytes, static_cast<int64_t>(row));
    }
  }
  return owners;
}

// Outputs of one call in host memory, poisoned, each with kGuardBytes past its end.
struct SiluOutputs {
  explicit SiluOutputs(const SiluCase& test)
      : out(test.out_bytes() + kGuardBytes, kSiluPoison),
        scales(test.scale_bytes() + kGuardBytes, kSiluPoison) {}
  std::vector<uint8_t> out;
  std::vector<uint8_t> scales;
};

// The arguments of `test` with its buffers at these addresses (host or device memory).
inline SiluArgs silu_args(const SiluCase& test, const void* gate_up, void* out, void* out_scales,
                          const uint32_t* row_offsets, const float* global_scales) {
  SiluArgs args = test.shape;
  args.gate_up = gate_up;
  args.out = out;
  args.out_scales = out_scales;
  args.row_offsets = row_offsets;
  args.global_scales = global_scales;
  return args;
}

// Runs the CPU reference on `test` into fresh poisoned outputs.
inline SiluOutputs run_reference(const SiluCase& test) {
  SiluOutputs outputs(test);
  silu_and_quantize_reference(silu_args(test, test.gate_up.data(), outputs.out.data(), outputs.scales.data(),
                                        test.row_offsets.data(), test.global_scales.data()));
  return outputs;
}

// Each argument the contract rejects with InvalidInputError (for an nvfp4 call, which uses every
// pointer), with the field its message must name.
struct InvalidSiluArgument {
  const char* field;
  void (*spoil)(SiluArgs&);
};
inline const InvalidSiluArgument kInvalidSiluArguments[] = {
    {"gate_up", [](SiluArgs& args) { args.gate_up = nullptr; }},
    {"gate_up", [](SiluArgs& args) { args.gate_up = static_cast<const uint16_t*>(args.gate_up) + 1; }},
    {"out", [](SiluArgs& args) { args.out = static_cast<uint8_t*>(args.out) + 2; }},
    {"out", [](SiluArgs& args) { args.out = nullptr; }},
    {"out_scales", [](SiluArgs& args) { args.out_scales = nullptr; }},
    {"row_offsets", [](SiluArgs& args) { args.row_offsets = nullptr; }},
    {"global_scales", [](SiluArgs& args) { args.global_scales = nullptr; }},
    {"num_groups", [](SiluArgs& args) { args.num_groups = 0; }},
    {"n", [](SiluArgs& args) { args.n = 96; }},
    {"n", [](SiluArgs& args) { args.n = -128; }},
    {"format", [](SiluArgs& args) { args.format = static_cast<TokenFormat>(9); }},
    {"fp8_encoding", [](SiluArgs& args) { args.fp8_encoding = static_cast<Fp8Encoding>(7); }},
    {"capacity_rows", [](SiluArgs& args) { args.capacity_rows = std::size_t{1} << 31; }},
    {"clamp_limit", [](SiluArgs& args) { args.clamp_limit = -1.0f; }},
};

// Empty when every payload byte of rows at or past test.rows(), every scale byte that does not belong to
// a written row and every guard byte still holds the poison; otherwise says where the first one does not.
inline std::string unwritten_bytes_problem(const SiluCase& test, const SiluOutputs& outputs) {
  const std::size_t row_bytes = format_payload_bytes(test.shape.format, test.shape.n);
  for (std::size_t i = test.rows() * row_bytes; i < outputs.out.size(); ++i) {
    if (outputs.out[i] != kSiluPoison) {
      return "out byte " + std::to_string(i) + " of row " + std::to_string(i / row_bytes) +
             " (rows = " + std::to_string(test.rows()) + ") was written";
    }
  }
  std::vector<int64_t> owners = scale_byte_rows(test);
  owners.resize(outputs.scales.size(), -1);  // the guard
  for (std::size_t i = 0; i < owners.size(); ++i) {
    const bool written_row = test.shape.format != TokenFormat::kBf16 && owners[i] >= 0 &&
                             static_cast<std::size_t>(owners[i]) < test.rows();
    if (!written_row && outputs.scales[i] != kSiluPoison) {
      return "scale byte " + std::to_string(i) + " of row " + std::to_string(owners[i]) +
             " (rows = " + std::to_string(test.rows()) + ") was written";
    }
  }
  return "";
}

}  // namespace rocep::testing
