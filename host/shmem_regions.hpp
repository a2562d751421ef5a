// The peer-visible memory of a group whose ranks span nodes (docs/scale-out.md): the group's dispatch and
// combine regions and its signals in the SHMEM engine's symmetric memory, with what the transport needs
// for each peer on another node (hip/transport.hpp): an outbox per peer for each region, and an image of
// every rank's dispatch region. Symmetric bytes per rank: (1 + world) x the dispatch region (its own and
// the images), world x the dispatch region's ids, weights and masks, the signals, and the combine region
// with its outboxes: per-token, 2 x world - 1 slices of max_tokens_per_rank rows; expanded, (1 + world) x
// the region, which grows as world x max(world, top_k) x max_tokens_per_rank rows (docs/scale-out.md). Peers
// of this rank's node are reached through the engine's mapping of their symmetric memory, with plain loads
// and stores as over IPC. Compiled only into builds with an engine (ROCEP_SHMEM).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "node.hpp"
#include "rocep/bootstrap.hpp"

namespace rocep {

class ShmemEngine;

class ShmemRegions {
 public:
  // Collective over `world` (every rank, the same sizes): joins the engine (one per process, kept while the
  // process lives) and allocates the regions, zeroing the combine region and the signals. Throws ConfigError
  // when a rank of this node is not mapped by the engine, GpuRuntimeError when the engine's heap is too
  // small (NVSHMEM_SYMMETRIC_SIZE / ROCSHMEM_HEAP_SIZE) or it refused to start.
  // A dispatch window (the outbox for a peer) spans [0, dispatch_window_bytes) of the region: where this
  // rank stores into a peer's dispatch region. combine_slice_bytes > 0: this rank stores into a peer's
  // combine region only within [rank * combine_slice_bytes, (rank + 1) * combine_slice_bytes) (the
  // per-token layout's rows of this rank), so the outboxes hold that slice of each peer's region alone;
  // 0: whole regions (the expanded layout's unweighted combine stores anywhere in them).
  ShmemRegions(Bootstrap& world, const NodeLayout& layout, std::size_t dispatch_bytes,
               std::size_t dispatch_window_bytes, std::size_t combine_bytes, std::size_t combine_slice_bytes,
               std::size_t signal_bytes);
  // Frees the symmetric memory, a collective of the engine, unless leaked.
  ~ShmemRegions();
  ShmemRegions(const ShmemRegions&) = delete;
  ShmemRegions& operator=(const ShmemRegions&) = delete;

  uint8_t* dispatch_region() const { return dispatch_region_; }
  uint8_t* combine_region() const { return combine_region_; }
  void* signals() const { return signals_; }
  uint8_t* dispatch_images() const { return dispatch_images_; }
  // Bit r: rank r is on another node, reached by puts.
  uint64_t shmem_peers() const { return shmem_peers_; }
  // [world] each: where this rank stores into rank r's region (its own memory, a same-node peer's as
  // mapped by the engine, or the outbox for a peer on another node), and rank r's signals (null for a peer
  // on another node).
  const std::vector<void*>& dispatch_windows() const { return dispatch_windows_; }
  const std::vector<void*>& combine_windows() const { return combine_windows_; }
  const std::vector<void*>& signal_pointers() const { return signal_pointers_; }
  // Symmetric bytes this rank holds.
  std::size_t bytes() const { return bytes_; }
  // Gives the memory up without freeing it (a group that timed out: a peer may still put into it), and
  // without the collective free that a missing peer would never join.
  void leak() { allocations_.clear(); }

 private:
  void* allocate(std::size_t bytes);

  std::shared_ptr<ShmemEngine> engine_;
  std::vector<void*> allocations_;
  uint8_t* dispatch_region_ = nullptr;
  uint8_t* combine_region_ = nullptr;
  void* signals_ = nullptr;
  uint8_t* dispatch_images_ = nullptr;
  uint64_t shmem_peers_ = 0;
  std::vector<void*> dispatch_windows_;
  std::vector<void*> combine_windows_;
  std::vector<void*> signal_pointers_;
  std::size_t bytes_ = 0;
};

}  // namespace rocep
