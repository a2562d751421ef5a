#include "bootstrap.hpp"

#include <cctype>
#include <cstdlib>
#include <string>

#include "rocep/errors.hpp"

namespace rocep {

int device_for_local_rank(int local_rank, int device_count, const char* override_text) {
  if (device_count < 1) {
    throw ConfigError("device_for_local_rank: no GPU is visible (device count " +
                      std::to_string(device_count) + ")");
  }
  if (override_text == nullptr || *override_text == '\0') {
    return local_rank % device_count;
  }
  char* end = nullptr;
  const long device = std::strtol(override_text, &end, 10);
  const bool digits_only = std::isdigit(static_cast<unsigned char>(*override_text)) && *end == '\0';
  if (!digits_only || device < 0 || device >= device_count) {
    throw ConfigError(std::string("ROCEP_DEVICE = '") + override_text +
                      "' is invalid: allowed range is [0, " + std::to_string(device_count - 1) + "]");
  }
  return static_cast<int>(device);
}

}  // namespace rocep
