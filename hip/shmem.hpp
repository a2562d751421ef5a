// The SHMEM engine's calls under rocep's names, as hip/platform.hpp does for the GPU runtime: NVSHMEM
// (ROCEP_SHMEM_NVSHMEM) or rocSHMEM (ROCEP_SHMEM_ROCSHMEM), chosen at configure time (ROCEP_SHMEM,
// cmake/RocepShmem.cmake). This is the only file that names either engine; rocep's code calls shmem::*.
//
// Host: the engine joined through rocep's own Bootstrap with a unique id (no MPI, no launcher), symmetric
// memory, a barrier over every PE. Device: a non-blocking put of bytes followed, on the same connection, by
// an add to a 64-bit signal word of the target PE (so a peer that sees the signal sees the bytes), and the
// signal word read where it lives.
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
inline void finalize() {
  nvshmem_finalize();
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

#if defined(__CUDACC__)
// The calling thread puts `bytes` from `source` (local) to `destination` (symmetric) on `pe`, then adds
// `value` to the signal word `signal` (symmetric) on `pe`, ordered after the bytes. Returns at once.
__device__ inline void put_signal_add_nbi(void* destination, const void* source, std::size_t bytes,
                                          uint64_t* signal, uint64_t value, int pe) {
  nvshmem_putmem_signal_nbi(destination, source, bytes, signal, value, NVSHMEM_SIGNAL_ADD, pe);
}
// The local signal word, as the engine's signal updates leave it.
__device__ inline uint64_t signal_fetch(uint64_t* signal) {
  return nvshmem_signal_fetch(signal);
}
// Completes this thread's puts (their source may be reused).
__device__ inline void quiet() {
  nvshmem_quiet();
}
#endif

#else  // rocSHMEM: the same calls under its names (compiled where rocSHMEM is installed; no CI here has it)
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
inline void finalize() {
  rocshmem_finalize();
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

#if defined(__HIPCC__)
__device__ inline void put_signal_add_nbi(void* destination, const void* source, std::size_t bytes,
                                          uint64_t* signal, uint64_t value, int pe) {
  rocshmem_putmem_signal_nbi(destination, source, bytes, signal, value, ROCSHMEM_SIGNAL_ADD, pe);
}
__device__ inline uint64_t signal_fetch(uint64_t* signal) {
  return rocshmem_signal_fetch(signal);
}
__device__ inline void quiet() {
  rocshmem_quiet();
}
#endif
#endif

}  // namespace rocep::shmem

#endif
