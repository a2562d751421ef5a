// Combine: expert outputs go back to the ranks their tokens came from.
//
//   rocep_combine_send  expert rank, blocks over received (source, token): weighted, reduce the token's
//                       rows on this rank (float32 fma in ascending k, rounded to bf16) and store that one
//                       partial row into the source's region; unweighted, store each row. The grid's last
//                       block then adds 1 to every peer's combine_arrived[rank].
//   rocep_combine_recv  source rank, blocks over its tokens: wait for every rank, then sum the partials in
//                       ascending rank order (+ shared expert), or copy the rows; store bf16.
//   rocep_combine       both halves in one kernel (the fused call)
//   rocep_combine*_per_token  the same for the per-token layout, where a rank's row of a token is already
//                       its partial (weighted and summed over its experts by the caller): rows of other
//                       ranks' tokens cross as partials do, flagged chunk by chunk of the owner's tokens; a
//                       rank's own tokens' rows stay in place. The fused kernel's blocks either send or
//                       receive, so that the receive sums each chunk while later ones still cross.
#include "combine_receive.hpp"
#include "quantize_message.hpp"

using namespace rocep::device;

namespace {

// destination = bf16(sum_j weights[j] * rows[j]) over `vectors` vectors, accumulated in float32 by fused
// multiply-add in list order. A plain sum uses weight 1: fma(1, y, s) rounds once, exactly like s + y. Each
// thread keeps kStaged loads in flight before it uses them: kVectors of its vectors of kRows rows at once.
// `epilogue` applies to each summed vector before its store.
template <int kVectors, int kRows, typename Epilogue>
__device__ inline void reduce_rows_staged(Vector16* destination, const Vector16* const* rows,
                                          const float* weights, int count, int vectors, int thread,
                                          int num_threads, const Epilogue& epilogue) {
  static_assert(kVectors * kRows == kStaged);
  for (int first = thread; first < vectors; first += kVectors * num_threads) {
    Lanes sum[kVectors] = {};
    for (int j = 0; j < count; j += kRows) {
      Vector16 staged[kStaged];  // [row r][vector i] at r * kVectors + i
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
#pragma unroll
        for (int i = 0; i < kVectors; ++i) {
          const int index = first + i * num_threads;
          if (j + r < count && index < vectors) {
            staged[r * kVectors + i] = rows[j + r][index];
          }
        }
      }
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        if (j + r < count) {
#pragma unroll
          for (int i = 0; i < kVectors; ++i) {
            const Lanes y = unpack(staged[r * kVectors + i]);
            for (int lane = 0; lane < kLanes; ++lane) {
              sum[i].value[lane] = fmaf(weights[j + r], y.value[lane], sum[i].value[lane]);
            }
          }
        }
      }
    }
#pragma unroll
    for (int i = 0; i < kVectors; ++i) {
      const int index = first + i * num_threads;
      if (index < vectors) {
        epilogue.apply(sum[i], index);
        destination[index] = pack(sum[i]);
      }
    }
  }
}

// reduce_rows_staged with a thread's loads in flight spread over rows where it has only one or two vectors
// of each (hidden up to 2 x 8 x kBlockThreads = 4096): with kStaged vectors of one row at a time, it waited
// on memory once per row with one or two loads in flight. Hidden 7168 (3.5 vectors per thread) keeps one
// row at a time, which spreading its loads over rows did not beat (performance-notes.md, perf-kern-1).
template <typename Epilogue = NoEpilogue>
__device__ inline void reduce_rows(Vector16* destination, const Vector16* const* rows, const float* weights,
                                   int count, int vectors, int thread, int num_threads,
                                   const Epilogue& epilogue = Epilogue{}) {
  if (vectors <= num_threads) {
    reduce_rows_staged<1, kStaged>(destination, rows, weights, count, vectors, thread, num_threads, epilogue);
  } else if (vectors <= 2 * num_threads) {
    reduce_rows_staged<2, kStaged / 2>(destination, rows, weights, count, vectors, thread, num_threads,
                                       epilogue);
  } else {
    reduce_rows_staged<kStaged, 1>(destination, rows, weights, count, vectors, thread, num_threads, epilogue);
  }
}

// The weighted sum of `rows` (reduce_rows' arithmetic, float32 fma in list order), quantised to an fp8
// block-128 message at `message` instead of rounded to bf16: `hidden` codes, then a float32 scale per 128
// elements (Shape::combine_fp8, the expanded layout's partial for another rank). Every thread [thread,
// num_threads) of the calling group runs the same steps (quantize_elements shuffles across lanes of a wave,
// and a group is whole waves); lanes past the row sum nothing and store nothing.
__device__ void reduce_rows_to_fp8(uint8_t* message, const Vector16* const* rows, const float* weights,
                                   int count, const Shape& shape, int thread, int num_threads) {
  const int vectors = shape.hidden / kLanes;
  constexpr int kLanesPerScale = 128 / kLanes;
  for (int base = 0; base < vectors; base += num_threads) {
    const int vector = base + thread;
    Lanes sum = {};
    if (vector < vectors) {
      for (int j = 0; j < count; ++j) {
        const Lanes y = unpack(rows[j][vector]);
        for (int lane = 0; lane < kLanes; ++lane) {
          sum.value[lane] = fmaf(weights[j], y.value[lane], sum.value[lane]);
        }
      }
    }
    const QuantizedElements<kLanes> q =
        quantize_elements<Format::kFp8Block128, kLanes>(sum.value, shape.fp8_encoding, 1.0f);
    if (vector < vectors) {
      *reinterpret_cast<uint2*>(message + static_cast<std::size_t>(vector) * kLanes) =
          uint2{q.codes[0], q.codes[1]};
      if (vector % kLanesPerScale == 0) {
        *reinterpret_cast<uint32_t*>(message + shape.hidden + vector / kLanesPerScale * sizeof(float)) =
            q.scale;
      }
    }
  }
}

// out = bf16(the sum of `inputs` in list order), each a bf16 row or (tagged kFp8Input) an fp8 block-128
// message dequantised as the per-token receive does (add_fp8_row), float32, `epilogue` before the store; by
// the threads [thread, num_threads) of the calling group.
template <typename Epilogue>
__device__ void sum_rows_and_messages(Vector16* out, const Vector16* const* inputs, int count,
                                      const Shape& shape, int thread, int num_threads,
                                      const Epilogue& epilogue) {
  const int vectors = shape.hidden / kLanes;
  for (int vector = thread; vector < vectors; vector += num_threads) {
    Lanes sum[1] = {};
    for (int j = 0; j < count; ++j) {
      const auto tagged = reinterpret_cast<uintptr_t>(inputs[j]);
      if ((tagged & kFp8Input) != 0) {
        add_fp8_row<1, 1>(sum, reinterpret_cast<const uint8_t*>(tagged - kFp8Input), shape, vector, vectors);
        continue;
      }
      const Lanes y = unpack(inputs[j][vector]);
      for (int lane = 0; lane < kLanes; ++lane) {
        sum[0].value[lane] = fmaf(1.0f, y.value[lane], sum[0].value[lane]);
      }
    }
    epilogue.apply(sum[0], vector);
    out[vector] = pack(sum[0]);
  }
}

// The part of a block of the expanded combine that sums a pair (send) or a token (receive) by itself: the
// block's threads in parts of kBlockThreads, so that a wide block (kExpandedWideThreads, a budget's grid)
// sums as many at once as the kBlockThreads blocks that a multiprocessor holds on the whole GPU's grid, each
// with its own loads in flight, instead of all its threads on one with a few loads each. A batch of one item
// takes the whole block, which would otherwise leave all parts but the first idle: the receive's batches of
// one token (combine_batch_items); the send's batches always hold kBlockThreads / top_k pairs. A SHMEM build
// keeps the block whole: its puts (publish_staged, publish_block) synchronise the block.
struct SubBlock {
  int index;    // of the block's parts, [0, count)
  int count;    // parts of the block
  int thread;   // within the part, [0, threads)
  int threads;  // of each part
};

