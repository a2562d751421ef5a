// The sources of NodeTopology: the GPU runtime, rocm-smi (AMD builds that found librocm_smi64) and NVML
// (NVIDIA, when libnvidia-ml.so.1 loads). Only the asking lives here; what the answers mean is decided by
// link_from_rocm_smi / link_from_runtime in topology.cpp.
#include "topology.hpp"

#include <algorithm>
#include <array>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "device.hpp"
#include "gpu_check.hpp"
#include "node.hpp"
#include "rocep/bootstrap.hpp"

#if defined(ROCEP_HAVE_ROCM_SMI)
#include <rocm_smi/rocm_smi.h>
#endif
#if defined(ROCEP_PLATFORM_NVIDIA)
#include <dlfcn.h>
#endif

namespace rocep {

namespace {

// The index of each of `gpus` among this process's devices, -1 where this process does not see it.
std::vector<int> local_devices(const std::vector<GpuInfo>& gpus) {
  const std::vector<GpuInfo> visible = visible_gpus();
  std::vector<int> devices;
  for (const GpuInfo& gpu : gpus) {
    const auto found = std::find_if(visible.begin(), visible.end(), [&gpu](const GpuInfo& candidate) {
      return candidate.pci_bus_id == gpu.pci_bus_id;
    });
    devices.push_back(found == visible.end() ? -1 : static_cast<int>(found - visible.begin()));
  }
  return devices;
}

// A runtime P2P attribute from device `from` to device `to`; -1 when the runtime cannot answer, with the
// failure cleared so that a later launch check does not report it.
int p2p_attribute(hipDeviceP2PAttr attribute, int from, int to) {
  int value = 0;
  if (hipDeviceGetP2PAttribute(&value, attribute, from, to) != hipSuccess) {
    (void)hipGetLastError();
    return -1;
  }
  return value;
}

RuntimeLinkAnswer ask_runtime(int from, int to) {
  RuntimeLinkAnswer answer;
  int can_access_peer = 0;
  if (hipDeviceCanAccessPeer(&can_access_peer, from, to) == hipSuccess) {
    answer.can_access_peer = can_access_peer;
  } else {
    (void)hipGetLastError();
  }
  answer.access_supported = p2p_attribute(hipDevP2PAttrAccessSupported, from, to);
  answer.native_atomics = p2p_attribute(hipDevP2PAttrNativeAtomicSupported, from, to);
  answer.performance_rank = p2p_attribute(hipDevP2PAttrPerformanceRank, from, to);
  return answer;
}

// Linux's NUMA node of a PCI device; -1 where it has none or sysfs is not readable.
// Read with stdio, not iostreams: their locale facets are process-wide state of the host process.
int64_t numa_node_from_sysfs(const std::string& pci_bus_id) {
  std::FILE* file = std::fopen(("/sys/bus/pci/devices/" + pci_bus_id + "/numa_node").c_str(), "r");
  if (file == nullptr) {
    return -1;
  }
  long long numa_node = -1;
  if (std::fscanf(file, "%lld", &numa_node) != 1) {
    numa_node = -1;
  }
  std::fclose(file);
  return numa_node;
}

#if defined(ROCEP_PLATFORM_NVIDIA)
// NVML, opened at run time so that building needs no NVML; it sees every GPU of the node, also those that
// CUDA_VISIBLE_DEVICES hides from this process. The entry points used, with their C signatures (nvml.h).
class Nvml {
 public:
  // nvmlGpuP2PCapsIndex_t values.
  static constexpr int kP2pRead = 0;
  static constexpr int kP2pWrite = 1;
  static constexpr int kP2pNvlink = 2;
  static constexpr int kP2pAtomics = 3;

