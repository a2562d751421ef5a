#include "gpu_backend.hpp"

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "device.hpp"
#include "gpu_check.hpp"
#include "reference.hpp"
#include "rocep/errors.hpp"

namespace rocep {

namespace {

using device::Operation;
using device::StatusCode;

const char* operation_name(int32_t operation) {
  switch (static_cast<Operation>(operation)) {
    case Operation::kDispatchSend:
      return "dispatch_send";
    case Operation::kDispatchRecv:
      return "dispatch_recv";
    case Operation::kCombineSend:
      return "combine_send";
    case Operation::kCombineRecv:
      return "combine_recv";
    case Operation::kNone:
      break;
  }
  return "unknown operation";
}

DeviceBuffer zeroed(std::size_t bytes, DeviceMemoryKind kind = DeviceMemoryKind::kDefault) {
  DeviceBuffer buffer(bytes, kind);
  if (bytes > 0) {
    ROCEP_GPU_CHECK(hipMemset(buffer.get(), 0, bytes));
  }
  return buffer;
}

}  // namespace

GpuEp::GpuEp(MpiBootstrap& world, const EpConfig& config)
    : config_(config), rank_(world.rank()), node_(world.split_node()) {
  if (node_->size() != world.size()) {
    throw ConfigError("EpGroup: backend gpu needs every rank on one node (this node has " +
                      std::to_string(node_->size()) + " of " + std::to_string(world.size()) +
                      " ranks); multi-node groups are not supported yet");
  }
  if (world.size() > device::kMaxWorld) {
    throw ConfigError("EpGroup: world size " + std::to_string(world.size()) +
                      " is invalid for backend gpu: allowed range is [1, " +
                      std::to_string(device::kMaxWorld) + "]");
  }
  if (config.top_k > device::kMaxTopK) {
    throw ConfigError("EpConfig.top_k = " + std::to_string(config.top_k) +
                      " is invalid for backend gpu: allowed range is [1, " +
                      std::to_string(device::kMaxTopK) + "]");
  }
  if (config.num_local_experts(world.size()) > device::kMaxLocalExperts) {
    throw ConfigError("EpConfig.num_experts = " + std::to_string(config.num_experts) + " gives " +
                      std::to_string(config.num_local_experts(world.size())) +
                      " experts per rank, invalid for backend gpu: allowed range is [1, " +
                      std::to_string(device::kMaxLocalExperts) + "] per rank");
  }
  int resident_per_multiprocessor = 1 << 30;
  ROCEP_GPU_CHECK(device::load_dispatch_kernels(&resident_per_multiprocessor));
  ROCEP_GPU_CHECK(device::load_combine_kernels(&resident_per_multiprocessor));
  const int device = current_device();
  hipDeviceProp_t properties;
  ROCEP_GPU_CHECK(hipGetDeviceProperties(&properties, device));
  const int resident_blocks = resident_per_multiprocessor * properties.multiProcessorCount;
  if (config.num_blocks > resident_blocks) {
    throw ConfigError("EpConfig.num_blocks = " + std::to_string(config.num_blocks) +
                      " is invalid on this device: allowed range is [1, " + std::to_string(resident_blocks) +
                      "] (the blocks of one kernel must all be resident at once)");
  }
  // Ranks of this node that run on this same GPU (several ranks per GPU under MPS) share its
  // multiprocessors: each one's grid must fit its share, or ranks spinning on each other deadlock.
  const int gpu_id[3] = {properties.pciDomainID, properties.pciBusID, properties.pciDeviceID};
  std::vector<int> gpu_ids(3 * static_cast<std::size_t>(node_->size()));
  node_->all_gather(gpu_id, gpu_ids.data(), sizeof gpu_id);
  int ranks_on_this_gpu = 0;
  for (int peer = 0; peer < node_->size(); ++peer) {
    ranks_on_this_gpu += std::equal(gpu_id, gpu_id + 3, gpu_ids.begin() + 3 * peer) ? 1 : 0;
  }
  // Every block that fits: the copies are bound by memory latency, so more blocks in flight move more bytes
  // (on H200, 3 blocks per multiprocessor instead of 1 took prefill dispatch from 452 to 385 us).
  blocks_ = config.num_blocks > 0 ? config.num_blocks : std::max(1, resident_blocks / ranks_on_this_gpu);

  device::Shape& shape = view_.shape;
  shape.hidden = config.hidden;
  shape.top_k = config.top_k;
  shape.num_experts = config.num_experts;
  shape.local_experts = config.num_local_experts(world.size());
  shape.world = world.size();
  shape.rank = world.rank();
  shape.max_tokens = config.max_tokens_per_rank;
  shape.alignment = config.expert_alignment;
  shape.payload_bytes = static_cast<uint32_t>(format_payload_bytes(config.dispatch_format, config.hidden));
  shape.scale_bytes = static_cast<uint32_t>(format_scale_bytes(config.dispatch_format, config.hidden));
  shape.message_bytes = shape.payload_bytes + (shape.scale_bytes + 15) / 16 * 16;
  shape.format = static_cast<device::Format>(config.dispatch_format);
  shape.fp8_encoding = static_cast<device::Fp8>(config.fp8_encoding);  // resolved by EpGroup

  const std::size_t slots = static_cast<std::size_t>(shape.max_tokens) * shape.top_k;
  dispatch_region_ = DeviceBuffer(ipc_allocation_bytes(device::DispatchRegion::bytes(shape)));
  combine_region_ = DeviceBuffer(ipc_allocation_bytes(device::CombineRegion::bytes(shape)));
  signals_ = zeroed(ipc_allocation_bytes(sizeof(device::Signals)), DeviceMemoryKind::kPolledFlags);
  state_ = zeroed(sizeof(device::LocalState));
  block_calls_ = zeroed(static_cast<std::size_t>(blocks_) * sizeof(device::BlockCalls));
  status_ = zeroed(sizeof(device::Status));
  token_rows_ = DeviceBuffer(slots * shape.world * sizeof(int32_t));
  expert_rows_ = DeviceBuffer(shape.local_experts * sizeof(uint32_t));
  const std::size_t chunks = static_cast<std::size_t>(shape.world) * device::chunks_per_source(shape);
  chunk_rows_ = DeviceBuffer(chunks * shape.local_experts * sizeof(uint32_t));
  sent_ids_ = DeviceBuffer(slots * sizeof(int32_t));
  sent_masks_ = DeviceBuffer(static_cast<std::size_t>(shape.max_tokens) * sizeof(uint64_t));
  received_scales_ =
      DeviceBuffer(device::scales_laid_out_later(shape) ? device::ReceivedScales::bytes(shape) : 0);
  ROCEP_GPU_CHECK(hipDeviceSynchronize());

  peer_dispatch_regions_ = std::make_unique<PeerBuffers>(*node_, dispatch_region_);
  peer_combine_regions_ = std::make_unique<PeerBuffers>(*node_, combine_region_);
  peer_signals_ = std::make_unique<PeerBuffers>(*node_, signals_);
  std::vector<void*> tables;
  for (const PeerBuffers* peers :
       {peer_dispatch_regions_.get(), peer_combine_regions_.get(), peer_signals_.get()}) {
    tables.insert(tables.end(), peers->pointers().begin(), peers->pointers().end());
  }
  peer_tables_ = DeviceBuffer(tables.size() * sizeof(void*));
  ROCEP_GPU_CHECK(hipMemcpy(peer_tables_.get(), tables.data(), peer_tables_.bytes(), hipMemcpyHostToDevice));
  status_mirror_ = PinnedHostBuffer(sizeof(device::Status));

  auto* table = peer_tables_.as<void*>();
  view_.peer_dispatch_regions = reinterpret_cast<uint8_t* const*>(table);
  view_.peer_combine_regions = reinterpret_cast<uint8_t* const*>(table + shape.world);
  view_.peer_signals = reinterpret_cast<device::Signals* const*>(table + 2 * shape.world);
  view_.signals = signals_.as<device::Signals>();
  view_.dispatch_region = dispatch_region_.as<uint8_t>();
  view_.combine_region = combine_region_.as<uint8_t>();
  view_.state = state_.as<device::LocalState>();
  view_.block_calls = block_calls_.as<device::BlockCalls>();
  view_.status = status_.as<device::Status>();
  view_.token_rows = token_rows_.as<int32_t>();
  view_.expert_rows = expert_rows_.as<uint32_t>();
  view_.chunk_rows = chunk_rows_.as<uint32_t>();
  view_.sent_ids = sent_ids_.as<int32_t>();
  view_.sent_masks = sent_masks_.as<uint64_t>();
  view_.received_scales = received_scales_.as<uint8_t>();
  view_.timeout_ticks =
      static_cast<uint64_t>(config.timeout_seconds * static_cast<double>(wall_clock_rate_hz(device)));

  for (const DeviceBuffer* buffer :
       {&dispatch_region_, &combine_region_, &signals_, &state_, &block_calls_, &status_, &token_rows_,
        &expert_rows_, &chunk_rows_, &sent_ids_, &sent_masks_, &received_scales_, &peer_tables_}) {
    memory_bytes_ += buffer->bytes();
  }
  node_->barrier();  // every peer has mapped everything before anyone may signal
}

GpuEp::~GpuEp() {
  // Peers may still store into this rank's regions until they are done with the last call: wait for them,
  // but never longer than the timeout (a peer may be gone), and not at all once this group has failed.
  if (!broken_) {
    try {
      (void)hipDeviceSynchronize();
      (void)node_->barrier_within(config_.timeout_seconds);
    } catch (const Error&) {
      // Destruction goes on regardless: the mappings and buffers are released below.
    }
  }
}

void GpuEp::require_usable() const {
  if (broken_) {
    throw Error("EpGroup: a previous call timed out; this group is unusable and must be destroyed");
  }
}

void* GpuEp::dispatch_input_buffer() const {
  const std::string error = reference::input_buffer_format_error(config_);
  if (!error.empty()) {
    throw ConfigError(error);
  }
  return dispatch_region_.as<uint8_t>() + device::DispatchRegion::message_offset(view_.shape, 0);
}

device::DispatchSendArgs GpuEp::dispatch_send_args(const DispatchInputs& inputs) const {
  require_usable();
  if (inputs.num_tokens_on_device == nullptr &&
      (inputs.num_tokens < 0 || inputs.num_tokens > config_.max_tokens_per_rank)) {
    throw InvalidInputError("dispatch: rank " + std::to_string(rank_) +
                            " passed num_tokens = " + std::to_string(inputs.num_tokens) +
                            ", allowed range is [0, " + std::to_string(config_.max_tokens_per_rank) + "]");
  }
  if (inputs.tokens == nullptr || inputs.topk_ids == nullptr || inputs.topk_weights == nullptr) {
    throw InvalidInputError("dispatch: rank " + std::to_string(rank_) +
                            " passed a null tokens/topk_ids/topk_weights pointer");
  }
  const std::string format_error = reference::dispatch_format_input_error(config_, rank_, inputs);
  if (!format_error.empty()) {
    throw InvalidInputError(format_error);
  }
  // Tokens in this rank's own dispatch region are valid only at the input buffer (bf16): anywhere else the
  // staging copy would overwrite tokens it has yet to read.
  const void* buffer = config_.dispatch_format == TokenFormat::kBf16 ? dispatch_input_buffer() : nullptr;
  const std::string misplaced = reference::misplaced_tokens_error(
      rank_, inputs.tokens, dispatch_region_.get(), dispatch_region_.bytes(), buffer);
  if (!misplaced.empty()) {
    throw InvalidInputError(misplaced);
  }
  return {static_cast<const uint8_t*>(inputs.tokens),
          static_cast<const uint8_t*>(inputs.token_scales),
          inputs.global_scale,
          inputs.topk_ids,
          inputs.topk_weights,
          inputs.num_tokens,
          inputs.num_tokens_on_device,
          buffer != nullptr && inputs.tokens == buffer};
}

device::DispatchRecvArgs GpuEp::dispatch_recv_args(const DispatchOutputs& outputs) const {
  require_usable();
  if (outputs.recv_tokens == nullptr || outputs.row_offsets == nullptr || outputs.expert_ids == nullptr ||
      outputs.src_info == nullptr || outputs.recv_weights == nullptr) {
    throw InvalidInputError("dispatch_recv: rank " + std::to_string(rank_) + " passed a null output pointer");
  }
  const std::string format_error = reference::dispatch_format_output_error(config_, rank_, outputs);
  if (!format_error.empty()) {
    throw InvalidInputError(format_error);
  }
  static_assert(sizeof(SrcInfo) == 3 * sizeof(int32_t), "src_info rows are three int32");
  return {static_cast<uint8_t*>(outputs.recv_tokens),
          static_cast<uint8_t*>(outputs.recv_scales),
          config_.max_recv_rows(view_.shape.world),
          outputs.row_offsets,
          outputs.expert_ids,
          reinterpret_cast<int32_t*>(outputs.src_info),
          outputs.recv_weights,
          outputs.expert_token_counts};
}

void GpuEp::dispatch(const DispatchInputs& inputs, const DispatchOutputs& outputs, hipStream_t stream) {
  device::launch_dispatch(view_, dispatch_send_args(inputs), dispatch_recv_args(outputs), blocks_, stream);
  ROCEP_GPU_CHECK(hipGetLastError());
}

void GpuEp::dispatch_send(const DispatchInputs& inputs, hipStream_t stream) {
  device::launch_dispatch_send(view_, dispatch_send_args(inputs), blocks_, stream);
  ROCEP_GPU_CHECK(hipGetLastError());
}

void GpuEp::dispatch_recv(const DispatchOutputs& outputs, hipStream_t stream) {
  device::launch_dispatch_recv(view_, dispatch_recv_args(outputs), blocks_, stream);
  ROCEP_GPU_CHECK(hipGetLastError());
}

device::CombineArgs GpuEp::combine_kernel_args(const CombineArgs& args) const {
  require_usable();
  if (args.expert_outputs == nullptr || args.out == nullptr) {
    throw InvalidInputError("combine: rank " + std::to_string(rank_) +
                            " passed a null expert_outputs/out pointer");
  }
  return {static_cast<const uint16_t*>(args.expert_outputs), args.row_weights,
          static_cast<const uint16_t*>(args.shared_expert_output), static_cast<uint16_t*>(args.out)};
}

void GpuEp::combine(const CombineArgs& args, hipStream_t stream) {
  device::launch_combine(view_, combine_kernel_args(args), blocks_, stream);
  ROCEP_GPU_CHECK(hipGetLastError());
}

void GpuEp::combine_send(const CombineArgs& args, hipStream_t stream) {
  device::launch_combine_send(view_, combine_kernel_args(args), blocks_, stream);
  ROCEP_GPU_CHECK(hipGetLastError());
}

void GpuEp::combine_recv(const CombineArgs& args, hipStream_t stream) {
  device::launch_combine_recv(view_, combine_kernel_args(args), blocks_, stream);
  ROCEP_GPU_CHECK(hipGetLastError());
}

void GpuEp::synchronize(hipStream_t stream) {
  auto* status = status_mirror_.as<device::Status>();
  ROCEP_GPU_CHECK(hipMemcpyAsync(status, status_.get(), sizeof *status, hipMemcpyDeviceToHost, stream));
  ROCEP_GPU_CHECK(hipStreamSynchronize(stream));
  const auto code = static_cast<StatusCode>(status->code);
  if (code == StatusCode::kOk) {
    return;
  }
  const std::string where =
      std::string(operation_name(status->operation)) + " on rank " + std::to_string(rank_);
  if (code == StatusCode::kTimeout) {
    broken_ = true;  // sequence numbers no longer agree across ranks
    char seconds[32];
    std::snprintf(seconds, sizeof seconds, "%g", config_.timeout_seconds);
    throw TimeoutError(where + ": timed out after " + seconds + " s waiting for rank " +
                       std::to_string(status->peer) + " to signal call " + std::to_string(status->value));
  }
  ROCEP_GPU_CHECK(hipMemsetAsync(status_.get(), 0, sizeof *status, stream));
  ROCEP_GPU_CHECK(hipStreamSynchronize(stream));
  std::string message = where;
  if (code == StatusCode::kTokenCountOutOfRange) {
    message += ": num_tokens = " + std::to_string(status->value) + " (device), allowed range is [0, " +
               std::to_string(config_.max_tokens_per_rank) + "]; no token was sent";
  } else {
    message += ", token " + std::to_string(status->token) + ", slot " + std::to_string(status->slot) +
               ": expert id " + std::to_string(status->value) +
               (code == StatusCode::kExpertRepeated
                    ? " is named twice by this token"
                    : " is outside [-1, " + std::to_string(config_.num_experts) + ")") +
               "; that slot was not dispatched";
  }
  throw InvalidInputError(message);
}

}  // namespace rocep
