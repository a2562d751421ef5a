// The memory traffic of the dispatch and combine calls of one rank, on one GPU and without the links: what
// the HBM alone allows for each step, the floor under the EP benchmark's prefill figures. Each step moves
// the bytes its kernels move, in the same pattern:
//
//   dispatch send       stage the rank's bf16 tokens (a device-to-device copy)
//   dispatch receive    every received token (world x tokens) read once and written into its rows (top_k /
//                       world per token), bf16 and fp8 payloads, with the dispatch receive's own copy routine
//   combine send        every received token's rows summed in float32 into one bf16 partial
//   combine receive     each of the rank's tokens summed from world partials
//   per-token send      the rows of another rank's tokens copied (bf16) or quantised into fp8 block-128
//                       messages, by the per-token combine send's own routines (copy_rows,
//                       quantize_rows_to_messages) on --sms multiprocessors, one block of
//                       PerTokenTuning::kCombineThreads each: the rate of those routines on a small budget,
//                       without the links
//   expanded, --sms     the bf16 dispatch receive and the combine's two sums above on --sms multiprocessors,
//                       one block each: blocks of 256 threads (the expanded dispatch receive's on a budget)
//                       and of 768 in three parts (the expanded combine's): what the multiprocessors of a
//                       budget move to and from the HBM, the bound of the expanded layout there
//
// The rows of the received tokens are a random permutation. What the links add (the peers' reads of this
// rank's staged tokens, the peers' partials landing here), signalling and the ranking are not included, so
// each figure is a lower bound of its step. Median of --iterations calls (events between calls, after a
// warm-up), bytes read + written, and the fraction of the HBM copy peak measured in the same run.
//
//   rocep_memory_bench [--tokens=4096] [--hidden=7168] [--top_k=8] [--world=2] [--iterations=30] [--sms=24]
#include <algorithm>
#include <cstdio>
#include <exception>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "bench/device_timing.hpp"
#include "bench/flags.hpp"
#include "hip/bf16.hpp"
#include "hip/ep_kernels.hpp"
#include "hip/quantize_message.hpp"
#include "hip/vector_copy.hpp"
#include "host/device.hpp"
#include "rocep/errors.hpp"