  Nvml() : library_(dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL)) {
    if (library_ == nullptr) {
      problem_ = "libnvidia-ml.so.1 not loaded";
      return;
    }
    init_ = symbol<int (*)()>("nvmlInit_v2");
    shutdown_ = symbol<int (*)()>("nvmlShutdown");
    device_by_pci_bus_id_ = symbol<int (*)(const char*, Device*)>("nvmlDeviceGetHandleByPciBusId_v2");
    p2p_status_ = symbol<int (*)(Device, Device, int, int*)>("nvmlDeviceGetP2PStatus");
    if (init_ == nullptr || shutdown_ == nullptr || device_by_pci_bus_id_ == nullptr ||
        p2p_status_ == nullptr) {
      problem_ = "libnvidia-ml.so.1 lacks nvmlDeviceGetP2PStatus or its companions";
    } else if (init_() != kSuccess) {
      problem_ = "nvmlInit_v2 failed";
    } else {
      initialised_ = true;
    }
  }
  ~Nvml() {
    if (initialised_) {
      shutdown_();
    }
    if (library_ != nullptr) {
      dlclose(library_);
    }
  }
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  bool loaded() const { return initialised_; }
  // Why NVML cannot answer; empty when it can.
  const std::string& problem() const { return problem_; }

  // NVML's P2P status for `capability` (kP2p*) from GPU `from` to GPU `to` (PCI bus ids): 1 supported,
  // 0 not, -1 when NVML cannot answer.
  int p2p_status(const std::string& from, const std::string& to, int capability) const {
    Device from_device = nullptr;
    Device to_device = nullptr;
    int status = 0;
    if (!initialised_ || device_by_pci_bus_id_(from.c_str(), &from_device) != kSuccess ||
        device_by_pci_bus_id_(to.c_str(), &to_device) != kSuccess ||
        p2p_status_(from_device, to_device, capability, &status) != kSuccess) {
      return -1;
    }
    return status == kP2pStatusOk ? 1 : 0;
  }

 private:
  using Device = void*;                   // nvmlDevice_t, an opaque pointer
  static constexpr int kSuccess = 0;      // NVML_SUCCESS
  static constexpr int kP2pStatusOk = 0;  // NVML_P2P_STATUS_OK

  template <typename Function>
  Function symbol(const char* name) const {
    return reinterpret_cast<Function>(dlsym(library_, name));
  }

