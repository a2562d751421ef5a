// The MPI bootstrap (all-gather, barrier, node split) on MPI_COMM_WORLD at any rank count, the
// single-process bootstrap, the device choice for a local rank, and the collective agreement on input
// errors that keeps every rank out of an exchange once one rank has failed.
#include "host/bootstrap.hpp"

#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "host/reference.hpp"
#include "mpi_support.hpp"
#include "rocep/errors.hpp"

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

TEST(MpiBootstrapTest, AllGatherPlacesEachRankAtItsOffset) {
  rocep::MpiBootstrap bootstrap(MPI_COMM_WORLD);
  for (std::size_t bytes : kGatherSizes) {
    SCOPED_TRACE(std::to_string(bytes) + " bytes per rank");
    const std::vector<uint8_t> sent = contribution(bootstrap.rank(), bytes);
    std::vector<uint8_t> received(bootstrap.size() * bytes, 0xA5);
    bootstrap.all_gather(sent.data(), received.data(), bytes);
    EXPECT_EQ(received, gathered(bootstrap.size(), bytes));
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

TEST(MpiBootstrapTest, SplitNodeKeepsTheWholeWorldOnOneMachine) {
  rocep::MpiBootstrap bootstrap(MPI_COMM_WORLD);
  const std::unique_ptr<rocep::MpiBootstrap> node = bootstrap.split_node();
  EXPECT_LE(node->size(), bootstrap.size());
  // The tests start every rank on one machine, so the node is the world, ordered by world rank.
  EXPECT_EQ(node->size(), bootstrap.size());
  EXPECT_EQ(node->rank(), bootstrap.rank());
  const int mine = bootstrap.rank();
  std::vector<int> world_ranks(node->size(), -1);
  node->all_gather(&mine, world_ranks.data(), sizeof mine);
  for (int rank = 0; rank < node->size(); ++rank) {
    EXPECT_EQ(world_ranks[rank], rank);
  }
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

// The message of the InvalidInputError agree_on_input_errors threw on this rank, or "" if it threw none.
std::string agreement_error(const std::string& local_error) {
  try {
    rocep::reference::agree_on_input_errors(MPI_COMM_WORLD, local_error, "dispatch");
  } catch (const rocep::InvalidInputError& error) {
    return error.what();
  }
  return "";
}

TEST(AgreeOnInputErrorsTest, NoErrorThrowsNothing) {
  EXPECT_EQ(agreement_error(""), "");
  EXPECT_EQ(agreement_error(""), "");
}

TEST(AgreeOnInputErrorsTest, ErrorOnLastRankThrowsEverywhere) {
  const int last = world_size() - 1;
  const std::string own_error = "dispatch: rank " + std::to_string(last) + " token 3 slot 1: bad id";
  const std::string message = agreement_error(world_rank() == last ? own_error : "");
  if (world_rank() == last) {
    EXPECT_EQ(message, own_error);
  } else {
    EXPECT_PRED_FORMAT2(::testing::IsSubstring, "rank " + std::to_string(last), message);
    EXPECT_PRED_FORMAT2(::testing::IsSubstring, "dispatch", message);
  }
  // The agreement leaves nothing pending: a call without errors right after throws nowhere.
  EXPECT_EQ(agreement_error(""), "");
}

TEST(AgreeOnInputErrorsTest, OthersNameTheLowestFailingRank) {
  // The upper half of the ranks fails (rank 0 alone at one rank).
  const int lowest_failing = world_size() / 2;
  const bool failing = world_rank() >= lowest_failing;
  const std::string own_error = "rank " + std::to_string(world_rank()) + " failed";
  const std::string message = agreement_error(failing ? own_error : "");
  if (failing) {
    EXPECT_EQ(message, own_error);
  } else {
    EXPECT_PRED_FORMAT2(::testing::IsSubstring, "rank " + std::to_string(lowest_failing) + " ", message);
  }
}

}  // namespace
