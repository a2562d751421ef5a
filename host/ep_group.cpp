#include "rocep/ep_group.hpp"

#include <array>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "backend.hpp"
#include "codecs.hpp"
#include "contract.hpp"
#include "profiler_range.hpp"
#include "reference.hpp"
#include "rocep/errors.hpp"

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

using contract::Call;

// ROCEP_GPUS_PER_NODE where it applies: set, and the caller left gpus_per_node 0 (detect).
struct EnvironmentNodes {
  std::string text;  // empty where the variable does not apply
  int value = 0;     // the variable as a positive integer; 0 where it is not one
};

EnvironmentNodes environment_nodes(const EpConfig& config) {
  const char* given = std::getenv("ROCEP_GPUS_PER_NODE");
  if (config.gpus_per_node != 0 || given == nullptr || *given == '\0') {
    return {};
  }
  char* end = nullptr;
  const long value = std::strtol(given, &end, 10);
  const bool positive = *end == '\0' && value >= 1 && value <= std::numeric_limits<int>::max();
  return {given, positive ? static_cast<int>(value) : 0};
}

// What every rank must agree on at creation, in a form whose bytes are equal where the fields are (no
// padding bytes): every field of the config, the backend asked for, and the environment's node size.
std::array<double, 17> agreed_fields(const EpConfig& config, Backend backend, const EnvironmentNodes& nodes) {
  return {static_cast<double>(config.hidden),
          static_cast<double>(config.top_k),
          static_cast<double>(config.num_experts),
          static_cast<double>(config.max_tokens_per_rank),
          static_cast<double>(config.dispatch_format),
          static_cast<double>(config.fp8_encoding),
          static_cast<double>(config.combine_dtype),
          static_cast<double>(config.gpus_per_node),
          static_cast<double>(config.num_sms),
          static_cast<double>(config.expert_alignment),
          config.timeout_seconds,
          static_cast<double>(config.layout),
          config.local_only ? 1.0 : 0.0,
          static_cast<double>(config.allreduce_world_size),
          config.combine_input_buffer ? 1.0 : 0.0,
          static_cast<double>(backend),
          nodes.text.empty() ? -1.0 : static_cast<double>(nodes.value)};
}

// Collective: throws ConfigError on every rank unless all ranks passed the same config and backend and see
// the same ROCEP_GPUS_PER_NODE. Compared byte for byte, so that a NaN agrees with itself (and is then
// refused by validate on every rank).
void require_same_config(Bootstrap& bootstrap, const EpConfig& config, Backend backend,
                         const EnvironmentNodes& nodes) {
  const auto mine = agreed_fields(config, backend, nodes);
  std::vector<std::array<double, 17>> all(bootstrap.size());
  bootstrap.all_gather(&mine, all.data(), sizeof mine);
  for (int peer = 0; peer < bootstrap.size(); ++peer) {
    if (std::memcmp(&all[peer], &all[0], sizeof mine) != 0) {
      std::string verdict;
      try {
        config.validate(bootstrap.size());
      } catch (const ConfigError& error) {
        verdict = std::string(" (this rank's: ") + error.what() + ")";
      }
      throw ConfigError("EpGroup: rank " + std::to_string(peer) +
                        " passed a different EpConfig or backend, or has a different ROCEP_GPUS_PER_NODE, " +
                        "than rank 0; every rank must pass the same" + verdict);
    }
  }
}

// After agreement, on every rank alike: throws ConfigError naming what is wrong with the backend asked for
// or with ROCEP_GPUS_PER_NODE where it applies.
void require_valid_choices(Backend backend, const EnvironmentNodes& nodes, int world_size) {
  if (backend != Backend::kAuto && backend != Backend::kGpu && backend != Backend::kCpuReference) {
    throw ConfigError("EpGroup: backend = " + std::to_string(static_cast<int>(backend)) +
                      " is invalid: allowed values are 0 (auto), 1 (gpu), 2 (cpu-reference)");
  }
  if (!nodes.text.empty() && (nodes.value == 0 || world_size % nodes.value != 0)) {
    throw ConfigError("ROCEP_GPUS_PER_NODE='" + nodes.text +
                      "' is invalid: allowed values are a positive integer that divides the world size " +
                      std::to_string(world_size) + ", or unset");
  }
}

