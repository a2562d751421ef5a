// Cases and checks shared by the GPU tests of dispatch and combine (ep_test.cpp, contract_test.cpp): random
// inputs per routing, their device copies, poisoned outputs, the CPU reference's results for one call, and
// the bit-for-bit comparison of a GPU call with them. The CPU reference (an EpGroup of
// Backend::kCpuReference over MPI_COMM_WORLD) is the oracle: every GPU output equals its output bit for bit,
// and every byte the GPU was not to write still holds the poison written before the call.
#pragma once

#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpu_support.hpp"
#include "hip/bf16.hpp"
#include "hip/scale_layout.hpp"
#include "host/codecs.hpp"
#include "host/device_memory.hpp"
#include "host/gpu_check.hpp"
#include "mpi_support.hpp"
#include "rocep/mpi.hpp"
#include "rocep/rocep.hpp"

namespace rocep::testing {

inline constexpr uint8_t kPoison = 0xFF;

enum class Routing { kUniform, kMasked, kHotExpert, kUnevenCounts, kFull };

inline const char* routing_name(Routing routing) {
  switch (routing) {
    case Routing::kUniform:
      return "uniform";
    case Routing::kMasked:
      return "masked";
    case Routing::kHotExpert:
      return "hot expert";
    case Routing::kUnevenCounts:
      return "uneven counts";
    case Routing::kFull:
      return "full";
  }
  return "unknown routing";
}

// The GPU tests' fixture: every rank skips alike when some rank sees no GPU; otherwise each rank's GPU is
// current.
class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!use_rank_gpu()) {
      GTEST_SKIP()
          << "no GPU visible (hipGetDeviceCount/cudaGetDeviceCount returned 0): GPU dispatch/combine "
             "tests not run";
    }
  }
};

// A config of `experts_per_rank` experts on every rank of MPI_COMM_WORLD, with a timeout long enough for
// oversubscribed GPUs (ranks > GPUs under MPS). `num_sms` is EpConfig::num_sms: the blocks of every kernel,
// one per multiprocessor (0: the default share).
inline EpConfig make_config(int hidden, int top_k, int experts_per_rank, int max_tokens, int alignment = 1,
                            int num_sms = EpConfig::kDefaultSms) {
  EpConfig config;
  config.num_sms = num_sms;
  config.hidden = hidden;
  config.top_k = top_k;
  config.num_experts = experts_per_rank * world_size();
  config.max_tokens_per_rank = max_tokens;
  config.expert_alignment = alignment;
  config.timeout_seconds = 20;
  return config;
}

// One rank's inputs, in host memory.
struct Inputs {
  int num_tokens = 0;
  std::vector<bf16_bits> tokens;
  std::vector<int32_t> topk_ids;
  std::vector<float> topk_weights;

  // As the CPU reference takes them (bf16 tokens).
  DispatchInputs view() const {
    return {tokens.data(), topk_ids.data(), topk_weights.data(), num_tokens, nullptr};
  }
};

