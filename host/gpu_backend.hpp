// The GPU backend of EpGroup: owns the receive regions, signals and peer tables of one group and launches
// the dispatch / combine kernels on the caller's stream.
#pragma once

#include <memory>

#include "bootstrap.hpp"
#include "device_memory.hpp"
#include "hip/ep_kernels.hpp"
#include "ipc.hpp"
#include "rocep/config.hpp"
#include "rocep/types.hpp"

namespace rocep {

class GpuEp {
 public:
  // Collective over `world`. Uses the calling thread's current device. Throws ConfigError if the ranks
  // are not all on one node or the shape exceeds what the kernels support.
  GpuEp(MpiBootstrap& world, const EpConfig& config);
  ~GpuEp();
  GpuEp(const GpuEp&) = delete;
  GpuEp& operator=(const GpuEp&) = delete;

  std::size_t memory_bytes() const { return memory_bytes_; }
  // bf16 dispatch: the message area of this rank's dispatch region, [T][hidden] bf16 (see EpGroup).
  void* dispatch_input_buffer() const;

  // The fused calls run one kernel each; the halves one each.
  void dispatch(const DispatchInputs& inputs, const DispatchOutputs& outputs, hipStream_t stream);
  void combine(const CombineArgs& args, hipStream_t stream);
  void dispatch_send(const DispatchInputs& inputs, hipStream_t stream);
  void dispatch_recv(const DispatchOutputs& outputs, hipStream_t stream);
  void combine_send(const CombineArgs& args, hipStream_t stream);
  void combine_recv(const CombineArgs& args, hipStream_t stream);
  // Waits for `stream`, then throws what the kernels recorded (TimeoutError, InvalidInputError) and clears
  // it. After a timeout the group is unusable: every later call throws.
  void synchronize(hipStream_t stream);

 private:
  void require_usable() const;
  // Check the arguments of each half (throw InvalidInputError) and convert them.
  device::DispatchSendArgs dispatch_send_args(const DispatchInputs& inputs) const;
  device::DispatchRecvArgs dispatch_recv_args(const DispatchOutputs& outputs) const;
  // The same for the arguments both halves of combine take.
  device::CombineArgs combine_kernel_args(const CombineArgs& args) const;

  EpConfig config_;
  int rank_;
  std::unique_ptr<MpiBootstrap> node_;
  DeviceBuffer dispatch_region_;
  DeviceBuffer combine_region_;
  DeviceBuffer signals_;
  DeviceBuffer state_;
  DeviceBuffer block_calls_;  // [blocks_] device::BlockCalls
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
  DeviceBuffer peer_tables_;  // [3][world] pointers: dispatch regions, combine regions, signals
  PinnedHostBuffer status_mirror_;
  device::GroupView view_{};
  int blocks_ = 0;
  std::size_t memory_bytes_ = 0;
  bool broken_ = false;
};

}  // namespace rocep
