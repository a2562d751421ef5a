// A combine receive through your own elementwise device epilogue, compiled by your build into rocep's
// per-token receive kernel. Header-only device code: include it from a file that nvcc compiles (NVIDIA), or
// hipcc / clang -x hip (AMD), for the GPU architecture rocep was built for.
//
//   // out[t][c] = combined[t][c] * scale[t] + bias[c]
//   struct ScaleAndBias {
//     const float* scale;  // device memory, [tokens]
//     const float* bias;   // device memory, [hidden]
//     __device__ void operator()(int token, int column, float (&values)[8]) const {
//       for (int i = 0; i < 8; ++i) {
//         values[i] = values[i] * scale[token] + bias[column + i];
//       }
//     }
//   };
//
//   rocep::prepare_combine_epilogue<ScaleAndBias>();  // once, before the group's first dispatch
//   group.combine_send(args, stream);
//   rocep::combine_recv(group, args, ScaleAndBias{scale, bias}, stream);
//
// The epilogue is called for every 8 consecutive columns [column, column + 8) of every combined token
// (column a multiple of 8), with their float32 values: the token's rows from every rank that received it,
// summed in ascending rank order, plus the shared expert. It changes them in place; rocep then rounds them
// to bf16 and stores them at args.out + token * out_row_stride + column. It runs in the receive's threads,
// once per (token, 8 columns), in no particular order: it must not depend on another call's values. The
// sums are rocep's, bit for bit whatever your build's flags (explicit fused multiply-adds by 1); your
// epilogue's arithmetic follows your build's (nvcc contracts a * b + c into one fma unless --fmad=false).
//
// The call is EpGroup::combine_recv in every other respect (order, errors, graph capture, the group's SM
// budget); the fused combine has no such form: use combine_send, then this. InvalidInputError on the CPU
// reference, in the expanded layout, or with CombineArgs' own epilogue set (factor, token_factors,
// residual; out_row_stride is allowed). The epilogue is passed to the kernel by value: it must be trivially
// copyable, and its pointers device memory.
#pragma once

#if !defined(ROCEP_PLATFORM_NVIDIA) && !defined(ROCEP_PLATFORM_AMD)
#if defined(__HIP__) || defined(__HIPCC__)
#define ROCEP_PLATFORM_AMD
#elif defined(__CUDACC__)
#define ROCEP_PLATFORM_NVIDIA
#else
#error "<rocep/combine_epilogue.hpp> is device code: compile it with nvcc, or with hipcc / clang -x hip"
#endif
#endif

#include <initializer_list>
#include <string>
#include <type_traits>

#include "rocep/ep_group.hpp"
#include "rocep/errors.hpp"
#include "rocep/hip/combine_receive.hpp"

namespace rocep {
namespace detail {

// kFp8: the group's rows cross ranks in fp8 (EpConfig::combine_dtype).
template <typename Epilogue, bool kFp8>
__global__ void __launch_bounds__(device::PerTokenTuning::kCombineThreads)
    combine_recv_with_epilogue(device::GroupView group, device::CombineArgs args, Epilogue epilogue) {
  device::receive_kernel_per_token<kFp8>(group, args, device::CallerEpilogues<Epilogue>{epilogue});
}

template <typename Epilogue>
int launch_combine_recv(const void* group_view, const void* kernel_args, int blocks, void* stream,
                        const void* epilogue) {
  const auto& group = *static_cast<const device::GroupView*>(group_view);
  const auto& args = *static_cast<const device::CombineArgs*>(kernel_args);
  const auto& caller = *static_cast<const Epilogue*>(epilogue);
  constexpr int kThreads = device::PerTokenTuning::kCombineThreads;
  const auto on = static_cast<hipStream_t>(stream);
  if (group.shape.combine_fp8 != 0) {
    combine_recv_with_epilogue<Epilogue, true><<<blocks, kThreads, 0, on>>>(group, args, caller);
  } else {
    combine_recv_with_epilogue<Epilogue, false><<<blocks, kThreads, 0, on>>>(group, args, caller);
  }
  return static_cast<int>(hipGetLastError());
}

}  // namespace detail

// Loads the receive kernels of `Epilogue` now (for bf16 and fp8 combines). With lazy loading (CUDA's
// default), a kernel's first launch waits for the device to idle, which a spinning rocep kernel of the same
// process can prevent forever: call this once per epilogue type, before the group's first dispatch (outside
// graph capture). Throws GpuRuntimeError if the runtime cannot load it.
template <typename Epilogue>
void prepare_combine_epilogue() {
  for (const void* kernel :
       {reinterpret_cast<const void*>(&detail::combine_recv_with_epilogue<Epilogue, false>),
        reinterpret_cast<const void*>(&detail::combine_recv_with_epilogue<Epilogue, true>)}) {
    hipFuncAttributes attributes;
    const hipError_t status = hipFuncGetAttributes(&attributes, kernel);
    if (status != hipSuccess) {
      throw GpuRuntimeError(
          std::string("rocep::prepare_combine_epilogue: loading the receive kernel failed: ") +
          hipGetErrorString(status));
    }
  }
}

// EpGroup::combine_recv through `epilogue` (see the top of this file).
template <typename Epilogue>
void combine_recv(EpGroup& group, const CombineArgs& args, const Epilogue& epilogue, void* stream = nullptr) {
  static_assert(std::is_trivially_copyable_v<Epilogue>, "the epilogue is passed to the kernel by value");
  group.combine_recv_with(args, CombineReceiveLauncher{&detail::launch_combine_recv<Epilogue>, &epilogue},
                          stream);
}

}  // namespace rocep
