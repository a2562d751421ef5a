// The CPU reference implementation of dispatch and combine: the definition every GPU kernel is tested
// against bit for bit, and the backend of EpGroup on machines without a GPU. Data moves between ranks
// through the group's Bootstrap (an all-gather of the messages); every pointer is host memory.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "backend.hpp"
#include "hip/ep_params.hpp"
#include "node.hpp"
#include "rocep/bootstrap.hpp"
#include "rocep/config.hpp"
#include "rocep/types.hpp"

namespace rocep::reference {

// An expert id outside [-1, num_experts) or named twice by one token: that slot is not dispatched, and the
// first such slot (in token, then slot order) is recorded, as the GPU kernels do. Mixed weighted and
// unweighted combines are recorded by every rank that receives from a rank that differs; its out is then
// not written.
class ReferenceEp final : public EpBackend {
 public:
  // Collective over `bootstrap`, which must outlive the backend. Throws ConfigError if
  // config.validate(world size) fails. fp8_encoding kAuto means e4m3fn.
  ReferenceEp(Bootstrap& bootstrap, const EpConfig& config);

  int rank() const { return bootstrap_.rank(); }
  int world_size() const { return bootstrap_.size(); }

  std::size_t memory_bytes() const override { return 0; }  // only transient host vectors
  // Host memory here, allocated on the first call.
  void* dispatch_input_buffer() override;
  contract::OwnMemory dispatch_memory() const override;
  void* combine_input_buffer() override;
  contract::OwnMemory combine_memory() const override;
  // Collective; see EpGroup for the contracts. `stream` is ignored.
  void dispatch_send(const DispatchInputs& inputs, void* stream) override;
  void dispatch_recv(const DispatchOutputs& outputs, void* stream) override;
  void combine_send(const CombineArgs& args, void* stream) override;
  void combine_recv(const CombineArgs& args, void* stream) override;
  RecordedError poll_error() override;
  RecordedError synchronize(void* stream) override;
  bool broken() const override { return false; }  // nothing here waits, so nothing times out

 private:
  // One token as it reached this rank, and the rows dispatch_recv laid it out in.
  struct ReceivedToken {
    int32_t token = 0;
    std::vector<int32_t> rows;  // expanded [top_k]: row of slot k on this rank, -1 if slot k is elsewhere
    int32_t token_row = -1;     // per-token: the token's row
  };
  // One message of a dispatch as received: per source rank, in the order sent (ascending token).
  struct Arrival {
    int32_t token;
    std::vector<int32_t> ids;  // [top_k]: the ids that concern this rank, -1 elsewhere
    std::vector<float> weights;
    const uint8_t* payload;  // then the scales, row-major
  };
  std::vector<std::vector<Arrival>> decode_arrivals() const;
  // Whether combine sends one partial row per (token, rank): weighted, or the per-token layout.
  bool sends_partials(const CombineArgs& args) const {
    return args.row_weights != nullptr || config_.layout == Layout::kPerToken;
  }
  void lay_out_expanded(const std::vector<std::vector<Arrival>>& arrivals, const DispatchOutputs& outputs);
  void lay_out_per_token(const std::vector<std::vector<Arrival>>& arrivals, const DispatchOutputs& outputs);
  // Whether the shared expert output is added to `token` of the call: always, except in local-only mode,
  // where only this rank's slice of the tokens gets it (EpConfig::local_only).
  bool in_shared_expert_slice(int token) const;
  // Whether the combine partials between this rank and `peer` (either way) cross in fp8
  // (EpConfig::combine_dtype): every partial between two ranks; a rank's own stays bf16.
  bool crosses_in_fp8(int peer) const {
    return config_.combine_dtype == CombineDtype::kFp8Block128 && peer != rank();
  }
  // Bytes of a partial row that crosses in fp8 block-128 (payload, then scales); 0 where none does.
  std::size_t fp8_partial_bytes() const {
    return config_.combine_dtype == CombineDtype::kFp8Block128
               ? format_payload_bytes(TokenFormat::kFp8Block128, config_.hidden) +
                     format_scale_bytes(TokenFormat::kFp8Block128, config_.hidden)
               : 0;
  }

  // out[t] of a partial combine's rows of token t: rows[r] (float32 values of a bf16 row) for every rank r
  // with has_row[r], summed in float32 in ascending rank order into `sum`; where nodes sum first
  // (sums_nodes), another node's rows are first summed in float32 in ascending rank order and rounded to
  // bf16, and that node sum is added in the place of the rank there that holds this rank's messages.
  void sum_partials(const std::vector<std::vector<float>>& rows, const std::vector<char>& has_row,
                    std::vector<float>& sum) const;

  // Records a failure unless one is recorded already (the first is the cause).
  void record(device::StatusCode code, device::Operation operation, int peer, int token, int slot, int value);

  Bootstrap& bootstrap_;
  EpConfig config_;
  NodeLayout layout_;        // which ranks share a node (EpConfig::gpus_per_node, else the host identities)
  bool sums_nodes_ = false;  // the per-token combine sums each node's rows first (sums_nodes)
  int local_experts_ = 0;
  device::Status status_{};
  std::mutex status_lock_;  // status_ is read by poll_error from any thread, also during a call

  std::vector<uint8_t> input_buffer_;  // [max_tokens_per_rank][format_input_row_bytes] once asked for
  std::vector<bf16_bits> combine_input_buffer_;  // [world x max_tokens_per_rank][hidden] once asked for
  // dispatch_send -> dispatch_recv
  std::vector<std::vector<uint8_t>> received_messages_;
  // dispatch -> combine
  int sent_tokens_ = 0;
  std::vector<int32_t> sent_topk_ids_;                       // [sent_tokens_, top_k]
  std::vector<std::vector<ReceivedToken>> received_tokens_;  // per source rank, in arrival order
  // combine_send -> combine_recv
  std::vector<std::vector<uint8_t>> combine_messages_;
};

}  // namespace rocep::reference
