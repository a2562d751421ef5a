// The one place that knows which GPU runtime is underneath. On AMD it includes the HIP runtime; on NVIDIA it
// includes the CUDA runtime and maps exactly the HIP names rocep uses onto their CUDA twins (the
// HIP-on-NVIDIA headers of ROCm 5.2 do not compile against CUDA 13, so the project carries this small table
// instead). Kernels are launched with the <<<...>>> syntax, which both compilers accept, or through
// hipLaunchKernel / hipLaunchCooperativeKernel (hip/ep_kernels.hpp launch_kernel).
#pragma once

#include "portable.hpp"

#if defined(ROCEP_PLATFORM_NVIDIA)

#include <cudaTypedefs.h>  // PFN_cuMemGetAddressRange_v3020
#include <cuda_runtime.h>

// Types and constants.
#define hipError_t cudaError_t
#define hipSuccess cudaSuccess
#define hipErrorCooperativeLaunchTooLarge cudaErrorCooperativeLaunchTooLarge
#define hipStream_t cudaStream_t
#define hipEvent_t cudaEvent_t
#define hipDeviceProp_t cudaDeviceProp
#define hipIpcMemHandle_t cudaIpcMemHandle_t
#define hipIpcMemLazyEnablePeerAccess cudaIpcMemLazyEnablePeerAccess
#define hipStreamNonBlocking cudaStreamNonBlocking
#define hipStreamPerThread cudaStreamPerThread
#define hipStreamLegacy cudaStreamLegacy
#define hipEventDefault cudaEventDefault
#define hipHostMallocDefault cudaHostAllocDefault
#define hipMemcpyHostToDevice cudaMemcpyHostToDevice
#define hipMemcpyDeviceToHost cudaMemcpyDeviceToHost
#define hipMemcpyDeviceToDevice cudaMemcpyDeviceToDevice
#define hipGraph_t cudaGraph_t
#define hipFuncAttributes cudaFuncAttributes
#define hipGraphExec_t cudaGraphExec_t
#define hipStreamCaptureModeGlobal cudaStreamCaptureModeGlobal
#define hipStreamCaptureModeThreadLocal cudaStreamCaptureModeThreadLocal
#define hipStreamCaptureStatus cudaStreamCaptureStatus
#define hipStreamCaptureStatusNone cudaStreamCaptureStatusNone
#define hipDeviceP2PAttr cudaDeviceP2PAttr
#define hipDevP2PAttrPerformanceRank cudaDevP2PAttrPerformanceRank
#define hipDevP2PAttrAccessSupported cudaDevP2PAttrAccessSupported
#define hipDevP2PAttrNativeAtomicSupported cudaDevP2PAttrNativeAtomicSupported

