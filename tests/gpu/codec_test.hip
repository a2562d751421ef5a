// The device codecs (hip/codecs.hpp) compiled for the GPU against the CPU reference (host/codecs.hpp), bit
// for bit: element encoders over every bf16, random float32 patterns and every rounding boundary; every
// decoder code; rows quantised by the scale helpers composed as a kernel composes them, and by the kernels'
// own quantiser (hip/quantize.hpp) with dispatch's 8 and SiLU's 16 elements per thread; and the SiLU math
// (hip/silu_math.hpp) with the bf16 pair conversion of its outputs. The same checks pass on the host
// (tests/cpu/codec_test.cpp, silu_reference_test.cpp), so a difference here is the device compilation's:
// a contracted multiply-add, a flushed subnormal, a different division.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "codec_cases.hpp"
#include "gpu_support.hpp"
#include "hip/bf16.hpp"
#include "hip/codecs.hpp"
#include "hip/quantize.hpp"
#include "hip/silu_math.hpp"
#include "host/device_memory.hpp"
#include "host/gpu_check.hpp"
#include "mpi_support.hpp"

namespace {

using rocep::DeviceBuffer;
using rocep::testing::Element;
using rocep::testing::FormatCase;
using rocep::testing::QuantizedRows;
using rocep::testing::RowCase;

namespace device = rocep::device;

constexpr int kThreads = 256;
// What the output buffers hold before a kernel writes them: a byte it fails to write shows as this.
constexpr uint8_t kUnwritten = 0xA5;

int grid_for(std::size_t items) {
  return static_cast<int>((items + kThreads - 1) / kThreads);
}

__global__ void encode_elements(Element element, const float* inputs, int count, uint8_t* codes) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < count) {
    codes[i] = rocep::testing::device_encode(element, inputs[i]);
  }
}

__global__ void decode_every_code(rocep::testing::DecodedCodes* decoded) {
  rocep::testing::device_decode(threadIdx.x, *decoded);
}

// One thread per block of every row.
__global__ void quantize_rows(device::Format format, device::Fp8 encoding, const float* values, int rows,
                              int columns, float global_scale, uint8_t* payload, int payload_bytes,
                              uint8_t* scales, int scale_bytes) {
  const int blocks_per_row = columns / device::block_elements(format);
  const int block = blockIdx.x * blockDim.x + threadIdx.x;
  if (block < rows * blocks_per_row) {
    const int row = block / blocks_per_row;
    rocep::testing::quantize_block_with_device_codecs(
        format, encoding, values + static_cast<std::size_t>(row) * columns, block % blocks_per_row,
        global_scale, payload + static_cast<std::size_t>(row) * payload_bytes,
        scales + static_cast<std::size_t>(row) * scale_bytes);
  }
}

// The rows (`count` elements, whole scale blocks) quantised by quantize_elements as the kernels call it:
// kCount consecutive elements per thread, every lane of a wave calling it (lanes past the end with zeros),
// the block's first lane storing its scale; payload and scales laid out as reference::quantize_row lays
// them out.
template <device::Format kFormat, int kCount>
__global__ void quantize_elements_of_rows(const float* values, std::size_t count, device::Fp8 encoding,
                                          float global_scale, uint8_t* payload, uint8_t* scales) {
  const std::size_t first = (static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kCount;
  float elements[kCount] = {};
  for (int i = 0; i < kCount && first < count; ++i) {
    elements[i] = values[first + i];
  }
  const device::QuantizedElements<kCount> q =
      device::quantize_elements<kFormat, kCount>(elements, encoding, global_scale);
  if (first >= count) {
    return;
  }
  constexpr int code_bytes = device::elements_payload_bytes(kFormat, kCount);
  __builtin_memcpy(payload + first / kCount * code_bytes, q.codes, code_bytes);
  if (first % device::block_elements(kFormat) == 0) {
    const std::size_t block = first / device::block_elements(kFormat);
    if constexpr (kFormat == device::Format::kFp8Block128) {
      __builtin_memcpy(scales + 4 * block, &q.scale, 4);
    } else {
      scales[block] = static_cast<uint8_t>(q.scale);
    }
  }
}

template <int kCount>
QuantizedRows quantize_elements_on_device(const FormatCase& format_case, const RowCase& row_case) {
  const std::size_t count = row_case.values.size();
  const std::size_t blocks = count / rocep::format_block_elements(format_case.format);
  const std::size_t scale_bytes = format_case.format == rocep::TokenFormat::kFp8Block128 ? 4 : 1;
  const DeviceBuffer values = rocep::testing::upload(row_case.values);
  DeviceBuffer payload(rocep::format_payload_bytes(format_case.format, static_cast<int>(count)));
  DeviceBuffer scales(blocks * scale_bytes);
  rocep::testing::fill_bytes(payload, kUnwritten);
  rocep::testing::fill_bytes(scales, kUnwritten);
  const float* in = values.as<float>();
  const device::Fp8 encoding = rocep::testing::device_fp8(format_case.encoding);
  const int grid = grid_for(count / kCount);
  switch (rocep::testing::device_format(format_case.format)) {
    case device::Format::kFp8Block128:
      quantize_elements_of_rows<device::Format::kFp8Block128, kCount><<<grid, kThreads>>>(
          in, count, encoding, row_case.global_scale, payload.as<uint8_t>(), scales.as<uint8_t>());
      break;
    case device::Format::kMxfp8:
      quantize_elements_of_rows<device::Format::kMxfp8, kCount><<<grid, kThreads>>>(
          in, count, encoding, row_case.global_scale, payload.as<uint8_t>(), scales.as<uint8_t>());
      break;
    case device::Format::kMxfp4:
      quantize_elements_of_rows<device::Format::kMxfp4, kCount><<<grid, kThreads>>>(
          in, count, encoding, row_case.global_scale, payload.as<uint8_t>(), scales.as<uint8_t>());
      break;
    default:
      quantize_elements_of_rows<device::Format::kNvfp4, kCount><<<grid, kThreads>>>(
          in, count, encoding, row_case.global_scale, payload.as<uint8_t>(), scales.as<uint8_t>());
  }
  ROCEP_GPU_CHECK(hipGetLastError());
  return {rocep::testing::download<uint8_t>(payload, payload.bytes()),
          rocep::testing::download<uint8_t>(scales, scales.bytes())};
}

// silu of every input, and the bf16 pair (input, silu) as the bf16 SiLU output stores it.
__global__ void silu_and_pairs(const float* inputs, int count, float* silu_values, uint32_t* pairs) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < count) {
    silu_values[i] = device::silu(inputs[i]);
    pairs[i] = rocep::float_pair_to_bf16_canonical(inputs[i], silu_values[i]);
  }
}

