// The per-token layout on the GPU against the CPU reference, bit for bit: every output of dispatch (rows,
// scales, ids, weights, origins, the count, sorted_token_ids and its blocks) and of combine, on fresh random
// inputs, every output poisoned before each call and checked to keep its poison past what the call wrote.
// Then calls that change count and routing on one group, eagerly and as graph replays, and SM budgets.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "compute_load.hpp"
#include "ep_cases.hpp"
#include "hip/bf16.hpp"
#include "host/codecs.hpp"
#include "host/device_memory.hpp"
#include "host/gpu_check.hpp"
#include "mpi_support.hpp"
#include "per_token_outputs.hpp"
#include "rocep/combine_epilogue.hpp"
#include "rocep/mpi.hpp"
#include "rocep/rocep.hpp"

namespace {

using rocep::testing::all_poison;
using rocep::testing::copy_into;
using rocep::testing::copy_to_device;
using rocep::testing::download;
using rocep::testing::fill_bytes;
using rocep::testing::Inputs;
using rocep::testing::kPoison;
using rocep::testing::make_config;
using rocep::testing::make_inputs;
using rocep::testing::poisoned;
using rocep::testing::Routing;
using rocep::testing::routing_name;
using rocep::testing::same_bytes;
using rocep::testing::seed_trace;
using rocep::testing::shared_seed;
using rocep::testing::upload;
using rocep::testing::world_rank;
using rocep::testing::world_size;

using rocep::bf16_bits;
using rocep::DeviceBuffer;
using rocep::EpConfig;
using rocep::SrcInfo;

using GpuPerToken = rocep::testing::GpuTest;

constexpr float kGlobalScale = 0.75f;  // nvfp4's, on both backends

EpConfig per_token(EpConfig config, rocep::TokenFormat format = rocep::TokenFormat::kBf16) {
  config.layout = rocep::Layout::kPerToken;
  config.dispatch_format = format;
  return config;
}

std::size_t scale_bytes(const EpConfig& config) {
  return rocep::format_scale_bytes(config.dispatch_format, config.hidden);
}

// The sizes of one rank's per-token outputs.
struct Sizes {
  explicit Sizes(const EpConfig& config)
      : rows(config.max_recv_tokens(world_size())),
        entries(config.max_recv_rows(world_size())),
        local_experts(config.num_local_experts(world_size())),
        payload_bytes(rocep::format_payload_bytes(config.dispatch_format, config.hidden)),
        scale_bytes(::scale_bytes(config)),
        top_k(config.top_k),
        hidden(config.hidden),
        alignment(config.expert_alignment) {}
  std::size_t rows, entries;
  int local_experts;
  std::size_t payload_bytes, scale_bytes;
  int top_k, hidden, alignment;
};

// One rank's per-token outputs in host memory (the reference's).
struct HostOutputs : rocep::testing::PerTokenHostOutputs {
  explicit HostOutputs(const EpConfig& config) : PerTokenHostOutputs(config, world_size(), 0) {}
};

// The same in device memory, poisoned.
struct DeviceOutputs {
  explicit DeviceOutputs(const Sizes& sizes)
      : recv_tokens(poisoned(sizes.rows * sizes.payload_bytes)),
        recv_scales(poisoned(std::max<std::size_t>(sizes.rows * sizes.scale_bytes, 1))),
        row_offsets(poisoned((sizes.local_experts + 1) * sizeof(uint32_t))),
        src_info(poisoned(sizes.rows * sizeof(SrcInfo))),
        topk_ids(poisoned(sizes.rows * sizes.top_k * sizeof(int32_t))),
        topk_weights(poisoned(sizes.rows * sizes.top_k * sizeof(float))),
        num_recv_tokens(poisoned(sizeof(int32_t))),
        sorted_token_ids(poisoned(sizes.entries * sizeof(int32_t))),
        block_expert_ids(
            poisoned(std::max<std::size_t>(sizes.entries / sizes.alignment, 1) * sizeof(int32_t))) {}
  rocep::DispatchOutputs view(const Sizes& sizes) const {
    rocep::DispatchOutputs outputs;
    outputs.recv_tokens = recv_tokens.get();
    outputs.recv_scales = sizes.scale_bytes > 0 ? recv_scales.get() : nullptr;
    outputs.row_offsets = row_offsets.as<uint32_t>();
    outputs.src_info = src_info.as<SrcInfo>();
    outputs.recv_topk_ids = topk_ids.as<int32_t>();
    outputs.recv_topk_weights = topk_weights.as<float>();
    outputs.num_recv_tokens = num_recv_tokens.as<int32_t>();
    outputs.sorted_token_ids = sorted_token_ids.as<int32_t>();
    outputs.block_expert_ids = block_expert_ids.as<int32_t>();
    return outputs;
  }
  void poison() const {
    for (const DeviceBuffer* buffer :
         {&recv_tokens, &recv_scales, &row_offsets, &src_info, &topk_ids, &topk_weights, &num_recv_tokens,
          &sorted_token_ids, &block_expert_ids}) {
      fill_bytes(*buffer, kPoison);
    }
  }
  DeviceBuffer recv_tokens, recv_scales, row_offsets, src_info, topk_ids, topk_weights, num_recv_tokens,
      sorted_token_ids, block_expert_ids;
};

// `count` elements of `got` (device) equal the first `count` of `expected`, and the rest of `got` holds the
// poison.
template <typename T>
void expect_prefix(const char* what, const DeviceBuffer& got, const std::vector<T>& expected,
                   std::size_t count) {
  const auto bytes = download<uint8_t>(got, got.bytes());
  const std::size_t used = count * sizeof(T);
  ASSERT_LE(used, bytes.size()) << what;
  EXPECT_TRUE(same_bytes(bytes.data(), expected.data(), used)) << what << " differ";
  EXPECT_TRUE(all_poison(bytes.data() + used, bytes.data() + bytes.size()))
      << what << " written past the end";
}

void expect_dispatch_matches(const Sizes& sizes, const DeviceOutputs& got, const HostOutputs& expected) {
  const auto count = download<int32_t>(got.num_recv_tokens, 1);
  ASSERT_EQ(count[0], expected.num_recv_tokens[0]) << "num_recv_tokens";
  const auto rows = static_cast<std::size_t>(count[0]);
  expect_prefix("recv_tokens", got.recv_tokens, expected.recv_tokens, rows * sizes.payload_bytes);
  if (sizes.scale_bytes > 0) {
    expect_prefix("recv_scales", got.recv_scales, expected.recv_scales, rows * sizes.scale_bytes);
  }
  expect_prefix("src_info", got.src_info, expected.src_info, rows);
  expect_prefix("recv_topk_ids", got.topk_ids, expected.topk_ids, rows * sizes.top_k);
  expect_prefix("recv_topk_weights", got.topk_weights, expected.topk_weights, rows * sizes.top_k);
  expect_prefix("row_offsets", got.row_offsets, expected.row_offsets, expected.row_offsets.size());
  const std::size_t entries = expected.row_offsets.back();
  expect_prefix("sorted_token_ids", got.sorted_token_ids, expected.sorted_token_ids, entries);
  expect_prefix("block_expert_ids", got.block_expert_ids, expected.block_expert_ids,
                entries / sizes.alignment);
}

// One call's inputs and expert rows, on both backends.
struct Call {
  Inputs inputs;
  std::vector<bf16_bits> rows;    // [P, hidden]: what the experts return per received token
  std::vector<bf16_bits> shared;  // [T, hidden]
  // Scaled formats passed through already quantised: the payloads and scales dispatch reads instead of
  // inputs.tokens (random bytes: they travel as they are). Empty: quantised in dispatch.
  std::vector<uint8_t> payloads, scales;

