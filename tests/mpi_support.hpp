// Helpers shared by the tests that run under mpirun.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>

namespace rocep::testing {

inline int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

inline int world_size() {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

// Drawn fresh on every run, or taken from ROCEP_TEST_SEED to replay a failure. Not collective: each caller
// draws its own.
inline uint64_t fresh_seed() {
  const char* replay = std::getenv("ROCEP_TEST_SEED");
  if (replay != nullptr) {
    return std::strtoull(replay, nullptr, 10);
  }
  std::random_device device;
  return (uint64_t{device()} << 32) | device();
}

// What a failure prints about its seed.
inline std::string seed_trace(uint64_t seed) {
  return "seed " + std::to_string(seed) + " (replay with ROCEP_TEST_SEED=" + std::to_string(seed) + ")";
}

// fresh_seed() of rank 0, the same on every rank. Collective.
inline uint64_t shared_seed() {
  uint64_t seed = world_rank() == 0 ? fresh_seed() : 0;
  MPI_Bcast(&seed, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  return seed;
}

}  // namespace rocep::testing
