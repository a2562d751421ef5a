#include "compute_load.hpp"

#include <cmath>

namespace {

constexpr int kComputeLoadThreads = 1024;
constexpr int kChains = 8;  // independent dependency chains per thread, enough to keep the FMA pipes full
constexpr int kMaxIterations = 1 << 30;

// Each thread iterates x -> x * 0.999 + 0.001 on kChains values (which stay near 1: no overflow, no
// subnormals) and stores their sum.
__global__ void __launch_bounds__(kComputeLoadThreads) rocep_test_compute_load(float* sink, int iterations) {
  float chains[kChains];
  for (int c = 0; c < kChains; ++c) {
    chains[c] = static_cast<float>(threadIdx.x + c) * 1e-3f;
  }
  for (int i = 0; i < iterations; ++i) {
#pragma unroll
    for (int c = 0; c < kChains; ++c) {
      chains[c] = fmaf(chains[c], 0.999f, 1e-3f);
    }
  }
  float sum = 0.0f;
  for (int c = 0; c < kChains; ++c) {
    sum += chains[c];
  }
  sink[static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x] = sum;
}

}  // namespace

namespace rocep::testing {

ComputeLoad::ComputeLoad(int multiprocessors, double milliseconds, hipStream_t stream)
    : sink_(static_cast<std::size_t>(std::max(multiprocessors, 1)) * kComputeLoadThreads * sizeof(float)),
      blocks_(std::max(multiprocessors, 1)) {
  // Iterations grow 4x until a launch takes long enough to time (a tenth of the target, 5 ms at most), then
  // are scaled to the target.
  const double timed_ms = std::min(milliseconds / 10, 5.0);
  Event start;
  Event stop;
  iterations_ = 256;
  launch(stream);  // the first launch loads the kernel
  for (;;) {
    start.record(stream);
    launch(stream);
    stop.record(stream);
    stop.synchronize();
    const double measured_ms = stop.elapsed_ms_since(start);
    if (measured_ms >= timed_ms || iterations_ > kMaxIterations / 4) {
      const double scaled = std::ceil(iterations_ * milliseconds / std::max(measured_ms, 1e-3));
      iterations_ = static_cast<int>(std::min<double>(std::max(scaled, 1.0), kMaxIterations));
      return;
    }
    iterations_ *= 4;
  }
}

void ComputeLoad::launch(hipStream_t stream) const {
  rocep_test_compute_load<<<blocks_, kComputeLoadThreads, 0, stream>>>(sink_.as<float>(), iterations_);
  ROCEP_GPU_CHECK(hipGetLastError());
}

}  // namespace rocep::testing
