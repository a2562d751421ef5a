// IPC between the ranks of one node, on memory allocated as the group's regions are (peer-visible):
//   KernelStoresIntoMappedPeerBuffer   every rank maps every peer's buffer, a kernel stores a rank-specific
//                                      pattern straight into the next rank's memory and releases a flag
//                                      there; the receiver's kernel acquires its flag (bounded wait) and
//                                      checks it
//   SmallBuffersOfOneAllocationStayApart  buffers far below the runtimes' pooled block size, shared by
//                                      (allocation, offset): a mapping that lost the offset would alias them
//   MessagePassingLitmus               thousands of messages each way in one kernel per rank, every word of
//                                      every message checked against its round by the receiver
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
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

// The message-passing litmus. Each rank sends kLitmusRounds messages to the next rank and receives as many
// from the previous one, both at once, in one kernel: sender blocks store a message into the next rank's
// mailbox and the round's last sender block publishes its round there (odd rounds: one system fence, then a
// relaxed add, as signal_grid_done does; even rounds: a system-scope release store); receiver blocks wait for
// the round in their own mailbox (bounded), check every word, and the round's last receiver block
// acknowledges it into the previous rank's mailbox, which the senders wait for before they overwrite. A
// payload store that reaches the receiver after its flag shows as a stale word; an acknowledgement seen
// before the check as a word of the next round.
constexpr uint32_t kLitmusRounds = 5000;
constexpr int kLitmusWords = 16384;  // 64 KiB per message
constexpr int kLitmusBlocks = 4;     // per role: blocks [0, 4) send, blocks [4, 8) receive
constexpr int kLitmusThreads = 256;

// One rank's mailbox, in peer-visible memory.
struct LitmusMailbox {
  uint32_t payload[kLitmusWords];  // written by the previous rank
  uint64_t sent;                   // rounds the previous rank has published into payload
  uint64_t checked;                // rounds the next rank has checked of what this rank sent it
};

// This rank's blocks that are done with their rounds so far (only grow; ordinary device memory).
struct LitmusCounts {
  uint32_t sent_blocks;
  uint32_t checked_blocks;
};

struct LitmusStatus {
  uint32_t timed_out;    // a wait gave up
  uint32_t mismatches;   // words that differed from their round's value
  uint32_t stale;        // of which: the previous round's value
  uint32_t recorded;     // the first mismatch below is claimed by compare-and-swap
  uint32_t first_round;  // the first mismatch recorded
  uint32_t first_index;
  uint32_t first_value;
};

// The word rank `sender` writes at `index` in `round`: every word differs from its value in any other round.
__host__ __device__ inline uint32_t litmus_word(int sender, uint32_t round, int index) {
  return (round * 2654435761u) ^ (static_cast<uint32_t>(index) * 0x9E3779B9u) ^
         (static_cast<uint32_t>(sender) << 28);
}

