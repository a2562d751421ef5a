// The combine receive of the per-token layout, and what it shares with the rest of hip/combine.hip: bf16
// vectors as float32 lanes and back, and the epilogues applied to combined values before their store. A
// header, so that a caller's build can compile the receive with its own epilogue
// (include/rocep/combine_epilogue.hpp); the library's kernels are in hip/combine.hip.
#pragma once

#include <cstddef>
#include <cstdint>

#include "bf16.hpp"
#include "ep_kernels.hpp"
#include "group_sync.hpp"
#include "vector_copy.hpp"

namespace rocep::device {

inline constexpr int kLanes = 8;  // bf16 elements per 16-byte vector

struct Lanes {
  float value[kLanes];
};

// A vector's eight bf16 as float32 and back: element 2i in the low half of 32-bit word i, 2i + 1 in its
// high half (both targets are little-endian). Worked on the words' bits: read through a uint16_t pointer
// into the vector, hipcc (clang 15) kept every staged vector in scratch memory and waited for each load
// before issuing the next.
__device__ inline void unpack_word(uint32_t word, float* pair) {
  pair[0] = bits_float(word << 16);  // rocep::bf16_to_float of each half
  pair[1] = bits_float(word & 0xffff0000u);
}

__device__ inline Lanes unpack(const Vector16& vector) {
  Lanes lanes;
  unpack_word(vector.x, lanes.value);
  unpack_word(vector.y, lanes.value + 2);
  unpack_word(vector.z, lanes.value + 4);
  unpack_word(vector.w, lanes.value + 6);
  return lanes;
}

// rocep::float_to_bf16 of both. NVIDIA sm_80 and later round a pair in one instruction, to nearest even as
// float_to_bf16 does, but store every NaN as 0x7fff where float_to_bf16 keeps the NaN's quieted bits: a
// pair holding a NaN takes float_to_bf16. The receive of 4096 tokens at 24 SMs is bound by its
// instructions (docs/performance.md), of which float_to_bf16 was about 9 per element.
__device__ inline uint32_t pack_word(const float* pair) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if (__builtin_expect(pair[0] == pair[0] && pair[1] == pair[1], 1)) {
    uint32_t packed;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(packed) : "f"(pair[1]), "f"(pair[0]));
    return packed;
  }
#endif
  return rocep::float_to_bf16(pair[0]) | static_cast<uint32_t>(rocep::float_to_bf16(pair[1])) << 16;
}

__device__ inline Vector16 pack(const Lanes& lanes) {
  return Vector16{pack_word(lanes.value), pack_word(lanes.value + 2), pack_word(lanes.value + 4),
                  pack_word(lanes.value + 6)};
}

// A partial row on its way to a peer, or a combined row without an epilogue: stored as summed.
// As the epilogues of a per-token receive (Epilogues below), one per token: none.
struct NoEpilogue {
  __device__ void apply(Lanes& /*values*/, int /*vector*/) const {}
  __device__ NoEpilogue row(int /*token*/, int /*vectors*/) const { return {}; }
};

// CombineArgs' epilogue on one combined row (include/rocep/types.hpp: the order), for token `token`.
struct RowEpilogue {
  float factor;               // applied when not 1
  const float* token_factor;  // applied when set
  const Vector16* residual;   // the token's residual row, added when set
  __device__ RowEpilogue(const rocep::device::CombineArgs& args, int token, int vectors)
      : factor(args.factor),
        token_factor(args.token_factors != nullptr ? args.token_factors + token : nullptr),
        residual(args.residual != nullptr ? reinterpret_cast<const Vector16*>(args.residual) +
                                                static_cast<std::size_t>(token) * vectors
                                          : nullptr) {}
  __device__ void apply(Lanes& values, int vector) const {
    if (factor != 1.0f) {
      for (int lane = 0; lane < kLanes; ++lane) {
        values.value[lane] *= factor;
      }
    }
    if (token_factor != nullptr) {
      const float by = *token_factor;
      for (int lane = 0; lane < kLanes; ++lane) {
        values.value[lane] *= by;
      }
    }
    if (residual != nullptr) {
      const Lanes added = unpack(residual[vector]);
      for (int lane = 0; lane < kLanes; ++lane) {
        values.value[lane] += added.value[lane];
      }
    }
  }
};

