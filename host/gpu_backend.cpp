#include "gpu_backend.hpp"

#include <algorithm>
#include <array>
#include <string>
#include <vector>

#include "agreement.hpp"
#include "comm_policy.hpp"
#include "device.hpp"
#include "gpu_check.hpp"
#include "node.hpp"
#include "rocep/errors.hpp"
#include "shmem_regions.hpp"
#include "topology.hpp"

namespace rocep {

namespace {

DeviceBuffer zeroed(std::size_t bytes, DeviceMemoryKind kind = DeviceMemoryKind::kLocal) {
  DeviceBuffer buffer(bytes, kind);
  if (bytes > 0) {
    ROCEP_GPU_CHECK(hipMemset(buffer.get(), 0, bytes));
  }
  return buffer;
}

}  // namespace

template <typename Call>
hipError_t GpuEp::on_kernels(Call&& call) const {
#if defined(ROCEP_WITH_SHMEM_KERNELS)
  if (transport_ == device::Transport::kShmem) {
    return call(device::EpKernels<device::Transport::kShmem>{});
  }
#endif
  return call(device::EpKernels<device::Transport::kIpc>{});
}

GpuEp::GpuEp(Bootstrap& world, const EpConfig& config)
    : config_(config),
      has_combine_input_buffer_(contract::combine_input_buffer_error(config).empty()),
      max_recv_rows_(config.max_recv_rows(world.size())),
      rank_(world.rank()),
      world_(world) {
  // The limits of backend gpu see the same values on every rank (the config is agreed, the node layout is
  // gathered), so every rank fails alike; an agreed step all the same, so that the error names the rank and
  // the step, as every other failure at creation does.
  const NodeLayout layout = node_layout(world, config.gpus_per_node);
  transport_ = layout.num_nodes == 1 ? device::Transport::kIpc : device::Transport::kShmem;
  run_agreed(world, "validating the EpConfig for backend gpu", [&] {
    if (world.size() > device::kMaxWorld) {
      throw ConfigError("world size " + std::to_string(world.size()) +
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
  });
  // Refused here, on every rank, rather than hanging in the first call: the node's ranks must reach each
  // other's GPUs peer-to-peer.
  std::vector<bool> on_this_node;
  for (int peer = 0; peer < world.size(); ++peer) {
    on_this_node.push_back(layout.on_this_node(peer));
  }
  const NodeGroupTopology node_gpus = gather_node_topology(world, on_this_node);
  run_agreed(world, "the peer-to-peer check", [&] {
    const std::string error = peer_to_peer_error(node_gpus.topology, node_gpus.rank_gpus);
    if (!error.empty()) {
      throw ConfigError(error);
    }
  });
  run_agreed(world, "loading the kernels", [&] {
    int resident_per_multiprocessor = 1 << 30;
    const bool per_token = config.layout == Layout::kPerToken;
    ROCEP_GPU_CHECK(on_kernels([&](auto kernels) {
      const hipError_t status = kernels.load_dispatch_kernels(per_token, &resident_per_multiprocessor);
      return status != hipSuccess ? status
                                  : kernels.load_combine_kernels(per_token, &resident_per_multiprocessor);
    }));
    device_ = current_device();
    hipDeviceProp_t properties;
    ROCEP_GPU_CHECK(hipGetDeviceProperties(&properties, device_));
    // Ranks that run on this same GPU (several ranks per GPU under MPS; with nodes declared by
    // gpus_per_node, also ranks of other declared nodes) share its multiprocessors: each one's grid must fit
    // its share, or ranks spinning on each other deadlock.
    const int ranks_on_this_gpu = node_gpus.ranks_on_this_gpu;
    // One block per multiprocessor of the budget, at most the rank's share: with every kernel keeping at
    // least one block resident per multiprocessor, the grids of all the ranks on this GPU are resident
    // together (checked here, so a grid too large is refused at creation rather than spinning).
    const CommPolicy policy = comm_policy();
    const int sms = sm_budget(config.num_sms, properties.multiProcessorCount, ranks_on_this_gpu, policy);
    if (resident_per_multiprocessor < 1) {
      throw GpuRuntimeError(
          std::string(
              "EpGroup: a dispatch / combine kernel keeps no block resident on a multiprocessor of ") +
          properties.name + " (shared memory or registers)");
    }
    if (policy.cooperative_launch && properties.cooperativeLaunch == 0) {
      throw GpuRuntimeError(std::string("EpGroup: ") + properties.name +
                            " does not support cooperative launches, which keep the kernels' grids resident");
    }
    // With the whole share the kernels own it: every block that stays resident there, more bytes in flight.
    const int blocks = config.num_sms == EpConfig::kAllSms ? sms * resident_per_multiprocessor : sms;
    grid_ = {blocks, policy.launch_cooperatively(config.num_sms), config.num_sms != EpConfig::kAllSms};
  });

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
  shape.message_bytes = static_cast<uint32_t>(format_input_row_bytes(config.dispatch_format, config.hidden));
  shape.format = static_cast<device::Format>(config.dispatch_format);
  shape.fp8_encoding = static_cast<device::Fp8>(config.fp8_encoding);  // resolved by EpGroup
  shape.per_token = config.layout == Layout::kPerToken ? 1 : 0;
  shape.combine_fp8 = config.combine_dtype == CombineDtype::kFp8Block128 ? 1 : 0;
  shape.local_only = config.local_only ? 1 : 0;
  shape.allreduce_world_size = config.allreduce_world_size;
  // Within one node the combine input buffer is part of the combine region, where the peers load from it.
  shape.pulled_combine =
      has_combine_input_buffer_ && layout.num_nodes == 1 && world.size() > 1 && !config.local_only ? 1 : 0;
  // Across nodes, the per-token combine sums each node's rows first where sums_nodes says so.
  const NodeSumPlan node_sums = sums_nodes(config, layout) ? node_sum_plan(layout) : NodeSumPlan{};
  shape.node_sums = node_sums.slots;
  // Senders flag a combine's chunks only where every receive can use them (hip/combine.hip); a combine that
  // sums nodes first sends its sums once its node's rows are staged, so it is not chunked.
  const int32_t blocks = grid_.blocks;
  std::vector<int32_t> grids(static_cast<std::size_t>(world.size()));
  world.all_gather(&blocks, grids.data(), sizeof(blocks));
  const int32_t smallest_grid = *std::min_element(grids.begin(), grids.end());
  // Local-only: no rows cross, so a fused combine's blocks all receive.
  shape.split_combine = smallest_grid >= device::PerTokenTuning::kCombineSplitBlocks && !config.local_only &&
                                shape.node_sums == 0
                            ? 1
                            : 0;
  shape.combine_chunk_tokens = device::PerTokenTuning::combine_chunk_tokens(smallest_grid);

  const std::size_t dispatch_bytes = device::DispatchRegion::bytes(shape);
  const std::size_t combine_bytes = device::CombineRegion::bytes(shape);
  run_agreed(world, "allocating the group's memory", [&] {
    const std::size_t slots = static_cast<std::size_t>(shape.max_tokens) * shape.top_k;
    // Peers store into these three, load from the dispatch region and poll the signals while kernels run
    // (docs/design.md, "Memory regions and who writes them"). Across nodes they are the SHMEM engine's.
    if (layout.num_nodes == 1) {
      dispatch_region_ = DeviceBuffer(dispatch_bytes, DeviceMemoryKind::kPeerVisible);
      combine_region_ = zeroed(combine_bytes, DeviceMemoryKind::kPeerVisible);
      signals_ = zeroed(sizeof(device::Signals), DeviceMemoryKind::kPeerVisible);
    }
    state_ = zeroed(sizeof(device::LocalState));
    block_calls_ = zeroed(static_cast<std::size_t>(grid_.blocks) * sizeof(device::BlockCalls));
    status_ = zeroed(sizeof(device::Status));
    token_rows_ = DeviceBuffer(slots * shape.world * sizeof(int32_t));
    expert_rows_ = DeviceBuffer(shape.local_experts * sizeof(uint32_t));
    const std::size_t chunks = static_cast<std::size_t>(shape.world) * device::chunks_per_source(shape);
    chunk_rows_ = DeviceBuffer(chunks * shape.local_experts * sizeof(uint32_t));
    sent_ids_ = DeviceBuffer(slots * sizeof(int32_t));
    sent_masks_ = DeviceBuffer(static_cast<std::size_t>(shape.max_tokens) * sizeof(uint64_t));
    received_scales_ =
        DeviceBuffer(device::scales_laid_out_later(shape) ? device::ReceivedScales::bytes(shape) : 0);
    status_mirror_ = PinnedHostBuffer(sizeof(device::Status));
    poll_mirror_ = PinnedHostBuffer(sizeof(device::Status));
    poll_stream_ = Stream();
    ROCEP_GPU_CHECK(hipDeviceSynchronize());
  });

  std::vector<void*> tables;  // [3][world]: dispatch regions, combine regions, signals
  if (layout.num_nodes == 1) {
    // IPC: every rank exports its three regions, the handles are gathered, every rank maps its peers'.
    constexpr int kRegions = 3;
    std::array<IpcBufferHandle, kRegions> mine{};
    run_agreed(world, "exporting the group's memory over IPC", [&] {
      mine = {export_ipc(dispatch_region_), export_ipc(combine_region_), export_ipc(signals_)};
    });
    std::vector<std::array<IpcBufferHandle, kRegions>> gathered(world.size());
    world.all_gather(&mine, gathered.data(), sizeof mine);
    run_agreed(world, "mapping the peers' memory over IPC", [&] {
      std::array<std::unique_ptr<PeerBuffers>*, kRegions> peers = {&peer_dispatch_regions_,
                                                                   &peer_combine_regions_, &peer_signals_};
      std::array<const DeviceBuffer*, kRegions> locals = {&dispatch_region_, &combine_region_, &signals_};
      for (int region = 0; region < kRegions; ++region) {
        std::vector<IpcBufferHandle> handles;
        for (const auto& rank_handles : gathered) {
          handles.push_back(rank_handles[region]);
        }
        *peers[region] = std::make_unique<PeerBuffers>(handles, rank_, *locals[region]);
        tables.insert(tables.end(), (*peers[region])->pointers().begin(), (*peers[region])->pointers().end());
      }
    });
    view_.signals = signals_.as<device::Signals>();
    view_.dispatch_region = dispatch_region_.as<uint8_t>();
    view_.combine_region = combine_region_.as<uint8_t>();
  } else {
    // Across nodes: the engine's symmetric memory, peers of other nodes reached by puts (hip/transport.hpp).
    run_agreed(world, "allocating the group's symmetric memory in the SHMEM engine",
               [&] { shmem_ = std::make_unique<ShmemRegions>(world, layout, ShmemRegionSizes::of(shape)); });
    for (const std::vector<void*>* table : {&shmem_->dispatch_windows(), &shmem_->combine_windows(),
                                            &shmem_->signal_pointers(), &shmem_->dispatch_sources()}) {
      tables.insert(tables.end(), table->begin(), table->end());
    }
    for (int peer = 0; peer < shape.world; ++peer) {
      auto* held = static_cast<device::Signals*>(shmem_->held_signals()[peer]);
      tables.push_back(held != nullptr ? &held->dispatch_arrived[peer] : nullptr);
    }
    for (const std::vector<void*>* table : {&shmem_->node_sum_windows(), &shmem_->staged_rows()}) {
      tables.insert(tables.end(), table->begin(), table->end());
    }
    view_.peers.share_peers = shmem_->share_peers();
    view_.signals = static_cast<device::Signals*>(shmem_->signals());
    view_.dispatch_region = shmem_->dispatch_region();
    view_.combine_region = shmem_->combine_region();
    view_.peers.shmem_peers = shmem_->shmem_peers();
    view_.peers.own_dispatch_region = shmem_->dispatch_region();
    view_.peers.own_combine_region = shmem_->combine_region();
    view_.peers.own_signals = view_.signals;
    view_.peers.own_dispatch_image = shmem_->own_dispatch_image();
    view_.peers.combine_staging = shmem_->combine_staging();
    view_.peers.rank = rank_;
    memory_bytes_ += shmem_->bytes();
  }
  // The arrival adds of each peer's call: its grid's last block signals, or, from another node, each block
  // of its grid (hip/transport.hpp).
  std::vector<uint32_t> arrival_adds;
  for (int peer = 0; peer < world.size(); ++peer) {
    arrival_adds.push_back(layout.on_this_node(peer) ? 1u : static_cast<uint32_t>(grids[peer]));
  }
  // PeerTransport::node_ranks: bit q of entry r, rank q shares rank r's node.
  std::vector<uint64_t> node_ranks(static_cast<std::size_t>(world.size()), 0);
  for (int peer = 0; peer < world.size(); ++peer) {
    for (int other = 0; other < world.size(); ++other) {
      if (layout.node_of_rank[other] == layout.node_of_rank[peer]) {
        node_ranks[static_cast<std::size_t>(peer)] |= uint64_t{1} << other;
      }
    }
  }
  run_agreed(world, "copying the peer tables to the GPU", [&] {
    peer_tables_ = DeviceBuffer(tables.size() * sizeof(void*));
    ROCEP_GPU_CHECK(
        hipMemcpy(peer_tables_.get(), tables.data(), peer_tables_.bytes(), hipMemcpyHostToDevice));
    arrival_adds_ = DeviceBuffer(arrival_adds.size() * sizeof(uint32_t));
    ROCEP_GPU_CHECK(
        hipMemcpy(arrival_adds_.get(), arrival_adds.data(), arrival_adds_.bytes(), hipMemcpyHostToDevice));
    node_ranks_ = DeviceBuffer(node_ranks.size() * sizeof(uint64_t));
    ROCEP_GPU_CHECK(
        hipMemcpy(node_ranks_.get(), node_ranks.data(), node_ranks_.bytes(), hipMemcpyHostToDevice));
    node_summers_ = DeviceBuffer(node_sums.summers.size() * sizeof(int32_t));
    if (!node_sums.summers.empty()) {
      ROCEP_GPU_CHECK(hipMemcpy(node_summers_.get(), node_sums.summers.data(), node_summers_.bytes(),
                                hipMemcpyHostToDevice));
    }
  });
  view_.peers.arrival_adds = arrival_adds_.as<uint32_t>();
  view_.peers.node_ranks = node_ranks_.as<uint64_t>();

  auto* table = peer_tables_.as<void*>();
  view_.peers.dispatch_regions = reinterpret_cast<uint8_t* const*>(table);
  view_.peers.combine_regions = reinterpret_cast<uint8_t* const*>(table + shape.world);
  view_.peers.signals = reinterpret_cast<device::Signals* const*>(table + 2 * shape.world);
  // Across nodes the tables are [7][world]: then where the dispatch messages are read, the arrival words
  // of their holders, and this node's node sums and staging rows.
  if (shmem_) {
    view_.peers.dispatch_sources = reinterpret_cast<const uint8_t* const*>(table + 3 * shape.world);
    view_.peers.held_arrivals = reinterpret_cast<const uint64_t* const*>(table + 4 * shape.world);
    view_.peers.node_sums = reinterpret_cast<uint8_t* const*>(table + 5 * shape.world);
    view_.peers.staged_rows = reinterpret_cast<uint8_t* const*>(table + 6 * shape.world);
  }
  view_.peers.node_summers = node_summers_.as<int32_t>();
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
      static_cast<uint64_t>(config.timeout_seconds * static_cast<double>(wall_clock_rate_hz(device_)));

  for (const DeviceBuffer* buffer :
       {&dispatch_region_, &combine_region_, &signals_, &state_, &block_calls_, &status_, &token_rows_,
        &expert_rows_, &chunk_rows_, &sent_ids_, &sent_masks_, &received_scales_, &peer_tables_,
        &arrival_adds_, &node_ranks_, &node_summers_}) {
    memory_bytes_ += buffer->bytes();
  }
  world.barrier();  // every peer has mapped everything before anyone may signal
}

GpuEp::~GpuEp() {
  // Close the mappings of the peers' memory first, then wait for the peers to close theirs (a peer may
  // still store into this rank's memory until its last call ends), then free this rank's memory. After a
  // timeout nobody is waited for, and the exported memory is given up without being freed. The caller's
  // current device may be another GPU: the group's is made current for all of it.
  teardown_device_.enter(device_);
  (void)hipDeviceSynchronize();
  peer_dispatch_regions_.reset();
  peer_combine_regions_.reset();
  peer_signals_.reset();
  bool peers_done = false;
  if (!broken_) {
    try {
      peers_done = world_.barrier_within(config_.timeout_seconds);
    } catch (const std::exception&) {
      peers_done = false;  // destruction goes on regardless
    }
  }
  if (!peers_done) {
    dispatch_region_.leak();
    combine_region_.leak();
    signals_.leak();
    if (shmem_) {
      shmem_->leak();
    }
  }
}

uint8_t* GpuEp::messages() const {
  return view_.dispatch_region + device::DispatchRegion::message_offset(view_.shape, 0);
}

void* GpuEp::dispatch_input_buffer() {
  return messages();
}

void* GpuEp::combine_input_buffer() {
  if (combine_rows() == nullptr) {
    combine_input_buffer_ = DeviceBuffer(combine_memory().bytes);
    memory_bytes_ += combine_input_buffer_.bytes();
  }
  return combine_rows();
}

uint8_t* GpuEp::combine_rows() const {
  if (view_.shape.pulled_combine != 0) {
    return view_.combine_region + device::CombineRegion::input_rows_offset(view_.shape);
  }
  return view_.peers.combine_staging != nullptr ? view_.peers.combine_staging
                                                : combine_input_buffer_.as<uint8_t>();
}

contract::OwnMemory GpuEp::combine_memory() const {
  const void* first = combine_rows();
  return {first,
          static_cast<std::size_t>(view_.shape.world) * view_.shape.max_tokens *
              device::CombineRegion::row_bytes(view_.shape),
          has_combine_input_buffer_ ? first : nullptr};
}

contract::OwnMemory GpuEp::dispatch_memory() const {
  return {view_.dispatch_region, device::DispatchRegion::bytes(view_.shape), messages()};
}

device::DispatchSendArgs GpuEp::dispatch_send_args(const DispatchInputs& inputs) const {
  const void* buffer = dispatch_memory().input_buffer;
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
  static_assert(sizeof(SrcInfo) == 3 * sizeof(int32_t), "src_info rows are three int32");
  return {static_cast<uint8_t*>(outputs.recv_tokens),
          static_cast<uint8_t*>(outputs.recv_scales),
          max_recv_rows_,
          outputs.row_offsets,
          outputs.expert_ids,
          reinterpret_cast<int32_t*>(outputs.src_info),
          outputs.recv_weights,
          outputs.expert_token_counts,
          outputs.recv_topk_ids,
          outputs.recv_topk_weights,
          outputs.num_recv_tokens,
          outputs.sorted_token_ids,
          outputs.block_expert_ids,
          outputs.expert_input_scales};
}

void GpuEp::dispatch(const DispatchInputs& inputs, const DispatchOutputs& outputs, void* stream) {
  check_launch("dispatch", on_kernels([&](auto kernels) {
                 return kernels.launch_dispatch(view_, dispatch_send_args(inputs),
                                                dispatch_recv_args(outputs), grid_,
                                                static_cast<hipStream_t>(stream));
               }));
}

void GpuEp::dispatch_send(const DispatchInputs& inputs, void* stream) {
  check_launch("dispatch_send", on_kernels([&](auto kernels) {
                 return kernels.launch_dispatch_send(view_, dispatch_send_args(inputs), grid_,
                                                     static_cast<hipStream_t>(stream));
               }));
}

void GpuEp::dispatch_recv(const DispatchOutputs& outputs, void* stream) {
  check_launch("dispatch_recv", on_kernels([&](auto kernels) {
                 return kernels.launch_dispatch_recv(view_, dispatch_recv_args(outputs), grid_,
                                                     static_cast<hipStream_t>(stream));
               }));
}

device::CombineArgs GpuEp::combine_kernel_args(const CombineArgs& args) const {
  const std::size_t stride =
      args.out_row_stride != 0 ? args.out_row_stride : static_cast<std::size_t>(view_.shape.hidden);
  return {static_cast<const uint16_t*>(args.expert_outputs),
          args.row_weights,
          static_cast<const uint16_t*>(args.shared_expert_output),
          static_cast<uint16_t*>(args.out),
          args.factor,
          args.token_factors,
          static_cast<const uint16_t*>(args.residual),
          static_cast<uint32_t>(stride)};
}

void GpuEp::combine(const CombineArgs& args, void* stream) {
  check_launch("combine", on_kernels([&](auto kernels) {
                 return kernels.launch_combine(view_, combine_kernel_args(args), grid_,
                                               static_cast<hipStream_t>(stream));
               }));
}

void GpuEp::combine_send(const CombineArgs& args, void* stream) {
  check_launch("combine_send", on_kernels([&](auto kernels) {
                 return kernels.launch_combine_send(view_, combine_kernel_args(args), grid_,
                                                    static_cast<hipStream_t>(stream));
               }));
}

void GpuEp::combine_recv(const CombineArgs& args, void* stream) {
  check_launch("combine_recv", on_kernels([&](auto kernels) {
                 return kernels.launch_combine_recv(view_, combine_kernel_args(args), grid_,
                                                    static_cast<hipStream_t>(stream));
               }));
}

void GpuEp::combine_recv_with(const CombineArgs& args, const CombineReceiveLauncher& launcher, void* stream) {
  const device::CombineArgs kernel_args = combine_kernel_args(args);
  check_launch("combine_recv_with", static_cast<hipError_t>(launcher.launch(
                                        &view_, &kernel_args, grid_.blocks, stream, launcher.epilogue)));
}

int GpuEp::calling_device() const {
  return current_device();
}

int GpuEp::stream_device(void* stream) const {
  const auto handle = static_cast<hipStream_t>(stream);
  // The reserved handles (the null and the legacy default stream, the per-thread stream) name streams of the
  // current device; they are not asked (HIP's hipGetStreamDeviceId crashed on hipStreamLegacy in ROCm 6.3).
  if (handle == nullptr || handle == hipStreamLegacy || handle == hipStreamPerThread) {
    return current_device();
  }
  if (handle == stream_on_device_) {
    return device_;
  }
  // A stream being captured is not asked for its device: CUDA ends the capture with an error on that query.
  hipStreamCaptureStatus capture = hipStreamCaptureStatusNone;
  if (hipStreamIsCapturing(handle, &capture) != hipSuccess) {
    return -1;
  }
  if (capture != hipStreamCaptureStatusNone) {
    return device_;
  }
  const int device = hipGetStreamDeviceId(handle);
  if (device == device_) {
    stream_on_device_ = handle;
  }
  return device;
}

void GpuEp::check_launch(const char* call, hipError_t status) {
  if (status == hipSuccess) {
    return;
  }
  (void)hipGetLastError();  // the launch's error is reported here, not by a later check
  broken_ = true;  // this rank's call never ran: its sequence numbers no longer agree with the peers'
  std::string message = std::string("EpGroup::") + call + " on rank " + std::to_string(rank_) +
                        ": the kernel's launch failed: " + hipGetErrorName(status) + " (" +
                        hipGetErrorString(status) + ")";
  if (status == hipErrorCooperativeLaunchTooLarge) {
    message += "; its grid of " + std::to_string(grid_.blocks) +
               " blocks (EpConfig.num_sms = " + std::to_string(config_.num_sms) +
               ") cannot be resident at once on this GPU, as the kernel needs: lower num_sms";
  }
  throw GpuRuntimeError(message);
}

device::Status GpuEp::read_status(hipStream_t stream, PinnedHostBuffer& mirror) {
  auto* status = mirror.as<device::Status>();
  ROCEP_GPU_CHECK(hipMemcpyAsync(status, status_.get(), sizeof *status, hipMemcpyDeviceToHost, stream));
  ROCEP_GPU_CHECK(hipStreamSynchronize(stream));
  return *status;
}

RecordedError GpuEp::poll_error() {
  const std::lock_guard<std::mutex> lock(poll_lock_);
  return contract::recorded_error(read_status(poll_stream_.get(), poll_mirror_), config_, rank_);
}

RecordedError GpuEp::synchronize(void* stream) {
  const auto hip_stream = static_cast<hipStream_t>(stream);
  const RecordedError error =
      contract::recorded_error(read_status(hip_stream, status_mirror_), config_, rank_);
  if (error.kind == RecordedError::Kind::kTimeout) {
    broken_ = true;  // sequence numbers no longer agree across ranks
  } else if (error) {
    ROCEP_GPU_CHECK(hipMemsetAsync(status_.get(), 0, sizeof(device::Status), hip_stream));
    ROCEP_GPU_CHECK(hipStreamSynchronize(hip_stream));
  }
  return error;
}

bool gpu_visible() {
  return device_count() > 0;
}

std::unique_ptr<EpBackend> make_gpu_backend(Bootstrap& bootstrap, EpConfig& config) {
  config.fp8_encoding = resolve_fp8_encoding(config.fp8_encoding, current_device());
  return std::make_unique<GpuEp>(bootstrap, config);
}

}  // namespace rocep