std::vector<uint8_t> encode_on_device(Element element, const std::vector<float>& inputs) {
  const DeviceBuffer device_inputs = rocep::testing::upload(inputs);
  DeviceBuffer codes(inputs.size());
  rocep::testing::fill_bytes(codes, kUnwritten);
  const int count = static_cast<int>(inputs.size());
  encode_elements<<<grid_for(inputs.size()), kThreads>>>(element, device_inputs.as<float>(), count,
                                                         codes.as<uint8_t>());
  ROCEP_GPU_CHECK(hipGetLastError());
  return rocep::testing::download<uint8_t>(codes, inputs.size());
}

QuantizedRows quantize_on_device(const FormatCase& format_case, const RowCase& row_case) {
  const int columns = row_case.columns;
  const int rows = static_cast<int>(row_case.values.size() / columns);
  const int payload_bytes = static_cast<int>(rocep::format_payload_bytes(format_case.format, columns));
  const int scale_bytes = static_cast<int>(rocep::format_scale_bytes(format_case.format, columns));
  const int blocks = rows * (columns / rocep::format_block_elements(format_case.format));
  const DeviceBuffer values = rocep::testing::upload(row_case.values);
  DeviceBuffer payload(static_cast<std::size_t>(rows) * payload_bytes);
  DeviceBuffer scales(std::max(static_cast<std::size_t>(rows) * scale_bytes, std::size_t{1}));
  rocep::testing::fill_bytes(payload, kUnwritten);
  rocep::testing::fill_bytes(scales, kUnwritten);
  quantize_rows<<<grid_for(blocks), kThreads>>>(
      rocep::testing::device_format(format_case.format), rocep::testing::device_fp8(format_case.encoding),
      values.as<float>(), rows, columns, row_case.global_scale, payload.as<uint8_t>(), payload_bytes,
      scales.as<uint8_t>(), scale_bytes);
  ROCEP_GPU_CHECK(hipGetLastError());
  return {rocep::testing::download<uint8_t>(payload, payload.bytes()),
          rocep::testing::download<uint8_t>(scales, static_cast<std::size_t>(rows) * scale_bytes)};
}

class GpuCodecTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!rocep::testing::use_rank_gpu()) {
      GTEST_SKIP() << "no GPU visible (hipGetDeviceCount/cudaGetDeviceCount returned 0): device codec tests "
                      "not run";
    }
  }
};

