#include "rocep/ep_group.hpp"

#include <array>
#include <vector>

#include "bootstrap.hpp"
#include "codecs.hpp"
#include "reference.hpp"
#include "rocep/errors.hpp"

#include "hip/portable.hpp"
#if defined(ROCEP_GPU_BUILD)
#include "device.hpp"
#include "gpu_backend.hpp"
#endif

namespace rocep {

const char* to_string(Backend backend) {
  switch (backend) {
    case Backend::kAuto:
      return "auto";
    case Backend::kGpu:
      return "gpu";
    case Backend::kCpuReference:
      return "cpu-reference";
  }
  return "unknown";
}

namespace {

// Every field of the config, in a form whose equality is field equality (no padding bytes).
std::array<double, 12> config_fields(const EpConfig& config) {
  return {static_cast<double>(config.hidden),
          static_cast<double>(config.top_k),
          static_cast<double>(config.num_experts),
          static_cast<double>(config.max_tokens_per_rank),
          static_cast<double>(config.dispatch_format),
          static_cast<double>(config.fp8_encoding),
          static_cast<double>(config.combine_dtype),
          static_cast<double>(config.gpus_per_node),
          static_cast<double>(config.num_blocks),
          static_cast<double>(config.expert_alignment),
          config.timeout_seconds,
          0.0};
}

// Collective: throws ConfigError on every rank unless all ranks passed the same config and backend.
void require_same_config(Bootstrap& bootstrap, const EpConfig& config, Backend backend) {
  auto mine = config_fields(config);
  mine.back() = static_cast<double>(backend);
  std::vector<std::array<double, 12>> all(bootstrap.size());
  bootstrap.all_gather(&mine, all.data(), sizeof mine);
  for (int peer = 0; peer < bootstrap.size(); ++peer) {
    if (all[peer] != all[0]) {
      std::string verdict;
      try {
        config.validate(bootstrap.size());
      } catch (const ConfigError& error) {
        verdict = std::string(" (this rank's: ") + error.what() + ")";
      }
      throw ConfigError("EpGroup: rank " + std::to_string(peer) +
                        " passed a different EpConfig or backend than rank 0; every rank must pass the same" +
                        verdict);
    }
  }
}

// The GPU backend when this build has one and every rank sees a GPU (the same answer on every rank).
Backend resolve_auto(Bootstrap& bootstrap) {
#if defined(ROCEP_GPU_BUILD)
  const int mine = device_count() > 0 ? 1 : 0;
  std::vector<int> all(bootstrap.size());
  bootstrap.all_gather(&mine, all.data(), sizeof mine);
  for (const int has_gpu : all) {
    if (has_gpu == 0) {
      return Backend::kCpuReference;
    }
  }
  return Backend::kGpu;
#else
  (void)bootstrap;
  return Backend::kCpuReference;
#endif
}

}  // namespace

struct EpGroup::Impl {
  Impl(MPI_Comm comm, const EpConfig& group_config, Backend requested)
      : bootstrap(comm), config(group_config), backend(requested) {
    // Agree first, validate second: the same config gives the same verdict on every rank, so no rank is
    // left waiting in a collective that a rank with a bad config never joins.
    require_same_config(bootstrap, config, requested);
    config.validate(bootstrap.size());
    if (backend == Backend::kAuto) {
      backend = resolve_auto(bootstrap);
    }
    if (backend == Backend::kCpuReference) {
      config.fp8_encoding = reference::reference_fp8_encoding(config.fp8_encoding);
      reference = std::make_unique<reference::ReferenceEp>(bootstrap.comm(), config);
      return;
    }
#if defined(ROCEP_GPU_BUILD)
    config.fp8_encoding = resolve_fp8_encoding(config.fp8_encoding, current_device());
    gpu = std::make_unique<GpuEp>(bootstrap, config);
#else
    throw ConfigError("EpGroup: backend gpu is not available: this build of rocep has no GPU platform");
#endif
  }

