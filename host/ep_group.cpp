#include "rocep/ep_group.hpp"

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <vector>

#include "agreement.hpp"
#include "backend.hpp"
#include "codecs.hpp"
#include "contract.hpp"
#include "guarded_bootstrap.hpp"
#include "number_text.hpp"
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

// How the message naming a difference writes an agreed field's value.
enum class FieldKind {
  kInteger,
  kBool,
  kSeconds,
  kFormat,
  kEncoding,
  kCombineDtype,
  kLayout,
  kBackend,
  kEnvironmentNodes
};

// One value every rank must agree on at creation, held as a double so that its bytes are equal where the
// values are (no padding bytes).
struct AgreedField {
  const char* name;
  FieldKind kind;
  double value;
};

constexpr std::size_t kAgreedFields = 17;
using AgreedValues = std::array<double, kAgreedFields>;

// What every rank must agree on at creation: every field of the config, the backend asked for, and the
// environment's node size (-1 where it does not apply, 0 where it is no positive integer).
std::array<AgreedField, kAgreedFields> agreed_fields(const EpConfig& config, Backend backend,
                                                     const EnvironmentNodes& nodes) {
  return {
      {{"EpConfig.hidden", FieldKind::kInteger, static_cast<double>(config.hidden)},
       {"EpConfig.top_k", FieldKind::kInteger, static_cast<double>(config.top_k)},
       {"EpConfig.num_experts", FieldKind::kInteger, static_cast<double>(config.num_experts)},
       {"EpConfig.max_tokens_per_rank", FieldKind::kInteger, static_cast<double>(config.max_tokens_per_rank)},
       {"EpConfig.dispatch_format", FieldKind::kFormat, static_cast<double>(config.dispatch_format)},
       {"EpConfig.fp8_encoding", FieldKind::kEncoding, static_cast<double>(config.fp8_encoding)},
       {"EpConfig.combine_dtype", FieldKind::kCombineDtype, static_cast<double>(config.combine_dtype)},
       {"EpConfig.gpus_per_node", FieldKind::kInteger, static_cast<double>(config.gpus_per_node)},
       {"EpConfig.num_sms", FieldKind::kInteger, static_cast<double>(config.num_sms)},
       {"EpConfig.expert_alignment", FieldKind::kInteger, static_cast<double>(config.expert_alignment)},
       {"EpConfig.timeout_seconds", FieldKind::kSeconds, config.timeout_seconds},
       {"EpConfig.layout", FieldKind::kLayout, static_cast<double>(config.layout)},
       {"EpConfig.local_only", FieldKind::kBool, config.local_only ? 1.0 : 0.0},
       {"EpConfig.allreduce_world_size", FieldKind::kInteger,
        static_cast<double>(config.allreduce_world_size)},
       {"EpConfig.combine_input_buffer", FieldKind::kBool, config.combine_input_buffer ? 1.0 : 0.0},
       {"backend", FieldKind::kBackend, static_cast<double>(backend)},
       {"ROCEP_GPUS_PER_NODE", FieldKind::kEnvironmentNodes,
        nodes.text.empty() ? -1.0 : static_cast<double>(nodes.value)}}};
}

// An enum's value as its name, or as its number where it names none (validation then refuses it).
template <typename Enum>
std::string enum_text(double value) {
  const auto code = static_cast<int>(value);
  const std::string name = to_string(static_cast<Enum>(code));
  return name != "unknown" ? name : std::to_string(code);
}

std::string field_text(FieldKind kind, double value) {
  switch (kind) {
    case FieldKind::kBool:
      return value != 0.0 ? "true" : "false";
    case FieldKind::kSeconds:
      return number_text(value);
    case FieldKind::kFormat:
      return enum_text<TokenFormat>(value);
    case FieldKind::kEncoding:
      return enum_text<Fp8Encoding>(value);
    case FieldKind::kCombineDtype:
      return enum_text<CombineDtype>(value);
    case FieldKind::kLayout:
      return enum_text<Layout>(value);
    case FieldKind::kBackend:
      return enum_text<Backend>(value);
    case FieldKind::kEnvironmentNodes:
      if (value < 0) {
        return "unset (or overridden by EpConfig.gpus_per_node)";
      }
      if (value == 0) {
        return "not a positive integer";
      }
      return std::to_string(static_cast<long long>(value));
    case FieldKind::kInteger:
      break;
  }
  return std::to_string(static_cast<long long>(value));
}

