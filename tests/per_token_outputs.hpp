// One rank's per-token dispatch outputs in host memory (the layout of rocep/types.hpp), every byte set to a
// fill value first: the CPU reference's outputs in the CPU tests, and the oracle's in the GPU tests.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "rocep/config.hpp"
#include "rocep/formats.hpp"
#include "rocep/types.hpp"

namespace rocep::testing {

struct PerTokenHostOutputs {
  PerTokenHostOutputs(const EpConfig& config, int world, uint8_t fill)
      : rows(config.max_recv_tokens(world)),
        scale_bytes(format_scale_bytes(config.dispatch_format, config.hidden)),
        recv_tokens(
            filled<uint8_t>(rows * format_payload_bytes(config.dispatch_format, config.hidden), fill)),
        recv_scales(filled<uint8_t>(std::max<std::size_t>(rows * scale_bytes, 1), fill)),
        row_offsets(filled<uint32_t>(config.num_local_experts(world) + 1, fill)),
        src_info(filled<SrcInfo>(rows, fill)),
        topk_ids(filled<int32_t>(rows * config.top_k, fill)),
        topk_weights(filled<float>(rows * config.top_k, fill)),
        num_recv_tokens(filled<int32_t>(1, fill)),
        sorted_token_ids(filled<int32_t>(config.max_recv_rows(world), fill)),
        block_expert_ids(filled<int32_t>(config.max_recv_rows(world) / config.expert_alignment, fill)) {}

  DispatchOutputs view() {
    DispatchOutputs outputs;
    outputs.recv_tokens = recv_tokens.data();
    outputs.recv_scales = scale_bytes > 0 ? recv_scales.data() : nullptr;
    outputs.row_offsets = row_offsets.data();
    outputs.src_info = src_info.data();
    outputs.recv_topk_ids = topk_ids.data();
    outputs.recv_topk_weights = topk_weights.data();
    outputs.num_recv_tokens = num_recv_tokens.data();
    outputs.sorted_token_ids = sorted_token_ids.data();
    outputs.block_expert_ids = block_expert_ids.data();
    return outputs;
  }

  std::size_t rows;         // P = max_recv_tokens
  std::size_t scale_bytes;  // per row
  std::vector<uint8_t> recv_tokens, recv_scales;
  std::vector<uint32_t> row_offsets;
  std::vector<SrcInfo> src_info;
  std::vector<int32_t> topk_ids;
  std::vector<float> topk_weights;
  std::vector<int32_t> num_recv_tokens, sorted_token_ids, block_expert_ids;

 private:
  template <typename T>
  static std::vector<T> filled(std::size_t count, uint8_t fill) {
    std::vector<T> values(count);
    std::memset(static_cast<void*>(values.data()), fill, count * sizeof(T));
    return values;
  }
};

}  // namespace rocep::testing