// CombineArgs' epilogue as the epilogues of a per-token receive: RowEpilogue for each token.
struct RowEpilogues {
  const CombineArgs& args;
  __device__ RowEpilogue row(int token, int vectors) const { return RowEpilogue(args, token, vectors); }
};

// A caller's elementwise epilogue (include/rocep/combine_epilogue.hpp) on one token's combined row: called
// with the token, the first of the vector's columns and its kLanes float32 values, which it changes in place.
template <typename Epilogue>
struct CallerRowEpilogue {
  const Epilogue* epilogue;
  int token;
  __device__ void apply(Lanes& values, int vector) const {
    (*epilogue)(token, vector * kLanes, values.value);
  }
};
template <typename Epilogue>
struct CallerEpilogues {
  const Epilogue& epilogue;
  __device__ CallerRowEpilogue<Epilogue> row(int token, int /*vectors*/) const { return {&epilogue, token}; }
};

// An input of the per-token receive that is an fp8 block-128 message (Shape::combine_fp8), not a bf16 row:
// its address (16-byte aligned) plus this.
inline constexpr uintptr_t kFp8Input = 1;

// sums += the eight codes of `words` (no NaN among them) as float16, each times `by` rounded once, then
// added as a bf16 row's values are (fmaf by 1). kHardware: NVIDIA sm_89 and later convert e4m3fn pairs to
// float16 of value decode(code) in one instruction; otherwise the codes' bits are moved
// (e4m3_pair_as_f16_bits) and `by` carries their factor.
template <bool kHardware>
__device__ inline void add_f16_pairs(Lanes& sums, const uint32_t (&words)[2], float by) {
#pragma unroll
  for (int pair = 0; pair < kLanes / 2; ++pair) {
    const uint32_t codes = words[pair / 2] >> (16 * (pair % 2));
    uint32_t halves = 0;
    if constexpr (kHardware) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
      asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(halves) : "h"(static_cast<uint16_t>(codes)));
#endif
    } else {
      halves = e4m3_pair_as_f16_bits(codes);
    }
    const float low = __fmul_rn(f16_as_float(halves & 0xffffu), by);
    const float high = __fmul_rn(f16_as_float(halves >> 16), by);
    sums.value[2 * pair] = fmaf(1.0f, low, sums.value[2 * pair]);
    sums.value[2 * pair + 1] = fmaf(1.0f, high, sums.value[2 * pair + 1]);
  }
}

// sums[i] += the values of vector vector0 + i * kStep (i < kVectors, below `end`) of the fp8 block-128
// message at `message` (payload, then a float32 scale per 128 elements), each decode(code) * scale rounded
// once, then added as a bf16 row's values are (fmaf by 1): the CPU reference's dequantize_row and sum. The
// codes go through float16 (add_f16_pairs); a vector holding a NaN code, which no sender writes, decodes
// one code at a time.
template <int kVectors, int kStep>
__device__ inline void add_fp8_row(Lanes (&sums)[kVectors], const uint8_t* message, const Shape& shape,
                                   int vector0, int end) {
  constexpr int kVectorsPerScale = 128 / kLanes;
  const auto* scales = reinterpret_cast<const float*>(message + shape.hidden);
  const Fp8 encoding = shape.fp8_encoding;
  uint2 codes[kVectors];
  float scale[kVectors];
#pragma unroll
  for (int i = 0; i < kVectors; ++i) {
    const int vector = vector0 + i * kStep;
    if (vector < end) {
      codes[i] = reinterpret_cast<const uint2*>(message)[vector];
      scale[i] = scales[vector / kVectorsPerScale];
    }
  }
  const float f16_factor = e4m3_f16_factor(encoding);
#pragma unroll
  for (int i = 0; i < kVectors; ++i) {
    if (vector0 + i * kStep >= end) {
      continue;
    }
    const uint32_t words[2] = {codes[i].x, codes[i].y};
    if (__builtin_expect(e4m3_word_has_nan(words[0], encoding) || e4m3_word_has_nan(words[1], encoding), 0)) {
#pragma unroll
      for (int value = 0; value < kLanes; ++value) {
        const auto code = static_cast<uint8_t>(words[value / 4] >> (8 * (value % 4)));
        // __fmul_rn: the product is rounded on its own, whatever the build's contraction of a * b + c.
        const float x = __fmul_rn(decode_fp8(code, encoding), scale[i]);
        sums[i].value[value] = fmaf(1.0f, x, sums[i].value[value]);
      }
      continue;
    }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    if (encoding == Fp8::kE4m3fn) {  // the hardware converts e4m3fn pairs to float16 exactly
      add_f16_pairs<true>(sums[i], words, scale[i]);
      continue;
    }
#endif
    add_f16_pairs<false>(sums[i], words, scale[i] * f16_factor);  // exact
  }
}