// This rank's inputs for `seed`, routed as `routing` says. `num_tokens` >= 0 replaces the count the routing
// draws (kFull: max_tokens_per_rank; kUnevenCounts: none on rank 1, any on the others; else 1 or more).
inline Inputs make_inputs(const EpConfig& config, Routing routing, uint64_t seed, int num_tokens = -1) {
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
  if (num_tokens >= 0) {
    inputs.num_tokens = num_tokens;
  }
  std::uniform_real_distribution<float> value(-4.0f, 4.0f);
  std::uniform_real_distribution<float> weight(0.01f, 1.0f);
  inputs.tokens.resize(static_cast<std::size_t>(inputs.num_tokens) * config.hidden);
  for (auto& element : inputs.tokens)
    element = float_to_bf16(value(random));
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

// What this rank's experts return for one call, and the shared expert's rows: random, the same for both
// backends.
struct ExpertData {
  std::vector<bf16_bits> outputs;  // [max_recv_rows, hidden]
  std::vector<bf16_bits> shared;   // [max_tokens_per_rank, hidden]
};

inline ExpertData make_expert_data(const EpConfig& config, uint64_t seed) {
  const std::size_t hidden = config.hidden;
  std::mt19937 random(static_cast<unsigned>(seed ^ static_cast<uint64_t>(world_rank())));
  std::uniform_real_distribution<float> value(-2.0f, 2.0f);
  ExpertData data{std::vector<bf16_bits>(config.max_recv_rows(world_size()) * hidden),
                  std::vector<bf16_bits>(static_cast<std::size_t>(config.max_tokens_per_rank) * hidden)};
  for (auto* rows : {&data.outputs, &data.shared})
    for (auto& element : *rows)
      element = float_to_bf16(value(random));
  return data;
}

inline bool all_poison(const uint8_t* first, const uint8_t* last) {
  return std::all_of(first, last, [](uint8_t byte) { return byte == kPoison; });
}

// memcmp that also takes empty ranges (whose pointers may be null).
inline bool same_bytes(const void* got, const void* expected, std::size_t bytes) {
  return bytes == 0 || std::memcmp(got, expected, bytes) == 0;
}

inline DeviceBuffer poisoned(std::size_t bytes) {
  DeviceBuffer buffer(bytes);
  fill_bytes(buffer, kPoison);
  return buffer;
}

// Writes `values` at the start of `buffer`, complete on return (see upload).
template <typename T>
void copy_into(const DeviceBuffer& buffer, const std::vector<T>& values) {
  if (values.size() * sizeof(T) > buffer.bytes()) {
    throw std::length_error("copy_into: " + std::to_string(values.size() * sizeof(T)) +
                            " bytes into a buffer of " + std::to_string(buffer.bytes()));
  }
  copy_to_device(buffer.get(), values.data(), values.size() * sizeof(T));
}

// The CPU reference's results for one call on this rank.
struct Expected {
  std::vector<uint8_t> recv_tokens;  // [R, format_payload_bytes]
  std::vector<uint8_t> recv_scales;  // the scale tensor of R rows (empty for bf16)
  std::vector<uint32_t> row_offsets;
  std::vector<int32_t> expert_ids;
  std::vector<SrcInfo> src_info;
  std::vector<float> recv_weights;
  std::vector<bf16_bits> combined;   // weighted, plus the shared expert's rows: [num_tokens, hidden]
  std::vector<bf16_bits> unreduced;  // unweighted: [num_tokens, top_k, hidden]
};

// Collective: the reference's dispatch of `inputs` (host memory) and, unless `experts` is null, its two
// combines of experts->outputs, weighted by the dispatched weights with the shared expert's rows added, and
// unweighted, each after a dispatch of its own (a combine ends a step; without `experts`, combined and
// unreduced stay empty). What the reference records (an invalid expert id) goes with its group.
inline Expected reference_results(const EpConfig& config, const DispatchInputs& inputs,
                                  const ExpertData* experts) {
  const int world = world_size();
  const int local_experts = config.num_local_experts(world);
  const std::size_t rows = config.max_recv_rows(world);
  const std::size_t hidden = config.hidden;
  Expected expected;
  expected.recv_tokens.resize(rows * format_payload_bytes(config.dispatch_format, config.hidden));
  expected.recv_scales.resize(format_scale_tensor_bytes(config.dispatch_format, rows, config.hidden));
  expected.row_offsets.resize(local_experts + 1);
  expected.expert_ids.resize(local_experts);
  expected.src_info.resize(rows);
  expected.recv_weights.resize(rows);
  DispatchOutputs outputs{expected.recv_tokens.data(),  expected.row_offsets.data(),
                          expected.expert_ids.data(),   expected.src_info.data(),
                          expected.recv_weights.data(), nullptr};
  outputs.recv_scales = expected.recv_scales.empty() ? nullptr : expected.recv_scales.data();
  EpGroup reference(MPI_COMM_WORLD, config, Backend::kCpuReference);
  reference.dispatch(inputs, outputs);
  if (experts == nullptr) {
    return expected;
  }
  // Room for one token at least, so that `out` is never null; cut to the tokens afterwards.
  const std::size_t out_tokens = std::max(inputs.num_tokens, 1);
  expected.combined.resize(out_tokens * hidden);
  reference.combine({experts->outputs.data(), expected.recv_weights.data(), experts->shared.data(),
                     expected.combined.data()});
  reference.dispatch(inputs, outputs);
  expected.unreduced.resize(out_tokens * config.top_k * hidden);
  reference.combine({experts->outputs.data(), nullptr, nullptr, expected.unreduced.data()});
  expected.combined.resize(static_cast<std::size_t>(inputs.num_tokens) * hidden);
  expected.unreduced.resize(static_cast<std::size_t>(inputs.num_tokens) * config.top_k * hidden);
  return expected;
}

// One rank's inputs in device memory. With `read_count_on_device`, the token count is read from device
// memory, as a captured graph would take it.
struct DeviceInputs {
  explicit DeviceInputs(const Inputs& inputs, bool read_count_on_device = false)
      : tokens(upload(inputs.tokens)),
        ids(upload(inputs.topk_ids)),
        weights(upload(inputs.topk_weights)),
        num_tokens(upload(std::vector<int32_t>{inputs.num_tokens})),
        host_num_tokens(inputs.num_tokens),
        count_on_device(read_count_on_device) {}
  DispatchInputs view() const {
    return {tokens.get(), ids.as<int32_t>(), weights.as<float>(), count_on_device ? 0 : host_num_tokens,
            count_on_device ? num_tokens.as<int32_t>() : nullptr};
  }
  // Writes `inputs` over these buffers (made for as many tokens at least), complete on return: a captured
  // graph reads its inputs from these very buffers when it is replayed.
  void overwrite(const Inputs& inputs) {
    copy_into(tokens, inputs.tokens);
    copy_into(ids, inputs.topk_ids);
    copy_into(weights, inputs.topk_weights);
    copy_into(num_tokens, std::vector<int32_t>{inputs.num_tokens});
    host_num_tokens = inputs.num_tokens;
  }
  DeviceBuffer tokens, ids, weights, num_tokens;
  int host_num_tokens;
  bool count_on_device;
};

// One rank's dispatch outputs in device memory, in the group's dispatch format, every byte poisoned.
struct DeviceOutputs {
  explicit DeviceOutputs(const EpConfig& config)
      : format(config.dispatch_format),
        rows(config.max_recv_rows(world_size())),
        local_experts(config.num_local_experts(world_size())),
        recv_tokens(poisoned(rows * format_payload_bytes(format, config.hidden))),
        recv_scales(
            poisoned(std::max<std::size_t>(format_scale_tensor_bytes(format, rows, config.hidden), 1))),
        row_offsets(poisoned((local_experts + 1) * sizeof(uint32_t))),
        expert_ids(poisoned(local_experts * sizeof(int32_t))),
        src_info(poisoned(rows * sizeof(SrcInfo))),
        recv_weights(poisoned(rows * sizeof(float))) {}
  DispatchOutputs view() const {
    DispatchOutputs outputs{recv_tokens.get(),      row_offsets.as<uint32_t>(), expert_ids.as<int32_t>(),
                            src_info.as<SrcInfo>(), recv_weights.as<float>(),   nullptr};
    outputs.recv_scales = format == TokenFormat::kBf16 ? nullptr : recv_scales.get();
    return outputs;
  }
  // Every byte back to the poison, complete on return.
  void poison() const {
    for (const DeviceBuffer* buffer :
         {&recv_tokens, &recv_scales, &row_offsets, &expert_ids, &src_info, &recv_weights}) {
      fill_bytes(*buffer, kPoison);
    }
  }
  TokenFormat format;
  std::size_t rows;   // R
  int local_experts;  // L
  DeviceBuffer recv_tokens, recv_scales, row_offsets, expert_ids, src_info, recv_weights;
};

// One call's expert data in device memory, and where its combine writes: poisoned, with room for the
// unweighted combine of a full call.
struct DeviceCombine {
  DeviceCombine(const EpConfig& config, const ExpertData& experts)
      : expert_outputs(upload(experts.outputs)),
        shared(upload(experts.shared)),
        out(poisoned(static_cast<std::size_t>(config.max_tokens_per_rank) * config.top_k * config.hidden *
                     sizeof(bf16_bits))) {}
  // Weighted by the dispatch's recv_weights, with the shared expert's rows added; or unweighted.
  CombineArgs args(const DeviceOutputs& dispatched, bool weighted) const {
    return {expert_outputs.get(), weighted ? dispatched.recv_weights.as<float>() : nullptr,
            weighted ? shared.get() : nullptr, out.get()};
  }
  // New expert data in these very buffers, and `out` poisoned again; complete on return.
  void overwrite(const ExpertData& experts) const {
    copy_into(expert_outputs, experts.outputs);
    copy_into(shared, experts.shared);
    fill_bytes(out, kPoison);
  }
  DeviceBuffer expert_outputs, shared, out;
};

// Dispatch (fused, or dispatch_send + dispatch_recv) and combine (fused, or combine_send + combine_recv).
inline void dispatch_on(EpGroup& group, const DispatchInputs& inputs, const DispatchOutputs& outputs,
                        bool split, hipStream_t stream) {
  if (split) {
    group.dispatch_send(inputs, stream);
    group.dispatch_recv(outputs, stream);
  } else {
    group.dispatch(inputs, outputs, stream);
  }
}

inline void combine_on(EpGroup& group, const CombineArgs& args, bool split, hipStream_t stream) {
  if (split) {
    group.combine_send(args, stream);
    group.combine_recv(args, stream);
  } else {
    group.combine(args, stream);
  }
}

// Scaled formats: the scales of every row below row_offsets[L] (`used`) equal the reference's, and those of
// the rows past it still hold the poison, nvfp4's tile rows past R included.
inline void expect_scales_match(const EpConfig& config, const DeviceOutputs& outputs,
                                const Expected& expected, std::size_t used) {
  const std::size_t rows = outputs.rows;
  const std::size_t scale_rows =
      config.dispatch_format == TokenFormat::kNvfp4 ? (rows + 127) / 128 * 128 : rows;
  const int hidden = config.hidden;
  const auto got_scales = download<uint8_t>(outputs.recv_scales, expected.recv_scales.size());
  const auto format = static_cast<device::Format>(config.dispatch_format);
  const int blocks = hidden / format_block_elements(config.dispatch_format);
  const std::size_t size = format_scale_bytes(config.dispatch_format, hidden) / blocks;
  int wrong = 0;
  int written_past_end = 0;
  for (std::size_t row = 0; row < scale_rows; ++row) {
    for (int block = 0; block < blocks; ++block) {
      const std::size_t offset = device::scale_offset(format, row, block, rows, hidden);
      if (row < used) {
        wrong += std::memcmp(&got_scales[offset], &expected.recv_scales[offset], size) != 0 ? 1 : 0;
      } else {
        written_past_end += all_poison(&got_scales[offset], &got_scales[offset] + size) ? 0 : 1;
      }
    }
  }
  EXPECT_EQ(wrong, 0) << "scales that differ from the reference";
  EXPECT_EQ(written_past_end, 0) << "scales of rows past row_offsets[L] that were written";
}

// The GPU's dispatch outputs (after the stream completed) equal the reference's bit for bit: row offsets and
// expert ids; the payload, source and weight of every row below row_offsets[L], and its scales in scaled
// formats; the payload and scales of every row past it still hold the poison.
inline void expect_dispatch_matches(const EpConfig& config, const DeviceOutputs& outputs,
                                    const Expected& expected) {
  const std::size_t rows = outputs.rows;
  const int local_experts = outputs.local_experts;
  const auto row_offsets = download<uint32_t>(outputs.row_offsets, local_experts + 1);
  ASSERT_EQ(row_offsets, expected.row_offsets);
  EXPECT_EQ(download<int32_t>(outputs.expert_ids, local_experts), expected.expert_ids);
  const std::size_t used = row_offsets[local_experts];
  ASSERT_LE(used, rows);
  const std::size_t payload_bytes = format_payload_bytes(config.dispatch_format, config.hidden);
  const auto recv_tokens = download<uint8_t>(outputs.recv_tokens, rows * payload_bytes);
  EXPECT_TRUE(same_bytes(recv_tokens.data(), expected.recv_tokens.data(), used * payload_bytes))
      << "payloads differ";
  EXPECT_TRUE(all_poison(recv_tokens.data() + used * payload_bytes, recv_tokens.data() + recv_tokens.size()))
      << "payload rows past row_offsets[L] were written";
  const auto src_info = download<uint8_t>(outputs.src_info, rows * sizeof(SrcInfo));
  EXPECT_TRUE(same_bytes(src_info.data(), expected.src_info.data(), used * sizeof(SrcInfo)))
      << "src_info differs";
  EXPECT_TRUE(all_poison(src_info.data() + used * sizeof(SrcInfo), src_info.data() + src_info.size()))
      << "src_info past row_offsets[L] was written";
  const auto recv_weights = download<uint8_t>(outputs.recv_weights, rows * sizeof(float));
  EXPECT_TRUE(same_bytes(recv_weights.data(), expected.recv_weights.data(), used * sizeof(float)))
      << "recv_weights differ";
  EXPECT_TRUE(
      all_poison(recv_weights.data() + used * sizeof(float), recv_weights.data() + recv_weights.size()))
      << "recv_weights past row_offsets[L] were written";
  if (config.dispatch_format != TokenFormat::kBf16) {
    expect_scales_match(config, outputs, expected, used);
  }
}

// The GPU's combined tokens (after the stream completed) are `expected`, and the rest of `out` still holds
// the poison.
inline void expect_combined_matches(const DeviceBuffer& out, const std::vector<bf16_bits>& expected) {
  const std::size_t bytes = expected.size() * sizeof(bf16_bits);
  ASSERT_LE(bytes, out.bytes());
  const auto combined = download<uint8_t>(out, out.bytes());
  EXPECT_TRUE(same_bytes(combined.data(), expected.data(), bytes)) << "combined tokens differ";
  EXPECT_TRUE(all_poison(combined.data() + bytes, combined.data() + combined.size()))
      << "combine wrote past its tokens";
}

// A combine epilogue of fresh random values (CombineArgs: factor, token_factors, residual) that writes rows
// `stride` elements apart (a slice of a wider tensor), in host and in device memory.
struct EpilogueData {
  EpilogueData(const EpConfig& config, uint64_t seed)
      : stride(static_cast<std::size_t>(config.hidden) + 24),
        token_factors(static_cast<std::size_t>(config.max_tokens_per_rank)),
        residual(static_cast<std::size_t>(config.max_tokens_per_rank) * config.hidden) {
    std::mt19937 random(static_cast<unsigned>(seed ^ (0xe9ull * (world_rank() + 1))));
    std::uniform_real_distribution<float> value(-2.0f, 2.0f);
    factor = 0.5f + static_cast<float>(random() % 8) / 8.0f;
    for (float& token_factor : token_factors) {
      token_factor = value(random);
    }
    for (bf16_bits& element : residual) {
      element = float_to_bf16(value(random));
    }
    device_token_factors = upload(token_factors);
    device_residual = upload(residual);
  }
  // `args` with this epilogue, on the host's arrays or on the device's.
  CombineArgs with(CombineArgs args, bool on_device) const {
    args.factor = factor;
    args.token_factors = on_device ? device_token_factors.as<float>() : token_factors.data();
    args.residual = on_device ? device_residual.get() : static_cast<const void*>(residual.data());
    args.out_row_stride = stride;
    return args;
  }
  std::size_t stride;  // hidden + 24: a multiple of 8 when hidden is
  float factor = 1.0f;
  std::vector<float> token_factors;
  std::vector<bf16_bits> residual;
  DeviceBuffer device_token_factors, device_residual;
};

// `out` (device, rows `stride` elements apart) holds the `tokens` rows of `expected` (rows `hidden` apart,
// from the reference with the same stride) in the first `hidden` elements of each row, and the poison in
// every other byte: the columns between the rows and the rows past the tokens.
inline void expect_strided_rows_match(const DeviceBuffer& out, const std::vector<bf16_bits>& expected,
                                      int tokens, int hidden, std::size_t stride) {
  const auto got = download<bf16_bits>(out, out.bytes() / sizeof(bf16_bits));
  ASSERT_LE(static_cast<std::size_t>(tokens) * stride, got.size());
  for (int token = 0; token < tokens; ++token) {
    const bf16_bits* row = got.data() + static_cast<std::size_t>(token) * stride;
    ASSERT_TRUE(same_bytes(row, expected.data() + static_cast<std::size_t>(token) * stride,
                           static_cast<std::size_t>(hidden) * sizeof(bf16_bits)))
        << "token " << token << " differs";
    ASSERT_TRUE(all_poison(reinterpret_cast<const uint8_t*>(row + hidden),
                           reinterpret_cast<const uint8_t*>(row + stride)))
        << "token " << token << ": written between the rows";
  }
  const auto* rest = reinterpret_cast<const uint8_t*>(got.data() + static_cast<std::size_t>(tokens) * stride);
  EXPECT_TRUE(all_poison(rest, reinterpret_cast<const uint8_t*>(got.data() + got.size())))
      << "written past the tokens";
}

// Runs dispatch + combine on the reference and on a new GPU group, each on fresh random inputs, and compares
// everything: weighted (with the shared expert's rows) after split dispatch calls, unweighted after a fused
// dispatch, each on data of its own (so that what the first left in the group cannot pass for the second's
// results). The tokens are bf16, quantised in dispatch in a scaled format. With `in_input_buffer`, the GPU
// dispatches them from the group's input buffer: bf16 as they are, a scaled format (not nvfp4, whose global
// scale these inputs lack) quantised on the host into the buffer's rows (each its payload, then its scales),
// which must arrive as the tokens quantised in the reference's dispatch.
inline void check_against_reference(const EpConfig& config, Routing routing, bool in_input_buffer = false) {
  SCOPED_TRACE(std::string("routing ") + routing_name(routing) + ", " + config.describe() +
               (in_input_buffer ? ", tokens in the input buffer" : ""));
  EpGroup group(MPI_COMM_WORLD, config, Backend::kGpu);
  if (config.dispatch_format == TokenFormat::kBf16) {
    // Receive memory is O(world x T x message) whatever the expert count: the dispatch region (this rank's
    // staged tokens) and the combine region, per-slot bookkeeping, and each of the three exported buffers
    // rounded up to 2 MiB.
    const int world = world_size();
    const std::size_t hidden = config.hidden;
    const std::size_t tokens = config.max_tokens_per_rank;
    const std::size_t slots = tokens * config.top_k;
    const std::size_t regions = (1 + std::max(world, config.top_k)) * tokens * hidden * sizeof(bf16_bits);
    const std::size_t chunks = world * ((tokens + 63) / 64);  // the receiver ranks tokens 64 at a time
    const std::size_t bookkeeping = (3 * world + 1) * slots * sizeof(int32_t) + tokens * sizeof(uint64_t) +
                                    (chunks + 1) * config.num_local_experts(world) * sizeof(uint32_t) +
                                    3 * (std::size_t{2} << 20) + 4096;
    // With ranks on other nodes (ROCEP_GPUS_PER_NODE set and below the world size; empty is unset, as for
    // the library), the SHMEM engine adds an image of every rank's dispatch messages and a combine outbox of
    // top_k x T rows per peer, and bookkeeping twice more: the dispatch outboxes of one source block per
    // peer, as many bytes as the region's ids, weights and masks (host/shmem_regions.hpp).
    const char* gpus_per_node = std::getenv("ROCEP_GPUS_PER_NODE");
    const bool across_nodes =
        gpus_per_node != nullptr && *gpus_per_node != '\0' && std::atoi(gpus_per_node) < world;
    const std::size_t peer_copies = across_nodes ? static_cast<std::size_t>(world) * (1 + config.top_k) *
                                                       tokens * hidden * sizeof(bf16_bits)
                                                 : 0;
    EXPECT_GE(group.memory_bytes(), regions + peer_copies);
    EXPECT_LE(group.memory_bytes(), regions + peer_copies + (across_nodes ? 3 : 1) * bookkeeping);
  }
  Stream stream;
  for (const bool weighted : {true, false}) {
    const uint64_t seed = shared_seed();
    SCOPED_TRACE(seed_trace(seed) + (weighted ? ", weighted combine" : ", unweighted combine"));
    const Inputs inputs = make_inputs(config, routing, seed);
    const ExpertData experts = make_expert_data(config, seed);
    const Expected expected = reference_results(config, inputs.view(), &experts);
    const DeviceInputs device_inputs(inputs);
    DispatchInputs dispatch_inputs = device_inputs.view();
    if (in_input_buffer) {  // between the last combine and this dispatch
      const TokenFormat format = config.dispatch_format;
      const std::size_t row_bytes = format_input_row_bytes(format, config.hidden);
      std::vector<uint8_t> rows(std::size_t{1} * config.max_tokens_per_rank * row_bytes, 0xa5);
      if (format == TokenFormat::kBf16) {
        std::memcpy(rows.data(), inputs.tokens.data(), inputs.tokens.size() * sizeof(bf16_bits));
      } else {
        const std::size_t payload_bytes = format_payload_bytes(format, config.hidden);
        const std::size_t scale_bytes = format_scale_bytes(format, config.hidden);
        const auto tokens = static_cast<std::size_t>(std::max(inputs.num_tokens, 1));
        std::vector<uint8_t> payloads(tokens * payload_bytes), scales(tokens * scale_bytes);
        rocep::reference::quantize_bf16_rows(format, group.config().fp8_encoding, inputs.tokens.data(),
                                             inputs.num_tokens, config.hidden, 1.0f, payloads.data(),
                                             scales.data());
        rocep::reference::write_input_rows(format, config.hidden, payloads.data(), scales.data(),
                                           inputs.num_tokens, rows.data());
      }
      dispatch_inputs.tokens = group.dispatch_input_buffer();
      copy_to_device(group.dispatch_input_buffer(), rows.data(), rows.size());
    }
    const DeviceOutputs outputs(config);
    const DeviceCombine combine(config, experts);
    dispatch_on(group, dispatch_inputs, outputs.view(), /*split=*/weighted, stream.get());
    EXPECT_NO_THROW(group.synchronize(stream.get()));
    expect_dispatch_matches(config, outputs, expected);
    group.combine(combine.args(outputs, weighted), stream.get());
    EXPECT_NO_THROW(group.synchronize(stream.get()));
    expect_combined_matches(combine.out, weighted ? expected.combined : expected.unreduced);
  }
}

}  // namespace rocep::testing