  void* library_ = nullptr;
  bool initialised_ = false;
  std::string problem_;
  int (*init_)() = nullptr;
  int (*shutdown_)() = nullptr;
  int (*device_by_pci_bus_id_)(const char*, Device*) = nullptr;
  int (*p2p_status_)(Device, Device, int, int*) = nullptr;
};
#endif

// NUMA nodes from sysfs; links from the runtime for the pairs of GPUs this process sees and, on NVIDIA, from
// NVML: NVLink or PCIe for every pair, P2P for the pairs this process does not see. Sets topology.source.
void read_runtime(NodeTopology& topology, const std::vector<int>& devices) {
#if defined(ROCEP_PLATFORM_NVIDIA)
  const Nvml nvml;
  topology.source =
      nvml.loaded() ? "CUDA runtime + NVML" : "CUDA runtime, NVLink or PCIe unknown: " + nvml.problem();
#else
  topology.source = "HIP runtime, link types unknown";
#endif
  const int count = static_cast<int>(topology.gpus.size());
  for (GpuInfo& gpu : topology.gpus) {
    gpu.numa_node = numa_node_from_sysfs(gpu.pci_bus_id);
  }
  for (int from = 0; from < count; ++from) {
    for (int to = 0; to < count; ++to) {
      if (from == to) {
        continue;
      }
      const bool both_visible = devices[from] >= 0 && devices[to] >= 0;
      RuntimeLinkAnswer answer = both_visible ? ask_runtime(devices[from], devices[to]) : RuntimeLinkAnswer{};
#if defined(ROCEP_PLATFORM_NVIDIA)
      const std::string& from_id = topology.gpus[from].pci_bus_id;
      const std::string& to_id = topology.gpus[to].pci_bus_id;
      answer.nvlink = nvml.p2p_status(from_id, to_id, Nvml::kP2pNvlink);
      if (!both_visible) {
        answer.can_access_peer = nvml.p2p_status(from_id, to_id, Nvml::kP2pRead);
        answer.access_supported = nvml.p2p_status(from_id, to_id, Nvml::kP2pWrite);
        answer.native_atomics = nvml.p2p_status(from_id, to_id, Nvml::kP2pAtomics);
      }
#endif
      topology.links[static_cast<std::size_t>(from * count + to)] = link_from_runtime(answer);
    }
  }
}

#if defined(ROCEP_HAVE_ROCM_SMI)
static_assert(RSMI_IOLINK_TYPE_PCIEXPRESS == kRocmSmiLinkPcie && RSMI_IOLINK_TYPE_XGMI == kRocmSmiLinkXgmi,
              "topology.hpp mirrors rocm_smi.h's RSMI_IO_LINK_TYPE");

std::string rocm_smi_failure(const char* call, rsmi_status_t status) {
  const char* text = nullptr;
  if (rsmi_status_string(status, &text) != RSMI_STATUS_SUCCESS || text == nullptr) {
    text = "unknown status";
  }
  return std::string(call) + " failed: " + text;
}

// NUMA nodes and links from rocm-smi; empty on success, else why rocm-smi could not answer (topology then
// keeps no answer of it).
std::string read_rocm_smi(NodeTopology& topology, const std::vector<int>& devices) {
  rsmi_status_t status = rsmi_init(0);
  if (status != RSMI_STATUS_SUCCESS) {
    return rocm_smi_failure("rsmi_init", status);
  }
  struct Session {
    ~Session() { (void)rsmi_shut_down(); }
  } session;
  uint32_t rocm_smi_count = 0;
  status = rsmi_num_monitor_devices(&rocm_smi_count);
  if (status != RSMI_STATUS_SUCCESS) {
    return rocm_smi_failure("rsmi_num_monitor_devices", status);
  }
  // rocm-smi numbers the node's GPUs its own way (and sees those HIP_VISIBLE_DEVICES hides): match by PCI
  // bus id.
  std::vector<std::string> rocm_smi_bus_ids(rocm_smi_count);
  for (uint32_t index = 0; index < rocm_smi_count; ++index) {
    uint64_t bdf_id = 0;
    if (rsmi_dev_pci_id_get(index, &bdf_id) == RSMI_STATUS_SUCCESS) {
      rocm_smi_bus_ids[index] = pci_bus_id_from_rocm_smi(bdf_id);
    }
  }
  std::vector<uint32_t> indices;
  for (const GpuInfo& gpu : topology.gpus) {
    const auto found = std::find(rocm_smi_bus_ids.begin(), rocm_smi_bus_ids.end(), gpu.pci_bus_id);
    if (found == rocm_smi_bus_ids.end()) {
      return "rocm-smi does not list GPU " + gpu.pci_bus_id;
    }
    indices.push_back(static_cast<uint32_t>(found - rocm_smi_bus_ids.begin()));
  }
  const int count = static_cast<int>(topology.gpus.size());
  for (int gpu = 0; gpu < count; ++gpu) {
    uint32_t numa_node = 0;
    topology.gpus[gpu].numa_node =
        rsmi_topo_get_numa_node_number(indices[gpu], &numa_node) == RSMI_STATUS_SUCCESS ? numa_node : -1;
  }
  for (int from = 0; from < count; ++from) {
    for (int to = 0; to < count; ++to) {
      if (from == to) {
        continue;
      }
      RocmSmiLinkAnswer answer;
      uint64_t hops = 0;
      RSMI_IO_LINK_TYPE link_type = RSMI_IOLINK_TYPE_UNDEFINED;
      if (rsmi_topo_get_link_type(indices[from], indices[to], &hops, &link_type) == RSMI_STATUS_SUCCESS) {
        answer.link_type = link_type;
        answer.hops = static_cast<int64_t>(hops);
      }
      uint64_t weight = 0;
      if (rsmi_topo_get_link_weight(indices[from], indices[to], &weight) == RSMI_STATUS_SUCCESS) {
        answer.weight = static_cast<int64_t>(weight);
      }
      bool accessible = false;
      if (rsmi_is_P2P_accessible(indices[from], indices[to], &accessible) == RSMI_STATUS_SUCCESS) {
        answer.p2p_accessible = accessible ? 1 : 0;
      }
      if (devices[from] >= 0 && devices[to] >= 0) {
        answer.runtime_native_atomics =
            p2p_attribute(hipDevP2PAttrNativeAtomicSupported, devices[from], devices[to]);
      }
      topology.links[static_cast<std::size_t>(from * count + to)] = link_from_rocm_smi(answer);
    }
  }
  topology.source = "rocm-smi";
  return {};
}
#endif

}  // namespace