// The caller's bootstrap as the group uses it (GuardedBootstrap). Throws ConfigError on this rank, before any
// collective, unless it is set, its size() is positive and its rank() lies in [0, size()). The peers then
// wait in the bootstrap's first all-gather, as for a rank that never creates the group.
std::shared_ptr<Bootstrap> guarded(std::shared_ptr<Bootstrap> bootstrap) {
  if (!bootstrap) {
    throw ConfigError("EpGroup: bootstrap is null; pass a rocep::Bootstrap (MpiBootstrap, or your own)");
  }
  const int rank = bootstrap->rank();
  const int size = bootstrap->size();
  if (size < 1 || rank < 0 || rank >= size) {
    throw ConfigError("EpGroup: the bootstrap's rank() = " + std::to_string(rank) +
                      " and size() = " + std::to_string(size) +
                      " are invalid: allowed are size() >= 1 and rank() in [0, size() - 1]");
  }
  return std::make_shared<GuardedBootstrap>(std::move(bootstrap));
}

// What each rank contributes to the first collective of creation: the fields it must agree on, and what its
// bootstrap says it is (all doubles: no padding bytes).
struct CreationRecord {
  AgreedValues agreed;
  double rank;
  double size;
};

// Throws ConfigError on every rank (all see the same records) unless the record at each place i of the
// all-gather comes from a bootstrap whose rank() is i and whose size() is the world's.
void require_ranks_in_gather_order(const std::vector<CreationRecord>& all) {
  for (std::size_t place = 0; place < all.size(); ++place) {
    if (all[place].rank != static_cast<double>(place) || all[place].size != static_cast<double>(all.size())) {
      throw ConfigError("EpGroup: the bytes at place " + std::to_string(place) +
                        " of the bootstrap's all_gather (of " + std::to_string(all.size()) +
                        ") come from a rank whose bootstrap says rank() = " + number_text(all[place].rank) +
                        ", size() = " + number_text(all[place].size) +
                        ": every rank's rank() must be its place in all_gather's output (rank i's bytes at "
                        "offset i x bytes_per_rank) and every rank's size() the same");
    }
  }
}

// Collective: throws ConfigError on every rank unless all ranks passed the same config and backend and see
// the same ROCEP_GPUS_PER_NODE, naming the first rank that differs from rank 0 and each field in which it
// differs, with both values; and before that unless the bootstraps' ranks are their places in the
// all-gather (require_ranks_in_gather_order). Compared byte for byte, so that a NaN agrees with itself (and
// is then refused by validate on every rank).
void require_same_config(Bootstrap& bootstrap, const EpConfig& config, Backend backend,
                         const EnvironmentNodes& nodes) {
  const auto fields = agreed_fields(config, backend, nodes);
  CreationRecord mine{};
  for (std::size_t i = 0; i < kAgreedFields; ++i) {
    mine.agreed[i] = fields[i].value;
  }
  mine.rank = bootstrap.rank();
  mine.size = bootstrap.size();
  std::vector<CreationRecord> records(bootstrap.size());
  bootstrap.all_gather(&mine, records.data(), sizeof mine);
  require_ranks_in_gather_order(records);
  const AgreedValues& first = records[0].agreed;
  for (int peer = 1; peer < bootstrap.size(); ++peer) {
    std::string differences;
    const AgreedValues& theirs = records[peer].agreed;
    for (std::size_t i = 0; i < kAgreedFields; ++i) {
      if (std::memcmp(&theirs[i], &first[i], sizeof(double)) != 0) {
        differences += std::string(differences.empty() ? "" : ", ") + fields[i].name + " (" +
                       field_text(fields[i].kind, theirs[i]) + " on rank " + std::to_string(peer) + ", " +
                       field_text(fields[i].kind, first[i]) + " on rank 0)";
      }
    }
    if (differences.empty()) {
      continue;
    }
    std::string verdict;
    try {
      config.validate(bootstrap.size());
    } catch (const ConfigError& error) {
      verdict = std::string(" (this rank's: ") + error.what() + ")";
    }
    throw ConfigError("EpGroup: rank " + std::to_string(peer) + " differs from rank 0 in " + differences +
                      "; every rank must pass the same EpConfig and backend and see the same "
                      "ROCEP_GPUS_PER_NODE" +
                      verdict);
  }
}

constexpr const char* kValidationStep = "validating the EpConfig, backend and ROCEP_GPUS_PER_NODE";

