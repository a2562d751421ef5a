// Parameters and launchers of the dispatch and combine kernels. Host code fills the structs and calls the
// launchers; the kernels themselves live in dispatch.hip and combine.hip.
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>

#include "ep_params.hpp"
#include "platform.hpp"
#include "transport.hpp"

namespace rocep::device {

inline constexpr int kMaxTopK = 32;
inline constexpr int kBlockThreads = 256;
inline constexpr int kMaxLocalExperts =
    1024;  // the receiver keeps one row offset and one token mask per local expert in shared memory
// Chunks of all sources.
ROCEP_HOST_DEVICE inline int dispatch_chunks(const Shape& shape) {
  return shape.world * chunks_per_source(shape);
}

// A receive whose masks of the chunks that hold the call's tokens (DispatchRegion: one 64-bit word per
// chunk and local expert, the chunks of the most tokens any source sent) fit in kBlockRankingMasks is
// ranked by every block on its own, from a copy of the masks in its shared memory: no global counts and no
// grid barrier (performance-notes.md, perf-kern-20). A larger one takes the prefix over its chunks in a
// pass and a grid barrier (rank_chunks and finish_layout in hip/dispatch.hip).
inline constexpr int kBlockRankingMasks = 1024;  // 8 KB

// Whether every call of the group is ranked in each block, whatever its tokens.
ROCEP_HOST_DEVICE inline bool ranked_in_block(const Shape& shape) {
  return dispatch_chunks(shape) * shape.local_experts <= kBlockRankingMasks;
}

// A group whose calls may be too large to be ranked in each block may keep each token's scales in
// ReceivedScales and lay out every row's scales after the expansion, in whole 512-byte runs of 128 rows (a
// grid barrier and a pass over the rows). nvfp4 always does: each row storing its 4-byte groups into their
// tiles, 512 bytes apart, was slower. fp8 block-128's transposed scales (a 4-byte store per row and block,
// rows apart) do where a token fans out into 4 or more rows per rank on average, so that the receive is
// bound by the memory rather than the links; with fewer rows per token the pass costs more than it saves
// (performance-notes.md, perf-kern-15 and perf-kern-21).
ROCEP_HOST_DEVICE inline bool scales_laid_out_later(const Shape& shape) {
  const bool fans_out = shape.top_k >= 4 * shape.world;
  return (shape.format == Format::kNvfp4 || (shape.format == Format::kFp8Block128 && fans_out)) &&
         !ranked_in_block(shape);
}

// What every kernel of one group needs: who we are, where the peers' regions are, our own state.
struct GroupView {
  Shape shape;
  PeerTransport peers;       // the only way to the peers' regions and signals
  Signals* signals;          // this rank's Signals
  uint8_t* dispatch_region;  // this rank's DispatchRegion
  uint8_t* combine_region;   // this rank's CombineRegion
  LocalState* state;
  BlockCalls* block_calls;  // [blocks of every kernel of the group]
  Status* status;
  int32_t* token_rows;    // [world][T][top_k]: row of each received (source, token, k), -1 if none
  uint32_t* expert_rows;  // [local_experts]: rows each local expert received in the last dispatch
  // [world * ceil(T / kChunkTokens)][local_experts]: rows of each expert in the chunks of tokens before
  // each chunk (in (source, token) order), for receives whose prefix over chunks is taken in a pass
  uint32_t* chunk_rows;
  int32_t* sent_ids;         // [T][top_k]: the validated ids of this rank's last dispatch (-1 = none)
  uint64_t* sent_masks;      // [T]: destination ranks of each token of this rank's last dispatch
  uint8_t* received_scales;  // ReceivedScales, when scales_laid_out_later (else null)
  uint64_t timeout_ticks;
};

struct DispatchSendArgs {
  const uint8_t* tokens;        // [num_tokens][hidden] bf16 to quantise, else [num_tokens][payload_bytes]
  const uint8_t* token_scales;  // [num_tokens][scale_bytes] of already quantised tokens; null = quantise
  const float* global_scale;    // nvfp4 from bf16
  const int32_t* topk_ids;
  const float* topk_weights;
  int32_t num_tokens;
  const int32_t* num_tokens_on_device;  // overrides num_tokens when set
  bool tokens_in_place;                 // `tokens` is this rank's region's message area: nothing to stage
};

// Whether a dispatch send quantises its tokens: bf16 tokens staged into a scaled format.
ROCEP_HOST_DEVICE inline bool quantizes(const Shape& shape, const DispatchSendArgs& args) {
  return shape.format != Format::kBf16 && args.token_scales == nullptr && !args.tokens_in_place;
}

struct DispatchRecvArgs {
  uint8_t* recv_tokens;
  uint8_t* recv_scales;  // scaled formats: the tensor of scale_rows rows (formats.hpp layouts)
  uint64_t scale_rows;   // R = max_recv_rows
  uint32_t* row_offsets;
  int32_t* expert_ids;
  int32_t* src_info;  // [rows][3]: rank, token, k
  float* recv_weights;
  int64_t* expert_token_counts;  // optional
  // The per-token layout (rocep/types.hpp): recv_tokens and recv_scales are [world * T] rows, src_info too.
  int32_t* recv_topk_ids;     // [world * T][top_k]
  float* recv_topk_weights;   // [world * T][top_k]
  int32_t* num_recv_tokens;   // [1]
  int32_t* sorted_token_ids;  // [scale_rows]: (row, slot) pairs expert by expert, padded per expert
  int32_t* block_expert_ids;  // [scale_rows / alignment]
  // Expanded bf16 only, optional: [local_experts] input scales; recv_tokens rows are then `hidden` fp8
  // codes, each x / scale of the row's expert (rocep::DispatchOutputs::expert_input_scales)
  const float* expert_input_scales;
};

// How the per-token kernels keep bytes in flight, which is what a small SM budget needs. Each kernel runs one
// block per multiprocessor of the budget, of kDispatchThreads or kCombineThreads threads: more threads keep
// more loads in flight at once, within a register file that then gives each thread fewer registers. The
// dispatch send and the combine send copy kBatchTokens tokens a block at a time (their rows found first,
// then every vector of all of them loaded before any is stored, or kDispatchQuantizedSlices /
// kCombineQuantizedSlices slices of them loaded at a time where they are quantised), the dispatch receive a
// token a group of threads at a time, each group on its own; each thread keeps kVectorsInFlight (dispatch) or
// kCombineVectorsInFlight (the combine send) 16-byte vectors in flight; the combine receive sums each token's
// row by kTokenThreads threads, kSummedVectors vectors per thread at once (kSummedFp8Vectors where the rows
// cross in fp8, within the 64 registers of a 1024-thread block), one input after another (two inputs at once
// measured no faster: docs/performance.md). Where every rank's grid has kCombineSplitBlocks blocks or more, a
// fused combine of a chunked call (chunked_combine) splits them: kCombineSenderPercent of them send and the
// rest receive (hip/combine.hip), kCombineSenderPercentFp8 where the rows cross in fp8,
// kCombineSenderPercentOverShmem where the group has SHMEM peers (whose puts take the senders'
// multiprocessors over NVLink; kCombineSenderPercentOverShmemStaged where the caller wrote its rows into the
// staging rows, so that the senders only put); its chunks hold up to kCombineChunkTokens tokens, or
// kFineCombineChunkTokens where every rank's grid has kFineCombineChunkBlocks blocks or more: the last
// chunk's sums, after the last flag, are then shorter, while the extra waits and lists are shared by many
// receivers (combine_chunk_tokens); on grids of kPushedBufferBlocks blocks or more a chunked combine pushes
// its rows from the combine input buffer rather than leave them to be pulled (rows_pulled). One set for
// every architecture until one is measured to want another (docs/performance.md, per-token layout).
struct PerTokenTuning {
  static constexpr int kDispatchThreads = 512;
  static constexpr int kBatchTokens = 32;
  static constexpr int kVectorsInFlight = 16;  // the dispatch kernels' copies
  static constexpr int kCombineThreads = 1024;
  static constexpr int kCombineVectorsInFlight = 8;  // the combine send's copies
  // A multiple of the wave size that divides kCombineThreads. One wave: a row of hidden 7168 (896 vectors) is
  // then 7 rounds of kSummedVectors on NVIDIA with none part-filled, where 128 threads left a round 3/4 full.
  static constexpr int kTokenThreads = kWaveSize;
  static constexpr int kSummedVectors = 4;
  static constexpr int kSummedFp8Vectors = 2;
  // Slices of 16 elements (32 bytes of bf16) a block loads before it quantises any
  // (quantize_rows_to_messages): two a thread in the dispatch send, two in the combine send.
  static constexpr int kDispatchQuantizedSlices = 1024;
  static constexpr int kCombineQuantizedSlices = 2048;
  static constexpr int kCombineSplitBlocks = 16;
  static constexpr int kCombineSenderPercent = 42;
  static constexpr int kCombineSenderPercentFp8 = 36;  // rows crossing in fp8: quantised by the senders
  static constexpr int kCombineSenderPercentOverShmem = 60;
  static constexpr int kCombineSenderPercentOverShmemStaged = 48;  // the caller's rows already staged
  static constexpr int kCombineChunkTokens = 32;
  static constexpr int kFineCombineChunkTokens = 16;
  static constexpr int kFineCombineChunkBlocks = 48;
  static constexpr int kPushedBufferBlocks = 96;
  // The most tokens of a chunked combine's chunk (Shape::combine_chunk_tokens) in a group whose smallest
  // grid has `blocks` blocks.
  static constexpr int combine_chunk_tokens(int blocks) {
    return blocks >= kFineCombineChunkBlocks ? kFineCombineChunkTokens : kCombineChunkTokens;
  }
};
static_assert(PerTokenTuning::kCombineChunkTokens <= kMaxCombineChunkTokens &&
                  PerTokenTuning::kFineCombineChunkTokens <= kMaxCombineChunkTokens,
              "a chunk holds at most kMaxCombineChunkTokens tokens");

// The consecutive tokens a block takes at a time where `blocks` blocks share `tokens`: up to
// PerTokenTuning::kBatchTokens, fewer when the tokens are few, so that every block gets some.
ROCEP_HOST_DEVICE inline int tokens_per_run(int tokens, int blocks) {
  const int even = (tokens + blocks - 1) / blocks;
  return even < 1 ? 1 : (even < PerTokenTuning::kBatchTokens ? even : PerTokenTuning::kBatchTokens);
}

struct CombineArgs {
  const uint16_t* expert_outputs;  // bf16 [rows][hidden]
  const float* row_weights;        // null = unweighted
  const uint16_t* shared_expert_output;
  uint16_t* out;
  // The reduced combine's epilogue (rocep::CombineArgs in include/rocep/types.hpp has its order).
  float factor;
  const float* token_factors;  // [tokens] or null
  const uint16_t* residual;    // bf16 [tokens][hidden] or null
  uint32_t
      out_row_stride;  // elements between out rows of a reduced combine (hidden or more, a multiple of 8)
};

// Whether a reduced combine's values pass through an epilogue before their store (the out row stride aside):
// such a combine runs kernels of their own (`_epilogue`), so that the registers the epilogue takes do not
// tax the plain ones.
ROCEP_HOST_DEVICE inline bool has_epilogue(const CombineArgs& args) {
  return args.factor != 1.0f || args.token_factors != nullptr || args.residual != nullptr;
}

// The residency of the expanded layout's kernels, by which the group's grid is sized
// (tests/check_registers.py): 3 blocks of kBlockThreads per multiprocessor on NVIDIA (at most 80 registers
// a thread) and, read by HIP as waves per SIMD, 3 wave64 waves per SIMD on AMD: the same 3 blocks of 256
// threads per compute unit. The second launch bound of the fused dispatch kernels, which the compiler would
// otherwise give more registers; the combine's kernels take kExpandedWideThreads as their launch bound,
// which holds them to the same registers (one block of that size per multiprocessor or compute unit). The
// wide dispatch kernels, launched only on a budget's grid (LaunchGrid::wide), hold one block of
// kBlockThreads per multiprocessor and take its registers.
inline constexpr int kExpandedBlocksPerSm = 3;

// The expanded layout's combine kernels are written for any block size up to kExpandedWideThreads, the
// threads kExpandedBlocksPerSm blocks hold on one multiprocessor. On a grid of one block per multiprocessor
// of a budget (LaunchGrid::wide) their blocks have that many threads, so that the budget's multiprocessors
// hold as many loads in flight as they do with every resident block; on the grid of kAllSms, blocks of
// kBlockThreads.
inline constexpr int kExpandedWideThreads = kBlockThreads * kExpandedBlocksPerSm;

// Loads every dispatch / combine kernel now. With lazy loading, a kernel's first launch waits for the device
// to idle, which a spinning receive kernel of the same process can prevent forever; loading them all when
// the group is created rules that out. Also lowers *resident_blocks to the fewest blocks (of `threads`, the
// kernels' block size) that any of them keeps resident on one multiprocessor: kernels that wait on other
// blocks of their own grid (a grid barrier, or the wait for their own send's signal) need the whole grid
// resident at once. Returns the runtime's status.
inline hipError_t load_kernels(std::initializer_list<const void*> kernels, int* resident_blocks,
                               int threads = kBlockThreads) {
  for (const void* kernel : kernels) {
    hipFuncAttributes attributes;
    hipError_t status = hipFuncGetAttributes(&attributes, kernel);
    int blocks = 0;
    if (status == hipSuccess) {
      status = hipOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, 0);
    }
    if (status != hipSuccess) {
      return status;
    }
    *resident_blocks = std::min(*resident_blocks, blocks);
  }
  return hipSuccess;
}

