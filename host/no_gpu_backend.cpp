// The GPU entry points of a build without a GPU platform (ROCEP_GPU_PLATFORM=none).
#include "backend.hpp"

namespace rocep {

bool gpu_visible() {
  return false;
}

std::unique_ptr<EpBackend> make_gpu_backend(Bootstrap& /*bootstrap*/, EpConfig& /*config*/) {
  throw ConfigError("EpGroup: backend gpu is not available: this build of rocep has no GPU platform");
}

}  // namespace rocep
