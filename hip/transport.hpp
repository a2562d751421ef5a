// How the dispatch and combine kernels reach their peers. Every access to another rank's memory goes through
// PeerTransport, so that the phase code names what it does and never indexes a peer table itself:
//   - write_window + publish: stores bound for a peer's region, then handed over;
//   - row_window + publish_staged: the same for the per-token combine's rows, staged (SHMEM) at their own
//     rows of the expert outputs, so that rows a caller wrote there already need no copy;
//   - read_window: loads of a peer's region, after that peer's arrival was acquired (and, for a SHMEM
//     peer's messages held by a node-mate, that node-mate's arrival word for the peer: held_arrivals);
//   - share_tokens_block: this rank's own messages that peers will read (its staged tokens);
//   - signal_store + signal_add: the words of a peer's Signals; flag_store: a flag word in a peer's region;
//   - store_node_row + publish_node_sums: where the per-token combine sums each node's rows of a token on
//     that node first, the row index its summing rank reads, and that rank's puts of the sums;
//   - signal_block_done: a block's own arrival signal to the peers that count blocks (SHMEM), after its
//     puts; arrivals: how many arrival adds a peer's call makes.
// A peer of this node is reached by IPC: its regions are mapped into this process (by the runtime's IPC, or
// by the SHMEM engine where the group spans nodes) and reached with plain loads and stores over xGMI /
// NVLink, so a window is the peer's region itself and publish / share / signal_block_done have nothing left
// to do. A peer on another node (a bit of shmem_peers; builds with an engine, ROCEP_SHMEM) is reached through
// the engine: its write window is this rank's outbox for it, publish puts the range from the outbox into the
// peer's region (at the same offset: the regions are symmetric), share puts this rank's own messages into
// the image of this rank's dispatch region on the holder of each node that needs them (so that the
// holder's read_window is local, and its node-mates read the holder's image by IPC), the signal
// words are single-word puts and adds on the engine, and a flag is put after a fence. Each block signals a
// SHMEM peer itself, after a fence that orders its puts before the add, so the send returns with its puts
// in flight and the peer counts the blocks of the call (arrivals). The phase code calls every one of them
// where such a transport needs it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ep_params.hpp"
#if defined(__HIPCC__) || defined(__CUDACC__)
#include "atomics.hpp"  // the members that signal: device compilations only (host code fills the tables)
#include "shmem.hpp"    // ROCEP_HAVE_SHMEM and the engine's calls, in builds with an engine
#endif