// The grid of every kernel of one group (the host's CommPolicy decides it).
struct LaunchGrid {
  int blocks;  // one per multiprocessor of the budget (more for kAllSms, all resident), of any kernel's size
  bool cooperative;  // launch the kernels that need their whole grid resident cooperatively
  bool wide;         // one block per multiprocessor (not kAllSms): kernels of any block size take wide blocks
};

// What a kernel needs of its grid: kWholeGrid for a kernel whose blocks wait on other blocks of the same
// grid (a grid barrier, or a fused call's wait for its own send's signal), which would spin forever on a
// block that never got a multiprocessor.
enum class Residency { kBlockByBlock, kWholeGrid };

template <typename T>
struct NotDeduced {
  using type = T;
};

// Launches `kernel` on grid.blocks blocks of kThreads (the kernel's launch bound) with `params`, converted to
// the kernel's own parameter types. A kWholeGrid kernel of a cooperative grid is launched cooperatively: the
// runtime starts it only with every block resident, and refuses a grid that cannot be
// (hipErrorCooperativeLaunchTooLarge). Returns the runtime's status of the launch. launch_kernel_threads
// takes blocks of `threads` chosen at run time, for kernels written for any block size up to their launch
// bound.
template <typename... Params>
hipError_t launch_kernel_threads(void (*kernel)(Params...), const LaunchGrid& grid, int threads,
                                 Residency residency, hipStream_t stream,
                                 typename NotDeduced<Params>::type... params) {
  void* arguments[] = {static_cast<void*>(&params)...};
  const auto* function = reinterpret_cast<const void*>(kernel);
  if (grid.cooperative && residency == Residency::kWholeGrid) {
    return hipLaunchCooperativeKernel(function, dim3(grid.blocks), dim3(threads), arguments, 0, stream);
  }
  return hipLaunchKernel(function, dim3(grid.blocks), dim3(threads), arguments, 0, stream);
}

