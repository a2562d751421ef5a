// The GPU backend of EpGroup: owns the receive regions, signals and peer tables of one group and launches
// the dispatch / combine kernels on the caller's stream.
#pragma once

#include <memory>
#include <mutex>

#include "backend.hpp"
#include "device.hpp"
#include "device_memory.hpp"
#include "hip/ep_kernels.hpp"
#include "ipc.hpp"
#include "rocep/bootstrap.hpp"
#include "rocep/config.hpp"
#include "rocep/types.hpp"
#include "shmem_regions.hpp"

namespace rocep {

class GpuEp final : public EpBackend {
 public:
  // Collective over `world`, failure-atomic (every step agreed: the ranks throw together). Uses the calling
  // thread's current device. Ranks on other nodes (node_layout) are reached through the SHMEM engine
  // (ShmemRegions). Throws ConfigError if the ranks span nodes in a build without an engine, two of the
  // node's GPUs cannot reach each other peer-to-peer, the shape exceeds what the kernels support, or
  // config.num_sms exceeds this rank's share of its GPU's multiprocessors (comm_policy.hpp sm_budget).
  GpuEp(Bootstrap& world, const EpConfig& config);
  // From any thread: makes the group's device current until the end (then the caller's again), waits for
  // it, closes the mappings of the peers' memory, then waits for every peer to have closed theirs (a
  // barrier bounded by the timeout) before this rank's memory is freed. If the group is
  // broken (broken(), e.g. after a timeout), nobody is waited for; if the barrier times out or fails, the
  // wait ends there. In both cases this rank's exported memory (its dispatch and combine regions and its
  // signals) is deliberately not freed, since a peer may still store into it: the process keeps it until it
  // exits. The rest is freed.
  ~GpuEp() override;
  GpuEp(const GpuEp&) = delete;
  GpuEp& operator=(const GpuEp&) = delete;

  std::size_t memory_bytes() const override { return memory_bytes_; }
  int device() const override { return device_; }
  int calling_device() const override;
  int stream_device(void* stream) const override;
  // The message area of this rank's dispatch region, [T][format_input_row_bytes] (see EpGroup).
  void* dispatch_input_buffer() override;
  contract::OwnMemory dispatch_memory() const override;
  // bf16 per-token combine: combine_rows(), allocated on the first call where there are none yet (see
  // EpGroup).
  void* combine_input_buffer() override;
  contract::OwnMemory combine_memory() const override;

  // The fused calls run one kernel each; the halves one each.
  void dispatch(const DispatchInputs& inputs, const DispatchOutputs& outputs, void* stream) override;
  void combine(const CombineArgs& args, void* stream) override;
  void dispatch_send(const DispatchInputs& inputs, void* stream) override;
  void dispatch_recv(const DispatchOutputs& outputs, void* stream) override;
  void combine_send(const CombineArgs& args, void* stream) override;
  void combine_recv(const CombineArgs& args, void* stream) override;
  void combine_recv_with(const CombineArgs& args, const CombineReceiveLauncher& launcher,
                         void* stream) override;
  // Reads the status record on a stream of its own, so it never waits for the group's stream.
  RecordedError poll_error() override;
  RecordedError synchronize(void* stream) override;
  bool broken() const override { return broken_; }

 private:
  // The message area of this rank's dispatch region: [T][message_bytes], the dispatch input buffer.
  uint8_t* messages() const;
  // The combine input buffer, [world x T][hidden] bf16: where combines pull (Shape::pulled_combine), the
  // input rows of this rank's combine region; across nodes, the staging rows; else memory of its own, null
  // until combine_input_buffer first allocates it.
  uint8_t* combine_rows() const;
  // The kernels' arguments (checked by the contract before they get here).
  device::DispatchSendArgs dispatch_send_args(const DispatchInputs& inputs) const;
  device::DispatchRecvArgs dispatch_recv_args(const DispatchOutputs& outputs) const;
  device::CombineArgs combine_kernel_args(const CombineArgs& args) const;
  // Throws GpuRuntimeError naming `call` (and, for a grid that cannot be resident, EpConfig::num_sms) unless
  // `status`, a kernel launch's, is hipSuccess; the group is then broken (this rank's call never ran).
  void check_launch(const char* call, hipError_t status);
  // The status record as the kernels left it, copied on `stream` into `mirror` and waited for.
  device::Status read_status(hipStream_t stream, PinnedHostBuffer& mirror);
  // call(kernels), kernels the device::EpKernels of the group's transport; returns what it returns. A
  // build without an engine has only the IPC kernels (and no group with transport kShmem gets created).
  template <typename Call>
  hipError_t on_kernels(Call&& call) const;

  // The group's device, current while the group is destroyed (its first member: freed last, after the
  // others' memory); the caller's device is then made current again.
  DeviceScope teardown_device_;
  EpConfig config_;
  // Whether the group has a combine input buffer (contract::combine_input_buffer_error), for the check of
  // every combine's expert outputs.
  bool has_combine_input_buffer_;
  std::size_t max_recv_rows_;  // EpConfig::max_recv_rows, computed once: every dispatch_recv passes it
  int rank_;
  int device_ = -1;  // the calling thread's current device at creation
  // The last stream asked for its device and found on device_, not asked again (its calls skip two runtime
  // queries; a handle destroyed and made again on another GPU then fails at launch instead).
  mutable hipStream_t stream_on_device_ = nullptr;
  Bootstrap& world_;
  DeviceBuffer dispatch_region_;
  DeviceBuffer combine_region_;
  DeviceBuffer signals_;
  DeviceBuffer state_;
  DeviceBuffer block_calls_;  // [grid_.blocks] device::BlockCalls
  DeviceBuffer status_;
  DeviceBuffer token_rows_;
  DeviceBuffer expert_rows_;
  DeviceBuffer chunk_rows_;
  DeviceBuffer sent_ids_;
  DeviceBuffer sent_masks_;
  DeviceBuffer received_scales_;  // device::ReceivedScales, when device::scales_laid_out_later
  std::unique_ptr<PeerBuffers> peer_dispatch_regions_;
  std::unique_ptr<PeerBuffers> peer_combine_regions_;
  std::unique_ptr<PeerBuffers> peer_signals_;
  std::unique_ptr<ShmemRegions> shmem_;  // across nodes: the regions and signals, in place of the three above
  // [3][world] pointers: dispatch regions, combine regions, signals; across nodes [5][world]: then
  // PeerTransport::dispatch_sources and held_arrivals
  DeviceBuffer peer_tables_;
  DeviceBuffer arrival_adds_;          // [world] uint32: PeerTransport::arrival_adds
  DeviceBuffer node_ranks_;            // [world] uint64: PeerTransport::node_ranks
  DeviceBuffer node_summers_;          // [2][world] int32: PeerTransport::node_summers (node sums only)
  DeviceBuffer combine_input_buffer_;  // one rank or local-only, once asked for (combine_input_buffer)
  PinnedHostBuffer status_mirror_;     // synchronize's copy of status_
  // poll_error's own copy of status_ and stream, so that a poll from another thread (while a call of this
  // group or synchronize runs) shares nothing with the calls; poll_lock_ orders polls among themselves.
  PinnedHostBuffer poll_mirror_;
  Stream poll_stream_;
  std::mutex poll_lock_;
  device::GroupView view_{};
  device::LaunchGrid grid_{};  // every kernel's: from the SM budget (comm_policy.hpp)
  device::Transport transport_ = device::Transport::kIpc;
  std::size_t memory_bytes_ = 0;
  bool broken_ = false;
};

}  // namespace rocep
