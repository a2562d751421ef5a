// Plain structs shared by the host launch code and the dispatch / combine kernels: the shape of a group,
// the layout of the receive regions every rank exposes to its peers, and the host-visible status record.
// No runtime types here: kernels take these by value.
#pragma once

#include <cstddef>
#include <cstdint>

#include "codecs.hpp"
#include "portable.hpp"

namespace rocep::device {

inline constexpr int kMaxWorld = 64;        // ranks of one node reachable by IPC (a uint64 mask per token)
inline constexpr int kMaxHidden = 1 << 16;  // the largest hidden size EpConfig accepts
// 32-bit words of the largest token scales: nvfp4's one byte per 16 elements.
inline constexpr int kMaxScaleWords = kMaxHidden / 16 / 4;
// The most ranks of a node whose per-token combine rows are summed on the node before they cross
// (Shape::node_sums): a node sum lists each rank's row of a token in shared memory.
inline constexpr int kMaxNodeSumRanks = 8;

enum class StatusCode : uint32_t {
  kOk = 0,
  kTimeout = 1,
  kExpertOutOfRange = 2,
  kExpertRepeated = 3,
  kTokenCountOutOfRange = 4,
  kCombineWeightingMismatch = 5,  // peer = a rank whose combine differed, value = 1 if it was weighted
};

enum class Operation : int32_t {
  kNone = 0,
  kDispatchSend = 1,
  kDispatchRecv = 2,
  kCombineSend = 3,
  kCombineRecv = 4,
};

// The first failure of any kernel of a group, in pinned host memory the host reads after the stream
// completes. `code` is claimed with a compare-and-swap, so the first failure wins and is never torn.
struct Status {
  uint32_t code;      // StatusCode
  int32_t operation;  // Operation
  int32_t peer;       // rank awaited (timeout) or -1
  int32_t token;      // token index (invalid input) or -1
  int32_t slot;       // top-k slot (invalid input) or -1
  int32_t value;      // the offending expert id / token count
};

struct Shape {
  int32_t hidden;
  int32_t top_k;
  int32_t num_experts;
  int32_t local_experts;
  int32_t world;
  int32_t rank;
  int32_t max_tokens;      // T = max_tokens_per_rank
  int32_t alignment;       // expert_alignment
  uint32_t payload_bytes;  // bytes of one token's payload in the dispatch format (a multiple of 16)
  uint32_t scale_bytes;    // bytes of one token's scales (0 for bf16)
  uint32_t message_bytes;  // payload then scales, padded to 16 bytes: what travels per token
  Format format;
  Fp8 fp8_encoding;   // resolved (never auto)
  int32_t per_token;  // 1: the per-token layout (EpConfig::Layout::kPerToken), 0: expanded
  // 1: every rank's grid is large enough to split a fused per-token combine into senders and receivers
  // (PerTokenTuning::kCombineSplitBlocks), so chunked_combine calls are chunked
  int32_t split_combine;
  // The most tokens of a chunk of a chunked combine (combine_chunk_tokens), agreed at creation from the
  // group's smallest grid (PerTokenTuning::combine_chunk_tokens); at least 1, at most kMaxCombineChunkTokens
  int32_t combine_chunk_tokens;
  // 1: the per-token combine's rows cross ranks as fp8 block-128 messages (EpConfig::combine_dtype): the
  // payload, then a float32 scale per 128 elements, in the rows of the combine region
  int32_t combine_fp8;
  // EpConfig::local_only (1: a rank dispatches only to its own experts, so no tokens or rows cross ranks)
  // and EpConfig::allreduce_world_size (1 unless local_only)
  int32_t local_only;
  int32_t allreduce_world_size;
  // 1: the group's per-token bf16 combine may pull (one node, more than one rank, not local-only): a rank
  // whose expert outputs are in its combine input buffer (CombineRegion::input_rows_offset) sends nothing,
  // and its peers load its rows of their tokens from there (Signals::combine_pulled)
  int32_t pulled_combine;
  // The per-token bf16 combine of a group spanning nodes sums each node's rows of a token on that node
  // before they cross (docs/scale-out.md, NodeSums): the node sums each rank keeps (a slot of T rows per
  // source on another node whose messages it holds, the most any rank holds); 0: every rank's row crosses
  int32_t node_sums;

