// Device atomics with the scope and order spelled out. Cross-GPU flags use system scope: a peer GPU polls
// them over xGMI / NVLink, so device scope would let the store sit in this GPU's caches. On AMD the memory a
// peer touches while kernels run must also be fine-grained or uncached (DeviceMemoryKind::kPeerVisible in
// host/device_memory.hpp; docs/design.md says why per region), or the stores may stay invisible until the
// kernel ends. tests/isa/check_isa.py checks what these compile to on the AMD targets.
#pragma once

#include "platform.hpp"

#if defined(ROCEP_PLATFORM_NVIDIA)
#include <cuda/atomic>
#endif

namespace rocep::device {

// The scopes, and how each target spells them (this file is the only place that does):
enum class Scope {
  kDevice,  // this GPU: the AMDGPU memory model's "agent" scope, CUDA's thread_scope_device (PTX .gpu)
  kSystem,  // every GPU and the host: AMDGPU "system" scope, CUDA's thread_scope_system (PTX .sys)
};

#if defined(ROCEP_PLATFORM_AMD)
template <Scope S>
inline constexpr int kHipScope = S == Scope::kSystem ? __HIP_MEMORY_SCOPE_SYSTEM : __HIP_MEMORY_SCOPE_AGENT;
#else
template <Scope S>
inline constexpr cuda::thread_scope kCudaScope =
    S == Scope::kSystem ? cuda::thread_scope_system : cuda::thread_scope_device;
#endif

// Load that orders every later load/store of this thread after it (pairs with store_release).
template <Scope S, typename T>
__device__ inline T load_acquire(const T* address) {
#if defined(ROCEP_PLATFORM_AMD)
  return __hip_atomic_load(address, __ATOMIC_ACQUIRE, kHipScope<S>);
#else
  return cuda::atomic_ref<T, kCudaScope<S> >(*const_cast<T*>(address)).load(cuda::memory_order_acquire);
#endif
}

// Store that makes every earlier load/store of this thread visible before it (pairs with load_acquire).
template <Scope S, typename T>
__device__ inline void store_release(T* address, T value) {
#if defined(ROCEP_PLATFORM_AMD)
  __hip_atomic_store(address, value, __ATOMIC_RELEASE, kHipScope<S>);
#else
  cuda::atomic_ref<T, kCudaScope<S> >(*address).store(value, cuda::memory_order_release);
#endif
}

// Atomic add that returns the old value, acquire-release at scope S: every earlier load/store of this thread,
// and what it has synchronised with (a block barrier's threads), is released before it, and what earlier
// releases of the word published is acquired. Lighter than the sequentially consistent fences around a
// plain atomicAdd (__threadfence), which is all the grid barrier and the arrival count need.
template <Scope S>
__device__ inline uint32_t fetch_add_acq_rel(uint32_t* address, uint32_t value) {
#if defined(ROCEP_PLATFORM_AMD)
  return __hip_atomic_fetch_add(address, value, __ATOMIC_ACQ_REL, kHipScope<S>);
#else
  return cuda::atomic_ref<uint32_t, kCudaScope<S> >(*address).fetch_add(value, cuda::memory_order_acq_rel);
#endif
}

// Acquire-release fence at system scope: every earlier load/store of this thread (and what it acquired) is
// ordered before its later ones for every observer, peers included.
__device__ inline void fence_acq_rel_system() {
#if defined(ROCEP_PLATFORM_AMD)
  // __builtin_amdgcn_fence reads its scope only from a string literal, in which the empty string "" is the
  // AMDGPU memory model's system scope ("agent" would be this GPU only). A named constant compiles but is not
  // read (clang 15 made an "agent" constant system scope; clang 22 crashes on one), and a template parameter
  // is refused as the order: so this is the one place that spells the fence.
  __builtin_amdgcn_fence(__ATOMIC_ACQ_REL, "");
#else
  cuda::atomic_thread_fence(cuda::memory_order_acq_rel, kCudaScope<Scope::kSystem>);
#endif
}

// Whether every store of a kernel that has ended is seen by the peers with no fence in a later kernel: a
// peer's loads of this GPU's memory, and the peer's own loads of what the kernel stored into the peer's
// memory. NVIDIA: a kernel ends once its stores are performed, its stores into a peer's memory included,
// and a peer's loads of this GPU's memory are served by this GPU's L2, which those stores have reached.
// AMD: not assumed (the L2 of one XCD may hold what an ended kernel wrote until a system-scope release
// writes it back), so a signal after such stores keeps its fence.
#if defined(ROCEP_PLATFORM_NVIDIA)
inline constexpr bool kEndedKernelsVisibleToPeers = true;
#else
inline constexpr bool kEndedKernelsVisibleToPeers = false;
#endif

// Atomic add at system scope to a word in global memory (a peer's, too), with no ordering of its own and
// no result, so the thread does not wait for it to complete (a reduction, not a fetch).
__device__ inline void add_relaxed_system(uint64_t* address, uint64_t value) {
#if defined(ROCEP_PLATFORM_AMD)
  __hip_atomic_fetch_add(address, value, __ATOMIC_RELAXED, kHipScope<Scope::kSystem>);
#else
  asm volatile("red.relaxed.sys.global.add.u64 [%0], %1;" ::"l"(address), "l"(value) : "memory");
#endif
}

// Sets bit `bit` (0-63) of a 64-bit mask in shared or global memory, atomically. Through the 32-bit half
// that holds it: sm_90 has no 64-bit atomic OR and runs atomicOr on 64 bits as a compare-and-swap loop
// (ATOMS.CAST.SPIN.64 in the dispatch ranking). Both targets are little-endian, so the low half comes first.
__device__ inline void atomic_set_bit(unsigned long long* mask, int bit) {
  atomicOr(reinterpret_cast<unsigned int*>(mask) + (bit >> 5), 1u << (bit & 31));
}

}  // namespace rocep::device
