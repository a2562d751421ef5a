// EpGroup through its public API only, over a Bootstrap that is not MPI (threads of this process as ranks),
// on the CPU reference: dispatch + combine against a naive model written here, on one group called again
// and again with new data and token counts (full, 1, 0, full), and the contract every backend shares: a
// rank's bad inputs stay local (it takes part with zero tokens, only it throws, its peers' results are
// correct and the group goes on), calls out of order are refused, and so is a call while another thread is
// inside one of the group (while a poll is answered), data errors are recorded for poll_error() /
// synchronize(), mixed weighted and unweighted combines are recorded.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "hip/bf16.hpp"
#include "mpi_support.hpp"
#include "rocep/rocep.hpp"
#include "thread_bootstrap.hpp"

namespace {

using rocep::bf16_bits;
using rocep::bf16_to_float;
using rocep::float_to_bf16;

constexpr int kHidden = 64;
constexpr int kTopK = 4;
constexpr int kExpertsPerRank = 3;
constexpr int kMaxTokens = 24;

rocep::EpConfig small_config(int world) {
  rocep::EpConfig config;
  config.hidden = kHidden;
  config.top_k = kTopK;
  config.num_experts = kExpertsPerRank * world;
  config.max_tokens_per_rank = kMaxTokens;
  return config;
}

// One call's inputs on every rank, drawn from one seed (so each thread can compute every rank's part).
struct Step {
  int world = 0;
  std::vector<int> num_tokens;                 // [world]
  std::vector<std::vector<bf16_bits>> tokens;  // [world][num_tokens * hidden]
  std::vector<std::vector<int32_t>> ids;       // [world][num_tokens * top_k]
  std::vector<std::vector<float>> weights;     // [world][num_tokens * top_k]
};

Step draw_step(int world, const std::vector<int>& num_tokens, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> value(-4.0f, 4.0f);
  std::uniform_real_distribution<float> weight(0.05f, 1.0f);
  Step step{world, num_tokens, {}, {}, {}};
  const int experts = kExpertsPerRank * world;
  for (int rank = 0; rank < world; ++rank) {
    std::vector<bf16_bits> tokens(static_cast<std::size_t>(num_tokens[rank]) * kHidden);
    for (bf16_bits& element : tokens) {
      element = float_to_bf16(value(rng));
    }
    std::vector<int32_t> ids;
    std::vector<float> weights;
    for (int token = 0; token < num_tokens[rank]; ++token) {
      std::vector<int32_t> all(experts);
      for (int expert = 0; expert < experts; ++expert) {
        all[expert] = expert;
      }
      std::shuffle(all.begin(), all.end(), rng);
      for (int k = 0; k < kTopK; ++k) {
        ids.push_back(rng() % 5 == 0 ? -1 : all[k]);  // some slots name no expert
        weights.push_back(weight(rng));
      }
    }
    step.tokens.push_back(std::move(tokens));
    step.ids.push_back(std::move(ids));
    step.weights.push_back(std::move(weights));
  }
  return step;
}

// What expert `expert` (global id) returns for token row `row`: each element scaled by a factor of its own.
bf16_bits expert_element(const bf16_bits* row, int expert, int column) {
  return float_to_bf16(bf16_to_float(row[column]) * (1.0f + 0.125f * static_cast<float>(expert)));
}

// Weighted combine of rank `rank`'s tokens by definition: per destination rank (ascending) the fma of its
// slots in ascending k, rounded to bf16; the partials summed in float32 in ascending rank order, rounded
// once.
std::vector<bf16_bits> naive_combine(const Step& step, int rank) {
  std::vector<bf16_bits> out(static_cast<std::size_t>(step.num_tokens[rank]) * kHidden);
  for (int token = 0; token < step.num_tokens[rank]; ++token) {
    const bf16_bits* row = step.tokens[rank].data() + static_cast<std::size_t>(token) * kHidden;
    const int32_t* ids = step.ids[rank].data() + static_cast<std::size_t>(token) * kTopK;
    const float* weights = step.weights[rank].data() + static_cast<std::size_t>(token) * kTopK;
    for (int column = 0; column < kHidden; ++column) {
      float sum = 0.0f;
      for (int destination = 0; destination < step.world; ++destination) {
        float partial = 0.0f;
        bool any = false;
        for (int k = 0; k < kTopK; ++k) {
          if (ids[k] >= 0 && ids[k] / kExpertsPerRank == destination) {
            partial = std::fma(weights[k], bf16_to_float(expert_element(row, ids[k], column)), partial);
            any = true;
          }
        }
        if (any) {
          sum += bf16_to_float(float_to_bf16(partial));
        }
      }
      out[static_cast<std::size_t>(token) * kHidden + column] = float_to_bf16(sum);
    }
  }
  return out;
}

// Where one rank's dispatch writes and what its experts return, poisoned before every call.
struct RankBuffers {
  explicit RankBuffers(const rocep::EpGroup& group)
      : rows(group.max_recv_rows()),
        recv_tokens(rows * kHidden, 0xffff),
        row_offsets(group.num_local_experts() + 1, 0xdeadbeef),
        expert_ids(group.num_local_experts(), -7),
        src_info(rows, rocep::SrcInfo{-7, -7, -7}),
        recv_weights(rows, -1.0f),
        expert_outputs(rows * kHidden, 0xffff),
        out(static_cast<std::size_t>(kMaxTokens) * kHidden, 0xffff) {}

