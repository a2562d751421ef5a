// ReferenceEp, the CPU reference of dispatch and combine over MPI, against a naive single-process model
// written here. Every rank draws the inputs of every rank from one seed (drawn by rank 0, broadcast), so
// each rank can compute its own expected outputs without communication; expert outputs are a hash of
// (source rank, source token, slot, column) for the same reason. Every output buffer is poisoned before a
// call and compared bit for bit, the rows past the last written one included.
#include "host/reference.hpp"

#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <iterator>
#include <limits>
#include <memory>
#include <numeric>
#include <optional>
#include <ostream>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "hip/bf16.hpp"
#include "hip/codecs.hpp"
#include "hip/scale_layout.hpp"
#include "host/codecs.hpp"
#include "mpi_support.hpp"
#include "per_token_outputs.hpp"
#include "rocep/config.hpp"
#include "rocep/ep_group.hpp"
#include "rocep/errors.hpp"
#include "rocep/mpi.hpp"
#include "rocep/types.hpp"

namespace {

using rocep::testing::shared_seed;
using rocep::testing::world_rank;
using rocep::testing::world_size;

using rocep::bf16_bits;
using rocep::EpConfig;
using rocep::SrcInfo;
using rocep::reference::ReferenceEp;

// The bootstrap of every ReferenceEp here: MPI_COMM_WORLD's, made once after MPI_Init.
rocep::Bootstrap& world_bootstrap() {
  static rocep::MpiBootstrap bootstrap(MPI_COMM_WORLD);
  return bootstrap;
}

constexpr uint8_t kPoison = 0xA5;
constexpr bf16_bits kBf16NaN = 0x7FC0;

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A bf16 that depends only on the seed and the indices: random sign, magnitude in [2^-12, 2^13). Over that
// range float32 sums of bf16 values round, so a change in the order of the partial sums shows.
bf16_bits hashed_bf16(uint64_t seed, std::initializer_list<int64_t> indices) {
  uint64_t state = seed;
  for (int64_t index : indices) {
    state = splitmix64(state ^ static_cast<uint64_t>(index));
  }
  const int exponent = static_cast<int>(state % 25) - 12;
  const float mantissa = 1.0f + static_cast<float>((state >> 32) & 0xffff) / 65536.0f;
  const float sign = (state >> 63) != 0 ? -1.0f : 1.0f;
  return rocep::float_to_bf16(sign * std::ldexp(mantissa, exponent));
}

// What the experts return for slot k of token t of source rank s, and the shared expert's row of that token.
bf16_bits expert_output(uint64_t seed, int source, int token, int k, int column) {
  return hashed_bf16(seed, {1, source, token, k, column});
}
bf16_bits shared_expert_output(uint64_t seed, int source, int token, int column) {
  return hashed_bf16(seed, {2, source, token, column});
}

template <typename T>
std::vector<T> poisoned(std::size_t count) {
  std::vector<T> values(count);
  std::memset(values.data(), kPoison, count * sizeof(T));
  return values;
}

// Elements [first, end) of `values` still hold the poison.
template <typename T>
bool still_poisoned(const std::vector<T>& values, std::size_t first) {
  const auto* bytes = reinterpret_cast<const uint8_t*>(values.data());
  return std::all_of(bytes + first * sizeof(T), bytes + values.size() * sizeof(T),
                     [](uint8_t byte) { return byte == kPoison; });
}

template <typename T>
bool same_bytes(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// `message` names `word` followed by exactly `number` ("token 3", not "token 31").
::testing::AssertionResult names(const std::string& message, const std::string& word, int number) {
  const std::string needle = word + " " + std::to_string(number);
  for (std::size_t at = message.find(needle); at != std::string::npos; at = message.find(needle, at + 1)) {
    const std::size_t end = at + needle.size();
    if (end == message.size() || !std::isdigit(static_cast<unsigned char>(message[end]))) {
      return ::testing::AssertionSuccess();
    }
  }
  return ::testing::AssertionFailure() << "\"" << message << "\" does not name " << needle;
}

enum class Routing {
  kUniform,       // random token counts, top_k distinct random experts per token
  kMasked,        // as kUniform with about a quarter of the slots -1
  kUnevenCounts,  // random counts, and rank 1 (rank 0 at one rank) has no tokens
  kOneExpert,     // every token: slot 0 is expert 0, the other slots -1
  kHotExperts,    // every token names the same top_k experts, in its own order
  kFull,          // max_tokens_per_rank tokens on every rank
};

const char* to_string(Routing routing) {
  switch (routing) {
    case Routing::kUniform:
      return "Uniform";
    case Routing::kMasked:
      return "Masked";
    case Routing::kUnevenCounts:
      return "UnevenCounts";
    case Routing::kOneExpert:
      return "OneExpert";
    case Routing::kHotExperts:
      return "HotExperts";
    case Routing::kFull:
      return "Full";
  }
  return "Unknown";
}

// A config at any world size: num_experts = experts_per_rank * world, so top_k <= experts_per_rank keeps
// top_k <= num_experts.
struct Shape {
  int hidden;
  int top_k;
  int experts_per_rank;
  int max_tokens_per_rank;
  int expert_alignment;
};

std::string to_string(const Shape& shape) {
  return "h" + std::to_string(shape.hidden) + "_k" + std::to_string(shape.top_k) + "_e" +
         std::to_string(shape.experts_per_rank) + "PerRank_t" + std::to_string(shape.max_tokens_per_rank) +
         "_a" + std::to_string(shape.expert_alignment);
}

// Readable parameters in gtest's failure lines.
void PrintTo(Routing routing, std::ostream* stream) {
  *stream << to_string(routing);
}
void PrintTo(const Shape& shape, std::ostream* stream) {
  *stream << to_string(shape);
}

// One rank's dispatch inputs.
struct RankInputs {
  int num_tokens = 0;
  std::vector<bf16_bits> tokens;    // [num_tokens, hidden]
  std::vector<int32_t> topk_ids;    // [num_tokens, top_k]
  std::vector<float> topk_weights;  // [num_tokens, top_k]

  rocep::DispatchInputs view() const {
    rocep::DispatchInputs inputs;
    inputs.tokens = tokens.data();
    inputs.topk_ids = topk_ids.data();
    inputs.topk_weights = topk_weights.data();
    inputs.num_tokens = num_tokens;
    return inputs;
  }
};

// The first `count` values of a random permutation of `values` (partial Fisher-Yates).
std::vector<int32_t> draw_distinct(std::vector<int32_t> values, int count, std::mt19937_64& rng) {
  for (int i = 0; i < count; ++i) {
    std::uniform_int_distribution<int> pick(i, static_cast<int>(values.size()) - 1);
    std::swap(values[i], values[pick(rng)]);
  }
  values.resize(count);
  return values;
}

// One routing problem: the config at this world size and the inputs of every rank.
struct Problem {
  Problem(const Shape& shape, Routing routing)
      : seed(shared_seed()), world(world_size()), rank(world_rank()) {
    config.hidden = shape.hidden;
    config.top_k = shape.top_k;
    config.num_experts = shape.experts_per_rank * world;
    config.max_tokens_per_rank = shape.max_tokens_per_rank;
    config.expert_alignment = shape.expert_alignment;
    draw_inputs(routing);
  }

  int local_experts() const { return config.num_local_experts(world); }
  std::size_t max_recv_rows() const { return config.max_recv_rows(world); }
  const RankInputs& mine() const { return inputs[rank]; }
  std::string trace() const {
    return "seed " + std::to_string(seed) + " (replay with ROCEP_TEST_SEED=" + std::to_string(seed) + "), " +
           config.describe();
  }

  uint64_t seed;
  int world;
  int rank;
  EpConfig config;
  std::vector<RankInputs> inputs;  // [world]

 private:
  void draw_inputs(Routing routing) {
    std::mt19937_64 rng(seed);
    const int top_k = config.top_k;
    std::uniform_int_distribution<int> token_count(1, config.max_tokens_per_rank);
    std::uniform_real_distribution<float> token_value(-4.0f, 4.0f);
    std::uniform_real_distribution<float> weight(std::numeric_limits<float>::min(), 1.0f);
    std::bernoulli_distribution masked(0.25);
    std::vector<int32_t> experts(config.num_experts);
    std::iota(experts.begin(), experts.end(), 0);
    const std::vector<int32_t> hot_experts = draw_distinct(experts, top_k, rng);

    inputs.resize(world);
    for (int source = 0; source < world; ++source) {
      RankInputs& in = inputs[source];
      if (routing == Routing::kFull || routing == Routing::kOneExpert) {
        in.num_tokens = config.max_tokens_per_rank;
      } else if (routing == Routing::kUnevenCounts && source == 1 % world) {
        in.num_tokens = 0;
      } else {
        in.num_tokens = token_count(rng);
      }
      for (int token = 0; token < in.num_tokens; ++token) {
        for (int column = 0; column < config.hidden; ++column) {
          bf16_bits value;
          do {
            value = rocep::float_to_bf16(token_value(rng));
          } while ((value & 0x7fff) == 0);
          in.tokens.push_back(value);
        }
        std::vector<int32_t> ids;
        switch (routing) {
          case Routing::kOneExpert:
            ids.assign(top_k, -1);
            ids[0] = 0;
            break;
          case Routing::kHotExperts:
            ids = draw_distinct(hot_experts, top_k, rng);
            break;
          default:
            ids = draw_distinct(experts, top_k, rng);
            break;
        }
        if (routing == Routing::kMasked) {
          for (int32_t& id : ids) {
            id = masked(rng) ? -1 : id;
          }
        }
        in.topk_ids.insert(in.topk_ids.end(), ids.begin(), ids.end());
        for (int k = 0; k < top_k; ++k) {
          in.topk_weights.push_back(weight(rng));
        }
      }
    }
  }
};

// Where one dispatch writes on this rank, poisoned before the call.
struct DispatchBuffers {
  explicit DispatchBuffers(const Problem& problem)
      : recv_tokens(poisoned<bf16_bits>(problem.max_recv_rows() * problem.config.hidden)),
        row_offsets(poisoned<uint32_t>(problem.local_experts() + 1)),
        expert_ids(poisoned<int32_t>(problem.local_experts())),
        src_info(poisoned<SrcInfo>(problem.max_recv_rows())),
        recv_weights(poisoned<float>(problem.max_recv_rows())) {}

  rocep::DispatchOutputs view() {
    rocep::DispatchOutputs outputs;
    outputs.recv_tokens = recv_tokens.data();
    outputs.row_offsets = row_offsets.data();
    outputs.expert_ids = expert_ids.data();
    outputs.src_info = src_info.data();
    outputs.recv_weights = recv_weights.data();
    return outputs;
  }

  bool same_bytes_as(const DispatchBuffers& other) const {
    return same_bytes(recv_tokens, other.recv_tokens) && same_bytes(row_offsets, other.row_offsets) &&
           same_bytes(expert_ids, other.expert_ids) && same_bytes(src_info, other.src_info) &&
           same_bytes(recv_weights, other.recv_weights);
  }

  std::vector<bf16_bits> recv_tokens;  // [R, hidden]
  std::vector<uint32_t> row_offsets;   // [L + 1]
  std::vector<int32_t> expert_ids;     // [L]
  std::vector<SrcInfo> src_info;       // [R]
  std::vector<float> recv_weights;     // [R]
};

// The rows dispatch must produce on this rank, by the naive definition.
struct ExpectedDispatch {
  std::vector<uint32_t> row_offsets;  // [L + 1]
  std::vector<bf16_bits> rows;        // [row_offsets[L], hidden]
  std::vector<SrcInfo> src_info;      // [row_offsets[L]]
  std::vector<float> weights;         // [row_offsets[L]]
  std::vector<int64_t> token_counts;  // [L]: rows per expert, padding excluded
};

ExpectedDispatch naive_dispatch(const Problem& problem) {
  const int top_k = problem.config.top_k;
  const int hidden = problem.config.hidden;
  const int local_experts = problem.local_experts();
  ExpectedDispatch expected;
  for (int expert = 0; expert < local_experts; ++expert) {
    const auto first_row = static_cast<uint32_t>(expected.src_info.size());
    expected.row_offsets.push_back(first_row);
    for (int source = 0; source < problem.world; ++source) {
      const RankInputs& in = problem.inputs[source];
      for (int token = 0; token < in.num_tokens; ++token) {
        for (int k = 0; k < top_k; ++k) {
          if (in.topk_ids[token * top_k + k] != problem.rank * local_experts + expert) {
            continue;
          }
          expected.rows.insert(expected.rows.end(), in.tokens.begin() + token * hidden,
                               in.tokens.begin() + (token + 1) * hidden);
          expected.src_info.push_back({source, token, k});
          expected.weights.push_back(in.topk_weights[token * top_k + k]);
        }
      }
    }
    expected.token_counts.push_back(expected.src_info.size() - first_row);
    while ((expected.src_info.size() - first_row) % problem.config.expert_alignment != 0) {
      expected.rows.insert(expected.rows.end(), hidden, bf16_bits{0});
      expected.src_info.push_back({-1, -1, -1});
      expected.weights.push_back(0.0f);
    }
  }
  expected.row_offsets.push_back(static_cast<uint32_t>(expected.src_info.size()));
  return expected;
}

// Row `row` of `actual` equals the expected one bit for bit: src_info, weight and token payload.
::testing::AssertionResult row_matches(const DispatchBuffers& actual, const ExpectedDispatch& expected,
                                       std::size_t row, int hidden) {
  const SrcInfo& got = actual.src_info[row];
  const SrcInfo& want = expected.src_info[row];
  if (got.rank != want.rank || got.token != want.token || got.k != want.k) {
    return ::testing::AssertionFailure()
           << "row " << row << ": src_info {" << got.rank << ", " << got.token << ", " << got.k
           << "}, expected {" << want.rank << ", " << want.token << ", " << want.k << "}";
  }
  if (std::memcmp(&actual.recv_weights[row], &expected.weights[row], sizeof(float)) != 0) {
    return ::testing::AssertionFailure() << "row " << row << ": weight " << actual.recv_weights[row]
                                         << ", expected " << expected.weights[row];
  }
  if (std::memcmp(actual.recv_tokens.data() + row * hidden, expected.rows.data() + row * hidden,
                  hidden * sizeof(bf16_bits)) != 0) {
    return ::testing::AssertionFailure() << "row " << row << ": the token payload differs";
  }
  return ::testing::AssertionSuccess();
}

// Every written row bit for bit (up to the first differing one), and the poison left past the last row.
void expect_dispatch_matches(const DispatchBuffers& actual, const Problem& problem) {
  const ExpectedDispatch expected = naive_dispatch(problem);
  const int hidden = problem.config.hidden;
  EXPECT_EQ(actual.row_offsets, expected.row_offsets);
  std::vector<int32_t> identity(problem.local_experts());
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_EQ(actual.expert_ids, identity);

  const std::size_t rows = expected.src_info.size();
  ASSERT_LE(rows, problem.max_recv_rows()) << "the routing yields more rows than max_recv_rows";
  for (std::size_t row = 0; row < rows; ++row) {
    ASSERT_TRUE(row_matches(actual, expected, row, hidden));
  }
  EXPECT_TRUE(still_poisoned(actual.recv_tokens, rows * hidden)) << "recv_tokens written past row " << rows;
  EXPECT_TRUE(still_poisoned(actual.src_info, rows)) << "src_info written past row " << rows;
  EXPECT_TRUE(still_poisoned(actual.recv_weights, rows)) << "recv_weights written past row " << rows;
}

DispatchBuffers dispatch(ReferenceEp& ep, const Problem& problem) {
  DispatchBuffers buffers(problem);
  ep.dispatch_send(problem.mine().view(), nullptr);
  ep.dispatch_recv(buffers.view(), nullptr);
  return buffers;
}

// The expert outputs [R, hidden] for the rows of `dispatched`: the hash of each row's origin; NaN in
// padding rows and past the last row, which combine must not read.
std::vector<bf16_bits> expert_outputs(const Problem& problem, const DispatchBuffers& dispatched) {
  const int hidden = problem.config.hidden;
  const uint32_t rows = dispatched.row_offsets[problem.local_experts()];
  std::vector<bf16_bits> outputs(problem.max_recv_rows() * hidden, kBf16NaN);
  for (uint32_t row = 0; row < rows && row < problem.max_recv_rows(); ++row) {
    const SrcInfo& origin = dispatched.src_info[row];
    if (origin.rank < 0) {
      continue;
    }
    for (int column = 0; column < hidden; ++column) {
      outputs[row * hidden + column] =
          expert_output(problem.seed, origin.rank, origin.token, origin.k, column);
    }
  }
  return outputs;
}

// This rank's shared-expert rows [num_tokens, hidden].
std::vector<bf16_bits> shared_expert_outputs(const Problem& problem) {
  std::vector<bf16_bits> rows;
  for (int token = 0; token < problem.mine().num_tokens; ++token) {
    for (int column = 0; column < problem.config.hidden; ++column) {
      rows.push_back(shared_expert_output(problem.seed, problem.rank, token, column));
    }
  }
  return rows;
}

// A combine epilogue (CombineArgs: factor, token_factors, residual) of values drawn from the problem's seed
// for this rank, writing rows `stride` elements apart.
struct Epilogue {
  explicit Epilogue(const Problem& problem)
      : stride(static_cast<std::size_t>(problem.config.hidden) + 8),
        token_factors(static_cast<std::size_t>(problem.config.max_tokens_per_rank)),
        residual(static_cast<std::size_t>(problem.config.max_tokens_per_rank) * problem.config.hidden) {
    std::mt19937_64 random(problem.seed ^ (0xe1ull * (problem.rank + 1)));
    std::uniform_real_distribution<float> value(-2.0f, 2.0f);
    factor = value(random);
    for (float& token_factor : token_factors) {
      token_factor = value(random);
    }
    for (bf16_bits& element : residual) {
      element = rocep::float_to_bf16(value(random));
    }
  }
  // The epilogue's definition on one value, written out: multiply, multiply, add, each rounded.
  float apply(float value, int token, int column, int hidden) const {
    const float scaled = value * factor;
    const float token_scaled = scaled * token_factors[token];
    return token_scaled + rocep::bf16_to_float(residual[static_cast<std::size_t>(token) * hidden + column]);
  }
  std::size_t stride;
  float factor = 1.0f;
  std::vector<float> token_factors;
  std::vector<bf16_bits> residual;
};

// Weighted combine on this rank: per destination rank the partial sum (fma in ascending k) rounded to bf16,
// the partials summed in float32 in ascending rank order, the shared row added, the epilogue (unless null),
// one final rounding.
std::vector<bf16_bits> naive_weighted_combine(const Problem& problem, bool with_shared_expert,
                                              const Epilogue* epilogue = nullptr) {
  const RankInputs& in = problem.mine();
  const int top_k = problem.config.top_k;
  const int hidden = problem.config.hidden;
  std::vector<bf16_bits> out;
  for (int token = 0; token < in.num_tokens; ++token) {
    for (int column = 0; column < hidden; ++column) {
      float sum = 0.0f;
      for (int destination = 0; destination < problem.world; ++destination) {
        bool reached = false;
        float partial = 0.0f;
        for (int k = 0; k < top_k; ++k) {
          const int32_t id = in.topk_ids[token * top_k + k];
          if (id < 0 || id / problem.local_experts() != destination) {
            continue;
          }
          reached = true;
          const float y = rocep::bf16_to_float(expert_output(problem.seed, problem.rank, token, k, column));
          partial = std::fma(in.topk_weights[token * top_k + k], y, partial);
        }
        if (reached) {
          sum += rocep::bf16_to_float(rocep::float_to_bf16(partial));
        }
      }
      if (with_shared_expert) {
        sum += rocep::bf16_to_float(shared_expert_output(problem.seed, problem.rank, token, column));
      }
      out.push_back(
          rocep::float_to_bf16(epilogue != nullptr ? epilogue->apply(sum, token, column, hidden) : sum));
    }
  }
  return out;
}

// Unweighted combine on this rank: [num_tokens, top_k, hidden], each slot's expert output, zeros for -1.
std::vector<bf16_bits> naive_unweighted_combine(const Problem& problem) {
  const RankInputs& in = problem.mine();
  const int top_k = problem.config.top_k;
  std::vector<bf16_bits> out;
  for (int token = 0; token < in.num_tokens; ++token) {
    for (int k = 0; k < top_k; ++k) {
      for (int column = 0; column < problem.config.hidden; ++column) {
        const bool routed = in.topk_ids[token * top_k + k] >= 0;
        out.push_back(routed ? expert_output(problem.seed, problem.rank, token, k, column) : bf16_bits{0});
      }
    }
  }
  return out;
}

enum class Combine { kWeighted, kWeightedWithSharedExpert, kUnweighted };

// Runs a combine of the rows of `dispatched` into a poisoned out buffer of max_tokens_per_rank tokens, rows
// epilogue->stride apart with an epilogue.
std::vector<bf16_bits> combine(ReferenceEp& ep, const Problem& problem, const DispatchBuffers& dispatched,
                               Combine kind, const Epilogue* epilogue = nullptr) {
  const std::vector<bf16_bits> y = expert_outputs(problem, dispatched);
  const std::vector<bf16_bits> shared = shared_expert_outputs(problem);
  const int slots = kind == Combine::kUnweighted ? problem.config.top_k : 1;
  const std::size_t row =
      epilogue != nullptr ? epilogue->stride : std::size_t{1} * slots * problem.config.hidden;
  std::vector<bf16_bits> out = poisoned<bf16_bits>(problem.config.max_tokens_per_rank * row);
  rocep::CombineArgs args;
  if (epilogue != nullptr) {
    args.factor = epilogue->factor;
    args.token_factors = epilogue->token_factors.data();
    args.residual = epilogue->residual.data();
    args.out_row_stride = epilogue->stride;
  }
  args.expert_outputs = y.data();
  args.row_weights = kind == Combine::kUnweighted ? nullptr : dispatched.recv_weights.data();
  args.shared_expert_output = kind == Combine::kWeightedWithSharedExpert ? shared.data() : nullptr;
  args.out = out.data();
  ep.combine_send(args, nullptr);
  ep.combine_recv(args, nullptr);
  return out;
}

// The first num_tokens rows of `out` equal `expected` bit for bit, the rest is still poison.
void expect_combine_matches(const std::vector<bf16_bits>& out, const std::vector<bf16_bits>& expected,
                            int row_elements) {
  ASSERT_LE(expected.size(), out.size());
  for (std::size_t row = 0; row * row_elements < expected.size(); ++row) {
    ASSERT_EQ(std::memcmp(out.data() + row * row_elements, expected.data() + row * row_elements,
                          row_elements * sizeof(bf16_bits)),
              0)
        << "combined row " << row << " differs";
  }
  EXPECT_TRUE(still_poisoned(out, expected.size())) << "combine wrote past the last token";
}

// --- every routing on every shape ----------------------------------------------------------------------

class ReferenceEpRoutingTest : public ::testing::TestWithParam<std::tuple<Routing, Shape>> {
 protected:
  ReferenceEpRoutingTest()
      : problem_(std::get<1>(GetParam()), std::get<0>(GetParam())),
        trace_(__FILE__, __LINE__, problem_.trace()),
        ep_(world_bootstrap(), problem_.config) {}

  Problem problem_;
  ::testing::ScopedTrace trace_;
  ReferenceEp ep_;
};

TEST_P(ReferenceEpRoutingTest, DispatchMatchesNaiveLayout) {
  expect_dispatch_matches(dispatch(ep_, problem_), problem_);
}

TEST_P(ReferenceEpRoutingTest, WeightedCombineMatchesNaiveSum) {
  const DispatchBuffers dispatched = dispatch(ep_, problem_);
  expect_combine_matches(combine(ep_, problem_, dispatched, Combine::kWeighted),
                         naive_weighted_combine(problem_, false), problem_.config.hidden);
}

TEST_P(ReferenceEpRoutingTest, WeightedCombineAddsSharedExpert) {
  const DispatchBuffers dispatched = dispatch(ep_, problem_);
  expect_combine_matches(combine(ep_, problem_, dispatched, Combine::kWeightedWithSharedExpert),
                         naive_weighted_combine(problem_, true), problem_.config.hidden);
}

TEST_P(ReferenceEpRoutingTest, WeightedCombineAppliesTheEpilogueIntoWiderRows) {
  const DispatchBuffers dispatched = dispatch(ep_, problem_);
  const Epilogue epilogue(problem_);
  const std::vector<bf16_bits> out =
      combine(ep_, problem_, dispatched, Combine::kWeightedWithSharedExpert, &epilogue);
  const std::vector<bf16_bits> expected = naive_weighted_combine(problem_, true, &epilogue);
  const int hidden = problem_.config.hidden;
  for (int token = 0; token < problem_.mine().num_tokens; ++token) {
    const bf16_bits* row = out.data() + token * epilogue.stride;
    ASSERT_EQ(std::memcmp(row, expected.data() + static_cast<std::size_t>(token) * hidden,
                          hidden * sizeof(bf16_bits)),
              0)
        << "combined row " << token << " differs";
    ASSERT_TRUE(std::all_of(row + hidden, row + epilogue.stride,
                            [](bf16_bits element) { return element == poisoned<bf16_bits>(1)[0]; }))
        << "written between rows " << token << " and " << token + 1;
  }
  EXPECT_TRUE(still_poisoned(out, problem_.mine().num_tokens * epilogue.stride)) << "written past the tokens";
}

TEST_P(ReferenceEpRoutingTest, UnweightedCombineReturnsEverySlot) {
  const DispatchBuffers dispatched = dispatch(ep_, problem_);
  expect_combine_matches(combine(ep_, problem_, dispatched, Combine::kUnweighted),
                         naive_unweighted_combine(problem_), problem_.config.top_k * problem_.config.hidden);
}

constexpr Routing kRoutings[] = {Routing::kUniform,   Routing::kMasked,     Routing::kUnevenCounts,
                                 Routing::kOneExpert, Routing::kHotExperts, Routing::kFull};

constexpr Shape kShapes[] = {
    {64, 1, 8, 16, 1},
    {256, 4, 4, 32, 4},
    {64, 8, 16, 64, 4},
    {256, 8, 16, 24, 1},
};

INSTANTIATE_TEST_SUITE_P(Routings, ReferenceEpRoutingTest,
                         ::testing::Combine(::testing::ValuesIn(kRoutings), ::testing::ValuesIn(kShapes)),
                         [](const ::testing::TestParamInfo<std::tuple<Routing, Shape>>& param_info) {
                           return std::string(to_string(std::get<0>(param_info.param))) + "_" +
                                  to_string(std::get<1>(param_info.param));
                         });

// --- the per-token layout ------------------------------------------------------------------------------

Problem per_token(Problem problem) {
  problem.config.layout = rocep::Layout::kPerToken;
  return problem;
}

// Where a per-token dispatch writes on this rank, poisoned before the call.
struct PerTokenBuffers : rocep::testing::PerTokenHostOutputs {
  explicit PerTokenBuffers(const Problem& problem)
      : PerTokenHostOutputs(problem.config, problem.world, kPoison) {}
};

// The per-token layout by its naive definition: a row per (source, token) in that order for every token
// that names an expert of this rank; sorted_token_ids by a stable sort of every (row, slot) pair by its
// local expert, each expert's run padded with P * top_k to the alignment.
void expect_per_token_matches(const PerTokenBuffers& got, const Problem& problem) {
  const int top_k = problem.config.top_k;
  const int hidden = problem.config.hidden;
  const int local_experts = problem.local_experts();
  const int first_expert = problem.rank * local_experts;
  struct Pair {
    int expert;
    int32_t entry;  // row * top_k + k
  };
  std::vector<Pair> pairs;
  int32_t row = 0;
  for (int source = 0; source < problem.world; ++source) {
    const RankInputs& in = problem.inputs[source];
    for (int token = 0; token < in.num_tokens; ++token) {
      const int32_t* ids = in.topk_ids.data() + token * top_k;
      if (std::none_of(ids, ids + top_k,
                       [&](int32_t id) { return id >= first_expert && id < first_expert + local_experts; })) {
        continue;
      }
      ASSERT_EQ(std::memcmp(got.recv_tokens.data() + row * hidden * sizeof(bf16_bits),
                            in.tokens.data() + token * hidden, hidden * sizeof(bf16_bits)),
                0)
          << "row " << row << " (source " << source << ", token " << token << ") payload";
      ASSERT_EQ(got.src_info[row].rank, source) << "row " << row;
      ASSERT_EQ(got.src_info[row].token, token) << "row " << row;
      ASSERT_EQ(got.src_info[row].k, -1) << "row " << row;
      for (int k = 0; k < top_k; ++k) {
        const bool local = ids[k] >= first_expert && ids[k] < first_expert + local_experts;
        ASSERT_EQ(got.topk_ids[row * top_k + k], local ? ids[k] - first_expert : -1) << "row " << row;
        ASSERT_EQ(got.topk_weights[row * top_k + k], in.topk_weights[token * top_k + k]) << "row " << row;
        if (local) {
          pairs.push_back({ids[k] - first_expert, row * top_k + k});
        }
      }
      ++row;
    }
  }
  EXPECT_EQ(got.num_recv_tokens[0], row);
  EXPECT_TRUE(still_poisoned(got.recv_tokens, static_cast<std::size_t>(row) * hidden * sizeof(bf16_bits)));
  EXPECT_TRUE(still_poisoned(got.src_info, row));
  // A stable sort by expert: the pairs of each expert in the order met (row, then slot).
  std::vector<Pair> by_expert;
  for (int expert = 0; expert < local_experts; ++expert) {
    std::copy_if(pairs.begin(), pairs.end(), std::back_inserter(by_expert),
                 [&](const Pair& pair) { return pair.expert == expert; });
  }
  pairs = by_expert;
  const int alignment = problem.config.expert_alignment;
  const auto padding = static_cast<int32_t>(got.rows * top_k);
  std::vector<int32_t> sorted;
  std::vector<uint32_t> offsets;
  std::vector<int32_t> blocks;
  std::size_t next = 0;
  for (int expert = 0; expert < local_experts; ++expert) {
    offsets.push_back(static_cast<uint32_t>(sorted.size()));
    const std::size_t first = sorted.size();
    for (; next < pairs.size() && pairs[next].expert == expert; ++next) {
      sorted.push_back(pairs[next].entry);
    }
    while ((sorted.size() - first) % alignment != 0) {
      sorted.push_back(padding);
    }
    blocks.insert(blocks.end(), (sorted.size() - first) / alignment, expert);
  }
  offsets.push_back(static_cast<uint32_t>(sorted.size()));
  EXPECT_EQ(got.row_offsets, offsets);
  EXPECT_EQ(std::vector<int32_t>(got.sorted_token_ids.begin(), got.sorted_token_ids.begin() + sorted.size()),
            sorted);
  EXPECT_TRUE(still_poisoned(got.sorted_token_ids, sorted.size()));
  EXPECT_EQ(std::vector<int32_t>(got.block_expert_ids.begin(), got.block_expert_ids.begin() + blocks.size()),
            blocks);
}

// This rank's per-token rows [P, hidden]: a hash of (this rank, source, token) per received row; NaN past
// the rows, which combine must not read.
std::vector<bf16_bits> per_token_rows(const Problem& problem, const PerTokenBuffers& dispatched) {
  const int hidden = problem.config.hidden;
  std::vector<bf16_bits> rows(dispatched.rows * hidden, kBf16NaN);
  for (int32_t row = 0; row < dispatched.num_recv_tokens[0]; ++row) {
    const SrcInfo& origin = dispatched.src_info[row];
    for (int column = 0; column < hidden; ++column) {
      rows[row * hidden + column] =
          hashed_bf16(problem.seed, {3, problem.rank, origin.rank, origin.token, column});
    }
  }
  return rows;
}

// out[t] = the rows of t from every rank that received it, summed in float32 in ascending rank order, plus
// the shared expert, rounded once. With nodes of `node_ranks` ranks (ranks [n * node_ranks, (n + 1) *
// node_ranks) on node n; 0: one node), another node's rows of t are summed in float32 in ascending rank order
// and rounded to bf16 first, and that sum is added in the place of the rank there with this rank's index in
// its own node.
std::vector<bf16_bits> naive_per_token_combine(const Problem& problem, int node_ranks = 0) {
  const RankInputs& in = problem.mine();
  const int top_k = problem.config.top_k;
  const int ranks_per_node = node_ranks > 0 ? node_ranks : problem.world;
  const auto node_of = [&](int rank) { return rank / ranks_per_node; };
  const auto row = [&](int token, int destination, int column) {
    const int32_t* ids = in.topk_ids.data() + token * top_k;
    const bool received = std::any_of(
        ids, ids + top_k, [&](int32_t id) { return id >= 0 && id / problem.local_experts() == destination; });
    return received ? std::optional<float>(rocep::bf16_to_float(
                          hashed_bf16(problem.seed, {3, destination, problem.rank, token, column})))
                    : std::nullopt;
  };
  std::vector<bf16_bits> out;
  for (int token = 0; token < in.num_tokens; ++token) {
    for (int column = 0; column < problem.config.hidden; ++column) {
      float sum = 0.0f;
      for (int destination = 0; destination < problem.world; ++destination) {
        if (node_of(destination) == node_of(problem.rank)) {
          sum += row(token, destination, column).value_or(0.0f);
          continue;
        }
        if (destination % ranks_per_node != problem.rank % ranks_per_node) {
          continue;  // in its node's sum
        }
        float node_sum = 0.0f;
        bool any = false;
        for (int mate = node_of(destination) * ranks_per_node;
             mate < (node_of(destination) + 1) * ranks_per_node; ++mate) {
          if (const std::optional<float> value = row(token, mate, column)) {
            node_sum += *value;
            any = true;
          }
        }
        sum += any ? rocep::bf16_to_float(rocep::float_to_bf16(node_sum)) : 0.0f;
      }
      sum += rocep::bf16_to_float(shared_expert_output(problem.seed, problem.rank, token, column));
      out.push_back(rocep::float_to_bf16(sum));
    }
  }
  return out;
}

class ReferenceEpPerTokenTest : public ::testing::TestWithParam<std::tuple<Routing, Shape>> {
 protected:
  ReferenceEpPerTokenTest()
      : problem_(per_token(Problem(std::get<1>(GetParam()), std::get<0>(GetParam())))),
        trace_(__FILE__, __LINE__, problem_.trace()),
        ep_(world_bootstrap(), problem_.config) {}

  Problem problem_;
  ::testing::ScopedTrace trace_;
  ReferenceEp ep_;
};

// One per-token dispatch on `ep` (its layout checked against the naive definition), then a combine of
// per_token_rows with the shared expert: the combine's output.
std::vector<bf16_bits> dispatch_and_combine(ReferenceEp& ep, const Problem& problem) {
  PerTokenBuffers dispatched(problem);
  ep.dispatch_send(problem.mine().view(), nullptr);
  ep.dispatch_recv(dispatched.view(), nullptr);
  expect_per_token_matches(dispatched, problem);
  const std::vector<bf16_bits> rows = per_token_rows(problem, dispatched);
  const std::vector<bf16_bits> shared = shared_expert_outputs(problem);
  std::vector<bf16_bits> out =
      poisoned<bf16_bits>(std::size_t{1} * problem.config.max_tokens_per_rank * problem.config.hidden);
  rocep::CombineArgs args;
  args.expert_outputs = rows.data();
  args.shared_expert_output = shared.data();
  args.out = out.data();
  ep.combine_send(args, nullptr);
  ep.combine_recv(args, nullptr);
  return out;
}

TEST_P(ReferenceEpPerTokenTest, DispatchAndCombineMatchTheNaiveDefinition) {
  expect_combine_matches(dispatch_and_combine(ep_, problem_), naive_per_token_combine(problem_),
                         problem_.config.hidden);
}

// Two nodes of two ranks (EpConfig::gpus_per_node = 2, at 4 ranks): each node's rows of a token are summed
// on that node first and rounded to bf16, then added in the place of the rank there that holds this rank's
// messages (docs/scale-out.md). Where tokens reach several ranks, that differs from the sum over ranks.
TEST_P(ReferenceEpPerTokenTest, NodesOfTwoRanksSumTheirRowsFirst) {
  if (problem_.world != 4) {
    GTEST_SKIP() << "needs 4 ranks: two nodes of two";
  }
  Problem problem = problem_;
  problem.config.gpus_per_node = 2;
  ReferenceEp ep(world_bootstrap(), problem.config);
  const std::vector<bf16_bits> expected = naive_per_token_combine(problem, 2);
  expect_combine_matches(dispatch_and_combine(ep, problem), expected, problem.config.hidden);
  if (std::get<0>(GetParam()) == Routing::kFull && problem.config.top_k > 1) {
    EXPECT_NE(expected, naive_per_token_combine(problem)) << "the node sums changed no value";
  }
}

INSTANTIATE_TEST_SUITE_P(Routings, ReferenceEpPerTokenTest,
                         ::testing::Combine(::testing::ValuesIn(kRoutings), ::testing::ValuesIn(kShapes)),
                         [](const ::testing::TestParamInfo<std::tuple<Routing, Shape>>& param_info) {
                           return std::string(to_string(std::get<0>(param_info.param))) + "_" +
                                  to_string(std::get<1>(param_info.param));
                         });

// Row weights in the per-token layout are refused on the calling rank (each row is already weighted).
TEST(ReferenceEpPerTokenContract, RowWeightsAreRefused) {
  Problem problem = per_token(Problem(kShapes[1], Routing::kUniform));
  rocep::EpGroup group(MPI_COMM_WORLD, problem.config, rocep::Backend::kCpuReference);
  PerTokenBuffers dispatched(problem);
  group.dispatch(problem.mine().view(), dispatched.view());
  std::vector<bf16_bits> rows = per_token_rows(problem, dispatched);
  std::vector<float> weights(dispatched.rows, 1.0f);
  std::vector<bf16_bits> out(std::size_t{1} * problem.config.max_tokens_per_rank * problem.config.hidden);
  rocep::CombineArgs args;
  args.expert_outputs = rows.data();
  args.row_weights = weights.data();
  args.out = out.data();
  try {
    group.combine(args);
    ADD_FAILURE() << "a per-token combine with row_weights was accepted";
  } catch (const rocep::InvalidInputError& error) {
    EXPECT_PRED_FORMAT2(::testing::IsSubstring, "row_weights", error.what());
  }
  args.row_weights = nullptr;
  group.combine(args);  // the group goes on
}

TEST(ReferenceEpPerTokenContract, ExpertInputScalesAreRefused) {
  Problem problem = per_token(Problem(kShapes[1], Routing::kUniform));
  rocep::EpGroup group(MPI_COMM_WORLD, problem.config, rocep::Backend::kCpuReference);
  PerTokenBuffers dispatched(problem);
  rocep::DispatchOutputs outputs = dispatched.view();
  const std::vector<float> scales(problem.local_experts(), 0.5f);
  outputs.expert_input_scales = scales.data();
  // Refused on every rank (so that none waits), in the words of the call made: the split receive, then the
  // fused dispatch.
  const std::string refused = ": rank " + std::to_string(problem.rank) +
                              " passed expert_input_scales, which the per-token layout refuses";
  group.dispatch_send(problem.mine().view());
  try {
    group.dispatch_recv(outputs);
    ADD_FAILURE() << "a per-token dispatch_recv with expert_input_scales was accepted";
  } catch (const rocep::InvalidInputError& error) {
    EXPECT_EQ(std::string(error.what()).find("dispatch_recv" + refused), 0u) << error.what();
  }
  group.dispatch_recv(dispatched.view());  // the group goes on
  std::vector<bf16_bits> rows = per_token_rows(problem, dispatched);
  std::vector<bf16_bits> out(std::size_t{1} * problem.config.max_tokens_per_rank * problem.config.hidden);
  group.combine({rows.data(), nullptr, nullptr, out.data()});
  try {
    group.dispatch(problem.mine().view(), outputs);
    ADD_FAILURE() << "a per-token dispatch with expert_input_scales was accepted";
  } catch (const rocep::InvalidInputError& error) {
    EXPECT_EQ(std::string(error.what()).find("dispatch" + refused), 0u) << error.what();
  }
  group.dispatch(problem.mine().view(), dispatched.view());  // the group goes on
  group.combine({rows.data(), nullptr, nullptr, out.data()});
}

// Null outputs of a per-token dispatch are refused naming each null one, and only those.
TEST(ReferenceEpPerTokenContract, NullOutputsAreRefusedByName) {
  Problem problem = per_token(Problem(kShapes[1], Routing::kUniform));
  rocep::EpGroup group(MPI_COMM_WORLD, problem.config, rocep::Backend::kCpuReference);
  PerTokenBuffers dispatched(problem);
  rocep::DispatchOutputs outputs = dispatched.view();
  outputs.recv_topk_ids = nullptr;
  outputs.num_recv_tokens = nullptr;
  outputs.block_expert_ids = nullptr;
  group.dispatch_send(problem.mine().view());  // refused on every rank, so that none waits
  try {
    group.dispatch_recv(outputs);
    ADD_FAILURE() << "a per-token dispatch_recv with null outputs was accepted";
  } catch (const rocep::InvalidInputError& error) {
    EXPECT_EQ(std::string(error.what()), "dispatch_recv: rank " + std::to_string(problem.rank) +
                                             " passed null recv_topk_ids, num_recv_tokens and "
                                             "block_expert_ids pointers (layout per-token)");
  }
  group.dispatch_recv(dispatched.view());  // the group goes on
  std::vector<bf16_bits> rows = per_token_rows(problem, dispatched);
  std::vector<bf16_bits> out(std::size_t{1} * problem.config.max_tokens_per_rank * problem.config.hidden);
  group.combine({rows.data(), nullptr, nullptr, out.data()});
}

// Expert outputs written into the combine input buffer combine exactly like a copy of them elsewhere, on
// two calls of the group; a pointer into the buffer anywhere but at its start is refused on its rank only;
// the expanded layout, an fp8 combine and a group created with EpConfig::combine_input_buffer = false have
// no buffer, and the last combines its rows as the others do.
TEST(ReferenceEpPerTokenContract, RowsInTheCombineInputBufferCombineLikeAnyOther) {
  Problem problem = per_token(Problem(kShapes[1], Routing::kMasked));
  rocep::EpGroup group(MPI_COMM_WORLD, problem.config, rocep::Backend::kCpuReference);
  auto* buffer = static_cast<bf16_bits*>(group.combine_input_buffer());
  ASSERT_NE(buffer, nullptr);
  EXPECT_EQ(group.combine_input_buffer(), buffer) << "the buffer moved";
  const std::size_t out_elements =
      std::size_t{1} * problem.config.max_tokens_per_rank * problem.config.hidden;
  for (int call = 0; call < 2; ++call) {
    SCOPED_TRACE("call " + std::to_string(call));
    problem.seed += 17;  // new rows each call
    PerTokenBuffers dispatched(problem);
    group.dispatch(problem.mine().view(), dispatched.view());
    const std::vector<bf16_bits> rows = per_token_rows(problem, dispatched);
    std::copy(rows.begin(), rows.end(), buffer);
    std::vector<bf16_bits> out = poisoned<bf16_bits>(out_elements);
    group.combine({buffer, nullptr, nullptr, out.data()});
    std::vector<bf16_bits> expected = poisoned<bf16_bits>(out_elements);
    group.dispatch(problem.mine().view(), dispatched.view());
    group.combine({rows.data(), nullptr, nullptr, expected.data()});
    EXPECT_TRUE(same_bytes(out, expected));
  }

  PerTokenBuffers dispatched(problem);
  group.dispatch(problem.mine().view(), dispatched.view());
  const bool last = problem.rank == problem.world - 1;
  std::vector<bf16_bits> out(out_elements);
  const rocep::CombineArgs misplaced{last ? buffer + problem.config.hidden : buffer, nullptr, nullptr,
                                     out.data()};
  try {
    group.combine(misplaced);
    EXPECT_FALSE(last) << "no InvalidInputError on the last rank";
  } catch (const rocep::InvalidInputError& error) {
    EXPECT_TRUE(last) << error.what();
    EXPECT_TRUE(names(error.what(), "rank", problem.world - 1)) << error.what();
    EXPECT_PRED_FORMAT2(::testing::IsSubstring, "combine_input_buffer()", error.what());
    group.combine({buffer, nullptr, nullptr, out.data()});  // the group goes on
  }

  // A group without the buffer refuses to give one, with `why` in the message.
  const auto expect_no_buffer = [](rocep::EpGroup& without, const char* why) {
    try {
      without.combine_input_buffer();
      ADD_FAILURE() << "a group without a combine input buffer (" << why << ") gave one";
    } catch (const rocep::ConfigError& error) {
      EXPECT_PRED_FORMAT2(::testing::IsSubstring, why, error.what());
    }
  };
  rocep::EpConfig fp8 = problem.config;
  fp8.combine_dtype = rocep::CombineDtype::kFp8Block128;
  rocep::EpGroup fp8_group(MPI_COMM_WORLD, fp8, rocep::Backend::kCpuReference);
  expect_no_buffer(fp8_group, "combine_dtype");
  rocep::EpConfig expanded = problem.config;
  expanded.layout = rocep::Layout::kExpanded;
  rocep::EpGroup expanded_group(MPI_COMM_WORLD, expanded, rocep::Backend::kCpuReference);
  expect_no_buffer(expanded_group, "per-token");
  // Left out at creation: no buffer, named by its field; the combine goes on from the caller's memory.
  rocep::EpConfig without = problem.config;
  without.combine_input_buffer = false;
  rocep::EpGroup group_without(MPI_COMM_WORLD, without, rocep::Backend::kCpuReference);
  expect_no_buffer(group_without, "EpConfig::combine_input_buffer = false");
  PerTokenBuffers dispatched_without(problem);
  group_without.dispatch(problem.mine().view(), dispatched_without.view());
  const std::vector<bf16_bits> rows = per_token_rows(problem, dispatched_without);
  std::vector<bf16_bits> out_without = poisoned<bf16_bits>(out_elements);
  group_without.combine({rows.data(), nullptr, nullptr, out_without.data()});
  std::vector<bf16_bits> out_with = poisoned<bf16_bits>(out_elements);
  group.dispatch(problem.mine().view(), dispatched.view());
  group.combine({rows.data(), nullptr, nullptr, out_with.data()});
  EXPECT_TRUE(same_bytes(out_without, out_with));
}

// --- calls, repeats and the EpGroup wrapper ------------------------------------------------------------

constexpr Shape kSmallShape = {64, 4, 4, 16, 4};

TEST(ReferenceEpTest, ExpertTokenCountsAccumulateOverCalls) {
  const Problem problem(kSmallShape, Routing::kMasked);
  SCOPED_TRACE(problem.trace());
  ReferenceEp ep(world_bootstrap(), problem.config);
  const std::vector<int64_t> expected = naive_dispatch(problem).token_counts;
  std::vector<int64_t> counts(problem.local_experts(), 0);
  for (int64_t calls = 1; calls <= 2; ++calls) {
    DispatchBuffers buffers(problem);
    rocep::DispatchOutputs outputs = buffers.view();
    outputs.expert_token_counts = counts.data();
    ep.dispatch_send(problem.mine().view(), nullptr);
    ep.dispatch_recv(outputs, nullptr);
    expect_dispatch_matches(buffers, problem);
    for (int expert = 0; expert < problem.local_experts(); ++expert) {
      EXPECT_EQ(counts[expert], calls * expected[expert]) << "local expert " << expert << " after " << calls;
    }
  }
}

// Expert input scales: every row of local expert e is the bf16 row's elements divided by scales[e], as fp8
// codes (checked with the kernels' codec, written apart from the reference's), padding rows zero; the other
// outputs as without scales. Both encodings.
TEST(ReferenceEpTest, ExpertInputScalesQuantiseEachRowWithItsExpertsScale) {
  for (const auto encoding : {rocep::Fp8Encoding::kE4m3fn, rocep::Fp8Encoding::kE4m3fnuz}) {
    Problem problem({256, 4, 4, 32, 4}, Routing::kUniform);
    problem.config.fp8_encoding = encoding;
    SCOPED_TRACE(problem.trace());
    ReferenceEp ep(world_bootstrap(), problem.config);
    const DispatchBuffers plain = dispatch(ep, problem);
    std::mt19937_64 random(problem.seed ^ 0x5ca1e5ull);
    std::vector<float> scales(problem.local_experts());
    for (float& scale : scales) {
      scale = std::ldexp(1.0f + static_cast<float>(random() % 1000) / 1000.0f,
                         static_cast<int>(random() % 9) - 6);
    }
    DispatchBuffers scaled(problem);
    rocep::DispatchOutputs outputs = scaled.view();
    outputs.expert_input_scales = scales.data();
    ep.dispatch_send(problem.mine().view(), nullptr);
    ep.dispatch_recv(outputs, nullptr);
    EXPECT_EQ(plain.row_offsets, scaled.row_offsets);
    EXPECT_TRUE(same_bytes(plain.src_info, scaled.src_info));
    EXPECT_TRUE(same_bytes(plain.recv_weights, scaled.recv_weights));
    const int hidden = problem.config.hidden;
    const auto* codes = reinterpret_cast<const uint8_t*>(scaled.recv_tokens.data());
    const auto device_encoding = static_cast<rocep::device::Fp8>(encoding);
    for (int expert = 0; expert < problem.local_experts(); ++expert) {
      for (uint32_t row = plain.row_offsets[expert]; row < plain.row_offsets[expert + 1]; ++row) {
        const bool padding = plain.src_info[row].rank < 0;
        for (int i = 0; i < hidden; ++i) {
          const float x = rocep::bf16_to_float(plain.recv_tokens[static_cast<std::size_t>(row) * hidden + i]);
          const uint8_t want = padding ? 0 : rocep::device::encode_fp8(x / scales[expert], device_encoding);
          ASSERT_EQ(codes[static_cast<std::size_t>(row) * hidden + i], want)
              << "row " << row << " (local expert " << expert << "), element " << i;
        }
      }
    }
    const std::size_t used = std::size_t{plain.row_offsets.back()} * hidden;  // bytes of fp8 rows
    EXPECT_TRUE(std::all_of(codes + used, codes + scaled.recv_tokens.size() * sizeof(bf16_bits),
                            [](uint8_t byte) { return byte == kPoison; }))
        << "written past the rows";
  }
}

TEST(ReferenceEpTest, WeightedCombineSumsSlotsAndRanksInAscendingOrder) {
  // 256 - 256 + 2^-20 sums to 2^-20 in this order; in reverse, 2^-20 is lost next to -256 and the sum is 0.
  const std::vector<float> slot_values = {256.0f, -256.0f, std::ldexp(1.0f, -20)};
  Problem problem({8, 3, 4, 1, 1}, Routing::kUniform);  // one token per rank
  SCOPED_TRACE(problem.trace());
  ReferenceEp ep(world_bootstrap(), problem.config);
  const int hidden = problem.config.hidden;
  const int local_experts = problem.local_experts();
  std::vector<std::vector<int32_t>> layouts = {{0, 1, 2}};  // every slot on rank 0: the order of k
  if (problem.world >= 3) {
    layouts.push_back({0, local_experts, 2 * local_experts});  // one slot per rank: the order of ranks
  }
  for (const std::vector<int32_t>& ids : layouts) {
    SCOPED_TRACE("experts " + std::to_string(ids[0]) + ", " + std::to_string(ids[1]) + ", " +
                 std::to_string(ids[2]));
    for (RankInputs& in : problem.inputs) {
      in.topk_ids = ids;
      in.topk_weights.assign(ids.size(), 1.0f);
    }
    const DispatchBuffers dispatched = dispatch(ep, problem);
    expect_dispatch_matches(dispatched, problem);
    std::vector<bf16_bits> y(problem.max_recv_rows() * hidden, kBf16NaN);
    for (uint32_t row = 0; row < dispatched.row_offsets[local_experts]; ++row) {
      const float value = slot_values.at(dispatched.src_info[row].k);
      std::fill_n(y.begin() + row * hidden, hidden, rocep::float_to_bf16(value));
    }
    std::vector<bf16_bits> out(hidden, kBf16NaN);
    rocep::CombineArgs args;
    args.expert_outputs = y.data();
    args.row_weights = dispatched.recv_weights.data();
    args.out = out.data();
    ep.combine_send(args, nullptr);
    ep.combine_recv(args, nullptr);
    EXPECT_EQ(out, std::vector<bf16_bits>(hidden, rocep::float_to_bf16(slot_values[2])));
  }
}

TEST(ReferenceEpTest, SplitCallsEqualEpGroupAndRepeatBitIdentically) {
  const Problem problem({256, 8, 16, 32, 4}, Routing::kMasked);
  SCOPED_TRACE(problem.trace());
  ReferenceEp ep(world_bootstrap(), problem.config);
  rocep::EpGroup group(MPI_COMM_WORLD, problem.config, rocep::Backend::kCpuReference);
  EXPECT_EQ(group.backend(), rocep::Backend::kCpuReference);
  EXPECT_EQ(group.max_recv_rows(), problem.max_recv_rows());
  EXPECT_EQ(group.num_local_experts(), problem.local_experts());

  const DispatchBuffers split = dispatch(ep, problem);
  expect_dispatch_matches(split, problem);
  const std::vector<bf16_bits> y = expert_outputs(problem, split);
  const std::vector<bf16_bits> shared = shared_expert_outputs(problem);
  const std::vector<bf16_bits> split_out = combine(ep, problem, split, Combine::kWeightedWithSharedExpert);

  for (int run = 0; run < 2; ++run) {
    SCOPED_TRACE("EpGroup run " + std::to_string(run));
    DispatchBuffers fused(problem);
    group.dispatch(problem.mine().view(), fused.view());
    EXPECT_TRUE(fused.same_bytes_as(split));
    std::vector<bf16_bits> out = poisoned<bf16_bits>(split_out.size());
    rocep::CombineArgs args;
    args.expert_outputs = y.data();
    args.row_weights = fused.recv_weights.data();
    args.shared_expert_output = shared.data();
    args.out = out.data();
    group.combine(args);
    EXPECT_TRUE(same_bytes(out, split_out));
  }
}

// Tokens written into the group's input buffer dispatch exactly like a copy of them elsewhere; a pointer
// into the buffer anywhere but at its start is rejected on its rank only, and so are token_scales passed with
// a scaled format's tokens in the buffer (the buffer's rows hold their scales).
TEST(ReferenceEpTest, TokensInTheInputBufferDispatchLikeAnyOther) {
  const Problem problem({256, 8, 16, 32, 4}, Routing::kMasked);
  SCOPED_TRACE(problem.trace());
  ReferenceEp ep(world_bootstrap(), problem.config);
  const DispatchBuffers expected = dispatch(ep, problem);
  rocep::EpGroup group(MPI_COMM_WORLD, problem.config, rocep::Backend::kCpuReference);
  auto* buffer = static_cast<bf16_bits*>(group.dispatch_input_buffer());
  ASSERT_NE(buffer, nullptr);
  EXPECT_EQ(group.dispatch_input_buffer(), buffer) << "the buffer moved";
  const RankInputs& mine = problem.mine();
  std::copy(mine.tokens.begin(), mine.tokens.end(), buffer);
  rocep::DispatchInputs inputs = mine.view();
  inputs.tokens = buffer;
  DispatchBuffers in_place(problem);
  group.dispatch(inputs, in_place.view());
  EXPECT_TRUE(in_place.same_bytes_as(expected));

  std::vector<bf16_bits> y = expert_outputs(problem, in_place);
  std::vector<bf16_bits> out(std::size_t{1} * problem.config.max_tokens_per_rank * problem.config.hidden);
  group.combine({y.data(), in_place.recv_weights.data(), nullptr, out.data()});

  // Misplaced on the last rank only: it takes part with zero tokens and alone throws.
  const bool last = problem.rank == problem.world - 1;
  if (last)
    inputs.tokens = buffer + problem.config.hidden;  // one row in
  try {
    group.dispatch(inputs, in_place.view());
    EXPECT_FALSE(last) << "no InvalidInputError on the last rank";
  } catch (const rocep::InvalidInputError& error) {
    EXPECT_TRUE(last) << error.what();
    EXPECT_TRUE(names(error.what(), "rank", problem.world - 1)) << error.what();
    EXPECT_PRED_FORMAT2(::testing::IsSubstring, "dispatch_input_buffer()", error.what());
  }
  y = expert_outputs(problem, in_place);
  group.combine({y.data(), in_place.recv_weights.data(), nullptr, out.data()});

  rocep::EpConfig fp8 = problem.config;
  fp8.dispatch_format = rocep::TokenFormat::kFp8Block128;
  rocep::EpGroup fp8_group(MPI_COMM_WORLD, fp8, rocep::Backend::kCpuReference);
  const std::size_t row_bytes = rocep::format_input_row_bytes(fp8.dispatch_format, fp8.hidden);
  EXPECT_EQ(row_bytes, std::size_t{256 + 16}) << "256 codes, 2 float32 scales padded to 16 bytes";
  auto* fp8_buffer = static_cast<uint8_t*>(fp8_group.dispatch_input_buffer());
  std::fill(fp8_buffer, fp8_buffer + std::size_t{1} * fp8.max_tokens_per_rank * row_bytes, uint8_t{0x38});
  rocep::DispatchInputs fp8_inputs = mine.view();
  fp8_inputs.tokens = fp8_buffer;
  const std::vector<float> scales(std::size_t{2} * mine.num_tokens + 1, 1.0f);
  if (last)
    fp8_inputs.token_scales = scales.data();
  DispatchBuffers fp8_out(problem);
  std::vector<uint8_t> fp8_tokens(problem.max_recv_rows() * fp8.hidden);
  std::vector<uint8_t> fp8_scales(
      rocep::format_scale_tensor_bytes(fp8.dispatch_format, problem.max_recv_rows(), fp8.hidden));
  rocep::DispatchOutputs fp8_outputs = fp8_out.view();
  fp8_outputs.recv_tokens = fp8_tokens.data();
  fp8_outputs.recv_scales = fp8_scales.data();
  try {
    fp8_group.dispatch(fp8_inputs, fp8_outputs);
    EXPECT_FALSE(last) << "no InvalidInputError on the last rank";
  } catch (const rocep::InvalidInputError& error) {
    EXPECT_TRUE(last) << error.what();
    EXPECT_PRED_FORMAT2(::testing::IsSubstring, "token_scales", error.what());
  }
}

// --- quantised formats ----------------------------------------------------------------------------------

// Dispatch in a scaled format from bf16 tokens: every row holds exactly the source token as
// rocep::reference::quantize_row encodes it, its scales sit where the format's layout says, padding rows
// are zero and everything past the last row keeps its poison. Passing the tokens in already quantised
// (with their scales), or writing them so into the group's input buffer, gives the same bytes.
TEST(ReferenceEpFormats, RowsAreTheSourceTokensQuantisedInTheFormatLayout) {
  struct Case {
    rocep::TokenFormat format;
    rocep::Fp8Encoding encoding;
    int alignment;
  };
  const Case cases[] = {{rocep::TokenFormat::kFp8Block128, rocep::Fp8Encoding::kE4m3fn, 4},
                        {rocep::TokenFormat::kFp8Block128, rocep::Fp8Encoding::kE4m3fnuz, 1},
                        {rocep::TokenFormat::kMxfp8, rocep::Fp8Encoding::kE4m3fn, 1},
                        {rocep::TokenFormat::kMxfp4, rocep::Fp8Encoding::kE4m3fn, 2},
                        {rocep::TokenFormat::kNvfp4, rocep::Fp8Encoding::kE4m3fn, 128}};
  const float global_scale = 448.0f * 6.0f / 4.0f;
  for (const Case& c : cases) {
    Problem problem({512, 4, 4, 24, c.alignment}, Routing::kMasked);
    problem.config.dispatch_format = c.format;
    problem.config.fp8_encoding = c.encoding;
    SCOPED_TRACE(problem.trace());
    const int hidden = problem.config.hidden;
    const std::size_t rows = problem.max_recv_rows();
    const std::size_t payload_bytes = rocep::format_payload_bytes(c.format, hidden);
    const std::size_t scale_bytes = rocep::format_scale_bytes(c.format, hidden);
    const int blocks = hidden / rocep::format_block_elements(c.format);
    const std::size_t scale_size = scale_bytes / blocks;
    const auto layout = static_cast<rocep::device::Format>(c.format);

    // Each rank's tokens quantised on the host, as a caller that quantises before dispatch would.
    auto quantised = [&](const RankInputs& in, std::vector<uint8_t>& payloads, std::vector<uint8_t>& scales) {
      payloads.assign(std::max<std::size_t>(in.num_tokens * payload_bytes, 1), 0);
      scales.assign(std::max<std::size_t>(in.num_tokens * scale_bytes, 1), 0);
      rocep::reference::quantize_bf16_rows(c.format, c.encoding, in.tokens.data(), in.num_tokens, hidden,
                                           global_scale, payloads.data(), scales.data());
    };

    ReferenceEp ep(world_bootstrap(), problem.config);
    // Quantised by dispatch, passed in quantised with their scales, written into the input buffer.
    enum Inputs { kBf16, kQuantised, kInBuffer };
    std::vector<std::vector<uint8_t>> recv_tokens(3), recv_scales(3);
    for (const Inputs given : {kBf16, kQuantised, kInBuffer}) {
      std::vector<uint8_t> my_payloads, my_scales;
      quantised(problem.mine(), my_payloads, my_scales);
      rocep::DispatchInputs inputs = problem.mine().view();
      inputs.global_scale = &global_scale;
      if (given == kQuantised) {
        inputs.tokens = my_payloads.data();
        inputs.token_scales = my_scales.data();
      } else if (given == kInBuffer) {
        auto* buffer = static_cast<uint8_t*>(ep.dispatch_input_buffer());
        const std::size_t row_bytes = rocep::format_input_row_bytes(c.format, hidden);
        ASSERT_GE(row_bytes, payload_bytes + scale_bytes);
        rocep::reference::write_input_rows(c.format, hidden, my_payloads.data(), my_scales.data(),
                                           problem.mine().num_tokens, buffer);
        for (int token = 0; token < problem.mine().num_tokens; ++token) {  // the layout ep_group.hpp states
          ASSERT_TRUE(std::memcmp(buffer + token * row_bytes, my_payloads.data() + token * payload_bytes,
                                  payload_bytes) == 0 &&
                      std::memcmp(buffer + token * row_bytes + payload_bytes,
                                  my_scales.data() + token * scale_bytes, scale_bytes) == 0)
              << "input buffer row " << token;
        }
        inputs.tokens = buffer;
        inputs.global_scale = nullptr;  // nothing to quantise
      }
      DispatchBuffers buffers(problem);
      std::vector<uint8_t>& payload_out = recv_tokens[given] = poisoned<uint8_t>(rows * payload_bytes);
      std::vector<uint8_t>& scales_out = recv_scales[given] =
          poisoned<uint8_t>(rocep::format_scale_tensor_bytes(c.format, rows, hidden));
      rocep::DispatchOutputs outputs = buffers.view();
      outputs.recv_tokens = payload_out.data();
      outputs.recv_scales = scales_out.data();
      ep.dispatch_send(inputs, nullptr);
      ep.dispatch_recv(outputs, nullptr);
    }
    EXPECT_TRUE(same_bytes(recv_tokens[kBf16], recv_tokens[kQuantised]) &&
                same_bytes(recv_scales[kBf16], recv_scales[kQuantised]))
        << "tokens passed in quantised arrive differently from tokens quantised by dispatch";
    EXPECT_TRUE(same_bytes(recv_tokens[kBf16], recv_tokens[kInBuffer]) &&
                same_bytes(recv_scales[kBf16], recv_scales[kInBuffer]))
        << "tokens quantised into the input buffer arrive differently from tokens quantised by dispatch";

    // Row by row against the naive layout.
    const ExpectedDispatch expected = naive_dispatch(problem);
    const std::size_t used = expected.src_info.size();
    std::vector<std::vector<uint8_t>> payloads(problem.world), scales(problem.world);
    for (int source = 0; source < problem.world; ++source) {
      quantised(problem.inputs[source], payloads[source], scales[source]);
    }
    const std::vector<uint8_t> zeros(std::max(payload_bytes, scale_bytes), 0);
    int wrong_rows = 0;
    for (std::size_t row = 0; row < used; ++row) {
      const SrcInfo& origin = expected.src_info[row];
      const uint8_t* want_payload =
          origin.rank < 0 ? zeros.data() : payloads[origin.rank].data() + origin.token * payload_bytes;
      const uint8_t* want_scales =
          origin.rank < 0 ? zeros.data() : scales[origin.rank].data() + origin.token * scale_bytes;
      bool same = std::memcmp(recv_tokens[0].data() + row * payload_bytes, want_payload, payload_bytes) == 0;
      for (int block = 0; block < blocks; ++block) {
        const std::size_t offset = rocep::device::scale_offset(layout, row, block, rows, hidden);
        same =
            same && std::memcmp(&recv_scales[0][offset], want_scales + block * scale_size, scale_size) == 0;
      }
      wrong_rows += same ? 0 : 1;
    }
    EXPECT_EQ(wrong_rows, 0) << "rows whose payload or scales are not their source token's";
    EXPECT_TRUE(still_poisoned(recv_tokens[0], used * payload_bytes)) << "payload written past row " << used;
    int scales_past_end = 0;
    for (std::size_t row = used; row < rows; ++row) {
      for (int block = 0; block < blocks; ++block) {
        const std::size_t offset = rocep::device::scale_offset(layout, row, block, rows, hidden);
        scales_past_end += std::all_of(&recv_scales[0][offset], &recv_scales[0][offset] + scale_size,
                                       [](uint8_t byte) { return byte == kPoison; })
                               ? 0
                               : 1;
      }
    }
    EXPECT_EQ(scales_past_end, 0) << "scales written for rows past row " << used;
  }
}

TEST(ReferenceEpFormats, MissingScaleBuffersAndGlobalScaleAreRejected) {
  Problem problem(kSmallShape, Routing::kUniform);
  problem.config.dispatch_format = rocep::TokenFormat::kNvfp4;  // hidden 64: one swizzled scale tile wide
  SCOPED_TRACE(problem.trace());
  rocep::EpGroup group(MPI_COMM_WORLD, problem.config, rocep::Backend::kCpuReference);
  rocep::DispatchInputs inputs = problem.mine().view();
  // Every rank passes the same bad inputs: each takes part with zero tokens and throws.
  EXPECT_THROW(group.dispatch_send(inputs), rocep::InvalidInputError)
      << "nvfp4 from bf16 without a global scale";
  DispatchBuffers buffers(problem);
  EXPECT_THROW(group.dispatch_recv(buffers.view()), rocep::InvalidInputError) << "no recv_scales";
}

// --- invalid input: the contract of EpGroup, on the CPU reference ----------------------------------------

// The problem as dispatch sees it once the last rank's slot (token, slot) is dropped.
Problem without_slot(Problem problem, int rank, int token, int slot) {
  problem.inputs[rank].topk_ids[token * problem.config.top_k + slot] = -1;
  return problem;
}

// The problem as dispatch sees it once the last rank takes part with zero tokens.
Problem without_tokens(Problem problem, int rank) {
  problem.inputs[rank] = RankInputs{};
  return problem;
}

class EpGroupInvalidInputTest : public ::testing::Test {
 protected:
  EpGroupInvalidInputTest()
      : problem_(kSmallShape, Routing::kUniform),
        trace_(__FILE__, __LINE__, problem_.trace()),
        group_(MPI_COMM_WORLD, problem_.config, rocep::Backend::kCpuReference),
        last_rank_(problem_.world - 1),
        last_(problem_.rank == last_rank_),
        bad_token_(problem_.inputs[last_rank_].num_tokens / 2) {}

  // A dispatch in which the last rank passes `last_rank_inputs`; the message of the InvalidInputError this
  // rank got from the call ("" if none); then the layout against `expected`, and a combine.
  std::string dispatch_then_check(const RankInputs& last_rank_inputs, const Problem& expected) {
    DispatchBuffers buffers(problem_);
    std::string message;
    try {
      group_.dispatch(last_ ? last_rank_inputs.view() : problem_.mine().view(), buffers.view());
    } catch (const rocep::InvalidInputError& error) {
      message = error.what();
    }
    expect_dispatch_matches(buffers, expected);
    combine_and_check(buffers, expected);
    return message;
  }

  // A weighted combine of `dispatched` equals the naive one of `expected` on this rank.
  void combine_and_check(const DispatchBuffers& dispatched, const Problem& expected) {
    const std::vector<bf16_bits> y = expert_outputs(expected, dispatched);
    std::vector<bf16_bits> out =
        poisoned<bf16_bits>(std::size_t{1} * problem_.config.max_tokens_per_rank * problem_.config.hidden);
    group_.combine({y.data(), dispatched.recv_weights.data(), nullptr, out.data()});
    expect_combine_matches(out, naive_weighted_combine(expected, false), problem_.config.hidden);
  }

  // The next whole step on the group is correct on every rank.
  void expect_usable() {
    SCOPED_TRACE("the step after");
    EXPECT_EQ(dispatch_then_check(problem_.mine(), problem_), "");
    EXPECT_FALSE(group_.poll_error()) << group_.poll_error().message;
  }

  Problem problem_;
  ::testing::ScopedTrace trace_;
  rocep::EpGroup group_;
  int last_rank_;
  bool last_;
  int bad_token_;
};

TEST_F(EpGroupInvalidInputTest, ExpertIdOutOfRangeIsRecordedOnItsRankAndItsSlotDropped) {
  const int slot = problem_.config.top_k - 1;
  for (int32_t bad_id : {problem_.config.num_experts, -2}) {
    SCOPED_TRACE("expert id " + std::to_string(bad_id));
    RankInputs inputs = problem_.inputs[last_rank_];
    inputs.topk_ids[bad_token_ * problem_.config.top_k + slot] = bad_id;
    EXPECT_EQ(dispatch_then_check(inputs, without_slot(problem_, last_rank_, bad_token_, slot)), "");
    const rocep::RecordedError recorded = group_.poll_error();
    EXPECT_EQ(static_cast<bool>(recorded), last_);
    if (last_) {
      EXPECT_TRUE(names(recorded.message, "rank", last_rank_)) << recorded.message;
      EXPECT_TRUE(names(recorded.message, "token", bad_token_)) << recorded.message;
      EXPECT_TRUE(names(recorded.message, "slot", slot)) << recorded.message;
      EXPECT_THROW(group_.synchronize(), rocep::InvalidInputError);
    }
    EXPECT_NO_THROW(group_.synchronize()) << "synchronize() clears what it threw";
    expect_usable();
  }
}

TEST_F(EpGroupInvalidInputTest, ExpertNamedTwiceByOneTokenIsRecordedOnItsRank) {
  const int slot = problem_.config.top_k - 1;
  const int top_k = problem_.config.top_k;
  RankInputs inputs = problem_.inputs[last_rank_];
  inputs.topk_ids[bad_token_ * top_k + slot] = inputs.topk_ids[bad_token_ * top_k];
  EXPECT_EQ(dispatch_then_check(inputs, without_slot(problem_, last_rank_, bad_token_, slot)), "");
  if (last_) {
    const std::string message = group_.poll_error().message;
    EXPECT_PRED_FORMAT2(::testing::IsSubstring, "named twice", message);
    EXPECT_TRUE(names(message, "slot", slot)) << message;
  }
  EXPECT_EQ(static_cast<bool>(group_.poll_error()), last_);
  (void)group_.poll_error();
  if (last_) {
    EXPECT_THROW(group_.synchronize(), rocep::InvalidInputError);
  }
  expect_usable();
}

TEST_F(EpGroupInvalidInputTest, BadTokenCountOrNullPointerStaysOnItsRank) {
  const int max_tokens = problem_.config.max_tokens_per_rank;
  for (int variant = 0; variant < 3; ++variant) {
    RankInputs inputs = problem_.inputs[last_rank_];
    std::string expected_words;
    if (variant < 2) {
      inputs.num_tokens = variant == 0 ? max_tokens + 1 : -1;
      expected_words = "num_tokens = " + std::to_string(inputs.num_tokens);
    } else {
      inputs.topk_weights.clear();
      inputs.topk_weights.shrink_to_fit();  // data() null
      expected_words = "dispatch: rank " + std::to_string(last_rank_) + " passed a null topk_weights pointer";
    }
    SCOPED_TRACE(expected_words);
    const std::string message = dispatch_then_check(inputs, without_tokens(problem_, last_rank_));
    EXPECT_EQ(message.empty(), !last_) << message;
    if (last_) {
      EXPECT_TRUE(names(message, "rank", last_rank_)) << message;
      EXPECT_PRED_FORMAT2(::testing::IsSubstring, expected_words, message);
    }
    expect_usable();
  }
}

TEST_F(EpGroupInvalidInputTest, NullOutputIsRefusedOnItsRankAndMayBeRepeated) {
  DispatchBuffers buffers(problem_);
  rocep::DispatchOutputs outputs = buffers.view();
  if (last_) {
    outputs.recv_weights = nullptr;
  }
  group_.dispatch_send(problem_.mine().view());
  if (last_) {
    try {
      group_.dispatch_recv(outputs);
      ADD_FAILURE() << "no InvalidInputError on this rank";
    } catch (const rocep::InvalidInputError& error) {
      EXPECT_EQ(std::string(error.what()),
                "dispatch_recv: rank " + std::to_string(last_rank_) + " passed a null recv_weights pointer");
    }
  }
  group_.dispatch_recv(buffers.view());  // the valid repetition (the first call on the other ranks)
  expect_dispatch_matches(buffers, problem_);
  combine_and_check(buffers, problem_);
  expect_usable();
}

// The same for the fused dispatch, whose error names dispatch (the call made) and each null output.
TEST_F(EpGroupInvalidInputTest, NullOutputsOfAFusedDispatchAreRefusedNamingDispatch) {
  DispatchBuffers buffers(problem_);
  rocep::DispatchOutputs outputs = buffers.view();
  outputs.recv_tokens = nullptr;
  outputs.src_info = nullptr;
  if (last_) {
    try {
      group_.dispatch(problem_.mine().view(), outputs);
      ADD_FAILURE() << "no InvalidInputError on this rank";
    } catch (const rocep::InvalidInputError& error) {
      EXPECT_EQ(std::string(error.what()), "dispatch: rank " + std::to_string(last_rank_) +
                                               " passed null recv_tokens and src_info pointers");
    }
  }
  group_.dispatch(problem_.mine().view(), buffers.view());  // the valid repetition (the first elsewhere)
  expect_dispatch_matches(buffers, problem_);
  combine_and_check(buffers, problem_);
  expect_usable();
}

// Null combine arguments are refused naming the call made and each null argument.
TEST_F(EpGroupInvalidInputTest, NullCombineArgumentsAreRefusedByName) {
  DispatchBuffers buffers(problem_);
  group_.dispatch(problem_.mine().view(), buffers.view());
  const std::vector<bf16_bits> y = expert_outputs(problem_, buffers);
  std::vector<bf16_bits> out(std::size_t{1} * problem_.config.max_tokens_per_rank * problem_.config.hidden);
  if (last_) {
    const std::string rank = ": rank " + std::to_string(last_rank_);
    const rocep::CombineArgs null_out{y.data(), buffers.recv_weights.data(), nullptr, nullptr};
    const rocep::CombineArgs null_both{nullptr, buffers.recv_weights.data(), nullptr, nullptr};
    const rocep::CombineArgs null_rows{nullptr, buffers.recv_weights.data(), nullptr, out.data()};
    try {
      group_.combine(null_out);
      ADD_FAILURE() << "a combine with a null out was accepted";
    } catch (const rocep::InvalidInputError& error) {
      EXPECT_EQ(std::string(error.what()), "combine" + rank + " passed a null out pointer");
    }
    try {
      group_.combine(null_both);
      ADD_FAILURE() << "a combine with null expert_outputs and out was accepted";
    } catch (const rocep::InvalidInputError& error) {
      EXPECT_EQ(std::string(error.what()), "combine" + rank + " passed null expert_outputs and out pointers");
    }
    try {
      group_.combine_send(null_rows);
      ADD_FAILURE() << "a combine_send with null expert_outputs was accepted";
    } catch (const rocep::InvalidInputError& error) {
      EXPECT_EQ(std::string(error.what()), "combine_send" + rank + " passed a null expert_outputs pointer");
    }
  }
  combine_and_check(buffers, problem_);  // the valid call (the first on the other ranks)
  expect_usable();
}

TEST_F(EpGroupInvalidInputTest, EpilogueOrSharedExpertOfAnUnweightedCombineOrAnUnalignedStrideIsRefused) {
  DispatchBuffers buffers(problem_);
  group_.dispatch(problem_.mine().view(), buffers.view());
  const std::vector<bf16_bits> y = expert_outputs(problem_, buffers);
  std::vector<bf16_bits> out = poisoned<bf16_bits>(std::size_t{1} * problem_.config.max_tokens_per_rank *
                                                   problem_.config.top_k * problem_.config.hidden);
  if (last_) {
    rocep::CombineArgs unweighted{y.data(), nullptr, nullptr, out.data()};
    unweighted.factor = 2.0f;
    rocep::CombineArgs unaligned{y.data(), buffers.recv_weights.data(), nullptr, out.data()};
    unaligned.out_row_stride = static_cast<std::size_t>(problem_.config.hidden) + 3;
    const rocep::CombineArgs shared{y.data(), nullptr, y.data(), out.data()};  // nothing to add it to
    for (const auto& [args, named] :
         {std::pair{unweighted,
                    "epilogue (factor, token_factors, residual or out_row_stride) to an unweighted"},
          std::pair{unaligned, "out_row_stride = "},
          std::pair{shared, "shared_expert_output to an unweighted combine"}}) {
      try {
        group_.combine(args);
        ADD_FAILURE() << "no InvalidInputError for the " << named;
      } catch (const rocep::InvalidInputError& error) {
        EXPECT_NE(std::string(error.what()).find(named), std::string::npos) << error.what();
        EXPECT_TRUE(names(error.what(), "rank", last_rank_)) << error.what();
      }
    }
  }
  combine_and_check(buffers, problem_);  // the valid call (the first on the other ranks)
  expect_usable();
}

TEST_F(EpGroupInvalidInputTest, CombineBetweenDispatchSendAndRecvIsOutOfOrder) {
  group_.dispatch_send(problem_.mine().view());
  std::vector<bf16_bits> expert_outputs(problem_.max_recv_rows() * problem_.config.hidden, bf16_bits{0x3f80});
  std::vector<bf16_bits> out(std::max(problem_.mine().num_tokens, 1) * problem_.config.hidden);
  rocep::CombineArgs args;
  args.expert_outputs = expert_outputs.data();
  args.out = out.data();
  EXPECT_THROW(group_.combine_send(args), rocep::CallOrderError);
  DispatchBuffers buffers(problem_);
  group_.dispatch_recv(buffers.view());
  expect_dispatch_matches(buffers, problem_);
  combine_and_check(buffers, problem_);
}

TEST_F(EpGroupInvalidInputTest, WeightedOnSomeRanksOnlyIsRecordedOnEveryRank) {
  if (problem_.world < 2)
    GTEST_SKIP() << "needs 2 ranks to disagree";
  DispatchBuffers buffers(problem_);
  group_.dispatch(problem_.mine().view(), buffers.view());
  std::vector<bf16_bits> expert_outputs(problem_.max_recv_rows() * problem_.config.hidden, bf16_bits{0x3f80});
  std::vector<bf16_bits> out(std::max(problem_.mine().num_tokens, 1) * problem_.config.top_k *
                             problem_.config.hidden);
  rocep::CombineArgs args;
  args.expert_outputs = expert_outputs.data();
  args.row_weights = last_ ? nullptr : buffers.recv_weights.data();
  args.out = out.data();
  group_.combine(args);
  const rocep::RecordedError recorded = group_.poll_error();
  ASSERT_TRUE(recorded);
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, "row_weights", recorded.message);
  EXPECT_THROW(group_.synchronize(), rocep::InvalidInputError);
  expect_usable();
}

// A field that validates on every rank but differs on one (here whether the group keeps a combine input
// buffer) is refused on every rank.
TEST(EpGroupConstruction, ConfigThatDiffersOnOneRankThrowsOnEveryRank) {
  if (world_size() == 1) {
    GTEST_SKIP() << "one rank agrees with itself";
  }
  EpConfig config;
  config.num_experts = 8 * world_size();
  config.layout = rocep::Layout::kPerToken;
  config.combine_input_buffer = world_rank() != world_size() - 1;
  try {
    rocep::EpGroup group(MPI_COMM_WORLD, config, rocep::Backend::kCpuReference);
    ADD_FAILURE() << "no ConfigError on this rank";
  } catch (const rocep::ConfigError& error) {
    const std::string last = std::to_string(world_size() - 1);
    EXPECT_EQ(std::string(error.what())
                  .find("EpGroup: rank " + last + " differs from rank 0 in " +
                        "EpConfig.combine_input_buffer (false on rank " + last +
                        ", true on rank 0); every rank must pass the same"),
              0u)
        << error.what();
  }
}

TEST(EpGroupConstruction, ConfigInvalidOnOneRankThrowsOnEveryRank) {
  EpConfig config;
  config.num_experts = 8 * world_size();
  if (world_rank() == world_size() - 1)
    config.hidden = 0;
  try {
    rocep::EpGroup group(MPI_COMM_WORLD, config, rocep::Backend::kCpuReference);
    ADD_FAILURE() << "no ConfigError on this rank";
  } catch (const rocep::ConfigError& error) {
    const std::string message = error.what();
    const std::string last = std::to_string(world_size() - 1);
    // At one rank there is nobody to disagree with: the validation step names the field.
    EXPECT_EQ(
        message.find(world_size() == 1
                         ? "EpGroup: rank 0 failed at validating the EpConfig, backend and "
                           "ROCEP_GPUS_PER_NODE: EpConfig.hidden = 0 is invalid"
                         : "EpGroup: rank " + last + " differs from rank 0 in EpConfig.hidden (0 on rank " +
                               last + ", 7168 on rank 0)"),
        0u)
        << message;
  }
}

// A bootstrap that says rank() = `rank` and size() = `size` and gathers through `ranks` (MPI_COMM_WORLD's
// ranks), or through no one where `ranks` is null (then a collective is a failure of the test).
class ClaimedBootstrap final : public rocep::Bootstrap {
 public:
  ClaimedBootstrap(int rank, int size, std::shared_ptr<rocep::Bootstrap> ranks = nullptr)
      : rank_(rank), size_(size), ranks_(std::move(ranks)) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void all_gather(const void* mine, void* all, std::size_t bytes_per_rank) override {
    ASSERT_NE(ranks_, nullptr) << "a collective before the bootstrap was checked";
    ranks_->all_gather(mine, all, bytes_per_rank);
  }
  void barrier() override {
    ASSERT_NE(ranks_, nullptr) << "a collective before the bootstrap was checked";
    ranks_->barrier();
  }

