// The topology the GPU machine reports: every pair of GPUs this process sees can reach each other
// peer-to-peer with native atomics (the machines rocep runs on), the node's ranks agree on their GPUs and
// form a group. Rank 0 prints the description. And what the build says it is (rocep::build_info) against
// the GPU it runs on.
#include "host/topology.hpp"

#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <sstream>
#include <string>

#include "gpu_support.hpp"
#include "host/device.hpp"
#include "mpi_support.hpp"
#include "rocep/build_info.hpp"
#include "rocep/mpi.hpp"

namespace {

using rocep::Answer;
using rocep::LinkKind;
using rocep::NodeTopology;

TEST(GpuTopologyTest, EveryPairOfVisibleGpusHasPeerAccess) {
  if (!rocep::testing::use_rank_gpu()) {
    GTEST_SKIP() << "no GPU visible";
  }
  const NodeTopology topology = rocep::read_node_topology(rocep::visible_gpus());
  if (rocep::testing::world_rank() == 0) {
    std::printf("%s", topology.describe().c_str());
  }
  const int count = rocep::device_count();
  ASSERT_EQ(static_cast<int>(topology.gpus.size()), count);
  ASSERT_EQ(topology.links.size(), static_cast<std::size_t>(count) * count);
  for (int from = 0; from < count; ++from) {
    EXPECT_EQ(topology.gpus[from].pci_bus_id, rocep::normalized_pci_bus_id(topology.gpus[from].pci_bus_id));
    for (int to = 0; to < count; ++to) {
      SCOPED_TRACE("GPU " + std::to_string(from) + " -> GPU " + std::to_string(to) + ": " +
                   rocep::describe_link(topology.link(from, to)));
      const rocep::GpuLink& link = topology.link(from, to);
      EXPECT_EQ(link.kind == LinkKind::kSameGpu, from == to);
      EXPECT_EQ(link.peer_access, Answer::kYes);
      EXPECT_EQ(link.native_atomics, Answer::kYes);
#if defined(ROCEP_PLATFORM_NVIDIA)
      // With NVML (the driver's library) the kind of every link is known.
      if (from != to && topology.source == "CUDA runtime + NVML") {
        EXPECT_TRUE(link.kind == LinkKind::kNvlink || link.kind == LinkKind::kPcie);
      }
#endif
    }
  }
}

TEST(GpuTopologyTest, NodeRanksAgreeOnTheirGpusAndFormAGroup) {
  if (!rocep::testing::use_rank_gpu()) {
    GTEST_SKIP() << "no GPU visible";
  }
  // The test's ranks all run on one node.
  rocep::MpiBootstrap node(MPI_COMM_WORLD);
  const rocep::NodeGroupTopology gathered = rocep::gather_node_topology(node);
  if (node.rank() == 0) {
    std::printf("the node's ranks run on:\n%s", gathered.topology.describe().c_str());
  }
  ASSERT_EQ(static_cast<int>(gathered.rank_gpus.size()), node.size());
  const int mine = gathered.rank_gpus[node.rank()];
  ASSERT_GE(mine, 0);
  ASSERT_LT(mine, static_cast<int>(gathered.topology.gpus.size()));
  EXPECT_EQ(gathered.topology.gpus[mine].pci_bus_id,
            rocep::visible_gpus()[rocep::current_device()].pci_bus_id);
  EXPECT_EQ(rocep::peer_to_peer_error(gathered.topology, gathered.rank_gpus), "");
}

// The platform the suite was compiled for, and among the build's architectures this GPU's (an entry may carry
// a suffix: NVIDIA's "90a", "90-real"; CMake's "native", "all" and "all-major" stand for it too).
TEST(GpuBuildInfoTest, NamesThisPlatformAndTheGpusArchitecture) {
  if (!rocep::testing::use_rank_gpu()) {
    GTEST_SKIP() << "no GPU visible";
  }
  const rocep::BuildInfo info = rocep::build_info();
  hipDeviceProp_t properties;
  ROCEP_GPU_CHECK(hipGetDeviceProperties(&properties, rocep::current_device()));
#if defined(ROCEP_PLATFORM_AMD)
  EXPECT_STREQ(info.gpu_platform, "amd");
  std::string architecture = properties.gcnArchName;  // "gfx942:sramecc+:xnack-"
  architecture = architecture.substr(0, architecture.find(':'));
#else
  EXPECT_STREQ(info.gpu_platform, "nvidia");
  const std::string architecture = std::to_string(properties.major * 10 + properties.minor);
#endif
  bool listed = false;
  std::istringstream entries(info.gpu_architectures);
  for (std::string entry; std::getline(entries, entry, ',');) {
    const bool any = entry == "native" || entry == "all" || entry == "all-major";
    listed = listed || any ||
             (entry.compare(0, architecture.size(), architecture) == 0 &&
              (entry.size() == architecture.size() || entry[architecture.size()] < '0' ||
               entry[architecture.size()] > '9'));
  }
  EXPECT_TRUE(listed) << "this GPU is " << architecture << ", the build's architectures are \""
                      << info.gpu_architectures << "\"";
}

}  // namespace