// After agreement, on every rank alike: throws ConfigError naming what is wrong with the backend asked for
// or with ROCEP_GPUS_PER_NODE where it applies.
void require_valid_choices(Backend backend, const EnvironmentNodes& nodes, int world_size) {
  if (backend != Backend::kAuto && backend != Backend::kGpu && backend != Backend::kCpuReference) {
    throw ConfigError("backend = " + std::to_string(static_cast<int>(backend)) +
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
  throw ConfigError("EpGroup: rank " + std::to_string(without) +
                    " failed at choosing the backend: backend gpu is not available there: its build of rocep "
                    "has no GPU platform, or it sees no GPU (allowed there: backend auto or cpu-reference)");
}

}  // namespace

struct EpGroup::Impl {
  Impl(std::shared_ptr<Bootstrap> group_bootstrap, const EpConfig& group_config, Backend requested)
      : bootstrap(guarded(std::move(group_bootstrap))), config(group_config), backend(requested) {
    // Agree first, validate second: the same config gives the same verdict on every rank, so no rank is
    // left waiting in a collective that a rank with a bad config never joins. A test or a launcher can
    // declare each GPU a node through the environment's ROCEP_GPUS_PER_NODE.
    const EnvironmentNodes nodes = environment_nodes(config);
    require_same_config(*bootstrap, config, requested, nodes);
    // Agreed, so every rank fails alike; run as a step of its own so that the error names the rank and the
    // step, as every other failure at creation does.
    run_agreed(*bootstrap, kValidationStep, [&] {
      require_valid_choices(requested, nodes, bootstrap->size());
      if (!nodes.text.empty()) {
        config.gpus_per_node = nodes.value;
      }
      config.validate(bootstrap->size());
    });
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

  // Checks that the group can take `call` on `stream` now: not broken, in order, and on its device.
  void require(Call call, void* stream) const {
    if (implementation->broken()) {
      throw Error(called(contract::to_string(call)) +
                  ": a previous call timed out or failed to launch (poll_error() shows what, synchronize() "
                  "throws it); this group is unusable and must be destroyed");
    }
    order.require(call, rank());
    require_device(contract::to_string(call), stream);
  }

  // Checks that EpGroup::`name` comes from a thread whose current device is the group's.
  void require_calling_device(const char* name) const {
    const int device = implementation->device();
    if (const int calling = implementation->calling_device(); calling != device) {
      throw InvalidInputError(called(name) + ": the calling thread's current device is GPU " +
                              std::to_string(calling) + ", the group's is GPU " + std::to_string(device) +
                              ": set it (hipSetDevice, cudaSetDevice, torch.cuda.set_device) before the "
                              "call; nothing was issued");
    }
  }

  // Checks that EpGroup::`name` comes from a thread whose current device is the group's, on a stream of that
  // device.
  void require_device(const char* name, void* stream) const {
    require_calling_device(name);
    const int device = implementation->device();
    if (const int queued = implementation->stream_device(stream); queued != device) {
      throw InvalidInputError(called(name) + ": " +
                              (queued < 0 ? std::string("the runtime names no GPU for the stream")
                                          : "the stream is GPU " + std::to_string(queued) + "'s") +
                              ", the group's GPU is GPU " + std::to_string(device) +
                              ": pass a stream made on the group's GPU (or 0, its default stream); nothing "
                              "was issued");
    }
  }

  // "EpGroup::`name` on rank r", the start of this rank's messages; composed only for an error.
  std::string called(const char* name) const {
    return std::string("EpGroup::") + name + " on rank " + std::to_string(rank());
  }

  // Throws InvalidInputError for `error` (not empty): before anything is issued, or with `issued` after
  // this rank's part of the call was issued with zero tokens (InvalidInputError::issued).
  static void refuse(const std::string& error, bool issued = false) {
    if (!error.empty()) {
      throw InvalidInputError(error, issued);
    }
  }

  // One call of EpGroup::`name` on this group, for its scope: throws CallOrderError, nothing issued, while
  // another thread is inside a call of the same group (one group's calls must not overlap in time), or once
  // the group is closed. EpGroup::close claims it without throwing (`refuse` false) and asks held().
  class Inside {
   public:
    Inside(Impl& group, const char* name, bool refuse = true) : group_(group) {
      group.inside.compare_exchange_strong(other_, name, std::memory_order_acquire);
      if (refuse && !held()) {
        throw CallOrderError(group.called(name) + ": another thread is inside EpGroup::" + other_ +
                             " of this group; one group's calls must not overlap in time (call it from one "
                             "thread, or from threads taking turns under a lock); nothing was issued");
      }
      if (refuse && group.closed.load(std::memory_order_acquire)) {
        group.inside.store(nullptr, std::memory_order_release);
        throw CallOrderError(kClosed);
      }
    }
    ~Inside() {
      if (held()) {
        group_.inside.store(nullptr, std::memory_order_release);
      }
    }
    Inside(const Inside&) = delete;
    Inside& operator=(const Inside&) = delete;

    bool held() const { return other_ == nullptr; }
    // The call another thread was inside when this one was made; null when held().
    const char* other() const { return other_; }

   private:
    Impl& group_;
    const char* other_ = nullptr;
  };

  static constexpr const char* kClosed =
      "EpGroup: this group was closed (EpGroup::close()); create a new group to go on";

  std::shared_ptr<Bootstrap> bootstrap;
  EpConfig config;
  int local_experts = 0;  // EpConfig::num_local_experts and max_recv_rows of the group, computed once
  std::size_t recv_rows = 0;
  Backend backend;
  std::unique_ptr<EpBackend> implementation;
  contract::CallOrder order;
  std::atomic<const char*> inside{nullptr};  // the name of the call a thread is inside, else null
  std::atomic<bool> closed{false};           // set by close() before `implementation` is released
  // Shared by poll_error around its read (polls order among themselves in the backend), taken alone by
  // close() while it takes `implementation`.
  std::shared_mutex polling;
};

EpGroup::EpGroup(std::shared_ptr<Bootstrap> bootstrap, const EpConfig& config, Backend backend) {
  const ProfilerRange range("rocep::EpGroup");
  impl_ = std::make_unique<Impl>(std::move(bootstrap), config, backend);
}
EpGroup::~EpGroup() = default;
EpGroup::EpGroup(EpGroup&&) noexcept = default;
EpGroup& EpGroup::operator=(EpGroup&&) noexcept = default;

EpGroup::Impl& EpGroup::impl() const {
  if (impl_ == nullptr) {
    throw CallOrderError("EpGroup: this group was moved from; call the group it was moved to");
  }
  if (impl_->closed.load(std::memory_order_acquire)) {
    throw CallOrderError(Impl::kClosed);
  }
  return *impl_;
}

void EpGroup::close() {
  if (impl_ != nullptr && impl_->closed.load(std::memory_order_acquire)) {
    return;  // closed before
  }
  Impl& group = impl();  // a group moved from throws
  const ProfilerRange range("rocep::close");
  const Impl::Inside inside(group, "close", /*refuse=*/false);
  // Agreed first: a rank that released alone would leave its peers' calls waiting on its memory.
  const uint8_t busy = inside.held() ? 0 : 1;
  std::vector<uint8_t> all(static_cast<std::size_t>(group.bootstrap->size()));
  if (!group.bootstrap->all_gather_within(&busy, all.data(), sizeof busy, group.config.timeout_seconds)) {
    throw TimeoutError(group.called("close") + ": not every rank called close within timeout_seconds = " +
                       number_text(group.config.timeout_seconds) +
                       " s; nothing released (destroying the group releases this rank's part, its wait for "
                       "the peers bounded alike)");
  }
  std::string busy_ranks;
  for (std::size_t rank = 0; rank < all.size(); ++rank) {
    if (all[rank] != 0) {
      busy_ranks += (busy_ranks.empty() ? "" : ", ") + std::to_string(rank);
    }
  }
  if (!busy_ranks.empty()) {
    throw CallOrderError(
        group.called("close") +
        ": refused on every rank, nothing released: another thread is inside a call of the "
        "group on rank(s) " +
        busy_ranks +
        (inside.held() ? std::string() : std::string(" (here EpGroup::") + inside.other() + ")") +
        "; close it once no other thread is inside one of its calls");
  }
  std::unique_ptr<EpBackend> released;
  {
    const std::unique_lock<std::shared_mutex> lock(group.polling);
    group.closed.store(true, std::memory_order_release);
    released = std::move(group.implementation);
  }
  released.reset();  // the backend's teardown: collective on the GPU backend, as in the destructor
}

int EpGroup::rank() const {
  return impl().rank();
}
int EpGroup::world_size() const {
  return impl().bootstrap->size();
}
const EpConfig& EpGroup::config() const {
  return impl().config;
}
Backend EpGroup::backend() const {
  return impl().backend;
}
int EpGroup::num_local_experts() const {
  return impl().local_experts;
}
std::size_t EpGroup::max_recv_rows() const {
  return impl().recv_rows;
}
std::size_t EpGroup::memory_bytes() const {
  return impl().implementation->memory_bytes();
}
int EpGroup::device() const {
  return impl().implementation->device();
}

void* EpGroup::dispatch_input_buffer() {
  return impl().implementation->dispatch_input_buffer();
}

void* EpGroup::combine_input_buffer() {
  const std::string error = contract::combine_input_buffer_error(impl().config);
  if (!error.empty()) {
    throw ConfigError(error);
  }
  return impl().implementation->combine_input_buffer();
}

void EpGroup::dispatch(const DispatchInputs& inputs, const DispatchOutputs& outputs, void* stream) {
  const ProfilerRange range("rocep::dispatch");
  const Impl::Inside inside(impl(), "dispatch");
  impl().require(Call::kDispatch, stream);
  EpBackend& backend = *impl().implementation;
  Impl::refuse(contract::dispatch_outputs_error(impl().config, "dispatch", rank(), outputs));
  const std::string error =
      contract::dispatch_inputs_error(impl().config, "dispatch", rank(), inputs, backend.dispatch_memory());
  backend.dispatch(error.empty() ? inputs : contract::zero_tokens(), outputs, stream);
  impl().order.advance(Call::kDispatch);
  Impl::refuse(error, true);
}

void EpGroup::dispatch_send(const DispatchInputs& inputs, void* stream) {
  const ProfilerRange range("rocep::dispatch_send");
  const Impl::Inside inside(impl(), "dispatch_send");
  impl().require(Call::kDispatchSend, stream);
  EpBackend& backend = *impl().implementation;
  const std::string error = contract::dispatch_inputs_error(impl().config, "dispatch_send", rank(), inputs,
                                                            backend.dispatch_memory());
  backend.dispatch_send(error.empty() ? inputs : contract::zero_tokens(), stream);
  impl().order.advance(Call::kDispatchSend);
  Impl::refuse(error, true);
}

void EpGroup::dispatch_recv(const DispatchOutputs& outputs, void* stream) {
  const ProfilerRange range("rocep::dispatch_recv");
  const Impl::Inside inside(impl(), "dispatch_recv");
  impl().require(Call::kDispatchRecv, stream);
  Impl::refuse(contract::dispatch_outputs_error(impl().config, "dispatch_recv", rank(), outputs));
  impl().implementation->dispatch_recv(outputs, stream);
  impl().order.advance(Call::kDispatchRecv);
}

void EpGroup::combine(const CombineArgs& args, void* stream) {
  const ProfilerRange range("rocep::combine");
  const Impl::Inside inside(impl(), "combine");
  impl().require(Call::kCombine, stream);
  Impl::refuse(contract::combine_args_error(impl().config, "combine", rank(), args,
                                            impl().implementation->combine_memory()));
  impl().implementation->combine(args, stream);
  impl().order.advance(Call::kCombine);
}

void EpGroup::combine_send(const CombineArgs& args, void* stream) {
  const ProfilerRange range("rocep::combine_send");
  const Impl::Inside inside(impl(), "combine_send");
  impl().require(Call::kCombineSend, stream);
  Impl::refuse(contract::combine_args_error(impl().config, "combine_send", rank(), args,
                                            impl().implementation->combine_memory()));
  impl().implementation->combine_send(args, stream);
  impl().order.advance(Call::kCombineSend);
}

void EpGroup::combine_recv(const CombineArgs& args, void* stream) {
  const ProfilerRange range("rocep::combine_recv");
  const Impl::Inside inside(impl(), "combine_recv");
  impl().require(Call::kCombineRecv, stream);
  Impl::refuse(contract::combine_args_error(impl().config, "combine_recv", rank(), args,
                                            impl().implementation->combine_memory()));
  impl().implementation->combine_recv(args, stream);
  impl().order.advance(Call::kCombineRecv);
}

void EpGroup::combine_recv_with(const CombineArgs& args, const CombineReceiveLauncher& launcher,
                                void* stream) {
  const ProfilerRange range("rocep::combine_recv");
  const Impl::Inside inside(impl(), "combine_recv_with");
  impl().require(Call::kCombineRecv, stream);
  Impl::refuse(contract::combine_args_error(impl().config, "combine_recv_with", rank(), args,
                                            impl().implementation->combine_memory()));
  Impl::refuse(contract::caller_epilogue_error(impl().config, impl().backend, rank(), args, launcher));
  impl().implementation->combine_recv_with(args, launcher, stream);
  impl().order.advance(Call::kCombineRecv);
}

void EpGroup::synchronize(void* stream) {
  const ProfilerRange range("rocep::synchronize");
  const Impl::Inside inside(impl(), "synchronize");
  impl().require_device("synchronize", stream);
  impl().implementation->synchronize(stream).raise();
}

RecordedError EpGroup::poll_error() {
  Impl& group = impl();
  const std::shared_lock<std::shared_mutex> lock(group.polling);  // close() takes the backend between polls
  if (group.closed.load(std::memory_order_acquire)) {
    throw CallOrderError(Impl::kClosed);
  }
  group.require_calling_device("poll_error");
  return group.implementation->poll_error();
}

}  // namespace rocep
