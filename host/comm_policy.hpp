// The SM budget of the dispatch / combine kernels, per architecture: how many multiprocessors (SMs; CUs on
// AMD) they take by default and how their grids are kept resident. The one place that turns
// EpConfig::num_sms into a grid. Plain C++ (the CPU tests check it); the GPU backend applies it.
#pragma once

#include <algorithm>
#include <string>

#include "rocep/config.hpp"
#include "rocep/errors.hpp"

namespace rocep {

// A grid is one block per multiprocessor of the budget, never more: the hardware block
// scheduler spreads a launch over idle multiprocessors first, so k blocks per multiprocessor would occupy
// k x num_sms of them. More bytes in flight per multiprocessor come from wider blocks, not more of them.
// The exception is EpConfig::kAllSms, where nothing is left to share: every resident block runs.
struct CommPolicy {
  // EpConfig::kDefaultSms: this share of the GPU's multiprocessors, rounded down (at least 1). 3/16 is
  // DeepEP's budget on H100 (24 of 132 SMs for its normal kernels, 108 left to the experts' GEMMs), kept as
  // a share so that it scales with the GPU: 24 of H200's 132 SMs, 57 of MI300X's 304 CUs. Not yet measured
  // per GPU; a measured choice replaces it here, with its number in docs/performance-notes.md.
  int default_share_numerator = 3;
  int default_share_denominator = 16;
  // Whether the kernels that wait on other blocks of their own grid (a grid barrier, or a fused call's wait
  // for its own send's signal) are launched cooperatively: the runtime then guarantees the whole grid
  // resident at once, beside whatever else runs, and refuses at launch a grid that cannot be. NVIDIA: yes
  // (as DeepEP launches its kernels; CUDA graphs capture cooperative launches as kernel nodes). AMD: no:
  // HIP sends every cooperative dispatch of a device, from any stream, through one internal queue, fenced
  // after each, so a cooperative grid waits for the one before it: two groups' calls on two streams would
  // run in one order per rank and could wait on each other across ranks; and ROCm 5.2's stream capture of
  // it is unproven. There the grid is sized at creation to fit (sm_budget: one block per multiprocessor of
  // each rank's share, every kernel keeping at least one resident), so the grids of the ranks sharing a GPU
  // fit it together; a kernel of another stream that holds multiprocessors can only delay them.
  bool cooperative_launch = false;

  // Whether the grid of a group with budget `num_sms` is launched cooperatively. Not at kAllSms: that grid
  // is every block the occupancy check at creation found resident on the rank's share, which nothing else
  // is meant to use (a kernel of another stream can only delay it), and the cooperative launch's own cost
  // then shows in the shortest calls (docs/performance-notes.md, perf-sms-5).
  bool launch_cooperatively(int num_sms) const { return cooperative_launch && num_sms != EpConfig::kAllSms; }
};

// The policy of the platform this build targets.
inline CommPolicy comm_policy() {
  CommPolicy policy;
#if defined(ROCEP_PLATFORM_NVIDIA)
  policy.cooperative_launch = true;
#endif
  return policy;
}

// The multiprocessors that one rank's communication kernels occupy (= the blocks of each grid), for
// EpConfig::num_sms (validated) on a GPU of `multiprocessors` that `ranks_on_gpu` ranks of the group share
// (several under MPS, else 1). Each of those ranks has its own budget and all of them run at once, so a
// rank's budget is at most its share, multiprocessors / ranks_on_gpu; the default share is divided among
// them too. (Under MPS with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE the runtime may already report fewer
// multiprocessors; dividing again is then only conservative.) Throws ConfigError naming num_sms and the
// allowed range when an explicit budget exceeds the share, or when the GPU has fewer multiprocessors than
// ranks.
inline int sm_budget(int num_sms, int multiprocessors, int ranks_on_gpu, const CommPolicy& policy) {
  const int share = multiprocessors / std::max(ranks_on_gpu, 1);
  const std::string gpu = std::to_string(multiprocessors) + " multiprocessors shared by " +
                          std::to_string(ranks_on_gpu) + " rank(s) of the group";
  if (share < 1) {
    throw ConfigError("EpConfig.num_sms = " + std::to_string(num_sms) + " is invalid on this GPU: " + gpu +
                      " leave less than one multiprocessor per rank");
  }
  if (num_sms == EpConfig::kAllSms) {
    return share;
  }
  if (num_sms == EpConfig::kDefaultSms) {
    const long long sms = static_cast<long long>(multiprocessors) * policy.default_share_numerator /
                          policy.default_share_denominator / std::max(ranks_on_gpu, 1);
    return static_cast<int>(std::clamp<long long>(sms, 1, share));
  }
  if (num_sms < 1 || num_sms > share) {
    throw ConfigError("EpConfig.num_sms = " + std::to_string(num_sms) +
                      " is invalid on this GPU: allowed range is [1, " + std::to_string(share) + "] (" + gpu +
                      "), or 0 = the default share, -1 = every multiprocessor of the share");
  }
  return num_sms;
}

}  // namespace rocep