  rocep::DispatchOutputs outputs() {
    return {recv_tokens.data(), row_offsets.data(), expert_ids.data(), src_info.data(), recv_weights.data()};
  }
  // The experts of this rank: every dispatched row through its expert.
  void run_experts(int rank) {
    for (std::size_t expert = 0; expert + 1 < row_offsets.size(); ++expert) {
      for (uint32_t row = row_offsets[expert]; row < row_offsets[expert + 1]; ++row) {
        for (int column = 0; column < kHidden; ++column) {
          expert_outputs[row * kHidden + column] = expert_element(
              recv_tokens.data() + row * kHidden, rank * kExpertsPerRank + static_cast<int>(expert), column);
        }
      }
    }
  }

  std::size_t rows;
  std::vector<bf16_bits> recv_tokens;
  std::vector<uint32_t> row_offsets;
  std::vector<int32_t> expert_ids;
  std::vector<rocep::SrcInfo> src_info;
  std::vector<float> recv_weights;
  std::vector<bf16_bits> expert_outputs;
  std::vector<bf16_bits> out;
};

// Runs body(rank, group) on `world` threads, each with its own group over one ThreadRendezvous.
void on_thread_ranks(int world, const std::function<void(int, rocep::EpGroup&)>& body) {
  auto rendezvous = std::make_shared<rocep::testing::ThreadRendezvous>(world);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      rocep::EpGroup group(std::make_shared<rocep::testing::ThreadBootstrap>(rendezvous, rank),
                           small_config(world), rocep::Backend::kCpuReference);
      body(rank, group);
    });
  }
  for (std::thread& thread : threads) {
    thread.join();
  }
}

// `call` refused before anything was issued: an InvalidInputError with issued() false whose message names
// `named`; `accepted` is the failure reported if it returns.
template <typename Call>
void expect_refused(const Call& call, const std::string& named, const char* accepted) {
  try {
    call();
    ADD_FAILURE() << accepted;
  } catch (const rocep::InvalidInputError& error) {
    EXPECT_FALSE(error.issued()) << error.what();
    EXPECT_NE(std::string(error.what()).find(named), std::string::npos) << error.what();
  }
}

// One dispatch + experts + weighted combine of `step` on this rank; returns the first num_tokens rows of out.
std::vector<bf16_bits> run_step(rocep::EpGroup& group, const Step& step, int rank, int passed_tokens) {
  RankBuffers buffers(group);
  const rocep::DispatchInputs inputs{step.tokens[rank].data(), step.ids[rank].data(),
                                     step.weights[rank].data(), passed_tokens};
  group.dispatch(inputs, buffers.outputs());
  buffers.run_experts(rank);
  group.combine({buffers.expert_outputs.data(), buffers.recv_weights.data(), nullptr, buffers.out.data()});
  const auto end = buffers.out.begin() + static_cast<std::ptrdiff_t>(step.num_tokens[rank]) * kHidden;
  EXPECT_TRUE(std::all_of(end, buffers.out.end(), [](bf16_bits value) { return value == 0xffff; }))
      << "rank " << rank << ": combine wrote past its tokens";
  return {buffers.out.begin(), end};
}

TEST(EpGroupOverThreadsTest, ConsecutiveCallsMatchTheNaiveModel) {
  const uint64_t seed = rocep::testing::fresh_seed();
  for (int world = 2; world <= 4; ++world) {
    // Token counts per call: full on every rank, one, none, then full again, on the same group.
    const std::vector<std::vector<int>> counts = {std::vector<int>(world, kMaxTokens),
                                                  std::vector<int>(world, 1), std::vector<int>(world, 0),
                                                  std::vector<int>(world, kMaxTokens)};
    on_thread_ranks(world, [&](int rank, rocep::EpGroup& group) {
      EXPECT_EQ(group.world_size(), world);
      EXPECT_EQ(group.device(), -1) << "the CPU reference is on no GPU";
      for (std::size_t call = 0; call < counts.size(); ++call) {
        const Step step = draw_step(world, counts[call], seed + 1000 * world + call);
        EXPECT_EQ(run_step(group, step, rank, step.num_tokens[rank]), naive_combine(step, rank))
            << "world " << world << ", call " << call << ", rank " << rank << ", "
            << rocep::testing::seed_trace(seed);
      }
    });
  }
}

