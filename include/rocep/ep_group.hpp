// EpGroup: one expert-parallel group of ranks and everything its dispatch and combine calls need (receive
// buffers, counters, peer tables). Created collectively, destroyed collectively.
//
// Streams: `stream` is a hipStream_t (AMD) or cudaStream_t (NVIDIA); both convert to void* implicitly, and
// nullptr is the default stream. The CPU reference backend ignores it and works on host memory.
//
// Beside compute: give the group its own stream and leave the experts' kernels (a shared-expert GEMM, the
// next layer's work, a TP all-reduce) on others. The communication kernels then take config.num_sms
// multiprocessors (the default share unless set) and the other kernels the rest, at the same time; their
// grids are resident at once, so a concurrent kernel can delay a call but not deadlock it. Do not run two
// groups whose budgets together exceed the GPU (two kAllSms groups, or a kAllSms group beside another
// kernel that waits on a peer: it would hold multiprocessors the group's grid needs), and order every call
// of one group on one stream (see dispatch). Split calls let the caller run its own work between a send
// and its receive on the compute stream.
//
// Threads: one group's calls (synchronize included) must not overlap in time: call a group from one thread,
// or from several that take turns under the caller's own lock (each with the group's GPU current). A call
// made while another thread is inside one of the same group throws CallOrderError. poll_error is the
// exception: any thread may call it at any time, also while another thread is inside a call of the group
// (a watchdog). Different groups may be called from different threads at the same time, each on its own
// stream. close() is refused on every rank while another thread is inside a call of the group; destroying
// the object while another thread uses it is the caller's error, not detected.
//
// Errors, the same on both backends (each call below says which apply):
// - CallOrderError: a call out of the order dispatch -> combine -> dispatch ... (each fused or as its two
//   halves), or made while another thread is inside a call of the group. Refused before anything is
//   issued; the group's state is unchanged.
// - InvalidInputError from dispatch / dispatch_send for bad inputs (num_tokens out of range, a null pointer,
//   tokens misplaced in the group's memory, a format field that does not fit): this rank still takes part as
//   a rank with zero tokens, so its peers complete with correct results; only this rank throws, after its
//   part is issued (InvalidInputError::issued() true), and the group goes on. Its next call is
//   dispatch_recv (or, after a fused dispatch, combine), as after any dispatch.
// - InvalidInputError from dispatch_recv / combine / combine_send / combine_recv for bad arguments (a null
//   pointer, an epilogue the layout or mode refuses: CombineArgs), and from a fused dispatch for bad outputs
//   (checked as dispatch_recv checks them): that call is refused on this rank before anything is issued
//   (issued() false) and may be repeated with valid arguments; until then the peers' waits on this rank run
//   against config().timeout_seconds (on the CPU reference the peers wait in the bootstrap's all_gather,
//   which bounds it only if the bootstrap does).
// - Recorded, never thrown from a call: what only the data shows while the call runs (an expert id outside
//   [-1, num_experts) or named twice: that slot is not dispatched; a device-side token count out of range:
//   no token is sent; weighted and unweighted combines mixed across ranks: out is invalid; a peer that never
//   signals: TimeoutError). poll_error() reads it without waiting; synchronize() throws it.
// - After a TimeoutError, or a kernel launch the runtime refused (GpuRuntimeError from the call), the group
//   is unusable: every call throws Error; it can still be destroyed.
#pragma once

#include <cstddef>
#include <memory>
#include <type_traits>

#include "bootstrap.hpp"
#include "config.hpp"
#include "errors.hpp"
#include "types.hpp"

