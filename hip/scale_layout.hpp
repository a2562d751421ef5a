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

// Bytes of the whole scale tensor.
ROCEP_HOST_DEVICE inline std::size_t scale_tensor_bytes(Format format, std::size_t rows, int columns) {
  if (format == Format::kNvfp4) {
    return (rows + 127) / 128 * (static_cast<std::size_t>(columns) / 64) * 512;
  }
  return rows * static_cast<std::size_t>(columns / block_elements(format)) * scale_bytes(format);
}

}  // namespace rocep::device
