// The sizes of the symmetric memory of a group whose ranks span nodes (docs/scale-out.md), from its Shape:
// what host/shmem_regions.hpp allocates on every PE, and their sum. Plain host code, so that the CPU tests
// check the sum without an engine: it grows as world x max_tokens_per_rank x the message or row bytes
// (per-token; expanded, times top_k), never with the experts beyond their masks.
#pragma once

#include <cstddef>

#include "hip/ep_params.hpp"

namespace rocep {

struct ShmemRegionSizes {
  // The dispatch region (device::DispatchRegion): its messages from dispatch_messages_offset on, and a block
  // of dispatch_source_bytes per source before them. A peer's dispatch window (the outbox for it) holds
  // this rank's block only, and an image of a rank's region its messages only, each addressed as the region
  // is. An outbox, an image and a staging slice are allocated per rank of the group (world of each), used
  // for the ranks on other nodes.
  std::size_t dispatch = 0;
  std::size_t dispatch_messages_offset = 0;
  std::size_t dispatch_source_bytes = 0;
  // Where this rank's (Shape::rank's) block lies in a region: DispatchRegion::source_offset.
  std::size_t dispatch_own_block = 0;
  std::size_t combine = 0;  // the combine region (device::CombineRegion)
  // Per-token (> 0: max_tokens_per_rank rows): the combine stages its rows for peers on other nodes in
  // combine_staging, world slices of this many bytes, and the combine windows of those peers are null.
  std::size_t combine_slice = 0;
  // Expanded (> 0): a combine outbox per rank of this many bytes (max_tokens_per_rank x top_k rows),
  // addressed as that rank's region: the unweighted combine stores its rows there at their own rows of the
  // region, the weighted one its partial of token t at row t (row_window).
  std::size_t combine_outbox = 0;
  // > 0: the combine sums each node's rows first (device::NodeSums, that many bytes).
  std::size_t node_sums = 0;
  std::size_t signals = 0;

  static ShmemRegionSizes of(const device::Shape& shape) {
    const std::size_t slice =
        static_cast<std::size_t>(shape.max_tokens) * device::CombineRegion::row_bytes(shape);
    ShmemRegionSizes sizes;
    sizes.dispatch = device::DispatchRegion::bytes(shape);
    sizes.dispatch_messages_offset = device::DispatchRegion::message_offset(shape, 0);
    sizes.dispatch_source_bytes = device::DispatchRegion::source_bytes(shape);
    sizes.dispatch_own_block = device::DispatchRegion::source_offset(shape, shape.rank);
    sizes.combine = device::CombineRegion::bytes(shape);
    sizes.combine_slice = shape.per_token != 0 ? slice : 0;
    sizes.combine_outbox = shape.per_token != 0 ? 0 : slice * static_cast<std::size_t>(shape.top_k);
    sizes.node_sums = shape.node_sums != 0 ? device::NodeSums::bytes(shape) : 0;
    sizes.signals = sizeof(device::Signals);
    return sizes;
  }

  // An image of a rank's dispatch region: its messages.
  std::size_t dispatch_image() const { return dispatch - dispatch_messages_offset; }

  // The bytes of every PE of a group of `world` ranks: its regions and signals, the images of every rank's
  // messages, and per rank a dispatch outbox and a combine outbox or staging slice.
  std::size_t total(int world) const {
    const auto ranks = static_cast<std::size_t>(world);
    return dispatch + combine + signals + node_sums +
           ranks * (dispatch_image() + dispatch_source_bytes + combine_outbox + combine_slice);
  }
};

}  // namespace rocep
