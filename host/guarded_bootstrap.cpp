#include "guarded_bootstrap.hpp"

#include <exception>
#include <string>
#include <utility>

#include "rocep/errors.hpp"

namespace rocep {

GuardedBootstrap::GuardedBootstrap(std::shared_ptr<Bootstrap> caller)
    : caller_(std::move(caller)), rank_(caller_->rank()), size_(caller_->size()) {}

template <typename Collective>
auto GuardedBootstrap::guarded(const char* name, Collective&& collective) {
  const auto failed = [&](const std::string& what) {
    return BootstrapError("EpGroup: rank " + std::to_string(rank_) + ": the bootstrap's " + name +
                          " failed: " + what);
  };
  try {
    return collective();
  } catch (const std::exception& error) {
    throw failed(error.what());
  } catch (...) {
    throw failed("it threw an exception that is no std::exception");
  }
}

void GuardedBootstrap::all_gather(const void* mine, void* all, std::size_t bytes_per_rank) {
  guarded("all_gather", [&] { caller_->all_gather(mine, all, bytes_per_rank); });
}

void GuardedBootstrap::barrier() {
  guarded("barrier", [&] { caller_->barrier(); });
}

bool GuardedBootstrap::barrier_within(double timeout_seconds) {
  return guarded("barrier_within", [&] { return caller_->barrier_within(timeout_seconds); });
}

bool GuardedBootstrap::all_gather_within(const void* mine, void* all, std::size_t bytes_per_rank,
                                         double timeout_seconds) {
  return guarded("all_gather_within",
                 [&] { return caller_->all_gather_within(mine, all, bytes_per_rank, timeout_seconds); });
}

}  // namespace rocep
