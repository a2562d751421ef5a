// Command-line flags of the benchmarks: --name=value, where a number N is a positive integer. Host only.
#pragma once

#include <cstdlib>
#include <cstring>
#include <string>

#include "rocep/errors.hpp"

namespace rocep::bench {

// The default bound on N: above any size a benchmark takes, and well inside an int.
inline constexpr long kMaxFlagValue = 1L << 30;

// The value of `argument` when it is --name=value, else nullptr.
inline const char* flag_value(const char* argument, const char* name) {
  const std::string prefix = std::string("--") + name + "=";
  return std::strncmp(argument, prefix.c_str(), prefix.size()) == 0 ? argument + prefix.size() : nullptr;
}

// `text`, the N of --name=N, as an int; ConfigError naming --name=N when N is not an integer in
// [1, max_value].
inline int parse_positive(const std::string& text, const char* name, long max_value = kMaxFlagValue) {
  char* end = nullptr;
  const long parsed = std::strtol(text.c_str(), &end, 10);
  if (*end != '\0' || parsed < 1 || parsed > max_value) {
    throw ConfigError(std::string("--") + name + "=" + text + " is invalid: expected a positive integer");
  }
  return static_cast<int>(parsed);
}

// When `argument` is --name=N: sets *value to N and returns true (ConfigError when N is not an integer in
// [1, max_value]). Otherwise false, *value untouched.
inline bool parse_flag(const char* argument, const char* name, int* value, long max_value = kMaxFlagValue) {
  const char* text = flag_value(argument, name);
  if (text == nullptr) {
    return false;
  }
  *value = parse_positive(text, name, max_value);
  return true;
}

}  // namespace rocep::bench
