// The one place that knows which GPU runtime is underneath. On AMD it includes the HIP runtime; on NVIDIA it
// includes the CUDA runtime and maps exactly the HIP names rocep uses onto their CUDA twins (the
// HIP-on-NVIDIA headers of ROCm 5.2 do not compile against CUDA 13, so the project carries this small table
// instead). Kernels are launched with the <<<...>>> syntax, which both compilers accept.
#pragma once

#include "portable.hpp"

#if defined(ROCEP_PLATFORM_NVIDIA)

#include <cuda_runtime.h>

// Types and constants.
#define hipError_t cudaError_t
#define hipSuccess cudaSuccess
#define hipStream_t cudaStream_t
#define hipEvent_t cudaEvent_t
#define hipDeviceProp_t cudaDeviceProp
#define hipIpcMemHandle_t cudaIpcMemHandle_t
#define hipIpcMemLazyEnablePeerAccess cudaIpcMemLazyEnablePeerAccess
#define hipStreamNonBlocking cudaStreamNonBlocking
#define hipEventDefault cudaEventDefault
#define hipHostMallocDefault cudaHostAllocDefault
#define hipMemcpyHostToDevice cudaMemcpyHostToDevice
#define hipMemcpyDeviceToHost cudaMemcpyDeviceToHost
#define hipMemcpyDeviceToDevice cudaMemcpyDeviceToDevice
#define hipGraph_t cudaGraph_t
#define hipFuncAttributes cudaFuncAttributes
#define hipGraphExec_t cudaGraphExec_t
#define hipStreamCaptureModeThreadLocal cudaStreamCaptureModeThreadLocal
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

#elif defined(ROCEP_PLATFORM_AMD)

#include <hip/hip_runtime.h>

#else
#error "hip/platform.hpp needs ROCEP_PLATFORM_AMD or ROCEP_PLATFORM_NVIDIA (set by the build)"
#endif
