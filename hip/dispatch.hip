// Dispatch: every token goes once to each rank that owns one of its experts; the receiver expands it into
// rows grouped by local expert, in (source rank, source token, k) order.
//
//   rocep_dispatch_send  sending half: store the payload (quantised if asked) into this rank's own region
//                        (unless the caller wrote the tokens there), validate ids, store ids / weights and
//                        the expert masks of each chunk of 64 tokens (a bit per token) into each peer's
//                        region, then the grid's last block adds 1 to the peers' dispatch_arrived[rank]
//                        words
//   rocep_dispatch_recv  receiving half: wait for every source; rank the rows per local expert from the
//                        senders' masks of the chunks that hold the call's tokens (where they fit, in every
//                        block on its own; else blocks over experts take the prefix over chunks and a grid
//                        barrier), whatever the group could send; every block takes the padded prefix over
//                        experts (row_offsets); blocks over (source, token), the rows of a batch of their
//                        items looked up at once, read each token from its source's region and copy it into
//                        its rows (small receives: other ranks' tokens in halves, two blocks each)
//   rocep_dispatch       both halves in one kernel (the fused call)
//   rocep_dispatch_recv_scale_runs, rocep_dispatch_scale_runs
//                        the same for receives that lay out their scales later (scales_laid_out_later:
//                        nvfp4, and fp8 block-128 fanned out 4 rows or more per token, when too large to
//                        rank in each block): after a grid barrier they lay out the scales of all rows in
//                        whole 512-byte runs of 128 rows
//   rocep_dispatch_wide, rocep_dispatch_wide_scaled, rocep_dispatch_scale_runs_wide, and their _recv
//                        kernels: the same on a budget's grid (LaunchGrid::wide), a block per
//                        multiprocessor expanding kWideExpansionItems tokens at a time; with
//                        rocep_dispatch_send_wide, their sends stage runs of tokens (stage_tokens)
#include "atomics.hpp"
#include "bf16.hpp"
#include "block_scan.hpp"
#include "ep_kernels.hpp"
#include "group_sync.hpp"
#include "quantize_message.hpp"
#include "vector_copy.hpp"

using namespace rocep::device;

