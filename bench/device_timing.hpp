// Device timing shared by the single-GPU benchmarks: the median time of a call queued back to back, and
// the HBM copy peak of the device.
#pragma once

#include <cstddef>
#include <vector>

#include "bench/statistics.hpp"
#include "hip/platform.hpp"
#include "host/device_memory.hpp"
#include "host/gpu_check.hpp"

namespace rocep::bench {

// Untimed calls before each timing, for at least this long: the first calls after the host's reference
// check (or an upload) find the GPU at idle clocks, and a few of them left runs 10% apart.
inline constexpr double kWarmUpSeconds = 0.05;

// Median seconds of `call` over `iterations` calls queued back to back on `stream`, an event between
// consecutive calls, after kWarmUpSeconds of untimed ones.
template <typename Call>
double median_seconds(hipStream_t stream, int iterations, Call call) {
  for (double warm = 0.0; warm < kWarmUpSeconds;) {
    Event start;
    Event end;
    start.record(stream);
    for (int i = 0; i < 10; ++i) {
      call();
    }
    end.record(stream);
    end.synchronize();
    warm += end.elapsed_ms_since(start) * 1e-3;
  }
  std::vector<Event> events(iterations + 1);
  events[0].record(stream);
  for (int i = 0; i < iterations; ++i) {
    call();
    events[i + 1].record(stream);
  }
  events.back().synchronize();
  std::vector<double> seconds(iterations);
  for (int i = 0; i < iterations; ++i) {
    seconds[i] = events[i + 1].elapsed_ms_since(events[i]) * 1e-3;
  }
  return median(seconds);
}

// The HBM peak as this device reaches it: a device-to-device copy of 1 GiB, read + written bytes.
inline double copy_peak_bytes_per_second(hipStream_t stream, int iterations) {
  const std::size_t bytes = std::size_t{1} << 30;
  const DeviceBuffer source(bytes);
  const DeviceBuffer target(bytes);
  ROCEP_GPU_CHECK(hipMemset(source.get(), 1, bytes));
  const double seconds = median_seconds(stream, iterations, [&] {
    ROCEP_GPU_CHECK(hipMemcpyAsync(target.get(), source.get(), bytes, hipMemcpyDeviceToDevice, stream));
  });
  return 2.0 * static_cast<double>(bytes) / seconds;
}

}  // namespace rocep::bench
