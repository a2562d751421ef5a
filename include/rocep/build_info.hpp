// What this build of the library is: its version and what it was compiled for, as CMake configured it. For
// bug reports, and for a server that must know before it creates a group whether the GPU backend exists: a
// build whose gpu_platform is "none" runs every group on the CPU reference (Backend::kAuto picks it, and
// Backend::kGpu is refused with ConfigError).
#pragma once

namespace rocep {

struct BuildInfo {
  const char* version;            // the project's version, "major.minor.patch" (the Python package's too)
  const char* gpu_platform;       // "amd", "nvidia" or "none": ROCEP_GPU_PLATFORM as the build resolved it
  const char* gpu_architectures;  // comma-separated: AMD "gfx90a,gfx940", NVIDIA "90"; "" without a platform
  const char* shmem_engine;       // "nvshmem", "rocshmem" or "none": a group spanning nodes needs one
  const char* profiler_ranges;    // "nvtx", "roctx" or "none" (compiled out): docs/profiling.md
};

// Static strings, the same for the life of the process; no GPU or group needed.
BuildInfo build_info();

}  // namespace rocep
