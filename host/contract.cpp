#include "contract.hpp"

#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <vector>

namespace rocep::contract {

namespace {

using device::StatusCode;

// The half of a call that recorded an error on the device, by a name that reads for the fused call and for
// the split one alike.
const char* operation_name(int32_t operation) {
  switch (static_cast<device::Operation>(operation)) {
    case device::Operation::kDispatchSend:
      return "dispatch_send (the send half of dispatch)";
    case device::Operation::kDispatchRecv:
      return "dispatch_recv (the receive half of dispatch)";
    case device::Operation::kCombineSend:
      return "combine_send (the send half of combine)";
    case device::Operation::kCombineRecv:
      return "combine_recv (the receive half of combine)";
    case device::Operation::kNone:
      break;
  }
  return "unknown operation";
}

std::string on_rank(const char* operation, int rank) {
  return std::string(operation) + ": rank " + std::to_string(rank);
}

// A pointer argument of a call, by the name the user sees.
struct PointerArgument {
  const char* name;
  const void* pointer;
};

// " passed a null x pointer" or " passed null x, y and z pointers", naming the arguments of `arguments`
// that are null; empty when none is.
std::string null_arguments(std::initializer_list<PointerArgument> arguments) {
  std::vector<const char*> null;
  for (const PointerArgument& argument : arguments) {
    if (argument.pointer == nullptr) {
      null.push_back(argument.name);
    }
  }
  if (null.empty()) {
    return {};
  }
  if (null.size() == 1) {
    return std::string(" passed a null ") + null[0] + " pointer";
  }
  std::string names;
  for (std::size_t i = 0; i < null.size(); ++i) {
    names += (i == 0 ? "" : i + 1 == null.size() ? " and " : ", ") + std::string(null[i]);
  }
  return " passed null " + names + " pointers";
}

// Whether `args` carries a built-in epilogue's values (factor, token_factors, residual); out_row_stride,
// which only places the rows, aside.
bool has_epilogue_values(const CombineArgs& args) {
  return args.factor != 1.0f || args.token_factors != nullptr || args.residual != nullptr;
}

// Whether `pointer` lies inside `memory` but not at its input buffer.
bool misplaced(const void* pointer, const OwnMemory& memory) {
  const auto address = reinterpret_cast<std::uintptr_t>(pointer);
  const auto first = reinterpret_cast<std::uintptr_t>(memory.first);
  return pointer != nullptr && pointer != memory.input_buffer && memory.first != nullptr &&
         address >= first && address - first < memory.bytes;
}

}  // namespace

const char* to_string(Call call) {
  switch (call) {
    case Call::kDispatch:
      return "dispatch";
    case Call::kDispatchSend:
      return "dispatch_send";
    case Call::kDispatchRecv:
      return "dispatch_recv";
    case Call::kCombine:
      return "combine";
    case Call::kCombineSend:
      return "combine_send";
    case Call::kCombineRecv:
      return "combine_recv";
  }
  return "unknown call";
}

void CallOrder::require(Call call, int rank) const {
  const char* expected = nullptr;
  switch (phase_) {
    case Phase::kIdle:
      expected =
          call == Call::kDispatch || call == Call::kDispatchSend ? nullptr : "dispatch or dispatch_send";
      break;
    case Phase::kDispatchSent:
      expected = call == Call::kDispatchRecv ? nullptr : "dispatch_recv";
      break;
    case Phase::kDispatched:
      expected = call == Call::kCombine || call == Call::kCombineSend ? nullptr : "combine or combine_send";
      break;
    case Phase::kCombineSent:
      expected = call == Call::kCombineRecv ? nullptr : "combine_recv";
      break;
  }
  if (expected != nullptr) {
    throw CallOrderError(on_rank(to_string(call), rank) + " called out of order: the group expects " +
                         expected + " next (calls go dispatch -> combine, each fused or as its two halves)");
  }
}

void CallOrder::advance(Call call) {
  switch (call) {
    case Call::kDispatchSend:
      phase_ = Phase::kDispatchSent;
      break;
    case Call::kDispatch:
    case Call::kDispatchRecv:
      phase_ = Phase::kDispatched;
      break;
    case Call::kCombineSend:
      phase_ = Phase::kCombineSent;
      break;
    case Call::kCombine:
    case Call::kCombineRecv:
      phase_ = Phase::kIdle;
      break;
  }
}

std::string dispatch_inputs_error(const EpConfig& config, const char* call, int rank,
                                  const DispatchInputs& inputs, const OwnMemory& memory) {
  const std::string where = on_rank(call, rank);
  if (inputs.num_tokens_on_device == nullptr &&
      (inputs.num_tokens < 0 || inputs.num_tokens > config.max_tokens_per_rank)) {
    return where + " passed num_tokens = " + std::to_string(inputs.num_tokens) + ", allowed range is [0, " +
           std::to_string(config.max_tokens_per_rank) + "]";
  }
  // With the count on the device, any count up to the maximum may come: the pointers must be valid.
  const bool has_tokens = inputs.num_tokens_on_device != nullptr || inputs.num_tokens > 0;
  if (has_tokens) {
    const std::string null = null_arguments(
        {{"tokens", inputs.tokens}, {"topk_ids", inputs.topk_ids}, {"topk_weights", inputs.topk_weights}});
    if (!null.empty()) {
      return where + null;
    }
  }
  if (config.dispatch_format == TokenFormat::kBf16 && inputs.token_scales != nullptr) {
    return where + " passed token_scales, but dispatch_format bf16 has no scales";
  }
  // Tokens in the input buffer arrive as they are, each row its payload and then its scales.
  const bool in_buffer = inputs.tokens != nullptr && inputs.tokens == memory.input_buffer;
  if (in_buffer && inputs.token_scales != nullptr) {
    return where +
           " passed token_scales with tokens at dispatch_input_buffer(), whose rows hold each token's scales "
           "after its payload (format_input_row_bytes): pass token_scales = nullptr";
  }
  if (has_tokens && config.dispatch_format == TokenFormat::kNvfp4 && inputs.token_scales == nullptr &&
      !in_buffer && inputs.global_scale == nullptr) {
    return where + " passed a null global_scale: nvfp4 tokens quantised in dispatch need one";
  }
  // Anywhere in the group's own dispatch memory but at the input buffer, the staging copy would overwrite
  // tokens it has yet to read.
  if (misplaced(inputs.tokens, memory)) {
    return where + " passed tokens inside the group's own dispatch memory but not at dispatch_input_buffer()";
  }
  return {};
}

std::string dispatch_outputs_error(const EpConfig& config, const char* call, int rank,
                                   const DispatchOutputs& outputs) {
  const std::string where = on_rank(call, rank);
  if (outputs.expert_input_scales != nullptr) {
    if (config.layout == Layout::kPerToken) {
      return where +
             " passed expert_input_scales, which the per-token layout refuses: each of its rows serves every "
             "local expert of its token (apply the experts' input scales in the fused-MoE kernel)";
    }
    if (config.dispatch_format != TokenFormat::kBf16) {
      return where + " passed expert_input_scales with dispatch_format " + to_string(config.dispatch_format) +
             ": allowed only with bf16, whose rows the receiving rank quantises";
    }
  }
  if (config.layout == Layout::kPerToken) {
    const std::string null = null_arguments({{"recv_tokens", outputs.recv_tokens},
                                             {"row_offsets", outputs.row_offsets},
                                             {"src_info", outputs.src_info},
                                             {"recv_topk_ids", outputs.recv_topk_ids},
                                             {"recv_topk_weights", outputs.recv_topk_weights},
                                             {"num_recv_tokens", outputs.num_recv_tokens},
                                             {"sorted_token_ids", outputs.sorted_token_ids},
                                             {"block_expert_ids", outputs.block_expert_ids}});
    if (!null.empty()) {
      return where + null + " (layout per-token)";
    }
  } else {
    const std::string null = null_arguments({{"recv_tokens", outputs.recv_tokens},
                                             {"row_offsets", outputs.row_offsets},
                                             {"expert_ids", outputs.expert_ids},
                                             {"src_info", outputs.src_info},
                                             {"recv_weights", outputs.recv_weights}});
    if (!null.empty()) {
      return where + null;
    }
  }
  if (config.dispatch_format != TokenFormat::kBf16 && outputs.recv_scales == nullptr) {
    return where + " passed a null recv_scales, but dispatch_format " + to_string(config.dispatch_format) +
           " has scales";
  }
  return {};
}

std::string combine_args_error(const EpConfig& config, const char* call, int rank, const CombineArgs& args,
                               const OwnMemory& memory) {
  const std::string where = on_rank(call, rank);
  const std::string null = null_arguments({{"expert_outputs", args.expert_outputs}, {"out", args.out}});
  if (!null.empty()) {
    return where + null;
  }
  // Anywhere in the combine input buffer's memory but at its start: across nodes, where that memory is the
  // send's staging rows, the staging copy would overwrite rows it has yet to read. Refused in every group
  // alike, so that what a caller may pass does not depend on where the group's ranks are.
  if (misplaced(args.expert_outputs, memory)) {
    return where +
           " passed expert_outputs inside the group's own combine memory but not at combine_input_buffer()";
  }
  if (config.layout == Layout::kPerToken && args.row_weights != nullptr) {
    return where +
           " passed row_weights, but in the per-token layout each row is already weighted and summed over "
           "the rank's experts (row_weights must be null)";
  }
  if (args.shared_expert_output != nullptr && config.layout == Layout::kExpanded &&
      args.row_weights == nullptr) {
    return where +
           " passed shared_expert_output to an unweighted combine, whose rows come back unreduced (nothing "
           "to "
           "add it to): allowed only with row_weights or in the per-token layout";
  }
  const bool epilogue = has_epilogue_values(args) || args.out_row_stride != 0;
  if (epilogue && config.layout == Layout::kExpanded && args.row_weights == nullptr) {
    return where +
           " passed an epilogue (factor, token_factors, residual or out_row_stride) to an unweighted "
           "combine, whose rows come back unreduced: allowed only with row_weights or in the per-token "
           "layout";
  }
  if (args.residual != nullptr && config.local_only && config.allreduce_world_size > 1) {
    return where +
           " passed residual in local-only mode, where every rank of the all-reduce adds it to the same "
           "tokens and the caller's all-reduce would count it allreduce_world_size = " +
           std::to_string(config.allreduce_world_size) +
           " times: add it after the all-reduce, or into shared_expert_output, which only this rank's slice "
           "of the tokens adds";
  }
  constexpr std::size_t kMostRowStride = std::size_t{1} << 31;  // the kernels hold it in 32 bits
  if (args.out_row_stride != 0 && (args.out_row_stride < static_cast<std::size_t>(config.hidden) ||
                                   args.out_row_stride % 8 != 0 || args.out_row_stride > kMostRowStride)) {
    return where + " passed out_row_stride = " + std::to_string(args.out_row_stride) +
           ": allowed are 0 (rows hidden apart) or a multiple of 8 in [hidden = " +
           std::to_string(config.hidden) + ", 2^31] (elements; rows stay 16-byte aligned)";
  }
  return {};
}

std::string caller_epilogue_error(const EpConfig& config, Backend backend, int rank, const CombineArgs& args,
                                  const CombineReceiveLauncher& launcher) {
  const std::string call = on_rank("combine_recv_with", rank);
  if (backend != Backend::kGpu) {
    return call + ": a device epilogue runs in the GPU backend's kernels; this group runs the CPU reference";
  }
  if (config.layout != Layout::kPerToken) {
    return call + ": a device epilogue needs the per-token layout (EpConfig::layout = kPerToken)";
  }
  if (has_epilogue_values(args)) {
    return call +
           " passed factor, token_factors or residual beside a device epilogue: apply them in the epilogue "
           "(out_row_stride is allowed)";
  }
  if (launcher.launch == nullptr || launcher.epilogue == nullptr) {
    return call +
           " passed a launcher without its launch function or epilogue (fill it with "
           "rocep::combine_recv of <rocep/combine_epilogue.hpp>)";
  }
  return {};
}

std::string combine_input_buffer_error(const EpConfig& config) {
  if (config.layout != Layout::kPerToken) {
    return "EpGroup::combine_input_buffer: layout is expanded; the combine input buffer serves the per-token "
           "layout only (EpConfig::layout = kPerToken)";
  }
  if (config.combine_dtype != CombineDtype::kBf16) {
    return std::string("EpGroup::combine_input_buffer: combine_dtype is ") + to_string(config.combine_dtype) +
           ", which quantises the rows into the buffer's memory; the input buffer serves bf16 combines only";
  }
  if (!config.combine_input_buffer) {
    return "EpGroup::combine_input_buffer: EpConfig::combine_input_buffer = false left it out of the group "
           "(allowed: true, the default, to have one)";
  }
  return {};
}

DispatchInputs zero_tokens() {
  return DispatchInputs{};
}

RecordedError recorded_error(const device::Status& status, const EpConfig& config, int rank) {
  const auto code = static_cast<StatusCode>(status.code);
  if (code == StatusCode::kOk) {
    return {};
  }
  const std::string where =
      std::string(operation_name(status.operation)) + " on rank " + std::to_string(rank);
  if (code == StatusCode::kTimeout) {
    char seconds[32];
    std::snprintf(seconds, sizeof seconds, "%g", config.timeout_seconds);
    return {RecordedError::Kind::kTimeout, where + ": timed out after " + seconds + " s waiting for rank " +
                                               std::to_string(status.peer) + " to signal call " +
                                               std::to_string(status.value)};
  }
  std::string message = where;
  switch (code) {
    case StatusCode::kTokenCountOutOfRange:
      message += ": num_tokens = " + std::to_string(status.value) + " (device), allowed range is [0, " +
                 std::to_string(config.max_tokens_per_rank) + "]; no token was sent";
      break;
    case StatusCode::kCombineWeightingMismatch:
      if (status.peer == rank) {  // this rank's own send against its receive
        message +=
            ": row_weights was " + std::string(status.value != 0 ? "set" : "null") +
            " in this rank's combine_send but not in its combine_recv; pass combine_recv the arguments "
            "of its combine_send (out is invalid)";
      } else {
        message += ": row_weights was " + std::string(status.value != 0 ? "set" : "null") + " on rank " +
                   std::to_string(status.peer) +
                   " but not on this rank; weighted or not must agree on every rank (out is invalid)";
      }
      break;
    default:
      message += ", token " + std::to_string(status.token) + ", slot " + std::to_string(status.slot) +
                 ": expert id " + std::to_string(status.value) +
                 (code == StatusCode::kExpertRepeated
                      ? " is named twice by this token"
                      : " is outside [-1, " + std::to_string(config.num_experts) + ")") +
                 "; that slot was not dispatched";
      break;
  }
  return {RecordedError::Kind::kInvalidInput, message};
}

}  // namespace rocep::contract
