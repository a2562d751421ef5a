// The GPU topology's decisions without a GPU: rocm-smi's and the runtime's answers, as a node reports them,
// fed to the same mapping functions the GPU sources use; the verdict on which ranks can form a group and the
// message naming the two GPUs and the link; and the agreement that makes every rank refuse together.
#include "host/topology.hpp"

#include <gtest/gtest.h>
#include <mpi.h>

#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "mpi_support.hpp"
#include "rocep/errors.hpp"
#include "rocep/mpi.hpp"

namespace {

using rocep::Answer;
using rocep::GpuLink;
using rocep::LinkKind;
using rocep::NodeTopology;
using rocep::RocmSmiLinkAnswer;
using rocep::RuntimeLinkAnswer;
using rocep::testing::world_rank;
using rocep::testing::world_size;

// rocm-smi's BDF ids (rsmi_dev_pci_id_get: bus << 8) of an 8 x MI300X board.
constexpr uint64_t kMi300xBdfIds[] = {0x0500, 0x2600, 0x4600, 0x6500, 0x8500, 0xa600, 0xc600, 0xe500};

// A topology of GPUs at `pci_bus_ids` whose link from -> to is link_of(from, to).
NodeTopology topology_of(const std::vector<std::string>& pci_bus_ids,
                         const std::function<GpuLink(int, int)>& link_of) {
  NodeTopology topology;
  topology.source = "recorded answers";
  const int count = static_cast<int>(pci_bus_ids.size());
  for (int gpu = 0; gpu < count; ++gpu) {
    topology.gpus.push_back({pci_bus_ids[gpu], "GPU model", gpu < count / 2 ? 0 : 1});
  }
  for (int from = 0; from < count; ++from) {
    for (int to = 0; to < count; ++to) {
      topology.links.push_back(from == to ? GpuLink{LinkKind::kSameGpu, 0, -1, Answer::kYes, Answer::kYes}
                                          : link_of(from, to));
    }
  }
  return topology;
}

// rocm-smi on an 8 x MI300X node: every pair xGMI, 1 hop, weight 15, P2P accessible (AMD's MI300X platform
// topology); rocm-smi alone is asked, as for GPUs this process does not see.
NodeTopology mi300x_node() {
  std::vector<std::string> pci_bus_ids;
  for (const uint64_t bdf_id : kMi300xBdfIds) {
    pci_bus_ids.push_back(rocep::pci_bus_id_from_rocm_smi(bdf_id));
  }
  RocmSmiLinkAnswer xgmi;
  xgmi.link_type = rocep::kRocmSmiLinkXgmi;
  xgmi.hops = 1;
  xgmi.weight = 15;
  xgmi.p2p_accessible = 1;
  const GpuLink link = rocep::link_from_rocm_smi(xgmi);
  return topology_of(pci_bus_ids, [&link](int, int) { return link; });
}

// rocm-smi on a PCIe-only node of 4 GPUs, two behind each CPU socket: P2P within a socket (the runtime
// reports native atomics there), none across the sockets.
NodeTopology pcie_node() {
  return topology_of({"0000:05:00.0", "0000:26:00.0", "0000:85:00.0", "0000:a6:00.0"}, [](int from, int to) {
    const bool same_socket = from / 2 == to / 2;
    RocmSmiLinkAnswer pcie;
    pcie.link_type = rocep::kRocmSmiLinkPcie;
    pcie.hops = same_socket ? 2 : 3;
    pcie.weight = same_socket ? 40 : 72;
    pcie.p2p_accessible = same_socket ? 1 : 0;
    pcie.runtime_native_atomics = same_socket ? 1 : 0;
    return rocep::link_from_rocm_smi(pcie);
  });
}

// Two GPUs with the same link both ways.
NodeTopology pair_node(const GpuLink& link) {
  return topology_of({"0000:19:00.0", "0000:3b:00.0"}, [&link](int, int) { return link; });
}

int occurrences(const std::string& text, const std::string& word) {
  int count = 0;
  for (std::size_t at = text.find(word); at != std::string::npos; at = text.find(word, at + word.size())) {
    ++count;
  }
  return count;
}

TEST(TopologyTest, PciBusIdsFromRocmSmiAndRuntimes) {
  EXPECT_EQ(rocep::pci_bus_id_from_rocm_smi(0x0500), "0000:05:00.0");
  EXPECT_EQ(rocep::pci_bus_id_from_rocm_smi((uint64_t{1} << 32) | (0xc1 << 8) | (0x1 << 3) | 0x2),
            "0001:c1:01.2");
  // Bits 31:16 are reserved (a partition id in newer rocm-smi): not part of the bus id.
  EXPECT_EQ(rocep::pci_bus_id_from_rocm_smi((uint64_t{3} << 28) | 0xe500), "0000:e5:00.0");
  EXPECT_EQ(rocep::normalized_pci_bus_id("00000000:C1:00.0"), "0000:c1:00.0");
  EXPECT_EQ(rocep::normalized_pci_bus_id("0000:05:00.0"), "0000:05:00.0");
  EXPECT_EQ(rocep::normalized_pci_bus_id("not a bus id"), "not a bus id");
}

// The ranks sharing a GPU are counted by machine and bus id, whatever nodes they are declared on: 4 ranks on
// 2 GPUs of one machine, declared 2 nodes of ranks {0, 1} and {2, 3}, still share each GPU two by two; the
// same bus id on another machine is another GPU.
TEST(TopologyTest, RanksOnAGpuAreCountedByMachineAndBusId) {
  struct Case {
    std::vector<rocep::RankPlace> places;
    std::vector<int> expected;  // per rank
  };
  const std::vector<Case> cases = {
      {{{"host a", "0000:18:00.0"},
        {"host a", "0000:2a:00.0"},
        {"host a", "0000:18:00.0"},
        {"host a", "0000:2a:00.0"}},
       {2, 2, 2, 2}},
      {{{"host a", "0000:18:00.0"},
        {"host a", "0000:2a:00.0"},
        {"host b", "0000:18:00.0"},
        {"host b", "0000:2a:00.0"}},
       {1, 1, 1, 1}},
      {{{"host a", "0000:18:00.0"},
        {"host a", "0000:18:00.0"},
        {"host a", "0000:18:00.0"},
        {"host b", "0000:18:00.0"}},
       {3, 3, 3, 1}},
  };
  for (std::size_t index = 0; index < cases.size(); ++index) {
    for (int rank = 0; rank < static_cast<int>(cases[index].places.size()); ++rank) {
      EXPECT_EQ(rocep::ranks_on_gpu_of(cases[index].places, rank), cases[index].expected[rank])
          << "case " << index << ", rank " << rank;
    }
  }
}

TEST(TopologyTest, Mi300xNodeFormsAGroup) {
  const NodeTopology topology = mi300x_node();
  const GpuLink& link = topology.link(2, 5);
  EXPECT_EQ(link.kind, LinkKind::kXgmi);
  EXPECT_EQ(link.hops, 1);
  EXPECT_EQ(link.weight, 15);
  EXPECT_EQ(link.peer_access, Answer::kYes);
  // Not asked of the runtime: xGMI carries atomics itself.
  EXPECT_EQ(link.native_atomics, Answer::kYes);
  EXPECT_EQ(rocep::peer_to_peer_error(topology, {0, 1, 2, 3, 4, 5, 6, 7}), "");
  // Two ranks per GPU (MPS), in any order.
  EXPECT_EQ(rocep::peer_to_peer_error(topology, {7, 6, 5, 4, 3, 2, 1, 0, 0, 1, 2, 3, 4, 5, 6, 7}), "");

  const std::string description = topology.describe();
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, "GPU 7: 0000:e5:00.0 GPU model, NUMA node 1", description);
  // Every cell off the diagonal, none of them with a refusal or an unknown (the legend names "noP2P" once).
  EXPECT_EQ(occurrences(description, "xGMI 1h w15"), 8 * 7);
  EXPECT_EQ(occurrences(description, "self"), 8);
  EXPECT_EQ(occurrences(description, "noP2P"), 1);
  EXPECT_EQ(occurrences(description, "?"), 1);
}