  // Runs on_gpu(gpu backend, its stream) when the group runs on the GPU, on_reference(reference) otherwise.
  template <typename OnGpu, typename OnReference>
  void run(void* stream, OnGpu on_gpu, OnReference on_reference) {
#if defined(ROCEP_GPU_BUILD)
    if (gpu) {
      on_gpu(*gpu, static_cast<hipStream_t>(stream));
      return;
    }
#endif
    (void)stream;
    (void)on_gpu;
    on_reference(*reference);
  }

  MpiBootstrap bootstrap;
  EpConfig config;
  Backend backend;
  std::unique_ptr<reference::ReferenceEp> reference;
#if defined(ROCEP_GPU_BUILD)
  std::unique_ptr<GpuEp> gpu;
#endif
};

EpGroup::EpGroup(MPI_Comm comm, const EpConfig& config, Backend backend)
    : impl_(std::make_unique<Impl>(comm, config, backend)) {}
EpGroup::~EpGroup() = default;
EpGroup::EpGroup(EpGroup&&) noexcept = default;
EpGroup& EpGroup::operator=(EpGroup&&) noexcept = default;

int EpGroup::rank() const {
  return impl_->bootstrap.rank();
}
int EpGroup::world_size() const {
  return impl_->bootstrap.size();
}
const EpConfig& EpGroup::config() const {
  return impl_->config;
}
Backend EpGroup::backend() const {
  return impl_->backend;
}
int EpGroup::num_local_experts() const {
  return impl_->config.num_local_experts(world_size());
}
std::size_t EpGroup::max_recv_rows() const {
  return impl_->config.max_recv_rows(world_size());
}

void* EpGroup::dispatch_input_buffer() {
#if defined(ROCEP_GPU_BUILD)
  if (impl_->gpu) {
    return impl_->gpu->dispatch_input_buffer();
  }
#endif
  return impl_->reference->dispatch_input_buffer();
}

std::size_t EpGroup::memory_bytes() const {
#if defined(ROCEP_GPU_BUILD)
  if (impl_->gpu) {
    return impl_->gpu->memory_bytes();
  }
#endif
  return 0;  // the reference keeps only transient host vectors
}

void EpGroup::dispatch(const DispatchInputs& inputs, const DispatchOutputs& outputs, void* stream) {
  impl_->run(
      stream, [&](auto& gpu, auto gpu_stream) { gpu.dispatch(inputs, outputs, gpu_stream); },
      [&](auto& reference) {
        reference.dispatch_send(inputs);
        reference.dispatch_recv(outputs);
      });
}

void EpGroup::dispatch_send(const DispatchInputs& inputs, void* stream) {
  impl_->run(
      stream, [&](auto& gpu, auto gpu_stream) { gpu.dispatch_send(inputs, gpu_stream); },
      [&](auto& reference) { reference.dispatch_send(inputs); });
}

void EpGroup::dispatch_recv(const DispatchOutputs& outputs, void* stream) {
  impl_->run(
      stream, [&](auto& gpu, auto gpu_stream) { gpu.dispatch_recv(outputs, gpu_stream); },
      [&](auto& reference) { reference.dispatch_recv(outputs); });
}

void EpGroup::combine(const CombineArgs& args, void* stream) {
  impl_->run(
      stream, [&](auto& gpu, auto gpu_stream) { gpu.combine(args, gpu_stream); },
      [&](auto& reference) {
        reference.combine_send(args);
        reference.combine_recv(args);
      });
}

void EpGroup::combine_send(const CombineArgs& args, void* stream) {
  impl_->run(
      stream, [&](auto& gpu, auto gpu_stream) { gpu.combine_send(args, gpu_stream); },
      [&](auto& reference) { reference.combine_send(args); });
}

void EpGroup::combine_recv(const CombineArgs& args, void* stream) {
  impl_->run(
      stream, [&](auto& gpu, auto gpu_stream) { gpu.combine_recv(args, gpu_stream); },
      [&](auto& reference) { reference.combine_recv(args); });
}

void EpGroup::synchronize(void* stream) {
  impl_->run(
      stream, [](auto& gpu, auto gpu_stream) { gpu.synchronize(gpu_stream); }, [](auto&) {});
}

}  // namespace rocep
