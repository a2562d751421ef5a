// The contract of EpGroup (include/rocep/ep_group.hpp) on the GPU backend, against the CPU reference bit for
// bit: a rank's bad inputs stay on that rank, a call from another GPU than the group's is refused before
// anything is issued, a call on a stream new to the group leaves another thread's global-mode capture
// valid, a group destroyed with another GPU current waits for its own, data errors are recorded for
// poll_error() / synchronize() (and polled by another thread while synchronize waits), weighted and
// unweighted combines mixed across ranks are caught on the device; and one group called again and again (new
// counts, routings, fused and split calls, graph replays with new data), two groups in one process (from one
// thread, and each from a thread of its own at once), and small calls in a group sized for many tokens. Every
// call gets fresh random inputs and freshly poisoned outputs.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <future>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "compute_load.hpp"
#include "ep_cases.hpp"
#include "host/device.hpp"
#include "host/device_memory.hpp"
#include "host/gpu_check.hpp"
#include "mpi_support.hpp"
#include "rocep/mpi.hpp"
#include "rocep/rocep.hpp"

namespace {

using rocep::testing::combine_on;
using rocep::testing::ComputeLoad;
using rocep::testing::DeviceCombine;
using rocep::testing::DeviceInputs;
using rocep::testing::DeviceOutputs;
using rocep::testing::dispatch_on;
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
using rocep::testing::routing_name;
using rocep::testing::seed_trace;
using rocep::testing::shared_seed;
using rocep::testing::world_rank;
using rocep::testing::world_size;

using rocep::EpConfig;
using rocep::RecordedError;

using GpuEpContract = rocep::testing::GpuTest;

// True when `message` names `what` `number` ("rank 1", "token 3"), not as the start of a longer number.
bool names(const std::string& message, const std::string& what, int number) {
  const std::string words = what + " " + std::to_string(number);
  for (std::size_t at = message.find(words); at != std::string::npos; at = message.find(words, at + 1)) {
    const std::size_t end = at + words.size();
    if (end == message.size() || message[end] < '0' || message[end] > '9') {
      return true;
    }
  }
  return false;
}

// One step of a group: what this rank passes and how the calls are made.
struct Step {
  Routing routing;
  int num_tokens;       // -1: as the routing draws it
  bool split_dispatch;  // dispatch_send + dispatch_recv, else dispatch
  bool split_combine;   // combine_send + combine_recv, else combine
  bool weighted;  // weighted (by the dispatched weights, plus the shared expert's rows), else unweighted
};

std::string describe(const Step& step) {
  return std::string(routing_name(step.routing)) + ", num_tokens " +
         (step.num_tokens < 0 ? std::string("drawn") : std::to_string(step.num_tokens)) +
         (step.split_dispatch ? ", dispatch_send + dispatch_recv" : ", dispatch") +
         (step.split_combine ? ", combine_send + combine_recv" : ", combine") +
         (step.weighted ? ", weighted + shared expert" : ", unweighted");
}

// Runs `step` on `group` with fresh inputs and compares its dispatch and combine with the reference's.
// Collective.
void expect_step_matches_reference(rocep::EpGroup& group, hipStream_t stream, const Step& step) {
  // group.config(): the fp8 encoding as the GPU resolved it, which the reference then uses too.
  const EpConfig& config = group.config();
  const uint64_t seed = shared_seed();
  SCOPED_TRACE(seed_trace(seed) + ", " + describe(step) + ", " + config.describe());
  const Inputs inputs = make_inputs(config, step.routing, seed, step.num_tokens);
  const ExpertData experts = make_expert_data(config, seed);
  const Expected expected = reference_results(config, inputs.view(), &experts);
  const DeviceInputs device_inputs(inputs);
  const DeviceOutputs outputs(config);
  const DeviceCombine combine(config, experts);
  dispatch_on(group, device_inputs.view(), outputs.view(), step.split_dispatch, stream);
  combine_on(group, combine.args(outputs, step.weighted), step.split_combine, stream);
  EXPECT_NO_THROW(group.synchronize(stream));
  EXPECT_FALSE(group.poll_error()) << group.poll_error().message;
  expect_dispatch_matches(config, outputs, expected);
  expect_combined_matches(combine.out, step.weighted ? expected.combined : expected.unreduced);
}

// Runs `steps` in turn on one new group of `config` and one stream, each against the reference. Collective.
template <std::size_t N>
void expect_steps_match_reference(const EpConfig& config, const Step (&steps)[N]) {
  rocep::EpGroup group(MPI_COMM_WORLD, config, rocep::Backend::kGpu);
  rocep::Stream stream;
  for (std::size_t call = 0; call < N; ++call) {
    SCOPED_TRACE("call " + std::to_string(call));
    expect_step_matches_reference(group, stream.get(), steps[call]);
  }
}

// The step every test below ends with: the group is usable and correct again.
constexpr Step kValidStep{Routing::kUniform, -1, false, false, true};

// Calls on the runtime's reserved stream handles, the current device's streams: the null handle, the legacy
// default stream and the calling thread's per-thread stream. Each is taken and matches the reference.
TEST_F(GpuEpContract, CallsOnTheReservedStreamHandlesMatchTheReference) {
  const EpConfig config = make_config(2048, 8, 64 / world_size(), 96, 4);
  rocep::EpGroup group(MPI_COMM_WORLD, config, rocep::Backend::kGpu);
  const char* const labels[] = {"null", "hipStreamLegacy", "hipStreamPerThread"};
  const hipStream_t handles[] = {nullptr, hipStreamLegacy, hipStreamPerThread};
  for (int i = 0; i < 3; ++i) {
    SCOPED_TRACE(std::string("stream ") + labels[i]);
    expect_step_matches_reference(group, handles[i], kValidStep);
  }
}

// A call on a stream new to the group while another thread of the process captures a graph in the global
// capture mode (torch.cuda.graph's default), in which a potentially unsafe runtime call from any thread
// fails and invalidates the capture: the group asks the new stream for its device then. The call is taken and
// matches the reference, and the other thread's capture ends valid.
TEST_F(GpuEpContract, ACallOnANewStreamLeavesAnotherThreadsGlobalCaptureValid) {
  const EpConfig config = make_config(2048, 8, 64 / world_size(), 96, 4);
  rocep::EpGroup group(MPI_COMM_WORLD, config, rocep::Backend::kGpu);
  const uint64_t seed = shared_seed();
  SCOPED_TRACE(seed_trace(seed));
  // Everything allocated before the capture begins: an allocation during it is itself unsafe.
  const Inputs inputs = make_inputs(config, Routing::kUniform, seed);
  const ExpertData experts = make_expert_data(config, seed);
  const Expected expected = reference_results(config, inputs.view(), &experts);
  const DeviceInputs device_inputs(inputs);
  const DeviceOutputs outputs(config);
  const DeviceCombine combine(config, experts);
  const rocep::Stream captured;  // the other thread's
  const rocep::Stream stream;    // new to the group
  const rocep::DeviceBuffer scratch(4096);

  std::promise<void> capture_begun;
  std::promise<void> calls_issued;
  hipError_t begun = hipSuccess;
  hipError_t ended = hipSuccess;
  hipGraph_t graph = nullptr;
  std::thread capturer([&, device = group.device()] {
    begun = hipSetDevice(device);
    if (begun == hipSuccess) {
      begun = hipStreamBeginCapture(captured.get(), hipStreamCaptureModeGlobal);
    }
    if (begun == hipSuccess) {
      (void)hipMemsetAsync(scratch.get(), 1, 4096, captured.get());
    }
    capture_begun.set_value();
    calls_issued.get_future().wait();
    if (begun == hipSuccess) {
      ended = hipStreamEndCapture(captured.get(), &graph);
    }
  });
  capture_begun.get_future().wait();
  EXPECT_NO_THROW({
    group.dispatch(device_inputs.view(), outputs.view(), stream.get());
    group.combine(combine.args(outputs, /*weighted=*/true), stream.get());
  });
  calls_issued.set_value();
  capturer.join();
  ASSERT_EQ(begun, hipSuccess) << hipGetErrorString(begun);
  EXPECT_EQ(ended, hipSuccess) << "the other thread's capture: " << hipGetErrorString(ended);
  EXPECT_NE(graph, nullptr);
  if (graph != nullptr) {
    ROCEP_GPU_CHECK(hipGraphDestroy(graph));
  }
  EXPECT_NO_THROW(group.synchronize(stream.get()));
  EXPECT_FALSE(group.poll_error()) << group.poll_error().message;
  expect_dispatch_matches(config, outputs, expected);
  expect_combined_matches(combine.out, expected.combined);
  expect_step_matches_reference(group, stream.get(), kValidStep);
}

// Call A: the last rank passes num_tokens = max + 1 (fused calls); call B: a null topk_weights with tokens
// (split calls). That rank throws InvalidInputError naming itself, after taking part as a rank with zero
// tokens: every rank's dispatch and combine equal the reference's with that rank at zero tokens (its own
// combine writes nothing). Call C, valid everywhere, is correct on every rank.
TEST_F(GpuEpContract, BadInputsOfOneRankStayOnThatRank) {
  const int world = world_size();
  const EpConfig config = make_config(2048, 8, 64 / world, 96, 4);
  const int bad_rank = world - 1;
  const bool bad = world_rank() == bad_rank;
  rocep::EpGroup group(MPI_COMM_WORLD, config, rocep::Backend::kGpu);
  rocep::Stream stream;
  for (int call = 0; call < 2; ++call) {
    const bool split = call == 1;
    const uint64_t seed = shared_seed();
    SCOPED_TRACE(seed_trace(seed) +
                 (split ? ", call B: null topk_weights" : ", call A: num_tokens = max + 1"));
    // kMasked: one token at least, so that the null pointer of call B comes with tokens.
    const Inputs inputs = make_inputs(config, Routing::kMasked, seed);
    const ExpertData experts = make_expert_data(config, seed);
    // The group computes with the bad rank's tokens counted as none.
    const Expected expected = reference_results(config, bad ? Inputs{}.view() : inputs.view(), &experts);
    const DeviceInputs device_inputs(inputs);
    rocep::DispatchInputs passed = device_inputs.view();
    if (bad && !split) {
      passed.num_tokens = config.max_tokens_per_rank + 1;
    }
    if (bad && split) {
      passed.topk_weights = nullptr;
    }
    const DeviceOutputs outputs(config);
    const DeviceCombine combine(config, experts);
    std::string message;  // of the InvalidInputError this rank got, if any
    try {
      if (split) {
        group.dispatch_send(passed, stream.get());
      } else {
        group.dispatch(passed, outputs.view(), stream.get());
      }
    } catch (const rocep::InvalidInputError& error) {
      message = error.what();
    }
    // The calls stay collective: the bad rank goes on as every rank does.
    if (split) {
      group.dispatch_recv(outputs.view(), stream.get());
    }
    combine_on(group, combine.args(outputs, /*weighted=*/true), split, stream.get());
    EXPECT_NO_THROW(group.synchronize(stream.get())) << "refused inputs are not recorded";
    EXPECT_EQ(message.empty(), !bad) << message;
    if (bad) {
      EXPECT_TRUE(names(message, "rank", bad_rank)) << message;
      const std::string words =
          split ? "null" : "num_tokens = " + std::to_string(config.max_tokens_per_rank + 1);
      EXPECT_NE(message.find(words), std::string::npos) << message;
    }
    expect_dispatch_matches(config, outputs, expected);
    expect_combined_matches(combine.out, expected.combined);
  }
  SCOPED_TRACE("call C: valid on every rank");
  expect_step_matches_reference(group, stream.get(), kValidStep);
}

// Collective: the fewest GPUs a rank sees (the tests that make another GPU current need two).
int fewest_visible_gpus() {
  const int devices = rocep::device_count();
  int fewest = 0;
  MPI_Allreduce(&devices, &fewest, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return fewest;
}

// The last rank calls dispatch, dispatch_send, synchronize and poll_error with another GPU current than its
// group's, then the first three with its own GPU current on a stream of the other GPU (where every rank sees
// two GPUs or more): each is refused with InvalidInputError before anything is issued (issued() false),
// naming both GPUs and what was wrong; with its own GPU current and its own stream the group takes the next
// call and matches the reference on every rank.
TEST_F(GpuEpContract, CallsFromAnotherGpuAreRefusedBeforeAnythingIsIssued) {
  const int devices = rocep::device_count();
  if (const int fewest = fewest_visible_gpus(); fewest < 2) {
    GTEST_SKIP() << "every rank must see two GPUs or more; the fewest a rank sees is " << fewest;
  }
  const int world = world_size();
  const EpConfig config = make_config(2048, 8, 64 / world, 96, 4);
  rocep::EpGroup group(MPI_COMM_WORLD, config, rocep::Backend::kGpu);
  rocep::Stream stream;
  const int own = rocep::current_device();
  EXPECT_EQ(group.device(), own);
  if (world_rank() == world - 1) {
    const int other = (own + 1) % devices;
    rocep::set_device(other);
    const rocep::Stream other_stream;
    for (const bool other_current : {true, false}) {
      rocep::set_device(other_current ? other : own);
      const hipStream_t call_stream = other_current ? stream.get() : other_stream.get();
      const std::string wrong = other_current ? "current device" : "stream";
      for (const std::string call : {"dispatch", "dispatch_send", "synchronize", "poll_error"}) {
        if (call == "poll_error" && !other_current) {
          continue;  // it takes no stream
        }
        SCOPED_TRACE(call + " with the wrong " + wrong);
        try {
          if (call == "dispatch") {
            group.dispatch({}, {}, call_stream);
          } else if (call == "dispatch_send") {
            group.dispatch_send({}, call_stream);
          } else if (call == "synchronize") {
            group.synchronize(call_stream);
          } else {
            (void)group.poll_error();
          }
          ADD_FAILURE() << "a call with the " << wrong << " of GPU " << other
                        << " was taken by the group of GPU " << own;
        } catch (const rocep::InvalidInputError& error) {
          EXPECT_FALSE(error.issued());
          const std::string message = error.what();
          EXPECT_NE(message.find(wrong), std::string::npos) << message;
          EXPECT_TRUE(names(message, "GPU", other)) << message;
          EXPECT_TRUE(names(message, "GPU", own)) << message;
          EXPECT_TRUE(names(message, "rank", world - 1)) << message;
        }
      }
    }
    rocep::set_device(own);
  }
  expect_step_matches_reference(group, stream.get(), kValidStep);
}

// The last rank destroys its group with another GPU current (where every rank sees two GPUs or more), a
// kernel of about 300 ms still running on the group's stream behind the group's last call: the destructor
// waits for the group's GPU, not the current one (the kernel has finished when it returns), and makes the
// caller's GPU current again. A new group on the same GPUs then matches the reference.
TEST_F(GpuEpContract, AGroupDestroyedWithAnotherGpuCurrentWaitsForItsOwn) {
  const int devices = rocep::device_count();
  if (const int fewest = fewest_visible_gpus(); fewest < 2) {
    GTEST_SKIP() << "every rank must see two GPUs or more; the fewest a rank sees is " << fewest;
  }
  const int world = world_size();
  const EpConfig config = make_config(2048, 8, 64 / world, 96, 4);
  const bool last = world_rank() == world - 1;
  const int own = rocep::current_device();
  const int other = (own + 1) % devices;
  rocep::Stream stream;
  const ComputeLoad load(1, 300.0, stream.get());  // outlives the group: its memory is not freed under it
  {
    rocep::EpGroup group(MPI_COMM_WORLD, config, rocep::Backend::kGpu);
    expect_step_matches_reference(group, stream.get(), kValidStep);
    if (last) {
      load.launch(stream.get());
      rocep::set_device(other);
    }
  }
  if (last) {
    EXPECT_EQ(rocep::current_device(), other) << "the destructor did not give the caller's GPU back";
    rocep::set_device(own);
    EXPECT_EQ(hipStreamQuery(stream.get()), hipSuccess) << "the destructor did not wait for the group's GPU";
  }
  rocep::EpGroup again(MPI_COMM_WORLD, config, rocep::Backend::kGpu);
  expect_step_matches_reference(again, stream.get(), kValidStep);
}

// close() while a second thread of the last rank waits in synchronize (behind a kernel of about 500 ms on the
// group's stream): refused on every rank with CallOrderError naming that rank, nothing released, and the
// group's next step matches the reference. Then close() is taken on every rank: the GPU's free memory grows
// by the group's memory_bytes at once (checked with one rank per GPU, all on one node: under MPS the ranks
// of a GPU release at their own times), every later call, poll_error included, throws CallOrderError, and
// close() again does nothing.
TEST_F(GpuEpContract, CloseIsRefusedOnEveryRankWhileAThreadIsInsideACallThenReleasesTheGroup) {
  const EpConfig config = make_config(2048, 8, 64 / world_size(), 96, 4);
  const bool last = world_rank() == world_size() - 1;
  rocep::Stream stream;
  const ComputeLoad late(1, 500.0, stream.get());
  rocep::EpGroup group(MPI_COMM_WORLD, config, rocep::Backend::kGpu);
  expect_step_matches_reference(group, stream.get(), kValidStep);
  std::atomic<bool> waiting{false};
  std::thread waiter;
  if (last) {
    late.launch(stream.get());
    waiter = std::thread([&] {
      rocep::set_device(group.device());
      waiting = true;
      EXPECT_NO_THROW(group.synchronize(stream.get()));
    });
    while (!waiting.load()) {
      std::this_thread::yield();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // into synchronize's wait for the kernel
  }
  try {
    group.close();
    ADD_FAILURE() << "close() was taken while the last rank's thread waited in synchronize";
  } catch (const rocep::CallOrderError& error) {
    EXPECT_EQ(
        std::string(error.what()),
        "EpGroup::close on rank " + std::to_string(world_rank()) +
            ": refused on every rank, nothing released: another thread is inside a call of the group on "
            "rank(s) " +
            std::to_string(world_size() - 1) + (last ? " (here EpGroup::synchronize)" : "") +
            "; close it once no other thread is inside one of its calls");
  }
  if (last) {
    waiter.join();
  }
  expect_step_matches_reference(group, stream.get(), kValidStep);
  const std::size_t held = group.memory_bytes();
  std::size_t free_before = 0;
  std::size_t total = 0;
  ASSERT_EQ(hipMemGetInfo(&free_before, &total), hipSuccess);
  group.close();
  std::size_t free_after = 0;
  ASSERT_EQ(hipMemGetInfo(&free_after, &total), hipSuccess);
  // One rank per GPU, and every peer reached by IPC (a SHMEM engine's heap keeps what the group frees in it).
  if (world_size() <= rocep::device_count() && std::getenv("ROCEP_GPUS_PER_NODE") == nullptr) {
    EXPECT_GE(free_after, free_before + held)
        << "close() gave back less than the group's memory_bytes " << held;
  }
  const std::string closed = "EpGroup: this group was closed (EpGroup::close()); create a new group to go on";
  const DeviceOutputs outputs(config);
  for (const auto& call : std::vector<std::function<void()>>{
           [&] { group.poll_error(); }, [&] { group.synchronize(stream.get()); },
           [&] { group.dispatch_recv(outputs.view(), stream.get()); }, [&] { group.device(); }}) {
    try {
      call();
      ADD_FAILURE() << "a call of a closed group was taken";
    } catch (const rocep::CallOrderError& error) {
      EXPECT_EQ(std::string(error.what()), closed);
    }
  }
  EXPECT_NO_THROW(group.close()) << "a second close does nothing";
}

// A call of fresh inputs whose last rank names an expert id out of range (token 3, slot 2), and the
// reference's results for it (which drop that slot, as the kernels do). Collective.
struct BadIdCall {
  explicit BadIdCall(uint64_t seed)
      : config(make_config(2048, 4, 32 / world_size(), 32)),
        bad(world_rank() == world_size() - 1),
        inputs([&] {
          Inputs drawn = make_inputs(config, Routing::kFull, seed);
          if (bad) {
            drawn.topk_ids[3 * config.top_k + 2] = config.num_experts;
          }
          return drawn;
        }()),
        experts(make_expert_data(config, seed)),
        expected(reference_results(config, inputs.view(), &experts)) {}

  EpConfig config;
  bool bad;  // this rank is the last
  Inputs inputs;
  ExpertData experts;
  Expected expected;
};

// An expert id out of range on the last rank (token 3, slot 2): once the stream has finished, poll_error()
// reports it on that rank only, naming rank, token and slot, and reads the same twice (it does not clear);
// synchronize() then throws it once. The rest of the call is the reference's (which drops that slot too).
TEST_F(GpuEpContract, PollErrorReportsAnInvalidExpertIdWithoutClearingIt) {
  const uint64_t seed = shared_seed();
  SCOPED_TRACE(seed_trace(seed));
  const BadIdCall call(seed);
  const int bad_rank = world_size() - 1;

  rocep::EpGroup group(MPI_COMM_WORLD, call.config, rocep::Backend::kGpu);
  rocep::Stream stream;
  const DeviceInputs device_inputs(call.inputs);
  const DeviceOutputs outputs(call.config);
  const DeviceCombine combine(call.config, call.experts);
  group.dispatch(device_inputs.view(), outputs.view(), stream.get());
  group.combine(combine.args(outputs, /*weighted=*/true), stream.get());
  ROCEP_GPU_CHECK(hipStreamSynchronize(stream.get()));  // the kernels ended; group.synchronize() not called
  const RecordedError first = group.poll_error();
  const RecordedError second = group.poll_error();
  EXPECT_EQ(first.kind, second.kind) << "poll_error() must not clear";
  EXPECT_EQ(first.message, second.message) << "poll_error() must not clear";
  if (call.bad) {
    EXPECT_EQ(first.kind, RecordedError::Kind::kInvalidInput) << first.message;
    EXPECT_TRUE(names(first.message, "rank", bad_rank)) << first.message;
    EXPECT_TRUE(names(first.message, "token", 3)) << first.message;
    EXPECT_TRUE(names(first.message, "slot", 2)) << first.message;
    EXPECT_THROW(group.synchronize(stream.get()), rocep::InvalidInputError);
  } else {
    EXPECT_EQ(first.kind, RecordedError::Kind::kNone) << first.message;
  }
  EXPECT_NO_THROW(group.synchronize(stream.get())) << "synchronize() clears what it threw";
  EXPECT_FALSE(group.poll_error()) << group.poll_error().message;
  expect_dispatch_matches(call.config, outputs, call.expected);
  expect_combined_matches(combine.out, call.expected.combined);
  SCOPED_TRACE("the step after");
  expect_step_matches_reference(group, stream.get(), kValidStep);
}

// A watchdog thread of every rank polls its group (poll_error, the group's GPU made current on that thread
// first) while the rank's own thread waits in synchronize for a call that in turn waits for rank 0, whose
// dispatch starts about 300 ms late, behind a kernel on its stream. The last rank's send
// records an expert id out of range (token 3, slot 2). Every poll is answered, none refused, and many while
// synchronize waits (a poll held until synchronize returned would count as none); on NVIDIA the last
// rank's watchdog reads the record before synchronize throws it. The calls match the reference.
TEST_F(GpuEpContract, AWatchdogThreadPollsWhileSynchronizeWaits) {
  const uint64_t seed = shared_seed();
  SCOPED_TRACE(seed_trace(seed));
  const BadIdCall call(seed);

  rocep::EpGroup group(MPI_COMM_WORLD, call.config, rocep::Backend::kGpu);
  rocep::Stream stream;
  const ComputeLoad late(1, 300.0, stream.get());
  const DeviceInputs device_inputs(call.inputs);
  const DeviceOutputs outputs(call.config);
  const DeviceCombine combine(call.config, call.experts);
  if (world_rank() == 0) {
    late.launch(stream.get());
  }
  group.dispatch(device_inputs.view(), outputs.view(), stream.get());
  group.combine(combine.args(outputs, /*weighted=*/true), stream.get());

  std::atomic<bool> waiting{false};
  std::atomic<bool> finished{false};
  int answered_while_waiting = 0;
  int recorded_while_waiting = 0;
  double longest_poll_ms = 0;
  std::vector<std::string> unexpected;  // polls refused, or records other than the last rank's bad id
  std::thread watchdog([&] {
    rocep::set_device(group.device());
    while (!finished.load()) {
      const bool before = waiting.load();
      RecordedError polled;
      const auto start = std::chrono::steady_clock::now();
      try {
        polled = group.poll_error();
      } catch (const rocep::Error& error) {
        unexpected.emplace_back(error.what());
        continue;
      }
      longest_poll_ms = std::max(
          longest_poll_ms,
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
      const bool bad_id = call.bad && polled.kind == RecordedError::Kind::kInvalidInput &&
                          names(polled.message, "token", 3) && names(polled.message, "slot", 2);
      if (polled && !bad_id) {
        unexpected.push_back(polled.message);
      }
      if (before && waiting.load()) {
        ++answered_while_waiting;
        recorded_while_waiting += bad_id ? 1 : 0;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  waiting = true;
  if (call.bad) {
    EXPECT_THROW(group.synchronize(stream.get()), rocep::InvalidInputError);
  } else {
    EXPECT_NO_THROW(group.synchronize(stream.get()));
  }
  waiting = false;
  finished = true;
  watchdog.join();
  EXPECT_TRUE(unexpected.empty()) << unexpected.size() << " unexpected polls, the first: " << unexpected[0];
  // About 300 ms of waiting at 1 ms apart: far more polls than could fit between the flag and the call.
  EXPECT_GE(answered_while_waiting, 10)
      << "polls answered while synchronize waited; the longest poll took " << longest_poll_ms << " ms";
#if defined(ROCEP_PLATFORM_NVIDIA)
  if (call.bad) {  // on AMD a record may sit in the GPU's L2 until its kernel ends (ep_group.hpp, poll_error)
    EXPECT_GT(recorded_while_waiting, 0) << "the record was not read while synchronize waited";
  }
#endif
  EXPECT_FALSE(group.poll_error()) << group.poll_error().message;
  expect_dispatch_matches(call.config, outputs, call.expected);
  expect_combined_matches(combine.out, call.expected.combined);
  SCOPED_TRACE("the step after");
  expect_step_matches_reference(group, stream.get(), kValidStep);
}

// Rank 0 combines weighted, the others unweighted: every rank records InvalidInputError about row_weights
// (checked on the device from Signals::combine_weighted), naming itself; synchronize() throws it; the next
// whole step, weighted on every rank, is correct.
TEST_F(GpuEpContract, MixedWeightedAndUnweightedCombineIsRecordedOnEveryRank) {
  if (world_size() < 2) {
    GTEST_SKIP() << "needs 2 ranks to disagree";
  }
  const EpConfig config = make_config(2048, 8, 64 / world_size(), 64);
  const uint64_t seed = shared_seed();
  SCOPED_TRACE(seed_trace(seed));
  const Inputs inputs = make_inputs(config, Routing::kUniform, seed);
  const ExpertData experts = make_expert_data(config, seed);
  const Expected expected = reference_results(config, inputs.view(), &experts);

  rocep::EpGroup group(MPI_COMM_WORLD, config, rocep::Backend::kGpu);
  rocep::Stream stream;
  const DeviceInputs device_inputs(inputs);
  const DeviceOutputs outputs(config);
  const DeviceCombine combine(config, experts);  // out has room for the unweighted combine
  group.dispatch(device_inputs.view(), outputs.view(), stream.get());
  group.combine(combine.args(outputs, /*weighted=*/world_rank() == 0), stream.get());
  ROCEP_GPU_CHECK(hipStreamSynchronize(stream.get()));
  const RecordedError recorded = group.poll_error();
  EXPECT_EQ(recorded.kind, RecordedError::Kind::kInvalidInput) << recorded.message;
  EXPECT_NE(recorded.message.find("row_weights"), std::string::npos) << recorded.message;
  EXPECT_TRUE(names(recorded.message, "rank", world_rank())) << recorded.message;
  EXPECT_THROW(group.synchronize(stream.get()), rocep::InvalidInputError);
  EXPECT_FALSE(group.poll_error()) << group.poll_error().message;
  expect_dispatch_matches(config, outputs, expected);  // the dispatch before it was valid
  SCOPED_TRACE("the step after");
  expect_step_matches_reference(group, stream.get(), kValidStep);
}

// One group per format, called again and again with new data: token counts full, 1, 0, full, then drawn;
// a different routing every call; fused and split dispatch and combine; weighted with the shared expert
// (one call unweighted). What one call leaves in the group's memory must not leak into the next.
TEST_F(GpuEpContract, OneGroupCalledAgainAndAgainMatchesReferenceEveryCall) {
  const int world = world_size();
  EpConfig bf16 = make_config(7168, 8, 256 / world, 128);
  EpConfig fp8 = make_config(2048, 8, 64 / world, 128, 4);
  fp8.dispatch_format = rocep::TokenFormat::kFp8Block128;
  fp8.fp8_encoding = rocep::Fp8Encoding::kE4m3fn;
  for (const EpConfig& config : {bf16, fp8}) {
    const int full = config.max_tokens_per_rank;
    const Step steps[] = {
        {Routing::kUniform, full, false, false, true},  {Routing::kMasked, 1, true, true, true},
        {Routing::kHotExpert, 0, true, false, true},    {Routing::kUniform, full, false, true, true},
        {Routing::kUnevenCounts, -1, true, true, true}, {Routing::kMasked, -1, false, false, false},
        {Routing::kHotExpert, -1, true, false, true},
    };
    expect_steps_match_reference(config, steps);
  }
}

// The same for a group sized for many more tokens than most of its calls send (a server's one group for
// prefill and decode), bf16 and fp8 block-128 (whose receive lays its scales out later in such a group):
// each receive ranks only the chunks of 64 tokens that hold the tokens sent, in its blocks where their
// masks fit, else by a prefix pass, and must not read what larger calls left in the chunks past them. The
// ranks send different counts (uneven routing, or counts by rank), so a source's chunks past its own count
// but within another's are read as empty.
TEST_F(GpuEpContract, SmallCallsInAGroupSizedForManyTokensMatchReferenceEveryCall) {
  EpConfig bf16 = make_config(2048, 8, 128, 1024);
  EpConfig fp8 = make_config(2048, 8, 128, 1024, 4);
  fp8.dispatch_format = rocep::TokenFormat::kFp8Block128;
  fp8.fp8_encoding = rocep::Fp8Encoding::kE4m3fn;
  const bool even = world_rank() % 2 == 0;
  for (const EpConfig& config : {bf16, fp8}) {
    const Step steps[] = {
        {Routing::kUniform, 1024, false, false, true},
        {Routing::kUniform, even ? 100 : 300, true, false, true},
        {Routing::kMasked, even ? 1 : 0, false, true, true},
        {Routing::kHotExpert, even ? 300 : 1024, false, false, true},
        {Routing::kUnevenCounts, -1, true, true, true},
        {Routing::kUniform, even ? 17 : 200, false, false, false},
        {Routing::kUniform, 64, false, false, true},
    };
    expect_steps_match_reference(config, steps);
  }
}

// One dispatch + combine step captured with the token count in device memory, replayed 20 times, each time
// with new tokens, ids, weights, count and expert outputs written into the captured buffers first (counts
// full, 1, 0, then drawn; routings in turn): every replay equals the reference for its own data.
TEST_F(GpuEpContract, GraphReplaysWithNewDataAndCountsMatchReference) {
  const EpConfig config = make_config(2048, 8, 64 / world_size(), 96, 4);
  rocep::EpGroup group(MPI_COMM_WORLD, config, rocep::Backend::kGpu);
  rocep::Stream stream;
  const uint64_t capture_seed = shared_seed();
  // Made for a full call: every replay's inputs fit.
  DeviceInputs device_inputs(make_inputs(config, Routing::kFull, capture_seed),
                             /*read_count_on_device=*/true);
  const DeviceOutputs outputs(config);
  const DeviceCombine combine(config, make_expert_data(config, capture_seed));

  hipGraph_t graph;
  hipGraphExec_t executable;
  ROCEP_GPU_CHECK(hipStreamBeginCapture(stream.get(), hipStreamCaptureModeThreadLocal));
  group.dispatch(device_inputs.view(), outputs.view(), stream.get());
  group.combine(combine.args(outputs, /*weighted=*/true), stream.get());
  ROCEP_GPU_CHECK(hipStreamEndCapture(stream.get(), &graph));
  ROCEP_GPU_CHECK(hipGraphInstantiate(&executable, graph, nullptr, nullptr, 0));

  const Routing routings[] = {Routing::kUniform, Routing::kMasked, Routing::kHotExpert,
                              Routing::kUnevenCounts, Routing::kFull};
  for (int replay = 0; replay < 20; ++replay) {
    const uint64_t seed = shared_seed();
    const Routing routing = routings[replay % std::size(routings)];
    const int num_tokens =
        replay == 0 ? config.max_tokens_per_rank : (replay == 1 ? 1 : (replay == 2 ? 0 : -1));
    SCOPED_TRACE("replay " + std::to_string(replay) + ", " + seed_trace(seed) + ", " + routing_name(routing));
    const Inputs inputs = make_inputs(config, routing, seed, num_tokens);
    const ExpertData experts = make_expert_data(config, seed);
    const Expected expected = reference_results(config, inputs.view(), &experts);
    device_inputs.overwrite(inputs);
    combine.overwrite(experts);
    outputs.poison();
    ROCEP_GPU_CHECK(hipGraphLaunch(executable, stream.get()));
    EXPECT_NO_THROW(group.synchronize(stream.get()));
    expect_dispatch_matches(config, outputs, expected);
    expect_combined_matches(combine.out, expected.combined);
  }
  ROCEP_GPU_CHECK(hipGraphExecDestroy(executable));
  ROCEP_GPU_CHECK(hipGraphDestroy(graph));
}

// Two groups of different shapes on the same ranks, each on a stream of its own, their calls interleaved
// (A dispatch, B dispatch, B combine, A combine; then B first): both equal the reference. Each group takes
// its default share of multiprocessors, so both groups' grids are resident at once whichever kernel a GPU
// starts first (with every multiprocessor each, a rank whose GPU ran group A's kernel and a peer whose GPU
// ran group B's would wait on each other).
TEST_F(GpuEpContract, TwoGroupsOnTwoStreamsInterleaved) {
  const int world = world_size();
  const EpConfig config_a = make_config(2048, 8, 64 / world, 96);
  const EpConfig config_b = make_config(7168, 4, 256 / world, 64, 4);
  rocep::EpGroup group_a(MPI_COMM_WORLD, config_a, rocep::Backend::kGpu);
  rocep::EpGroup group_b(MPI_COMM_WORLD, config_b, rocep::Backend::kGpu);
  rocep::Stream stream_a;
  rocep::Stream stream_b;
  for (const bool a_first : {true, false}) {
    const uint64_t seed_a = shared_seed();
    const uint64_t seed_b = shared_seed();
    SCOPED_TRACE(std::string(a_first ? "A first" : "B first") + ", A: " + seed_trace(seed_a) +
                 ", B: " + seed_trace(seed_b));
    const Inputs inputs_a = make_inputs(config_a, Routing::kMasked, seed_a);
    const Inputs inputs_b = make_inputs(config_b, Routing::kUniform, seed_b);
    const ExpertData experts_a = make_expert_data(config_a, seed_a);
    const ExpertData experts_b = make_expert_data(config_b, seed_b);
    const Expected expected_a = reference_results(config_a, inputs_a.view(), &experts_a);
    const Expected expected_b = reference_results(config_b, inputs_b.view(), &experts_b);
    const DeviceInputs device_inputs_a(inputs_a);
    const DeviceInputs device_inputs_b(inputs_b);
    const DeviceOutputs outputs_a(config_a);
    const DeviceOutputs outputs_b(config_b);
    const DeviceCombine combine_a(config_a, experts_a);
    const DeviceCombine combine_b(config_b, experts_b);
    auto dispatch_a = [&] { group_a.dispatch(device_inputs_a.view(), outputs_a.view(), stream_a.get()); };
    auto dispatch_b = [&] {
      dispatch_on(group_b, device_inputs_b.view(), outputs_b.view(), true, stream_b.get());
    };
    auto combine_of_a = [&] { combine_on(group_a, combine_a.args(outputs_a, true), true, stream_a.get()); };
    auto combine_of_b = [&] { group_b.combine(combine_b.args(outputs_b, true), stream_b.get()); };
    if (a_first) {
      dispatch_a();
      dispatch_b();
      combine_of_b();
      combine_of_a();
    } else {
      dispatch_b();
      dispatch_a();
      combine_of_a();
      combine_of_b();
    }
    EXPECT_NO_THROW(group_b.synchronize(stream_b.get()));
    EXPECT_NO_THROW(group_a.synchronize(stream_a.get()));
    {
      SCOPED_TRACE("group A");
      expect_dispatch_matches(config_a, outputs_a, expected_a);
      expect_combined_matches(combine_a.out, expected_a.combined);
    }
    {
      SCOPED_TRACE("group B");
      expect_dispatch_matches(config_b, outputs_b, expected_b);
      expect_combined_matches(combine_b.out, expected_b.combined);
    }
  }
}

// Two groups, each called by a thread of its own at the same time, each on its own stream: four steps of
// fresh data per group (fused and split calls in turn), each equal to the reference. The inputs and the
// references are made before the threads start (the reference's collectives run on this thread); the
// threads then only call their group and compare.
TEST_F(GpuEpContract, TwoGroupsCalledFromTwoThreadsAtOnce) {
  const int world = world_size();
  constexpr int kSteps = 4;
  struct Prepared {
    Prepared(const EpConfig& config, Routing routing, uint64_t seed)
        : trace(seed_trace(seed)),
          inputs(make_inputs(config, routing, seed)),
          experts(make_expert_data(config, seed)),
          expected(reference_results(config, inputs.view(), &experts)),
          device_inputs(inputs),
          outputs(config),
          combine(config, experts) {}
    std::string trace;
    Inputs inputs;
    ExpertData experts;
    Expected expected;
    DeviceInputs device_inputs;
    DeviceOutputs outputs;
    DeviceCombine combine;
  };
  struct Caller {
    EpConfig config;
    Routing routing;
    rocep::EpGroup group;
    rocep::Stream stream;
    std::vector<std::unique_ptr<Prepared>> steps;
  };
  const EpConfig configs[] = {make_config(2048, 8, 64 / world, 96), make_config(7168, 4, 256 / world, 64, 4)};
  const Routing routings[] = {Routing::kMasked, Routing::kUniform};
  std::vector<Caller> callers;
  for (int index = 0; index < 2; ++index) {
    callers.push_back({configs[index],
                       routings[index],
                       rocep::EpGroup(MPI_COMM_WORLD, configs[index], rocep::Backend::kGpu),
                       rocep::Stream(),
                       {}});
    for (int step = 0; step < kSteps; ++step) {
      callers.back().steps.push_back(
          std::make_unique<Prepared>(configs[index], routings[index], shared_seed()));
    }
  }
  std::vector<std::thread> threads;
  for (int index = 0; index < 2; ++index) {
    threads.emplace_back([&caller = callers[index], index] {
      SCOPED_TRACE("group " + std::to_string(index));
      if (const hipError_t status = hipSetDevice(caller.group.device()); status != hipSuccess) {
        ADD_FAILURE() << hipGetErrorString(status);
        return;
      }
      for (int step = 0; step < kSteps; ++step) {
        const Prepared& prepared = *caller.steps[step];
        SCOPED_TRACE("step " + std::to_string(step) + ", " + prepared.trace);
        const bool split = step % 2 == 1;
        try {
          dispatch_on(caller.group, prepared.device_inputs.view(), prepared.outputs.view(), split,
                      caller.stream.get());
          combine_on(caller.group, prepared.combine.args(prepared.outputs, true), split, caller.stream.get());
          caller.group.synchronize(caller.stream.get());
        } catch (const rocep::Error& error) {
          ADD_FAILURE() << error.what();
          return;
        }
        expect_dispatch_matches(caller.config, prepared.outputs, prepared.expected);
        expect_combined_matches(prepared.combine.out, prepared.expected.combined);
      }
    });
  }
  for (std::thread& thread : threads) {
    thread.join();
  }
}

}  // namespace
