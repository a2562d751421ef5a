// The SM budget (EpConfig::num_sms): dispatch + combine run beside a compute-bound kernel that holds the
// rest of the GPU on a stream of its own, and both finish, with the outputs dispatch + combine have alone
// and the CPU reference's, bit for bit; the outputs do not depend on the budget; a budget the GPU cannot
// hold is refused when the group is created.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "compute_load.hpp"
#include "ep_cases.hpp"
#include "host/device_memory.hpp"
#include "mpi_support.hpp"
#include "rocep/mpi.hpp"
#include "rocep/rocep.hpp"

namespace {

using rocep::EpConfig;
using rocep::EpGroup;
using rocep::testing::ComputeLoad;
using rocep::testing::DeviceCombine;
using rocep::testing::DeviceInputs;
using rocep::testing::DeviceOutputs;
using rocep::testing::download;
using rocep::testing::expect_combined_matches;
using rocep::testing::expect_dispatch_matches;
using rocep::testing::Expected;
using rocep::testing::ExpertData;
using rocep::testing::Inputs;
using rocep::testing::make_config;
using rocep::testing::make_expert_data;
using rocep::testing::make_inputs;
using rocep::testing::reference_results;
using rocep::testing::Routing;
using rocep::testing::seed_trace;
using rocep::testing::shared_seed;
using rocep::testing::sm_split;
using rocep::testing::SmSplit;
using rocep::testing::world_rank;
using rocep::testing::world_size;

using SmBudget = rocep::testing::GpuTest;

// Long enough that dispatch + combine start and end while it runs (they take well under a millisecond at
// these sizes), short enough for a test.
constexpr double kComputeLoadMs = 200.0;

// The split of this rank's GPU for `num_sms`, as the group makes it. Collective.
SmSplit split_for(int num_sms) {
  rocep::MpiBootstrap world(MPI_COMM_WORLD);
  return sm_split(world, num_sms);
}

// `value` reduced over the ranks by `operation`, the same on every rank. Collective.
int over_ranks(int value, MPI_Op operation) {
  int result = 0;
  MPI_Allreduce(&value, &result, 1, MPI_INT, operation, MPI_COMM_WORLD);
  return result;
}

// Every byte of a round's outputs, poison included: the dispatch outputs and the combined tokens.
std::vector<uint8_t> round_bytes(const DeviceOutputs& outputs, const DeviceCombine& combine) {
  std::vector<uint8_t> bytes;
  for (const rocep::DeviceBuffer* buffer :
       {&outputs.recv_tokens, &outputs.recv_scales, &outputs.row_offsets, &outputs.expert_ids,
        &outputs.src_info, &outputs.recv_weights, &combine.out}) {
    const auto contents = download<uint8_t>(*buffer, buffer->bytes());
    bytes.insert(bytes.end(), contents.begin(), contents.end());
  }
  return bytes;
}

// Every output of a step back to the poison, complete on return (it waits for the whole device).
void poison(const DeviceOutputs& outputs, const DeviceCombine& combine) {
  outputs.poison();
  rocep::testing::fill_bytes(combine.out, rocep::testing::kPoison);
}

// One step on `stream`: fused dispatch of `inputs`, then the weighted combine (with the shared expert); the
// caller waits.
void queue_step(EpGroup& group, const DeviceInputs& inputs, const DeviceOutputs& outputs,
                const DeviceCombine& combine, hipStream_t stream) {
  group.dispatch(inputs.view(), outputs.view(), stream);
  group.combine(combine.args(outputs, /*weighted=*/true), stream);
}

// Waits for `stream` (every device-side wait is bounded by the group's timeout) and checks the step against
// the reference.
void expect_step_matches(EpGroup& group, const EpConfig& config, const DeviceOutputs& outputs,
                         const DeviceCombine& combine, const Expected& expected, hipStream_t stream) {
  EXPECT_NO_THROW(group.synchronize(stream));
  expect_dispatch_matches(config, outputs, expected);
  expect_combined_matches(combine.out, expected.combined);
}

TEST_F(SmBudget, DispatchAndCombineFinishBesideAComputeKernelOnTheOtherSms) {
  // A prefill-sized step at the default budget.
  const EpConfig config = make_config(7168, 8, 256 / world_size(), 512);
  const SmSplit split = split_for(config.num_sms);
  if (over_ranks(split.compute, MPI_MIN) < 1) {  // the same decision on every rank
    GTEST_SKIP() << "the default budget takes all " << split.multiprocessors
                 << " multiprocessors of this GPU";
  }
  const uint64_t seed = shared_seed();
  SCOPED_TRACE(seed_trace(seed) + ", " + config.describe());
  // A first step alone; the step beside the compute kernel on new data (so that nothing it outputs could be
  // left from the first), then that data again alone.
  const Inputs first_inputs = make_inputs(config, Routing::kUniform, seed, config.max_tokens_per_rank);
  const ExpertData first_experts = make_expert_data(config, seed);
  const Expected first_expected = reference_results(config, first_inputs.view(), &first_experts);
  const Inputs inputs = make_inputs(config, Routing::kUniform, seed + 1, config.max_tokens_per_rank);
  const ExpertData experts = make_expert_data(config, seed + 1);
  const Expected expected = reference_results(config, inputs.view(), &experts);

  EpGroup group(MPI_COMM_WORLD, config, rocep::Backend::kGpu);
  const rocep::Stream communication;
  const rocep::Stream compute;
  DeviceInputs device_inputs(first_inputs);
  const DeviceOutputs outputs(config);
  const DeviceCombine combine(config, first_experts);

  poison(outputs, combine);
  queue_step(group, device_inputs, outputs, combine, communication.get());
  expect_step_matches(group, config, outputs, combine, first_expected, communication.get());
  device_inputs.overwrite(inputs);
  combine.overwrite(experts);

  const ComputeLoad load(split.compute, kComputeLoadMs, compute.get());
  const rocep::Event load_start;
  const rocep::Event load_end;
  const rocep::Event step_end;
  poison(outputs, combine);  // before the load: it waits for the device
  MPI_Barrier(MPI_COMM_WORLD);
  load_start.record(compute.get());
  load.launch(compute.get());
  load_end.record(compute.get());
  queue_step(group, device_inputs, outputs, combine, communication.get());
  step_end.record(communication.get());
  expect_step_matches(group, config, outputs, combine, expected, communication.get());
  load_end.synchronize();
  const std::vector<uint8_t> beside = round_bytes(outputs, combine);

  const double step_ms = step_end.elapsed_ms_since(load_start);
  const double load_ms = load_end.elapsed_ms_since(load_start);
  EXPECT_LT(step_ms, load_ms) << "dispatch + combine on " << split.communication
                              << " multiprocessors did not finish while the compute kernel held "
                              << split.compute << " others: they waited for it instead of running beside it";
  if (world_rank() == 0) {
    std::printf(
        "[ budget   ] rank 0: dispatch + combine on %d of %d multiprocessors done %.2f ms after a "
        "compute kernel on %d others started, which took %.2f ms\n",
        split.communication, split.multiprocessors, step_ms, split.compute, load_ms);
  }

  poison(outputs, combine);
  queue_step(group, device_inputs, outputs, combine, communication.get());
  expect_step_matches(group, config, outputs, combine, expected, communication.get());
  EXPECT_EQ(round_bytes(outputs, combine), beside)
      << "outputs alone differ from those beside the compute kernel";
}

TEST_F(SmBudget, OutputsAreBitIdenticalAtEveryBudget) {
  const int world = world_size();
  // Few tokens (with every multiprocessor, a receive with blocks to spare splits each token between two of
  // them), one chunk of 64 tokens per source (ranked in each block), and more than 16 chunks (ranked by the
  // whole grid, behind a grid barrier), each at 8 and 24 multiprocessors, the default and all of them.
  for (const EpConfig& shape : {make_config(7168, 8, 256 / world, 16), make_config(7168, 8, 256 / world, 128),
                                make_config(2048, 8, 64 / world, 576)}) {
    const uint64_t seed = shared_seed();
    SCOPED_TRACE(seed_trace(seed) + ", " + shape.describe());
    const Inputs inputs = make_inputs(shape, Routing::kMasked, seed, shape.max_tokens_per_rank);
    const ExpertData experts = make_expert_data(shape, seed);
    const Expected expected = reference_results(shape, inputs.view(), &experts);
    // The smallest share of any rank (the same decision on every rank: creation is collective).
    const int smallest_share = over_ranks(split_for(EpConfig::kAllSms).communication, MPI_MIN);
    std::vector<uint8_t> first;
    for (const int num_sms : {8, 24, EpConfig::kDefaultSms, EpConfig::kAllSms}) {
      if (num_sms > smallest_share) {
        continue;  // more than a rank's share of its GPU (many ranks per GPU): refused, as tested below
      }
      EpConfig config = shape;
      config.num_sms = num_sms;
      SCOPED_TRACE(config.describe());
      EpGroup group(MPI_COMM_WORLD, config, rocep::Backend::kGpu);
      const rocep::Stream stream;
      const DeviceInputs device_inputs(inputs);
      const DeviceOutputs outputs(config);
      const DeviceCombine combine(config, experts);
      poison(outputs, combine);
      queue_step(group, device_inputs, outputs, combine, stream.get());
      expect_step_matches(group, config, outputs, combine, expected, stream.get());
      const std::vector<uint8_t> bytes = round_bytes(outputs, combine);
      if (first.empty()) {
        first = bytes;
      } else {
        EXPECT_EQ(bytes, first) << "outputs differ from those at the first budget";
      }
    }
  }
}

TEST_F(SmBudget, BudgetAboveTheRanksShareIsRefusedAtCreation) {
  const SmSplit split = split_for(EpConfig::kAllSms);
  EpConfig config = make_config(2048, 4, 8, 16);
  // One more than the largest share of any rank: every rank refuses it (and all throw alike anyway).
  config.num_sms = over_ranks(split.communication, MPI_MAX) + 1;
  try {
    EpGroup group(MPI_COMM_WORLD, config, rocep::Backend::kGpu);
    ADD_FAILURE() << "num_sms " << config.num_sms << " accepted on " << split.multiprocessors
                  << " multiprocessors shared by " << split.ranks_on_gpu << " rank(s)";
  } catch (const rocep::ConfigError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("EpConfig.num_sms = " + std::to_string(config.num_sms)), std::string::npos)
        << message;
    EXPECT_NE(message.find("allowed range is [1, "), std::string::npos) << message;
  }
}

}  // namespace
