// The contract of dispatch and combine, in one place for every backend (EpGroup applies it before it
// forwards a call): the argument checks, the call-order state machine, and the words of the errors that
// the kernels (or the CPU reference) record while a call runs.
//
// Semantics (the header of EpGroup states them for users):
// - A call out of order (CallOrderError) is refused before anything is issued; the group's state is
//   unchanged.
// - Bad dispatch inputs (num_tokens out of range, a null pointer, misplaced tokens, format fields): the rank
//   still takes part, as a rank with zero tokens, so its peers complete with correct results; then only this
//   rank throws InvalidInputError.
// - Bad dispatch_recv outputs or combine arguments: that call is refused on this rank before anything is
//   issued (InvalidInputError) and may be repeated with valid arguments; its peers' next waits on this rank
//   are bounded by the group's timeout.
// - Data only known while the call runs (an expert id out of range or named twice, a device-side token
//   count out of range, weighted and unweighted combines mixed across ranks, a peer that never signals) is
//   recorded, never thrown from the call: poll_error() reads it, synchronize() throws it.
#pragma once

#include <cstddef>
#include <string>

#include "hip/ep_params.hpp"
#include "rocep/config.hpp"
#include "rocep/ep_group.hpp"
#include "rocep/errors.hpp"
#include "rocep/types.hpp"

namespace rocep::contract {

enum class Call { kDispatch, kDispatchSend, kDispatchRecv, kCombine, kCombineSend, kCombineRecv };

const char* to_string(Call call);

// Which call may come next: dispatch (or dispatch_send), then dispatch_recv, then combine (or combine_send),
// then combine_recv, then the next dispatch. Each call is checked and recorded on the host, in issue order,
// which on one stream is also execution order and, under graph capture, replay order (a captured sequence
// must itself follow this order, and a graph that holds a whole number of steps replays in order).
class CallOrder {
 public:
  // Throws CallOrderError naming the call, the rank and what was expected instead.
  void require(Call call, int rank) const;
  void advance(Call call);

 private:
  enum class Phase { kIdle, kDispatchSent, kDispatched, kCombineSent };
  Phase phase_ = Phase::kIdle;
};

// Memory of the group's own that a call may read its inputs from only at the input buffer: the dispatch
// memory (tokens, bf16 groups) and the combine's staging rows (expert outputs, bf16 per-token groups).
struct OwnMemory {
  const void* first = nullptr;
  std::size_t bytes = 0;
  const void* input_buffer = nullptr;  // null unless the group has one
};

// Empty when the argument is valid, else the message of the InvalidInputError, naming `call` (the EpGroup
// call the user made: "dispatch" or "dispatch_send", "dispatch" or "dispatch_recv", "combine",
// "combine_send", "combine_recv" or "combine_recv_with"), the rank and the argument (each null pointer by
// name).
std::string dispatch_inputs_error(const EpConfig& config, const char* call, int rank,
                                  const DispatchInputs& inputs, const OwnMemory& memory);
std::string dispatch_outputs_error(const EpConfig& config, const char* call, int rank,
                                   const DispatchOutputs& outputs);
std::string combine_args_error(const EpConfig& config, const char* call, int rank, const CombineArgs& args,
                               const OwnMemory& memory);
// A combine_recv through the caller's epilogue (EpGroup::combine_recv_with), beyond combine_args_error.
std::string caller_epilogue_error(const EpConfig& config, Backend backend, int rank, const CombineArgs& args,
                                  const CombineReceiveLauncher& launcher);
// Empty when the group has a combine input buffer (per-token layout, bf16 combine_dtype), else the
// ConfigError's message.
std::string combine_input_buffer_error(const EpConfig& config);

// What a rank whose dispatch inputs failed their checks sends in their place: no token.
DispatchInputs zero_tokens();

// The error a status record describes (none for kOk), with the message naming the operation, the rank and
// what went wrong; the same words for both backends.
RecordedError recorded_error(const device::Status& status, const EpConfig& config, int rank);

}  // namespace rocep::contract