TEST(EpGroupOverThreadsTest, BadInputsStayOnTheirRank) {
  const uint64_t seed = rocep::testing::fresh_seed();
  constexpr int kWorld = 3;
  constexpr int kBadRank = 1;
  on_thread_ranks(kWorld, [&](int rank, rocep::EpGroup& group) {
    for (int call = 0; call < 3; ++call) {
      Step step = draw_step(kWorld, std::vector<int>(kWorld, kMaxTokens / 2), seed + call);
      // Call 0: the bad rank passes a count past the maximum; call 1: a null ids pointer; call 2: valid.
      const bool bad = rank == kBadRank && call < 2;
      int passed = step.num_tokens[rank];
      if (rank == kBadRank && call == 0) {
        passed = kMaxTokens + 1;
      }
      if (rank == kBadRank && call == 1) {
        step.ids[rank].clear();  // data() may then be null: passed as null below
      }
      Step expected = step;
      if (bad) {
        expected.num_tokens[rank] = 0;  // it takes part with zero tokens
      }
      RankBuffers buffers(group);
      const rocep::DispatchInputs inputs{step.tokens[rank].data(),
                                         call == 1 && bad ? nullptr : step.ids[rank].data(),
                                         step.weights[rank].data(), passed};
      bool threw = false;
      try {
        group.dispatch(inputs, buffers.outputs());
      } catch (const rocep::InvalidInputError& error) {
        threw = true;
        EXPECT_TRUE(error.issued()) << "bad inputs take part with zero tokens: " << error.what();
        EXPECT_NE(std::string(error.what()).find("rank " + std::to_string(rank)), std::string::npos)
            << error.what();
        if (call == 1) {  // the null argument by name, in the words of the call the rank made
          EXPECT_EQ(std::string(error.what()), "dispatch: rank 1 passed a null topk_ids pointer");
        }
      }
      EXPECT_EQ(threw, bad) << "rank " << rank << ", call " << call;
      buffers.run_experts(rank);
      group.combine(
          {buffers.expert_outputs.data(), buffers.recv_weights.data(), nullptr, buffers.out.data()});
      const std::vector<bf16_bits> out(
          buffers.out.begin(),
          buffers.out.begin() + static_cast<std::ptrdiff_t>(expected.num_tokens[rank]) * kHidden);
      EXPECT_EQ(out, naive_combine(expected, rank))
          << "rank " << rank << ", call " << call << ", " << rocep::testing::seed_trace(seed);
      EXPECT_FALSE(group.poll_error()) << group.poll_error().message;
    }
  });
}

// A bad output of a fused dispatch is refused on its rank before anything is issued (issued() false): the
// rank repeats the call with valid outputs, and every rank's combine is then the one of the data sent.
TEST(EpGroupOverThreadsTest, ABadDispatchOutputIsRefusedAndTheCallRepeated) {
  const uint64_t seed = rocep::testing::fresh_seed();
  constexpr int kBadRank = 1;
  on_thread_ranks(2, [&](int rank, rocep::EpGroup& group) {
    const Step step = draw_step(2, {kMaxTokens / 2, kMaxTokens / 3}, seed);
    RankBuffers buffers(group);
    const rocep::DispatchInputs inputs{step.tokens[rank].data(), step.ids[rank].data(),
                                       step.weights[rank].data(), step.num_tokens[rank]};
    if (rank == kBadRank) {
      rocep::DispatchOutputs bad = buffers.outputs();
      bad.recv_tokens = nullptr;
      expect_refused([&] { group.dispatch(inputs, bad); }, "recv_tokens", "a null recv_tokens was accepted");
    }
    EXPECT_EQ(run_step(group, step, rank, step.num_tokens[rank]), naive_combine(step, rank))
        << "rank " << rank << ", " << rocep::testing::seed_trace(seed);
  });
}