__global__ void litmus_exchange(LitmusMailbox* own, LitmusMailbox* next_mailbox,
                                LitmusMailbox* previous_mailbox, LitmusCounts* counts, int rank, int previous,
                                uint64_t timeout_ticks, LitmusStatus* status) {
  using namespace rocep::device;
  __shared__ bool go_on;
  const bool sends = blockIdx.x < kLitmusBlocks;
  const int first = static_cast<int>(sends ? blockIdx.x : blockIdx.x - kLitmusBlocks) * kLitmusThreads;
  for (uint32_t round = 1; round <= kLitmusRounds; ++round) {
    if (threadIdx.x == 0) {
      // Senders: the next rank has checked the last message. Receivers: this round's message has arrived.
      const uint64_t* word = sends ? &own->checked : &own->sent;
      go_on = *reinterpret_cast<volatile uint32_t*>(&status->timed_out) == 0 &&
              wait_until_at_least(word, uint64_t{sends ? round - 1 : round}, timeout_ticks);
      if (!go_on) {
        atomicExch(&status->timed_out, 1u);
      }
    }
    __syncthreads();  // extends thread 0's acquire to the block
    if (!go_on) {
      return;
    }
    uint32_t mismatches = 0;
    uint32_t stale = 0;
    for (int i = first + static_cast<int>(threadIdx.x); i < kLitmusWords;
         i += kLitmusBlocks * kLitmusThreads) {
      if (sends) {
        next_mailbox->payload[i] = litmus_word(rank, round, i);
      } else {
        const uint32_t value = own->payload[i];
        if (value != litmus_word(previous, round, i)) {
          ++mismatches;
          stale += value == litmus_word(previous, round - 1, i) ? 1 : 0;
          if (atomicCAS(&status->recorded, 0u, 1u) == 0u) {
            status->first_round = round;
            status->first_index = static_cast<uint32_t>(i);
            status->first_value = value;
          }
        }
      }
    }
    if (mismatches > 0) {
      atomicAdd(&status->mismatches, mismatches);
      atomicAdd(&status->stale, stale);
    }
    __syncthreads();  // the block's stores or checks are done before thread 0 counts the block
    if (threadIdx.x == 0) {
      uint32_t* count = sends ? &counts->sent_blocks : &counts->checked_blocks;
      // The round's last block acquires the others' work through the count and passes it on at system scope.
      if (fetch_add_acq_rel<Scope::kDevice>(count, 1u) + 1 == round * kLitmusBlocks) {
        if (!sends) {
          store_release<Scope::kSystem>(&previous_mailbox->checked, uint64_t{round});
        } else if (round % 2 == 1) {
          fence_acq_rel_system();
          add_relaxed_system(&next_mailbox->sent, uint64_t{1});  // round - 1 before
        } else {
          store_release<Scope::kSystem>(&next_mailbox->sent, uint64_t{round});
        }
      }
    }
  }
}

// Stores `mark ^ i` at word i of a buffer (SmallBuffersOfOneAllocationStayApart).
__global__ void store_marks(uint32_t* words, int count, uint32_t mark) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += gridDim.x * blockDim.x) {
    words[i] = mark ^ static_cast<uint32_t>(i);
  }
}