__device__ inline SubBlock sub_block(int batch_items) {
  const int thread = static_cast<int>(threadIdx.x);
  if (kCompiledTransport == Transport::kShmem || batch_items == 1) {
    return {0, 1, thread, static_cast<int>(blockDim.x)};
  }
  // blockDim.x is kBlockThreads or kExpandedWideThreads
  return {thread / kBlockThreads, static_cast<int>(blockDim.x) / kBlockThreads, thread % kBlockThreads,
          kBlockThreads};
}

// The most tokens any rank sent in the last dispatch (Signals::tokens_from), in every thread of the
// calling block; call once per kernel, from every thread. The send's pairs go up to it: with fewer tokens
// sent than allowed, the pairs that hold tokens are still spread over all blocks, and no block claims pairs
// that hold none.
__device__ inline int most_tokens_sent(const Signals* signals, int world) {
  __shared__ int most;
  if (threadIdx.x == 0) {
    most = 0;
  }
  __syncthreads();
  if (static_cast<int>(threadIdx.x) < world) {
    atomicMax(&most, signals->tokens_from[threadIdx.x]);
  }
  __syncthreads();
  return most;
}

// Where this rank's weighted partial of `token` lies in its owner's combine region: row [rank][token].
__device__ inline std::size_t partial_row_offset(const Shape& shape, int token) {
  return (static_cast<std::size_t>(shape.rank) * shape.max_tokens + token) * CombineRegion::row_bytes(shape);
}

// (source, token) pairs of `total` that each block of a combine send takes first, fixed by its index: about
// three quarters of them over the blocks, at least one. The blocks then claim the rest one at a time
// (LocalState::combine_claims), so that every block keeps working to the end. Short rows
// (send_partials_in_batches) keep their fixed pairs: claiming runs of pairs there did not pay
// (performance-notes.md, perf-kern-2).
__device__ inline int first_share(int total) {
  return max(1, 3 * total / (4 * static_cast<int>(gridDim.x)));
}

// A block per (source, token) at a time: long rows (more than two vectors a thread: hidden above 4096 on
// blocks of kBlockThreads, above 12288 on wide ones), whose loads keep the block busy.
// send_partials_in_batches with a batch of one pair would do the same, but as one function for both the
// fused kernel spilled registers on sm_90 and ran slower (performance-notes.md, perf-kern-3).
template <bool kFp8>
__device__ void send_partials_by_token(const GroupView& group, const rocep::device::CombineArgs& args) {
  const Shape& shape = group.shape;
  const int vectors = shape.hidden / kLanes;
  // With no more pairs allowed than blocks, nothing is claimed: the pairs go up to max_tokens, without the
  // count's loads and barriers (performance-notes.md, perf-kern-4).
  const int allowed = shape.world * shape.max_tokens;
  const int total = allowed <= static_cast<int>(gridDim.x)
                        ? allowed
                        : shape.world * most_tokens_sent(group.signals, shape.world);
  const bool weighted = args.row_weights != nullptr;
  __shared__ const Vector16* inputs[kMaxTopK];
  __shared__ float weights[kMaxTopK];
  __shared__ uint8_t* destinations[kMaxTopK];
  __shared__ int input_count;
  __shared__ int32_t slot_rows[kMaxTopK];
  __shared__ float slot_weights[kMaxTopK];
  __shared__ int next_index;
  // Token by token, the sources interleaved: each source's partials cross a different link (or none, for
  // this rank's own), so taking one source after another left each link idle for part of the call. With a
  // grid that is a multiple of the world size this keeps each block on one source through its first share;
  // turning the sources from round to round, as the dispatch receive does (batch_slot_expansion_item),
  // made this send slower, so it is not done here (performance-notes.md, perf-kern-5). The pairs past the
  // first shares are claimed one at a time, each claim issued when the pair before it starts.
  const int share = first_share(total);
  const int shared_items = share * static_cast<int>(gridDim.x);
  int index = static_cast<int>(blockIdx.x);
  for (int round = 1; index < total; ++round) {
    int next = total;
    if (threadIdx.x == 0) {
      if (round < share) {
        next = static_cast<int>(blockIdx.x) + round * static_cast<int>(gridDim.x);
      } else if (shared_items < total) {
        next = shared_items + static_cast<int>(atomicAdd(&group.state->combine_claims, 1u));
      }
    }
    const int source = index % shape.world;
    const int token = index / shape.world;
    auto* region = reinterpret_cast<uint16_t*>(group.peers.write_window(PeerRegion::kCombine, source));
    // The token's rows on this rank in ascending k, with their weights (1 when unweighted): every slot is
    // loaded at once, then thread 0 compacts them from shared memory.
    if (static_cast<int>(threadIdx.x) < shape.top_k) {
      int32_t row = -1;
      if (token < group.signals->tokens_from[source]) {
        row = group.token_rows[(static_cast<std::size_t>(source) * shape.max_tokens + token) * shape.top_k +
                               threadIdx.x];
      }
      slot_rows[threadIdx.x] = row;
      slot_weights[threadIdx.x] = row >= 0 && weighted ? args.row_weights[row] : 1.0f;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int count = 0;
      for (int k = 0; k < shape.top_k; ++k) {
        if (slot_rows[k] >= 0) {
          inputs[count] = reinterpret_cast<const Vector16*>(
              args.expert_outputs + static_cast<std::size_t>(slot_rows[k]) * shape.hidden);
          weights[count] = slot_weights[k];
          destinations[count] = reinterpret_cast<uint8_t*>(
              region + (static_cast<std::size_t>(token) * shape.top_k + k) * shape.hidden);
          ++count;
        }
      }
      input_count = count;
    }
    __syncthreads();
    const std::size_t row_bytes = CombineRegion::row_bytes(shape);
    if (weighted && input_count > 0) {
      const std::size_t partial_offset = partial_row_offset(shape, token);
      uint8_t* partial = group.peers.row_window(source, partial_offset, token * row_bytes);
      if (kFp8 && source != shape.rank) {
        reduce_rows_to_fp8(partial, inputs, weights, input_count, shape, threadIdx.x, blockDim.x);
      } else {
        reduce_rows(reinterpret_cast<Vector16*>(partial), inputs, weights, input_count, vectors, threadIdx.x,
                    blockDim.x);
      }
      group.peers.publish_staged(source, token * row_bytes, partial_offset, row_bytes);
    } else {
      for (int j = 0; j < input_count; ++j) {
        copy_bytes16(destinations[j], inputs[j], row_bytes, threadIdx.x, blockDim.x);
        group.peers.publish_block(PeerRegion::kCombine, source,
                                  destinations[j] - reinterpret_cast<uint8_t*>(region), row_bytes);
      }
    }
    if (threadIdx.x == 0) {
      next_index = next;
    }
    __syncthreads();  // the shared lists are rewritten for the next token
    index = next_index;
  }
}