TEST_F(GpuCodecTest, EncodersMatchReference) {
  const uint64_t seed = rocep::testing::fresh_seed();
  SCOPED_TRACE(rocep::testing::seed_trace(seed));
  std::vector<float> inputs = rocep::testing::bf16_inputs();
  const std::vector<float> random = rocep::testing::random_float_inputs(seed, 1u << 18);
  inputs.insert(inputs.end(), random.begin(), random.end());
  for (Element element : rocep::testing::kElements) {
    std::vector<float> element_inputs = inputs;
    const std::vector<float> boundaries = rocep::testing::boundary_inputs(element);
    element_inputs.insert(element_inputs.end(), boundaries.begin(), boundaries.end());
    EXPECT_TRUE(rocep::testing::same_codes_as_reference(element, element_inputs,
                                                        encode_on_device(element, element_inputs)));
  }
}

// Every bf16 (the kernels' gate values) and every 251st float32 bit pattern: silu's division on the
// device is the IEEE quotient wherever the inputs take it, including subnormal and infinite numerators.
TEST_F(GpuCodecTest, SiluAndBf16PairsMatchReference) {
  std::vector<float> inputs = rocep::testing::bf16_inputs();
  for (uint64_t bits = 0; bits <= 0xffffffffull; bits += 251) {
    inputs.push_back(device::bits_float(static_cast<uint32_t>(bits)));
  }
  const int count = static_cast<int>(inputs.size());
  const DeviceBuffer device_inputs = rocep::testing::upload(inputs);
  DeviceBuffer silu_values(inputs.size() * sizeof(float));
  DeviceBuffer pairs(inputs.size() * sizeof(uint32_t));
  silu_and_pairs<<<grid_for(inputs.size()), kThreads>>>(device_inputs.as<float>(), count,
                                                        silu_values.as<float>(), pairs.as<uint32_t>());
  ROCEP_GPU_CHECK(hipGetLastError());
  const std::vector<float> gpu_silu = rocep::testing::download<float>(silu_values, inputs.size());
  const std::vector<uint32_t> gpu_pairs = rocep::testing::download<uint32_t>(pairs, inputs.size());
  std::vector<float> expected_silu(inputs.size());
  std::size_t pair_mismatches = 0;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    expected_silu[i] = device::silu(inputs[i]);
    const uint32_t expected_pair = rocep::float_pair_to_bf16_canonical(inputs[i], expected_silu[i]);
    if (gpu_pairs[i] != expected_pair && ++pair_mismatches <= 8) {
      ADD_FAILURE() << "bf16 pair of " << rocep::testing::describe(inputs[i]) << " and its silu: GPU "
                    << rocep::testing::hex(gpu_pairs[i], 8) << ", reference "
                    << rocep::testing::hex(expected_pair, 8);
    }
  }
  EXPECT_EQ(pair_mismatches, 0u);
  EXPECT_TRUE(rocep::testing::same_floats("silu", gpu_silu, expected_silu));
}

TEST_F(GpuCodecTest, DecodersMatchReference) {
  DeviceBuffer decoded(sizeof(rocep::testing::DecodedCodes));
  decode_every_code<<<1, 256>>>(decoded.as<rocep::testing::DecodedCodes>());
  ROCEP_GPU_CHECK(hipGetLastError());
  EXPECT_TRUE(
      rocep::testing::same_decoded(rocep::testing::download<rocep::testing::DecodedCodes>(decoded, 1)[0],
                                   rocep::testing::reference_decoded_codes()));
}

TEST_F(GpuCodecTest, QuantizedRowsMatchReference) {
  const uint64_t seed = rocep::testing::fresh_seed();
  SCOPED_TRACE(rocep::testing::seed_trace(seed));
  for (const FormatCase& format_case : rocep::testing::kFormatCases) {
    for (const RowCase& row_case : rocep::testing::row_cases(format_case, seed)) {
      EXPECT_TRUE(rocep::testing::same_as_reference(format_case, row_case,
                                                    quantize_on_device(format_case, row_case)));
    }
  }
}

// The same rows through the kernels' own quantiser, with dispatch's and SiLU's elements per thread: it
// takes the scale helpers' results in its own order (mxfp4's factor inside the rounding multiply-adds,
// but for scale code 0), so it is checked on its own.
TEST_F(GpuCodecTest, KernelQuantiserMatchesReference) {
  const uint64_t seed = rocep::testing::fresh_seed();
  SCOPED_TRACE(rocep::testing::seed_trace(seed));
  for (const FormatCase& format_case : rocep::testing::kFormatCases) {
    if (format_case.format == rocep::TokenFormat::kBf16) {
      continue;
    }
    for (const RowCase& row_case : rocep::testing::row_cases(format_case, seed)) {
      SCOPED_TRACE(rocep::testing::to_string(format_case) + ", " + row_case.name);
      EXPECT_TRUE(rocep::testing::same_as_reference(format_case, row_case,
                                                    quantize_elements_on_device<8>(format_case, row_case)));
      EXPECT_TRUE(rocep::testing::same_as_reference(format_case, row_case,
                                                    quantize_elements_on_device<16>(format_case, row_case)));
    }
  }
}

}  // namespace
