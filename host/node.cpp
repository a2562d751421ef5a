#include "node.hpp"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>

#include "hip/ep_params.hpp"

namespace rocep {

int message_holder(const NodeLayout& layout, int rank, int node) {
  std::vector<int> there;
  int index = 0;
  for (int peer = 0; peer < static_cast<int>(layout.node_of_rank.size()); ++peer) {
    if (layout.node_of_rank[peer] == node) {
      there.push_back(peer);
    }
    if (peer < rank && layout.node_of_rank[peer] == layout.node_of_rank[rank]) {
      ++index;
    }
  }
  return there[static_cast<std::size_t>(index) % there.size()];
}

bool sums_nodes(const EpConfig& config, const NodeLayout& layout) {
  std::vector<int> ranks(static_cast<std::size_t>(layout.num_nodes), 0);
  for (const int node : layout.node_of_rank) {
    ++ranks[static_cast<std::size_t>(node)];
  }
  const int largest = *std::max_element(ranks.begin(), ranks.end());
  return layout.num_nodes > 1 && largest > 1 && largest <= device::kMaxNodeSumRanks &&
         config.layout == Layout::kPerToken && config.combine_dtype == CombineDtype::kBf16 &&
         !config.local_only;
}

NodeSumPlan node_sum_plan(const NodeLayout& layout) {
  const int world = static_cast<int>(layout.node_of_rank.size());
  NodeSumPlan plan;
  plan.summers.assign(2 * static_cast<std::size_t>(world), -1);
  std::vector<int> held(static_cast<std::size_t>(world), 0);  // [h]: the sources rank h holds so far
  for (int source = 0; source < world; ++source) {
    for (int node = 0; node < layout.num_nodes; ++node) {
      if (node == layout.node_of_rank[source]) {
        continue;
      }
      const int holder = message_holder(layout, source, node);
      const int slot = held[static_cast<std::size_t>(holder)]++;
      if (node == layout.node) {
        plan.summers[static_cast<std::size_t>(source)] = holder;
        plan.summers[static_cast<std::size_t>(world + source)] = slot;
      }
    }
  }
  plan.slots = *std::max_element(held.begin(), held.end());
  return plan;
}

std::string host_identity() {
  std::array<char, 256> name{};
  if (gethostname(name.data(), name.size() - 1) != 0) {
    name[0] = '\0';
  }
  std::string identity(name.data());
  // stdio, not iostreams: their locale facets are process-wide state of the host process.
  std::FILE* boot_id = std::fopen("/proc/sys/kernel/random/boot_id", "r");
  if (boot_id != nullptr) {
    std::array<char, 64> id{};
    if (std::fscanf(boot_id, "%63s", id.data()) == 1) {
      identity += std::string("/") + id.data();
    }
    std::fclose(boot_id);
  }
  return identity;
}

NodeLayout node_layout_of(const std::vector<std::string>& identities, int rank) {
  NodeLayout layout;
  std::vector<std::string> nodes;  // identity of each node, in the order of their lowest rank
  for (const std::string& identity : identities) {
    const auto found = std::find(nodes.begin(), nodes.end(), identity);
    layout.node_of_rank.push_back(static_cast<int>(found - nodes.begin()));
    if (found == nodes.end()) {
      nodes.push_back(identity);
    }
  }
  layout.num_nodes = static_cast<int>(nodes.size());
  layout.node = layout.node_of_rank[rank];
  for (int peer = 0; peer < static_cast<int>(identities.size()); ++peer) {
    if (layout.node_of_rank[peer] == layout.node) {
      if (peer == rank) {
        layout.local_rank = static_cast<int>(layout.local_ranks.size());
      }
      layout.local_ranks.push_back(peer);
    }
  }
  return layout;
}

NodeLayout node_layout(Bootstrap& bootstrap, int ranks_per_node) {
  const int world = bootstrap.size();
  std::vector<std::string> identities(world);
  if (ranks_per_node > 0) {
    for (int peer = 0; peer < world; ++peer) {
      identities[peer] = "node " + std::to_string(peer / ranks_per_node);
    }
  } else {
    std::array<char, kHostIdentityBytes> mine{};
    const std::string identity = host_identity();
    std::copy_n(identity.begin(), std::min(identity.size(), mine.size() - 1), mine.begin());
    std::vector<char> all(kHostIdentityBytes * world);
    bootstrap.all_gather(mine.data(), all.data(), kHostIdentityBytes);
    for (int peer = 0; peer < world; ++peer) {
      identities[peer] = std::string(all.data() + kHostIdentityBytes * peer);
    }
  }
  return node_layout_of(identities, bootstrap.rank());
}

}  // namespace rocep
