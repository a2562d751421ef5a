// How the dispatch and combine kernels reach their peers. Every access to another rank's memory goes through
// PeerTransport, so that the phase code names what it does and never indexes a peer table itself:
//   - write_window + publish: stores bound for a peer's region, then handed over;
//   - read_window: loads of a peer's region, after that peer's arrival was acquired;
//   - share: this rank's own bytes that peers will read (its staged messages);
//   - signal_store + signal_add: the words of a peer's Signals; flag_store: a flag word in a peer's region.
// The transport of a node is IPC: each peer's regions are mapped into this process and reached with plain
// loads and stores over xGMI / NVLink, so a window is the peer's region itself and publish / share have
// nothing left to do. A transport without load/store access to a peer (SHMEM across nodes) gives a window
// onto a local image of the peer's region instead, turns publish into a non-blocking put from that image,
// share into a put of this rank's bytes into the peer's image of this rank's region (so that the peer's
// read_window is local), and signal_add into a signal on the same connection, ordered after those puts. The
// phase code calls every one of them where such a transport needs it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ep_params.hpp"
#if defined(__HIPCC__) || defined(__CUDACC__)
#include "atomics.hpp"  // the members that signal: device compilations only (host code fills the tables)
#endif

namespace rocep::device {

// One set of arrival words of Signals, e.g. &Signals::dispatch_arrived.
using ArrivalWords = uint64_t (Signals::*)[kMaxWorld];
// One set of plain words of Signals, e.g. &Signals::tokens_from.
using SignalWords = int32_t (Signals::*)[kMaxWorld];

// The regions a rank exposes to its peers (hip/ep_params.hpp has their layouts).
enum class PeerRegion { kDispatch, kCombine };

// The IPC transport: the peers' regions, mapped here (entry r is rank r's; this rank's own entry is its own
// memory). Built by the host (host/gpu_backend.cpp) from the group's IPC mappings.
struct PeerTransport {
  uint8_t* const* dispatch_regions;  // [world]: rank r's DispatchRegion
  uint8_t* const* combine_regions;   // [world]: rank r's CombineRegion
  Signals* const* signals;           // [world]: rank r's Signals

  // Where this rank stores bytes bound for `peer`'s `region`, addressed as that region is: they are the
  // peer's once published (publish) and signalled (signal_add). IPC: the peer's region itself.
  ROCEP_DEVICE uint8_t* write_window(PeerRegion region, int peer) const {
    return region == PeerRegion::kDispatch ? dispatch_regions[peer] : combine_regions[peer];
  }
  // Where this rank loads bytes of `peer`'s `region` from, once it acquired the peer's arrival. IPC: the
  // peer's region itself.
  ROCEP_DEVICE const uint8_t* read_window(PeerRegion region, int peer) const {
    return region == PeerRegion::kDispatch ? dispatch_regions[peer] : combine_regions[peer];
  }
  // Called by the thread that stored [offset, offset + bytes) of `peer`'s write window, after those stores
  // (publish_block: by every thread of the block, after its own stores of the block's range; a transport
  // that puts the range synchronises the block first). IPC: the stores are already in the peer's memory.
  ROCEP_DEVICE void publish(PeerRegion, int /*peer*/, std::size_t /*offset*/, std::size_t /*bytes*/) const {}
  ROCEP_DEVICE void publish_block(PeerRegion, int /*peer*/, std::size_t /*offset*/,
                                  std::size_t /*bytes*/) const {}
  // Called by every thread of the block after its own stores of the block's [offset, offset + bytes) of
  // this rank's own `region` (or none, where the caller wrote them): bytes the peers will read through their
  // read_window. IPC: they read them in place.
  ROCEP_DEVICE void share_block(PeerRegion, std::size_t /*offset*/, std::size_t /*bytes*/) const {}

#if defined(__HIPCC__) || defined(__CUDACC__)
  // Stores `value` into `peer`'s (words)[index], a plain store that the next signal_add of this grid
  // releases to the peer (signal_grid_done: the block's count, then a system-scope fence).
  __device__ void signal_store(int peer, SignalWords words, int index, int32_t value) const {
    (signals[peer]->*words)[index] = value;
  }
  // Adds `value` to `peer`'s (words)[index] at system scope, relaxed: the caller orders what it signals
  // with a system-scope release (fence_acq_rel_system) before it.
  __device__ void signal_add(int peer, ArrivalWords words, int index, uint64_t value) const {
    add_relaxed_system(&(signals[peer]->*words)[index], value);
  }
  // Stores `value` into the 64-bit flag at `offset` of `peer`'s `region` with release at system scope: what
  // this thread stored, and what its block stored before a barrier with it, is the peer's first. A
  // transport that puts would put the flag on the connection of the puts it flags, after them.
  __device__ void flag_store(PeerRegion region, int peer, std::size_t offset, uint64_t value) const {
    store_release<Scope::kSystem>(reinterpret_cast<uint64_t*>(write_window(region, peer) + offset), value);
  }
#endif
};

}  // namespace rocep::device