namespace rocep {

// How a combine receive that the caller's own build compiled is launched (<rocep/combine_epilogue.hpp>
// fills it; nothing else needs to): `launch` starts the kernel on `stream` with the group's device view,
// the combine's kernel arguments, the group's grid and `epilogue`, and returns the runtime's status
// (hipError_t / cudaError_t).
struct CombineReceiveLauncher {
  int (*launch)(const void* group_view, const void* kernel_args, int blocks, void* stream,
                const void* epilogue) = nullptr;
  const void* epilogue = nullptr;
};

enum class Backend {
  kAuto,          // the GPU when this build has GPU kernels and a GPU is visible, else the CPU reference
  kGpu,           // kernels on the GPU; every pointer is device memory
  kCpuReference,  // the CPU reference implementation; every pointer is host memory
};

const char* to_string(Backend backend);

class EpGroup {
 public:
  // Collective over `bootstrap`: every rank must call it with an equal `config` and `backend`. The group
  // keeps the bootstrap for its lifetime (its destructor uses it); the GPU backend uses it only at creation
  // and destruction, never in dispatch or combine. The CPU reference moves its data through the bootstrap's
  // all_gather in every call: two CPU-reference groups over one bootstrap must be called in the same order
  // on every rank. Allocates: yes (receive buffers, counters, peer tables; see
  // memory_bytes()). Not graph-safe. The GPU backend uses the calling thread's current device (set it first;
  // one GPU per rank). Which ranks share a node comes from config.gpus_per_node, else from the environment's
  // ROCEP_GPUS_PER_NODE, else from the host identity every rank reports; the GPUs of a node must reach each
  // other peer to peer. Ranks on other nodes are reached through the SHMEM engine, in builds with one
  // (ROCEP_SHMEM, docs/scale-out.md); without one, every rank must be on one node (else ConfigError).
  // Failure-atomic: either every rank returns, or every rank throws, naming the first rank that failed and
  // the step: ConfigError if config.validate(bootstrap size) fails, if the configs of the ranks differ (then
  // naming the first rank that differs from rank 0 and each field that does, with both values), if kGpu is
  // asked for and some rank's build or machine has no GPU, if two GPUs of the node cannot reach each other,
  // or if config.num_sms exceeds the rank's share of its GPU; GpuRuntimeError / BootstrapError if
  // allocation, the IPC exchange or a bootstrap collective fails; ConfigError also if some rank's
  // bootstrap says a rank() other than its place in all_gather's output, or another size(). A null
  // bootstrap, or one whose size() < 1 or rank() outside [0, size()), throws ConfigError on its rank alone,
  // before any collective (its peers wait for it in their first all_gather).
  EpGroup(std::shared_ptr<Bootstrap> bootstrap, const EpConfig& config, Backend backend = Backend::kAuto);
  // The same over an MPI communicator (duplicated; the caller may free its handle afterwards). Defined in
  // <rocep/mpi.hpp>, which a caller of this constructor includes.
  template <typename MpiComm,
            typename = std::enable_if_t<!std::is_convertible_v<MpiComm, std::shared_ptr<Bootstrap>>>>
  EpGroup(MpiComm comm, const EpConfig& config, Backend backend = Backend::kAuto);
  // GPU backend: collective (barrier with the peers, who may still be storing into this rank's buffers)
  // unless the group timed out, in which case it releases everything without waiting for anyone. It waits
  // for the group's device whatever device is current (made current for the teardown, the caller's given
  // back after), and for all work queued there on any stream (a device synchronisation): destroy a group at
  // the same point on every rank, not while another kernel of this rank waits for a peer that is itself
  // inside this destructor (that peer's barrier gives up after config().timeout_seconds where its bootstrap
  // bounds it, Bootstrap::barrier_within, and keeps its memory). The CPU reference holds nothing a peer
  // writes, and waits for no one.
  ~EpGroup();
  // Releases the group now, as the destructor would (the same waits, and on the GPU backend the same
  // collective teardown), rather than when the object goes; the destructor then releases nothing more.
  // Collective: every rank calls it at the same point, after its last call of the group, with any device
  // current (as the destructor). The ranks agree through the bootstrap first, so that no rank releases
  // alone: while another thread is inside a call of the group on any rank, it is refused on every rank with
  // nothing released (CallOrderError naming those ranks; call it again once they are out). A poll_error
  // from another thread never overlaps the release: it answers before, or throws CallOrderError after.
  // Afterwards every call but close throws CallOrderError; close again does nothing. Not graph-safe.
  // Errors, each with nothing released: CallOrderError as said, or on a group moved from; TimeoutError when
  // not every rank calls close within config().timeout_seconds, where the bootstrap bounds its all-gather
  // (Bootstrap::all_gather_within: MpiBootstrap does; the Python bootstraps wait); BootstrapError if the
  // agreement's collective fails. On the CPU reference, whose calls move their data through the bootstrap
  // too, the refusal needs the other thread's call not to be inside a collective of the bootstrap: close
  // and that call would cross there (the bootstrap's collectives are matched in order); do not overlap them.
  void close();
  EpGroup(EpGroup&&) noexcept;
  EpGroup& operator=(EpGroup&&) noexcept;
  EpGroup(const EpGroup&) = delete;
  EpGroup& operator=(const EpGroup&) = delete;

