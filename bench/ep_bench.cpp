// Dispatch / combine benchmark under MPI. Every rank runs every iteration; an iteration's time is the
// slowest rank's (MPI_MAX), since a collective step is as slow as its slowest member. Rank 0 prints the
// table: median time per call, bytes that crossed to other ranks, and the resulting GB/s.
//
//   mpirun -np 2 rocep_bench [--tokens=128,4096] [--hidden=7168] [--top_k=8] [--experts=256]
//                            [--iterations=20] [benchmark flags]
#include <benchmark/benchmark.h>
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "hip/bf16.hpp"
#include "rocep/rocep.hpp"

namespace {

struct BenchOptions {
  std::vector<int> tokens{128, 1024};
  int hidden = 7168;
  int top_k = 8;
  int experts = 256;
  int iterations = 20;
};

// Removes --name=value from argv (so Google Benchmark does not see it) and returns the value.
bool take_flag(int& argc, char** argv, const char* name, std::string& value) {
  const std::string prefix = std::string("--") + name + "=";
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], prefix.c_str(), prefix.size()) == 0) {
      value = argv[i] + prefix.size();
      std::copy(argv + i + 1, argv + argc, argv + i);
      --argc;
      return true;
    }
  }
  return false;
}

int parse_positive(const std::string& text, const char* name) {
  char* end = nullptr;
  const long value = std::strtol(text.c_str(), &end, 10);
  if (*end != '\0' || value < 1 || value > (1L << 30)) {
    throw rocep::ConfigError(std::string("--") + name + "=" + text +
                             " is invalid: expected a positive integer");
  }
  return static_cast<int>(value);
}

BenchOptions parse_options(int& argc, char** argv) {
  BenchOptions options;
  std::string value;
  if (take_flag(argc, argv, "tokens", value)) {
    options.tokens.clear();
    std::stringstream list(value);
    for (std::string item; std::getline(list, item, ',');) {
      options.tokens.push_back(parse_positive(item, "tokens"));
    }
  }
  if (take_flag(argc, argv, "hidden", value))
    options.hidden = parse_positive(value, "hidden");
  if (take_flag(argc, argv, "top_k", value))
    options.top_k = parse_positive(value, "top_k");
  if (take_flag(argc, argv, "experts", value))
    options.experts = parse_positive(value, "experts");
  if (take_flag(argc, argv, "iterations", value))
    options.iterations = parse_positive(value, "iterations");
  return options;
}

// One rank's random workload: tokens, uniformly random distinct experts per token, weights.
struct Workload {
  std::vector<rocep::bf16_bits> tokens;
  std::vector<int32_t> topk_ids;
  std::vector<float> topk_weights;
  double remote_dispatch_bytes = 0;  // bytes this rank's dispatch sends to other ranks
  double remote_combine_bytes = 0;   // bytes this rank's combine receives from other ranks
};

Workload make_workload(const rocep::EpConfig& config, int num_tokens, int rank, int world, unsigned seed) {
  std::mt19937 random(seed + 7919u * static_cast<unsigned>(rank));
  std::uniform_real_distribution<float> value(-4.0f, 4.0f);
  std::uniform_real_distribution<float> weight(0.01f, 1.0f);
  Workload workload;
  workload.tokens.resize(static_cast<std::size_t>(num_tokens) * config.hidden);
  for (auto& element : workload.tokens)
    element = rocep::float_to_bf16(value(random));
  std::vector<int32_t> experts(config.num_experts);
  const int local_experts = config.num_local_experts(world);
  const double row_bytes = static_cast<double>(config.hidden) * sizeof(rocep::bf16_bits);
  for (int token = 0; token < num_tokens; ++token) {
    for (int e = 0; e < config.num_experts; ++e)
      experts[e] = e;
    std::vector<bool> destination(world, false);
    for (int k = 0; k < config.top_k; ++k) {
      std::uniform_int_distribution<int> pick(k, config.num_experts - 1);
      std::swap(experts[k], experts[pick(random)]);
      workload.topk_ids.push_back(experts[k]);
      workload.topk_weights.push_back(weight(random));
      destination[experts[k] / local_experts] = true;
    }
    for (int peer = 0; peer < world; ++peer) {
      if (destination[peer] && peer != rank) {
        workload.remote_dispatch_bytes += row_bytes;
        workload.remote_combine_bytes += row_bytes;
      }
    }
  }
  return workload;
}

