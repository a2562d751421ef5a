// IPC round trip between the ranks of one node: every rank maps every peer's buffer, a kernel stores a
// rank-specific pattern straight into the next rank's memory and releases a flag there; the receiver's
// kernel acquires its flag (bounded wait) and checks the pattern. Exercises export/import, peer stores
// over xGMI / NVLink, and system-scope release/acquire on polled-flag memory.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <vector>

#include "gpu_support.hpp"
#include "hip/atomics.hpp"
#include "hip/wait.hpp"
#include "host/bootstrap.hpp"
#include "host/device.hpp"
#include "host/device_memory.hpp"
#include "host/gpu_check.hpp"
#include "host/ipc.hpp"
#include "host/node.hpp"
#include "rocep/mpi.hpp"

namespace {

using rocep::device::Scope;

constexpr int kWords = 1 << 20;  // 4 MiB of payload per rank

// The value rank `sender` writes at word `index` in round `round`.
__host__ __device__ inline uint32_t pattern(int sender, int round, int index) {
  return (static_cast<uint32_t>(sender) << 24) ^ (static_cast<uint32_t>(round) << 20) ^
         static_cast<uint32_t>(index * 2654435761u);
}

struct RoundTripStatus {
  uint32_t timed_out;
  uint32_t mismatches;
};

// Blocks store the pattern into the receiver; after a grid-wide count, block 0 releases the flag.
__global__ void send_pattern(uint32_t* peer_words, uint32_t* peer_flag, uint32_t* blocks_done, int sender,
                             int round) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < kWords; i += gridDim.x * blockDim.x) {
    peer_words[i] = pattern(sender, round, i);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    // Each block's stores are ordered before its count (release); the last block to count acquires all
    // of them and publishes the flag to the peer.
    __threadfence_system();
    const uint32_t done = atomicAdd(blocks_done, 1u) + 1;
    if (done == gridDim.x) {
      __threadfence_system();
      *blocks_done = 0;
      rocep::device::store_release<Scope::kSystem>(peer_flag, static_cast<uint32_t>(round));
    }
  }
}

__global__ void receive_pattern(const uint32_t* words, const uint32_t* flag, int sender, int round,
                                uint64_t timeout_ticks, RoundTripStatus* status) {
  __shared__ bool arrived;
  if (threadIdx.x == 0) {
    arrived = rocep::device::wait_until_at_least(flag, static_cast<uint32_t>(round), timeout_ticks);
    if (!arrived) {
      status->timed_out = 1;
    }
  }
  __syncthreads();
  if (!arrived) {
    return;
  }
  uint32_t mismatches = 0;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < kWords; i += gridDim.x * blockDim.x) {
    mismatches += words[i] != pattern(sender, round, i) ? 1 : 0;
  }
  if (mismatches > 0) {
    atomicAdd(&status->mismatches, mismatches);
  }
}

class IpcRoundTrip : public ::testing::Test {
 protected:
  void SetUp() override {
    int world = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    // Same decision on every rank: skip only if some rank sees no GPU.
    int local_devices = rocep::device_count();
    int fewest_devices = 0;
    MPI_Allreduce(&local_devices, &fewest_devices, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (fewest_devices == 0) {
      GTEST_SKIP() << "no GPU visible (hipGetDeviceCount/cudaGetDeviceCount returned 0): IPC test not run";
    }
    if (world < 2) {
      GTEST_SKIP() << "needs at least 2 MPI ranks on one node, got " << world;
    }
  }
};

TEST_F(IpcRoundTrip, KernelStoresIntoMappedPeerBuffer) {
  rocep::MpiBootstrap world(MPI_COMM_WORLD);
  const rocep::NodeLayout layout = rocep::node_layout(world, 0);
  ASSERT_EQ(layout.num_nodes, 1) << "the IPC test expects all ranks on one node";
  const int device =
      rocep::device_for_local_rank(layout.local_rank, rocep::device_count(), std::getenv("ROCEP_DEVICE"));
  rocep::set_device(device);

  rocep::DeviceBuffer words(rocep::ipc_allocation_bytes(kWords * sizeof(uint32_t)));
  // [0] = the flag peers release into, [1] = the local block counter of send_pattern.
  rocep::DeviceBuffer flags(rocep::ipc_allocation_bytes(2 * sizeof(uint32_t)),
                            rocep::DeviceMemoryKind::kPolledFlags);
  rocep::testing::fill_bytes(words, 0xA5);
  rocep::testing::fill_bytes(flags, 0);
  rocep::DeviceBuffer status_buffer(sizeof(RoundTripStatus));

  const rocep::PeerBuffers peer_words(rocep::gather_ipc_handles(world, words), world.rank(), words);
  const rocep::PeerBuffers peer_flags(rocep::gather_ipc_handles(world, flags), world.rank(), flags);
  rocep::Stream send_stream;
  rocep::Stream receive_stream;
  const int next = (world.rank() + 1) % world.size();
  const int previous = (world.rank() + world.size() - 1) % world.size();
  const uint64_t timeout_ticks = 10 * rocep::wall_clock_rate_hz(device);
  std::printf("[rank %d] GPU %d, writes to rank %d at %p\n", world.rank(), device, next, peer_words[next]);

  // Several rounds: the flag value is the round, so a stale flag from the last round is never mistaken.
  for (int round = 1; round <= 3; ++round) {
    rocep::testing::fill_bytes(status_buffer, 0);
    world.barrier();  // the previous round's checks are done everywhere before anyone overwrites
    // Senders are launched first: the first launch of a kernel may load it (lazy loading), and loading
    // waits for the device to idle, which a receiver spinning in the same process would never allow.
    // The peer's sender still runs while this rank's receiver spins.
    send_pattern<<<32, 256, 0, send_stream.get()>>>(static_cast<uint32_t*>(peer_words[next]),
                                                    static_cast<uint32_t*>(peer_flags[next]),
                                                    flags.as<uint32_t>() + 1, world.rank(), round);
    ROCEP_GPU_CHECK(hipGetLastError());
    receive_pattern<<<64, 256, 0, receive_stream.get()>>>(words.as<uint32_t>(), flags.as<uint32_t>(),
                                                          previous, round, timeout_ticks,
                                                          status_buffer.as<RoundTripStatus>());
    ROCEP_GPU_CHECK(hipGetLastError());
    send_stream.synchronize();
    receive_stream.synchronize();
    RoundTripStatus status{};
    ROCEP_GPU_CHECK(hipMemcpy(&status, status_buffer.get(), sizeof status, hipMemcpyDeviceToHost));
    EXPECT_EQ(status.timed_out, 0u) << "round " << round << ": flag from rank " << previous
                                    << " never arrived";
    EXPECT_EQ(status.mismatches, 0u) << "round " << round << ": words from rank " << previous << " differ";
  }
  world.barrier();  // nobody unmaps while a peer may still write
}

}  // namespace