TEST(EpGroupOverThreadsTest, CallsOutOfOrderAreRefusedAndChangeNothing) {
  const uint64_t seed = rocep::testing::fresh_seed();
  on_thread_ranks(2, [&](int rank, rocep::EpGroup& group) {
    RankBuffers buffers(group);
    const rocep::CombineArgs combine_args{buffers.expert_outputs.data(), buffers.recv_weights.data(), nullptr,
                                          buffers.out.data()};
    EXPECT_THROW(group.combine(combine_args), rocep::CallOrderError);
    EXPECT_THROW(group.dispatch_recv(buffers.outputs()), rocep::CallOrderError);
    const Step step = draw_step(2, {5, 7}, seed);
    group.dispatch_send(
        {step.tokens[rank].data(), step.ids[rank].data(), step.weights[rank].data(), step.num_tokens[rank]});
    EXPECT_THROW(group.dispatch_send({}), rocep::CallOrderError);
    EXPECT_THROW(group.combine_send(combine_args), rocep::CallOrderError);
    group.dispatch_recv(buffers.outputs());
    buffers.run_experts(rank);
    group.combine_send(combine_args);
    EXPECT_THROW(group.dispatch({}, buffers.outputs()), rocep::CallOrderError);
    // A receive through a caller's device epilogue is the GPU backend's: refused here, launching nothing.
    static std::atomic<bool> launched{false};
    const rocep::CombineReceiveLauncher launcher{[](const void*, const void*, int, void*, const void*) {
                                                   launched = true;
                                                   return 0;
                                                 },
                                                 &launched};
    expect_refused([&] { group.combine_recv_with(combine_args, launcher); }, "CPU reference",
                   "combine_recv_with on the CPU reference was not refused");
    EXPECT_FALSE(launched);
    group.combine_recv(combine_args);
    const std::vector<bf16_bits> out(buffers.out.begin(),
                                     buffers.out.begin() + step.num_tokens[rank] * kHidden);
    EXPECT_EQ(out, naive_combine(step, rank)) << rocep::testing::seed_trace(seed);
  });
}

// Rank 0's dispatch waits inside its group for rank 1 (in the bootstrap's all-gather); meanwhile the thread
// of rank 1 calls rank 0's group: dispatch_recv is refused with CallOrderError naming the dispatch, and
// poll_error, which any thread may call at any time, reads what rank 0's send recorded before it waited (an
// expert id out of range). Rank 0's calls then go on as if the others had not been made. Rank 1 tries
// dispatch_recv until the dispatch is inside, so rank 0's dispatch may meet one of those tries inside the
// group: refused too, nothing issued, and made again.
TEST(EpGroupOverThreadsTest, ACallWhileAnotherThreadIsInsideOneOfTheGroupIsRefusedAndAPollAnswered) {
  const uint64_t seed = rocep::testing::fresh_seed();
  std::atomic<rocep::EpGroup*> first_group{nullptr};
  on_thread_ranks(2, [&](int rank, rocep::EpGroup& group) {
    Step step = draw_step(2, {kMaxTokens / 2, kMaxTokens / 3}, seed);
    Step expected = step;
    step.ids[0][2 * kTopK + 1] = 1000;    // rank 0's token 2, slot 1: out of range
    expected.ids[0][2 * kTopK + 1] = -1;  // every rank's model: that slot is not dispatched
    if (rank == 0) {
      first_group = &group;
      std::vector<bf16_bits> out;
      for (bool done = false; !done;) {
        try {
          out = run_step(group, step, rank, step.num_tokens[rank]);
          done = true;
        } catch (const rocep::CallOrderError& error) {
          EXPECT_NE(std::string(error.what()).find("another thread is inside EpGroup::dispatch_recv of"),
                    std::string::npos)
              << error.what();
        }
      }
      EXPECT_EQ(out, naive_combine(expected, rank)) << "rank 0, " << rocep::testing::seed_trace(seed);
      EXPECT_THROW(group.synchronize(), rocep::InvalidInputError) << "rank 0 recorded nothing";
    } else {
      rocep::EpGroup* other = nullptr;
      while ((other = first_group.load()) == nullptr) {
        std::this_thread::yield();
      }
      // Rank 0's dispatch cannot end before this rank's joins it.
      RankBuffers buffers(group);
      std::string message;
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (message.find("inside EpGroup::dispatch of") == std::string::npos &&
             std::chrono::steady_clock::now() < deadline) {
        try {
          other->dispatch_recv(buffers.outputs());
          ADD_FAILURE() << "a dispatch_recv of rank 0's group was taken";
          break;
        } catch (const rocep::CallOrderError& error) {
          message = error.what();
        }
        std::this_thread::yield();
      }
      EXPECT_EQ(
          message,
          "EpGroup::dispatch_recv on rank 0: another thread is inside EpGroup::dispatch of this group; one "
          "group's calls must not overlap in time (call it from one thread, or from threads taking turns "
          "under a lock); nothing was issued");
      rocep::RecordedError recorded;
      while (!recorded && std::chrono::steady_clock::now() < deadline) {
        recorded = other->poll_error();  // the dispatch entered before its send recorded the id
        std::this_thread::yield();
      }
      EXPECT_EQ(recorded.kind, rocep::RecordedError::Kind::kInvalidInput) << recorded.message;
      EXPECT_NE(recorded.message.find("token 2, slot 1: expert id 1000"), std::string::npos)
          << recorded.message;
      EXPECT_EQ(run_step(group, step, rank, step.num_tokens[rank]), naive_combine(expected, rank))
          << "rank 1, " << rocep::testing::seed_trace(seed);
    }
    EXPECT_FALSE(group.poll_error()) << group.poll_error().message;
  });
}

