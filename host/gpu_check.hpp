// Turns a failed HIP/CUDA runtime call into a GpuRuntimeError carrying the runtime's text and file:line.
#pragma once

#include <string>

#include "hip/platform.hpp"
#include "rocep/errors.hpp"

namespace rocep {

[[noreturn]] inline void throw_gpu_error(hipError_t code, const char* call, const char* file, int line) {
  throw GpuRuntimeError(std::string(call) + " failed: " + hipGetErrorName(code) + " (" +
                        hipGetErrorString(code) + ") at " + file + ":" + std::to_string(line));
}

}  // namespace rocep

#define ROCEP_GPU_CHECK(call)                                             \
  do {                                                                    \
    const hipError_t rocep_status_ = (call);                              \
    if (rocep_status_ != hipSuccess) {                                    \
      ::rocep::throw_gpu_error(rocep_status_, #call, __FILE__, __LINE__); \
    }                                                                     \
  } while (0)
