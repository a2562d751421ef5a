// rocep::silu_and_quantize (GPU launch) and rocep::silu_and_quantize_reference (the CPU definition).
#include "rocep/silu.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "hip/bf16.hpp"
#include "hip/scale_layout.hpp"
#include "hip/silu_math.hpp"
#include "host/codecs.hpp"
#include "host/profiler_range.hpp"
#include "rocep/errors.hpp"

#if defined(ROCEP_GPU_BUILD)
#include <map>
#include <mutex>

#include "hip/silu_kernels.hpp"
#include "host/device.hpp"
#include "host/gpu_check.hpp"
#endif

namespace rocep {

namespace {

// Row indices are 32-bit in the kernels: the grid's cursors step past the last row by less than another
// 2^31 rows, so they never wrap.
constexpr std::size_t kMaxCapacityRows = (std::size_t{1} << 31) - 1;

[[noreturn]] void invalid(const char* call, const std::string& what) {
  throw InvalidInputError(std::string(call) + ": " + what);
}

void validate(const SiluArgs& args, const char* call) {
  const int format_code = static_cast<int>(args.format);
  if (format_code < static_cast<int>(TokenFormat::kBf16) ||
      format_code > static_cast<int>(TokenFormat::kMxfp8)) {
    invalid(call, "SiluArgs.format = " + std::to_string(format_code) +
                      " is invalid: allowed values are bf16, fp8_block128, mxfp4, nvfp4, mxfp8");
  }
  const int multiple = format_column_multiple(args.format);
  if (args.fp8_encoding != Fp8Encoding::kAuto && args.fp8_encoding != Fp8Encoding::kE4m3fn &&
      args.fp8_encoding != Fp8Encoding::kE4m3fnuz) {
    invalid(call, "SiluArgs.fp8_encoding = " + std::to_string(static_cast<int>(args.fp8_encoding)) +
                      " is invalid: allowed values are auto, e4m3fn, e4m3fnuz");
  }
  if (args.n <= 0 || args.n % multiple != 0) {
    invalid(call, "SiluArgs.n = " + std::to_string(args.n) + " is invalid for format " +
                      to_string(args.format) + ": must be a positive multiple of " +
                      std::to_string(multiple));
  }
  if (args.num_groups < 1) {
    invalid(call, "SiluArgs.num_groups = " + std::to_string(args.num_groups) + " is invalid: must be >= 1");
  }
  if (args.capacity_rows > kMaxCapacityRows) {
    invalid(call, "SiluArgs.capacity_rows = " + std::to_string(args.capacity_rows) +
                      " is invalid: allowed range is [0, " + std::to_string(kMaxCapacityRows) + "]");
  }
  if (!(args.clamp_limit >= 0.0f)) {
    invalid(call, "SiluArgs.clamp_limit = " + std::to_string(args.clamp_limit) +
                      " is invalid: must be >= 0 (0 = no clamp)");
  }
  const bool has_scales = args.format != TokenFormat::kBf16;
  for (const auto& [pointer, name] : {std::pair<const void*, const char*>{args.gate_up, "gate_up"},
                                      {args.out, "out"},
                                      {args.row_offsets, "row_offsets"}}) {
    if (pointer == nullptr) {
      invalid(call, std::string("SiluArgs.") + name + " is null");
    }
  }
  if (has_scales && args.out_scales == nullptr) {
    invalid(call, std::string("SiluArgs.out_scales is null, but format ") + to_string(args.format) +
                      " writes scales");
  }
  // The kernels load gate and up as 16-byte vectors and store 8 columns, and float32 scales, per access.
  const std::size_t scale_alignment =
      has_scales ? device::scale_bytes(static_cast<device::Format>(args.format)) : 1;
  for (const auto& [pointer, name, alignment] :
       {std::tuple<const void*, const char*, std::size_t>{args.gate_up, "gate_up", 16},
        {args.out, "out", format_payload_bytes(args.format, 8)},
        {args.out_scales, "out_scales", scale_alignment}}) {
    if (reinterpret_cast<std::uintptr_t>(pointer) % alignment != 0) {
      invalid(call,
              std::string("SiluArgs.") + name + " is not " + std::to_string(alignment) + "-byte aligned");
    }
  }
  if (args.format == TokenFormat::kNvfp4 && args.global_scales == nullptr) {
    invalid(call, "SiluArgs.global_scales is null, but format nvfp4 needs one global scale per group");
  }
}

}  // namespace

void silu_and_quantize_reference(const SiluArgs& args) {
  const ProfilerRange range("rocep::silu_and_quantize_reference");
  validate(args, "silu_and_quantize_reference");
  const int n = args.n;
  const auto format = static_cast<device::Format>(args.format);
  const Fp8Encoding encoding = reference::reference_fp8_encoding(args.fp8_encoding);
  const uint32_t* row_offsets = args.row_offsets;
  const std::size_t rows = std::min<std::size_t>(row_offsets[args.num_groups], args.capacity_rows);
  const std::size_t payload_bytes = format_payload_bytes(args.format, n);
  const int blocks = n / format_block_elements(args.format);
  const int scale_bytes = device::scale_bytes(format);
  const bool clamp = args.clamp_limit > 0.0f;

  std::vector<float> values(n);
  std::vector<uint8_t> row_scales(format_scale_bytes(args.format, n));
  for (std::size_t row = 0; row < rows; ++row) {
    const auto* gate_up = static_cast<const uint16_t*>(args.gate_up) + row * 2 * static_cast<std::size_t>(n);
    for (int column = 0; column < n; ++column) {
      float g = bf16_to_float(gate_up[args.interleaved ? 2 * column : column]);
      float u = bf16_to_float(gate_up[args.interleaved ? 2 * column + 1 : n + column]);
      if (clamp) {
        g = device::clamp_gate(g, args.clamp_limit);
        u = device::clamp_up(u, args.clamp_limit);
      }
      values[column] = canonical_nan(device::silu_product(g, u));
    }
    // The row's group: the first g with row < row_offsets[g + 1], the last group at most (as the kernels).
    float global_scale = 0.0f;
    if (args.format == TokenFormat::kNvfp4) {
      const uint32_t* end = row_offsets + args.num_groups;
      const auto group =
          std::upper_bound(row_offsets + 1, end, static_cast<uint32_t>(row)) - (row_offsets + 1);
      global_scale = args.global_scales[group];
    }
    reference::quantize_row(args.format, encoding, values.data(), n, global_scale,
                            static_cast<uint8_t*>(args.out) + row * payload_bytes, row_scales.data());
    for (int block = 0; block < blocks && scale_bytes > 0; ++block) {
      std::memcpy(static_cast<uint8_t*>(args.out_scales) +
                      device::scale_offset(format, row, block, args.capacity_rows, n),
                  row_scales.data() + static_cast<std::size_t>(block) * scale_bytes, scale_bytes);
    }
  }
}

#if defined(ROCEP_GPU_BUILD)

namespace {

// What a launch needs from its device, found once per device: the persistent grid (every block that fits
// at once, so no block waits for another to finish before it starts) and the fp8 encoding kAuto means.
struct SiluDevice {
  int max_blocks;
  Fp8Encoding auto_encoding;
};

SiluDevice silu_device(int device) {
  static std::mutex mutex;
  static std::map<int, SiluDevice> devices;
  const std::lock_guard<std::mutex> lock(mutex);
  const auto found = devices.find(device);
  if (found != devices.end()) {
    return found->second;
  }
  int resident_per_multiprocessor = std::numeric_limits<int>::max();
  ROCEP_GPU_CHECK(device::load_silu_kernels(&resident_per_multiprocessor));
  hipDeviceProp_t properties;
  ROCEP_GPU_CHECK(hipGetDeviceProperties(&properties, device));
  const SiluDevice found_now{std::max(1, resident_per_multiprocessor) * properties.multiProcessorCount,
                             resolve_fp8_encoding(Fp8Encoding::kAuto, device)};
  devices.emplace(device, found_now);
  return found_now;
}

}  // namespace

void silu_and_quantize(const SiluArgs& args, void* stream) {
  const ProfilerRange range("rocep::silu_and_quantize");
  validate(args, "silu_and_quantize");
  const SiluDevice gpu = silu_device(current_device());
  const Fp8Encoding encoding =
      args.fp8_encoding == Fp8Encoding::kAuto ? gpu.auto_encoding : args.fp8_encoding;
  const device::SiluParams params{static_cast<const uint16_t*>(args.gate_up),
                                  static_cast<uint8_t*>(args.out),
                                  static_cast<uint8_t*>(args.out_scales),
                                  args.row_offsets,
                                  args.global_scales,
                                  args.capacity_rows,
                                  args.num_groups,
                                  args.n,
                                  static_cast<device::Format>(args.format),
                                  static_cast<device::Fp8>(encoding),
                                  args.interleaved,
                                  args.clamp_limit};
  device::launch_silu(params, gpu.max_blocks, static_cast<hipStream_t>(stream));
  ROCEP_GPU_CHECK(hipGetLastError());
}

#else

void silu_and_quantize(const SiluArgs&, void*) {
  throw ConfigError(
      "silu_and_quantize: this build of rocep has no GPU platform (ROCEP_GPU_PLATFORM=none); "
      "silu_and_quantize_reference computes the same result on the CPU");
}

#endif

}  // namespace rocep
