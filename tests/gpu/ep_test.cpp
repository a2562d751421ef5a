// The GPU backend of dispatch and combine against the CPU reference, bit for bit: both run collectively
// on the same fresh random inputs in the same processes. Every GPU output is poisoned before each call,
// and rows past row_offsets[L] must still hold the poison afterwards.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gpu_support.hpp"
#include "hip/bf16.hpp"
#include "hip/scale_layout.hpp"
#include "host/device.hpp"
#include "host/device_memory.hpp"
#include "host/gpu_check.hpp"
#include "host/reference.hpp"
#include "mpi_support.hpp"
#include "rocep/mpi.hpp"
#include "rocep/rocep.hpp"

namespace {

using rocep::testing::download;
using rocep::testing::fill_bytes;
using rocep::testing::shared_seed;
using rocep::testing::upload;
using rocep::testing::world_rank;
using rocep::testing::world_size;

using rocep::bf16_bits;
using rocep::DeviceBuffer;
using rocep::EpConfig;
using rocep::SrcInfo;

constexpr uint8_t kPoison = 0xFF;

enum class Routing { kUniform, kMasked, kHotExpert, kUnevenCounts, kFull };

// One rank's inputs.
struct Inputs {
  int num_tokens = 0;
  std::vector<bf16_bits> tokens;
  std::vector<int32_t> topk_ids;
  std::vector<float> topk_weights;
};

Inputs make_inputs(const EpConfig& config, Routing routing, uint64_t seed) {
  const int rank = world_rank();
  std::mt19937_64 random(seed + 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(rank + 1));
  Inputs inputs;
  const int max_tokens = config.max_tokens_per_rank;
  switch (routing) {
    case Routing::kFull:
      inputs.num_tokens = max_tokens;
      break;
    case Routing::kUnevenCounts:
      inputs.num_tokens = rank == 1 || world_size() == 1 ? 0 : static_cast<int>(random() % (max_tokens + 1));
      break;
    default:
      inputs.num_tokens = 1 + static_cast<int>(random() % max_tokens);
  }
  std::uniform_real_distribution<float> value(-4.0f, 4.0f);
  std::uniform_real_distribution<float> weight(0.01f, 1.0f);
  inputs.tokens.resize(static_cast<std::size_t>(inputs.num_tokens) * config.hidden);
  for (auto& element : inputs.tokens)
    element = rocep::float_to_bf16(value(random));
  std::vector<int32_t> experts(config.num_experts);
  for (int token = 0; token < inputs.num_tokens; ++token) {
    for (int e = 0; e < config.num_experts; ++e)
      experts[e] = e;
    for (int k = 0; k < config.top_k; ++k) {
      std::swap(experts[k], experts[k + random() % (config.num_experts - k)]);
      int32_t id = experts[k];
      if (routing == Routing::kMasked && random() % 4 == 0)
        id = -1;
      if (routing == Routing::kHotExpert)
        id = k == 0 ? 0 : -1;
      inputs.topk_ids.push_back(id);
      inputs.topk_weights.push_back(weight(random));
    }
  }
  return inputs;
}

DeviceBuffer poisoned(std::size_t bytes) {
  DeviceBuffer buffer(bytes);
  fill_bytes(buffer, kPoison);
  return buffer;
}

bool all_poison(const uint8_t* first, const uint8_t* last) {
  return std::all_of(first, last, [](uint8_t byte) { return byte == kPoison; });
}

// One rank's inputs in device memory. With `count_on_device`, the token count is read from device memory,
// as a captured graph would take it.
struct DeviceInputs {
  explicit DeviceInputs(const Inputs& inputs, bool read_count_on_device = false)
      : tokens(upload(inputs.tokens)),
        ids(upload(inputs.topk_ids)),
        weights(upload(inputs.topk_weights)),
        num_tokens(upload(std::vector<int32_t>{inputs.num_tokens})),
        host_num_tokens(inputs.num_tokens),
        count_on_device(read_count_on_device) {}
  rocep::DispatchInputs view() const {
    return {tokens.get(), ids.as<int32_t>(), weights.as<float>(), count_on_device ? 0 : host_num_tokens,
            count_on_device ? num_tokens.as<int32_t>() : nullptr};
  }
  DeviceBuffer tokens, ids, weights, num_tokens;
  int host_num_tokens;
  bool count_on_device;
};

// Device-side dispatch outputs of one rank.
struct DeviceOutputs {
  DeviceOutputs(const EpConfig& config, std::size_t rows, int local_experts)
      : recv_tokens(poisoned(rows * config.hidden * sizeof(bf16_bits))),
        row_offsets(poisoned((local_experts + 1) * sizeof(uint32_t))),
        expert_ids(poisoned(local_experts * sizeof(int32_t))),
        src_info(poisoned(rows * sizeof(SrcInfo))),
        recv_weights(poisoned(rows * sizeof(float))) {}
  rocep::DispatchOutputs view() const {
    return {recv_tokens.get(),      row_offsets.as<uint32_t>(), expert_ids.as<int32_t>(),
            src_info.as<SrcInfo>(), recv_weights.as<float>(),   nullptr};
  }
  DeviceBuffer recv_tokens, row_offsets, expert_ids, src_info, recv_weights;
};

// The reference's results on one rank: dispatch layout, weighted (+shared) and unweighted combine.
struct Expected {
  std::vector<bf16_bits> recv_tokens;
  std::vector<uint32_t> row_offsets;
  std::vector<int32_t> expert_ids;
  std::vector<SrcInfo> src_info;
  std::vector<float> recv_weights;
  std::vector<bf16_bits> combined;
  std::vector<bf16_bits> unreduced;
};

class GpuEp : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!rocep::testing::use_rank_gpu()) {
      GTEST_SKIP()
          << "no GPU visible (hipGetDeviceCount/cudaGetDeviceCount returned 0): GPU dispatch/combine "
             "tests not run";
    }
  }

  // Runs dispatch + combine on the reference and on the GPU and compares everything. With
  // `in_input_buffer`, the GPU dispatches the tokens from the group's input buffer.
  void check_against_reference(const EpConfig& config, Routing routing, bool in_input_buffer = false) {
    const uint64_t seed = shared_seed();
    SCOPED_TRACE("seed " + std::to_string(seed) + ", routing " + std::to_string(static_cast<int>(routing)) +
                 ", " + config.describe() + (in_input_buffer ? ", tokens in the input buffer" : ""));
    const Inputs inputs = make_inputs(config, routing, seed);
    const int world = world_size();
    const int local_experts = config.num_local_experts(world);
    const std::size_t rows = config.max_recv_rows(world);
    const std::size_t hidden = config.hidden;

    // Expert outputs and shared-expert rows: random, the same for both backends.
    std::mt19937 random(static_cast<unsigned>(seed ^ world_rank()));
    std::uniform_real_distribution<float> value(-2.0f, 2.0f);
    std::vector<bf16_bits> expert_outputs(rows * hidden);
    for (auto& element : expert_outputs)
      element = rocep::float_to_bf16(value(random));
    std::vector<bf16_bits> shared(std::max(inputs.num_tokens, 1) * hidden);
    for (auto& element : shared)
      element = rocep::float_to_bf16(value(random));

    Expected expected;
    // Room for one element at least, so no pointer is null on a rank with no tokens.
    const std::size_t out_tokens = std::max(inputs.num_tokens, 1);
    {
      rocep::EpGroup reference(MPI_COMM_WORLD, config, rocep::Backend::kCpuReference);
      expected.recv_tokens.resize(rows * hidden);
      expected.row_offsets.resize(local_experts + 1);
      expected.expert_ids.resize(local_experts);
      expected.src_info.resize(rows);
      expected.recv_weights.resize(rows);
      reference.dispatch_send({inputs.tokens.data(), inputs.topk_ids.data(), inputs.topk_weights.data(),
                               inputs.num_tokens, nullptr});
      reference.dispatch_recv({expected.recv_tokens.data(), expected.row_offsets.data(),
                               expected.expert_ids.data(), expected.src_info.data(),
                               expected.recv_weights.data(), nullptr});
      expected.combined.resize(out_tokens * hidden);
      const rocep::CombineArgs weighted{expert_outputs.data(), expected.recv_weights.data(), shared.data(),
                                        expected.combined.data()};
      reference.combine_send(weighted);
      reference.combine_recv(weighted);
      // The unweighted combine needs a dispatch before it too.
      reference.dispatch_send({inputs.tokens.data(), inputs.topk_ids.data(), inputs.topk_weights.data(),
                               inputs.num_tokens, nullptr});
      reference.dispatch_recv({expected.recv_tokens.data(), expected.row_offsets.data(),
                               expected.expert_ids.data(), expected.src_info.data(),
                               expected.recv_weights.data(), nullptr});
      expected.unreduced.resize(out_tokens * config.top_k * hidden);
      const rocep::CombineArgs unweighted{expert_outputs.data(), nullptr, nullptr, expected.unreduced.data()};
      reference.combine_send(unweighted);
      reference.combine_recv(unweighted);
    }

    rocep::EpGroup group(MPI_COMM_WORLD, config, rocep::Backend::kGpu);
    // Receive memory is O(world x T x message) whatever the expert count: the dispatch region (this rank's
    // staged tokens) and the combine region, per-slot bookkeeping, and each of the three exported buffers
    // rounded up to 2 MiB.
    const std::size_t tokens = config.max_tokens_per_rank;
    const std::size_t slots = tokens * config.top_k;
    const std::size_t regions = (1 + std::max(world, config.top_k)) * tokens * hidden * sizeof(bf16_bits);
    const std::size_t chunks = world * ((tokens + 63) / 64);  // the receiver ranks tokens 64 at a time
    const std::size_t bookkeeping = (3 * world + 1) * slots * sizeof(int32_t) + tokens * sizeof(uint64_t) +
                                    (chunks + 1) * local_experts * sizeof(uint32_t) +
                                    3 * (std::size_t{2} << 20) + 4096;
    EXPECT_GE(group.memory_bytes(), regions);
    EXPECT_LE(group.memory_bytes(), regions + bookkeeping);
    rocep::Stream stream;
    const DeviceInputs device_inputs(inputs);
    rocep::DispatchInputs dispatch_inputs = device_inputs.view();
    if (in_input_buffer) {
      dispatch_inputs.tokens = group.dispatch_input_buffer();
      ROCEP_GPU_CHECK(hipMemcpy(group.dispatch_input_buffer(), inputs.tokens.data(),
                                inputs.tokens.size() * sizeof(bf16_bits), hipMemcpyHostToDevice));
    }
    const DeviceBuffer device_expert_outputs = upload(expert_outputs);
    const DeviceBuffer device_shared = upload(shared);
    for (const bool weighted : {true, false}) {
      SCOPED_TRACE(weighted ? "weighted combine" : "unweighted combine");
      DeviceOutputs outputs(config, rows, local_experts);
      // Split calls for the weighted pass, fused calls for the unweighted one: both must match.
      if (weighted) {
        group.dispatch_send(dispatch_inputs, stream.get());
        group.dispatch_recv(outputs.view(), stream.get());
      } else {
        group.dispatch(dispatch_inputs, outputs.view(), stream.get());
      }
      group.synchronize(stream.get());
      const auto row_offsets = download<uint32_t>(outputs.row_offsets, local_experts + 1);
      ASSERT_EQ(row_offsets, expected.row_offsets);
      EXPECT_EQ(download<int32_t>(outputs.expert_ids, local_experts), expected.expert_ids);
      const std::size_t used = row_offsets[local_experts];
      const auto recv_tokens = download<bf16_bits>(outputs.recv_tokens, rows * hidden);
      EXPECT_EQ(
          0, std::memcmp(recv_tokens.data(), expected.recv_tokens.data(), used * hidden * sizeof(bf16_bits)))
          << "recv_tokens differ";
      const auto* recv_bytes = reinterpret_cast<const uint8_t*>(recv_tokens.data());
      EXPECT_TRUE(all_poison(recv_bytes + used * hidden * 2, recv_bytes + rows * hidden * 2))
          << "rows past row_offsets[L] were written";
      const auto src_info = download<SrcInfo>(outputs.src_info, rows);
      EXPECT_EQ(0, std::memcmp(src_info.data(), expected.src_info.data(), used * sizeof(SrcInfo)))
          << "src_info differs";
      const auto recv_weights = download<float>(outputs.recv_weights, rows);
      EXPECT_EQ(0, std::memcmp(recv_weights.data(), expected.recv_weights.data(), used * sizeof(float)))
          << "recv_weights differ";

      const std::size_t out_elements = inputs.num_tokens * hidden * (weighted ? 1 : config.top_k);
      DeviceBuffer out = poisoned(std::max<std::size_t>(out_elements, 1) * sizeof(bf16_bits));
      const rocep::CombineArgs combine{device_expert_outputs.get(),
                                       weighted ? outputs.recv_weights.as<float>() : nullptr,
                                       weighted ? device_shared.get() : nullptr, out.get()};
      group.combine(combine, stream.get());
      group.synchronize(stream.get());
      const auto combined = download<bf16_bits>(out, out_elements);
      const auto& expected_out = weighted ? expected.combined : expected.unreduced;
      EXPECT_EQ(0, std::memcmp(combined.data(), expected_out.data(), out_elements * sizeof(bf16_bits)))
          << "combined tokens differ";
    }
  }
};

