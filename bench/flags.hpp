// Command-line flags of the benchmarks: --name=value, where a number N is a positive integer. Host only.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <set>
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
    throw ConfigError(std::string("--") + name + "=" + text + " is invalid: expected an integer from 1 to " +
                      std::to_string(max_value));
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

// A --name=N flag of a benchmark that takes only such flags: where N goes and its largest value.
struct IntFlag {
  const char* name;
  int* value;
  long max_value = kMaxFlagValue;
};

// Parses argv[1..argc) as `flags`, each at most once. --help or -h prints `usage` to stdout and returns
// false (the caller exits with 0); an unknown or repeated argument throws ConfigError naming it and
// listing the flags.
inline bool parse_int_flags(int argc, char** argv, std::initializer_list<IntFlag> flags, const char* usage) {
  std::set<std::string> seen;
  for (int i = 1; i < argc; ++i) {
    const std::string argument = argv[i];
    if (argument == "--help" || argument == "-h") {
      std::fputs(usage, stdout);
      return false;
    }
    bool taken = false;
    for (const IntFlag& flag : flags) {
      if (parse_flag(argv[i], flag.name, flag.value, flag.max_value)) {
        if (!seen.insert(flag.name).second) {
          throw ConfigError(std::string("--") + flag.name + " is given twice");
        }
        taken = true;
      }
    }
    if (!taken) {
      std::string names;
      for (const IntFlag& flag : flags) {
        names += std::string(names.empty() ? "" : ", ") + "--" + flag.name;
      }
      throw ConfigError("unknown argument " + argument + " (flags: " + names + ", each as --name=N; --help)");
    }
  }
  return true;
}

}  // namespace rocep::bench
