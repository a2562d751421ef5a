#include "rocep/build_info.hpp"

namespace rocep {

// The ROCEP_BUILD_* strings are set on this file alone by CMakeLists.txt ("what this build is").
BuildInfo build_info() {
  return {ROCEP_BUILD_VERSION, ROCEP_BUILD_PLATFORM, ROCEP_BUILD_ARCHITECTURES, ROCEP_BUILD_SHMEM_ENGINE,
          ROCEP_BUILD_PROFILER_RANGES};
}

}  // namespace rocep
