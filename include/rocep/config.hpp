// EpConfig: the sizes and options of one expert-parallel group, fixed at group construction.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "formats.hpp"

namespace rocep {

// Element type of the expert outputs that combine reads and of the combined tokens it writes.
// What the partial rows of a combine carry across ranks. kFp8Block128: each partial row that crosses to
// another rank (a per-token combine's row, a weighted combine's per-rank sum, taken in float32 before any
// rounding) is quantised as fp8 block-128 tokens are (formats.hpp, in EpConfig::fp8_encoding), then
// dequantised (element * scale, float32) and summed at the owner; a rank's own partial stays bf16, as it
// never crosses. The unweighted expanded combine returns every slot's row in bf16 either way. Both backends
// implement it, bit for bit alike.
enum class CombineDtype : int32_t {
  kBf16 = 0,
  kFp8Block128 = 1,
};

const char* to_string(CombineDtype dtype);

// How dispatch lays out what a rank receives (DispatchOutputs says what each field holds in each).
enum class Layout : int32_t {
  // A row per (token, local expert) pair, grouped expert by expert: what a grouped GEMM reads directly.
  kExpanded = 0,
  // A row per received token, with its top-k ids mapped to local experts and its weights, plus the
  // grouping a fused-MoE kernel reads (sorted_token_ids, block_expert_ids): what vLLM's and SGLang's EP
  // backends consume. Writes each token once, however many local experts it names.
  kPerToken = 1,
};

const char* to_string(Layout layout);

// validate() states what every backend takes. The GPU backend takes less, refused at creation on every rank
// (ConfigError naming the step): at most 64 ranks, top_k at most 32, and at most 1024 experts per rank.
struct EpConfig {
  int hidden = 7168;              // elements per token
  int top_k = 8;                  // experts per token
  int num_experts = 256;          // experts over the whole group, split evenly over the ranks
  int max_tokens_per_rank = 128;  // upper bound on the tokens any rank passes to one call
  TokenFormat dispatch_format = TokenFormat::kBf16;
  Fp8Encoding fp8_encoding = Fp8Encoding::kAuto;  // for kFp8Block128 (SiLU takes SiluArgs::fp8_encoding)
  CombineDtype combine_dtype = CombineDtype::kBf16;
  // Ranks that share a node and reach each other by IPC; the others are reached through the SHMEM engine.
  // 0 = ROCEP_GPUS_PER_NODE from the environment where set, else detect.
  int gpus_per_node = 0;
  // The multiprocessors (SMs; CUs on AMD) that this rank's dispatch / combine kernels may occupy, so that
  // the experts' kernels keep the rest. kDefaultSms: the default share, 3/16 of the GPU's multiprocessors
  // rounded down (24 of an H100's or H200's 132 SMs, DeepEP's budget there; 57 of an MI300X's 304 CUs).
  // N >= 1: N of them; each kernel then runs one block per multiprocessor of the budget, which may take
  // most of that multiprocessor's registers (the hardware spreads a grid over idle multiprocessors first,
  // so more blocks would occupy more of them). kAllSms: the
  // kernels own every multiprocessor, and run every block that stays resident there (several per
  // multiprocessor: the fastest when nothing runs beside them). Either way all blocks are resident at once:
  // the grid is sized at creation from the kernels' occupancy, and on NVIDIA, below kAllSms, the kernels
  // that wait on their own grid are also launched cooperatively, so a grid that cannot be resident beside
  // what else runs fails at launch (GpuRuntimeError naming num_sms; the group is then unusable) instead of
  // spinning. Ranks that share a GPU (MPS) share its multiprocessors: each rank's budget is at most
  // multiprocessors / (ranks on that GPU) (kAllSms gives that, kDefaultSms the default share divided
  // likewise), and a larger N throws ConfigError at group creation. The CPU reference ignores it.
  static constexpr int kDefaultSms = 0;
  static constexpr int kAllSms = -1;
  int num_sms = kDefaultSms;
  Layout layout = Layout::kExpanded;
  // Expanded: each expert's rows padded to a multiple of this (padding rows invalid). Per-token: each
  // expert's segment of sorted_token_ids padded to a multiple of this: the block size (BLOCK_SIZE_M) of
  // the fused-MoE kernel that reads it.
  int expert_alignment = 1;
  double timeout_seconds = 10.0;  // bound on every device-side wait
  // Local-only mode (the specification's skip_a2a), for attention run tensor-parallel: every rank of an
  // all-reduce group holds the same tokens and runs only its own experts on them. Dispatch lays out, in the
  // group's layout, only the (token, expert) pairs of this rank's experts from this rank's own tokens, and
  // moves nothing across ranks; combine sums them here. The shared expert output is added only to this
  // rank's slice of the tokens: with A = allreduce_world_size and position p = rank % A, tokens
  // [T * p / A, T * (p + 1) / A) of the call's T, so that after the caller's all-reduce over the A ranks
  // each token carries the shared expert once. allreduce_world_size must divide the world size; it must be
  // 1 when local_only is false. Both backends implement it; on the GPU the ranks still exchange their calls'
  // arrival signals (a few words each), so every rank of the group makes every call, as in the other modes.
  bool local_only = false;
  int allreduce_world_size = 1;
  // Per-token layout with a bf16 combine: whether the group keeps a combine input buffer
  // (EpGroup::combine_input_buffer). Within one node that is world_size x max_tokens_per_rank rows of
  // `hidden` bf16 of the group's memory, allocated with the group (117 MB at 2 ranks x 4096 tokens x hidden
  // 7168), from which the peers load the rows; false saves that memory, and every combine then copies its
  // rows to the peers. Across nodes the buffer is memory the combine stages into anyway. No effect in the
  // other layouts and combine types, which have no buffer.
  bool combine_input_buffer = true;

  // Throws ConfigError naming the first offending field, its value and the allowed range. `world_size` is
  // the number of ranks of the group: num_experts must divide evenly among them.
  void validate(int world_size) const;

  // The sizes below throw ConfigError where validate(world_size) does.
  // Experts owned by each rank: num_experts / world_size.
  int num_local_experts(int world_size) const;
  // Upper bound on the rows dispatch can produce on one rank, whatever the routing:
  // world_size * max_tokens_per_rank * min(top_k, L) + L * (expert_alignment - 1). A token names each
  // expert at most once, so it yields at most min(top_k, L) rows on one rank.
  // Expanded: the rows to allocate. Per-token: the entries of sorted_token_ids to allocate (one per
  // (token, local expert) pair, plus the padding).
  std::size_t max_recv_rows(int world_size) const;
  // Per-token: the rows to allocate, one per token a rank can receive: world_size * max_tokens_per_rank.
  std::size_t max_recv_tokens(int world_size) const;

  std::string describe() const;  // one line, for logs and benchmark headers
};

}  // namespace rocep
