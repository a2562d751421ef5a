// The topology the GPU machine reports: every pair of GPUs this process sees can reach each other
// peer-to-peer with native atomics (the machines rocep runs on), the node's ranks agree on their GPUs and
// form a group. Rank 0 prints the description.
#include "host/topology.hpp"

#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <string>

#include "gpu_support.hpp"
#include "host/device.hpp"
#include "mpi_support.hpp"
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

}  // namespace
