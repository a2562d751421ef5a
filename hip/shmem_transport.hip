#include "shmem_transport.hpp"

#include "device_clock.hpp"
#include "ep_kernels.hpp"
#include "shmem.hpp"

namespace {

using rocep::device::kBlockThreads;

__global__ void __launch_bounds__(kBlockThreads)
    rocep_shmem_put_signal(void* destination, const void* source, std::size_t bytes, uint64_t* signal,
                           uint64_t value, int pe) {
  if (threadIdx.x == 0) {
    rocep::shmem::put_signal_add_nbi(destination, source, bytes, signal, value, pe);
  }
}

__global__ void rocep_shmem_wait_signal(uint64_t* signal, uint64_t expected, uint64_t timeout_ticks,
                                        int* timed_out) {
  const uint64_t start = rocep::device::wall_clock_ticks();
  while (rocep::shmem::signal_fetch(signal) < expected) {
    if (rocep::device::wall_clock_ticks() - start > timeout_ticks) {
      *timed_out = 1;
      return;
    }
  }
  *timed_out = 0;
}

}  // namespace

namespace rocep::device {

hipError_t launch_shmem_put_signal(void* destination, const void* source, std::size_t bytes, uint64_t* signal,
                                   uint64_t value, int pe, hipStream_t stream) {
  rocep_shmem_put_signal<<<1, kBlockThreads, 0, stream>>>(destination, source, bytes, signal, value, pe);
  return hipGetLastError();
}

hipError_t launch_shmem_wait_signal(uint64_t* signal, uint64_t expected, uint64_t timeout_ticks,
                                    int* timed_out, hipStream_t stream) {
  rocep_shmem_wait_signal<<<1, 1, 0, stream>>>(signal, expected, timeout_ticks, timed_out);
  return hipGetLastError();
}

}  // namespace rocep::device
