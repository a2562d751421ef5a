// The SHMEM engine (host/shmem_engine.hpp) between the ranks of one host, each rank its own PE as a rank on
// another node would be: joined through rocep's Bootstrap with a unique id (no NVSHMEM launcher, no MPI
// inside the engine), symmetric memory, and in three rounds of new data and sizes every PE puts its buffer
// to the next PE with a signal added after it; the receiver waits on the device (bounded) for the signal,
// then checks every byte against the sender's data and the poison past it. Last, a wait for a signal that
// never comes ends by its bound. Built only with an engine (ROCEP_SHMEM).
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <random>
#include <vector>

#include "gpu_support.hpp"
#include "hip/shmem_transport.hpp"
#include "host/shmem_engine.hpp"

namespace {

constexpr std::size_t kBytes = std::size_t{4} << 20;
constexpr uint8_t kPoison = 0xab;

// Rank `pe`'s bytes in round `round` of a run with `seed`, as every rank can recompute them.
std::vector<uint8_t> round_bytes(uint32_t seed, int pe, int round, std::size_t bytes) {
  std::mt19937 random(seed ^ (static_cast<uint32_t>(pe) << 16) ^ static_cast<uint32_t>(round));
  std::vector<uint8_t> values(bytes);
  for (uint8_t& value : values) {
    value = static_cast<uint8_t>(random());
  }
  return values;
}

class ShmemEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int world = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (!rocep::testing::use_rank_gpu()) {
      GTEST_SKIP() << "no GPU visible (hipGetDeviceCount/cudaGetDeviceCount returned 0): SHMEM test not run";
    }
    if (world < 2) {
      GTEST_SKIP() << "needs at least 2 MPI ranks, got " << world;
    }
  }
};

TEST_F(ShmemEngineTest, PutsWithASignalArriveWholeRoundAfterRoundAndAMissingSignalTimesOut) {
  rocep::MpiBootstrap world(MPI_COMM_WORLD);
  uint32_t seed = static_cast<uint32_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  MPI_Bcast(&seed, 1, MPI_UINT32_T, 0, MPI_COMM_WORLD);

  const std::shared_ptr<rocep::ShmemEngine> engine = rocep::ShmemEngine::join(world);
  ASSERT_EQ(engine->pe(), world.rank());
  ASSERT_EQ(engine->pes(), world.size());
  auto* inbox = static_cast<uint8_t*>(engine->allocate(kBytes));
  auto* outbox = static_cast<uint8_t*>(engine->allocate(kBytes));
  auto* signal = static_cast<uint64_t*>(engine->allocate(sizeof(uint64_t)));
  int* timed_out = nullptr;
  ROCEP_GPU_CHECK(hipMalloc(&timed_out, sizeof(int)));
  ROCEP_GPU_CHECK(hipMemset(signal, 0, sizeof(uint64_t)));
  ROCEP_GPU_CHECK(hipDeviceSynchronize());
  engine->barrier();

  const int next = (engine->pe() + 1) % engine->pes();
  const int previous = (engine->pe() + engine->pes() - 1) % engine->pes();
  const uint64_t second_ticks = rocep::wall_clock_rate_hz(rocep::current_device());
  for (int round = 1; round <= 3; ++round) {
    const std::size_t bytes = kBytes >> (round - 1);  // 4, 2, 1 MiB: the rest of the inbox stays poisoned
    const std::vector<uint8_t> mine = round_bytes(seed, engine->pe(), round, bytes);
    ROCEP_GPU_CHECK(hipMemcpy(outbox, mine.data(), bytes, hipMemcpyHostToDevice));
    ROCEP_GPU_CHECK(hipMemset(inbox, kPoison, kBytes));
    ROCEP_GPU_CHECK(hipDeviceSynchronize());
    engine->barrier();  // every inbox poisoned before anyone puts
    ROCEP_GPU_CHECK(rocep::device::launch_shmem_put_signal(inbox, outbox, bytes, signal, 1, next, nullptr));
    ROCEP_GPU_CHECK(rocep::device::launch_shmem_wait_signal(signal, static_cast<uint64_t>(round),
                                                            10 * second_ticks, timed_out, nullptr));
    ROCEP_GPU_CHECK(hipDeviceSynchronize());
    int waited_out = 1;
    ROCEP_GPU_CHECK(hipMemcpy(&waited_out, timed_out, sizeof(int), hipMemcpyDeviceToHost));
    ASSERT_EQ(waited_out, 0) << "round " << round << ": no signal from PE " << previous << " within 10 s";
    std::vector<uint8_t> received(kBytes);
    ROCEP_GPU_CHECK(hipMemcpy(received.data(), inbox, kBytes, hipMemcpyDeviceToHost));
    const std::vector<uint8_t> expected = round_bytes(seed, previous, round, bytes);
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < kBytes; ++i) {
      wrong += received[i] != (i < bytes ? expected[i] : kPoison) ? 1 : 0;
    }
    EXPECT_EQ(wrong, 0u) << "round " << round << ": bytes from PE " << previous << " differ";
    engine->barrier();  // every PE checked its inbox before the next round poisons it
  }

  // Nobody adds to the signal again: a wait for a 4th arrival ends by its bound (50 ms), on the device.
  const auto start = std::chrono::steady_clock::now();
  ROCEP_GPU_CHECK(rocep::device::launch_shmem_wait_signal(signal, 4, second_ticks / 20, timed_out, nullptr));
  ROCEP_GPU_CHECK(hipDeviceSynchronize());
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  int waited_out = 0;
  ROCEP_GPU_CHECK(hipMemcpy(&waited_out, timed_out, sizeof(int), hipMemcpyDeviceToHost));
  EXPECT_EQ(waited_out, 1);
  EXPECT_LT(waited, 5.0);

  engine->barrier();
  ROCEP_GPU_CHECK(hipFree(timed_out));
  engine->release(signal);
  engine->release(outbox);
  engine->release(inbox);
}

}  // namespace