TEST(TopologyTest, PcieNodeRefusesRanksAcrossSockets) {
  const NodeTopology topology = pcie_node();
  EXPECT_EQ(topology.link(0, 1).kind, LinkKind::kPcie);
  EXPECT_EQ(topology.link(0, 1).native_atomics, Answer::kYes);
  EXPECT_EQ(topology.link(0, 2).peer_access, Answer::kNo);
  EXPECT_EQ(topology.link(0, 2).native_atomics, Answer::kNo);
  EXPECT_EQ(rocep::peer_to_peer_error(topology, {0, 1}), "");
  EXPECT_EQ(rocep::peer_to_peer_error(topology, {3, 2, 3}), "");
  EXPECT_EQ(rocep::peer_to_peer_error(topology, {0, 1, 2, 3}),
            "rank 0 (GPU 0000:05:00.0) cannot reach rank 2 (GPU 0000:85:00.0) peer-to-peer: link PCIe, "
            "3 hops, weight 72, no P2P access");
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, "PCIe 3h w72 noP2P", topology.describe());
}

TEST(TopologyTest, OneRankOnAnUnreachableGpuIsNamed) {
  // Ranks 0 and 2 share GPU 1, rank 1 is on GPU 0 beside it, rank 3 alone behind the other socket.
  EXPECT_EQ(rocep::peer_to_peer_error(pcie_node(), {1, 0, 1, 2}),
            "rank 0 (GPU 0000:26:00.0) cannot reach rank 3 (GPU 0000:85:00.0) peer-to-peer: link PCIe, "
            "3 hops, weight 72, no P2P access");
}

