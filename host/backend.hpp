// The interface every backend of EpGroup implements: the CPU reference (host/reference.hpp) and the GPU
// (host/gpu_backend.hpp). EpGroup applies the contract (host/contract.hpp) first, so a backend receives
// only arguments that passed their checks (or the zero-token stand-in of a rank whose inputs failed them),
// in a valid call order. Data-dependent failures are recorded, never thrown from a call.
#pragma once

#include <cstddef>
#include <memory>

#include "contract.hpp"
#include "rocep/bootstrap.hpp"
#include "rocep/config.hpp"
#include "rocep/errors.hpp"
#include "rocep/types.hpp"

namespace rocep {

class EpBackend {
 public:
  virtual ~EpBackend() = default;

  // Bytes the backend allocated for itself (outputs not included).
  virtual std::size_t memory_bytes() const = 0;
  // The GPU the backend's memory and kernels are on; -1: none (the CPU reference).
  virtual int device() const { return -1; }
  // The calling thread's current GPU, which every call must leave at device() (the kernels launch on it);
  // -1 where the backend has no GPU.
  virtual int calling_device() const { return -1; }
  // The GPU whose work `stream` queues (the default stream: the current GPU's), which every call must also
  // leave at device(); -1 where the backend has no GPU or the runtime names none for it; device() for a
  // stream being captured (not asked).
  virtual int stream_device(void* /*stream*/) const { return -1; }
  // The dispatch input buffer (see EpGroup::dispatch_input_buffer); its memory, for the check of misplaced
  // tokens.
  virtual void* dispatch_input_buffer() = 0;
  virtual contract::OwnMemory dispatch_memory() const = 0;
  // bf16 per-token groups: the combine input buffer (see EpGroup::combine_input_buffer); the combine's own
  // memory, for the check of misplaced expert outputs.
  virtual void* combine_input_buffer() = 0;
  virtual contract::OwnMemory combine_memory() const = 0;

  // `stream` is the caller's hipStream_t / cudaStream_t (the CPU reference ignores it).
  virtual void dispatch_send(const DispatchInputs& inputs, void* stream) = 0;
  virtual void dispatch_recv(const DispatchOutputs& outputs, void* stream) = 0;
  virtual void combine_send(const CombineArgs& args, void* stream) = 0;
  virtual void combine_recv(const CombineArgs& args, void* stream) = 0;
  // combine_recv whose kernel `launcher` launches: the GPU backend's. EpGroup refuses it for the others
  // (contract::caller_epilogue_error) before it gets here.
  virtual void combine_recv_with(const CombineArgs& /*args*/, const CombineReceiveLauncher& /*launcher*/,
                                 void* /*stream*/) {
    throw InvalidInputError("combine_recv_with: a device epilogue runs in the GPU backend's kernels only");
  }
  // The fused calls: the two halves unless the backend has one kernel for both.
  virtual void dispatch(const DispatchInputs& inputs, const DispatchOutputs& outputs, void* stream) {
    dispatch_send(inputs, stream);
    dispatch_recv(outputs, stream);
  }
  virtual void combine(const CombineArgs& args, void* stream) {
    combine_send(args, stream);
    combine_recv(args, stream);
  }

  // What was recorded so far, without waiting for `stream`; not cleared. Safe from any thread, also while
  // another thread is inside any call of the backend (a snapshot).
  virtual RecordedError poll_error() = 0;
  // Waits for `stream`, then returns what was recorded and clears it, except a timeout, which stays: the
  // ranks' sequence numbers no longer agree, and every later call is refused.
  virtual RecordedError synchronize(void* stream) = 0;
  // True once a timeout was recorded and seen by synchronize().
  virtual bool broken() const = 0;
};

// True when this build has GPU kernels and this process sees a GPU.
bool gpu_visible();

// The GPU backend over `bootstrap` (collective, failure-atomic: see EpGroup's constructor), on the calling
// thread's current device; resolves config.fp8_encoding kAuto to the device's encoding. In a build without a
// GPU platform it throws ConfigError (host/no_gpu_backend.cpp).
std::unique_ptr<EpBackend> make_gpu_backend(Bootstrap& bootstrap, EpConfig& config);

}  // namespace rocep