  int rank() const;
  int world_size() const;
  // As given, with fp8_encoding kAuto resolved to the encoding in use and gpus_per_node 0 replaced by the
  // environment's ROCEP_GPUS_PER_NODE where set.
  const EpConfig& config() const;
  Backend backend() const;
  int num_local_experts() const;      // L = num_experts / world_size
  std::size_t max_recv_rows() const;  // R: rows to allocate for DispatchOutputs and expert outputs
  std::size_t memory_bytes() const;   // device bytes the group allocated for itself (outputs not included;
                                      // 0 on the CPU reference)
  // The GPU the group's memory and kernels are on (the calling thread's current device at creation); -1 on
  // the CPU reference. Every call of dispatch and combine (either half) must come from a thread whose current
  // device is this one, with a stream of this device (or 0, its default stream): else it throws
  // InvalidInputError, naming both devices, before anything is issued. (A stream being captured into a graph
  // is not checked, nor any stream with CUDA before 12.8, whose runtime cannot tell a stream's device, and
  // the last stream found on the group's device is not asked again: there a stream of another GPU fails at
  // launch instead, which breaks the group.) Asking a stream is safe while another thread captures a graph
  // in the global capture mode: the check makes no call that would invalidate that capture.
  int device() const;

  // This rank's input buffer in the group's own memory (device memory on the GPU backend, host memory on the
  // CPU reference), where the peers read this rank's tokens: max_tokens_per_rank rows of
  // format_input_row_bytes(dispatch_format, hidden) bytes, 16-byte aligned. bf16: [max_tokens_per_rank,
  // hidden] bf16. Scaled formats: each row the token already quantised, its payload
  // (format_payload_bytes) and then its scales row-major (format_scale_bytes, as DispatchInputs::
  // token_scales holds them), then padding to the row's end. Tokens written here and passed as
  // DispatchInputs::tokens (this very pointer, with token_scales null) are not copied by dispatch_send,
  // which then sends only ids and weights. Write it only between this rank's combine and its next
  // dispatch, in stream order: from a dispatch until this rank's combine of it, the peers may be reading
  // the tokens. Not collective; the same pointer for the group's lifetime. Allocates: no on the GPU backend
  // (it is the memory the send would stage the tokens into); the CPU reference allocates it on the first
  // call.
  void* dispatch_input_buffer();
  // Per-token layout, bf16 combine only: this rank's combine input buffer, [world_size x
  // max_tokens_per_rank, hidden] bf16 in the group's own memory (the CPU reference: host memory), for the
  // expert outputs, a row per received token at its row of DispatchOutputs. Expert outputs written here and
  // passed as CombineArgs::expert_outputs (this very pointer) are not copied by combine_send: within one
  // node the peers load their tokens' rows from here in their combine receive, and to peers on other nodes
  // the rows are put from here (docs/scale-out.md). Write it only between this rank's dispatch_recv and its
  // combine_send, in stream order: until the next dispatch_recv ends, peers may still read the last
  // combine's rows. Not collective; the same pointer for the group's lifetime. Allocates: no (within one
  // node, world_size x max_tokens_per_rank rows of the group's memory, allocated with the group when it has
  // more than one rank, counted by memory_bytes(); across nodes the staging rows), except device memory on
  // the first call of a one-rank or local-only group, and host memory on the CPU reference's first call.
  // Throws ConfigError for the expanded layout, for combine_dtype fp8, and where
  // EpConfig::combine_input_buffer is false.
  void* combine_input_buffer();