// Short rows (two vectors a thread at most): a batch of kBlockThreads / top_k (source, token) pairs at a
// time, in the same order. Every slot's row and weight is looked up at once (a thread per slot; on wide
// blocks the threads past kBlockThreads look up nothing) and each pair's list of inputs made by a thread of
// its own, so the block waits on those loads and on its barriers once per batch; then its warps sum the pairs
// one after another without waiting for each other, each part of the block (sub_block) pairs of its own.
// Wide blocks take hidden 7168 here, three pairs at a time, one per part (performance-notes.md, perf-kern-6).
// Taken in small calls too, where a block has one pair: choosing the other function there cost the fused
// kernel spilled registers on sm_90.
template <bool kFp8>
__device__ void send_partials_in_batches(const GroupView& group, const rocep::device::CombineArgs& args) {
  const Shape& shape = group.shape;
  const int vectors = shape.hidden / kLanes;
  const int total = shape.world * shape.max_tokens;
  const bool weighted = args.row_weights != nullptr;
  const int batch_pairs = kBlockThreads / shape.top_k;
  // [pair of the batch][slot k]: each slot's row and weight; then [pair][input] the pair's inputs
  __shared__ int32_t slot_rows[kBlockThreads];
  __shared__ float slot_weights[kBlockThreads];
  __shared__ const Vector16* inputs[kBlockThreads];
  __shared__ float weights[kBlockThreads];
  __shared__ int input_counts[kBlockThreads];  // [pair of the batch]
  const SubBlock part = sub_block(batch_pairs);
  for (int first = blockIdx.x; first < total; first += batch_pairs * gridDim.x) {
    // the thread's slot of the batch; worked out again for each batch, which keeps the fused kernels within
    // their launch bound's registers without spilling
    const int pair = static_cast<int>(threadIdx.x) / shape.top_k;
    const int k = static_cast<int>(threadIdx.x) % shape.top_k;
    const int index = first + pair * static_cast<int>(gridDim.x);
    int32_t row = -1;
    if (pair < batch_pairs && index < total) {
      const int source = index % shape.world;
      const int token = index / shape.world;
      if (token < group.signals->tokens_from[source]) {
        row =
            group.token_rows[(static_cast<std::size_t>(source) * shape.max_tokens + token) * shape.top_k + k];
      }
    }
    if (threadIdx.x < kBlockThreads) {
      slot_rows[threadIdx.x] = row;
      slot_weights[threadIdx.x] = row >= 0 && weighted ? args.row_weights[row] : 1.0f;
    }
    __syncthreads();
    if (static_cast<int>(threadIdx.x) < batch_pairs) {
      const int list = static_cast<int>(threadIdx.x) * shape.top_k;
      int count = 0;
      for (int slot = list; slot < list + shape.top_k; ++slot) {
        if (slot_rows[slot] >= 0) {
          inputs[list + count] = reinterpret_cast<const Vector16*>(
              args.expert_outputs + static_cast<std::size_t>(slot_rows[slot]) * shape.hidden);
          weights[list + count] = slot_weights[slot];
          ++count;
        }
      }
      input_counts[threadIdx.x] = count;
    }
    __syncthreads();
    for (int b = part.index; b < batch_pairs && first + b * static_cast<int>(gridDim.x) < total;
         b += part.count) {
      const int b_index = first + b * static_cast<int>(gridDim.x);
      const int source = b_index % shape.world;
      const int token = b_index / shape.world;
      const std::size_t row_bytes = CombineRegion::row_bytes(shape);
      const int list = b * shape.top_k;
      if (weighted) {
        if (input_counts[b] > 0) {
          const std::size_t partial_offset = partial_row_offset(shape, token);
          uint8_t* partial = group.peers.row_window(source, partial_offset, token * row_bytes);
          if (kFp8 && source != shape.rank) {
            reduce_rows_to_fp8(partial, inputs + list, weights + list, input_counts[b], shape, part.thread,
                               part.threads);
          } else {
            reduce_rows(reinterpret_cast<Vector16*>(partial), inputs + list, weights + list, input_counts[b],
                        vectors, part.thread, part.threads);
          }
          group.peers.publish_staged(source, token * row_bytes, partial_offset, row_bytes);
        }
      } else {
        auto* region = reinterpret_cast<uint16_t*>(group.peers.write_window(PeerRegion::kCombine, source));
        for (int slot = 0; slot < shape.top_k; ++slot) {
          const int32_t input_row = slot_rows[list + slot];
          if (input_row >= 0) {
            const std::size_t output_row = static_cast<std::size_t>(token) * shape.top_k + slot;
            copy_bytes16(region + output_row * shape.hidden,
                         args.expert_outputs + static_cast<std::size_t>(input_row) * shape.hidden, row_bytes,
                         part.thread, part.threads);
            group.peers.publish_block(PeerRegion::kCombine, source, output_row * row_bytes, row_bytes);
          }
        }
      }
    }
    __syncthreads();  // the shared lists are rewritten for the next batch
  }
}

// kFp8: the weighted partials for other ranks cross as fp8 block-128 messages (Shape::combine_fp8).
template <bool kFp8>
__device__ void send_partials(const GroupView& group, const rocep::device::CombineArgs& args) {
  const Shape& shape = group.shape;
  if (shape.hidden / kLanes <= 2 * static_cast<int>(blockDim.x)) {
    send_partials_in_batches<kFp8>(group, args);
  } else {
    send_partials_by_token<kFp8>(group, args);
  }
  // Whether this combine is weighted, for the receivers to check: released to them with the partials by
  // signal_grid_done (block 0's stores reach the last block through the blocks' count).
  if (blockIdx.x == 0 && static_cast<int>(threadIdx.x) < shape.world) {
    group.peers.signal_store(static_cast<int>(threadIdx.x), &Signals::combine_weighted, shape.rank,
                             args.row_weights != nullptr ? 1 : 0);
  }
  signal_grid_done(&group.state->combine_blocks_sent, &group.state->combine_claims, group.peers, shape.world,
                   shape.rank, &Signals::combine_arrived);
}

// The combine receive's tokens per batch: short rows (two vectors a thread at most: hidden up to 4096 on
// blocks of kBlockThreads, up to 12288 on wide ones) are summed a batch of tokens at a time where there are
// more tokens than blocks: each token's list of partials is made by a thread of its own and the block waits
// on those loads and on its barriers once per batch; then its warps sum the batch's tokens one after another,
// without waiting for each other, each part of the block (sub_block) tokens of its own
// (performance-notes.md, perf-kern-7). Longer rows keep the block busy with one token's loads, and a call
// with fewer tokens than blocks has one per block anyway: there a batch is one token.
__device__ inline int combine_batch_items(const Shape& shape, int items, int items_per_batch) {
  const bool short_rows = shape.hidden / kLanes <= 2 * static_cast<int>(blockDim.x);
  return short_rows && items > static_cast<int>(gridDim.x) ? items_per_batch : 1;
}