// Makes this rank's GPU current (its rank on the node, or ROCEP_DEVICE) and returns it.
int use_node_gpu(rocep::Bootstrap& world) {
  const rocep::NodeLayout layout = rocep::node_layout(world, 0);
  if (layout.num_nodes != 1) {
    throw std::runtime_error("the IPC tests expect all ranks on one node, got " +
                             std::to_string(layout.num_nodes) + " nodes");
  }
  const int device =
      rocep::device_for_local_rank(layout.local_rank, rocep::device_count(), std::getenv("ROCEP_DEVICE"));
  rocep::set_device(device);
  return device;
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
  const int device = use_node_gpu(world);

  rocep::DeviceBuffer words(kWords * sizeof(uint32_t), rocep::DeviceMemoryKind::kPeerVisible);
  // [0] = the flag peers release into, [1] = the local block counter of send_pattern.
  rocep::DeviceBuffer flags(2 * sizeof(uint32_t), rocep::DeviceMemoryKind::kPeerVisible);
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

TEST_F(IpcRoundTrip, SmallBuffersOfOneAllocationStayApart) {
  rocep::MpiBootstrap world(MPI_COMM_WORLD);
  use_node_gpu(world);
  // Far below the runtimes' 2 MiB pooled blocks, and no multiple of any granularity: several of them may
  // share one runtime allocation, each at its own offset.
  constexpr int kBuffers = 8;
  constexpr int kBufferWords = 1000;
  std::vector<rocep::DeviceBuffer> buffers;
  std::vector<std::unique_ptr<rocep::PeerBuffers>> peers;
  for (int b = 0; b < kBuffers; ++b) {
    buffers.emplace_back(kBufferWords * sizeof(uint32_t));
    rocep::testing::fill_bytes(buffers.back(), 0);
  }
  for (int b = 0; b < kBuffers; ++b) {
    const std::vector<rocep::IpcBufferHandle> handles = rocep::gather_ipc_handles(world, buffers[b]);
    std::printf("[rank %d] buffer %d: %zu bytes at offset %zu of its allocation\n", world.rank(), b,
                handles[world.rank()].bytes, handles[world.rank()].offset);
    peers.push_back(std::make_unique<rocep::PeerBuffers>(handles, world.rank(), buffers[b]));
  }
  // Every rank marks each buffer of the next rank with its own rank and the buffer's index.
  const int next = (world.rank() + 1) % world.size();
  const int previous = (world.rank() + world.size() - 1) % world.size();
  const auto mark = [](int sender, int buffer) {
    return (static_cast<uint32_t>(sender) << 24) | (static_cast<uint32_t>(buffer) << 16);
  };
  for (int b = 0; b < kBuffers; ++b) {
    store_marks<<<4, 256>>>(static_cast<uint32_t*>((*peers[b])[next]), kBufferWords, mark(world.rank(), b));
    ROCEP_GPU_CHECK(hipGetLastError());
  }
  ROCEP_GPU_CHECK(hipDeviceSynchronize());
  world.barrier();  // every rank's stores are complete
  for (int b = 0; b < kBuffers; ++b) {
    const std::vector<uint32_t> words = rocep::testing::download<uint32_t>(buffers[b], kBufferWords);
    int wrong = 0;
    for (int i = 0; i < kBufferWords; ++i) {
      wrong += words[i] != (mark(previous, b) ^ static_cast<uint32_t>(i)) ? 1 : 0;
    }
    EXPECT_EQ(wrong, 0) << "buffer " << b << ": " << wrong << " of " << kBufferWords << " words are not rank "
                        << previous << "'s (word 0 is " << std::hex << words[0] << ")";
  }
  world.barrier();  // every rank has checked before any mapping is closed or buffer freed
}

TEST_F(IpcRoundTrip, MessagePassingLitmus) {
  rocep::MpiBootstrap world(MPI_COMM_WORLD);
  const int device = use_node_gpu(world);
  rocep::DeviceBuffer mailbox(sizeof(LitmusMailbox), rocep::DeviceMemoryKind::kPeerVisible);
  rocep::DeviceBuffer counts(sizeof(LitmusCounts));
  rocep::DeviceBuffer status_buffer(sizeof(LitmusStatus));
  rocep::testing::fill_bytes(mailbox, 0);
  rocep::testing::fill_bytes(counts, 0);
  rocep::testing::fill_bytes(status_buffer, 0);
  const rocep::PeerBuffers mailboxes(rocep::gather_ipc_handles(world, mailbox), world.rank(), mailbox);
  const int next = (world.rank() + 1) % world.size();
  const int previous = (world.rank() + world.size() - 1) % world.size();
  const uint64_t timeout_ticks = 10 * rocep::wall_clock_rate_hz(device);
  rocep::Stream stream;
  world.barrier();  // every mailbox is zeroed before anyone sends into it
  litmus_exchange<<<2 * kLitmusBlocks, kLitmusThreads, 0, stream.get()>>>(
      mailbox.as<LitmusMailbox>(), static_cast<LitmusMailbox*>(mailboxes[next]),
      static_cast<LitmusMailbox*>(mailboxes[previous]), counts.as<LitmusCounts>(), world.rank(), previous,
      timeout_ticks, status_buffer.as<LitmusStatus>());
  ROCEP_GPU_CHECK(hipGetLastError());
  stream.synchronize();
  LitmusStatus status{};
  ROCEP_GPU_CHECK(hipMemcpy(&status, status_buffer.get(), sizeof status, hipMemcpyDeviceToHost));
  world.barrier();  // nobody unmaps while a peer may still write
  EXPECT_EQ(status.timed_out, 0u) << "a wait for rank " << previous << "'s message or rank " << next
                                  << "'s acknowledgement gave up";
  EXPECT_EQ(status.mismatches, 0u) << status.mismatches << " words from rank " << previous << " differed ("
                                   << status.stale << " of them the previous round's); the first in round "
                                   << status.first_round << ", word " << status.first_index << ": "
                                   << std::hex << status.first_value << " instead of "
                                   << litmus_word(previous, status.first_round,
                                                  static_cast<int>(status.first_index));
}

}  // namespace
