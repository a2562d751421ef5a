// Command-line flags of the single-GPU benchmarks: --name=N, N a positive integer.
#pragma once

#include <cstdlib>
#include <cstring>
#include <string>

#include "rocep/errors.hpp"

namespace rocep::bench {

// N of `argument` when it is --name=N, else `value`; ConfigError when N is not an integer in [1, max_value].
inline int parse_flag(const char* argument, const char* name, int value, long max_value = 1L << 30) {
  const std::string prefix = std::string("--") + name + "=";
  if (std::strncmp(argument, prefix.c_str(), prefix.size()) != 0) {
    return value;
  }
  char* end = nullptr;
  const long parsed = std::strtol(argument + prefix.size(), &end, 10);
  if (*end != '\0' || parsed < 1 || parsed > max_value) {
    throw ConfigError(std::string(argument) + " is invalid: expected a positive integer");
  }
  return static_cast<int>(parsed);
}

}  // namespace rocep::bench
