// The CPU reference implementation of dispatch and combine: the definition every GPU kernel is tested
// against bit for bit, and the backend of EpGroup on machines without a GPU. Data moves between ranks with
// MPI_Alltoallv; every pointer is host memory.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "bootstrap.hpp"
#include "rocep/config.hpp"
#include "rocep/types.hpp"

namespace rocep::reference {

// Collective over `comm`: if any rank passes a non-empty `local_error`, every rank throws
// InvalidInputError (the failing rank with its own message, the others naming the first failing rank), so
// no rank is left waiting in the exchange that would have followed.
void agree_on_input_errors(MPI_Comm comm, const std::string& local_error, const char* operation);

// Empty when the format-dependent fields of `inputs` / `outputs` suit config.dispatch_format, else a message
// naming the rank and the field (both backends check with these).
std::string dispatch_format_input_error(const EpConfig& config, int rank, const DispatchInputs& inputs);
std::string dispatch_format_output_error(const EpConfig& config, int rank, const DispatchOutputs& outputs);
// EpGroup::dispatch_input_buffer: empty when config.dispatch_format has one (bf16), else the ConfigError's
// message; and empty unless `tokens` lies in [memory, memory + bytes), the group's own dispatch memory,
// anywhere but at `buffer`, the input buffer inside it.
std::string input_buffer_format_error(const EpConfig& config);
std::string misplaced_tokens_error(int rank, const void* tokens, const void* memory, std::size_t bytes,
                                   const void* buffer);

class ReferenceEp {
 public:
  // Collective. Throws ConfigError if config.validate(world size) fails. fp8_encoding kAuto means e4m3fn.
  ReferenceEp(MPI_Comm comm, const EpConfig& config);

  int rank() const { return bootstrap_.rank(); }
  int world_size() const { return bootstrap_.size(); }

  // See EpGroup for the contracts: host memory here, allocated on the first call.
  void* dispatch_input_buffer();
  // Collective; see EpGroup for the contracts.
  void dispatch_send(const DispatchInputs& inputs);
  void dispatch_recv(const DispatchOutputs& outputs);
  void combine_send(const CombineArgs& args);
  void combine_recv(const CombineArgs& args);

 private:
  // One token as it reached this rank, and the rows dispatch_recv expanded it into.
  struct ReceivedToken {
    int32_t token = 0;
    std::vector<int32_t> rows;  // [top_k]: row of slot k on this rank, -1 if slot k is elsewhere
  };

  MpiBootstrap bootstrap_;
  EpConfig config_;
  int local_experts_ = 0;

  std::vector<bf16_bits> input_buffer_;  // [max_tokens_per_rank][hidden] once asked for
  // dispatch_send -> dispatch_recv
  std::vector<std::vector<uint8_t>> received_messages_;
  bool dispatch_sent_ = false;
  // dispatch -> combine
  int sent_tokens_ = 0;
  std::vector<int32_t> sent_topk_ids_;                       // [sent_tokens_, top_k]
  std::vector<std::vector<ReceivedToken>> received_tokens_;  // per source rank, in arrival order
  bool dispatched_ = false;
  // combine_send -> combine_recv
  std::vector<std::vector<uint8_t>> combine_messages_;
  bool combine_sent_ = false;
};

}  // namespace rocep::reference
