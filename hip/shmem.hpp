// The SHMEM engine's calls under rocep's names, as hip/platform.hpp does for the GPU runtime: NVSHMEM
// (ROCEP_SHMEM_NVSHMEM) or rocSHMEM (ROCEP_SHMEM_ROCSHMEM), chosen at configure time (ROCEP_SHMEM,
// cmake/RocepShmem.cmake). This is the only file that names either engine; rocep's code calls shmem::*.
//
// Host: the engine joined through rocep's own Bootstrap with a unique id (no MPI, no launcher), symmetric
// memory (and a pointer to a same-node PE's), a barrier over every PE. Device: non-blocking puts (by a
// thread, or by a block together), a put of bytes followed, on the same connection, by an add to a 64-bit
// signal word of the target PE (so a peer that sees the signal sees the bytes), single-word stores and
// adds, the signal word read where it lives, and a fence.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(ROCEP_SHMEM_NVSHMEM)
#include <nvshmem.h>
#include <nvshmemx.h>
#elif defined(ROCEP_SHMEM_ROCSHMEM)
#include <rocshmem/rocshmem.hpp>
#endif

#if defined(ROCEP_SHMEM_NVSHMEM) || defined(ROCEP_SHMEM_ROCSHMEM)
#define ROCEP_HAVE_SHMEM 1

