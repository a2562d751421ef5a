// Failure-atomic steps of group creation: every rank runs a step, then the ranks agree on its outcome, so
// that either every rank goes on or every rank throws, and no rank is left waiting in a collective that a
// failed rank never joins.
#pragma once

#include <exception>

#include "rocep/bootstrap.hpp"

namespace rocep {

// Runs step() and then agrees over `bootstrap` (collective). If step() threw on any rank, every rank
// throws the same exception type as the lowest failing rank (ConfigError, GpuRuntimeError, BootstrapError,
// else Error), with a message naming that rank, `step_name` and the failing rank's own message. Where the
// agreement's own all-gather fails, BootstrapError naming this rank, the collective and `step_name`.
template <typename Step>
void run_agreed(Bootstrap& bootstrap, const char* step_name, Step&& step);

// The agreement itself: `failure` is this rank's exception (null if the step succeeded).
void agree_on_step(Bootstrap& bootstrap, const char* step_name, std::exception_ptr failure);

template <typename Step>
void run_agreed(Bootstrap& bootstrap, const char* step_name, Step&& step) {
  std::exception_ptr failure;
  try {
    step();
  } catch (...) {
    failure = std::current_exception();
  }
  agree_on_step(bootstrap, step_name, failure);
}

}  // namespace rocep