  // dispatch = dispatch_send + dispatch_recv.
  // Collective: every rank calls it, in the same order relative to combine, with its own inputs (0 tokens
  // is allowed). Allocates: no. Graph-safe: yes on the GPU backend (no host synchronisation).
  // Errors (see the top of this file): CallOrderError unless the group's last call ended a combine (or
  // none came yet); InvalidInputError for bad inputs, after this rank took part with zero tokens, and for
  // bad outputs, refused before anything is issued (fused dispatch; may be repeated); recorded:
  // an invalid expert id (rank, token, slot), a device-side count out of range, TimeoutError naming the peer.
  // Streams: every call of a group goes on one stream (or on streams the caller orders, event by event, in
  // the same call order); two groups may run on two streams at once when their SM budgets fit the GPU
  // together (two default budgets do; two kAllSms groups do not, and are not supported). Every dispatch is
  // followed by a combine before the next dispatch: the combine is what tells a rank that its peers are done
  // reading its dispatch memory. Under graph capture the calls are checked in capture order, which is their
  // replay order: capture whole dispatch + combine steps.
  void dispatch(const DispatchInputs& inputs, const DispatchOutputs& outputs, void* stream = nullptr);
  // Sends every peer the ids and weights that concern it, and stages this rank's tokens (quantised if
  // asked) where the peers read them: each token crosses to each destination rank once, in that rank's
  // dispatch_recv. Returns once this is issued; the inputs must stay valid until dispatch_recv has returned.
  void dispatch_send(const DispatchInputs& inputs, void* stream = nullptr);
  // Waits until every peer has sent its ids and staged its tokens, reads the tokens and lays them out
  // expert by expert into `outputs`. After a recorded failure that stops the call (a timeout), it writes
  // row_offsets as all zeros, so no stale rows from an earlier call look valid.
  void dispatch_recv(const DispatchOutputs& outputs, void* stream = nullptr);

  // combine = combine_send + combine_recv. Combines the rows of the latest dispatch of this group.
  // Collective, allocates nothing, graph-safe on the GPU backend. Weighted (row_weights set): the rows of
  // one token that sit on one rank are reduced there (float32 fused multiply-add in ascending k, rounded
  // to bf16) and only that partial crosses the link; the source sums the partials in float32 in ascending
  // rank order, adds the shared-expert row and rounds to bf16 once. Errors: CallOrderError without a
  // dispatch before it; InvalidInputError for a null pointer (refused, may be repeated); recorded: weighted
  // and unweighted mixed across ranks, TimeoutError naming the peer.
  void combine(const CombineArgs& args, void* stream = nullptr);
  // Sends the expert outputs (reduced per token when weighted) back to the ranks the tokens came from.
  void combine_send(const CombineArgs& args, void* stream = nullptr);
  // Waits for every peer's rows and writes args.out. Takes the CombineArgs of its combine_send (the same
  // row_weights, shared expert, epilogue and out; a combine_recv weighted otherwise is recorded, out
  // invalid).
  void combine_recv(const CombineArgs& args, void* stream = nullptr);
  // combine_recv through the caller's own elementwise device epilogue, which its build compiled into the
  // receive: call rocep::combine_recv(group, args, epilogue, stream) of <rocep/combine_epilogue.hpp>, which
  // fills `launcher`. The same call as combine_recv otherwise (order, errors). InvalidInputError: on the CPU
  // reference, in the expanded layout, with CombineArgs' own epilogue (factor, token_factors, residual: do
  // that in the caller's epilogue), or with no launcher.
  void combine_recv_with(const CombineArgs& args, const CombineReceiveLauncher& launcher,
                         void* stream = nullptr);

  // Waits for `stream` and throws what was recorded since the last synchronize (and clears it):
  // InvalidInputError for an expert id out of range or named twice (rank, token, slot; that slot was not
  // dispatched, the rest of the call completed), a device-side token count out of range, or mixed weighted
  // and unweighted combines; TimeoutError naming the operation and the peer that never signalled. After a
  // TimeoutError the group is unusable (every call throws) but can still be destroyed. Both backends record
  // these the same way; the CPU reference has nothing to wait for. Like dispatch and combine, it must come
  // from the group's device with a stream of it (else InvalidInputError, before waiting for anything).
  void synchronize(void* stream = nullptr);
  // What was recorded so far, without waiting for any stream and without clearing it (Kind::kNone: nothing).
  // Not collective. Safe while kernels run, from any thread, also while another thread is inside a call of
  // this group (synchronize included): it reads a copy of the record made on a stream of its own, and never
  // throws CallOrderError for another thread's call. Like every call, it must come with the group's device
  // current (else InvalidInputError; a watchdog thread sets it once), so that it creates no context on
  // another GPU. A kernel's failure may take until that kernel ends to appear (on AMD a record may also
  // appear late while it sits in the GPU's L2), and a record that another thread's synchronize clears may be
  // read just before or just after. After close(), CallOrderError.
  RecordedError poll_error();

 private:
  struct Impl;
  // *impl_; CallOrderError on a group moved from.
  Impl& impl() const;
  std::unique_ptr<Impl> impl_;
};

}  // namespace rocep