namespace rocep::shmem {

#if defined(ROCEP_SHMEM_NVSHMEM)
// The environment variable that sizes the engine's symmetric heap on every PE.
inline constexpr const char* kHeapSizeVariable = "NVSHMEM_SYMMETRIC_SIZE";
using UniqueId = nvshmemx_uniqueid_t;
using InitAttributes = nvshmemx_init_attr_t;

inline int get_unique_id(UniqueId* id) {
  return nvshmemx_get_uniqueid(id);
}
// Joins the PEs `pes` as PE `pe` with the unique id every PE got from PE 0. Returns the engine's status.
inline int init_with_unique_id(int pe, int pes, const UniqueId* id) {
  InitAttributes attributes = NVSHMEMX_INIT_ATTR_INITIALIZER;
  const int status = nvshmemx_set_attr_uniqueid_args(pe, pes, id, &attributes);
  return status != 0 ? status : nvshmemx_init_attr(NVSHMEMX_INIT_WITH_UNIQUEID, &attributes);
}
inline int my_pe() {
  return nvshmem_my_pe();
}
inline int n_pes() {
  return nvshmem_n_pes();
}
inline void* symmetric_malloc(std::size_t bytes) {
  return nvshmem_malloc(bytes);
}
inline void symmetric_free(void* memory) {
  nvshmem_free(memory);
}
inline void barrier_all() {
  nvshmem_barrier_all();
}
inline UniqueId unique_id_initializer() {
  return NVSHMEMX_UNIQUEID_INITIALIZER;
}

// `memory` (symmetric) of PE `pe` as this process can load and store it (a PE of this node whose memory
// the engine mapped), or null.
inline void* peer_pointer(void* memory, int pe) {
  return nvshmem_ptr(memory, pe);
}

#if defined(__CUDACC__)
// The calling thread puts `bytes` from `source` (local) to `destination` (symmetric) on `pe`, then adds
// `value` to the signal word `signal` (symmetric) on `pe`, ordered after the bytes. Returns at once.
__device__ inline void put_signal_add_nbi(void* destination, const void* source, std::size_t bytes,
                                          uint64_t* signal, uint64_t value, int pe) {
  nvshmem_putmem_signal_nbi(destination, source, bytes, signal, value, NVSHMEM_SIGNAL_ADD, pe);
}
// The calling thread puts `bytes` from `source` (symmetric) to `destination` (symmetric) on `pe`; returns
// once issued.
__device__ inline void put_nbi(void* destination, const void* source, std::size_t bytes, int pe) {
  nvshmem_putmem_nbi(destination, source, bytes, pe);
}
// The same put by every thread of the block together (each calls it with the same arguments).
__device__ inline void put_nbi_block(void* destination, const void* source, std::size_t bytes, int pe) {
  nvshmemx_putmem_nbi_block(destination, source, bytes, pe);
}
// Single words to `destination` (symmetric) on `pe`: a store of an int32 that the target reads after a
// signal, a uint64 flag that the target polls, an atomic add to a uint64.
__device__ inline void int32_put(int32_t* destination, int32_t value, int pe) {
  nvshmem_int32_p(destination, value, pe);
}
__device__ inline void flag_put(uint64_t* destination, uint64_t value, int pe) {
  nvshmem_uint64_p(destination, value, pe);
}
__device__ inline void uint64_add(uint64_t* destination, uint64_t value, int pe) {
  nvshmem_uint64_atomic_add(destination, value, pe);
}
// The local signal word, as the engine's signal updates leave it.
__device__ inline uint64_t signal_fetch(uint64_t* signal) {
  return nvshmem_signal_fetch(signal);
}
// Operations this PE issued before to a PE are delivered there before the ones it issues after.
__device__ inline void fence() {
  nvshmem_fence();
}
#endif

#else  // rocSHMEM: the same calls under its names (compiled where rocSHMEM is installed; no CI here has it)
inline constexpr const char* kHeapSizeVariable = "ROCSHMEM_HEAP_SIZE";
using UniqueId = rocshmem_uniqueid_t;
using InitAttributes = rocshmem_init_attr_t;

inline int get_unique_id(UniqueId* id) {
  return rocshmem_get_uniqueid(id);
}
inline int init_with_unique_id(int pe, int pes, const UniqueId* id) {
  InitAttributes attributes{};
  const int status = rocshmem_set_attr_uniqueid_args(pe, pes, const_cast<UniqueId*>(id), &attributes);
  return status != 0 ? status : rocshmem_init_attr(ROCSHMEM_INIT_WITH_UNIQUEID, &attributes);
}
inline int my_pe() {
  return rocshmem_my_pe();
}
inline int n_pes() {
  return rocshmem_n_pes();
}
inline void* symmetric_malloc(std::size_t bytes) {
  return rocshmem_malloc(bytes);
}
inline void symmetric_free(void* memory) {
  rocshmem_free(memory);
}
inline void barrier_all() {
  rocshmem_barrier_all();
}
inline UniqueId unique_id_initializer() {
  return UniqueId{};
}

inline void* peer_pointer(void* memory, int pe) {
  return rocshmem_ptr(memory, pe);
}

#if defined(__HIPCC__)
__device__ inline void put_signal_add_nbi(void* destination, const void* source, std::size_t bytes,
                                          uint64_t* signal, uint64_t value, int pe) {
  rocshmem_putmem_signal_nbi(destination, source, bytes, signal, value, ROCSHMEM_SIGNAL_ADD, pe);
}
__device__ inline void put_nbi(void* destination, const void* source, std::size_t bytes, int pe) {
  rocshmem_putmem_nbi(destination, source, bytes, pe);
}
__device__ inline void put_nbi_block(void* destination, const void* source, std::size_t bytes, int pe) {
  rocshmem_putmem_nbi_wg(destination, source, bytes, pe);
}
__device__ inline void int32_put(int32_t* destination, int32_t value, int pe) {
  rocshmem_int32_p(destination, value, pe);
}
// A polled flag as an atomic: on AMD a plain store into memory a peer polls may stay unseen there.
__device__ inline void flag_put(uint64_t* destination, uint64_t value, int pe) {
  rocshmem_uint64_atomic_set(destination, value, pe);
}
__device__ inline void uint64_add(uint64_t* destination, uint64_t value, int pe) {
  rocshmem_uint64_atomic_add(destination, value, pe);
}
__device__ inline uint64_t signal_fetch(uint64_t* signal) {
  return rocshmem_signal_fetch(signal);
}
__device__ inline void fence() {
  rocshmem_fence();
}
#endif
#endif

}  // namespace rocep::shmem

#endif
