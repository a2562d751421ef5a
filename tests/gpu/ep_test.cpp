// The GPU backend of dispatch and combine against the CPU reference, bit for bit: both run collectively
// on the same fresh random inputs in the same processes. Every GPU output is poisoned before each call,
// and rows past row_offsets[L] must still hold the poison afterwards. The cases and checks are in
// ep_cases.hpp, shared with contract_test.cpp.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ep_cases.hpp"
#include "hip/bf16.hpp"
#include "host/device.hpp"
#include "host/device_memory.hpp"
#include "host/gpu_check.hpp"
#include "mpi_support.hpp"
#include "rocep/mpi.hpp"
#include "rocep/rocep.hpp"

namespace {

using rocep::testing::check_against_reference;
using rocep::testing::DeviceInputs;
using rocep::testing::DeviceOutputs;
using rocep::testing::download;
using rocep::testing::expect_dispatch_matches;
using rocep::testing::Expected;
using rocep::testing::fill_bytes;
using rocep::testing::Inputs;
using rocep::testing::kPoison;
using rocep::testing::make_config;
using rocep::testing::make_inputs;
using rocep::testing::poisoned;
using rocep::testing::reference_results;
using rocep::testing::Routing;
using rocep::testing::routing_name;
using rocep::testing::seed_trace;
using rocep::testing::shared_seed;
using rocep::testing::upload;
using rocep::testing::world_rank;
using rocep::testing::world_size;

using rocep::bf16_bits;
using rocep::DeviceBuffer;
using rocep::EpConfig;

using GpuEp = rocep::testing::GpuTest;

TEST_F(GpuEp, MatchesReferenceAcrossShapesAndRoutings) {
  const int world = world_size();
  // hidden {2048, 2880, 4096, 7168}, top_k {1, 4, 8}, experts {8, 64, 128, 256} (as far as the world size
  // divides them). The combine sums rows with 1, 2 (2880, 4096) or 3.5 (7168) vectors per thread; with 8
  // blocks, short rows a batch of tokens at a time.
  const std::vector<EpConfig> configs = {
      make_config(7168, 8, 256 / world, 128),
      // 8 blocks: the combine send's blocks take 3/4 of the (source, token) pairs by their index and claim
      // the rest.
      make_config(7168, 8, 256 / world, 128, 1, 8),
      make_config(4096, 8, 128 / world, 96),
      make_config(2880, 4, 128 / world, 80, 1, 8),
      make_config(2048, 8, 64 / world, 64),
      make_config(2048, 4, std::max(8 / world, 1), 32, 4),
      make_config(7168, 1, 64 / world, 48),
      make_config(2048, 4, 256 / world, 96, 8),
      // Enough tokens that the receiver ranks more than 16 chunks of 64 and takes their prefix in a pass.
      make_config(2048, 8, 64 / world, 576),
      // 8 blocks: each sends its 72 tokens in batches of 32, 32 and 8.
      make_config(2048, 8, 64 / world, 576, 1, 8),
  };
  for (const EpConfig& config : configs) {
    for (const Routing routing :
         {Routing::kUniform, Routing::kMasked, Routing::kHotExpert, Routing::kUnevenCounts, Routing::kFull}) {
      if (config.top_k > config.num_experts)
        continue;
      check_against_reference(config, routing);
    }
  }
}

// Local-only mode (EpConfig::local_only): each rank lays out only its own experts' rows of its own tokens,
// sums them, and adds the shared expert on its slice of the tokens, in every all-reduce size that divides
// the world (1 and the world's), at the default budget and on 8 blocks.
TEST_F(GpuEp, LocalOnlyMatchesReference) {
  const int world = world_size();
  for (const int allreduce_world_size : {world, 1}) {
    for (EpConfig config :
         {make_config(7168, 8, 256 / world, 128), make_config(2048, 4, 64 / world, 96, 1, 8)}) {
      config.local_only = true;
      config.allreduce_world_size = allreduce_world_size;
      for (const Routing routing : {Routing::kUniform, Routing::kMasked, Routing::kFull}) {
        check_against_reference(config, routing);
      }
    }
  }
}

// Expert input scales (expanded, bf16): every row holds its token's fp8 codes divided by its expert's
// scale (scales from 2^-8 to 8, so that codes saturate, round and go subnormal), padding rows zero; both
// encodings, fused and split dispatches of new data and counts on one group, each followed by its combine,
// against the reference. Rows past row_offsets[L] keep the poison.
TEST_F(GpuEp, ExpertInputScalesMatchReference) {
  const int world = world_size();
  for (const auto encoding : {rocep::Fp8Encoding::kE4m3fn, rocep::Fp8Encoding::kE4m3fnuz}) {
    EpConfig config = make_config(2048, 8, 64 / world, 96, 16);
    config.fp8_encoding = encoding;
    const uint64_t seed = shared_seed();
    SCOPED_TRACE(seed_trace(seed) + ", " + config.describe());
    const int local_experts = config.num_local_experts(world);
    const std::size_t rows = config.max_recv_rows(world);
    const std::size_t hidden = config.hidden;
    rocep::EpGroup reference(MPI_COMM_WORLD, config, rocep::Backend::kCpuReference);
    rocep::EpGroup group(MPI_COMM_WORLD, config, rocep::Backend::kGpu);
    rocep::Stream stream;
    const int counts[] = {96, 41, 96};
    for (int call = 0; call < 3; ++call) {
      const bool split = call == 1;
      SCOPED_TRACE("call " + std::to_string(call) + (split ? ", split" : ", fused"));
      const Inputs inputs = make_inputs(config, Routing::kUniform, seed + call, counts[call]);
      const rocep::testing::ExpertData experts = rocep::testing::make_expert_data(config, seed + 10 + call);
      std::mt19937_64 random(seed + 31 * call + world_rank());
      std::vector<float> scales(local_experts);
      for (float& scale : scales) {
        scale = std::ldexp(1.0f + static_cast<float>(random() % 1000) / 1000.0f,
                           static_cast<int>(random() % 12) - 8);
      }
      std::vector<uint8_t> codes(rows * hidden);
      std::vector<uint32_t> row_offsets(local_experts + 1);
      std::vector<int32_t> expert_ids(local_experts);
      std::vector<rocep::SrcInfo> src_info(rows);
      std::vector<float> recv_weights(rows);
      rocep::DispatchOutputs expected{codes.data(),    row_offsets.data(),  expert_ids.data(),
                                      src_info.data(), recv_weights.data(), nullptr};
      expected.expert_input_scales = scales.data();
      reference.dispatch(inputs.view(), expected);
      std::vector<bf16_bits> combined(static_cast<std::size_t>(std::max(counts[call], 1)) * hidden);
      reference.combine(
          {experts.outputs.data(), recv_weights.data(), experts.shared.data(), combined.data()});
      combined.resize(static_cast<std::size_t>(counts[call]) * hidden);

      const DeviceOutputs outputs(config);
      const DeviceBuffer device_scales = upload(scales);
      rocep::DispatchOutputs view = outputs.view();
      view.expert_input_scales = device_scales.as<float>();
      const DeviceInputs device_inputs(inputs);
      const rocep::testing::DeviceCombine combine(config, experts);
      rocep::testing::dispatch_on(group, device_inputs.view(), view, split, stream.get());
      rocep::testing::combine_on(group, combine.args(outputs, /*weighted=*/true), split, stream.get());
      EXPECT_NO_THROW(group.synchronize(stream.get()));
      ASSERT_EQ(download<uint32_t>(outputs.row_offsets, local_experts + 1), row_offsets);
      const std::size_t used = row_offsets[local_experts];
      const auto got = download<uint8_t>(outputs.recv_tokens, outputs.recv_tokens.bytes());
      EXPECT_TRUE(rocep::testing::same_bytes(got.data(), codes.data(), used * hidden)) << "codes differ";
      EXPECT_TRUE(rocep::testing::all_poison(got.data() + used * hidden, got.data() + got.size()))
          << "bytes past the used rows' codes were written";
      EXPECT_TRUE(rocep::testing::same_bytes(download<rocep::SrcInfo>(outputs.src_info, rows).data(),
                                             src_info.data(), used * sizeof(rocep::SrcInfo)));
      EXPECT_TRUE(rocep::testing::same_bytes(download<float>(outputs.recv_weights, rows).data(),
                                             recv_weights.data(), used * sizeof(float)));
      rocep::testing::expect_combined_matches(combine.out, combined);
    }
  }
}

// The weighted combine's partials crossing in fp8 block-128 (EpConfig::combine_dtype), both encodings: long
// rows (a block per (source, token)) and short ones (batches of pairs), at the default budget and on 8
// blocks; the unweighted combine's rows stay bf16.
TEST_F(GpuEp, Fp8CombineMatchesReference) {
  const int world = world_size();
  for (const auto encoding : {rocep::Fp8Encoding::kE4m3fn, rocep::Fp8Encoding::kE4m3fnuz}) {
    for (EpConfig config :
         {make_config(7168, 8, 256 / world, 128), make_config(2048, 4, 64 / world, 96, 1, 8)}) {
      config.combine_dtype = rocep::CombineDtype::kFp8Block128;
      config.fp8_encoding = encoding;
      for (const Routing routing : {Routing::kUniform, Routing::kMasked, Routing::kHotExpert}) {
        check_against_reference(config, routing);
      }
    }
  }
}

// Tokens written into the group's input buffer (no staging copy in the send) give the same results, bf16
// and, already quantised with their scales in the buffer's rows, the scaled formats.
TEST_F(GpuEp, TokensInTheInputBufferMatchReference) {
  const int world = world_size();
  for (const EpConfig& config : {make_config(7168, 8, 256 / world, 128), make_config(2048, 4, 8, 32, 4),
                                 make_config(2048, 8, 64 / world, 576, 1, 8)}) {
    for (const Routing routing : {Routing::kUniform, Routing::kMasked, Routing::kUnevenCounts}) {
      check_against_reference(config, routing, /*in_input_buffer=*/true);
    }
  }
  for (const auto format :
       {rocep::TokenFormat::kFp8Block128, rocep::TokenFormat::kMxfp8, rocep::TokenFormat::kMxfp4}) {
    for (const EpConfig& config : {make_config(7168, 8, 256 / world, 128), make_config(2176, 4, 8, 64, 4)}) {
      EpConfig scaled = config;
      scaled.dispatch_format = format;
      check_against_reference(scaled, Routing::kUniform, /*in_input_buffer=*/true);
    }
  }
  // A pointer into the buffer anywhere but at its start is refused: the rank takes part with zero tokens
  // and throws (here every rank at once).
  const EpConfig config = make_config(2048, 4, 8, 32);
  rocep::EpGroup group(MPI_COMM_WORLD, config, rocep::Backend::kGpu);
  const Inputs inputs = make_inputs(config, Routing::kFull, shared_seed());
  const DeviceInputs device_inputs(inputs);
  rocep::DispatchInputs misplaced = device_inputs.view();
  misplaced.tokens = static_cast<bf16_bits*>(group.dispatch_input_buffer()) + config.hidden;
  EXPECT_THROW(group.dispatch_send(misplaced, nullptr), rocep::InvalidInputError);
  // A scaled format's rows in the buffer hold their scales: token_scales beside them are refused.
  EpConfig fp8 = config;
  fp8.dispatch_format = rocep::TokenFormat::kFp8Block128;
  rocep::EpGroup fp8_group(MPI_COMM_WORLD, fp8, rocep::Backend::kGpu);
  rocep::DispatchInputs with_scales = device_inputs.view();
  with_scales.tokens = fp8_group.dispatch_input_buffer();
  with_scales.token_scales = fp8_group.dispatch_input_buffer();
  EXPECT_THROW(fp8_group.dispatch_send(with_scales, nullptr), rocep::InvalidInputError);
}

// Dispatch in a quantised format, quantised from bf16 in the kernel or passed through already quantised:
// payload, scales (in the format's layout) and row metadata equal the reference's bit for bit, and every
// byte that belongs to a row past row_offsets[L] keeps its poison.
void check_format_against_reference(const EpConfig& config, Routing routing, bool pass_through) {
  SCOPED_TRACE(std::string("routing ") + routing_name(routing) +
               (pass_through ? ", already quantised" : ", quantised in dispatch") + ", " + config.describe());
  rocep::EpGroup group(MPI_COMM_WORLD, config, rocep::Backend::kGpu);
  rocep::Stream stream;
  // Split calls, then a fused call, each on data of its own: what the first left in the group cannot pass
  // for the second's results.
  for (const bool fused : {false, true}) {
    const uint64_t seed = shared_seed();
    SCOPED_TRACE(seed_trace(seed) + (fused ? ", fused dispatch" : ", dispatch_send + dispatch_recv"));
    Inputs inputs = make_inputs(config, routing, seed);
    const std::size_t rows = config.max_recv_rows(world_size());
    const int hidden = config.hidden;
    const std::size_t payload_bytes = rocep::format_payload_bytes(config.dispatch_format, hidden);
    const std::size_t scale_bytes = rocep::format_scale_bytes(config.dispatch_format, hidden);

    std::mt19937_64 random(seed ^ (0x51ed27ull * (world_rank() + 1)));
    std::vector<uint8_t> tokens;        // what dispatch reads: bf16 rows, or quantised payloads
    std::vector<uint8_t> token_scales;  // already quantised only
    if (pass_through) {
      // Any bytes travel as they are.
      tokens.resize(std::max<std::size_t>(inputs.num_tokens * payload_bytes, 1));
      token_scales.resize(std::max<std::size_t>(inputs.num_tokens * scale_bytes, 1));
      for (auto* bytes : {&tokens, &token_scales})
        for (auto& byte : *bytes)
          byte = static_cast<uint8_t>(random());
    } else {
      // Magnitudes from 2^-12 to 2^12 per token, so scales differ; a NaN and an infinity in two blocks.
      for (int token = 0; token < inputs.num_tokens; ++token) {
        const float magnitude = std::ldexp(1.0f, static_cast<int>(random() % 25) - 12);
        for (int i = 0; i < hidden; ++i) {
          bf16_bits& element = inputs.tokens[static_cast<std::size_t>(token) * hidden + i];
          element = rocep::float_to_bf16(rocep::bf16_to_float(element) * magnitude);
        }
      }
      if (inputs.num_tokens >= 2) {
        inputs.tokens[5] = 0x7fc0;                                              // NaN, token 0
        inputs.tokens[static_cast<std::size_t>(hidden) + hidden / 2] = 0x7f80;  // +inf, token 1
      }
      tokens.assign(std::max<std::size_t>(inputs.tokens.size(), 1) * sizeof(bf16_bits), 0);
      if (!inputs.tokens.empty()) {
        std::memcpy(tokens.data(), inputs.tokens.data(), inputs.tokens.size() * sizeof(bf16_bits));
      }
    }
    const float global_scale = 448.0f * 6.0f / 2048.0f;  // the same on every rank

    rocep::DispatchInputs host_inputs{tokens.data(), inputs.topk_ids.data(), inputs.topk_weights.data(),
                                      inputs.num_tokens, nullptr};
    host_inputs.token_scales = pass_through ? token_scales.data() : nullptr;
    host_inputs.global_scale = &global_scale;
    const Expected expected = reference_results(config, host_inputs, /*experts=*/nullptr);

    const DeviceBuffer device_tokens = upload(tokens);
    const DeviceBuffer device_scales = upload(token_scales);
    const DeviceBuffer device_global_scale = upload(std::vector<float>{global_scale});
    DeviceInputs device_inputs(inputs);
    rocep::DispatchInputs view = device_inputs.view();
    view.tokens = device_tokens.get();
    view.token_scales = pass_through ? device_scales.get() : nullptr;
    view.global_scale = device_global_scale.as<float>();
    // The combine that ends each step: its output is checked by the combine tests; the expert outputs are a
    // poisoned bf16 buffer of R rows.
    const DeviceBuffer expert_outputs = poisoned(rows * hidden * sizeof(bf16_bits));
    const DeviceOutputs outputs(config);
    rocep::testing::dispatch_on(group, view, outputs.view(), /*split=*/!fused, stream.get());
    EXPECT_NO_THROW(group.synchronize(stream.get()));
    expect_dispatch_matches(config, outputs, expected);

    // A combine ends the round: it tells every rank that its peers are done reading the buffers that the
    // next dispatch rewrites.
    DeviceBuffer combined = poisoned(std::max(inputs.num_tokens, 1) * hidden * sizeof(bf16_bits));
    group.combine({expert_outputs.get(), outputs.recv_weights.as<float>(), nullptr, combined.get()},
                  stream.get());
    EXPECT_NO_THROW(group.synchronize(stream.get()));
  }
}

TEST_F(GpuEp, QuantisedDispatchMatchesReference) {
  const int world = world_size();
  struct Case {
    rocep::TokenFormat format;
    rocep::Fp8Encoding encoding;
    int hidden;
    int alignment;
    int max_tokens;  // 48: one chunk of 64 tokens per source; 576: nine; 1088: ranked by the whole grid
    int num_sms;     // 0: the default budget; N: N multiprocessors; kAllSms: every resident block
  };
  const Case cases[] = {
      {rocep::TokenFormat::kFp8Block128, rocep::Fp8Encoding::kE4m3fn, 7168, 1, 48, 0},
      {rocep::TokenFormat::kFp8Block128, rocep::Fp8Encoding::kE4m3fnuz, 2048, 4, 48, 0},
      {rocep::TokenFormat::kMxfp8, rocep::Fp8Encoding::kAuto, 2048, 1, 48, 0},
      {rocep::TokenFormat::kMxfp4, rocep::Fp8Encoding::kAuto, 7168, 1, 48, 0},
      {rocep::TokenFormat::kNvfp4, rocep::Fp8Encoding::kAuto, 2048, 128, 48, 0},
      {rocep::TokenFormat::kFp8Block128, rocep::Fp8Encoding::kE4m3fn, 2048, 4, 576, 0},
      {rocep::TokenFormat::kNvfp4, rocep::Fp8Encoding::kAuto, 2048, 128, 576, 0},
      // Ranked by the whole grid; nvfp4's scales then laid out after the expansion, in whole tile runs
      // (hidden 2880: 45 groups of 4 scales per row, so the last 8 are partial).
      {rocep::TokenFormat::kFp8Block128, rocep::Fp8Encoding::kE4m3fn, 2688, 4, 1088, 0},
      {rocep::TokenFormat::kNvfp4, rocep::Fp8Encoding::kAuto, 7168, 128, 1088, 0},
      {rocep::TokenFormat::kNvfp4, rocep::Fp8Encoding::kAuto, 2880, 3, 1088, 0},
      // Several tokens per block: quantised in runs of consecutive tokens (stage_tokens; with 48 tokens a
      // block quantises its few one at a time).
      {rocep::TokenFormat::kFp8Block128, rocep::Fp8Encoding::kE4m3fn, 7168, 1, 576, 8},
      // Every resident block (the cases above run on a budget's grid, whose blocks expand several tokens
      // at a time): scales with the payloads, and laid out later.
      {rocep::TokenFormat::kMxfp8, rocep::Fp8Encoding::kAuto, 2048, 1, 576, EpConfig::kAllSms},
      {rocep::TokenFormat::kNvfp4, rocep::Fp8Encoding::kAuto, 7168, 128, 1088, EpConfig::kAllSms},
  };
  for (const Case& c : cases) {
    EpConfig config = make_config(c.hidden, 8, 64 / world, c.max_tokens, c.alignment, c.num_sms);
    config.dispatch_format = c.format;
    config.fp8_encoding = c.encoding == rocep::Fp8Encoding::kAuto ? rocep::Fp8Encoding::kE4m3fn : c.encoding;
    for (const Routing routing : {Routing::kUniform, Routing::kMasked, Routing::kUnevenCounts}) {
      for (const bool pass_through : {false, true}) {
        check_format_against_reference(config, routing, pass_through);
      }
    }
  }
}

// The weighted combine's epilogue (factor, per-token factors, residual, rows into a wider tensor) against
// the reference's, over calls with new data and counts, fused and split.
TEST_F(GpuEp, CombineEpilogueMatchesTheReference) {
  const EpConfig config = make_config(2048, 8, 64 / world_size(), 96, 4);
  rocep::EpGroup reference(MPI_COMM_WORLD, config, rocep::Backend::kCpuReference);
  rocep::EpGroup group(MPI_COMM_WORLD, config, rocep::Backend::kGpu);
  rocep::Stream stream;
  const uint64_t seed = shared_seed();
  SCOPED_TRACE(seed_trace(seed));
  const int counts[] = {96, 3, 0, 40};
  for (int i = 0; i < 4; ++i) {
    SCOPED_TRACE("call " + std::to_string(i));
    const Inputs inputs = make_inputs(config, Routing::kUniform, seed + i, counts[i]);
    const rocep::testing::ExpertData experts = rocep::testing::make_expert_data(config, seed + 20 + i);
    const rocep::testing::EpilogueData epilogue(config, seed + 40 + i);
    Expected expected = reference_results(config, inputs.view(), nullptr);
    // reference_results' dispatch was on a group of its own: this one dispatches again for its combine.
    const std::size_t rows = config.max_recv_rows(world_size());
    std::vector<uint8_t> tokens(rows * config.hidden * sizeof(bf16_bits));
    rocep::DispatchOutputs host{tokens.data(),
                                expected.row_offsets.data(),
                                expected.expert_ids.data(),
                                expected.src_info.data(),
                                expected.recv_weights.data(),
                                nullptr};
    reference.dispatch(inputs.view(), host);
    std::vector<bf16_bits> combined(static_cast<std::size_t>(std::max(counts[i], 1)) * epilogue.stride);
    reference.combine(epilogue.with(
        {experts.outputs.data(), expected.recv_weights.data(), experts.shared.data(), combined.data()},
        false));

    const DeviceInputs device_inputs(inputs);
    const DeviceOutputs outputs(config);
    const rocep::testing::DeviceCombine device_combine(config, experts);
    const DeviceBuffer out =
        poisoned(static_cast<std::size_t>(config.max_tokens_per_rank) * epilogue.stride * sizeof(bf16_bits));
    rocep::CombineArgs args = device_combine.args(outputs, /*weighted=*/true);
    args.out = out.get();
    rocep::testing::dispatch_on(group, device_inputs.view(), outputs.view(), i % 2 == 1, stream.get());
    rocep::testing::combine_on(group, epilogue.with(args, true), i % 2 == 1, stream.get());
    EXPECT_NO_THROW(group.synchronize(stream.get()));
    expect_dispatch_matches(config, outputs, expected);
    rocep::testing::expect_strided_rows_match(out, combined, counts[i], config.hidden, epilogue.stride);
  }
}

TEST_F(GpuEp, TwoRunsAreBitIdenticalAndGraphReplaysMatchEager) {
  const EpConfig config = make_config(2048, 8, 64 / world_size(), 64);
  const uint64_t seed = shared_seed();
  SCOPED_TRACE(seed_trace(seed));
  const Inputs inputs = make_inputs(config, Routing::kMasked, seed);
  rocep::EpGroup group(MPI_COMM_WORLD, config, rocep::Backend::kGpu);
  rocep::Stream stream;
  const DeviceInputs device_inputs(inputs, /*read_count_on_device=*/true);
  const DeviceOutputs outputs(config);
  DeviceBuffer out = poisoned(std::max(inputs.num_tokens, 1) * config.hidden * sizeof(bf16_bits));
  // Expert outputs = the dispatched rows themselves.
  const rocep::CombineArgs combine{outputs.recv_tokens.get(), outputs.recv_weights.as<float>(), nullptr,
                                   out.get()};
  const std::size_t out_bytes =
      static_cast<std::size_t>(inputs.num_tokens) * config.hidden * sizeof(bf16_bits);

  auto run_eager = [&] {
    group.dispatch(device_inputs.view(), outputs.view(), stream.get());
    group.combine(combine, stream.get());
    group.synchronize(stream.get());
    return download<uint8_t>(out, out_bytes);
  };
  const auto first = run_eager();
  // The first run's dispatch is the reference's (the determinism below is of correct results).
  expect_dispatch_matches(config, outputs, reference_results(config, inputs.view(), /*experts=*/nullptr));
  fill_bytes(out, kPoison);
  const auto second = run_eager();
  EXPECT_EQ(first, second) << "two eager runs differ";

  hipGraph_t graph;
  hipGraphExec_t executable;
  ROCEP_GPU_CHECK(hipStreamBeginCapture(stream.get(), hipStreamCaptureModeThreadLocal));
  group.dispatch(device_inputs.view(), outputs.view(), stream.get());
  group.combine(combine, stream.get());
  ROCEP_GPU_CHECK(hipStreamEndCapture(stream.get(), &graph));
  ROCEP_GPU_CHECK(hipGraphInstantiate(&executable, graph, nullptr, nullptr, 0));
  int mismatches = 0;
  for (int replay = 0; replay < 100; ++replay) {
    ROCEP_GPU_CHECK(hipMemsetAsync(out.get(), kPoison, out.bytes(), stream.get()));
    ROCEP_GPU_CHECK(hipGraphLaunch(executable, stream.get()));
    group.synchronize(stream.get());
    mismatches += download<uint8_t>(out, out_bytes) == first ? 0 : 1;
  }
  EXPECT_EQ(mismatches, 0) << "graph replays that differ from the eager run";
  ROCEP_GPU_CHECK(hipGraphExecDestroy(executable));
  ROCEP_GPU_CHECK(hipGraphDestroy(graph));
}

TEST_F(GpuEp, InvalidExpertIdIsReportedWithRankTokenAndSlot) {
  const int world = world_size();
  const EpConfig config = make_config(2048, 4, 8, 16);
  const uint64_t seed = shared_seed();
  Inputs inputs = make_inputs(config, Routing::kFull, seed);
  const bool culprit = world_rank() == world - 1;
  if (culprit)
    inputs.topk_ids[3 * config.top_k + 2] = config.num_experts;  // token 3, slot 2
  rocep::EpGroup group(MPI_COMM_WORLD, config, rocep::Backend::kGpu);
  rocep::Stream stream;
  const DeviceInputs device_inputs(inputs);
  const DeviceOutputs outputs(config);
  group.dispatch(device_inputs.view(), outputs.view(), stream.get());
  if (culprit) {
    try {
      group.synchronize(stream.get());
      ADD_FAILURE() << "no InvalidInputError";
    } catch (const rocep::InvalidInputError& error) {
      const std::string message = error.what();
      EXPECT_NE(message.find("rank " + std::to_string(world_rank())), std::string::npos) << message;
      EXPECT_NE(message.find("token 3"), std::string::npos) << message;
      EXPECT_NE(message.find("slot 2"), std::string::npos) << message;
    }
  } else {
    EXPECT_NO_THROW(group.synchronize(stream.get()));
  }
  DeviceBuffer out = poisoned(inputs.num_tokens * config.hidden * sizeof(bf16_bits));
  group.combine({outputs.recv_tokens.get(), outputs.recv_weights.as<float>(), nullptr, out.get()},
                stream.get());
  EXPECT_NO_THROW(group.synchronize(stream.get())) << "the group stays usable after invalid input";
}

TEST_F(GpuEp, RankThatNeverJoinsMakesPeersTimeOut) {
  const int world = world_size();
  EpConfig config = make_config(2048, 4, 8, 16);
  config.timeout_seconds = 1.0;
  const uint64_t seed = shared_seed();
  const Inputs inputs = make_inputs(config, Routing::kFull, seed);
  const int absent = world - 1;
  {
    rocep::EpGroup group(MPI_COMM_WORLD, config, rocep::Backend::kGpu);
    rocep::Stream stream;
    const DeviceInputs device_inputs(inputs);
    const DeviceOutputs outputs(config);
    // row_offsets as an earlier call could have left them (expert e's rows from 5e on): after the timeout
    // they must read as an empty layout, so that no stale rows look valid.
    const int local_experts = config.num_local_experts(world);
    std::vector<uint32_t> stale_offsets(local_experts + 1);
    for (int expert = 0; expert <= local_experts; ++expert)
      stale_offsets[expert] = 5 * static_cast<uint32_t>(expert);
    rocep::testing::copy_into(outputs.row_offsets, stale_offsets);
    if (world_rank() != absent) {
      const double start = MPI_Wtime();
      group.dispatch(device_inputs.view(), outputs.view(), stream.get());
      try {
        group.synchronize(stream.get());
        ADD_FAILURE() << "no TimeoutError";
      } catch (const rocep::TimeoutError& error) {
        const std::string message = error.what();
        EXPECT_NE(message.find("dispatch_recv"), std::string::npos) << message;
        EXPECT_NE(message.find("rank " + std::to_string(absent)), std::string::npos) << message;
      }
      EXPECT_LT(MPI_Wtime() - start, 10 * config.timeout_seconds)
          << "the timeout took far longer than configured";
      EXPECT_EQ(download<uint32_t>(outputs.row_offsets, local_experts + 1),
                std::vector<uint32_t>(local_experts + 1, 0u))
          << "row_offsets after a timed-out dispatch_recv are not all zeros";
      EXPECT_THROW(group.dispatch_recv(outputs.view(), stream.get()), rocep::Error)
          << "a timed-out group refuses calls";
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }  // every rank destroys its group; none may hang
}

}  // namespace