namespace {

using rocep::DeviceBuffer;
using rocep::device::kStaged;
using rocep::device::kVectorBytes;
using rocep::device::StagedVectors;
using rocep::device::Vector16;

constexpr int kThreads = 256;
constexpr int kMaxFan = 16;

// Blocks of kParts parts of kThreads threads, each part working as a block of its own would in a grid of
// gridDim.x * kParts blocks: kParts 1 on the whole GPU's grid (three blocks per multiprocessor), 3 for a
// budget's grid of one wide block per multiprocessor, as the expanded combine's sub_block.
struct Part {
  int block;
  int blocks;
  int thread;
};

template <int kParts>
__device__ inline Part part_of_block() {
  return {static_cast<int>(blockIdx.x) * kParts + static_cast<int>(threadIdx.x) / kThreads,
          static_cast<int>(gridDim.x) * kParts, static_cast<int>(threadIdx.x) % kThreads};
}

// Parts over tokens: token t of `tokens` (row_bytes each) written into rows row_of[t * fan + f], f < fan.
// Every part of a block takes the same number of rounds, so that the block's barriers stay uniform.
template <int kParts>
__global__ void __launch_bounds__(kThreads* kParts)
    rocep_bench_tokens_into_rows(const uint8_t* tokens, uint8_t* rows, const int32_t* row_of, int num_tokens,
                                 int fan, int row_bytes) {
  __shared__ uint8_t* destinations[kParts][kMaxFan];
  const Part part = part_of_block<kParts>();
  const std::size_t vectors = static_cast<std::size_t>(row_bytes) / kVectorBytes;
  for (int round = 0; round * part.blocks < num_tokens; ++round) {
    const int token = round * part.blocks + part.block;
    const bool present = token < num_tokens;
    const uint8_t* source = tokens + static_cast<std::size_t>(token) * row_bytes;
    StagedVectors head;
    if (present) {
      head.load(source, part.thread, vectors, kThreads);
      if (part.thread < fan) {
        destinations[threadIdx.x / kThreads][part.thread] =
            rows + static_cast<std::size_t>(row_of[token * fan + part.thread]) * row_bytes;
      }
    }
    __syncthreads();
    if (present) {
      rocep::device::copy_bytes16_to_many(destinations[threadIdx.x / kThreads], fan, source, row_bytes,
                                          part.thread, kThreads, head);
    }
    __syncthreads();  // the destinations are rewritten for the next token
  }
}

// Parts over outputs: out[o] = bf16 of the float32 fma sum of the bf16 rows row_of[o * fan + f], f < fan.
template <int kParts>
__global__ void __launch_bounds__(kThreads* kParts)
    rocep_bench_rows_summed(const uint8_t* rows, uint8_t* out, const int32_t* row_of, int num_outputs,
                            int fan, int row_bytes) {
  const Part part = part_of_block<kParts>();
  const int vectors = row_bytes / static_cast<int>(kVectorBytes);
  for (int output = part.block; output < num_outputs; output += part.blocks) {
    for (int first = part.thread; first < vectors; first += kStaged * kThreads) {
      float sum[kStaged][8] = {};
      for (int f = 0; f < fan; ++f) {
        const auto* row = reinterpret_cast<const Vector16*>(
            rows + static_cast<std::size_t>(row_of[output * fan + f]) * row_bytes);
        StagedVectors staged;  // lanes past the row are summed but never stored
        staged.load(row, first, vectors, kThreads);
        for (int i = 0; i < kStaged; ++i) {
          const uint32_t words[4] = {staged.vector[i].x, staged.vector[i].y, staged.vector[i].z,
                                     staged.vector[i].w};
          for (int e = 0; e < 8; ++e) {
            sum[i][e] = fmaf(
                1.0f, rocep::bf16_to_float(static_cast<uint16_t>(words[e / 2] >> (16 * (e % 2)))), sum[i][e]);
          }
        }
      }
      auto* destination = reinterpret_cast<Vector16*>(out + static_cast<std::size_t>(output) * row_bytes);
      for (int i = 0; i < kStaged; ++i) {
        const int index = first + i * kThreads;
        if (index < vectors) {
          destination[index] = Vector16{rocep::float_pair_to_bf16_canonical(sum[i][0], sum[i][1]),
                                        rocep::float_pair_to_bf16_canonical(sum[i][2], sum[i][3]),
                                        rocep::float_pair_to_bf16_canonical(sum[i][4], sum[i][5]),
                                        rocep::float_pair_to_bf16_canonical(sum[i][6], sum[i][7])};
        }
      }
    }
  }
}

// Blocks over rows, PerTokenTuning::kBatchTokens of a block's at a time, as the per-token combine send
// takes them: each bf16 row of `rows` copied into `out` (row_bytes apart), or with kQuantize quantised into
// the fp8 block-128 message of `out` at the same index (`shape`: hidden, fp8 encoding, payload bytes =
// hidden).
template <bool kQuantize>
__global__ void __launch_bounds__(rocep::device::PerTokenTuning::kCombineThreads)
    rocep_bench_send_rows(const uint8_t* rows, uint8_t* out, int num_rows, rocep::device::Shape shape) {
  using rocep::device::PerTokenTuning;
  constexpr int kBatch = PerTokenTuning::kBatchTokens;
  __shared__ const uint8_t* from[kBatch];
  __shared__ uint8_t* to[kBatch];
  const std::size_t row_bytes = static_cast<std::size_t>(shape.hidden) * 2;
  const std::size_t out_bytes = kQuantize ? rocep::device::fp8_combine_message_bytes(shape) : row_bytes;
  const int stride = static_cast<int>(gridDim.x);
  for (int first = static_cast<int>(blockIdx.x); first < num_rows; first += kBatch * stride) {
    __syncthreads();  // the batch before is done
    const int row = first + static_cast<int>(threadIdx.x) * stride;
    if (static_cast<int>(threadIdx.x) < kBatch) {
      from[threadIdx.x] = rows + static_cast<std::size_t>(row) * row_bytes;
      to[threadIdx.x] = out + static_cast<std::size_t>(row) * out_bytes;
    }
    __syncthreads();
    const int count = min(kBatch, (num_rows - first + stride - 1) / stride);
    if constexpr (kQuantize) {
      rocep::device::quantize_rows_to_messages<rocep::device::Format::kFp8Block128,
                                               PerTokenTuning::kCombineThreads,
                                               PerTokenTuning::kCombineQuantizedSlices>(from, to, count,
                                                                                        shape, 1.0f);
    } else {
      rocep::device::copy_rows<PerTokenTuning::kCombineVectorsInFlight>(
          from, to, count, static_cast<uint32_t>(row_bytes / kVectorBytes));
    }
  }
}

struct Options {
  int tokens = 4096;
  int hidden = 7168;
  int top_k = 8;
  int world = 2;
  int iterations = 30;
  int sms = 24;  // multiprocessors of the per-token send routines' steps
};

constexpr const char* kUsage =
    "usage: rocep_memory_bench [--tokens=4096] [--hidden=7168] [--top_k=8] [--world=2] [--iterations=30]\n"
    "                          [--sms=24]\n"
    "  the HBM traffic of one rank's dispatch and combine steps on one GPU, without the links (header of\n"
    "  bench/memory_bench.hip); --hidden a multiple of 128, --top_k a multiple of --world\n";

// The options, or none where --help printed the usage.
std::optional<Options> parse_options(int argc, char** argv) {
  constexpr long kMaxValue = 1L << 20;
  Options options;
  if (!rocep::bench::parse_int_flags(argc, argv,
                                     {{"tokens", &options.tokens, kMaxValue},
                                      {"hidden", &options.hidden, kMaxValue},
                                      {"top_k", &options.top_k, kMaxValue},
                                      {"world", &options.world, kMaxFan},
                                      {"iterations", &options.iterations, kMaxValue},
                                      {"sms", &options.sms, 1L << 12}},
                                     kUsage)) {
    return std::nullopt;
  }
  if (options.hidden % 128 != 0) {
    throw rocep::ConfigError("--hidden=" + std::to_string(options.hidden) + " is invalid: a multiple of 128");
  }
  if (options.top_k % options.world != 0 || options.top_k / options.world > kMaxFan) {
    throw rocep::ConfigError("--top_k=" + std::to_string(options.top_k) +
                             " is invalid with --world=" + std::to_string(options.world) +
                             ": a multiple of it, at most " + std::to_string(kMaxFan) + " times it");
  }
  return options;
}

// A random permutation of the row indices [0, rows), on the device.
rocep::DeviceBuffer random_rows(std::size_t rows, std::mt19937& random) {
  std::vector<int32_t> order(rows);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), random);
  DeviceBuffer buffer(rows * sizeof(int32_t));
  ROCEP_GPU_CHECK(hipMemcpy(buffer.get(), order.data(), rows * sizeof(int32_t), hipMemcpyHostToDevice));
  return buffer;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::optional<Options> parsed = parse_options(argc, argv);
    if (!parsed) {
      return 0;
    }
    const Options& options = *parsed;
    if (rocep::device_count() == 0) {
      std::printf("rocep_memory_bench: no GPU visible: nothing to time\n");
      return 0;
    }
    hipDeviceProp_t properties;
    ROCEP_GPU_CHECK(hipGetDeviceProperties(&properties, rocep::current_device()));
    const rocep::Stream stream;
    const double peak = rocep::bench::copy_peak_bytes_per_second(stream.get(), options.iterations);
    const int fan = options.top_k / options.world;  // rows of a received token on one rank
    const int received = options.world * options.tokens;
    const int bf16_bytes = options.hidden * 2;
    const int fp8_bytes = options.hidden;  // the payload; its scales are 1/32 more
    const int blocks = 3 * properties.multiProcessorCount;
    std::printf(
        "rocep_memory_bench: %s, %d tokens per rank, hidden %d, top_k %d, world %d: %d received tokens, "
        "%d rows each; median of %d calls\n",
        properties.name, options.tokens, options.hidden, options.top_k, options.world, received, fan,
        options.iterations);
    std::printf(
        "HBM copy peak in this run: %.1f GB/s (device-to-device copy of 1 GiB, read + written bytes)\n\n",
        peak / 1e9);

    std::mt19937 random(7);
    const std::size_t rows = static_cast<std::size_t>(received) * fan;
    const DeviceBuffer tokens(static_cast<std::size_t>(received) * bf16_bytes);
    const DeviceBuffer row_data(rows * bf16_bytes);
    const DeviceBuffer out(static_cast<std::size_t>(options.tokens) * bf16_bytes);
    const DeviceBuffer token_rows = random_rows(rows, random);
    const DeviceBuffer partial_rows = random_rows(received, random);
    ROCEP_GPU_CHECK(hipMemset(tokens.get(), 0x3f, tokens.bytes()));
    ROCEP_GPU_CHECK(hipMemset(row_data.get(), 0x3f, row_data.bytes()));
    ROCEP_GPU_CHECK(hipMemset(out.get(), 0x3f, out.bytes()));
    hipStream_t s = stream.get();

    struct Step {
      const char* name;
      double bytes;  // read + written
      double seconds;
    };
    std::vector<Step> steps;
    const auto time_step = [&](const char* name, double bytes, auto call) {
      steps.push_back({name, bytes, rocep::bench::median_seconds(s, options.iterations, call)});
      const Step& step = steps.back();
      std::printf("%-44s %10.1f us %10.1f MB %10.1f GB/s %7.1f%% of the copy peak\n", step.name,
                  step.seconds * 1e6, step.bytes / 1e6, step.bytes / step.seconds / 1e9,
                  100.0 * step.bytes / step.seconds / peak);
    };
    const double token_bytes = static_cast<double>(options.tokens) * bf16_bytes;
    time_step("dispatch send: stage bf16 tokens", 2 * token_bytes, [&] {
      ROCEP_GPU_CHECK(hipMemcpyAsync(tokens.get(), out.get(), static_cast<std::size_t>(token_bytes),
                                     hipMemcpyDeviceToDevice, s));
    });
    for (const int row_bytes : {bf16_bytes, fp8_bytes}) {
      time_step(row_bytes == bf16_bytes ? "dispatch receive: bf16 tokens into rows"
                                        : "dispatch receive: fp8 tokens into rows",
                static_cast<double>(received) * row_bytes * (1 + fan), [&] {
                  rocep_bench_tokens_into_rows<1>
                      <<<blocks, kThreads, 0, s>>>(tokens.as<uint8_t>(), row_data.as<uint8_t>(),
                                                   token_rows.as<int32_t>(), received, fan, row_bytes);
                });
    }
    time_step("combine send: each token's rows summed",
              static_cast<double>(received) * bf16_bytes * (fan + 1), [&] {
                rocep_bench_rows_summed<1>
                    <<<blocks, kThreads, 0, s>>>(row_data.as<uint8_t>(), tokens.as<uint8_t>(),
                                                 token_rows.as<int32_t>(), received, fan, bf16_bytes);
              });
    time_step("combine receive: the partials summed", token_bytes * (options.world + 1), [&] {
      rocep_bench_rows_summed<1><<<blocks, kThreads, 0, s>>>(tokens.as<uint8_t>(), out.as<uint8_t>(),
                                                             partial_rows.as<int32_t>(), options.tokens,
                                                             options.world, bf16_bytes);
    });
    // The per-token combine send's routines over another rank's tokens, on --sms multiprocessors.
    rocep::device::Shape fp8_rows{};
    fp8_rows.hidden = options.hidden;
    fp8_rows.payload_bytes = static_cast<uint32_t>(options.hidden);
    fp8_rows.format = rocep::device::Format::kFp8Block128;
    fp8_rows.fp8_encoding = rocep::device::Fp8::kE4m3fn;
    const int send_blocks = std::min(options.sms, properties.multiProcessorCount);
    constexpr int kSendThreads = rocep::device::PerTokenTuning::kCombineThreads;
    const std::string copied = "per-token send, " + std::to_string(send_blocks) + " SMs: copy bf16 rows";
    time_step(copied.c_str(), 2 * token_bytes, [&] {
      rocep_bench_send_rows<false><<<send_blocks, kSendThreads, 0, s>>>(
          tokens.as<uint8_t>(), row_data.as<uint8_t>(), options.tokens, fp8_rows);
    });
    const std::string quantised = "per-token send, " + std::to_string(send_blocks) + " SMs: quantise to fp8";
    time_step(quantised.c_str(),
              token_bytes +
                  static_cast<double>(options.tokens) * rocep::device::fp8_combine_message_bytes(fp8_rows),
              [&] {
                rocep_bench_send_rows<true><<<send_blocks, kSendThreads, 0, s>>>(
                    tokens.as<uint8_t>(), row_data.as<uint8_t>(), options.tokens, fp8_rows);
              });
    // The expanded layout's steps on --sms multiprocessors, a block each: blocks of 256 (the dispatch
    // receive's on a budget) and wide blocks of three parts (the combine's, kExpandedWideThreads).
    const std::string budget = "expanded, " + std::to_string(send_blocks) + " SMs ";
    const std::string into_rows = budget + "x 256: bf16 tokens into rows";
    time_step(into_rows.c_str(), static_cast<double>(received) * bf16_bytes * (1 + fan), [&] {
      rocep_bench_tokens_into_rows<1><<<send_blocks, kThreads, 0, s>>>(
          tokens.as<uint8_t>(), row_data.as<uint8_t>(), token_rows.as<int32_t>(), received, fan, bf16_bytes);
    });
    constexpr int kParts = rocep::device::kExpandedBlocksPerSm;
    const std::string wide_into_rows = budget + "x 768: bf16 tokens into rows";
    time_step(wide_into_rows.c_str(), static_cast<double>(received) * bf16_bytes * (1 + fan), [&] {
      rocep_bench_tokens_into_rows<kParts><<<send_blocks, kParts * kThreads, 0, s>>>(
          tokens.as<uint8_t>(), row_data.as<uint8_t>(), token_rows.as<int32_t>(), received, fan, bf16_bytes);
    });
    const std::string wide_summed = budget + "x 768: each token's rows summed";
    time_step(wide_summed.c_str(), static_cast<double>(received) * bf16_bytes * (fan + 1), [&] {
      rocep_bench_rows_summed<kParts><<<send_blocks, kParts * kThreads, 0, s>>>(
          row_data.as<uint8_t>(), tokens.as<uint8_t>(), token_rows.as<int32_t>(), received, fan, bf16_bytes);
    });
    const std::string wide_partials = budget + "x 768: the partials summed";
    time_step(wide_partials.c_str(), token_bytes * (options.world + 1), [&] {
      rocep_bench_rows_summed<kParts><<<send_blocks, kParts * kThreads, 0, s>>>(
          tokens.as<uint8_t>(), out.as<uint8_t>(), partial_rows.as<int32_t>(), options.tokens, options.world,
          bf16_bytes);
    });
    ROCEP_GPU_CHECK(hipGetLastError());
    std::printf("\nfloors of the fused calls (their steps one after the other, without the links):\n");
    std::printf("  dispatch bf16: %.1f us (staged), %.1f us (from the input buffer)\n",
                (steps[0].seconds + steps[1].seconds) * 1e6, steps[1].seconds * 1e6);
    std::printf("  combine: %.1f us\n", (steps[3].seconds + steps[4].seconds) * 1e6);
    std::printf(
        "  expanded at %d SMs: dispatch receive %.1f us (blocks of 256), %.1f us (768); combine %.1f us\n",
        send_blocks, steps[7].seconds * 1e6, steps[8].seconds * 1e6,
        (steps[9].seconds + steps[10].seconds) * 1e6);
    return 0;
  } catch (const std::exception& error) {  // rocep's errors, and memory the sizes asked for
    std::fprintf(stderr, "rocep_memory_bench: %s\n", error.what());
    return 1;
  }
}
