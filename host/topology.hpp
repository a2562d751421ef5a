// The GPU topology of one node, read when a GPU group is created, and the verdict on whether the group's
// ranks can reach each other's GPUs peer-to-peer.
//
// - Sources: on AMD, rocm-smi (link type xGMI / PCIe, hops, weight, P2P, NUMA node) when the build found
//   librocm_smi64, else the HIP runtime's P2P attributes (link type unknown); on NVIDIA, the CUDA runtime's
//   P2P attributes, plus NVML when libnvidia-ml.so.1 loads at run time, to tell NVLink from PCIe and to
//   answer for GPUs this process does not see. Each source's raw answers become a GpuLink through one pure
//   function (link_from_rocm_smi, link_from_runtime), which the CPU tests feed with recorded answers.
// - Verdict: every pair of distinct GPUs that the node's ranks use needs P2P access and native peer atomics
//   (the kernels signal with system-scope atomics on peer memory). A pair a source answered "no" for fails
//   the group at construction, on every rank, with a ConfigError naming both GPUs and the link, instead of a
//   hang in the first call. A pair no source could ask about passes (the calls' bounded waits still catch
//   it). Ranks sharing one GPU (MPS) need no link.
// - NodeTopology::describe() is the table the benchmark prints.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace rocep {

class Bootstrap;

enum class LinkKind { kSameGpu, kXgmi, kNvlink, kPcie, kUnknown };
const char* to_string(LinkKind kind);

// A source's answer to a yes/no question; kUnknown where it could not ask.
enum class Answer { kUnknown, kNo, kYes };

// What one GPU's memory looks like from another GPU (one ordered pair: from -> to).
struct GpuLink {
  LinkKind kind = LinkKind::kUnknown;
  int64_t hops = -1;    // -1: unknown
  int64_t weight = -1;  // the source's relative cost, lower is closer (rocm-smi's link weight, the
                        // runtime's P2P performance rank); -1: unknown
  Answer peer_access = Answer::kUnknown;
  Answer native_atomics = Answer::kUnknown;  // atomics on the peer's memory, done by the link itself
};

struct GpuInfo {
  std::string pci_bus_id;  // normalized_pci_bus_id(): 0000:c1:00.0
  std::string name;
  int64_t numa_node = -1;  // -1: unknown
};

struct NodeTopology {
  std::string source;  // which library answered, and why a better one did not
  std::vector<GpuInfo> gpus;
  std::vector<GpuLink> links;  // [from * gpus.size() + to]; the diagonal is kSameGpu

  // Throws std::out_of_range naming the indices when either is not a GPU of this topology.
  const GpuLink& link(int from, int to) const;
  // The GPUs and the matrix of their links, several lines, each ending in '\n'.
  std::string describe() const;
};

// "link PCIe, 2 hops, no P2P access": the words the verdict and describe() use for a link.
std::string describe_link(const GpuLink& link);

// Empty when ranks whose GPUs are `rank_gpus` (one index into topology.gpus per rank, in rank order; -1 for
// a rank of another node, which is not checked) can form a group: every pair of ranks on distinct GPUs has
// P2P access and native atomics both ways, or no source could ask. Otherwise the ConfigError message for the
// first failing pair in rank order, e.g. "rank 0 (GPU 0000:c1:00.0) cannot reach rank 3 (GPU 0000:05:00.0)
// peer-to-peer: link PCIe, 2 hops, no P2P access".
std::string peer_to_peer_error(const NodeTopology& topology, const std::vector<int>& rank_gpus);

// Where a rank runs: its machine (host_identity() of host/node.hpp) and its GPU's PCI bus id.
struct RankPlace {
  std::string machine;
  std::string pci_bus_id;
};
// The ranks of `places` (one per rank) that run on rank `rank`'s GPU, itself included: the same machine and
// bus id, whatever nodes the group declares them on (gpus_per_node can split one machine's ranks).
int ranks_on_gpu_of(const std::vector<RankPlace>& places, int rank);

// "0000:c1:00.0" (lower case, four-digit domain) from a runtime's "00000000:C1:00.0" or similar; `text`
// unchanged when it is not domain:bus:device.function in hex.
std::string normalized_pci_bus_id(const std::string& text);

// rocm-smi's answers for one ordered pair of distinct GPUs, as it returned them; -1 where a call failed.
struct RocmSmiLinkAnswer {
  int64_t link_type = -1;           // rsmi_topo_get_link_type: an RSMI_IO_LINK_TYPE
  int64_t hops = -1;                // rsmi_topo_get_link_type
  int64_t weight = -1;              // rsmi_topo_get_link_weight
  int p2p_accessible = -1;          // rsmi_is_P2P_accessible: 1 or 0
  int runtime_native_atomics = -1;  // rocm-smi does not report atomics: the HIP runtime's
                                    // hipDevP2PAttrNativeAtomicSupported, where this process sees both GPUs
};
// RSMI_IO_LINK_TYPE values (rocm_smi.h; the AMD source static_asserts them).
inline constexpr int64_t kRocmSmiLinkPcie = 1;
inline constexpr int64_t kRocmSmiLinkXgmi = 2;

GpuLink link_from_rocm_smi(const RocmSmiLinkAnswer& answer);
// rsmi_dev_pci_id_get's BDF id ((domain << 32) | (bus << 8) | (device << 3) | function) as a PCI bus id.
std::string pci_bus_id_from_rocm_smi(uint64_t bdf_id);

// The HIP / CUDA runtime's P2P answers for one ordered pair of distinct GPUs that this process sees (or
// NVML's, on NVIDIA, for a GPU it does not see); -1 where nothing could be asked.
struct RuntimeLinkAnswer {
  int can_access_peer = -1;   // hipDeviceCanAccessPeer; NVML: P2P read
  int access_supported = -1;  // hipDevP2PAttrAccessSupported; NVML: P2P write
  int native_atomics = -1;    // hipDevP2PAttrNativeAtomicSupported; NVML: P2P atomics
  int performance_rank = -1;  // hipDevP2PAttrPerformanceRank
  int nvlink = -1;            // NVML: P2P over NVLink (the runtime alone cannot tell NVLink from PCIe)
};

GpuLink link_from_runtime(const RuntimeLinkAnswer& answer);

// --- GPU builds only (host/topology_gpu.cpp) ---------------------------------------------------------------

// The GPUs this process sees, in device order, with their PCI bus ids and names.
std::vector<GpuInfo> visible_gpus();
// The links among `gpus` (and each one's NUMA node), from the best source this build and machine offer.
// Never throws for a question a source cannot answer: the link keeps kUnknown.
NodeTopology read_node_topology(std::vector<GpuInfo> gpus);

struct NodeGroupTopology {
  NodeTopology topology;       // the distinct GPUs of the node's ranks
  std::vector<int> rank_gpus;  // per rank: its GPU's index in topology.gpus; -1 for a rank of another node
  // The ranks of the group on the caller's GPU (same machine, same PCI bus id), the caller included,
  // whatever nodes they are declared on: they share its multiprocessors.
  int ranks_on_this_gpu = 1;
};
// Collective over `group`: each rank names its machine and current GPU; every rank of a node returns the
// same GPUs and rank_gpus, with links as this process can read them. `on_this_node` (empty: every rank)
// marks the ranks of the caller's node; the others are left out (-1).
NodeGroupTopology gather_node_topology(Bootstrap& group, const std::vector<bool>& on_this_node = {});

}  // namespace rocep
