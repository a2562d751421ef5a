// The MPI bootstrap (all-gather, barrier, their bounded forms, and a group's close bounded by it) on
// MPI_COMM_WORLD at any rank count, the single-process bootstrap, the node layout from host identities or a
// given ranks-per-node, the device choice for a local rank, and the failure-atomic steps of group creation
// (every rank throws, naming the lowest failing rank and the step).
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "host/agreement.hpp"
#include "host/bootstrap.hpp"
#include "host/node.hpp"
#include "mpi_support.hpp"
#include "rocep/errors.hpp"
#include "rocep/mpi.hpp"

namespace {

using rocep::testing::world_rank;
using rocep::testing::world_size;

// The byte rank `rank` contributes at `index`: distinct for every (rank, index) within one contribution.
uint8_t pattern(int rank, std::size_t index) {
  return static_cast<uint8_t>(rank * 61 + index * 7 + 1);
}

std::vector<uint8_t> contribution(int rank, std::size_t bytes) {
  std::vector<uint8_t> bytes_of_rank(bytes);
  for (std::size_t i = 0; i < bytes; ++i) {
    bytes_of_rank[i] = pattern(rank, i);
  }
  return bytes_of_rank;
}

// Every rank's contribution at offset rank * bytes.
std::vector<uint8_t> gathered(int size, std::size_t bytes) {
  std::vector<uint8_t> all;
  for (int rank = 0; rank < size; ++rank) {
    const std::vector<uint8_t> part = contribution(rank, bytes);
    all.insert(all.end(), part.begin(), part.end());
  }
  return all;
}

constexpr std::size_t kGatherSizes[] = {0, 1, 13, 64, 4096};

TEST(MpiBootstrapTest, RankAndSizeMatchMpi) {
  rocep::MpiBootstrap bootstrap(MPI_COMM_WORLD);
  EXPECT_EQ(bootstrap.rank(), world_rank());
  EXPECT_EQ(bootstrap.size(), world_size());
}

TEST(MpiBootstrapTest, OwnsADuplicateOfTheCommunicator) {
  rocep::MpiBootstrap bootstrap(MPI_COMM_WORLD);
  int comparison = MPI_UNEQUAL;
  MPI_Comm_compare(bootstrap.comm(), MPI_COMM_WORLD, &comparison);
  EXPECT_EQ(comparison, MPI_CONGRUENT);
}

TEST(MpiBootstrapTest, AllGatherAndItsBoundedFormPlaceEachRankAtItsOffset) {
  rocep::MpiBootstrap bootstrap(MPI_COMM_WORLD);
  for (std::size_t bytes : kGatherSizes) {
    SCOPED_TRACE(std::to_string(bytes) + " bytes per rank");
    const std::vector<uint8_t> sent = contribution(bootstrap.rank(), bytes);
    std::vector<uint8_t> received(bootstrap.size() * bytes, 0xA5);
    bootstrap.all_gather(sent.data(), received.data(), bytes);
    EXPECT_EQ(received, gathered(bootstrap.size(), bytes));
    std::fill(received.begin(), received.end(), 0xA5);
    EXPECT_TRUE(bootstrap.all_gather_within(sent.data(), received.data(), bytes, 30.0));
    EXPECT_EQ(received, gathered(bootstrap.size(), bytes)) << "all_gather_within";
  }
}

TEST(MpiBootstrapTest, AllGatherInPlace) {
  rocep::MpiBootstrap bootstrap(MPI_COMM_WORLD);
  for (std::size_t bytes : kGatherSizes) {
    SCOPED_TRACE(std::to_string(bytes) + " bytes per rank");
    std::vector<uint8_t> received(bootstrap.size() * bytes, 0xA5);
    const std::vector<uint8_t> mine = contribution(bootstrap.rank(), bytes);
    std::copy(mine.begin(), mine.end(), received.begin() + bootstrap.rank() * bytes);
    bootstrap.all_gather(received.data() + bootstrap.rank() * bytes, received.data(), bytes);
    EXPECT_EQ(received, gathered(bootstrap.size(), bytes));
  }
}

TEST(MpiBootstrapTest, BarrierRepeatedly) {
  rocep::MpiBootstrap bootstrap(MPI_COMM_WORLD);
  for (int round = 0; round < 3; ++round) {
    EXPECT_NO_THROW(bootstrap.barrier());
  }
  // The communicator still carries a matching all-gather after the barriers.
  const int mine = bootstrap.rank();
  std::vector<int> ranks(bootstrap.size(), -1);
  bootstrap.all_gather(&mine, ranks.data(), sizeof mine);
  for (int rank = 0; rank < bootstrap.size(); ++rank) {
    EXPECT_EQ(ranks[rank], rank);
  }
}

TEST(MpiBootstrapTest, BoundedBarrierPassesWhenEveryRankArrives) {
  rocep::MpiBootstrap bootstrap(MPI_COMM_WORLD);
  EXPECT_TRUE(bootstrap.barrier_within(30.0));
  const int mine = bootstrap.rank();
  std::vector<int> ranks(bootstrap.size(), -1);
  bootstrap.all_gather(&mine, ranks.data(), sizeof mine);
  EXPECT_EQ(ranks.back(), bootstrap.size() - 1);
}

// The last rank joins 1 s late: the others give up after 0.2 s; the last rank's all-gather, joining the ones
// the others left pending, completes with every rank's bytes.
TEST(MpiBootstrapTest, BoundedAllGatherGivesUpOnALateRankWhoseOwnStillCompletes) {
  rocep::MpiBootstrap bootstrap(MPI_COMM_WORLD);
  if (bootstrap.size() < 2) {
    GTEST_SKIP() << "needs a late rank and one that waits for it";
  }
  const std::vector<uint8_t> sent = contribution(bootstrap.rank(), 13);
  std::vector<uint8_t> received(bootstrap.size() * sent.size(), 0xA5);
  if (bootstrap.rank() == bootstrap.size() - 1) {
    std::this_thread::sleep_for(std::chrono::seconds(1));
    EXPECT_TRUE(bootstrap.all_gather_within(sent.data(), received.data(), sent.size(), 30.0));
    EXPECT_EQ(received, gathered(bootstrap.size(), sent.size()));
  } else {
    EXPECT_FALSE(bootstrap.all_gather_within(sent.data(), received.data(), sent.size(), 0.2));
  }
  MPI_Barrier(MPI_COMM_WORLD);  // the ranks that gave up drive MPI's progress here until the last one is in
}

// EpGroup::close over an MpiBootstrap bounds its agreement by EpConfig::timeout_seconds: with 0.2 s and the
// last rank 1 s late, the others throw TimeoutError, nothing released (their groups still answer); the last
// rank's close, joining the agreement they left pending, releases its group.
TEST(MpiBootstrapTest, ACloseThatALateRankJoinsTooLateTimesOutOnTheOthers) {
  const auto bootstrap = std::make_shared<rocep::MpiBootstrap>(MPI_COMM_WORLD);
  if (bootstrap->size() < 2) {
    GTEST_SKIP() << "needs a late rank and one that waits for it";
  }
  rocep::EpConfig config;
  config.hidden = 64;
  config.top_k = 2;
  config.num_experts = 2 * bootstrap->size();
  config.max_tokens_per_rank = 8;
  config.timeout_seconds = 0.2;
  rocep::EpGroup group(bootstrap, config, rocep::Backend::kCpuReference);
  const int rank = bootstrap->rank();
  if (rank == bootstrap->size() - 1) {
    std::this_thread::sleep_for(std::chrono::seconds(1));
    EXPECT_NO_THROW(group.close());
    EXPECT_THROW(group.poll_error(), rocep::CallOrderError) << "the late rank's group was not released";
  } else {
    try {
      group.close();
      ADD_FAILURE() << "rank " << rank << ": close() returned without the last rank";
    } catch (const rocep::TimeoutError& error) {
      EXPECT_EQ(std::string(error.what())
                    .rfind("EpGroup::close on rank " + std::to_string(rank) +
                               ": not every rank called close within timeout_seconds = "
                               "0.2 s; nothing released",
                           0),
                0u)
          << error.what();
    }
    EXPECT_FALSE(group.poll_error()) << "the group was released";
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST(NodeLayoutTest, EveryRankOfThisMachineSharesOneNode) {
  rocep::MpiBootstrap bootstrap(MPI_COMM_WORLD);
  const rocep::NodeLayout layout = rocep::node_layout(bootstrap, 0);
  // The tests start every rank on one machine: the node is the world, ordered by rank.
  EXPECT_EQ(layout.num_nodes, 1);
  EXPECT_EQ(layout.node, 0);
  EXPECT_EQ(layout.local_rank, bootstrap.rank());
  ASSERT_EQ(static_cast<int>(layout.local_ranks.size()), bootstrap.size());
  for (int rank = 0; rank < bootstrap.size(); ++rank) {
    EXPECT_EQ(layout.local_ranks[rank], rank);
    EXPECT_TRUE(layout.on_this_node(rank));
  }
  EXPECT_FALSE(rocep::host_identity().empty());
}

TEST(NodeLayoutTest, RanksPerNodeDeclaresNodes) {
  rocep::MpiBootstrap bootstrap(MPI_COMM_WORLD);
  const rocep::NodeLayout layout = rocep::node_layout(bootstrap, 1);  // every rank a node of its own
  EXPECT_EQ(layout.num_nodes, bootstrap.size());
  EXPECT_EQ(layout.node, bootstrap.rank());
  EXPECT_EQ(layout.local_ranks, std::vector<int>{bootstrap.rank()});
  EXPECT_EQ(layout.local_rank, 0);
}

TEST(NodeLayoutTest, IdentitiesGroupRanksInOrderOfTheirLowestRank) {
  const std::vector<std::string> identities = {"b", "a", "b", "c", "a"};
  const rocep::NodeLayout layout = rocep::node_layout_of(identities, 4);
  EXPECT_EQ(layout.node_of_rank, (std::vector<int>{0, 1, 0, 2, 1}));
  EXPECT_EQ(layout.num_nodes, 3);
  EXPECT_EQ(layout.node, 1);
  EXPECT_EQ(layout.local_ranks, (std::vector<int>{1, 4}));
  EXPECT_EQ(layout.local_rank, 1);
  EXPECT_FALSE(layout.on_this_node(0));
}

// A rank's dispatch messages are held on another node by the rank at its own index there, modulo that
// node's size: nodes {0, 2, 5}, {1, 4} and {3} (from the identities above).
TEST(NodeLayoutTest, MessageHolderIsTheRankAtTheSameIndexModuloTheNodeSize) {
  const std::vector<std::string> identities = {"b", "a", "b", "c", "a", "b"};
  const rocep::NodeLayout layout = rocep::node_layout_of(identities, 0);
  EXPECT_EQ(rocep::message_holder(layout, 0, 1), 1);  // index 0 on node 1
  EXPECT_EQ(rocep::message_holder(layout, 2, 1), 4);  // index 1
  EXPECT_EQ(rocep::message_holder(layout, 5, 1), 1);  // index 2, modulo 2
  EXPECT_EQ(rocep::message_holder(layout, 4, 0), 2);  // index 1 on node 0
  EXPECT_EQ(rocep::message_holder(layout, 4, 2), 3);  // node 2 has one rank
  EXPECT_EQ(rocep::message_holder(layout, 3, 0), 0);
  EXPECT_EQ(rocep::message_holder(layout, 1, 0), 0);  // a rank of another node at index 0
}

TEST(SingleProcessBootstrapTest, IsRankZeroOfOne) {
  rocep::SingleProcessBootstrap bootstrap;
  EXPECT_EQ(bootstrap.rank(), 0);
  EXPECT_EQ(bootstrap.size(), 1);
  EXPECT_NO_THROW(bootstrap.barrier());
}

TEST(SingleProcessBootstrapTest, AllGatherCopies) {
  rocep::SingleProcessBootstrap bootstrap;
  const std::vector<uint8_t> sent = contribution(0, 13);
  std::vector<uint8_t> received(13, 0xA5);
  bootstrap.all_gather(sent.data(), received.data(), sent.size());
  EXPECT_EQ(received, sent);
  bootstrap.all_gather(received.data(), received.data(), received.size());
  EXPECT_EQ(received, sent);
}

TEST(DeviceForLocalRankTest, WithoutOverrideMapsLocalRankModuloDevices) {
  for (int local_rank = 0; local_rank < 6; ++local_rank) {
    EXPECT_EQ(rocep::device_for_local_rank(local_rank, 2, nullptr), local_rank % 2);
    EXPECT_EQ(rocep::device_for_local_rank(local_rank, 2, ""), local_rank % 2);
    EXPECT_EQ(rocep::device_for_local_rank(local_rank, 8, nullptr), local_rank);
  }
}

TEST(DeviceForLocalRankTest, OverrideNamesTheDevice) {
  for (int local_rank = 0; local_rank < 4; ++local_rank) {
    EXPECT_EQ(rocep::device_for_local_rank(local_rank, 2, "1"), 1);
    EXPECT_EQ(rocep::device_for_local_rank(local_rank, 2, "0"), 0);
  }
}

TEST(DeviceForLocalRankTest, OverrideOutsideTheDevicesThrowsNamingRocepDevice) {
  for (const char* override_text : {"5", "2", "-1", "abc", "1x", "1.0", " 1", "+1"}) {
    SCOPED_TRACE(std::string("ROCEP_DEVICE=") + override_text);
    try {
      rocep::device_for_local_rank(0, 2, override_text);
      ADD_FAILURE() << "override accepted";
    } catch (const rocep::ConfigError& error) {
      EXPECT_PRED_FORMAT2(::testing::IsSubstring, std::string("ROCEP_DEVICE = '") + override_text + "'",
                          error.what());
    }
  }
}

TEST(DeviceForLocalRankTest, NoDeviceThrows) {
  EXPECT_THROW(rocep::device_for_local_rank(0, 0, nullptr), rocep::ConfigError);
  EXPECT_THROW(rocep::device_for_local_rank(0, 0, "0"), rocep::ConfigError);
}

// The exception run_agreed threw on this rank (type name and message), or "" if it threw none.
std::string agreed_failure(bool fail_here, const char* what) {
  rocep::MpiBootstrap bootstrap(MPI_COMM_WORLD);
  try {
    rocep::run_agreed(bootstrap, "test step", [&] {
      if (fail_here) {
        throw rocep::ConfigError(what);
      }
    });
  } catch (const rocep::ConfigError& error) {
    return std::string("ConfigError: ") + error.what();
  } catch (const std::exception& error) {
    return std::string("other: ") + error.what();
  }
  return "";
}

TEST(RunAgreedTest, NoFailureThrowsNowhere) {
  EXPECT_EQ(agreed_failure(false, ""), "");
}

TEST(RunAgreedTest, EveryRankThrowsTheLowestFailingRanksError) {
  // The upper half of the ranks fails (rank 0 alone at one rank).
  const int lowest_failing = world_size() / 2;
  const std::string own = "rank " + std::to_string(world_rank()) + " cannot";
  const std::string message = agreed_failure(world_rank() >= lowest_failing, own.c_str());
  EXPECT_EQ(message, "ConfigError: EpGroup: rank " + std::to_string(lowest_failing) +
                         " failed at test step: rank " + std::to_string(lowest_failing) + " cannot");
  // Nothing is left pending: a step that succeeds everywhere right after throws nowhere.
  EXPECT_EQ(agreed_failure(false, ""), "");
}

}  // namespace