// Sums a piece of `count` tokens, token i from its input_counts[i] inputs inputs[i * lists + 0..] in list
// order (bf16 rows, or with kFp8 also fp8 block-128 messages tagged kFp8Input), in float32, and stores row i
// at out_row(i) with the epilogue epilogue_row(i) before each vector's store. Each row is summed by
// PerTokenTuning::kTokenThreads threads (whole waves, so that a wave's threads walk the same list), or a part
// of it by as many when the piece has fewer tokens than keep the block busy; each thread sums kSummedVectors
// vectors at once, one input after another (kSummedVectors loads in flight). Call from every thread, once
// the lists are written and the block has passed a barrier.
template <bool kFp8, typename OutRow, typename EpilogueRow>
__device__ inline void sum_piece(const Vector16* const* inputs, int lists, const int* input_counts, int count,
                                 const Shape& shape, const OutRow& out_row, const EpilogueRow& epilogue_row) {
  constexpr int kSummedVectors = kFp8 ? PerTokenTuning::kSummedFp8Vectors : PerTokenTuning::kSummedVectors;
  constexpr int kTokenThreads = PerTokenTuning::kTokenThreads;
  static_assert(PerTokenTuning::kCombineThreads % kTokenThreads == 0 && kTokenThreads % kWaveSize == 0,
                "a token's row is summed by whole waves of the block");
  constexpr int kTokensAtOnce = PerTokenTuning::kCombineThreads / kTokenThreads;
  const int vectors = shape.hidden / kLanes;
  int parts = 1;  // of each row, as many as keep the block's threads busy
  while (parts < kTokensAtOnce && count * parts * 2 <= kTokensAtOnce) {
    parts *= 2;
  }
  for (int unit = static_cast<int>(threadIdx.x) / kTokenThreads; unit < count * parts;
       unit += kTokensAtOnce) {
    const int in_piece = unit / parts;
    const int part = unit - in_piece * parts;
    const int listed = input_counts[in_piece];
    const Vector16* const* token_inputs = inputs + in_piece * lists;
    const int end = (part + 1) * vectors / parts;
    Vector16* const out = out_row(in_piece);
    for (int vector0 = part * vectors / parts + static_cast<int>(threadIdx.x) % kTokenThreads; vector0 < end;
         vector0 += kSummedVectors * kTokenThreads) {
      Lanes sums[kSummedVectors] = {};
      for (int input = 0; input < listed; ++input) {
        if constexpr (kFp8) {
          const auto tagged = reinterpret_cast<uintptr_t>(token_inputs[input]);
          if ((tagged & kFp8Input) != 0) {
            add_fp8_row<kSummedVectors, kTokenThreads>(
                sums, reinterpret_cast<const uint8_t*>(tagged - kFp8Input), shape, vector0, end);
            continue;
          }
        }
        const Vector16* row = token_inputs[input] + vector0;
        Vector16 loaded[kSummedVectors];
#pragma unroll
        for (int i = 0; i < kSummedVectors; ++i) {
          if (vector0 + i * kTokenThreads < end) {
            loaded[i] = row[i * kTokenThreads];
          }
        }
#pragma unroll
        for (int i = 0; i < kSummedVectors; ++i) {
          if (vector0 + i * kTokenThreads < end) {
            const Lanes y = unpack(loaded[i]);
            for (int value = 0; value < kLanes; ++value) {
              sums[i].value[value] = fmaf(1.0f, y.value[value], sums[i].value[value]);
            }
          }
        }
      }
#pragma unroll
      for (int i = 0; i < kSummedVectors; ++i) {
        const int vector = vector0 + i * kTokenThreads;
        if (vector < end) {
          epilogue_row(in_piece).apply(sums[i], vector);
          out[vector] = pack(sums[i]);
        }
      }
    }
  }
}