namespace {

__device__ inline int32_t* region_ids(uint8_t* region, const Shape& shape, int source, int token) {
  return reinterpret_cast<int32_t*>(region + DispatchRegion::ids_offset(shape, source, token));
}
__device__ inline float* region_weights(uint8_t* region, const Shape& shape, int source, int token) {
  return reinterpret_cast<float*>(region + DispatchRegion::weights_offset(shape, source, token));
}
__device__ inline unsigned long long* region_masks(uint8_t* region, const Shape& shape, int source,
                                                   int chunk) {
  return reinterpret_cast<unsigned long long*>(region + DispatchRegion::masks_offset(shape, source, chunk));
}
__device__ inline unsigned long long* region_token_masks(uint8_t* region, const Shape& shape, int source,
                                                         int chunk) {
  return reinterpret_cast<unsigned long long*>(region +
                                               DispatchRegion::token_masks_offset(shape, source, chunk));
}
__device__ inline uint8_t* region_message(uint8_t* region, const Shape& shape, int token) {
  return region + DispatchRegion::message_offset(shape, token);
}

// Stores the scales of one token (row-major, 4-byte aligned; zeros when `scales` is null) into the rows
// rows[0, count) of the scale tensor, in the format's layout, skipping rows < 0, with threads [thread, ...,
// num_threads): each thread reads its groups of scale bytes once and stores them into every row.
__device__ void store_scales_to_rows(const uint8_t* scales, uint8_t* recv_scales, const ScaleGroups& groups,
                                     const int32_t* rows, int count, int thread, int num_threads) {
  const bool words = groups.group_bytes == 4;
  for (int g = thread; g < groups.groups; g += num_threads) {
    const std::size_t group_offset = static_cast<std::size_t>(g) * groups.group_stride;
    const uint32_t value =
        scales == nullptr ? 0u : (words ? reinterpret_cast<const uint32_t*>(scales)[g] : uint32_t{scales[g]});
    for (int c = 0; c < count; ++c) {
      if (rows[c] < 0) {
        continue;
      }
      uint8_t* destination = recv_scales + groups.row_offset(static_cast<uint32_t>(rows[c])) + group_offset;
      if (words) {
        *reinterpret_cast<uint32_t*>(destination) = value;
      } else {
        *destination = static_cast<uint8_t>(value);
      }
    }
  }
}

__device__ inline int requested_tokens(const DispatchSendArgs& args) {
  return args.num_tokens_on_device != nullptr ? *args.num_tokens_on_device : args.num_tokens;
}

// Stores one token into `message` (the payload, then the scales row-major), reading it once: quantised
// here (scaled formats from bf16), or copied as it is with `token_scales` (its scales when it arrived
// quantised). `head`: the thread's first staged vectors of `row`.
__device__ void store_token(uint8_t* message, const uint8_t* row, const uint8_t* token_scales, bool quantize,
                            const Shape& shape, float global_scale, const StagedVectors& head) {
  if (quantize) {
    switch (shape.format) {
      case Format::kFp8Block128:
        quantize_to_message<Format::kFp8Block128>(message, row, shape, global_scale, head.vector[0]);
        break;
      case Format::kMxfp8:
        quantize_to_message<Format::kMxfp8>(message, row, shape, global_scale, head.vector[0]);
        break;
      case Format::kMxfp4:
        quantize_to_message<Format::kMxfp4>(message, row, shape, global_scale, head.vector[0]);
        break;
      default:
        quantize_to_message<Format::kNvfp4>(message, row, shape, global_scale, head.vector[0]);
    }
    return;
  }
  copy_bytes16_to_many(&message, 1, row, shape.payload_bytes, threadIdx.x, blockDim.x, head);
  for (uint32_t i = threadIdx.x; i < shape.scale_bytes; i += blockDim.x) {
    message[shape.payload_bytes + i] = token_scales[i];
  }
}

// Tokens this rank sends: the count given, or 0 when it is out of range (then still signal every peer, so
// nobody waits for tokens that will never come).
__device__ inline int tokens_to_send(const Shape& shape, const DispatchSendArgs& args) {
  const int requested = requested_tokens(args);
  return requested < 0 || requested > shape.max_tokens ? 0 : requested;
}

// Slot k's id as dispatched: the id itself if it names an expert that no earlier slot of the token names,
// else -1, with the reason in *code.
__device__ inline int32_t checked_id(const int32_t* given, int k, const Shape& shape, StatusCode* code) {
  const int32_t id = given[k];
  *code = StatusCode::kOk;
  if (id < -1 || id >= shape.num_experts) {
    *code = StatusCode::kExpertOutOfRange;
    return -1;
  }
  for (int earlier = 0; id >= 0 && earlier < k; ++earlier) {
    if (given[earlier] == id) {
      *code = StatusCode::kExpertRepeated;
      return -1;
    }
  }
  return id;
}

// Bit r: rank r owns one of the experts token `token` names (ids out of range ignored).
__device__ inline uint64_t destination_ranks(const Shape& shape, const DispatchSendArgs& args, int token) {
  uint64_t ranks = 0;
  const int32_t* ids = args.topk_ids + static_cast<std::size_t>(token) * shape.top_k;
  for (int k = 0; k < shape.top_k; ++k) {
    if (ids[k] >= 0 && ids[k] < shape.num_experts) {
      ranks |= uint64_t{1} << (ids[k] / shape.local_experts);
    }
  }
  return ranks;
}

// This rank's staged messages of tokens [first, first + count) (count at most kBatchTokens), shared with
// the peers that read them (PeerTransport::share_tokens_block: over SHMEM each goes only to the nodes of
// its experts), by the whole block.
__device__ void share_tokens(const GroupView& group, const DispatchSendArgs& args, int first, int count) {
  const Shape& shape = group.shape;
  const int token = first + static_cast<int>(threadIdx.x);
  const uint64_t ranks = static_cast<int>(threadIdx.x) < count && group.peers.share_peers != 0
                             ? destination_ranks(shape, args, token)
                             : 0;
  group.peers.share_tokens_block(shape.world, DispatchRegion::message_offset(shape, first),
                                 shape.message_bytes, count, ranks);
}

// Tokens of one batch of send_tokens, a slot (token, k) per thread: a whole number of bytes of a chunk's
// masks (8, 16, 32 or 64 tokens), the fewest that give every block at most one batch of the chunks that
// hold the `num_tokens` tokens sent (sent_chunks) where top_k allows.
__device__ inline int batch_tokens(const Shape& shape, int num_tokens) {
  const int padded_tokens = sent_chunks(num_tokens) * kChunkTokens;
  int tokens = 8;
  while (tokens < kChunkTokens && 2 * tokens * shape.top_k <= static_cast<int>(blockDim.x) &&
         padded_tokens > tokens * static_cast<int>(gridDim.x)) {
    tokens *= 2;
  }
  return tokens;
}

// The calling thread's slot of a batch of tokens first_token + i, i in [0, count): token i = threadIdx.x /
// top_k, k = threadIdx.x % top_k; `active` false for threads past the batch.
struct BatchSlot {
  bool active;
  int token;
  int k;
  int32_t id;  // as given, loaded by load_batch_slot
  float weight;
};

// Loads the slot's id and weight: issued before the block's tokens are staged, so that their latency
// overlaps the copies.
__device__ inline BatchSlot load_batch_slot(const Shape& shape, const DispatchSendArgs& args, int first_token,
                                            int count) {
  const int i = static_cast<int>(threadIdx.x) / shape.top_k;
  BatchSlot slot{i < count, first_token + i, static_cast<int>(threadIdx.x) - i * shape.top_k, -1, 0.0f};
  if (slot.active) {
    const std::size_t index = static_cast<std::size_t>(slot.token) * shape.top_k + slot.k;
    slot.id = args.topk_ids[index];
    slot.weight = args.topk_weights[index];
  }
  return slot;
}

// Stores the low `tokens` bits of `bits` (8, 16, 32 or 64) at bit `first_bit` (a multiple of `tokens`) of
// the 64-bit mask at `mask`, with one store of that width: batches of a chunk write their own bytes of it.
__device__ inline void store_mask_bits(unsigned long long* mask, int first_bit, int tokens,
                                       unsigned long long bits) {
  uint8_t* bytes = reinterpret_cast<uint8_t*>(mask) + first_bit / 8;  // little-endian on both targets
  switch (tokens) {
    case 8:
      *bytes = static_cast<uint8_t>(bits);
      break;
    case 16:
      *reinterpret_cast<uint16_t*>(bytes) = static_cast<uint16_t>(bits);
      break;
    case 32:
      *reinterpret_cast<uint32_t*>(bytes) = static_cast<uint32_t>(bits);
      break;
    default:
      *mask = bits;
  }
}

// With every thread's slot loaded: checks the batch's ids (an invalid one is reported and not dispatched),
// stores ids and weights into every peer's region (-1 for an expert the peer does not own, so receivers
// read every source densely) and this rank's sent_ids, each token's destination ranks (a bit per rank that
// owns one of its experts) into sent_masks, and the batch's bits of every peer's expert masks
// (DispatchRegion: `tokens` bits of the chunk's mask per local expert, zero past the count), so that
// receivers rank their rows without reading the ids. All slots at once, not a token after another
// (performance-notes.md, perf-kern-8). `scratch`: shared, kBlockRankingMasks words.
template <bool kPerToken>
__device__ void send_batch_ids(const GroupView& group, int first_token, int tokens, int count,
                               const BatchSlot& slot, int32_t* given, unsigned long long* destinations,
                               unsigned long long* scratch) {
  const Shape& shape = group.shape;
  const int thread = threadIdx.x;
  // Per-token layout: bit i of [peer], token first_token + i names one of the peer's experts.
  __shared__ unsigned long long peer_token_bits[kPerToken ? kMaxWorld : 1];
  if (slot.active) {
    given[thread] = slot.id;
  }
  if (thread < count) {
    destinations[thread] = 0;
  }
  if (kPerToken && thread < shape.world) {
    peer_token_bits[thread] = 0;
  }
  __syncthreads();
  int32_t id = -1;
  if (slot.active) {
    StatusCode code = StatusCode::kOk;
    id = checked_id(given + (thread - slot.k), slot.k, shape, &code);
    if (code != StatusCode::kOk) {
      report_failure(group.status, code, Operation::kDispatchSend, -1, slot.token, slot.k, slot.id);
    }
    if (id >= 0 && shape.local_only != 0 && id / shape.local_experts != shape.rank) {
      id = -1;  // local-only: another rank's expert, which that rank runs on its own copy of the token
    }
    if (id >= 0) {
      atomic_set_bit(&destinations[thread / shape.top_k], id / shape.local_experts);
      if constexpr (kPerToken) {
        atomic_set_bit(&peer_token_bits[id / shape.local_experts], thread / shape.top_k);
      }
    }
    for (int peer = 0; peer < shape.world; ++peer) {
      uint8_t* region = group.peers.write_window(PeerRegion::kDispatch, peer);
      region_ids(region, shape, shape.rank, slot.token)[slot.k] =
          id >= 0 && id / shape.local_experts == peer ? id : -1;
      region_weights(region, shape, shape.rank, slot.token)[slot.k] = slot.weight;
    }
    group.sent_ids[static_cast<std::size_t>(slot.token) * shape.top_k + slot.k] = id;
  }
  const std::size_t slots_bytes = static_cast<std::size_t>(count) * shape.top_k;
  for (int peer = 0; peer < shape.world; ++peer) {
    group.peers.publish_block(PeerRegion::kDispatch, peer,
                              DispatchRegion::ids_offset(shape, shape.rank, first_token),
                              slots_bytes * sizeof(int32_t));
    group.peers.publish_block(PeerRegion::kDispatch, peer,
                              DispatchRegion::weights_offset(shape, shape.rank, first_token),
                              slots_bytes * sizeof(float));
  }
  __syncthreads();
  if (thread < count) {
    group.sent_masks[first_token + thread] = destinations[thread];
  }
  const int chunk = first_token / kChunkTokens;
  if (kPerToken && thread < shape.world) {  // the batch's bits of peer `thread`'s token masks
    const int first_bit = first_token % kChunkTokens;
    store_mask_bits(
        region_token_masks(group.peers.write_window(PeerRegion::kDispatch, thread), shape, shape.rank, chunk),
        first_bit, tokens, peer_token_bits[thread]);
    group.peers.publish(PeerRegion::kDispatch, thread,
                        DispatchRegion::token_masks_offset(shape, shape.rank, chunk) + first_bit / 8,
                        min(tokens, kChunkTokens) / 8);
  }
  // The mask bits of as many peers at a time as `scratch` holds (all of them for up to 1024 experts).
  static_assert(kMaxLocalExperts <= kBlockRankingMasks);
  const int round_peers = kBlockRankingMasks / shape.local_experts;
  for (int first_peer = 0; first_peer < shape.world; first_peer += round_peers) {
    const int first_expert = first_peer * shape.local_experts;
    const int words = min(round_peers, shape.world - first_peer) * shape.local_experts;
    for (int word = thread; word < words; word += blockDim.x) {
      scratch[word] = 0;
    }
    __syncthreads();
    if (id >= first_expert && id < first_expert + words) {
      atomic_set_bit(&scratch[id - first_expert], thread / shape.top_k);
    }
    __syncthreads();
    for (int word = thread; word < words; word += blockDim.x) {
      const int peer = first_peer + word / shape.local_experts;
      const int expert = word - (peer - first_peer) * shape.local_experts;
      const int first_bit = first_token % kChunkTokens;
      store_mask_bits(
          region_masks(group.peers.write_window(PeerRegion::kDispatch, peer), shape, shape.rank, chunk) +
              expert,
          first_bit, tokens, scratch[word]);
      group.peers.publish(PeerRegion::kDispatch, peer,
                          DispatchRegion::masks_offset(shape, shape.rank, chunk) +
                              static_cast<std::size_t>(expert) * sizeof(uint64_t) + first_bit / 8,
                          min(tokens, kChunkTokens) / 8);
    }
    __syncthreads();  // the scratch is cleared for the next peers
  }
}

// Stores `token` into this rank's own region, where the receivers read it: quantised here (scaled formats
// from bf16), or copied as it is with its scales.
__device__ void stage_token(const GroupView& group, const DispatchSendArgs& args, int token) {
  const Shape& shape = group.shape;
  const bool quantize = quantizes(shape, args);
  const std::size_t row_bytes = quantize ? static_cast<std::size_t>(shape.hidden) * 2 : shape.payload_bytes;
  const uint8_t* row = args.tokens + static_cast<std::size_t>(token) * row_bytes;
  StagedVectors head;
  head.load(row, threadIdx.x, row_bytes / kVectorBytes, blockDim.x);
  const float global_scale = quantize && shape.format == Format::kNvfp4 ? *args.global_scale : 1.0f;
  store_token(region_message(group.dispatch_region, shape, token), row,
              args.token_scales != nullptr
                  ? args.token_scales + static_cast<std::size_t>(token) * shape.scale_bytes
                  : nullptr,
              quantize, shape, global_scale, head);
}

// Quantises bf16 rows from[i] into messages to[i] (i < count) in the group's scaled format, by a block of
// kThreads threads.
template <int kThreads>
__device__ void quantize_rows(const uint8_t* const* from, uint8_t* const* to, int count, const Shape& shape,
                              float global_scale) {
  constexpr int kSlices = PerTokenTuning::kDispatchQuantizedSlices;
  switch (shape.format) {
    case Format::kFp8Block128:
      quantize_rows_to_messages<Format::kFp8Block128, kThreads, kSlices>(from, to, count, shape,
                                                                         global_scale);
      break;
    case Format::kMxfp8:
      quantize_rows_to_messages<Format::kMxfp8, kThreads, kSlices>(from, to, count, shape, global_scale);
      break;
    case Format::kMxfp4:
      quantize_rows_to_messages<Format::kMxfp4, kThreads, kSlices>(from, to, count, shape, global_scale);
      break;
    default:
      quantize_rows_to_messages<Format::kNvfp4, kThreads, kSlices>(from, to, count, shape, global_scale);
  }
}

// The scales of a run of `count` tokens that arrived quantised, contiguous at `scales` (the caller's rows),
// into their messages after the payloads (to[i] + payload_bytes), in Units (words where the scales are
// whole words, else bytes): every thread loads up to kAtOnce units before it stores any, so that a run's
// scales take one round trip of the memory rather than one per unit.
template <typename Unit>
__device__ void copy_run_scales(const uint8_t* scales, uint8_t* const* to, int count, const Shape& shape) {
  constexpr int kAtOnce = 4;
  const uint32_t units = shape.scale_bytes / sizeof(Unit);  // a token's
  const uint32_t total = static_cast<uint32_t>(count) * units;
  const auto* from = reinterpret_cast<const Unit*>(scales);
  for (uint32_t first = threadIdx.x; first < total; first += kAtOnce * blockDim.x) {
    Unit staged[kAtOnce];
#pragma unroll
    for (int i = 0; i < kAtOnce; ++i) {
      if (first + i * blockDim.x < total) {
        staged[i] = from[first + i * blockDim.x];
      }
    }
#pragma unroll
    for (int i = 0; i < kAtOnce; ++i) {
      const uint32_t unit = first + i * blockDim.x;
      if (unit < total) {
        const uint32_t token = unit / units;
        reinterpret_cast<Unit*>(to[token] + shape.payload_bytes)[unit - token * units] = staged[i];
      }
    }
  }
}

// This rank's tokens [0, num_tokens) into its own region, in runs of tokens_per_run consecutive tokens
// (run r by block r % gridDim.x): bf16 tokens, or tokens that arrived quantised with their scales
// (args.token_scales), as they are, with PerTokenTuning::kVectorsInFlight loads in flight per thread; or
// (`quantize`) bf16 tokens quantised into the group's scaled format, PerTokenTuning::kDispatchQuantizedSlices
// slices of 16 elements per block at a time. Each run is then shared as one range. The staging of the
// per-token send and of the expanded one on a budget's grid (blocks of kThreads), which a small grid
// otherwise waits on token by token.
template <int kThreads>
__device__ void stage_token_batches(const GroupView& group, const DispatchSendArgs& args, int num_tokens,
                                    bool quantize) {
  const Shape& shape = group.shape;
  constexpr int kBatch = PerTokenTuning::kBatchTokens;
  __shared__ const uint8_t* from[kBatch];
  __shared__ uint8_t* to[kBatch];
  const std::size_t row_bytes = quantize ? static_cast<std::size_t>(shape.hidden) * 2 : shape.payload_bytes;
  const float global_scale = quantize && shape.format == Format::kNvfp4 ? *args.global_scale : 1.0f;
  const int run = tokens_per_run(num_tokens, static_cast<int>(gridDim.x));
  for (int first = static_cast<int>(blockIdx.x) * run; first < num_tokens;
       first += static_cast<int>(gridDim.x) * run) {
    __syncthreads();  // the run before is stored
    if (static_cast<int>(threadIdx.x) < run) {
      const int token = first + static_cast<int>(threadIdx.x);
      from[threadIdx.x] = args.tokens + static_cast<std::size_t>(token) * row_bytes;
      to[threadIdx.x] = region_message(group.dispatch_region, shape, token);
    }
    __syncthreads();
    const int count = min(run, num_tokens - first);
    if (quantize) {
      quantize_rows<kThreads>(from, to, count, shape, global_scale);
    } else {
      copy_rows<PerTokenTuning::kVectorsInFlight>(from, to, count, shape.payload_bytes / kVectorBytes);
    }
    if (args.token_scales != nullptr) {
      const uint8_t* scales = args.token_scales + static_cast<std::size_t>(first) * shape.scale_bytes;
      if (shape.scale_bytes % 4 == 0 && reinterpret_cast<uintptr_t>(args.token_scales) % 4 == 0) {
        copy_run_scales<uint32_t>(scales, to, count, shape);
      } else {
        copy_run_scales<uint8_t>(scales, to, count, shape);
      }
    }
    share_tokens(group, args, first, count);
  }
}

// The fewest tokens per block (tokens_per_run) for which the expanded send on a budget's grid stages its
// tokens in runs: with fewer a block, runs were slower (performance-notes.md, perf-kern-9).
inline constexpr int kMinExpandedRunTokens = 8;

// This rank's tokens [0, num_tokens) into its own region, each shared once staged: in runs
// (stage_token_batches, kStagesRuns, blocks of kPerToken's threads) or one token per block at a time.
template <bool kPerToken, bool kMayQuantize, bool kStagesRuns>
__device__ void stage_tokens(const GroupView& group, const DispatchSendArgs& args, int num_tokens) {
  const int stride = static_cast<int>(gridDim.x);
  if constexpr (kStagesRuns) {
    if (kPerToken || tokens_per_run(num_tokens, stride) >= kMinExpandedRunTokens) {
      constexpr int kThreads = kPerToken ? PerTokenTuning::kDispatchThreads : kBlockThreads;
      stage_token_batches<kThreads>(group, args, num_tokens, kMayQuantize && quantizes(group.shape, args));
      return;
    }
  }
  if constexpr (!kPerToken) {
    for (int staged = static_cast<int>(blockIdx.x); staged < num_tokens; staged += stride) {
      stage_token(group, args, staged);
      share_tokens(group, args, staged, 1);
    }
  }
}

// Blocks over batches of this rank's tokens (batch_tokens, up to the end of the last chunk that holds
// tokens: the receivers read no chunk past it, sent_chunks): each batch's ids
// (send_batch_ids); and blocks over this rank's tokens, each staged once into this rank's own region (unless
// the caller wrote them there), whether or not any rank wants it, while a block's first batch of ids is
// loaded. Block 0 first tells every peer the token count, and the grid's last block then signals the peers'
// dispatch_arrived[rank] words. `scratch`: shared, kBlockRankingMasks words. kMayQuantize: false in the
// per-token kernels launched where the send does not quantise (quantizes), so that they carry no
// quantisation. kStagesRuns: the tokens are staged in runs (stage_token_batches), as the per-token send
// does, and the expanded one on a budget's grid where a block's runs are long enough; else one token per
// block at a time.
template <bool kPerToken, bool kMayQuantize = true, bool kStagesRuns = kPerToken>
__device__ void send_tokens(const GroupView& group, const DispatchSendArgs& args,
                            unsigned long long* scratch) {
  const Shape& shape = group.shape;
  __shared__ int32_t given[kPerToken ? PerTokenTuning::kDispatchThreads : kBlockThreads];
  __shared__ unsigned long long destinations[kChunkTokens];
  const int num_tokens = tokens_to_send(shape, args);
  if (blockIdx.x == 0 && threadIdx.x == 0 && num_tokens != requested_tokens(args)) {
    report_failure(group.status, StatusCode::kTokenCountOutOfRange, Operation::kDispatchSend, -1, -1, -1,
                   requested_tokens(args));
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    group.state->sent_tokens = num_tokens;
    for (int peer = 0; peer < shape.world; ++peer) {
      group.peers.signal_store(peer, &Signals::tokens_from, shape.rank, num_tokens);
    }
  }
  const int stride = static_cast<int>(gridDim.x);
  const int tokens = batch_tokens(shape, num_tokens);
  if (args.tokens_in_place) {  // written there by the caller: shared as they are, a run at a time
    const int run = tokens_per_run(num_tokens, stride);
    for (int first = static_cast<int>(blockIdx.x) * run; first < num_tokens; first += stride * run) {
      share_tokens(group, args, first, min(run, num_tokens - first));
    }
  }
  // The batches of the block: each one's slots loaded while the one before is sent (the first's while the
  // tokens are staged), so that a block with several batches waits once for its ids.
  const int end = sent_chunks(num_tokens) * kChunkTokens;
  const auto batch_count = [&](int first) {
    return first < end ? max(0, min(tokens, num_tokens - first)) : 0;
  };
  int first = static_cast<int>(blockIdx.x) * tokens;
  BatchSlot slot = load_batch_slot(shape, args, first, batch_count(first));
  if (!args.tokens_in_place) {
    stage_tokens<kPerToken, kMayQuantize, kStagesRuns>(group, args, num_tokens);
  }
  for (; first < end; first += stride * tokens) {
    const BatchSlot next =
        load_batch_slot(shape, args, first + stride * tokens, batch_count(first + stride * tokens));
    send_batch_ids<kPerToken>(group, first, tokens, batch_count(first), slot, given, destinations, scratch);
    slot = next;
  }
  signal_grid_done(&group.state->dispatch_blocks_sent, nullptr, group.peers, shape.world, shape.rank,
                   &Signals::dispatch_arrived);
}

// The rows of one receive as every block keeps them, in its shared memory: offsets[e] is the first row of
// local expert e (padded); masks (RankedRows); tokens_from[s], this call's tokens of source s
// (Signals::tokens_from). `masks` also serves the send of the fused kernels as scratch.
struct RowLayout {
  uint32_t offsets[kMaxLocalExperts + 1];
  unsigned long long masks[kBlockRankingMasks];
  int32_t tokens_from[kMaxWorld];
};

// A RowLayout as the receive reads it: its arrays where they lie, and what every thread derives from
// tokens_from in registers (held in shared memory, they were loaded again after each store to shared memory
// in the receive's loops). The receive ranks `chunks` chunks per source, those that hold the most tokens any
// source sent (`tokens`; sent_chunks), in (source, chunk) order, chunk c of source s at index s * chunks + c
// (`total` = world * chunks of them). Mask (s, c, e) has bit t % kChunkTokens set when token t of the chunk
// names local expert e, so a token's place among the chunk's rows of that expert is the popcount of the
// mask below it. `in_block`: every block ranks from a copy of the masks in `masks` (mask (s, c, e) at index
// (s * chunks + c) * local_experts + e); else from the senders' masks in this rank's region, with the rows
// of earlier chunks from the prefix pass (chunk_rows, by index). The masks of a source's chunks past its own
// are read as zero (holds_tokens: they keep what a larger call left there).
struct RankedRows {
  const uint32_t* offsets;
  const unsigned long long* masks;
  const int32_t* tokens_from;
  int tokens;
  int chunks;
  int total;
  bool in_block;
};

// Once tokens_from is the block's (block_wait_for_peers), in every thread.
__device__ inline RankedRows ranked_rows(const Shape& shape, const RowLayout& layout) {
  int tokens = 0;
  for (int source = 0; source < shape.world; ++source) {
    tokens = max(tokens, layout.tokens_from[source]);
  }
  const int chunks = sent_chunks(tokens);
  const int total = shape.world * chunks;
  return {layout.offsets,
          layout.masks,
          layout.tokens_from,
          tokens,
          chunks,
          total,
          total * shape.local_experts <= kBlockRankingMasks};
}

// Whether chunk `chunk` of `source` holds tokens of this call, so that its masks in the region are this
// call's.
__device__ inline bool holds_tokens(const RankedRows& layout, int source, int chunk) {
  return chunk < sent_chunks(layout.tokens_from[source]);
}

// Chunk `index` of the layout (s * chunks + c): its source s and its index c among the source's chunks.
struct SourceChunk {
  int source;
  int chunk;
};

__device__ inline SourceChunk source_chunk(const RankedRows& layout, int index) {
  const int source = index / layout.chunks;
  return {source, index - source * layout.chunks};
}

// The mask of local expert `expert` in chunk `index` of the layout, as the senders stored it in this rank's
// region (zero past the source's own chunks).
__device__ inline unsigned long long region_chunk_mask(const GroupView& group, const RankedRows& layout,
                                                       int index, int expert) {
  const SourceChunk at = source_chunk(layout, index);
  return holds_tokens(layout, at.source, at.chunk)
             ? region_masks(group.dispatch_region, group.shape, at.source, at.chunk)[expert]
             : 0ull;
}

// Blocks (of kThreads threads) over local experts: chunk_rows becomes, per expert, the rows of all earlier
// chunks (in (source, token) order), counted from the senders' masks; expert_rows gets each expert's total.
// Where an expert's chunks fill at most half a block, a pass counts as many experts' chunks as fit, one
// expert's after another's in one scan, each expert's rows counted from its first chunk's prefix
// (first_chunk_prefix: shared, kThreads words, the RowLayout's masks, which no block copies where the
// prefix pass runs).
template <int kThreads>
__device__ void prefix_chunk_rows(const GroupView& group, const RankedRows& layout,
                                  uint32_t* first_chunk_prefix) {
  const Shape& shape = group.shape;
  const int at_once = layout.total <= kThreads / 2 ? kThreads / layout.total : 1;
  if (at_once == 1) {
    for (int expert = blockIdx.x; expert < shape.local_experts; expert += gridDim.x) {
      uint32_t rows = 0;
      for (int first = 0; first < layout.total; first += kThreads) {
        const int index = first + threadIdx.x;
        const auto count =
            index < layout.total
                ? static_cast<uint32_t>(__popcll(region_chunk_mask(group, layout, index, expert)))
                : 0u;
        uint32_t block_rows = 0;
        const uint32_t before = block_exclusive_scan<kThreads>(count, &block_rows);
        if (index < layout.total) {
          group.chunk_rows[static_cast<std::size_t>(index) * shape.local_experts + expert] = rows + before;
        }
        rows += block_rows;
      }
      if (threadIdx.x == 0) {
        group.expert_rows[expert] = rows;
      }
    }
    return;
  }
  // The expert of the pass that this thread counts a chunk of, and the chunk.
  const int in_pass = static_cast<int>(threadIdx.x) / layout.total;
  const int index = static_cast<int>(threadIdx.x) - in_pass * layout.total;
  for (int first = static_cast<int>(blockIdx.x) * at_once; first < shape.local_experts;
       first += static_cast<int>(gridDim.x) * at_once) {
    const int expert = first + in_pass;
    const bool counts = in_pass < at_once && expert < shape.local_experts;
    const auto count =
        counts ? static_cast<uint32_t>(__popcll(region_chunk_mask(group, layout, index, expert))) : 0u;
    uint32_t block_rows = 0;
    // The scan's barriers order the previous pass's reads of first_chunk_prefix before these stores.
    const uint32_t before = block_exclusive_scan<kThreads>(count, &block_rows);
    if (counts && index == 0) {
      first_chunk_prefix[in_pass] = before;
    }
    __syncthreads();
    if (counts) {
      const uint32_t rows = before - first_chunk_prefix[in_pass];
      group.chunk_rows[static_cast<std::size_t>(index) * shape.local_experts + expert] = rows;
      if (index == layout.total - 1) {
        group.expert_rows[expert] = rows + count;
      }
    }
  }
}

// Rows of local expert `expert` in the chunks before chunk `chunk` of `source` (in all chunks for source =
// world, chunk = 0).
__device__ inline uint32_t rows_before_chunk(const GroupView& group, const RankedRows& layout, int source,
                                             int chunk, int expert) {
  const int index = source * layout.chunks + chunk;
  const int local_experts = group.shape.local_experts;
  if (!layout.in_block) {
    return index < layout.total ? group.chunk_rows[static_cast<std::size_t>(index) * local_experts + expert]
                                : group.expert_rows[expert];
  }
  uint32_t rows = 0;
  for (int earlier = 0; earlier < index; ++earlier) {
    rows += __popcll(layout.masks[earlier * local_experts + expert]);
  }
  return rows;
}

// sorted_token_ids' padding entry: one past the last (row, slot) pair the group can have.
__device__ inline int32_t padding_pair(const Shape& shape) {
  return static_cast<int32_t>(static_cast<std::size_t>(shape.world) * shape.max_tokens * shape.top_k);
}

// Every block (of kThreads threads): offsets[e] = first row of local expert e, each expert's rows padded to
// the alignment; offsets[local_experts] = all rows. Block 0 also publishes them (and the statistics) to the
// caller. `pads` (the per-token layout, where the offsets are those of sorted_token_ids): the padding
// entries of each expert's segment too, by the expert's thread in block expert % gridDim.x.
template <int kThreads>
__device__ void compute_row_offsets(const GroupView& group, const DispatchRecvArgs& args, RowLayout* layout,
                                    const RankedRows& ranked, bool pads) {
  const Shape& shape = group.shape;
  uint32_t* offsets = layout->offsets;
  uint32_t offset = 0;
  for (int first = 0; first < shape.local_experts; first += kThreads) {
    const int expert = first + threadIdx.x;
    uint32_t rows = 0;
    uint32_t padded = 0;
    if (expert < shape.local_experts) {
      rows = rows_before_chunk(group, ranked, shape.world, 0, expert);
      padded = (rows + shape.alignment - 1) / shape.alignment * shape.alignment;
    }
    uint32_t block_rows = 0;
    const uint32_t position = block_exclusive_scan<kThreads>(padded, &block_rows);
    if (expert < shape.local_experts) {
      offsets[expert] = offset + position;
      if (pads && expert % static_cast<int>(gridDim.x) == static_cast<int>(blockIdx.x)) {
        for (uint32_t entry = offset + position + rows; entry < offset + position + padded; ++entry) {
          args.sorted_token_ids[entry] = padding_pair(shape);
        }
      }
      if (blockIdx.x == 0) {
        args.row_offsets[expert] = offset + position;
        if (args.expert_ids != nullptr) {  // the expanded layout's identity (not kept per token)
          args.expert_ids[expert] = expert;
        }
        if (args.expert_token_counts != nullptr) {
          args.expert_token_counts[expert] += rows;
        }
      }
    }
    offset += block_rows;
  }
  if (threadIdx.x == 0) {
    offsets[shape.local_experts] = offset;
    if (blockIdx.x == 0) {
      args.row_offsets[shape.local_experts] = offset;
    }
  }
  __syncthreads();
}

// The layout of this call's rows in two halves, so that a block can copy between them (the per-token
// receive). Once every source's ids are here, and its token count in layout->tokens_from
// (block_wait_for_peers), every block (of kThreads threads) alike: a receive whose chunks' masks fit in
// kBlockRankingMasks is ranked by every block on its own from a copy of them in its shared memory; a
// larger one takes their prefix in a pass and a grid barrier, which rank_chunks arrives at and
// finish_layout waits for (`generation`: what rank_chunks returned). Then finish_layout puts each expert's
// first row into layout->offsets (compute_row_offsets, `pads` as there). `ranked`: ranked_rows of the
// layout, whose masks and offsets are the block's after finish_layout. finish_layout: false if the
// grid barrier gave up.
template <int kThreads>
__device__ uint64_t rank_chunks(const GroupView& group, RowLayout* layout, const RankedRows& ranked) {
  const Shape& shape = group.shape;
  if (ranked.in_block) {
    for (int i = threadIdx.x; i < ranked.total * shape.local_experts; i += blockDim.x) {
      const int index = i / shape.local_experts;
      layout->masks[i] = region_chunk_mask(group, ranked, index, i - index * shape.local_experts);
    }
    __syncthreads();
    return 0;
  }
  static_assert(sizeof(RowLayout::masks) >= kThreads * sizeof(uint32_t), "the masks hold a word per thread");
  prefix_chunk_rows<kThreads>(group, ranked, reinterpret_cast<uint32_t*>(layout->masks));
  return grid_arrive(&group.state->barrier);
}

template <int kThreads>
__device__ bool finish_layout(const GroupView& group, const DispatchRecvArgs& args, RowLayout* layout,
                              const RankedRows& ranked, uint64_t generation, bool pads) {
  if (!ranked.in_block && !grid_wait(&group.state->barrier, generation, group.shape.rank, group.timeout_ticks,
                                     group.status, Operation::kDispatchRecv)) {
    return false;
  }
  compute_row_offsets<kThreads>(group, args, layout, ranked, pads);
  return true;
}

// Once the calling block has every source's payload of call `sequence`: the block's next dispatch is the
// one after.
__device__ inline void count_dispatch(const GroupView& group, uint64_t sequence) {
  if (threadIdx.x == 0) {
    group.block_calls[blockIdx.x].dispatches = sequence;
  }
}

// Row of a slot of `token` from `source` (id: the slot's expert id as the region holds it, >= 0).
__device__ inline int32_t row_of(const GroupView& group, const RankedRows& layout, int source, int token,
                                 int32_t id) {
  const Shape& shape = group.shape;
  const int expert = id - shape.rank * shape.local_experts;
  const int chunk = token / kChunkTokens;
  const uint32_t earlier_chunks = rows_before_chunk(group, layout, source, chunk, expert);
  const unsigned long long mask =
      layout.in_block ? layout.masks[(source * layout.chunks + chunk) * shape.local_experts + expert]
                      : region_masks(group.dispatch_region, shape, source, chunk)[expert];
  const int32_t in_chunk = __popcll(mask & ((1ull << (token % kChunkTokens)) - 1));
  return static_cast<int32_t>(layout.offsets[expert] + earlier_chunks) + in_chunk;
}

// An item of the expansion: a token of one source, whole (half 0) or its first or second half (1, 2).
// Of a payload of `vectors` 16-byte vectors, the item holds [first_vector, first_vector + part_vectors);
// the item of the token's first part (half 0 or 1) also carries its scales and metadata.
struct ExpansionItem {
  int token;
  int source;
  int half;

