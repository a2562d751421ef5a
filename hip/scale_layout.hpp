// Where the scale of (row, block) of a quantised tensor lives: the layouts include/rocep/formats.hpp
// documents, in one place for the kernels, the CPU reference and the tests.
#pragma once

#include <cstddef>
#include <cstdint>

#include "codecs.hpp"
#include "portable.hpp"

namespace rocep::device {

// Elements that share one scale.
ROCEP_HOST_DEVICE constexpr int block_elements(Format format) {
  switch (format) {
    case Format::kFp8Block128:
      return 128;
    case Format::kMxfp4:
    case Format::kMxfp8:
      return 32;
    case Format::kNvfp4:
      return 16;
    default:
      return 1;
  }
}

// Bytes of one scale (float32 for fp8 block-128, one byte for the others, 0 without scales).
ROCEP_HOST_DEVICE inline int scale_bytes(Format format) {
  return format == Format::kBf16 ? 0 : (format == Format::kFp8Block128 ? 4 : 1);
}

// Byte offset of the scale of (row, block) in a tensor of `rows` rows of `columns` elements.
ROCEP_HOST_DEVICE inline std::size_t scale_offset(Format format, std::size_t row, int block, std::size_t rows,
                                                  int columns) {
  switch (format) {
    case Format::kFp8Block128:
      return (static_cast<std::size_t>(block) * rows + row) * sizeof(float);
    case Format::kNvfp4: {
      const std::size_t tile_columns = static_cast<std::size_t>(columns) / 64;
      return ((row / 128) * tile_columns + static_cast<std::size_t>(block) / 4) * 512 + (row % 32) * 16 +
             ((row % 128) / 32) * 4 + static_cast<std::size_t>(block) % 4;
    }
    default:
      return row * static_cast<std::size_t>(columns / block_elements(format)) + block;
  }
}

// A row's scales in groups of consecutive bytes that lie side by side in every layout: 4 bytes (one fp8
// float32 scale, or the codes of four neighbouring MX / nvfp4 blocks), or single bytes in MX rows whose
// code count is not a multiple of 4. Group g of row r starts at byte row_offset(r) + g * group_stride: the
// row-major and transposed layouts are linear in r, and nvfp4's 128x4 tiles add r's place in its tile, so
// one form with no division and no switch serves every format (scale_offset stays the definition).
struct ScaleGroups {
  std::size_t tile_stride;     // per 128 rows
  std::size_t quarter_stride;  // per 32 rows within the 128
  std::size_t lane_stride;     // per row within the 32
  std::size_t group_stride;
  int group_bytes;
  int groups;  // per row

  ROCEP_HOST_DEVICE std::size_t row_offset(uint32_t row) const {
    return (row / 128) * tile_stride + (row % 128 / 32) * quarter_stride + (row % 32) * lane_stride;
  }
};

ROCEP_HOST_DEVICE inline ScaleGroups scale_groups(Format format, std::size_t rows, int columns) {
  const int blocks = columns / block_elements(format);
  switch (format) {
    case Format::kFp8Block128:
      return {128 * sizeof(float), 32 * sizeof(float), sizeof(float), rows * sizeof(float), 4, blocks};
    case Format::kNvfp4:
      return {static_cast<std::size_t>(columns) / 64 * 512, 4, 16, 512, 4, blocks / 4};
    case Format::kMxfp4:
    case Format::kMxfp8: {
      const auto row_bytes = static_cast<std::size_t>(blocks);
      const int group_bytes = blocks % 4 == 0 ? 4 : 1;
      return {128 * row_bytes, 32 * row_bytes,      row_bytes, static_cast<std::size_t>(group_bytes),
              group_bytes,     blocks / group_bytes};
    }
    default:
      return {0, 0, 0, 0, 0, 0};
  }
}

// Bytes of the whole scale tensor.
ROCEP_HOST_DEVICE inline std::size_t scale_tensor_bytes(Format format, std::size_t rows, int columns) {
  if (format == Format::kNvfp4) {
    return (rows + 127) / 128 * (static_cast<std::size_t>(columns) / 64) * 512;
  }
  return rows * static_cast<std::size_t>(columns / block_elements(format)) * scale_bytes(format);
}

}  // namespace rocep::device