namespace rocep::device {

// One set of arrival words of Signals, e.g. &Signals::dispatch_arrived.
using ArrivalWords = uint64_t (Signals::*)[kMaxWorld];
// One set of plain words of Signals, e.g. &Signals::tokens_from.
using SignalWords = int32_t (Signals::*)[kMaxWorld];

// The regions a rank exposes to its peers (hip/ep_params.hpp has their layouts).
enum class PeerRegion { kDispatch, kCombine };

#if defined(__HIPCC__) || defined(__CUDACC__)
// A run of consecutive set bits of a 32-bit mask: its lowest bit and its length.
struct BitRun {
  int start;
  int length;
};

// The lowest run of set bits of *bits (not 0), at most `longest` bits long, cleared from *bits: how a
// block hands over a batch's listed tokens, a put per run of consecutive ones.
__device__ inline BitRun take_lowest_run(uint32_t* bits, int longest) {
  const int start = __ffs(static_cast<int>(*bits)) - 1;
  const uint32_t above = *bits >> start;
  const int ones = ~above == 0 ? 32 - start : __ffs(static_cast<int>(~above)) - 1;
  const int length = ones < longest ? ones : longest;
  *bits &= length == 32 ? 0u : ~(((1u << length) - 1u) << start);
  return {start, length};
}
#endif

// The peers' regions (entry r is rank r's; this rank's own entry is its own memory). Built by the host
// (host/gpu_backend.cpp). The layout is the same in every build: a caller's build without an engine reads
// the same GroupView.
struct PeerTransport {
  uint8_t* const* dispatch_regions;  // [world]: rank r's DispatchRegion (a SHMEM peer's: the outbox for it)
  uint8_t* const* combine_regions;   // [world]: rank r's CombineRegion (a SHMEM peer's: the outbox for it)
  Signals* const* signals;           // [world]: rank r's Signals (a SHMEM peer's: unused)
  // The peers reached through the SHMEM engine: bit r for rank r. 0 on one node and without an engine.
  uint64_t shmem_peers;
  // With SHMEM peers, this rank's symmetric memory (the same addresses on every PE): its own regions and
  // signals, and the image of its dispatch messages, where share_tokens_block puts them on each holder,
  // addressed as its dispatch region (a message at its offset there; host/shmem_regions.hpp).
  uint8_t* own_dispatch_region;
  uint8_t* own_combine_region;
  Signals* own_signals;
  uint8_t* own_dispatch_image;
  int32_t rank;
  // [world]: the arrival adds rank r makes per call: 1 (its grid's last block signals), or one per block
  // of its grid where r reaches this rank through the SHMEM engine.
  const uint32_t* arrival_adds;
  // Per-token groups with SHMEM peers: this rank's expert-output rows bound for those peers, at their own
  // rows ([world x max_tokens] rows of CombineRegion::row_bytes, symmetric), put from there; also the
  // caller's combine input buffer (EpGroup::combine_input_buffer). Null otherwise.
  uint8_t* combine_staging;
  // With SHMEM peers, the dispatch messages cross once per node that needs them (docs/scale-out.md):
  // share_tokens_block puts this rank's into the image of the ranks of share_peers only, one per other node
  // (the one whose local index is this rank's, modulo its node's size). [world]: where this rank reads rank
  // r's messages (its region, or the image of r on this node's rank that holds it: this rank's own or a
  // node-mate's, mapped), and for a node-mate's, that rank's arrival word for r (mapped; null elsewhere),
  // whose count tells that the image is complete.
  uint64_t share_peers;
  const uint8_t* const* dispatch_sources;
  const uint64_t* const* held_arrivals;
  // [world]: bit q of entry r, rank q is on rank r's node.
  const uint64_t* node_ranks;
  // Where the per-token combine sums each node's rows first (Shape::node_sums, docs/scale-out.md): [world]
  // for rank q of this node, its NodeSums and its combine_staging (mapped; this rank's own for q = rank),
  // null elsewhere; [2][world] for a source s on another node, the rank of this node that sums its tokens'
  // rows (the holder of its messages here) and the slot of s there, -1 and -1 for s on this node.
  uint8_t* const* node_sums;
  uint8_t* const* staged_rows;
  const int32_t* node_summers;

  // The arrival count of `peer` once it made `calls` calls.
  ROCEP_DEVICE uint64_t arrivals(int peer, uint64_t calls) const { return calls * arrival_adds[peer]; }

  ROCEP_DEVICE bool through_shmem(int peer) const { return ((shmem_peers >> peer) & 1u) != 0; }