  __device__ uint32_t first_vector(uint32_t vectors) const { return half == 2 ? vectors / 2 : 0u; }
  __device__ uint32_t part_vectors(uint32_t vectors) const {
    return half == 0 ? vectors : (half == 1 ? vectors / 2 : vectors - vectors / 2);
  }
  __device__ bool first_part() const { return half != 2; }
};

// A batch of expand_tokens' items: items first_item + j * gridDim.x for j < batch_items, one thread per
// slot k of item j (thread j * top_k + k).
struct ExpansionBatch {
  int first_item;
  int first_round;  // the block's rounds before first_item: first_item = blockIdx.x + first_round * gridDim.x
  int batch_items;
  int total;  // items of the receive
  bool halves;
  bool sources_turn;     // see batch_slot_expansion_item
  ExpansionItem* items;  // [batch_items], shared: filled by batch_slot_row for the items < total
};

// Items in one batch at most (with top_k 1, a thread per item would be kBlockThreads).
inline constexpr int kMaxBatchItems = 64;

// The item of this thread's slot of `batch` (slot k = thread % top_k of the thread / top_k-th item).
__device__ inline int batch_slot_item(const Shape& shape, const ExpansionBatch& batch) {
  return batch.first_item + static_cast<int>(threadIdx.x) / shape.top_k * static_cast<int>(gridDim.x);
}

// That item as (token, source), or for a small receive (`halves`) (token, this rank) and (token, other
// rank, half). With the source item % world, a grid that is a multiple of the world size kept each block
// on one source: at EP2 half the blocks only copied locally, the other half only read over the link.
// There (sources_turn) the sources of a token turn by one from each round of the block to the next, so that
// every block takes each source in turn (faster in every format: performance-notes.md, perf-kern-10).
__device__ inline ExpansionItem batch_slot_expansion_item(const Shape& shape, const ExpansionBatch& batch) {
  const int item = batch_slot_item(shape, batch);
  if (!batch.halves) {
    const int turn = batch.sources_turn ? batch.first_round + static_cast<int>(threadIdx.x) / shape.top_k : 0;
    return ExpansionItem{item / shape.world, (item + turn) % shape.world, 0};
  }
  const int items_per_token = 2 * shape.world - 1;
  const int token = item / items_per_token;
  const int slot = item % items_per_token;
  if (slot == 0) {
    return ExpansionItem{token, shape.rank, 0};
  }
  const int other = (slot - 1) >> 1;  // two slots per other rank
  return ExpansionItem{token, other + (other >= shape.rank ? 1 : 0), 1 + ((slot - 1) & 1)};
}

// batch_rows entry of a slot that has no token (past the batch, the items or its source's count).
inline constexpr int32_t kNoSlot = -2;

// The row of this thread's slot of `batch`: -1 if the slot names no local expert, kNoSlot if it has no
// token.
__device__ int32_t batch_slot_row(const GroupView& group, const RankedRows& layout,
                                  const ExpansionBatch& batch) {
  const Shape& shape = group.shape;
  const int k = static_cast<int>(threadIdx.x) % shape.top_k;
  const int item = batch_slot_item(shape, batch);
  if (static_cast<int>(threadIdx.x) >= batch.batch_items * shape.top_k || item >= batch.total) {
    return kNoSlot;
  }
  const ExpansionItem it = batch_slot_expansion_item(shape, batch);
  if (k == 0) {
    batch.items[threadIdx.x / shape.top_k] = it;
  }
  if (it.token >= layout.tokens_from[it.source]) {
    return kNoSlot;
  }
  const int32_t id = region_ids(group.dispatch_region, shape, it.source, it.token)[k];
  return id >= 0 ? row_of(group, layout, it.source, it.token, id) : -1;
}

// The metadata of this thread's slot of `batch` (row: its batch_slot_row), once per token (by the item of
// its first part): src_info and weight of its row, its token_rows entry.
__device__ void store_batch_slot(const GroupView& group, const DispatchRecvArgs& args,
                                 const ExpansionBatch& batch, int32_t row) {
  const Shape& shape = group.shape;
  if (row == kNoSlot) {
    return;
  }
  const int k = static_cast<int>(threadIdx.x) % shape.top_k;
  // Worked out again rather than read from batch.items: reading it cost rocep_dispatch_recv a resident
  // block per multiprocessor (performance-notes.md, perf-kern-11).
  const ExpansionItem it = batch_slot_expansion_item(shape, batch);
  if (it.half == 2) {
    return;
  }
  if (row >= 0) {
    args.src_info[3 * static_cast<std::size_t>(row) + 0] = it.source;
    args.src_info[3 * static_cast<std::size_t>(row) + 1] = it.token;
    args.src_info[3 * static_cast<std::size_t>(row) + 2] = k;
    args.recv_weights[row] = region_weights(group.dispatch_region, shape, it.source, it.token)[k];
  }
  group.token_rows[(static_cast<std::size_t>(it.source) * shape.max_tokens + it.token) * shape.top_k + k] =
      row;  // the final row, for combine
}

// The padding rows after each expert's rows, blocks over experts: zero payload (none where `input_scaled`:
// the input scales' kernel writes every row's codes), no source, weight 0; and zero scales in
// `scale_layout` where `scales_here` (scaled rows whose scales are laid out with the payloads).
__device__ inline void lay_out_padding_rows(const GroupView& group, const DispatchRecvArgs& args,
                                            const RankedRows& layout, bool input_scaled, bool scales_here,
                                            const ScaleGroups& scale_layout) {
  const Shape& shape = group.shape;
  for (int expert = blockIdx.x; expert < shape.local_experts; expert += gridDim.x) {
    const uint32_t first = layout.offsets[expert] + rows_before_chunk(group, layout, shape.world, 0, expert);
    for (uint32_t row = first; row < layout.offsets[expert + 1]; ++row) {
      uint8_t* destination = args.recv_tokens + static_cast<std::size_t>(row) * shape.payload_bytes;
      for (uint32_t i = threadIdx.x; !input_scaled && i < shape.payload_bytes / kVectorBytes;
           i += blockDim.x) {
        reinterpret_cast<Vector16*>(destination)[i] = Vector16{0, 0, 0, 0};
      }
      if (scales_here) {
        const auto padding_row = static_cast<int32_t>(row);
        store_scales_to_rows(nullptr, args.recv_scales, scale_layout, &padding_row, 1, threadIdx.x,
                             blockDim.x);
      }
      if (threadIdx.x == 0) {
        args.src_info[3 * static_cast<std::size_t>(row) + 0] = -1;
        args.src_info[3 * static_cast<std::size_t>(row) + 1] = -1;
        args.src_info[3 * static_cast<std::size_t>(row) + 2] = -1;
        args.recv_weights[row] = 0.0f;
      }
    }
  }
}

// Every thread of the block: source_regions[s] (shared, kMaxWorld) = where this rank reads the messages of
// source s (PeerTransport::read_window). The block's barrier after it orders them before their loads.
__device__ inline void load_source_regions(const GroupView& group, const uint8_t** source_regions) {
  for (int source = threadIdx.x; source < group.shape.world; source += blockDim.x) {
    source_regions[source] = group.peers.read_window(PeerRegion::kDispatch, source);
  }
}

// Whether any slot of an item (rows: its top_k entries of batch_rows) names a local expert.
__device__ inline bool names_local_expert(const int32_t* rows, int top_k) {
  bool named = false;
  for (int k = 0; k < top_k; ++k) {
    named = named || rows[k] >= 0;
  }
  return named;
}

// Where the part of item `it` starts in each of its rows (rows: its top_k entries of batch_rows, >= 0
// where a row), into row_starts in slot order; returns how many.
__device__ inline int part_row_starts(const Shape& shape, const DispatchRecvArgs& args,
                                      const ExpansionItem& it, const int32_t* rows, uint32_t vectors,
                                      uint8_t** row_starts) {
  const std::size_t offset = it.first_vector(vectors) * kVectorBytes;
  int count = 0;
  for (int k = 0; k < shape.top_k; ++k) {
    if (rows[k] >= 0) {
      row_starts[count++] =
          args.recv_tokens + static_cast<std::size_t>(rows[k]) * shape.payload_bytes + offset;
    }
  }
  return count;
}

// Every thread of the block: the scales of the first part of item `it` (rows: its top_k entries of
// batch_rows), from the scale words after the payload of its `message`, each thread's first one already
// loaded into `first_word` (with the payload), the rest (past blockDim.x) read here. Kept into
// received_scales where `scales_later` (for lay_out_scales), else into `message_scales` (shared,
// kMaxScaleWords words, which no thread may still be reading) and from there, after a barrier, into the
// item's rows.
__device__ inline void keep_item_scales(const GroupView& group, const DispatchRecvArgs& args,
                                        const ExpansionItem& it, const int32_t* rows,
                                        const ScaleGroups& scale_layout, bool scales_later,
                                        const uint8_t* message, uint32_t first_word,
                                        uint32_t* message_scales) {
  const Shape& shape = group.shape;
  const auto* message_words = reinterpret_cast<const uint32_t*>(message + shape.payload_bytes);
  const uint32_t scale_words = shape.scale_words();
  uint32_t* kept = scales_later
                       ? reinterpret_cast<uint32_t*>(group.received_scales +
                                                     ReceivedScales::offset(shape, it.source, it.token))
                       : message_scales;
  if (threadIdx.x < scale_words) {
    kept[threadIdx.x] = first_word;
  }
  for (uint32_t w = threadIdx.x + blockDim.x; w < scale_words; w += blockDim.x) {
    kept[w] = message_words[w];
  }
  if (!scales_later) {
    __syncthreads();
    store_scales_to_rows(reinterpret_cast<const uint8_t*>(message_scales), args.recv_scales, scale_layout,
                         rows, shape.top_k, threadIdx.x, blockDim.x);
  }
}

// The block's first batch of the expansion's items (`items`: shared, kMaxBatchItems entries): tokens whole,
// or halved where the items would leave blocks idle (batch_slot_expansion_item).
__device__ inline ExpansionBatch first_expansion_batch(const Shape& shape, const RankedRows& layout,
                                                       ExpansionItem* items) {
  const bool halves = (2 * shape.world - 1) * layout.tokens <= static_cast<int>(gridDim.x);
  return {static_cast<int>(blockIdx.x),
          0,
          min(kBlockThreads / shape.top_k, kMaxBatchItems),
          (halves ? 2 * shape.world - 1 : shape.world) * layout.tokens,
          halves,
          !halves && gridDim.x % shape.world == 0,
          items};
}

// Blocks over (source, token), the sources interleaved so that local copies and reads over the links run
// side by side: each token's payload and scales into its rows, with src_info and weight; then the padding
// rows. Reading from the sources' regions (a pull), each token crosses the link once per receiving rank
// and is written into its rows as it arrives, with no second pass over a staging copy here. A receive
// small enough to leave blocks idle has each token of another rank read by two blocks, half each, so that
// twice the reads over the link are in flight; this rank's own tokens stay whole. A block works out the
// rows of a batch of its items at once (a thread per slot of an item), so the loads that rank a slot are
// waited on once per batch rather than once per token. With `scales_later` (a constant in each kernel),
// each token's scales go to received_scales once instead, for lay_out_scales. `message_scales`: shared
// memory of kMaxScaleWords words.
__device__ void expand_tokens(const GroupView& group, const DispatchRecvArgs& args, const RankedRows& layout,
                              bool scales_later, uint32_t* message_scales) {
  const Shape& shape = group.shape;

  __shared__ int32_t batch_rows[kBlockThreads];  // [item of the batch][k]: batch_slot_row
  // The sources' regions, loaded with the first batch's rows: each item's payload loads wait on none.
  __shared__ const uint8_t* source_regions[kMaxWorld];
  load_source_regions(group, source_regions);
  __shared__ uint8_t* row_starts[kMaxTopK];
  __shared__ int row_count;
  const auto vectors = static_cast<uint32_t>(shape.payload_bytes / kVectorBytes);
  // With expert input scales the rows are fp8 codes, which rocep_dispatch_input_scales writes afterwards;
  // a token's first payload loads still go out, unconditional, which keeps the fused kernel within its 80
  // registers (tests/check_registers.py).
  const bool input_scaled = args.expert_input_scales != nullptr;
  const bool scaled = shape.format != Format::kBf16;
  const ScaleGroups scale_layout = scale_groups(shape.format, args.scale_rows, shape.hidden);
  __shared__ ExpansionItem batch_items[kMaxBatchItems];
  ExpansionBatch batch = first_expansion_batch(shape, layout, batch_items);
  for (; batch.first_item < batch.total;
       batch.first_item += batch.batch_items * gridDim.x, batch.first_round += batch.batch_items) {
    const int32_t slot_row = batch_slot_row(group, layout, batch);
    batch_rows[threadIdx.x] = slot_row;
    // A slot's metadata waits on a load (its weight). With several items per block it goes out once the
    // first payload loads are in flight; in a small receive, one item per block, before them (each measured
    // faster where it is used: performance-notes.md, perf-kern-12).
    bool metadata_pending = true;
    if (batch.halves) {
      store_batch_slot(group, args, batch, slot_row);
      metadata_pending = false;
    }
    __syncthreads();
    for (int j = 0; j < batch.batch_items; ++j) {
      const int item = batch.first_item + j * static_cast<int>(gridDim.x);
      if (item >= batch.total) {
        break;
      }
      const int32_t* rows = batch_rows + j * shape.top_k;
      if (!names_local_expert(rows, shape.top_k)) {
        continue;  // uniform across the block; also a token past its source's count
      }
      const ExpansionItem it = batch.items[j];
      const uint32_t first_vector = it.first_vector(vectors);
      const uint32_t part_vectors = it.part_vectors(vectors);
      const uint8_t* message = source_regions[it.source] + DispatchRegion::message_offset(shape, it.token);
      StagedVectors head{};
      head.load(message + first_vector * kVectorBytes, threadIdx.x, part_vectors, blockDim.x);
      // The token's scale words, read once with the payload's first loads: every row of the token stores
      // them, and reading them from the source once per row put a read over the link behind each row's
      // stores. A thread's first word waits in a register until the payload has landed, so the block does
      // not wait on it before the copy.
      const auto* message_words = reinterpret_cast<const uint32_t*>(message + shape.payload_bytes);
      uint32_t first_word = 0;
      if (scaled && it.first_part() && threadIdx.x < shape.scale_words()) {
        first_word = message_words[threadIdx.x];
      }
      if (metadata_pending) {
        store_batch_slot(group, args, batch, batch_rows[threadIdx.x]);
        metadata_pending = false;
      }
      if (threadIdx.x == 0) {
        row_count = part_row_starts(shape, args, it, rows, vectors, row_starts);
      }
      __syncthreads();
      if (!input_scaled) {  // uniform across the block
        copy_bytes16_to_many(row_starts, row_count, message + first_vector * kVectorBytes,
                             part_vectors * kVectorBytes, threadIdx.x, blockDim.x, head);
      }
      if (scaled && it.first_part()) {  // uniform across the block
        keep_item_scales(group, args, it, rows, scale_layout, scales_later, message, first_word,
                         message_scales);
      }
      __syncthreads();  // row_starts and message_scales are rewritten next
    }
    if (metadata_pending) {
      store_batch_slot(group, args, batch, batch_rows[threadIdx.x]);
    }
    __syncthreads();  // batch_rows is rewritten next
  }
  lay_out_padding_rows(group, args, layout, input_scaled, scaled && !scales_later, scale_layout);
}

// The items a block of the wide receive expands at a time (expand_tokens_wide): more at a time was faster
// up to eight, which the scaled kernels hold without spilling on sm_90; more would spill
// (performance-notes.md, perf-kern-13).
inline constexpr int kWideExpansionItems = 8;

// How the blocks of an expanded receive take their items: one at a time (expand_tokens), or on a budget's
// grid (LaunchGrid::wide) kWideExpansionItems at a time (expand_tokens_wide), bf16 payloads or scaled ones.
enum class Expansion { kOneAtATime, kWideBf16, kWideScaled };

// expand_tokens on a budget's grid (one block per multiprocessor, LaunchGrid::wide), kWideExpansionItems of
// the block's items at a time: their payloads' first loads (and, kScaled, each thread's first scale word of
// their tokens) all go out before the block waits on any, so that one block keeps several tokens' loads in
// flight, as the kExpandedBlocksPerSm blocks that a multiprocessor holds on the whole GPU's grid do, each
// waiting on its own. Its kernels may take the registers of a whole multiprocessor (one block each): a head
// of StagedVectors per item. Same rows, same bytes, same metadata as expand_tokens; the scales of each item
// then go to its rows one item after another through `message_scales`, or to received_scales where
// `scales_later`.
template <bool kScaled>
__device__ void expand_tokens_wide(const GroupView& group, const DispatchRecvArgs& args,
                                   const RankedRows& layout, bool scales_later, uint32_t* message_scales) {
  constexpr int kItems = kWideExpansionItems;
  const Shape& shape = group.shape;
  __shared__ int32_t batch_rows[kBlockThreads];  // [item of the batch][k]: batch_slot_row
  __shared__ const uint8_t* source_regions[kMaxWorld];
  load_source_regions(group, source_regions);
  __shared__ uint8_t* row_starts[kItems][kMaxTopK];
  __shared__ int row_counts[kItems];
  const auto vectors = static_cast<uint32_t>(shape.payload_bytes / kVectorBytes);
  // With expert input scales (bf16 only) the rows are fp8 codes, which rocep_dispatch_input_scales writes
  // afterwards: no payload is loaded or copied.
  const bool input_scaled = !kScaled && args.expert_input_scales != nullptr;
  const ScaleGroups scale_layout =
      kScaled ? scale_groups(shape.format, args.scale_rows, shape.hidden) : ScaleGroups{};
  __shared__ ExpansionItem batch_items[kMaxBatchItems];
  ExpansionBatch batch = first_expansion_batch(shape, layout, batch_items);
  for (; batch.first_item < batch.total;
       batch.first_item += batch.batch_items * gridDim.x, batch.first_round += batch.batch_items) {
    const int32_t slot_row = batch_slot_row(group, layout, batch);
    batch_rows[threadIdx.x] = slot_row;
    bool metadata_pending = true;
    if (batch.halves) {
      store_batch_slot(group, args, batch, slot_row);
      metadata_pending = false;
    }
    __syncthreads();
    for (int first = 0;
         first < batch.batch_items && batch.first_item + first * static_cast<int>(gridDim.x) < batch.total;
         first += kItems) {
      // The items [first, first + kItems) of the batch: a token part's payload where any of its slots names
      // a local expert (uniform across the block), null otherwise.
      const uint8_t* payloads[kItems];
      uint32_t item_vectors[kItems];
      StagedVectors heads[kItems];
      uint32_t first_words[kItems];  // kScaled: the thread's word of the item's scales, where it has them
#pragma unroll
      for (int i = 0; i < kItems; ++i) {
        const int j = first + i;
        payloads[i] = nullptr;
        item_vectors[i] = 0;
        first_words[i] = 0;
        if (j >= batch.batch_items || batch.first_item + j * static_cast<int>(gridDim.x) >= batch.total) {
          continue;
        }
        // names_local_expert written out: through the helper this loop compiled to other code in each of
        // the kItems unrolled items, and the scaled kernels were slower (performance-notes.md, perf-kern-14).
        bool wanted = false;
        for (int k = 0; k < shape.top_k; ++k) {
          wanted = wanted || batch_rows[j * shape.top_k + k] >= 0;
        }
        if (!wanted || input_scaled) {  // uniform across the block
          continue;
        }
        const ExpansionItem it = batch.items[j];
        item_vectors[i] = it.part_vectors(vectors);
        payloads[i] = source_regions[it.source] + DispatchRegion::message_offset(shape, it.token) +
                      it.first_vector(vectors) * kVectorBytes;
        heads[i].load(payloads[i], threadIdx.x, item_vectors[i], blockDim.x);
        if (kScaled && it.first_part() &&
            threadIdx.x < shape.scale_words()) {  // the message's scales follow its payload
          first_words[i] = reinterpret_cast<const uint32_t*>(payloads[i] + shape.payload_bytes)[threadIdx.x];
        }
      }
      if (metadata_pending) {
        store_batch_slot(group, args, batch, batch_rows[threadIdx.x]);
        metadata_pending = false;
      }
      if (static_cast<int>(threadIdx.x) < kItems) {
        const int j = first + static_cast<int>(threadIdx.x);
        row_counts[threadIdx.x] =
            j < batch.batch_items ? part_row_starts(shape, args, batch.items[j], batch_rows + j * shape.top_k,
                                                    vectors, row_starts[threadIdx.x])
                                  : 0;
      }
      __syncthreads();
#pragma unroll
      for (int i = 0; i < kItems; ++i) {
        if (payloads[i] != nullptr) {  // uniform across the block
          copy_bytes16_to_many(row_starts[i], row_counts[i], payloads[i], item_vectors[i] * kVectorBytes,
                               threadIdx.x, blockDim.x, heads[i]);
        }
      }
      if constexpr (kScaled) {
        bool message_scales_read = false;  // by store_scales_to_rows, since the last barrier
#pragma unroll
        for (int i = 0; i < kItems; ++i) {
          if (payloads[i] == nullptr || !batch.items[first + i].first_part()) {  // uniform across the block
            continue;
          }
          if (message_scales_read) {
            __syncthreads();
          }
          keep_item_scales(group, args, batch.items[first + i], batch_rows + (first + i) * shape.top_k,
                           scale_layout, scales_later, payloads[i], first_words[i], message_scales);
          message_scales_read = !scales_later;
        }
      }
      __syncthreads();  // row_starts and message_scales are rewritten next
    }
    if (metadata_pending) {
      store_batch_slot(group, args, batch, batch_rows[threadIdx.x]);
    }
    __syncthreads();  // batch_rows is rewritten next
  }
  lay_out_padding_rows(group, args, layout, input_scaled, kScaled && !scales_later, scale_layout);
}

// Four scale words of a received token: groups [first, first + 4) of its row in received_scales (zeros past
// the row's groups, or for no token).
__device__ inline Vector16 kept_scale_words(const uint32_t* kept, int first, int groups) {
  if (kept == nullptr) {
    return Vector16{0, 0, 0, 0};
  }
  if (first + 4 <= groups) {
    return *reinterpret_cast<const Vector16*>(kept + first);
  }
  uint32_t words[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    words[i] = first + i < groups ? kept[first + i] : 0u;
  }
  return Vector16{words[0], words[1], words[2], words[3]};
}

// After the expansion of a receive that scales_laid_out_later: every row's scales, from received_scales by
// its src_info (zeros for padding rows), stored in whole 512-byte runs, a run being one 4-byte group of
// 128 consecutive rows (an nvfp4 tile, or 128 rows of one block of fp8's transposed scales; the code
// follows ScaleGroups, so any layout of that kind works).
// Blocks over (128 rows, a part of their groups; parts enough for every block): each thread looks up the
// token of one row once, then per 8 groups (a 32-byte sector of the row) loads 4 of them, the next 8's
// already in flight; the block regroups them in shared memory (`words`, kMaxScaleWords) and 32 threads
// store each run, faster than each row storing its own groups where they belong, one sector each
// (performance-notes.md, perf-kern-15). Rows past the last one are not stored.
__device__ void lay_out_scales(const GroupView& group, const DispatchRecvArgs& args, uint32_t num_rows,
                               uint32_t* words) {
  const Shape& shape = group.shape;
  constexpr int kTileRows = 128;
  constexpr int kTileGroups = 8;
  static_assert(kTileRows * kTileGroups <= kMaxScaleWords && kBlockThreads == 2 * kTileRows &&
                kBlockThreads == kTileGroups * kTileRows / 4);
  __shared__ bool present[kTileRows];  // by the row's word in a run
  const ScaleGroups layout = scale_groups(shape.format, args.scale_rows, shape.hidden);
  const uint32_t tiles = (num_rows + kTileRows - 1) / kTileRows;
  const uint32_t chunks = (static_cast<uint32_t>(layout.groups) + kTileGroups - 1) / kTileGroups;
  const uint32_t wanted_parts = tiles == 0 ? 1 : min(chunks, (gridDim.x + tiles - 1) / tiles);
  const uint32_t part_chunks = (chunks + wanted_parts - 1) / wanted_parts;
  const uint32_t tile_parts = (chunks + part_chunks - 1) / part_chunks;  // none of them empty
  for (uint32_t item = blockIdx.x; item < tiles * tile_parts; item += gridDim.x) {
    const uint32_t first_row = item / tile_parts * kTileRows;
    const uint32_t first_chunk = item % tile_parts * part_chunks;
    const uint32_t end_chunk = min(first_chunk + part_chunks, chunks);
    const std::size_t run_start = layout.row_offset(first_row);
    const uint32_t row = first_row + threadIdx.x / 2;
    const int half = static_cast<int>(threadIdx.x % 2) * 4;  // the thread's groups [half, half + 4) of 8
    const int32_t* source = args.src_info + 3 * static_cast<std::size_t>(row);  // rank, token, k
    const uint32_t* kept = nullptr;
    if (row < num_rows && source[0] >= 0) {
      kept = reinterpret_cast<const uint32_t*>(group.received_scales +
                                               ReceivedScales::offset(shape, source[0], source[1]));
    }
    const auto row_word = static_cast<uint32_t>((layout.row_offset(row) - run_start) / 4);
    if (half == 0) {
      present[row_word] = row < num_rows;
    }
    const int run = static_cast<int>(threadIdx.x) / 32;           // the group of the 8 this thread stores
    const int run_word = static_cast<int>(threadIdx.x % 32) * 4;  // and its 4 words of that run
    Vector16 next = kept_scale_words(kept, static_cast<int>(first_chunk) * kTileGroups + half, layout.groups);
    for (uint32_t chunk = first_chunk; chunk < end_chunk; ++chunk) {
      const int first_group = static_cast<int>(chunk) * kTileGroups;
      const Vector16 current = next;
      if (chunk + 1 < end_chunk) {
        next = kept_scale_words(kept, first_group + kTileGroups + half, layout.groups);
      }
      words[(half + 0) * kTileRows + row_word] = current.x;
      words[(half + 1) * kTileRows + row_word] = current.y;
      words[(half + 2) * kTileRows + row_word] = current.z;
      words[(half + 3) * kTileRows + row_word] = current.w;
      __syncthreads();
      if (first_group + run < layout.groups) {
        auto* destination = reinterpret_cast<uint32_t*>(args.recv_scales + run_start +
                                                        (first_group + run) * layout.group_stride);
        const uint32_t* values = words + run * kTileRows + run_word;
        if (present[run_word + 3] && reinterpret_cast<uintptr_t>(destination) % kVectorBytes == 0) {
          // The rows present are a prefix of the tile, and the last of the 4 words holds the highest row.
          *reinterpret_cast<Vector16*>(destination + run_word) =
              Vector16{values[0], values[1], values[2], values[3]};
        } else {
          for (int i = 0; i < 4; ++i) {
            if (present[run_word + i]) {
              destination[run_word + i] = values[i];
            }
          }
        }
      }
      __syncthreads();  // the shared words (and `present`, after the last chunk) are rewritten next
    }
  }
}

// After a failed wait (a peer late, or the group timed out before) the call's rows are not laid out: an
// empty layout (every row offset 0) takes the place of whatever an earlier call left there.
__device__ inline void invalidate_layout(const Shape& shape, const DispatchRecvArgs& args) {
  for (int expert = threadIdx.x; expert <= shape.local_experts; expert += blockDim.x) {
    args.row_offsets[expert] = 0;
  }
}

template <bool kScalesLater, Expansion kExpansion = Expansion::kOneAtATime>
__device__ void receive_tokens(const GroupView& group, const DispatchRecvArgs& args, uint64_t sequence,
                               RowLayout* layout) {
  const Shape& shape = group.shape;
  __shared__ uint32_t scale_words[kMaxScaleWords];
  if (!block_wait_for_peers(group.signals->dispatch_arrived, sequence, shape.world, group.timeout_ticks,
                            group.status, Operation::kDispatchRecv, &group.peers, -1,
                            group.peers.held_arrivals, ~uint64_t{0},
                            {group.signals->tokens_from, layout->tokens_from})) {
    invalidate_layout(shape, args);
    return;
  }
  count_dispatch(group, sequence);
  const RankedRows ranked = ranked_rows(shape, *layout);
  const uint64_t generation = rank_chunks<kBlockThreads>(group, layout, ranked);
  if (!finish_layout<kBlockThreads>(group, args, layout, ranked, generation, false)) {
    invalidate_layout(shape, args);
    return;
  }
  if constexpr (kExpansion == Expansion::kOneAtATime) {
    expand_tokens(group, args, ranked, kScalesLater, scale_words);
  } else {
    expand_tokens_wide<kExpansion == Expansion::kWideScaled>(group, args, ranked, kScalesLater, scale_words);
  }
  if constexpr (kScalesLater) {
    if (grid_barrier(&group.state->barrier, shape.rank, group.timeout_ticks, group.status,
                     Operation::kDispatchRecv)) {
      lay_out_scales(group, args, layout->offsets[shape.local_experts], scale_words);
    }
  }
}

template <bool kScalesLater, Expansion kExpansion = Expansion::kOneAtATime>
__device__ void receive_kernel(const GroupView& group, const DispatchRecvArgs& args) {
  __shared__ RowLayout layout;
  receive_tokens<kScalesLater, kExpansion>(group, args, group.block_calls[blockIdx.x].dispatches + 1,
                                           &layout);
}

// --- the per-token layout -------------------------------------------------------------------------------

// Up to this many chunks of the layout (RowLayout: index s * chunks + c for chunk c of source s), every
// block keeps the received tokens before each chunk in shared memory; past it, each token counts them
// itself.
inline constexpr int kTokenBaseEntries = 2048;

// The token mask of chunk `chunk` of `layout` (zero past the chunks its source sent).
__device__ inline unsigned long long chunk_token_mask(const GroupView& group, const RankedRows& layout,
                                                      int chunk) {
  const SourceChunk at = source_chunk(layout, chunk);
  return holds_tokens(layout, at.source, at.chunk)
             ? *region_token_masks(group.dispatch_region, group.shape, at.source, at.chunk)
             : 0ull;
}

// The per-token row of token `token` of `source` (which names an expert of this rank): the received tokens
// before it in (source, token) order, from the senders' token masks (`mask`: its chunk's). `bases`: the
// exclusive prefix of the masks' counts per chunk of the layout, or null past kTokenBaseEntries.
__device__ inline int32_t token_row(const GroupView& group, const RankedRows& layout, const uint32_t* bases,
                                    int source, int token, unsigned long long mask) {
  const int chunk = source * layout.chunks + token / kChunkTokens;
  uint32_t before = 0;
  if (bases != nullptr) {
    before = bases[chunk];
  } else {
    for (int earlier = 0; earlier < chunk; ++earlier) {
      before += __popcll(chunk_token_mask(group, layout, earlier));
    }
  }
  return static_cast<int32_t>(before + __popcll(mask & ((1ull << (token % kChunkTokens)) - 1)));
}

// Every block (of PerTokenTuning::kDispatchThreads): bases[chunk] = received tokens before each chunk of
// the layout (when they fit), and the total; block 0 publishes the total as num_recv_tokens.
__device__ uint32_t count_received_tokens(const GroupView& group, const DispatchRecvArgs& args,
                                          const RankedRows& layout, uint32_t* bases) {
  const int entries = layout.total;
  uint32_t total = 0;
  for (int first = 0; first < entries; first += PerTokenTuning::kDispatchThreads) {
    const int entry = first + static_cast<int>(threadIdx.x);
    const auto count =
        entry < entries ? static_cast<uint32_t>(__popcll(chunk_token_mask(group, layout, entry))) : 0u;
    uint32_t block_count = 0;
    const uint32_t before = block_exclusive_scan<PerTokenTuning::kDispatchThreads>(count, &block_count);
    if (entry < entries && entries <= kTokenBaseEntries) {
      bases[entry] = total + before;
    }
    total += block_count;
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    *args.num_recv_tokens = static_cast<int32_t>(total);
  }
  __syncthreads();
  return total;
}

// Slot k of token `token` of `source`, whose id and weight the region holds (`id`, `weight`), `row` its row
// (-1: it names no expert here): its id mapped to a local expert, its weight, and for a local expert the
// (row, slot) pair in sorted_token_ids at its place among that expert's pairs (the expanded layout's
// ranking), and the expert of the alignment's block of sorted_token_ids that the pair starts (every block
// starts with a pair: an expert's segment is its pairs padded to less than a block more); slot 0 also its
// origin, and where the source's combine finds the row should this rank's combine leave its rows to be
// pulled, or where the node's summing rank finds it; token_rows for combine (the row in slot 0, -1 in the
// others).
__device__ inline void keep_slot(const GroupView& group, const DispatchRecvArgs& args,
                                 const RankedRows& layout, int source, int token, int k, int32_t id,
                                 float weight, int32_t row) {
  const Shape& shape = group.shape;
  if (row >= 0) {
    const std::size_t slot = static_cast<std::size_t>(row) * shape.top_k + k;
    args.recv_topk_ids[slot] = id >= 0 ? id - shape.rank * shape.local_experts : -1;
    args.recv_topk_weights[slot] = weight;
    if (id >= 0) {
      const int32_t pair = row_of(group, layout, source, token, id);
      args.sorted_token_ids[pair] = row * shape.top_k + k;
      const int32_t block = pair / shape.alignment;
      if (block * shape.alignment == pair) {
        args.block_expert_ids[block] = id - shape.rank * shape.local_experts;
      }
    }
    if (k == 0) {
      args.src_info[3 * static_cast<std::size_t>(row) + 0] = source;
      args.src_info[3 * static_cast<std::size_t>(row) + 1] = token;
      args.src_info[3 * static_cast<std::size_t>(row) + 2] = -1;
      if (shape.pulled_combine != 0 && source != shape.rank) {
        *reinterpret_cast<int32_t*>(group.peers.write_window(PeerRegion::kCombine, source) +
                                    CombineRegion::pulled_row_offset(shape, shape.rank, token)) = row;
      }
    }
  }
  if (k == 0 && combine_sums_nodes(shape)) {
    group.peers.store_node_row(shape, source, token, row);
  }
  group.token_rows[(static_cast<std::size_t>(source) * shape.max_tokens + token) * shape.top_k + k] =
      k == 0 ? row : -1;
}

// How a block's threads share the per-token receive: groups of `row_threads` threads (row_copy_threads),
// each copying one token at a time on its own; `group` is the calling thread's, at or past `block_groups` for
// the threads past the last whole group (which copy nothing), `lane` its place in it.
struct TokenCopyGroups {
  int row_threads;
  int block_groups;
  int group;
  uint32_t lane;
};

__device__ inline TokenCopyGroups token_copy_groups(const Shape& shape) {
  const int row_threads =
      row_copy_threads<PerTokenTuning::kVectorsInFlight>(shape.payload_bytes / kVectorBytes);
  return {row_threads, static_cast<int>(blockDim.x) / row_threads,
          static_cast<int>(threadIdx.x) / row_threads,
          static_cast<uint32_t>(threadIdx.x) % static_cast<uint32_t>(row_threads)};
}

// A received token as its group copied it: its row (-1: it names no expert here), and the id and weight of
// the calling lane's first slot (k = lane, if below top_k), loaded before the copy so that their latency
// passes under it. `source` -1: no token (an item past its source's tokens, or a thread past the groups).
struct ReceivedToken {
  int source;
  int token;
  int32_t row;
  int32_t id;
  float weight;
};

// Item `index` of the receive (the sources interleaved: source index % world, token index / world), by the
// calling group: the token's message copied into its row (payload, then, kScaled, the scales of a scaled
// format) if it names an expert here. Its rows need only the token masks (token_row); its slots
// (keep_slots) need the whole layout.
template <bool kScaled>
__device__ ReceivedToken copy_received_token(const GroupView& group, const DispatchRecvArgs& args,
                                             const RankedRows& layout, const uint32_t* token_bases,
                                             const uint8_t* const* source_regions,
                                             const TokenCopyGroups& groups, int index) {
  const Shape& shape = group.shape;
  const int source = index % shape.world;
  const int token = index / shape.world;
  ReceivedToken received{-1, token, -1, -1, 0.0f};
  if (groups.group >= groups.block_groups || token >= layout.tokens_from[source]) {
    return received;
  }
  received.source = source;
  const int first_k = static_cast<int>(groups.lane);
  if (first_k < shape.top_k) {
    received.id = region_ids(group.dispatch_region, shape, source, token)[first_k];
    received.weight = region_weights(group.dispatch_region, shape, source, token)[first_k];
  }
  const unsigned long long mask =
      *region_token_masks(group.dispatch_region, shape, source, token / kChunkTokens);
  if (((mask >> (token % kChunkTokens)) & 1) == 0) {
    return received;
  }
  received.row = token_row(group, layout, token_bases, source, token, mask);
  const std::size_t at = static_cast<std::size_t>(received.row);
  const uint8_t* message = source_regions[source] + DispatchRegion::message_offset(shape, token);
  const auto step = static_cast<uint32_t>(groups.row_threads);
  const uint32_t payload_vectors = shape.payload_bytes / kVectorBytes;
  auto* payload_row = reinterpret_cast<Vector16*>(args.recv_tokens + at * shape.payload_bytes);
  const auto* from = reinterpret_cast<const Vector16*>(message);
  if constexpr (!kScaled) {
    copy_row_part<PerTokenTuning::kVectorsInFlight>(from, payload_row, 0, payload_vectors, groups.lane, step);
    return received;
  }
  // Scales row-major after the payload in the message, and so in their rows: loaded with the payload where
  // their rows are whole vectors (every format at a hidden that is a multiple of 512), so that one round
  // trip of the link brings both; else after it, words where they are whole.
  uint8_t* to = args.recv_scales + at * shape.scale_bytes;
  if (shape.scale_bytes % kVectorBytes == 0 && reinterpret_cast<uintptr_t>(to) % kVectorBytes == 0) {
    copy_split_row<PerTokenTuning::kVectorsInFlight>(
        from, payload_row, reinterpret_cast<Vector16*>(to), payload_vectors, 0,
        payload_vectors + shape.scale_bytes / kVectorBytes, groups.lane, step);
    return received;
  }
  copy_row_part<PerTokenTuning::kVectorsInFlight>(from, payload_row, 0, payload_vectors, groups.lane, step);
  const uint8_t* scales = message + shape.payload_bytes;
  if (shape.scale_bytes % 4 == 0) {
    for (uint32_t unit = groups.lane; unit < shape.scale_bytes / 4; unit += step) {
      reinterpret_cast<uint32_t*>(to)[unit] = reinterpret_cast<const uint32_t*>(scales)[unit];
    }
  } else {
    for (uint32_t unit = groups.lane; unit < shape.scale_bytes; unit += step) {
      to[unit] = scales[unit];
    }
  }
  return received;
}

// The slots of a token its group copied (keep_slot), each lane its own: the first from `received`, any
// further ones (top_k above the group's threads) loaded here.
__device__ inline void keep_slots(const GroupView& group, const DispatchRecvArgs& args,
                                  const RankedRows& layout, const TokenCopyGroups& groups,
                                  const ReceivedToken& received) {
  const Shape& shape = group.shape;
  const int first_k = static_cast<int>(groups.lane);
  if (received.source < 0 || first_k >= shape.top_k) {
    return;
  }
  keep_slot(group, args, layout, received.source, received.token, first_k, received.id, received.weight,
            received.row);
  const int32_t* ids = region_ids(group.dispatch_region, shape, received.source, received.token);
  const float* weights = region_weights(group.dispatch_region, shape, received.source, received.token);
  for (int k = first_k + groups.row_threads; k < shape.top_k; k += groups.row_threads) {
    keep_slot(group, args, layout, received.source, received.token, k, ids[k], weights[k], received.row);
  }
}

// After a failed wait the call's tokens are not laid out: no rows, no pairs.
__device__ inline void invalidate_per_token(const Shape& shape, const DispatchRecvArgs& args) {
  invalidate_layout(shape, args);
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    *args.num_recv_tokens = 0;
  }
}

