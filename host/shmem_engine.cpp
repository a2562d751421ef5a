#include "shmem_engine.hpp"

#include <mutex>
#include <string>
#include <vector>

#include "hip/shmem.hpp"
#include "rocep/errors.hpp"

namespace rocep {

namespace {

std::mutex engine_mutex;
// The process's engine, once joined, until the process exits: the engine cannot be initialised twice in a
// process, and its finalisation is a collective that a peer gone first would never join. Never destroyed.
std::shared_ptr<ShmemEngine>& engine = *new std::shared_ptr<ShmemEngine>();

}  // namespace

std::shared_ptr<ShmemEngine> ShmemEngine::join(Bootstrap& world) {
  const std::lock_guard<std::mutex> lock(engine_mutex);
  if (const std::shared_ptr<ShmemEngine>& running = engine) {
    if (running->pe() != world.rank() || running->pes() != world.size()) {
      throw ConfigError("ShmemEngine: this process already joined the engine as PE " +
                        std::to_string(running->pe()) + " of " + std::to_string(running->pes()) +
                        "; a group of rank " + std::to_string(world.rank()) + " of " +
                        std::to_string(world.size()) + " cannot join it too (one engine per process)");
    }
    return running;
  }
  // Rank 0's unique id reaches every rank through the bootstrap (each rank contributes one, rank 0's is
  // used).
  shmem::UniqueId mine = shmem::unique_id_initializer();
  if (world.rank() == 0 && shmem::get_unique_id(&mine) != 0) {
    throw GpuRuntimeError("ShmemEngine: the engine gave no unique id on rank 0");
  }
  std::vector<shmem::UniqueId> ids(static_cast<std::size_t>(world.size()));
  world.all_gather(&mine, ids.data(), sizeof mine);
  const int status = shmem::init_with_unique_id(world.rank(), world.size(), &ids[0]);
  if (status != 0) {
    throw GpuRuntimeError("ShmemEngine: the engine refused to start on rank " + std::to_string(world.rank()) +
                          " (status " + std::to_string(status) + ")");
  }
  if (shmem::my_pe() != world.rank() || shmem::n_pes() != world.size()) {
    throw GpuRuntimeError("ShmemEngine: the engine made rank " + std::to_string(world.rank()) + " of " +
                          std::to_string(world.size()) + " PE " + std::to_string(shmem::my_pe()) + " of " +
                          std::to_string(shmem::n_pes()));
  }
  std::shared_ptr<ShmemEngine> joined(new ShmemEngine(world.rank(), world.size()));
  engine = joined;
  return joined;
}

void* ShmemEngine::allocate(std::size_t bytes) {
  void* memory = shmem::symmetric_malloc(bytes);
  if (memory == nullptr && bytes > 0) {
    throw GpuRuntimeError("ShmemEngine: no " + std::to_string(bytes) +
                          " bytes of symmetric memory left on PE " + std::to_string(pe_) + " (" +
                          shmem::kHeapSizeVariable + " sets the heap)");
  }
  return memory;
}

void ShmemEngine::release(void* memory) {
  shmem::symmetric_free(memory);
}

void ShmemEngine::barrier() {
  shmem::barrier_all();
}

}  // namespace rocep