// kFp8: the other ranks' weighted partials are fp8 block-128 messages (Shape::combine_fp8).
template <bool kEpilogue, bool kFp8>
__device__ void receive_partials(const GroupView& group, const rocep::device::CombineArgs& args,
                                 uint64_t sequence) {
  const Shape& shape = group.shape;
  const bool arrived =
      block_wait_for_peers(group.signals->combine_arrived, sequence, shape.world, group.timeout_ticks,
                           group.status, Operation::kCombineRecv, &group.peers);
  // Partials laid out by a combine weighted otherwise than this one are read as if they were this call's
  // (within the region, so no access strays) and out is invalid: recorded as a failure of the call. Block 0
  // checks, its thread r reading rank r's word after its own acquire of rank r's arrival, with no barrier.
  if (arrived && blockIdx.x == 0 && static_cast<int>(threadIdx.x) < shape.world) {
    const int32_t peer_weighted = group.signals->combine_weighted[threadIdx.x];
    if (peer_weighted != (args.row_weights != nullptr ? 1 : 0)) {
      report_failure(group.status, StatusCode::kCombineWeightingMismatch, Operation::kCombineRecv,
                     static_cast<int>(threadIdx.x), -1, -1, peer_weighted);
    }
  }
  const int vectors = shape.hidden / kLanes;
  const int tokens = group.state->sent_tokens;
  // [token of the batch][input], world + 1 apart: the partials, then the shared expert's row
  __shared__ const Vector16* partials[kBlockThreads];  // indexed below batch_tokens * list_length
  __shared__ int partial_counts[kBlockThreads];        // [token of the batch]
  __shared__ float ones[kMaxWorld + 1];
  for (int i = threadIdx.x; i <= kMaxWorld; i += blockDim.x) {
    ones[i] = 1.0f;
  }
  const int list_length = shape.world + 1;
  const int batch_tokens = combine_batch_items(shape, tokens, kBlockThreads / list_length);
  const SubBlock part = sub_block(batch_tokens);
  const auto* region = reinterpret_cast<const uint16_t*>(group.combine_region);
  for (int first = blockIdx.x; arrived && first < tokens; first += batch_tokens * gridDim.x) {
    if (args.row_weights != nullptr) {
      // The partials in ascending rank order, then the shared expert's row, all with weight 1.
      const int token = first + static_cast<int>(threadIdx.x) * static_cast<int>(gridDim.x);
      if (static_cast<int>(threadIdx.x) < batch_tokens && token < tokens) {
        const uint64_t mask = group.sent_masks[token];
        const Vector16** list = partials + threadIdx.x * list_length;
        int count = 0;
        for (int peer = 0; peer < shape.world; ++peer) {
          if ((mask >> peer) & 1) {
            const uintptr_t fp8 = kFp8 && peer != shape.rank ? kFp8Input : 0;
            list[count++] = reinterpret_cast<const Vector16*>(
                reinterpret_cast<uintptr_t>(
                    region + (static_cast<std::size_t>(peer) * shape.max_tokens + token) * shape.hidden) +
                fp8);
          }
        }
        if (args.shared_expert_output != nullptr && in_shared_expert_slice(shape, tokens, token)) {
          list[count++] = reinterpret_cast<const Vector16*>(args.shared_expert_output +
                                                            static_cast<std::size_t>(token) * shape.hidden);
        }
        partial_counts[threadIdx.x] = count;
      }
      __syncthreads();
      for (int b = part.index; b < batch_tokens && first + b * static_cast<int>(gridDim.x) < tokens;
           b += part.count) {
        const int b_token = first + b * static_cast<int>(gridDim.x);
        auto* out =
            reinterpret_cast<Vector16*>(args.out + static_cast<std::size_t>(b_token) * args.out_row_stride);
        if constexpr (kFp8) {
          if constexpr (kEpilogue) {
            sum_rows_and_messages(out, partials + b * list_length, partial_counts[b], shape, part.thread,
                                  part.threads, RowEpilogue(args, b_token, vectors));
          } else {
            sum_rows_and_messages(out, partials + b * list_length, partial_counts[b], shape, part.thread,
                                  part.threads, NoEpilogue{});
          }
        } else if constexpr (kEpilogue) {
          reduce_rows(out, partials + b * list_length, ones, partial_counts[b], vectors, part.thread,
                      part.threads, RowEpilogue(args, b_token, vectors));
        } else {
          reduce_rows(out, partials + b * list_length, ones, partial_counts[b], vectors, part.thread,
                      part.threads);
        }
      }
      __syncthreads();  // the shared lists are rewritten for the next batch
    } else {
      for (int b = part.index; b < batch_tokens && first + b * static_cast<int>(gridDim.x) < tokens;
           b += part.count) {
        const int b_token = first + b * static_cast<int>(gridDim.x);
        for (int k = 0; k < shape.top_k; ++k) {
          const std::size_t row = static_cast<std::size_t>(b_token) * shape.top_k + k;
          auto* out = reinterpret_cast<Vector16*>(args.out + row * shape.hidden);
          if (group.sent_ids[row] >= 0) {
            copy_bytes16(out, region + row * shape.hidden, CombineRegion::row_bytes(shape), part.thread,
                         part.threads);
          } else {
            for (int v = part.thread; v < vectors; v += part.threads) {
              out[v] = Vector16{0, 0, 0, 0};
            }
          }
        }
      }
    }
  }
  if (arrived && threadIdx.x == 0) {
    group.block_calls[blockIdx.x].combines = sequence;  // the block's next combine is the one after
  }
}

// --- the per-token layout -------------------------------------------------------------------------------

// The blocks of a fused per-token combine of a chunked call that send, the others receiving: PerTokenTuning's
// share of the grid (of kCombineSplitBlocks or more), a smaller one where the rows cross in fp8 (each row's
// sum, which dequantises it, takes a receiver longer than its quantisation takes a sender); where the group
// has SHMEM peers, whose puts take their senders' multiprocessors where the link is NVLink
// (docs/scale-out.md), a larger one, larger still where the senders stage the rows before they put them than
// where the caller wrote them into the staging rows (the combine input buffer). The links fill from a few
// multiprocessors; the receive's sums, bound by each multiprocessor's instructions, take the rest.
__device__ inline int combine_senders(const GroupView& group, const rocep::device::CombineArgs& args,
                                      int blocks) {
  if (kCompiledTransport != Transport::kShmem || group.peers.shmem_peers == 0) {
    return blocks *
           (group.shape.combine_fp8 != 0 ? PerTokenTuning::kCombineSenderPercentFp8
                                         : PerTokenTuning::kCombineSenderPercent) /
           100;
  }
  const bool staged = reinterpret_cast<const uint8_t*>(args.expert_outputs) == group.peers.combine_staging;
  return blocks *
         (staged ? PerTokenTuning::kCombineSenderPercentOverShmemStaged
                 : PerTokenTuning::kCombineSenderPercentOverShmem) /
         100;
}