// The per-token receive: once every source's ids and token masks are here, the messages copied from the
// sources' regions into their rows (a pull, each token crossing the link once) and each token's slots kept,
// by the groups of threads of token_copy_groups, every group on its own: group g of the grid takes items g,
// g + groups, ... (copy_received_token: the sources interleaved, so that every link is busy), with no
// block-wide step between rows, so that while one group waits for a token's mask or its first loads the
// others copy. In a grid of an even number of groups each group keeps to one source at EP2, so pulls over
// the link and local copies run side by side (every group pulling the other ranks' tokens first measured
// slower: docs/performance.md). The items stop at the layout's tokens (the most any source sent). A token's
// row needs only the token masks, counted first; its slots need the layout of every expert's pairs, which
// the prefix pass and its grid barrier make: each group copies its first token between the two halves of
// the layout (rank_chunks, finish_layout) and keeps its slots after, so that the barrier's wait passes
// under the copy. The padding of sorted_token_ids comes with the layout's offsets, and block_expert_ids
// with the pairs (keep_slot).
template <bool kScaled>
__device__ void receive_per_token(const GroupView& group, const DispatchRecvArgs& args, uint64_t sequence,
                                  RowLayout* layout) {
  const Shape& shape = group.shape;
  if (!block_wait_for_peers(group.signals->dispatch_arrived, sequence, shape.world, group.timeout_ticks,
                            group.status, Operation::kDispatchRecv, &group.peers, -1,
                            group.peers.held_arrivals, ~uint64_t{0},
                            {group.signals->tokens_from, layout->tokens_from})) {
    invalidate_per_token(shape, args);
    return;
  }
  count_dispatch(group, sequence);
  const RankedRows ranked = ranked_rows(shape, *layout);
  __shared__ uint32_t bases[kTokenBaseEntries];
  count_received_tokens(group, args, ranked, bases);
  const uint32_t* token_bases = ranked.total <= kTokenBaseEntries ? bases : nullptr;
  __shared__ const uint8_t* source_regions[kMaxWorld];  // where each source's messages are read
  load_source_regions(group, source_regions);
  const uint64_t generation = rank_chunks<PerTokenTuning::kDispatchThreads>(group, layout, ranked);
  __syncthreads();  // source_regions
  const TokenCopyGroups groups = token_copy_groups(shape);
  const int items = shape.world * ranked.tokens;
  const int stride = static_cast<int>(gridDim.x) * groups.block_groups;
  int index = static_cast<int>(blockIdx.x) * groups.block_groups + groups.group;
  const ReceivedToken first = index < items ? copy_received_token<kScaled>(group, args, ranked, token_bases,
                                                                           source_regions, groups, index)
                                            : ReceivedToken{-1, 0, -1, -1, 0.0f};
  if (!finish_layout<PerTokenTuning::kDispatchThreads>(group, args, layout, ranked, generation, true)) {
    invalidate_per_token(shape, args);
    return;
  }
  keep_slots(group, args, ranked, groups, first);
  for (index += stride; index < items; index += stride) {
    keep_slots(group, args, ranked, groups,
               copy_received_token<kScaled>(group, args, ranked, token_bases, source_regions, groups, index));
  }
}