  // Where this rank stores bytes bound for `peer`'s `region`, addressed as that region is: they are the
  // peer's once published (publish) and signalled (signal_add). IPC: the peer's region itself.
  ROCEP_DEVICE uint8_t* write_window(PeerRegion region, int peer) const {
    return region == PeerRegion::kDispatch ? dispatch_regions[peer] : combine_regions[peer];
  }
  // The rows a combine send stages for a SHMEM peer (row_window): per-token groups' combine_staging, else
  // the peer's combine outbox.
  ROCEP_DEVICE uint8_t* staged_rows_for(int peer) const {
    return combine_staging != nullptr ? combine_staging : combine_regions[peer];
  }
  // Where a combine send stores a row bound for [offset, offset + a row) of `peer`'s combine region: IPC,
  // the peer's region there; SHMEM, `row_offset` of the rows staged for the peer, put from there by
  // publish_staged: per-token, combine_staging at the expert-output row's own offset; expanded, the peer's
  // combine outbox at the token's row (a weighted partial; the unweighted rows go through write_window).
  ROCEP_DEVICE uint8_t* row_window(int peer, std::size_t offset, std::size_t row_offset) const {
#if defined(ROCEP_HAVE_SHMEM)
    if (through_shmem(peer)) {
      return staged_rows_for(peer) + row_offset;
    }
#else
    (void)row_offset;
#endif
    return combine_regions[peer] + offset;
  }
  // Where this rank loads bytes of `peer`'s dispatch region from, once it acquired the peer's arrival (and
  // for a SHMEM peer the holder's, held_arrivals). IPC: the peer's region itself; SHMEM: the image of it on
  // this node's rank that holds it (dispatch_sources). The combine region: IPC only, where the group's
  // combines pull their rows from the peers' combine input buffers (Shape::pulled_combine).
  ROCEP_DEVICE const uint8_t* read_window(PeerRegion region, int peer) const {
#if defined(ROCEP_HAVE_SHMEM)
    if (region == PeerRegion::kDispatch && through_shmem(peer)) {
      return dispatch_sources[peer];
    }
#endif
    return region == PeerRegion::kDispatch ? dispatch_regions[peer] : combine_regions[peer];
  }

#if defined(__HIPCC__) || defined(__CUDACC__)
  // Called by the thread that stored [offset, offset + bytes) of `peer`'s write window, after those stores.
  // IPC: the stores are already in the peer's memory.
  __device__ void publish(PeerRegion region, int peer, std::size_t offset, std::size_t bytes) const {
#if defined(ROCEP_HAVE_SHMEM)
    if (through_shmem(peer)) {
      shmem::put_nbi(own_region(region) + offset, write_window(region, peer) + offset, bytes, peer);
    }
#else
    (void)region, (void)peer, (void)offset, (void)bytes;
#endif
  }
  // The same by every thread of the block, after its own stores of the block's range; `peer` is the same in
  // every thread. SHMEM synchronises the block, then the block puts the range together.
  __device__ void publish_block(PeerRegion region, int peer, std::size_t offset, std::size_t bytes) const {
#if defined(ROCEP_HAVE_SHMEM)
    if (through_shmem(peer)) {
      __syncthreads();
      shmem::put_nbi_block(own_region(region) + offset, write_window(region, peer) + offset, bytes, peer);
    }
#else
    (void)region, (void)peer, (void)offset, (void)bytes;
#endif
  }
  // By every thread of the block, after the block's stores through row_window: SHMEM puts
  // [row_offset, row_offset + bytes) of the rows staged for `peer` into [offset, offset + bytes) of its
  // combine region; `peer` is the same in every thread. IPC: the stores are already in the peer's memory.
  __device__ void publish_staged(int peer, std::size_t row_offset, std::size_t offset,
                                 std::size_t bytes) const {
#if defined(ROCEP_HAVE_SHMEM)
    if (through_shmem(peer)) {
      __syncthreads();
      shmem::put_nbi_block(own_combine_region + offset, staged_rows_for(peer) + row_offset, bytes, peer);
    }
#else
    (void)peer, (void)row_offset, (void)offset, (void)bytes;
#endif
  }
  // By the dispatch receive, where nodes sum first (Shape::node_sums): this rank's row of token `token` of
  // `source` (-1: none), where the rank of this node that sums the source's rows finds it; nothing for a
  // source on this node. Released to that rank by this rank's next combine (Signals::combine_staged).
  __device__ void store_node_row(const Shape& shape, int source, int token, int32_t row) const {
    const int summer = node_summers[source];
    if (summer >= 0) {
      const int slot = node_summers[shape.world + source];
      *reinterpret_cast<int32_t*>(node_sums[summer] + NodeSums::row_index_offset(shape, rank, slot, token)) =
          row;
    }
  }
  // By every thread of the block, after the block's stores of the node sums of `count` consecutive tokens
  // of `source` from `first` on (slot `slot` of this rank's NodeSums): puts them into this rank's rows of
  // those tokens in the source's combine region, where its other rows would go.
  __device__ void publish_node_sums(const Shape& shape, int source, int slot, int first, int count) const {
#if defined(ROCEP_HAVE_SHMEM)
    __syncthreads();
    const std::size_t row_bytes = CombineRegion::row_bytes(shape);
    shmem::put_nbi_block(
        own_combine_region + (static_cast<std::size_t>(rank) * shape.max_tokens + first) * row_bytes,
        node_sums[rank] + NodeSums::row_offset(shape, slot, first),
        static_cast<std::size_t>(count) * row_bytes, source);
#else
    (void)shape, (void)source, (void)slot, (void)first, (void)count;
#endif
  }
  // Called by every thread of the block after its own stores of the messages of `count` consecutive tokens
  // (at most 32) of this rank's own dispatch region from `offset` on, each `message_bytes` long (or none,
  // where the caller wrote them): messages the peers will read through their read_window. IPC: they read
  // them in place. SHMEM: each goes only to the holders (share_peers) of the nodes its experts are on:
  // thread t < count gives `ranks`, its token's destination ranks (bit r: rank r owns one of its
  // experts), and each holder gets the runs of consecutive tokens bound for its node, a block put each.
  // `world`: the group's ranks.
  __device__ void share_tokens_block(int world, std::size_t offset, std::size_t message_bytes, int count,
                                     uint64_t ranks) const {
#if defined(ROCEP_HAVE_SHMEM)
    if (share_peers == 0) {
      return;
    }
    __shared__ uint32_t bound;  // bit t: token t goes to the holder's node
    uint8_t* image = own_dispatch_image + offset;
    // The holders in turn, from rank (rank + 1 + block) % world on, cyclically, so that at any moment the
    // ranks' blocks write to different holders rather than all to the lowest one first.
    const int first = (rank + 1 + static_cast<int>(blockIdx.x)) % world;
    for (int turn = 0; turn < world; ++turn) {
      const int peer = (first + turn) % world;
      if (((share_peers >> peer) & 1u) == 0) {
        continue;  // the same in every thread
      }
      __syncthreads();  // the messages stored, and `bound` of the holder before read by every thread
      if (threadIdx.x == 0) {
        bound = 0;
      }
      __syncthreads();
      if (static_cast<int>(threadIdx.x) < count && (ranks & node_ranks[peer]) != 0) {
        atomicOr(&bound, 1u << threadIdx.x);
      }
      __syncthreads();
      for (uint32_t left = bound; left != 0;) {  // the same in every thread
        const BitRun run = take_lowest_run(&left, 32);
        const std::size_t at = static_cast<std::size_t>(run.start) * message_bytes;
        shmem::put_nbi_block(image + at, own_dispatch_region + offset + at,
                             static_cast<std::size_t>(run.length) * message_bytes, peer);
      }
    }
#else
    (void)world, (void)offset, (void)message_bytes, (void)count, (void)ranks;
#endif
  }
  // Called by thread 0 of a block after a barrier of the block, once its stores and puts for the peers are
  // issued: SHMEM adds 1 to every SHMEM peer's words[rank], after a fence that delivers the block's puts
  // first. The puts may still be in flight when the kernel ends.
  __device__ void signal_block_done(ArrivalWords words) const {
#if defined(ROCEP_HAVE_SHMEM)
    if (shmem_peers == 0) {
      return;
    }
    shmem::fence();
    for (int peer = 0; peer < kMaxWorld && (shmem_peers >> peer) != 0; ++peer) {
      if (through_shmem(peer)) {
        shmem::uint64_add(&(own_signals->*words)[rank], uint64_t{1}, peer);
      }
    }
#else
    (void)words;
#endif
  }
  // Stores `value` into `peer`'s (words)[index], a plain store (IPC) or a single-word put (SHMEM) that the
  // next arrival signal of this block (SHMEM) or grid (IPC) releases to the peer (signal_grid_done).
  __device__ void signal_store(int peer, SignalWords words, int index, int32_t value) const {
#if defined(ROCEP_HAVE_SHMEM)
    if (through_shmem(peer)) {
      shmem::int32_put(&(own_signals->*words)[index], value, peer);
      return;
    }
#endif
    (signals[peer]->*words)[index] = value;
  }
  // Adds `value` to `peer`'s (words)[index] at system scope, relaxed: the caller orders what it signals
  // with a system-scope release (fence_acq_rel_system) before it. A peer reached by IPC only: the SHMEM
  // peers count blocks (signal_block_done).
  __device__ void signal_add(int peer, ArrivalWords words, int index, uint64_t value) const {
    add_relaxed_system(&(signals[peer]->*words)[index], value);
  }
  // Stores `value` into the 64-bit flag at `offset` of `peer`'s `region` with release at system scope: what
  // this thread stored, and what its block stored or put before a barrier with it, is the peer's first.
  // SHMEM: the flag is put after a fence, so it is delivered after the block's puts.
  __device__ void flag_store(PeerRegion region, int peer, std::size_t offset, uint64_t value) const {
#if defined(ROCEP_HAVE_SHMEM)
    if (through_shmem(peer)) {
      shmem::fence();
      shmem::flag_put(reinterpret_cast<uint64_t*>(own_region(region) + offset), value, peer);
      return;
    }
#endif
    store_release<Scope::kSystem>(reinterpret_cast<uint64_t*>(write_window(region, peer) + offset), value);
  }

 private:
  __device__ uint8_t* own_region(PeerRegion region) const {
    return region == PeerRegion::kDispatch ? own_dispatch_region : own_combine_region;
  }
#endif
};

}  // namespace rocep::device
