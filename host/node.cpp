#include "node.hpp"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>

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
