// The fused SiLU kernels against the CPU reference, bit for bit, in every output format, layout and clamp
// setting, on fresh random inputs every run (the seed is printed with any failure; ROCEP_TEST_SEED
// replays it). Outputs and scales are poisoned before each call: rows past row_offsets[num_groups], the
// scale bytes of those rows and the bytes past every buffer must still hold the poison afterwards.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gpu_support.hpp"
#include "hip/platform.hpp"
#include "host/device.hpp"
#include "host/device_memory.hpp"
#include "host/gpu_check.hpp"
#include "mpi_support.hpp"
#include "rocep/errors.hpp"
#include "rocep/silu.hpp"
#include "silu_cases.hpp"

namespace {

using rocep::DeviceBuffer;
using rocep::Fp8Encoding;
using rocep::SiluArgs;
using rocep::TokenFormat;
using rocep::testing::kFormatCases;
using rocep::testing::kSiluPoison;
using rocep::testing::random_silu_case;
using rocep::testing::run_reference;
using rocep::testing::SiluCase;
using rocep::testing::SiluOutputs;
using rocep::testing::unwritten_bytes_problem;
using rocep::testing::upload;

// The device buffers of one case: inputs uploaded, outputs poisoned (kGuardBytes past the end included).
struct DeviceCase {
  explicit DeviceCase(const SiluCase& test)
      : gate_up(upload(test.gate_up)),
        row_offsets(upload(test.row_offsets)),
        global_scales(upload(test.global_scales)),
        out(test.out_bytes() + rocep::testing::kGuardBytes),
        scales(test.scale_bytes() + rocep::testing::kGuardBytes),
        args(rocep::testing::silu_args(test, gate_up.get(), out.get(), scales.get(),
                                       row_offsets.as<uint32_t>(), global_scales.as<float>())) {}
  void poison(hipStream_t stream) const {
    ROCEP_GPU_CHECK(hipMemsetAsync(out.get(), kSiluPoison, out.bytes(), stream));
    ROCEP_GPU_CHECK(hipMemsetAsync(scales.get(), kSiluPoison, scales.bytes(), stream));
  }
  SiluOutputs results(const SiluCase& test) const {
    SiluOutputs outputs(test);
    outputs.out = rocep::testing::download<uint8_t>(out, out.bytes());
    outputs.scales = rocep::testing::download<uint8_t>(scales, scales.bytes());
    return outputs;
  }
  DeviceBuffer gate_up, row_offsets, global_scales, out, scales;
  SiluArgs args;
};

// Where two byte vectors first differ, with the row of that byte, or "" when they are equal.
std::string first_difference(const std::vector<uint8_t>& gpu, const std::vector<uint8_t>& reference,
                             std::size_t row_bytes, const char* what) {
  for (std::size_t i = 0; i < gpu.size() && i < reference.size(); ++i) {
    if (gpu[i] != reference[i]) {
      return std::string(what) + " byte " + std::to_string(i) +
             (row_bytes > 0 ? " (row " + std::to_string(i / row_bytes) + ")" : "") + ": GPU " +
             std::to_string(gpu[i]) + ", reference " + std::to_string(reference[i]);
    }
  }
  return gpu.size() == reference.size() ? "" : std::string(what) + ": sizes differ";
}

class GpuSilu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!rocep::testing::use_rank_gpu()) {
      GTEST_SKIP() << "no GPU visible (hipGetDeviceCount/cudaGetDeviceCount returned 0): GPU SiLU tests not "
                      "run";
    }
    seed_ = rocep::testing::shared_seed() + 0x9e3779b97f4a7c15ull * (rocep::testing::world_rank() + 1);
    random_.seed(seed_);
  }

  // kAuto cases are compared with the encoding the device resolves it to.
  static SiluCase as_reference(SiluCase test) {
    test.shape.fp8_encoding = rocep::resolve_fp8_encoding(test.shape.fp8_encoding, rocep::current_device());
    return test;
  }

  // Runs `test` on the GPU (on `stream`) and on the CPU and compares every byte.
  void check(const SiluCase& test, hipStream_t stream = nullptr) {
    SCOPED_TRACE("seed " + std::to_string(seed_) + ", " + test.describe());
    const DeviceCase device(test);
    device.poison(stream);
    rocep::silu_and_quantize(device.args, stream);
    ROCEP_GPU_CHECK(hipStreamSynchronize(stream));
    expect_matches_reference(test, device.results(test));
  }

  void expect_matches_reference(const SiluCase& test, const SiluOutputs& gpu) {
    const SiluOutputs reference = run_reference(as_reference(test));
    const std::size_t row_bytes = rocep::format_payload_bytes(test.shape.format, test.shape.n);
    EXPECT_EQ(first_difference(gpu.out, reference.out, row_bytes, "out"), "");
    EXPECT_EQ(first_difference(gpu.scales, reference.scales, 0, "out_scales"), "");
    EXPECT_EQ(unwritten_bytes_problem(test, gpu), "");
  }

  uint64_t seed_ = 0;
  std::mt19937_64 random_;
};

TEST_F(GpuSilu, EveryFormatLayoutAndClampMatchesTheReferenceBitForBit) {
  std::uniform_real_distribution<float> limit(1.0f, 20.0f);
  for (const auto format : kFormatCases) {
    for (const bool interleaved : {false, true}) {
      for (const bool clamp : {false, true}) {
        for (int repeat = 0; repeat < 3; ++repeat) {
          check(random_silu_case(random_, format, interleaved, clamp ? limit(random_) : 0.0f));
        }
      }
    }
  }
}

