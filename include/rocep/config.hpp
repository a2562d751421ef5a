// EpConfig: the sizes and options of one expert-parallel group, fixed at group construction.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "formats.hpp"

namespace rocep {

// Element type of the expert outputs that combine reads and of the combined tokens it writes.
enum class CombineDtype : int32_t {
  kBf16 = 0,
};

const char* to_string(CombineDtype dtype);

struct EpConfig {
  int hidden = 7168;              // elements per token
  int top_k = 8;                  // experts per token
  int num_experts = 256;          // experts over the whole group, split evenly over the ranks
  int max_tokens_per_rank = 128;  // upper bound on the tokens any rank passes to one call
  TokenFormat dispatch_format = TokenFormat::kBf16;
  Fp8Encoding fp8_encoding = Fp8Encoding::kAuto;  // for kFp8Block128 (and the SiLU kernels' fp8 output)
  CombineDtype combine_dtype = CombineDtype::kBf16;
  int gpus_per_node = 0;          // ranks that share a node (and reach each other by IPC); 0 = detect
  int num_blocks = 0;             // blocks per communication kernel; 0 = every block that stays resident
  int expert_alignment = 1;       // each expert's rows padded to a multiple of this (padding rows invalid)
  double timeout_seconds = 10.0;  // bound on every device-side wait

  // Throws ConfigError naming the first offending field, its value and the allowed range. `world_size` is
  // the number of ranks of the group: num_experts must divide evenly among them.
  void validate(int world_size) const;

  // Experts owned by each rank: num_experts / world_size.
  int num_local_experts(int world_size) const;
  // Upper bound on the rows dispatch can produce on one rank, whatever the routing:
  // world_size * max_tokens_per_rank * min(top_k, L) + L * (expert_alignment - 1). A token names each
  // expert at most once, so it yields at most min(top_k, L) rows on one rank.
  std::size_t max_recv_rows(int world_size) const;

  std::string describe() const;  // one line, for logs and benchmark headers
};

}  // namespace rocep