template <bool kScaled>
__device__ void receive_per_token_kernel(const GroupView& group, const DispatchRecvArgs& args) {
  __shared__ RowLayout layout;
  receive_per_token<kScaled>(group, args, group.block_calls[blockIdx.x].dispatches + 1, &layout);
}

// kMayQuantize: the send may quantise bf16 tokens (send_tokens').
template <bool kScaled, bool kMayQuantize>
__device__ void dispatch_per_token_kernel(const GroupView& group, const DispatchSendArgs& send_args,
                                          const DispatchRecvArgs& recv_args) {
  const uint64_t sequence = group.block_calls[blockIdx.x].dispatches + 1;
  __shared__ RowLayout layout;
  send_tokens<true, kMayQuantize>(group, send_args, layout.masks);
  __syncthreads();  // the send's scratch is the receive's masks
  receive_per_token<kScaled>(group, recv_args, sequence, &layout);
}

template <bool kScalesLater, Expansion kExpansion = Expansion::kOneAtATime>
__device__ void dispatch_kernel(const GroupView& group, const DispatchSendArgs& send_args,
                                const DispatchRecvArgs& recv_args) {
  const uint64_t sequence = group.block_calls[blockIdx.x].dispatches + 1;
  __shared__ RowLayout layout;
  send_tokens<false, true, kExpansion != Expansion::kOneAtATime>(group, send_args, layout.masks);
  __syncthreads();  // the send's scratch is the receive's masks
  receive_tokens<kScalesLater, kExpansion>(group, recv_args, sequence, &layout);
}

}  // namespace