// The per-token send, by sender `sender` of `senders`: the row of every token this rank received from
// another rank, into that rank's combine region at [rank][token] (where the weighted combine puts a
// partial), with PerTokenTuning::kCombineVectorsInFlight loads in flight per thread. Its own tokens' rows
// stay in expert_outputs, where its receive reads them. Rows for a SHMEM peer are staged at their own rows
// of combine_staging first (hip/transport.hpp), and not copied at all where the caller wrote its expert
// outputs there (bf16). Where the rows are pulled (rows_pulled) nothing is copied: block 0 tells the peers
// (Signals::combine_pulled = 1) and flags every chunk at once, and the peers load the rows themselves;
// otherwise, in groups whose combines may pull, each block that flags stores 0 there first (block 0
// does where none does, for the grid's signal to release). A rank whose call is chunked (chunked_combine
// of the count it dispatched) gets units (chunk, rank), the ranks interleaved so that every link is busy,
// each unit flagged as the unit of call `sequence` once its rows are stored; the others get runs of
// consecutive tokens of one rank (tokens_per_run), the ranks interleaved, released by the grid's signal
// alone. Returns true in block 0 where its signal needs no fence (signal_rows_sent): the rows are pulled,
// no chunk is flagged, and every peer already holds this rank's words from an earlier signal
// (LocalState::peers_hold_pulled_words), so that block 0 stores nothing for the peers, and the rows they
// load were written by kernels that have ended (kEndedKernelsVisibleToPeers).
template <bool kFp8>
__device__ bool send_rows_per_token(const GroupView& group, const rocep::device::CombineArgs& args,
                                    uint64_t sequence, int sender, int senders) {
  const Shape& shape = group.shape;
  constexpr int kBatch = PerTokenTuning::kBatchTokens;
  static_assert(kMaxCombineChunkTokens <= kBatch, "a chunk's rows fit a batch's lists");
  static_assert(kBatch <= 32, "a batch's tokens fit the bits of `listed`");
  __shared__ const uint8_t* from[kBatch];  // [place]: the listed rows, in no order
  __shared__ uint8_t* to[kBatch];
  __shared__ std::size_t row_offsets[kBatch];  // [token - first]: where its row lies in the expert outputs
  __shared__ uint32_t listed;                  // bit token - first: the token's row is listed
  __shared__ int count;
  const int others = shape.world - 1;
  const std::size_t row_bytes = CombineRegion::row_bytes(shape);
  const auto* expert_outputs = reinterpret_cast<const uint8_t*>(args.expert_outputs);
  // Where token `token`'s row goes in a peer's combine region.
  const auto offset_of = [&](int token) {
    return (static_cast<std::size_t>(shape.rank) * shape.max_tokens + token) * row_bytes;
  };
  // Lists row `token` (the batch's first + i) of `source` for the copy, if this rank has one.
  const auto list_row = [&](int source, int token, int i) {
    const int32_t row =
        group.token_rows[(static_cast<std::size_t>(source) * shape.max_tokens + token) * shape.top_k];
    if (row >= 0) {
      const int place = atomicAdd(&count, 1);
      const std::size_t row_offset = static_cast<std::size_t>(row) * row_bytes;
      from[place] = expert_outputs + row_offset;
      to[place] = group.peers.row_window(source, offset_of(token), row_offset);
      row_offsets[i] = row_offset;
      atomicOr(&listed, 1u << i);
    }
  };
  // The listed rows (all bound for `source`) as they are, or (combine_fp8) quantised to fp8 block-128
  // messages by the whole block, PerTokenTuning::kCombineQuantizedSlices slices at a time; then handed
  // over: bf16 rows as one range per run of consecutive listed tokens (their rows are consecutive too: a
  // row per received token of `source`, in token order), fp8 messages (each shorter than its row slot) one
  // by one. `first`: the batch's first token.
  Shape fp8_rows = shape;
  fp8_rows.format = Format::kFp8Block128;
  fp8_rows.payload_bytes = static_cast<uint32_t>(shape.hidden);
  const std::size_t sent_bytes = kFp8 ? fp8_combine_message_bytes(shape) : row_bytes;
  const auto copy_listed = [&](int source, int first) {
    if constexpr (kFp8) {
      quantize_rows_to_messages<Format::kFp8Block128, PerTokenTuning::kCombineThreads,
                                PerTokenTuning::kCombineQuantizedSlices>(from, to, count, fp8_rows, 1.0f);
    } else if (count > 0 && from[0] != to[0]) {  // the same in every row: staged by the caller already
      copy_rows<PerTokenTuning::kCombineVectorsInFlight>(from, to, count,
                                                         static_cast<uint32_t>(row_bytes / kVectorBytes));
    }
    if (!group.peers.through_shmem(source) || combine_sums_nodes(shape)) {
      return;  // stored in the peer's memory, or staged for this node's sum of the source's rows
    }
    for (uint32_t left = listed; left != 0;) {  // the same in every thread
      const BitRun run = take_lowest_run(&left, kFp8 ? 1 : 32);
      group.peers.publish_staged(source, row_offsets[run.start], offset_of(first + run.start),
                                 static_cast<std::size_t>(run.length - 1) * row_bytes + sent_bytes);
    }
  };
  // Tokens [first, first + n) of `source` (those below its count), listed, copied and handed over by the
  // block; the same arguments in every thread.
  const auto send_tokens_of = [&](int source, int first, int n, int tokens) {
    __syncthreads();  // the tokens before are copied
    if (threadIdx.x == 0) {
      count = 0;
      listed = 0;
    }
    __syncthreads();
    const int token = first + static_cast<int>(threadIdx.x);
    if (static_cast<int>(threadIdx.x) < n && token < tokens) {
      list_row(source, token, static_cast<int>(threadIdx.x));
    }
    __syncthreads();
    copy_listed(source, first);
  };
  const bool pulled = !kFp8 && rows_pulled(group, args);  // Shape::pulled_combine: bf16 rows only
  if (pulled && sender != 0) {
    return false;  // nothing to copy: block 0 tells the peers and flags every chunk for the whole grid
  }
  bool any_chunked = false;
  bool any_whole = false;
  for (int source = 0; source < shape.world; ++source) {
    if (source != shape.rank && shape.local_only == 0) {  // local-only: no rank got another's tokens
      (chunked_combine(shape, group.signals->tokens_from[source]) ? any_chunked : any_whole) = true;
    }
  }
  any_whole = any_whole && !pulled;
  // The state is read only where the rows are pulled, which only block 0 reaches here.
  const bool words_held =
      kEndedKernelsVisibleToPeers && pulled && !any_chunked && group.state->peers_hold_pulled_words != 0;
  if (words_held) {
    return true;
  }
  if (sender == 0 && threadIdx.x == 0 && !pulled) {
    group.state->peers_hold_pulled_words = 0;  // its combine_pulled is 0 from this call on
  }
  // The word before anything of this call that releases it: every block's flags, or the grid's signal.
  if (!kFp8 && shape.pulled_combine != 0 && (any_chunked || sender == 0)) {
    const int peer = static_cast<int>(threadIdx.x);
    if (peer < shape.world && peer != shape.rank) {
      group.peers.signal_store(peer, &Signals::combine_pulled, shape.rank, pulled ? 1 : 0);
    }
    __syncthreads();
  }
  // (other rank, run of `run` consecutive tokens), up to the most tokens any rank sent.
  const int most = any_whole ? most_tokens_sent(group.signals, shape.world) : 0;
  const int run = tokens_per_run(most * others, senders);
  const int batches = others * ((most + run - 1) / run);
  for (int batch = sender; batch < batches; batch += senders) {
    const int other = batch % others;
    const int source = other + (other >= shape.rank ? 1 : 0);
    const int tokens = group.signals->tokens_from[source];
    const int first = batch / others * run;
    if (chunked_combine(shape, tokens) || first >= tokens) {
      continue;  // the same in every thread
    }
    send_tokens_of(source, first, run, tokens);
  }
  // Unit (chunk, other rank) of a chunked call: its rank, the rank's token count and the chunk's first
  // token, which is past the count where the rank's call is not chunked or has no such chunk.
  struct Unit {
    int source;
    int tokens;
    int first;
  };
  const auto unit_of = [&](int unit) {
    const int other = unit % others;
    const int source = other + (other >= shape.rank ? 1 : 0);
    const int tokens = group.signals->tokens_from[source];
    return Unit{
        source, tokens,
        chunked_combine(shape, tokens) ? unit / others * combine_chunk_tokens(shape, tokens) : tokens};
  };
  const auto flag = [&](int unit, int source) {
    group.peers.flag_store(PeerRegion::kCombine, source,
                           CombineRegion::chunk_flag_offset(shape, unit / others, shape.rank), sequence);
  };
  const int units = any_chunked ? others * max_combine_chunks(shape) : 0;
  if (pulled) {
    for (int unit = static_cast<int>(threadIdx.x); unit < units; unit += static_cast<int>(blockDim.x)) {
      const Unit at = unit_of(unit);
      if (at.first < at.tokens) {
        flag(unit, at.source);  // after this block's word, which the release orders first
      }
    }
  }
  for (int unit = pulled ? units : sender; unit < units; unit += senders) {
    const Unit at = unit_of(unit);
    if (at.first >= at.tokens) {
      continue;  // the same in every thread
    }
    send_tokens_of(at.source, at.first, combine_chunk_tokens(shape, at.tokens), at.tokens);
    __syncthreads();  // every thread's rows before the flag
    if (threadIdx.x == 0) {
      flag(unit, at.source);
    }
  }
  // Partials, as a weighted combine's: released to the receivers with the grid's signal.
  if (blockIdx.x == 0 && static_cast<int>(threadIdx.x) < shape.world) {
    group.peers.signal_store(static_cast<int>(threadIdx.x), &Signals::combine_weighted, shape.rank, 1);
  }
  return false;
}