double max_over_ranks(double value) {
  double result = 0;
  MPI_Allreduce(&value, &result, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return result;
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values.empty() ? 0.0 : values[values.size() / 2];
}

enum class Operation { kDispatch, kCombine };

// One line of the summary table rank 0 prints after the run.
struct SummaryRow {
  std::string name;
  std::string backend;
  double median_us;
  double remote_mb;
  double gb_per_s;
};
std::vector<SummaryRow> summary;

void print_summary() {
  std::printf("\n%-28s %-16s %12s %12s %10s\n", "case", "backend", "median [us]", "remote [MB]", "GB/s");
  for (const SummaryRow& row : summary) {
    std::printf("%-28s %-16s %12.1f %12.3f %10.3f\n", row.name.c_str(), row.backend.c_str(), row.median_us,
                row.remote_mb, row.gb_per_s);
  }
}

// Times `operation` on an EpGroup of the whole world. Counters: median and per-call bytes / bandwidth.
void run_case(benchmark::State& state, const std::string& name, Operation operation, rocep::EpConfig config,
              int num_tokens) {
  int rank = 0;
  int world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  config.max_tokens_per_rank = num_tokens;
  rocep::EpGroup group(MPI_COMM_WORLD, config);
  const Workload workload = make_workload(config, num_tokens, rank, world, 12345u);

  const std::size_t rows = group.max_recv_rows();
  std::vector<rocep::bf16_bits> recv_tokens(rows * config.hidden);
  std::vector<uint32_t> row_offsets(group.num_local_experts() + 1);
  std::vector<int32_t> expert_ids(group.num_local_experts());
  std::vector<rocep::SrcInfo> src_info(rows);
  std::vector<float> recv_weights(rows);
  std::vector<rocep::bf16_bits> combined(static_cast<std::size_t>(num_tokens) * config.hidden);

  const rocep::DispatchInputs inputs{workload.tokens.data(), workload.topk_ids.data(),
                                     workload.topk_weights.data(), num_tokens, nullptr};
  const rocep::DispatchOutputs outputs{recv_tokens.data(), row_offsets.data(),  expert_ids.data(),
                                       src_info.data(),    recv_weights.data(), nullptr};
  // Expert outputs: the dispatched rows themselves (an identity expert) are as good as any for timing.
  const rocep::CombineArgs combine_args{recv_tokens.data(), recv_weights.data(), nullptr, combined.data()};

  group.dispatch(inputs, outputs);  // warm-up, and the layout combine needs
  group.combine(combine_args);
  std::vector<double> seconds;
  for (auto _ : state) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double start = MPI_Wtime();
    if (operation == Operation::kDispatch) {
      group.dispatch(inputs, outputs);
    } else {
      group.combine(combine_args);
    }
    const double slowest = max_over_ranks(MPI_Wtime() - start);
    seconds.push_back(slowest);
    state.SetIterationTime(slowest);
  }
  const double bytes = max_over_ranks(operation == Operation::kDispatch ? workload.remote_dispatch_bytes
                                                                        : workload.remote_combine_bytes);
  const double median_seconds = median(seconds);
  const double gb_per_s = median_seconds > 0 ? bytes / median_seconds / 1e9 : 0.0;
  const std::string backend = std::string(rocep::to_string(group.backend())) + " EP" + std::to_string(world);
  state.counters["median_us"] = median_seconds * 1e6;
  state.counters["remote_MB"] = bytes / 1e6;
  state.counters["GB/s"] = gb_per_s;
  state.SetLabel(backend);
  summary.push_back({name, backend, median_seconds * 1e6, bytes / 1e6, gb_per_s});
}

// Rank 0 prints; the other ranks run the same benchmarks silently.
class SilentReporter : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  int world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  int status = 0;
  try {
    const BenchOptions options = parse_options(argc, argv);
    rocep::EpConfig config;
    config.hidden = options.hidden;
    config.top_k = options.top_k;
    config.num_experts = options.experts;
    config.max_tokens_per_rank = *std::max_element(options.tokens.begin(), options.tokens.end());
    config.validate(world);

    benchmark::Initialize(&argc, argv);
    for (const int tokens : options.tokens) {
      for (const Operation operation : {Operation::kDispatch, Operation::kCombine}) {
        const std::string name = std::string(operation == Operation::kDispatch ? "dispatch" : "combine") +
                                 "/bf16/tokens:" + std::to_string(tokens);
        // A fixed iteration count: every rank must run the same number of collective calls.
        benchmark::RegisterBenchmark(name.c_str(), run_case, name, operation, config, tokens)
            ->Iterations(options.iterations)
            ->UseManualTime()
            ->Unit(benchmark::kMicrosecond);
      }
    }
    if (rank == 0) {
      std::printf("rocep benchmark: %d rank(s), %s\n", world, config.describe().c_str());
      benchmark::RunSpecifiedBenchmarks();
      print_summary();
    } else {
      SilentReporter silent;
      benchmark::RunSpecifiedBenchmarks(&silent);
    }
    benchmark::Shutdown();
  } catch (const rocep::Error& error) {
    std::fprintf(stderr, "[rank %d] rocep_bench: %s\n", rank, error.what());
    status = 1;
  }
  MPI_Finalize();
  return status;
}