 private:
  int rank_;
  int size_;
  std::shared_ptr<rocep::Bootstrap> ranks_;
};

// A bootstrap whose rank() lies outside [0, size()) or whose size() is not positive is refused on its rank
// before any collective, naming both.
TEST(EpGroupConstruction, BootstrapWhoseRankLiesOutsideItsSizeIsRefusedBeforeAnyCollective) {
  EpConfig config;
  config.num_experts = 8;
  for (const auto& [rank, size] : {std::pair{1, 1}, std::pair{-1, 2}, std::pair{0, 0}, std::pair{3, 2}}) {
    try {
      rocep::EpGroup group(std::make_shared<ClaimedBootstrap>(rank, size), config,
                           rocep::Backend::kCpuReference);
      ADD_FAILURE() << "no ConfigError for rank() " << rank << ", size() " << size;
    } catch (const rocep::ConfigError& error) {
      EXPECT_EQ(std::string(error.what()),
                "EpGroup: the bootstrap's rank() = " + std::to_string(rank) +
                    " and size() = " + std::to_string(size) +
                    " are invalid: allowed are size() >= 1 and rank() in [0, size() - 1]");
    }
  }
}

// Bootstraps whose rank() is not their place in all_gather's output (each says the next rank's number), or
// whose size() differs on one rank, are refused on every rank, naming the first place that disagrees.
TEST(EpGroupConstruction, RanksOutOfTheAllGathersOrderOrSizesThatDifferAreRefusedOnEveryRank) {
  if (world_size() == 1) {
    GTEST_SKIP() << "one rank is always at its own place";
  }
  EpConfig config;
  config.num_experts = 8 * world_size();
  const auto world = std::make_shared<rocep::MpiBootstrap>(MPI_COMM_WORLD);
  const int last = world_size() - 1;
  const std::string of =
      " of the bootstrap's all_gather (of " + std::to_string(world_size()) + ") come from ";
  try {
    rocep::EpGroup group(
        std::make_shared<ClaimedBootstrap>((world_rank() + 1) % world_size(), world_size(), world), config,
        rocep::Backend::kCpuReference);
    ADD_FAILURE() << "no ConfigError on this rank for ranks out of order";
  } catch (const rocep::ConfigError& error) {
    EXPECT_EQ(std::string(error.what())
                  .find("EpGroup: the bytes at place 0" + of +
                        "a rank whose bootstrap says rank() = 1, size() = " + std::to_string(world_size()) +
                        ": every rank's rank() must be its place in all_gather's output"),
              0u)
        << error.what();
  }
  // The last rank says one rank more than there are: its own gather has room for it, and the others see it.
  const int claimed = world_size() + (world_rank() == last ? 1 : 0);
  try {
    rocep::EpGroup group(std::make_shared<ClaimedBootstrap>(world_rank(), claimed, world), config,
                         rocep::Backend::kCpuReference);
    ADD_FAILURE() << "no ConfigError on this rank for a size that differs";
  } catch (const rocep::ConfigError& error) {
    if (world_rank() != last) {
      EXPECT_EQ(std::string(error.what())
                    .find("EpGroup: the bytes at place " + std::to_string(last) + of +
                          "a rank whose bootstrap says rank() = " + std::to_string(last) +
                          ", size() = " + std::to_string(world_size() + 1) + ": "),
                0u)
          << error.what();
    }
  }
  // The same bootstraps at their own places still make a group.
  rocep::EpGroup group(std::make_shared<ClaimedBootstrap>(world_rank(), world_size(), world), config,
                       rocep::Backend::kCpuReference);
  EXPECT_EQ(group.rank(), world_rank());
}

// A config invalid alike on every rank is refused on every rank naming the rank and the step of creation
// that failed, as a failure in any other step is.
TEST(EpGroupConstruction, ConfigInvalidOnEveryRankNamesTheRankAndTheStep) {
  EpConfig config;
  config.num_experts = world_size() == 1 ? 0 : 2 * world_size() + 1;
  try {
    rocep::EpGroup group(MPI_COMM_WORLD, config, rocep::Backend::kCpuReference);
    ADD_FAILURE() << "no ConfigError on this rank";
  } catch (const rocep::ConfigError& error) {
    const std::string step =
        "EpGroup: rank 0 failed at validating the EpConfig, backend and ROCEP_GPUS_PER_NODE: ";
    EXPECT_EQ(std::string(error.what()),
              step + (world_size() == 1 ? "EpConfig.num_experts = 0 is invalid: allowed range is [1, 16384]"
                                        : "EpConfig.num_experts = " + std::to_string(config.num_experts) +
                                              " is invalid: must be divisible by the world size " +
                                              std::to_string(world_size())));
  }
}

// A group moved from refuses every call with CallOrderError (it held a null implementation: a crash); the
// group it was moved to works.
TEST(EpGroupConstruction, AGroupMovedFromRefusesItsCalls) {
  EpConfig config;
  config.num_experts = 8 * world_size();
  rocep::EpGroup moved(MPI_COMM_WORLD, config, rocep::Backend::kCpuReference);
  rocep::EpGroup group(std::move(moved));
  EXPECT_EQ(group.rank(), world_rank());
  try {
    static_cast<void>(moved.rank());  // NOLINT(bugprone-use-after-move): what is tested
    ADD_FAILURE() << "no CallOrderError";
  } catch (const rocep::CallOrderError& error) {
    EXPECT_EQ(std::string(error.what()),
              "EpGroup: this group was moved from; call the group it was moved to");
  }
  EXPECT_THROW(moved.dispatch({}, {}), rocep::CallOrderError);  // NOLINT(bugprone-use-after-move)
  EXPECT_THROW(moved.synchronize(), rocep::CallOrderError);     // NOLINT(bugprone-use-after-move)
}

// ROCEP_GPUS_PER_NODE seen on one rank only is refused on every rank, naming the variable and its values.
TEST(EpGroupConstruction, GpusPerNodeInTheEnvironmentOfOneRankOnlyThrowsOnEveryRank) {
  if (world_size() == 1) {
    GTEST_SKIP() << "one rank agrees with itself";
  }
  const char* before = std::getenv("ROCEP_GPUS_PER_NODE");
  const std::string saved = before != nullptr ? before : "";
  const bool last = world_rank() == world_size() - 1;
  ASSERT_EQ(last ? setenv("ROCEP_GPUS_PER_NODE", "1", 1) : unsetenv("ROCEP_GPUS_PER_NODE"), 0);
  EpConfig config;
  config.num_experts = 8 * world_size();
  try {
    rocep::EpGroup group(MPI_COMM_WORLD, config, rocep::Backend::kCpuReference);
    ADD_FAILURE() << "no ConfigError on this rank";
  } catch (const rocep::ConfigError& error) {
    const std::string last_rank = std::to_string(world_size() - 1);
    EXPECT_EQ(
        std::string(error.what())
            .find("EpGroup: rank " + last_rank + " differs from rank 0 in ROCEP_GPUS_PER_NODE (1 on rank " +
                  last_rank + ", unset (or overridden by EpConfig.gpus_per_node) on rank 0)"),
        0u)
        << error.what();
  }
  ASSERT_EQ(
      before != nullptr ? setenv("ROCEP_GPUS_PER_NODE", saved.c_str(), 1) : unsetenv("ROCEP_GPUS_PER_NODE"),
      0);
}

}  // namespace