// Where the per-token combine sums nodes first (Shape::node_sums), by every block once it has sent: tells
// this node's ranks that this rank's rows of the combine for the other nodes are staged
// (Signals::combine_staged): every block counts in, and the grid's last one tells. Rows the caller wrote
// into the staging rows (the combine input buffer) were there before the kernel began, but telling at once
// there measured slower (docs/scale-out.md).
__device__ void tell_rows_staged(const GroupView& group) {
  __syncthreads();  // the block's staging stores are ordered before thread 0's count
  if (threadIdx.x == 0 && arrives_last(&group.state->combine_blocks_staged)) {
    signal_ipc_peers(group.peers, group.shape.world, group.shape.rank, &Signals::combine_staged);
  }
}

// The node sums of a per-token combine (Shape::node_sums), by sender `sender` of `senders`, once this node's
// ranks told that their rows are staged (tell_rows_staged): every block waits until each rank of this node
// has told it for combine `sequence`. For each source on another node whose messages this rank held, runs
// of consecutive tokens (tokens_per_run of all such tokens, so that the senders share them) go to the
// senders in turn: each token's rows from this node's ranks that received it (ascending rank, from their
// staging rows, found through the row index their dispatch receives stored, NodeSums) summed in float32 and
// rounded once, into its NodeSums row, and the tokens that have one put to the source as this rank's rows
// (publish_node_sums), a put per run of consecutive ones. The source sums that row in the place of this
// rank's (summed_ranks).
__device__ void send_node_sums(const GroupView& group, uint64_t sequence, int sender, int senders) {
  const Shape& shape = group.shape;
  constexpr int kBatch = PerTokenTuning::kBatchTokens;
  static_assert(kBatch <= 32, "a batch's tokens fit the bits of `summed`");
  const uint64_t mates = group.peers.node_ranks[shape.rank];
  if (!block_wait_for_peers(group.signals->combine_staged, sequence, shape.world, group.timeout_ticks,
                            group.status, Operation::kCombineSend, nullptr, -1, nullptr, mates)) {
    return;
  }
  __shared__ const Vector16* inputs[kBatch][kMaxNodeSumRanks];
  __shared__ int input_counts[kBatch];
  __shared__ uint32_t summed;  // bit i: the batch's token i has a sum
  const std::size_t row_bytes = CombineRegion::row_bytes(shape);
  const auto held = [&](int source) { return group.peers.node_summers[source] == shape.rank; };
  int held_tokens = 0;
  for (int source = 0; source < shape.world; ++source) {
    held_tokens += held(source) ? group.signals->tokens_from[source] : 0;
  }
  const int run_tokens = tokens_per_run(held_tokens, senders);
  int batch = 0;  // runs of the held sources so far, in source then token order
  for (int source = 0; source < shape.world; ++source) {
    if (!held(source)) {
      continue;  // on this node, or held by a node-mate
    }
    const int slot = group.peers.node_summers[shape.world + source];
    const int tokens = group.signals->tokens_from[source];
    for (int first = 0; first < tokens; first += run_tokens, ++batch) {
      if (batch % senders != sender) {
        continue;  // the same in every thread
      }
      const int count = min(run_tokens, tokens - first);
      if (threadIdx.x == 0) {
        summed = 0;
      }
      __syncthreads();
      // A thread per token: its rows on this node, in ascending rank.
      if (static_cast<int>(threadIdx.x) < count) {
        const int token = first + static_cast<int>(threadIdx.x);
        int listed = 0;
        for (uint64_t left = mates; left != 0; left &= left - 1) {
          const int mate = __ffsll(static_cast<long long>(left)) - 1;
          const int32_t row = *reinterpret_cast<const int32_t*>(
              group.peers.node_sums[shape.rank] + NodeSums::row_index_offset(shape, mate, slot, token));
          if (row >= 0) {
            inputs[threadIdx.x][listed++] = reinterpret_cast<const Vector16*>(
                group.peers.staged_rows[mate] + static_cast<std::size_t>(row) * row_bytes);
          }
        }
        input_counts[threadIdx.x] = listed;
        if (listed > 0) {
          atomicOr(&summed, 1u << threadIdx.x);
        }
      }
      __syncthreads();
      sum_piece<false>(
          &inputs[0][0], kMaxNodeSumRanks, input_counts, count, shape,
          [&](int in_piece) {
            return reinterpret_cast<Vector16*>(group.peers.node_sums[shape.rank] +
                                               NodeSums::row_offset(shape, slot, first + in_piece));
          },
          [](int /*in_piece*/) { return NoEpilogue{}; });
      for (uint32_t left = summed; left != 0;) {  // the same in every thread
        const BitRun run = take_lowest_run(&left, kBatch);
        group.peers.publish_node_sums(shape, source, slot, first + run.start, run.length);
      }
      __syncthreads();  // `summed` and the lists are read before the next batch's
    }
  }
}

// The signal of a per-token combine send, from every block once it has sent. Where this rank's rows are
// pulled (rows_pulled: one node, so every peer by IPC) only block 0 stored anything for the peers (its
// words and flags), so it signals alone, without waiting for the grid's count: the rows the peers then
// load were written before this kernel began; with no fence where send_rows_per_token returned
// `words_held`. Otherwise the grid signals once every block has sent (signal_grid_done).
template <bool kFp8>
__device__ void signal_rows_sent(const GroupView& group, const rocep::device::CombineArgs& args,
                                 bool words_held) {
  const Shape& shape = group.shape;
  if (kFp8 || !rows_pulled(group, args)) {
    signal_grid_done(&group.state->combine_blocks_sent, nullptr, group.peers, shape.world, shape.rank,
                     &Signals::combine_arrived);
  } else if (blockIdx.x == 0) {
    __syncthreads();  // the block's words and flags are ordered before thread 0's fence
    if (threadIdx.x != 0) {
      return;
    }
    if (words_held) {
      add_to_ipc_peers(group.peers, shape.world, shape.rank, &Signals::combine_arrived);
      return;
    }
    signal_ipc_peers(group.peers, shape.world, shape.rank, &Signals::combine_arrived);
    group.state->peers_hold_pulled_words = 1;  // read by block 0 of a later kernel only
  }
}

// The split send: every block sends, then the grid signals the peers.
template <bool kFp8>
__device__ void send_kernel_per_token(const GroupView& group, const rocep::device::CombineArgs& args) {
  const int block = static_cast<int>(blockIdx.x);
  const uint64_t sequence = group.block_calls[block].combines + 1;
  const bool words_held =
      send_rows_per_token<kFp8>(group, args, sequence, block, static_cast<int>(gridDim.x));
  if (!kFp8 && combine_sums_nodes(group.shape)) {
    tell_rows_staged(group);
    send_node_sums(group, sequence, block, static_cast<int>(gridDim.x));
  }
  signal_rows_sent<kFp8>(group, args, words_held);
}