// After an expanded bf16 receive given expert input scales (DispatchRecvArgs::expert_input_scales), which
// laid out everything but the payloads: blocks over the rows below row_offsets[L], each row the fp8 codes
// of its token (read again from its source's region, which holds it until this rank's combine has sent)
// divided by its expert's scale (IEEE division, then the saturating encoder), 8 per thread and step;
// padding rows zero bytes. A kernel of its own: the division's registers stay out of the receive's.
extern "C" __global__ void __launch_bounds__(kBlockThreads)
    ROCEP_EP_KERNEL(rocep_dispatch_input_scales)(GroupView group, DispatchRecvArgs args) {
  const Shape& shape = group.shape;
  const uint32_t rows = args.row_offsets[shape.local_experts];
  const auto vectors = static_cast<uint32_t>(shape.hidden) / kElementsPerThread;
  for (uint32_t row = blockIdx.x; row < rows; row += gridDim.x) {
    auto* codes =
        reinterpret_cast<uint64_t*>(args.recv_tokens + static_cast<std::size_t>(row) * shape.hidden);
    const int32_t* origin = args.src_info + 3 * static_cast<std::size_t>(row);  // rank, token, k
    const int source = origin[0];
    if (source < 0) {  // padding
      for (uint32_t v = threadIdx.x; v < vectors; v += blockDim.x) {
        codes[v] = 0;
      }
      continue;
    }
    const int token = origin[1];
    const int32_t expert = region_ids(group.dispatch_region, shape, source, token)[origin[2]];
    const float scale = args.expert_input_scales[expert - shape.rank * shape.local_experts];
    const auto* message =
        reinterpret_cast<const Vector16*>(group.peers.read_window(PeerRegion::kDispatch, source) +
                                          DispatchRegion::message_offset(shape, token));
    for (uint32_t v = threadIdx.x; v < vectors; v += blockDim.x) {
      const Vector16 loaded = message[v];
      const uint32_t words[4] = {loaded.x, loaded.y, loaded.z, loaded.w};
      uint64_t row_codes = 0;
#pragma unroll
      for (int e = 0; e < kElementsPerThread; ++e) {
        const float x = rocep::bf16_to_float(static_cast<uint16_t>(words[e / 2] >> (16 * (e % 2))));
        row_codes |= static_cast<uint64_t>(encode_fp8(x / scale, shape.fp8_encoding)) << (8 * e);
      }
      codes[v] = row_codes;
    }
  }
}

