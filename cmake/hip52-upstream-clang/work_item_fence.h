// Force-included into every HIP compile of the upstream-clang AMD build (cmake/RocepUpstreamClangHip.cmake).
// HIP 5.2's __syncthreads / __threadfence* call __atomic_work_item_fence, which only ROCm 5.2's hip.bc
// defines; upstream clang no longer links hip.bc, so this defines it from the fence builtin, with the scopes
// mapped as the AMDGPU memory model names them: sub_group -> "wavefront", work_group -> "workgroup",
// device -> "agent", all_svm_devices -> "" (system). The address-space flags are ignored: a fence over every
// address space orders at least what the caller asked for.
#pragma once

#if defined(__HIP__)
#include <hip/hip_runtime.h>

#if defined(__HIP_DEVICE_COMPILE__)
// Every caller passes constant arguments and the device code is fully inlined, so the switches fold away.
#define ROCEP_FENCE_AT_SCOPE(order)                    \
  switch (scope) {                                     \
    case __memory_scope_work_item:                     \
      break;                                           \
    case __memory_scope_sub_group:                     \
      __builtin_amdgcn_fence(order, "wavefront");      \
      break;                                           \
    case __memory_scope_work_group:                    \
      __builtin_amdgcn_fence(order, "workgroup");      \
      break;                                           \
    case __memory_scope_device:                        \
      __builtin_amdgcn_fence(order, "agent");          \
      break;                                           \
    case __memory_scope_all_svm_devices:               \
      __builtin_amdgcn_fence(order, "");               \
      break;                                           \
  }

extern "C" __device__ __attribute__((weak, always_inline)) void __atomic_work_item_fence(
    __cl_mem_fence_flags, __memory_order order, __memory_scope scope) {
  switch (order) {
    case __memory_order_relaxed:
      break;
    case __memory_order_acquire:
      ROCEP_FENCE_AT_SCOPE(__ATOMIC_ACQUIRE)
      break;
    case __memory_order_release:
      ROCEP_FENCE_AT_SCOPE(__ATOMIC_RELEASE)
      break;
    case __memory_order_acq_rel:
      ROCEP_FENCE_AT_SCOPE(__ATOMIC_ACQ_REL)
      break;
    case __memory_order_seq_cst:
      ROCEP_FENCE_AT_SCOPE(__ATOMIC_SEQ_CST)
      break;
  }
}
#undef ROCEP_FENCE_AT_SCOPE
#endif  // __HIP_DEVICE_COMPILE__
#endif  // __HIP__
