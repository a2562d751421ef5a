// How the dispatch and combine kernels reach their peers. Every access to another rank's memory goes through
// PeerTransport, so that the phase code names what it does (store into a peer's region, signal a peer) and
// never indexes a peer table itself. The transport of a node is IPC: each peer's regions are mapped into this
// process and reached with plain loads and stores over xGMI / NVLink. A transport without load/store access
// (SHMEM across nodes) takes its place behind the same calls.
#pragma once

#include <cstdint>

#include "ep_params.hpp"
#if defined(__HIPCC__) || defined(__CUDACC__)
#include "atomics.hpp"  // the members that signal: device compilations only (host code fills the tables)
#endif

namespace rocep::device {

// One set of arrival words of Signals, e.g. &Signals::dispatch_arrived.
using ArrivalWords = uint64_t (Signals::*)[kMaxWorld];

// The IPC transport: the peers' regions, mapped here (entry r is rank r's; this rank's own entry is its own
// memory). Built by the host (host/gpu_backend.cpp) from the group's IPC mappings.
struct PeerTransport {
  uint8_t* const* dispatch_regions;  // [world]: rank r's DispatchRegion
  uint8_t* const* combine_regions;   // [world]: rank r's CombineRegion
  Signals* const* signals;           // [world]: rank r's Signals

  // Load/store access to `peer`'s regions.
  ROCEP_DEVICE uint8_t* dispatch_region(int peer) const { return dispatch_regions[peer]; }
  ROCEP_DEVICE uint8_t* combine_region(int peer) const { return combine_regions[peer]; }
  ROCEP_DEVICE Signals* peer_signals(int peer) const { return signals[peer]; }

#if defined(__HIPCC__) || defined(__CUDACC__)
  // Adds `value` to `peer`'s (words)[index] at system scope, relaxed: the caller orders what it signals
  // with a system-scope release (fence_acq_rel_system) before it.
  __device__ void signal_add(int peer, ArrivalWords words, int index, uint64_t value) const {
    add_relaxed_system(&(signals[peer]->*words)[index], value);
  }
#endif
};

}  // namespace rocep::device