// Runtime calls.
#define hipGetErrorName cudaGetErrorName
#define hipGetErrorString cudaGetErrorString
#define hipGetLastError cudaGetLastError
#define hipGetDeviceCount cudaGetDeviceCount
#define hipGetDevice cudaGetDevice
#define hipSetDevice cudaSetDevice
#define hipGetDeviceProperties cudaGetDeviceProperties
#define hipDeviceGetPCIBusId cudaDeviceGetPCIBusId
#define hipDeviceCanAccessPeer cudaDeviceCanAccessPeer
#define hipDeviceGetP2PAttribute cudaDeviceGetP2PAttribute
#define hipDeviceSynchronize cudaDeviceSynchronize
#define hipMalloc cudaMalloc
#define hipMemGetInfo cudaMemGetInfo
#define hipFree cudaFree
#define hipHostMalloc cudaHostAlloc
#define hipHostFree cudaFreeHost
#define hipMemcpy cudaMemcpy
#define hipMemcpyAsync cudaMemcpyAsync
#define hipMemset cudaMemset
#define hipMemsetAsync cudaMemsetAsync
#define hipStreamCreateWithFlags cudaStreamCreateWithFlags
#define hipStreamDestroy cudaStreamDestroy
#define hipStreamSynchronize cudaStreamSynchronize
#define hipStreamQuery cudaStreamQuery
#define hipStreamIsCapturing cudaStreamIsCapturing
#define hipStreamWaitEvent cudaStreamWaitEvent
#define hipEventCreateWithFlags cudaEventCreateWithFlags
#define hipEventDestroy cudaEventDestroy
#define hipEventRecord cudaEventRecord
#define hipEventSynchronize cudaEventSynchronize
#define hipEventElapsedTime cudaEventElapsedTime
#define hipIpcGetMemHandle cudaIpcGetMemHandle
#define hipIpcOpenMemHandle cudaIpcOpenMemHandle
#define hipIpcCloseMemHandle cudaIpcCloseMemHandle
#define hipStreamBeginCapture cudaStreamBeginCapture
#define hipFuncGetAttributes cudaFuncGetAttributes
#define hipStreamEndCapture cudaStreamEndCapture
#define hipGraphInstantiate cudaGraphInstantiate
#define hipGraphLaunch cudaGraphLaunch
#define hipGraphExecDestroy cudaGraphExecDestroy
#define hipGraphDestroy cudaGraphDestroy
#define hipStreamAddCallback cudaStreamAddCallback
#define hipOccupancyMaxActiveBlocksPerMultiprocessor cudaOccupancyMaxActiveBlocksPerMultiprocessor
#define hipLaunchKernel cudaLaunchKernel
#define hipLaunchCooperativeKernel cudaLaunchCooperativeKernel

// hipMemGetAddressRange (the base and size of the allocation that holds `pointer`) has no twin in the CUDA
// runtime: the driver's cuMemGetAddressRange, looked up through the runtime so that rocep needs no link
// against libcuda. Any driver failure reads as cudaErrorInvalidValue (a pointer not from cudaMalloc).
inline cudaError_t hipMemGetAddressRange(void** base, size_t* bytes, void* pointer) {
  static const PFN_cuMemGetAddressRange_v3020 get_range = [] {
    void* function = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
    const cudaError_t status =
        cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &function, 3020, cudaEnableDefault, &found);
#else
    const cudaError_t status =
        cudaGetDriverEntryPoint("cuMemGetAddressRange", &function, cudaEnableDefault, &found);
#endif
    return status == cudaSuccess && found == cudaDriverEntryPointSuccess
               ? reinterpret_cast<PFN_cuMemGetAddressRange_v3020>(function)
               : nullptr;
  }();
  if (get_range == nullptr) {
    return cudaErrorSymbolNotFound;
  }
  CUdeviceptr found_base = 0;
  if (get_range(&found_base, bytes, reinterpret_cast<CUdeviceptr>(pointer)) != CUDA_SUCCESS) {
    return cudaErrorInvalidValue;
  }
  *base = reinterpret_cast<void*>(found_base);
  return cudaSuccess;
}

// hipGetStreamDeviceId (the device of a stream's work; -1 where the runtime names none) is
// cudaStreamGetDevice from CUDA 12.8 on; before, the runtime has no such query and the current device stands
// in for it.
inline int hipGetStreamDeviceId(cudaStream_t stream) {
  int device = -1;
#if CUDART_VERSION >= 12080
  return cudaStreamGetDevice(stream, &device) == cudaSuccess ? device : -1;
#else
  (void)stream;
  return cudaGetDevice(&device) == cudaSuccess ? device : -1;
#endif
}

#elif defined(ROCEP_PLATFORM_AMD)

#include <hip/hip_runtime.h>

// The legacy default stream's reserved handle, named from ROCm 6.3 on; before, no stream has that handle.
#ifndef hipStreamLegacy
#define hipStreamLegacy ((hipStream_t)1)
#endif

#else
#error "hip/platform.hpp needs ROCEP_PLATFORM_AMD or ROCEP_PLATFORM_NVIDIA (set by the build)"
#endif