// A rank's bootstrap whose next all-gather, once held, waits for release() before it joins the others.
class HeldBootstrap final : public rocep::Bootstrap {
 public:
  explicit HeldBootstrap(std::shared_ptr<rocep::Bootstrap> ranks) : ranks_(std::move(ranks)) {}
  int rank() const override { return ranks_->rank(); }
  int size() const override { return ranks_->size(); }
  void all_gather(const void* mine, void* all, std::size_t bytes_per_rank) override {
    if (held_.exchange(false)) {
      std::unique_lock<std::mutex> lock(mutex_);
      waiting_ = true;
      changed_.notify_all();
      changed_.wait(lock, [&] { return released_; });
    }
    ranks_->all_gather(mine, all, bytes_per_rank);
  }
  void barrier() override { ranks_->barrier(); }

  void hold() { held_ = true; }
  void wait_until_held() {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return waiting_; });
  }
  void release() {
    const std::lock_guard<std::mutex> lock(mutex_);
    released_ = true;
    changed_.notify_all();
  }

 private:
  std::shared_ptr<rocep::Bootstrap> ranks_;
  std::atomic<bool> held_{false};
  std::mutex mutex_;
  std::condition_variable changed_;
  bool waiting_ = false;
  bool released_ = false;
};

// close() while a second thread of rank 1 is inside a dispatch (held in its bootstrap's all-gather): refused
// on both ranks, naming rank 1, nothing released. The dispatch then goes on, its step matches the naive
// model, and close() releases the group on both ranks: every later call, poll_error included, throws
// CallOrderError, and close() again does nothing.
TEST(EpGroupOverThreadsTest, CloseIsRefusedOnEveryRankWhileAThreadIsInsideACallThenReleasesTheGroup) {
  const uint64_t seed = rocep::testing::fresh_seed();
  const Step step = draw_step(2, {kMaxTokens, kMaxTokens / 2}, seed);
  auto rendezvous = std::make_shared<rocep::testing::ThreadRendezvous>(2);
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    ranks.emplace_back([&, rank] {
      auto bootstrap = std::make_shared<HeldBootstrap>(
          std::make_shared<rocep::testing::ThreadBootstrap>(rendezvous, rank));
      rocep::EpGroup group(bootstrap, small_config(2), rocep::Backend::kCpuReference);
      std::vector<bf16_bits> out;
      std::thread caller;
      if (rank == 1) {
        bootstrap->hold();
        caller = std::thread([&] { out = run_step(group, step, rank, step.num_tokens[rank]); });
        bootstrap->wait_until_held();
      }
      try {
        group.close();
        ADD_FAILURE() << "rank " << rank << ": close() was taken while rank 1's dispatch was inside";
      } catch (const rocep::CallOrderError& error) {
        EXPECT_EQ(
            std::string(error.what()),
            "EpGroup::close on rank " + std::to_string(rank) +
                ": refused on every rank, nothing released: another thread is inside a call of the group "
                "on rank(s) 1" +
                (rank == 1 ? " (here EpGroup::dispatch)" : "") +
                "; close it once no other thread is inside one of its calls");
      }
      if (rank == 1) {
        bootstrap->release();
        caller.join();
      } else {
        out = run_step(group, step, rank, step.num_tokens[rank]);
      }
      EXPECT_EQ(out, naive_combine(step, rank))
          << "rank " << rank << ", " << rocep::testing::seed_trace(seed);
      group.close();
      const std::string closed =
          "EpGroup: this group was closed (EpGroup::close()); create a new group to go on";
      for (const auto& call : std::vector<std::function<void()>>{
               [&] { run_step(group, step, rank, step.num_tokens[rank]); }, [&] { group.poll_error(); },
               [&] { group.synchronize(); }, [&] { group.dispatch_input_buffer(); }, [&] { group.rank(); }}) {
        try {
          call();
          ADD_FAILURE() << "rank " << rank << ": a call of a closed group was taken";
        } catch (const rocep::CallOrderError& error) {
          EXPECT_EQ(std::string(error.what()), closed);
        }
      }
      EXPECT_NO_THROW(group.close()) << "a second close does nothing";
    });
  }
  for (std::thread& rank : ranks) {
    rank.join();
  }
}

