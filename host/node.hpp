// Which ranks of a group share a node (and may map each other's GPU memory): from a host identity that every
// rank contributes at group creation, or from EpConfig::gpus_per_node when the caller sets it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "rocep/bootstrap.hpp"
#include "rocep/config.hpp"

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

// Whether a group's combine sums each node's rows of a token on that node before one row crosses back
// (docs/scale-out.md, device::NodeSums), by the rank there that held the token's messages
// (message_holder): where the ranks span nodes and some node has more than one, in the per-token layout
// with a bf16 combine, not local-only, and no node has more than device::kMaxNodeSumRanks ranks. Elsewhere
// each rank's row crosses on its own. The same rule on every backend, the CPU reference included.
bool sums_nodes(const EpConfig& config, const NodeLayout& layout);

// The node sums as this rank sees them: `summers` [2][world], for a source s on another node the rank of
// this node that sums its rows, then the slot of s there (its index among the sources that rank holds,
// ascending), -1 and -1 for s on this node; and the slots each rank keeps (the most any rank holds).
struct NodeSumPlan {
  std::vector<int32_t> summers;
  int slots = 0;
};
NodeSumPlan node_sum_plan(const NodeLayout& layout);

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