template <int kThreads = kBlockThreads, typename... Params>
hipError_t launch_kernel(void (*kernel)(Params...), const LaunchGrid& grid, Residency residency,
                         hipStream_t stream, typename NotDeduced<Params>::type... params) {
  return launch_kernel_threads(kernel, grid, kThreads, residency, stream, params...);
}

// How a group's kernels reach its peers (hip/transport.hpp): kIpc, every peer on this node; kShmem, some
// on other nodes, through the SHMEM engine.
enum class Transport { kIpc, kShmem };

// The dispatch and combine kernels of one transport. hip/dispatch.hip and hip/combine.hip are compiled once
// for kIpc into the library, and in builds with an engine once more for kShmem (ROCEP_SHMEM_KERNELS:
// relocatable device code, the engine's calls, kernels named with ROCEP_EP_KERNEL), so that neither the
// engine's code nor the relocatable build touches the kernels of a group within one node.
template <Transport kTransport>
struct EpKernels {
  // The kernels of both layouts are loaded; *resident_blocks counts those of the group's (`per_token`).
  static hipError_t load_dispatch_kernels(bool per_token, int* resident_blocks);
  static hipError_t load_combine_kernels(bool per_token, int* resident_blocks);
  // Each launcher returns the runtime's status of its launch.
  static hipError_t launch_dispatch_send(const GroupView& group, const DispatchSendArgs& args,
                                         const LaunchGrid& grid, hipStream_t stream);
  static hipError_t launch_dispatch_recv(const GroupView& group, const DispatchRecvArgs& args,
                                         const LaunchGrid& grid, hipStream_t stream);
  // The fused calls run both halves in one kernel.
  static hipError_t launch_dispatch(const GroupView& group, const DispatchSendArgs& send_args,
                                    const DispatchRecvArgs& recv_args, const LaunchGrid& grid,
                                    hipStream_t stream);
  static hipError_t launch_combine(const GroupView& group, const CombineArgs& args, const LaunchGrid& grid,
                                   hipStream_t stream);
  static hipError_t launch_combine_send(const GroupView& group, const CombineArgs& args,
                                        const LaunchGrid& grid, hipStream_t stream);
  static hipError_t launch_combine_recv(const GroupView& group, const CombineArgs& args,
                                        const LaunchGrid& grid, hipStream_t stream);
};

// The transport this compilation of the kernels serves, and the names of its kernels (extern "C", so the
// two compilations' must differ).
#if defined(ROCEP_SHMEM_KERNELS)
inline constexpr Transport kCompiledTransport = Transport::kShmem;
#define ROCEP_EP_KERNEL(name) name##_over_shmem
#else
inline constexpr Transport kCompiledTransport = Transport::kIpc;
#define ROCEP_EP_KERNEL(name) name
#endif

// Whether the group's per-token combine sums each node's rows of a token on that node first
// (Shape::node_sums): only groups that span nodes, so the kernels compiled for IPC leave that code out.
ROCEP_HOST_DEVICE inline bool combine_sums_nodes(const Shape& shape) {
  return kCompiledTransport == Transport::kShmem && shape.node_sums != 0;
}

}  // namespace rocep::device
