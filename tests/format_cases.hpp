// The dispatch formats with the fp8 encoding each is tested in, shared by the codec and SiLU tests and the
// SiLU benchmark.
#pragma once

#include <string>

#include "rocep/formats.hpp"

namespace rocep::testing {

// A format with its fp8 encoding (which only fp8 block-128 reads).
struct FormatCase {
  TokenFormat format;
  Fp8Encoding encoding;
};
inline constexpr FormatCase kFormatCases[] = {
    {TokenFormat::kBf16, Fp8Encoding::kE4m3fn},          {TokenFormat::kFp8Block128, Fp8Encoding::kE4m3fn},
    {TokenFormat::kFp8Block128, Fp8Encoding::kE4m3fnuz}, {TokenFormat::kMxfp8, Fp8Encoding::kE4m3fn},
    {TokenFormat::kMxfp4, Fp8Encoding::kE4m3fn},         {TokenFormat::kNvfp4, Fp8Encoding::kE4m3fn},
};

inline std::string to_string(const FormatCase& format_case) {
  return std::string(rocep::to_string(format_case.format)) + " " + rocep::to_string(format_case.encoding);
}

}  // namespace rocep::testing
