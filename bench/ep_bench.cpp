// Dispatch / combine benchmark under MPI. Every rank runs every call; a call's time is the slowest rank's
// (MPI_MAX), since a collective step is as slow as its slowest member. Rank 0 prints the table: median time
// per call, the spread of the per-rank medians (each rank's own times), bytes that crossed to other ranks,
// and the resulting GB/s. --iterations: the timed calls of each kind, rounded up to whole rounds of 8 in the
// fused, split and concurrent cases (the rows' iterations count rounds).
//
// Scaled dispatch formats (--formats=fp8,...) quantise the bf16 tokens inside dispatch (--inputs=copied) or
// take them already quantised (--inputs=quantised); their remote bytes are the payload and scales that
// travel. Combine moves bf16 unless --combine=fp8.
//
//   mpirun -np 2 rocep_bench [--tokens=128,4096] [--formats=bf16,fp8,mxfp8,mxfp4,nvfp4] [--hidden=7168]
//                            [--top_k=8] [--experts=N] [--iterations=20] [--sms=default,all,N]
//                            [--cases=fused,split,concurrent,graph] [--concurrent_tokens=4096]
//                            [--layouts=expanded,per-token] [--combine=bf16|fp8] [--local_only=0|1]
//                            [--inputs=copied,input_buffer,quantised] [--max_tokens=N] [benchmark flags]
//
// --experts: 256 by default, rounded up to a multiple of the rank count (the experts split evenly).
// An argument that is none of these flags nor Google Benchmark's, or a flag given twice, is refused.
// With --benchmark_format=json (or csv) stdout holds Google Benchmark's output alone: the header and the
// table go to stderr.
// --combine: EpConfig::combine_dtype of every case (fp8: the per-token layout's rows cross ranks as fp8
// block-128; the header line's config says which).
// --local_only=1: EpConfig::local_only of every case, allreduce_world_size the world's: each rank dispatches
// its tokens to its own experts only, so nothing crosses (remote bytes 0; logical bytes its own rows).
// --inputs (default copied) selects where the tokens come from, each item its own cases. input_buffer times
// dispatch from tokens written into EpGroup::dispatch_input_buffer() (a scaled format's quantised beforehand
// on the host, each row its payload and then its scales), and the per-token bf16 combine from expert outputs
// in EpGroup::combine_input_buffer(), in the fused, split and graph cases. --inputs=quantised times the
// scaled formats' dispatch from tokens quantised beforehand (on the host, by the CPU reference's codec) and
// passed with DispatchInputs::token_scales, as a server whose previous kernel quantises them hands them over:
// the send copies payloads and scales.
// --sms: the SM budgets (EpConfig::num_sms) every case runs at: default (the library's share), all, or N
// multiprocessors; each row names its budget and the multiprocessors it resolved to.
// The concurrent case (GPU only, at each budget that leaves multiprocessors over): dispatch + combine of
// --concurrent_tokens tokens on one stream while a compute-bound kernel holds the rest of the rank's share
// of the GPU on another, sized to take as long alone as dispatch + combine alone. Rows: dispatch + combine
// alone, the compute kernel alone, both together (from the first event of either stream to the last); and
// below the table, both together as a multiple of the longer alone (1 = fully overlapped, 2 = serialised).
// The graph case (GPU only, not by default): 20 fused dispatch + combine pairs captured into one graph and
// launched between two events; the row gives one pair's time, as a server replaying graphs sees it.
// --tokens: tokens per rank of each case; by default a decode and a prefill step, 128 and 4096, on a GPU,
// and 128 and 1024 on the CPU reference.
// --layouts: EpConfig::layout of every case (by default both); per-token rows say so in their names.
// --max_tokens: EpConfig::max_tokens_per_rank of the fused, split and graph cases whose token count is
// smaller (by default each case's own count), as a server that sizes one group for its largest batch runs
// its decode steps; those rows name it.
#include <benchmark/benchmark.h>
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>
#if defined(__GLIBC__)  // defined by the C++ headers above on glibc systems
#include <malloc.h>
#endif

#include "bench/flags.hpp"
#include "bench/statistics.hpp"
#include "hip/bf16.hpp"
#include "host/bootstrap.hpp"
#include "host/codecs.hpp"
#include "host/node.hpp"
#include "rocep/mpi.hpp"
#include "rocep/rocep.hpp"

#include "hip/portable.hpp"
#if defined(ROCEP_GPU_BUILD)
#include <memory>

#include "host/device.hpp"
#include "host/device_memory.hpp"
#include "host/gpu_check.hpp"
#include "host/ipc.hpp"
#include "host/topology.hpp"
#include "tests/gpu/compute_load.hpp"
#endif