TEST(TopologyTest, RanksOfOtherNodesAreNotChecked) {
  // Ranks 1 and 3 on another node (-1): the node's own ranks share one socket; the same GPUs as ranks of
  // this node are refused.
  EXPECT_EQ(rocep::peer_to_peer_error(pcie_node(), {0, -1, 1, -1}), "");
  EXPECT_EQ(rocep::peer_to_peer_error(pcie_node(), {-1, -1}), "");
  EXPECT_EQ(rocep::peer_to_peer_error(pcie_node(), {0, -1, 2}),
            "rank 0 (GPU 0000:05:00.0) cannot reach rank 2 (GPU 0000:85:00.0) peer-to-peer: link PCIe, "
            "3 hops, weight 72, no P2P access");
}

TEST(TopologyTest, AOneWayLinkIsRefusedInItsDirection) {
  // P2P from GPU 1 to GPU 0 only: the pair of ranks (0, 1) fails reading rank 1's side.
  NodeTopology topology = pcie_node();
  RocmSmiLinkAnswer refused;
  refused.link_type = rocep::kRocmSmiLinkPcie;
  refused.hops = 2;
  refused.p2p_accessible = 0;
  topology.links[0 * 4 + 1] = rocep::link_from_rocm_smi(refused);
  EXPECT_EQ(rocep::peer_to_peer_error(topology, {1, 0}),
            "rank 1 (GPU 0000:05:00.0) cannot reach rank 0 (GPU 0000:26:00.0) peer-to-peer: link PCIe, "
            "2 hops, no P2P access");
}