extern "C" __global__ void __launch_bounds__(kBlockThreads)
    ROCEP_EP_KERNEL(rocep_dispatch_send)(GroupView group, DispatchSendArgs args) {
  __shared__ unsigned long long scratch[kBlockRankingMasks];
  send_tokens<false>(group, args, scratch);
}

// The send on a budget's grid (LaunchGrid::wide), a block per multiprocessor: its tokens staged in runs.
extern "C" __global__ void __launch_bounds__(kBlockThreads, 1)
    ROCEP_EP_KERNEL(rocep_dispatch_send_wide)(GroupView group, DispatchSendArgs args) {
  __shared__ unsigned long long scratch[kBlockRankingMasks];
  send_tokens<false, true, true>(group, args, scratch);
}

extern "C" __global__ void __launch_bounds__(kBlockThreads)
    ROCEP_EP_KERNEL(rocep_dispatch_recv)(GroupView group, DispatchRecvArgs args) {
  receive_kernel<false>(group, args);
}

extern "C" __global__ void __launch_bounds__(kBlockThreads, kExpandedBlocksPerSm)
    ROCEP_EP_KERNEL(rocep_dispatch)(GroupView group, DispatchSendArgs send_args, DispatchRecvArgs recv_args) {
  dispatch_kernel<false>(group, send_args, recv_args);
}

// The receive and fused dispatch on a budget's grid (LaunchGrid::wide), a block per multiprocessor:
// kWideExpansionItems items at a time (expand_tokens_wide), with the registers of a multiprocessor. bf16
// payloads, scaled ones (`_scaled`), and scaled ones whose scales are laid out later (`_scale_runs_wide`).
extern "C" __global__ void __launch_bounds__(kBlockThreads, 1)
    ROCEP_EP_KERNEL(rocep_dispatch_recv_wide)(GroupView group, DispatchRecvArgs args) {
  receive_kernel<false, Expansion::kWideBf16>(group, args);
}

extern "C" __global__ void __launch_bounds__(kBlockThreads, 1)
    ROCEP_EP_KERNEL(rocep_dispatch_wide)(GroupView group, DispatchSendArgs send_args,
                                         DispatchRecvArgs recv_args) {
  dispatch_kernel<false, Expansion::kWideBf16>(group, send_args, recv_args);
}

extern "C" __global__ void __launch_bounds__(kBlockThreads, 1)
    ROCEP_EP_KERNEL(rocep_dispatch_recv_wide_scaled)(GroupView group, DispatchRecvArgs args) {
  receive_kernel<false, Expansion::kWideScaled>(group, args);
}

extern "C" __global__ void __launch_bounds__(kBlockThreads, 1)
    ROCEP_EP_KERNEL(rocep_dispatch_wide_scaled)(GroupView group, DispatchSendArgs send_args,
                                                DispatchRecvArgs recv_args) {
  dispatch_kernel<false, Expansion::kWideScaled>(group, send_args, recv_args);
}

extern "C" __global__ void __launch_bounds__(kBlockThreads, 1)
    ROCEP_EP_KERNEL(rocep_dispatch_recv_scale_runs_wide)(GroupView group, DispatchRecvArgs args) {
  receive_kernel<true, Expansion::kWideScaled>(group, args);
}

extern "C" __global__ void __launch_bounds__(kBlockThreads, 1)
    ROCEP_EP_KERNEL(rocep_dispatch_scale_runs_wide)(GroupView group, DispatchSendArgs send_args,
                                                    DispatchRecvArgs recv_args) {
  dispatch_kernel<true, Expansion::kWideScaled>(group, send_args, recv_args);
}