// The ranks whose rows of a token this rank's combine sums, from the token's destination ranks `ranks`:
// those ranks, or where nodes sum first (Shape::node_sums) those of this node and, for each other node
// among them, the rank there that summed that node's rows (the holder of this rank's messages there,
// PeerTransport::share_peers), in the place of its rank. Asked of the Shape alone, not of the compiled
// transport: a caller's build compiles this receive for IPC (<rocep/combine_epilogue.hpp>) and runs it in
// groups that span nodes too.
__device__ inline uint64_t summed_ranks(const GroupView& group, uint64_t ranks) {
  if (group.shape.node_sums == 0) {
    return ranks;
  }
  const PeerTransport& peers = group.peers;
  uint64_t summed = ranks & ~peers.shmem_peers;
  for (uint64_t holders = peers.share_peers; holders != 0; holders &= holders - 1) {
    const int holder = __ffsll(static_cast<long long>(holders)) - 1;
    if ((ranks & peers.node_ranks[holder]) != 0) {
      summed |= uint64_t{1} << holder;
    }
  }
  return summed;
}

// Waits for every rank's grid signal of combine `sequence`; with check_weighting, also reports a rank whose
// send was not per-token partials.
__device__ inline bool wait_for_rows(const GroupView& group, uint64_t sequence, bool check_weighting) {
  const Shape& shape = group.shape;
  const bool arrived =
      block_wait_for_peers(group.signals->combine_arrived, sequence, shape.world, group.timeout_ticks,
                           group.status, Operation::kCombineRecv, &group.peers);
  if (arrived && check_weighting && static_cast<int>(threadIdx.x) < shape.world) {
    const int32_t peer_weighted = group.signals->combine_weighted[threadIdx.x];
    if (peer_weighted != 1) {
      report_failure(group.status, StatusCode::kCombineWeightingMismatch, Operation::kCombineRecv,
                     static_cast<int>(threadIdx.x), -1, -1, peer_weighted);
    }
  }
  return arrived;
}

// Whether this rank's per-token combine leaves its rows where its peers load them: where the group's
// combines pull (Shape::pulled_combine) and the caller wrote the expert outputs into the combine input
// buffer (this rank's CombineRegion input rows, which the peers have mapped), unless the call is chunked
// (chunked_combine of the count this rank dispatched) on a grid of PerTokenTuning::kPushedBufferBlocks
// blocks or more: its rows are then pushed from the buffer as from any expert outputs. Each rank decides
// for its own call and tells its peers (Signals::combine_pulled).
__device__ inline bool rows_pulled(const GroupView& group, const rocep::device::CombineArgs& args) {
  return group.shape.pulled_combine != 0 &&
         reinterpret_cast<const uint8_t*>(args.expert_outputs) ==
             group.combine_region + CombineRegion::input_rows_offset(group.shape) &&
         !(static_cast<int>(gridDim.x) >= PerTokenTuning::kPushedBufferBlocks &&
           chunked_combine(group.shape, group.state->sent_tokens));
}

// Whether every other rank's rows of this rank's tokens are pulled from its combine input buffer
// (Signals::combine_pulled), once the calling block has acquired every other rank's flags or signal of this
// combine.
__device__ inline bool others_pulled(const GroupView& group) {
  const Shape& shape = group.shape;
  if (shape.pulled_combine == 0) {
    return false;
  }
  for (int peer = 0; peer < shape.world; ++peer) {
    if (peer != shape.rank && group.signals->combine_pulled[peer] == 0) {
      return false;
    }
  }
  return true;
}

// The tokens of one pass of receive_rows_per_token: `count` of them, token i at first + (i / run) * stride
// + i % run (runs of consecutive tokens, `stride` apart).
struct ReceivePass {
  int first;
  int run;
  int stride;
  int count;
  __device__ int token(int i) const { return first + i / run * stride + i % run; }
};