EpConfig make_config(int hidden, int top_k, int experts_per_rank, int max_tokens, int alignment = 1,
                     int num_blocks = 0) {
  EpConfig config;
  config.num_blocks = num_blocks;
  config.hidden = hidden;
  config.top_k = top_k;
  config.num_experts = experts_per_rank * world_size();
  config.max_tokens_per_rank = max_tokens;
  config.expert_alignment = alignment;
  config.timeout_seconds = 20;
  return config;
}

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

// Tokens written into the group's input buffer (no staging copy in the send) give the same results.
TEST_F(GpuEp, TokensInTheInputBufferMatchReference) {
  const int world = world_size();
  for (const EpConfig& config : {make_config(7168, 8, 256 / world, 128), make_config(2048, 4, 8, 32, 4),
                                 make_config(2048, 8, 64 / world, 576, 1, 8)}) {
    for (const Routing routing : {Routing::kUniform, Routing::kMasked, Routing::kUnevenCounts}) {
      check_against_reference(config, routing, /*in_input_buffer=*/true);
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
  EpConfig fp8 = config;
  fp8.dispatch_format = rocep::TokenFormat::kFp8Block128;
  rocep::EpGroup fp8_group(MPI_COMM_WORLD, fp8, rocep::Backend::kGpu);
  EXPECT_THROW(fp8_group.dispatch_input_buffer(), rocep::ConfigError);
}

// Dispatch in a quantised format, quantised from bf16 in the kernel or passed through already quantised:
// payload, scales (in the format's layout) and row metadata equal the reference's bit for bit, and every
// byte that belongs to a row past row_offsets[L] keeps its poison.
void check_format_against_reference(const EpConfig& config, Routing routing, bool pass_through) {
  const uint64_t seed = shared_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + ", routing " + std::to_string(static_cast<int>(routing)) +
               (pass_through ? ", already quantised" : ", quantised in dispatch") + ", " + config.describe());
  Inputs inputs = make_inputs(config, routing, seed);
  const int world = world_size();
  const int local_experts = config.num_local_experts(world);
  const std::size_t rows = config.max_recv_rows(world);
  const int hidden = config.hidden;
  const std::size_t payload_bytes = rocep::format_payload_bytes(config.dispatch_format, hidden);
  const std::size_t scale_bytes = rocep::format_scale_bytes(config.dispatch_format, hidden);
  const std::size_t scale_tensor_bytes =
      rocep::format_scale_tensor_bytes(config.dispatch_format, rows, hidden);

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

  // The reference's results.
  std::vector<uint8_t> expected_tokens(rows * payload_bytes);
  std::vector<uint8_t> expected_scales(scale_tensor_bytes);
  std::vector<uint32_t> expected_offsets(local_experts + 1);
  std::vector<int32_t> expected_ids(local_experts);
  std::vector<SrcInfo> expected_src(rows);
  std::vector<float> expected_weights(rows);
  rocep::DispatchInputs host_inputs{tokens.data(), inputs.topk_ids.data(), inputs.topk_weights.data(),
                                    inputs.num_tokens, nullptr};
  host_inputs.token_scales = pass_through ? token_scales.data() : nullptr;
  host_inputs.global_scale = &global_scale;
  {
    rocep::EpGroup reference(MPI_COMM_WORLD, config, rocep::Backend::kCpuReference);
    reference.dispatch_send(host_inputs);
    rocep::DispatchOutputs host_outputs{expected_tokens.data(), expected_offsets.data(), expected_ids.data(),
                                        expected_src.data(),    expected_weights.data(), nullptr};
    host_outputs.recv_scales = expected_scales.data();
    reference.dispatch_recv(host_outputs);
  }

  rocep::EpGroup group(MPI_COMM_WORLD, config, rocep::Backend::kGpu);
  rocep::Stream stream;
  const DeviceBuffer device_tokens = upload(tokens);
  const DeviceBuffer device_scales = upload(token_scales);
  const DeviceBuffer device_global_scale = upload(std::vector<float>{global_scale});
  DeviceInputs device_inputs(inputs);
  rocep::DispatchInputs view = device_inputs.view();
  view.tokens = device_tokens.get();
  view.token_scales = pass_through ? device_scales.get() : nullptr;
  view.global_scale = device_global_scale.as<float>();
  for (const bool fused : {false, true}) {
    SCOPED_TRACE(fused ? "fused dispatch" : "dispatch_send + dispatch_recv");
    DeviceBuffer recv_tokens = poisoned(rows * payload_bytes);
    DeviceBuffer recv_scales = poisoned(scale_tensor_bytes);
    DeviceOutputs outputs(config, rows, local_experts);
    rocep::DispatchOutputs out_view = outputs.view();
    out_view.recv_tokens = recv_tokens.get();
    out_view.recv_scales = recv_scales.get();
    if (fused) {
      group.dispatch(view, out_view, stream.get());
    } else {
      group.dispatch_send(view, stream.get());
      group.dispatch_recv(out_view, stream.get());
    }
    group.synchronize(stream.get());
    const auto offsets = download<uint32_t>(outputs.row_offsets, local_experts + 1);
    ASSERT_EQ(offsets, expected_offsets);
    const std::size_t used = offsets[local_experts];
    const auto got_tokens = download<uint8_t>(recv_tokens, rows * payload_bytes);
    EXPECT_EQ(0, std::memcmp(got_tokens.data(), expected_tokens.data(), used * payload_bytes))
        << "payloads differ";
    EXPECT_TRUE(all_poison(got_tokens.data() + used * payload_bytes, got_tokens.data() + got_tokens.size()))
        << "payload rows past row_offsets[L] were written";
    const auto got_src = download<SrcInfo>(outputs.src_info, rows);
    EXPECT_EQ(0, std::memcmp(got_src.data(), expected_src.data(), used * sizeof(SrcInfo)))
        << "src_info differs";
    const auto got_weights = download<float>(outputs.recv_weights, rows);
    EXPECT_EQ(0, std::memcmp(got_weights.data(), expected_weights.data(), used * sizeof(float)))
        << "recv_weights differ";

    const auto got_scales = download<uint8_t>(recv_scales, scale_tensor_bytes);
    const auto format = static_cast<rocep::device::Format>(config.dispatch_format);
    const int blocks = hidden / rocep::format_block_elements(config.dispatch_format);
    const std::size_t size = scale_bytes / blocks;
    int wrong = 0;
    int written_past_end = 0;
    for (std::size_t row = 0; row < rows; ++row) {
      for (int block = 0; block < blocks; ++block) {
        const std::size_t offset = rocep::device::scale_offset(format, row, block, rows, hidden);
        if (row < used) {
          wrong += std::memcmp(&got_scales[offset], &expected_scales[offset], size) != 0 ? 1 : 0;
        } else {
          written_past_end += all_poison(&got_scales[offset], &got_scales[offset] + size) ? 0 : 1;
        }
      }
    }
    EXPECT_EQ(wrong, 0) << "scales that differ from the reference";
    EXPECT_EQ(written_past_end, 0) << "scales of rows past row_offsets[L] that were written";

    // A combine ends the round: it tells every rank that its peers are done reading the buffers that the
    // next dispatch rewrites. Its output is checked by the combine tests; the expert outputs are the
    // (poisoned, bf16-sized) rows buffer this test does not dispatch into.
    DeviceBuffer combined = poisoned(std::max(inputs.num_tokens, 1) * hidden * sizeof(bf16_bits));
    group.combine({outputs.recv_tokens.get(), outputs.recv_weights.as<float>(), nullptr, combined.get()},
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
    int num_blocks;  // 0: every block that stays resident
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
      // Several tokens per block, in batches: quantised one after another after one check of their ids.
      {rocep::TokenFormat::kFp8Block128, rocep::Fp8Encoding::kE4m3fn, 7168, 1, 576, 8},
  };
  for (const Case& c : cases) {
    EpConfig config = make_config(c.hidden, 8, 64 / world, c.max_tokens, c.alignment, c.num_blocks);
    config.dispatch_format = c.format;
    config.fp8_encoding = c.encoding == rocep::Fp8Encoding::kAuto ? rocep::Fp8Encoding::kE4m3fn : c.encoding;
    for (const Routing routing : {Routing::kUniform, Routing::kMasked, Routing::kUnevenCounts}) {
      for (const bool pass_through : {false, true}) {
        check_format_against_reference(config, routing, pass_through);
      }
    }
  }
}

TEST_F(GpuEp, TwoRunsAreBitIdenticalAndGraphReplaysMatchEager) {
  const EpConfig config = make_config(2048, 8, 64 / world_size(), 64);
  const uint64_t seed = shared_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const Inputs inputs = make_inputs(config, Routing::kMasked, seed);
  const int local_experts = config.num_local_experts(world_size());
  const std::size_t rows = config.max_recv_rows(world_size());
  rocep::EpGroup group(MPI_COMM_WORLD, config, rocep::Backend::kGpu);
  rocep::Stream stream;
  const DeviceInputs device_inputs(inputs, /*count_on_device=*/true);
  DeviceOutputs outputs(config, rows, local_experts);
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
  DeviceOutputs outputs(config, config.max_recv_rows(world), config.num_local_experts(world));
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
    DeviceOutputs outputs(config, config.max_recv_rows(world), config.num_local_experts(world));
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
      EXPECT_THROW(group.dispatch_recv(outputs.view(), stream.get()), rocep::Error)
          << "a timed-out group refuses calls";
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }  // every rank destroys its group; none may hang
}

}  // namespace