// The fused call: every block sends, then receives; or, for a chunked call, combine_senders(grid) blocks
// send and the others receive chunk by chunk as the peers' sends flag them. Where this rank's rows are
// pulled, its sends only flag and signal, and every block then receives, chunk by chunk for a chunked call.
template <bool kFp8, typename Epilogues>
__device__ void combine_kernel_per_token(const GroupView& group, const rocep::device::CombineArgs& args,
                                         const Epilogues& epilogues) {
  const int block = static_cast<int>(blockIdx.x);
  const int blocks = static_cast<int>(gridDim.x);
  const uint64_t sequence = group.block_calls[block].combines + 1;
  const bool chunked = chunked_combine(group.shape, group.state->sent_tokens);
  const bool split_roles = chunked && (kFp8 || !rows_pulled(group, args));
  const int senders = split_roles ? combine_senders(group, args, blocks) : blocks;
  bool words_held = false;
  if (block < senders) {
    words_held = send_rows_per_token<kFp8>(group, args, sequence, block, senders);
  }
  if (!kFp8 && combine_sums_nodes(group.shape)) {  // not chunked: every block sends (Shape::split_combine)
    tell_rows_staged(group);
    send_node_sums(group, sequence, block, senders);
  }
  signal_rows_sent<kFp8>(group, args, words_held);
  if (split_roles && block < senders) {
    if (threadIdx.x == 0) {
      group.block_calls[block].combines = sequence;  // a sender's part of the call is done
    }
    return;
  }
  const int receiver = split_roles ? block - senders : block;
  receive_rows_per_token<kFp8>(group, args, epilogues, sequence, receiver,
                               blocks - (split_roles ? senders : 0), chunked);
}

}  // namespace

extern "C" __global__ void __launch_bounds__(PerTokenTuning::kCombineThreads)
    ROCEP_EP_KERNEL(rocep_combine_send_per_token)(GroupView group, rocep::device::CombineArgs args) {
  send_kernel_per_token<false>(group, args);
}

extern "C" __global__ void __launch_bounds__(PerTokenTuning::kCombineThreads)
    ROCEP_EP_KERNEL(rocep_combine_recv_per_token)(GroupView group, rocep::device::CombineArgs args) {
  receive_kernel_per_token<false>(group, args, NoEpilogue{});
}

extern "C" __global__ void __launch_bounds__(PerTokenTuning::kCombineThreads)
    ROCEP_EP_KERNEL(rocep_combine_recv_per_token_epilogue)(GroupView group, rocep::device::CombineArgs args) {
  receive_kernel_per_token<false>(group, args, RowEpilogues{args});
}

extern "C" __global__ void __launch_bounds__(PerTokenTuning::kCombineThreads)
    ROCEP_EP_KERNEL(rocep_combine_per_token)(GroupView group, rocep::device::CombineArgs args) {
  combine_kernel_per_token<false>(group, args, NoEpilogue{});
}

extern "C" __global__ void __launch_bounds__(PerTokenTuning::kCombineThreads)
    ROCEP_EP_KERNEL(rocep_combine_per_token_epilogue)(GroupView group, rocep::device::CombineArgs args) {
  combine_kernel_per_token<false>(group, args, RowEpilogues{args});
}

extern "C" __global__ void __launch_bounds__(PerTokenTuning::kCombineThreads)
    ROCEP_EP_KERNEL(rocep_combine_send_per_token_fp8)(GroupView group, rocep::device::CombineArgs args) {
  send_kernel_per_token<true>(group, args);
}

extern "C" __global__ void __launch_bounds__(PerTokenTuning::kCombineThreads)
    ROCEP_EP_KERNEL(rocep_combine_recv_per_token_fp8)(GroupView group, rocep::device::CombineArgs args) {
  receive_kernel_per_token<true>(group, args, NoEpilogue{});
}

extern "C" __global__ void __launch_bounds__(PerTokenTuning::kCombineThreads)
    ROCEP_EP_KERNEL(rocep_combine_recv_per_token_epilogue_fp8)(GroupView group,
                                                               rocep::device::CombineArgs args) {
  receive_kernel_per_token<true>(group, args, RowEpilogues{args});
}

extern "C" __global__ void __launch_bounds__(PerTokenTuning::kCombineThreads)
    ROCEP_EP_KERNEL(rocep_combine_per_token_fp8)(GroupView group, rocep::device::CombineArgs args) {
  combine_kernel_per_token<true>(group, args, NoEpilogue{});
}

extern "C" __global__ void __launch_bounds__(PerTokenTuning::kCombineThreads)
    ROCEP_EP_KERNEL(rocep_combine_per_token_epilogue_fp8)(GroupView group, rocep::device::CombineArgs args) {
  combine_kernel_per_token<true>(group, args, RowEpilogues{args});
}

extern "C" __global__ void __launch_bounds__(kExpandedWideThreads)
    ROCEP_EP_KERNEL(rocep_combine_send)(GroupView group, rocep::device::CombineArgs args) {
  send_partials<false>(group, args);
}

extern "C" __global__ void __launch_bounds__(kExpandedWideThreads)
    ROCEP_EP_KERNEL(rocep_combine_recv)(GroupView group, rocep::device::CombineArgs args) {
  receive_partials<false, false>(group, args, group.block_calls[blockIdx.x].combines + 1);
}

extern "C" __global__ void __launch_bounds__(kExpandedWideThreads)
    ROCEP_EP_KERNEL(rocep_combine_recv_epilogue)(GroupView group, rocep::device::CombineArgs args) {
  receive_partials<true, false>(group, args, group.block_calls[blockIdx.x].combines + 1);
}

extern "C" __global__ void __launch_bounds__(kExpandedWideThreads)
    ROCEP_EP_KERNEL(rocep_combine)(GroupView group, rocep::device::CombineArgs args) {
  const uint64_t sequence = group.block_calls[blockIdx.x].combines + 1;
  send_partials<false>(group, args);
  receive_partials<false, false>(group, args, sequence);
}

extern "C" __global__ void __launch_bounds__(kExpandedWideThreads)
    ROCEP_EP_KERNEL(rocep_combine_epilogue)(GroupView group, rocep::device::CombineArgs args) {
  const uint64_t sequence = group.block_calls[blockIdx.x].combines + 1;
  send_partials<false>(group, args);
  receive_partials<true, false>(group, args, sequence);
}

// The expanded layout's combine with the partials crossing in fp8 (Shape::combine_fp8): kernels of their
// own, so that the bf16 ones keep their registers.
extern "C" __global__ void __launch_bounds__(kExpandedWideThreads)
    ROCEP_EP_KERNEL(rocep_combine_send_fp8)(GroupView group, rocep::device::CombineArgs args) {
  send_partials<true>(group, args);
}

extern "C" __global__ void __launch_bounds__(kExpandedWideThreads)
    ROCEP_EP_KERNEL(rocep_combine_recv_fp8)(GroupView group, rocep::device::CombineArgs args) {
  receive_partials<false, true>(group, args, group.block_calls[blockIdx.x].combines + 1);
}

extern "C" __global__ void __launch_bounds__(kExpandedWideThreads)
    ROCEP_EP_KERNEL(rocep_combine_recv_epilogue_fp8)(GroupView group, rocep::device::CombineArgs args) {
  receive_partials<true, true>(group, args, group.block_calls[blockIdx.x].combines + 1);
}

extern "C" __global__ void __launch_bounds__(kExpandedWideThreads)
    ROCEP_EP_KERNEL(rocep_combine_fp8)(GroupView group, rocep::device::CombineArgs args) {
  const uint64_t sequence = group.block_calls[blockIdx.x].combines + 1;
  send_partials<true>(group, args);
  receive_partials<false, true>(group, args, sequence);
}

extern "C" __global__ void __launch_bounds__(kExpandedWideThreads)
    ROCEP_EP_KERNEL(rocep_combine_epilogue_fp8)(GroupView group, rocep::device::CombineArgs args) {
  const uint64_t sequence = group.block_calls[blockIdx.x].combines + 1;
  send_partials<true>(group, args);
  receive_partials<true, true>(group, args, sequence);
}