// The per-token receive, by receiver `receiver` of `receivers`: out[t] = the rows of t from every rank that
// received it, in ascending rank order (this rank's own from expert_outputs, the others' from the combine
// region, or loaded from the peer's combine input buffer where its send left them there:
// Signals::combine_pulled, read once its flag or signal is acquired), plus the shared expert, summed in
// float32 and rounded once. `chunked`: chunk by chunk of this rank's tokens (combine_chunk_tokens), each
// once every other rank flagged it for call `sequence`, chunks receiver, receiver + receivers, ...; else,
// once every rank's grid signalled, tokens receiver, receiver + receivers, ... . In passes of as many tokens
// as the block's lists hold (kListEntries entries, world + 1 per token): a pass's input lists are found
// first (a thread per token and rank), then its rows summed (sum_piece), its waves each taking tokens on
// their own, so that the lists' loads and the block's barriers come once a pass, not once a chunk. A
// chunked pass takes one chunk, or, where every other rank's rows are pulled (others_pulled: they flag
// every chunk at once), as many chunks as fit. Where nodes sum first (Shape::node_sums), another
// node's rows of a token are one, its summing rank's (summed_ranks). With Shape::combine_fp8 the other
// ranks' rows are fp8 block-128 messages, dequantised as they are summed (add_fp8_row): kFp8, kernels of
// their own, whose registers do not tax the bf16 receive. `epilogues.row(token, vectors)` (vectors of a row)
// applies to each of the token's summed vectors before its store (Epilogues: NoEpilogue, RowEpilogues or
// CallerEpilogues; each a kernel of its own, so that an epilogue's registers do not tax the plain receive).
template <bool kFp8, typename Epilogues>
__device__ void receive_rows_per_token(const GroupView& group, const rocep::device::CombineArgs& args,
                                       const Epilogues& epilogues, uint64_t sequence, int receiver,
                                       int receivers, bool chunked) {
  const Shape& shape = group.shape;
  constexpr int kListEntries = PerTokenTuning::kBatchTokens * (kMaxWorld + 1);
  const int vectors = shape.hidden / kLanes;
  const int tokens = group.state->sent_tokens;
  const int chunk_tokens = combine_chunk_tokens(shape, tokens);
  const int lists = shape.world + 1;
  const int pass_tokens = kListEntries / lists;  // at least kBatchTokens, and a chunk
  __shared__ const Vector16* inputs[kListEntries];
  __shared__ int input_counts[kListEntries / 2];
  __shared__ int listed_tokens[kListEntries / 2];  // [i]: the token of the pass's list i
  // A failed wait returns at once (reported; the block's next combine stays this one), rather than leave
  // a flag for after the passes: carried through the sums, it was spilled and reloaded at the end.
  if (!chunked && !wait_for_rows(group, sequence, receiver == 0)) {
    return;
  }
  int next = receiver;  // the receiver's next chunk (chunked), else the next pass's first token
  // Chunked: every other rank's rows are pulled, known after the first pass; until then, guessed from this
  // rank's own (a wrong guess only delays the first sums until the pass's chunks are all flagged).
  bool pulled = !kFp8 && rows_pulled(group, args);
  for (;;) {
    ReceivePass pass{};
    if (chunked) {
      pass = {next * chunk_tokens, chunk_tokens, receivers * chunk_tokens, 0};
      const int most_chunks = pulled ? pass_tokens / chunk_tokens : 1;
      for (int taken = 0; taken < most_chunks && next * chunk_tokens < tokens; ++taken) {
        if (!block_wait_for_peers(
                reinterpret_cast<const uint64_t*>(group.combine_region +
                                                  CombineRegion::chunk_flag_offset(shape, next, 0)),
                sequence, shape.world, group.timeout_ticks, group.status, Operation::kCombineRecv, nullptr,
                shape.rank)) {
          return;
        }
        pass.count = taken * chunk_tokens + min(chunk_tokens, tokens - next * chunk_tokens);
        next += receivers;
      }
      if (pass.count == 0) {
        break;
      }
    } else {
      pass = {next, 1, receivers, 0};
      if (pass.first >= tokens) {
        break;
      }
      pass.count = min(pass_tokens, (tokens - pass.first + receivers - 1) / receivers);
      next += pass_tokens * receivers;
    }
    // The pass's input lists, a thread per (token, rank), every load of a thread issued before any is
    // used: the token's destination ranks (its mask), and this rank's row of the token, or the peer's
    // pulled row with its word (read whether or not the peer pulls, from this rank's own combine region).
    // Each input goes to its place in rank order among the ranks the token went to.
    for (int slot = static_cast<int>(threadIdx.x); slot < pass.count * shape.world;
         slot += static_cast<int>(blockDim.x)) {
      const int in_pass = slot / shape.world;
      const int peer = slot - in_pass * shape.world;
      const int token = pass.token(in_pass);
      const uint64_t mask = summed_ranks(group, group.sent_masks[token]);
      const uint16_t* row = nullptr;
      if (peer == shape.rank) {
        row = args.expert_outputs +
              static_cast<std::size_t>(
                  group.token_rows[(static_cast<std::size_t>(shape.rank) * shape.max_tokens + token) *
                                   shape.top_k]) *
                  shape.hidden;
      } else {
        row = reinterpret_cast<const uint16_t*>(group.combine_region) +
              (static_cast<std::size_t>(peer) * shape.max_tokens + token) * shape.hidden;
        if (!kFp8 && shape.pulled_combine != 0) {
          const int32_t pulled_row = *reinterpret_cast<const int32_t*>(
              group.combine_region + CombineRegion::pulled_row_offset(shape, peer, token));
          if (group.signals->combine_pulled[peer] != 0) {  // the peer's row, in its combine input buffer
            row = reinterpret_cast<const uint16_t*>(group.peers.read_window(PeerRegion::kCombine, peer) +
                                                    CombineRegion::input_rows_offset(shape)) +
                  static_cast<std::size_t>(pulled_row) * shape.hidden;
          }
        }
      }
      const int ranks = __popcll(mask);
      const Vector16** token_inputs = inputs + in_pass * lists;
      if (((mask >> peer) & 1) != 0) {
        const uintptr_t fp8 = kFp8 && peer != shape.rank ? kFp8Input : 0;
        token_inputs[__popcll(mask & ((1ull << peer) - 1))] =
            reinterpret_cast<const Vector16*>(reinterpret_cast<uintptr_t>(row) + fp8);
      }
      if (peer == 0) {
        const bool shared_expert =
            args.shared_expert_output != nullptr && in_shared_expert_slice(shape, tokens, token);
        if (shared_expert) {
          token_inputs[ranks] = reinterpret_cast<const Vector16*>(
              args.shared_expert_output + static_cast<std::size_t>(token) * shape.hidden);
        }
        input_counts[in_pass] = ranks + (shared_expert ? 1 : 0);
        listed_tokens[in_pass] = token;
      }
    }
    pulled = chunked && !kFp8 && others_pulled(group);  // loaded beside the lists
    __syncthreads();
    sum_piece<kFp8>(
        inputs, lists, input_counts, pass.count, shape,
        [&](int in_pass) {
          return reinterpret_cast<Vector16*>(args.out + static_cast<std::size_t>(listed_tokens[in_pass]) *
                                                            args.out_row_stride);
        },
        [&](int in_pass) { return epilogues.row(listed_tokens[in_pass], vectors); });
    __syncthreads();  // the pass's lists are summed before the next pass's are written
  }
  if (chunked && receiver == 0 && !wait_for_rows(group, sequence, true)) {
    return;
  }
  if (threadIdx.x == 0) {
    group.block_calls[blockIdx.x].combines = sequence;  // the block's next combine is the one after
  }
}

// The split receive: every block receives, once every rank's grid signalled.
template <bool kFp8, typename Epilogues>
__device__ void receive_kernel_per_token(const GroupView& group, const rocep::device::CombineArgs& args,
                                         const Epilogues& epilogues) {
  const int block = static_cast<int>(blockIdx.x);
  receive_rows_per_token<kFp8>(group, args, epilogues, group.block_calls[block].combines + 1, block,
                               static_cast<int>(gridDim.x), false);
}

}  // namespace rocep::device