// Thousands of rows: every block of the persistent grid loops several times, and nvfp4 rows cross many
// 128-row scale tiles and groups.
TEST_F(GpuSilu, ManyRowsMatchTheReference) {
  for (const auto format : kFormatCases) {
    SiluCase test = random_silu_case(random_, format, false, 0.0f);
    test.shape.n = 2048;
    test.shape.num_groups = 64;
    test.row_offsets.assign(1, 0);
    test.global_scales.clear();
    std::uniform_real_distribution<float> scale(0.5f, 4096.0f);
    for (int group = 0; group < test.shape.num_groups; ++group) {
      test.row_offsets.push_back(test.row_offsets.back() + static_cast<uint32_t>(random_() % 160));
      test.global_scales.push_back(scale(random_));
    }
    test.shape.capacity_rows = test.row_offsets.back() + 1 + random_() % 300;
    test.gate_up = rocep::testing::random_gate_up(random_, test.shape.capacity_rows, test.shape.n);
    check(test);
  }
}

TEST_F(GpuSilu, AutoEncodingIsTheDevicesOwn) {
  check(random_silu_case(random_, {TokenFormat::kFp8Block128, Fp8Encoding::kAuto}, false, 0.0f));
}

TEST_F(GpuSilu, ZeroRowCallLeavesEverythingPoisoned) {
  for (const auto format : kFormatCases) {
    SiluCase test = random_silu_case(random_, format, true, 5.0f);
    std::fill(test.row_offsets.begin(), test.row_offsets.end(), 0u);
    check(test);
  }
}

TEST_F(GpuSilu, RowCountAboveCapacityIsClamped) {
  for (const auto format : kFormatCases) {
    SiluCase test = random_silu_case(random_, format, false, 0.0f);
    // At least one row of capacity: a random case may have fewer than two rows, and an empty buffer has
    // no pointer to pass.
    test.shape.capacity_rows = std::max<uint32_t>(test.row_offsets.back() / 2, 1);
    test.gate_up.resize(test.shape.capacity_rows * 2 * test.shape.n);
    check(test);
  }
}

// On a stream of its own, and captured into a graph that is replayed after the inputs (row count
// included) change in device memory, as a server replays one graph per step.
TEST_F(GpuSilu, StreamOrderedAndGraphReplaysMatchTheReference) {
  rocep::Stream stream;
  for (const auto format : kFormatCases) {
    check(random_silu_case(random_, format, false, 0.0f), stream.get());
  }
  SiluCase test = random_silu_case(random_, {TokenFormat::kNvfp4, Fp8Encoding::kE4m3fn}, true, 0.0f);
  const DeviceCase device(test);
  hipGraph_t graph;
  hipGraphExec_t executable;
  ROCEP_GPU_CHECK(hipStreamBeginCapture(stream.get(), hipStreamCaptureModeThreadLocal));
  rocep::silu_and_quantize(device.args, stream.get());
  ROCEP_GPU_CHECK(hipStreamEndCapture(stream.get(), &graph));
  ROCEP_GPU_CHECK(hipGraphInstantiate(&executable, graph, nullptr, nullptr, 0));
  for (int replay = 0; replay < 3; ++replay) {
    SCOPED_TRACE("seed " + std::to_string(seed_) + ", graph replay " + std::to_string(replay));
    // New inputs of the same shape: fresh values, a new row count up to the capacity, split anew.
    test.gate_up = rocep::testing::random_gate_up(random_, test.shape.capacity_rows, test.shape.n);
    const auto total = static_cast<uint32_t>(random_() % (test.shape.capacity_rows + 1));
    for (std::size_t group = 1; group + 1 < test.row_offsets.size(); ++group) {
      test.row_offsets[group] = test.row_offsets[group - 1] +
                                static_cast<uint32_t>(random_() % (total - test.row_offsets[group - 1] + 1));
    }
    test.row_offsets.back() = total;
    ROCEP_GPU_CHECK(hipMemcpyAsync(device.gate_up.get(), test.gate_up.data(),
                                   test.gate_up.size() * sizeof(uint16_t), hipMemcpyHostToDevice,
                                   stream.get()));
    ROCEP_GPU_CHECK(hipMemcpyAsync(device.row_offsets.get(), test.row_offsets.data(),
                                   test.row_offsets.size() * sizeof(uint32_t), hipMemcpyHostToDevice,
                                   stream.get()));
    device.poison(stream.get());
    ROCEP_GPU_CHECK(hipGraphLaunch(executable, stream.get()));
    stream.synchronize();
    expect_matches_reference(test, device.results(test));
  }
  ROCEP_GPU_CHECK(hipGraphExecDestroy(executable));
  ROCEP_GPU_CHECK(hipGraphDestroy(graph));
}

TEST_F(GpuSilu, InvalidArgumentsThrowInvalidInputErrorNamingTheField) {
  const SiluCase test = random_silu_case(random_, {TokenFormat::kNvfp4, Fp8Encoding::kE4m3fn}, false, 0.0f);
  const DeviceCase device(test);
  for (const rocep::testing::InvalidSiluArgument& invalid : rocep::testing::kInvalidSiluArguments) {
    SiluArgs args = device.args;
    invalid.spoil(args);
    try {
      rocep::silu_and_quantize(args);
      ADD_FAILURE() << "no exception for a bad " << invalid.field;
    } catch (const rocep::InvalidInputError& error) {
      EXPECT_NE(std::string(error.what()).find(std::string("SiluArgs.") + invalid.field), std::string::npos)
          << error.what();
    }
  }
  ROCEP_GPU_CHECK(hipDeviceSynchronize());
}

}  // namespace
