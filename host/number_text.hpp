// Numbers as text for messages, without iostreams: their locale facets are process-wide state, owned by
// whatever process loads the library (a Python interpreter with other extensions, a server).
#pragma once

#include <array>
#include <charconv>
#include <string>

namespace rocep {

inline std::string number_text(int value) {
  return std::to_string(value);
}

// The shortest text that reads back as `value` ("nan", "inf" where not finite).
inline std::string number_text(double value) {
  std::array<char, 32> text{};
  const std::to_chars_result end = std::to_chars(text.data(), text.data() + text.size(), value);
  return std::string(text.data(), end.ptr);
}

}  // namespace rocep
