// The SHMEM engine of this process (hip/shmem.hpp names its calls), for peers on other nodes: joined through
// rocep's own Bootstrap with a unique id, so no MPI and no launcher is needed. The engine is one per
// process: the first join initialises it over the joining group's ranks, and it stays up until the process
// exits, never finalised (it cannot start twice in a process, and finalising is a collective).
// Compiled only into builds with an engine (ROCEP_SHMEM, cmake/RocepShmem.cmake).
#pragma once

#include <cstddef>
#include <memory>

#include "rocep/bootstrap.hpp"

namespace rocep {

class ShmemEngine {
 public:
  // Joins the engine: every rank of `world` calls it, its GPU current, and becomes PE world.rank() of
  // world.size(). A later join needs the same rank and size (else ConfigError). Throws ConfigError (another
  // world already joined), GpuRuntimeError (the engine refused to start; NVSHMEM ends the process on some
  // failures itself).
  static std::shared_ptr<ShmemEngine> join(Bootstrap& world);

  ShmemEngine(const ShmemEngine&) = delete;
  ShmemEngine& operator=(const ShmemEngine&) = delete;

  int pe() const { return pe_; }
  int pes() const { return pes_; }
  // Symmetric memory: collective, every PE with the same size, in the same order. Throws GpuRuntimeError
  // when the engine's heap is exhausted (shmem::kHeapSizeVariable sets it).
  void* allocate(std::size_t bytes);
  void release(void* memory);  // collective
  void barrier();              // every PE, on the host

 private:
  ShmemEngine(int pe, int pes) : pe_(pe), pes_(pes) {}
  int pe_;
  int pes_;
};

}  // namespace rocep
