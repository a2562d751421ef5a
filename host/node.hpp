// Which ranks of a group share a node (and may map each other's GPU memory): from a host identity that every
// rank contributes at group creation, or from EpConfig::gpus_per_node when the caller sets it.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "rocep/bootstrap.hpp"

namespace rocep {

struct NodeLayout {
  std::vector<int> node_of_rank;  // [world]: nodes numbered in the order of their lowest rank
  std::vector<int> local_ranks;   // the ranks on this rank's node, ascending
  int node = 0;                   // this rank's node
  int local_rank = 0;             // this rank's index in local_ranks
  int num_nodes = 1;

  bool on_this_node(int rank) const { return node_of_rank[rank] == node; }
};

// The rank of node `node` that holds rank `rank`'s dispatch messages there when they cross nodes: the
// one whose index among its node's ranks is rank's index among its own node's, modulo the size of `node`.
int message_holder(const NodeLayout& layout, int rank, int node);

// Bytes a rank contributes for host_identity() when the ranks gather them: room for a host name (at most
// 255 bytes on Linux) and a boot id; longer identities are cut, which only merges machines whose names
// differ past that point.
inline constexpr std::size_t kHostIdentityBytes = 320;

// This machine's identity: its host name and its boot id (/proc/sys/kernel/random/boot_id, where it
// exists), so that two containers with the same host name on different machines differ.
std::string host_identity();

// Collective over `bootstrap`. ranks_per_node > 0: rank r is on node r / ranks_per_node (the caller vouches
// for it: a test can declare each GPU a node); 0: ranks with equal host_identity() share a node.
NodeLayout node_layout(Bootstrap& bootstrap, int ranks_per_node);

// The layout of `identities` ([world] host identities) as seen by `rank`: the pure part of node_layout.
NodeLayout node_layout_of(const std::vector<std::string>& identities, int rank);

}  // namespace rocep
