// A named profiler range around each public call ("rocep::dispatch", ...): profiler timelines show rocep's
// calls around its kernels. NVTX3 on NVIDIA, roctx on AMD, picked at configure time (ROCEP_PROFILER_RANGES);
// where neither is found, or the option is OFF, an empty object that compiles to nothing.
// To see them: rocprofv3 --marker-trace; nsys profile --trace=cuda,nvtx; ncu --nvtx --nvtx-include
// "rocep::dispatch/" (profiles only the kernels inside rocep::dispatch; bench/profile_ranges.sh runs it).
#pragma once

#if defined(ROCEP_RANGES_NVTX)
#include <nvtx3/nvToolsExt.h>
#elif defined(ROCEP_RANGES_ROCTX_SDK)
#include <rocprofiler-sdk-roctx/roctx.h>
#elif defined(ROCEP_RANGES_ROCTX)
#include <roctracer/roctx.h>
#endif

namespace rocep {

// Opens the range `name` (a string literal) on the calling thread for the object's lifetime. Neither copied
// nor moved: a range is closed exactly once, by the object that opened it.
class ProfilerRange {
 public:
#if defined(ROCEP_RANGES_NVTX)
  explicit ProfilerRange(const char* name) {
    nvtxRangePushA(name);
  }
  ~ProfilerRange() {
    nvtxRangePop();
  }
#elif defined(ROCEP_RANGES_ROCTX_SDK) || defined(ROCEP_RANGES_ROCTX)
  explicit ProfilerRange(const char* name) {
    roctxRangePushA(name);
  }
  ~ProfilerRange() {
    roctxRangePop();
  }
#else
  explicit ProfilerRange(const char* /*name*/) {}
#endif
  ProfilerRange(const ProfilerRange&) = delete;
  ProfilerRange& operator=(const ProfilerRange&) = delete;
};

}  // namespace rocep