extern "C" __global__ void __launch_bounds__(PerTokenTuning::kDispatchThreads)
    ROCEP_EP_KERNEL(rocep_dispatch_send_per_token)(GroupView group, DispatchSendArgs args) {
  __shared__ unsigned long long scratch[kBlockRankingMasks];
  send_tokens<true, false>(group, args, scratch);
}

extern "C" __global__ void __launch_bounds__(PerTokenTuning::kDispatchThreads)
    ROCEP_EP_KERNEL(rocep_dispatch_recv_per_token)(GroupView group, DispatchRecvArgs args) {
  receive_per_token_kernel<false>(group, args);
}

extern "C" __global__ void __launch_bounds__(PerTokenTuning::kDispatchThreads)
    ROCEP_EP_KERNEL(rocep_dispatch_per_token)(GroupView group, DispatchSendArgs send_args,
                                              DispatchRecvArgs recv_args) {
  dispatch_per_token_kernel<false, false>(group, send_args, recv_args);
}

// The same for scaled formats: separate kernels, so that the copy of the scales with the payloads adds
// nothing to the bf16 kernels' registers (in the same kernels, the bf16 receive spilled); and where the
// tokens are quantised in the kernel, kernels of their own again, so that the quantisation's registers (its
// loads of a step: the scaled fused kernel spills there) tax neither the bf16 calls nor those of tokens that
// arrive quantised (`_quantizing`).
extern "C" __global__ void __launch_bounds__(PerTokenTuning::kDispatchThreads)
    ROCEP_EP_KERNEL(rocep_dispatch_send_per_token_quantizing)(GroupView group, DispatchSendArgs args) {
  __shared__ unsigned long long scratch[kBlockRankingMasks];
  send_tokens<true>(group, args, scratch);
}

extern "C" __global__ void __launch_bounds__(PerTokenTuning::kDispatchThreads)
    ROCEP_EP_KERNEL(rocep_dispatch_recv_per_token_scaled)(GroupView group, DispatchRecvArgs args) {
  receive_per_token_kernel<true>(group, args);
}

extern "C" __global__ void __launch_bounds__(PerTokenTuning::kDispatchThreads)
    ROCEP_EP_KERNEL(rocep_dispatch_per_token_scaled)(GroupView group, DispatchSendArgs send_args,
                                                     DispatchRecvArgs recv_args) {
  dispatch_per_token_kernel<true, false>(group, send_args, recv_args);
}

extern "C" __global__ void __launch_bounds__(PerTokenTuning::kDispatchThreads)
    ROCEP_EP_KERNEL(rocep_dispatch_per_token_quantizing)(GroupView group, DispatchSendArgs send_args,
                                                         DispatchRecvArgs recv_args) {
  dispatch_per_token_kernel<true, true>(group, send_args, recv_args);
}

// The same for receives that scales_laid_out_later: separate kernels, so that the pass leaves the others'
// code as it was (as a run-time choice inside them, it slowed the mxfp4 receive: performance-notes.md,
// perf-kern-16).
extern "C" __global__ void __launch_bounds__(kBlockThreads)
    ROCEP_EP_KERNEL(rocep_dispatch_recv_scale_runs)(GroupView group, DispatchRecvArgs args) {
  receive_kernel<true>(group, args);
}

extern "C" __global__ void __launch_bounds__(kBlockThreads, kExpandedBlocksPerSm)
    ROCEP_EP_KERNEL(rocep_dispatch_scale_runs)(GroupView group, DispatchSendArgs send_args,
                                               DispatchRecvArgs recv_args) {
  dispatch_kernel<true>(group, send_args, recv_args);
}

namespace rocep::device {

template <>
hipError_t EpKernels<kCompiledTransport>::load_dispatch_kernels(bool per_token, int* resident_blocks) {
  const std::initializer_list<const void*> expanded = {
      reinterpret_cast<const void*>(&ROCEP_EP_KERNEL(rocep_dispatch_send)),
      reinterpret_cast<const void*>(&ROCEP_EP_KERNEL(rocep_dispatch_recv)),
      reinterpret_cast<const void*>(&ROCEP_EP_KERNEL(rocep_dispatch)),
      reinterpret_cast<const void*>(&ROCEP_EP_KERNEL(rocep_dispatch_recv_scale_runs)),
      reinterpret_cast<const void*>(&ROCEP_EP_KERNEL(rocep_dispatch_scale_runs)),
      reinterpret_cast<const void*>(&ROCEP_EP_KERNEL(rocep_dispatch_input_scales))};
  const std::initializer_list<const void*> by_token = {
      reinterpret_cast<const void*>(&ROCEP_EP_KERNEL(rocep_dispatch_send_per_token)),
      reinterpret_cast<const void*>(&ROCEP_EP_KERNEL(rocep_dispatch_recv_per_token)),
      reinterpret_cast<const void*>(&ROCEP_EP_KERNEL(rocep_dispatch_per_token)),
      reinterpret_cast<const void*>(&ROCEP_EP_KERNEL(rocep_dispatch_send_per_token_quantizing)),
      reinterpret_cast<const void*>(&ROCEP_EP_KERNEL(rocep_dispatch_recv_per_token_scaled)),
      reinterpret_cast<const void*>(&ROCEP_EP_KERNEL(rocep_dispatch_per_token_scaled)),
      reinterpret_cast<const void*>(&ROCEP_EP_KERNEL(rocep_dispatch_per_token_quantizing))};
  const std::initializer_list<const void*> expanded_wide = {
      reinterpret_cast<const void*>(&ROCEP_EP_KERNEL(rocep_dispatch_send_wide)),
      reinterpret_cast<const void*>(&ROCEP_EP_KERNEL(rocep_dispatch_recv_wide)),
      reinterpret_cast<const void*>(&ROCEP_EP_KERNEL(rocep_dispatch_wide)),
      reinterpret_cast<const void*>(&ROCEP_EP_KERNEL(rocep_dispatch_recv_wide_scaled)),
      reinterpret_cast<const void*>(&ROCEP_EP_KERNEL(rocep_dispatch_wide_scaled)),
      reinterpret_cast<const void*>(&ROCEP_EP_KERNEL(rocep_dispatch_recv_scale_runs_wide)),
      reinterpret_cast<const void*>(&ROCEP_EP_KERNEL(rocep_dispatch_scale_runs_wide))};
  int unused = 1 << 30;  // the other layout's kernels are loaded too, but their residency is not the group's
  constexpr int kPerTokenThreads = PerTokenTuning::kDispatchThreads;
  hipError_t status = per_token ? load_kernels(by_token, resident_blocks, kPerTokenThreads)
                                : load_kernels(expanded, resident_blocks);
  if (status == hipSuccess && !per_token) {
    // A wide grid's kernels (one block per multiprocessor) must be resident too: counted as no block if not.
    int wide = 1 << 30;
    status = load_kernels(expanded_wide, &wide);
    *resident_blocks = wide < 1 ? 0 : *resident_blocks;
  }
  if (status == hipSuccess) {
    status = per_token ? load_kernels(expanded, &unused) : load_kernels(by_token, &unused, kPerTokenThreads);
  }
  if (status == hipSuccess && per_token) {
    status = load_kernels(expanded_wide, &unused);
  }
  return status;
}

namespace {

// The expanded receive's kernels (the receive's or the fused call's), one per Expansion and way of laying
// out the scales.
template <typename Kernel>
struct ExpandedKernels {
  Kernel plain;            // expand_tokens, scales with the payloads
  Kernel wide;             // expand_tokens_wide, bf16
  Kernel wide_scaled;      // expand_tokens_wide, scales with the payloads
  Kernel scale_runs;       // expand_tokens, scales_laid_out_later
  Kernel scale_runs_wide;  // expand_tokens_wide, scales_laid_out_later
};

// The expanded receive's kernel on `grid`: a budget's grid (LaunchGrid::wide) takes the wide kernels.
template <typename Kernel>
Kernel expanded_receive_kernel(const Shape& shape, const LaunchGrid& grid,
                               const ExpandedKernels<Kernel>& kernels) {
  if (scales_laid_out_later(shape)) {
    return grid.wide ? kernels.scale_runs_wide : kernels.scale_runs;
  }
  if (!grid.wide) {
    return kernels.plain;
  }
  return shape.format == Format::kBf16 ? kernels.wide : kernels.wide_scaled;
}

}  // namespace

// The send waits on nobody; the receive (a grid barrier where the whole grid ranks the rows or lays out the
// scales) and the fused call (its own send's signal) wait on their grid.
template <>
hipError_t EpKernels<kCompiledTransport>::launch_dispatch_send(const GroupView& group,
                                                               const DispatchSendArgs& args,
                                                               const LaunchGrid& grid, hipStream_t stream) {
  if (group.shape.per_token != 0) {
    return launch_kernel<PerTokenTuning::kDispatchThreads>(
        quantizes(group.shape, args) ? &ROCEP_EP_KERNEL(rocep_dispatch_send_per_token_quantizing)
                                     : &ROCEP_EP_KERNEL(rocep_dispatch_send_per_token),
        grid, Residency::kBlockByBlock, stream, group, args);
  }
  return launch_kernel(
      grid.wide ? &ROCEP_EP_KERNEL(rocep_dispatch_send_wide) : &ROCEP_EP_KERNEL(rocep_dispatch_send), grid,
      Residency::kBlockByBlock, stream, group, args);
}

namespace {

// An expanded receive given expert input scales: its rows' fp8 codes, after it on the same stream.
hipError_t launch_input_scales(const GroupView& group, const DispatchRecvArgs& args, const LaunchGrid& grid,
                               hipStream_t stream) {
  if (args.expert_input_scales == nullptr) {
    return hipSuccess;
  }
  return launch_kernel(&ROCEP_EP_KERNEL(rocep_dispatch_input_scales), grid, Residency::kBlockByBlock, stream,
                       group, args);
}

}  // namespace

template <>
hipError_t EpKernels<kCompiledTransport>::launch_dispatch_recv(const GroupView& group,
                                                               const DispatchRecvArgs& args,
                                                               const LaunchGrid& grid, hipStream_t stream) {
  if (group.shape.per_token != 0) {
    return launch_kernel<PerTokenTuning::kDispatchThreads>(
        group.shape.scale_bytes != 0 ? &ROCEP_EP_KERNEL(rocep_dispatch_recv_per_token_scaled)
                                     : &ROCEP_EP_KERNEL(rocep_dispatch_recv_per_token),
        grid, Residency::kWholeGrid, stream, group, args);
  }
  const hipError_t status =
      launch_kernel(expanded_receive_kernel(
                        group.shape, grid,
                        ExpandedKernels<decltype(&ROCEP_EP_KERNEL(rocep_dispatch_recv))>{
                            &ROCEP_EP_KERNEL(rocep_dispatch_recv), &ROCEP_EP_KERNEL(rocep_dispatch_recv_wide),
                            &ROCEP_EP_KERNEL(rocep_dispatch_recv_wide_scaled),
                            &ROCEP_EP_KERNEL(rocep_dispatch_recv_scale_runs),
                            &ROCEP_EP_KERNEL(rocep_dispatch_recv_scale_runs_wide)}),
                    grid, Residency::kWholeGrid, stream, group, args);
  return status == hipSuccess ? launch_input_scales(group, args, grid, stream) : status;
}

template <>
hipError_t EpKernels<kCompiledTransport>::launch_dispatch(const GroupView& group,
                                                          const DispatchSendArgs& send_args,
                                                          const DispatchRecvArgs& recv_args,
                                                          const LaunchGrid& grid, hipStream_t stream) {
  if (group.shape.per_token != 0) {
    return launch_kernel<PerTokenTuning::kDispatchThreads>(
        quantizes(group.shape, send_args)
            ? &ROCEP_EP_KERNEL(rocep_dispatch_per_token_quantizing)
            : (group.shape.scale_bytes != 0 ? &ROCEP_EP_KERNEL(rocep_dispatch_per_token_scaled)
                                            : &ROCEP_EP_KERNEL(rocep_dispatch_per_token)),
        grid, Residency::kWholeGrid, stream, group, send_args, recv_args);
  }
  const hipError_t status = launch_kernel(
      expanded_receive_kernel(
          group.shape, grid,
          ExpandedKernels<decltype(&ROCEP_EP_KERNEL(rocep_dispatch))>{
              &ROCEP_EP_KERNEL(rocep_dispatch), &ROCEP_EP_KERNEL(rocep_dispatch_wide),
              &ROCEP_EP_KERNEL(rocep_dispatch_wide_scaled), &ROCEP_EP_KERNEL(rocep_dispatch_scale_runs),
              &ROCEP_EP_KERNEL(rocep_dispatch_scale_runs_wide)}),
      grid, Residency::kWholeGrid, stream, group, send_args, recv_args);
  return status == hipSuccess ? launch_input_scales(group, recv_args, grid, stream) : status;
}

}  // namespace rocep::device