std::vector<GpuInfo> visible_gpus() {
  std::vector<GpuInfo> gpus(static_cast<std::size_t>(device_count()));
  for (int device = 0; device < static_cast<int>(gpus.size()); ++device) {
    char pci_bus_id[32] = {};
    ROCEP_GPU_CHECK(hipDeviceGetPCIBusId(pci_bus_id, sizeof pci_bus_id, device));
    hipDeviceProp_t properties;
    ROCEP_GPU_CHECK(hipGetDeviceProperties(&properties, device));
    gpus[device].pci_bus_id = normalized_pci_bus_id(pci_bus_id);
    gpus[device].name = properties.name;
  }
  return gpus;
}

NodeTopology read_node_topology(std::vector<GpuInfo> gpus) {
  NodeTopology topology;
  topology.gpus = std::move(gpus);
  const std::size_t count = topology.gpus.size();
  topology.links.assign(count * count, GpuLink{});
  const std::vector<int> devices = local_devices(topology.gpus);
#if defined(ROCEP_HAVE_ROCM_SMI)
  const std::string rocm_smi_problem = read_rocm_smi(topology, devices);
  if (!rocm_smi_problem.empty()) {
    read_runtime(topology, devices);
    topology.source += " (" + rocm_smi_problem + ")";
  }
#elif defined(ROCEP_PLATFORM_AMD)
  read_runtime(topology, devices);
  topology.source += " (this build found no librocm_smi64)";
#else
  read_runtime(topology, devices);
#endif
  for (std::size_t gpu = 0; gpu < count; ++gpu) {
    topology.links[gpu * count + gpu] = {LinkKind::kSameGpu, 0, -1, Answer::kYes, Answer::kYes};
  }
  return topology;
}

NodeGroupTopology gather_node_topology(Bootstrap& group, const std::vector<bool>& on_this_node) {
  const std::vector<GpuInfo> visible = visible_gpus();
  const GpuInfo& mine = visible.at(static_cast<std::size_t>(current_device()));
  // Fixed size: every rank contributes the same bytes. Names and machine identities longer than this are
  // cut (bus ids never are).
  struct RankGpu {
    std::array<char, 32> pci_bus_id;
    std::array<char, 96> name;
    std::array<char, kHostIdentityBytes> machine;
  };
  RankGpu contribution{};
  mine.pci_bus_id.copy(contribution.pci_bus_id.data(), contribution.pci_bus_id.size() - 1);
  mine.name.copy(contribution.name.data(), contribution.name.size() - 1);
  host_identity().copy(contribution.machine.data(), contribution.machine.size() - 1);
  std::vector<RankGpu> rank_gpus(static_cast<std::size_t>(group.size()));
  group.all_gather(&contribution, rank_gpus.data(), sizeof contribution);

  std::vector<GpuInfo> gpus;
  NodeGroupTopology gathered;
  std::vector<RankPlace> places;
  for (const RankGpu& rank_gpu : rank_gpus) {
    places.push_back({rank_gpu.machine.data(), rank_gpu.pci_bus_id.data()});
  }
  gathered.ranks_on_this_gpu = ranks_on_gpu_of(places, group.rank());
  for (std::size_t rank = 0; rank < rank_gpus.size(); ++rank) {
    const RankGpu& rank_gpu = rank_gpus[rank];
    if (!on_this_node.empty() && !on_this_node[rank]) {
      gathered.rank_gpus.push_back(-1);
      continue;
    }
    const std::string pci_bus_id = rank_gpu.pci_bus_id.data();
    const auto found = std::find_if(
        gpus.begin(), gpus.end(), [&pci_bus_id](const GpuInfo& gpu) { return gpu.pci_bus_id == pci_bus_id; });
    gathered.rank_gpus.push_back(static_cast<int>(found - gpus.begin()));
    if (found == gpus.end()) {
      gpus.push_back({pci_bus_id, rank_gpu.name.data(), -1});
    }
  }
  gathered.topology = read_node_topology(std::move(gpus));
  return gathered;
}

}  // namespace rocep