TEST(EpGroupOverThreadsTest, InvalidExpertIdsAreRecordedAndTheirSlotsDropped) {
  const uint64_t seed = rocep::testing::fresh_seed();
  on_thread_ranks(2, [&](int rank, rocep::EpGroup& group) {
    Step step = draw_step(2, {6, 6}, seed);
    Step expected = step;
    if (rank == 0) {
      step.ids[0][2 * kTopK + 1] = 1000;  // token 2, slot 1: out of range
    }
    expected.ids[0][2 * kTopK + 1] = -1;  // every rank's model: that slot is not dispatched
    EXPECT_EQ(run_step(group, step, rank, step.num_tokens[rank]), naive_combine(expected, rank))
        << rocep::testing::seed_trace(seed);
    const rocep::RecordedError recorded = group.poll_error();
    EXPECT_EQ(static_cast<bool>(recorded), rank == 0);
    if (rank == 0) {
      EXPECT_NE(recorded.message.find("token 2, slot 1: expert id 1000"), std::string::npos)
          << recorded.message;
      EXPECT_EQ(recorded.message.find("dispatch_send (the send half of dispatch) on rank 0"), 0u)
          << recorded.message;
      EXPECT_TRUE(group.poll_error()) << "poll_error() must not clear";
      try {
        group.synchronize();
        ADD_FAILURE() << "synchronize() did not throw what was recorded";
      } catch (const rocep::InvalidInputError& error) {
        EXPECT_TRUE(error.issued()) << "recorded while the call ran: " << error.what();
      }
    }
    EXPECT_FALSE(group.poll_error()) << "synchronize() clears what it threw";
    EXPECT_NO_THROW(group.synchronize());
  });
}

TEST(EpGroupOverThreadsTest, MixedWeightedCombinesAreRecordedOnEveryRank) {
  const uint64_t seed = rocep::testing::fresh_seed();
  on_thread_ranks(2, [&](int rank, rocep::EpGroup& group) {
    const Step step = draw_step(2, {4, 4}, seed);
    RankBuffers buffers(group);
    group.dispatch({step.tokens[rank].data(), step.ids[rank].data(), step.weights[rank].data(), 4},
                   buffers.outputs());
    buffers.run_experts(rank);
    std::vector<bf16_bits> unreduced(static_cast<std::size_t>(kMaxTokens) * kTopK * kHidden);
    group.combine({buffers.expert_outputs.data(), rank == 0 ? buffers.recv_weights.data() : nullptr, nullptr,
                   rank == 0 ? buffers.out.data() : unreduced.data()});
    EXPECT_THROW(group.synchronize(), rocep::InvalidInputError) << "rank " << rank;
    // The group goes on: the next step agrees again.
    EXPECT_EQ(run_step(group, step, rank, 4), naive_combine(step, rank));
  });
}

// The ConfigError each rank of a group of `world` threads saw creating it, rank r with config_of(r) and
// backend_of(r) ("" where none).
std::vector<std::string> creation_errors(int world, const std::function<rocep::EpConfig(int)>& config_of,
                                         const std::function<rocep::Backend(int)>& backend_of) {
  auto rendezvous = std::make_shared<rocep::testing::ThreadRendezvous>(world);
  std::vector<std::string> errors(world);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        rocep::EpGroup group(std::make_shared<rocep::testing::ThreadBootstrap>(rendezvous, rank),
                             config_of(rank), backend_of(rank));
      } catch (const rocep::ConfigError& error) {
        errors[rank] = error.what();
      }
    });
  }
  for (std::thread& thread : threads) {
    thread.join();
  }
  return errors;
}

// The same, every rank passing `config` and `backend`.
std::vector<std::string> creation_errors(int world, const rocep::EpConfig& config, rocep::Backend backend) {
  return creation_errors(
      world, [&](int) { return config; }, [&](int) { return backend; });
}

// The step of creation that checks the agreed config: its failures name the rank and the step, as the other
// steps' do.
constexpr const char* kValidationFailure =
    "EpGroup: rank 0 failed at validating the EpConfig, backend and ROCEP_GPUS_PER_NODE: ";