namespace {

using rocep::bench::flag_value;
using rocep::bench::median;
using rocep::bench::parse_positive;

// Where dispatch's tokens come from: a buffer of the caller's, bf16 (dispatch stages them, quantising them
// for a scaled format); the group's input buffer (EpGroup::dispatch_input_buffer: bf16, or a scaled format's
// already quantised with their scales); or a buffer of the caller's holding them already quantised, with
// their scales (scaled formats only).
enum class TokenInputs { kCopied, kInputBuffer, kQuantised };

struct BenchOptions {
  std::vector<int> tokens;  // --tokens (parse_options gives the default)
  std::vector<rocep::TokenFormat> formats{rocep::TokenFormat::kBf16};
  int hidden = 7168;
  int top_k = 8;
  int experts = 0;  // --experts; 0: 256 rounded up to a multiple of the rank count
  int iterations = 20;
  // SM budgets (EpConfig::num_sms) at which every case runs: the default share and every multiprocessor.
  std::vector<int> sms{rocep::EpConfig::kDefaultSms, rocep::EpConfig::kAllSms};
  bool fused = true;  // the cases to run (--cases)
  bool split = true;
  bool concurrent = true;
  bool graph = false;            // the decode pair inside one graph of kGraphPairs pairs (--cases=graph)
  int concurrent_tokens = 4096;  // tokens per rank of the concurrent case (a prefill step)
  std::vector<TokenInputs> inputs{TokenInputs::kCopied};                                   // --inputs
  std::vector<rocep::Layout> layouts{rocep::Layout::kPerToken, rocep::Layout::kExpanded};  // --layouts
  rocep::CombineDtype combine_dtype = rocep::CombineDtype::kBf16;  // EpConfig::combine_dtype of every case
  bool local_only = false;                                         // EpConfig::local_only of every case
  int max_tokens = 0;  // EpConfig::max_tokens_per_rank where larger than a case's tokens (--max_tokens)
};

// Removes --name=value from argv (so Google Benchmark does not see it) and returns the value.
bool take_flag(int& argc, char** argv, const char* name, std::string& value) {
  for (int i = 1; i < argc; ++i) {
    if (const char* text = flag_value(argv[i], name)) {
      value = text;
      std::copy(argv + i + 1, argv + argc, argv + i);
      --argc;
      return true;
    }
  }
  return false;
}

rocep::TokenFormat parse_format(const std::string& text) {
  for (const rocep::TokenFormat format :
       {rocep::TokenFormat::kBf16, rocep::TokenFormat::kFp8Block128, rocep::TokenFormat::kMxfp8,
        rocep::TokenFormat::kMxfp4, rocep::TokenFormat::kNvfp4}) {
    if (text == rocep::to_string(format) || (text == "fp8" && format == rocep::TokenFormat::kFp8Block128)) {
      return format;
    }
  }
  throw rocep::ConfigError("--formats: '" + text +
                           "' is not a format: allowed are bf16, fp8 (fp8_block128), " +
                           "mxfp8, mxfp4, nvfp4");
}

// The CPU reference allocates its messages on every call, hundreds of KB to MBs each. Under glibc's
// defaults those were mmapped, or trimmed off the heap when freed, and faulted in again on every call until
// the frees had raised glibc's thresholds: the first case measured took about 4 x what the same case took
// later (EP2, 64 tokens, 7.0 against 1.6-1.8 ms). Fixed thresholds above those sizes time every case in
// the same steady state. The benchmark's process only: the library sets no allocator state.
void keep_large_allocations_in_the_heap() {
#if defined(__GLIBC__)
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
#endif
}

// Whether this process runs on a GPU (a GPU build on a machine with one), rather than the CPU reference.
bool on_gpu() {
#if defined(ROCEP_GPU_BUILD)
  return rocep::device_count() > 0;
#else
  return false;
#endif
}

// What --help prints: the flags above, then Google Benchmark's own.
constexpr const char* kUsage =
    "usage: mpirun -np <ranks> rocep_bench [flags], each flag at most once, as --name=value:\n"
    "  --tokens=128,4096            tokens per rank of each case (CPU reference: 128,1024)\n"
    "  --formats=bf16               dispatch formats: bf16, fp8 (fp8_block128), mxfp8, mxfp4, nvfp4\n"
    "  --layouts=expanded,per-token EpConfig::layout of every case\n"
    "  --sms=default,all            SM budgets: default, all, or a multiprocessor count\n"
    "  --cases=fused,split,concurrent  also: graph (20 dispatch + combine pairs in one graph)\n"
    "  --inputs=copied              also: input_buffer, quantised (scaled formats quantised beforehand)\n"
    "  --combine=bf16               or fp8: the per-token rows cross ranks as fp8 block-128\n"
    "  --local_only=0               1: each rank dispatches to its own experts only\n"
    "  --hidden=7168 --top_k=8 --experts=256 (rounded up to a multiple of the ranks)\n"
    "  --iterations=20              timed calls of each kind (rounds of 8 in fused, split, concurrent)\n"
    "  --max_tokens=N               size the groups of smaller cases for N tokens per rank\n"
    "  --concurrent_tokens=4096     tokens of the concurrent case\n"
    "  --benchmark_*                Google Benchmark's flags (--benchmark_filter, --benchmark_out, ...)\n"
    "details: the header of bench/ep_bench.cpp\n";

// Whether the command line asks for the usage text.
bool wants_help(int argc, char** argv) {
  return std::any_of(argv + 1, argv + argc, [](const char* argument) {
    return std::strcmp(argument, "--help") == 0 || std::strcmp(argument, "-h") == 0;
  });
}

// The items of a comma-separated flag value; an empty one (",," or a comma at either end) throws
// ConfigError naming the flag.
std::vector<std::string> list_items(const std::string& value, const char* flag) {
  std::vector<std::string> items;
  for (std::size_t start = 0;;) {
    const std::size_t comma = value.find(',', start);
    items.push_back(value.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (items.back().empty()) {
      throw rocep::ConfigError(std::string("--") + flag + "='" + value +
                               "' is invalid: allowed is a comma-separated list without empty items");
    }
    if (comma == std::string::npos) {
      return items;
    }
    start = comma + 1;
  }
}

BenchOptions parse_options(int& argc, char** argv) {
  BenchOptions options;
  options.tokens = on_gpu() ? std::vector<int>{128, 4096} : std::vector<int>{128, 1024};
  std::string value;
  if (take_flag(argc, argv, "tokens", value)) {
    options.tokens.clear();
    for (const std::string& item : list_items(value, "tokens")) {
      options.tokens.push_back(parse_positive(item, "tokens"));
    }
  }
  if (take_flag(argc, argv, "formats", value)) {
    options.formats.clear();
    for (const std::string& item : list_items(value, "formats")) {
      options.formats.push_back(parse_format(item));
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
  if (take_flag(argc, argv, "sms", value)) {
    options.sms.clear();
    for (const std::string& item : list_items(value, "sms")) {
      if (item == "default" || item == "all") {
        options.sms.push_back(item == "default" ? rocep::EpConfig::kDefaultSms : rocep::EpConfig::kAllSms);
        continue;
      }
      try {
        options.sms.push_back(parse_positive(item, "sms", 1 << 12));
      } catch (const rocep::ConfigError&) {
        throw rocep::ConfigError(
            "--sms: '" + item +
            "' is invalid: allowed are default, all and multiprocessor counts from 1 to " +
            std::to_string(1 << 12));
      }
    }
  }
  if (take_flag(argc, argv, "cases", value)) {
    options.fused = options.split = options.concurrent = options.graph = false;
    for (const std::string& item : list_items(value, "cases")) {
      if (item != "fused" && item != "split" && item != "concurrent" && item != "graph") {
        throw rocep::ConfigError("--cases: '" + item +
                                 "' is invalid: allowed are fused, split, concurrent, graph");
      }
      (item == "fused"        ? options.fused
       : item == "split"      ? options.split
       : item == "concurrent" ? options.concurrent
                              : options.graph) = true;
    }
  }
  if (take_flag(argc, argv, "layouts", value)) {
    options.layouts.clear();
    for (const std::string& item : list_items(value, "layouts")) {
      if (item != "expanded" && item != "per-token") {
        throw rocep::ConfigError("--layouts: '" + item + "' is invalid: allowed are expanded, per-token");
      }
      options.layouts.push_back(item == "expanded" ? rocep::Layout::kExpanded : rocep::Layout::kPerToken);
    }
  }
  if (take_flag(argc, argv, "combine", value)) {
    if (value != "bf16" && value != "fp8") {
      throw rocep::ConfigError("--combine: '" + value + "' is invalid: allowed are bf16, fp8");
    }
    options.combine_dtype = value == "fp8" ? rocep::CombineDtype::kFp8Block128 : rocep::CombineDtype::kBf16;
  }
  if (take_flag(argc, argv, "local_only", value)) {
    if (value != "0" && value != "1") {
      throw rocep::ConfigError("--local_only: '" + value + "' is invalid: allowed are 0, 1");
    }
    options.local_only = value == "1";
  }
  if (take_flag(argc, argv, "max_tokens", value))
    options.max_tokens = parse_positive(value, "max_tokens");
  if (take_flag(argc, argv, "concurrent_tokens", value))
    options.concurrent_tokens = parse_positive(value, "concurrent_tokens");
  if (take_flag(argc, argv, "inputs", value)) {
    options.inputs.clear();
    for (const std::string& item : list_items(value, "inputs")) {
      if (item != "copied" && item != "input_buffer" && item != "quantised") {
        throw rocep::ConfigError("--inputs: '" + item +
                                 "' is invalid: allowed are copied, input_buffer, quantised");
      }
      options.inputs.push_back(item == "copied"         ? TokenInputs::kCopied
                               : item == "input_buffer" ? TokenInputs::kInputBuffer
                                                        : TokenInputs::kQuantised);
    }
  }
  if (options.tokens.empty() || options.formats.empty() || options.inputs.empty() || options.sms.empty() ||
      options.layouts.empty()) {
    throw rocep::ConfigError(
        "--tokens, --formats, --inputs, --sms and --layouts each need at least one item");
  }
  return options;
}

// A budget as --sms names it.
std::string sms_name(int num_sms) {
  return num_sms == rocep::EpConfig::kDefaultSms ? "default"
         : num_sms == rocep::EpConfig::kAllSms   ? "all"
                                                 : std::to_string(num_sms);
}

// The header's line: what every case shares (from `config`), then what the cases range over.
std::string settings_line(const BenchOptions& options, const rocep::EpConfig& config) {
  std::string text = "hidden=" + std::to_string(config.hidden) + " top_k=" + std::to_string(config.top_k) +
                     " experts=" + std::to_string(config.num_experts) +
                     " combine=" + rocep::to_string(config.combine_dtype) +
                     (config.local_only ? " local_only" : "") + "; layouts:";
  for (const rocep::Layout layout : options.layouts) {
    text += std::string(" ") + rocep::to_string(layout);
  }
  text += "; formats:";
  for (const rocep::TokenFormat format : options.formats) {
    text += std::string(" ") + rocep::to_string(format);
  }
  text += "; tokens:";
  for (const int tokens : options.tokens) {
    text += " " + std::to_string(tokens);
  }
  if (options.max_tokens > 0) {
    text += " (groups sized for at least " + std::to_string(options.max_tokens) + ")";
  }
  return text;
}

// One rank's random workload: tokens, uniformly random distinct experts per token, weights.
struct Workload {
  std::vector<rocep::bf16_bits> tokens;
  std::vector<int32_t> topk_ids;
  std::vector<float> topk_weights;
  double remote_dispatch_bytes = 0;  // bytes this rank's dispatch sends to other ranks
  double remote_combine_bytes = 0;   // bytes this rank's combine receives from other ranks
  // The bytes each call receives on this rank, its own included (the convention DeepEP's and MoRI's figures
  // use): tokens from every rank that name one of this rank's experts; one row back per (token of this
  // rank, rank that holds one of its experts).
  double logical_dispatch_bytes = 0;
  double logical_combine_bytes = 0;
};

// Collective (the received bytes are summed over the ranks).
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
  const double message_bytes =
      static_cast<double>(rocep::format_payload_bytes(config.dispatch_format, config.hidden) +
                          rocep::format_scale_bytes(config.dispatch_format, config.hidden));
  // A combine row as it crosses: bf16, or an fp8 block-128 message (combine_dtype); this rank's own stays
  // bf16.
  const double row_bytes = static_cast<double>(config.hidden) * sizeof(rocep::bf16_bits);
  const double remote_row_bytes =
      config.combine_dtype == rocep::CombineDtype::kFp8Block128
          ? static_cast<double>(rocep::format_payload_bytes(rocep::TokenFormat::kFp8Block128, config.hidden) +
                                rocep::format_scale_bytes(rocep::TokenFormat::kFp8Block128, config.hidden))
          : row_bytes;
  std::vector<double> dispatch_bytes_to(world, 0.0);  // [rank]: of this rank's tokens
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
      if (config.local_only && peer != rank) {
        continue;  // that rank runs its own experts on its own copy of the token
      }
      if (destination[peer]) {
        dispatch_bytes_to[peer] += message_bytes;
        workload.logical_combine_bytes += peer == rank ? row_bytes : remote_row_bytes;
      }
      if (destination[peer] && peer != rank) {
        workload.remote_dispatch_bytes += message_bytes;
        workload.remote_combine_bytes += remote_row_bytes;
      }
    }
  }
  MPI_Allreduce(MPI_IN_PLACE, dispatch_bytes_to.data(), world, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  workload.logical_dispatch_bytes = dispatch_bytes_to[rank];
  return workload;
}

double reduce_over_ranks(double value, MPI_Op operation) {
  double result = 0;
  MPI_Allreduce(&value, &result, 1, MPI_DOUBLE, operation, MPI_COMM_WORLD);
  return result;
}

double max_over_ranks(double value) {
  return reduce_over_ranks(value, MPI_MAX);
}

// A case runs a sequence of calls repeatedly and times each call on its own: kFused runs dispatch then
// combine; kSplit runs dispatch_send, dispatch_recv, combine_send, combine_recv (each receive's time
// includes any wait for the peers' sends).
enum class Sequence { kFused, kSplit };

// One line of the summary table rank 0 prints after the run.
struct SummaryRow {
  std::string name;
  std::string backend;
  double median_us;
  double fastest_rank_us;  // the per-rank medians (each rank's own event times): fastest and slowest rank
  double slowest_rank_us;
  double remote_mb;
  double logical_mb;
  double gb_per_s;
  double host_us;  // the host's time to issue the call (this rank's median, the slowest rank's); 0: not timed
};
std::vector<SummaryRow> summary;
// One line per concurrent case, printed below the table.
std::vector<std::string> overlap_summary;

// Prints the table to `out`.
void print_summary(double link_peak, std::FILE* out) {
  if (link_peak > 0) {
    std::fprintf(
        out, "\nP2P link peak measured in this run: %.1f GB/s per rank (copy engine, all ranks at once)\n",
        link_peak);
  }
  std::fprintf(out, "\n%-60s %-20s %12s %17s %12s %13s %10s %10s %10s\n", "case", "backend, SMs",
               "median [us]", "ranks [us]", "remote [MB]", "logical [MB]", "GB/s", "of link", "host [us]");
  for (const SummaryRow& row : summary) {
    char host[32] = "-";
    if (row.host_us > 0) {
      std::snprintf(host, sizeof(host), "%.1f", row.host_us);
    }
    char of_link[32] = "-";  // no link peak: the CPU reference, one rank, or ranks sharing a GPU
    if (link_peak > 0) {
      std::snprintf(of_link, sizeof(of_link), "%.0f%%", 100 * row.gb_per_s / link_peak);
    }
    std::fprintf(out, "%-60s %-20s %12.1f %8.1f-%-8.1f %12.3f %13.3f %10.3f %10s %10s\n", row.name.c_str(),
                 row.backend.c_str(), row.median_us, row.fastest_rank_us, row.slowest_rank_us, row.remote_mb,
                 row.logical_mb, row.gb_per_s, of_link, host);
  }
  if (!overlap_summary.empty()) {
    std::fprintf(out,
                 "\nConcurrent cases: both together as a multiple of the longer alone (1 = overlapped, "
                 "2 = serialised)\n");
    for (const std::string& line : overlap_summary) {
      std::fprintf(out, "%s\n", line.c_str());
    }
  }
}

// The backend column: the backend, the world and, on a GPU, the multiprocessors the communication kernels
// take (of the GPU's). Collective.
std::string backend_label(const rocep::EpGroup& group, int world) {
  std::string label = std::string(rocep::to_string(group.backend())) + " EP" + std::to_string(world);
#if defined(ROCEP_GPU_BUILD)
  if (group.backend() == rocep::Backend::kGpu) {
    rocep::MpiBootstrap bootstrap(MPI_COMM_WORLD);
    const rocep::testing::SmSplit split = rocep::testing::sm_split(bootstrap, group.config().num_sms);
    label += " " + std::to_string(split.communication) + "/" + std::to_string(split.multiprocessors);
  }
#endif
  return label;
}

#if defined(ROCEP_GPU_BUILD)
// Whether some rank's next rank (rank + 1 modulo the world, where the link peak copies) runs on its GPU, so
// that its copy would not cross a link; the same answer on every rank. `rank_gpus` as NodeGroupTopology
// gives it (-1: a rank of another node).
bool next_rank_on_same_gpu(const std::vector<int>& rank_gpus) {
  const int world = static_cast<int>(rank_gpus.size());
  if (world < 2) {
    return false;  // one rank has no next rank (measure_link_peak_gb_per_s measures nothing)
  }
  int shared = 0;
  for (int rank = 0; rank < world; ++rank) {
    const int next = rank_gpus[(rank + 1) % world];
    shared |= rank_gpus[rank] >= 0 && rank_gpus[rank] == next ? 1 : 0;
  }
  int any = 0;
  MPI_Allreduce(&shared, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return any != 0;
}

// The P2P link peak, measured in this run: every rank copies 256 MiB into the next rank's mapped buffer at
// the same time (copy engine), median of 10; GB/s per rank, the slowest rank's.
double measure_link_peak_gb_per_s() {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (world < 2)
    return 0.0;
  rocep::MpiBootstrap bootstrap(MPI_COMM_WORLD);
  const std::size_t bytes = std::size_t{256} << 20;
  rocep::DeviceBuffer source(bytes);
  rocep::DeviceBuffer target(bytes);
  ROCEP_GPU_CHECK(hipMemset(source.get(), 1, bytes));
  const rocep::PeerBuffers peers(rocep::gather_ipc_handles(bootstrap, target), bootstrap.rank(), target);
  rocep::Stream stream;
  rocep::Event start, stop;
  std::vector<double> seconds;
  for (int repeat = 0; repeat < 12; ++repeat) {
    bootstrap.barrier();
    start.record(stream.get());
    ROCEP_GPU_CHECK(hipMemcpyAsync(peers[(bootstrap.rank() + 1) % world], source.get(), bytes,
                                   hipMemcpyDeviceToDevice, stream.get()));
    stop.record(stream.get());
    stop.synchronize();
    if (repeat >= 2)
      seconds.push_back(max_over_ranks(stop.elapsed_ms_since(start) * 1e-3));
  }
  bootstrap.barrier();
  return bytes / median(seconds) / 1e9;
}
#endif

// Memory for one case: host vectors on the CPU reference backend, device buffers on the GPU backend.
class CaseMemory {
 public:
  explicit CaseMemory(bool on_gpu) : on_gpu_(on_gpu) {}
  template <typename T>
  T* make(const std::vector<T>& contents) {
    void* pointer = allocate(std::max<std::size_t>(contents.size(), 1) * sizeof(T));
    copy_in(pointer, contents.data(), contents.size() * sizeof(T));
    return static_cast<T*>(pointer);
  }
  template <typename T>
  T* make(std::size_t count) {
    return static_cast<T*>(allocate(std::max<std::size_t>(count, 1) * sizeof(T)));
  }
  void copy_in(void* destination, const void* source, std::size_t bytes) {
#if defined(ROCEP_GPU_BUILD)
    if (on_gpu_) {
      ROCEP_GPU_CHECK(hipMemcpy(destination, source, bytes, hipMemcpyHostToDevice));
      return;
    }
#endif
    if (bytes > 0)
      std::memcpy(destination, source, bytes);
  }

 private:
  void* allocate(std::size_t bytes) {
#if defined(ROCEP_GPU_BUILD)
    if (on_gpu_) {
      device_.emplace_back(bytes);
      ROCEP_GPU_CHECK(hipMemset(device_.back().get(), 0, bytes));
      return device_.back().get();
    }
#endif
    host_.emplace_back(bytes);
    return host_.back().data();
  }
  bool on_gpu_;
  std::vector<std::vector<uint8_t>> host_;
#if defined(ROCEP_GPU_BUILD)
  std::vector<rocep::DeviceBuffer> device_;
#endif
};

// A case's workload and the arguments of its calls: in host memory on the CPU reference, in device memory on
// the GPU. Dispatch writes its outputs; combine reduces the dispatched rows (bf16: the dispatched rows
// themselves, an identity expert).
struct CaseCalls {
  CaseCalls(rocep::EpGroup& group, int num_tokens, TokenInputs token_inputs);
  Workload workload;
  CaseMemory memory;
  rocep::DispatchInputs inputs{};
  rocep::DispatchOutputs outputs{};
  rocep::CombineArgs combine_args{};
};

CaseCalls::CaseCalls(rocep::EpGroup& group, int num_tokens, TokenInputs token_inputs)
    : workload(make_workload(group.config(), num_tokens, group.rank(), group.world_size(), 12345u)),
      memory(group.backend() == rocep::Backend::kGpu) {
  const rocep::EpConfig& config = group.config();
  const std::size_t rows = group.max_recv_rows();
  const bool bf16 = config.dispatch_format == rocep::TokenFormat::kBf16;
  auto* recv_tokens =
      memory.make<uint8_t>(rows * rocep::format_payload_bytes(config.dispatch_format, config.hidden));
  auto* recv_weights = memory.make<float>(rows);
  inputs = {memory.make(workload.tokens), memory.make(workload.topk_ids), memory.make(workload.topk_weights),
            num_tokens, nullptr};
  const bool in_input_buffer = token_inputs == TokenInputs::kInputBuffer;
  // nvfp4: a global scale that keeps the block scales of values in [-4, 4] inside e4m3's range.
  const float global_scale = 448.0f * 6.0f / 4.0f;
  inputs.global_scale = memory.make(std::vector<float>{global_scale});
  // The input buffer is written once: the calls only read it, as a server's previous layer would have
  // written it there (a scaled format's tokens already quantised, each row its payload, then its scales).
  std::vector<uint8_t> buffer_rows;
  if (in_input_buffer && bf16) {
    buffer_rows.resize(workload.tokens.size() * sizeof(rocep::bf16_bits));
    std::memcpy(buffer_rows.data(), workload.tokens.data(), buffer_rows.size());
  }
  if (token_inputs == TokenInputs::kQuantised || (in_input_buffer && !bf16)) {
    const std::size_t payload_bytes = rocep::format_payload_bytes(config.dispatch_format, config.hidden);
    const std::size_t scale_bytes = rocep::format_scale_bytes(config.dispatch_format, config.hidden);
    std::vector<uint8_t> payloads(std::max<std::size_t>(std::size_t{1} * num_tokens * payload_bytes, 1));
    std::vector<uint8_t> scales(std::max<std::size_t>(std::size_t{1} * num_tokens * scale_bytes, 1));
    rocep::reference::quantize_bf16_rows(config.dispatch_format, config.fp8_encoding, workload.tokens.data(),
                                         num_tokens, config.hidden, global_scale, payloads.data(),
                                         scales.data());
    if (in_input_buffer) {
      buffer_rows.assign(
          std::size_t{1} * num_tokens * rocep::format_input_row_bytes(config.dispatch_format, config.hidden),
          0);
      rocep::reference::write_input_rows(config.dispatch_format, config.hidden, payloads.data(),
                                         scales.data(), num_tokens, buffer_rows.data());
    } else {
      inputs.tokens = memory.make(payloads);
      inputs.token_scales = memory.make(scales);
    }
  }
  if (in_input_buffer) {
    memory.copy_in(group.dispatch_input_buffer(), buffer_rows.data(), buffer_rows.size());
    inputs.tokens = group.dispatch_input_buffer();
  }
  if (config.layout == rocep::Layout::kPerToken) {
    // A row per received token; sorted_token_ids and its blocks sized by the expanded row bound.
    const std::size_t token_rows = config.max_recv_tokens(group.world_size());
    auto* token_payloads =
        memory.make<uint8_t>(token_rows * rocep::format_payload_bytes(config.dispatch_format, config.hidden));
    outputs.recv_tokens = token_payloads;
    outputs.row_offsets = memory.make<uint32_t>(group.num_local_experts() + 1);
    outputs.src_info = memory.make<rocep::SrcInfo>(token_rows);
    outputs.recv_topk_ids = memory.make<int32_t>(token_rows * config.top_k);
    outputs.recv_topk_weights = memory.make<float>(token_rows * config.top_k);
    outputs.num_recv_tokens = memory.make<int32_t>(1);
    outputs.sorted_token_ids = memory.make<int32_t>(rows);
    outputs.block_expert_ids = memory.make<int32_t>(rows / config.expert_alignment);
    if (!bf16) {
      outputs.recv_scales =
          memory.make<uint8_t>(token_rows * rocep::format_scale_bytes(config.dispatch_format, config.hidden));
    }
    combine_args = {bf16 ? static_cast<const void*>(token_payloads)
                         : memory.make<rocep::bf16_bits>(token_rows * config.hidden),
                    nullptr, nullptr,
                    memory.make<rocep::bf16_bits>(std::size_t{1} * num_tokens * config.hidden)};
    if (in_input_buffer && config.combine_dtype == rocep::CombineDtype::kBf16) {
      // The expert outputs in the combine input buffer, as a server's expert kernel would leave them there
      // (their values, whatever the buffer holds, do not change the time).
      combine_args.expert_outputs = group.combine_input_buffer();
    }
    return;
  }
  outputs = {recv_tokens,
             memory.make<uint32_t>(group.num_local_experts() + 1),
             memory.make<int32_t>(group.num_local_experts()),
             memory.make<rocep::SrcInfo>(rows),
             recv_weights,
             nullptr};
  if (!bf16) {
    outputs.recv_scales =
        memory.make<uint8_t>(rocep::format_scale_tensor_bytes(config.dispatch_format, rows, config.hidden));
  }
  // Expert outputs: for bf16 the dispatched rows themselves (an identity expert), as good as any for timing.
  combine_args = {
      bf16 ? static_cast<const void*>(recv_tokens) : memory.make<rocep::bf16_bits>(rows * config.hidden),
      recv_weights, nullptr, memory.make<rocep::bf16_bits>(std::size_t{1} * num_tokens * config.hidden)};
}

#if defined(ROCEP_GPU_BUILD)
// Holds a stream in a host callback until opened, so that a whole batch of calls is queued before the device
// starts on it: events between the calls then time the device's work, not the host's launch overhead (as
// in a server that replays graphs or launches ahead of the device).
class StreamGate {
 public:
  void close(hipStream_t stream) {
    open_.store(false);
    ROCEP_GPU_CHECK(hipStreamAddCallback(stream, &StreamGate::wait, this, 0));
  }
  void open() { open_.store(true); }

 private:
  static void wait(hipStream_t, hipError_t, void* gate) {
    while (!static_cast<StreamGate*>(gate)->open_.load()) {
    }
  }
  std::atomic<bool> open_{true};
};
#endif

// One timed call of a sequence.
struct Step {
  std::string name;
  bool dispatching;  // counts dispatch bytes (else combine bytes)
  bool moves_data;   // the call that moves the bytes across (or a fused call): bytes / time is reported
  std::function<void()> call;
};

// Times every step of `sequence` on an EpGroup of the whole world. One benchmark iteration queues
// kRepeats rounds of the sequence behind a gate (GPU) with an event between consecutive calls, then
// opens the gate after a barrier; a call's time is the slowest rank's. Medians over all rounds.
constexpr int kRepeats = 8;

void run_case(benchmark::State& state, const std::string& name, Sequence sequence, rocep::EpConfig config,
              int num_tokens, TokenInputs token_inputs) {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  rocep::EpGroup group(MPI_COMM_WORLD, config);
  const bool on_gpu = group.backend() == rocep::Backend::kGpu;
  const CaseCalls case_calls(group, num_tokens, token_inputs);
  const Workload& workload = case_calls.workload;
  const rocep::DispatchInputs& inputs = case_calls.inputs;
  const rocep::DispatchOutputs& outputs = case_calls.outputs;
  const rocep::CombineArgs& combine_args = case_calls.combine_args;
#if defined(ROCEP_GPU_BUILD)
  std::unique_ptr<rocep::Stream> stream = on_gpu ? std::make_unique<rocep::Stream>() : nullptr;
  std::vector<rocep::Event> events;
  void* stream_handle = on_gpu ? stream->get() : nullptr;
#else
  void* stream_handle = nullptr;
#endif

  std::vector<Step> steps;
  if (sequence == Sequence::kFused) {
    steps.push_back({"dispatch", true, true, [&] { group.dispatch(inputs, outputs, stream_handle); }});
    steps.push_back({"combine", false, true, [&] { group.combine(combine_args, stream_handle); }});
  } else {
    // On GPUs the receivers read the tokens over the links (dispatch_send stages them locally), so the
    // dispatch bytes move in dispatch_recv; the CPU reference sends them in dispatch_send.
    const bool pulled = on_gpu;
    steps.push_back({"dispatch send", true, !pulled, [&] { group.dispatch_send(inputs, stream_handle); }});
    steps.push_back({"dispatch recv", true, pulled, [&] { group.dispatch_recv(outputs, stream_handle); }});
    steps.push_back({"combine send", false, true, [&] { group.combine_send(combine_args, stream_handle); }});
    steps.push_back({"combine recv", false, false, [&] { group.combine_recv(combine_args, stream_handle); }});
  }
  const std::size_t calls = steps.size() * kRepeats;
#if defined(ROCEP_GPU_BUILD)
  if (on_gpu) {
    events.resize(calls + 1);
  }
#endif

  // Warm-up (module load, first touch).
  for (int warm_up = 0; warm_up < 3; ++warm_up) {
    for (const Step& step : steps) {
      step.call();
    }
  }
  group.synchronize(stream_handle);

  std::vector<std::vector<double>> step_seconds(steps.size());      // the slowest rank's, per call
  std::vector<std::vector<double>> own_step_seconds(steps.size());  // this rank's, per call
  std::vector<std::vector<double>> own_host_seconds(steps.size());  // this rank's time to issue, per call
  std::vector<double> seconds(calls);
  std::vector<double> host_seconds(calls);
  const auto issue = [&](std::size_t call) {
    const auto start = std::chrono::steady_clock::now();
    steps[call % steps.size()].call();
    host_seconds[call] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  for (auto _ : state) {
    MPI_Barrier(MPI_COMM_WORLD);
    if (on_gpu) {
#if defined(ROCEP_GPU_BUILD)
      StreamGate gate;
      gate.close(stream->get());
      events[0].record(stream->get());
      for (std::size_t call = 0; call < calls; ++call) {
        issue(call);
        events[call + 1].record(stream->get());
      }
      MPI_Barrier(MPI_COMM_WORLD);
      gate.open();
      group.synchronize(stream_handle);
      for (std::size_t call = 0; call < calls; ++call) {
        seconds[call] = events[call + 1].elapsed_ms_since(events[call]) * 1e-3;
      }
#endif
    } else {
      for (std::size_t call = 0; call < calls; ++call) {
        issue(call);  // the CPU reference runs the call while issuing it
        seconds[call] = host_seconds[call];
      }
    }
    for (std::size_t call = 0; call < calls; ++call) {
      own_step_seconds[call % steps.size()].push_back(seconds[call]);
      own_host_seconds[call % steps.size()].push_back(host_seconds[call]);
    }
    MPI_Allreduce(MPI_IN_PLACE, seconds.data(), static_cast<int>(calls), MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    double round = 0;
    for (std::size_t call = 0; call < calls; ++call) {
      step_seconds[call % steps.size()].push_back(seconds[call]);
      round += seconds[call];
    }
    state.SetIterationTime(round / kRepeats);
  }
  const std::string backend = backend_label(group, world);
  state.SetLabel(backend);
  for (std::size_t i = 0; i < steps.size(); ++i) {
    const Step& step = steps[i];
    // Both counts go to the step that moves the data (a split send or receive that only stages or sums
    // gets none), the slowest rank's.
    const auto step_bytes = [&](double dispatching_bytes, double combining_bytes) {
      return step.moves_data ? max_over_ranks(step.dispatching ? dispatching_bytes : combining_bytes) : 0.0;
    };
    const double bytes = step_bytes(workload.remote_dispatch_bytes, workload.remote_combine_bytes);
    const double logical_bytes = step_bytes(workload.logical_dispatch_bytes, workload.logical_combine_bytes);
    const double median_seconds = median(step_seconds[i]);
    const double own_median_seconds = median(own_step_seconds[i]);
    const double gb_per_s = median_seconds > 0 ? bytes / median_seconds / 1e9 : 0.0;
    state.counters[step.name + " [us]"] = median_seconds * 1e6;
    summary.push_back({step.name + name, backend, median_seconds * 1e6,
                       reduce_over_ranks(own_median_seconds, MPI_MIN) * 1e6,
                       reduce_over_ranks(own_median_seconds, MPI_MAX) * 1e6, bytes / 1e6, logical_bytes / 1e6,
                       gb_per_s, reduce_over_ranks(median(own_host_seconds[i]), MPI_MAX) * 1e6});
  }
}

#if defined(ROCEP_GPU_BUILD)
// Dispatch + combine pairs captured back to back into one graph, as a server that replays graphs runs them.
inline constexpr int kGraphPairs = 20;

// The graph case: one graph of kGraphPairs fused dispatch + combine pairs, launched behind a gate between two
// events; a pair's time is the graph's over kGraphPairs, the slowest rank's. Without the per-call events of
// run_case, it is what a server replaying graphs sees of each pair.
void run_graph_case(benchmark::State& state, const std::string& name, rocep::EpConfig config, int num_tokens,
                    TokenInputs token_inputs) {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  rocep::EpGroup group(MPI_COMM_WORLD, config, rocep::Backend::kGpu);
  const CaseCalls calls(group, num_tokens, token_inputs);
  const rocep::Stream stream;
  for (int warm_up = 0; warm_up < 3; ++warm_up) {
    group.dispatch(calls.inputs, calls.outputs, stream.get());
    group.combine(calls.combine_args, stream.get());
  }
  group.synchronize(stream.get());
  hipGraph_t graph;
  hipGraphExec_t executable;
  ROCEP_GPU_CHECK(hipStreamBeginCapture(stream.get(), hipStreamCaptureModeThreadLocal));
  for (int pair = 0; pair < kGraphPairs; ++pair) {
    group.dispatch(calls.inputs, calls.outputs, stream.get());
    group.combine(calls.combine_args, stream.get());
  }
  ROCEP_GPU_CHECK(hipStreamEndCapture(stream.get(), &graph));
  ROCEP_GPU_CHECK(hipGraphInstantiate(&executable, graph, nullptr, nullptr, 0));
  ROCEP_GPU_CHECK(hipGraphLaunch(executable, stream.get()));  // warm-up
  group.synchronize(stream.get());
  const rocep::Event start;
  const rocep::Event end;
  std::vector<double> pair_seconds;
  for (auto _ : state) {
    MPI_Barrier(MPI_COMM_WORLD);
    StreamGate gate;
    gate.close(stream.get());
    start.record(stream.get());
    ROCEP_GPU_CHECK(hipGraphLaunch(executable, stream.get()));
    end.record(stream.get());
    MPI_Barrier(MPI_COMM_WORLD);
    gate.open();
    group.synchronize(stream.get());
    double seconds = end.elapsed_ms_since(start) * 1e-3 / kGraphPairs;
    MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    pair_seconds.push_back(seconds);
    state.SetIterationTime(seconds);
  }
  ROCEP_GPU_CHECK(hipGraphExecDestroy(executable));
  ROCEP_GPU_CHECK(hipGraphDestroy(graph));
  const Workload& workload = calls.workload;
  const double bytes = max_over_ranks(workload.remote_dispatch_bytes + workload.remote_combine_bytes);
  const double logical = max_over_ranks(workload.logical_dispatch_bytes + workload.logical_combine_bytes);
  const double seconds = median(pair_seconds);
  state.SetLabel(backend_label(group, world));
  summary.push_back({"graph pair" + name, backend_label(group, world), seconds * 1e6, seconds * 1e6,
                     seconds * 1e6, bytes / 1e6, logical / 1e6, seconds > 0 ? bytes / seconds / 1e9 : 0.0,
                     0.0});
}

// The concurrent case: fused dispatch + combine on one stream beside a compute-bound kernel on another that
// holds the rest of the rank's share of the GPU (tests/gpu/compute_load.hpp), sized to take about as long
// alone as dispatch + combine alone. One benchmark iteration times kRepeats rounds of each of: dispatch +
// combine alone, the compute kernel alone, and both at once (each batch queued behind a gate, as in
// run_case); a round's time is the slowest rank's. Both at once: from the event that releases both streams
// to the later of their last events; each round starts after both streams finished the round before.
void run_concurrent_case(benchmark::State& state, const std::string& name, rocep::EpConfig config,
                         int num_tokens) {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  config.max_tokens_per_rank = num_tokens;
  rocep::EpGroup group(MPI_COMM_WORLD, config, rocep::Backend::kGpu);
  rocep::MpiBootstrap bootstrap(MPI_COMM_WORLD);
  const rocep::testing::SmSplit split = rocep::testing::sm_split(bootstrap, config.num_sms);
  const CaseCalls calls(group, num_tokens, TokenInputs::kCopied);
  const rocep::Stream communication;
  const rocep::Stream compute;
  const std::function<void()> step = [&] {
    group.dispatch(calls.inputs, calls.outputs, communication.get());
    group.combine(calls.combine_args, communication.get());
  };

  // Times `queue()` for kRepeats rounds, each between two events of its own on `stream`, behind a gate
  // released by every rank at once; per round, this rank's seconds (own) and the slowest rank's (all).
  std::vector<rocep::Event> starts(kRepeats);
  std::vector<rocep::Event> ends(kRepeats);
  const auto time_rounds = [&](hipStream_t stream, const std::function<void()>& queue,
                               std::vector<double>* own, std::vector<double>* all) {
    StreamGate gate;
    gate.close(stream);
    for (int round = 0; round < kRepeats; ++round) {
      starts[round].record(stream);
      queue();
      ends[round].record(stream);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    gate.open();
    ends.back().synchronize();
    group.synchronize(communication.get());
    std::vector<double> seconds(kRepeats);
    for (int round = 0; round < kRepeats; ++round) {
      seconds[round] = ends[round].elapsed_ms_since(starts[round]) * 1e-3;
    }
    own->insert(own->end(), seconds.begin(), seconds.end());
    MPI_Allreduce(MPI_IN_PLACE, seconds.data(), kRepeats, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    all->insert(all->end(), seconds.begin(), seconds.end());
  };

  // Warm-up, then the compute kernel sized to dispatch + combine alone.
  for (int warm_up = 0; warm_up < 3; ++warm_up) {
    step();
  }
  group.synchronize(communication.get());
  std::vector<double> own_step, all_step;
  time_rounds(communication.get(), step, &own_step, &all_step);
  const rocep::testing::ComputeLoad load(split.compute, median(all_step) * 1e3, compute.get());
  own_step.clear();
  all_step.clear();
  const std::function<void()> launch_load = [&] { load.launch(compute.get()); };

  // Both at once: each round starts on the communication stream once both streams finished the round
  // before; the compute stream waits for that start.
  std::vector<rocep::Event> compute_ends(kRepeats);
  std::vector<double> own_load, all_load, own_both, all_both;
  for (auto _ : state) {
    time_rounds(communication.get(), step, &own_step, &all_step);
    time_rounds(compute.get(), launch_load, &own_load, &all_load);
    StreamGate gate;
    gate.close(communication.get());
    for (int round = 0; round < kRepeats; ++round) {
      if (round > 0) {
        ROCEP_GPU_CHECK(hipStreamWaitEvent(communication.get(), compute_ends[round - 1].get(), 0));
      }
      starts[round].record(communication.get());
      ROCEP_GPU_CHECK(hipStreamWaitEvent(compute.get(), starts[round].get(), 0));
      load.launch(compute.get());
      compute_ends[round].record(compute.get());
      step();
      ends[round].record(communication.get());
    }
    MPI_Barrier(MPI_COMM_WORLD);
    gate.open();
    compute_ends.back().synchronize();
    group.synchronize(communication.get());
    std::vector<double> seconds(kRepeats);
    for (int round = 0; round < kRepeats; ++round) {
      seconds[round] = std::max(ends[round].elapsed_ms_since(starts[round]),
                                compute_ends[round].elapsed_ms_since(starts[round])) *
                       1e-3;
    }
    own_both.insert(own_both.end(), seconds.begin(), seconds.end());
    MPI_Allreduce(MPI_IN_PLACE, seconds.data(), kRepeats, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    all_both.insert(all_both.end(), seconds.begin(), seconds.end());
    state.SetIterationTime(median(seconds));
  }

  const std::string backend = backend_label(group, world);
  state.SetLabel(backend);
  const double remote_bytes =
      max_over_ranks(calls.workload.remote_dispatch_bytes + calls.workload.remote_combine_bytes);
  const double logical_bytes =
      max_over_ranks(calls.workload.logical_dispatch_bytes + calls.workload.logical_combine_bytes);
  const auto add_row = [&](const std::string& what, const std::vector<double>& all,
                           const std::vector<double>& own, bool moves_data) {
    const double median_seconds = median(all);
    const double bytes = moves_data ? remote_bytes : 0.0;
    state.counters[what + " [us]"] = median_seconds * 1e6;
    summary.push_back(
        {name + " " + what, backend, median_seconds * 1e6, reduce_over_ranks(median(own), MPI_MIN) * 1e6,
         reduce_over_ranks(median(own), MPI_MAX) * 1e6, bytes / 1e6, moves_data ? logical_bytes / 1e6 : 0.0,
         median_seconds > 0 ? bytes / median_seconds / 1e9 : 0.0, 0.0});
    return median_seconds;
  };
  const double step_seconds = add_row("dispatch+combine", all_step, own_step, true);
  const double load_seconds =
      add_row("compute on " + std::to_string(split.compute) + " SMs", all_load, own_load, false);
  const double both_seconds = add_row("both", all_both, own_both, true);
  std::ostringstream line;
  line.precision(2);
  line << std::fixed << name << ": both " << both_seconds * 1e6
       << " us = " << both_seconds / std::max(step_seconds, load_seconds)
       << " x the longer alone (dispatch+combine " << step_seconds * 1e6 << " us on " << split.communication
       << " SMs, compute " << load_seconds * 1e6 << " us on " << split.compute << " SMs)";
  overlap_summary.push_back(line.str());
}
#endif

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
  if (wants_help(argc, argv)) {
    if (rank == 0) {
      std::fputs(kUsage, stdout);
    }
    MPI_Finalize();
    return 0;
  }
  keep_large_allocations_in_the_heap();
  try {
    const BenchOptions options = parse_options(argc, argv);
    rocep::EpConfig config;
    config.hidden = options.hidden;
    config.top_k = options.top_k;
    config.combine_dtype = options.combine_dtype;
    config.local_only = options.local_only;
    config.allreduce_world_size = options.local_only ? world : 1;
    config.num_experts = options.experts > 0 ? options.experts : (256 + world - 1) / world * world;
    // Checked here at the largest case; each case sets its own tokens, budget, layout and format.
    config.max_tokens_per_rank = *std::max_element(options.tokens.begin(), options.tokens.end());
    config.validate(world);

    // Google Benchmark keeps the last of a repeated flag: refused here, as this benchmark's own are.
    for (int i = 1; i < argc; ++i) {
      const std::string name(argv[i], std::strcspn(argv[i], "="));
      if (name.rfind("--benchmark_", 0) != 0) {
        continue;
      }
      for (int earlier = 1; earlier < i; ++earlier) {
        if (std::strncmp(argv[earlier], name.c_str(), name.size()) == 0 &&
            (argv[earlier][name.size()] == '=' || argv[earlier][name.size()] == '\0')) {
          throw rocep::ConfigError(name + " is given twice");
        }
      }
    }
    if (rank != 0) {  // one file: rank 0 writes --benchmark_out; another rank opening it would truncate it
      argc = static_cast<int>(std::remove_if(argv + 1, argv + argc,
                                             [](const char* argument) {
                                               return std::strncmp(argument, "--benchmark_out", 15) == 0;
                                             }) -
                              argv);
    }
    const bool machine_readable = std::any_of(argv + 1, argv + argc, [](const char* argument) {
      return std::strncmp(argument, "--benchmark_format=", 19) == 0 &&
             std::strcmp(argument, "--benchmark_format=console") != 0;
    });
    benchmark::Initialize(&argc, argv);
    if (argc > 1) {  // what neither parse_options nor Google Benchmark took
      std::string unknown;
      for (int i = 1; i < argc; ++i) {
        unknown += std::string(i > 1 ? " " : "") + argv[i];
      }
      throw rocep::ConfigError("unknown or repeated argument(s): " + unknown +
                               " (each flag at most once, as --name=value; --help lists them)");
    }
    int cases = 0;  // registered below
    double link_peak = 0.0;
    std::string topology;                  // the GPUs of rank 0's node and their links, printed in the header
    std::string budgets = "SM budgets: ";  // printed in the header; on a GPU, rank 0's as resolved
    for (std::size_t i = 0; i < options.sms.size(); ++i) {
      budgets += (i == 0 ? "" : ", ") + sms_name(options.sms[i]);
    }
    budgets += " (the CPU reference ignores them)\n";
    // Per --sms value: the multiprocessors left beside the communication kernels (0 without a GPU).
    std::vector<int> compute_sms(options.sms.size(), 0);
#if defined(ROCEP_GPU_BUILD)
    if (on_gpu()) {
      rocep::MpiBootstrap world_bootstrap(MPI_COMM_WORLD);
      rocep::set_device(rocep::device_for_local_rank(rocep::node_layout(world_bootstrap, 0).local_rank,
                                                     rocep::device_count(), std::getenv("ROCEP_DEVICE")));
      const rocep::NodeGroupTopology node = rocep::gather_node_topology(world_bootstrap);
      topology = node.topology.describe();
      if (next_rank_on_same_gpu(node.rank_gpus)) {
        topology += "No P2P link peak: ranks share a GPU, so a copy to the next rank may not cross a link\n";
      } else {
        link_peak = measure_link_peak_gb_per_s();
      }
      for (std::size_t i = 0; i < options.sms.size(); ++i) {
        const rocep::testing::SmSplit split = rocep::testing::sm_split(world_bootstrap, options.sms[i]);
        // The same decision on every rank: the cases are collective.
        MPI_Allreduce(&split.compute, &compute_sms[i], 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
        if (i == 0) {
          budgets = "SM budgets of rank 0, of the " + std::to_string(split.multiprocessors) +
                    " multiprocessors of a GPU it shares with " + std::to_string(split.ranks_on_gpu - 1) +
                    " other rank(s): ";
        }
        budgets +=
            (i == 0 ? "" : ", ") + sms_name(options.sms[i]) + " = " + std::to_string(split.communication);
      }
      budgets += "\n";
    }
#endif
    for (std::size_t budget = 0; budget < options.sms.size(); ++budget) {
      for (const rocep::Layout layout : options.layouts) {
        const std::string sms = std::string(layout == rocep::Layout::kPerToken ? "/per-token" : "") +
                                "/sms:" + sms_name(options.sms[budget]);
        for (const rocep::TokenFormat format : options.formats) {
          rocep::EpConfig format_config = config;
          format_config.layout = layout;
          format_config.dispatch_format = format;
          format_config.num_sms = options.sms[budget];
          format_config.validate(world);
          for (const TokenInputs token_inputs : options.inputs) {
            const bool bf16 = format == rocep::TokenFormat::kBf16;
            if (token_inputs == TokenInputs::kQuantised && bf16) {
              continue;  // bf16 has nothing to quantise
            }
            for (const int tokens : options.tokens) {
              rocep::EpConfig case_config = format_config;
              case_config.max_tokens_per_rank = std::max(tokens, options.max_tokens);
              const std::string max_tokens =
                  options.max_tokens > tokens ? "/max_tokens:" + std::to_string(options.max_tokens) : "";
              const std::string name = std::string("/") + rocep::to_string(format) +
                                       (token_inputs == TokenInputs::kInputBuffer ? "/input_buffer"
                                        : token_inputs == TokenInputs::kQuantised ? "/quantised"
                                                                                  : "") +
                                       "/tokens:" + std::to_string(tokens) + max_tokens + sms;
              for (const Sequence sequence : {Sequence::kFused, Sequence::kSplit}) {
                if (!(sequence == Sequence::kFused ? options.fused : options.split)) {
                  continue;
                }
                // A fixed iteration count: every rank must run the same number of collective calls.
                const std::string case_name = (sequence == Sequence::kFused ? "fused" : "split") + name;
                ++cases;
                benchmark::RegisterBenchmark(case_name.c_str(), run_case, name, sequence, case_config, tokens,
                                             token_inputs)
                    ->Iterations((options.iterations + kRepeats - 1) / kRepeats)
                    ->UseManualTime()
                    ->Unit(benchmark::kMicrosecond);
              }
#if defined(ROCEP_GPU_BUILD)
              if (options.graph) {
                ++cases;
                benchmark::RegisterBenchmark(("graph" + name).c_str(), run_graph_case, name, case_config,
                                             tokens, token_inputs)
                    ->Iterations(options.iterations)
                    ->UseManualTime()
                    ->Unit(benchmark::kMicrosecond);
              }
#endif
            }
          }
#if defined(ROCEP_GPU_BUILD)
          // Beside a compute kernel: only where the budget leaves multiprocessors over.
          if (options.concurrent && compute_sms[budget] > 0) {
            const std::string name = std::string("concurrent/") + rocep::to_string(format) +
                                     "/tokens:" + std::to_string(options.concurrent_tokens) + sms;
            ++cases;
            benchmark::RegisterBenchmark(name.c_str(), run_concurrent_case, name, format_config,
                                         options.concurrent_tokens)
                ->Iterations((options.iterations + kRepeats - 1) / kRepeats)
                ->UseManualTime()
                ->Unit(benchmark::kMicrosecond);
          }
#endif
        }
      }
    }
    std::size_t ran = 0;  // cases Google Benchmark ran (those --benchmark_filter matches)
    if (cases == 0) {
      throw rocep::ConfigError(
          "no case to run: --layouts, --cases, --formats and --inputs select none (--inputs=quantised takes "
          "the scaled formats only; the graph and concurrent cases need a GPU)");
    }
    if (rank == 0) {
      // Where Google Benchmark writes JSON or CSV to stdout, this benchmark's own text goes to stderr.
      std::FILE* report = machine_readable ? stderr : stdout;
      std::fprintf(report, "rocep benchmark: %d rank(s), %s\n%s%s", world,
                   settings_line(options, config).c_str(), budgets.c_str(), topology.c_str());
      std::fflush(report);
      if (!on_gpu() && (options.graph || options.concurrent)) {
        std::fprintf(report, "(--cases: graph and concurrent run on a GPU only, and are left out here)\n");
      }
      ran = benchmark::RunSpecifiedBenchmarks();
      print_summary(link_peak, report);
    } else {
      SilentReporter silent;
      ran = benchmark::RunSpecifiedBenchmarks(&silent);
    }
    if (ran == 0) {
      throw rocep::ConfigError("no case to run: --benchmark_filter matches none of the cases");
    }
    benchmark::Shutdown();
  } catch (const std::exception& error) {  // rocep's errors, and host memory the sizes asked for
    std::fprintf(stderr, "[rank %d] rocep_bench: %s\n", rank, error.what());
    status = 1;
  }
  MPI_Finalize();
  return status;
}