// Collective: the first rank that sees no GPU (or whose build has none), or -1 where every rank sees one.
int first_rank_without_gpu(Bootstrap& bootstrap) {
  const int mine = gpu_visible() ? 1 : 0;
  std::vector<int> all(bootstrap.size());
  bootstrap.all_gather(&mine, all.data(), sizeof mine);
  for (int rank = 0; rank < bootstrap.size(); ++rank) {
    if (all[rank] == 0) {
      return rank;
    }
  }
  return -1;
}

// `requested` resolved, the same on every rank: kAuto is the GPU backend when every rank sees a GPU, else
// the CPU reference; kGpu throws ConfigError on every rank unless every rank sees one.
Backend resolve_backend(Bootstrap& bootstrap, Backend requested) {
  if (requested == Backend::kCpuReference) {
    return requested;
  }
  const int without = first_rank_without_gpu(bootstrap);
  if (without < 0) {
    return Backend::kGpu;
  }
  if (requested == Backend::kAuto) {
    return Backend::kCpuReference;
  }
  throw ConfigError("EpGroup: backend gpu is not available on rank " + std::to_string(without) +
                    ": its build of rocep has no GPU platform, or it sees no GPU");
}

}  // namespace

struct EpGroup::Impl {
  Impl(std::shared_ptr<Bootstrap> group_bootstrap, const EpConfig& group_config, Backend requested)
      : bootstrap(std::move(group_bootstrap)), config(group_config), backend(requested) {
    if (!bootstrap) {
      throw ConfigError("EpGroup: bootstrap is null; pass a rocep::Bootstrap (MpiBootstrap, or your own)");
    }
    // Agree first, validate second: the same config gives the same verdict on every rank, so no rank is
    // left waiting in a collective that a rank with a bad config never joins. A test or a launcher can
    // declare each GPU a node through the environment's ROCEP_GPUS_PER_NODE.
    const EnvironmentNodes nodes = environment_nodes(config);
    require_same_config(*bootstrap, config, requested, nodes);
    require_valid_choices(requested, nodes, bootstrap->size());
    if (!nodes.text.empty()) {
      config.gpus_per_node = nodes.value;
    }
    config.validate(bootstrap->size());
    local_experts = config.num_local_experts(bootstrap->size());
    recv_rows = config.max_recv_rows(bootstrap->size());
    backend = resolve_backend(*bootstrap, requested);
    if (backend == Backend::kCpuReference) {
      config.fp8_encoding = reference::reference_fp8_encoding(config.fp8_encoding);
      implementation = std::make_unique<reference::ReferenceEp>(*bootstrap, config);
    } else {
      implementation = make_gpu_backend(*bootstrap, config);
    }
  }

  int rank() const { return bootstrap->rank(); }

  // Checks that the group can take `call` now: not broken, and in order.
  void require(Call call) const {
    if (implementation->broken()) {
      throw Error(
          std::string("EpGroup::") + contract::to_string(call) + " on rank " + std::to_string(rank()) +
          ": a previous call timed out or failed to launch; this group is unusable and must be destroyed");
    }
    order.require(call, rank());
  }

  // Throws InvalidInputError for `error` (not empty) before anything is issued.
  static void refuse(const std::string& error) {
    if (!error.empty()) {
      throw InvalidInputError(error);
    }
  }

  std::shared_ptr<Bootstrap> bootstrap;
  EpConfig config;
  int local_experts = 0;  // EpConfig::num_local_experts and max_recv_rows of the group, computed once
  std::size_t recv_rows = 0;
  Backend backend;
  std::unique_ptr<EpBackend> implementation;
  contract::CallOrder order;
};

EpGroup::EpGroup(std::shared_ptr<Bootstrap> bootstrap, const EpConfig& config, Backend backend) {
  const ProfilerRange range("rocep::EpGroup");
  impl_ = std::make_unique<Impl>(std::move(bootstrap), config, backend);
}
EpGroup::~EpGroup() = default;
EpGroup::EpGroup(EpGroup&&) noexcept = default;
EpGroup& EpGroup::operator=(EpGroup&&) noexcept = default;

int EpGroup::rank() const {
  return impl_->rank();
}
int EpGroup::world_size() const {
  return impl_->bootstrap->size();
}
const EpConfig& EpGroup::config() const {
  return impl_->config;
}
Backend EpGroup::backend() const {
  return impl_->backend;
}
int EpGroup::num_local_experts() const {
  return impl_->local_experts;
}
std::size_t EpGroup::max_recv_rows() const {
  return impl_->recv_rows;
}
std::size_t EpGroup::memory_bytes() const {
  return impl_->implementation->memory_bytes();
}