// ROCEP_GPUS_PER_NODE stands in for EpConfig::gpus_per_node = 0 at creation: a value that is no positive
// integer, or does not divide the world, is refused naming the variable, on every rank alike; a value the
// caller's config overrides is not read.
TEST(EpGroupOverThreadsTest, GpusPerNodeFromTheEnvironmentIsCheckedAtCreation) {
  const auto errors_with = [](int gpus_per_node) {
    constexpr int kWorld = 4;
    rocep::EpConfig config = small_config(kWorld);
    config.gpus_per_node = gpus_per_node;
    return creation_errors(kWorld, config, rocep::Backend::kCpuReference);
  };
  ASSERT_EQ(setenv("ROCEP_GPUS_PER_NODE", "two", 1), 0);
  for (const std::string& error : errors_with(0)) {
    EXPECT_EQ(error.find(std::string(kValidationFailure) + "ROCEP_GPUS_PER_NODE='two' is invalid"), 0u)
        << error;
  }
  ASSERT_EQ(setenv("ROCEP_GPUS_PER_NODE", "3", 1), 0);
  for (const std::string& error : errors_with(0)) {
    EXPECT_NE(error.find("ROCEP_GPUS_PER_NODE='3' is invalid"), std::string::npos) << error;
    EXPECT_NE(error.find("divides the world size 4"), std::string::npos) << error;
  }
  for (const std::string& error : errors_with(2)) {  // the config's own value: the variable unread
    EXPECT_EQ(error, "");
  }
  ASSERT_EQ(setenv("ROCEP_GPUS_PER_NODE", "2", 1), 0);
  for (const std::string& error : errors_with(0)) {
    EXPECT_EQ(error, "");
  }
  ASSERT_EQ(unsetenv("ROCEP_GPUS_PER_NODE"), 0);
}

// Every rank passing the same NaN timeout is told of the timeout, not of ranks that disagree; a backend
// outside the enum is refused naming the allowed values. Alike on every rank.
TEST(EpGroupOverThreadsTest, ANanTimeoutAndAnUnknownBackendAreRefusedByName) {
  constexpr int kWorld = 2;
  rocep::EpConfig nan_timeout = small_config(kWorld);
  nan_timeout.timeout_seconds = std::nan("");
  for (const std::string& error : creation_errors(kWorld, nan_timeout, rocep::Backend::kCpuReference)) {
    EXPECT_EQ(error.find(std::string(kValidationFailure) + "EpConfig.timeout_seconds = nan is invalid"), 0u)
        << error;
    EXPECT_EQ(error.find("different"), std::string::npos) << error;
  }
  for (const std::string& error :
       creation_errors(kWorld, small_config(kWorld), static_cast<rocep::Backend>(7))) {
    EXPECT_EQ(error, std::string(kValidationFailure) +
                         "backend = 7 is invalid: allowed values are 0 (auto), 1 (gpu), 2 (cpu-reference)");
  }
}

// A config valid on every rank but not alike (or a backend not alike) is refused on every rank, naming the
// first rank that differs from rank 0 and each field in which it does, with both values. A NaN timeout on
// one rank differs from rank 0's number; the same NaN on every rank agrees (the test above).
TEST(EpGroupOverThreadsTest, ConfigsOrBackendsThatDifferAreRefusedNamingEachField) {
  constexpr int kWorld = 3;
  const auto config_of = [](int rank) {
    rocep::EpConfig config = small_config(kWorld);
    if (rank == 2) {
      config.hidden = kHidden + 8;
      config.timeout_seconds = std::nan("");
      config.layout = rocep::Layout::kPerToken;
    }
    return config;
  };
  const auto cpu_reference = [](int) { return rocep::Backend::kCpuReference; };
  for (const std::string& error : creation_errors(kWorld, config_of, cpu_reference)) {
    EXPECT_EQ(
        error.find("EpGroup: rank 2 differs from rank 0 in EpConfig.hidden (72 on rank 2, 64 on rank 0), "
                   "EpConfig.timeout_seconds (nan on rank 2, 10 on rank 0), EpConfig.layout (per-token "
                   "on rank 2, expanded on rank 0); every rank must pass the same EpConfig and backend and "
                   "see the same ROCEP_GPUS_PER_NODE"),
        0u)
        << error;
  }
  const auto same_config = [](int) { return small_config(kWorld); };
  const auto auto_on_rank_1 = [](int rank) {
    return rank == 1 ? rocep::Backend::kAuto : rocep::Backend::kCpuReference;
  };
  for (const std::string& error : creation_errors(kWorld, same_config, auto_on_rank_1)) {
    EXPECT_EQ(error.find("EpGroup: rank 1 differs from rank 0 in backend (auto on rank 1, cpu-reference on "
                         "rank 0); every rank must pass the same"),
              0u)
        << error;
  }
}

