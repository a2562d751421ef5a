#include "topology.hpp"

#include <algorithm>
#include <cstdio>
#include <stdexcept>
#include <utility>

namespace rocep {

namespace {

std::string format_pci_bus_id(unsigned domain, unsigned bus, unsigned device, unsigned function) {
  char text[32];
  std::snprintf(text, sizeof text, "%04x:%02x:%02x.%x", domain, bus, device, function);
  return text;
}

// A raw 1 / 0 / -1 (yes / no / not asked).
Answer answer_of(int64_t raw) {
  return raw < 0 ? Answer::kUnknown : raw == 0 ? Answer::kNo : Answer::kYes;
}

// Yes when both say yes; no as soon as one says no.
Answer both(int first, int second) {
  if (first == 0 || second == 0) {
    return Answer::kNo;
  }
  return first < 0 || second < 0 ? Answer::kUnknown : Answer::kYes;
}

// One cell of describe()'s matrix: "xGMI 1h w15", "PCIe 2h w40 noP2P", "self".
std::string link_cell(const GpuLink& link) {
  if (link.kind == LinkKind::kSameGpu) {
    return "self";
  }
  std::string cell = to_string(link.kind);
  if (link.hops >= 0) {
    cell += " " + std::to_string(link.hops) + "h";
  }
  if (link.weight >= 0) {
    cell += " w" + std::to_string(link.weight);
  }
  if (link.peer_access != Answer::kYes) {
    cell += link.peer_access == Answer::kNo ? " noP2P" : " P2P?";
  } else if (link.native_atomics != Answer::kYes) {
    cell += link.native_atomics == Answer::kNo ? " noAtomics" : " atomics?";
  }
  return cell;
}

}  // namespace

const char* to_string(LinkKind kind) {
  switch (kind) {
    case LinkKind::kSameGpu:
      return "same GPU";
    case LinkKind::kXgmi:
      return "xGMI";
    case LinkKind::kNvlink:
      return "NVLink";
    case LinkKind::kPcie:
      return "PCIe";
    case LinkKind::kUnknown:
      break;
  }
  return "unknown";
}

const GpuLink& NodeTopology::link(int from, int to) const {
  const int count = static_cast<int>(gpus.size());
  if (from < 0 || from >= count || to < 0 || to >= count) {
    throw std::out_of_range("NodeTopology::link(" + std::to_string(from) + ", " + std::to_string(to) +
                            "): the topology has " + std::to_string(count) + " GPU(s)");
  }
  return links[static_cast<std::size_t>(from) * gpus.size() + static_cast<std::size_t>(to)];
}

std::string NodeTopology::describe() const {
  std::string text = "GPU topology (" + source + "), " + std::to_string(gpus.size()) + " GPU(s):\n";
  for (std::size_t gpu = 0; gpu < gpus.size(); ++gpu) {
    text += "  GPU " + std::to_string(gpu) + ": " + gpus[gpu].pci_bus_id + " " + gpus[gpu].name +
            ", NUMA node " + (gpus[gpu].numa_node < 0 ? "unknown" : std::to_string(gpus[gpu].numa_node)) +
            "\n";
  }
  if (gpus.size() < 2) {
    return text;
  }
  text +=
      "  links from row to column: kind, hops (h), weight (w); noP2P / noAtomics where refused, ? where "
      "unknown\n";
  const int count = static_cast<int>(gpus.size());
  // Rows: "GPU n" then one cell per column, each column as wide as its widest cell; no trailing blanks.
  std::vector<std::vector<std::string>> rows(count + 1, std::vector<std::string>(count + 1));
  for (int gpu = 0; gpu < count; ++gpu) {
    rows[0][gpu + 1] = rows[gpu + 1][0] = "GPU " + std::to_string(gpu);
    for (int to = 0; to < count; ++to) {
      rows[gpu + 1][to + 1] = link_cell(link(gpu, to));
    }
  }
  std::vector<std::size_t> widths(count + 1);
  for (const auto& row : rows) {
    for (int column = 0; column <= count; ++column) {
      widths[column] = std::max(widths[column], row[column].size());
    }
  }
  for (const auto& row : rows) {
    std::string line;
    for (int column = 0; column <= count; ++column) {
      line += "  " + row[column] + std::string(widths[column] - row[column].size(), ' ');
    }
    text += line.erase(line.find_last_not_of(' ') + 1) + "\n";
  }
  return text;
}

std::string describe_link(const GpuLink& link) {
  if (link.kind == LinkKind::kSameGpu) {
    return "same GPU";
  }
  std::string text = std::string("link ") + to_string(link.kind);
  if (link.hops >= 0) {
    text += ", " + std::to_string(link.hops) + (link.hops == 1 ? " hop" : " hops");
  }
  if (link.weight >= 0) {
    text += ", weight " + std::to_string(link.weight);
  }
  switch (link.peer_access) {
    case Answer::kNo:
      return text + ", no P2P access";
    case Answer::kUnknown:
      return text + ", P2P access unknown";
    case Answer::kYes:
      break;
  }
  switch (link.native_atomics) {
    case Answer::kNo:
      return text + ", P2P access without native atomics";
    case Answer::kUnknown:
      return text + ", P2P access, native atomics unknown";
    case Answer::kYes:
      break;
  }
  return text + ", P2P access with native atomics";
}

std::string peer_to_peer_error(const NodeTopology& topology, const std::vector<int>& rank_gpus) {
  const int ranks = static_cast<int>(rank_gpus.size());
  for (int first = 0; first < ranks; ++first) {
    for (int second = first + 1; second < ranks; ++second) {
      for (const auto& [from, to] : {std::pair{first, second}, std::pair{second, first}}) {
        const int from_gpu = rank_gpus[from];
        const int to_gpu = rank_gpus[to];
        if (from_gpu == to_gpu || from_gpu < 0 || to_gpu < 0) {
          continue;  // one GPU shared by several ranks (MPS), or a rank of another node
        }
        const GpuLink& link = topology.link(from_gpu, to_gpu);
        if (link.peer_access == Answer::kNo || link.native_atomics == Answer::kNo) {
          return "rank " + std::to_string(from) + " (GPU " + topology.gpus[from_gpu].pci_bus_id +
                 ") cannot reach rank " + std::to_string(to) + " (GPU " + topology.gpus[to_gpu].pci_bus_id +
                 ") peer-to-peer: " + describe_link(link) +
                 (link.peer_access == Answer::kYes ? " (the kernels signal with atomics on peer memory)"
                                                   : "");
        }
      }
    }
  }
  return {};
}

int ranks_on_gpu_of(const std::vector<RankPlace>& places, int rank) {
  const RankPlace& mine = places.at(static_cast<std::size_t>(rank));
  return static_cast<int>(std::count_if(places.begin(), places.end(), [&mine](const RankPlace& place) {
    return place.machine == mine.machine && place.pci_bus_id == mine.pci_bus_id;
  }));
}

std::string normalized_pci_bus_id(const std::string& text) {
  unsigned domain = 0;
  unsigned bus = 0;
  unsigned device = 0;
  unsigned function = 0;
  if (std::sscanf(text.c_str(), "%x:%x:%x.%x", &domain, &bus, &device, &function) != 4) {
    return text;
  }
  return format_pci_bus_id(domain, bus, device, function);
}

GpuLink link_from_rocm_smi(const RocmSmiLinkAnswer& answer) {
  GpuLink link;
  link.kind = answer.link_type == kRocmSmiLinkXgmi   ? LinkKind::kXgmi
              : answer.link_type == kRocmSmiLinkPcie ? LinkKind::kPcie
                                                     : LinkKind::kUnknown;
  link.hops = answer.hops;
  link.weight = answer.weight;
  link.peer_access = answer_of(answer.p2p_accessible);
  if (link.peer_access == Answer::kNo) {
    link.native_atomics = Answer::kNo;
  } else if (answer.runtime_native_atomics >= 0) {
    link.native_atomics = answer_of(answer.runtime_native_atomics);
  } else if (link.kind == LinkKind::kXgmi) {
    // xGMI carries atomics itself; over PCIe they need AtomicOps routed along the whole path, which only
    // the runtime (KFD's io-link flags) knows.
    link.native_atomics = Answer::kYes;
  }
  return link;
}

std::string pci_bus_id_from_rocm_smi(uint64_t bdf_id) {
  // Bits 31:16 are reserved (newer rocm-smi puts a partition id there): not part of the bus id.
  return format_pci_bus_id(static_cast<unsigned>(bdf_id >> 32), static_cast<unsigned>((bdf_id >> 8) & 0xff),
                           static_cast<unsigned>((bdf_id >> 3) & 0x1f), static_cast<unsigned>(bdf_id & 0x7));
}

GpuLink link_from_runtime(const RuntimeLinkAnswer& answer) {
  GpuLink link;
  link.kind = answer.nvlink == 1   ? LinkKind::kNvlink
              : answer.nvlink == 0 ? LinkKind::kPcie
                                   : LinkKind::kUnknown;
  link.weight = answer.performance_rank;
  link.peer_access = both(answer.can_access_peer, answer.access_supported);
  link.native_atomics = link.peer_access == Answer::kNo ? Answer::kNo : answer_of(answer.native_atomics);
  return link;
}

}  // namespace rocep
