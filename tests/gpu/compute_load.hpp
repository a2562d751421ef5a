// A compute-bound kernel that stands in for the experts' GEMMs beside dispatch / combine (the SM-budget test
// and the benchmark's concurrent case), and the split of a rank's multiprocessors between the two.
#pragma once

#include "hip/platform.hpp"
#include "host/comm_policy.hpp"
#include "host/device_memory.hpp"
#include "host/gpu_check.hpp"
#include "host/topology.hpp"
#include "rocep/bootstrap.hpp"

namespace rocep::testing {

// One rank's multiprocessors: the communication kernels' budget and the rest of the rank's share.
struct SmSplit {
  int multiprocessors = 0;  // the GPU's
  int ranks_on_gpu = 1;     // ranks of the group on this GPU (several under MPS)
  int communication = 0;    // the multiprocessors (= blocks) of the rank's dispatch / combine kernels
  int compute = 0;          // the rest of the rank's share, multiprocessors / ranks_on_gpu
};

// The split for EpConfig::num_sms on this rank's current GPU, as the group resolves it (comm_policy.hpp).
// Collective over `node`, the ranks of one node; throws ConfigError where the group would.
inline SmSplit sm_split(Bootstrap& node, int num_sms) {
  const NodeGroupTopology gpus = gather_node_topology(node);
  SmSplit split;
  split.ranks_on_gpu = gpus.ranks_on_this_gpu;
  int device = 0;
  ROCEP_GPU_CHECK(hipGetDevice(&device));
  hipDeviceProp_t properties;
  ROCEP_GPU_CHECK(hipGetDeviceProperties(&properties, device));
  split.multiprocessors = properties.multiProcessorCount;
  split.communication = sm_budget(num_sms, split.multiprocessors, split.ranks_on_gpu, comm_policy());
  split.compute = split.multiprocessors / split.ranks_on_gpu - split.communication;
  return split;
}

// Fused multiply-adds on registers, one block of kComputeLoadThreads per multiprocessor it is given, as a
// GEMM sized to the multiprocessors left to it takes them: the hardware spreads a grid over idle
// multiprocessors first, so on an otherwise idle GPU the load holds that many and leaves the others free.
class ComputeLoad {
 public:
  // A load of `multiprocessors` blocks (at least 1) whose launch takes about `milliseconds` on this GPU:
  // calibrated now, on `stream`.
  ComputeLoad(int multiprocessors, double milliseconds, hipStream_t stream);
  // Queues one run on `stream`; returns at once.
  void launch(hipStream_t stream) const;
  int blocks() const { return blocks_; }

 private:
  DeviceBuffer sink_;  // one float per thread: the result, so that the arithmetic is not optimised away
  int blocks_ = 1;
  int iterations_ = 1;
};

}  // namespace rocep::testing