// A config that every rank passes alike but that is invalid: refused on every rank, naming the rank and the
// step of creation that failed, as a failure in any other step is.
TEST(EpGroupOverThreadsTest, AnInvalidConfigIsRefusedNamingTheRankAndTheStep) {
  constexpr int kWorld = 2;
  rocep::EpConfig config = small_config(kWorld);
  config.num_experts = 3;
  for (const std::string& error : creation_errors(kWorld, config, rocep::Backend::kCpuReference)) {
    EXPECT_EQ(error, std::string(kValidationFailure) +
                         "EpConfig.num_experts = 3 is invalid: must be divisible by the world size 2");
  }
}

// A bootstrap whose all_gather fails from its `first_failing`-th call on (counted from 1), as a launcher's
// store does once it is gone; its failure is no rocep::Error.
class FailingBootstrap final : public rocep::Bootstrap {
 public:
  FailingBootstrap(std::shared_ptr<rocep::testing::ThreadRendezvous> rendezvous, int rank, int first_failing)
      : threads_(std::move(rendezvous), rank), first_failing_(first_failing) {}
  int rank() const override { return threads_.rank(); }
  int size() const override { return threads_.size(); }
  void all_gather(const void* mine, void* all, std::size_t bytes_per_rank) override {
    if (++calls_ >= first_failing_) {
      throw std::runtime_error("the store is gone");
    }
    threads_.all_gather(mine, all, bytes_per_rank);
  }
  void barrier() override { threads_.barrier(); }

 private:
  rocep::testing::ThreadBootstrap threads_;
  int first_failing_;
  int calls_ = 0;
};

// Whatever the caller's bootstrap throws reaches the caller as a BootstrapError naming the rank and the
// collective, at each of creation's all-gathers and in the CPU reference's dispatch that moves its messages
// through the bootstrap: never the bootstrap's own exception, which a server catching rocep::Error misses.
TEST(EpGroupOverThreadsTest, ABootstrapThatFailsThrowsBootstrapErrorAtCreationAndInCalls) {
  constexpr int kWorld = 2;
  const uint64_t seed = rocep::testing::fresh_seed();
  bool created = false;
  for (int first_failing = 1; !created; ++first_failing) {
    ASSERT_LE(first_failing, 16) << "creation took more than 15 all-gathers";
    auto rendezvous = std::make_shared<rocep::testing::ThreadRendezvous>(kWorld);
    std::vector<std::string> errors(kWorld);
    std::vector<int> made(kWorld, 0);
    std::vector<std::thread> threads;
    for (int rank = 0; rank < kWorld; ++rank) {
      threads.emplace_back([&, rank] {
        try {
          rocep::EpGroup group(std::make_shared<FailingBootstrap>(rendezvous, rank, first_failing),
                               small_config(kWorld), rocep::Backend::kCpuReference);
          made[rank] = 1;
          run_step(group, draw_step(kWorld, {5, 7}, seed), rank, rank == 0 ? 5 : 7);
        } catch (const rocep::BootstrapError& error) {
          errors[rank] = error.what();
        } catch (const std::exception& error) {
          errors[rank] = std::string("not a BootstrapError: ") + error.what();
        }
      });
    }
    for (std::thread& thread : threads) {
      thread.join();
    }
    created = made[0] == 1;
    for (int rank = 0; rank < kWorld; ++rank) {
      EXPECT_EQ(made[rank], made[0]) << "all-gather " << first_failing;
      EXPECT_EQ(errors[rank].find("EpGroup: rank " + std::to_string(rank) +
                                  ": the bootstrap's all_gather failed: the store is gone"),
                0u)
          << "all-gather " << first_failing << ": " << errors[rank];
    }
  }
}

#if defined(ROCEP_TEST_NO_GPU_PLATFORM)
// Asked for the GPU backend in a build without one, every rank throws the same ConfigError, naming the
// first rank without a GPU; kAuto takes the CPU reference.
TEST(EpGroupOverThreadsTest, TheGpuBackendInABuildWithoutOneIsRefusedOnEveryRank) {
  constexpr int kWorld = 2;
  for (const std::string& error : creation_errors(kWorld, small_config(kWorld), rocep::Backend::kGpu)) {
    EXPECT_EQ(
        error.find("EpGroup: rank 0 failed at choosing the backend: backend gpu is not available there"), 0u)
        << error;
  }
  for (const std::string& error : creation_errors(kWorld, small_config(kWorld), rocep::Backend::kAuto)) {
    EXPECT_EQ(error, "");
  }
}
#endif

}  // namespace