  rocep::DispatchInputs view() const {
    rocep::DispatchInputs view = inputs.view();
    view.global_scale = &kGlobalScale;
    if (!payloads.empty()) {
      view.tokens = payloads.data();
      view.token_scales = scales.data();
    }
    return view;
  }
};

Call make_call(const EpConfig& config, Routing routing, uint64_t seed, int num_tokens = -1,
               bool pass_through = false) {
  Call call{make_inputs(config, routing, seed, num_tokens), {}, {}, {}, {}};
  std::mt19937 random(static_cast<unsigned>(seed ^ (0x51ull * (rocep::testing::world_rank() + 1))));
  std::uniform_real_distribution<float> value(-2.0f, 2.0f);
  if (pass_through) {
    const std::size_t tokens = std::max(call.inputs.num_tokens, 1);
    call.payloads.resize(tokens * rocep::format_payload_bytes(config.dispatch_format, config.hidden));
    call.scales.resize(tokens * scale_bytes(config));
    for (auto* bytes : {&call.payloads, &call.scales}) {
      for (auto& byte : *bytes) {
        byte = static_cast<uint8_t>(random());
      }
    }
  }
  call.rows.resize(config.max_recv_tokens(world_size()) * config.hidden);
  call.shared.resize(static_cast<std::size_t>(config.max_tokens_per_rank) * config.hidden);
  for (auto* values : {&call.rows, &call.shared}) {
    for (auto& element : *values) {
      element = rocep::float_to_bf16(value(random));
    }
  }
  return call;
}

// The reference's dispatch and combine of `call` on `group` (a CPU reference group).
std::vector<bf16_bits> reference_call(rocep::EpGroup& group, const Call& call, HostOutputs& outputs,
                                      const Sizes& sizes) {
  group.dispatch(call.view(), outputs.view());
  std::vector<bf16_bits> out(std::max<std::size_t>(call.inputs.num_tokens, 1) * sizes.hidden);
  group.combine({call.rows.data(), nullptr, call.shared.data(), out.data()});
  out.resize(static_cast<std::size_t>(call.inputs.num_tokens) * sizes.hidden);
  return out;
}

// The same call on the GPU group, from device buffers big enough for any call of the config.
struct DeviceCall {
  DeviceCall(const EpConfig& config, const Sizes& sizes)
      : tokens(poisoned(static_cast<std::size_t>(config.max_tokens_per_rank) * config.hidden *
                        sizeof(bf16_bits))),
        ids(poisoned(static_cast<std::size_t>(config.max_tokens_per_rank) * config.top_k * sizeof(int32_t))),
        weights(
            poisoned(static_cast<std::size_t>(config.max_tokens_per_rank) * config.top_k * sizeof(float))),
        token_scales(poisoned(std::max<std::size_t>(
            static_cast<std::size_t>(config.max_tokens_per_rank) * sizes.scale_bytes, 1))),
        num_tokens(poisoned(sizeof(int32_t))),
        global_scale(upload(std::vector<float>{kGlobalScale})),
        rows(poisoned(sizes.rows * config.hidden * sizeof(bf16_bits))),
        shared(poisoned(static_cast<std::size_t>(config.max_tokens_per_rank) * config.hidden *
                        sizeof(bf16_bits))),
        out(poisoned(static_cast<std::size_t>(config.max_tokens_per_rank) * config.hidden *
                     sizeof(bf16_bits))) {}
  void load(const Call& call) {
    if (call.payloads.empty()) {
      copy_into(tokens, call.inputs.tokens);
    } else {
      copy_into(tokens, call.payloads);
      copy_into(token_scales, call.scales);
    }
    pass_through = !call.payloads.empty();
    copy_into(ids, call.inputs.topk_ids);
    copy_into(weights, call.inputs.topk_weights);
    copy_into(num_tokens, std::vector<int32_t>{call.inputs.num_tokens});
    copy_into(rows, call.rows);
    copy_into(shared, call.shared);
    fill_bytes(out, kPoison);
    host_num_tokens = call.inputs.num_tokens;
  }
  rocep::DispatchInputs inputs(bool count_on_device) const {
    rocep::DispatchInputs view{tokens.get(), ids.as<int32_t>(), weights.as<float>(), host_num_tokens,
                               count_on_device ? num_tokens.as<int32_t>() : nullptr};
    view.global_scale = global_scale.as<float>();
    view.token_scales = pass_through ? token_scales.get() : nullptr;
    return view;
  }
  rocep::CombineArgs combine() const { return {rows.get(), nullptr, shared.get(), out.get()}; }
  DeviceBuffer tokens, ids, weights, token_scales, num_tokens, global_scale, rows, shared, out;
  int host_num_tokens = 0;
  bool pass_through = false;
};

void expect_combined(const DeviceBuffer& out, const std::vector<bf16_bits>& expected) {
  expect_prefix("combined tokens", out, expected, expected.size());
}

// A GPU group and the CPU reference group of one config, with one call's device buffers: what a test of
// calls on one group holds.
struct Groups {
  explicit Groups(const EpConfig& config)
      : sizes(config),
        reference(MPI_COMM_WORLD, config, rocep::Backend::kCpuReference),
        group(MPI_COMM_WORLD, config, rocep::Backend::kGpu),
        device(config, sizes),
        outputs(sizes) {}
  Sizes sizes;
  rocep::EpGroup reference;
  rocep::EpGroup group;
  rocep::Stream stream;
  DeviceCall device;
  DeviceOutputs outputs;
};

// A caller's epilogue (<rocep/combine_epilogue.hpp>) that does what CombineArgs' own epilogue does, in the
// same order: the factor, the token's factor, then the token's bf16 residual row.
struct FactorsAndResidual {
  float factor;
  const float* token_factors;  // [tokens]
  const uint16_t* residual;    // bf16 [tokens][hidden]
  int hidden;
  __device__ void operator()(int token, int column, float (&values)[8]) const {
    if (factor != 1.0f) {
      for (float& value : values) {
        value *= factor;
      }
    }
    const float by = token_factors[token];
    for (float& value : values) {
      value *= by;
    }
    const uint16_t* row = residual + static_cast<std::size_t>(token) * hidden + column;
    for (int i = 0; i < 8; ++i) {
      values[i] += rocep::bf16_to_float(row[i]);
    }
  }
};

// Where a call's expert rows are combined from.
enum class ExpertRows {
  kOwnMemory,       // the test's own device memory
  kInBuffer,        // the group's combine input buffer, written once the dispatch is done
  kBesideTheBuffer  // the test's own memory, while the combine input buffer holds poison (NaN)
};

// `call` dispatched and combined on `groups`, split or fused, through `epilogue` when given (rows its
// stride apart, else hidden), against the reference's outputs; every output poisoned first. `by_caller`:
// the combine is combine_send, then the receive through FactorsAndResidual with `epilogue`'s values,
// after the same receive with CombineArgs' own epilogue beside it was refused. `rows`: where the expert
// rows are combined from. `tokens_in_buffer`: the tokens are written into the group's dispatch input buffer
// and dispatched from there (a scaled format's already quantised: each row its payload, then its scales).
void check_call_on(Groups& groups, const EpConfig& config, const Call& call, bool split,
                   const rocep::testing::EpilogueData* epilogue, bool by_caller = false,
                   ExpertRows rows = ExpertRows::kOwnMemory, bool tokens_in_buffer = false) {
  const std::size_t stride = epilogue != nullptr ? epilogue->stride : static_cast<std::size_t>(config.hidden);
  const int tokens = call.inputs.num_tokens;
  HostOutputs expected(config);
  groups.reference.dispatch(call.view(), expected.view());
  std::vector<bf16_bits> combined(static_cast<std::size_t>(std::max(tokens, 1)) * stride);
  const rocep::CombineArgs host_args{call.rows.data(), nullptr, call.shared.data(), combined.data()};
  groups.reference.combine(epilogue != nullptr ? epilogue->with(host_args, false) : host_args);
  groups.device.load(call);
  groups.outputs.poison();
  const DeviceBuffer out =
      poisoned(static_cast<std::size_t>(config.max_tokens_per_rank) * stride * sizeof(bf16_bits));
  rocep::CombineArgs args = groups.device.combine();
  args.out = out.get();
  rocep::DispatchInputs inputs = groups.device.inputs(false);
  if (tokens_in_buffer && call.payloads.empty()) {  // the last call is done: the buffer may be written
    copy_to_device(groups.group.dispatch_input_buffer(), call.inputs.tokens.data(),
                   call.inputs.tokens.size() * sizeof(bf16_bits));
    inputs.tokens = groups.group.dispatch_input_buffer();
  } else if (tokens_in_buffer) {  // the rows' padding random, as a caller may leave it
    const std::size_t row_bytes = rocep::format_input_row_bytes(config.dispatch_format, config.hidden);
    std::vector<uint8_t> buffer_rows(static_cast<std::size_t>(config.max_tokens_per_rank) * row_bytes);
    std::mt19937 random(static_cast<unsigned>(tokens));
    for (auto& byte : buffer_rows) {
      byte = static_cast<uint8_t>(random());
    }
    rocep::reference::write_input_rows(config.dispatch_format, config.hidden, call.payloads.data(),
                                       call.scales.data(), tokens, buffer_rows.data());
    copy_to_device(groups.group.dispatch_input_buffer(), buffer_rows.data(), buffer_rows.size());
    inputs.tokens = groups.group.dispatch_input_buffer();
    inputs.token_scales = nullptr;
  }
  rocep::testing::dispatch_on(groups.group, inputs, groups.outputs.view(groups.sizes), split,
                              groups.stream.get());
  if (rows != ExpertRows::kOwnMemory) {
    // The buffer may be written once this rank's dispatch is done: no peer reads it any more.
    ROCEP_GPU_CHECK(hipStreamSynchronize(static_cast<hipStream_t>(groups.stream.get())));
    void* buffer = groups.group.combine_input_buffer();
    if (rows == ExpertRows::kInBuffer) {
      args.expert_outputs = buffer;
      copy_to_device(buffer, call.rows.data(), call.rows.size() * sizeof(bf16_bits));
    } else {
      ROCEP_GPU_CHECK(hipMemset(buffer, 0xff,
                                static_cast<std::size_t>(world_size()) * config.max_tokens_per_rank *
                                    config.hidden * sizeof(bf16_bits)));
      ROCEP_GPU_CHECK(hipDeviceSynchronize());  // before the combine, on a stream that does not wait for it
    }
  }
  if (by_caller) {
    groups.group.combine_send(args, groups.stream.get());
    const FactorsAndResidual caller{epilogue->factor, epilogue->device_token_factors.as<float>(),
                                    static_cast<const uint16_t*>(epilogue->device_residual.get()),
                                    config.hidden};
    EXPECT_THROW(rocep::combine_recv(groups.group, epilogue->with(args, true), caller, groups.stream.get()),
                 rocep::InvalidInputError);
    args.out_row_stride = epilogue->stride;
    rocep::combine_recv(groups.group, args, caller, groups.stream.get());
  } else {
    rocep::testing::combine_on(groups.group, epilogue != nullptr ? epilogue->with(args, true) : args, split,
                               groups.stream.get());
  }
  EXPECT_NO_THROW(groups.group.synchronize(groups.stream.get()));
  expect_dispatch_matches(groups.sizes, groups.outputs, expected);
  rocep::testing::expect_strided_rows_match(out, combined, tokens, config.hidden, stride);
}

// Where one call of check_calls_on takes its inputs from.
struct CallInputs {
  ExpertRows rows = ExpertRows::kOwnMemory;  // this rank's expert rows
  bool tokens_in_buffer = false;             // the tokens in the dispatch input buffer
  bool pass_through = false;                 // scaled formats: the tokens already quantised
};

// Calls of counts[i] tokens of fresh inputs (seed + i) on one group, uniformly routed, every second one
// split, checked as check_call_on does; `inputs_of(call)`: where each takes its inputs from.
void check_calls_on(
    Groups& groups, const EpConfig& config, uint64_t seed, const std::vector<int>& counts,
    const std::function<CallInputs(int)>& inputs_of = [](int) { return CallInputs{}; }) {
  for (std::size_t i = 0; i < counts.size(); ++i) {
    const bool split = i % 2 == 1;
    const CallInputs inputs = inputs_of(static_cast<int>(i));
    SCOPED_TRACE("call " + std::to_string(i) + (split ? ", split" : ", fused") +
                 (inputs.rows == ExpertRows::kInBuffer ? ", rows in the combine input buffer" : "") +
                 (inputs.tokens_in_buffer ? ", tokens in the dispatch input buffer" : "") +
                 (inputs.pass_through ? ", already quantised" : ""));
    check_call_on(groups, config,
                  make_call(config, Routing::kUniform, seed + i, counts[i], inputs.pass_through), split,
                  nullptr, false, inputs.rows, inputs.tokens_in_buffer);
  }
}

// Dispatch + combine of fresh inputs on a new GPU group and on the reference, split or fused.
void check_per_token(const EpConfig& config, Routing routing, bool split, bool pass_through = false) {
  const uint64_t seed = shared_seed();
  SCOPED_TRACE(seed_trace(seed) + ", routing " + routing_name(routing) + (split ? ", split" : ", fused") +
               (pass_through ? ", already quantised" : "") + ", " + config.describe());
  Groups groups(config);
  check_call_on(groups, config, make_call(config, routing, seed, -1, pass_through), split, nullptr);
}

TEST_F(GpuPerToken, MatchesReferenceInEveryFormatAndRouting) {
  const int world = world_size();
  bool split = false;
  for (const Routing routing :
       {Routing::kUniform, Routing::kMasked, Routing::kHotExpert, Routing::kUnevenCounts, Routing::kFull}) {
    check_per_token(per_token(make_config(7168, 8, 256 / world, 128)), routing, split = !split);
    check_per_token(per_token(make_config(2048, 4, 64 / world, 96, 16)), routing, split = !split);
  }
  // 320 tokens from each rank: more (source, chunk) entries than a receive ranks in its blocks.
  check_per_token(per_token(make_config(2048, 8, 256 / world, 320, 4)), Routing::kUniform, true);
  check_per_token(per_token(make_config(1024, 1, std::max(8 / world, 1), 64)), Routing::kFull, false);
  for (const auto format : {rocep::TokenFormat::kFp8Block128, rocep::TokenFormat::kMxfp8,
                            rocep::TokenFormat::kMxfp4, rocep::TokenFormat::kNvfp4}) {
    check_per_token(per_token(make_config(2048, 8, 64 / world, 64, 8), format), Routing::kMasked,
                    split = !split);
    check_per_token(per_token(make_config(2048, 8, 64 / world, 64, 8), format), Routing::kUniform, split,
                    /*pass_through=*/true);
  }
  EpConfig fnuz = per_token(make_config(7168, 8, 256 / world, 48), rocep::TokenFormat::kFp8Block128);
  fnuz.fp8_encoding = rocep::Fp8Encoding::kE4m3fnuz;
  check_per_token(fnuz, Routing::kUniform, true);
  // The combine's rows across ranks in fp8 block-128 (both encodings), fused and split.
  for (const auto encoding : {rocep::Fp8Encoding::kE4m3fn, rocep::Fp8Encoding::kE4m3fnuz}) {
    EpConfig fp8_combine = per_token(make_config(7168, 8, 256 / world, 128));
    fp8_combine.combine_dtype = rocep::CombineDtype::kFp8Block128;
    fp8_combine.fp8_encoding = encoding;
    check_per_token(fp8_combine, Routing::kUniform, false);
    check_per_token(fp8_combine, Routing::kMasked, true);
  }
}

// A group sized for many more tokens than most of its calls send, as a server's one group for prefill and
// decode: each receive ranks only the chunks of 64 tokens that hold the tokens sent (in its blocks where
// their masks fit, else by a prefix pass), and must not read what larger calls before it left in the chunks
// past them. The ranks send different counts, so a source's chunks past its own count
// but within another's are read as empty.
TEST_F(GpuPerToken, SmallCallsInAGroupSizedForManyTokensMatchTheReference) {
  const EpConfig config = per_token(make_config(2048, 8, 128, 1024, 16));
  Groups groups(config);
  const uint64_t seed = shared_seed();
  SCOPED_TRACE(seed_trace(seed));
  const bool even = world_rank() % 2 == 0;
  check_calls_on(groups, config, seed,
                 {1024, even ? 100 : 300, even ? 1 : 0, even ? 300 : 1024, even ? 1024 : 17, 0,
                  even ? 17 : 200, even ? 64 : 65});
}

// One group, one call after another with new data, counts full -> 1 -> 0 -> full and a new routing every
// time, eagerly; then as graph replays of one captured dispatch + combine with the count on the device.
TEST_F(GpuPerToken, CallsThatChangeCountsAndRoutingsMatchTheReference) {
  const EpConfig config = per_token(make_config(4096, 8, 128 / world_size(), 256, 16));
  Groups groups(config);
  const uint64_t seed = shared_seed();
  SCOPED_TRACE(seed_trace(seed));
  const int counts[] = {256, 1, 0, 256, 17};
  const Routing routings[] = {Routing::kFull, Routing::kMasked, Routing::kUniform, Routing::kHotExpert,
                              Routing::kUniform};
  for (int i = 0; i < 5; ++i) {
    SCOPED_TRACE("eager call " + std::to_string(i));
    const Call call = make_call(config, routings[i], seed + i, counts[i]);
    HostOutputs expected(config);
    const std::vector<bf16_bits> combined = reference_call(groups.reference, call, expected, groups.sizes);
    groups.device.load(call);
    groups.outputs.poison();
    groups.group.dispatch(groups.device.inputs(false), groups.outputs.view(groups.sizes),
                          groups.stream.get());
    groups.group.combine(groups.device.combine(), groups.stream.get());
    EXPECT_NO_THROW(groups.group.synchronize(groups.stream.get()));
    expect_dispatch_matches(groups.sizes, groups.outputs, expected);
    expect_combined(groups.device.out, combined);
  }
  hipGraph_t graph;
  hipGraphExec_t executable;
  ROCEP_GPU_CHECK(hipStreamBeginCapture(groups.stream.get(), hipStreamCaptureModeThreadLocal));
  groups.group.dispatch_send(groups.device.inputs(true), groups.stream.get());
  groups.group.dispatch_recv(groups.outputs.view(groups.sizes), groups.stream.get());
  groups.group.combine(groups.device.combine(), groups.stream.get());
  ROCEP_GPU_CHECK(hipStreamEndCapture(groups.stream.get(), &graph));
  ROCEP_GPU_CHECK(hipGraphInstantiate(&executable, graph, nullptr, nullptr, 0));
  for (int replay = 0; replay < 4; ++replay) {
    SCOPED_TRACE("graph replay " + std::to_string(replay));
    const Call call = make_call(config, routings[replay + 1], seed + 100 + replay, counts[replay]);
    HostOutputs expected(config);
    const std::vector<bf16_bits> combined = reference_call(groups.reference, call, expected, groups.sizes);
    groups.device.load(call);
    groups.outputs.poison();
    ROCEP_GPU_CHECK(hipGraphLaunch(executable, groups.stream.get()));
    EXPECT_NO_THROW(groups.group.synchronize(groups.stream.get()));
    expect_dispatch_matches(groups.sizes, groups.outputs, expected);
    expect_combined(groups.device.out, combined);
  }
  ROCEP_GPU_CHECK(hipGraphExecDestroy(executable));
  ROCEP_GPU_CHECK(hipGraphDestroy(graph));
}

// The combine epilogue (factor, per-token factors, residual, rows into a wider tensor) against the
// reference's, on one group over calls with new data and counts (the dispatch checked too): CombineArgs'
// own epilogue in fused and split calls, and a caller's that does the same compiled into the receive
// (<rocep/combine_epilogue.hpp>), which must give the same bits.
TEST_F(GpuPerToken, CombineEpilogueMatchesTheReference) {
  rocep::prepare_combine_epilogue<FactorsAndResidual>();
  const EpConfig config = per_token(make_config(2048, 8, 64 / world_size(), 96, 16));
  Groups groups(config);
  const uint64_t seed = shared_seed();
  SCOPED_TRACE(seed_trace(seed));
  const int counts[] = {96, 5, 0, 61, 17, 96};
  for (int i = 0; i < 6; ++i) {
    const bool by_caller = i % 3 == 2;
    SCOPED_TRACE("call " + std::to_string(i) + (by_caller ? ", the caller's epilogue" : ""));
    const rocep::testing::EpilogueData epilogue(config, seed + 50 + i);
    check_call_on(groups, config, make_call(config, Routing::kUniform, seed + i, counts[i]), i % 2 == 1,
                  &epilogue, by_caller);
  }
}

// Where every rank's grid has 16 blocks or more, calls of 1024 tokens or more are combined chunk by chunk,
// and a fused one splits its blocks into senders and receivers (hip/combine.hip): one group over calls that
// cross that count both ways (ranks on either side of it in one call), with new data each time, fused and
// split, with and without an epilogue; at the default budget, on 8 multiprocessors (no chunks), and with
// the rows crossing in fp8; and on the whole share, whose grid, where it has
// PerTokenTuning::kFineCombineChunkBlocks blocks or more, cuts smaller chunks (Shape::combine_chunk_tokens).
// fp8 rows store each four blocks' scales as one vector where the four lie in one row
// (quantize_rows_to_messages): at hidden 2048 every block's, at 2176 (17 scales, 68 bytes a row) the last
// block's, and some spanning two rows, one by one.
TEST_F(GpuPerToken, ChunkedCombinesMatchTheReference) {
  struct Case {
    int sms;
    rocep::CombineDtype combine_dtype;
    int hidden;
  };
  for (const Case& c : {Case{EpConfig::kDefaultSms, rocep::CombineDtype::kBf16, 2048},
                        Case{8, rocep::CombineDtype::kBf16, 2048},
                        Case{EpConfig::kDefaultSms, rocep::CombineDtype::kFp8Block128, 2048},
                        Case{EpConfig::kAllSms, rocep::CombineDtype::kBf16, 2048},
                        Case{EpConfig::kAllSms, rocep::CombineDtype::kFp8Block128, 2048},
                        Case{EpConfig::kAllSms, rocep::CombineDtype::kFp8Block128, 2176}}) {
    EpConfig config = per_token(make_config(c.hidden, 8, 64 / world_size(), 1536, 16, c.sms));
    config.combine_dtype = c.combine_dtype;
    Groups groups(config);
    const uint64_t seed = shared_seed();
    SCOPED_TRACE(seed_trace(seed) + ", " + config.describe());
    const int counts[] = {1536, world_rank() % 2 == 0 ? 1100 : 700, 1024, 3, 1300};
    for (int i = 0; i < 5; ++i) {
      const bool split = i == 1 || i == 4;
      const bool with_epilogue = i % 3 == 0;
      SCOPED_TRACE("call " + std::to_string(i) + (split ? ", split" : ", fused") +
                   (with_epilogue ? ", epilogue" : ""));
      const rocep::testing::EpilogueData epilogue(config, seed + 50 + i);
      check_call_on(groups, config, make_call(config, Routing::kUniform, seed + i, counts[i]), split,
                    with_epilogue ? &epilogue : nullptr);
    }
  }
}

// Tokens written into the dispatch input buffer (bf16: nothing staged, the peers read them there) give the
// reference's outputs over calls of one group whose counts and data change, fused and split, with every
// rank's tokens in the buffer in some calls and only some ranks' in others, at the decode shape (hidden
// 7168, top-8 of 256 experts) and a smaller one.
TEST_F(GpuPerToken, TokensInTheDispatchInputBufferMatchTheReference) {
  const int rank = world_rank();
  for (const EpConfig& config : {per_token(make_config(7168, 8, 256 / world_size(), 512, 16)),
                                 per_token(make_config(2048, 8, 64 / world_size(), 1024, 16))}) {
    Groups groups(config);
    const uint64_t seed = shared_seed();
    SCOPED_TRACE(seed_trace(seed) + ", " + config.describe());
    check_calls_on(groups, config, seed,
                   {128, 128, 256, 257, rank % 2 == 0 ? 200 : 60, 3, 512, 96, 96, 0, 50}, [rank](int call) {
                     CallInputs inputs;
                     inputs.tokens_in_buffer = call != 5 && (call < 8 || (call + rank) % 2 == 0);
                     return inputs;
                   });
  }
}

// Tokens that arrive already quantised give the reference's outputs over calls of one group whose counts and
// data change, fused and split: copied by the send (payloads and scales, a run of tokens at a time) or
// written into the dispatch input buffer (each row its payload, then its scales; nothing staged), in turn
// with calls quantised in dispatch, which stage into the same memory, so that payloads or scales left by
// another call show. Every scaled format; at a hidden whose scales are whole 16-byte vectors (7168, 2048)
// and one whose are not (2176: 68 bytes of fp8 scales, 4-byte groups of mxfp4's).
TEST_F(GpuPerToken, AlreadyQuantisedTokensAcrossCallsMatchTheReference) {
  const int world = world_size();
  const int rank = world_rank();
  for (const EpConfig& config :
       {per_token(make_config(7168, 8, 256 / world, 256, 16), rocep::TokenFormat::kFp8Block128),
        per_token(make_config(2176, 8, 64 / world, 320, 8), rocep::TokenFormat::kFp8Block128),
        per_token(make_config(2048, 8, 64 / world, 256, 8), rocep::TokenFormat::kMxfp8),
        per_token(make_config(2176, 4, 32 / world, 320, 8), rocep::TokenFormat::kMxfp4),
        per_token(make_config(2048, 8, 64 / world, 256, 8), rocep::TokenFormat::kNvfp4)}) {
    Groups groups(config);
    const uint64_t seed = shared_seed();
    SCOPED_TRACE(seed_trace(seed) + ", " + config.describe());
    check_calls_on(groups, config, seed,
                   {config.max_tokens_per_rank, 1, rank % 2 == 0 ? 100 : 33, 0, 129, 129, 64, 7},
                   [rank](int call) {
                     CallInputs inputs;
                     inputs.pass_through = call % 4 != 3;
                     inputs.tokens_in_buffer = inputs.pass_through && (call + rank) % 3 != 1;
                     return inputs;
                   });
  }
}

// Expert rows written into the combine input buffer (within one node: loaded by the peers from there;
// across nodes: the staging rows, put from without a copy) give the reference's outputs, over calls of one
// group whose counts and data change (chunked and not, fused and split), with every rank's rows in the
// buffer in some calls and only some ranks' in others (the others' buffers poisoned, so that a stale
// load shows); a pointer into the buffer anywhere but at its start is refused on every rank, and the
// group goes on; a group created with EpConfig::combine_input_buffer = false has no buffer. At the default
// budget and on the whole share, where a grid of PerTokenTuning::kPushedBufferBlocks blocks or more (the
// whole of a GPU with one rank) pushes the rows of its chunked calls from the buffer, each rank deciding
// for its own call.
void check_rows_in_the_combine_input_buffer(const EpConfig& config) {
  Groups groups(config);
  const uint64_t seed = shared_seed();
  SCOPED_TRACE(seed_trace(seed) + ", " + config.describe());
  const int rank = world_rank();
  // Calls 7 and 8: small calls with the rows in the buffer on every rank one after the other (their
  // signal may then skip what the peers already hold), then calls 9 and 10 alternating by rank.
  check_calls_on(groups, config, seed, {1536, rank % 2 == 0 ? 1100 : 700, 3, 1300, 1200, 5, 1536, 6, 9, 4, 7},
                 [rank](int call) {
                   CallInputs inputs;
                   inputs.rows = call == 0 || call == 3 || call == 7 || call == 8 || (call + rank) % 2 == 0
                                     ? ExpertRows::kInBuffer
                                     : ExpertRows::kBesideTheBuffer;
                   return inputs;
                 });
  rocep::testing::dispatch_on(groups.group, groups.device.inputs(false), groups.outputs.view(groups.sizes),
                              false, groups.stream.get());
  rocep::CombineArgs args = groups.device.combine();
  args.expert_outputs = static_cast<bf16_bits*>(groups.group.combine_input_buffer()) + config.hidden;
  EXPECT_THROW(groups.group.combine(args, groups.stream.get()), rocep::InvalidInputError);
  args.expert_outputs = groups.group.combine_input_buffer();
  groups.group.combine(args, groups.stream.get());
  EXPECT_NO_THROW(groups.group.synchronize(groups.stream.get()));

  // A group created without the buffer has none, and combines as the others do.
  EpConfig without = config;
  without.combine_input_buffer = false;
  Groups groups_without(without);
  EXPECT_THROW(groups_without.group.combine_input_buffer(), rocep::ConfigError);
  check_calls_on(groups_without, without, seed + 100, {1536, 3});
}

TEST_F(GpuPerToken, RowsInTheCombineInputBufferMatchTheReference) {
  for (const int sms : {EpConfig::kDefaultSms, EpConfig::kAllSms}) {
    check_rows_in_the_combine_input_buffer(per_token(make_config(2048, 8, 64 / world_size(), 1536, 16, sms)));
  }
}

// Local-only mode (EpConfig::local_only): each rank lays out only its own experts' pairs of its own tokens,
// combines them here and adds the shared expert on its slice of the tokens, in every all-reduce size that
// divides the world (the world's and 1); one group over fused and split calls whose counts change, some
// of 1024 tokens or more (chunked combines), and one of none.
TEST_F(GpuPerToken, LocalOnlyMatchesTheReference) {
  const int world = world_size();
  for (const int allreduce_world_size : {world, 1}) {
    EpConfig config = per_token(make_config(2048, 8, 64 / world, 1536, 16));
    config.local_only = true;
    config.allreduce_world_size = allreduce_world_size;
    Groups groups(config);
    const uint64_t seed = shared_seed();
    SCOPED_TRACE(seed_trace(seed) + ", " + config.describe());
    check_calls_on(groups, config, seed, {1536, world_rank() % 2 == 0 ? 1100 : 700, 0, 77});
  }
}

// 8 and 24 multiprocessors and the default share give the reference's outputs, so the same bits (each
// budget that fits the rank's share of its GPU: under MPS at 25%, 24 does not).
TEST_F(GpuPerToken, SmBudgetsGiveTheSameBits) {
  rocep::MpiBootstrap world(MPI_COMM_WORLD);
  const int share = rocep::testing::sm_split(world, EpConfig::kAllSms).communication;
  for (const int sms : {8, 24, EpConfig::kDefaultSms}) {
    if (sms > share) {
      continue;  // alike on every rank: each has the same share
    }
    check_per_token(per_token(make_config(7168, 8, 256 / world_size(), 256, 1, sms)), Routing::kUniform,
                    false);
  }
}

}  // namespace
