// Helpers shared by the GPU tests: picking each rank's GPU, and copies between host vectors and device
// buffers.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "host/bootstrap.hpp"
#include "host/device.hpp"
#include "host/device_memory.hpp"
#include "host/gpu_check.hpp"
#include "host/node.hpp"
#include "rocep/mpi.hpp"

namespace rocep::testing {

// Collective, the same answer on every rank: false when some rank sees no GPU (every rank then skips);
// otherwise makes this rank's GPU current (its rank on the node, or ROCEP_DEVICE) and returns true.
inline bool use_rank_gpu() {
  const int local_devices = device_count();
  int fewest_devices = 0;
  MPI_Allreduce(&local_devices, &fewest_devices, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (fewest_devices == 0) {
    return false;
  }
  MpiBootstrap world(MPI_COMM_WORLD);
  set_device(
      device_for_local_rank(node_layout(world, 0).local_rank, local_devices, std::getenv("ROCEP_DEVICE")));
  return true;
}

// `bytes` of host memory copied to `destination` in device memory, complete on return: the kernels under test
// run on non-blocking streams, which do not wait for the default stream, and a copy from pageable memory may
// return before it lands.
inline void copy_to_device(void* destination, const void* source, std::size_t bytes) {
  if (bytes > 0) {
    ROCEP_GPU_CHECK(hipMemcpy(destination, source, bytes, hipMemcpyHostToDevice));
  }
  ROCEP_GPU_CHECK(hipDeviceSynchronize());
}

// A device copy of `values`, one element at least so the pointer is never null, complete on return
// (copy_to_device).
template <typename T>
DeviceBuffer upload(const std::vector<T>& values) {
  DeviceBuffer buffer(std::max<std::size_t>(values.size(), 1) * sizeof(T));
  copy_to_device(buffer.get(), values.data(), values.size() * sizeof(T));
  return buffer;
}

// Sets every byte of `buffer` to `value`, complete on return (see upload).
inline void fill_bytes(const DeviceBuffer& buffer, uint8_t value) {
  ROCEP_GPU_CHECK(hipMemset(buffer.get(), value, buffer.bytes()));
  ROCEP_GPU_CHECK(hipDeviceSynchronize());
}

template <typename T>
std::vector<T> download(const DeviceBuffer& buffer, std::size_t count) {
  std::vector<T> values(count);
  ROCEP_GPU_CHECK(hipMemcpy(values.data(), buffer.get(), count * sizeof(T), hipMemcpyDeviceToHost));
  return values;
}

}  // namespace rocep::testing
