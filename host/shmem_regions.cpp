#include "shmem_regions.hpp"

#include <stdexcept>
#include <string>

#include "gpu_check.hpp"
#include "hip/shmem.hpp"
#include "rocep/errors.hpp"
#if defined(ROCEP_HAVE_SHMEM)
#include "shmem_engine.hpp"
#endif

namespace rocep {

#if defined(ROCEP_HAVE_SHMEM)

namespace {

// The address `offset` bytes before `memory`: a window or image that the device addresses from `offset` on
// only (hip/transport.hpp), so that every byte it reaches lies in `memory`'s allocation. Integer arithmetic:
// the address itself may lie before the allocation.
void* addressed_from(uint8_t* memory, std::size_t offset) {
  return reinterpret_cast<void*>(reinterpret_cast<std::uintptr_t>(memory) - offset);
}

}  // namespace

ShmemRegions::ShmemRegions(Bootstrap& world, const NodeLayout& layout, const ShmemRegionSizes& sizes)
    : engine_(ShmemEngine::join(world)), needed_bytes_(sizes.total(world.size())) {
  const int ranks = world.size();
  const auto world_bytes = static_cast<std::size_t>(ranks);
  const std::size_t image_bytes = sizes.dispatch_image();
  dispatch_region_ = static_cast<uint8_t*>(allocate(sizes.dispatch));
  combine_region_ = static_cast<uint8_t*>(allocate(sizes.combine));
  signals_ = allocate(sizes.signals);
  dispatch_images_ = static_cast<uint8_t*>(allocate(world_bytes * image_bytes));
  own_dispatch_image_ = static_cast<uint8_t*>(
      addressed_from(dispatch_images_ + static_cast<std::size_t>(world.rank()) * image_bytes,
                     sizes.dispatch_messages_offset));
  // A peer's dispatch outbox holds what this rank stores into the peer's region: its own source block there
  // (ids, weights and masks; the messages are shared, not written into peers' regions).
  auto* dispatch_outboxes = static_cast<uint8_t*>(allocate(world_bytes * sizes.dispatch_source_bytes));
  // Combine: expanded, an outbox per peer; per-token, the staging rows instead, [world][max_tokens_per_rank]
  // rows, where the rows for every peer lie at their own rows of the expert outputs.
  auto* combine_outboxes = sizes.combine_outbox > 0
                               ? static_cast<uint8_t*>(allocate(world_bytes * sizes.combine_outbox))
                               : nullptr;
  if (sizes.combine_slice > 0) {
    combine_staging_ = static_cast<uint8_t*>(allocate(world_bytes * sizes.combine_slice));
  }
  auto* node_sums = sizes.node_sums > 0 ? static_cast<uint8_t*>(allocate(sizes.node_sums)) : nullptr;
  if (bytes_ != needed_bytes_) {
    throw std::logic_error("ShmemRegions: allocated " + std::to_string(bytes_) + " bytes, not the " +
                           std::to_string(needed_bytes_) + " of ShmemRegionSizes::total");
  }
  ROCEP_GPU_CHECK(hipMemset(combine_region_, 0, sizes.combine));
  ROCEP_GPU_CHECK(hipMemset(signals_, 0, sizes.signals));
  ROCEP_GPU_CHECK(hipDeviceSynchronize());
  for (int peer = 0; peer < ranks; ++peer) {
    const auto slot = static_cast<std::size_t>(peer);
    if (peer == world.rank()) {
      dispatch_windows_.push_back(dispatch_region_);
      combine_windows_.push_back(combine_region_);
      signal_pointers_.push_back(signals_);
    } else if (layout.on_this_node(peer)) {
      void* dispatch = shmem::peer_pointer(dispatch_region_, peer);
      void* combine = shmem::peer_pointer(combine_region_, peer);
      void* signals = shmem::peer_pointer(signals_, peer);
      if (dispatch == nullptr || combine == nullptr || signals == nullptr) {
        throw ConfigError("EpGroup: rank " + std::to_string(peer) +
                          " is on this node, but the SHMEM engine " +
                          "maps no memory of it here (peer-to-peer access between the two GPUs is missing)");
      }
      dispatch_windows_.push_back(dispatch);
      combine_windows_.push_back(combine);
      signal_pointers_.push_back(signals);
    } else {
      shmem_peers_ |= uint64_t{1} << peer;
      dispatch_windows_.push_back(
          addressed_from(dispatch_outboxes + slot * sizes.dispatch_source_bytes, sizes.dispatch_own_block));
      combine_windows_.push_back(combine_outboxes != nullptr ? combine_outboxes + slot * sizes.combine_outbox
                                                             : nullptr);
      signal_pointers_.push_back(nullptr);
    }
  }
  // The node sums and the staging rows of this node's ranks, mapped (the combine's node sums).
  for (int peer = 0; peer < ranks; ++peer) {
    const bool mate = layout.on_this_node(peer) && node_sums != nullptr;
    const bool own = peer == world.rank();
    node_sum_windows_.push_back(!mate ? nullptr : own ? node_sums : shmem::peer_pointer(node_sums, peer));
    staged_rows_.push_back(!mate ? nullptr
                           : own ? combine_staging_
                                 : shmem::peer_pointer(combine_staging_, peer));
    if (mate && (node_sum_windows_.back() == nullptr || staged_rows_.back() == nullptr)) {
      throw ConfigError("EpGroup: rank " + std::to_string(peer) +
                        " is on this node, but the SHMEM engine maps no memory of it here");
    }
  }
  // The dispatch messages cross once per node, to their holder there (message_holder), which its
  // node-mates read them from.
  for (int peer = 0; peer < ranks; ++peer) {
    const auto slot = static_cast<std::size_t>(peer);
    if (!layout.on_this_node(peer)) {
      if (message_holder(layout, world.rank(), layout.node_of_rank[peer]) == peer) {
        share_peers_ |= uint64_t{1} << peer;
      }
      const int holder = message_holder(layout, peer, layout.node);
      void* image = dispatch_images_ + slot * image_bytes;
      auto* source =
          static_cast<uint8_t*>(holder == world.rank() ? image : shmem::peer_pointer(image, holder));
      if (source == nullptr) {
        throw ConfigError("EpGroup: rank " + std::to_string(holder) +
                          " is on this node, but the SHMEM engine maps no memory of it here");
      }
      dispatch_sources_.push_back(addressed_from(source, sizes.dispatch_messages_offset));
      held_signals_.push_back(holder == world.rank() ? nullptr : signal_pointers_[holder]);
    } else {
      dispatch_sources_.push_back(dispatch_windows_[slot]);
      held_signals_.push_back(nullptr);
    }
  }
}

ShmemRegions::~ShmemRegions() {
  for (auto memory = allocations_.rbegin(); memory != allocations_.rend(); ++memory) {
    engine_->release(*memory);
  }
}

void* ShmemRegions::allocate(std::size_t bytes) {
  void* memory = nullptr;
  try {
    memory = engine_->allocate(bytes);
  } catch (const GpuRuntimeError& error) {
    throw GpuRuntimeError("EpGroup: the group needs " + std::to_string(needed_bytes_) +
                          " bytes of symmetric memory on every PE (docs/scale-out.md); " +
                          shmem::kHeapSizeVariable +
                          " must hold them beside the engine's own: " + error.what());
  }
  allocations_.push_back(memory);
  bytes_ += bytes;
  return memory;
}

#else  // a build without an engine: groups stay within one node

ShmemRegions::ShmemRegions(Bootstrap& world, const NodeLayout& layout, const ShmemRegionSizes&) {
  throw ConfigError(
      "EpGroup: backend gpu needs every rank on one node in a build without a SHMEM engine (" +
      std::to_string(layout.num_nodes) + " nodes for " + std::to_string(world.size()) +
      " ranks); build with -DROCEP_SHMEM=nvshmem or rocshmem (docs/scale-out.md) to span nodes");
}
ShmemRegions::~ShmemRegions() = default;

#endif

}  // namespace rocep
