// The peer-visible memory of a group whose ranks span nodes (docs/scale-out.md): the group's dispatch and
// combine regions and its signals in the SHMEM engine's symmetric memory, with what the transport needs
// for each peer on another node (hip/transport.hpp): a dispatch outbox per peer, an image of every rank's
// dispatch messages, and the combine's staging: per-token, the staging rows (world x max_tokens_per_rank
// rows, the expert outputs' own rows); expanded, a combine outbox per peer; where the combine sums nodes
// first, its node sums. Their sizes and their sum per rank: ShmemRegionSizes (host/shmem_sizes.hpp,
// docs/scale-out.md). Peers of this rank's node are reached through the engine's mapping of their symmetric
// memory, with plain loads and stores as over IPC. Compiled only into builds with an engine (ROCEP_SHMEM).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "node.hpp"
#include "rocep/bootstrap.hpp"
#include "shmem_sizes.hpp"

namespace rocep {

class ShmemEngine;

class ShmemRegions {
 public:
  // Collective over `world` (every rank, the same sizes): joins the engine (one per process, kept while the
  // process lives) and allocates the regions, zeroing the combine region and the signals. Throws ConfigError
  // when a rank of this node is not mapped by the engine, GpuRuntimeError when the engine's heap is too
  // small (naming sizes.total and NVSHMEM_SYMMETRIC_SIZE / ROCSHMEM_HEAP_SIZE) or it refused to start.
  ShmemRegions(Bootstrap& world, const NodeLayout& layout, const ShmemRegionSizes& sizes);
  // Frees the symmetric memory, a collective of the engine, unless leaked.
  ~ShmemRegions();
  ShmemRegions(const ShmemRegions&) = delete;
  ShmemRegions& operator=(const ShmemRegions&) = delete;

  uint8_t* dispatch_region() const { return dispatch_region_; }
  uint8_t* combine_region() const { return combine_region_; }
  void* signals() const { return signals_; }
  // The image of this rank's dispatch messages (where it puts them on their holders), addressed as its
  // dispatch region from sizes.dispatch_messages_offset on.
  uint8_t* own_dispatch_image() const { return own_dispatch_image_; }
  // Per-token groups: the combine's staging rows (PeerTransport::combine_staging); null for expanded ones.
  uint8_t* combine_staging() const { return combine_staging_; }
  // Bit r: rank r is on another node, reached by puts.
  uint64_t shmem_peers() const { return shmem_peers_; }
  // [world] each: where this rank stores into rank r's region, addressed as the region (its own memory, a
  // same-node peer's as mapped by the engine, or the outbox for a peer on another node, whose dispatch
  // window reaches this rank's source block only), and rank r's signals (null for a peer on another node).
  const std::vector<void*>& dispatch_windows() const { return dispatch_windows_; }
  const std::vector<void*>& combine_windows() const { return combine_windows_; }
  const std::vector<void*>& signal_pointers() const { return signal_pointers_; }
  // The dispatch messages crossing once per node (PeerTransport::share_peers): bit r, rank r holds this
  // rank's messages on its node; [world]: where this rank reads rank r's messages (addressed as r's region,
  // from sizes.dispatch_messages_offset on), and the Signals of the node-mate holding them (mapped; null
  // where r is on this node or this rank holds them).
  uint64_t share_peers() const { return share_peers_; }
  const std::vector<void*>& dispatch_sources() const { return dispatch_sources_; }
  const std::vector<void*>& held_signals() const { return held_signals_; }
  // [world] each, where the combine sums nodes first: rank r's NodeSums and its combine staging rows, for r
  // on this node (mapped; this rank's own), null elsewhere (PeerTransport::node_sums, staged_rows).
  const std::vector<void*>& node_sum_windows() const { return node_sum_windows_; }
  const std::vector<void*>& staged_rows() const { return staged_rows_; }
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
  uint8_t* dispatch_images_ = nullptr;  // rank r's messages at r x sizes.dispatch_image()
  uint8_t* own_dispatch_image_ = nullptr;
  uint8_t* combine_staging_ = nullptr;
  uint64_t shmem_peers_ = 0;
  std::vector<void*> dispatch_windows_;
  std::vector<void*> combine_windows_;
  std::vector<void*> signal_pointers_;
  uint64_t share_peers_ = 0;
  std::vector<void*> dispatch_sources_;
  std::vector<void*> held_signals_;
  std::vector<void*> node_sum_windows_;
  std::vector<void*> staged_rows_;
  std::size_t needed_bytes_ = 0;  // ShmemRegionSizes::total: what the constructor allocates in all
  std::size_t bytes_ = 0;
};

}  // namespace rocep
