// Grid- and group-level coordination used by every dispatch / combine kernel: failure reports, the
// arrival signals and the wait for all peers' signals, and the barrier across the blocks of one grid.
#pragma once

#include <cstdint>

#include "atomics.hpp"
#include "ep_params.hpp"
#include "transport.hpp"
#include "wait.hpp"

namespace rocep::device {

// Records a failure unless an earlier one is already recorded (the first one is the cause, later ones
// are consequences).
__device__ inline void report_failure(Status* status, StatusCode code, Operation operation, int peer,
                                      int token, int slot, int value) {
  if (atomicCAS(&status->code, 0u, static_cast<uint32_t>(code)) == 0u) {
    status->operation = static_cast<int32_t>(operation);
    status->peer = peer;
    status->token = token;
    status->slot = slot;
    status->value = value;
  }
}

__device__ inline bool timed_out(const Status* status) {
  return *reinterpret_cast<const volatile uint32_t*>(&status->code) ==
         static_cast<uint32_t>(StatusCode::kTimeout);
}

// Called by thread 0 of every block of a grid, once per use of `count` (zero before the first): releases
// the block's earlier stores at device scope into *count and returns true in the grid's last block only,
// which has then acquired every other block's stores and reset the count for the next use.
__device__ inline bool arrives_last(uint32_t* count) {
  if (fetch_add_acq_rel<Scope::kDevice>(count, 1u) != gridDim.x - 1) {
    return false;
  }
  *count = 0;  // the next use comes after a later release (the barrier's generation) or kernel boundary
  return true;
}

// By one thread: 1 added to words[rank] of every peer reached by IPC (this rank included), relaxed.
__device__ inline void add_to_ipc_peers(const PeerTransport& peers, int world, int rank, ArrivalWords words) {
  for (int peer = 0; peer < world; ++peer) {
    if (!peers.through_shmem(peer)) {
      peers.signal_add(peer, words, rank, uint64_t{1});
    }
  }
}

// By one thread, once every store that the peers' waits release is ordered before its own: one
// system-scope fence, then add_to_ipc_peers.
__device__ inline void signal_ipc_peers(const PeerTransport& peers, int world, int rank, ArrivalWords words) {
  fence_acq_rel_system();
  add_to_ipc_peers(peers, world, rank, words);
}

// Called by every thread of every block of a sending grid once the block's stores for the peers are
// issued. The blocks count in through *blocks_done (arrives_last); the grid's last block then, with one
// system-scope fence for the whole grid, adds 1 to every peer's words[rank], rather than a system fence
// and adds in every block (performance-notes.md, perf-kern-22). A peer reached through the SHMEM engine
// is signalled by every block instead, after its own puts
// (PeerTransport::signal_block_done). The last block also sets *claims (unless null) to 0: no block of the
// grid claims work any more, and the next grid to claim from it starts after this one.
__device__ inline void signal_grid_done(uint32_t* blocks_done, uint32_t* claims, const PeerTransport& peers,
                                        int world, int rank, ArrivalWords words) {
  __syncthreads();  // the block's stores are ordered before thread 0's
  if (threadIdx.x != 0) {
    return;
  }
  peers.signal_block_done(words);
  if (!arrives_last(blocks_done)) {
    return;
  }
  if (claims != nullptr) {
    *claims = 0;
  }
  signal_ipc_peers(peers, world, rank, words);  // every block's stores, acquired by the count
}

// Words of each rank that a wait reads once the rank has signalled: words[r] into into[r] (the block's shared
// memory), by the thread that waited for r, so that the block has them after the wait with no load of its
// own. Null: none.
struct SignalledWords {
  const int32_t* words;
  int32_t* into;
};

// The calling block waits until every rank r of `ranks` (bit r) but skipped_rank has signalled its
// `sequence`-th call (words[r] >= sequence; for arrival words, `peers` given, words[r] >=
// peers->arrivals(r, sequence), and where `held` is given and held[r] is not null, *held[r] too), thread r
// for rank r, so that the waits
// overlap (one after another, thread 0 paid a read of the polled words per rank); the whole block learns
// the outcome, and the `read` words of every rank waited for. A rank that does not signal in time is
// reported. Call from every thread.
__device__ inline bool block_wait_for_peers(const uint64_t* words, uint64_t sequence, int world,
                                            uint64_t timeout_ticks, Status* status, Operation operation,
                                            const PeerTransport* peers, int skipped_rank = -1,
                                            const uint64_t* const* held = nullptr,
                                            uint64_t ranks = ~uint64_t{0},
                                            SignalledWords read = {nullptr, nullptr}) {
  __shared__ int missing;  // ranks not waited for: late, or the group had already timed out
  if (threadIdx.x == 0) {
    missing = 0;
  }
  __syncthreads();
  const int peer = static_cast<int>(threadIdx.x);
  if (peer < world && peer != skipped_rank && ((ranks >> peer) & 1u) != 0) {
    const bool waited = !timed_out(status);
    const uint64_t expected = peers != nullptr ? peers->arrivals(peer, sequence) : sequence;
    const uint64_t* held_word = held != nullptr ? held[peer] : nullptr;
    if (!waited || !wait_until_at_least(words + peer, expected, timeout_ticks) ||
        (held_word != nullptr && !wait_until_at_least(held_word, expected, timeout_ticks))) {
      if (waited) {
        report_failure(status, StatusCode::kTimeout, operation, peer, -1, -1, static_cast<int>(sequence));
      }
      atomicAdd(&missing, 1);
    } else if (read.words != nullptr) {
      read.into[peer] = read.words[peer];
    }
  }
  // The barrier extends each waiting thread's acquire to the block: its reads are ordered before the
  // others' reads.
  __syncthreads();
  const bool all_arrived = missing == 0;
  __syncthreads();  // every thread has read `missing` before the block's next wait resets it
  return all_arrived;
}

// The barrier across the blocks of a grid in two halves, so that a block can work on what needs no other
// block between them: grid_arrive counts the calling block in (after the block's earlier stores) and
// returns, in thread 0, the barrier's generation it joined; grid_wait(generation) returns once every block
// of the grid has arrived, in every thread. All blocks of the grid must be resident at once: the host sizes
// grids that use it by occupancy. Call both from every thread, once per use.
__device__ inline uint64_t grid_arrive(GridBarrier* barrier) {
  __syncthreads();  // the block's stores are ordered before thread 0's release
  uint64_t generation = 0;
  if (threadIdx.x == 0) {
    generation = load_acquire<Scope::kDevice>(&barrier->generation);
    if (arrives_last(&barrier->arrived)) {
      store_release<Scope::kDevice>(&barrier->generation, generation + 1);
    }
  }
  return generation;
}

// Gives up (false) when another wait of the group has timed out, or after `timeout_ticks`, which is then
// reported against this rank itself.
__device__ inline bool grid_wait(GridBarrier* barrier, uint64_t generation, int rank, uint64_t timeout_ticks,
                                 Status* status, Operation operation) {
  __shared__ bool passed;  // written after the arrive's barrier: no thread still reads the last use's
  if (threadIdx.x == 0) {
    passed = true;
    const uint64_t start = wall_clock_ticks();
    while (passed && load_acquire<Scope::kDevice>(&barrier->generation) == generation) {
      if (timed_out(status)) {
        passed = false;
      } else if (wall_clock_ticks() - start > timeout_ticks) {
        report_failure(status, StatusCode::kTimeout, operation, rank, -1, -1, 0);
        passed = false;
      }
    }
  }
  __syncthreads();
  return passed;
}

// Both halves at once.
__device__ inline bool grid_barrier(GridBarrier* barrier, int rank, uint64_t timeout_ticks, Status* status,
                                    Operation operation) {
  return grid_wait(barrier, grid_arrive(barrier), rank, timeout_ticks, status, operation);
}

}  // namespace rocep::device
