#include "rocep/config.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "hip/ep_params.hpp"
#include "hip/scale_layout.hpp"
#include "number_text.hpp"
#include "rocep/errors.hpp"

namespace rocep {

const char* to_string(TokenFormat format) {
  switch (format) {
    case TokenFormat::kBf16:
      return "bf16";
    case TokenFormat::kFp8Block128:
      return "fp8_block128";
    case TokenFormat::kMxfp4:
      return "mxfp4";
    case TokenFormat::kNvfp4:
      return "nvfp4";
    case TokenFormat::kMxfp8:
      return "mxfp8";
  }
  return "unknown";
}

const char* to_string(Fp8Encoding encoding) {
  switch (encoding) {
    case Fp8Encoding::kAuto:
      return "auto";
    case Fp8Encoding::kE4m3fn:
      return "e4m3fn";
    case Fp8Encoding::kE4m3fnuz:
      return "e4m3fnuz";
  }
  return "unknown";
}

const char* to_string(CombineDtype dtype) {
  switch (dtype) {
    case CombineDtype::kBf16:
      return "bf16";
    case CombineDtype::kFp8Block128:
      return "fp8_block128";
  }
  return "unknown";
}

const char* to_string(Layout layout) {
  switch (layout) {
    case Layout::kExpanded:
      return "expanded";
    case Layout::kPerToken:
      return "per-token";
  }
  return "unknown";
}

int format_block_elements(TokenFormat format) {
  switch (format) {
    case TokenFormat::kBf16:
      return 1;
    case TokenFormat::kFp8Block128:
      return 128;
    case TokenFormat::kMxfp4:
    case TokenFormat::kMxfp8:
      return 32;
    case TokenFormat::kNvfp4:
      return 16;
  }
  throw ConfigError("dispatch_format = " + std::to_string(static_cast<int>(format)) +
                    " is not a known format");
}

int format_column_multiple(TokenFormat format) {
  switch (format) {
    case TokenFormat::kBf16:
      return 8;
    case TokenFormat::kNvfp4:
      return 64;
    default:
      return std::max(format_block_elements(format), 32);  // 32 fp4 / fp8 elements fill 16 or 32 bytes
  }
}

namespace {

// Throws ConfigError unless `elements` (a row's length of `format`, named `name`) is a non-negative
// multiple of `multiple`.
void require_row_elements(TokenFormat format, long long elements, const char* name, int multiple) {
  if (elements < 0 || elements % multiple != 0) {
    throw ConfigError(std::string(name) + " = " + std::to_string(elements) + " is invalid for format " +
                      to_string(format) + ": allowed values are non-negative multiples of " +
                      std::to_string(multiple));
  }
}

}  // namespace

std::size_t format_payload_bytes(TokenFormat format, int hidden) {
  const bool two_per_byte = format == TokenFormat::kMxfp4 || format == TokenFormat::kNvfp4;
  require_row_elements(format, hidden, "hidden", two_per_byte ? 2 : 1);
  const auto elements = static_cast<std::size_t>(hidden);
  switch (format) {
    case TokenFormat::kBf16:
      return elements * 2;
    case TokenFormat::kFp8Block128:
    case TokenFormat::kMxfp8:
      return elements;
    case TokenFormat::kMxfp4:
    case TokenFormat::kNvfp4:
      return elements / 2;
  }
  throw ConfigError("dispatch_format = " + std::to_string(static_cast<int>(format)) +
                    " is not a known format");
}

std::size_t format_scale_bytes(TokenFormat format, int hidden) {
  require_row_elements(format, hidden, "hidden", format_block_elements(format));
  const std::size_t blocks = static_cast<std::size_t>(hidden) / format_block_elements(format);
  switch (format) {
    case TokenFormat::kBf16:
      return 0;
    case TokenFormat::kFp8Block128:
      return blocks * 4;  // float32
    case TokenFormat::kMxfp4:
    case TokenFormat::kMxfp8:
    case TokenFormat::kNvfp4:
      return blocks;  // one byte (e8m0 / e4m3) per block
  }
  throw ConfigError("dispatch_format = " + std::to_string(static_cast<int>(format)) +
                    " is not a known format");
}

std::size_t format_input_row_bytes(TokenFormat format, int hidden) {
  return format_payload_bytes(format, hidden) + (format_scale_bytes(format, hidden) + 15) / 16 * 16;
}

std::size_t format_scale_tensor_bytes(TokenFormat format, std::size_t rows, int columns) {
  // nvfp4's tiles hold whole 4-block columns: a partial one has no place of its own in the layout.
  require_row_elements(
      format, columns, "columns",
      format == TokenFormat::kNvfp4 ? format_column_multiple(format) : format_block_elements(format));
  // Tiles round rows up to 128: the bytes of 128 more rows must fit too.
  const std::size_t row_bytes = format_scale_bytes(format, columns);
  if (row_bytes > 0 && rows > std::numeric_limits<std::size_t>::max() / row_bytes - 128) {
    throw ConfigError("rows = " + std::to_string(rows) + " is invalid for format " + to_string(format) +
                      " with " + std::to_string(columns) +
                      " columns: its scale tensor's bytes overflow size_t");
  }
  return device::scale_tensor_bytes(static_cast<device::Format>(format), rows, columns);
}

namespace {

// Largest sizes accepted: well past any model, small enough that every byte count fits in 64 bits and
// every row index in 32. The kernels size a buffer by the largest hidden (device::kMaxHidden).
constexpr int kMaxHidden = device::kMaxHidden;
constexpr int kMaxExperts = 1 << 14;
constexpr int kMaxTokensPerRank = 1 << 16;
constexpr int kMaxSms = 1 << 12;  // past any GPU's multiprocessors
constexpr int kMaxAlignment = 1 << 10;
constexpr double kMaxTimeoutSeconds = 24 * 3600.0;

template <typename T>
void require(bool ok, const char* field, T value, const std::string& allowed) {
  if (!ok) {
    throw ConfigError(std::string("EpConfig.") + field + " = " + number_text(value) +
                      " is invalid: " + allowed);
  }
}

void require_world_size(int world_size) {
  if (world_size < 1) {
    throw ConfigError("world_size = " + std::to_string(world_size) +
                      " is invalid: allowed range is [1, inf)");
  }
}

std::string range(long long low, long long high) {
  return "allowed range is [" + std::to_string(low) + ", " + std::to_string(high) + "]";
}

}  // namespace

void EpConfig::validate(int world_size) const {
  require_world_size(world_size);
  const int format_code = static_cast<int>(dispatch_format);
  require(format_code >= 0 && format_code <= static_cast<int>(TokenFormat::kMxfp8), "dispatch_format",
          format_code, "allowed values are 0 (bf16) .. 4 (mxfp8)");
  const int encoding_code = static_cast<int>(fp8_encoding);
  require(encoding_code >= 0 && encoding_code <= static_cast<int>(Fp8Encoding::kE4m3fnuz), "fp8_encoding",
          encoding_code, "allowed values are 0 (auto), 1 (e4m3fn), 2 (e4m3fnuz)");
  const int combine_code = static_cast<int>(combine_dtype);
  require(combine_code >= 0 && combine_code <= static_cast<int>(CombineDtype::kFp8Block128), "combine_dtype",
          combine_code, "allowed values are 0 (bf16), 1 (fp8_block128)");
  const int layout_code = static_cast<int>(layout);
  require(layout_code >= 0 && layout_code <= static_cast<int>(Layout::kPerToken), "layout", layout_code,
          "allowed values are 0 (expanded), 1 (per-token)");
  require(hidden >= 1 && hidden <= kMaxHidden, "hidden", hidden, range(1, kMaxHidden));
  const int multiple = format_column_multiple(dispatch_format);
  require(hidden % multiple == 0, "hidden", hidden,
          std::string("must be a multiple of ") + std::to_string(multiple) + " for dispatch_format " +
              to_string(dispatch_format));
  const int combine_multiple = format_column_multiple(TokenFormat::kFp8Block128);
  require(combine_dtype != CombineDtype::kFp8Block128 || hidden % combine_multiple == 0, "hidden", hidden,
          "must be a multiple of " + std::to_string(combine_multiple) + " for combine_dtype fp8_block128");
  require(num_experts >= 1 && num_experts <= kMaxExperts, "num_experts", num_experts, range(1, kMaxExperts));
  require(num_experts % world_size == 0, "num_experts", num_experts,
          "must be divisible by the world size " + std::to_string(world_size));
  require(top_k >= 1 && top_k <= num_experts, "top_k", top_k, range(1, num_experts) + " (1 .. num_experts)");
  require(max_tokens_per_rank >= 1 && max_tokens_per_rank <= kMaxTokensPerRank, "max_tokens_per_rank",
          max_tokens_per_rank, range(1, kMaxTokensPerRank));
  require(gpus_per_node >= 0 && gpus_per_node <= world_size, "gpus_per_node", gpus_per_node,
          range(0, world_size) + " (0 = detect)");
  require(gpus_per_node == 0 || world_size % gpus_per_node == 0, "gpus_per_node", gpus_per_node,
          "must divide the world size " + std::to_string(world_size));
  require(num_sms >= kAllSms && num_sms <= kMaxSms, "num_sms", num_sms,
          range(kAllSms, kMaxSms) + " (0 = the default share, -1 = every multiprocessor)");
  require(expert_alignment >= 1 && expert_alignment <= kMaxAlignment, "expert_alignment", expert_alignment,
          range(1, kMaxAlignment));
  // Row indices (sorted_token_ids and its padding value, expanded rows) are int32.
  const long long row_indices = static_cast<long long>(world_size) * max_tokens_per_rank * top_k +
                                static_cast<long long>(num_experts / world_size) * (expert_alignment - 1);
  require(row_indices <= std::numeric_limits<int32_t>::max(), "top_k", top_k,
          "world size x max_tokens_per_rank x top_k + local experts x (expert_alignment - 1) = " +
              std::to_string(row_indices) + " must be at most 2147483647 (row indices are int32)");
  require(std::isfinite(timeout_seconds) && timeout_seconds > 0 && timeout_seconds <= kMaxTimeoutSeconds,
          "timeout_seconds", timeout_seconds, "allowed range is (0, 86400]");
  if (local_only) {
    require(allreduce_world_size >= 1 && allreduce_world_size <= world_size &&
                world_size % allreduce_world_size == 0,
            "allreduce_world_size", allreduce_world_size,
            range(1, world_size) + ", dividing the world size " + std::to_string(world_size));
  } else {
    require(allreduce_world_size == 1, "allreduce_world_size", allreduce_world_size,
            "allowed value is 1 unless local_only is set");
  }
}

int EpConfig::num_local_experts(int world_size) const {
  validate(world_size);
  return num_experts / world_size;
}

std::size_t EpConfig::max_recv_rows(int world_size) const {
  const int local = num_local_experts(world_size);
  return static_cast<std::size_t>(world_size) * max_tokens_per_rank * std::min(top_k, local) +
         static_cast<std::size_t>(local) * (expert_alignment - 1);
}

std::size_t EpConfig::max_recv_tokens(int world_size) const {
  validate(world_size);
  return static_cast<std::size_t>(world_size) * max_tokens_per_rank;
}

std::string EpConfig::describe() const {
  std::string text = "hidden=" + std::to_string(hidden) + " top_k=" + std::to_string(top_k) +
                     " experts=" + std::to_string(num_experts) +
                     " max_tokens_per_rank=" + std::to_string(max_tokens_per_rank) +
                     " format=" + to_string(dispatch_format);
  if (dispatch_format == TokenFormat::kFp8Block128) {
    text += std::string("/") + to_string(fp8_encoding);
  }
  text += std::string(" combine=") + to_string(combine_dtype) + " layout=" + to_string(layout) +
          " alignment=" + std::to_string(expert_alignment);
  if (local_only) {
    text += " local_only allreduce_world_size=" + std::to_string(allreduce_world_size);
  }
  if (!combine_input_buffer) {
    text += " no_combine_input_buffer";
  }
  text += " sms=";
  if (num_sms == kDefaultSms) {
    text += "default";
  } else if (num_sms == kAllSms) {
    text += "all";
  } else {
    text += std::to_string(num_sms);
  }
  return text;
}

}  // namespace rocep
