// Fused SiLU + quantisation benchmark, one process on one GPU. For every output format and both gate/up
// layouts: a bit-for-bit check of the GPU against the CPU reference on a smaller call, then the median
// device time of --iterations calls on rows x [2n] bf16 (events between consecutive calls, after a
// warm-up), the bytes each call reads and writes, and their rate as a fraction of the HBM copy peak
// measured in the same run (a device-to-device copy, its bytes counted as read + written).
//
//   rocep_silu_bench [--rows=32768] [--n=2048] [--iterations=100] [--check_rows=2048]
//
// Exit status 1 when a check fails (the kernels and the reference disagree); the table marks each case
// against the 85% target.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "bench/device_timing.hpp"
#include "bench/flags.hpp"
#include "hip/platform.hpp"
#include "host/device.hpp"
#include "host/device_memory.hpp"
#include "host/gpu_check.hpp"
#include "rocep/errors.hpp"
#include "rocep/silu.hpp"
#include "tests/gpu/gpu_support.hpp"
#include "tests/silu_cases.hpp"

namespace {

using rocep::DeviceBuffer;
using rocep::Fp8Encoding;
using rocep::SiluArgs;
using rocep::TokenFormat;
using rocep::bench::copy_peak_bytes_per_second;
using rocep::bench::kWarmUpSeconds;
using rocep::bench::median_seconds;

constexpr double kTargetFraction = 0.85;
constexpr int kGroups = 8;  // the rows are split evenly over this many groups (experts)

struct Options {
  int rows = 32768;
  int n = 2048;
  int iterations = 100;
  int check_rows = 2048;
};

constexpr const char* kUsage =
    "usage: rocep_silu_bench [--rows=32768] [--n=2048] [--iterations=100] [--check_rows=2048]\n"
    "  times rocep::silu_and_quantize in every output format and layout on one GPU, each first checked\n"
    "  bit for bit against the CPU reference on --check_rows rows; --n a multiple of 128\n";

// The options, or none where --help printed the usage.
std::optional<Options> parse_options(int argc, char** argv) {
  Options options;
  if (!rocep::bench::parse_int_flags(argc, argv,
                                     {{"rows", &options.rows},
                                      {"n", &options.n},
                                      {"iterations", &options.iterations},
                                      {"check_rows", &options.check_rows}},
                                     kUsage)) {
    return std::nullopt;
  }
  // Every format runs: n must be whole blocks of each (fp8 block-128's 128 covers the others).
  const int multiple = rocep::format_column_multiple(TokenFormat::kFp8Block128);
  if (options.n % multiple != 0) {
    throw rocep::ConfigError("--n = " + std::to_string(options.n) +
                             " is invalid: every format runs, so it must be a multiple of " +
                             std::to_string(multiple));
  }
  return options;
}

// One case: `rows` rows split evenly over kGroups groups, capacity = rows.
rocep::testing::SiluCase make_case(std::mt19937_64& random, rocep::testing::FormatCase format,
                                   bool interleaved, int rows, int n) {
  rocep::testing::SiluCase test;
  test.shape.format = format.format;
  test.shape.fp8_encoding = rocep::resolve_fp8_encoding(format.encoding, rocep::current_device());
  test.shape.interleaved = interleaved;
  test.shape.n = n;
  test.shape.num_groups = kGroups;
  test.shape.capacity_rows = static_cast<std::size_t>(rows);
  for (int group = 0; group <= kGroups; ++group) {
    test.row_offsets.push_back(static_cast<uint32_t>(static_cast<int64_t>(rows) * group / kGroups));
  }
  test.global_scales.assign(kGroups, 448.0f * 6.0f / 64.0f);  // |silu(g) * u| <= 64 for inputs in [-8, 8]
  test.gate_up = rocep::testing::random_gate_up(random, test.shape.capacity_rows, n, /*unusual_rows=*/false);
  return test;
}

// The device side of one case, outputs poisoned.
struct DeviceCase {
  explicit DeviceCase(const rocep::testing::SiluCase& test)
      : gate_up(rocep::testing::upload(test.gate_up)),
        row_offsets(rocep::testing::upload(test.row_offsets)),
        global_scales(rocep::testing::upload(test.global_scales)),
        out(test.out_bytes()),
        scales(test.scale_bytes()),
        args(rocep::testing::silu_args(test, gate_up.get(), out.get(), scales.get(),
                                       row_offsets.as<uint32_t>(), global_scales.as<float>())) {
    ROCEP_GPU_CHECK(hipMemset(out.get(), rocep::testing::kSiluPoison, out.bytes()));
    ROCEP_GPU_CHECK(hipMemset(scales.get(), rocep::testing::kSiluPoison, scales.bytes()));
  }
  DeviceBuffer gate_up, row_offsets, global_scales, out, scales;
  SiluArgs args;
};

// "identical", or where the GPU and the reference first differ.
std::string check_against_reference(const rocep::testing::SiluCase& test, hipStream_t stream) {
  const DeviceCase device(test);
  rocep::silu_and_quantize(device.args, stream);
  ROCEP_GPU_CHECK(hipStreamSynchronize(stream));
  const rocep::testing::SiluOutputs expected = rocep::testing::run_reference(test);
  for (const auto& [buffer, reference, name] :
       {std::make_tuple(&device.out, &expected.out, "out"),
        std::make_tuple(&device.scales, &expected.scales, "scales")}) {
    const std::vector<uint8_t> gpu = rocep::testing::download<uint8_t>(*buffer, buffer->bytes());
    const auto mismatch = std::mismatch(gpu.begin(), gpu.end(), reference->begin());
    if (mismatch.first != gpu.end()) {
      return std::string("MISMATCH ") + name + " byte " + std::to_string(mismatch.first - gpu.begin());
    }
  }
  return "identical";
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::optional<Options> parsed = parse_options(argc, argv);
    if (!parsed) {
      return 0;
    }
    const Options& options = *parsed;
    if (rocep::device_count() == 0) {
      std::printf("rocep_silu_bench: no GPU visible: nothing to time\n");
      return 0;
    }
    const int device = rocep::current_device();
    hipDeviceProp_t properties;
    ROCEP_GPU_CHECK(hipGetDeviceProperties(&properties, device));
    const rocep::Stream stream;
    const double peak = copy_peak_bytes_per_second(stream.get(), options.iterations);
    std::printf(
        "rocep_silu_bench: %s (%d multiprocessors), rows %d, n %d, median of %d calls after %.0f ms of "
        "warm-up calls\n",
        properties.name, properties.multiProcessorCount, options.rows, options.n, options.iterations,
        kWarmUpSeconds * 1e3);
    std::printf(
        "HBM copy peak in this run: %.1f GB/s (device-to-device copy of 1 GiB, read + written bytes)\n",
        peak / 1e9);
    std::printf("check: GPU against the CPU reference, bit for bit, on %d rows of the same n\n\n",
                std::min(options.check_rows, options.rows));
    std::printf("%-14s %-12s %-10s %10s %10s %12s %10s %8s  %s\n", "format", "encoding", "layout",
                "time [us]", "read [MB]", "written [MB]", "GB/s", "of peak", "check");

    std::mt19937_64 random(2024);
    bool all_identical = true;
    bool all_on_target = true;
    for (const auto format : rocep::testing::kFormatCases) {
      if (format.format == TokenFormat::kFp8Block128 && format.encoding == Fp8Encoding::kE4m3fnuz) {
        continue;  // fp8 runs once, in the device's own encoding (kAuto)
      }
      const rocep::testing::FormatCase tested{
          format.format, format.format == TokenFormat::kFp8Block128 ? Fp8Encoding::kAuto : format.encoding};
      for (const bool interleaved : {false, true}) {
        const std::string check = check_against_reference(
            make_case(random, tested, interleaved, std::min(options.check_rows, options.rows), options.n),
            stream.get());
        all_identical = all_identical && check == "identical";

        const rocep::testing::SiluCase test = make_case(random, tested, interleaved, options.rows, options.n);
        const DeviceCase device_case(test);
        const double seconds = median_seconds(stream.get(), options.iterations, [&] {
          rocep::silu_and_quantize(device_case.args, stream.get());
        });
        const double read = static_cast<double>(test.gate_up.size() * sizeof(uint16_t));
        const double written = static_cast<double>(
            test.out_bytes() +
            rocep::format_scale_tensor_bytes(test.shape.format, test.shape.capacity_rows, test.shape.n));
        const double rate = (read + written) / seconds;
        const bool on_target = rate >= kTargetFraction * peak;
        all_on_target = all_on_target && on_target;
        std::printf(
            "%-14s %-12s %-10s %10.1f %10.1f %12.1f %10.1f %7.1f%%  %s%s\n",
            rocep::to_string(test.shape.format),
            test.shape.format == TokenFormat::kFp8Block128 ? rocep::to_string(test.shape.fp8_encoding) : "-",
            interleaved ? "interleaved" : "plain", seconds * 1e6, read / 1e6, written / 1e6, rate / 1e9,
            100.0 * rate / peak, check.c_str(), on_target ? "" : "  BELOW 85% TARGET");
      }
    }
    std::printf(
        "\nchecks: %s; bandwidth: %s\n", all_identical ? "all identical" : "SOME MISMATCH",
        all_on_target ? "every case at >= 85% of the copy peak" : "SOME CASES BELOW 85% of the copy peak");
    return all_identical ? 0 : 1;
  } catch (const std::exception& error) {  // rocep's errors, and memory the sizes asked for
    std::fprintf(stderr, "rocep_silu_bench: %s\n", error.what());
    return 1;
  }
}
