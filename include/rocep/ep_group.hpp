// EpGroup: one expert-parallel group of ranks and everything its dispatch and combine calls need (receive
// buffers, counters, peer tables). Created collectively, destroyed collectively.
//
// Streams: `stream` is a hipStream_t (AMD) or cudaStream_t (NVIDIA); both convert to void* implicitly, and
// nullptr is the default stream. The CPU reference backend ignores it and works on host memory.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <memory>

#include "config.hpp"
#include "types.hpp"

namespace rocep {

enum class Backend {
  kAuto,          // the GPU when this build has GPU kernels and a GPU is visible, else the CPU reference
  kGpu,           // kernels on the GPU; every pointer is device memory
  kCpuReference,  // the CPU reference implementation over MPI; every pointer is host memory
};

const char* to_string(Backend backend);

class EpGroup {
 public:
  // Collective over `comm`: every rank of `comm` must call it with an equal `config` and `backend`.
  // Allocates: yes (receive buffers, counters, peer tables; see memory_bytes()). Not graph-safe.
  // The GPU backend uses the calling thread's current device (set it first; one GPU per rank) and needs
  // every rank on one node.
  // Errors: ConfigError if config.validate(size of comm) fails, if the configs of the ranks differ, or if
  // kGpu is asked for and this build or machine has no GPU; GpuRuntimeError / BootstrapError if allocation
  // or the IPC exchange fails.
  // `comm` is duplicated; the caller may free its own handle afterwards.
  EpGroup(MPI_Comm comm, const EpConfig& config, Backend backend = Backend::kAuto);
  // Collective (barrier with the peers, who may still be storing into this rank's buffers) unless the
  // group timed out, in which case it releases everything without waiting for anyone.
  ~EpGroup();
  EpGroup(EpGroup&&) noexcept;
  EpGroup& operator=(EpGroup&&) noexcept;
  EpGroup(const EpGroup&) = delete;
  EpGroup& operator=(const EpGroup&) = delete;

  int rank() const;
  int world_size() const;
  const EpConfig& config() const;  // as given, with fp8_encoding kAuto resolved to the encoding in use
  Backend backend() const;
  int num_local_experts() const;      // L = num_experts / world_size
  std::size_t max_recv_rows() const;  // R: rows to allocate for DispatchOutputs and expert outputs
  std::size_t memory_bytes() const;   // bytes the group allocated for itself (outputs not included)

  // bf16 dispatch only: this rank's input buffer, [max_tokens_per_rank, hidden] bf16 in the group's own
  // memory (device memory on the GPU backend, host memory on the CPU reference), where the peers read this
  // rank's tokens. Tokens written here and passed as DispatchInputs::tokens (this very pointer) are not
  // copied by dispatch_send, which then sends only ids and weights. Write it only between this rank's
  // combine and its next dispatch, in stream order: from a dispatch until this rank's combine of it, the
  // peers may be reading the tokens. Not collective; the same pointer for the group's lifetime. Allocates:
  // no on the GPU backend (it is the memory the send would stage the tokens into); the CPU reference
  // allocates it on the first call. Throws ConfigError for other dispatch formats.
  void* dispatch_input_buffer();

  // dispatch = dispatch_send + dispatch_recv.
  // Collective: every rank calls it, in the same order relative to combine, with its own inputs (0 tokens
  // is allowed). Allocates: no. Graph-safe: yes on the GPU backend (no host synchronisation).
  // Errors: InvalidInputError before any work if num_tokens is outside [0, max_tokens_per_rank], a pointer
  // is null, or the tokens lie in the group's own dispatch memory anywhere but at dispatch_input_buffer()
  // (the peers then time out waiting for this rank); InvalidInputError naming rank, token and slot
  // for an expert id outside [-1, num_experts) or an expert named twice by one token (nothing is stored
  // for it); TimeoutError naming the peer if a peer does not send within config().timeout_seconds. On the
  // GPU backend the last two come from synchronize().
  // All calls of a group go on one stream, and every dispatch is followed by a combine before the next
  // dispatch (the combine is what tells a rank that its peers are done reading its dispatch buffers).
  void dispatch(const DispatchInputs& inputs, const DispatchOutputs& outputs, void* stream = nullptr);
  // Sends every peer the ids and weights that concern it, and stages this rank's tokens (quantised if
  // asked) where the peers read them: each token crosses to each destination rank once, in that rank's
  // dispatch_recv. Returns once this is issued; the inputs must stay valid until dispatch_recv has returned.
  void dispatch_send(const DispatchInputs& inputs, void* stream = nullptr);
  // Waits until every peer has sent its ids and staged its tokens, reads the tokens and lays them out
  // expert by expert into `outputs`.
  void dispatch_recv(const DispatchOutputs& outputs, void* stream = nullptr);

  // combine = combine_send + combine_recv. Combines the rows of the latest dispatch of this group.
  // Collective, allocates nothing, graph-safe on the GPU backend. Weighted (row_weights set): the rows of
  // one token that sit on one rank are reduced there (float32 fused multiply-add in ascending k, rounded
  // to bf16) and only that partial crosses the link; the source sums the partials in float32 in ascending
  // rank order, adds the shared-expert row and rounds to bf16 once. Errors: InvalidInputError for a null
  // pointer or a combine without a dispatch before it; TimeoutError naming the peer.
  void combine(const CombineArgs& args, void* stream = nullptr);
  // Sends the expert outputs (reduced per token when weighted) back to the ranks the tokens came from.
  void combine_send(const CombineArgs& args, void* stream = nullptr);
  // Waits for every peer's rows and writes args.out.
  void combine_recv(const CombineArgs& args, void* stream = nullptr);

  // Waits for `stream` and throws what the kernels recorded since the last synchronize: InvalidInputError
  // for an expert id out of range or named twice (rank, token, slot; that slot was not dispatched, the rest
  // of the call completed), TimeoutError naming the operation and the peer that never signalled. After a
  // TimeoutError the group is unusable (every call throws) but can still be destroyed. On the GPU backend
  // device-side failures surface only here, since the calls themselves never wait for the device; the CPU
  // reference backend throws from the calls directly and synchronize() does nothing.
  void synchronize(void* stream = nullptr);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace rocep