TEST(TopologyTest, PcieP2pWithoutNativeAtomicsIsRefused) {
  RocmSmiLinkAnswer pcie;
  pcie.link_type = rocep::kRocmSmiLinkPcie;
  pcie.hops = 2;
  pcie.weight = 40;
  pcie.p2p_accessible = 1;
  pcie.runtime_native_atomics = 0;
  const GpuLink without_atomics = rocep::link_from_rocm_smi(pcie);
  EXPECT_EQ(without_atomics.peer_access, Answer::kYes);
  EXPECT_EQ(without_atomics.native_atomics, Answer::kNo);
  EXPECT_EQ(rocep::peer_to_peer_error(pair_node(without_atomics), {0, 1}),
            "rank 0 (GPU 0000:19:00.0) cannot reach rank 1 (GPU 0000:3b:00.0) peer-to-peer: link PCIe, "
            "2 hops, weight 40, P2P access without native atomics (the kernels signal with atomics on peer "
            "memory)");

  // Over PCIe only the runtime knows about atomics: not asked (a GPU this process does not see), the pair
  // is not refused.
  pcie.runtime_native_atomics = -1;
  const GpuLink atomics_unknown = rocep::link_from_rocm_smi(pcie);
  EXPECT_EQ(atomics_unknown.native_atomics, Answer::kUnknown);
  EXPECT_EQ(rocep::peer_to_peer_error(pair_node(atomics_unknown), {0, 1}), "");
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, "PCIe 2h w40 atomics?", pair_node(atomics_unknown).describe());
}

TEST(TopologyTest, NvidiaPairWithoutNvlinkOrP2pIsRefused) {
  // cudaDeviceCanAccessPeer, the P2P attributes and NVML's NVLink status of two PCIe GPUs under
  // different CPU sockets.
  RuntimeLinkAnswer answer;
  answer.can_access_peer = 0;
  answer.access_supported = 0;
  answer.native_atomics = 0;
  answer.performance_rank = 0;
  answer.nvlink = 0;
  const GpuLink link = rocep::link_from_runtime(answer);
  EXPECT_EQ(link.kind, LinkKind::kPcie);
  EXPECT_EQ(link.hops, -1);
  EXPECT_EQ(link.peer_access, Answer::kNo);
  EXPECT_EQ(rocep::peer_to_peer_error(pair_node(link), {0, 1}),
            "rank 0 (GPU 0000:19:00.0) cannot reach rank 1 (GPU 0000:3b:00.0) peer-to-peer: link PCIe, "
            "weight 0, no P2P access");
  // The runtime allows access but the attribute says no: no access.
  answer.can_access_peer = 1;
  EXPECT_EQ(rocep::link_from_runtime(answer).peer_access, Answer::kNo);
}

TEST(TopologyTest, NvidiaPairOverNvlinkFormsAGroup) {
  RuntimeLinkAnswer answer;
  answer.can_access_peer = 1;
  answer.access_supported = 1;
  answer.native_atomics = 1;
  answer.performance_rank = 0;
  answer.nvlink = 1;
  const GpuLink link = rocep::link_from_runtime(answer);
  EXPECT_EQ(link.kind, LinkKind::kNvlink);
  EXPECT_EQ(link.peer_access, Answer::kYes);
  EXPECT_EQ(link.native_atomics, Answer::kYes);
  EXPECT_EQ(rocep::peer_to_peer_error(pair_node(link), {0, 1}), "");
  // Without NVML the runtime cannot tell NVLink from PCIe.
  answer.nvlink = -1;
  EXPECT_EQ(rocep::link_from_runtime(answer).kind, LinkKind::kUnknown);
}

TEST(TopologyTest, APairNoSourceCouldAskAboutIsNotRefused) {
  const GpuLink link = rocep::link_from_runtime(RuntimeLinkAnswer{});
  EXPECT_EQ(link.kind, LinkKind::kUnknown);
  EXPECT_EQ(link.peer_access, Answer::kUnknown);
  EXPECT_EQ(link.native_atomics, Answer::kUnknown);
  EXPECT_EQ(rocep::peer_to_peer_error(pair_node(link), {0, 1}), "");
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, "unknown P2P?", pair_node(link).describe());
}

TEST(TopologyTest, LinkOutsideTheTopologyThrowsNamingTheIndices) {
  try {
    (void)pcie_node().link(1, 4);
    ADD_FAILURE() << "link(1, 4) of 4 GPUs returned";
  } catch (const std::out_of_range& error) {
    EXPECT_STREQ(error.what(), "NodeTopology::link(1, 4): the topology has 4 GPU(s)");
  }
}

}  // namespace