  // A token's scales in whole 32-bit words (its message is padded to 16 bytes past them)
  ROCEP_HOST_DEVICE uint32_t scale_words() const { return (scale_bytes + 3) / 4; }
};

// Whether a combine adds the shared expert to `token` of this rank's call of `tokens`: every token, or in
// local-only mode the rank's slice [T * p / A, T * (p + 1) / A) (A = allreduce_world_size, p = rank % A),
// so that after the caller's all-reduce over A ranks each token carries it once (EpConfig::local_only).
ROCEP_HOST_DEVICE inline bool in_shared_expert_slice(const Shape& shape, int tokens, int token) {
  if (shape.local_only == 0) {
    return true;
  }
  const int64_t ranks = shape.allreduce_world_size;
  const int64_t position = shape.rank % ranks;
  return token >= tokens * position / ranks && token < tokens * (position + 1) / ranks;
}

// A per-token combine row in fp8 (Shape::combine_fp8): the fp8 payload of `hidden` bytes, then its scales.
ROCEP_HOST_DEVICE inline std::size_t fp8_combine_message_bytes(const Shape& shape) {
  return static_cast<std::size_t>(shape.hidden) +
         static_cast<std::size_t>(shape.hidden) / 128 * sizeof(float);
}

// Tokens of one source that are ranked together: one bit each in a 64-bit mask per local expert.
inline constexpr int kChunkTokens = 64;

// Chunks of kChunkTokens that one source's tokens take at most.
ROCEP_HOST_DEVICE inline int chunks_per_source(const Shape& shape) {
  return (shape.max_tokens + kChunkTokens - 1) / kChunkTokens;
}

// The chunks that hold a call's `tokens` tokens of one source: its masks are written for these only, and
// read for these only, so a call costs what it sends rather than what the group could send.
ROCEP_HOST_DEVICE inline int sent_chunks(int tokens) {
  return (tokens + kChunkTokens - 1) / kChunkTokens;
}

// One rank's dispatch region: a block per source rank s of what s stores there for its token t, then this
// rank's own messages. A source's block is contiguous, so that a sender on another node stages what it
// stores into a peer's region in an outbox of one block (host/shmem_regions.hpp):
//   ids     [T][top_k] int32: expert ids that concern this rank, -1 elsewhere
//   weights [T][top_k] float32
//   masks   [chunks_per_source][local_experts] uint64: bit t % kChunkTokens of masks[t / kChunkTokens][e] is
//           set when token t of s names this rank's local expert e (zero for tokens past s's count in its
//           last chunk; chunks past sent_chunks of s's count are not written and never read): the receiver
//           ranks its rows from them without reading the ids
//   token masks [chunks_per_source] uint64, per-token layout only: bit t % kChunkTokens of [t /
//           kChunkTokens] is set when token t of s names any expert of this rank (written and read as the
//           masks)
// and after the blocks of all sources:
//   message [T][message_bytes]: this rank's own tokens, staged there by its send (the payload, then the
//           scales row-major), or written there by the caller (bf16, EpGroup::dispatch_input_buffer); the
//           receivers read them from there (pull).
// Tokens are stored at their own index t (no compaction), so a sender needs no prefix sum and the receiver
// reads the sources in (rank, token) order directly.
struct DispatchRegion {
  // A multiple of 8: the ids and weights take 8 bytes per slot, so the masks are 8-byte aligned.
  ROCEP_HOST_DEVICE static std::size_t source_bytes(const Shape& shape) {
    const auto slots = static_cast<std::size_t>(shape.max_tokens) * shape.top_k;
    return slots * (sizeof(int32_t) + sizeof(float)) +
           static_cast<std::size_t>(chunks_per_source(shape)) * (shape.local_experts + 1) * sizeof(uint64_t);
  }
  ROCEP_HOST_DEVICE static std::size_t source_offset(const Shape& shape, int source) {
    return static_cast<std::size_t>(source) * source_bytes(shape);
  }
  ROCEP_HOST_DEVICE static std::size_t ids_offset(const Shape& shape, int source, int token) {
    return source_offset(shape, source) + static_cast<std::size_t>(token) * shape.top_k * sizeof(int32_t);
  }
  ROCEP_HOST_DEVICE static std::size_t weights_offset(const Shape& shape, int source, int token) {
    return ids_offset(shape, source, shape.max_tokens) +
           static_cast<std::size_t>(token) * shape.top_k * sizeof(float);
  }
  ROCEP_HOST_DEVICE static std::size_t masks_offset(const Shape& shape, int source, int chunk) {
    return weights_offset(shape, source, shape.max_tokens) +
           static_cast<std::size_t>(chunk) * shape.local_experts * sizeof(uint64_t);
  }
  ROCEP_HOST_DEVICE static std::size_t token_masks_offset(const Shape& shape, int source, int chunk) {
    return masks_offset(shape, source, chunks_per_source(shape)) +
           static_cast<std::size_t>(chunk) * sizeof(uint64_t);
  }
  // 16-byte aligned: messages are read and written in 16-byte vectors.
  ROCEP_HOST_DEVICE static std::size_t message_offset(const Shape& shape, int token) {
    return (source_offset(shape, shape.world) + 15) / 16 * 16 +
           static_cast<std::size_t>(token) * shape.message_bytes;
  }
  ROCEP_HOST_DEVICE static std::size_t bytes(const Shape& shape) {
    return message_offset(shape, shape.max_tokens);
  }
};

// The scales of every token a rank received in its last dispatch, row-major [world][T][row_bytes] (its own
// device memory, not exported), for receives that scales_laid_out_later (ep_kernels.hpp): each token's
// scales are kept here once and laid out for all rows in a pass after the expansion.
struct ReceivedScales {
  // A token's scale bytes padded to 16: rows are read in 16-byte vectors.
  ROCEP_HOST_DEVICE static std::size_t row_bytes(const Shape& shape) {
    return (static_cast<std::size_t>(shape.scale_bytes) + 15) / 16 * 16;
  }
  ROCEP_HOST_DEVICE static std::size_t offset(const Shape& shape, int source, int token) {
    return (static_cast<std::size_t>(source) * shape.max_tokens + token) * row_bytes(shape);
  }
  ROCEP_HOST_DEVICE static std::size_t bytes(const Shape& shape) { return offset(shape, shape.world, 0); }
};

// The per-token combine cuts a chunked call's T tokens into chunks of combine_chunk_tokens(shape, T) (at
// most Shape::combine_chunk_tokens) tokens, at least kCombineChunks of them when T allows: rank r's rows of
// chunk c are flagged to the chunk's owner on their own, so that its receive sums chunk c while later
// chunks still cross. Both ends derive the chunking from the group's Shape and T alone (the count the owner
// dispatched).
inline constexpr int kCombineChunks = 32;
inline constexpr int kMaxCombineChunkTokens = 32;  // the most Shape::combine_chunk_tokens may be
ROCEP_HOST_DEVICE inline int combine_chunk_tokens(const Shape& shape, int tokens) {
  const int spread = (tokens + kCombineChunks - 1) / kCombineChunks;
  return spread < 1 ? 1 : (spread > shape.combine_chunk_tokens ? shape.combine_chunk_tokens : spread);
}
// Whether a call of T tokens is chunked: only where every rank's receive can overlap the sends (the group's
// split_combine), and not for smaller calls (decode), sent in one piece per grid and released by its
// signal alone, since chunks of a few tokens would only add waits.
inline constexpr int kChunkedCombineTokens = 1024;
ROCEP_HOST_DEVICE inline bool chunked_combine(const Shape& shape, int tokens) {
  return shape.split_combine != 0 && tokens >= kChunkedCombineTokens;
}
// The most chunks of any call of the group (T <= max_tokens).
ROCEP_HOST_DEVICE inline int max_combine_chunks(const Shape& shape) {
  const int large = (shape.max_tokens + shape.combine_chunk_tokens - 1) / shape.combine_chunk_tokens;
  return large > kCombineChunks ? large : kCombineChunks;
}

// One rank's combine receive region, bf16 rows of `hidden`:
//   weighted (and per-token): [world][T] rows: the partial sum (per-token: the row) rank r computed for
//               token t at row r * T + t
//   unweighted (expanded):    [T][top_k] rows: expert output of (t, k) at row t * top_k + k
// then, for the per-token layout, chunk flags [max_combine_chunks][world] uint64: [c][r] = the last combine
// call whose rows of chunk c rank r has stored here (zero at creation; calls count from 1). Where combines
// pull (Shape::pulled_combine), then:
//   pulled rows [world][T] int32: [r][t] = the row of this rank's token t among rank r's received rows,
//               stored by rank r's dispatch receive for every token it received from this rank
//   input rows [world][T] rows: this rank's combine input buffer (EpGroup::combine_input_buffer), from
//               which its peers load the rows of their tokens when its expert outputs are there
struct CombineRegion {
  ROCEP_HOST_DEVICE static std::size_t row_bytes(const Shape& shape) {
    return static_cast<std::size_t>(shape.hidden) * sizeof(uint16_t);
  }
  // Per-token: a row per (rank, token); expanded: also [token][k] for an unweighted combine.
  ROCEP_HOST_DEVICE static std::size_t rows(const Shape& shape) {
    return static_cast<std::size_t>(shape.max_tokens) *
           (shape.per_token != 0 || shape.world > shape.top_k ? shape.world : shape.top_k);
  }
  // 8-byte aligned: row_bytes is a multiple of 16.
  ROCEP_HOST_DEVICE static std::size_t chunk_flag_offset(const Shape& shape, int chunk, int rank) {
    return rows(shape) * row_bytes(shape) +
           (static_cast<std::size_t>(chunk) * shape.world + rank) * sizeof(uint64_t);
  }
  ROCEP_HOST_DEVICE static std::size_t pulled_rows_offset(const Shape& shape) {
    return chunk_flag_offset(shape, shape.per_token != 0 ? max_combine_chunks(shape) : 0, 0);
  }
  ROCEP_HOST_DEVICE static std::size_t pulled_row_offset(const Shape& shape, int rank, int token) {
    return pulled_rows_offset(shape) +
           (static_cast<std::size_t>(rank) * shape.max_tokens + token) * sizeof(int32_t);
  }
  // 16-byte aligned, as the rows are.
  ROCEP_HOST_DEVICE static std::size_t input_rows_offset(const Shape& shape) {
    return (pulled_row_offset(shape, shape.world, 0) + 15) / 16 * 16;
  }
  ROCEP_HOST_DEVICE static std::size_t bytes(const Shape& shape) {
    return shape.pulled_combine != 0 ? input_rows_offset(shape) + static_cast<std::size_t>(shape.world) *
                                                                      shape.max_tokens * row_bytes(shape)
                                     : pulled_rows_offset(shape);
  }
};

// The node sums of a rank of a group whose per-token combine sums nodes first (Shape::node_sums), in the
// engine's symmetric memory, reached by this rank and its node-mates only:
//   rows       [node_sums][T] rows: slot l holds this node's sum of each token of the l-th source on another
//              node whose messages this rank holds (PeerTransport::node_summers), put from here to it
//   row index  [world][node_sums][T] int32: [q][l][t] = rank q's row of token t of that source among its
//              received rows, -1 where q received it not; stored by q's dispatch receive (q on this node)
struct NodeSums {
  ROCEP_HOST_DEVICE static std::size_t row_offset(const Shape& shape, int slot, int token) {
    return (static_cast<std::size_t>(slot) * shape.max_tokens + token) * CombineRegion::row_bytes(shape);
  }
  ROCEP_HOST_DEVICE static std::size_t row_index_offset(const Shape& shape, int rank, int slot, int token) {
    return row_offset(shape, shape.node_sums, 0) +
           ((static_cast<std::size_t>(rank) * shape.node_sums + slot) * shape.max_tokens + token) *
               sizeof(int32_t);
  }
  ROCEP_HOST_DEVICE static std::size_t bytes(const Shape& shape) {
    return row_index_offset(shape, shape.world, 0, 0);
  }
};

// Words every rank exposes for peers to signal into (polled-flag memory). The last block of a sending grid
// adds 1 once every block's stores are done (group_sync.hpp); the counts only grow, so they never need a
// reset and a stale count is never mistaken for a new one.
struct Signals {
  uint64_t dispatch_arrived[kMaxWorld];  // [s]: dispatch sends of source s so far
  uint64_t combine_arrived[kMaxWorld];   // [r]: combine sends of rank r so far
  int32_t tokens_from[kMaxWorld];        // [s]: tokens source s sent in its last dispatch
  int32_t combine_weighted[kMaxWorld];   // [r]: 1 if rank r's last combine send was weighted, else 0
  // [r]: 1 if rank r's last combine send left its rows in its combine input buffer for this rank to load
  // (Shape::pulled_combine), else 0: stored before anything that releases the send's rows or chunks
  int32_t combine_pulled[kMaxWorld];
  // [q]: combine sends of node-mate q (this rank included) whose rows for the other nodes are staged, where
  // the group sums nodes first (Shape::node_sums)
  uint64_t combine_staged[kMaxWorld];
};

// A barrier across the blocks of one kernel: blocks count in, the last one resets the count and bumps the
// generation the others wait for.
struct GridBarrier {
  uint32_t arrived;
  uint32_t unused;
  uint64_t generation;
};

// State a rank keeps for itself between the kernels of one dispatch / combine (device memory).
struct LocalState {
  GridBarrier barrier;
  int32_t sent_tokens;             // tokens of this rank's last dispatch_send
  uint32_t dispatch_blocks_sent;   // blocks of the running dispatch send that are done (then reset to 0)
  uint32_t combine_blocks_sent;    // the same for combine
  uint32_t combine_blocks_staged;  // the same for a combine's staging before its node sums (Shape::node_sums)
  // (source, token) pairs claimed so far by the blocks of a combine send past their first shares
  // (first_share); set to 0 again by the send's last block.
  uint32_t combine_claims;
  // 1 while every peer holds combine_pulled = combine_weighted = 1 from this rank, released by a signal of
  // an earlier per-token combine (written by block 0 of the combine sends only).
  int32_t peers_hold_pulled_words;
};

// The receives one block of a group's grids has completed (device memory, one entry per block). Every
// kernel of a group runs the same number of blocks, so block b learns which call it is in from its own
// entry, and no block waits for the others before the count moves on.
struct BlockCalls {
  uint64_t dispatches;  // the block is in dispatch call dispatches + 1
  uint64_t combines;
};

}  // namespace rocep::device
