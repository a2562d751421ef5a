// Plain argument structs of dispatch and combine. Every pointer is device memory on the GPU backend and host
// memory on the CPU reference backend; shapes are given in elements.
#pragma once

#include <cstddef>
#include <cstdint>

namespace rocep {

// bf16 values travel as their raw 16-bit pattern.
using bf16_bits = uint16_t;

// Origin of one dispatched row. Padding rows (expert_alignment) have rank = token = k = -1.
struct SrcInfo {
  int32_t rank;   // source rank of the token
  int32_t token;  // index of the token on its source rank
  int32_t k;      // top-k slot of the (token, expert) pair on the source rank
};

// What one rank hands to dispatch.
struct DispatchInputs {
  // [num_tokens, hidden] bf16 when token_scales is null: quantised to EpConfig::dispatch_format inside
  // dispatch. Otherwise the tokens arrive already quantised: [num_tokens, format_payload_bytes] in the
  // dispatch format, and they travel as they are. Or EpGroup::dispatch_input_buffer(), with token_scales
  // null: the tokens written there, in any format (scaled ones already quantised, with their scales).
  const void* tokens = nullptr;
  // [num_tokens, top_k] expert ids in [-1, num_experts); -1 = no expert for that slot. A token names each
  // expert at most once.
  const int32_t* topk_ids = nullptr;
  // [num_tokens, top_k] router weights.
  const float* topk_weights = nullptr;
  // Tokens on this rank, 0 <= num_tokens <= max_tokens_per_rank.
  int num_tokens = 0;
  // Optional: when set, the token count is read from here (device memory on the GPU backend) instead of
  // num_tokens, so a captured graph can be replayed with a different count.
  const int32_t* num_tokens_on_device = nullptr;
  // Scaled formats only, optional: the scales of already quantised tokens, row-major per token
  // ([num_tokens, format_scale_bytes]: float32 for fp8 block-128, e8m0 for MX, e4m3fn for nvfp4).
  const void* token_scales = nullptr;
  // nvfp4 from bf16 only (ignored by every other dispatch): one float32, the global scale the tokens are
  // quantised with (device memory on the GPU backend). Every rank must pass the same value: the receiver's
  // GEMM applies one per tensor.
  const float* global_scale = nullptr;
};

// Where dispatch writes on the receiving rank. Sizes use R = EpConfig::max_recv_rows(world_size),
// P = EpConfig::max_recv_tokens(world_size) and L = EpConfig::num_local_experts(world_size).
//
// Expanded layout (EpConfig::layout = kExpanded): a row per (token, local expert) pair. Row order: expert
// by expert (local expert 0 first); inside one expert by source rank, then source token, then k. Expert
// e's rows are [row_offsets[e], row_offsets[e+1]); with expert_alignment > 1 each expert's segment ends
// with zeroed padding rows whose src_info is {-1, -1, -1} and whose weight is 0. Fields: recv_tokens,
// row_offsets, expert_ids, src_info, recv_weights, recv_scales (scaled formats), expert_token_counts.
//
// Per-token layout (kPerToken): a row per received token, in source rank order, then source token order;
// *num_recv_tokens rows are valid. A row holds the payload (recv_tokens, [P, format_payload_bytes]), its
// scales (recv_scales, [P, format_scale_bytes] row-major, as DispatchInputs::token_scales), its top-k ids
// mapped to this rank's experts (recv_topk_ids [P, top_k]: the local expert, -1 for a slot of another
// rank or none), the token's router weights (recv_topk_weights [P, top_k], every slot) and its origin
// (src_info [P], k = -1). For a fused-MoE kernel that gathers rows by sorted ids (vLLM's and aiter's
// moe_align_block_size outputs): sorted_token_ids [R] holds, expert by expert and in row order inside an
// expert, row * top_k + k for each (row, slot) whose id is local expert e, each expert's segment padded to
// a multiple of expert_alignment with P * top_k (so every padding entry is >= the entries of
// recv_topk_ids); row_offsets [L + 1] are the segments' starts and row_offsets[L] the padded total
// (num_tokens_post_padded); block_expert_ids [R / expert_alignment] is the local expert of each block of
// expert_alignment entries. Entries past row_offsets[L] are not written. expert_token_counts (optional)
// adds each expert's (row, slot) pairs. expert_ids and recv_weights are not used.
struct DispatchOutputs {
  void* recv_tokens = nullptr;      // expanded [R, ...], per-token [P, format_payload_bytes]
  uint32_t* row_offsets = nullptr;  // [L + 1]
  int32_t* expert_ids = nullptr;    // expanded [L]: local expert of each group (identity)
  SrcInfo* src_info = nullptr;      // expanded [R], per-token [P]
  float* recv_weights = nullptr;    // expanded [R]: router weight of the row's (token, expert) pair
  // Optional [L]: every call adds the (token, expert) pairs each local expert received (padding excluded).
  int64_t* expert_token_counts = nullptr;
  // Scaled formats. Expanded: format_scale_tensor_bytes(format, R, hidden) bytes in the layout
  // formats.hpp gives (fp8 block-128 transposed [hidden/128][R] float32, MX [R][hidden/32], nvfp4 swizzled
  // tiles); padding rows get payload and scales 0. Per-token: [P, format_scale_bytes] row-major.
  void* recv_scales = nullptr;
  // Per-token layout only (see above).
  int32_t* recv_topk_ids = nullptr;     // [P, top_k]
  float* recv_topk_weights = nullptr;   // [P, top_k]
  int32_t* num_recv_tokens = nullptr;   // [1]
  int32_t* sorted_token_ids = nullptr;  // [R]
  int32_t* block_expert_ids = nullptr;  // [R / expert_alignment]
  // Expanded layout with dispatch_format bf16 only, optional: one float32 input scale per local expert
  // ([L]), as experts with static fp8 input scales take. When set, the receiving rank quantises each row
  // with its expert's scale s and recv_tokens holds fp8 codes in EpConfig::fp8_encoding, [R, hidden] bytes:
  // code = fp8(x / s) for each element x (IEEE division, rounded to nearest even, saturating to the
  // encoding's largest finite value, NaN kept); padding rows are zero bytes. The per-token layout refuses
  // it: its row serves every local expert of its token, whose scales differ, so a fused-MoE kernel applies
  // them itself (the rows stay bf16). On the GPU a kernel of its own writes the codes after the receive, on
  // the same stream (rocep_dispatch_input_scales).
  const float* expert_input_scales = nullptr;
};

// What combine reads and writes on every rank.
struct CombineArgs {
  // Expanded: [R, hidden] bf16, one expert output row per dispatched row, in the order dispatch produced
  // them. Per-token: [P, hidden] bf16, one row per received token (its local experts' outputs already
  // weighted and summed by the caller); out[t] = the rows of t from every rank that received it, summed in
  // float32 in ascending rank order (+ the shared expert), rounded to bf16 once. Across nodes (a SHMEM
  // engine) each other node's rows are first summed there and rounded to bf16 (node sums,
  // docs/scale-out.md): the bits then depend on how the ranks are placed in nodes.
  const void* expert_outputs = nullptr;
  // Expanded only (null in the per-token layout): [R] weight of each dispatched row, normally
  // DispatchOutputs::recv_weights of the matching dispatch.
  // Set: out[t] = sum_k w[t,k] * y[t,k], out is [num_tokens, hidden].
  // Null: the rows come back unreduced, out is [num_tokens, top_k, hidden]; slots with id -1 are zero.
  const float* row_weights = nullptr;
  // Optional [num_tokens, hidden] bf16 added (in float32) to the weighted sum before the store (a reduced
  // combine only: the unweighted expanded combine refuses it).
  const void* shared_expert_output = nullptr;
  // Where the combined tokens go; num_tokens is that of the matching dispatch.
  void* out = nullptr;

  // The epilogue of a reduced combine (the per-token layout, or the expanded one with row_weights; the
  // unweighted combine refuses it). On each combined float32 value v of token t and element h (the shared
  // expert included), in this order, each operation rounded on its own:
  //   v = v * factor               when factor != 1
  //   v = v * token_factors[t]     when token_factors is set: [num_tokens] float32
  //   v = v + residual[t][h]       when residual is set: [num_tokens, hidden] bf16, rows hidden apart
  //                                (refused in local-only mode with allreduce_world_size > 1: every rank
  //                                would add it, the caller's all-reduce then sums it that many times)
  // then v is rounded to bf16 once and stored at out + t * out_row_stride + h, in elements. out_row_stride 0
  // means hidden; a larger one (a multiple of 8 up to 2^31: rows stay 16-byte aligned) writes into a slice of
  // a wider row-major tensor, e.g. the first hidden columns of [num_tokens, 2 * hidden].
  float factor = 1.0f;
  const float* token_factors = nullptr;
  const void* residual = nullptr;
  std::size_t out_row_stride = 0;
};

}  // namespace rocep
