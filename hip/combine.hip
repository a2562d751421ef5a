// Combine: expert outputs go back to the ranks their tokens came from.
//
//   rocep_combine_send  expert rank, blocks over received (source, token): weighted, reduce the token's
//                       rows on this rank (float32 fma in ascending k, rounded to bf16) and store that one
//                       partial row into the source's region; unweighted, store each row. The last block
//                       releases every peer's combine_arrived[rank].
//   rocep_combine_recv  source rank, blocks over its tokens: wait for every rank, then sum the partials in
//                       ascending rank order (+ shared expert), or copy the rows; store bf16.
#include "bf16.hpp"
#include "ep_kernels.hpp"
#include "group_sync.hpp"
#include "vector_copy.hpp"

using namespace rocep::device;

namespace {

constexpr int kLanes = 8;  // bf16 elements per 16-byte vector

struct Lanes {
  float value[kLanes];
};

__device__ inline Lanes unpack(const Vector16& vector) {
  const auto* halves = reinterpret_cast<const uint16_t*>(&vector);
  Lanes lanes;
  for (int i = 0; i < kLanes; ++i) {
    lanes.value[i] = rocep::bf16_to_float(halves[i]);
  }
  return lanes;
}

__device__ inline Vector16 pack(const Lanes& lanes) {
  Vector16 vector;
  auto* halves = reinterpret_cast<uint16_t*>(&vector);
  for (int i = 0; i < kLanes; ++i) {
    halves[i] = rocep::float_to_bf16(lanes.value[i]);
  }
  return vector;
}

__device__ inline const Vector16* row_vectors(const uint16_t* rows, std::size_t row, int hidden) {
  return reinterpret_cast<const Vector16*>(rows + row * hidden);
}

}  // namespace

extern "C" __global__ void __launch_bounds__(kBlockThreads)
    rocep_combine_send(GroupView group, rocep::device::CombineArgs args) {
  const Shape& shape = group.shape;
  const uint64_t sequence = group.state->combine_sequence + 1;
  const int vectors = shape.hidden / kLanes;
  const int total = shape.world * shape.max_tokens;
  for (int index = blockIdx.x; index < total; index += gridDim.x) {
    const int source = index / shape.max_tokens;
    const int token = index % shape.max_tokens;
    if (token >= group.signals->tokens_from[source]) {
      continue;
    }
    const int32_t* rows = group.token_rows + static_cast<std::size_t>(index) * shape.top_k;
    auto* region = reinterpret_cast<uint16_t*>(group.peer_combine_regions[source]);
    if (args.row_weights != nullptr) {
      bool any = false;
      for (int k = 0; k < shape.top_k; ++k) {
        any = any || rows[k] >= 0;
      }
      if (!any) {
        continue;
      }
      auto* partial = reinterpret_cast<Vector16*>(
          region + (static_cast<std::size_t>(shape.rank) * shape.max_tokens + token) * shape.hidden);
      for (int v = threadIdx.x; v < vectors; v += blockDim.x) {
        Lanes sum{};
        for (int k = 0; k < shape.top_k; ++k) {
          if (rows[k] < 0) {
            continue;
          }
          const float weight = args.row_weights[rows[k]];
          const Lanes y = unpack(row_vectors(args.expert_outputs, rows[k], shape.hidden)[v]);
          for (int i = 0; i < kLanes; ++i) {
            sum.value[i] = fmaf(weight, y.value[i], sum.value[i]);
          }
        }
        partial[v] = pack(sum);
      }
    } else {
      for (int k = 0; k < shape.top_k; ++k) {
        if (rows[k] >= 0) {
          copy_bytes16(region + (static_cast<std::size_t>(token) * shape.top_k + k) * shape.hidden,
                       args.expert_outputs + static_cast<std::size_t>(rows[k]) * shape.hidden,
                       CombineRegion::row_bytes(shape), threadIdx.x, blockDim.x);
        }
      }
    }
  }
  if (last_block_to_finish(&group.state->blocks_done)) {
    for (int peer = 0; peer < shape.world; ++peer) {
      store_release<Scope::kSystem>(&group.peer_signals[peer]->combine_arrived[shape.rank], sequence);
    }
  }
}

extern "C" __global__ void __launch_bounds__(kBlockThreads)
    rocep_combine_recv(GroupView group, rocep::device::CombineArgs args) {
  const Shape& shape = group.shape;
  const uint64_t sequence = group.state->combine_sequence + 1;
  const bool arrived = block_wait_for_peers(group.signals->combine_arrived, sequence, shape.world,
                                            group.timeout_ticks, group.status, Operation::kCombineRecv);
  const int vectors = shape.hidden / kLanes;
  const int tokens = group.state->sent_tokens;
  const auto* region = reinterpret_cast<const uint16_t*>(group.combine_region);
  for (int token = blockIdx.x; arrived && token < tokens; token += gridDim.x) {
    if (args.row_weights != nullptr) {
      const uint64_t mask = group.sent_masks[token];
      auto* out = reinterpret_cast<Vector16*>(args.out + static_cast<std::size_t>(token) * shape.hidden);
      for (int v = threadIdx.x; v < vectors; v += blockDim.x) {
        Lanes sum{};
        for (int peer = 0; peer < shape.world; ++peer) {
          if ((mask >> peer) & 1) {
            const Lanes partial = unpack(row_vectors(
                region, static_cast<std::size_t>(peer) * shape.max_tokens + token, shape.hidden)[v]);
            for (int i = 0; i < kLanes; ++i) {
              sum.value[i] += partial.value[i];
            }
          }
        }
        if (args.shared_expert_output != nullptr) {
          const Lanes shared = unpack(row_vectors(args.shared_expert_output, token, shape.hidden)[v]);
          for (int i = 0; i < kLanes; ++i) {
            sum.value[i] += shared.value[i];
          }
        }
        out[v] = pack(sum);
      }
    } else {
      for (int k = 0; k < shape.top_k; ++k) {
        const std::size_t row = static_cast<std::size_t>(token) * shape.top_k + k;
        auto* out = reinterpret_cast<Vector16*>(args.out + row * shape.hidden);
        if (group.sent_ids[row] >= 0) {
          copy_bytes16(out, region + row * shape.hidden, CombineRegion::row_bytes(shape), threadIdx.x,
                       blockDim.x);
        } else {
          for (int v = threadIdx.x; v < vectors; v += blockDim.x) {
            out[v] = Vector16{0, 0, 0, 0};
          }
        }
      }
    }
  }
  if (last_block_to_finish(&group.state->blocks_done) && !timed_out(group.status)) {
    group.state->combine_sequence += 1;
  }
}

namespace rocep::device {

hipError_t load_combine_kernels() {
  hipFuncAttributes attributes;
  for (const void* kernel : {reinterpret_cast<const void*>(&rocep_combine_send),
                             reinterpret_cast<const void*>(&rocep_combine_recv)}) {
    const hipError_t status = hipFuncGetAttributes(&attributes, kernel);
    if (status != hipSuccess)
      return status;
  }
  return hipSuccess;
}

void launch_combine_send(const GroupView& group, const CombineArgs& args, int blocks, hipStream_t stream) {
  rocep_combine_send<<<blocks, kBlockThreads, 0, stream>>>(group, args);
}

void launch_combine_recv(const GroupView& group, const CombineArgs& args, int blocks, hipStream_t stream) {
  rocep_combine_recv<<<blocks, kBlockThreads, 0, stream>>>(group, args);
}

}  // namespace rocep::device