void* EpGroup::dispatch_input_buffer() {
  const std::string error = contract::input_buffer_error(impl_->config);
  if (!error.empty()) {
    throw ConfigError(error);
  }
  return impl_->implementation->dispatch_input_buffer();
}

void* EpGroup::combine_input_buffer() {
  const std::string error = contract::combine_input_buffer_error(impl_->config);
  if (!error.empty()) {
    throw ConfigError(error);
  }
  return impl_->implementation->combine_input_buffer();
}

void EpGroup::dispatch(const DispatchInputs& inputs, const DispatchOutputs& outputs, void* stream) {
  const ProfilerRange range("rocep::dispatch");
  impl_->require(Call::kDispatch);
  EpBackend& backend = *impl_->implementation;
  Impl::refuse(contract::dispatch_outputs_error(impl_->config, rank(), outputs));
  const std::string error =
      contract::dispatch_inputs_error(impl_->config, rank(), inputs, backend.dispatch_memory());
  backend.dispatch(error.empty() ? inputs : contract::zero_tokens(), outputs, stream);
  impl_->order.advance(Call::kDispatch);
  Impl::refuse(error);
}

void EpGroup::dispatch_send(const DispatchInputs& inputs, void* stream) {
  const ProfilerRange range("rocep::dispatch_send");
  impl_->require(Call::kDispatchSend);
  EpBackend& backend = *impl_->implementation;
  const std::string error =
      contract::dispatch_inputs_error(impl_->config, rank(), inputs, backend.dispatch_memory());
  backend.dispatch_send(error.empty() ? inputs : contract::zero_tokens(), stream);
  impl_->order.advance(Call::kDispatchSend);
  Impl::refuse(error);
}

void EpGroup::dispatch_recv(const DispatchOutputs& outputs, void* stream) {
  const ProfilerRange range("rocep::dispatch_recv");
  impl_->require(Call::kDispatchRecv);
  Impl::refuse(contract::dispatch_outputs_error(impl_->config, rank(), outputs));
  impl_->implementation->dispatch_recv(outputs, stream);
  impl_->order.advance(Call::kDispatchRecv);
}

void EpGroup::combine(const CombineArgs& args, void* stream) {
  const ProfilerRange range("rocep::combine");
  impl_->require(Call::kCombine);
  Impl::refuse(
      contract::combine_args_error(impl_->config, rank(), args, impl_->implementation->combine_memory()));
  impl_->implementation->combine(args, stream);
  impl_->order.advance(Call::kCombine);
}

void EpGroup::combine_send(const CombineArgs& args, void* stream) {
  const ProfilerRange range("rocep::combine_send");
  impl_->require(Call::kCombineSend);
  Impl::refuse(
      contract::combine_args_error(impl_->config, rank(), args, impl_->implementation->combine_memory()));
  impl_->implementation->combine_send(args, stream);
  impl_->order.advance(Call::kCombineSend);
}

void EpGroup::combine_recv(const CombineArgs& args, void* stream) {
  const ProfilerRange range("rocep::combine_recv");
  impl_->require(Call::kCombineRecv);
  Impl::refuse(
      contract::combine_args_error(impl_->config, rank(), args, impl_->implementation->combine_memory()));
  impl_->implementation->combine_recv(args, stream);
  impl_->order.advance(Call::kCombineRecv);
}

void EpGroup::combine_recv_with(const CombineArgs& args, const CombineReceiveLauncher& launcher,
                                void* stream) {
  const ProfilerRange range("rocep::combine_recv");
  impl_->require(Call::kCombineRecv);
  Impl::refuse(
      contract::combine_args_error(impl_->config, rank(), args, impl_->implementation->combine_memory()));
  Impl::refuse(contract::caller_epilogue_error(impl_->config, impl_->backend, rank(), args, launcher));
  impl_->implementation->combine_recv_with(args, launcher, stream);
  impl_->order.advance(Call::kCombineRecv);
}

void EpGroup::synchronize(void* stream) {
  const ProfilerRange range("rocep::synchronize");
  impl_->implementation->synchronize(stream).raise();
}

RecordedError EpGroup::poll_error() {
  return impl_->implementation->poll_error();
}

}  // namespace rocep