namespace rocep::device {

// The block size of the expanded layout's combine kernels on `grid` (kExpandedWideThreads).
inline int expanded_combine_threads(const LaunchGrid& grid) {
  return grid.wide ? kExpandedWideThreads : kBlockThreads;
}

template <>
hipError_t EpKernels<kCompiledTransport>::load_combine_kernels(bool per_token, int* resident_blocks) {
  const std::initializer_list<const void*> expanded = {
      reinterpret_cast<const void*>(&ROCEP_EP_KERNEL(rocep_combine_send)),
      reinterpret_cast<const void*>(&ROCEP_EP_KERNEL(rocep_combine_recv)),
      reinterpret_cast<const void*>(&ROCEP_EP_KERNEL(rocep_combine_recv_epilogue)),
      reinterpret_cast<const void*>(&ROCEP_EP_KERNEL(rocep_combine)),
      reinterpret_cast<const void*>(&ROCEP_EP_KERNEL(rocep_combine_epilogue)),
      reinterpret_cast<const void*>(&ROCEP_EP_KERNEL(rocep_combine_send_fp8)),
      reinterpret_cast<const void*>(&ROCEP_EP_KERNEL(rocep_combine_recv_fp8)),
      reinterpret_cast<const void*>(&ROCEP_EP_KERNEL(rocep_combine_recv_epilogue_fp8)),
      reinterpret_cast<const void*>(&ROCEP_EP_KERNEL(rocep_combine_fp8)),
      reinterpret_cast<const void*>(&ROCEP_EP_KERNEL(rocep_combine_epilogue_fp8))};
  const std::initializer_list<const void*> by_token = {
      reinterpret_cast<const void*>(&ROCEP_EP_KERNEL(rocep_combine_send_per_token)),
      reinterpret_cast<const void*>(&ROCEP_EP_KERNEL(rocep_combine_recv_per_token)),
      reinterpret_cast<const void*>(&ROCEP_EP_KERNEL(rocep_combine_recv_per_token_epilogue)),
      reinterpret_cast<const void*>(&ROCEP_EP_KERNEL(rocep_combine_per_token)),
      reinterpret_cast<const void*>(&ROCEP_EP_KERNEL(rocep_combine_per_token_epilogue)),
      reinterpret_cast<const void*>(&ROCEP_EP_KERNEL(rocep_combine_send_per_token_fp8)),
      reinterpret_cast<const void*>(&ROCEP_EP_KERNEL(rocep_combine_recv_per_token_fp8)),
      reinterpret_cast<const void*>(&ROCEP_EP_KERNEL(rocep_combine_recv_per_token_epilogue_fp8)),
      reinterpret_cast<const void*>(&ROCEP_EP_KERNEL(rocep_combine_per_token_fp8)),
      reinterpret_cast<const void*>(&ROCEP_EP_KERNEL(rocep_combine_per_token_epilogue_fp8))};
  int unused = 1 << 30;  // the other layout's kernels are loaded too, but their residency is not the group's
  constexpr int kPerTokenThreads = PerTokenTuning::kCombineThreads;
  hipError_t status = per_token ? load_kernels(by_token, resident_blocks, kPerTokenThreads)
                                : load_kernels(expanded, resident_blocks);
  if (status == hipSuccess && !per_token) {
    // A wide grid's blocks (expanded_combine_threads) must be resident too: counted as no block if not.
    int wide = 1 << 30;
    status = load_kernels(expanded, &wide, kExpandedWideThreads);
    *resident_blocks = wide < 1 ? 0 : *resident_blocks;
  }
  if (status == hipSuccess) {
    status = per_token ? load_kernels(expanded, &unused) : load_kernels(by_token, &unused, kPerTokenThreads);
  }
  return status;
}

// The send waits on nobody and the receive only on the peers' grids; the fused call also on its own send's
// signal.
template <>
hipError_t EpKernels<kCompiledTransport>::launch_combine_send(const GroupView& group, const CombineArgs& args,
                                                              const LaunchGrid& grid, hipStream_t stream) {
  if (group.shape.per_token != 0) {
    const bool fp8 = group.shape.combine_fp8 != 0;
    return launch_kernel<PerTokenTuning::kCombineThreads>(
        fp8 ? &ROCEP_EP_KERNEL(rocep_combine_send_per_token_fp8)
            : &ROCEP_EP_KERNEL(rocep_combine_send_per_token),
        grid, Residency::kBlockByBlock, stream, group, args);
  }
  const bool fp8 = group.shape.combine_fp8 != 0;
  return launch_kernel_threads(
      fp8 ? &ROCEP_EP_KERNEL(rocep_combine_send_fp8) : &ROCEP_EP_KERNEL(rocep_combine_send), grid,
      expanded_combine_threads(grid), Residency::kBlockByBlock, stream, group, args);
}

template <>
hipError_t EpKernels<kCompiledTransport>::launch_combine_recv(const GroupView& group, const CombineArgs& args,
                                                              const LaunchGrid& grid, hipStream_t stream) {
  const bool epilogue = has_epilogue(args);
  if (group.shape.per_token != 0) {
    const bool fp8 = group.shape.combine_fp8 != 0;
    const auto kernel = epilogue ? (fp8 ? &ROCEP_EP_KERNEL(rocep_combine_recv_per_token_epilogue_fp8)
                                        : &ROCEP_EP_KERNEL(rocep_combine_recv_per_token_epilogue))
                                 : (fp8 ? &ROCEP_EP_KERNEL(rocep_combine_recv_per_token_fp8)
                                        : &ROCEP_EP_KERNEL(rocep_combine_recv_per_token));
    return launch_kernel<PerTokenTuning::kCombineThreads>(kernel, grid, Residency::kBlockByBlock, stream,
                                                          group, args);
  }
  const bool fp8 = group.shape.combine_fp8 != 0;
  const auto kernel =
      epilogue ? (fp8 ? &ROCEP_EP_KERNEL(rocep_combine_recv_epilogue_fp8)
                      : &ROCEP_EP_KERNEL(rocep_combine_recv_epilogue))
               : (fp8 ? &ROCEP_EP_KERNEL(rocep_combine_recv_fp8) : &ROCEP_EP_KERNEL(rocep_combine_recv));
  return launch_kernel_threads(kernel, grid, expanded_combine_threads(grid), Residency::kBlockByBlock, stream,
                               group, args);
}

template <>
hipError_t EpKernels<kCompiledTransport>::launch_combine(const GroupView& group, const CombineArgs& args,
                                                         const LaunchGrid& grid, hipStream_t stream) {
  const bool epilogue = has_epilogue(args);
  if (group.shape.per_token != 0) {
    const bool fp8 = group.shape.combine_fp8 != 0;
    const auto kernel = epilogue ? (fp8 ? &ROCEP_EP_KERNEL(rocep_combine_per_token_epilogue_fp8)
                                        : &ROCEP_EP_KERNEL(rocep_combine_per_token_epilogue))
                                 : (fp8 ? &ROCEP_EP_KERNEL(rocep_combine_per_token_fp8)
                                        : &ROCEP_EP_KERNEL(rocep_combine_per_token));
    return launch_kernel<PerTokenTuning::kCombineThreads>(kernel, grid, Residency::kWholeGrid, stream, group,
                                                          args);
  }
  const bool fp8 = group.shape.combine_fp8 != 0;
  const auto kernel =
      epilogue
          ? (fp8 ? &ROCEP_EP_KERNEL(rocep_combine_epilogue_fp8) : &ROCEP_EP_KERNEL(rocep_combine_epilogue))
          : (fp8 ? &ROCEP_EP_KERNEL(rocep_combine_fp8) : &ROCEP_EP_KERNEL(rocep_combine));
  return launch_kernel_threads(kernel, grid, expanded_combine_threads(grid), Residency::kWholeGrid, stream,
                               group, args);
}

}  // namespace rocep::device
